// torchtitan's ChunkedLossWrapper (exec/schedule_head.c, plan loss_chunks): the head's GEMMs
// and the loss run once a chunk of T/N rows, every chunk but the last forward and backward
// inside the step's forward, the last one's backward where the step's backward begins; the
// same FLOPs as the unchunked head; the plan refuses a count the rank's sequence does not
// take, a negative one, and the wrapper under a memory model that does not run it.
#include <gtest/gtest.h>

#include <string>

#include "tests/schedule/built.h"

namespace {

using sched_test::Build;
using sched_test::Built;
using sched_test::Expand;
using sched_test::Inst;
using sched_test::Opts;
using sched_test::PlanOnly;

struct HeadOps {
  int gemm[3][2] = {};     // [FWD, DGRAD, WGRAD][forward phase, backward phase] counts
  int64_t rows[3] = {};    // each variant's token rows summed (FWD, DGRAD: m; WGRAD: k)
  double flops = 0;        // the head's GEMM FLOPs
  int loss[2] = {};        // the loss kernels: forward, backward
  int64_t loss_elems = 0;  // the forward loss kernels' elements summed
};

HeadOps Head(const mp_schedule *s) {
  HeadOps h;
  for (const Inst &x : Expand(s)) {
    const mp_op *op = x.op;
    if (op->type != MP_OP_COMPUTE || op->module != MP_MOD_OUTPUT) continue;
    if (op->kernel == MP_KERNEL_LOSS) {
      h.loss[op->variant == MP_VAR_FWD ? 0 : 1]++;
      if (op->variant == MP_VAR_FWD) h.loss_elems += op->m;
      continue;
    }
    if (op->kernel != MP_KERNEL_GEMM) continue;
    const int v = op->variant == MP_VAR_FWD ? 0 : op->variant == MP_VAR_DGRAD ? 1 : 2;
    h.gemm[v][op->phase == MP_PHASE_FORWARD ? 0 : 1]++;
    h.rows[v] += v == 2 ? op->k : op->m;
    h.flops += op->flops;
  }
  return h;
}

// llama3.1-8b on dp_shard 8 (the fixture's), two sequences of 8192 a micro-batch, the head
// and loss in n chunks.
void BuildChunked(Built *b, int n) {
  Opts o;
  o.micro_batch = 2;
  o.loss_chunks = n;
  Build(b, o);
}

// The highest running total of category cat's bytes over the schedule's ops in phase
// `phase` (-1: every phase); *end the total after the last op.
int64_t TopLive(const mp_schedule *s, mp_mem_cat cat, int phase, int64_t *end) {
  int64_t live = 0, top = 0;
  for (const Inst &x : Expand(s)) {
    if (x.op->mem_cat != cat || (phase >= 0 && x.op->phase != phase)) continue;
    if (x.op->type == MP_OP_ALLOC) live += x.op->mem_bytes;
    if (x.op->type == MP_OP_FREE) live -= x.op->mem_bytes;
    top = live > top ? live : top;
  }
  *end = live;
  return top;
}

// llama3.1-8b on dp_shard 8, two sequences of 8192 a micro-batch: T = 16384 rows, V = 128256,
// H = 4096. One chunk: one GEMM of each variant on T rows, FWD in the forward, DGRAD and WGRAD
// in the backward. Eight: 2048 rows each, chunks 0-6's DGRAD and WGRAD in the forward (the
// wrapper's chunk_loss.backward() inside the loss call), chunk 7's in the backward; the FLOPs
// 3 x 2 T V H = 51,642,686,767,104 either way.
TEST(LossChunks, HeadGemmsSplitByRowsSameFlops) {
  const int64_t T = 16384, V = 128256, H = 4096;
  for (int n : {1, 8}) {
    Built b;
    ASSERT_NO_FATAL_FAILURE(BuildChunked(&b, n));
    const HeadOps h = Head(b.s);
    EXPECT_EQ(h.gemm[0][0], n) << n;
    EXPECT_EQ(h.gemm[0][1], 0) << n;
    for (int v = 1; v < 3; v++) {
      EXPECT_EQ(h.gemm[v][0], n - 1) << n << " variant " << v;
      EXPECT_EQ(h.gemm[v][1], 1) << n << " variant " << v;
    }
    for (int v = 0; v < 3; v++) EXPECT_EQ(h.rows[v], T) << n << " variant " << v;
    EXPECT_DOUBLE_EQ(h.flops, 3.0 * 2.0 * (double)T * (double)V * (double)H) << n;
    EXPECT_DOUBLE_EQ(h.flops, 51642686767104.0);
    EXPECT_EQ(h.loss[0], n);
    EXPECT_EQ(h.loss[1], n);
    EXPECT_EQ(h.loss_elems, T * V);
  }
}

// The logits' peak in the head under the eager cross-entropy (fp32 log_softmax saved, nll's
// and log_softmax's fp32 gradients: 12 bytes a logit at the loss's backward) falls from
// 12 T V to 12 (T/8) V, and the chunks hold 6 T H (the bf16 copies and the fp32 sum):
// 25,216,155,648 -> 3,152,019,456 + 402,653,184 = 3,554,672,640 bytes. Measured as the
// highest running LOGITS total over rank 0's schedule.
TEST(LossChunks, LogitsLiveOneChunkAtATime) {
  const int64_t T = 16384, V = 128256, H = 4096;
  for (int n : {1, 8}) {
    Built b;
    ASSERT_NO_FATAL_FAILURE(BuildChunked(&b, n));
    int64_t live = -1;
    const int64_t top = TopLive(b.s, MP_MEM_LOGITS, -1, &live);
    EXPECT_EQ(live, 0) << n;
    const int64_t want = n == 1 ? 12 * T * V : 12 * (T / 8) * V + 6 * T * H;
    EXPECT_EQ(top, want) << n;
    EXPECT_EQ(top, n == 1 ? 25216155648LL : 3554672640LL) << n;
  }
}

// Under FSDP the head's unsharded bf16 gradient, V x H x 2 = 1,050,673,152 bytes, is held
// from the first chunk's backward to the end of the forward's chunks (then the step's
// unsharded gradients of the root unit hold it); TEMP in the forward is that alone, and
// nothing unchunked.
TEST(LossChunks, HeadGradientHeldThroughTheForwardChunks) {
  for (int n : {1, 8}) {
    Built b;
    ASSERT_NO_FATAL_FAILURE(BuildChunked(&b, n));
    int64_t end = -1;
    EXPECT_EQ(TopLive(b.s, MP_MEM_TEMP, MP_PHASE_FORWARD, &end), n == 1 ? 0 : 128256LL * 4096 * 2) << n;
    EXPECT_EQ(end, 0) << n;
  }
}

TEST(LossChunks, PlanRefusesWhatTorchtitanRefuses) {
  struct Case {
    const char *mesh;
    mp_mem_model mm;
    int n;
    const char *words;
  } cases[] = {
      {"dp_shard=8", MP_MEM_MODEL_TORCHTITAN, 3, "does not divide the rank's sequence of 8192"},
      {"dp_shard=4,cp=2", MP_MEM_MODEL_TORCHTITAN, 8192, "does not divide the rank's sequence of 4096"},
      {"dp_shard=8", MP_MEM_MODEL_TORCHTITAN, -2, "loss_chunks -2"},
      {"dp_replicate=8", MP_MEM_MODEL_MEGATRON, 8, "the megatron memory model"},
      {"dp_shard=8", MP_MEM_MODEL_MESHPLAN_CUDA, 8, "the meshplan-cuda memory model"},
  };
  for (const Case &c : cases) {
    Opts o;
    o.mesh = c.mesh;
    o.mem_model = c.mm;
    o.loss_chunks = c.n;
    Built b;
    EXPECT_EQ(PlanOnly(&b, o), MP_ERR_INVALID) << c.words;
    EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find(c.words), std::string::npos) << mp_errmsg(&b.ctx);
  }
  Opts ok;
  ok.mesh = "dp_shard=4,cp=2";
  ok.loss_chunks = 4096;  // the rank's 4096 tokens, one a chunk
  Built b;
  EXPECT_EQ(PlanOnly(&b, ok), MP_OK) << mp_errmsg(&b.ctx);
}

}  // namespace
