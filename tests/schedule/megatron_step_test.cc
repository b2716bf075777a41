// Megatron-LM's per-step kernels outside the blocks in the schedule, against hand counts: the
// bytes its vocab-parallel cross-entropy moves over the [T, V/tp] logits, the eager steps of
// _VocabParallelCrossEntropy (megatron/core/tensor_parallel/cross_entropy.py, core_v0.14.0;
// Megatron's default) and the fused ones of --cross-entropy-loss-fusion (megatron/core/
// fusions/fused_cross_entropy.py, each jit_fuser function one compiled kernel), both keeping
// the same tensors; the fp32 gradient buffer zeroed once a step (zero_grad_buffer); and each
// gradient bucket's NaN check and 1/dp scaling before its reduction (start_grad_sync).
#include <gtest/gtest.h>

#include <string>

#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Inst;
using sched_test::Megatron;
using sched_test::Opts;

// llama3.1-8b on 8 ranks, without and with tp 2: what a rank holds of the vocabulary (128256,
// halved by tp 2) and of the parameters. Its parameters: the embedding and the untied output
// layer 128256 x 4096 each; a layer's q and o 4096 x 4096, k and v 1024 x 4096, gate, up and
// down 3 x 14336 x 4096, two norms of 4096; the final norm 4096: 2 x 525,336,576 + 32 x
// 218,112,000 + 4096 = 8,030,261,248. Under tp 2 a rank holds half of each matrix and every
// norm: 525,336,576 + 32 x (109,051,904 + 8192) + 4096 = 4,015,263,744.
const struct MeshCase {
  const char *mesh;
  double vocab, params;
} kCases[] = {{"dp_replicate=8", 128256.0, 8030261248.0}, {"dp_replicate=4,tp=2", 64128.0, 4015263744.0}};

struct LossOps {
  double fwd_bytes = 0, bwd_bytes = 0;
  int n_fwd = 0, n_bwd = 0;
  int64_t f32_logits = 0;  // bytes of the fp32 logits copy allocated in the loss forward
};

LossOps Loss(mp_loss_impl loss, const char *mesh) {
  Built b;
  Opts o = Megatron(mesh);
  o.loss = loss;
  sched_test::Build(&b, o);
  LossOps r;
  for (const Inst &x : sched_test::Expand(b.s)) {
    if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_LOSS) {
      const int fwd = x.op->variant == MP_VAR_FWD;
      (fwd ? r.fwd_bytes : r.bwd_bytes) += x.op->bytes;
      (fwd ? r.n_fwd : r.n_bwd)++;
    }
    if (x.op->type == MP_OP_ALLOC && x.op->mem_cat == MP_MEM_LOGITS && x.op->phase == MP_PHASE_FORWARD &&
        x.op->mem_bytes > r.f32_logits)
      r.f32_logits = x.op->mem_bytes;
  }
  return r;
}

// One sequence of 4096 tokens a micro-batch. Eager, per
// logit: the fp32 cast reads 2 and writes 4 bytes, torch.max reads 4, the in-place
// subtraction of the max reads and writes 4, torch.exp(out=) 4 + 4, the sum reads 4, div_
// 4 + 4: 38 forward; backward mul_(grad_output) 4 + 4 and autograd's cast back to the bf16
// input 4 + 2: 14 (the target column's update touches T elements, not T x V). Fused:
// calculate_logits_max casts and reduces in one pass (2 + 4), calculate_predicted_logits
// subtracts, exponentiates and sums in one (4 + 4), calculate_cross_entropy_loss divides
// (4 + 4): 22; calculate_gradients reads the softmax, updates it in place and writes the
// bf16 gradient: 4 + 4 + 2 = 10.
TEST(MegatronStep, CrossEntropyBytesEagerAndFused) {
  for (const MeshCase &c : kCases) {
    SCOPED_TRACE(c.mesh);
    const double TV = 4096.0 * c.vocab;
    const LossOps eager = Loss(MP_LOSS_INPLACE, c.mesh), fused = Loss(MP_LOSS_INPLACE_FUSED, c.mesh);
    ASSERT_EQ(eager.n_fwd, 1);
    ASSERT_EQ(eager.n_bwd, 1);
    ASSERT_EQ(fused.n_fwd, 1);
    ASSERT_EQ(fused.n_bwd, 1);
    EXPECT_DOUBLE_EQ(eager.fwd_bytes, 38.0 * TV);
    EXPECT_DOUBLE_EQ(eager.bwd_bytes, 14.0 * TV);
    EXPECT_DOUBLE_EQ(fused.fwd_bytes, 22.0 * TV);
    EXPECT_DOUBLE_EQ(fused.bwd_bytes, 10.0 * TV);
    // the fp32 copy that becomes the softmax (saved) is the same tensor in both paths
    EXPECT_EQ(eager.f32_logits, (int64_t)(4.0 * TV));
    EXPECT_EQ(fused.f32_logits, eager.f32_logits);
  }
}

// Each step Megatron zeroes the rank's whole fp32 gradient buffer (4 bytes a parameter it
// holds) once (train_step's zero_grad_buffer, before the next step's forward), whatever the
// micro-batches.
TEST(MegatronStep, GradientBufferZeroedOnceAStep) {
  for (const MeshCase &c : kCases) {
    SCOPED_TRACE(c.mesh);
    Built b;
    Opts o = Megatron(c.mesh);
    o.global_batch = 16;  // two micro-batches a rank on dp 8, four on dp 4
    sched_test::Build(&b, o);
    int zeroes = 0;
    for (const Inst &x : sched_test::Expand(b.s))
      if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_COPY && x.op->phase == MP_PHASE_OPTIMIZER &&
          x.op->bytes == 4.0 * c.params)
        zeroes++;
    EXPECT_EQ(zeroes, 1);
  }
}

// With --overlap-grad-reduce a bucket is a block's gradients (or the root's), reduced in the
// last micro-batch's backward; before each reduction Megatron-Core takes the bucket's norm
// (reads its fp32 elements: 4 bytes each) and scales it by 1/dp (reads and writes them: 8),
// on the compute stream (param_and_grad_buffer.py start_grad_sync, core_v0.14.0). Over the
// step the buckets cover every parameter the rank holds once, whatever the micro-batches:
// 4 and 8 bytes a parameter, one norm and one scaling a bucket (33: the root and 32 blocks).
// Without the two switches (--no-check-for-nan-in-loss-and-grad, --ddp-average-in-collective)
// there is neither.
TEST(MegatronStep, BucketsCheckedAndScaledBeforeTheirReduction) {
  for (const MeshCase &c : kCases) {
    for (int on = 0; on <= 1; on++) {
      SCOPED_TRACE(std::string(c.mesh) + (on ? " checked and scaled" : " neither"));
      Built b;
      Opts o = Megatron(c.mesh);
      o.global_batch = 16;  // two micro-batches a rank on dp 8, four on dp 4
      o.dp_overlap = 1;
      o.ddp_scale = o.ddp_check = on;
      sched_test::Build(&b, o);
      double norm = 0, scale = 0;
      int n_norm = 0, n_scale = 0;
      for (const Inst &x : sched_test::Expand(b.s)) {
        if (x.op->type != MP_OP_COMPUTE || x.op->phase != MP_PHASE_BACKWARD) continue;
        if (x.op->kernel == MP_KERNEL_GRAD_NORM) norm += x.op->bytes, n_norm++;
        if (x.op->kernel == MP_KERNEL_COPY) scale += x.op->bytes, n_scale++;
      }
      EXPECT_EQ(n_norm, on ? 33 : 0);
      EXPECT_EQ(n_scale, on ? 33 : 0);
      EXPECT_DOUBLE_EQ(norm, on ? 4.0 * c.params : 0.0);
      EXPECT_DOUBLE_EQ(scale, on ? 8.0 * c.params : 0.0);
    }
  }
}

}  // namespace
