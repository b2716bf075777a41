// Megatron FSDP's hybrid sharding (Megatron-Core's --use-megatron-fsdp, optim_grads_params,
// with --num-distributed-optimizer-instances N, core_v0.14.0), what dp_replicate = N over
// dp_shard > 1 runs under the megatron memory model, against hand counts from
// megatron/core/distributed/fsdp/mcore_fsdp_adapter.py (_init_dist_index: the
// intra-instance dp x cp group shards, the inter-instance group is the outer one),
// param_and_grad_buffer.py (_init_each_parameter_group_buffers: with the default
// outer_dp_sharding_strategy no_shard every buffer is cut over the intra-instance group
// only; _bucket_group_gradient_reduce: the reduce-scatter inside the instance every
// micro-batch, the all-reduce of the main-gradient shard across instances on the last) and
// parallel_state.py (the dp x cp ranks cut into N consecutive intra-instance groups).
#include <gtest/gtest.h>

#include <string>

#include "exec/mesh.h"
#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Inst;
using sched_test::Opts;

// llama3.1-8b (megatron_fsdp_test.cc): 8,030,261,248 parameters, a layer 218,112,000, the
// embedding, output layer and final norm 2 x 525,336,576 + 4,096; every row count divides by
// 8, so a quarter of each is exact.
constexpr int64_t kParams = 8030261248LL, kBlock = 218112000LL, kRoot = 2 * 525336576LL + 4096;

Opts Hsdp(const char *mesh) {
  Opts o = sched_test::Megatron(mesh);
  o.dist_opt = 1;
  o.dp_overlap = 1;
  return o;
}

// dp_replicate=2 x dp_shard=4 on 8 ranks: each rank's shard is a quarter, 2,007,565,312
// parameters, twice dp_shard=8's eighth; per parameter the bf16 model weights' 2 and fp32
// main weights' 4 bytes, the main gradients' 4 (fp32, grad_reduce_in_fp32) or 2 (bf16, as
// Megatron-Bridge's Llama 3.1 recipes set grad_reduce_in_fp32 False), Adam's 8.
TEST(MegatronHsdp, StateShardedInsideTheInstance) {
  const int64_t q = kParams / 4;
  Built b;
  sched_test::Build(&b, Hsdp("dp_replicate=2,dp_shard=4"));
  ASSERT_TRUE(mp_plan_is_megatron_fsdp(b.plan));
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_PARAMS], 6 * q);
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_GRADS], 4 * q);
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_OPTIMIZER], 8 * q);
  Built e;
  sched_test::Build(&e, Hsdp("dp_shard=8"));
  EXPECT_EQ(e.s->resident_bytes[MP_MEM_OPTIMIZER] * 2, b.s->resident_bytes[MP_MEM_OPTIMIZER]);
  Built h;
  Opts o = Hsdp("dp_replicate=2,dp_shard=4");
  o.reduce_dtype = MP_DTYPE_BF16;
  sched_test::Build(&h, o);
  EXPECT_EQ(h.s->resident_bytes[MP_MEM_GRADS], 2 * q);
  EXPECT_EQ(h.s->resident_bytes[MP_MEM_PARAMS], 6 * q);
}

// Megatron's groups on dp_replicate=2, dp_shard=4, tp=2 (16 ranks, tp innermost): the data
// parallel ranks of tp rank 0 are 0, 2, .., 14; parallel_state cuts them into 2 consecutive
// intra-instance groups {0, 2, 4, 6} and {8, .., 14}, and the inter-instance group strides
// them: {0, 8}. The mesh's dp_shard (FSDP) and dp_replicate groups are those.
TEST(MegatronHsdp, GroupsAreMegatronsInstances) {
  Built b;
  sched_test::Build(&b, Hsdp("dp_replicate=2,dp_shard=4,tp=2"));
  int r[16];
  ASSERT_EQ(mp_mesh_group_ranks(&b.plan->mesh, MP_GROUP_FSDP, 0, r), 4);
  EXPECT_EQ(std::vector<int>(r, r + 4), (std::vector<int>{0, 2, 4, 6}));
  ASSERT_EQ(mp_mesh_group_ranks(&b.plan->mesh, MP_GROUP_FSDP, 9, r), 4);
  EXPECT_EQ(std::vector<int>(r, r + 4), (std::vector<int>{9, 11, 13, 15}));
  ASSERT_EQ(mp_mesh_group_ranks(&b.plan->mesh, MP_GROUP_DP_REPLICATE, 0, r), 2);
  EXPECT_EQ(std::vector<int>(r, r + 2), (std::vector<int>{0, 8}));
}

struct Colls {
  int ag_block = 0, ag_root = 0, rs_block = 0, rs_root = 0, ar_block = 0, ar_root = 0, other = 0;
};

// Two micro-batches (global batch 16 over 8 data-parallel ranks). A micro-batch's ops: each
// layer's bf16 weights (2 x 218,112,000 bytes) gathered over the instance's 4 ranks before
// its forward and its backward, its fp32 gradients (4 x 218,112,000) reduce-scattered over
// them after its backward, every micro-batch; the root's 2 x and 4 x 1,050,677,248 once
// each; in the last micro-batch only, each unit's fp32 main-gradient shard all-reduced over
// the 2 instances: a layer's 4 x 218,112,000 / 4 = 218,112,000 bytes, the root's
// 1,050,677,248. The bucket's buffer is freed once its reduce-scatter is done (the
// all-reduce works on the resident shard).
TEST(MegatronHsdp, ReduceScatterInsideAllReduceAcrossLastMicroBatch) {
  Built b;
  Opts o = Hsdp("dp_replicate=2,dp_shard=4");
  o.global_batch = 16;
  sched_test::Build(&b, o);
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_FSDP), 4);
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_DP_REPLICATE), 2);
  const std::vector<Inst> ops = sched_test::Expand(b.s);
  Colls c;
  int frees = 0;
  for (const Inst &x : ops) {
    const mp_op *op = x.op;
    if (op->type == MP_OP_FREE && op->stream == MP_STREAM_REDUCE && op->mem_cat == MP_MEM_TEMP &&
        op->mem_bytes == 4 * kBlock) {
      frees++;
      ASSERT_EQ(x.deps.size(), 1u);
      EXPECT_EQ(ops[x.deps[0]].op->coll, MP_COLL_REDUCE_SCATTER);
    }
    if (op->type != MP_OP_COMM || op->group == MP_GROUP_WORLD) continue;
    if (op->coll == MP_COLL_ALL_GATHER && op->group == MP_GROUP_FSDP && op->dtype == MP_DTYPE_BF16) {
      EXPECT_EQ(op->when, MP_WHEN_EVERY_MICRO);
      (op->bytes == 2.0 * kBlock ? c.ag_block : op->bytes == 2.0 * kRoot ? c.ag_root : c.other)++;
    } else if (op->coll == MP_COLL_REDUCE_SCATTER && op->group == MP_GROUP_FSDP && op->dtype == MP_DTYPE_FP32) {
      EXPECT_EQ(op->when, MP_WHEN_EVERY_MICRO);
      (op->bytes == 4.0 * kBlock ? c.rs_block : op->bytes == 4.0 * kRoot ? c.rs_root : c.other)++;
    } else if (op->coll == MP_COLL_ALL_REDUCE && op->group == MP_GROUP_DP_REPLICATE && op->dtype == MP_DTYPE_FP32) {
      EXPECT_EQ(op->when, MP_WHEN_LAST_MICRO);
      (op->bytes == 1.0 * kBlock ? c.ar_block : op->bytes == 1.0 * kRoot ? c.ar_root : c.other)++;
    } else {
      c.other++;
    }
  }
  EXPECT_EQ(c.ag_block, 32 * 2);
  EXPECT_EQ(c.ag_root, 1);
  EXPECT_EQ(c.rs_block, 32);
  EXPECT_EQ(c.rs_root, 1);
  EXPECT_EQ(c.ar_block, 32);
  EXPECT_EQ(c.ar_root, 1);
  EXPECT_EQ(c.other, 0);
  EXPECT_EQ(frees, 32);
}

// Megatron-Core v0.14.0's FSDPDistributedIndex gives expert parameters no group
// (get_fsdp_group and get_dp_group return None for them): the hybrid form with routed
// experts is refused by name.
TEST(MegatronHsdp, ExpertsRefused) {
  Built b;
  Opts o = Hsdp("dp_replicate=2,dp_shard=4,ep=2");
  o.model = "tiny-moe";
  o.seq = 64;
  ASSERT_EQ(sched_test::PlanOnly(&b, o), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find("hybrid sharding of routed experts"), std::string::npos)
      << mp_errmsg(&b.ctx);
}

}  // namespace
