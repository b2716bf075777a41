// Transformer Engine's float8 weight copies (v2.8), held for Megatron-Core, which passes
// is_first_microbatch: each float8 Linear's weight cast in a step's first micro-batch into a
// workspace the module keeps (TransformerEngineBaseModule.get_weight_workspace,
// transformer_engine/pytorch/module/base.py; linear.py, layernorm_linear.py, layernorm_mlp.py,
// grouped_linear.py), written in place each step; under --fp8-param-gather the float8 weight's
// own transpose (Float8TensorBase.update_usage) or blockwise's column-wise copy, dropped by
// cast_master_weights_to_fp8 (tensor/utils.py). Bytes by hand from the shapes, by recipe and
// GPU (exec/plan.h, mp_fp8_te_weight_copy_bytes).
#include <gtest/gtest.h>

#include <vector>

#include "tests/schedule/built.h"

using namespace sched_test;

namespace {

// tiny-dense on dp_replicate=2 (tp 1) under the megatron memory model and the distributed
// optimizer: two layers of Megatron-Core's fused Linears, linear_qkv [64 + 32 + 32, 64] (8
// heads and 4 kv heads of 8), linear_proj [64, 64], linear_fc1 [192 + 192, 64], linear_fc2
// [64, 192]: 8,192 + 4,096 + 24,576 + 12,288 = 49,152 float8 elements a layer, four weights.
constexpr int64_t kLayerElems = 49152, kLayers = 2;

Opts Tiny(int fp8, mp_fp8_recipe r, int cc, int gather) {
  Opts o;
  o.model = "tiny-dense";
  o.mesh = "dp_replicate=2";
  o.seq = 64;
  o.global_batch = 4;
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.dist_opt = 1;
  o.fp8 = fp8;
  o.fp8_recipe = r;
  o.gpu_cc = cc;
  o.fp8_param_gather = gather;
  return o;
}

int64_t Held(const Opts &o) {
  Built b;
  Build(&b, o);
  return b.s->resident_bytes[MP_MEM_FP8];
}

}  // namespace

// Delayed scaling: the workspace's row-major copy and, on the H100 (9.0, TN-only float8
// GEMMs), its transpose, with one fp32 scale_inv a weight: 2 x 49,152 + 4 x 4 bytes a layer on
// Hopper, 49,152 + 16 on the B200 (10.0). Under --fp8-param-gather the weight is the float8
// parameter (counted with the parameters): its transpose alone on Hopper, nothing on the B200.
// bf16 holds none.
TEST(Fp8WeightCopies, HopperBlackwellParamGatherBf16) {
  EXPECT_EQ(Held(Tiny(1, MP_FP8_DELAYED, 90, 0)), kLayers * (2 * kLayerElems + 16));
  EXPECT_EQ(Held(Tiny(1, MP_FP8_DELAYED, 100, 0)), kLayers * (kLayerElems + 16));
  EXPECT_EQ(Held(Tiny(1, MP_FP8_DELAYED, 90, 1)), kLayers * kLayerElems);
  EXPECT_EQ(Held(Tiny(1, MP_FP8_DELAYED, 100, 1)), 0);
  EXPECT_EQ(Held(Tiny(1, MP_FP8_TENSORWISE, 90, 0)), kLayers * (2 * kLayerElems + 16));
  EXPECT_EQ(Held(Tiny(0, MP_FP8_DEFAULT, 90, 0)), 0);
}

// torchao's Float8Linear (torchtitan) casts its weight in each forward and again in backward
// (torchao/float8/float8_linear.py saves the high-precision weight): nothing held.
TEST(Fp8WeightCopies, TorchaoHoldsNone) {
  Opts o = Tiny(1, MP_FP8_TENSORWISE, 90, 0);
  o.mem_model = MP_MEM_MODEL_TORCHTITAN;
  o.mesh = "dp_shard=2";
  o.dist_opt = 0;
  EXPECT_EQ(Held(o), 0);
}

// MXFP8 (B200): a row-wise and a column-wise copy, E8M0 scales [roundup(rows, 128),
// roundup(cols / 32, 4)] and [roundup(rows / 32, 4), roundup(cols, 128)] a weight:
//   qkv [128, 64]:  16,384 + 128 x 4 + 4 x 128    = 17,408
//   proj [64, 64]:   8,192 + 128 x 4 + 4 x 128    =  9,216
//   fc1 [384, 64]:  49,152 + 384 x 4 + 12 x 128   = 52,224
//   fc2 [64, 192]:  24,576 + 128 x 8 + 4 x 256    = 26,624
// 105,472 a layer. Fused as Megatron-Core builds them: q, k and v apart would pad k's and v's
// 32 rows to 128 each.
TEST(Fp8WeightCopies, Mxfp8ScalesPadded) {
  EXPECT_EQ(Held(Tiny(1, MP_FP8_MXFP8, 100, 0)), kLayers * 105472);
}

namespace {

// Llama 3.1 8B (every dim a multiple of 128, so blockwise's 128 x 128 tiles apply): 32 layers
// of qkv [6144, 4096], proj [4096, 4096], fc1 [28672, 4096], fc2 [4096, 14336], 218,103,808
// elements a layer; dp_replicate=8 with the distributed optimizer.
Opts Llama(mp_fp8_recipe r, int gather) {
  Opts o = sched_test::Megatron("dp_replicate=8");
  o.fp8 = 1;
  o.fp8_recipe = r;
  o.gpu_cc = 90;
  o.dist_opt = 1;
  o.global_batch = 16;
  o.fp8_param_gather = gather;
  return o;
}

}  // namespace

// Blockwise: both copies and their fp32 scales, [ceil(rows / 128), roundup(ceil(cols / 128),
// 4)] row-wise and [ceil(cols / 128), roundup(ceil(rows / 128), 4)] column-wise:
//   qkv 48 x 32 + 32 x 48 = 3,072;  proj 32 x 32 x 2 = 2,048;  fc1 224 x 32 x 2 = 14,336;
//   fc2 32 x 112 x 2 = 7,168: 26,624 scales, 106,496 bytes a layer,
// held through the step: 32 x (2 x 218,103,808 + 106,496). Under --fp8-param-gather the
// column-wise copy and its scales (218,103,808 + 53,248 a layer) are made in each layer's
// forward of the first micro-batch and freed in the optimizer step: none resident.
TEST(Fp8WeightCopies, BlockwiseAndItsStepCopy) {
  constexpr int64_t kElems = 218103808;
  EXPECT_EQ(Held(Llama(MP_FP8_BLOCKWISE, 0)), 32 * (2 * kElems + 106496));
  Built b;
  Build(&b, Llama(MP_FP8_BLOCKWISE, 1));
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_FP8], 0);
  std::vector<int> made, freed;
  for (const Inst &x : Expand(b.s)) {
    const mp_op *op = x.op;
    if (op->mem_cat != MP_MEM_FP8 || op->mem_bytes != kElems + 53248) continue;
    if (op->type == MP_OP_ALLOC) {
      EXPECT_EQ(op->phase, MP_PHASE_FORWARD);
      EXPECT_EQ(op->when, MP_WHEN_FIRST_MICRO);
      made.push_back(x.layer);
    } else if (op->type == MP_OP_FREE) {
      EXPECT_EQ(op->phase, MP_PHASE_OPTIMIZER);
      freed.push_back(x.layer);
    }
  }
  std::vector<int> layers;
  for (int l = 0; l < 32; l++) layers.push_back(l);
  EXPECT_EQ(made, layers);
  EXPECT_EQ(freed, layers);
}

// The rule itself, one weight at a time: bytes an element by recipe and GPU, and a per-tensor
// weight's scale (4 bytes) that a float8 weight's transpose shares.
TEST(Fp8WeightCopies, RuleByRecipeAndGpu) {
  EXPECT_EQ(mp_fp8_te_copies_per_elem(MP_FP8_DELAYED, 90, 0), 2);
  EXPECT_EQ(mp_fp8_te_copies_per_elem(MP_FP8_DELAYED, 100, 0), 1);
  EXPECT_EQ(mp_fp8_te_copies_per_elem(MP_FP8_TENSORWISE, 120, 0), 2);  // RTX Blackwell: TN only
  EXPECT_EQ(mp_fp8_te_copies_per_elem(MP_FP8_DELAYED, 100, 1), 0);
  EXPECT_EQ(mp_fp8_te_copies_per_elem(MP_FP8_BLOCKWISE, 100, 0), 2);
  EXPECT_EQ(mp_fp8_te_copies_per_elem(MP_FP8_BLOCKWISE, 90, 1), 1);
  EXPECT_EQ(mp_fp8_te_weight_copy_bytes(MP_FP8_DELAYED, 90, 0, 4096, 4096), 2 * 4096 * 4096 + 4);
  EXPECT_EQ(mp_fp8_te_weight_copy_bytes(MP_FP8_DELAYED, 90, 1, 4096, 4096), 4096 * 4096);
  EXPECT_TRUE(mp_fp8_te_copy_per_step(MP_FP8_BLOCKWISE, 1));
  EXPECT_FALSE(mp_fp8_te_copy_per_step(MP_FP8_BLOCKWISE, 0));
  EXPECT_FALSE(mp_fp8_te_copy_per_step(MP_FP8_DELAYED, 1));
}
