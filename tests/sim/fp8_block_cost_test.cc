// Hopper's block-scaled float8 GEMMs (mp_op.fp8_block MP_FP8_BLOCK_HOPPER: Transformer Engine's
// blockwise recipe, 1x128 and 128x128 scales on cuBLASLt's VEC128 and BLK128x128 modes) and
// Blackwell's MXFP8 ones (MP_FP8_BLOCK_MX: an E8M0 scale per 32, VEC32_UE8M0) priced at the
// stack's stated speed of each over its bf16 GEMMs (fp8_block_gemm_vs_bf16,
// mxfp8_gemm_vs_bf16, sim/cost.c), each time by hand.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "exec/schedule.h"
#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/sim/round_figures.h"

namespace {

// round_figures.h's stack with GEMMs at 0.6 of the bf16 peak and 0.62 of the float8 peak at
// every size (half_mnk 0), HBM at half its rate, no launch overhead; Hopper's block-scaled
// float8 GEMMs at vs_bf16 times its bf16 ones and MXFP8 ones at mx_vs_bf16 (0: none stated).
mp_stack_profile Stack(double vs_bf16, double mx_vs_bf16 = 0) {
  mp_stack_profile p = Profile();
  p.gemm_eff_max = 0.6;
  p.fp8_gemm_eff_max = 0.62;
  p.fp8_block_gemm_vs_bf16 = vs_bf16;
  p.mxfp8_gemm_vs_bf16 = mx_vs_bf16;
  return p;
}

// round_figures.h's GPU: bf16 1000 TFLOP/s, float8 2000, HBM 1000 GB/s.
mp_gpu Gpu() { return Cluster().gpu; }

// An 8192^3 GEMM: 2 x 8192^3 = 1.099511627776e12 FLOPs; its bytes (at most 3 x 8192^2 x 2 =
// 403 MB, 805 us at 500 GB/s in bf16, 537 us in float8) stay under its arithmetic at any of
// these rates (1833 us in bf16, 887 us or more in float8).
mp_op Gemm(int dtype, int block) {
  mp_op o;
  memset(&o, 0, sizeof o);
  o.type = MP_OP_COMPUTE;
  o.kernel = MP_KERNEL_GEMM;
  o.dtype = (uint8_t)dtype;
  o.m = o.n = o.k = 8192;
  o.batch = 1;
  o.flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
  o.bytes = mp_gemm_bytes(8192.0, 8192.0, 8192.0, 1.0, mp_dtype_bytes((mp_dtype)dtype));
  o.fp8_block = (uint8_t)block;
  return o;
}

constexpr double kFlops = 1.099511627776e12;

}  // namespace

TEST(Fp8BlockCost, BlockScaledAtItsSpeedOverBf16) {
  // 1.75x the bf16 GEMMs: a ceiling of 0.6 x 1.75 x 1000 / 2000 = 0.525 of the float8 peak,
  // 1.099511627776e12 / (2e15 x 0.525) = 1047.154 us; the per-tensor float8 GEMM
  // 1.099511627776e12 / (2e15 x 0.62) = 886.703 us; bf16 / (1e15 x 0.6) = 1832.519 us, 1.75x
  // the block-scaled one.
  const mp_stack_profile p = Stack(1.75);
  const mp_gpu g = Gpu();
  const mp_op blk = Gemm(MP_DTYPE_FP8_E4M3, 1), f8 = Gemm(MP_DTYPE_FP8_E4M3, 0), bf = Gemm(MP_DTYPE_BF16, 0);
  EXPECT_NEAR(mp_sim_compute_op_s(&blk, &g, &p), kFlops / (2e15 * 0.525), 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&f8, &g, &p), kFlops / (2e15 * 0.62), 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&bf, &g, &p) / mp_sim_compute_op_s(&blk, &g, &p), 1.75, 1e-12);
  // E5M2 operands (a hybrid recipe's gradients) are float8 GEMMs the same
  const mp_op e5 = Gemm(MP_DTYPE_FP8_E5M2, 1);
  EXPECT_NEAR(mp_sim_compute_op_s(&e5, &g, &p), kFlops / (2e15 * 0.525), 1e-12);
}

TEST(Fp8BlockCost, NeverFasterThanPerTensorAndAbsentIsPerTensor) {
  // 2.2x bf16 would be 0.6 x 2.2 / 2 = 0.66 > 0.62: capped at the per-tensor ceiling; with no
  // key the block-scaled GEMM runs at 0.62 too.
  const mp_gpu g = Gpu();
  const mp_op blk = Gemm(MP_DTYPE_FP8_E4M3, 1);
  const mp_stack_profile fast = Stack(2.2), none = Stack(0);
  EXPECT_NEAR(mp_sim_compute_op_s(&blk, &g, &fast), kFlops / (2e15 * 0.62), 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&blk, &g, &none), kFlops / (2e15 * 0.62), 1e-12);
  // a bf16 GEMM marked by mistake is still a bf16 GEMM
  const mp_stack_profile p = Stack(1.75);
  const mp_op bf = Gemm(MP_DTYPE_BF16, 1);
  EXPECT_NEAR(mp_sim_compute_op_s(&bf, &g, &p), kFlops / (1e15 * 0.6), 1e-12);
}

TEST(Fp8BlockCost, Mxfp8AtItsOwnSpeedOverBf16) {
  // mxfp8_gemm_vs_bf16 1.83 (Transformer Engine's B300 benchmark, 13.102 / 7.161 ms): a
  // ceiling of 0.6 x 1.83 x 1000 / 2000 = 0.549 of the float8 peak, 1.099511627776e12 /
  // (2e15 x 0.549) = 1001.377 us, and bf16 / MXFP8 = 1832.519 / 1001.377 = 1.83; the Hopper
  // key (1.549 here) prices only Hopper's kind, 0.6 x 1.549 / 2 = 0.4647, and leaves the MXFP8
  // GEMM alone, as the MXFP8 key leaves the per-tensor one at 0.62.
  const mp_gpu g = Gpu();
  const mp_stack_profile p = Stack(1.549, 1.83);
  const mp_op mx = Gemm(MP_DTYPE_FP8_E4M3, MP_FP8_BLOCK_MX), blk = Gemm(MP_DTYPE_FP8_E4M3, MP_FP8_BLOCK_HOPPER);
  const mp_op f8 = Gemm(MP_DTYPE_FP8_E4M3, 0), bf = Gemm(MP_DTYPE_BF16, 0);
  EXPECT_NEAR(mp_sim_compute_op_s(&mx, &g, &p), kFlops / (2e15 * 0.549), 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&bf, &g, &p) / mp_sim_compute_op_s(&mx, &g, &p), 1.83, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&blk, &g, &p), kFlops / (2e15 * 0.4647), 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&f8, &g, &p), kFlops / (2e15 * 0.62), 1e-12);
  // no MXFP8 key: the per-tensor ceiling, whatever the Hopper key; a faster stated MXFP8
  // speed (2.2x, 0.66) is capped at the per-tensor 0.62
  const mp_stack_profile none = Stack(1.549, 0), fast = Stack(0, 2.2);
  EXPECT_NEAR(mp_sim_compute_op_s(&mx, &g, &none), kFlops / (2e15 * 0.62), 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&mx, &g, &fast), kFlops / (2e15 * 0.62), 1e-12);
}

TEST(Fp8BlockCost, TorchtitanMxfp8OnGb200) {
  // torchtitan-compile on a GB200: its bf16 ceiling 0.50 of the 500 W H100's peak carried by
  // the GPUs' bf16_gemm fractions, 0.50 x 0.602 / 0.685 = 0.439416; the MXFP8 GEMMs at 1.830x
  // that, 0.439416 x 1.830 x 2500 / 5000 = 0.402066 of the fp8 peak, under the per-tensor
  // ceiling carried by the fp8_gemm fractions, 0.47 x 0.624 / 0.709 = 0.413653 (2.9 % faster).
  // An 8192^3 GEMM (size 5.49756e11 against half_mnk 2e9: x0.996375 for every kind) takes
  // 1.099511627776e12 / (5e15 x 0.402066 x 0.996375) = 548.92 us as MXFP8, 1.830x less than in
  // bf16 (1.099511627776e12 / (2.5e15 x 0.439416 x 0.996375) = 1004.53 us), each plus the
  // profile's 2 us launch.
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  mp_gpu g;
  ASSERT_EQ(mp_stack_load(&ctx, "torchtitan-compile", &p), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_gpu_load(&ctx, "gb200", &g), MP_OK) << mp_errmsg(&ctx);
  const double size = 8192.0 * 8192.0 * 8192.0, fill = size / (size + 2e9);
  const double bf16_eff = 0.50 * 0.602 / 0.685, mx_eff = bf16_eff * 1.830 * 2500.0 / 5000.0;
  const double f8_eff = 0.47 * 0.624 / 0.709;
  EXPECT_NEAR(mx_eff, 0.402066, 1e-6);
  EXPECT_NEAR(f8_eff, 0.413653, 1e-6);
  const mp_op mx = Gemm(MP_DTYPE_FP8_E4M3, MP_FP8_BLOCK_MX), f8 = Gemm(MP_DTYPE_FP8_E4M3, 0);
  const mp_op bf = Gemm(MP_DTYPE_BF16, 0);
  const double launch = 2e-6;
  EXPECT_NEAR(mp_sim_compute_op_s(&mx, &g, &p), kFlops / (5e15 * mx_eff * fill) + launch, 1e-9);
  EXPECT_NEAR(mp_sim_compute_op_s(&mx, &g, &p), 550.92e-6, 0.01e-6);
  EXPECT_NEAR(mp_sim_compute_op_s(&bf, &g, &p), 1006.53e-6, 0.01e-6);
  EXPECT_NEAR(mp_sim_compute_op_s(&f8, &g, &p), kFlops / (5e15 * f8_eff * fill) + launch, 1e-9);
  EXPECT_NEAR((mp_sim_compute_op_s(&bf, &g, &p) - launch) / (mp_sim_compute_op_s(&mx, &g, &p) - launch), 1.830,
              1e-9);
}

TEST(Fp8BlockCost, KeyOutOfRangeIsRefused) {
  for (const char *key : {"fp8_block_gemm_vs_bf16", "mxfp8_gemm_vs_bf16"}) {
    for (const char *v : {"4.5", "-1"}) {
      char text[512];
      snprintf(text, sizeof text,
               "{\"name\": \"t\", \"gemm_eff_max\": 0.6, \"gemm_eff_half_mnk\": 0, \"fp8_gemm_eff_max\": 0.62,"
               " \"attention_eff\": 0.5, \"hbm_eff\": 1.0, \"link_eff\": 1.0, \"kernel_overhead_us\": 0,"
               " \"comm_overhead_us\": 0, \"frag_factor\": 1.0, \"source\": \"t\", \"%s\": %s}",
               key, v);
      mp_ctx ctx;
      mp_ctx_init(&ctx);
      mp_stack_profile p;
      EXPECT_EQ(mp_stack_from_text(&ctx, text, "t", &p), MP_ERR_INVALID) << v;
      EXPECT_NE(std::string(mp_errmsg(&ctx)).find(key), std::string::npos) << mp_errmsg(&ctx);
    }
  }
}
