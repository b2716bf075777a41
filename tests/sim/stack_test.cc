// sim/stack.h: a stack's kernel efficiencies carried from the GPU it was fitted on to the
// GPU it is evaluated on (mp_stack_kernel_scale_of, applied in sim/cost.c), each against
// a hand calculation on the round-number figures (GEMM 0.5, float8 0.25, attention 0.4);
// fit_gpu's refusals; the shipped profiles' fit GPUs.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/sim/round_figures.h"

namespace {

// GPU "y": the round-number cluster's GPU (1000 TFLOP/s bf16, 2000 fp8) with kernel
// fractions bf16 GEMM 0.96, fp8 GEMM 0.6, flash attention 0.62.
mp_gpu GpuY() {
  mp_gpu g = Cluster().gpu;
  snprintf(g.name, sizeof g.name, "y");
  g.kernel_eff = {0.96, 0.6, 0.62};
  return g;
}

// A GEMM of 8192 x 4096 x 4096 (2.749e11 FLOP per batch entry) with a token byte count,
// so the roofline's max is always its FLOP time.
mp_op Gemm(mp_dtype dt = MP_DTYPE_BF16, int64_t batch = 1) {
  mp_op o;
  memset(&o, 0, sizeof o);
  o.type = MP_OP_COMPUTE;
  o.kernel = MP_KERNEL_GEMM;
  o.dtype = dt;
  o.m = 8192, o.n = 4096, o.k = 4096, o.batch = batch;
  o.flops = 2.0 * 8192 * 4096 * 4096 * (double)batch;
  o.bytes = 1e3;  // compute-bound
  return o;
}

mp_op Attention() {
  mp_op o;
  memset(&o, 0, sizeof o);
  o.type = MP_OP_COMPUTE;
  o.kernel = MP_KERNEL_ATTENTION;
  o.dtype = MP_DTYPE_BF16;
  o.flops = 4e12;
  o.bytes = 1e3;
  return o;
}

// A stack fitted on GPU "x" (kernel fractions bf16 GEMM 0.8, fp8 GEMM 0.75, flash 0.31)
// evaluated on GPU "y": each efficiency times y's fraction over x's.
TEST(KernelScale, HandExampleAcrossGpus) {
  mp_stack_profile p = Profile();
  snprintf(p.fit_gpu, sizeof p.fit_gpu, "x");
  p.fit_kernel_eff = {0.8, 0.75, 0.31};
  mp_gpu y = GpuY();
  mp_stack_kernel_scale k;
  mp_stack_kernel_scale_of(&p, &y, &k);
  EXPECT_TRUE(k.scaled);
  EXPECT_DOUBLE_EQ(k.gemm, 0.96 / 0.8);  // 1.2
  EXPECT_DOUBLE_EQ(k.fp8_gemm, 0.6 / 0.75);  // 0.8
  EXPECT_DOUBLE_EQ(k.flash, 0.62 / 0.31);  // 2.0

  mp_stack_profile as_stated = p;
  as_stated.fit_gpu[0] = '\0';
  // bf16 GEMM: 0.5 x 1.2 = 0.6 of 1000 TFLOP/s: 2.749e11 / 6e14 = 0.458 ms, against
  // 2.749e11 / 5e14 = 0.550 ms as stated: the op time ratio is 0.5 / 0.6 = 5/6.
  mp_op g = Gemm();
  const double t_bf16 = mp_sim_compute_op_s(&g, &y, &p);
  EXPECT_NEAR(t_bf16, g.flops / 6e14, 1e-12);
  EXPECT_NEAR(t_bf16 / mp_sim_compute_op_s(&g, &y, &as_stated), 5.0 / 6.0, 1e-12);
  // Materialized attention's batched GEMMs run at the GEMM ratio too.
  mp_op bg = Gemm(MP_DTYPE_BF16, 32);
  EXPECT_NEAR(mp_sim_compute_op_s(&bg, &y, &p), bg.flops / 6e14, 1e-12);
  // float8 GEMM: 0.25 x 0.8 = 0.2 of the 2000 TFLOP/s fp8 peak = 4e14 FLOP/s.
  mp_op f8 = Gemm(MP_DTYPE_FP8_E4M3);
  EXPECT_NEAR(mp_sim_compute_op_s(&f8, &y, &p), f8.flops / 4e14, 1e-12);
  // Flash attention: 0.4 x 2 = 0.8 of 1000 TFLOP/s: 4e12 / 8e14 = 5 ms (10 ms as stated).
  mp_op a = Attention();
  EXPECT_NEAR(mp_sim_compute_op_s(&a, &y, &p), 5e-3, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&a, &y, &as_stated), 10e-3, 1e-12);
}

// A carried efficiency never passes the whole peak: attention 0.4 x (0.62 / 0.2) = 1.24
// runs at 1.0.
TEST(KernelScale, CappedAtThePeak) {
  mp_stack_profile p = Profile();
  snprintf(p.fit_gpu, sizeof p.fit_gpu, "x");
  p.fit_kernel_eff = {0.8, 0.75, 0.2};
  mp_gpu y = GpuY();
  mp_op a = Attention();
  EXPECT_NEAR(mp_sim_compute_op_s(&a, &y, &p), 4e12 / 1e15, 1e-12);
}

// A GPU without fp8 units runs float8 GEMMs as bf16 ones, at the GEMM ratio; a fit GPU
// without them states no fp8 fraction, so fp8_gemm_eff_max is carried as stated.
TEST(KernelScale, WithoutFp8Units) {
  mp_stack_profile p = Profile();
  snprintf(p.fit_gpu, sizeof p.fit_gpu, "x");
  p.fit_kernel_eff = {0.8, 0.75, 0.31};
  mp_gpu y = GpuY();
  y.peak_tflops[MP_DTYPE_FP8_E4M3] = y.peak_tflops[MP_DTYPE_FP8_E5M2] = 0;
  y.kernel_eff.fp8_gemm = 0;
  mp_op f8 = Gemm(MP_DTYPE_FP8_E4M3);
  // 0.5 x 1.2 = 0.6 of the bf16 peak
  EXPECT_NEAR(mp_sim_compute_op_s(&f8, &y, &p), f8.flops / 6e14, 1e-12);
  p.fit_kernel_eff.fp8_gemm = 0;
  mp_stack_kernel_scale k;
  const mp_gpu y_fp8 = GpuY();
  mp_stack_kernel_scale_of(&p, &y_fp8, &k);
  EXPECT_EQ(k.fp8_gemm, 1.0);
  char line[512];
  mp_stack_kernel_scale_format(&p, &y, line, sizeof line);
  EXPECT_STREQ(line, "test fitted on x; on y GEMM x1.200, flash attention x2.000, fp8 GEMM as bf16 (y has no "
                     "fp8 units)");
  mp_gpu y8 = GpuY();
  mp_stack_kernel_scale_format(&p, &y8, line, sizeof line);
  EXPECT_STREQ(line, "test fitted on x; on y GEMM x1.200, flash attention x2.000, fp8 GEMM as stated (x has no "
                     "fp8 units to fit it on)");
}

// A GPU that states no kernel fractions (a user's profile without kernel_eff) leaves the
// stack's figures as stated, and says so.
TEST(KernelScale, GpuWithoutKernelFractions) {
  mp_stack_profile p = Profile();
  snprintf(p.fit_gpu, sizeof p.fit_gpu, "x");
  p.fit_kernel_eff = {0.8, 0.75, 0.31};
  mp_gpu y = GpuY();
  y.kernel_eff = {0, 0, 0};
  mp_stack_kernel_scale k;
  mp_stack_kernel_scale_of(&p, &y, &k);
  EXPECT_EQ(k.gemm, 1.0);
  EXPECT_EQ(k.fp8_gemm, 1.0);
  EXPECT_EQ(k.flash, 1.0);
  char line[512];
  mp_stack_kernel_scale_format(&p, &y, line, sizeof line);
  EXPECT_STREQ(line, "test fitted on x; y states no kernel_eff: efficiencies as stated");
}

// On its own fit GPU a shipped stack costs every op exactly as with no fit GPU at all
// (the ratios are x / x = 1), so the published rows it was fitted on predict what they did.
TEST(KernelScale, OnItsFitGpuUnchanged) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  for (const char *n : {"torchtitan-eager", "torchtitan-compile", "megatron-lm", "llm.c"}) {
    SCOPED_TRACE(n);
    mp_stack_profile p;
    ASSERT_EQ(mp_stack_load(&ctx, n, &p), MP_OK) << mp_errmsg(&ctx);
    ASSERT_NE(p.fit_gpu[0], '\0');
    mp_gpu g;
    ASSERT_EQ(mp_gpu_load(&ctx, p.fit_gpu, &g), MP_OK) << mp_errmsg(&ctx);
    mp_stack_profile as_stated = p;
    as_stated.fit_gpu[0] = '\0';
    mp_stack_kernel_scale k;
    mp_stack_kernel_scale_of(&p, &g, &k);
    EXPECT_FALSE(k.scaled);
    mp_op ops[] = {Gemm(), Gemm(MP_DTYPE_BF16, 32), Gemm(MP_DTYPE_FP8_E4M3), Attention()};
    for (const mp_op &o : ops)
      EXPECT_EQ(mp_sim_compute_op_s(&o, &g, &p), mp_sim_compute_op_s(&o, &g, &as_stated));
    char line[512];
    mp_stack_kernel_scale_format(&p, &g, line, sizeof line);
    EXPECT_EQ(std::string(line), std::string(n) + " fitted on " + p.fit_gpu + ": efficiencies as stated");
  }
}

// torchtitan's stacks, fitted on the 500 W H100, on the A100: flash attention carried,
// x 0.62 / 0.35 = 1.7714; GEMMs at their gemm_fit, 0.68 of the A100's peak (fitted on the
// A100's fms-fsdp 34B and 70B rows), x 0.68 / 0.50 = 1.36 where the kernel_eff ratio would
// give 0.824 / 0.685 = 1.2029; a large GEMM's time shrinks by that multiplier (its size
// factor x / (x + half_mnk) is the same on both GPUs). On the 700 W H100 the ratio holds:
// 0.685 / 0.685 = 1.
TEST(KernelScale, TorchtitanOnTheA100) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  ASSERT_EQ(mp_stack_load(&ctx, "torchtitan-eager", &p), MP_OK) << mp_errmsg(&ctx);
  EXPECT_STREQ(p.fit_gpu, "h100-96gb-500w");
  mp_gpu a100;
  ASSERT_EQ(mp_gpu_load(&ctx, "a100-80gb-sxm", &a100), MP_OK) << mp_errmsg(&ctx);
  mp_stack_kernel_scale k;
  mp_stack_kernel_scale_of(&p, &a100, &k);
  EXPECT_DOUBLE_EQ(k.gemm, 0.68 / 0.50);
  EXPECT_NEAR(k.flash, 1.7714, 1e-4);
  mp_stack_profile as_stated = p;
  as_stated.fit_gpu[0] = '\0';
  mp_op g = Gemm();
  g.bytes = 0;
  const double ovh = p.kernel_overhead_s;
  EXPECT_NEAR((mp_sim_compute_op_s(&g, &a100, &as_stated) - ovh) / (mp_sim_compute_op_s(&g, &a100, &p) - ovh),
              0.68 / 0.50, 1e-9);
  char line[512];
  mp_stack_kernel_scale_format(&p, &a100, line, sizeof line);
  EXPECT_STREQ(line, "torchtitan-eager fitted on h100-96gb-500w; on a100-80gb-sxm GEMM x1.360 (fitted there), "
                     "flash attention x1.771, fp8 GEMM as bf16 (a100-80gb-sxm has no fp8 units)");
  mp_gpu h100;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &h100), MP_OK) << mp_errmsg(&ctx);
  mp_stack_kernel_scale_of(&p, &h100, &k);
  EXPECT_DOUBLE_EQ(k.gemm, 1.0);
}


// meshplan's runtimes name no fit GPU: stated (or calibrated) for the GPU they run on.
TEST(KernelScale, MeshplanStacksAreNotScaled) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  for (const char *n : {"meshplan-cuda", "meshplan-cpu"}) {
    mp_stack_profile p;
    ASSERT_EQ(mp_stack_load(&ctx, n, &p), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(p.fit_gpu[0], '\0') << n;
    for (const char *gn : {"a100-80gb-sxm", "h100-sxm", "b200", "cpu"}) {
      mp_gpu g;
      ASSERT_EQ(mp_gpu_load(&ctx, gn, &g), MP_OK) << mp_errmsg(&ctx);
      mp_stack_kernel_scale k;
      mp_stack_kernel_scale_of(&p, &g, &k);
      EXPECT_FALSE(k.scaled);
      EXPECT_EQ(k.gemm, 1.0);
      EXPECT_EQ(k.fp8_gemm, 1.0);
      EXPECT_EQ(k.flash, 1.0);
    }
    char line[512];
    mp_gpu g;
    ASSERT_EQ(mp_gpu_load(&ctx, "a100-80gb-sxm", &g), MP_OK);
    mp_stack_kernel_scale_format(&p, &g, line, sizeof line);
    EXPECT_EQ(std::string(line), std::string(n) + ": efficiencies as stated on every GPU (no fit GPU)");
  }
}

std::string StackJson(const std::string &fit) {
  return "{\"name\":\"x\",\"gemm_eff_max\":0.5,\"gemm_eff_half_mnk\":0,\"fp8_gemm_eff_max\":0.5,"
         "\"attention_eff\":0.5,\"hbm_eff\":0.5,\"link_eff\":0.5,\"kernel_overhead_us\":0,"
         "\"comm_overhead_us\":0,\"frag_factor\":1,\"source\":\"s\"," + fit + "}";
}

TEST(KernelScale, FitGpuRefusals) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"fit_gpu\":\"h900\"").c_str(), "x.json", &p), MP_ERR_NOT_FOUND);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)).rfind("x.json: key 'fit_gpu': unknown GPU 'h900'; known: ", 0), 0u)
      << mp_errmsg(&ctx);
  // the CPU profile states no kernel fractions, so nothing could be carried from it
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"fit_gpu\":\"cpu\"").c_str(), "x.json", &p), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "x.json: fit_gpu 'cpu' states no kernel_eff, so the stack's efficiencies cannot be "
                                "carried to other GPUs; add kernel_eff to that GPU profile or drop fit_gpu");
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"fit_gpu\":3").c_str(), "x.json", &p), MP_ERR_INVALID);
  ASSERT_EQ(mp_stack_from_text(&ctx, StackJson("\"fit_gpu\":\"a100-80gb-sxm\"").c_str(), "x.json", &p), MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_DOUBLE_EQ(p.fit_kernel_eff.bf16_gemm, 0.824);
  EXPECT_DOUBLE_EQ(p.fit_kernel_eff.flash_attention, 0.62);
  EXPECT_EQ(p.fit_kernel_eff.fp8_gemm, 0.0);
}

// gemm_fit: the GEMM efficiency a profile states for a GPU other than its fit GPU. A stack
// fitted on "x" (GEMM 0.5 of the peak; x's kernel fractions 0.8, 0.75, 0.31) that states 0.9
// for "y" runs its GEMMs on y at 0.9 / 0.5 = 1.8 times 0.5, where the ratio would give
// 0.96 / 0.8 = 1.2; flash attention and float8 keep their ratios (0.62 / 0.31, 0.6 / 0.75),
// and a third GPU "z" its GEMM ratio. Refused: without fit_gpu, naming fit_gpu itself, an
// unknown GPU, an efficiency outside (0, 1].
TEST(KernelScale, GemmFitOnAnotherGpu) {
  mp_stack_profile p = Profile();
  snprintf(p.fit_gpu, sizeof p.fit_gpu, "x");
  p.fit_kernel_eff = {0.8, 0.75, 0.31};
  snprintf(p.gemm_fit_gpu, sizeof p.gemm_fit_gpu, "y");
  p.gemm_fit_eff_max = 0.9;
  mp_gpu y = GpuY();
  mp_stack_kernel_scale k;
  mp_stack_kernel_scale_of(&p, &y, &k);
  EXPECT_DOUBLE_EQ(k.gemm, 0.9 / 0.5);
  EXPECT_DOUBLE_EQ(k.flash, 0.62 / 0.31);
  EXPECT_DOUBLE_EQ(k.fp8_gemm, 0.6 / 0.75);
  mp_gpu z = GpuY();
  snprintf(z.name, sizeof z.name, "z");  // another GPU: the ratio
  mp_stack_kernel_scale_of(&p, &z, &k);
  EXPECT_DOUBLE_EQ(k.gemm, 0.96 / 0.8);

  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile q;
  const std::string fit = "\"gemm_fit\":{\"gpu\":\"a100-80gb-sxm\",\"gemm_eff_max\":0.72}";
  ASSERT_EQ(mp_stack_from_text(&ctx, StackJson("\"fit_gpu\":\"h100-sxm\"," + fit).c_str(), "x.json", &q), MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_STREQ(q.gemm_fit_gpu, "a100-80gb-sxm");
  EXPECT_DOUBLE_EQ(q.gemm_fit_eff_max, 0.72);
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson(fit).c_str(), "x.json", &q), MP_ERR_INVALID);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)).rfind("x.json: gemm_fit restates the GEMM efficiency", 0), 0u)
      << mp_errmsg(&ctx);
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"fit_gpu\":\"a100-80gb-sxm\"," + fit).c_str(), "x.json", &q),
            MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "x.json: gemm_fit: gpu 'a100-80gb-sxm' is fit_gpu itself: its GEMM efficiency is "
                                "gemm_eff_max");
  EXPECT_EQ(mp_stack_from_text(&ctx,
                               StackJson("\"fit_gpu\":\"h100-sxm\",\"gemm_fit\":{\"gpu\":\"h900\",\"gemm_eff_max\":0.7}")
                                   .c_str(),
                               "x.json", &q),
            MP_ERR_NOT_FOUND);
  EXPECT_EQ(mp_stack_from_text(&ctx,
                               StackJson("\"fit_gpu\":\"h100-sxm\",\"gemm_fit\":{\"gpu\":\"a100-80gb-sxm\","
                                         "\"gemm_eff_max\":1.2}")
                                   .c_str(),
                               "x.json", &q),
            MP_ERR_INVALID);
}

// The pipeline settings a profile states. pp_microbatches: torchtitan's profiles state its
// pipeline default (pp micro-batches); Megatron-LM's micro-batch is a required setting, so
// its profile states none. pp_order: torchtitan's profiles run torch.distributed.pipelining's
// schedules, every other profile (Megatron-LM, the meshplan runtimes, llm.c) Megatron-LM's
// orders, the default. cp_rotate: torchtitan's profiles state its ring's default, allgather
// (Stacks.ContextParallelRotateMethod reads the other). A value other than the choices is
// refused with them.
TEST(Stacks, PipelineSettings) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  for (const char *n : {"torchtitan-eager", "torchtitan-compile"}) {
    ASSERT_EQ(mp_stack_load(&ctx, n, &p), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(p.pp_mb_stages, 1) << n;
    EXPECT_EQ(p.pp_flavor, MP_PP_FLAVOR_TORCH) << n;
    EXPECT_EQ(p.cp_rotate, MP_CP_ROTATE_ALLGATHER) << n;
  }
  for (const char *n : {"megatron-lm", "megatron-core", "meshplan-cpu", "meshplan-cuda", "llm.c"}) {
    ASSERT_EQ(mp_stack_load(&ctx, n, &p), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(p.pp_mb_stages, 0) << n;
    EXPECT_EQ(p.pp_flavor, MP_PP_FLAVOR_MEGATRON) << n;
  }
  ASSERT_EQ(mp_stack_from_text(&ctx, StackJson("\"pp_microbatches\":\"unstated\"").c_str(), "x.json", &p), MP_OK);
  EXPECT_EQ(p.pp_mb_stages, 0);
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"pp_microbatches\":\"layers\"").c_str(), "x.json", &p),
            MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "x.json: pp_microbatches 'layers' is unknown; choose unstated, stages");
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"pp_order\":\"gpipe\"").c_str(), "x.json", &p),
            MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "x.json: pp_order 'gpipe' is unknown; choose megatron, torch");
}

// allocator: every shipped profile counts the schedule's allocations times frag_factor
// ("tracked", the default); "pytorch-expandable" turns on the caching allocator's replay
// (sim/caching_alloc.h); another value is refused with the choices.
TEST(Stacks, AllocatorReplay) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  for (const char *n : {"torchtitan-eager", "torchtitan-compile", "megatron-core", "meshplan-cuda"}) {
    ASSERT_EQ(mp_stack_load(&ctx, n, &p), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(p.alloc_replay, 0) << n;
  }
  ASSERT_EQ(mp_stack_from_text(&ctx, StackJson("\"allocator\":\"pytorch-expandable\"").c_str(), "x.json", &p),
            MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(p.alloc_replay, 1);
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"allocator\":\"cudaMalloc\"").c_str(), "x.json", &p),
            MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "x.json: allocator 'cudaMalloc' is unknown; choose tracked, pytorch-expandable");
}

// cp_rotate (the torchtitan profiles' allgather: Stacks.PipelineSettings): alltoall is read
// and reaches the plan options; an unknown method and the key on a meshplan runtime's profile
// (whose ring is its own) are refused.
TEST(Stacks, ContextParallelRotateMethod) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  ASSERT_EQ(mp_stack_from_text(&ctx, StackJson("\"cp_rotate\":\"alltoall\"").c_str(), "x.json", &p), MP_OK);
  EXPECT_EQ(p.cp_rotate, MP_CP_ROTATE_ALLTOALL);
  mp_plan_options o;
  mp_plan_options_init(&o);
  mp_gpu gpu;
  EXPECT_EQ(mp_gpu_load(&ctx, "h100-sxm", &gpu), MP_OK) << mp_errmsg(&ctx);
  mp_stack_plan_options(&p, &gpu, &o);
  EXPECT_EQ(o.cp_rotate, MP_CP_ROTATE_ALLTOALL);
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"cp_rotate\":\"ring\"").c_str(), "x.json", &p),
            MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "x.json: cp_rotate 'ring' is unknown; choose allgather, alltoall");
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"memory_model\":\"meshplan-cpu\",\"cp_rotate\":\"allgather\"")
                                         .c_str(),
                               "x.json", &p),
            MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("cp_rotate names PyTorch's context-parallel ring"),
            std::string::npos);
}

// Megatron-Core's switches: megatron-core turns on the distributed optimizer, overlapped
// gradient reduce-scatters and parameter gathers, and Transformer Engine's TP comm overlap
// (the plan's async_tp); megatron-lm (the 2021-22 code of its fit rows) none of them. Each
// key is the megatron memory model's alone.
// cp_overlap: torchtitan-compile compiles the ring with its blocks, so its collectives
// wait where issued (the plan's cp_sync); torchtitan-eager's overlap. The key names
// torchtitan's ring: refused under another memory model.
TEST(Stacks, CompiledRingWaits) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  for (int compiled = 0; compiled <= 1; compiled++) {
    const char *n = compiled ? "torchtitan-compile" : "torchtitan-eager";
    ASSERT_EQ(mp_stack_load(&ctx, n, &p), MP_OK) << mp_errmsg(&ctx);
    mp_plan_options o;
    mp_plan_options_init(&o);
    mp_gpu gpu;
    EXPECT_EQ(mp_gpu_load(&ctx, "h100-sxm", &gpu), MP_OK) << mp_errmsg(&ctx);
    mp_stack_plan_options(&p, &gpu, &o);
    EXPECT_EQ(o.cp_wait_at_issue, compiled) << n;
  }
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"memory_model\":\"megatron\",\"cp_overlap\":false").c_str(),
                               "x.json", &p),
            MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("cp_overlap false names torchtitan's compiled ring"),
            std::string::npos)
      << mp_errmsg(&ctx);
}

TEST(Stacks, MegatronCoreSwitches) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  for (int core = 0; core <= 1; core++) {
    const char *n = core ? "megatron-core" : "megatron-lm";
    ASSERT_EQ(mp_stack_load(&ctx, n, &p), MP_OK) << mp_errmsg(&ctx);
    mp_plan_options o;
    mp_plan_options_init(&o);
    mp_gpu gpu;
    EXPECT_EQ(mp_gpu_load(&ctx, "h100-sxm", &gpu), MP_OK) << mp_errmsg(&ctx);
    mp_stack_plan_options(&p, &gpu, &o);
    EXPECT_EQ(o.mem_model, MP_MEM_MODEL_MEGATRON) << n;
    EXPECT_EQ(o.ddp.shard_optimizer, core) << n;
    EXPECT_EQ(o.ddp.overlap, core) << n;
    EXPECT_EQ(o.tp_comm_fused, core) << n;
    EXPECT_EQ(p.async_tp, core) << n;  // --async-tp accepted where the stack runs it
    EXPECT_EQ(o.attn, core ? MP_ATTN_FLASH : MP_ATTN_MATERIALIZED) << n;
    // megatron-lm is fitted on Narayanan et al.'s A100 rows; megatron-core's float8 on the
    // MLPerf H100 rows, its bf16 kernels being megatron-lm's restated on the H100 by the
    // ratios that carry them (sustained bf16 GEMM 0.685 / 0.824, FlashAttention-2 0.35 /
    // 0.62, data/gpus): the same bf16 prediction on every GPU
    EXPECT_STREQ(p.fit_gpu, core ? "h100-sxm" : "a100-80gb-sxm");
  }
  mp_stack_profile lm, mc;
  ASSERT_EQ(mp_stack_load(&ctx, "megatron-lm", &lm), MP_OK);
  ASSERT_EQ(mp_stack_load(&ctx, "megatron-core", &mc), MP_OK);
  EXPECT_NEAR(mc.gemm_eff_max, lm.gemm_eff_max * 0.685 / 0.824, 1e-4);
  EXPECT_NEAR(mc.attention_eff, 0.5 * 0.35 / 0.62, 1e-4);
  EXPECT_EQ(mc.fp8_gemm_eff_max, 0.59);
  // Transformer Engine's attention at cuDNN's measured rate by span (H200 sweep, 2K-32K keys):
  // at 16,384 keys the forward 673 TFLOP/s / 989.4 = 0.6802 x the sustained share 0.8534;
  // megatron-lm keeps its one rate
  EXPECT_EQ(mc.attn_span_n, 5);
  EXPECT_NEAR(mp_stack_attention_eff(&mc, 16384, 0), 0.6802 * 0.8534, 1e-9);
  EXPECT_EQ(lm.attn_span_n, 0);
  for (const char *key : {"distributed_optimizer", "tp_comm_overlap"}) {
    EXPECT_EQ(mp_stack_from_text(&ctx, StackJson(std::string("\"") + key + "\":true").c_str(), "x.json", &p),
              MP_ERR_INVALID)
        << key;
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("the torchtitan memory model does not run it"),
              std::string::npos)
        << mp_errmsg(&ctx);
    ASSERT_EQ(mp_stack_from_text(&ctx,
                                 StackJson(std::string("\"memory_model\":\"megatron\",\"") + key + "\":true")
                                     .c_str(),
                                 "x.json", &p),
              MP_OK)
        << mp_errmsg(&ctx);
  }
}

TEST(Stacks, MegatronCoreBlockScaledRatio) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile mc;
  ASSERT_EQ(mp_stack_load(&ctx, "megatron-core", &mc), MP_OK);
  // Hopper's block-scaled float8 GEMMs from Transformer Engine's H200 NVL benchmark
  // (docs/examples/gemm_profiling/gemm_profiling.rst, 1609c890e: per layer of hidden 4096,
  // intermediate 16384, M 15872, twelve te.Linear forwards): bf16 32.014 ms, Float8BlockScaling
  // 22.882 ms and DelayedScaling 18.978 ms in autocast, per-tensor float8 pre-quantized
  // 16.785 ms. Each forward quantizes its input (M x K) and weight (K x N) with both usages;
  // over the fprop (M,H,3H) (M,H,H) (M,H,I) (M,I,H), dgrad (M,3H,H) (M,H,H) (M,I,H) (M,H,I)
  // and wgrad (H,M,3H) (H,M,H) (H,M,I) (I,M,H) shapes (M, K, N) the inputs hold X = sum M K
  // and the weights W = sum K N elements (a wgrad shape's "weight" is M x N). Delayed's
  // cast-transpose moves 4 bytes an element in 18.978 - 16.785 ms; blockwise's 4 + 8/128 an
  // input element (1x128 scales) and 4 + 8/16384 a weight's (128x128) at that rate; the rest
  // of its 22.882 ms is the block-scaled GEMMs.
  const double M = 15872, H = 4096, I = 16384;
  const double X = M * (3 * H + I) + M * (3 * H + H + I + H) + M * (3 * H + I);
  const double W = 2 * (3 * H * H + H * H + 2 * H * I) + M * (3 * H + H + I + H);
  EXPECT_DOUBLE_EQ(X, 1495269376.0);
  EXPECT_DOUBLE_EQ(W, 987758592.0);
  const double q_block = (18.978 - 16.785) * (X * (4 + 8.0 / 128) + W * (4 + 8.0 / 16384)) / (4 * (X + W));
  EXPECT_NEAR(q_block, 2.2137, 1e-4);
  EXPECT_NEAR(mc.fp8_block_gemm_vs_bf16, 32.014 / (22.882 - q_block), 5e-4);
}

TEST(Stacks, MegatronCoreMxfp8Ratio) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile mc;
  ASSERT_EQ(mp_stack_load(&ctx, "megatron-core", &mc), MP_OK);
  // Blackwell's MXFP8 GEMMs from the same benchmark's B300 runs (gemm_profiling.rst,
  // 1609c890e, 'Worked Example: 5B Model on B300', pre-quantized mode): the twelve GEMMs of a
  // layer take 13.102 ms in bf16 and 7.161 ms as MXFP8 GEMMs on pre-quantized operands (fprop
  // 4.250 / 2.365, dgrad 4.434 / 2.397, wgrad 4.418 / 2.400 ms), the kernels alone: 1.830x.
  EXPECT_NEAR(mc.mxfp8_gemm_vs_bf16, 13.102 / 7.161, 5e-4);
  // Hopper's block-scaled kind keeps its own figure
  EXPECT_NEAR(mc.fp8_block_gemm_vs_bf16, 1.549, 1e-12);
  // torchao's MXFP8 Linears call the same cuBLASLt kernels through torch._scaled_mm (1x32
  // e8m0 scales: VEC32_UE8M0), so both torchtitan profiles state the same figure and no
  // Hopper block-scaled one (torchao runs no such recipe)
  for (const char *name : {"torchtitan-compile", "torchtitan-eager"}) {
    mp_stack_profile tt;
    ASSERT_EQ(mp_stack_load(&ctx, name, &tt), MP_OK) << mp_errmsg(&ctx);
    EXPECT_NEAR(tt.mxfp8_gemm_vs_bf16, 13.102 / 7.161, 5e-4) << name;
    EXPECT_EQ(tt.fp8_block_gemm_vs_bf16, 0.0) << name;
  }
}

// The SMs the stacks' collectives hold: megatron-core runs Transformer Engine's userbuffers
// reduce-scatter on 16 SMs (ub_sms, which needs tp_comm_overlap) and prices NCCL's channels;
// megatron-lm (the 2021-22 code of its fit rows, no overlapped collective) neither.
// nccl_max_ctas is NCCL_MAX_CTAS: at most NCCL 2.2x's 64 channels. megatron-core runs
// Transformer Engine's Linear, whose backward issues the input gradient's TP collective
// beside the weight-gradient GEMM (tp_dgrad_async), a key of the megatron memory model.
TEST(Stacks, CollectivesSms) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  ASSERT_EQ(mp_stack_load(&ctx, "megatron-core", &p), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(p.ub_sms, 16);
  EXPECT_EQ(p.nccl_sm_contention, 1);
  EXPECT_EQ(p.nccl_max_ctas, 0);
  EXPECT_EQ(p.tp_dgrad_async, 1);
  ASSERT_EQ(mp_stack_load(&ctx, "megatron-lm", &p), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(p.ub_sms, 0);
  EXPECT_EQ(p.nccl_sm_contention, 0);
  EXPECT_EQ(p.tp_dgrad_async, 0);
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"tp_dgrad_async\":true").c_str(), "x.json", &p), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("tp_dgrad_async"), std::string::npos) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"memory_model\":\"megatron\",\"ub_sms\":16").c_str(), "x.json", &p),
            MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("set tp_comm_overlap true or remove the key"), std::string::npos)
      << mp_errmsg(&ctx);
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"nccl_max_ctas\":65").c_str(), "x.json", &p), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("nccl_max_ctas"), std::string::npos) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_stack_from_text(&ctx, StackJson("\"nccl_sm_contention\":true,\"nccl_max_ctas\":8").c_str(), "x.json", &p),
            MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_EQ(p.nccl_sm_contention, 1);
  EXPECT_EQ(p.nccl_max_ctas, 8);
}

}  // namespace

// copy_hbm_eff: the one-pass device copies' own fraction of HBM bandwidth (MP_KERNEL_COPY),
// beside hbm_eff's for every other element-wise kernel. On a GPU of hbm_GBps B, 1e9 bytes
// copied take 1e9 / (B 1e9 x 0.85) s where a norm of the same bytes takes 1e9 / (B 1e9 x
// 0.5): their ratio is 0.5 / 0.85. torchtitan-eager states 0.85 (its hbm_eff 0.30 prices
// unfused chains), torchtitan-compile none (0: its hbm_eff). Above 1: refused.
TEST(Stacks, CopyHbmEff) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  ASSERT_EQ(mp_stack_from_text(&ctx, StackJson("\"copy_hbm_eff\":0.85").c_str(), "x.json", &p), MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_DOUBLE_EQ(p.hbm_eff_kernel[MP_KERNEL_COPY], 0.85);
  EXPECT_DOUBLE_EQ(p.hbm_eff_kernel[MP_KERNEL_NORM], 0.0);
  const mp_gpu g = GpuY();
  mp_op c;
  memset(&c, 0, sizeof c);
  c.type = MP_OP_COMPUTE;
  c.kernel = MP_KERNEL_COPY;
  c.m = 1;
  c.batch = 1;
  c.bytes = 1e9;
  c.dtype = MP_DTYPE_BF16;
  mp_op n = c;
  n.kernel = MP_KERNEL_NORM;
  EXPECT_NEAR(mp_sim_compute_op_s(&c, &g, &p), 1e9 / (g.hbm_GBps * 1e9 * 0.85), 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&c, &g, &p) / mp_sim_compute_op_s(&n, &g, &p), 0.5 / 0.85, 1e-12);
  ASSERT_EQ(mp_stack_load(&ctx, "torchtitan-eager", &p), MP_OK) << mp_errmsg(&ctx);
  EXPECT_DOUBLE_EQ(p.hbm_eff_kernel[MP_KERNEL_COPY], 0.85);
  ASSERT_EQ(mp_stack_load(&ctx, "torchtitan-compile", &p), MP_OK) << mp_errmsg(&ctx);
  EXPECT_DOUBLE_EQ(p.hbm_eff_kernel[MP_KERNEL_COPY], 0.0);
  EXPECT_EQ(mp_stack_from_text(&ctx, StackJson("\"copy_hbm_eff\":1.5").c_str(), "x.json", &p), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("copy_hbm_eff"), std::string::npos) << mp_errmsg(&ctx);
}
