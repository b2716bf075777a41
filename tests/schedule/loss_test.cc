// Megatron-LM's vocab-parallel cross-entropy in the schedule, against hand counts of the bytes
// its kernels move over the [T, V/tp] logits: the eager steps of _VocabParallelCrossEntropy
// (megatron/core/tensor_parallel/cross_entropy.py, core_v0.14.0; Megatron's default) and the
// fused ones of --cross-entropy-loss-fusion (megatron/core/fusions/fused_cross_entropy.py,
// each jit_fuser function one compiled kernel). Both keep the same tensors.
#include <gtest/gtest.h>

#include "tests/schedule/built.h"

namespace {

using sched_test::Build;
using sched_test::Built;
using sched_test::Expand;
using sched_test::Inst;
using sched_test::Opts;

struct LossOps {
  double fwd_bytes = 0, bwd_bytes = 0;
  int n_fwd = 0, n_bwd = 0;
  int64_t f32_logits = 0;  // bytes of the fp32 logits copy allocated in the loss forward
};

LossOps Loss(mp_loss_impl loss, const char *mesh) {
  Built b;
  Opts o;
  o.mesh = mesh;
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.loss = loss;
  o.seq = 4096;
  Build(&b, o);
  LossOps r;
  for (const Inst &x : Expand(b.s)) {
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

// llama3.1-8b (vocabulary 128256), one sequence of 4096 tokens a micro-batch. Eager, per
// logit: the fp32 cast reads 2 and writes 4 bytes, torch.max reads 4, the in-place
// subtraction of the max reads and writes 4, torch.exp(out=) 4 + 4, the sum reads 4, div_
// 4 + 4: 38 forward; backward mul_(grad_output) 4 + 4 and autograd's cast back to the bf16
// input 4 + 2: 14 (the target column's update touches T elements, not T x V). Fused:
// calculate_logits_max casts and reduces in one pass (2 + 4), calculate_predicted_logits
// subtracts, exponentiates and sums in one (4 + 4), calculate_cross_entropy_loss divides
// (4 + 4): 22; calculate_gradients reads the softmax, updates it in place and writes the
// bf16 gradient: 4 + 4 + 2 = 10. With tp 2 each rank holds half the vocabulary.
TEST(Loss, MegatronCrossEntropyBytesEagerAndFused) {
  const struct {
    const char *mesh;
    double vocab;
  } cases[] = {{"dp_replicate=8", 128256.0}, {"dp_replicate=4,tp=2", 64128.0}};
  for (const auto &c : cases) {
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

}  // namespace
