// Simulator on real plans and schedules (exec/plan.h, exec/schedule.h): resident bytes of
// Llama-3.1-8B under FSDP 8 against hand arithmetic, compact vs expanded schedules,
// overlap behaviour, and the Chrome trace (parsed back; events of a track nest or are
// disjoint).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "exec/plan.h"
#include "exec/schedule.h"
#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/sim/plan_case.h"

namespace {

void SimTraced(PlanCase &s, mp_sim_result *r, std::vector<double> *d, std::vector<mp_op> *ops) {
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&s.ctx, &s.m, &s.mesh, &s.o, &p), MP_OK) << mp_errmsg(&s.ctx);
  mp_arena *a = mp_arena_create();
  mp_schedule *sc = nullptr;
  ASSERT_EQ(mp_schedule_build(&s.ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &sc), MP_OK);
  s.cfg.record_trace = 1;
  mp_sim_trace *t = nullptr;
  ASSERT_EQ(mp_simulate(&s.ctx, sc, &s.cfg, r, &t), MP_OK) << mp_errmsg(&s.ctx);
  d->assign((size_t)sc->n_ops, 0.0);
  mp_sim_trace_op_durations(t, d->data(), sc->n_ops);
  ops->assign(sc->ops, sc->ops + sc->n_ops);
  mp_sim_trace_destroy(t);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
}

// The copies and sums schedule_ops.c emits around torchtitan's TP collectives (sp_cat,
// fused_shard_copy, fused_partials_sum: a copy, with the buffer allocated just before and
// freed just after it where it has one, or an add carrying a region Linear's module),
// dropped with their durations.
void DropSpLayoutOps(std::vector<mp_op> *ops, std::vector<double> *d) {
  const size_t n = ops->size();
  std::vector<bool> drop(n, false);
  for (size_t i = 0; i < n; i++) {
    const mp_op &op = (*ops)[i];
    const bool sum = op.kernel == MP_KERNEL_RESIDUAL && op.module >= 0;
    if (op.type != MP_OP_COMPUTE || !(op.kernel == MP_KERNEL_COPY || sum)) continue;
    drop[i] = true;
    if (i == 0 || i + 1 == n) continue;
    const mp_op &a = (*ops)[i - 1], &f = (*ops)[i + 1];
    if (a.type == MP_OP_ALLOC && f.type == MP_OP_FREE && a.buf == f.buf && a.mem_bytes == f.mem_bytes)
      drop[i - 1] = drop[i + 1] = true;
  }
  std::vector<mp_op> o;
  std::vector<double> k;
  for (size_t i = 0; i < n; i++)
    if (!drop[i]) {
      o.push_back((*ops)[i]);
      k.push_back((*d)[i]);
    }
  *ops = o;
  *d = k;
}

}  // namespace

// Llama-3.1-8B, FSDP over 8 GPUs: every parameter is sharded 8 ways (FSDP2 pads each
// unit's dim 0 to the group, a few thousand elements at most). fp32 master copy 4 bytes
// per element, fp32 gradients 4, AdamW m and v 8: with N = 8.03e9,
//   params 4.015e9 B, grads 4.015e9 B, optimizer 8.03e9 B per GPU.
TEST(PlanMemory, Llama8bFsdp8ResidentBytes) {
  PlanCase s("llama3.1-8b", "h100-8", "dp_shard=8");
  s.FullAcOneSequence(8192, 8);
  mp_sim_result r = s.Sim();
  const double N = (double)mp_model_param_count(&s.m);
  EXPECT_NEAR(N, 8.03e9, 0.01e9);
  EXPECT_NEAR((double)r.mem_max[MP_MEM_PARAMS], N * 4 / 8, 1e-4 * N);
  EXPECT_NEAR((double)r.mem_max[MP_MEM_GRADS], N * 4 / 8, 1e-4 * N);
  EXPECT_NEAR((double)r.mem_max[MP_MEM_OPTIMIZER], N * 8 / 8, 1e-4 * N);
  // resident at the peak
  EXPECT_EQ(r.mem_at_peak[MP_MEM_PARAMS], r.mem_max[MP_MEM_PARAMS]);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_OPTIMIZER], r.mem_max[MP_MEM_OPTIMIZER]);
  EXPECT_TRUE(r.fits);
}

// Compact and expanded schedules describe the same step: the simulator must give the
// same step time and memory for both (the compact one extrapolates repeated blocks and
// middle micro-batches).
TEST(PlanTime, CompactEqualsExpanded) {
  const char *meshes[] = {"dp_shard=8", "dp_shard=2,tp=4", "dp_replicate=2,dp_shard=4"};
  for (const char *ms : meshes) {
    PlanCase s("llama3.1-8b", "h100-8", ms);
    s.o.seq = 4096;
    s.o.micro_batch = 1;
    s.o.global_batch = 6 * s.mesh.size[MP_DIM_DP_SHARD] * s.mesh.size[MP_DIM_DP_REPLICATE];
    s.o.ac = MP_AC_SELECTIVE;
    mp_plan *p = NULL;
    ASSERT_EQ(mp_build_plan(&s.ctx, &s.m, &s.mesh, &s.o, &p), MP_OK) << mp_errmsg(&s.ctx);
    mp_arena *a = mp_arena_create();
    mp_schedule *sc = NULL, *se = NULL;
    ASSERT_EQ(mp_schedule_build(&s.ctx, p, 0, MP_SCHEDULE_COMPACT, a, &sc), MP_OK) << mp_errmsg(&s.ctx);
    ASSERT_EQ(mp_schedule_build(&s.ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &se), MP_OK) << mp_errmsg(&s.ctx);
    EXPECT_LT(sc->n_ops, se->n_ops);
    mp_sim_result rc, re;
    ASSERT_EQ(mp_simulate(&s.ctx, sc, &s.cfg, &rc, NULL), MP_OK) << mp_errmsg(&s.ctx);
    ASSERT_EQ(mp_simulate(&s.ctx, se, &s.cfg, &re, NULL), MP_OK) << mp_errmsg(&s.ctx);
    EXPECT_NEAR(rc.step_time_s, re.step_time_s, 1e-6 * re.step_time_s) << ms;
    EXPECT_NEAR(rc.exposed_comm_s, re.exposed_comm_s, 1e-6 * re.step_time_s) << ms;
    EXPECT_EQ(rc.peak_mem_bytes, re.peak_mem_bytes) << ms;
    for (int k = 0; k < MP_MEM_COUNT; k++) EXPECT_EQ(rc.mem_at_peak[k], re.mem_at_peak[k]) << ms << k;
    // the trace run (nothing extrapolated) agrees as well
    s.cfg.record_trace = 1;
    mp_sim_trace *t = NULL;
    mp_sim_result rt;
    ASSERT_EQ(mp_simulate(&s.ctx, sc, &s.cfg, &rt, &t), MP_OK) << mp_errmsg(&s.ctx);
    EXPECT_NEAR(rt.step_time_s, re.step_time_s, 1e-6 * re.step_time_s) << ms;
    mp_sim_trace_destroy(t);
    mp_arena_destroy(a);
    mp_plan_destroy(p);
  }
}

// FSDP on one node: all-gathers are prefetched on their own stream and hide under the
// block's compute (8B with seq 8192 does ~1.5 ms of GEMMs per block, a block's gather
// of 0.44 GB takes ~1 ms at NVLink speed); TP=8 all-reduces sit on the compute stream.
TEST(PlanTime, FsdpHidesGathersTpExposes) {
  PlanCase f("llama3.1-8b", "h100-8", "dp_shard=8");
  f.o.seq = 8192;
  f.o.micro_batch = 1;
  f.o.global_batch = 8;
  mp_sim_result rf = f.Sim();
  EXPECT_GT(rf.comm_s[MP_STREAM_GATHER], 0.0);
  EXPECT_LT(rf.exposed_comm_s, 0.15 * rf.step_time_s);
  PlanCase t("llama3.1-8b", "h100-8", "tp=8");
  t.o = f.o;
  t.o.global_batch = 1;
  mp_sim_result rt = t.Sim();
  EXPECT_GT(rt.comm_s[MP_STREAM_COMPUTE], 0.0);
  EXPECT_GE(rt.exposed_comm_s, rt.comm_s[MP_STREAM_COMPUTE] * 0.999);
  // per-GPU throughput: the TP replica spreads one micro-batch over 8 GPUs
  EXPECT_LT(rt.tokens_per_s_per_gpu, rf.tokens_per_s_per_gpu);
}

// The trace parses as Chrome trace JSON: thread_name metadata for every stream, complete
// events with FQN names, and on each track events nest or are disjoint.
// A plan's compact schedule of rank 0 simulated with its trace, written to TEST_TMPDIR/name
// and parsed back; freed with the fixture.
struct Traced {
  mp_plan *p = nullptr;
  mp_arena *a = nullptr;
  mp_sim_trace *t = nullptr;
  cJSON *json = nullptr;
  mp_sim_result r;
  void Run(PlanCase &s, const char *name) {
    ASSERT_EQ(mp_build_plan(&s.ctx, &s.m, &s.mesh, &s.o, &p), MP_OK) << mp_errmsg(&s.ctx);
    a = mp_arena_create();
    mp_schedule *sc = NULL;
    ASSERT_EQ(mp_schedule_build(&s.ctx, p, 0, MP_SCHEDULE_COMPACT, a, &sc), MP_OK) << mp_errmsg(&s.ctx);
    s.cfg.record_trace = 1;
    ASSERT_EQ(mp_simulate(&s.ctx, sc, &s.cfg, &r, &t), MP_OK) << mp_errmsg(&s.ctx);
    const char *tmp = getenv("TEST_TMPDIR");
    std::string path = std::string(tmp ? tmp : "/tmp") + "/" + name;
    ASSERT_EQ(mp_sim_trace_write(&s.ctx, t, path.c_str()), MP_OK) << mp_errmsg(&s.ctx);
    ASSERT_EQ(mp_json_parse_file(&s.ctx, path.c_str(), &json), MP_OK) << mp_errmsg(&s.ctx);
  }
  ~Traced() {
    cJSON_Delete(json);
    mp_sim_trace_destroy(t);
    mp_arena_destroy(a);
    mp_plan_destroy(p);
  }
};

// The memory counter's highest total is the allocated peak the result breaks down by
// category (mem_at_peak; the runtime overhead is no event): Llama-3.1-8B under FSDP 8 holds
// tens of GiB, each category rounded to 1e-4 GiB in the trace.
TEST(Trace, MemoryCounterPeaksAtTheResultsPeak) {
  PlanCase s("llama3.1-8b", "h100-8", "dp_shard=8");
  s.o.micro_batch = 1;
  s.o.global_batch = 16;
  Traced tr;
  ASSERT_NO_FATAL_FAILURE(tr.Run(s, "trace_mem.json"));
  cJSON *j = tr.json;
  const mp_sim_result &r = tr.r;
  double counter_max = 0;
  int counters = 0;
  cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) {
    if (strcmp(cJSON_GetObjectItemCaseSensitive(e, "ph")->valuestring, "C") != 0) continue;
    counters++;
    double total = 0;
    cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(e, "args")) total += x->valuedouble;
    counter_max = std::max(counter_max, total);
  }
  double at_peak = 0;
  for (int c = 0; c < MP_MEM_COUNT; c++) at_peak += (double)r.mem_at_peak[c];
  EXPECT_GT(at_peak, 10.0 * 1073741824.0);
  EXPECT_GT(counters, 100);
  EXPECT_NEAR(counter_max * 1073741824.0, at_peak, MP_MEM_COUNT * 0.5e-4 * 1073741824.0);
}

TEST(Trace, ParsesAndNests) {
  PlanCase s("tiny-dense", "h100-8", "dp_shard=4,tp=2");
  s.o.micro_batch = 1;
  s.o.global_batch = 8;
  Traced trace;
  ASSERT_NO_FATAL_FAILURE(trace.Run(s, "trace.json"));
  cJSON *j = trace.json;
  const mp_sim_result &r = trace.r;
  cJSON *evs = cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
  ASSERT_TRUE(cJSON_IsArray(evs));
  struct Ev {
    double ts, dur;
  };
  std::vector<std::vector<Ev>> tracks(MP_STREAM_COUNT);
  int meta = 0, layer_named = 0, counters = 0;
  double counter_max = 0;
  cJSON *e;
  cJSON_ArrayForEach(e, evs) {
    const char *ph = cJSON_GetObjectItemCaseSensitive(e, "ph")->valuestring;
    if (strcmp(ph, "C") == 0) {  // the memory counter: every category's level, GiB
      counters++;
      double total = 0;
      cJSON *a;
      cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(e, "args")) total += a->valuedouble;
      counter_max = std::max(counter_max, total);
      continue;
    }
    int tid = cJSON_GetObjectItemCaseSensitive(e, "tid")->valueint;
    ASSERT_TRUE(tid >= 0 && tid < MP_STREAM_COUNT);
    EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(e, "pid")->valueint, 0);
    if (strcmp(ph, "M") == 0) {
      meta++;
      continue;
    }
    ASSERT_STREQ(ph, "X");
    const char *name = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
    if (strncmp(name, "layers.", 7) == 0) layer_named++;
    ASSERT_TRUE(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(e, "args")));
    tracks[tid].push_back({cJSON_GetObjectItemCaseSensitive(e, "ts")->valuedouble,
                           cJSON_GetObjectItemCaseSensitive(e, "dur")->valuedouble});
  }
  EXPECT_EQ(meta, MP_STREAM_COUNT);
  EXPECT_GT(layer_named, 0);
  EXPECT_GT(counters, 10);  // the memory counter track
  EXPECT_GT(counter_max, 0.0);
  EXPECT_GT(tracks[MP_STREAM_COMPUTE].size(), 10u);
  double last_end = 0;
  for (auto &tr : tracks) {
    std::sort(tr.begin(), tr.end(), [](const Ev &a, const Ev &b) { return a.ts < b.ts; });
    for (size_t i = 1; i < tr.size(); i++) {
      const Ev &u = tr[i - 1], &v = tr[i];
      bool disjoint = v.ts >= u.ts + u.dur - 1e-6;
      bool nested = v.ts + v.dur <= u.ts + u.dur + 1e-6;
      EXPECT_TRUE(disjoint || nested) << "partial overlap at " << v.ts;
    }
    for (auto &ev : tr) last_end = std::max(last_end, ev.ts + ev.dur);
  }
  // the timeline ends when the step does (microseconds)
  EXPECT_NEAR(last_end, r.step_time_s * 1e6, 1e-6 * r.step_time_s * 1e6 + 1e-3);
}

// Distinct pipeline stages (sim/sim_plan.c): mp_simulate_built_plan simulates only the
// first, the last and the earliest of each class of alike middle stages; the result must
// equal, field for field and to the bit, the reference that builds and simulates every
// stage. Meshes cover even layers (8b pp=2,4,8), uneven ones (8b pp=5,6; pp=12 and
// gpt2 pp=8 leave middle stages with two layer counts, one of them empty), multi-node
// stages (h100-16k) and the all-stages fallback (world/pp=12 vs 8 GPUs a node).
namespace {
void ExpectSameResult(const mp_sim_result &a, const mp_sim_result &b, const std::string &what) {
  EXPECT_EQ(a.step_time_s, b.step_time_s) << what;
  EXPECT_EQ(a.tokens_per_s_per_gpu, b.tokens_per_s_per_gpu) << what;
  EXPECT_EQ(a.mfu, b.mfu) << what;
  EXPECT_EQ(a.compute_s, b.compute_s) << what;
  EXPECT_EQ(a.exposed_comm_s, b.exposed_comm_s) << what;
  EXPECT_EQ(a.bubble_s, b.bubble_s) << what;
  EXPECT_EQ(a.optimizer_s, b.optimizer_s) << what;
  for (int i = 0; i < MP_STREAM_COUNT; i++) EXPECT_EQ(a.comm_s[i], b.comm_s[i]) << what;
  EXPECT_EQ(a.peak_mem_bytes, b.peak_mem_bytes) << what;
  for (int i = 0; i < MP_MEM_COUNT; i++) {
    EXPECT_EQ(a.mem_at_peak[i], b.mem_at_peak[i]) << what << " category " << i;
    EXPECT_EQ(a.mem_max[i], b.mem_max[i]) << what << " category " << i;
  }
  EXPECT_EQ(a.overhead_bytes, b.overhead_bytes) << what;
  EXPECT_EQ(a.capacity_bytes, b.capacity_bytes) << what;
  EXPECT_EQ(a.fits, b.fits) << what;
}

void CheckDistinctStages(PlanCase &s, const std::string &what) {
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&s.ctx, &s.m, &s.mesh, &s.o, &p), MP_OK) << what << mp_errmsg(&s.ctx);
  mp_sim_result fast, ref, via_plan, via_scratch;
  ASSERT_EQ(mp_simulate_built_plan_all_stages(&s.ctx, p, &s.cfg, nullptr, &ref), MP_OK)
      << what << mp_errmsg(&s.ctx);
  ASSERT_EQ(mp_simulate_built_plan(&s.ctx, p, &s.cfg, nullptr, &fast), MP_OK)
      << what << mp_errmsg(&s.ctx);
  mp_plan_destroy(p);
  ExpectSameResult(fast, ref, what);
  ASSERT_EQ(mp_simulate_plan(&s.ctx, &s.m, &s.mesh, &s.o, &s.cfg, &via_plan), MP_OK);
  ExpectSameResult(via_plan, ref, what + " (mp_simulate_plan)");
  mp_arena *a = mp_arena_create();
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(mp_simulate_plan_scratch(&s.ctx, &s.m, &s.mesh, &s.o, &s.cfg, a, &via_scratch),
            MP_OK)
      << mp_errmsg(&s.ctx);
  EXPECT_GT(mp_arena_used_bytes(a), 0u) << "the schedules go to the caller's arena";
  mp_arena_destroy(a);
  ExpectSameResult(via_scratch, ref, what + " (scratch)");
  // the stages really differ: otherwise equality would say nothing about the selection
  EXPECT_GT(ref.step_time_s, 0.0) << what;
}
}  // namespace

TEST(PlanPipeline, DistinctStagesEqualAllStages) {
  struct Case {
    const char *model;
    int gpus, per_node;
    const char *mesh;
    mp_pp_schedule sched;
  } cases[] = {
      {"llama3.1-8b", 8, 8, "pp=2,dp_shard=4", MP_PP_1F1B},
      {"llama3.1-8b", 8, 8, "pp=4,dp_shard=2", MP_PP_1F1B},
      {"llama3.1-8b", 8, 8, "pp=8", MP_PP_1F1B},
      {"llama3.1-8b", 8, 8, "pp=8", MP_PP_GPIPE},
      {"llama3.1-8b", 40, 8, "pp=5,tp=8", MP_PP_1F1B},          // 6,7,7,6,6 layers
      {"llama3.1-8b", 96, 8, "pp=6,dp_shard=2,tp=8", MP_PP_1F1B}, // 5,6,6,5,5,5
      {"llama3.1-8b", 28, 4, "pp=7,tp=4", MP_PP_1F1B},            // 4,5,5,5,5,4,4
      {"llama3.1-8b", 72, 8, "pp=6,dp_shard=3,tp=4", MP_PP_1F1B}, // fallback: 12 vs 8
      {"gpt2-124m", 6, 8, "pp=3,dp_shard=2", MP_PP_1F1B},
      {"gpt2-124m", 8, 8, "pp=4,dp_shard=2", MP_PP_1F1B},
  };
  for (const Case &c : cases) {
    PlanCase s(c.model, "h100-8", "dp_shard=8");
    const std::string what = std::string(c.model) + " " + c.mesh;
    ASSERT_EQ(mp_cluster_make(&s.ctx, "h100-sxm", c.gpus, c.per_node, &s.c), MP_OK)
        << mp_errmsg(&s.ctx);
    ASSERT_EQ(mp_mesh_parse(&s.ctx, c.mesh, c.gpus, &s.mesh), MP_OK) << mp_errmsg(&s.ctx);
    s.m.tied_embeddings = 0; // gpt2 ties its head to the embedding: untie it for pp > 1
    s.o.seq = 1024;
    s.o.micro_batch = 1;
    s.o.global_batch = 96; // 8 or more micro-batches per replica: 1F1B in-flight counts
                           // differ from stage to stage
    s.o.ac = MP_AC_SELECTIVE;
    s.o.pp_schedule = c.sched;
    CheckDistinctStages(s, what);
  }
}

// A stated layout against the default split of s's plan: `even` (the default split stated)
// simulates to the same step and peak; `uneven` paces a longer step and leaves stage 0
// lighter; each stage simulated alone equals the whole pipeline's view of it.
void CheckStatedLayout(PlanCase &s, const std::vector<int16_t> &even, const std::vector<int16_t> &uneven,
                       const char *what) {
  int64_t peak[4] = {0, 0, 0, 0};
  s.cfg.stage_peak_bytes = peak;
  s.o.n_pp_layers = 0;
  const mp_sim_result base = s.Sim();
  const int64_t base0 = peak[0];
  s.o.n_pp_layers = (int)even.size();
  std::copy(even.begin(), even.end(), s.o.pp_layers);
  const mp_sim_result stated = s.Sim();
  EXPECT_EQ(stated.step_time_s, base.step_time_s) << what;
  EXPECT_EQ(stated.peak_mem_bytes, base.peak_mem_bytes) << what;
  s.o.n_pp_layers = (int)uneven.size();
  std::copy(uneven.begin(), uneven.end(), s.o.pp_layers);
  const mp_sim_result r = s.Sim();
  EXPECT_GT(r.step_time_s, base.step_time_s) << what;
  EXPECT_LT(peak[0], base0) << what;
  s.cfg.stage_peak_bytes = nullptr;
  CheckDistinctStages(s, what);
}

// Uneven stages (pp_layers): Llama-3.1-8B's 32 layers on pp=4. The stated 8, 8, 8, 8 is the
// default split and simulates to the same result; under 1F1B the step is paced by the
// slowest stage, so moving three layers off stage 0 onto the others (5, 9, 9, 9) lengthens
// the step, and stage 0, now holding 5 layers' weights and activations, peaks lower.
TEST(PlanPipeline, StatedUnevenStages) {
  PlanCase s("llama3.1-8b", "h100-8", "pp=4,dp_shard=2");
  s.FullAcOneSequence(8192, 16);
  CheckStatedLayout(s, {8, 8, 8, 8}, {5, 9, 9, 9}, "llama3.1-8b pp=4 5,9,9,9");
}

// A layout per model chunk under the interleaved schedule (Megatron-LM's
// --pipeline-model-parallel-layout): Llama-3.1-8B on pp=4 x 2 chunks. Four layers a chunk,
// stated, is the default split. "E|(t*5|)*4(t*4|)*2t*4,L" is 0, 5, 5, 5, 5, 4, 4, 4: chunk 0
// the embedding alone, so stage 0 holds chunks 0 and 4, 0 + 5 layers against 8, while the
// 5-layer chunks pace the step longer.
TEST(PlanPipeline, StatedLayoutPerModelChunk) {
  PlanCase s("llama3.1-8b", "h100-8", "pp=4,dp_shard=2");
  s.FullAcOneSequence(8192, 16);
  s.o.pp_schedule = MP_PP_INTERLEAVED;
  s.o.pp_virtual = 2;
  mp_plan_options parsed;
  mp_plan_options_init(&parsed);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_pp_layout_parse(&ctx, "E|(t*5|)*4(t*4|)*2t*4,L", &parsed), MP_OK);
  const std::vector<int16_t> uneven(parsed.pp_layers, parsed.pp_layers + parsed.n_pp_layers);
  ASSERT_EQ(uneven.size(), 8u);
  EXPECT_EQ(uneven[0], 0);
  EXPECT_EQ(uneven[4], 5);
  EXPECT_EQ(uneven[7], 4);
  CheckStatedLayout(s, std::vector<int16_t>(8, 4), uneven, "llama3.1-8b pp=4 x 2 E|(t*5|)*4(t*4|)*2t*4,L");
}

// Each stage's peak (mp_sim_config.stage_peak_bytes): Llama-3.1-8B on pp=4 (8 layers a
// stage), full AC, 8 micro-batches of one 8192-token sequence under 1F1B. Stage s holds pp -
// s micro-batches at once, so the two middle stages, which run the same schedule, differ by
// one micro-batch's held activations: the 8 layers' checkpointed inputs and the stage's
// output kept for its backward, 9 x 8192 x 4096 x 2 bytes = 603,979,776, times the stack's
// fragmentation factor. The result's peak is the fullest stage's.
TEST(PlanPipeline, StagePeaksStepByOneMicroBatch) {
  PlanCase s("llama3.1-8b", "h100-8", "pp=4,dp_shard=2");
  s.FullAcOneSequence(8192, 16);
  int64_t peak[4] = {0, 0, 0, 0};
  s.cfg.stage_peak_bytes = peak;
  const mp_sim_result r = s.Sim();
  const double held = 9.0 * 8192 * 4096 * 2 * s.prof.frag_factor;
  EXPECT_NEAR((double)(peak[1] - peak[2]), held, 2.0);
  EXPECT_GT(peak[0], peak[1]);
  // the last stage holds one micro-batch but the loss's fp32 logits, 8192 x 128256 x 4
  // bytes three times over
  EXPECT_GT(peak[3], peak[2]);
  EXPECT_EQ(r.peak_mem_bytes, *std::max_element(peak, peak + 4));
}

// mp_sim_plan_prep: one prep of a plan serves the plans derived from it (micro-batch, AC,
// reshard): mp_simulate_prepped equals mp_simulate_built_plan on each, field for field,
// pipelined (stage selection, per-stage links) and not; a prep for another cluster is
// refused.
TEST(PlanPrep, PreppedEqualsBuiltOnDerivedPlans) {
  struct Case {
    const char *model;
    int gpus, per_node;
    const char *mesh;
  } cases[] = {
      {"llama3.1-8b", 64, 8, "pp=4,dp_replicate=2,dp_shard=2,tp=4"},
      {"llama3.1-8b", 16, 8, "dp_shard=4,cp=2,tp=2"},
      {"llama3.1-8b", 40, 8, "pp=5,tp=8"},
  };
  for (const Case &c : cases) {
    PlanCase s(c.model, "h100-8", "dp_shard=8");
    ASSERT_EQ(mp_cluster_make(&s.ctx, "h100-sxm", c.gpus, c.per_node, &s.c), MP_OK)
        << mp_errmsg(&s.ctx);
    ASSERT_EQ(mp_mesh_parse(&s.ctx, c.mesh, c.gpus, &s.mesh), MP_OK) << mp_errmsg(&s.ctx);
    s.o.seq = 2048;
    s.o.micro_batch = 1;
    s.o.global_batch = 64;
    s.o.fp8 = 1;
    mp_plan *base = nullptr;
    ASSERT_EQ(mp_build_plan(&s.ctx, &s.m, &s.mesh, &s.o, &base), MP_OK) << mp_errmsg(&s.ctx);
    mp_arena *a = mp_arena_create();
    mp_sim_plan_prep *prep = nullptr;
    ASSERT_EQ(mp_sim_plan_prep_create(&s.ctx, base, &s.cfg, a, &prep), MP_OK) << mp_errmsg(&s.ctx);
    for (int mb : {1, 2, 8})
      for (mp_ac_mode ac : {MP_AC_NONE, MP_AC_SELECTIVE, MP_AC_FULL})
        for (int rs : {0, 1}) {
          const std::string what = std::string(c.mesh) + " mb=" + std::to_string(mb) +
                                   " ac=" + mp_ac_mode_name(ac) + " rs=" + std::to_string(rs);
          mp_plan_options o = s.o;
          o.micro_batch = mb;
          o.ac = ac;
          o.fsdp.reshard_after_forward = rs;
          mp_plan *d = nullptr;
          ASSERT_EQ(mp_plan_derive(&s.ctx, base, &o, a, &d), MP_OK) << mp_errmsg(&s.ctx);
          mp_sim_result ref, got, got_ws_arena;
          ASSERT_EQ(mp_simulate_built_plan(&s.ctx, d, &s.cfg, nullptr, &ref), MP_OK)
              << what << mp_errmsg(&s.ctx);
          ASSERT_EQ(mp_simulate_prepped(&s.ctx, d, prep, &s.cfg, a, &got), MP_OK)
              << what << mp_errmsg(&s.ctx);
          ASSERT_EQ(mp_simulate_prepped(&s.ctx, d, prep, &s.cfg, nullptr, &got_ws_arena), MP_OK)
              << what << mp_errmsg(&s.ctx);
          ExpectSameResult(got, ref, what);
          ExpectSameResult(got_ws_arena, ref, what + " (workspace arena)");
          EXPECT_GT(ref.step_time_s, 0.0) << what;
        }
    mp_cluster other = s.c;
    mp_sim_config cfg2 = s.cfg;
    cfg2.cluster = &other;
    mp_sim_result r;
    EXPECT_EQ(mp_simulate_prepped(&s.ctx, base, prep, &cfg2, a, &r), MP_ERR_INVALID);
    mp_arena_destroy(a);
    mp_plan_destroy(base);
  }
}

// The group link counts the members on the rank's node without listing big groups: it
// must agree with a count over the listed members (the definition) for every group kind.
TEST(Network, GroupLinkPerNodeMatchesListedMembers) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c;
  ASSERT_EQ(mp_cluster_make(&ctx, "h100-sxm", 256, 8, &c), MP_OK) << mp_errmsg(&ctx);
  for (const char *spec : {"pp=2,dp_replicate=2,dp_shard=8,cp=2,tp=4",
                           "dp_shard=64,ep=8,tp=4", "pp=4,dp_shard=4,cp=4,tp=4",
                           "dp_replicate=32,tp=8", "dp_shard=256"}) {
    mp_mesh mesh;
    ASSERT_EQ(mp_mesh_parse(&ctx, spec, 256, &mesh), MP_OK) << mp_errmsg(&ctx);
    for (int g = 0; g < MP_GROUP_COUNT; g++)
      for (int rank : {0, 5, 77, 255}) {
        const int n = mp_mesh_group_size(&mesh, (mp_group)g);
        std::vector<int> ranks((size_t)n);
        mp_mesh_group_ranks(&mesh, (mp_group)g, rank, ranks.data());
        int per_node = 0;
        for (int r : ranks) per_node += r / 8 == rank / 8;
        mp_sim_link l;
        ASSERT_EQ(mp_sim_group_link(&ctx, &c, &mesh, (mp_group)g, rank, &l), MP_OK);
        EXPECT_EQ(l.n, n) << spec << " group " << g << " rank " << rank;
        EXPECT_EQ(l.per_node, per_node) << spec << " group " << g << " rank " << rank;
        EXPECT_EQ(l.nodes, (n + per_node - 1) / per_node) << spec << " group " << g;
      }
  }
}

// The compute stream's events of one layer in a traced simulation of s's rank 0, in time
// order: name, start and end (microseconds).
struct TEv {
  std::string name;
  double ts, end;
};
std::vector<TEv> ComputeEvents(PlanCase &s, const char *prefix) {
  std::vector<TEv> v;
  mp_plan *p = NULL;
  EXPECT_EQ(mp_build_plan(&s.ctx, &s.m, &s.mesh, &s.o, &p), MP_OK) << mp_errmsg(&s.ctx);
  mp_arena *a = mp_arena_create();
  mp_schedule *sc = NULL;
  EXPECT_EQ(mp_schedule_build(&s.ctx, p, 0, MP_SCHEDULE_COMPACT, a, &sc), MP_OK);
  mp_sim_config cfg = s.cfg;
  cfg.record_trace = 1;
  mp_sim_trace *t = NULL;
  mp_sim_result r;
  EXPECT_EQ(mp_simulate(&s.ctx, sc, &cfg, &r, &t), MP_OK) << mp_errmsg(&s.ctx);
  const char *tmp = getenv("TEST_TMPDIR");
  std::string path = std::string(tmp ? tmp : "/tmp") + "/cp_trace.json";
  EXPECT_EQ(mp_sim_trace_write(&s.ctx, t, path.c_str()), MP_OK);
  cJSON *j = NULL;
  EXPECT_EQ(mp_json_parse_file(&s.ctx, path.c_str(), &j), MP_OK);
  cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) {
    if (strcmp(cJSON_GetObjectItemCaseSensitive(e, "ph")->valuestring, "X") != 0) continue;
    if (cJSON_GetObjectItemCaseSensitive(e, "tid")->valueint != MP_STREAM_COMPUTE) continue;
    const char *name = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
    if (strncmp(name, prefix, strlen(prefix)) != 0) continue;
    const double ts = cJSON_GetObjectItemCaseSensitive(e, "ts")->valuedouble;
    v.push_back({name, ts, ts + cJSON_GetObjectItemCaseSensitive(e, "dur")->valuedouble});
  }
  std::sort(v.begin(), v.end(), [](const TEv &x, const TEv &y) { return x.ts < y.ts; });
  cJSON_Delete(j);
  mp_sim_trace_destroy(t);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
  return v;
}

// Context parallelism's ring (exec/schedule_cp.c) on the p2p stream: llama3.1-8b on
// dp_shard=2 x cp=4 in one h100-8 node, seq 8192, 2048 tokens a rank. torchtitan's ring
// carries K and V expanded to the 32 query heads (repeat_kv): 2 x 2048 x 4096 x 2 bytes =
// 32 MiB a rank. Its busy time per layer: two all-gathers of them (forward and backward),
// each 3/4 of the 128 MiB gathered / (450 GB/s x link_eff 0.8) + NCCL's latency of a ring of
// 4 inside a node (sim/network.c: Simple's baseLat 8.4 us + 3 NVLink steps of 3.4 us; LL128
// would save 1.1 us on it and lose 8 % of 280 us) + the stack's 20 us, and 4 dK, dV shifts
// of 64 MiB (fp32), each bytes / (450 GB/s x 0.8) + the link's 3 us + 20 us. The gather starts with step 0 and step 1 waits for it: step 1 starts when the
// gather ends (318.2 us on NVLink, longer than step 0 at this short sequence; 0.28 s on a
// link 1000 times slower), and the later steps, their K and V already there, start as soon
// as the compute stream is free.
TEST(PlanTime, ContextParallelRingOverlapsItsSteps) {
  PlanCase fast("llama3.1-8b", "h100-8", "dp_shard=2,cp=4");
  fast.o.seq = 8192;
  mp_sim_result a = fast.Sim();
  const double kv = 2.0 * 2048 * 4096 * 2, dkv = 2.0 * kv, bw = 450e9 * 0.8;
  const double per = 2 * (0.75 * 4 * kv / bw + 8.4e-6 + 3 * 3.4e-6 + 20e-6) + 4 * (dkv / bw + 3e-6 + 20e-6);
  EXPECT_NEAR(a.comm_s[MP_STREAM_P2P], 32 * per, 1e-9);
  PlanCase slow("llama3.1-8b", "h100-8", "dp_shard=2,cp=4");
  slow.o.seq = 8192;
  slow.c.intra_node_GBps_per_gpu = 0.45;
  for (int is_slow = 0; is_slow <= 1; is_slow++) {
    std::vector<TEv> v = ComputeEvents(is_slow ? slow : fast, "layers.5 ");
    const double gather_us = 1e6 * (0.75 * 4 * kv / (bw / (is_slow ? 1000 : 1)) + 8.4e-6 + 3 * 3.4e-6 + 20e-6);
    int steps = 0;
    for (size_t i = 1; i < v.size(); i++) {
      if (v[i].name != "layers.5 attention core fwd" || v[i].end - v[i].ts < 50) continue;
      steps++;
      const double gap = v[i].ts - v[i - 1].end;
      if (steps == 2) /* v[i - 1] is step 0, which started with the gather */
        EXPECT_NEAR(gap, std::max(0.0, gather_us - (v[i - 1].end - v[i - 1].ts)), 1e-2)
            << (is_slow ? "slow" : "fast");
      else
        EXPECT_NEAR(gap, 0.0, 1e-3) << "step " << steps << (is_slow ? " slow" : " fast");
    }
    EXPECT_EQ(steps, 4);
  }
}

// The same ring compiled with its block (plan cp_sync, torchtitan-compile): each transfer
// is waited for where it is issued, on the compute stream between the attention steps. The
// p2p stream carries nothing, the compute stream carries the ring's whole busy time above
// (32 layers x `per`), and the step grows by what the overlapped ring hid: at most that
// busy time, and more than half of it here (only the gather outlasts its step).
TEST(PlanTime, CompiledContextParallelRingWaitsForEachTransfer) {
  mp_sim_result r[2];
  for (int sync = 0; sync <= 1; sync++) {
    PlanCase s("llama3.1-8b", "h100-8", "dp_shard=2,cp=4");
    s.o.seq = 8192;
    s.o.cp_wait_at_issue = sync;
    r[sync] = s.Sim();
  }
  const double kv = 2.0 * 2048 * 4096 * 2, dkv = 2.0 * kv, bw = 450e9 * 0.8;
  const double per = 2 * (0.75 * 4 * kv / bw + 8.4e-6 + 3 * 3.4e-6 + 20e-6) + 4 * (dkv / bw + 3e-6 + 20e-6);
  EXPECT_NEAR(r[0].comm_s[MP_STREAM_P2P], 32 * per, 1e-9);
  EXPECT_EQ(r[1].comm_s[MP_STREAM_P2P], 0.0);
  EXPECT_NEAR(r[1].comm_s[MP_STREAM_COMPUTE] - r[0].comm_s[MP_STREAM_COMPUTE], 32 * per, 1e-9);
  const double grew = r[1].step_time_s - r[0].step_time_s;
  EXPECT_GT(grew, 0.5 * 32 * per);
  EXPECT_LE(grew, 32 * per + 1e-9);
}

// The compact schedule folds ring attention's cp - 3 middle steps into one round of ops
// with mp_op.count (exec/schedule_cp.c); the expanded schedule writes every step. Both give
// the same step, with the ring compute-bound (NVLink) and transfer-bound (a link at 1/40 of
// it, the K, V and fp32 dK, dV shifts longer than the steps), for cp = 5 (a fold of 2), 8
// and 16 on 2 nodes of h100-8 (cp 16 crosses the nodes). Under the alltoall rotate method,
// whose K, V shifts interleave with the dK, dV ones step by step, the ring is not folded
// (no op of the compact schedule counts several), and the two give the same step.
TEST(PlanTime, FoldedRingEqualsTheExpandedOne) {
  for (int a2a = 0; a2a <= 1; a2a++) {
    struct Case {
      const char *mesh;
      int64_t seq;
      double link_scale;
    } cases[] = {{"dp_shard=1,cp=5", 10240, 1.0},  {"dp_shard=1,cp=5", 10240, 1.0 / 40},
                 {"dp_shard=1,cp=8", 8192, 1.0},   {"dp_shard=1,cp=8", 8192, 1.0 / 40},
                 {"dp_shard=1,cp=16", 16384, 1.0}, {"dp_shard=1,cp=16", 16384, 1.0 / 40}};
    for (const Case &k : cases) {
      PlanCase s("llama3.1-8b", "h100-8", "dp_shard=8");
      s.c.n_nodes = 2;
      s.c.intra_node_GBps_per_gpu *= k.link_scale;
      s.c.inter_node_Gbitps_per_gpu *= k.link_scale;
      ASSERT_EQ(mp_mesh_parse(&s.ctx, k.mesh, 0, &s.mesh), MP_OK) << mp_errmsg(&s.ctx);
      s.o.seq = k.seq;
      s.o.micro_batch = 1;
      s.o.global_batch = 4;
      s.o.ac = MP_AC_SELECTIVE_OP;
      s.o.cp_rotate = a2a ? MP_CP_ROTATE_ALLTOALL : MP_CP_ROTATE_ALLGATHER;
      SCOPED_TRACE(a2a ? "alltoall" : "allgather");
      mp_plan *p = NULL;
      ASSERT_EQ(mp_build_plan(&s.ctx, &s.m, &s.mesh, &s.o, &p), MP_OK) << mp_errmsg(&s.ctx);
      mp_arena *a = mp_arena_create();
      mp_schedule *sc = NULL, *se = NULL;
      ASSERT_EQ(mp_schedule_build(&s.ctx, p, 0, MP_SCHEDULE_COMPACT, a, &sc), MP_OK);
      ASSERT_EQ(mp_schedule_build(&s.ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &se), MP_OK);
      int folded = 0;
      for (int32_t i = 0; i < sc->n_ops; i++) folded += sc->ops[i].count > 1;
      EXPECT_EQ(folded > 0, !a2a) << k.mesh;
      mp_schedule_totals tc, te;
      mp_schedule_totals_compute(sc, &tc);
      mp_schedule_totals_compute(se, &te);
      EXPECT_NEAR(tc.flops, te.flops, 1e-9 * te.flops) << k.mesh;
      EXPECT_EQ(tc.n_comm[MP_COLL_SENDRECV][MP_GROUP_CP], te.n_comm[MP_COLL_SENDRECV][MP_GROUP_CP]);
      mp_sim_result rc, re;
      ASSERT_EQ(mp_simulate(&s.ctx, sc, &s.cfg, &rc, NULL), MP_OK) << mp_errmsg(&s.ctx);
      ASSERT_EQ(mp_simulate(&s.ctx, se, &s.cfg, &re, NULL), MP_OK) << mp_errmsg(&s.ctx);
      EXPECT_NEAR(rc.step_time_s, re.step_time_s, 1e-9 * re.step_time_s)
          << k.mesh << " link x" << k.link_scale;
      EXPECT_NEAR(rc.exposed_comm_s, re.exposed_comm_s, 1e-9 * re.step_time_s) << k.mesh;
      EXPECT_NEAR(rc.comm_s[MP_STREAM_P2P], re.comm_s[MP_STREAM_P2P], 1e-9 * re.step_time_s);
      EXPECT_EQ(rc.peak_mem_bytes, re.peak_mem_bytes) << k.mesh;
      mp_arena_destroy(a);
      mp_plan_destroy(p);
    }
  }
}

// llama3.1-8b on torchtitan-eager and the 500 W H100s it was measured on (8 a node), the
// stack's plan options applied, seq 8192, micro-batch 2.
static void TorchtitanEager8b(PlanCase *s) {
  ASSERT_EQ(mp_stack_load(&s->ctx, "torchtitan-eager", &s->prof), MP_OK);
  ASSERT_EQ(mp_cluster_make(&s->ctx, "h100-96gb-500w", 8, 8, &s->c), MP_OK);
  mp_stack_plan_options(&s->prof, &s->c.gpu, &s->o);
  s->o.seq = 8192;
  s->o.micro_batch = 2;
}

// The torchtitan memory model, byte for byte, on the plan of torchtitan's Table 1 (llama3.1-8b,
// FSDP 8, local batch 2 x 8192 tokens in one micro-batch, op-level selective AC; eager).
// N = 8,030,261,248 parameters, all dims divisible by 8: 1,003,782,656 per rank, fp32
// master, gradient and AdamW m, v: 4, 4 and 8 bytes each. The peak is in the head's
// backward (exec/schedule_ops.c, loss_bwd), T = 16384 tokens, V = 128256:
//   gathered   the root unit (tok_embeddings, norm, output) in bf16, 2 x (2 x 525,336,576
//              + 4096) = 2,101,354,496, and the last block, prefetched for its backward,
//              2 x 218,112,000 = 436,224,000
//   temp       the root unit's unsharded bf16 gradients, 2,101,354,496
//   activations 32 blocks x T x 63,616 (schedule_test's SavedActivationBytesPerBlock:
//              the block input, q, v, the attention output and log-sum-exp, gate, down's
//              output) = 33,353,105,408, and the head's: final norm's input 2TH, its rstd
//              4T, the head GEMM's input 2TH = 268,500,992
//   logits     eager cross-entropy's fp32 log_softmax output (saved), nll's fp32 gradient
//              and log_softmax's fp32 input gradient: 3 x 4 x T x V = 25,216,155,648 (on an
//              H100, PyTorch 2.11 allocates the two gradients, 8 T V bytes to the byte,
//              between `del pred` and this peak: bench/gpu/tp_mem_probe.py,
//              bench/gpu/RESULTS.md)
// The reserved peak is that x 1.114 (torchtitan-eager's frag_factor) + 2.5 GiB.
TEST(PlanMemory, TorchtitanLlama8bFsdp8ByteForByte) {
  PlanCase s("llama3.1-8b", "h100-8", "dp_shard=8");
  ASSERT_NO_FATAL_FAILURE(TorchtitanEager8b(&s));
  s.o.global_batch = 16;
  s.o.ac = MP_AC_SELECTIVE_OP;
  mp_sim_result r = s.Sim();
  const int64_t shard = 1003782656;
  EXPECT_EQ(r.mem_at_peak[MP_MEM_PARAMS], 4 * shard);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_GRADS], 4 * shard);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_OPTIMIZER], 8 * shard);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_GATHERED], 2101354496LL + 436224000LL);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_TEMP], 2101354496LL);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_ACTIVATIONS], 33353105408LL + 268500992LL);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_LOGITS], 25216155648LL);
  const int64_t alloc = 16 * shard + 2537578496LL + 2101354496LL + 33621606400LL + 25216155648LL;
  EXPECT_EQ(alloc, 79537217536LL);
  EXPECT_EQ(r.peak_mem_bytes, (int64_t)((double)alloc * 1.114 + 2.5 * 1073741824.0));
}

// torchtitan with tp > 1 computes the loss under DTensor's loss_parallel on the rank's
// vocab shard (torch/distributed/tensor/parallel/loss.py), whose backward is decomposed:
// the saved fp32 log_softmax output x, grad_input = zeros_like(x), exp(x), their sum and
// the product with grad_output, four fp32 [T, V/tp] tensors live at once where aten's fused
// kernels hold three. llama3.1-8b, dp_shard=4 x tp=2, one micro-batch of 2 x 8192 tokens,
// full AC (the head's backward is the peak): T = 16384, V/tp = 64128, so the logits at the
// peak are 4 x 4 x 16384 x 64128 = 16,810,770,432 bytes; with the logits gathered over tp
// instead (shard_logits off: aten's cross-entropy on the full vocab) 3 x 4 x T x 128256 =
// 25,216,155,648. PyTorch 2.11 on an H100 adds the three besides the saved output, 12 T V/tp
// bytes, and 3-4 MB of per-row statistics between `del pred` and the peak
// (bench/gpu/tp_mem_probe.py, bench/gpu/RESULTS.md).
TEST(PlanMemory, TorchtitanLossParallelHoldsFourFp32Shards) {
  for (int shard = 1; shard >= 0; shard--) {
    PlanCase s("llama3.1-8b", "h100-8", "dp_shard=4,tp=2");
    ASSERT_NO_FATAL_FAILURE(TorchtitanEager8b(&s));
    s.o.global_batch = 8;
    s.o.ac = MP_AC_FULL;
    s.o.tp.shard_logits = shard;
    mp_sim_result r = s.Sim();
    EXPECT_EQ(r.mem_at_peak[MP_MEM_LOGITS], shard ? 16810770432LL : 25216155648LL);
  }
}

// AsyncTP (exec/schedule.h, mp_fuse): Llama-3.1-8B on tp=8 with SP, seq 8192, every op of
// rank 0's expanded schedule simulated with and without it. The same ops run in the same
// order; a fused pair's GEMMs run as 8 chunks of 1024 tokens (each slower than an eighth of
// the whole: a launch each and the weight read 8 times) and its collective keeps only what
// exceeds 7/8 of them: d(C) = max(0, C - 7/8 G). Per layer four forward pairs (the
// all-gathers into q, k, v and gate, up; o's and down's reduce-scatters) and two backward
// ones (the output-gradient all-gathers into o's and down's input-gradient GEMMs); the
// input-gradient reduce-scatters keep their time. The step is shorter. Under torchao's
// float8 TP the 4-byte amax all-reduces of the weights' casts sit between a region's
// all-gather and q, k, v (gate, up): they scale the fused GEMMs' operands and run before
// the fused op, so the pair still takes all three (two) GEMMs, and they keep their time.
// Megatron-Core's --tp-comm-overlap (the megatron memory model) fuses the same pairs and runs
// Transformer Engine's bulk overlaps in the q, k, v and gate, up regions' backward (with the
// userbuffers' 16 SMs of the H100's 132): the re-gather of the region's input beside its
// input-gradient GEMMs, the input gradient's reduce-scatter beside its weight-gradient GEMMs,
// each GEMM 132/116 of its time and the collective keeping max(0, C - G).
TEST(PlanTime, AsyncTpRunsTpCollectivesBesideTheirGemms) {
  struct Case {
    mp_mem_model mm;
    int fp8;
  };
  for (const Case &c : {Case{MP_MEM_MODEL_TORCHTITAN, 0}, Case{MP_MEM_MODEL_MEGATRON, 0},
                        Case{MP_MEM_MODEL_TORCHTITAN, 1}}) {
    const mp_mem_model mm = c.mm;
    SCOPED_TRACE(std::string(mp_mem_model_name(mm)) + (c.fp8 ? " float8" : ""));
    PlanCase s("llama3.1-8b", "h100-8", "tp=8");
    s.o.mem_model = mm;
    s.o.fp8 = c.fp8;
    s.o.seq = 8192;
    s.o.global_batch = 1;
    const int mg = mm == MP_MEM_MODEL_MEGATRON;
    if (mg) s.prof.ub_sms = 16;
    ASSERT_EQ(s.c.gpu.sms, 132);
    std::vector<double> d[2];
    std::vector<mp_op> ops;
    mp_sim_result r[2];
    std::vector<mp_op> plain;
    for (int at = 0; at <= 1; at++) {
      s.o.tp_comm_fused = at;
      ASSERT_NO_FATAL_FAILURE(SimTraced(s, &r[at], &d[at], at ? &ops : &plain));
      // torchtitan's chunk + cat copies beside the unfused collectives and the fused ops'
      // shard copies and partial sums differ between the two forms (tests/schedule/
      // sp_cat_test.cc derives them); every other op is the same in both
      DropSpLayoutOps(at ? &ops : &plain, &d[at]);
    }
    for (const mp_op &op : plain) EXPECT_EQ(op.fused, MP_FUSE_NONE);
    ASSERT_EQ(d[0].size(), d[1].size());
    int pairs[MP_PHASE_COUNT] = {0}, unfused_rs = 0, amax = 0, bulk[2] = {0, 0};
    for (size_t i = 0; i < ops.size(); i++) {
      const mp_op &op = ops[i];
      if (op.layer != 5 || op.type != MP_OP_COMM || op.group != MP_GROUP_TP ||
          op.stream != MP_STREAM_COMPUTE)
        continue;
      if (op.coll == MP_COLL_ALL_REDUCE) {  // a float8 cast's amax, 4 bytes
        EXPECT_EQ(op.bytes, 4.0);
        EXPECT_EQ(op.fused, MP_FUSE_NONE);
        EXPECT_DOUBLE_EQ(d[1][i], d[0][i]);
        amax++;
        continue;
      }
      if (op.fused == MP_FUSE_BULK) {
        const int ag = op.coll == MP_COLL_ALL_GATHER, step = ag ? 1 : -1;
        double g = 0.0;
        int gemms = 0;
        for (long j = (long)i + step; j >= 0 && j < (long)ops.size(); j += step) {
          if (ops[j].type == MP_OP_COMM && ops[j].stream == MP_STREAM_COMPUTE) break;
          if (ops[j].type != MP_OP_COMPUTE || ops[j].kernel != MP_KERNEL_GEMM) continue;
          // every GEMM of the region stretched once, by the pair of its own variant
          EXPECT_EQ(ops[j].fused, MP_FUSE_BULK);
          EXPECT_NEAR(d[1][j], d[0][j] * 132.0 / 116.0, 1e-12);
          if (ops[j].variant != (ag ? MP_VAR_DGRAD : MP_VAR_WGRAD)) continue;
          g += d[1][j];
          gemms++;
        }
        EXPECT_EQ(gemms, op.module == MP_MOD_Q ? 3 : 2);
        EXPECT_NEAR(d[1][i], std::max(0.0, d[0][i] - g), 1e-12);
        bulk[ag]++;
        continue;
      }
      if (op.fused == MP_FUSE_NONE) {
        EXPECT_EQ(op.coll, MP_COLL_REDUCE_SCATTER);
        EXPECT_DOUBLE_EQ(d[1][i], d[0][i]);
        unfused_rs++;
        continue;
      }
      pairs[op.phase]++;
      const int step = op.fused == MP_FUSE_GATHER ? 1 : -1;
      double g = 0.0;
      int gemms = 0, first_module = -1;
      for (long j = (long)i + step; j >= 0 && j < (long)ops.size(); j += step) {
        if (ops[j].type == MP_OP_COMM && ops[j].stream == MP_STREAM_COMPUTE && ops[j].coll != MP_COLL_ALL_REDUCE)
          break;
        if (ops[j].fused != op.fused || ops[j].type != MP_OP_COMPUTE) continue;
        EXPECT_EQ(ops[j].kernel, MP_KERNEL_GEMM);
        EXPECT_GT(d[1][j], d[0][j]);
        if (first_module < 0) first_module = ops[j].module;
        g += d[1][j];
        gemms++;
      }
      // q, k, v or gate, up after a forward all-gather; one GEMM otherwise
      const int want = op.phase != MP_PHASE_BACKWARD && op.fused == MP_FUSE_GATHER
                           ? (first_module == MP_MOD_Q ? 3 : 2)
                           : 1;
      EXPECT_EQ(gemms, want) << mp_phase_name((mp_phase)op.phase);
      EXPECT_NEAR(d[1][i], std::max(0.0, d[0][i] - g * 7 / 8), 1e-12);
    }
    EXPECT_EQ(pairs[MP_PHASE_FORWARD], 4);
    EXPECT_EQ(pairs[MP_PHASE_BACKWARD], 2);
    EXPECT_EQ(unfused_rs, mg ? 0 : 2);
    EXPECT_EQ(bulk[0], mg ? 2 : 0);
    EXPECT_EQ(bulk[1], mg ? 2 : 0);
    EXPECT_EQ(amax, c.fp8 ? 11 + 7 : 0);  // schedule_test's Float8TensorwiseAmax... count
    EXPECT_LT(r[1].step_time_s, r[0].step_time_s);
    EXPECT_LT(r[1].exposed_comm_s, r[0].exposed_comm_s);
  }
}

// mp_sim_workspace holds no result: one workspace reused across plans of other shapes (a
// pipeline and a plan without one, larger and smaller schedules, a GPU and a CPU cluster
// each on its default stack) gives every plan, whatever ran in it before, the figures of
// a call without a workspace (a temporary one each), through every entry point.
TEST(Workspace, ReuseChangesNoResult) {
  struct Case {
    const char *model, *gpu;
    int gpus, per_node;
    const char *mesh;
  } cases[] = {
      {"llama3.1-8b", "h100-sxm", 64, 8, "pp=4,dp_shard=2,tp=8"},
      {"tiny-dense", "cpu", 4, 4, "dp_shard=4"},
      {"llama3.1-8b", "h100-sxm", 8, 8, "dp_shard=8"},
  };
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_sim_workspace *ws = nullptr;
  ASSERT_EQ(mp_sim_workspace_create(&ctx, &ws), MP_OK) << mp_errmsg(&ctx);
  for (int round = 0; round < 2; round++)
    for (const Case &c : cases) {
      const std::string what =
          std::string(c.model) + " " + c.mesh + " round " + std::to_string(round);
      mp_model m;
      mp_cluster cl;
      mp_mesh mesh;
      mp_stack_profile def;
      ASSERT_EQ(mp_model_load(&ctx, c.model, &m), MP_OK) << mp_errmsg(&ctx);
      ASSERT_EQ(mp_cluster_make(&ctx, c.gpu, c.gpus, c.per_node, &cl), MP_OK) << mp_errmsg(&ctx);
      ASSERT_EQ(mp_mesh_parse(&ctx, c.mesh, c.gpus, &mesh), MP_OK) << mp_errmsg(&ctx);
      ASSERT_EQ(mp_stack_default(&ctx, &cl.gpu, &def), MP_OK) << mp_errmsg(&ctx);
      mp_plan_options o;
      mp_plan_options_init(&o);
      mp_stack_plan_options(&def, &cl.gpu, &o);
      o.seq = 1024;
      o.micro_batch = 1;
      o.global_batch = 32;
      mp_sim_config cfg;
      memset(&cfg, 0, sizeof cfg);
      cfg.cluster = &cl; // no stack: the workspace keeps the default one per kind of device
      mp_sim_result fresh, reused, one;
      ASSERT_EQ(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, &fresh), MP_OK)
          << what << mp_errmsg(&ctx);
      cfg.ws = ws;
      ASSERT_EQ(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, &reused), MP_OK)
          << what << mp_errmsg(&ctx);
      ExpectSameResult(reused, fresh, what);
      // one schedule (a pipeline stage stands for every stage)
      mp_plan *p = nullptr;
      ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_OK) << mp_errmsg(&ctx);
      mp_arena *a = mp_arena_create();
      mp_schedule *s = nullptr;
      ASSERT_EQ(mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_COMPACT, a, &s), MP_OK)
          << mp_errmsg(&ctx);
      ASSERT_EQ(mp_simulate(&ctx, s, &cfg, &reused, nullptr), MP_OK) << what << mp_errmsg(&ctx);
      cfg.ws = nullptr;
      ASSERT_EQ(mp_simulate(&ctx, s, &cfg, &one, nullptr), MP_OK) << what << mp_errmsg(&ctx);
      ExpectSameResult(reused, one, what + " (one schedule)");
      mp_arena_destroy(a);
      mp_plan_destroy(p);
      EXPECT_GT(fresh.step_time_s, 0.0) << what;
    }
  mp_sim_workspace_destroy(ws);
  mp_sim_workspace_destroy(nullptr); // a no-op
}

// Megatron-Core's EP all-to-all overlap without pipelining (combined_1f1b_schedule_for_no_
// pipelining): the first forward alone, then m - 1 steps each running the forward of one
// micro-batch with the backward of the one before, then the last backward. Qwen3-30B-A3B
// on 8 H100s, EP 8 inside the node: a MoE layer's compute on either side of each
// all-to-all (attention, the experts) outlasts an all-to-all of 4096 x 8 tokens over
// NVLink, so in each combined step all four all-to-alls of every layer are hidden, and the
// step is (m - 1) x (one micro-batch's all-to-all time) shorter.
TEST(PlanTime, MoeOverlapHidesEveryAllToAllOfACombinedStep) {
  PlanCase s("qwen3-30b-a3b", "h100-8", "dp_replicate=8,ep=8");
  ASSERT_EQ(mp_stack_load(&s.ctx, "megatron-core", &s.prof), MP_OK) << mp_errmsg(&s.ctx);
  s.o.mem_model = MP_MEM_MODEL_MEGATRON;
  s.o.seq = 4096;
  s.o.micro_batch = 1;
  s.o.global_batch = 32;  // 4 micro-batches a rank
  mp_sim_result r[2];
  double a2a = 0.0;
  for (int ov = 0; ov <= 1; ov++) {
    s.o.moe_a2a_overlap = ov;
    std::vector<double> d;
    std::vector<mp_op> ops;
    ASSERT_NO_FATAL_FAILURE(SimTraced(s, &r[ov], &d, &ops));
    for (size_t i = 0; ov == 0 && i < ops.size(); i++)
      if (ops[i].type == MP_OP_COMM && ops[i].coll == MP_COLL_ALL_TO_ALL && ops[i].group == MP_GROUP_EP)
        a2a += d[i] * (ops[i].count > 1 ? ops[i].count : 1);
  }
  ASSERT_GT(a2a, 0.0);
  EXPECT_NEAR(r[0].step_time_s - r[1].step_time_s, 3 * a2a, 1e-9 * r[0].step_time_s);
}
