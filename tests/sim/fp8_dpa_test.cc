// Transformer Engine's float8 attention (--fp8-dpa; Megatron-Core's
// --fp8-dot-product-attention) priced as cuDNN's FP8 fused attention against its bf16 kernel
// (sim/cluster.c, mp_attn_fp8_flops): the tensor-core part 4.510 / 2.837 = 1.590x faster, the
// softmax exponentials' exposed time 2.018 / 1.014 = 1.990x the bf16 one, both fitted over
// cudnn-frontend's SDPA training benchmark on the GB200 and GB300 (fb682ce,
// benchmark/sdpa_benchmark_training/results/llama3.1). One attention core of Llama 3.1 8B
// derived by hand on the B200 and the GB300.
#include <gtest/gtest.h>

#include <cstring>

#include "exec/schedule.h"
#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/sim/round_figures.h"

namespace {

mp_gpu LoadGpu(const char *name) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  EXPECT_EQ(mp_gpu_load(&ctx, name, &g), MP_OK) << mp_errmsg(&ctx);
  return g;
}

// Profile() with Megatron-Core's attention efficiency fitted on the H100 SXM (its
// FlashAttention-2 fraction 0.35), launches free (as tests/sim/attn_exp_test.cc).
mp_stack_profile FitOnH100() {
  mp_stack_profile p = Profile();
  p.attention_eff = 0.2823;
  snprintf(p.fit_gpu, sizeof p.fit_gpu, "h100-sxm");
  p.fit_kernel_eff.bf16_gemm = 0.685;
  p.fit_kernel_eff.fp8_gemm = 0.709;
  p.fit_kernel_eff.flash_attention = 0.35;
  return p;
}

// Llama 3.1 8B's causal attention core on one sequence of 8192 tokens (32 query heads of
// 128): forward FLOPs 549,822,922,752, the backward's twice; 1,073,872,896 exponentials a
// pass (549,822,922,752 / (4 x 128)). dt: bf16, or the FP8 kernel's E4M3 forward and E5M2
// backward (exec/schedule_block.c under fp8_dpa).
mp_op Core(mp_variant v, mp_dtype dt) {
  mp_op o;
  memset(&o, 0, sizeof o);
  o.type = MP_OP_COMPUTE;
  o.kernel = MP_KERNEL_ATTENTION;
  o.variant = (uint8_t)v;
  o.dtype = (uint8_t)dt;
  o.m = 8192;
  o.n = 8192;
  o.k = 128;
  o.batch = 32;
  o.flops = (v == MP_VAR_BWD ? 2.0 : 1.0) * 549822922752.0;
  o.bytes = 168820736.0;
  return o;
}

}  // namespace

TEST(Fp8Dpa, OneCoreByHandOnB200AndGB300) {
  const mp_stack_profile p = FitOnH100();
  const mp_op fwd = Core(MP_VAR_FWD, MP_DTYPE_FP8_E4M3), bwd = Core(MP_VAR_BWD, MP_DTYPE_FP8_E5M2);
  // B200: attn_rate 2250e12 x 0.2823 x 0.400 / 0.35 = 7.259143e14 FLOP/s; an exponential
  // 0.493 x 8192 / 16 x 0.561 = 141.605376 FLOPs, x 1.990 in FP8: 1.073873e9 x 141.605376 x
  // 1.990138 = 3.026327e11. Tensor-core part 5.498229e11 / 1.589707 = 3.458642e11.
  // Forward (3.458642e11 + 3.026327e11) / 7.259143e14 = 893.35 us (bf16: 966.90),
  // backward (6.917284e11 + 3.026327e11) / 7.259143e14 = 1369.81 us (bf16: 1724.32).
  const mp_gpu b = LoadGpu("b200");
  const double b_rate = 2250e12 * 0.2823 * 0.400 / 0.35, exps = 549822922752.0 / 512.0;
  const double tc = 4.510 / 2.837, ex = 2.018 / 1.014;
  EXPECT_NEAR(mp_sim_compute_op_s(&fwd, &b, &p), (549822922752.0 / tc + exps * 141.605376 * ex) / b_rate, 1e-10);
  EXPECT_NEAR(mp_sim_compute_op_s(&fwd, &b, &p), 893.35e-6, 0.01e-6);
  EXPECT_NEAR(mp_sim_compute_op_s(&bwd, &b, &p), 1369.81e-6, 0.01e-6);
  // GB300: 8.065714e14 FLOP/s and half the exponential's cost (MUFU.EX2 32 a clock an SM):
  // forward (3.458642e11 + 1.513163e11) / 8.065714e14 = 616.41 us (bf16: 775.95), backward
  // (6.917284e11 + 1.513163e11) / 8.065714e14 = 1045.22 us (bf16: 1457.63).
  const mp_gpu u = LoadGpu("gb300");
  EXPECT_NEAR(mp_sim_compute_op_s(&fwd, &u, &p), 616.41e-6, 0.01e-6);
  EXPECT_NEAR(mp_sim_compute_op_s(&bwd, &u, &p), 1045.22e-6, 0.01e-6);
  // Forward + backward, bf16 over FP8: 1.189x on the B200 and GB200 (whose exponentials cost
  // the same) and 1.344x on the GB300, where cuDNN 9.22 measures 5.524 / 4.855 = 1.138x and
  // 5.017 / 3.846 = 1.304x at batch 2: the GB300 gains more, its exponentials being cheaper;
  // the bf16 price (exposed 0.493, fitted on cuDNN 9.19.1) is what the two ratios scale.
  const mp_op bf = Core(MP_VAR_FWD, MP_DTYPE_BF16), bb = Core(MP_VAR_BWD, MP_DTYPE_BF16);
  const double b_gain = (mp_sim_compute_op_s(&bf, &b, &p) + mp_sim_compute_op_s(&bb, &b, &p)) /
                        (mp_sim_compute_op_s(&fwd, &b, &p) + mp_sim_compute_op_s(&bwd, &b, &p));
  const double u_gain = (mp_sim_compute_op_s(&bf, &u, &p) + mp_sim_compute_op_s(&bb, &u, &p)) /
                        (mp_sim_compute_op_s(&fwd, &u, &p) + mp_sim_compute_op_s(&bwd, &u, &p));
  EXPECT_NEAR(b_gain, 1.1891, 1e-4);
  EXPECT_NEAR(u_gain, 1.3442, 1e-4);
}
