// Expert tensor parallelism (etp > 1, exec/mesh.h and exec/pass_ep.c) on tiny-moe (H = 64,
// 8 experts of d_ff_expert 32, top_k 2, 2 MoE layers, one shared expert): the expert weight
// shards, the expert-TP group's all-gather and reduce-scatter around the experts under
// Megatron-Core's all-to-all dispatcher, torchtitan's ExpertTensorParallel without them, and
// the experts' gradient reduction over expert-DP, each figure derived by hand.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

using namespace sched_test;

namespace {

// One sequence of 64 tokens a micro-batch on `mesh` under memory model `mm`.
Opts TinyMoe(const char *mesh, mp_mem_model mm, int64_t global_batch) {
  Opts o;
  o.model = "tiny-moe";
  o.mesh = mesh;
  o.mem_model = mm;
  o.seq = 64;
  o.global_batch = global_batch;
  if (mm == MP_MEM_MODEL_MEGATRON) o.loss = MP_LOSS_INPLACE;
  return o;
}

// The routed experts' gate GEMMs of the forward: their m, n, k and batch, all equal.
struct GateGemm {
  int64_t m = -1, n = -1, k = -1, batch = -1;
  int count = 0;
};

GateGemm GateFwd(const mp_schedule *s) {
  GateGemm g;
  for (const Inst &x : Expand(s)) {
    const mp_op *op = x.op;
    if (op->type != MP_OP_COMPUTE || op->kernel != MP_KERNEL_GEMM || op->module != MP_MOD_EXPERTS_GATE ||
        op->variant != MP_VAR_FWD || op->phase != MP_PHASE_FORWARD)
      continue;
    g = {op->m, op->n, op->k, op->batch, g.count + 1};
  }
  return g;
}

// The expert-TP collectives of a schedule: all-gathers and reduce-scatters over MP_GROUP_ETP.
int64_t EtpCollectives(const mp_schedule *s) {
  mp_schedule_totals t;
  mp_schedule_totals_compute(s, &t);
  return t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_ETP] + t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_ETP];
}

// The block of prm that rank stores: its offsets, and its lengths where want_len is given.
void ExpectTile(const mp_plan *p, const mp_param *prm, int rank, const std::vector<int64_t> &want_off,
                const std::vector<int64_t> &want_len) {
  int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
  ASSERT_TRUE(mp_param_tile(p, prm, rank, off, len)) << rank;
  EXPECT_EQ(std::vector<int64_t>(off, off + prm->ndim), want_off) << rank;
  if (!want_len.empty()) {
    EXPECT_EQ(std::vector<int64_t>(len, len + prm->ndim), want_len) << rank;
  }
}

// The all-to-all dispatcher's tiny-moe exchanges below move 65,536 B a kind over 2 layers: the EP all-to-all in 8
// ops, the expert-TP all-gather and reduce-scatter in 4 each.
void ExpectTinyMoeExchange(const mp_schedule *s) {
  mp_schedule_totals t;
  mp_schedule_totals_compute(s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 8);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 65536.0);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_ETP], 4);
  EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_ETP], 4);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_ETP], 65536.0);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_ETP], 65536.0);
}

// The forward gate GEMMs' m, n, k, batch and count against the derivation's.
void ExpectGate(const GateGemm &g, const GateGemm &want) {
  EXPECT_EQ(g.m, want.m);
  EXPECT_EQ(g.n, want.n);
  EXPECT_EQ(g.k, want.k);
  EXPECT_EQ(g.batch, want.batch);
  EXPECT_EQ(g.count, want.count);
}

const mp_param *Param(const mp_plan *p, const char *fqn) {
  for (int i = 0; i < p->n_params; i++)
    if (std::strcmp(p->params[i].fqn, fqn) == 0) return &p->params[i];
  return nullptr;
}

}  // namespace

// The expert weight shard: dp_replicate=4, tp=2, ep=2, etp=2 (8 ranks). A stage rank of the
// expert grid [edp 2, ep 2, etp 2] is (a x 2 + e) x 2 + t. gate_proj [8, 32, 64] splits on
// dim 0 over ep (4 experts a rank) and dim 1 over etp (column-parallel: 16 of an expert's 32
// rows); down_proj [8, 64, 32] on dims 0 and 2 (row-parallel). Rank 3 (a 0, e 1, t 1) holds
// gate [4:8, 16:32, 0:64] and down [4:8, 0:64, 16:32]; rank 6 (a 1, e 1, t 0) gate
// [4:8, 0:16, 0:64]. Each 4 x 16 x 64 = 4,096 elements, a quarter of an etp=1 rank's.
TEST(Etp, ExpertWeightShard) {
  Built b;
  ASSERT_EQ(PlanOnly(&b, TinyMoe("dp_replicate=4,tp=2,ep=2,etp=2", MP_MEM_MODEL_MEGATRON, 4)), MP_OK)
      << mp_errmsg(&b.ctx);
  const mp_param *gate = Param(b.plan, "layers.0.moe.experts.gate_proj.weight");
  const mp_param *down = Param(b.plan, "layers.0.moe.experts.down_proj.weight");
  ASSERT_TRUE(gate && down);
  ExpectTile(b.plan, gate, 3, {4, 16, 0}, {4, 16, 64});
  ExpectTile(b.plan, down, 3, {4, 0, 16}, {4, 64, 16});
  ExpectTile(b.plan, gate, 6, {4, 0, 0}, {});
  EXPECT_EQ(mp_param_local_numel(b.plan, gate, 6), 4096);
  EXPECT_EQ(mp_param_local_numel(b.plan, down, 6), 4096);
}

// Megatron-Core's all-to-all dispatcher with tp_size = etp (token_dispatcher.py,
// MoEAlltoAllTokenDispatcher, core_v0.14.0) on dp_replicate=2, tp=2, ep=2, etp=2 (4 ranks, SP
// on). T = 64 tokens; each TP rank routes its own sequence shard, 32 tokens x top_k 2 = 64
// rows. Per MoE layer:
//   all-to-all over EP   64 rows x 64 x 2 bytes = 8,192 B, dispatch and combine forward, the
//                        output gradient in and the input gradient out backward: 4
//   all-gather over ETP  the group's 2 x 64 rows x 64 x 2 bytes = 16,384 B (the gathered
//                        tensor): the dispatched rows forward, the output gradient backward: 2
//   reduce-scatter       the same 16,384 B: fc2's partial sums forward, the input gradient
//     over ETP           backward: 2
// 2 layers: EP 8 x 8,192 = 65,536 B; ETP 4 all-gathers and 4 reduce-scatters of 65,536 B
// each kind. A local expert (4 a rank) runs 2 x 64 rows x 2 (ep) / 8 = 32 rows through its
// gate slice of 32 / 2 = 16 columns: GEMM [32, 64] x [64, 16], batch 4. Without etp
// (etp=1) the expert-TP group is the rank: no ETP collective, 64 x 2 / 8 = 16 rows through
// all 32 columns.
TEST(Etp, MegatronGathersAndScattersOverExpertTp) {
  Built b;
  Build(&b, TinyMoe("dp_replicate=2,tp=2,ep=2,etp=2", MP_MEM_MODEL_MEGATRON, 2));
  ASSERT_EQ(b.model.n_layers, 2);
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_ETP), 2);
  ExpectTinyMoeExchange(b.s);
  ExpectGate(GateFwd(b.s), {32, 16, 64, 4, 2});

  Built one;
  Build(&one, TinyMoe("dp_replicate=2,tp=2,ep=2,etp=1", MP_MEM_MODEL_MEGATRON, 2));
  EXPECT_EQ(EtpCollectives(one.s), 0);
  const GateGemm g1 = GateFwd(one.s);
  EXPECT_EQ(g1.m, 16);
  EXPECT_EQ(g1.n, 32);
}

// Megatron-Core's flex dispatcher under expert tensor parallelism (MoEFlexTokenDispatcher,
// token_dispatcher.py, core_v0.14.0 and core_v0.19.0): its group is expert-TP x EP
// (tp_ep_group) and _initialize_metadata replicates each token's routing over the etp ranks of
// its expert's group, so the dispatch carries a copy to each and the combine sums their
// partial outputs; no ETP all-gather or reduce-scatter. dp_replicate=4, tp=2, ep=4, etp=2 (8
// ranks, SP on), T = 64 tokens: each rank routes its 32-token shard x top_k 2 = 64 rows.
// Per MoE layer (2 layers):
//   all-to-all dispatcher: EP all-to-all 64 rows x 64 x 2 B = 8,192 B, 4 a layer: 65,536 B;
//     ETP all-gather of the group's 2 x 64 rows, 16,384 B, 2 a layer: 65,536 B, and the
//     reduce-scatters the same
//   DeepEP (flex):         64 rows x etp 2 x 64 x 2 B = 16,384 B, 4 a layer: 131,072 B over
//     EP; no ETP collective
// The experts' GEMMs are the same under both: 8 ranks x 32 tokens x 2 = 512 (token, expert)
// pairs over 8 experts, 64 rows an expert, each expert-TP rank of its group running all 64
// through its 32 / 2 = 16 gate columns: [64, 64] x [64, 16], batch 8 / 4 = 2 local experts,
// one grouped GEMM a layer, and every other op the same: the step's FLOPs are equal.
TEST(Etp, FlexDispatcherSendsToEachExpertTpRank) {
  const char *mesh = "dp_replicate=4,tp=2,ep=4,etp=2";
  Built a2a;
  Build(&a2a, TinyMoe(mesh, MP_MEM_MODEL_MEGATRON, 4));
  ExpectTinyMoeExchange(a2a.s);
  ExpectGate(GateFwd(a2a.s), {64, 16, 64, 2, 2});
  mp_schedule_totals ta;
  mp_schedule_totals_compute(a2a.s, &ta);
  for (mp_moe_dispatcher d : {MP_MOE_DISPATCH_DEEPEP, MP_MOE_DISPATCH_HYBRIDEP}) {
    SCOPED_TRACE(d);
    Built flex;
    Opts o = TinyMoe(mesh, MP_MEM_MODEL_MEGATRON, 4);
    o.moe_dispatcher = d;
    Build(&flex, o);
    mp_schedule_totals t;
    mp_schedule_totals_compute(flex.s, &t);
    EXPECT_EQ(t.n_comm[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 8);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 131072.0);
    EXPECT_EQ(EtpCollectives(flex.s), 0);
    ExpectGate(GateFwd(flex.s), {64, 16, 64, 2, 2});
    EXPECT_DOUBLE_EQ(t.flops, ta.flops);
  }
  // etp 1 under DeepEP: one copy a (token, expert), 65,536 B, as the all-to-all's
  Built one;
  Opts o1 = TinyMoe("dp_replicate=4,tp=2,ep=4,etp=1", MP_MEM_MODEL_MEGATRON, 4);
  o1.moe_dispatcher = MP_MOE_DISPATCH_DEEPEP;
  Build(&one, o1);
  mp_schedule_totals t1;
  mp_schedule_totals_compute(one.s, &t1);
  EXPECT_DOUBLE_EQ(t1.comm_bytes[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 65536.0);
}

// etp strictly between 1 and tp, as the meshplan runtime runs it (meshplan-cpu: fp32, SP on):
// tp=4, ep=2, etp=2 on 4 ranks (Megatron-Core's expert grid [edp 1, ep 2, etp 2], etp
// innermost, parallel_state.py core_v0.14.0). Expert-TP groups {0, 1} and {2, 3}, EP groups
// {0, 2} and {1, 3}: an expert-TP group is half a TP group, and its two ranks route
// different sequence shards. Rank 3 (e 1, t 1) holds gate [4:8, 16:32, 0:64], rank 2
// (e 1, t 0) gate [4:8, 0:16, 0:64], rank 1 (e 0, t 1) down [0:4, 0:64, 16:32]. T = 64
// tokens over tp 4: each rank routes 16 tokens x top_k 2 = 32 rows. Per MoE layer:
//   all-to-all over EP   32 rows x 64 x 4 bytes = 8,192 B, 4 (dispatch, combine, and both
//                        backward): 2 layers 65,536 B
//   all-gather over ETP  the group's 2 x 32 rows x 64 x 4 bytes = 16,384 B, 2 (forward and
//                        backward): 2 layers 65,536 B; the reduce-scatters the same
// A local expert (4 a rank) runs 2 x 32 rows x 2 (ep) / 8 = 16 rows through its gate slice
// of 32 / 2 = 16 columns, as the runtime does one block at a time (runtime_block.c: per
// expert-TP rank t, EP source s and local expert e): 2 x 2 x 4 = 16 blocks a layer of
// 16 / (2 x 2) = 4 rows, GEMM [4, 64] x [64, 16], 32 over the 2 layers.
TEST(Etp, RuntimeRunsEtpBelowTp) {
  Built b;
  Build(&b, TinyMoe("tp=4,ep=2,etp=2", MP_MEM_MODEL_MESHPLAN_CPU, 1));
  int ranks[MP_MESH_MAX_WORLD];
  ASSERT_EQ(mp_mesh_group_ranks(&b.plan->mesh, MP_GROUP_ETP, 1, ranks), 2);
  EXPECT_EQ(ranks[0], 0);
  EXPECT_EQ(ranks[1], 1);
  ASSERT_EQ(mp_mesh_group_ranks(&b.plan->mesh, MP_GROUP_EP, 1, ranks), 2);
  EXPECT_EQ(ranks[0], 1);
  EXPECT_EQ(ranks[1], 3);
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_TP), 4);
  const mp_param *gate = Param(b.plan, "layers.0.moe.experts.gate_proj.weight");
  const mp_param *down = Param(b.plan, "layers.0.moe.experts.down_proj.weight");
  ASSERT_TRUE(gate && down);
  ExpectTile(b.plan, gate, 3, {4, 16, 0}, {4, 16, 64});
  ExpectTile(b.plan, gate, 2, {4, 0, 0}, {});
  ExpectTile(b.plan, down, 1, {0, 0, 16}, {4, 64, 16});
  ExpectTinyMoeExchange(b.s);
  ExpectGate(GateFwd(b.s), {4, 16, 64, 1, 32});
}

// torchtitan's ExpertTensorParallel (etp = tp; torchtitan/distributed/expert_parallel.py and
// llama4's apply_moe_ep_tp, v0.2.0): the MoE input is replicated over tp, so both ranks of an
// expert-TP group route the same 64 tokens and nothing is gathered between them; the
// all-to-all carries 64 x 2 rows x 64 x 2 bytes = 16,384 B (4 a layer, 2 layers: 131,072 B),
// and a local expert runs 64 x 2 x 2 / 8 = 32 rows through 16 columns.
TEST(Etp, TorchtitanRoutesTheReplicatedInput) {
  Built b;
  Build(&b, TinyMoe("dp_shard=2,tp=2,ep=2,etp=2", MP_MEM_MODEL_TORCHTITAN, 2));
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 131072.0);
  EXPECT_EQ(EtpCollectives(b.s), 0);
  const GateGemm g = GateFwd(b.s);
  EXPECT_EQ(g.m, 32);
  EXPECT_EQ(g.n, 16);
}

// The experts' gradients over expert-DP: dp_replicate=4, tp=2, ep=2, etp=2 under Megatron's
// distributed optimizer. A rank's routed experts: 2 layers x 3 projections x 4 x 16 x 64 =
// e = 24,576 elements; expert-DP = 8 / (2 x 2) = 2 ranks. Their fp32 gradients reduce-scattered
// over it, 4 e = 98,304 B, and the bf16 parameters gathered back, 2 e = 49,152 B.
TEST(Etp, ExpertGradientsReduceOverExpertDp) {
  Built b;
  Opts o = TinyMoe("dp_replicate=4,tp=2,ep=2,etp=2", MP_MEM_MODEL_MEGATRON, 4);
  o.dist_opt = 1;
  Build(&b, o);
  const int64_t e = 2 * 3 * 4 * 16 * 64;
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_EDP), 2);
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_EDP], 4.0 * e);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_EDP], 2.0 * e);
}

// What meshplan refuses, by name: torchtitan's etp other than 1 or tp (parallel_dims.py,
// v0.2.0), etp without EP other than tp, and a dense model.
TEST(Etp, Refusals) {
  const struct {
    const char *model, *mesh;
    mp_mem_model mm;
    const char *want;
  } cases[] = {
      {"tiny-moe", "dp_shard=4,tp=4,ep=2,etp=2", MP_MEM_MODEL_TORCHTITAN,
       "torchtitan supports expert_tensor_parallel_degree 1 or tp only"},
      {"tiny-moe", "dp_replicate=2,tp=4,etp=2", MP_MEM_MODEL_MEGATRON, "etp=2 without EP (ep=1) is modelled with etp = tp"},
      {"tiny-dense", "tp=2,etp=2", MP_MEM_MODEL_MEGATRON, "EP on a dense model"},
  };
  for (const auto &c : cases) {
    SCOPED_TRACE(c.mesh);
    Built b;
    Opts o = TinyMoe(c.mesh, c.mm, 0);
    o.model = c.model;
    EXPECT_NE(PlanOnly(&b, o), MP_OK);
    EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find(c.want), std::string::npos) << mp_errmsg(&b.ctx);
  }
  // the same etp=2 under tp=4 is Megatron-Core's to run
  Built mg;
  EXPECT_EQ(PlanOnly(&mg, TinyMoe("dp_replicate=4,tp=4,ep=2,etp=2", MP_MEM_MODEL_MEGATRON, 0)), MP_OK)
      << mp_errmsg(&mg.ctx);
}
