// Pipeline parallelism in the schedule: the pipeline order of a stage (mp_pp_order) for
// 1F1B, interleaved and GPipe against Megatron-LM's warm-up counts, the in-flight chunks
// they hold, and a stage's schedule: the sends and receives at its chunk boundaries, the
// layers of its interleaved chunks, a tied model's embedding copies and their all-reduce.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

std::vector<mp_pp_step> Order(mp_pp_schedule k, int pp, int v, int64_t m, int stage,
                              mp_pp_flavor flavor = MP_PP_FLAVOR_MEGATRON) {
  std::vector<mp_pp_step> o((size_t)(3 * m * v));  // room for a zero-bubble order's W's
  int64_t n = 0;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_pp_order(&ctx, k, flavor, pp, v, m, stage, o.data(), &n), MP_OK) << mp_errmsg(&ctx);
  o.resize((size_t)n);
  return o;
}

// "F0.3" for the forward of chunk 0, micro-batch 3; B and W (a split backward's) likewise.
std::string Str(const std::vector<mp_pp_step> &o) {
  std::string s;
  for (const mp_pp_step &q : o) {
    if (!s.empty()) s += ' ';
    s += "FBW"[q.bwd];
    s += std::to_string(q.chunk) + "." + std::to_string(q.micro);
  }
  return s;
}

// Every (micro-batch, chunk) runs its forward once, then its backward once.
void ExpectComplete(const std::vector<mp_pp_step> &o, int64_t m, int v) {
  ASSERT_EQ((int64_t)o.size(), 2 * m * v);
  std::set<std::pair<int, int>> fwd, bwd;
  for (const mp_pp_step &s : o) {
    const std::pair<int, int> key(s.micro, s.chunk);
    if (s.bwd) {
      EXPECT_TRUE(fwd.count(key)) << "backward before forward";
      EXPECT_TRUE(bwd.insert(key).second);
    } else {
      EXPECT_TRUE(fwd.insert(key).second);
    }
  }
}

TEST(PipelineOrder, OneFOneBWarmsUpPMinusSMinusOne) {
  // pp=4, m=8: stage s runs pp - s - 1 forwards before its first backward, then one of
  // each, and holds pp - s micro-batches at most.
  for (int s = 0; s < 4; s++) {
    auto o = Order(MP_PP_1F1B, 4, 1, 8, s);
    ExpectComplete(o, 8, 1);
    int warm = 0;
    while (!o[warm].bwd) warm++;
    EXPECT_EQ(warm, 4 - s) << "the forwards before the first backward, the steady one included";
    EXPECT_EQ(mp_pp_inflight(o.data(), (int64_t)o.size()), 4 - s);
  }
  // fewer micro-batches than stages: stage 0 holds all of them
  auto o = Order(MP_PP_1F1B, 4, 1, 2, 0);
  ExpectComplete(o, 2, 1);
  EXPECT_EQ(mp_pp_inflight(o.data(), (int64_t)o.size()), 2);
}

TEST(PipelineOrder, GPipeHoldsEveryMicroBatch) {
  for (int s = 0; s < 4; s++) {
    auto o = Order(MP_PP_GPIPE, 4, 1, 8, s);
    ExpectComplete(o, 8, 1);
    EXPECT_EQ(mp_pp_inflight(o.data(), (int64_t)o.size()), 8);
  }
}

TEST(PipelineOrder, InterleavedFollowsMegatron) {
  // pp=4, v=2, m=8: virtual step k runs chunk (k mod 8) / 4 of micro-batch (k / 8) 4 + k mod
  // 4; stage s warms up with (4 - s - 1) x 2 + (2 - 1) x 4 forwards and holds one more.
  auto o = Order(MP_PP_INTERLEAVED, 4, 2, 8, 0);
  ExpectComplete(o, 8, 2);
  const int want[12][2] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1},
                           {2, 1}, {3, 1}, {4, 0}, {5, 0}, {6, 0}, {7, 0}};
  for (int k = 0; k < 10; k++) {
    EXPECT_EQ(o[k].bwd, 0) << k;
    EXPECT_EQ(o[k].micro, want[k][0]) << k;
    EXPECT_EQ(o[k].chunk, want[k][1]) << k;
  }
  // then the steady state: forward k = 10 (micro 6, chunk 0), backward k = 0 (micro 0, the
  // last chunk first)
  EXPECT_EQ(o[10].bwd, 0);
  EXPECT_EQ(o[10].micro, 6);
  EXPECT_EQ(o[11].bwd, 1);
  EXPECT_EQ(o[11].micro, 0);
  EXPECT_EQ(o[11].chunk, 1);
  for (int s = 0; s < 4; s++) {
    auto os = Order(MP_PP_INTERLEAVED, 4, 2, 8, s);
    ExpectComplete(os, 8, 2);
    EXPECT_EQ(mp_pp_inflight(os.data(), (int64_t)os.size()), (4 - s - 1) * 2 + 4 + 1) << s;
  }
  // m == pp: every forward first (Megatron's all-warm-up case)
  auto a = Order(MP_PP_INTERLEAVED, 4, 2, 4, 3);
  EXPECT_EQ(mp_pp_inflight(a.data(), (int64_t)a.size()), 8);
}

TEST(PipelineOrder, TorchInterleavedKeepsItsWarmUpWithPpMicroBatches) {
  // torch.distributed.pipelining's ScheduleInterleaved1F1B warms rank r up with
  // min((v - 1) x pp + 2 (pp - 1 - r), m x v) forwards, also when m == pp (torchtitan's
  // default): pp=4, v=2, m=4 holds all 8 chunks on stages 0 and 1 (the warm-up capped at m
  // x v), 4 + 2 + 1 = 7 on stage 2 and 4 + 1 on the last, where Megatron-LM's order holds all
  // 8 on every stage.
  const int want[4] = {8, 8, 7, 5};
  for (int s = 0; s < 4; s++) {
    auto t = Order(MP_PP_INTERLEAVED, 4, 2, 4, s, MP_PP_FLAVOR_TORCH);
    ExpectComplete(t, 4, 2);
    EXPECT_EQ(mp_pp_inflight(t.data(), (int64_t)t.size()), want[s]) << s;
    auto g = Order(MP_PP_INTERLEAVED, 4, 2, 4, s);
    EXPECT_EQ(mp_pp_inflight(g.data(), (int64_t)g.size()), 8) << s;
  }
  // with more micro-batches than stages, and for 1F1B and GPipe, the two are one order
  for (mp_pp_schedule k : {MP_PP_1F1B, MP_PP_INTERLEAVED, MP_PP_GPIPE})
    for (int s = 0; s < 4; s++) {
      const int v = k == MP_PP_INTERLEAVED ? 2 : 1;
      auto a = Order(k, 4, v, 8, s), b = Order(k, 4, v, 8, s, MP_PP_FLAVOR_TORCH);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); i++)
        EXPECT_TRUE(a[i].bwd == b[i].bwd && a[i].chunk == b[i].chunk && a[i].micro == b[i].micro)
            << k << " stage " << s << " step " << i;
    }
}

TEST(PipelineOrder, RefusesWhatTheImplementationsRefuse) {
  std::vector<mp_pp_step> o(64);
  int64_t n = 0;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_INTERLEAVED, MP_PP_FLAVOR_MEGATRON, 4, 2, 3, 0, o.data(), &n), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("fewer (Megatron-LM needs at least pp)"), std::string::npos);
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_INTERLEAVED, MP_PP_FLAVOR_TORCH, 4, 2, 6, 0, o.data(), &n), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("not a multiple of it"), std::string::npos);
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_1F1B, MP_PP_FLAVOR_MEGATRON, 4, 2, 8, 0, o.data(), &n), MP_ERR_INVALID);
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_1F1B, MP_PP_FLAVOR_MEGATRON, 4, 1, 8, 4, o.data(), &n), MP_ERR_INVALID);
  // torch's zero-bubble schedules; ZBV: exactly 2 stages a rank
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_ZBV, MP_PP_FLAVOR_TORCH, 4, 3, 8, 0, o.data(), &n), MP_ERR_INVALID);
  // interleaved ZB: 9 micro-batches on pp 4 make 2 rounds, which do not divide 9
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_INTERLEAVED_ZB, MP_PP_FLAVOR_TORCH, 4, 2, 9, 0, o.data(), &n), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("multiple of 2"), std::string::npos) << mp_errmsg(&ctx);
  // 10 make 2 rounds of 5: accepted
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_INTERLEAVED_ZB, MP_PP_FLAVOR_TORCH, 4, 2, 10, 0, o.data(), &n), MP_OK);
  EXPECT_EQ(n, 60);
}

// Megatron-Core's schedule table with m not a multiple of pp (schedules.py
// get_schedule_table, core_v0.14.0): groups of pp micro-batches each run chunk by chunk, the
// last group the m mod pp left over. pp=4, v=2, m=6: virtual steps 0-7 are micro-batches 0-3
// of chunk 0 then of chunk 1; steps 8-11 micro-batches 4, 5 of chunk 0, then of chunk 1.
// Stage 3 warms up with (v - 1) pp = 4 forwards, so its first backward (step 0, chunk 1 of
// micro-batch 0: backwards run the chunks in reverse) follows the fifth forward (step 4:
// micro-batch 0, chunk 1).
TEST(PipelineOrder, MegatronShortLastGroup) {
  const std::vector<mp_pp_step> o = Order(MP_PP_INTERLEAVED, 4, 2, 6, 3);
  ExpectComplete(o, 6, 2);
  std::vector<std::pair<int, int>> fwd;
  for (const mp_pp_step &s : o)
    if (!s.bwd) fwd.emplace_back(s.micro, s.chunk);
  const std::vector<std::pair<int, int>> want = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1},
                                                 {2, 1}, {3, 1}, {4, 0}, {5, 0}, {4, 1}, {5, 1}};
  EXPECT_EQ(fwd, want);
  ASSERT_GE(o.size(), 6u);
  EXPECT_FALSE(o[4].bwd);
  EXPECT_TRUE(o[5].bwd);
  EXPECT_EQ(o[5].micro, 0);
  EXPECT_EQ(o[5].chunk, 1);
}

// ---- a stage's schedule ----------------------------------------------------------------

// A stage's schedule: llama-style defaults but seq 2048.
struct Stage : sched_test::Built {
  void Build(const char *model_name, const char *mesh_s, int rank, mp_pp_schedule k = MP_PP_1F1B,
             int v = 1, int64_t gb = 0, int64_t seq = 2048) {
    sched_test::Opts o;
    o.model = model_name;
    o.mesh = mesh_s;
    o.rank = rank;
    o.pp_schedule = k;
    o.pp_virtual = v;
    o.global_batch = gb;
    o.seq = seq;
    sched_test::Build(this, o);
  }
};

struct P2p {
  int phase, coll, peer;
  double bytes;
};

std::vector<P2p> PpOps(const mp_schedule *s) {
  std::vector<P2p> v;
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it))
    if (it.op->type == MP_OP_COMM && it.op->group == MP_GROUP_PP)
      v.push_back({it.op->phase, it.op->coll, it.op->peer, it.op->bytes});
  return v;
}

TEST(PipelineSchedule, MiddleStageReceivesAndSendsAtItsBoundaries) {
  // llama3.1-8b on pp=4 x tp=2 (SP on), seq 2048, micro-batch 1: a middle stage receives its
  // input from the previous stage and sends its output to the next, then receives the
  // output's gradient from the next and sends its input's to the previous; each [T/tp, H]
  // bf16 = 1024 x 4096 x 2 bytes, on the p2p stream.
  Stage st;
  st.Build("llama3.1-8b", "pp=4,tp=2", 2 * 2); /* rank 4: stage 2 */
  ASSERT_EQ(st.s->pp_stage, 2);
  auto v = PpOps(st.s);
  ASSERT_EQ(v.size(), 4u);
  const double b = 1024.0 * 4096 * 2;
  const P2p want[4] = {{MP_PHASE_FORWARD, MP_COLL_RECV, MP_PEER_PREV, b},
                       {MP_PHASE_FORWARD, MP_COLL_SEND, MP_PEER_NEXT, b},
                       {MP_PHASE_BACKWARD, MP_COLL_RECV, MP_PEER_NEXT, b},
                       {MP_PHASE_BACKWARD, MP_COLL_SEND, MP_PEER_PREV, b}};
  for (int i = 0; i < 4; i++) {
    EXPECT_EQ(v[i].phase, want[i].phase) << i;
    EXPECT_EQ(v[i].coll, want[i].coll) << i;
    EXPECT_EQ(v[i].peer, want[i].peer) << i;
    EXPECT_EQ(v[i].bytes, want[i].bytes) << i;
  }
  // stage 0 only sends forward and receives backward; the last stage the other way round
  Stage first, last;
  first.Build("llama3.1-8b", "pp=4,tp=2", 0);
  last.Build("llama3.1-8b", "pp=4,tp=2", 3 * 2);
  auto f = PpOps(first.s), l = PpOps(last.s);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].coll, MP_COLL_SEND);
  EXPECT_EQ(f[1].coll, MP_COLL_RECV);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].coll, MP_COLL_RECV);
  EXPECT_EQ(l[1].coll, MP_COLL_SEND);
}

TEST(PipelineSchedule, FsdpUnderAPipelineAsTorchtitanRunsIt) {
  // llama3.1-8b on pp=2 x dp_shard=4, 4 micro-batches (global batch 16 over 4 data-parallel
  // ranks), reshard_after_forward asked for. torchtitan keeps a pipeline stage's parameters
  // gathered through the step and torch.distributed.pipelining syncs gradients only in the
  // stage's last backward: every FSDP all-gather runs in the first micro-batch, every
  // gathered buffer is freed in the last, and each of stage 0's 17 units (16 blocks and
  // the root: tok_embeddings) is reduce-scattered once, from an fp32 accumulator of its
  // tp-local parameters: 16 x 218,112,000 + 525,336,576 = 4,015,128,576 elements x 4
  // bytes.
  Stage st;
  st.Build("llama3.1-8b", "pp=2,dp_shard=4", 0, MP_PP_1F1B, 1, 16);
  ASSERT_EQ(st.s->n_micro, 4);
  EXPECT_EQ(st.plan->opts.fsdp.reshard_after_forward, 0);
  bool noted = false;
  for (int i = 0; i < st.plan->n_notes; i++)
    noted |= strstr(st.plan->notes[i], "kept gathered through the pipeline step") != nullptr;
  EXPECT_TRUE(noted);
  int gathers = 0, reduces = 0;
  int64_t acc = 0, acc_freed = 0;
  mp_schedule_iter it;
  mp_schedule_iter_begin(st.s, &it);
  while (mp_schedule_iter_next(&it)) {
    const mp_op *op = it.op;
    if (op->type == MP_OP_COMM && op->coll == MP_COLL_ALL_GATHER && op->group == MP_GROUP_FSDP) {
      gathers++;
      EXPECT_EQ(op->when, MP_WHEN_FIRST_MICRO);
    }
    if (op->type == MP_OP_FREE && op->mem_cat == MP_MEM_GATHERED) {
      EXPECT_EQ(op->when, MP_WHEN_LAST_MICRO);
    }
    if (op->type == MP_OP_COMM && op->coll == MP_COLL_REDUCE_SCATTER && op->group == MP_GROUP_FSDP) {
      reduces++;
      EXPECT_EQ(op->when, MP_WHEN_LAST_MICRO);
    }
    if (op->type == MP_OP_ALLOC && op->mem_cat == MP_MEM_GRADS && op->phase != MP_PHASE_PROLOGUE) {
      EXPECT_EQ(op->when, MP_WHEN_FIRST_MICRO);
      acc += op->mem_bytes;
    }
    if (op->type == MP_OP_FREE && op->mem_cat == MP_MEM_GRADS) {
      EXPECT_EQ(op->when, MP_WHEN_LAST_MICRO);
      acc_freed += op->mem_bytes;
    }
  }
  EXPECT_EQ(gathers, 17);
  EXPECT_EQ(reduces, 17);
  EXPECT_EQ(acc, 4015128576LL * 4);
  EXPECT_EQ(acc_freed, acc);
  mp_schedule_totals t;
  mp_schedule_totals_compute(st.s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_FSDP], 17);  // not 4 x 17
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_FSDP], 17);
}

TEST(PipelineSchedule, InterleavedStageHoldsItsChunks) {
  // llama3.1-8b (32 layers) on pp=2 with two chunks per stage: model chunks of 8 layers,
  // chunk c x 2 + s on stage s: stage 0 holds layers 0-7 (chunk 0) and 16-23 (chunk 1);
  // its chunk 1 receives from stage 1's chunk 0 and sends to stage 1's chunk 1.
  Stage st;
  st.Build("llama3.1-8b", "pp=2", 0, MP_PP_INTERLEAVED, 2, 2);
  std::set<int> layers[2];
  mp_schedule_iter it;
  mp_schedule_iter_begin(st.s, &it);
  while (mp_schedule_iter_next(&it))
    if (it.layer >= 0) layers[st.s->segs[it.seg].chunk].insert(it.layer);
  EXPECT_EQ(*layers[0].begin(), 0);
  EXPECT_EQ(*layers[0].rbegin(), 7);
  EXPECT_EQ(*layers[1].begin(), 16);
  EXPECT_EQ(*layers[1].rbegin(), 23);
  auto v = PpOps(st.s);
  // chunk 0: send; chunk 1: receive, send; backward chunk 1: receive, send; chunk 0: receive
  ASSERT_EQ(v.size(), 6u);
  EXPECT_EQ(v[0].coll, MP_COLL_SEND);
  EXPECT_EQ(v[1].coll, MP_COLL_RECV);
  EXPECT_EQ(v[1].peer, MP_PEER_PREV);
  EXPECT_EQ(v[5].coll, MP_COLL_RECV);
  EXPECT_EQ(v[5].peer, MP_PEER_NEXT);
  // the plan places the layers by chunk
  EXPECT_EQ(mp_plan_layer_stage(st.plan, 8), 1);
  EXPECT_EQ(mp_plan_layer_stage(st.plan, 16), 0);
}

TEST(PipelineSchedule, TiedEmbeddingsAcrossStages) {
  // gpt-22b ties its head to tok_embeddings. With pp=4 stage 3 holds a copy (output.weight,
  // vocab-sharded like the embedding); stages 0 and 3 all-reduce the two copies' gradients
  // once per step (peer ENDS: the first and last stage), a middle stage not. Without FSDP
  // the payload is the tp-local copy in the fp32 reduce dtype: 51200 / 8 x 6144 x 4 bytes.
  for (int rank : {0, 8, 24}) {
    Stage st;
    st.Build("gpt-22b", "pp=4,tp=8", rank);
    int n = 0;
    double bytes = 0;
    mp_schedule_iter it;
    mp_schedule_iter_begin(st.s, &it);
    while (mp_schedule_iter_next(&it))
      if (it.op->type == MP_OP_COMM && it.op->group == MP_GROUP_PP &&
          it.op->coll == MP_COLL_ALL_REDUCE) {
        n++;
        bytes = it.op->bytes;
        EXPECT_EQ(it.op->peer, MP_PEER_ENDS);
        EXPECT_EQ(it.op->phase, MP_PHASE_OPTIMIZER);
      }
    EXPECT_EQ(n, rank == 8 ? 0 : 1) << "rank " << rank;
    if (rank != 8) {
      EXPECT_EQ(bytes, 51200.0 / 8 * 6144 * 4);
    }
  }
  Stage st;
  st.Build("gpt-22b", "pp=4,tp=8", 0);
  const int i = mp_plan_find_param(st.plan, "output.weight");
  ASSERT_GE(i, 0);
  EXPECT_TRUE(st.plan->params[i].tied_copy);
  EXPECT_EQ(st.plan->params[i].pp_stage, 3);
  EXPECT_EQ(st.plan->params[i].tp_shape[0], 51200 / 8);
}

// The layers of every model chunk of `model` on pp stages x v chunks (interleaved when v >
// 1), chunk k = c x pp + s in order, or empty with the refusal in *err.
std::vector<int> ChunkSizes(const char *model, int pp, int v, std::string *err = nullptr,
                            const std::vector<int> &layout = {}) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  EXPECT_EQ(mp_model_load(&ctx, model, &m), MP_OK);
  mp_mesh mesh;
  EXPECT_EQ(mp_mesh_parse(&ctx, ("pp=" + std::to_string(pp)).c_str(), 0, &mesh), MP_OK);
  mp_plan_options o;
  mp_plan_options_init(&o);
  if (v > 1) o.pp_schedule = MP_PP_INTERLEAVED, o.pp_virtual = v;
  o.n_pp_layers = (int)layout.size();
  for (size_t s = 0; s < layout.size(); s++) o.pp_layers[s] = (int16_t)layout[s];
  mp_plan *p = nullptr;
  std::vector<int> sizes;
  if (mp_build_plan(&ctx, &m, &mesh, &o, &p) != MP_OK) {
    if (err) *err = mp_errmsg(&ctx);
    return sizes;
  }
  int64_t next = 0;
  for (int c = 0; c < v; c++)
    for (int s = 0; s < pp; s++) {
      int64_t l0, l1;
      mp_plan_chunk_layers(p, s, c, &l0, &l1);
      EXPECT_EQ(l0, next) << "chunks cover the layers in order";
      next = l1;
      sizes.push_back((int)(l1 - l0));
      for (int64_t l = l0; l < l1; l++) EXPECT_EQ(mp_plan_layer_stage(p, l), s) << l;
    }
  EXPECT_EQ(next, m.n_layers);
  mp_plan_destroy(p);
  return sizes;
}

// A stated layout (pp_layers, --pp-layers): stage s holds layout[s] layers, in order.
// Llama 3 405B's 126 layers on pp=16 with one layer fewer on the first and the last stage
// (Dubey et al. 2024, sec. 3.3.2) is 7, 8 x 14, 7 (= 126), which is also torchtitan's default
// split; Megatron's --decoder-first-pipeline-num-layers 6 puts 6 on stage 0, 8 on the other
// 15 (6 + 15 x 8 = 126). DeepSeek-V3's 61 layers on pp=16 as 1 + 15 x 4: layer 0 alone on
// stage 0, layers 1-4 on stage 1, layer 60 on stage 15.
TEST(PipelineSchedule, StatedLayoutGivesEachStageItsCount) {
  std::vector<int> llama(16, 8);
  llama[0] = llama[15] = 7;
  EXPECT_EQ(ChunkSizes("llama3.1-405b", 16, 1, nullptr, llama), llama);
  EXPECT_EQ(ChunkSizes("llama3.1-405b", 16, 1), llama);
  std::vector<int> first6(16, 8);
  first6[0] = 6;
  EXPECT_EQ(ChunkSizes("llama3.1-405b", 16, 1, nullptr, first6), first6);
  std::vector<int> ds(16, 4);
  ds[0] = 1;
  EXPECT_EQ(ChunkSizes("deepseek-v3", 16, 1, nullptr, ds), ds);
  // refused: a count per stage, adding up to the layers, one chunk per stage
  std::string err;
  EXPECT_TRUE(ChunkSizes("llama3.1-405b", 8, 1, &err, llama).empty());
  EXPECT_NE(err.find("pp_layers names 16 stages but the mesh has pp=8"), std::string::npos) << err;
  std::vector<int> bad = llama;
  bad[3] = 9;
  EXPECT_TRUE(ChunkSizes("llama3.1-405b", 16, 1, &err, bad).empty());
  EXPECT_NE(err.find("pp_layers sum to 127 layers but llama3.1-405b has 126"), std::string::npos) << err;
  std::vector<int> eight(8, 16);
  eight[0] = 15, eight[7] = 15;
  EXPECT_TRUE(ChunkSizes("llama3.1-405b", 8, 2, &err, eight).empty());
  EXPECT_NE(err.find("the interleaved schedule runs 2 chunks a stage"), std::string::npos) << err;
}

// A layout per model chunk under the interleaved schedule (Megatron-LM's
// --pipeline-model-parallel-layout): Llama 3 405B as its paper describes the pipeline
// (Dubey et al. 2024, sec. 3.3.2: the first chunk of the first stage holds only the
// embedding, the last chunk of the last stage only the head and the loss, one layer fewer
// on the first and last stages). With K = 16 v chunks of c layers each but those two, (16 v -
// 2) c = 126 holds for v = 8, c = 1 alone: chunks 0 and 127 empty, the others one layer
// each; stage 0 holds layers 15, 31, ..., 111 (7), stage 15 layers 14, 30, ..., 126 - 1 (7).
TEST(PipelineSchedule, StatedLayoutPerModelChunk) {
  std::vector<int> meta(128, 1);
  meta[0] = meta[127] = 0;
  EXPECT_EQ(ChunkSizes("llama3.1-405b", 16, 8, nullptr, meta), meta);
  // an empty chunk runs nothing between the first and the last: refused
  std::vector<int> hole = meta;
  hole[5] = 0, hole[6] = 2;
  std::string err;
  EXPECT_TRUE(ChunkSizes("llama3.1-405b", 16, 8, &err, hole).empty());
  EXPECT_NE(err.find("model chunk 5 has 0 layers"), std::string::npos) << err;
  // one count per stage under the interleaved schedule names the wrong thing
  EXPECT_TRUE(ChunkSizes("llama3.1-405b", 16, 8, &err, std::vector<int>(16, 8)).empty());
  EXPECT_NE(err.find("give 128 counts, one per model chunk"), std::string::npos) << err;
}

// Megatron-LM's layout notation (megatron-core docs, "Custom Pipeline Model Parallel
// Layout"): '|' ends a virtual stage, E the embedding, t a layer, L the loss, X*N and
// (...)*N repeat, commas cosmetic.
std::vector<int> Layout(const char *s, std::string *err = nullptr) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_plan_options o;
  mp_plan_options_init(&o);
  std::vector<int> out;
  if (mp_pp_layout_parse(&ctx, s, &o) != MP_OK) {
    if (err) *err = mp_errmsg(&ctx);
    return out;
  }
  for (int k = 0; k < o.n_pp_layers; k++) out.push_back(o.pp_layers[k]);
  return out;
}

TEST(PipelineSchedule, MegatronLayoutNotation) {
  std::vector<int> meta(128, 1);
  meta[0] = meta[127] = 0;
  EXPECT_EQ(Layout("E|(t|)*126L"), meta);
  // DeepSeek-V3's documented example with its MTP layer as a plain one: 3, 2 x 29, 1, 0
  std::vector<int> ds(32, 2);
  ds[0] = 3, ds[30] = 1, ds[31] = 0;
  EXPECT_EQ(Layout("Et*3|(tt|)*29,t|L"), ds);
  EXPECT_EQ(Layout("Et*2|(tt|)*22t|(tt|)*7tL").size(), 32u);  // pp 8 x vpp 4: a group ends its stage
  EXPECT_EQ(Layout("E t*7 | ((t*8|)*2)*7 t*7 L"), ([] {
              std::vector<int> v(16, 8);
              v[0] = v[15] = 7;
              return v;
            }()));
  // written back in the same notation, and read again to the same counts
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.n_pp_layers = 128;
  for (int k = 0; k < 128; k++) o.pp_layers[k] = (int16_t)meta[k];
  char buf[256];
  ASSERT_GT(mp_pp_layout_format(&o, buf, sizeof buf), 0);
  EXPECT_STREQ(buf, "E|(t|)*126L");
  o.n_pp_layers = 32;
  for (int k = 0; k < 32; k++) o.pp_layers[k] = (int16_t)ds[k];
  ASSERT_GT(mp_pp_layout_format(&o, buf, sizeof buf), 0);
  EXPECT_EQ(Layout(buf), ds) << buf;
  EXPECT_EQ(mp_pp_layout_format(&o, buf, 8), -1) << "does not fit";
  // DeepSeek-V3's MTP layer on the last stage, after its layers and beside the loss: read
  // into the counts and o.pp_mtp, written back with it
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_plan_options m;
  mp_plan_options_init(&m);
  ASSERT_EQ(mp_pp_layout_parse(&ctx, "Et*3|(t*4|)*14t*2,mL", &m), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(m.n_pp_layers, 16);
  EXPECT_EQ(m.pp_layers[0], 3);
  EXPECT_EQ(m.pp_layers[15], 2);
  EXPECT_EQ(m.pp_mtp, 1);
  EXPECT_EQ(m.pp_mtp_stated, 1);
  ASSERT_GT(mp_pp_layout_format(&m, buf, sizeof buf), 0);
  EXPECT_STREQ(buf, "Et*3|(t*4|)*14t*2,mL");
  // refused, naming what is wrong
  const char *bad[][2] = {{"E|t*126", "the loss (L) once on the last"},
                          {"t|E|(t|)*125L", "the embedding (E) goes once on the first"},
                          {"E|(t|*126L", "a '(' without its ')'"},
                          {"E|t)|L", "a ')' without its '('"},
                          {"E|t*0|L", "a count of 1 or more"},
                          {"Et*3|(tt|)*29,m|L", "the MTP layers (m) go together on the last virtual stage"},
                          {"E|(t|)*126m,tL", "a layer (t) after an MTP layer (m)"},
                          {"E|(tx|)*126L", "an unknown symbol at offset 4"},
                          {"E|(t|)*200L", "more than 128 virtual stages"}};
  for (const auto &b : bad) {
    std::string err;
    EXPECT_TRUE(Layout(b[0], &err).empty()) << b[0];
    EXPECT_NE(err.find(b[1]), std::string::npos) << b[0] << ": " << err;
  }
}

TEST(PipelineSchedule, UnevenSplitAsTorchtitan) {
  // torchtitan's generate_split_points: base = L / K layers a chunk, the L mod K left over
  // one each to the chunks after the first, the last takes the rest.
  // Llama 3.1 405B, 126 layers on pp=8 (Table 5's layout): 15, 16 x 6, 15.
  EXPECT_EQ(ChunkSizes("llama3.1-405b", 8, 1), (std::vector<int>{15, 16, 16, 16, 16, 16, 16, 15}));
  // interleaved x2: 16 chunks of 126 / 16 = 7, 14 left over: 7, 8 x 14, 7; stage 0 holds
  // chunks 0 and 8 (7 + 8), stage 7 chunks 7 and 15 (8 + 7), the others 16
  std::vector<int> want(16, 8);
  want[0] = want[15] = 7;
  EXPECT_EQ(ChunkSizes("llama3.1-405b", 8, 2), want);
  // 32 layers on pp=5: 6, 7, 7, 6, 6; on pp=6 x 2: 2, 3 x 8, 2, 2, 2
  EXPECT_EQ(ChunkSizes("llama3.1-8b", 5, 1), (std::vector<int>{6, 7, 7, 6, 6}));
  EXPECT_EQ(ChunkSizes("llama3.1-8b", 6, 2), (std::vector<int>{2, 3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2}));
  // every layer its own chunk (K == L)
  EXPECT_EQ(ChunkSizes("llama3.1-8b", 8, 4), std::vector<int>(32, 1));
  // the schedule of the last stage of pp=5 runs layers 26..31
  Stage st;
  st.Build("llama3.1-8b", "pp=5", 4);
  std::set<int> layers;
  mp_schedule_iter it;
  mp_schedule_iter_begin(st.s, &it);
  while (mp_schedule_iter_next(&it))
    if (it.layer >= 0) layers.insert(it.layer);
  EXPECT_EQ(layers.size(), 6u);
  EXPECT_EQ(*layers.begin(), 26);
  // more chunks than layers: refused, naming the bound
  std::string err;
  EXPECT_TRUE(ChunkSizes("llama3.1-8b", 8, 8, &err).empty());
  EXPECT_NE(err.find("64 model chunks for the 32 layers"), std::string::npos) << err;
  EXPECT_NE(err.find("<= 32"), std::string::npos) << err;
  // and names the layout that gives the embedding and the loss chunks of their own: 34 chunks
  EXPECT_NE(err.find("\"E|(t|)*32L\" for 34 chunks"), std::string::npos) << err;
}

TEST(PipelineSchedule, ZbvPlacesTheModelInAV) {
  // ZBV (torchtitan's pipeline_parallel.py, style "v": stage pairs zip(range(pp), range(2 pp -
  // 1, pp - 1, -1))): Llama 3.1 8B on pp=4 is 8 chunks of 4 layers; rank s holds model chunks s
  // and 7 - s, so rank 0 runs layers 0-3 (with the embedding) and 28-31 (with the norm, the
  // head and the loss), rank 3 the V's turn, layers 12-15 and 16-19.
  auto Layers = [](const mp_schedule *s) {
    std::set<int> layers;
    mp_schedule_iter it;
    mp_schedule_iter_begin(s, &it);
    while (mp_schedule_iter_next(&it))
      if (it.layer >= 0) layers.insert(it.layer);
    return layers;
  };
  std::set<int> want0 = {0, 1, 2, 3, 28, 29, 30, 31}, want3;
  for (int l = 12; l < 20; l++) want3.insert(l);
  Stage r0, r3;
  r0.Build("llama3.1-8b", "pp=4", 0, MP_PP_ZBV, 2, 16);
  r3.Build("llama3.1-8b", "pp=4", 3, MP_PP_ZBV, 2, 16);
  ASSERT_NE(r0.s, nullptr);
  ASSERT_NE(r3.s, nullptr);
  EXPECT_EQ(Layers(r0.s), want0);
  EXPECT_EQ(Layers(r3.s), want3);
  EXPECT_EQ(mp_plan_chunk_index(r0.plan, 3, 1), 4);
  EXPECT_EQ(mp_plan_layer_stage(r0.plan, 28), 0);
  EXPECT_EQ(mp_plan_layer_stage(r0.plan, 16), 3);
  for (int i = 0; i < r0.plan->n_params; i++) {  // the head and the final norm sit on rank 0
    const mp_param *q = &r0.plan->params[i];
    if (q->module == MP_MOD_OUTPUT || q->module == MP_MOD_FINAL_NORM) {
      EXPECT_EQ(q->pp_stage, 0) << q->fqn;
    }
  }
  // a tied head would sit beside the embedding on rank 0, which the plan does not place
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_plan_options po;
  mp_plan_options_init(&po);
  po.pp_schedule = MP_PP_ZBV;
  po.pp_virtual = 2;
  mp_model m;
  mp_mesh mesh;
  ASSERT_EQ(mp_model_load(&ctx, "gpt2-124m", &m), MP_OK);
  ASSERT_EQ(mp_mesh_parse(&ctx, "pp=2", 0, &mesh), MP_OK);
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&ctx, &m, &mesh, &po, &p), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("tied output head"), std::string::npos) << mp_errmsg(&ctx);
}

// The zero-bubble orders (order_zbv, order_interleaved_zb): torch.distributed.pipelining's
// ScheduleZBVZeroBubble and ScheduleInterleavedZeroBubble (schedules.py, PyTorch v2.6 to
// v2.8) applied by hand for pp = 4, m = 8, and the chunks they hold (Qi et al., arXiv
// 2401.10241).
TEST(ZeroBubbleOrder, ZbvAsTorchWritesIt) {
  // pp = 4, m = 8 (n = max(2 pp - 1, m) = 8). Rank 0: 2 x 4 - 1 = 7 forwards of chunk 0, no
  // F1 F0 pairs, 4 triples F1 B1 W1; the steady loop while F1 lags F0 or F0 has forwards
  // left: F0.7 B0.0 W0.0 F1.4 B1.4 W1.4, then (no F0 left) B0 W0 F1 B1 W1 three times; no B0
  // B1 pairs, 4 pairs B0 W0; nothing left over.
  EXPECT_EQ(Str(Order(MP_PP_ZBV, 4, 2, 8, 0, MP_PP_FLAVOR_TORCH)),
            "F0.0 F0.1 F0.2 F0.3 F0.4 F0.5 F0.6 F1.0 B1.0 W1.0 F1.1 B1.1 W1.1 F1.2 B1.2 W1.2 F1.3 B1.3 "
            "W1.3 F0.7 B0.0 W0.0 F1.4 B1.4 W1.4 B0.1 W0.1 F1.5 B1.5 W1.5 B0.2 W0.2 F1.6 B1.6 W1.6 B0.3 "
            "W0.3 F1.7 B1.7 W1.7 B0.4 W0.4 B0.5 W0.5 B0.6 W0.6 B0.7 W0.7");
  // Rank 3 (the V's turn): 1 forward of chunk 0, 3 pairs F1 F0, 1 triple F1 B1 W1; the steady
  // loop F0 B0 W0 F1 B1 W1 until F0.7 (four times), then B0 W0 F1 B1 W1 ... until F1.7; 3 pairs
  // B0 B1, 1 pair B0 W0; the W1 left (W1.5 .. W1.7), then the W0 left (W0.5 .. W0.7).
  EXPECT_EQ(Str(Order(MP_PP_ZBV, 4, 2, 8, 3, MP_PP_FLAVOR_TORCH)),
            "F0.0 F1.0 F0.1 F1.1 F0.2 F1.2 F0.3 F1.3 B1.0 W1.0 F0.4 B0.0 W0.0 F1.4 B1.1 W1.1 F0.5 B0.1 "
            "W0.1 F1.5 B1.2 W1.2 F0.6 B0.2 W0.2 F1.6 B1.3 W1.3 F0.7 B0.3 W0.3 F1.7 B1.4 W1.4 B0.4 B1.5 "
            "B0.5 B1.6 B0.6 B1.7 B0.7 W0.4 W1.5 W1.6 W1.7 W0.5 W0.6 W0.7");
}

TEST(ZeroBubbleOrder, InterleavedZbDefersEachWByTheStage) {
  // pp = 4, v = 2, m = 8: rounds max(1, 8 / 4) = 2 of r = 4; stage 1 warms up with (v - 1) r +
  // pp - 1 - 1 = 6 forwards (chunk (k / 4) mod 2: four of chunk 0, two of chunk 1), then F and
  // B alternately, B number k of chunk 1 - (k / 4) mod 2, a W after each B from its second on
  // (num_1f1b_microbatches = rank = 1) for the oldest B without one; the 6 cool-down B's each
  // with a W, and the last W.
  EXPECT_EQ(Str(Order(MP_PP_INTERLEAVED_ZB, 4, 2, 8, 1, MP_PP_FLAVOR_TORCH)),
            "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 B1.0 F1.3 B1.1 W1.0 F0.4 B1.2 W1.1 F0.5 B1.3 W1.2 F0.6 "
            "B0.0 W1.3 F0.7 B0.1 W0.0 F1.4 B0.2 W0.1 F1.5 B0.3 W0.2 F1.6 B1.4 W0.3 F1.7 B1.5 W1.4 B1.6 "
            "W1.5 B1.7 W1.6 B0.4 W1.7 B0.5 W0.4 B0.6 W0.5 B0.7 W0.6 W0.7");
}

TEST(ZeroBubbleMemory, ChunksAreHeldUntilTheirW) {
  // Torch keeps a split backward's autograd state until its W (stage_backward_input runs
  // with retain_graph; _backward.py), so a chunk is held from its F to its W. ZBV: every rank
  // runs 2 pp forwards before its first W (rank s: 2 (pp - s) - 1 + 2 s + 1), then one W for
  // each F: 8 chunks of half a micro-batch's layers, pp = 4 micro-batches' worth, as 1F1B's
  // first stage (the paper's ZB-V, sec. 6).
  for (int s = 0; s < 4; s++) {
    const std::vector<mp_pp_step> o = Order(MP_PP_ZBV, 4, 2, 8, s, MP_PP_FLAVOR_TORCH);
    EXPECT_EQ(mp_pp_inflight(o.data(), (int64_t)o.size()), 8) << "rank " << s;
  }
  // ZB-H1 (v = 1): stage 3 warms up with none and defers each W by 3 backwards: F0 B0 F1 B1 F2
  // B2 F3 B3 W0 F4 ...: 4 held at F4, pp as 1F1B's first stage; released at B it would be 1.
  for (int s = 0; s < 4; s++) {
    const std::vector<mp_pp_step> o = Order(MP_PP_INTERLEAVED_ZB, 4, 1, 8, s, MP_PP_FLAVOR_TORCH);
    EXPECT_EQ(mp_pp_inflight(o.data(), (int64_t)o.size()), 4) << "stage " << s;
  }
}


}  // namespace
