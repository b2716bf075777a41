// The simulator tests' fixture: a model, a cluster, a mesh, plan options and the
// torchtitan-compile stack, simulated with mp_simulate_plan.
#ifndef MP_TESTS_SIM_PLAN_CASE_H
#define MP_TESTS_SIM_PLAN_CASE_H

#include <gtest/gtest.h>

#include <cstring>

#include "exec/plan.h"
#include "sim/cluster.h"
#include "sim/sim.h"
#include "sim/stack.h"

namespace {

struct PlanCase {
  mp_ctx ctx;
  mp_model m;
  mp_cluster c;
  mp_mesh mesh;
  mp_plan_options o;
  mp_stack_profile prof;
  mp_sim_config cfg;
  PlanCase(const char *model, const char *cluster, const char *mesh_spec) {
    mp_ctx_init(&ctx);
    EXPECT_EQ(mp_model_load(&ctx, model, &m), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(mp_cluster_load(&ctx, cluster, &c), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(mp_mesh_parse(&ctx, mesh_spec, mp_cluster_n_gpus(&c), &mesh), MP_OK)
        << mp_errmsg(&ctx);
    mp_plan_options_init(&o);
    EXPECT_EQ(mp_stack_load(&ctx, "torchtitan-compile", &prof), MP_OK) << mp_errmsg(&ctx);
    memset(&cfg, 0, sizeof cfg);
    cfg.cluster = &c;
    cfg.stack = &prof;
  }
  // The search's memory-first stop (mp_simulate_prepped with memory_first) reaches the
  // whole simulation's verdict, peak and step time (`what` names the case in failures).
  void ExpectMemoryFirstAgrees(const char *what) {
    mp_sim_result whole, first;
    ASSERT_EQ(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, &whole), MP_OK) << mp_errmsg(&ctx);
    mp_plan *p = nullptr;
    ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_OK) << mp_errmsg(&ctx);
    mp_arena *a = mp_arena_create();
    mp_sim_plan_prep *prep = nullptr;
    cfg.memory_first = 1;
    EXPECT_EQ(mp_sim_plan_prep_create(&ctx, p, &cfg, a, &prep), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(mp_simulate_prepped(&ctx, p, prep, &cfg, nullptr, &first), MP_OK) << mp_errmsg(&ctx);
    cfg.memory_first = 0;
    EXPECT_EQ(first.fits, whole.fits) << what;
    EXPECT_EQ(first.peak_mem_bytes, whole.peak_mem_bytes) << what;
    EXPECT_EQ(first.step_time_s, whole.step_time_s) << what;
    EXPECT_GT(first.step_time_s, 0.0) << what;
    mp_arena_destroy(a);
    mp_plan_destroy(p);
  }
  // Full AC over one sequence of seq tokens a micro-batch, global batch gb.
  void FullAcOneSequence(int64_t seq, int64_t gb) {
    o.seq = seq;
    o.micro_batch = 1;
    o.global_batch = gb;
    o.ac = MP_AC_FULL;
  }
  mp_sim_result Sim() {
    mp_sim_result r;
    EXPECT_EQ(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, &r), MP_OK) << mp_errmsg(&ctx);
    return r;
  }
};

// The plan of s simulated from its expanded schedule with a trace: the result, every op's
// duration and the ops.

}  // namespace

#endif
