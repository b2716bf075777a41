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
