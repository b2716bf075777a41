// planner/evaluate.h: the evaluator's per-worker cache (one built plan per mesh and float8
// setting, the other candidates' plans derived from it, simulator preps reused, each
// worker's own simulator workspace) must give the same prediction as simulating each
// candidate's plan from scratch (mp_simulate_plan), for every candidate of a real search
// run on two worker threads; and the search must deliver every candidate once, in
// enumeration order, whatever the chunking.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "exec/model.h"
#include "planner/evaluate.h"
#include "planner/search.h"

namespace {

struct Sink {
  std::vector<int64_t> order;
};

mp_status record(void *user, mp_ctx *ctx, int64_t index, mp_candidate *c) {
  (void)ctx;
  (void)c;
  static_cast<Sink *>(user)->order.push_back(index);
  return MP_OK;
}

void ExpectSame(const mp_sim_result &a, const mp_sim_result &b, const std::string &what) {
  EXPECT_EQ(a.step_time_s, b.step_time_s) << what;
  EXPECT_EQ(a.tokens_per_s_per_gpu, b.tokens_per_s_per_gpu) << what;
  EXPECT_EQ(a.mfu, b.mfu) << what;
  EXPECT_EQ(a.compute_s, b.compute_s) << what;
  EXPECT_EQ(a.exposed_comm_s, b.exposed_comm_s) << what;
  EXPECT_EQ(a.bubble_s, b.bubble_s) << what;
  EXPECT_EQ(a.optimizer_s, b.optimizer_s) << what;
  EXPECT_EQ(a.peak_mem_bytes, b.peak_mem_bytes) << what;
  for (int i = 0; i < MP_MEM_COUNT; i++) {
    EXPECT_EQ(a.mem_at_peak[i], b.mem_at_peak[i]) << what << " category " << i;
    EXPECT_EQ(a.mem_max[i], b.mem_max[i]) << what << " category " << i;
  }
  EXPECT_EQ(a.fits, b.fits) << what;
}

void RunAndCompare(const char *model, const char *gpu, int gpus, int per_node, int64_t seq,
                   int64_t gb) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_cluster c;
  ASSERT_EQ(mp_model_load(&ctx, model, &m), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_cluster_make(&ctx, gpu, gpus, per_node, &c), MP_OK) << mp_errmsg(&ctx);
  mp_sim_evaluator ev;
  ASSERT_EQ(mp_sim_evaluator_init(&ctx, &ev, &m, &c, seq, gb, 0.05, nullptr), MP_OK)
      << mp_errmsg(&ctx);
  mp_search_config cfg;
  mp_search_config_init(&cfg);
  cfg.model = &m;
  cfg.cluster = &c;
  cfg.seq = seq;
  cfg.global_batch = gb;
  cfg.n_threads = 2;
  cfg.eval = mp_sim_evaluate;
  cfg.eval_user = &ev;
  cfg.eval_thread_init = mp_sim_evaluator_thread_init;
  cfg.eval_thread_done = mp_sim_evaluator_thread_done;
  mp_search *s = nullptr;
  ASSERT_EQ(mp_search_enumerate(&ctx, &cfg, &s), MP_OK) << mp_errmsg(&ctx);
  Sink sink;
  ASSERT_EQ(mp_search_run(&ctx, &cfg, s, record, &sink, nullptr, nullptr), MP_OK)
      << mp_errmsg(&ctx);
  ASSERT_EQ((int64_t)sink.order.size(), s->n);
  for (int64_t i = 0; i < s->n; i++) ASSERT_EQ(sink.order[(size_t)i], i);
  ASSERT_GT(s->n_evaluated, 100) << "too few simulated candidates to say anything";
  EXPECT_EQ(s->n_failed, 0);
  int64_t compared = 0;
  for (int64_t i = 0; i < s->n; i++) {
    const mp_candidate &cd = s->cands[i];
    if (!cd.evaluated) continue;
    char mesh[128];
    mp_candidate_mesh_str(&cd, mesh, sizeof mesh);
    const std::string what = std::string(model) + " " + mesh + " mb=" +
                             std::to_string(cd.micro_batch) + " ac=" + std::to_string(cd.ac) +
                             " fp8=" + std::to_string(cd.fp8) + " rs=" + std::to_string(cd.reshard);
    mp_plan_options o;
    mp_sim_evaluator_options(&ev, &cd, &o);
    mp_sim_result ref;
    ASSERT_EQ(mp_simulate_plan(&ctx, &m, &cd.mesh, &o, &ev.sim, &ref), MP_OK)
        << what << ": " << mp_errmsg(&ctx);
    ExpectSame(cd.res, ref, what);
    compared++;
  }
  EXPECT_EQ(compared, s->n_evaluated);
  mp_search_destroy(s);
  mp_sim_evaluator_free(&ev);
}

}  // namespace

TEST(Evaluate, CachedPlansGiveTheUncachedPredictions) {
  RunAndCompare("llama3.1-8b", "h100-sxm", 16, 8, 4096, 64);  // pp, cp, tp, dp mixes
  RunAndCompare("tiny-moe", "h100-sxm", 8, 8, 512, 32);       // ep > 1
}

// A GPU without CUDA (the MI300X, ROCm) is searched under the torchtitan stack, its plans
// said not to run; meshplan's CUDA runtime's stack (what train --device cuda plans with) is
// refused on it by name.
namespace {
TEST(Evaluate, AGpuWithoutCudaIsPlannedNotRun) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "tiny-dense", &m), MP_OK) << mp_errmsg(&ctx);
  mp_cluster c;
  ASSERT_EQ(mp_cluster_make(&ctx, "mi300x", 2, 2, &c), MP_OK) << mp_errmsg(&ctx);
  mp_sim_evaluator ev;
  EXPECT_EQ(mp_sim_evaluator_init(&ctx, &ev, &m, &c, 32, 4, 0.05, "meshplan-cuda"), MP_ERR_USAGE);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("GPU mi300x has no CUDA (rocm): meshplan's CUDA runtime"),
            std::string::npos)
      << mp_errmsg(&ctx);
  mp_sim_evaluator_free(&ev);
  ASSERT_EQ(mp_sim_evaluator_init(&ctx, &ev, &m, &c, 32, 4, 0.05, nullptr), MP_OK) << mp_errmsg(&ctx);
  mp_candidate cand;
  memset(&cand, 0, sizeof cand);
  mp_mesh_init(&cand.mesh);
  cand.mesh.size[MP_DIM_DP_SHARD] = 2;
  cand.micro_batch = 1;
  cand.global_batch = 4;
  cand.pp_virtual = 1;
  int runs = 1;
  char why[256];
  ASSERT_EQ(mp_sim_evaluator_runs(&ctx, &ev, &cand, &runs, why, sizeof why), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(runs, 0);
  EXPECT_STREQ(why, "GPU mi300x has no CUDA (rocm): meshplan's runtime drives CUDA GPUs and CPUs");
  mp_sim_evaluator_free(&ev);
}
}  // namespace
