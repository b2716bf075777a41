// Transformer Engine's GroupedLinear (Megatron-Core's routed experts) quantizes expert by
// expert: each expert's weight by its own quantizer (_GroupedLinear.forward's loop over
// weight_quantizers, module/grouped_linear.py), the input and the output gradient by
// tex.split_quantize, one kernel a split outside delayed scaling, whose quantizers alone take
// the fused nvte_multi_cast_transpose (multi_tensor_quantize_impl, pytorch/csrc/extensions/
// cast.cpp, v2.6 at 07afda98 to v2.16). A cast so marked (mp_op.grouped, batch the local
// experts) is priced a launch an expert (sim/cost.c). Qwen3-30B-A3B, EP 8: 128 / 8 = 16 local
// experts; the experts' casts of layer 5 by hand.
#include <gtest/gtest.h>

#include <vector>

#include "tests/schedule/built.h"

using namespace sched_test;

namespace {

// The float8 casts of `module` in layer 5 in `phase`: each one's batch where grouped, 1 where
// not (one kernel).
std::vector<int64_t> Casts(const mp_schedule *s, int module, mp_phase phase) {
  std::vector<int64_t> r;
  for (const Inst &x : Expand(s)) {
    const mp_op *op = x.op;
    if (x.layer != 5 || op->phase != phase || op->type != MP_OP_COMPUTE) continue;
    if (op->module != module || op->kernel != MP_KERNEL_FP8_CAST) continue;
    r.push_back(op->grouped ? op->batch : 1);
  }
  return r;
}

void BuildQwen(Built *b, mp_fp8_recipe recipe) {
  Opts o = Megatron("dp_replicate=8,ep=8");
  o.model = "qwen3-30b-a3b";
  o.fp8 = 1;
  o.fp8_recipe = recipe;
  o.gpu_cc = 90;
  Build(b, o);
}

}  // namespace

// Blockwise: forward, gate (fc1's first half) casts its weight (once a step) and the shared
// fc1 input, up its weight alone (the input is gate's), down its weight and its input: every
// one a kernel an expert. Backward: down's and gate's output gradients (gate's standing for
// linear_fc1's one gradient, split-quantized once) a kernel an expert, up's one kernel.
TEST(Fp8ExpertCasts, BlockwiseQuantizesEachExpert) {
  Built b;
  BuildQwen(&b, MP_FP8_BLOCKWISE);
  EXPECT_EQ(b.model.n_experts / 8, 16);
  using V = std::vector<int64_t>;
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_GATE, MP_PHASE_FORWARD), (V{16, 16}));
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_UP, MP_PHASE_FORWARD), (V{16}));
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_DOWN, MP_PHASE_FORWARD), (V{16, 16}));
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_DOWN, MP_PHASE_BACKWARD), (V{16}));
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_GATE, MP_PHASE_BACKWARD), (V{16}));
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_UP, MP_PHASE_BACKWARD), (V{1}));
  // the attention's Linears are no grouped Linear: one kernel each (q's weight and input)
  EXPECT_EQ(Casts(b.s, MP_MOD_Q, MP_PHASE_FORWARD), (V{1, 1}));
}

// Delayed scaling: the weights still one quantizer an expert, the input and the output
// gradients one fused multi-cast-transpose kernel.
TEST(Fp8ExpertCasts, DelayedFusesTheSplits) {
  Built b;
  BuildQwen(&b, MP_FP8_DELAYED);
  using V = std::vector<int64_t>;
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_GATE, MP_PHASE_FORWARD), (V{16, 1}));
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_DOWN, MP_PHASE_FORWARD), (V{16, 1}));
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_DOWN, MP_PHASE_BACKWARD), (V{1}));
  EXPECT_EQ(Casts(b.s, MP_MOD_EXPERTS_GATE, MP_PHASE_BACKWARD), (V{1}));
}
