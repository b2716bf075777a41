// Where Transformer Engine's delayed scaling reduces its amaxes (exec/schedule_ops.c,
// mp_sched_f8_amax_reduce), against hand counts on Llama 3.1 8B: over the data-parallel group
// by default (Megatron-Core's amax-reduction group), over the TP group alone under
// NVTE_DP_AMAX_REDUCE_INTERVAL=0 with Transformer Engine v0.13 to v1.5
// (transformer_engine/pytorch/fp8.py global_amax_reduction, v1.5: "If
// `NVTE_DP_AMAX_REDUCE_INTERVAL` is set to 0, AMAX is reduced only in TP domain"; at TP 1 it
// returns without a reduction), and the refusals.
#include <gtest/gtest.h>

#include <string>

#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Inst;
using sched_test::Opts;

// llama3.1-8b's float8 Linears in a layer: q, k, v, o, gate, up and down, 7 modules. One
// chunk of 32 layers: the forward's all-reduce carries an fp32 amax of each module's input
// and weight, 4 x 2 x 7 x 32 = 1,792 bytes; the backward's one of each output gradient,
// 4 x 7 x 32 = 896 bytes.
constexpr double kFwd = 1792.0, kBwd = 896.0;

Opts Delayed(const char *mesh, int amax_tp) {
  Opts o = sched_test::Megatron(mesh);
  o.fp8 = 1;
  o.fp8_recipe = MP_FP8_DELAYED;
  o.global_batch = 8;
  o.fp8_amax_tp = amax_tp;
  return o;
}

struct Count {
  int fwd = 0, bwd = 0, other = 0;  // amax all-reduces by phase; fp32 all-reduces of other sizes
  mp_group group = MP_GROUP_COUNT;  // the amax all-reduces' group (one group for all)
  int mixed = 0;                    // 1: they ran on more than one group
};

Count Amax(const mp_schedule *s) {
  Count c;
  for (const Inst &x : sched_test::Expand(s)) {
    const mp_op *op = x.op;
    if (op->type != MP_OP_COMM || op->coll != MP_COLL_ALL_REDUCE || op->dtype != MP_DTYPE_FP32) continue;
    const int fwd = op->phase == MP_PHASE_FORWARD && op->bytes == kFwd;
    const int bwd = op->phase == MP_PHASE_BACKWARD && op->bytes == kBwd;
    if (!fwd && !bwd) continue;
    c.fwd += fwd;
    c.bwd += bwd;
    if (c.group != MP_GROUP_COUNT && c.group != (mp_group)op->group) c.mixed = 1;
    c.group = (mp_group)op->group;
  }
  return c;
}

// dp_replicate 2 x tp 4: each micro-batch's forward and backward reduce once each, over the
// data-parallel group (2 ranks) by default and over the TP group (4 ranks) with the option;
// the same count either way.
TEST(Fp8Amax, GroupFollowsTheInterval) {
  Built off, on;
  sched_test::Build(&off, Delayed("dp_replicate=2,tp=4", 0));
  sched_test::Build(&on, Delayed("dp_replicate=2,tp=4", 1));
  const Count a = Amax(off.s), b = Amax(on.s);
  ASSERT_GT(a.fwd, 0);
  EXPECT_EQ(a.fwd, a.bwd);
  EXPECT_EQ(b.fwd, a.fwd);
  EXPECT_EQ(b.bwd, a.bwd);
  EXPECT_EQ(a.group, MP_GROUP_DP_CP);
  EXPECT_EQ(b.group, MP_GROUP_TP);
  EXPECT_EQ(a.mixed + b.mixed, 0);
}

// At TP 1 Transformer Engine has no TP group to reduce over and skips the reduction.
TEST(Fp8Amax, NoneAtTp1) {
  Built off, on;
  sched_test::Build(&off, Delayed("dp_replicate=8", 0));
  sched_test::Build(&on, Delayed("dp_replicate=8", 1));
  EXPECT_GT(Amax(off.s).fwd, 0);
  const Count b = Amax(on.s);
  EXPECT_EQ(b.fwd + b.bwd, 0);
}

// The option is delayed scaling's: refused under current scaling and on torchtitan.
TEST(Fp8Amax, Refused) {
  Opts cur = Delayed("dp_replicate=2,tp=4", 1);
  cur.fp8_recipe = MP_FP8_TENSORWISE;
  Built b;
  EXPECT_NE(sched_test::PlanOnly(&b, cur), MP_OK);
  EXPECT_NE(std::string(b.ctx.msg).find("NVTE_DP_AMAX_REDUCE_INTERVAL"), std::string::npos) << b.ctx.msg;
  Opts tt = Delayed("dp_replicate=2,tp=4", 1);
  tt.mem_model = MP_MEM_MODEL_TORCHTITAN;
  Built c;
  EXPECT_NE(sched_test::PlanOnly(&c, tt), MP_OK);
}

}  // namespace
