// Transformer Engine's "bulk" overlaps under Megatron-Core's --tp-comm-overlap (exec/
// schedule_ops.c, bulk_tp): TE's _LayerNormLinear.backward (transformer_engine/pytorch/
// module/layernorm_linear.py v2.2, ub_bulk_dgrad and ub_bulk_wgrad, which initialize_ub's
// default config runs for qkv and fc1) all-gathers the saved norm output beside the
// input-gradient GEMM and reduce-scatters the input gradient beside the weight-gradient GEMM,
// the main stream waiting for each collective where its GEMM ends. Read off a block's
// backward against the mechanism, by hand.
#include <gtest/gtest.h>

#include <vector>

#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Inst;
using sched_test::Megatron;
using sched_test::Opts;

// Block 3's backward ops, in issue order.
std::vector<const mp_op *> Backward3(const Opts &o, Built *b) {
  sched_test::Build(b, o);
  std::vector<const mp_op *> v;
  for (const Inst &x : sched_test::Expand(b->s))
    if (x.layer == 3 && x.op->phase == MP_PHASE_BACKWARD) v.push_back(x.op);
  return v;
}

bool IsTp(const mp_op *op, mp_coll c) {
  return op->type == MP_OP_COMM && op->group == MP_GROUP_TP && op->coll == c;
}

}  // namespace

// llama3.1-8b on tp=8 with SP, 4096 tokens a micro-batch (H 4096): each region the block's
// backward enters (q, k, v after the attention core; gate, up after down) opens with the
// re-gather of its saved input, 4096 x 4096 bf16 = 33,554,432 bytes, on the compute stream
// marked bulk, then the region's GEMMs (three input-gradient and three weight-gradient ones
// for q, k, v; two and two for gate, up), all marked bulk, then the input gradient's
// reduce-scatter (the same bytes) on the compute stream marked bulk; the norm backward that
// consumes the input gradient comes next on that stream, after it. No other op of the
// block is marked: o's and down's output-gradient all-gathers are the pipelined pairs.
TEST(TpBulk, MegatronRegionsRunTheirCollectivesBesideTheirGemms) {
  Built b;
  Opts o = Megatron("tp=8");
  o.async_tp = 1;
  const std::vector<const mp_op *> v = Backward3(o, &b);
  const double bytes = 2.0 * 4096 * 4096;
  int regions = 0;
  for (size_t i = 0; i < v.size(); i++) {
    if (v[i]->fused != MP_FUSE_BULK || !IsTp(v[i], MP_COLL_ALL_GATHER)) continue;
    const mp_op *ag = v[i];
    EXPECT_EQ(ag->stream, MP_STREAM_COMPUTE);
    EXPECT_EQ(ag->bytes, bytes);
    int dgrad = 0, wgrad = 0;
    size_t j = i + 1;
    for (; j < v.size() && !(v[j]->type == MP_OP_COMM && v[j]->stream == MP_STREAM_COMPUTE); j++) {
      if (v[j]->type != MP_OP_COMPUTE || v[j]->kernel != MP_KERNEL_GEMM) continue;
      EXPECT_EQ(v[j]->fused, MP_FUSE_BULK);
      (v[j]->variant == MP_VAR_DGRAD ? dgrad : wgrad)++;
    }
    const int want = ag->module == MP_MOD_Q ? 3 : 2;
    EXPECT_EQ(ag->module == MP_MOD_Q || ag->module == MP_MOD_UP, true);
    EXPECT_EQ(dgrad, want);
    EXPECT_EQ(wgrad, want);
    ASSERT_LT(j, v.size());
    EXPECT_TRUE(IsTp(v[j], MP_COLL_REDUCE_SCATTER));
    EXPECT_EQ(v[j]->fused, MP_FUSE_BULK);
    EXPECT_EQ(v[j]->bytes, bytes);
    size_t k = j + 1;
    while (k < v.size() && v[k]->type != MP_OP_COMPUTE) k++;
    ASSERT_LT(k, v.size());
    EXPECT_EQ(v[k]->kernel, MP_KERNEL_NORM);
    EXPECT_EQ(v[k]->module, ag->module == MP_MOD_Q ? MP_MOD_ATTN_NORM : MP_MOD_FFN_NORM);
    regions++;
  }
  EXPECT_EQ(regions, 2);
  int marked = 0;
  for (const mp_op *op : v) marked += op->fused == MP_FUSE_BULK;
  EXPECT_EQ(marked, 2 * 2 + 6 + 4);
}

// Without --tp-comm-overlap Megatron's re-gather runs on the gather stream after the op
// before it, the reduce-scatter on the compute stream after the region's GEMMs, nothing
// marked; torchtitan's AsyncTP has no re-gather (it keeps the gathered input) and no bulk
// overlap.
TEST(TpBulk, NoneWithoutMegatronsTpCommOverlap) {
  Built plain;
  const std::vector<const mp_op *> v = Backward3(Megatron("tp=8"), &plain);
  int gathers = 0;
  for (const mp_op *op : v) {
    EXPECT_NE(op->fused, MP_FUSE_BULK);
    if (!IsTp(op, MP_COLL_ALL_GATHER) || (op->module != MP_MOD_Q && op->module != MP_MOD_UP)) continue;
    EXPECT_EQ(op->stream, MP_STREAM_GATHER);
    EXPECT_EQ(op->n_dep, 1);
    gathers++;
  }
  EXPECT_EQ(gathers, 2);
  Built tt;
  Opts o;
  o.mesh = "tp=8";
  o.async_tp = 1;
  for (const mp_op *op : Backward3(o, &tt)) EXPECT_NE(op->fused, MP_FUSE_BULK);
}
