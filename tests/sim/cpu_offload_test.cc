// Megatron-Core's CPU offloading (the plan's cpu_offload_layers): which bytes of a layer go
// to the host (exec/schedule_act.c offload_act), the memory they free, Transformer Engine's
// window map and the copies' exposed time (sim/offload.c), and the refusals
// (exec/rules.c mp_rule_cpu_offload_check), each derived by hand.
#include "tests/sim/plan_case.h"

#include "exec/schedule.h"
extern "C" {
#include "sim/sim_internal.h"  // mp_sim_offload_window, mp_sim_offload_exposed_s
}

namespace {

// llama3.1-8b under megatron-core on one H100 node, dp_replicate 8, one 4096-token sequence
// a micro-batch, two micro-batches a step; without the engine's extrapolation (every layer
// simulated, so the offloaded layers' own segment does not move the step by itself).
void Megatron8b(PlanCase &k, int n) {
  ASSERT_EQ(mp_stack_load(&k.ctx, "megatron-core", &k.prof), MP_OK) << mp_errmsg(&k.ctx);
  mp_stack_plan_options(&k.prof, &k.c.gpu, &k.o);
  k.o.seq = 4096;
  k.o.micro_batch = 1;
  k.o.global_batch = 16;
  k.o.cpu_offload_layers = n;
  k.cfg.record_trace = 1;
}

// The bytes one offloaded layer copies to the host (the schedule's offload_bytes); -1 where the
// plan or its schedule fails.
int64_t OffloadBytes(PlanCase &k) {
  mp_plan *p = nullptr;
  if (mp_build_plan(&k.ctx, &k.m, &k.mesh, &k.o, &p) != MP_OK) {
    ADD_FAILURE() << mp_errmsg(&k.ctx);
    return -1;
  }
  mp_arena *a = mp_arena_create();
  mp_schedule *s = nullptr;
  int64_t b = -1;
  if (mp_schedule_build(&k.ctx, p, 0, MP_SCHEDULE_COMPACT, a, &s) == MP_OK) b = s->offload_bytes;
  else ADD_FAILURE() << mp_errmsg(&k.ctx);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
  return b;
}

// One offloaded layer of llama3.1-8b (H 4096, f 14336, 32 query and 8 key-value heads of 128,
// RMSNorm: 4 bytes of statistics a token), T = 4096 tokens, tp 1, bf16. The tensors
// Transformer Engine marks: the block input 2TH; q/k/v's LayerNormLinear: rstd 4T and the
// normed input 2TH; the fused attention: q, k, v 2T(q + 2 kv) = 2T x 6144, output 2Tq = 2TH,
// softmax statistics 4T x 32; fc1's LayerNormLinear: its input h 2TH, rstd 4T, normed h 2TH;
// fc2's input 2Tf; and Megatron-Core's fused SwiGLU's saved input, fc1's output 2T x 2f, which
// its MLP marks for the host itself (fused_bias_swiglu.py cpu_offload_input, mlp.py,
// core_v0.13.0 on): the whole 3 x 2Tf the model counts for the MLP's activation. So
// 2T (4H + 6144 + H + 3f) + 8T + 128T = 8192 x 69632 + 32768 + 524288 = 570,982,400 bytes, and
// nothing of the layer stays on the GPU (llama's dropout is 0: no masks).
constexpr int64_t kLayerBytes = 570982400;

TEST(CpuOffload, OneLayersBytesAreTheTensorsTransformerEngineMarks) {
  PlanCase k("llama3.1-8b", "h100-8", "dp_replicate=8");
  Megatron8b(k, 4);
  EXPECT_EQ(OffloadBytes(k), kLayerBytes);
}

// GPT-2 small's GeLU MLP under the same stack (H 768, f 3072, 12 heads of 64, LayerNorm: 8
// bytes of statistics a token), T = 1024 tokens, tp 1: bias_gelu_impl marks nothing
// (fused_bias_gelu.py), so fc1's output 2Tf stays on the GPU, with the two dropout masks T H
// each. Marked, per token: the block input 2H 1536; q/k/v's LayerNormLinear: statistics 8,
// normed input 2H 1536; q, k, v 2 x 3H 4608; softmax statistics 4 x 12 48; the output 2H 1536;
// fc1's LayerNormLinear: its input 2H 1536, statistics 8, normed input 2H 1536; fc2's input 2f
// 6144. 18,496 a token, 1024 x 18,496 = 18,939,904 bytes.
TEST(CpuOffload, GeluInputStaysOnTheGpu) {
  PlanCase k("gpt2-124m", "h100-8", "dp_replicate=8");
  Megatron8b(k, 4);
  k.o.seq = 1024;
  EXPECT_EQ(OffloadBytes(k), 1024 * 18496);
}

// The same layer under Megatron-Core's local spec (te_spec 0): Megatron's SwiGLU is torch ops
// there, which save gate, up, silu and their product (4 x 2Tf, block_act_mg's list) and mark
// nothing for the host; of them only fc2's input 2Tf is a Linear's saved input that TE's hook
// offloads. The rest of the layer's list is the TE spec's (the norms' bytes are the same
// either way: input 2TH, statistics 4T, normed input 2TH). So 2T (4H + 6144 + H + f) + 8T +
// 128T = 8192 x 40960 + 32768 + 524288 = 336,101,376 bytes: the TE spec's 570,982,400 less
// fc1's output 2 x 2Tf = 234,881,024, which the unfused SwiGLU keeps on the GPU.
TEST(CpuOffload, UnfusedSwigluKeepsItsTensorsOnTheGpu) {
  PlanCase k("llama3.1-8b", "h100-8", "dp_replicate=8");
  Megatron8b(k, 4);
  k.o.te_spec = 0;
  EXPECT_EQ(OffloadBytes(k), 336101376);
  EXPECT_EQ(kLayerBytes - 336101376, 2 * 2 * 4096 * 14336);
}

// The activations' peak is at the head's backward (the logits' gradient beside every saved
// layer): the four offloaded layers' marked tensors are on the host then, and the first reload
// starts only as the backward reaches the top layer, after the head. So the peak falls by
// exactly 4 x 336,101,376 bytes; the rest of memory does not move.
TEST(CpuOffload, PeakFallsByTheOffloadedLayersBytes) {
  mp_sim_result r[2];
  for (int on = 0; on <= 1; on++) {
    PlanCase k("llama3.1-8b", "h100-8", "dp_replicate=8");
    Megatron8b(k, on ? 4 : 0);
    r[on] = k.Sim();
  }
  EXPECT_EQ(r[0].mem_at_peak[MP_MEM_ACTIVATIONS] - r[1].mem_at_peak[MP_MEM_ACTIVATIONS], 4 * kLayerBytes);
  EXPECT_EQ(r[0].peak_mem_bytes - r[1].peak_mem_bytes, 4 * kLayerBytes);
  EXPECT_EQ(r[0].mem_at_peak[MP_MEM_GRADS], r[1].mem_at_peak[MP_MEM_GRADS]);
}

// Transformer Engine's layer_window_map (cpu_offload.py, v2.8): (L // N)(i + 1) - 1, plus i + 1
// for the first L % N groups and the last of those after them. L 8, N 3: 8 // 3 = 2, 8 % 3 = 2:
// 1 + 1 = 2, 3 + 2 = 5, 5 + 2 = 7. L 80, N 5: 16 (i + 1) - 1. L 126, N 92 (Megatron-Bridge's
// Llama 3.1 405B GB200 recipe): 126 // 92 = 1, 126 % 92 = 34: 2i + 1 to i = 33 (67), then
// i + 34 (68 .. 125).
TEST(CpuOffload, WindowMapIsTransformerEngines) {
  const int32_t w83[] = {2, 5, 7};
  for (int k = 0; k < 3; k++) EXPECT_EQ(mp_sim_offload_window(8, 3, k), w83[k]);
  for (int k = 0; k < 5; k++) EXPECT_EQ(mp_sim_offload_window(80, 5, k), 16 * (k + 1) - 1);
  EXPECT_EQ(mp_sim_offload_window(126, 92, 0), 1);
  EXPECT_EQ(mp_sim_offload_window(126, 92, 33), 67);
  EXPECT_EQ(mp_sim_offload_window(126, 92, 34), 68);
  EXPECT_EQ(mp_sim_offload_window(126, 92, 91), 125);
}

// Eight layers, three groups (windows 2, 5, 7), every layer 1 ms forward and 2 ms backward,
// each copy 2.5 ms. Group 0 runs beside layers 1..2: 2 ms forward (0.5 ms shows), 4 ms
// backward (none); group 1 beside layers 3..5: 3 and 6 ms (none); group 2 beside layers 6..7:
// 2 ms forward (0.5 ms), 4 ms backward (none). 1 ms in all; a 1 ms copy shows nowhere.
TEST(CpuOffload, ACopyShowsWhereItOutlastsItsWindow) {
  double f[8], b[8];
  for (int l = 0; l < 8; l++) f[l] = 1e-3, b[l] = 2e-3;
  EXPECT_NEAR(mp_sim_offload_exposed_s(8, 3, 2.5e-3, f, b), 1e-3, 1e-15);
  EXPECT_EQ(mp_sim_offload_exposed_s(8, 3, 1e-3, f, b), 0.0);
}

// Over a host link of 1 GB/s one layer's copy takes 0.336 s, longer than any window of the
// 32 layers (windows 7, 15, 23, 31 of 8 layers; a layer's forward and backward are a few ms),
// so all 8 copies of a micro-batch show past their windows: halving the link to 0.5 GB/s adds
// 8 x 0.336 s a micro-batch, 2 micro-batches: 16 x 336,101,376 / 1e9 s. At 1000 GB/s (0.34 ms
// a copy) nothing shows and the step is the one without offloading.
TEST(CpuOffload, StepAddsTheCopiesThatOutlastTheirWindows) {
  auto step = [](int n, double link) {
    PlanCase k("llama3.1-8b", "h100-8", "dp_replicate=8");
    Megatron8b(k, n);
    k.c.gpu.host_link_GBps_per_dir = link;
    return k.Sim();
  };
  const mp_sim_result slow = step(4, 0.5), fast = step(4, 1.0);
  EXPECT_NEAR(slow.step_time_s - fast.step_time_s, 16.0 * kLayerBytes / 1e9, 1e-9);
  EXPECT_NEAR(slow.offload_exposed_s - fast.offload_exposed_s, 16.0 * kLayerBytes / 1e9, 1e-9);
  const mp_sim_result none = step(0, 1000.0), quick = step(4, 1000.0);
  EXPECT_EQ(quick.offload_exposed_s, 0.0);
  EXPECT_NEAR(quick.step_time_s, none.step_time_s, 1e-12);
}

// The profiles' host links one way (data/gpus): PCIe Gen5 x16, 32 GT/s x 16 lanes x 128/130 / 8
// = 63.0 GB/s (H100, H200, B200); Gen4 half that, 31.5 (A100); NVLink-C2C 900 GB/s both ways a
// Grace, 450 one way, shared by its two GPUs: 225 (GB200, GB300). The CPU profile states none.
TEST(CpuOffload, HostLinksOfTheProfiles) {
  const struct {
    const char *gpu;
    double GBps;
  } want[] = {{"h100-sxm", 63.0}, {"h200", 63.0}, {"b200", 63.0}, {"a100-80gb-sxm", 31.5},
              {"gb200", 225.0}, {"gb300", 225.0}, {"cpu", 0.0}};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  for (const auto &w : want) {
    mp_gpu g;
    ASSERT_EQ(mp_gpu_load(&ctx, w.gpu, &g), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(g.host_link_GBps_per_dir, w.GBps) << w.gpu;
  }
  EXPECT_NEAR(32.0 * 16 * 128 / 130 / 8, 63.0, 0.05);
}

// A GPU profile without a host link cannot price the copies.
TEST(CpuOffload, RefusedWithoutAHostLink) {
  PlanCase k("llama3.1-8b", "h100-8", "dp_replicate=8");
  Megatron8b(k, 4);
  k.c.gpu.host_link_GBps_per_dir = 0;
  mp_sim_result r;
  EXPECT_EQ(mp_simulate_plan(&k.ctx, &k.m, &k.mesh, &k.o, &k.cfg, &r), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&k.ctx), "host_link_GBps_per_dir"), nullptr) << mp_errmsg(&k.ctx);
}

// What Megatron-Core refuses (transformer_config.py __post_init__, core_v0.14.0) and what is not
// modelled, each by name.
TEST(CpuOffload, RefusalsByName) {
  struct Case {
    const char *model, *mesh;
    int n;
    mp_ac_mode ac;
    mp_cuda_graphs graphs;
    const char *says;
  } cases[] = {
      {"llama3.1-8b", "dp_replicate=8", 32, MP_AC_NONE, MP_CUDA_GRAPHS_NONE, "fewer layers than the model has"},
      {"llama3.1-8b", "pp=2,dp_replicate=4", 4, MP_AC_NONE, MP_CUDA_GRAPHS_NONE, "Pipeline parallelism"},
      {"llama3.1-8b", "dp_replicate=8", 4, MP_AC_FULL, MP_CUDA_GRAPHS_NONE, "activation recomputation"},
      {"llama3.1-8b", "dp_replicate=8", 4, MP_AC_NONE, MP_CUDA_GRAPHS_LAYERS, "--enable-cuda-graph"},
      {"llama3.1-8b", "dp_replicate=8", 4, MP_AC_NONE, MP_CUDA_GRAPHS_ATTN, "--external-cuda-graph"},
      {"llama3.1-8b", "dp_replicate=4,cp=2", 4, MP_AC_NONE, MP_CUDA_GRAPHS_NONE, "context parallelism"},
      {"qwen3-30b-a3b", "dp_replicate=8", 4, MP_AC_NONE, MP_CUDA_GRAPHS_NONE, "MoE"},
  };
  for (const Case &c : cases) {
    PlanCase k(c.model, "h100-8", c.mesh);
    Megatron8b(k, c.n);
    k.o.ac = c.ac;
    k.o.cuda_graphs = c.graphs;
    mp_plan *p = nullptr;
    EXPECT_EQ(mp_build_plan(&k.ctx, &k.m, &k.mesh, &k.o, &p), MP_ERR_INVALID) << c.says;
    EXPECT_NE(strstr(mp_errmsg(&k.ctx), c.says), nullptr) << mp_errmsg(&k.ctx);
    mp_plan_destroy(p);
  }
  PlanCase k("llama3.1-8b", "h100-8", "dp_shard=8");
  k.o.cpu_offload_layers = 4; // torchtitan-compile's memory model
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&k.ctx, &k.m, &k.mesh, &k.o, &p), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&k.ctx), "Megatron-Core's"), nullptr) << mp_errmsg(&k.ctx);
  mp_plan_destroy(p);
}

}  // namespace
