// PyTorch FSDP1 (FullyShardedDataParallel) as IBM's fms-fsdp runs it, against the
// schedule's per-block FSDP units, by hand. fms-fsdp main_training.py at 4ffb9bd wraps each
// LLaMABlock (policies/wrapping.py, transformer_auto_wrap_policy) with
// limit_all_gathers=True and the default backward_prefetch BACKWARD_PRE, FULL_SHARD or
// HYBRID_SHARD (both reshard after forward), and full AC as checkpoint_wrapper around every
// block (policies/ac_handler.py, selective_checkpointing 1). The rules these tests pin:
//   - one flat parameter a block, all-gathered in bf16 into one buffer (FlatParamHandle):
//     a block unit's gathered bytes are its parameters x 2;
//   - the rate limiter (torch/distributed/fsdp/_limiter_utils.py, _FreeEventQueue:
//     _max_num_inflight_all_gathers = 2): the CPU waits, before a third all-gather, for the
//     free event of the oldest, so at most two blocks' parameters are gathered at once and
//     block l+1's forward all-gather starts once block l-1's forward is done;
//   - the root unit (embedding, final norm, head) is not resharded after forward
//     (_runtime_utils.py _post_forward_reshard frees only a non-root handle);
//   - BACKWARD_PRE: block l's pre-backward hook issues block l-1's all-gather before block
//     l's own backward (its recompute under the checkpoint wrapper first) runs.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "tests/schedule/built.h"

namespace {

using sched_test::Build;
using sched_test::Built;
using sched_test::Expand;
using sched_test::Inst;
using sched_test::Opts;

// Llama 2 7B (data/models/llama2-7b.json: H 4096, 32 heads of 128, no GQA, FFN 11008,
// vocab 32000, untied), one block's parameters: q, k, v, o 4 x 4096^2 = 67,108,864; gate,
// up, down 3 x 11008 x 4096 = 135,266,304; two norms 8,192: 202,383,360 elements, gathered
// in bf16 404,766,720 bytes. The root unit: embedding and head 2 x 32000 x 4096 =
// 262,144,000 and the final norm 4,096: 262,148,096 elements, 524,296,192 bytes. Every dim 0
// divides by 8, so no shard is padded.
const int64_t kBlockBytes = 2 * 202383360LL, kRootBytes = 2 * 262148096LL;

// fms-fsdp's 34B and 70B rows: FULL_SHARD over 8 ranks here (the rules hold for any group),
// two sequences of 4096 tokens a GPU in one micro-batch, every block checkpointed.
Opts FmsFullShard() {
  Opts o;
  o.model = "llama2-7b";
  o.mesh = "dp_shard=8";
  o.ac = MP_AC_FULL;
  o.seq = 4096;
  o.micro_batch = 2;
  o.flat_params = 1;
  return o;
}

TEST(Fsdp1, LimitAllGathersHoldsTwoBlocksBesideTheRoot) {
  Built b;
  Build(&b, FmsFullShard());
  int64_t live = 0, peak = 0;
  std::set<int> blocks;  // blocks whose parameters are gathered
  size_t most_blocks = 0;
  int64_t root_at_fwd_end = -1;
  for (const Inst &x : Expand(b.s)) {
    if (x.op->mem_cat == MP_MEM_GATHERED && x.op->type == MP_OP_ALLOC) {
      live += x.op->mem_bytes;
      if (x.layer >= 0) {
        EXPECT_EQ(x.op->mem_bytes, kBlockBytes) << "block " << x.layer;
        blocks.insert(x.layer);
      } else {
        EXPECT_EQ(x.op->mem_bytes, kRootBytes);
      }
    }
    if (x.op->mem_cat == MP_MEM_GATHERED && x.op->type == MP_OP_FREE) {
      live -= x.op->mem_bytes;
      if (x.layer >= 0) blocks.erase(x.layer);
    }
    if (blocks.size() > most_blocks) most_blocks = blocks.size();
    if (live > peak) peak = live;
    if (x.op->phase == MP_PHASE_FORWARD) root_at_fwd_end = live - (int64_t)blocks.size() * kBlockBytes;
  }
  EXPECT_EQ(most_blocks, 2u);  // the limiter's two all-gathers in flight
  EXPECT_EQ(peak, kRootBytes + 2 * kBlockBytes);  // 1,333,829,632 bytes
  EXPECT_EQ(root_at_fwd_end, kRootBytes);  // the root stays gathered into backward
}

// The op index of block l's all-gather in `phase` (the backward's for the recompute and
// the backward alike), and of its first compute op in each phase.
struct Order {
  std::map<int, int64_t> gather[MP_PHASE_COUNT], first_compute[MP_PHASE_COUNT];
  std::map<int64_t, const Inst *> by_index;
};

Order OrderOf(const std::vector<Inst> &v) {
  Order o;
  for (const Inst &x : v) {
    o.by_index[x.index] = &x;
    if (x.layer < 0) continue;
    const int ph = x.op->phase == MP_PHASE_RECOMPUTE ? (int)MP_PHASE_BACKWARD : (int)x.op->phase;
    if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_GATHER) o.gather[ph][x.layer] = x.index;
    if (x.op->type == MP_OP_COMPUTE && !o.first_compute[ph].count(x.layer)) o.first_compute[ph][x.layer] = x.index;
  }
  return o;
}

TEST(Fsdp1, ForwardGatherWaitsForTheBlockTwoBack) {
  Built b;
  Build(&b, FmsFullShard());
  const std::vector<Inst> v = Expand(b.s);
  Order o = OrderOf(v);
  for (int l = 1; l + 1 < 32; l++) {
    const int64_t g = o.gather[MP_PHASE_FORWARD][l + 1];
    ASSERT_GT(g, 0) << l;
    // issued at block l's forward start, before its compute: the prefetch
    EXPECT_LT(g, o.first_compute[MP_PHASE_FORWARD][l]) << l;
    // after block l-1's forward compute, waiting for the free of block l-1's gathered
    // parameters (the free event of the oldest of the two in flight)
    EXPECT_GT(g, o.first_compute[MP_PHASE_FORWARD][l - 1]) << l;
    bool waits_two_back = false;
    for (const Inst &x : v) {
      if (x.index != g) continue;
      for (int64_t d : x.deps) {
        const Inst *p = o.by_index.count(d) ? o.by_index[d] : nullptr;
        if (p && p->op->type == MP_OP_FREE && p->op->mem_cat == MP_MEM_GATHERED && p->layer == l - 1)
          waits_two_back = true;
      }
    }
    EXPECT_TRUE(waits_two_back) << "block " << l + 1 << "'s gather";
  }
}

TEST(Fsdp1, BackwardPrefetchIssuesTheNextBlockBeforeTheRecompute) {
  Built b;
  Build(&b, FmsFullShard());
  Order o = OrderOf(Expand(b.s));
  for (int l = 31; l >= 1; l--) {
    // block l's gather for its recompute and backward, then block l-1's, both before
    // block l's first recomputed op
    const int64_t own = o.gather[MP_PHASE_BACKWARD][l], next = o.gather[MP_PHASE_BACKWARD][l - 1],
                  first = o.first_compute[MP_PHASE_BACKWARD][l];
    ASSERT_GT(first, 0) << l;
    if (l < 31) {
      EXPECT_LT(own, o.first_compute[MP_PHASE_BACKWARD][l + 1]) << l;
    }
    EXPECT_LT(next, first) << "block " << l - 1 << "'s gather";
  }
}

}  // namespace
