// The expert grid's collectives (exec/mesh.h): Megatron-Core's EP carved from the
// data-parallel and tensor ranks, with DDP reducing the routed experts' gradients over their
// expert-DP group and the dense weights' over dp_replicate, each group and byte count
// derived by hand.
#include <gtest/gtest.h>

#include <vector>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

using namespace sched_test;

namespace {

// Mixtral 8x7B's routed experts: 32 MoE layers x 8 experts x 3 Linears [14336, 4096].
int64_t RoutedExperts(const mp_model &m) {
  return m.n_layers * m.n_experts * 3 * m.d_model * m.d_ff_expert;
}

// Mixtral 8x7B under Megatron-LM's memory model with EP 8 spanning tp=4 (the expert grid
// [edp 1, ep 8, etp 1] over dp_replicate=2 x tp=4), one sequence per data-parallel rank.
void BuildGridOverTp4(Built *b) {
  Opts o;
  o.model = "mixtral-8x7b";
  o.mesh = "dp_replicate=2,tp=4,ep=8,etp=1";
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.global_batch = 2;
  Build(b, o);
}

}  // namespace

// Mixtral 8x7B under Megatron-Core on dp_replicate=8, ep=2 (EP 2 over a data-parallel group
// of 8: the expert grid [edp 4, ep 2, etp 1]), the distributed optimizer. A rank holds the
// dense weights D = N - E whole and its ep rank's half of the routed experts, e = E / 2.
// Gradients (fp32, 4 bytes): the dense 4 D reduce-scattered over dp_replicate (8 ranks),
// the experts' 4 e over expert-DP (4 ranks: the ranks of the other ep index hold other
// experts); the updated bf16 parameters gathered back the same way, 2 D and 2 e. The fp32
// master and Adam state: 12 bytes on ceil(D / 8) + ceil(e / 4) parameters. Without overlap
// one reduce-scatter and one all-gather per group; with it a bucket per block (32 for the
// experts, 32 + the root's for the dense weights). Each MoE layer's dispatch and combine:
// two all-to-alls over EP forward and two backward of 8192 tokens x top_k 2 x 4096 in bf16.
TEST(ExpertGrid, DdpReducesExpertsOverExpertDp) {
  for (int overlap = 0; overlap <= 1; overlap++) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    Built b;
    Opts o;
    o.model = "mixtral-8x7b";
    o.mesh = "dp_replicate=8,ep=2";
    o.mem_model = MP_MEM_MODEL_MEGATRON;
    o.global_batch = 8;
    o.dist_opt = 1;
    o.dp_overlap = overlap;
    Build(&b, o);
    const mp_model &m = b.model;
    const int64_t E = RoutedExperts(m), D = mp_model_param_count(&m) - E, e = E / 2;
    const int64_t shard = (D + 7) / 8 + (e + 3) / 4;
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_PARAMS], 2 * (D + e) + 4 * shard);
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_OPTIMIZER], 8 * shard);
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_GRADS], 4 * (D + e));
    mp_schedule_totals t;
    mp_schedule_totals_compute(b.s, &t);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_DP_REPLICATE], 4.0 * D);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_EDP], 4.0 * e);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_DP_REPLICATE], 2.0 * D);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_EDP], 2.0 * e);
    EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_EDP], overlap ? m.n_layers : 1);
    EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_DP_REPLICATE], overlap ? m.n_layers + 1 : 1);
    EXPECT_EQ(t.n_comm[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 4 * m.n_layers);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 4.0 * m.n_layers * 2 * 8192 * 2 * 4096);
    EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_EDP), 4);
  }
}

// EP 8 spanning the TP ranks (etp=1) while attention runs tp=4: dp_replicate=2, tp=4,
// ep=8. Each rank routes its own sequence shard, 8192 / 4 = 2048 tokens (Megatron-Core's
// token dispatcher under SP), so an all-to-all carries 2048 x 2 x 4096 bf16 values, and its
// one local expert receives 2048 x 2 x 8 / 8 = 4096 rows. Every rank holds different
// experts (expert-DP of 1): nothing reduces their gradients; the dense weights' go over
// dp_replicate (2).
TEST(ExpertGrid, EpSpanningTensorParallelRoutesTheSequenceShard) {
  Built b;
  BuildGridOverTp4(&b);
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  const mp_model &m = b.model;
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 4.0 * m.n_layers * 2 * 2048 * 2 * 4096);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_EDP] + t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_EDP], 0);
  EXPECT_GT(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_DP_REPLICATE], 0);
  int gemms = 0;
  for (const Inst &x : Expand(b.s))
    if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_GEMM && x.op->module == MP_MOD_EXPERTS_GATE &&
        x.op->variant == MP_VAR_FWD) {
      EXPECT_EQ(x.op->m, 4096);
      EXPECT_EQ(x.op->batch, 1);
      gemms++;
    }
  EXPECT_EQ(gemms, m.n_layers);
}

// Megatron-Core's MoE layer under SP with etp 1 takes the rank's [T/tp, H] sequence shard as
// it is: its router scores the shard (MoELayer.forward calls self.router(hidden_states) on
// the SP input, megatron/core/transformer/moe/moe_layer.py of core_v0.14) and its token
// dispatcher's tp group is the expert TP group (token_dispatcher.py: self.tp_group =
// model_comm_pgs.expt_tp), one rank under etp 1, so no all-gather before the router and no
// reduce-scatter after the combine. Mixtral 8x7B on dp_replicate=2, tp=4, ep=8, etp=1:
// T = 8192, the shard 2048 tokens; per MoE layer the router GEMM [2048, 4096] x [4096, 8]
// forward, no TP collective in the MLP part; the attention's stay: forward the all-gather
// into q/k/v and the reduce-scatter out of o (2 a layer), backward o's gradient all-gathered,
// q/k/v's input gradient reduce-scattered and their input all-gathered again for the weight
// gradients (3 a layer), each of T x H bf16 = 67,108,864 bytes.
TEST(ExpertGrid, MegatronMoeRoutesTheShardWithoutTpCollectives) {
  Built b;
  BuildGridOverTp4(&b);
  const mp_model &m = b.model;
  int routers = 0, tp_in_blocks = 0;
  for (const Inst &x : Expand(b.s)) {
    const mp_op *op = x.op;
    if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_GEMM && op->module == MP_MOD_ROUTER &&
        op->variant == MP_VAR_FWD) {
      EXPECT_EQ(op->m, 2048);
      routers++;
    }
    if (op->type != MP_OP_COMM || op->group != MP_GROUP_TP || op->layer < 0) continue;
    EXPECT_TRUE(op->module == MP_MOD_Q || op->module == MP_MOD_O) << op->module;
    EXPECT_DOUBLE_EQ(op->bytes, 67108864.0);
    tp_in_blocks++;
  }
  EXPECT_EQ(routers, m.n_layers);
  EXPECT_EQ(tp_in_blocks, 5 * m.n_layers);
}

// MoE under a pipeline (DeepSeek-V3's layout on 2,048 GPUs, tech report sec. 3.2, with EP
// inside dp_shard as torchtitan runs it): 61 layers on pp=16 split as torchtitan splits them,
// 3 a stage and the 13 left over one each to stages 1-13: stage 0 holds layers 0-2 (the
// three leading dense layers: no all-to-all), stage 1 layers 3-6 and stage 15 layers 58-60
// (MoE). Under full AC a MoE layer's dispatch and combine are two all-to-alls forward, two
// again in the recomputed forward and two backward, over its stage's EP group of 64 ranks,
// each of 4096 tokens x top_k 8 x 7168 in bf16; the group never leaves the stage.
TEST(ExpertGrid, MoeUnderAPipelineKeepsAllToAllsInsideAStage) {
  const struct {
    int rank, stage, moe_layers;
  } cases[] = {{0, 0, 0}, {128, 1, 4}, {1920 + 77, 15, 4}}; /* stage 15: 3 blocks and the MTP block */
  for (const auto &c : cases) {
    SCOPED_TRACE(c.rank);
    Built b;
    Opts o;
    o.model = "deepseek-v3";
    o.mesh = "pp=16,dp_shard=128,ep=64";
    o.seq = 4096;
    o.rank = c.rank;
    o.ac = MP_AC_FULL;
    Build(&b, o);
    mp_schedule_totals t;
    mp_schedule_totals_compute(b.s, &t);
    EXPECT_EQ(t.n_comm[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 6 * c.moe_layers);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 6.0 * c.moe_layers * 2 * 4096 * 8 * 7168);
    std::vector<int> ranks(64);
    ASSERT_EQ(mp_mesh_group_ranks(&b.plan->mesh, MP_GROUP_EP, c.rank, ranks.data()), 64);
    for (int r : ranks) EXPECT_EQ(mp_plan_rank_stage(b.plan, r), c.stage) << r;
  }
}

// What a MoE block saves for its backward under the expert grid follows the rows the rank
// routes: Mixtral 8x7B on dp_replicate=2, tp=4, ep=8, etp=1 under Megatron-LM's memory model
// (flash attention, SP, seq 8192, micro-batch 1). T = 8192 tokens, Ts = T / 4 = 2048 on the
// rank's sequence shard, H = 4096, heads 32 / 4 = 8 (q 1024 wide), kv heads 8 / 4 = 2 (kv
// 256), E = 8 experts of f_e = 14336, top_k 2; each TP rank routes its own shard, R = Ts x 2
// = 4096 rows (the rows EpSpanningTensorParallelRoutesTheSequenceShard's expert GEMMs run).
//   block input            2 Ts H                                  =  16,777,216
//   attention              4 Ts (rstd) + 2 Ts H (SP input) + 2T (q + kv) (q, k after RoPE)
//                          + 2T kv (v) + 4T x 8 (log-sum-exp) + 2T q (context)
//                                                                  =  58,990,592
//   MoE, not routed        2 Ts H + 4 Ts + 2 Ts H (normed h) + 4 Ts E (router
//                          probabilities): Megatron-Core's MoE layer routes the rank's
//                          sequence shard itself, no TP gather before its router
//                          (megatron/core/transformer/moe/moe_layer.py of core_v0.14)
//                                                                  =  33,628,160
//   MoE, routed rows       12 R + 2 R H (dispatched) + 4 x 2 R f_e (gate, up, silu,
//                          product)                                = 503,365,632
// (the expert outputs are not saved: Megatron-Core weights the rows in the experts'
// activation and combines them unweighted, exec/schedule_act.c)
// 612,761,600 bytes in all; counting all T tokens' rows on every rank instead (R = 16384)
// would give 2,122,858,496, and the gathered normed h and T tokens' probabilities
// 663,289,856.
TEST(ExpertGrid, SavedRoutedActivationsAreTheRanksRows) {
  const int64_t T = 8192, Ts = 2048, H = 4096, R = 4096;
  const int64_t want = 2 * Ts * H + (4 * Ts + 2 * Ts * H + 2 * T * (1024 + 256) + 2 * T * 256 + 4 * T * 8 + 2 * T * 1024) +
                       (2 * Ts * H + 4 * Ts + 2 * Ts * H + 4 * Ts * 8) +
                       (12 * R + 2 * R * H + 4 * 2 * R * 14336);
  EXPECT_EQ(want, 612761600);
  Built b;
  BuildGridOverTp4(&b);
  EXPECT_EQ(SavedByBlock(b.s, 0), want);
}

// The meshplan runtime's FSDP with EP reaching into dp_replicate (dp_replicate=4 x tp=2,
// ep=4, etp=1; the CPU backend's memory model): the expert grid [edp 2, ep 4, etp 1] over 8
// ranks, so the experts' FSDP group is one rank (nothing to reduce-scatter) and their
// gradients are all-reduced over the expert-DP group {0, 4}, not over dp_replicate's
// {0, 2, 4, 6} (ranks 2 and 6 hold other experts). tiny-moe: 2 MoE layers of 8 experts, a
// rank's 8 / 4 = 2 of them, each 3 Linears of 64 x 32: 2 x 3 x 2048 = 12,288 fp32 gradients,
// 49,152 bytes, a layer; one all-reduce a layer.
TEST(ExpertGrid, RuntimeSumsReachingExpertsOverExpertDp) {
  Built b;
  Opts o;
  o.model = "tiny-moe";
  o.mesh = "dp_replicate=4,tp=2,ep=4,etp=1";
  o.mem_model = MP_MEM_MODEL_MESHPLAN_CPU;
  o.seq = 32;
  o.global_batch = 4;
  Build(&b, o);
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_EFSDP), 1);
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_EDP), 2);
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_EDP], 2);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_REDUCE][MP_GROUP_EDP], 2 * 49152.0);
  EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_EFSDP], 0);
  EXPECT_GT(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_DP_REPLICATE], 0);
}
