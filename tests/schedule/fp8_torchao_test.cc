// What torchao's tensorwise float8 Linears copy and cast in a torchtitan block beyond the
// per-Linear casts (exec/schedule_ops.c: dy_copies, f8_row_input, amax_kept), derived by
// hand from the source of the June 2025 torchtitan AsyncTP benchmark (torchao 6243040,
// torchtitan 820504e):
//
// - Output gradient: matmul_with_hp_or_float8_args.backward (float8/float8_linear.py) hands
//   the E5M2 gradient to the input gradient's GEMM row-major and to the weight gradient's as
//   dy^T, which preprocess_addmm (float8/float8_ops.py) copies contiguous; the cast writes
//   both copies from one read (torchao's roofline_utils.py: "read in bf16, write twice in
//   float8"): 2 + 1 + 1 + the amax read 2 = 6 bytes an element, where the one-copy cast was 5.
// - A rowwise-parallel Linear's input under float8 TP (o and down): Float8RowwiseParallel
//   casts it before the Linear runs (float8/float8_tensor_parallel.py), the Linear saves the
//   float8 tensor and its backward takes it as it is, the weight gradient's second operand
//   being its transposed copy (b_data.t().contiguous().t()): 1 byte read + 1 written, where
//   a cast of the bf16 input read 2 + 2 and wrote 1. So is the weight under tensorwise:
//   Float8Linear.forward casts it once and the autograd function saves the float8 copy,
//   whose transpose is the input gradient's second operand.
// - torchtitan's op-level SAC saves aten.max.default's outputs, torchao's tensorwise amaxes
//   (torch.max(torch.abs(x)), float8_utils.py tensor_to_amax): the recompute casts from the
//   kept amax, 2 + 1 = 3 bytes an element; under full AC, or rowwise (torch.amax along a
//   dim, another op), the amax pass runs again: 5.
// - The rowwise recipe's Linears under torchtitan's plain TP are DTensors as well: each
//   amax is torch.amax(torch.abs(x), dim) (float8_utils.py tensor_to_amax), a partial max
//   where TP shards that dim, all-reduced over tp as a bf16 vector before the scale.
#include <gtest/gtest.h>

#include <vector>

#include "tests/schedule/built.h"

using namespace sched_test;

namespace {

constexpr double T = 8192, H = 4096, f = 14336;  // llama3.1-8b, seq 8192, micro-batch 1

// Layer 5's float8 casts and transposes (kernel FP8_CAST) of Linear `module` in `phase`,
// bytes in schedule order.
std::vector<double> CastBytes(const mp_schedule *s, int module, mp_phase phase) {
  std::vector<double> v;
  for (const Inst &x : Expand(s))
    if (x.layer == 5 && x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_FP8_CAST &&
        x.op->phase == phase && x.op->module == module)
      v.push_back(x.op->bytes);
  return v;
}

// Layer 5's float8 casts in `phase` as bytes per element (op->m holds the elements).
std::vector<double> PerElement(const mp_schedule *s, mp_phase phase) {
  std::vector<double> v;
  for (const Inst &x : Expand(s))
    if (x.layer == 5 && x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_FP8_CAST &&
        x.op->phase == phase)
      v.push_back(x.op->bytes / (double)x.op->m);
  return v;
}

}  // namespace

TEST(Fp8Torchao, TensorwiseGradientCastWritesBothLayouts) {
  // dp_shard=8 (no TP), AC none. Backward of gate [f, H]: its output gradient T x f cast
  // with both copies (6 T f), the float8 weight the forward saved transposed (2 f H), the
  // bf16 input re-cast (5 T H). Backward of o [H, H]: 6 T H, 2 H H, 5 T H. Rowwise casts
  // the gradient twice, each copy scaled along its own dim and written in its GEMM's
  // layout: 5 T f twice.
  Opts o;
  o.fp8 = 1;
  Built tw, rw;
  Build(&tw, o);
  EXPECT_EQ(CastBytes(tw.s, MP_MOD_GATE, MP_PHASE_BACKWARD),
            (std::vector<double>{6 * T * f, 2 * f * H, 5 * T * H}));
  EXPECT_EQ(CastBytes(tw.s, MP_MOD_O, MP_PHASE_BACKWARD),
            (std::vector<double>{6 * T * H, 2 * H * H, 5 * T * H}));
  o.fp8_recipe = MP_FP8_ROWWISE;
  Build(&rw, o);
  const std::vector<double> g = CastBytes(rw.s, MP_MOD_GATE, MP_PHASE_BACKWARD);
  ASSERT_GE(g.size(), 2u);
  EXPECT_EQ(g[0], 5 * T * f);
  EXPECT_EQ(g[1], 5 * T * f);
}

TEST(Fp8Torchao, RowwiseParallelInputIsTransposedNotRecast) {
  // tp=2 with SP, AC none. o [H, H/2 on the rank] reads the attention output T x 2048 and
  // down [H, f/2] reads T x 7168, each cast forward by Float8RowwiseParallel (5 bytes, after
  // the amax all-reduce). Backward of down: its output gradient cast on the sequence shard
  // T/2 x H before the float8 all-gather (5 x 4096 x 4096), the gathered T x H gradient
  // transposed for the weight gradient (2 T H), the saved float8 weight transposed
  // (2 x H x 7168) and the input's transposed copy (2 T 7168), no cast of it. q, a colwise
  // Linear, casts its gradient T x 2048 with both copies (6 T 2048), transposes its weight
  // (2 x 2048 x H) and its float8 input (2 T H).
  Opts o;
  o.mesh = "tp=2";
  o.fp8 = 1;
  Built b;
  Build(&b, o);
  EXPECT_EQ(CastBytes(b.s, MP_MOD_DOWN, MP_PHASE_FORWARD).back(), 5 * T * (f / 2));
  EXPECT_EQ(CastBytes(b.s, MP_MOD_DOWN, MP_PHASE_BACKWARD),
            (std::vector<double>{5 * (T / 2) * H, 2 * T * H, 2 * H * (f / 2), 2 * T * (f / 2)}));
  EXPECT_EQ(CastBytes(b.s, MP_MOD_O, MP_PHASE_BACKWARD).back(), 2 * T * (H / 2));
  EXPECT_EQ(CastBytes(b.s, MP_MOD_Q, MP_PHASE_BACKWARD),
            (std::vector<double>{6 * T * (H / 2), 2 * (H / 2) * H, 2 * T * H}));
}

TEST(Fp8Torchao, OpSacRecomputeCastsFromTheKeptAmax) {
  // dp_shard=8, AC selective-op: the recompute re-runs k, o and up (the even matmuls) and
  // casts their inputs and weights at 3 bytes an element, every one of them; the forward's
  // own casts stay at 5. Under full AC every recompute cast is 5, of the Linears up to the
  // block's last saved tensor, down's input (q, k, v, o, gate, up: the recompute stops
  // before down, whose output the backward does not read); under rowwise selective-op 5.
  Opts o;
  o.fp8 = 1;
  o.ac = MP_AC_SELECTIVE_OP;
  Built op, full, rw;
  Build(&op, o);
  const std::vector<double> rc = PerElement(op.s, MP_PHASE_RECOMPUTE);
  EXPECT_EQ(rc.size(), 6u);  // k, o, up: input and weight
  for (double b : rc) EXPECT_EQ(b, 3.0);
  for (double b : PerElement(op.s, MP_PHASE_FORWARD)) EXPECT_EQ(b, 5.0);
  o.ac = MP_AC_FULL;
  Build(&full, o);
  const std::vector<double> frc = PerElement(full.s, MP_PHASE_RECOMPUTE);
  EXPECT_EQ(frc.size(), 12u);  // six Linears: input and weight
  for (double b : frc) EXPECT_EQ(b, 5.0);
  o.ac = MP_AC_SELECTIVE_OP;
  o.fp8_recipe = MP_FP8_ROWWISE;
  Build(&rw, o);
  const std::vector<double> rrc = PerElement(rw.s, MP_PHASE_RECOMPUTE);
  EXPECT_EQ(rrc.size(), 6u);
  for (double b : rrc) EXPECT_EQ(b, 5.0);
}

namespace {

// Layer 5's TP all-reduces of Linear `module` in `phase`, payload bytes in schedule order.
std::vector<double> TpAllReduceBytes(const mp_schedule *s, int module, mp_phase phase) {
  std::vector<double> v;
  for (const Inst &x : Expand(s))
    if (x.layer == 5 && x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_REDUCE &&
        x.op->group == MP_GROUP_TP && x.op->phase == phase && x.op->module == module)
      v.push_back(x.op->bytes);
  return v;
}

}  // namespace

TEST(Fp8Torchao, RowwiseAmaxAllReducedWhereTpShardsItsDim) {
  // tp=2 with SP, AC none, the rowwise recipe on plain TP (torchtitan runs no float8 TP for
  // it): every amax is torch.amax along one dim of a DTensor, a partial max where that dim
  // is sharded, all-reduced as a bf16 vector (2 bytes an element). o [H, H/2 on the rank]
  // and down [H, f/2] (Shard(1)) forward: the weight's amax along in, one per output row
  // (2 H), then the input's along its sharded last dim, one per token (2 T). q [H/2, H] and
  // gate [f/2, H] (Shard(0)) backward: the output gradient's along its sharded last dim
  // (2 T), then the weight's along out, one per input column (2 H). The other casts reduce
  // along unsharded dims: q's forward, o's and down's backward emit none.
  Opts o;
  o.mesh = "tp=2";
  o.fp8 = 1;
  o.fp8_recipe = MP_FP8_ROWWISE;
  Built b;
  Build(&b, o);
  const std::vector<double> fwd{2 * H, 2 * T}, bwd{2 * T, 2 * H};
  EXPECT_EQ(TpAllReduceBytes(b.s, MP_MOD_O, MP_PHASE_FORWARD), fwd);
  EXPECT_EQ(TpAllReduceBytes(b.s, MP_MOD_DOWN, MP_PHASE_FORWARD), fwd);
  EXPECT_EQ(TpAllReduceBytes(b.s, MP_MOD_Q, MP_PHASE_BACKWARD), bwd);
  EXPECT_EQ(TpAllReduceBytes(b.s, MP_MOD_GATE, MP_PHASE_BACKWARD), bwd);
  EXPECT_TRUE(TpAllReduceBytes(b.s, MP_MOD_Q, MP_PHASE_FORWARD).empty());
  EXPECT_TRUE(TpAllReduceBytes(b.s, MP_MOD_O, MP_PHASE_BACKWARD).empty());
  EXPECT_TRUE(TpAllReduceBytes(b.s, MP_MOD_DOWN, MP_PHASE_BACKWARD).empty());
  // Without TP no cast reduces along a sharded dim.
  Opts d;
  d.fp8 = 1;
  d.fp8_recipe = MP_FP8_ROWWISE;
  Built n;
  Build(&n, d);
  EXPECT_TRUE(TpAllReduceBytes(n.s, MP_MOD_O, MP_PHASE_FORWARD).empty());
  EXPECT_TRUE(TpAllReduceBytes(n.s, MP_MOD_Q, MP_PHASE_BACKWARD).empty());
}
