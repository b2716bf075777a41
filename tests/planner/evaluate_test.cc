// planner/evaluate.h: the evaluator's per-worker cache (one built plan per mesh and float8
// setting, the other candidates' plans derived from it, simulator preps reused, each
// worker's own simulator workspace) must give the same prediction as simulating each
// candidate's plan from scratch (mp_simulate_plan), for every candidate of a real search
// run on two worker threads; and the search must deliver every candidate once, in
// enumeration order, whatever the chunking.
#include <gtest/gtest.h>

#include <functional>
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

// The simulated candidates of a search on the expert grid and resharded after forward (each
// mesh's plan is cached once for both reshard settings, planner/evaluate.h).
struct Compared {
  int64_t grid = 0, resharded = 0;
};

void RunAndCompare(const char *model, const char *gpu, int gpus, int per_node, int64_t seq,
                   int64_t gb, Compared *seen = nullptr, int fix_etp = -1) {
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
  cfg.fix.etp = fix_etp;
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
    if (seen) {
      seen->grid += cd.mesh.etp == 1;
      seen->resharded += cd.reshard;
    }
  }
  EXPECT_EQ(compared, s->n_evaluated);
  mp_search_destroy(s);
  mp_sim_evaluator_free(&ev);
}

// One search of model on gpus x gpu with the evaluator's memory_first as given: its
// candidates into *out (the search destroyed after the copy). no_capacity: every candidate
// simulated whatever its memory (no lower-bound prune); each (may be empty) then sees every
// candidate with the search's config.
void SearchWith(const char *model, const char *gpu, int gpus, int64_t seq, int64_t gb, int memory_first,
                const char *stack, std::vector<mp_candidate> *out, int no_capacity = 0,
                const std::function<void(const mp_search_config &, const mp_candidate &)> &each = nullptr) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_cluster c;
  ASSERT_EQ(mp_model_load(&ctx, model, &m), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_cluster_make(&ctx, gpu, gpus, 8, &c), MP_OK) << mp_errmsg(&ctx);
  mp_sim_evaluator ev;
  ASSERT_EQ(mp_sim_evaluator_init(&ctx, &ev, &m, &c, seq, gb, 0.05, stack), MP_OK) << mp_errmsg(&ctx);
  ev.sim.memory_first = memory_first;
  mp_search_config cfg;
  mp_sim_search_config(&cfg, &ev, &c, 0.05);
  cfg.n_threads = 2;
  if (no_capacity) cfg.mem_capacity_bytes = 0;
  mp_search *s = nullptr;
  ASSERT_EQ(mp_search_enumerate(&ctx, &cfg, &s), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_search_run(&ctx, &cfg, s, nullptr, nullptr, nullptr, nullptr), MP_OK) << mp_errmsg(&ctx);
  out->assign(s->cands, s->cands + s->n);
  if (each)
    for (int64_t i = 0; i < s->n; i++) each(cfg, s->cands[i]);
  mp_search_destroy(s);
  mp_sim_evaluator_free(&ev);
}

// memory_first: a plan's simulation stops at the first stage over capacity. The
// plan's peak is the largest stage's (mp_sim_pipeline_result), so such a stage decides
// "over capacity" exactly as the whole simulation does: every candidate's verdict is the
// same, the plans that fit keep every figure to the bit (they are simulated in full), and a
// stopped one reports a stage's peak, over capacity and at most the plan's.
void ExpectMemoryFirstSame(const char *model, const char *gpu, int gpus, int64_t seq, int64_t gb,
                           const char *stack) {
  std::vector<mp_candidate> full, first;
  SearchWith(model, gpu, gpus, seq, gb, 0, stack, &full);
  SearchWith(model, gpu, gpus, seq, gb, 1, stack, &first);
  ASSERT_EQ(full.size(), first.size());
  int64_t stopped = 0, fit = 0;
  for (size_t i = 0; i < full.size(); i++) {
    const mp_candidate &a = full[i], &b = first[i];
    ASSERT_EQ(a.reject, b.reject) << model << " candidate " << i;
    ASSERT_EQ(a.evaluated, b.evaluated) << model << " candidate " << i;
    if (!a.evaluated) continue;
    if (a.reject == MP_REJECT_NONE) {
      ExpectSame(a.res, b.res, std::string(model) + " candidate " + std::to_string(i));
      fit++;
    } else if (a.reject == MP_REJECT_MEMORY && b.res.step_time_s == 0.0) {
      EXPECT_GT(a.res.step_time_s, 0.0);
      EXPECT_GT(b.res.peak_mem_bytes, b.res.capacity_bytes) << i;
      EXPECT_LE(b.res.peak_mem_bytes, a.res.peak_mem_bytes) << i;
      EXPECT_EQ(b.res.fits, 0) << i;
      stopped++;
    }
  }
  EXPECT_GT(fit, 0) << model << ": nothing fits, the test says nothing";
  EXPECT_GT(stopped, 0) << model << ": no simulation stopped early, the test says nothing";
}

}  // namespace

TEST(Evaluate, MemoryFirstDecidesAsTheFullSimulation) {
  ExpectMemoryFirstSame("llama3.1-70b", "h100-sxm", 64, 8192, 128, nullptr);
  ExpectMemoryFirstSame("deepseek-v2-lite", "h100-sxm", 32, 4096, 64, "megatron-core");
}

TEST(Evaluate, CachedPlansGiveTheUncachedPredictions) {
  RunAndCompare("llama3.1-8b", "h100-sxm", 16, 8, 4096, 64);  // pp, cp, tp, dp mixes
  RunAndCompare("tiny-moe", "h100-sxm", 8, 8, 512, 32);       // ep > 1
  Compared moe;
  RunAndCompare("tiny-moe", "h100-sxm", 8, 8, 512, 32, &moe, 1);  // the expert grid
  // FSDP (the config's default) with etp=1 named searches the expert grid and both reshard
  // settings of a mesh without pp, so both kinds of candidate were compared
  EXPECT_GT(moe.grid, 0);
  EXPECT_GT(moe.resharded, 0);
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

namespace {

// Every candidate of a search of Llama 3.1 8B on 8 GPUs under megatron-core with
// --fp8-param-gather, simulated whatever its memory (no capacity prune): how many have a
// memory lower bound over their simulated peak, the bound taken with the option in the search
// config (cfg_gather 1) or left out of it (0, the model dtype's 2 bytes a weight), of how many
// float8 candidates.
void BoundOverPeak(const char *gpu, int cfg_gather, int64_t *over, int64_t *fp8) {
  *over = *fp8 = 0;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_cluster c;
  ASSERT_EQ(mp_model_load(&ctx, "llama3.1-8b", &m), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_cluster_make(&ctx, gpu, 8, 8, &c), MP_OK) << mp_errmsg(&ctx);
  mp_sim_evaluator ev;
  ASSERT_EQ(mp_sim_evaluator_init(&ctx, &ev, &m, &c, 1024, 8, 0.05, "megatron-core"), MP_OK) << mp_errmsg(&ctx);
  ev.base.fp8_opts.param_gather = 1;
  mp_search_config cfg;
  mp_sim_search_config(&cfg, &ev, &c, 0.05);
  ASSERT_EQ(cfg.fp8_param_gather, 1);
  cfg.mem_capacity_bytes = 0;
  cfg.n_threads = 2;
  mp_search *s = nullptr;
  ASSERT_EQ(mp_search_enumerate(&ctx, &cfg, &s), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_search_run(&ctx, &cfg, s, nullptr, nullptr, nullptr, nullptr), MP_OK) << mp_errmsg(&ctx);
  cfg.fp8_param_gather = cfg_gather;
  for (int64_t i = 0; i < s->n; i++) {
    const mp_candidate &cd = s->cands[i];
    if (!cd.evaluated || !cd.fp8) continue;
    (*fp8)++;
    *over += mp_search_mem_lower_bound(&cfg, &cd) > (double)cd.res.peak_mem_bytes;
  }
  mp_search_destroy(s);
  mp_sim_evaluator_free(&ev);
}

}  // namespace

// The bound is the state at rest: DDP's distributed optimizer 6 + 12 / dp bytes a parameter
// with bf16 weights. Under --fp8-param-gather a float8 weight is 1 byte; on the B200 (10.0)
// Transformer Engine holds nothing beside it (delayed scaling, no transpose), so the 2-byte
// count is over the true state by a byte a float8 parameter, 6,979,321,856 on a tp 1 rank
// (6.5 GiB), more than a 1,024-token micro-batch's activations: over the simulated peak. Taken
// from the search config, the bound stays under every peak; on the H100 the transpose
// Transformer Engine holds (a byte) makes up the byte either way.
TEST(Evaluate, MemoryBoundUnderPeakWithFp8ParamGather) {
  int64_t over = 0, fp8 = 0;
  BoundOverPeak("b200", 1, &over, &fp8);
  EXPECT_GT(fp8, 10);
  EXPECT_EQ(over, 0);
  BoundOverPeak("b200", 0, &over, &fp8);
  EXPECT_GT(over, 0) << "the 2-byte count never passes a peak: the test says nothing";
  BoundOverPeak("h100-sxm", 1, &over, &fp8);
  EXPECT_GT(fp8, 10);
  EXPECT_EQ(over, 0);
}

namespace {

// Every candidate of a search of model on n GPUs of gpu under megatron-core at seq and global
// batch gb, simulated in full whatever its memory (no capacity prune, no memory_first stop):
// how many on the expert grid with etp > 1 were simulated (*etp_n) and how many of them have
// a memory lower bound over their simulated peak (*over).
void EtpBoundOverPeak(const char *model, const char *gpu, int n, int64_t seq, int64_t gb, int64_t *over,
                      int64_t *etp_n) {
  *over = *etp_n = 0;
  std::vector<mp_candidate> cands;
  SearchWith(model, gpu, n, seq, gb, 0, "megatron-core", &cands, 1,
             [&](const mp_search_config &cfg, const mp_candidate &cd) {
               if (!cd.evaluated || cd.reject == MP_REJECT_EVAL_ERROR || cd.mesh.etp <= 1) return;
               (*etp_n)++;
               *over += mp_search_mem_lower_bound(&cfg, &cd) > (double)cd.res.peak_mem_bytes;
             });
}

}  // namespace

// The expert grid with etp > 1 (exec/mesh.h) splits each local expert over etp ranks, so a rank
// holds the routed experts' parameters over ep x etp x pp ranks and reduces their gradients over
// stage / (ep x etp) expert-DP ranks: the bound counts them so. Counted over ep x pp alone, as
// etp = 1 holds them, the routed experts of Mixtral 8x7B (32 layers x 8 experts x 3 x 4096 x
// 14336 = 45.1e9 parameters) at ep 2, etp 4, pp 1 would be 22.5e9 parameters a rank at 2 bytes
// and more, 42 GiB, where the rank holds a quarter of that: over its simulated peak.
TEST(Evaluate, MemoryBoundUnderPeakWithExpertTp) {
  int64_t over = 0, etp_n = 0;
  EtpBoundOverPeak("mixtral-8x7b", "h100-sxm", 8, 1024, 8, &over, &etp_n);
  EXPECT_GT(etp_n, 10);
  EXPECT_EQ(over, 0);
}

// Megatron FSDP (--fix dp_shard=4 on megatron-core) on a MoE model over 16 GPUs: the search
// enumerates the hybrid meshes dp_replicate x dp_shard 4 with ep > 1, which exec/plan.c
// refuses (mp_rule_mfsdp_experts_ok). They are pruned before a simulation, counted under
// mfsdp_experts, so no candidate ends as eval_error; dp_replicate 2 x dp_shard 4 x tp 2 with
// ep 2 (2 x 4 x 2 = 16 GPUs, ep 2 dividing dp_shard 4) is one of them.
TEST(Evaluate, MegatronFsdpHybridWithExpertsPrunedNotRefused) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_cluster c;
  ASSERT_EQ(mp_model_load(&ctx, "tiny-moe", &m), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_cluster_make(&ctx, "h100-sxm", 16, 8, &c), MP_OK) << mp_errmsg(&ctx);
  mp_sim_evaluator ev;
  ASSERT_EQ(mp_sim_evaluator_init(&ctx, &ev, &m, &c, 512, 64, 0.05, "megatron-core"), MP_OK) << mp_errmsg(&ctx);
  mp_search_config cfg;
  mp_sim_search_config(&cfg, &ev, &c, 0.05);
  cfg.n_threads = 2;
  ASSERT_EQ(mp_search_fix_parse(&ctx, "dp_shard=4", &cfg.fix), MP_OK) << mp_errmsg(&ctx);
  mp_search *s = nullptr;
  ASSERT_EQ(mp_search_enumerate(&ctx, &cfg, &s), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_search_run(&ctx, &cfg, s, nullptr, nullptr, nullptr, nullptr), MP_OK) << mp_errmsg(&ctx);
  int64_t by[MP_REJECT_COUNT];
  mp_search_reject_counts(s, by);
  EXPECT_EQ(by[MP_REJECT_EVAL_ERROR], 0);
  EXPECT_GT(by[MP_REJECT_MFSDP_EXPERTS], 0);
  int hybrid_ep2 = 0;
  for (int64_t i = 0; i < s->n; i++) {
    const mp_mesh &k = s->cands[i].mesh;
    if (k.size[MP_DIM_DP_REPLICATE] > 1 && k.ep > 1) {
      EXPECT_EQ(s->cands[i].reject, MP_REJECT_MFSDP_EXPERTS) << i;
    }
    hybrid_ep2 += k.size[MP_DIM_DP_REPLICATE] == 2 && k.size[MP_DIM_TP] == 2 && k.ep == 2 && !mp_mesh_expert_grid(&k);
  }
  EXPECT_GT(hybrid_ep2, 0) << "the hybrid mesh with ep 2 was not enumerated: the test says nothing";
  EXPECT_STREQ(mp_reject_name(MP_REJECT_MFSDP_EXPERTS), "mfsdp_experts");
  mp_search_destroy(s);
  mp_sim_evaluator_free(&ev);
}
