// Transformer Engine's float8 copies by the GPU's compute capability: on Hopper (9.0) its
// float8 GEMMs take TN operands alone, so a tensor used transposed (the weight in the input
// gradient's GEMM, the input and the output gradient in the weight gradient's) gets a
// transposed float8 copy beside the row-major one; on Blackwell (10.0) the per-tensor
// quantizers write none (transformer_engine/common/transformer_engine.cpp,
// nvte_is_non_tn_fp8_gemm_supported; transformer_engine/pytorch/csrc/quantizer.cpp,
// Float8Quantizer: with_transpose = columnwise_usage && !that; v2.8). MXFP8's column-wise
// copy is a second quantization on every GPU. Bytes and ops by hand from the shapes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/schedule/built.h"

using namespace sched_test;

namespace {

constexpr double T = 8192, H = 4096;  // llama3.1-8b, seq 8192, micro-batch 1, dp_replicate=8

// One Linear's ops in layer 5 in one phase: its float8 casts' bytes (in order), its GEMMs
// and the float8 buffers allocated right before one of its ops (an allocation names no
// module).
struct LinearOps {
  std::vector<double> casts;
  std::vector<mp_dtype> cast_dtypes;
  int gemms = 0;
  int block_gemms = 0;  // GEMMs marked to run Hopper's block-scaled kernels (mp_op.fp8_block)
  int mx_gemms = 0;     // GEMMs marked to run Blackwell's MXFP8 kernels (the same field)
  int fp4_gemms = 0;    // GEMMs marked to run on the FP4 tensor cores (mp_op.fp4)
  std::vector<double> gemm_bytes;
  std::vector<int64_t> fp8_allocs;
};

LinearOps Of(const mp_schedule *s, int module, mp_phase phase) {
  LinearOps r;
  std::vector<int64_t> pending;
  for (const Inst &x : Expand(s)) {
    const mp_op *op = x.op;
    if (x.layer != 5 || op->phase != phase) continue;
    if (op->type == MP_OP_ALLOC && op->mem_cat == MP_MEM_FP8) pending.push_back(op->mem_bytes);
    if (op->type != MP_OP_COMPUTE) continue;
    if (op->module == module) {
      r.fp8_allocs.insert(r.fp8_allocs.end(), pending.begin(), pending.end());
      if (op->kernel == MP_KERNEL_FP8_CAST) {
        r.casts.push_back(op->bytes);
        r.cast_dtypes.push_back((mp_dtype)op->dtype);
      }
      r.gemms += op->kernel == MP_KERNEL_GEMM;
      r.block_gemms += op->kernel == MP_KERNEL_GEMM && op->fp8_block == MP_FP8_BLOCK_HOPPER;
      r.mx_gemms += op->kernel == MP_KERNEL_GEMM && op->fp8_block == MP_FP8_BLOCK_MX;
      r.fp4_gemms += op->kernel == MP_KERNEL_GEMM && op->fp4;
      if (op->kernel == MP_KERNEL_GEMM) r.gemm_bytes.push_back(op->bytes);
    }
    pending.clear();
  }
  return r;
}

Opts On(int cc, mp_fp8_recipe recipe, int nvfp4_no_rht = 0, int fp8_dpa = 0) {
  Opts o;
  o.nvfp4_no_rht = nvfp4_no_rht;
  o.fp8_dpa = fp8_dpa;
  o.mesh = "dp_replicate=8";
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.fp8 = 1;
  o.fp8_recipe = recipe;
  o.gpu_cc = cc;
  return o;
}

void BuildOn(Built *b, int cc, mp_fp8_recipe recipe, int nvfp4_no_rht = 0, int fp8_dpa = 0) {
  Build(b, On(cc, recipe, nvfp4_no_rht, fp8_dpa));
}

}  // namespace

TEST(Fp8Layout, DelayedScalingWritesTransposesOnHopperOnly) {
  // o_proj [H, H] on T tokens, delayed scaling (no amax pass: a cast reads 2 bytes and writes
  // a byte a copy). Forward: the weight cast once a step and the input cast, each with its
  // transposed copy on the H100 (2 + 1 + 1 = 4 bytes an element), the row-major codes alone
  // on the B200 (3); one float8 GEMM; the float8 input held across it (T x H bytes, the
  // codes both GEMMs read on the B200; the weight's copies are the ones held through the step,
  // fp8_weight_copies_test.cc). Backward: the output gradient cast (4 and 3 bytes an element),
  // the input-gradient and weight-gradient GEMMs, its float8 buffers dy + input.
  Built h, bw;
  BuildOn(&h, 90, MP_FP8_DELAYED);
  BuildOn(&bw, 100, MP_FP8_DELAYED);
  const LinearOps hf = Of(h.s, MP_MOD_O, MP_PHASE_FORWARD), bf = Of(bw.s, MP_MOD_O, MP_PHASE_FORWARD);
  EXPECT_EQ(hf.casts, (std::vector<double>{4 * H * H, 4 * T * H}));
  EXPECT_EQ(bf.casts, (std::vector<double>{3 * H * H, 3 * T * H}));
  EXPECT_EQ(hf.gemms, 1);
  EXPECT_EQ(bf.gemms, 1);
  EXPECT_EQ(hf.fp8_allocs, (std::vector<int64_t>{(int64_t)(T * H)}));
  EXPECT_EQ(bf.fp8_allocs, hf.fp8_allocs);
  const LinearOps hb = Of(h.s, MP_MOD_O, MP_PHASE_BACKWARD), bb = Of(bw.s, MP_MOD_O, MP_PHASE_BACKWARD);
  EXPECT_EQ(hb.casts, (std::vector<double>{4 * T * H}));
  EXPECT_EQ(bb.casts, (std::vector<double>{3 * T * H}));
  EXPECT_EQ(hb.gemms, 2);
  EXPECT_EQ(bb.gemms, 2);
  EXPECT_EQ(bb.fp8_allocs, (std::vector<int64_t>{(int64_t)(2 * T * H)}));
  // q (a LayerNormLinear: the norm emits its float8 input row-major): the H100 transposes
  // that input in backward (a float8 read and write, 2 bytes an element, E4M3) after the
  // output gradient's cast; the B200's weight-gradient GEMM reads the norm's codes as they
  // are. The weight cast: 4 and 3 bytes an element of H x H.
  const LinearOps hq = Of(h.s, MP_MOD_Q, MP_PHASE_BACKWARD), bq = Of(bw.s, MP_MOD_Q, MP_PHASE_BACKWARD);
  EXPECT_EQ(hq.casts, (std::vector<double>{4 * T * H, 2 * T * H}));
  EXPECT_EQ(hq.cast_dtypes.back(), MP_DTYPE_FP8_E4M3);
  EXPECT_EQ(bq.casts, (std::vector<double>{3 * T * H}));
  EXPECT_EQ(Of(h.s, MP_MOD_Q, MP_PHASE_FORWARD).casts, (std::vector<double>{4 * H * H}));
  EXPECT_EQ(Of(bw.s, MP_MOD_Q, MP_PHASE_FORWARD).casts, (std::vector<double>{3 * H * H}));
}

TEST(Fp8Layout, CurrentScalingOnBlackwellAndMxfp8OnEither) {
  // Current scaling (tensorwise) adds the amax pass (2 bytes an element): o's input cast
  // 6 bytes an element on the H100, 5 on the B200 and on the GB200 (10.0), and on a 12.0
  // GPU (RTX Blackwell: TN only, as Hopper) 6 again.
  for (int cc : {90, 100, 120}) {
    Built b;
    BuildOn(&b, cc, MP_FP8_TENSORWISE);
    const double per = cc == 100 ? 5 : 6;
    EXPECT_EQ(Of(b.s, MP_MOD_O, MP_PHASE_FORWARD).casts, (std::vector<double>{per * H * H, per * T * H})) << cc;
  }
  // MXFP8 (Blackwell only): its column-wise copy is scaled along the other dim, a second
  // quantization; each cast writes both, 2 + 2 x (1 + 1/32) bytes an element.
  Built mx;
  BuildOn(&mx, 100, MP_FP8_MXFP8);
  const double per = 2 + 2 * (1 + 1.0 / 32);
  EXPECT_EQ(Of(mx.s, MP_MOD_O, MP_PHASE_FORWARD).casts, (std::vector<double>{per * H * H, per * T * H}));
}

TEST(Fp8Layout, BlockwiseGemmsRunBlockScaledOnHopperOnly) {
  // Blockwise: each cast writes the 1x128-scaled row-wise codes and the column-wise ones, a
  // byte and an fp32 scale per 128 elements each, reading the bf16 source once with no amax
  // pass: 2 + 2 x (1 + 4/128) bytes an element of o's weight and input. On the H100 (9.0)
  // all three of o's float8 GEMMs (forward, input and weight gradient) are cuBLASLt's
  // block-scaled kernels (Float8BlockScaling, VEC128 and BLK128x128 scale modes); on the
  // B200 (10.0) Transformer Engine runs them as MXFP8 (pull request 2157), all three marked
  // MXFP8 and none Hopper's kind, as under the mxfp8 recipe; under delayed scaling none of
  // either kind on either GPU.
  Built h, bw, d;
  BuildOn(&h, 90, MP_FP8_BLOCKWISE);
  BuildOn(&bw, 100, MP_FP8_BLOCKWISE);
  BuildOn(&d, 90, MP_FP8_DELAYED);
  const double per = 2 + 2 * (1 + 4.0 / 128);
  const LinearOps hf = Of(h.s, MP_MOD_O, MP_PHASE_FORWARD), hb = Of(h.s, MP_MOD_O, MP_PHASE_BACKWARD);
  EXPECT_EQ(hf.casts, (std::vector<double>{per * H * H, per * T * H}));
  EXPECT_EQ(hf.gemms, 1);
  EXPECT_EQ(hf.block_gemms, 1);
  EXPECT_EQ(hb.gemms, 2);
  EXPECT_EQ(hb.block_gemms, 2);
  EXPECT_EQ(hf.mx_gemms + hb.mx_gemms, 0);
  const LinearOps bf = Of(bw.s, MP_MOD_O, MP_PHASE_FORWARD), bb = Of(bw.s, MP_MOD_O, MP_PHASE_BACKWARD);
  EXPECT_EQ(bf.block_gemms + bb.block_gemms, 0);
  EXPECT_EQ(bf.mx_gemms + bb.mx_gemms, 3);
  Built mx;
  BuildOn(&mx, 100, MP_FP8_MXFP8);
  EXPECT_EQ(Of(mx.s, MP_MOD_O, MP_PHASE_FORWARD).mx_gemms + Of(mx.s, MP_MOD_O, MP_PHASE_BACKWARD).mx_gemms, 3);
  const LinearOps df = Of(d.s, MP_MOD_O, MP_PHASE_FORWARD), db = Of(d.s, MP_MOD_O, MP_PHASE_BACKWARD);
  EXPECT_EQ(df.block_gemms + db.block_gemms + df.mx_gemms + db.mx_gemms, 0);
}

TEST(Fp8Layout, GpuFunctionFollowsTransformerEngine) {
  // nvte_is_non_tn_fp8_gemm_supported: (cc >= 100 && cc < 120) || cc >= 130
  EXPECT_FALSE(mp_fp8_gemm_any_layout(89));
  EXPECT_FALSE(mp_fp8_gemm_any_layout(90));
  EXPECT_TRUE(mp_fp8_gemm_any_layout(100));
  EXPECT_TRUE(mp_fp8_gemm_any_layout(103));
  EXPECT_TRUE(mp_fp8_gemm_any_layout(110));
  EXPECT_FALSE(mp_fp8_gemm_any_layout(120));
  EXPECT_FALSE(mp_fp8_gemm_any_layout(121));
  EXPECT_TRUE(mp_fp8_gemm_any_layout(130));
}

TEST(Fp8Layout, Nvfp4QuantizesEveryGemmsOperands) {
  // NVFP4 (Transformer Engine's NVFP4BlockScaling, quantizer.cpp v2.9) on a B200 (10.0): a
  // copy is half a byte of E2M1 code and an E4M3 scale per 16 elements, 0.5625 bytes an
  // element. o's weight (16x16 blocks, no Hadamard transform): the amax pass (2), then one
  // kernel reading the bf16 weight (2) and writing the row-wise and column-wise copies
  // (2 x 0.5625): 5.125 bytes an element of H x H. Its input: the Hadamard amax pass (2), the
  // row-wise quantize (2 + 0.5625) and the column-wise copy through the random Hadamard
  // transform, which reads the input again (2 + 0.5625): 7.125 bytes an element of T x H. The
  // output gradient in backward the same 7.125 (stochastic rounding inside that kernel), no
  // transposed copy. All three GEMMs are NVFP4 (fp4), none of the float8 block-scaled kinds.
  Built b;
  BuildOn(&b, 100, MP_FP8_NVFP4);
  const double w = 2 + 2 + 2 * 0.5625, a = 2 + 2 + 0.5625 + 2 + 0.5625;
  const LinearOps f = Of(b.s, MP_MOD_O, MP_PHASE_FORWARD), bw = Of(b.s, MP_MOD_O, MP_PHASE_BACKWARD);
  EXPECT_EQ(f.casts, (std::vector<double>{w * H * H, a * T * H}));
  EXPECT_EQ(bw.casts, (std::vector<double>{a * T * H}));
  EXPECT_EQ(f.gemms, 1);
  EXPECT_EQ(bw.gemms, 2);
  EXPECT_EQ(f.fp4_gemms, 1);
  EXPECT_EQ(bw.fp4_gemms, 2);
  EXPECT_EQ(f.block_gemms + bw.block_gemms + f.mx_gemms + bw.mx_gemms, 0);
  // The forward GEMM reads its NVFP4 operands, (T + H) x H x 0.5625 bytes, and writes the bf16
  // output, T x H x 2.
  EXPECT_EQ(f.gemm_bytes, (std::vector<double>{(T + H) * H * 0.5625 + T * H * 2}));
  // MXFP8 on the same GPU marks none.
  Built mx;
  BuildOn(&mx, 100, MP_FP8_MXFP8);
  EXPECT_EQ(Of(mx.s, MP_MOD_O, MP_PHASE_FORWARD).fp4_gemms + Of(mx.s, MP_MOD_O, MP_PHASE_BACKWARD).fp4_gemms, 0);
}

TEST(Fp8Layout, Nvfp4WithoutHadamardCastsBothCopiesInOneKernel) {
  // NVTE_NVFP4_DISABLE_RHT=1 (the MLPerf v5.1 NVFP4 configs): the input and the output
  // gradient are quantized as the weight is, the amax pass (2) and one kernel reading the
  // source (2) and writing both copies (2 x 0.5625): 5.125 bytes an element each, the weight's
  // unchanged; the GEMMs are NVFP4 all the same.
  Built b;
  BuildOn(&b, 100, MP_FP8_NVFP4, 1);
  const double per = 2 + 2 + 2 * 0.5625;
  const LinearOps f = Of(b.s, MP_MOD_O, MP_PHASE_FORWARD), bw = Of(b.s, MP_MOD_O, MP_PHASE_BACKWARD);
  EXPECT_EQ(f.casts, (std::vector<double>{per * H * H, per * T * H}));
  EXPECT_EQ(bw.casts, (std::vector<double>{per * T * H}));
  EXPECT_EQ(f.fp4_gemms + bw.fp4_gemms, 3);
}

// The attention core's dtype in layer 5 in one phase (bf16 where it runs none).
mp_dtype CoreDtype(const mp_schedule *s, mp_phase phase) {
  for (const Inst &x : Expand(s))
    if (x.layer == 5 && x.op->phase == phase && x.op->kernel == MP_KERNEL_ATTENTION) return (mp_dtype)x.op->dtype;
  return MP_DTYPE_BF16;
}

TEST(Fp8Layout, Fp8AttentionCastsQkvAndTheOutputGradient) {
  // --fp8-dpa on the B200 under tensorwise (current scaling): before the forward core q, k and
  // v are cast to float8, T x (4096 + 1024 + 1024) elements at an amax pass and a cast, 5
  // bytes an element; before the backward core the output gradient, T x 4096 at 5 bytes; the
  // core runs in E4M3 forward and E5M2 backward; nothing else is cast (module -1 holds the
  // layer's other casts, the same with and without).
  Built off, on;
  BuildOn(&off, 100, MP_FP8_TENSORWISE);
  BuildOn(&on, 100, MP_FP8_TENSORWISE, 0, 1);
  std::vector<double> fwd = Of(off.s, -1, MP_PHASE_FORWARD).casts, bwd = Of(off.s, -1, MP_PHASE_BACKWARD).casts;
  fwd.push_back(5 * T * (H + 1024 + 1024));
  bwd.push_back(5 * T * H);
  EXPECT_EQ(Of(on.s, -1, MP_PHASE_FORWARD).casts, fwd);
  EXPECT_EQ(Of(on.s, -1, MP_PHASE_BACKWARD).casts, bwd);
  EXPECT_EQ(CoreDtype(on.s, MP_PHASE_FORWARD), MP_DTYPE_FP8_E4M3);
  EXPECT_EQ(CoreDtype(on.s, MP_PHASE_BACKWARD), MP_DTYPE_FP8_E5M2);
  EXPECT_EQ(CoreDtype(off.s, MP_PHASE_FORWARD), MP_DTYPE_BF16);
  // refused by name on Hopper, whose profiles state no split of the attention to price it by
  Built h;
  EXPECT_EQ(PlanOnly(&h, On(90, MP_FP8_TENSORWISE, 0, 1)), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&h.ctx)).find("not priced on compute capability 90"), std::string::npos);
}
