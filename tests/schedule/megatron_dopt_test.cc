// Megatron-LM's DDP with the distributed optimizer in N instances (the mesh's dopt=N:
// --use-distributed-optimizer --num-distributed-optimizer-instances N, no FSDP), against hand
// counts from megatron/core/parallel_state.py at core_v0.14.0 (the data-parallel-with-cp
// ranks cut into N consecutive intra-instance groups, the inter-instance group striding
// them), param_and_grad_buffer.py (start_grad_sync: each bucket reduce-scattered over the
// instance, then the rank's shard all-reduced over the inter-instance group, both on one
// communication stream; start_param_sync: the parameters all-gathered over the instance) and
// distributed_data_parallel.py ('Partial DistOpt cannot be used without DistOpt').
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exec/mesh.h"
#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Inst;
using sched_test::Opts;

// llama3.1-8b (megatron_fsdp_test.cc): 8,030,261,248 parameters, a layer 218,112,000, the
// embedding, output layer and final norm 2 x 525,336,576 + 4,096; each divides by 8.
constexpr int64_t kParams = 8030261248LL, kBlock = 218112000LL, kRoot = 2 * 525336576LL + 4096;

Opts Dopt(const char *mesh) {
  Opts o = sched_test::Megatron(mesh);
  o.dist_opt = 1;
  o.dp_overlap = 1;
  return o;
}

// dp_replicate=8 in 2 instances: the optimizer shards over an instance's 4 ranks, each rank
// stepping kParams / 4 = 2,007,565,312 parameters where one instance of 8 steps kParams / 8:
// the bf16 weights 2 x kParams whole plus the fp32 masters 4 x shard; the fp32 main
// gradients 4 x kParams whole either way; Adam's m and v 8 x shard.
TEST(MegatronDopt, OptimizerShardedOverTheInstance) {
  const int64_t q = kParams / 4, e = kParams / 8;
  Built b, one;
  sched_test::Build(&b, Dopt("dp_replicate=8,dopt=2"));
  sched_test::Build(&one, Dopt("dp_replicate=8"));
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_PARAMS], 2 * kParams + 4 * q);
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_GRADS], 4 * kParams);
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_OPTIMIZER], 8 * q);
  EXPECT_EQ(one.s->resident_bytes[MP_MEM_PARAMS], 2 * kParams + 4 * e);
  EXPECT_EQ(one.s->resident_bytes[MP_MEM_OPTIMIZER], 8 * e);
}

// parallel_state.py's groups: dp_replicate=8, tp=2 (16 ranks, tp innermost): tp rank 0's
// data-parallel ranks 0, 2, .., 14 cut into {0, 2, 4, 6} and {8, .., 14}, the inter-instance
// group {0, 8}; with cp=2 (dp_replicate=4, cp=2 on 8 ranks) the dp-cp ranks 0 .. 7 cut into
// {0, 1, 2, 3} and {4, 5, 6, 7}, rank 1's inter-instance group {1, 5}.
TEST(MegatronDopt, GroupsAreMegatronsInstances) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_replicate=8,tp=2,dopt=2", 16, &m), MP_OK);
  int r[16];
  ASSERT_EQ(mp_mesh_group_ranks(&m, MP_GROUP_DOPT, 0, r), 4);
  EXPECT_EQ(std::vector<int>(r, r + 4), (std::vector<int>{0, 2, 4, 6}));
  ASSERT_EQ(mp_mesh_group_ranks(&m, MP_GROUP_DOPT, 9, r), 4);
  EXPECT_EQ(std::vector<int>(r, r + 4), (std::vector<int>{9, 11, 13, 15}));
  ASSERT_EQ(mp_mesh_group_ranks(&m, MP_GROUP_DOPT_INTER, 0, r), 2);
  EXPECT_EQ(std::vector<int>(r, r + 2), (std::vector<int>{0, 8}));
  ASSERT_EQ(mp_mesh_group_ranks(&m, MP_GROUP_DP_REPLICATE, 2, r), 8);
  EXPECT_EQ(std::vector<int>(r, r + 8), (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  int c[MP_MESH_NDIMS];
  mp_mesh_coords(&m, 10, c);
  EXPECT_EQ(c[MP_DIM_DP_REPLICATE], 5);
  EXPECT_EQ(mp_mesh_rank_of(&m, c), 10);
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_replicate=4,cp=2,dopt=2", 8, &m), MP_OK);
  ASSERT_EQ(mp_mesh_group_ranks(&m, MP_GROUP_DOPT, 0, r), 4);
  EXPECT_EQ(std::vector<int>(r, r + 4), (std::vector<int>{0, 1, 2, 3}));
  ASSERT_EQ(mp_mesh_group_ranks(&m, MP_GROUP_DOPT_INTER, 1, r), 2);
  EXPECT_EQ(std::vector<int>(r, r + 2), (std::vector<int>{1, 5}));
  char f[64];
  mp_mesh_format(&m, f, sizeof f);
  EXPECT_STREQ(f, "dp_replicate=4,cp=2,dopt=2");
}

// Two micro-batches (global batch 16 over 8 data-parallel ranks), a bucket a block: in the
// last micro-batch each layer's fp32 gradients (4 x 218,112,000 bytes) reduce-scattered over
// the instance's 4 ranks, then the rank's shard (4 x 218,112,000 / 4 = 218,112,000 bytes)
// all-reduced over the 2 instances right behind it; the root's 4 x and 1 x 1,050,677,248 the
// same; each layer's bf16 weights (2 x 218,112,000) all-gathered over the instance before
// its forward, the root's once. Nothing over all of dp_replicate.
TEST(MegatronDopt, ReduceScatterInsideAllReduceAcross) {
  Built b;
  Opts o = Dopt("dp_replicate=8,dopt=2");
  o.global_batch = 16;
  sched_test::Build(&b, o);
  const std::vector<Inst> ops = sched_test::Expand(b.s);
  int rs_block = 0, rs_root = 0, ar_block = 0, ar_root = 0, ag_block = 0, ag_root = 0, other = 0;
  for (const Inst &x : ops) {
    const mp_op *op = x.op;
    if (op->type != MP_OP_COMM || op->group == MP_GROUP_WORLD || op->group == MP_GROUP_DP_CP) continue;
    if (op->coll == MP_COLL_REDUCE_SCATTER && op->group == MP_GROUP_DOPT && op->dtype == MP_DTYPE_FP32) {
      EXPECT_EQ(op->when, MP_WHEN_LAST_MICRO);
      (op->bytes == 4.0 * kBlock ? rs_block : op->bytes == 4.0 * kRoot ? rs_root : other)++;
    } else if (op->coll == MP_COLL_ALL_REDUCE && op->group == MP_GROUP_DOPT_INTER) {
      EXPECT_EQ(op->when, MP_WHEN_LAST_MICRO);
      EXPECT_EQ(op->stream, MP_STREAM_REDUCE);
      ASSERT_EQ(x.deps.size(), 1u);
      EXPECT_EQ(ops[x.deps[0]].op->coll, MP_COLL_REDUCE_SCATTER);
      EXPECT_EQ(ops[x.deps[0]].op->bytes, 4.0 * op->bytes);
      (op->bytes == 1.0 * kBlock ? ar_block : op->bytes == 1.0 * kRoot ? ar_root : other)++;
    } else if (op->coll == MP_COLL_ALL_GATHER && op->group == MP_GROUP_DOPT) {
      (op->bytes == 2.0 * kBlock ? ag_block : op->bytes == 2.0 * kRoot ? ag_root : other)++;
    } else {
      other++;
    }
  }
  EXPECT_EQ(rs_block, 32);
  EXPECT_EQ(rs_root, 1);
  EXPECT_EQ(ar_block, 32);
  EXPECT_EQ(ar_root, 1);
  EXPECT_EQ(ag_block, 32);
  EXPECT_EQ(ag_root, 1);
  EXPECT_EQ(other, 0);
}

// o's plan refused as invalid with a message holding `why`.
void ExpectRefused(const Opts &o, const char *why) {
  Built b;
  ASSERT_EQ(sched_test::PlanOnly(&b, o), MP_ERR_INVALID) << o.mesh;
  EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find(why), std::string::npos) << mp_errmsg(&b.ctx);
}

// Megatron asserts the distributed optimizer under instances; FSDP (dp_shard), instances not
// dividing the routed experts' expert-DP size (dp_replicate=8 with ep=8: 1) and instances not
// dividing dp_replicate are refused by name (moe_dopt_test.cc holds the experts' instances).
TEST(MegatronDopt, Refusals) {
  Opts o = Dopt("dp_replicate=8,dopt=2");
  o.dist_opt = 0;
  ExpectRefused(o, "without the distributed optimizer");
  ExpectRefused(Dopt("dp_replicate=2,dp_shard=4,dopt=2"), "Megatron FSDP's instances");
  Opts e = Dopt("dp_replicate=8,ep=8,etp=1,dopt=2");
  e.model = "tiny-moe";
  e.seq = 64;
  ExpectRefused(e, "does not divide the expert-DP size 1");
  ExpectRefused(Dopt("dp_replicate=6,dopt=4"), "does not divide dp_replicate=6");
}

}  // namespace
