// FSDP's gradient reduction dtype against hand derivations: bf16 reduction (FSDP1's
// MixedPrecision(reduce_dtype=torch.bfloat16), as IBM's fms-fsdp runs it:
// fms_fsdp/policies/mixed_precision.py bfSixteen) halves the bytes each block's
// reduce-scatter and HSDP all-reduce move and the reduce-scatter's input buffer, and keeps
// the resident sharded gradients in fp32 (FSDP1 casts the reduced shard to the flat
// parameter's dtype, FSDP2's foreach_reduce to the sharded parameter's); Megatron's bf16
// main_grad buffers (--grad-reduce-in-bf16); the refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <string>

#include "tests/schedule/built.h"

namespace {

using sched_test::Build;
using sched_test::Built;
using sched_test::Opts;
using sched_test::PlanOnly;

// Llama 3.1 8B under HSDP, dp_shard 4 within a replica, 2 replicas. One block's parameters
// (H 4096, 8 KV heads of 128, FFN 14336): q and o 2 x 4096^2 33,554,432, k and v
// 2 x 1024 x 4096 8,388,608, gate, up and down 3 x 14336 x 4096 176,160,768, the two norms
// 8192: 218,112,000 elements; a rank's shard of it 218,112,000 / 4 = 54,528,000.
const int64_t kBlock = 218112000, kShard = kBlock / 4;
const int64_t kParams = 8030261248LL;  // the model, embedding and head untied

Opts Hsdp(mp_dtype reduce) {
  Opts o;
  o.mesh = "dp_replicate=2,dp_shard=4";
  o.reduce_dtype = reduce;
  return o;
}

struct BlockComm {
  double rs_bytes = 0, ar_bytes = 0;
};

// Block 7's reduce-scatter over dp_shard and its all-reduce over dp_replicate.
BlockComm Block7(const mp_schedule *s) {
  BlockComm c;
  for (const sched_test::Inst &x : sched_test::Expand(s)) {
    if (x.layer != 7 || x.op->phase != MP_PHASE_BACKWARD) continue;
    if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_REDUCE_SCATTER) c.rs_bytes += x.op->bytes;
    if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_REDUCE && x.op->group == MP_GROUP_DP_REPLICATE)
      c.ar_bytes += x.op->bytes;
  }
  return c;
}

TEST(FsdpReduce, Bf16HalvesTheGradientCollectives) {
  Built f32, b16;
  Build(&f32, Hsdp(MP_DTYPE_FP32));
  Build(&b16, Hsdp(MP_DTYPE_BF16));
  const BlockComm a = Block7(f32.s), b = Block7(b16.s);
  EXPECT_EQ(a.rs_bytes, 4.0 * kBlock);  // 872,448,000: the block's gradients in fp32
  EXPECT_EQ(b.rs_bytes, 2.0 * kBlock);  // 436,224,000 in bf16
  EXPECT_EQ(a.ar_bytes, 4.0 * kShard);  // the reduced shard across the two replicas
  EXPECT_EQ(b.ar_bytes, 2.0 * kShard);
  // the all-gathers carry bf16 parameters either way
  mp_schedule_totals ta, tb;
  mp_schedule_totals_compute(f32.s, &ta);
  mp_schedule_totals_compute(b16.s, &tb);
  EXPECT_DOUBLE_EQ(ta.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_FSDP],
                   tb.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_FSDP]);
  EXPECT_DOUBLE_EQ(tb.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_FSDP],
                   ta.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_FSDP] / 2);
  // resident: the sharded gradients stay fp32, kParams / 4 ranks x 4 bytes
  EXPECT_EQ(f32.s->resident_bytes[MP_MEM_GRADS], kParams / 4 * 4);
  EXPECT_EQ(b16.s->resident_bytes[MP_MEM_GRADS], kParams / 4 * 4);
}

// The reduce-scatter's input: the block's unsharded gradients copied into one reduce-dtype
// buffer (FSDP2's reduce_scatter_input, FSDP1's padded flat gradient), 4 x 218,112,000 bytes
// in fp32, 2 x in bf16, freed on the reduce stream once the collectives that read it are done
// (the only TEMP buffer a block frees there).
TEST(FsdpReduce, Bf16ReduceScatterInputIsHalf) {
  int64_t in[2] = {0, 0};
  const mp_dtype d[2] = {MP_DTYPE_FP32, MP_DTYPE_BF16};
  for (int k = 0; k < 2; k++) {
    Built b;
    Build(&b, Hsdp(d[k]));
    for (const sched_test::Inst &x : sched_test::Expand(b.s))
      if (x.layer == 7 && x.op->type == MP_OP_FREE && x.op->mem_cat == MP_MEM_TEMP &&
          x.op->stream == MP_STREAM_REDUCE)
        in[k] += x.op->mem_bytes;
  }
  EXPECT_EQ(in[0], 4 * kBlock);
  EXPECT_EQ(in[1], 2 * kBlock);
}

// Megatron's DDP with --grad-reduce-in-bf16 (DistributedDataParallelConfig.grad_reduce_in_fp32
// False, core_v0.14.0 distributed_data_parallel.py: grad_dtype the parameters' bf16): the
// main_grad buffer, whole on every rank with or without the distributed optimizer, holds
// kParams x 2 bytes where fp32 holds x 4, and the all-reduce over dp_replicate 8 moves the
// same halving (Megatron's DDP all-reduces the whole buffer without the distributed optimizer).
TEST(FsdpReduce, MegatronBf16MainGradsAreHalf) {
  int64_t grads[2][2];
  double ar[2] = {0, 0};
  const mp_dtype d[2] = {MP_DTYPE_FP32, MP_DTYPE_BF16};
  for (int k = 0; k < 2; k++)
    for (int dist = 0; dist < 2; dist++) {
      Built b;
      Opts o;
      o.mesh = "dp_replicate=8", o.mem_model = MP_MEM_MODEL_MEGATRON, o.reduce_dtype = d[k], o.dist_opt = dist;
      Build(&b, o);
      grads[k][dist] = b.s->resident_bytes[MP_MEM_GRADS];
      if (dist) continue;
      mp_schedule_totals t;
      mp_schedule_totals_compute(b.s, &t);
      ar[k] = t.comm_bytes[MP_COLL_ALL_REDUCE][MP_GROUP_DP_REPLICATE];
    }
  for (int dist = 0; dist < 2; dist++) {
    EXPECT_EQ(grads[0][dist], kParams * 4);  // 32,121,044,992
    EXPECT_EQ(grads[1][dist], kParams * 2);  // 16,060,522,496
  }
  EXPECT_GT(ar[1], 0);
  EXPECT_DOUBLE_EQ(ar[1], ar[0] / 2);
}

// The DDP note states the main gradients' dtype and the bytes a parameter: with the
// distributed optimizer 2 (bf16 parameter) + 2 (bf16 main gradient) = 4 whole, and the fp32
// master and m, v (12) over d; without it 2 + 2 + 12 = 16 at rest.
TEST(FsdpReduce, MegatronBf16MainGradsNoted) {
  const char *want[2] = {"ZeRO-1: 4 + 12/d bytes a parameter", "(16 bytes a parameter at rest)"};
  for (int dist = 1; dist >= 0; dist--) {
    Built b;
    Opts o;
    o.mesh = "dp_replicate=8", o.mem_model = MP_MEM_MODEL_MEGATRON, o.reduce_dtype = MP_DTYPE_BF16, o.dist_opt = dist;
    ASSERT_EQ(PlanOnly(&b, o), MP_OK) << mp_errmsg(&b.ctx);
    bool noted = false;
    for (int i = 0; i < b.plan->n_notes; i++)
      noted |= strstr(b.plan->notes[i], "bf16 main gradients") && strstr(b.plan->notes[i], want[1 - dist]);
    EXPECT_TRUE(noted) << want[1 - dist];
  }
}

// The reduce-scatters whose op averages (mp_op.avg, which keeps NCCL off PAT): FSDP2's
// ReduceOp.AVG in fp32 or bf16, Megatron's under --ddp-average-in-collective (its
// distributed optimizer's and Megatron FSDP's); FSDP1 and Megatron's default sum. Returns
// {reduce-scatters, of them averaging}; an all-reduce never averages here.
std::pair<int, int> AvgReduceScatters(const Opts &o) {
  Built b;
  Build(&b, o);
  std::pair<int, int> n{0, 0};
  for (int i = 0; i < b.s->n_ops; i++) {
    const mp_op &op = b.s->ops[i];
    if (op.type != MP_OP_COMM) continue;
    if (op.coll != MP_COLL_REDUCE_SCATTER) {
      EXPECT_EQ(op.avg, 0) << "op " << i;
      continue;
    }
    n.first++;
    n.second += op.avg;
  }
  return n;
}

TEST(FsdpReduce, AveragingReduceScatters) {
  for (mp_dtype r : {MP_DTYPE_FP32, MP_DTYPE_BF16}) {
    const auto fsdp2 = AvgReduceScatters(Hsdp(r));
    EXPECT_GT(fsdp2.first, 0);
    EXPECT_EQ(fsdp2.second, fsdp2.first);
  }
  Opts f1 = Hsdp(MP_DTYPE_FP32);
  f1.flat_params = 1;
  const auto fsdp1 = AvgReduceScatters(f1);
  EXPECT_GT(fsdp1.first, 0);
  EXPECT_EQ(fsdp1.second, 0);
  Opts m;
  m.mesh = "dp_replicate=8", m.mem_model = MP_MEM_MODEL_MEGATRON, m.dist_opt = 1, m.ddp_scale = 1;
  const auto sum = AvgReduceScatters(m);
  EXPECT_GT(sum.first, 0);
  EXPECT_EQ(sum.second, 0);
  m.ddp_scale = 0; /* --ddp-average-in-collective */
  const auto avg = AvgReduceScatters(m);
  EXPECT_EQ(avg.first, sum.first);
  EXPECT_EQ(avg.second, avg.first);
}

// Refusals: bf16 reduction where the meshplan runtime reduces fp32 slots, and a dtype none
// of the stacks reduces in.
TEST(FsdpReduce, RefusedOutsideTorchtitanAndMegatron) {
  const struct {
    mp_mem_model mm;
    mp_dtype r;
    const char *mesh;
    const char *words;
  } cases[] = {
      {MP_MEM_MODEL_MESHPLAN_CUDA, MP_DTYPE_BF16, "dp_shard=8", "meshplan runtime"},
      {MP_MEM_MODEL_TORCHTITAN, MP_DTYPE_FP16, "dp_shard=8", "choose fp32 or bf16"},
      {MP_MEM_MODEL_MEGATRON, MP_DTYPE_FP16, "dp_replicate=8", "choose fp32 or bf16"},
  };
  for (const auto &c : cases) {
    SCOPED_TRACE(c.words);
    Built b;
    Opts o;
    o.mesh = c.mesh, o.mem_model = c.mm, o.reduce_dtype = c.r;
    EXPECT_EQ(PlanOnly(&b, o), MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find(c.words), std::string::npos) << mp_errmsg(&b.ctx);
  }
}

}  // namespace
