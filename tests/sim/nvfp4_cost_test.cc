// NVFP4 (Transformer Engine's NVFP4BlockScaling) priced from its mechanism: a GEMM marked
// mp_op.fp4 runs on the GPU's FP4 tensor cores at the stack's bf16 ceiling times the GPU's
// NVFP4-over-bf16 kernel fraction (sim/cost.c), the weight copies Transformer Engine holds
// (exec/plan.c), and the refusal on a GPU without FP4 tensor cores, each by hand.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "sim/sim.h"
#include "tests/sim/round_figures.h"

namespace {

// round_figures.h's GPU (bf16 1000 TFLOP/s, fp8 2000, HBM 1000 GB/s) with FP4 tensor cores
// of 4000 TFLOP/s whose NVFP4 GEMMs reach 0.3 of that peak where bf16 GEMMs reach 0.6 of
// theirs, compute capability 10.0.
mp_gpu Blackwell() {
  mp_gpu g = Cluster().gpu;
  g.compute_capability = 100;
  g.fp4_tflops = 4000;
  g.kernel_eff.bf16_gemm = 0.6;
  g.kernel_eff.fp8_gemm = 0.62;
  g.kernel_eff.flash_attention = 0.3;
  g.kernel_eff.fp4_gemm = 0.3;
  return g;
}

// One Linear's forward GEMM, o_proj of Llama 3.1 8B on 8192 tokens: [8192 x 4096] x
// [4096 x 4096], 2 x 8192 x 4096 x 4096 = 2.74877906944e11 FLOPs.
mp_op Linear(int fp4) {
  mp_op o;
  memset(&o, 0, sizeof o);
  o.type = MP_OP_COMPUTE;
  o.kernel = MP_KERNEL_GEMM;
  o.dtype = MP_DTYPE_FP8_E4M3;
  o.m = 8192;
  o.n = o.k = 4096;
  o.batch = 1;
  o.flops = 2.0 * 8192.0 * 4096.0 * 4096.0;
  // NVFP4 operands: half a byte and an E4M3 scale per 16 an element (0.5625), the bf16 output
  o.bytes = (8192.0 * 4096 + 4096.0 * 4096) * 0.5625 + 8192.0 * 4096 * 2;
  o.fp4 = (uint8_t)fp4;
  return o;
}

}  // namespace

TEST(Nvfp4Cost, GemmOnTheFp4TensorCores) {
  // The stack's bf16 ceiling 0.6 (half_mnk 0: every size) carried by 0.3 / 0.6: 0.3 of the
  // 4000 TFLOP/s FP4 peak, 2.74877906944e11 / 1.2e15 = 229.065 us; its bytes, (8192 x 4096 +
  // 4096^2) x 0.5625 + 8192 x 4096 x 2 = 95,420,416 at 500 GB/s (hbm_eff 0.5) = 190.8 us,
  // under it. The same GEMM unmarked is a float8 one: 0.62 of 2000, 2.74877906944e11 /
  // 1.24e15 = 221.676 us.
  mp_stack_profile p = Profile();
  p.gemm_eff_max = 0.6;
  p.fp8_gemm_eff_max = 0.62;
  const mp_gpu g = Blackwell();
  const mp_op f4 = Linear(1), f8 = Linear(0);
  EXPECT_NEAR(mp_sim_compute_op_s(&f4, &g, &p), 2.74877906944e11 / 1.2e15, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&f8, &g, &p), 2.74877906944e11 / 1.24e15, 1e-12);
  // A GPU twice as fast in FP4 at the same fraction would take 114.5 us of arithmetic: the
  // GEMM is then bound by its 190.8 us of HBM traffic.
  mp_gpu fast = g;
  fast.fp4_tflops = 8000;
  EXPECT_NEAR(mp_sim_compute_op_s(&f4, &fast, &p), 95420416.0 / 5e11, 1e-12);
}

TEST(Nvfp4Cost, WeightCopiesTransformerEngineHolds) {
  // o_proj [4096, 4096]: a row-wise and a column-wise copy, half a byte an element each
  // (4096^2 = 16,777,216 bytes), E4M3 scales [roundup(4096, 128), roundup(4096 / 16, 4)] =
  // 4096 x 256 each (2 x 1,048,576) and two fp32 amaxes (8): 18,874,376 bytes on any
  // Blackwell GPU. A [1000-row] weight pads its scales' rows to 1024 and its column-wise
  // scales' 1000 / 16 = 62 to 64: 4096 x 1000 + 1024 x 256 + 4096 x 64 + 8 = 4,620,296.
  EXPECT_EQ(mp_fp8_te_weight_copy_bytes(MP_FP8_NVFP4, 100, 0, 4096, 4096), 18874376);
  EXPECT_EQ(mp_fp8_te_weight_copy_bytes(MP_FP8_NVFP4, 103, 0, 4096, 4096), 18874376);
  EXPECT_EQ(mp_fp8_te_weight_copy_bytes(MP_FP8_NVFP4, 100, 0, 1000, 4096), 4620296);
  EXPECT_EQ(mp_fp8_te_copies_per_elem(MP_FP8_NVFP4, 100, 0), 1);
}

TEST(Nvfp4Cost, RefusedOffBlackwellByName) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu h100;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &h100), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_sim_fp8_recipe_check(&ctx, &h100, MP_FP8_NVFP4), MP_ERR_INVALID);
  const std::string msg = mp_errmsg(&ctx);
  EXPECT_NE(msg.find("nvfp4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("h100-sxm is 9.0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("FP4 tensor cores"), std::string::npos) << msg;
  // the A100, without float8 units, too (where float8 recipes fall back to bf16)
  mp_gpu a100;
  ASSERT_EQ(mp_gpu_load(&ctx, "a100-80gb-sxm", &a100), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_sim_fp8_recipe_check(&ctx, &a100, MP_FP8_NVFP4), MP_ERR_INVALID);
  // the Blackwell profiles run it: each states its FP4 peak and NVFP4 GEMM fraction
  for (const char *name : {"b200", "gb200", "gb300"}) {
    mp_gpu g;
    ASSERT_EQ(mp_gpu_load(&ctx, name, &g), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(mp_sim_fp8_recipe_check(&ctx, &g, MP_FP8_NVFP4), MP_OK) << name << ": " << mp_errmsg(&ctx);
  }
  // a Blackwell GPU whose profile states no FP4 peak is refused by name too
  mp_gpu bare = Blackwell();
  snprintf(bare.name, sizeof bare.name, "bare");
  bare.fp4_tflops = 0;
  bare.kernel_eff.fp4_gemm = 0;
  EXPECT_EQ(mp_sim_fp8_recipe_check(&ctx, &bare, MP_FP8_NVFP4), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("bare"), std::string::npos) << mp_errmsg(&ctx);
}
