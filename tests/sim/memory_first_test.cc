// The search's memory-first simulation (mp_simulate_prepped with memory_first): stage 0
// (without pipeline parallelism the one stage) and, with MTP modules, then the last stage
// are judged by their memory alone before any time is simulated (sim/memory_pass.c), the
// other stages by their stage runs, and the verdict and peak must be the full simulation's.
// Each plan is simulated in full first, with every stage's peak (stage_peak_bytes, which
// turns the memory-first stop off); then the GPU's memory is set to one byte under stage
// 0's peak, to one byte under the last stage's, and to the plan's peak.
//   one byte under stage 0's: stage 0 alone is over, so the memory-first result is that
//     stage's figures: fits 0, peak_mem_bytes = stage 0's peak to the byte, and no time
//     (step 0: stage 0 was never run in time, nor any other stage);
//   one byte under the last stage's, where stage 0 fits that capacity: the last stage
//     is over (judged right after stage 0 with MTP, else after the middle stages' runs, which
//     fit): its figures, and no time;
//   at the plan's peak: every stage fits (capacity = peak, fits is peak <= capacity), so
//     the memory-first result is the full simulation's, field for field.
// Capacity = mem_gib x 2^30 x (1 - headroom) truncated (sim.c, fill_memory); with headroom 0
// and mem_gib = bytes / 2^30 (a division by a power of two, exact below 2^53) it is bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "exec/plan.h"
#include "sim/cluster.h"
#include "sim/sim.h"
#include "sim/stack.h"

namespace {

struct Case {
  const char *model, *stack, *mesh;
  int gpus;
  int64_t micro_batch, global_batch;
  mp_ac_mode ac;
  int alloc_replay; /* the stack's memory through PyTorch's caching allocator (sim.h) */
  int mtp_layers;   /* multi-token-prediction modules on the last stage (the model's: 0) */
};

// A case's plan with the cluster it runs on, the stack's profile and the simulator's config
// (which points at both, so it stays where it was built).
struct Built {
  mp_ctx ctx;
  mp_cluster c;
  mp_stack_profile prof;
  mp_plan *p = nullptr;
  mp_sim_config cfg;
  Built() { mp_ctx_init(&ctx); }
  Built(const Built &) = delete;
  Built &operator=(const Built &) = delete;
  ~Built() { mp_plan_destroy(p); }
};

// Case k's plan at seq 2048 (*p; free with mp_plan_destroy), the cluster it runs on, the
// stack's profile (with k's caching-allocator replay) and a config simulating it on them.
void BuildCase(mp_ctx *ctx, const Case &k, mp_cluster *c, mp_stack_profile *prof, mp_plan **p,
               mp_sim_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->cluster = c;
  cfg->stack = prof;
  mp_model m;
  mp_mesh mesh;
  ASSERT_EQ(mp_model_load(ctx, k.model, &m), MP_OK) << mp_errmsg(ctx);
  if (k.mtp_layers > 0) m.mtp_layers = k.mtp_layers;
  ASSERT_EQ(mp_cluster_make(ctx, "h100-sxm", k.gpus, 8, c), MP_OK) << mp_errmsg(ctx);
  ASSERT_EQ(mp_mesh_parse(ctx, k.mesh, k.gpus, &mesh), MP_OK) << mp_errmsg(ctx);
  ASSERT_EQ(mp_stack_load(ctx, k.stack, prof), MP_OK) << mp_errmsg(ctx);
  prof->alloc_replay = k.alloc_replay;
  mp_plan_options o;
  mp_plan_options_init(&o);
  mp_stack_plan_options(prof, &c->gpu, &o);
  o.seq = 2048;
  o.micro_batch = k.micro_batch;
  o.global_batch = k.global_batch;
  o.ac = k.ac;
  ASSERT_EQ(mp_build_plan(ctx, &m, &mesh, &o, p), MP_OK) << mp_errmsg(ctx);
}

// The plan's result under memory_first with the GPU's memory set to `bytes`.
mp_sim_result MemoryFirst(mp_ctx *ctx, const mp_plan *p, mp_sim_config cfg, mp_cluster *c, int64_t bytes) {
  c->gpu.mem_gib = (double)bytes / 1073741824.0;
  cfg.memory_first = 1;
  cfg.stage_peak_bytes = nullptr;
  mp_arena *a = mp_arena_create();
  mp_sim_plan_prep *prep = nullptr;
  mp_sim_result r;
  memset(&r, 0, sizeof r);
  EXPECT_EQ(mp_sim_plan_prep_create(ctx, p, &cfg, a, &prep), MP_OK) << mp_errmsg(ctx);
  if (prep) {
    EXPECT_EQ(mp_simulate_prepped(ctx, p, prep, &cfg, nullptr, &r), MP_OK) << mp_errmsg(ctx);
  }
  mp_arena_destroy(a);
  return r;
}

// The memory-first result of a plan that fits: the full simulation's, field for field.
void ExpectFullFigures(const mp_sim_result &fit, const mp_sim_result &full, const std::string &what) {
  EXPECT_TRUE(fit.fits) << what;
  EXPECT_EQ(fit.peak_mem_bytes, full.peak_mem_bytes) << what;
  EXPECT_EQ(fit.step_time_s, full.step_time_s) << what;
  EXPECT_EQ(fit.bubble_s, full.bubble_s) << what;
  EXPECT_EQ(fit.compute_s, full.compute_s) << what;
  EXPECT_EQ(fit.exposed_comm_s, full.exposed_comm_s) << what;
  EXPECT_EQ(0, memcmp(fit.mem_at_peak, full.mem_at_peak, sizeof fit.mem_at_peak)) << what;
}

TEST(MemoryFirst, StageZeroAndTheLastByTheirMemoryAloneGiveTheFullSimulationsVerdictAndPeak) {
  const Case cases[] = {
      // dense, four stages (stage 0, a middle class, the last), 16 micro-batches
      {"llama3.1-8b", "torchtitan-compile", "pp=4,dp_replicate=2,dp_shard=2,tp=4", 64, 1, 64, MP_AC_NONE, 0},
      {"llama3.1-8b", "torchtitan-compile", "pp=4,dp_replicate=2,dp_shard=2,tp=4", 64, 2, 64, MP_AC_FULL, 0},
      // the caching allocator's gap added to every stage's peak
      {"llama3.1-8b", "torchtitan-compile", "pp=4,dp_replicate=2,dp_shard=2,tp=4", 64, 1, 64, MP_AC_NONE, 1},
      // Megatron-Core's DDP and memory model, four micro-batches
      {"llama3.1-8b", "megatron-core", "pp=4,dp_replicate=2,tp=8", 64, 1, 8, MP_AC_SELECTIVE_CORE, 0},
      // MoE with MLA, its first block dense (stage 0's blocks unlike the others'), two
      // micro-batches (no middle one)
      {"deepseek-v2-lite", "torchtitan-compile", "pp=2,dp_shard=4", 8, 1, 8, MP_AC_NONE, 0},
      // with an MTP module on the last stage (DeepSeek-V3's), which is then judged by its
      // memory alone right after stage 0
      {"deepseek-v2-lite", "torchtitan-compile", "pp=2,dp_shard=4", 8, 1, 8, MP_AC_NONE, 0, 1},
      {"deepseek-v2-lite", "torchtitan-compile", "pp=4,dp_shard=2", 8, 1, 8, MP_AC_FULL, 0, 1},
  };
  int n_last = 0; /* cases whose last stage is over where stage 0 fits */
  for (const Case &k : cases) {
    const std::string what = std::string(k.model) + " " + k.stack + " " + k.mesh + " mb=" +
                             std::to_string(k.micro_batch) + " ac=" + mp_ac_mode_name(k.ac) +
                             (k.alloc_replay ? " caching allocator" : "") + (k.mtp_layers ? " MTP" : "");
    Built b;
    ASSERT_NO_FATAL_FAILURE(BuildCase(&b.ctx, k, &b.c, &b.prof, &b.p, &b.cfg)) << what;
    const int pp = b.p->mesh.size[MP_DIM_PP];
    std::vector<int64_t> peaks((size_t)pp, 0);
    b.cfg.stage_peak_bytes = peaks.data();
    mp_sim_result full;
    ASSERT_EQ(mp_simulate_built_plan(&b.ctx, b.p, &b.cfg, nullptr, &full), MP_OK) << what << mp_errmsg(&b.ctx);
    ASSERT_GT(peaks[0], 0) << what;
    ASSERT_GT(full.step_time_s, 0.0) << what;

    const mp_sim_result over = MemoryFirst(&b.ctx, b.p, b.cfg, &b.c, peaks[0] - 1);
    EXPECT_FALSE(over.fits) << what;
    EXPECT_EQ(over.peak_mem_bytes, peaks[0]) << what;
    EXPECT_EQ(over.capacity_bytes, peaks[0] - 1) << what;
    EXPECT_EQ(over.step_time_s, 0.0) << what;

    if (peaks[0] <= peaks[pp - 1] - 1) {
      const mp_sim_result last = MemoryFirst(&b.ctx, b.p, b.cfg, &b.c, peaks[pp - 1] - 1);
      EXPECT_FALSE(last.fits) << what;
      EXPECT_EQ(last.peak_mem_bytes, peaks[pp - 1]) << what;
      EXPECT_EQ(last.step_time_s, 0.0) << what;
      n_last++;
    }

    ExpectFullFigures(MemoryFirst(&b.ctx, b.p, b.cfg, &b.c, full.peak_mem_bytes), full, what);
  }
  EXPECT_GT(n_last, 0) << "no case's last stage is over where stage 0 fits: the last stage's verdict is untested";
}

// Without pipeline parallelism the one stage is judged by its memory alone too. The plan's
// peak is that stage's (mp_sim_pipeline_result gives its result as it is), so one byte
// under it the memory-first result is over capacity with that peak to the byte and no time
// (step 0: no time run), and at it the full result field for field.
TEST(MemoryFirst, OneStageByItsMemoryAloneGivesTheFullSimulationsVerdictAndPeak) {
  const Case cases[] = {
      {"llama3.1-8b", "torchtitan-compile", "dp_shard=4,tp=2", 8, 1, 32, MP_AC_NONE, 0},
      {"deepseek-v2-lite", "torchtitan-compile", "dp_shard=8,ep=4", 8, 1, 32, MP_AC_FULL, 0},
  };
  for (const Case &k : cases) {
    const std::string what = std::string(k.model) + " " + k.mesh;
    Built b;
    ASSERT_NO_FATAL_FAILURE(BuildCase(&b.ctx, k, &b.c, &b.prof, &b.p, &b.cfg)) << what;
    mp_sim_result full;
    ASSERT_EQ(mp_simulate_built_plan(&b.ctx, b.p, &b.cfg, nullptr, &full), MP_OK) << what << mp_errmsg(&b.ctx);
    ASSERT_GT(full.step_time_s, 0.0) << what;

    const mp_sim_result over = MemoryFirst(&b.ctx, b.p, b.cfg, &b.c, full.peak_mem_bytes - 1);
    EXPECT_FALSE(over.fits) << what;
    EXPECT_EQ(over.peak_mem_bytes, full.peak_mem_bytes) << what;
    EXPECT_EQ(over.step_time_s, 0.0) << what;

    ExpectFullFigures(MemoryFirst(&b.ctx, b.p, b.cfg, &b.c, full.peak_mem_bytes), full, what);
  }
}

}  // namespace
