// Megatron FSDP (Megatron-Core's --use-megatron-fsdp with --data-parallel-sharding-strategy
// optim_grads_params, core_v0.14.0), what dp_shard > 1 runs under the megatron memory model,
// against hand counts from megatron/core/distributed/fsdp/src/megatron_fsdp/
// param_and_grad_buffer.py and megatron_fsdp.py: the bytes of each resident shard, each
// collective's bytes, dtype, group and count a step, the prefetch window's gathered blocks,
// the optimizer's per-step kernels, and the refusals.
#include <gtest/gtest.h>

#include <string>

#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Inst;
using sched_test::Opts;

// llama3.1-8b: the embedding and the untied output layer 128256 x 4096 each (525,336,576), a
// layer's q and o 4096 x 4096, k and v 1024 x 4096, gate, up and down 3 x 14336 x 4096 and
// two norms of 4096 (218,112,000), the final norm 4096: 8,030,261,248 parameters. Every row
// count divides by 8, so on dp_shard=8 each rank's shard is an eighth: 1,003,782,656.
constexpr int64_t kParams = 8030261248LL, kShard = kParams / 8, kBlock = 218112000LL;
constexpr int64_t kRoot = 2 * 525336576LL + 4096;

Opts MegatronFsdp(const char *mesh) {
  Opts o = sched_test::Megatron(mesh);
  o.dist_opt = 1;    // Megatron FSDP's optimizer is the distributed one (custom_fsdp.md)
  o.dp_overlap = 1;  // optim_grads_params turns both overlaps on (megatron_fsdp.py)
  return o;
}

// The resident state of optim_grads_params: the bf16 model weights' shard (2 bytes) and the
// fp32 main weights' (4) as parameters, the fp32 main gradients' shard (4; grad_reduce_in_fp32,
// which Megatron sets under bf16), Adam's two fp32 moments (8), each over the 8 ranks: 18/8
// bytes a parameter where Megatron's DDP holds 18 and its distributed optimizer 6 + 12/8.
TEST(MegatronFsdp, ResidentShards) {
  Built b;
  sched_test::Build(&b, MegatronFsdp("dp_shard=8"));
  ASSERT_TRUE(mp_plan_is_megatron_fsdp(b.plan));
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_PARAMS], 6 * kShard);
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_GRADS], 4 * kShard);
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_OPTIMIZER], 8 * kShard);
  // bf16 moments (--exp-avg-dtype / --exp-avg-sq-dtype bf16): 4 bytes a parameter
  Built h;
  Opts o = MegatronFsdp("dp_shard=8");
  o.moment_dtype = MP_DTYPE_BF16;
  sched_test::Build(&h, o);
  EXPECT_EQ(h.s->resident_bytes[MP_MEM_OPTIMIZER], 4 * kShard);
  // the state per parameter the planner's bound uses: 2 + 4 + 8 cut (the gradient left out)
  double bytes[2];
  int64_t ways = 0;
  mp_plan_dp_state_bytes(&b.plan->mesh, &b.plan->opts, bytes, &ways);
  EXPECT_EQ(bytes[0], 0.0);
  EXPECT_EQ(bytes[1], 14.0);
  EXPECT_EQ(ways, 1);
}

struct Colls {
  int ag_block = 0, rs_block = 0, ag_root = 0, rs_root = 0, other = 0;
};

// Each layer's weights all-gathered in bf16 over dp_shard (x cp: MP_GROUP_FSDP) before its
// forward and again before its backward (released after each: _post_forward and the
// post-backward hook), its gradients reduce-scattered in fp32 after every backward
// (grad_reduce_every_bprop for optim_grads_params, not only the last micro-batch's); the
// embedding, final norm and output layer (no FSDP unit: gathered once a micro-batch, kept to
// the backward's end, reduced at its end). A micro-batch's ops (the schedule lists one and
// says how often each runs: `when`): 2 gathers and 1 reduce-scatter a layer, 1 and 1 of the
// root, all of them every micro-batch; nothing else over the group.
TEST(MegatronFsdp, CollectivesEveryMicroBatch) {
  Built b;
  Opts o = MegatronFsdp("dp_shard=8");
  o.global_batch = 16;
  sched_test::Build(&b, o);
  Colls c;
  for (const Inst &x : sched_test::Expand(b.s)) {
    if (x.op->type != MP_OP_COMM) continue;
    const mp_op *op = x.op;
    if (op->group == MP_GROUP_FSDP) {
      EXPECT_EQ(op->when, MP_WHEN_EVERY_MICRO);
    }
    if (op->coll == MP_COLL_ALL_GATHER && op->group == MP_GROUP_FSDP && op->dtype == MP_DTYPE_BF16) {
      if (op->bytes == 2.0 * kBlock) c.ag_block++;
      else if (op->bytes == 2.0 * kRoot) c.ag_root++;
      else c.other++;
    } else if (op->coll == MP_COLL_REDUCE_SCATTER && op->group == MP_GROUP_FSDP && op->dtype == MP_DTYPE_FP32) {
      if (op->bytes == 4.0 * kBlock) c.rs_block++;
      else if (op->bytes == 4.0 * kRoot) c.rs_root++;
      else c.other++;
    } else if (op->group != MP_GROUP_WORLD) {
      c.other++;
    }
  }
  EXPECT_EQ(c.ag_block, 32 * 2);
  EXPECT_EQ(c.rs_block, 32);
  EXPECT_EQ(c.ag_root, 1);
  EXPECT_EQ(c.rs_root, 1);
  EXPECT_EQ(c.other, 0);
}

// Without --fsdp-double-buffer the gathers run ahead while fewer than 5 x 10^8 elements are
// prefetched (suggested_AG_prefetch_size = 10^9 / 2): ceil(5e8 / e) layers of e elements. The
// builder gathers one ahead; the rest are held resident. tp 1: e = 218,112,000, 3 ahead, 2
// more x 436,224,000 bf16 bytes; tp 2 (a rank's half of each matrix, whole norms): e =
// 109,051,904 + 8192 = 109,060,096, 5 ahead, 4 more x 218,120,192. The double buffer (two
// units' buffers: the current and the next layer) holds none beyond the one.
TEST(MegatronFsdp, PrefetchWindow) {
  const struct {
    const char *mesh;
    int64_t extra;
  } cases[] = {{"dp_shard=8", 2 * 2 * kBlock}, {"dp_shard=4,tp=2", 4 * 2 * (109051904LL + 8192)}};
  for (const auto &k : cases) {
    SCOPED_TRACE(k.mesh);
    Built b;
    sched_test::Build(&b, MegatronFsdp(k.mesh));
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_GATHERED], k.extra);
    Built d;
    Opts o = MegatronFsdp(k.mesh);
    o.fsdp_double_buffer = 1;
    sched_test::Build(&d, o);
    EXPECT_EQ(d.s->resident_bytes[MP_MEM_GATHERED], 0);
  }
}

// After AdamW on its shard a rank copies its fp32 main weights into its bf16 model weights
// (reads 4, writes 2 bytes each) and zeroes its fp32 main-gradient shard (4), once a step.
TEST(MegatronFsdp, OptimizerKernels) {
  Built b;
  Opts o = MegatronFsdp("dp_shard=8");
  o.global_batch = 16;
  sched_test::Build(&b, o);
  int copies = 0, zeroes = 0;
  for (const Inst &x : sched_test::Expand(b.s)) {
    if (x.op->type != MP_OP_COMPUTE || x.op->kernel != MP_KERNEL_COPY || x.op->phase != MP_PHASE_OPTIMIZER) continue;
    if (x.op->bytes == 6.0 * kShard) copies++;
    if (x.op->bytes == 4.0 * kShard) zeroes++;
  }
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(zeroes, 1);
}

// What Megatron FSDP does not run here is refused by name: the strategies that shard no
// weights (Megatron's DDP and distributed optimizer on dp_replicate), optim_grads, and running
// without the distributed optimizer (the hybrid form over dp_replicate: megatron_hsdp_test).
TEST(MegatronFsdp, Refusals) {
  const struct {
    const char *mesh;
    mp_mfsdp_strategy s;
    int dist_opt;
    const char *says;
  } cases[] = {
      {"dp_shard=8", MP_MFSDP_NO_SHARD, 1, "use dp_replicate=8 instead of dp_shard=8"},
      {"dp_shard=8", MP_MFSDP_OPTIM, 1, "--use-distributed-optimizer"},
      {"dp_shard=8", MP_MFSDP_OPTIM_GRADS, 1, "optim_grads"},
      {"dp_shard=8", MP_MFSDP_OPTIM_GRADS_PARAMS, 0, "distributed optimizer"},
  };
  for (const auto &k : cases) {
    SCOPED_TRACE(k.says);
    Built b;
    Opts o = MegatronFsdp(k.mesh);
    o.mfsdp_strategy = k.s;
    o.dist_opt = k.dist_opt;
    ASSERT_EQ(sched_test::PlanOnly(&b, o), MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find(k.says), std::string::npos) << mp_errmsg(&b.ctx);
  }
  // dp_replicate keeps Megatron's DDP: nothing sharded, no FSDP units
  Built d;
  ASSERT_EQ(sched_test::PlanOnly(&d, MegatronFsdp("dp_replicate=8")), MP_OK) << mp_errmsg(&d.ctx);
  EXPECT_FALSE(mp_plan_is_megatron_fsdp(d.plan));
  EXPECT_EQ(d.plan->opts.dp, MP_DP_DDP);
}

}  // namespace
