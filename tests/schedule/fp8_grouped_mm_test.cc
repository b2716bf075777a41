// torchtitan's float8 grouped GEMMs: quantize.grouped_mm.mx / .float8 with fqns ["experts"]
// swap the routed experts' weights for torchao's ScaledGroupedMMTensor, whose
// torch._grouped_mm runs _MXFP8GroupedMM (or _Float8GroupedMM): the forward quantizes the
// input along K and the weights, the input gradient's GEMM the output gradient along N and
// the weights along N, the weight gradient's GEMM the output gradient and the input along M
// (transposed copies), six casts, each from the bf16 tensor saved for the backward
// (pytorch/ao@36027d82d1 torchao/prototype/moe_training/mxfp8_grouped_mm.py and its README's
// kernel breakdown). Qwen3-30B-A3B under EP 8 on 8 ranks, seq 8192, micro-batch 1: d_model
// 2048, 128 experts top-8 of d_ff 768, so 128 / 8 = 16 local experts and, balanced,
// 8192 x 8 = 65536 routed rows a rank, 4096 an expert; layer 5's down projection by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/schedule/built.h"

using namespace sched_test;

namespace {

const int64_t kRows = 65536, kH = 2048, kF = 768, kLocal = 16;

Opts Qwen(mp_fp8_recipe recipe, mp_fp8_scope scope) {
  Opts o;
  o.mesh = "dp_shard=8,ep=8";
  o.model = "qwen3-30b-a3b";
  o.fp8 = 1;
  o.fp8_recipe = recipe;
  o.fp8_scope = scope;
  return o;
}

void BuildQwen(Built *b, mp_fp8_recipe recipe, mp_fp8_scope scope) { Build(b, Qwen(recipe, scope)); }

// Layer 5's float8 casts of `module` in `phase`, by elements (ascending), and their bytes.
std::vector<int64_t> CastElems(const mp_schedule *s, int module, mp_phase phase, double *bytes) {
  std::vector<int64_t> r;
  *bytes = 0;
  for (const Inst &x : Expand(s)) {
    const mp_op *op = x.op;
    if (x.layer != 5 || op->phase != phase || op->type != MP_OP_COMPUTE) continue;
    if (op->module != module || op->kernel != MP_KERNEL_FP8_CAST) continue;
    r.push_back(op->m);
    *bytes += op->bytes;
  }
  std::sort(r.begin(), r.end());
  return r;
}

// Layer 5's forward GEMM of `module`.
const mp_op *FwdGemm(const mp_schedule *s, int module) {
  for (const Inst &x : Expand(s))
    if (x.layer == 5 && x.op->phase == MP_PHASE_FORWARD && x.op->type == MP_OP_COMPUTE &&
        x.op->kernel == MP_KERNEL_GEMM && x.op->module == module)
      return x.op;
  return nullptr;
}

int Float8Params(const mp_plan *p, int ndim) {
  int n = 0;
  for (int i = 0; i < p->n_params; i++) n += p->params[i].float8 && p->params[i].ndim == ndim;
  return n;
}

}  // namespace

// Scope experts: the routed experts' three 3-d weights a layer run float8 and no Linear does;
// the down projection's casts by hand. Forward: its weight, 16 x 2048 x 768 = 25,165,824
// elements, and its input, 65536 x 768 = 50,331,648. Backward: the output gradient,
// 65536 x 2048 = 134,217,728, twice (along N for the input gradient, along M for the weight
// gradient), the weight along N and the input along M. MXFP8 moves 2 (bf16 read) + 1 (E4M3
// written) + 1/32 (an E8M0 scale per 32) = 3.03125 bytes an element.
TEST(Fp8GroupedMm, MxExpertsQuantizeSixTensors) {
  Built b;
  BuildQwen(&b, MP_FP8_MXFP8, MP_FP8_SCOPE_EXPERTS);
  EXPECT_EQ(Float8Params(b.plan, 2), 0);
  EXPECT_EQ(Float8Params(b.plan, 3), 3 * b.model.n_layers);
  const int64_t w = kLocal * kH * kF, x = kRows * kF, dy = kRows * kH;
  using V = std::vector<int64_t>;
  double fb = 0, bb = 0;
  EXPECT_EQ(CastElems(b.s, MP_MOD_EXPERTS_DOWN, MP_PHASE_FORWARD, &fb), (V{w, x}));
  EXPECT_EQ(CastElems(b.s, MP_MOD_EXPERTS_DOWN, MP_PHASE_BACKWARD, &bb), (V{w, x, dy, dy}));
  EXPECT_DOUBLE_EQ(fb, 3.03125 * (double)(w + x));
  EXPECT_DOUBLE_EQ(bb, 3.03125 * (double)(w + x + 2 * dy));
  // the grouped GEMM in E4M3 over the 16 experts: 2 x 65536 x 2048 x 768 FLOPs
  const mp_op *g = FwdGemm(b.s, MP_MOD_EXPERTS_DOWN);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->dtype, MP_DTYPE_FP8_E4M3);
  EXPECT_EQ(g->batch, kLocal);
  EXPECT_DOUBLE_EQ(g->flops, 2.0 * kRows * kH * kF);
  // q_proj stays bf16 and uncast
  double qb = 0;
  EXPECT_TRUE(CastElems(b.s, MP_MOD_Q, MP_PHASE_FORWARD, &qb).empty());
}

// Scope linears (torchtitan's quantize.linear.* alone): the experts stay bf16, uncast; scope
// all: both.
TEST(Fp8GroupedMm, ScopeLinearsLeavesExpertsBf16) {
  Built lin, all;
  BuildQwen(&lin, MP_FP8_MXFP8, MP_FP8_SCOPE_LINEARS);
  BuildQwen(&all, MP_FP8_MXFP8, MP_FP8_SCOPE_ALL);
  EXPECT_EQ(Float8Params(lin.plan, 3), 0);
  EXPECT_GT(Float8Params(lin.plan, 2), 0);
  EXPECT_EQ(Float8Params(all.plan, 3), 3 * all.model.n_layers);
  EXPECT_EQ(Float8Params(all.plan, 2), Float8Params(lin.plan, 2));
  double bytes = 0;
  EXPECT_TRUE(CastElems(lin.s, MP_MOD_EXPERTS_DOWN, MP_PHASE_FORWARD, &bytes).empty());
  EXPECT_EQ(FwdGemm(lin.s, MP_MOD_EXPERTS_DOWN)->dtype, MP_DTYPE_BF16);
}

// Rowwise (torchao's _Float8GroupedMM, Hopper): the same six casts, each with its amax pass
// (2 + 1 + 2 = 5 bytes an element), and no bf16 post-scale after the backward GEMMs: the
// row scales go into torch._scaled_grouped_mm.
TEST(Fp8GroupedMm, RowwiseScalesInTheGemm) {
  Built b;
  BuildQwen(&b, MP_FP8_ROWWISE, MP_FP8_SCOPE_EXPERTS);
  const int64_t w = kLocal * kH * kF, x = kRows * kF, dy = kRows * kH;
  double bb = 0;
  EXPECT_EQ(CastElems(b.s, MP_MOD_EXPERTS_DOWN, MP_PHASE_BACKWARD, &bb), (std::vector<int64_t>{w, x, dy, dy}));
  EXPECT_DOUBLE_EQ(bb, 5.0 * (double)(w + x + 2 * dy));
}

// Refused: the tensorwise recipe (torchao's grouped GEMMs scale rowwise or in MX blocks) and
// a megatron stack (its experts are float8 with its Linears).
TEST(Fp8GroupedMm, Refusals) {
  Built t, m;
  EXPECT_EQ(PlanOnly(&t, Qwen(MP_FP8_TENSORWISE, MP_FP8_SCOPE_EXPERTS)), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&t.ctx)).find("rowwise or mxfp8"), std::string::npos) << mp_errmsg(&t.ctx);
  Opts g = Megatron("dp_replicate=8,ep=8");
  g.model = "qwen3-30b-a3b";
  g.fp8 = 1;
  g.fp8_scope = MP_FP8_SCOPE_ALL;
  EXPECT_EQ(PlanOnly(&m, g), MP_ERR_INVALID);
}
