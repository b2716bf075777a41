// Attention on Blackwell priced from its mechanism: the tensor-core part of cuDNN's fused
// attention at the stack's attention_eff carried by the GPU's flash_attention fraction,
// plus the softmax exponentials' exposed time, which the GPU profile states as MUFU.EX2
// results a clock an SM against its dense bf16 FLOPs a clock (data/gpus/*.json
// "attention_exp", sim/cluster.h mp_gpu_attn_exp_flops, sim/cost.c attn_exps). One
// attention core of Llama 3.1 8B derived by hand on the B200 and the GB300; the H100, which
// states no attention_exp, keeps its FLOPs-only price.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

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
// FlashAttention-2 fraction 0.35), launches free.
mp_stack_profile FitOnH100() {
  mp_stack_profile p = Profile();
  p.attention_eff = 0.2823;
  snprintf(p.fit_gpu, sizeof p.fit_gpu, "h100-sxm");
  p.fit_kernel_eff.bf16_gemm = 0.685;
  p.fit_kernel_eff.fp8_gemm = 0.709;
  p.fit_kernel_eff.flash_attention = 0.35;
  return p;
}

// Llama 3.1 8B's attention core on one sequence of 8192 tokens (32 query heads of 128, 8
// key-value heads), causal: 8192 x 8193 / 2 = 33,558,528 score elements a head, forward
// FLOPs 2 x 8192 x 4096.5 x 32 x (128 + 128) = 549,822,922,752, the backward's twice
// (exec/schedule_block.c); bytes Q, O, K, V in bf16 and the fp32 softmax statistics,
// 2 x 8192 x (4096 + 4096 + 1024 + 1024) + 4 x 8192 x 32 = 168,820,736 (the backward's
// read here as the forward's: at 7700 GB/s x 0.5 either is tens of microseconds, far under
// the arithmetic). dt: bf16, or cuDNN's FP8 kernel's E4M3 forward and E5M2 backward
// (exec/schedule_block.c under --fp8-dpa).
mp_op Core(mp_variant v, mp_dtype dt = MP_DTYPE_BF16) {
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

TEST(AttnExp, ProfilesStateTheExponentialUnits) {
  // B200 and GB200: 16 MUFU.EX2 a clock an SM (arXiv 2603.05451); Blackwell Ultra doubles it;
  // 8192 dense bf16 FLOPs a clock an SM on all three (cudnn-frontend runner.py). exposed
  // 0.493 and ref_eff 0.561 fitted over cuDNN 9.19.1 on the GB200 and GB300: an exponential
  // costs 0.493 x 8192 / 16 x 0.561 = 141.605376 FLOPs of tensor-core time, 70.802688 on the
  // GB300. Hopper and Ampere state none.
  struct { const char *gpu; double ex2, flash; } want[] = {
      {"b200", 16, 0.400}, {"gb200", 16, 0.400}, {"gb300", 32, 0.400},
      {"h100-sxm", 0, 0.35}, {"h200", 0, 0.35}, {"a100-80gb-sxm", 0, 0.62},
  };
  for (auto &w : want) {
    SCOPED_TRACE(w.gpu);
    const mp_gpu g = LoadGpu(w.gpu);
    EXPECT_EQ(g.attn_exp.ex2_per_clk, w.ex2);
    EXPECT_EQ(g.kernel_eff.flash_attention, w.flash);
    EXPECT_EQ(g.attn_exp.bf16_flops_per_clk, w.ex2 > 0 ? 8192.0 : 0.0);
    EXPECT_EQ(g.attn_exp.exposed, w.ex2 > 0 ? 0.493 : 0.0);
    EXPECT_EQ(g.attn_exp.ref_eff, w.ex2 > 0 ? 0.561 : 0.0);
  }
  const mp_gpu b = LoadGpu("b200"), u = LoadGpu("gb300");
  EXPECT_NEAR(mp_gpu_attn_exp_flops(&b), 141.605376, 1e-9);
  EXPECT_NEAR(mp_gpu_attn_exp_flops(&u), 70.802688, 1e-9);
}

TEST(AttnExp, OneCoreByHandOnB200AndGB300) {
  const mp_stack_profile p = FitOnH100();
  const mp_op fwd = Core(MP_VAR_FWD), bwd = Core(MP_VAR_BWD);
  // B200: attn_rate = 2250e12 x 0.2823 x 0.400 / 0.35 = 7.259142857e14 FLOP/s; 1,073,872,896
  // exponentials a pass (549,822,922,752 / (4 x 128)) at 141.605376 FLOPs each add
  // 1.520673e11: forward (5.498229e11 + 1.520673e11) / 7.259143e14 = 966.90 us, backward
  // (1.0996458e12 + 1.520673e11) / 7.259143e14 = 1724.32 us. Without the exponentials the
  // forward would take 757.42 us: they add 27.7 % to a forward at head dim 128, 13.8 % to a
  // backward.
  const mp_gpu b = LoadGpu("b200");
  const double b_rate = 2250e12 * 0.2823 * 0.400 / 0.35, exps = 549822922752.0 / 512.0;
  EXPECT_NEAR(mp_gpu_attn_exp_flops(&b), 0.493 * 8192.0 / 16.0 * 0.561, 1e-9);
  EXPECT_NEAR(mp_sim_compute_op_s(&fwd, &b, &p), (549822922752.0 + exps * 141.605376) / b_rate, 1e-10);
  EXPECT_NEAR(mp_sim_compute_op_s(&fwd, &b, &p), 966.90e-6, 0.01e-6);
  EXPECT_NEAR(mp_sim_compute_op_s(&bwd, &b, &p), 1724.32e-6, 0.01e-6);
  // GB300: the same fraction of its 2500 TFLOP/s peak, 8.065714e14 FLOP/s, and half the
  // exponential's cost, 70.802688 FLOPs: forward (5.498229e11 + 7.603366e10) / 8.065714e14
  // = 775.95 us, backward (1.0996458e12 + 7.603366e10) / 8.065714e14 = 1457.63 us.
  const mp_gpu u = LoadGpu("gb300");
  EXPECT_NEAR(mp_gpu_attn_exp_flops(&u), 0.493 * 8192.0 / 32.0 * 0.561, 1e-9);
  EXPECT_NEAR(mp_sim_compute_op_s(&fwd, &u, &p), 775.95e-6, 0.01e-6);
  EXPECT_NEAR(mp_sim_compute_op_s(&bwd, &u, &p), 1457.63e-6, 0.01e-6);
  // The GB200 runs the B200's fractions at the GB300's peak: forward + backward 2422.11 us,
  // 1.0844x the GB300's 2233.57, where cuDNN 9.19.1 measures 2.785 / 2.568 = 1.0845x at
  // this shape (cudnn-frontend sdpa_benchmark_training, df73764): the fit reproduces its
  // pair. A forward alone gains 1.121x, a backward 1.065x.
  const mp_gpu g = LoadGpu("gb200");
  const double g_pair = mp_sim_compute_op_s(&fwd, &g, &p) + mp_sim_compute_op_s(&bwd, &g, &p);
  const double u_pair = mp_sim_compute_op_s(&fwd, &u, &p) + mp_sim_compute_op_s(&bwd, &u, &p);
  EXPECT_NEAR(g_pair, 2422.11e-6, 0.01e-6);
  EXPECT_NEAR(g_pair / u_pair, 2.785 / 2.568, 2e-3);
}

// Transformer Engine's float8 attention (--fp8-dpa; Megatron-Core's
// --fp8-dot-product-attention) priced as cuDNN's FP8 fused attention against its bf16 kernel
// (sim/cluster.c, mp_attn_fp8_flops): the tensor-core part 4.510 / 2.837 = 1.590x faster, the
// softmax exponentials' exposed time 2.018 / 1.014 = 1.990x the bf16 one, both fitted over
// cudnn-frontend's SDPA training benchmark on the GB200 and GB300 (fb682ce,
// benchmark/sdpa_benchmark_training/results/llama3.1). The same core by hand in FP8.
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

TEST(AttnExp, HopperKeepsItsFlopsOnlyPrice) {
  // The H100 SXM states no attention_exp: 5.498229e11 / (989.4e12 x 0.2823) = 1968.52 us,
  // the fit GPU's rate to the bit; the ring's merge kernels (k = 0) on the B200 likewise
  // take their FLOPs alone.
  const mp_stack_profile p = FitOnH100();
  const mp_gpu h = LoadGpu("h100-sxm");
  const mp_op fwd = Core(MP_VAR_FWD);
  EXPECT_EQ(mp_gpu_attn_exp_flops(&h), 0.0);
  EXPECT_EQ(mp_sim_compute_op_s(&fwd, &h, &p), 549822922752.0 / (989.4e12 * 0.2823));
  mp_op merge = Core(MP_VAR_FWD);
  merge.k = 0;
  merge.flops = 4.0 * 8192 * 4096;
  merge.bytes = 0;
  const mp_gpu b = LoadGpu("b200");
  EXPECT_DOUBLE_EQ(mp_sim_compute_op_s(&merge, &b, &p), merge.flops / (2250e12 * 0.2823 * 0.400 / 0.35));
}

TEST(AttnExp, TheKernelLineSaysWhatAnExponentialCosts) {
  // On the B200 the H100 fit's ratios are 0.602 / 0.685 = 0.879 (GEMM), 0.400 / 0.35 = 1.143
  // (the attention's tensor-core part), 0.624 / 0.709 = 0.880 (fp8 GEMM), and an exponential
  // costs 141.605 FLOPs; on the H100 the line stops at its fractions.
  const mp_stack_profile p = FitOnH100();
  const mp_gpu b = LoadGpu("b200"), h = LoadGpu("h100-sxm");
  char line[512];
  mp_stack_kernel_scale_format(&p, &b, line, sizeof line);
  EXPECT_STREQ(line, "test fitted on h100-sxm; on b200 GEMM x0.879, flash attention x1.143, fp8 GEMM x0.880; "
                     "attention's softmax exponentials 141.6 FLOPs of tensor-core time each (MUFU.EX2 16 a clock "
                     "an SM)");
  mp_stack_kernel_scale_format(&p, &h, line, sizeof line);
  EXPECT_STREQ(line, "test fitted on h100-sxm: efficiencies as stated");
}

TEST(AttnExp, BadFiguresAreRefused) {
  const std::string head = "{\"name\": \"g\", \"peak_tflops\": {\"bf16\": 2500, \"fp32\": 80}, "
                           "\"mem_gib\": 186, \"hbm_GBps\": 8000, \"nvlink_GBps_per_dir\": 900, "
                           "\"attention_exp\": ";
  struct { std::string ae, want; } cases[] = {
      {"{\"ex2_per_clk\": 16, \"bf16_flops_per_clk\": 8192, \"exposed\": 1.5, \"ref_eff\": 0.5, \"source\": \"s\"}",
       "g.json: attention_exp.exposed = 1.5 is out of range; accepted [0, 1]"},
      {"{\"ex2_per_clk\": 0, \"bf16_flops_per_clk\": 8192, \"exposed\": 0.5, \"ref_eff\": 0.5, \"source\": \"s\"}",
       "g.json: attention_exp.ex2_per_clk = 0 is out of range; accepted (0, 100000]"},
      {"{\"ex2_per_clk\": 16, \"bf16_flops_per_clk\": 8192, \"exposed\": 0.5, \"source\": \"s\"}",
       "g.json: attention_exp: missing required key 'ref_eff'"},
      {"{\"ex2_per_clk\": 16, \"bf16_flops_per_clk\": 8192, \"exposed\": 0.5, \"ref_eff\": 0.5}",
       "g.json: attention_exp: missing 'source': name the measurements the figures come from"},
      {"16", "g.json: attention_exp must be an object of ex2_per_clk, bf16_flops_per_clk, exposed, ref_eff and "
             "source"},
  };
  for (auto &c : cases) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_gpu g;
    const std::string text = head + c.ae + "}";
    EXPECT_EQ(mp_gpu_from_text(&ctx, text.c_str(), "g.json", &g), MP_ERR_INVALID) << c.want;
    EXPECT_EQ(std::string(mp_errmsg(&ctx)), c.want);
  }
}
