// Megatron-LM's distributed optimizer in N instances (the mesh's dopt=N) with routed experts
// on the expert grid, against hand counts from megatron/core/parallel_state.py at
// core_v0.14.0: the expert-DP group (ranks of a stage holding the same experts, the expert
// RankGenerator's "dp" groups) cut by create_hierarchical_groups with sizes
// [edp / N, N] into intra-instance slices of consecutive members
// (_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP) and the inter-instance group of members
// edp / N apart (_INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP, which
// get_inter_distributed_optimizer_instance_group returns for the dense buckets too);
// distributed_data_parallel.py (the expert buffers over intra_expt_dp_group, the bucket
// groups given inter_dist_opt_group); param_and_grad_buffer.py start_grad_sync (each bucket
// reduce-scattered over its instance group, the rank's shard then all-reduced across the
// instances) and start_param_sync (all-gathered over the instance group); and the assert
// "Expert data parallel size should be divisible by partial DistOpt shard factor".
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exec/mesh.h"
#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Opts;

std::vector<int> Ranks(const mp_mesh &m, mp_group g, int rank) {
  std::vector<int> r(mp_mesh_group_size(&m, g));
  mp_mesh_group_ranks(&m, g, rank, r.data());
  return r;
}

// Mixtral 8x7B's routed experts: 32 MoE layers x 8 experts x 3 Linears [14336, 4096].
int64_t RoutedExperts(const mp_model &m) { return m.n_layers * m.n_experts * 3 * m.d_model * m.d_ff_expert; }

// Mixtral 8x7B under Megatron-LM with the distributed optimizer, one sequence per
// data-parallel rank.
Opts Mixtral(const char *mesh, int overlap) {
  Opts o;
  o.model = "mixtral-8x7b";
  o.mesh = mesh;
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.global_batch = 8;
  o.dist_opt = 1;
  o.dp_overlap = overlap;
  return o;
}

// dp_replicate=8, ep=2 (the expert grid [edp 4, ep 2, etp 1], a stage rank = 2 a + e) in 2
// instances. Rank 0's expert-DP group {0, 2, 4, 6} (the ranks of ep index 0) cuts into
// {0, 2} and {4, 6}; rank 5's {1, 3, 5, 7} into {1, 3} and {5, 7}. The second level,
// members 2 apart: {0, 4}, {2, 6}: the dense inter-instance group (dp_replicate 0 .. 3 and
// 4 .. 7 the instances, ranks 4 apart). With tp=4, ep=2, etp=1 on dp_replicate=4 (16 ranks;
// the expert RankGenerator's rank = e + 2 x expert-DP index, etp 1) rank 0's expert-DP group
// {0, 2, .., 14} (8 members) cuts into {0, 2, 4, 6} and {8, .., 14}, across them {0, 8}, the
// dense instances' stride (dp_replicate 0, 1 and 2, 3: rank 9's dense instance {9, 13}).
TEST(MoeDopt, ExpertDpCutIntoInstanceSlices) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_replicate=8,ep=2,dopt=2", 8, &m), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(Ranks(m, MP_GROUP_EDP, 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(Ranks(m, MP_GROUP_EDOPT, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(Ranks(m, MP_GROUP_EDOPT, 6), (std::vector<int>{4, 6}));
  EXPECT_EQ(Ranks(m, MP_GROUP_EDOPT, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(Ranks(m, MP_GROUP_DOPT, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(Ranks(m, MP_GROUP_DOPT_INTER, 2), (std::vector<int>{2, 6}));
  EXPECT_EQ(Ranks(m, MP_GROUP_EP, 5), (std::vector<int>{4, 5}));
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_replicate=4,tp=4,ep=2,etp=1,dopt=2", 16, &m), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(Ranks(m, MP_GROUP_EDP, 0), (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(Ranks(m, MP_GROUP_EDOPT, 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(Ranks(m, MP_GROUP_EDOPT, 9), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(Ranks(m, MP_GROUP_DOPT, 9), (std::vector<int>{9, 13}));
  EXPECT_EQ(Ranks(m, MP_GROUP_DOPT_INTER, 0), (std::vector<int>{0, 8}));
}

// dp_replicate=8, ep=2, dopt=2, Mixtral 8x7B (N parameters, E routed): a rank holds the
// dense D = N - E whole and its ep rank's half of the experts, e = E / 2. The dense weights'
// optimizer over the instance's 4 ranks, the experts' over the instance's 2 of their
// expert-DP group of 4: the fp32 masters and Adam state (4 + 8 bytes) on D / 4 + e / 2
// parameters, against D / 8 + e / 4 with one instance (expert_grid_test.cc); the bf16
// weights (2) and fp32 main gradients (4) whole. Gradients: the dense 4 D bytes
// reduce-scattered over the instance (dopt), the experts' 4 e over their slice (edopt), and
// each rank's shard all-reduced across the 2 instances: 4 D / 4 + 4 e / 2 = D + 2 e bytes
// (every bucket divides: a block's dense weights 2 x 4096^2 + 2 x 4096 x 1024 + 2 x 4096 +
// 8 x 4096, its experts' 4 x 3 x 4096 x 14336, the root's 2 x 32000 x 4096 + 4096). The
// updated bf16 weights all-gathered the same way: 2 D over dopt, 2 e over edopt. Nothing
// over the whole expert-DP group or dp_replicate. Without overlap one bucket a kind (2
// all-reduces across); with it one a block for the experts (32) and one a block plus the
// root's for the dense weights (33), each followed by its all-reduce (65).
TEST(MoeDopt, ExpertOptimizerAndGradientsInsideTheInstance) {
  for (int overlap = 0; overlap <= 1; overlap++) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    Built b;
    sched_test::Build(&b, Mixtral("dp_replicate=8,ep=2,dopt=2", overlap));
    const mp_model &m = b.model;
    const int64_t E = RoutedExperts(m), D = mp_model_param_count(&m) - E, e = E / 2;
    ASSERT_EQ(D % 4, 0);
    ASSERT_EQ(e % 2, 0);
    const int64_t shard = D / 4 + e / 2;
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_PARAMS], 2 * (D + e) + 4 * shard);
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_OPTIMIZER], 8 * shard);
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_GRADS], 4 * (D + e));
    mp_schedule_totals t;
    mp_schedule_totals_compute(b.s, &t);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_DOPT], 4.0 * D);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_EDOPT], 4.0 * e);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_REDUCE][MP_GROUP_DOPT_INTER], 1.0 * D + 2.0 * e);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_DOPT], 2.0 * D);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_EDOPT], 2.0 * e);
    EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_EDOPT], overlap ? m.n_layers : 1);
    EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_DOPT], overlap ? m.n_layers + 1 : 1);
    EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_DOPT_INTER], overlap ? 2 * m.n_layers + 1 : 2);
    for (mp_group g : {MP_GROUP_EDP, MP_GROUP_DP_REPLICATE})
      for (mp_coll c : {MP_COLL_REDUCE_SCATTER, MP_COLL_ALL_GATHER, MP_COLL_ALL_REDUCE})
        EXPECT_EQ(t.n_comm[c][g], 0) << mp_group_name(g) << " " << c;
  }
}

// Each expert-bucket all-reduce across the instances runs on the reduce stream in the last
// micro-batch right behind its slice's reduce-scatter, a half of it (a slice of 2):
// Megatron's start_grad_sync issues both in order on the bucket group's stream.
TEST(MoeDopt, ExpertShardAllReducedBehindItsReduceScatter) {
  Built b;
  Opts o = Mixtral("dp_replicate=8,ep=2,dopt=2", 1);
  o.global_batch = 16;  // two micro-batches: the reductions only in the last
  sched_test::Build(&b, o);
  const std::vector<sched_test::Inst> ops = sched_test::Expand(b.s);
  int behind = 0;
  for (const sched_test::Inst &x : ops) {
    const mp_op *op = x.op;
    if (op->type != MP_OP_COMM || op->coll != MP_COLL_ALL_REDUCE || op->group != MP_GROUP_DOPT_INTER) continue;
    EXPECT_EQ(op->when, MP_WHEN_LAST_MICRO);
    EXPECT_EQ(op->stream, MP_STREAM_REDUCE);
    ASSERT_EQ(x.deps.size(), 1u);
    const mp_op *rs = ops[x.deps[0]].op;
    EXPECT_EQ(rs->coll, MP_COLL_REDUCE_SCATTER);
    if (rs->group == MP_GROUP_EDOPT) {
      EXPECT_EQ(rs->bytes, 2.0 * op->bytes);
      behind++;
    }
  }
  EXPECT_EQ(behind, (int)b.model.n_layers);
}

// dp_replicate=8, ep=4, dopt=2: expert-DP 2 (ranks 4 apart), one member an instance. The
// slice reduce-scatters and gathers nothing and the optimizer steps the rank's experts whole
// (e = E / 4: 12 bytes on each); their 4 e bytes of gradients are all-reduced whole across
// the 2 instances (Megatron's reduce-scatter over a group of one leaves the bucket as it is).
// The dense weights as above, over instances of 4: 4 D / 4 = D bytes across.
TEST(MoeDopt, SliceOfOneRankStillAllReducesAcross) {
  Built b;
  sched_test::Build(&b, Mixtral("dp_replicate=8,ep=4,dopt=2", 1));
  const mp_model &m = b.model;
  const int64_t E = RoutedExperts(m), D = mp_model_param_count(&m) - E, e = E / 4;
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_EDOPT), 1);
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_OPTIMIZER], 8 * (D / 4 + e));
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_EDOPT] + t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_EDOPT], 0);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_REDUCE][MP_GROUP_DOPT_INTER], 1.0 * D + 4.0 * e);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_DOPT_INTER], 2 * m.n_layers + 1);
}

// Megatron-Core asserts that the instances divide the expert-DP size: dp_replicate=8 with
// ep=8 leaves each expert on one rank of the stage (expert-DP 1), which 2 instances cannot
// cut; with 4 instances ep=4 (expert-DP 2) neither.
TEST(MoeDopt, InstancesNotDividingExpertDpRefused) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  EXPECT_EQ(mp_mesh_parse(&ctx, "dp_replicate=8,ep=8,dopt=2", 8, &m), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("dopt=2 does not divide the expert-DP size 1"), std::string::npos)
      << mp_errmsg(&ctx);
  EXPECT_EQ(mp_mesh_parse(&ctx, "dp_replicate=8,ep=4,dopt=4", 8, &m), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("dopt=4 does not divide the expert-DP size 2"), std::string::npos)
      << mp_errmsg(&ctx);
}

}  // namespace
