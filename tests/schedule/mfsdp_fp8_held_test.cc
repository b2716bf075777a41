// Transformer Engine's float8 weight copies a GPU holds under Megatron FSDP (Megatron-Core's
// --use-megatron-fsdp, optim_grads_params, core_v0.14.0) with float8 current scaling on
// Blackwell (compute capability 10.0, float8 GEMMs of any layout), against hand counts:
//   without --fp8-param-gather the gathered bf16 weight is cast into the module's cached
//       workspace (TransformerEngineBaseModule.get_weight_workspace, module/base.py v2.8,
//       cache_name "weight" whenever Megatron-Core passes is_first_microbatch: module.py
//       set_is_first_microbatch, which Megatron FSDP leaves on): one byte an element of
//       every tp-local float8 weight and an fp32 scale_inv a (fused) weight, held through
//       the step on every rank, whatever its FSDP shard;
//   with it the float8 model weight is the gathered tensor itself (get_weight_workspace
//       returns a QuantizedTensor as it is), and on Blackwell no transpose is made
//       (nvte_is_non_tn_fp8_gemm_supported): nothing held beyond the weights' shards. On
//       Hopper the transpose Transformer Engine makes in a Linear's forward and backward
//       (linear.py update_usage(columnwise_usage=True)) is dropped by Megatron FSDP after
//       the layer's forward and backward (megatron_fsdp.py release_module_parameters,
//       keep_fp8_transpose_cache False): the layer's transposes are a transient of each.
#include <gtest/gtest.h>

#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Opts;

Opts Mfsdp(const char *model, const char *mesh, int gather, int64_t seq, int cc = 100) {
  Opts o = sched_test::Megatron(mesh);
  o.model = model;
  o.seq = seq;
  o.fp8 = 1;
  o.fp8_recipe = MP_FP8_TENSORWISE;  // Transformer Engine's current scaling
  o.gpu_cc = cc;                     // 100: B200, GB200; 90: H100
  o.dist_opt = 1;
  o.dp_overlap = 1;
  o.fsdp_double_buffer = 1;
  o.fp8_param_gather = gather;
  return o;
}

int64_t Held(const Opts &o) {
  Built b;
  sched_test::Build(&b, o);
  EXPECT_TRUE(mp_plan_is_megatron_fsdp(b.plan));
  return b.s->resident_bytes[MP_MEM_FP8];
}

// tiny-dense (d 64, 8 heads and 4 KV heads of 8, d_ff 192, 2 layers) on tp=2: a layer's
// linear_qkv (64 + 32 + 32) x 64 / 2 = 4,096, linear_proj 64 x 64 / 2 = 2,048, linear_fc1
// (192 + 192) x 64 / 2 = 12,288, linear_fc2 64 x 192 / 2 = 6,144: 24,576 bytes and 4 scales
// of 4 bytes; 2 layers: 2 x (24,576 + 16) = 49,184 bytes on each of the 8 ranks.
TEST(MfsdpFp8Held, TinyByHand) {
  EXPECT_EQ(Held(Mfsdp("tiny-dense", "dp_shard=4,tp=2", 0, 64)), 49184);
  EXPECT_EQ(Held(Mfsdp("tiny-dense", "dp_shard=4,tp=2", 1, 64)), 0);
}

// Llama 3.1 405B (d 16384, 128 heads and 8 KV heads of 128, d_ff 53248, 126 layers) on the
// Megatron-Bridge GB200 layout (128 GPUs, TP 2, Megatron FSDP over 64): a layer's
// linear_qkv (16384 + 1024 + 1024) x 16384 / 2 = 150,994,944, linear_proj 16384^2 / 2 =
// 134,217,728, linear_fc1 2 x 53248 x 16384 / 2 = 872,415,232, linear_fc2 the half of it,
// 436,207,616: 1,593,835,520 bytes and 16 of scales; 126 layers: 200,823,277,536 bytes
// (187.03 GiB) without --fp8-param-gather; none with it (Megatron-Bridge's fp8_cs precision,
// bf16_with_fp8_current_scaling_mixed, sets fp8_param_gather).
TEST(MfsdpFp8Held, Llama405bGb200ByHand) {
  EXPECT_EQ(Held(Mfsdp("llama3.1-405b", "dp_shard=64,tp=2", 0, 8192)), 126 * (1593835520LL + 16));
  EXPECT_EQ(Held(Mfsdp("llama3.1-405b", "dp_shard=64,tp=2", 1, 8192)), 0);
}

// Hopper, tiny-dense on tp=2 with --fp8-param-gather: a layer's float8 weights' transposes,
// 24,576 bytes (their scale_inv is the weight's own), exist from the layer's forward to its
// end and again through its backward, every micro-batch; none is held through the step.
// The distributed optimizer (dp_replicate=4) keeps them (Float8Tensor's _transpose, which
// nothing drops but the optimizer step's cast): 2 x 24,576 resident.
TEST(MfsdpFp8Held, HopperTransposesPerLayer) {
  Opts o = Mfsdp("tiny-dense", "dp_shard=4,tp=2", 1, 64, 90);
  EXPECT_EQ(Held(o), 0);
  Built b;
  sched_test::Build(&b, o);
  int fwd = 0, bwd = 0;
  for (const sched_test::Inst &x : sched_test::Expand(b.s))
    if (x.layer == 0 && x.op->type == MP_OP_ALLOC && x.op->mem_cat == MP_MEM_FP8 && x.op->mem_bytes == 24576) {
      EXPECT_NE(x.op->when, MP_WHEN_FIRST_MICRO);
      (x.op->phase == MP_PHASE_BACKWARD ? bwd : fwd)++;
    }
  EXPECT_EQ(fwd, 1);
  EXPECT_EQ(bwd, 1);
  Opts d = o;
  d.mesh = "dp_replicate=4,tp=2";
  Built k;
  sched_test::Build(&k, d);
  EXPECT_FALSE(mp_plan_is_megatron_fsdp(k.plan));
  EXPECT_EQ(k.s->resident_bytes[MP_MEM_FP8], 2 * 24576);
}

}  // namespace
