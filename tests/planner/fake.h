/* Test fixtures for the planner: hand-built models and clusters, and a deterministic fake
 * evaluator, so search, store and plots are tested without the simulator.
 *
 * Fake model of a candidate (stated so tests can derive expectations by hand):
 *   peak   = 64 GiB / (dp_shard * tp * pp * cp) + micro_batch * act GiB,
 *            act = 8 (ac none), 4 (selective-core), 1 (full); fp8 saves 1 GiB when mb >= 1
 *   step   = 10 / (dp_replicate * dp_shard * tp) s * (1 + 0.25 * r) * (fp8 ? 0.8 : 1)
 *            + 0.001 * reshard + 0.01 / micro_batch
 *            with r = 0, 1, 2 for ac none, selective-core, full (the search's default
 *            policies; any other counts as selective-core)
 *   fits   = peak <= capacity (40 GiB)
 * A candidate with tp == 2 and ac == full fails with "fake refusal" when fail_tp2_full.
 * With ep_cp_effects, expert and context parallelism act as they do on a real cluster, a
 * little better than the plan without them, so that only the tie rule keeps the simpler
 * plan first:
 *   peak  = 64 GiB / (dp_shard * tp * pp * cp) + micro_batch * act / cp GiB - (ep > 1 ? 1 : 0) GiB
 *           - (fp8 ? 1 : 0) GiB   (cp splits the sequence's activations; EP shards the experts)
 *   step  = 10 / (dp_replicate * dp_shard * cp * tp) s * (1 + 0.25 * r) * (fp8 ? 0.8 : 1)
 *           * (ep > 1 ? 0.995 : 1) * (cp > 1 ? 0.995 : 1) + 0.001 * reshard + 0.01 / micro_batch */
#ifndef MP_TESTS_PLANNER_FAKE_H
#define MP_TESTS_PLANNER_FAKE_H

#include <string.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "planner/search.h"

static const int64_t kGiB = 1024LL * 1024 * 1024;

struct FakeEval {
  int fail_tp2_full = 0;
  int delay_us = 0; /* each evaluation sleeps this long: a search that takes its time */
  int ep_cp_effects = 0; /* the model with EP and cp effects (above) */
  double capacity_gib = 40; /* GPU memory less headroom */
};

static inline mp_status fake_eval(void *user, mp_ctx *ctx, mp_arena *scratch,
                                  const mp_candidate *c, mp_sim_result *out) {
  const FakeEval *fe = static_cast<const FakeEval *>(user);
  // The scratch arena is usable and reset between calls.
  if (!mp_arena_alloc(scratch, 4096)) return mp_error(ctx, MP_ERR_NOMEM, "scratch");
  const mp_mesh &m = c->mesh;
  if (fe && fe->delay_us > 0) usleep((useconds_t)fe->delay_us);
  if (fe && fe->fail_tp2_full && m.size[MP_DIM_TP] == 2 && c->ac == MP_AC_FULL)
    return mp_error(ctx, MP_ERR_ORDER, "fake refusal tp=2 full");
  const int r = c->ac == MP_AC_NONE ? 0 : c->ac == MP_AC_FULL ? 2 : 1;
  int64_t act = r == 0 ? 8 : r == 1 ? 4 : 1;
  const int fx = fe && fe->ep_cp_effects, cp = m.size[MP_DIM_CP];
  memset(out, 0, sizeof *out);
  out->peak_mem_bytes = 64 * kGiB / ((int64_t)m.size[MP_DIM_DP_SHARD] * m.size[MP_DIM_TP] *
                                     m.size[MP_DIM_PP] * cp) +
                        c->micro_batch * act * kGiB / (fx ? cp : 1) - (c->fp8 ? kGiB : 0) -
                        (fx && m.ep > 1 ? kGiB : 0);
  out->mem_at_peak[MP_MEM_PARAMS] = out->peak_mem_bytes / 2;
  out->mem_at_peak[MP_MEM_ACTIVATIONS] = out->peak_mem_bytes - out->peak_mem_bytes / 2;
  out->capacity_bytes = (int64_t)((fe ? fe->capacity_gib : 40.0) * (double)kGiB);
  out->fits = out->peak_mem_bytes <= out->capacity_bytes;
  double dp = (double)m.size[MP_DIM_DP_REPLICATE] * m.size[MP_DIM_DP_SHARD] * (fx ? cp : 1);
  out->step_time_s = 10.0 / (dp * m.size[MP_DIM_TP]) * (1 + 0.25 * r) * (c->fp8 ? 0.8 : 1.0) *
                         (fx && m.ep > 1 ? 0.995 : 1.0) * (fx && cp > 1 ? 0.995 : 1.0) +
                     0.001 * c->reshard + 0.01 / (double)c->micro_batch;
  out->tokens_per_s_per_gpu = 1000.0 / out->step_time_s;
  out->mfu = 0.4;
  out->compute_s = out->step_time_s * 0.9;
  out->exposed_comm_s = out->step_time_s * 0.1;
  return MP_OK;
}

/* A small dense llama-like model whose dims every tp in {1,2,4,8} divides. */
static inline mp_model fake_dense_model() {
  mp_model m;
  memset(&m, 0, sizeof m);
  strcpy(m.name, "fake-dense");
  m.family = MP_FAMILY_LLAMA;
  m.vocab = 1000;
  m.d_model = 1024;
  m.n_layers = 16;
  m.n_heads = 16;
  m.n_kv_heads = 8;
  m.head_dim = 64;
  m.d_ff = 4096;
  m.max_seq = 4096;
  m.norm_eps = 1e-5;
  m.rope_theta = 10000;
  return m;
}

static inline mp_model fake_moe_model(int64_t n_experts) {
  mp_model m = fake_dense_model();
  strcpy(m.name, "fake-moe");
  m.n_experts = n_experts;
  m.top_k = 2;
  m.d_ff_expert = 512;
  for (int64_t l = 0; l < m.n_layers; l++) m.moe_layer[l] = 1;
  return m;
}

static inline mp_cluster fake_cluster(int n_nodes, int gpus_per_node, int cc = 90) {
  mp_cluster c;
  memset(&c, 0, sizeof c);
  strcpy(c.name, "fake-cluster");
  strcpy(c.gpu.name, "fake-gpu");
  c.gpu.peak_tflops[MP_DTYPE_BF16] = 1000;
  c.gpu.peak_tflops[MP_DTYPE_FP8_E4M3] = cc >= 89 ? 2000 : 0;
  c.gpu.peak_tflops[MP_DTYPE_FP8_E5M2] = cc >= 89 ? 2000 : 0;
  c.gpu.mem_gib = 40;
  c.gpu.compute_capability = cc;
  c.gpus_per_node = gpus_per_node;
  c.n_nodes = n_nodes;
  c.intra_node_GBps_per_gpu = 450;
  c.inter_node_Gbitps_per_gpu = 400;
  c.price_per_gpu_hour = 2.0;
  return c;
}

/* A search of the fake dense model on one node of 8 fake GPUs at seq 4096 and a global
 * batch of 32, run on 2 threads and ranked by time (order[0..n_order)); full_ac_ahead as
 * mp_search_config's (0: every candidate decided in enumeration order). */
struct FakeRankedSearch {
  mp_model model = fake_dense_model();
  mp_cluster cluster = fake_cluster(1, 8);
  mp_search_config cfg;
  FakeEval fe;
  mp_search *s = nullptr;
  int64_t *order = nullptr, n_order = 0;
  mp_ctx ctx;
  explicit FakeRankedSearch(int full_ac_ahead = 1) {
    mp_ctx_init(&ctx);
    mp_search_config_init(&cfg);
    cfg.full_ac_ahead = full_ac_ahead;
    cfg.model = &model;
    cfg.cluster = &cluster;
    cfg.seq = 4096;
    cfg.global_batch = 32;
    cfg.eval = fake_eval;
    cfg.eval_user = &fe;
    cfg.n_threads = 2;
    EXPECT_EQ(mp_search_enumerate(&ctx, &cfg, &s), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(mp_search_run(&ctx, &cfg, s, nullptr, nullptr, nullptr, nullptr), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(mp_search_rank(&ctx, s, MP_OBJECTIVE_TIME, 0, &order, &n_order), MP_OK) << mp_errmsg(&ctx);
  }
  ~FakeRankedSearch() { mp_search_destroy(s); }
  FakeRankedSearch(const FakeRankedSearch &) = delete;
  FakeRankedSearch &operator=(const FakeRankedSearch &) = delete;
};

#endif
