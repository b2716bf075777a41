// Megatron-Core's --fp8-param-gather (core_v0.14.0; Transformer Engine v2.6's float8 model
// weights), against hand counts on Llama 3.1 8B: the bytes of the distributed optimizer's and
// Megatron FSDP's parameter all-gathers, the model weights at rest, the per-step weight cast it
// replaces by a transposed copy, the masters' cast into the float8 weights after the step
// (transformer_engine/pytorch/tensor/utils.py cast_master_weights_to_fp8), MXFP8 weights gathered
// in bf16 and quantized after the gather, and the refusals.
#include <gtest/gtest.h>

#include <string>

#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Inst;
using sched_test::Opts;

// llama3.1-8b: a layer's float8 Linears are q and o (4096 x 4096), k and v (1024 x 4096) and
// gate, up and down (14336 x 4096): 2 x 16,777,216 + 2 x 4,194,304 + 3 x 58,720,256 =
// 218,103,808 elements; its two norms 8192 more (218,112,000 in all). Every dim is a multiple
// of 128, so each Linear runs float8 under every recipe; the embedding and output layer stay
// bf16. 32 layers: 224 float8 weights of 6,979,321,856 elements.
constexpr int64_t kF8 = 218103808LL, kBlock = 218112000LL, kLayers = 32;
constexpr int64_t kF8All = kF8 * kLayers, kParams = 8030261248LL;

Opts Dopt(int gather, mp_fp8_recipe r = MP_FP8_DELAYED) {
  Opts o = sched_test::Megatron("dp_replicate=8");
  o.fp8 = 1;
  o.fp8_recipe = r;
  o.dist_opt = 1;
  o.dp_overlap = 1;  // --overlap-param-gather: the gathers layer by layer in the first forward
  o.global_batch = 16;
  o.fp8_param_gather = gather;
  return o;
}

Opts Mfsdp(int gather, mp_fp8_recipe r = MP_FP8_DELAYED) {
  Opts o = Dopt(gather, r);
  o.mesh = "dp_shard=8";
  return o;
}

// The step's all-gathers of a layer's weights over the data-parallel group: bytes of each.
std::vector<double> LayerGathers(const mp_schedule *s) {
  std::vector<double> out;
  for (const Inst &x : sched_test::Expand(s))
    if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_GATHER && x.layer >= 0 && x.op->bytes > 1e8)
      out.push_back(x.op->bytes);
  return out;
}

// The same plan without and with --fp8-param-gather: under the distributed optimizer
// (fsdp 0) or Megatron FSDP (1).
void BuildPair(int fsdp, Built *off, Built *on) {
  sched_test::Build(off, fsdp ? Mfsdp(0) : Dopt(0));
  sched_test::Build(on, fsdp ? Mfsdp(1) : Dopt(1));
}

// The distributed optimizer's gather carries each float8 weight's raw byte: a layer 2 x 8192
// (the norms, bf16) + 218,103,808 where bf16 weights take 2 x 218,112,000. Megatron FSDP's
// per-layer gathers (forward and backward) the same.
TEST(Fp8ParamGather, GatherBytes) {
  for (int fsdp = 0; fsdp < 2; fsdp++) {
    SCOPED_TRACE(fsdp ? "Megatron FSDP" : "distributed optimizer");
    Built off, on;
    BuildPair(fsdp, &off, &on);
    const std::vector<double> a = LayerGathers(off.s), b = LayerGathers(on.s);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.size(), (size_t)(fsdp ? 2 * kLayers : kLayers));
    for (size_t i = 0; i < a.size(); i++) {
      EXPECT_EQ(a[i], 2.0 * kBlock);
      EXPECT_EQ(b[i], 2.0 * 8192 + kF8);
    }
  }
}

// The model weights at rest: DDP's whole model-dtype copy loses a byte an element of its
// 6,979,321,856 float8 ones; Megatron FSDP's shard its eighth (872,415,232). The fp32 masters,
// gradients and Adam state do not change.
TEST(Fp8ParamGather, ResidentWeights) {
  for (int fsdp = 0; fsdp < 2; fsdp++) {
    SCOPED_TRACE(fsdp ? "Megatron FSDP" : "distributed optimizer");
    Built off, on;
    BuildPair(fsdp, &off, &on);
    const int64_t f8 = fsdp ? kF8All / 8 : kF8All;
    EXPECT_EQ(off.s->resident_bytes[MP_MEM_PARAMS] - on.s->resident_bytes[MP_MEM_PARAMS], f8);
    EXPECT_EQ(off.s->resident_bytes[MP_MEM_GRADS], on.s->resident_bytes[MP_MEM_GRADS]);
    EXPECT_EQ(off.s->resident_bytes[MP_MEM_OPTIMIZER], on.s->resident_bytes[MP_MEM_OPTIMIZER]);
  }
  Built m;
  sched_test::Build(&m, Mfsdp(1));
  // Megatron FSDP's shard: bf16 weights (2) less the float8 ones' byte, fp32 masters (4)
  EXPECT_EQ(m.s->resident_bytes[MP_MEM_PARAMS], 6 * (kParams / 8) - kF8All / 8);
}

// The once-a-step weight casts of the first micro-batch: Transformer Engine casts a bf16
// weight with its transposed copy (read 2, write 1 + 1: 4 bytes an element under delayed
// scaling); a float8 weight only gets its transposed copy (read 1, write 1).
TEST(Fp8ParamGather, WeightCastBecomesTranspose) {
  for (int gather = 0; gather < 2; gather++) {
    Built b;
    sched_test::Build(&b, Dopt(gather));
    double bytes = 0;
    for (const Inst &x : sched_test::Expand(b.s))
      if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_FP8_CAST && x.op->when == MP_WHEN_FIRST_MICRO &&
          x.op->phase == MP_PHASE_FORWARD)
        bytes += x.op->bytes;
    EXPECT_EQ(bytes, (gather ? 2.0 : 4.0) * kF8All) << "gather " << gather;
  }
}

// After AdamW: the masters copied to bf16 (4 + 2 bytes over the shard, with or without the
// option), then the float8 part of the shard cast into the weights (read 2, write 1; current
// and blockwise scaling read the shard once more for its amax) and the amaxes all-reduced
// over the group: an fp32 a weight (224: 896 bytes), under blockwise a 128 x 128 block's
// (6,979,321,856 / 16384 = 425,984 blocks: 1,703,936 bytes). Megatron FSDP's shard holds an
// eighth of every weight: 872,415,232 float8 elements.
TEST(Fp8ParamGather, MasterCastAfterStep) {
  const struct {
    mp_fp8_recipe r;
    double per_elem, amax_bytes;
  } cases[] = {{MP_FP8_DELAYED, 3.0, 896.0}, {MP_FP8_TENSORWISE, 5.0, 896.0},
               {MP_FP8_BLOCKWISE, 5.0 + 4.0 / 16384, 1703936.0}};
  for (const auto &k : cases) {
    SCOPED_TRACE(mp_fp8_recipe_name(k.r));
    Built b;
    sched_test::Build(&b, Mfsdp(1, k.r));
    int casts = 0, reduces = 0;
    for (const Inst &x : sched_test::Expand(b.s)) {
      if (x.op->phase != MP_PHASE_OPTIMIZER) continue;
      if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_FP8_CAST) {
        casts++;
        EXPECT_DOUBLE_EQ(x.op->bytes, k.per_elem * (kF8All / 8));
      }
      if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_REDUCE && x.op->group == MP_GROUP_FSDP) {
        reduces++;
        EXPECT_EQ(x.op->bytes, k.amax_bytes);
      }
    }
    EXPECT_EQ(casts, 1);
    EXPECT_EQ(reduces, 1);
  }
  // without the option no float8 cast runs in the optimizer phase
  Built off;
  sched_test::Build(&off, Mfsdp(0));
  for (const Inst &x : sched_test::Expand(off.s))
    EXPECT_FALSE(x.op->phase == MP_PHASE_OPTIMIZER && x.op->kernel == MP_KERNEL_FP8_CAST && x.op->type == MP_OP_COMPUTE);
}

// MXFP8 weights (Megatron-Core core_v0.14.0 with reuse_grad_buf_for_mxfp8_param_ag, as
// Megatron-Bridge's bf16_with_mxfp8_mixed sets it) on a B200 (compute capability 10.0): the
// same plan without and with the option.
void BuildMx(Built *off, Built *on) {
  Opts a = Dopt(0, MP_FP8_MXFP8), b = Dopt(1, MP_FP8_MXFP8);
  a.gpu_cc = b.gpu_cc = 100;
  sched_test::Build(off, a);
  sched_test::Build(on, b);
}

// Bytes held a float8 element: without the option the bf16 weight (2) and Transformer
// Engine's cached workspace, row-wise and column-wise codes (1 + 1) with an E8M0 scale per 32
// each way (every dim a multiple of 128, so no padding: 2/32 = 1/16 byte); with it the MXFP8
// weight alone, its row-wise code counted with the parameters (1) and its column-wise code
// and both scales with the float8 copies (1 + 1/16): 2 bytes an element saved,
// 13,958,643,712 on the rank. The other 1,050,939,392 (embedding, output, norms) keep their
// own bf16 storage beside their buffer's bf16 param_data, which the flag leaves allocated (2
// more bytes each: 2,101,878,784), so the parameters shrink by 6,979,321,856 - 2,101,878,784.
// The gather still moves bf16 through the gradient buffer (param_and_grad_buffer.py
// shared_buffer), 2 x 218,112,000 bytes a layer, and the gradient buffer and optimizer state
// do not change.
TEST(Fp8ParamGatherMx, HeldAndGathered) {
  Built off, on;
  BuildMx(&off, &on);
  EXPECT_EQ(off.s->resident_bytes[MP_MEM_PARAMS] - on.s->resident_bytes[MP_MEM_PARAMS],
            kF8All - 2 * (kParams - kF8All));
  EXPECT_EQ(off.s->resident_bytes[MP_MEM_FP8], 2 * kF8All + kF8All / 16);
  EXPECT_EQ(on.s->resident_bytes[MP_MEM_FP8], kF8All + kF8All / 16);
  EXPECT_EQ(off.s->resident_bytes[MP_MEM_GRADS], on.s->resident_bytes[MP_MEM_GRADS]);
  EXPECT_EQ(off.s->resident_bytes[MP_MEM_OPTIMIZER], on.s->resident_bytes[MP_MEM_OPTIMIZER]);
  const std::vector<double> a = LayerGathers(off.s), b = LayerGathers(on.s);
  ASSERT_EQ(b.size(), (size_t)kLayers);
  for (size_t i = 0; i < b.size(); i++) {
    EXPECT_EQ(a[i], 2.0 * kBlock);
    EXPECT_EQ(b[i], 2.0 * kBlock);
  }
}

// Quantized once a step, from bf16, into both usages: the same first-micro-batch casts as
// the bf16 weight's workspace (read 2, write 1 + 1 and the scales' 1/16), none in the
// optimizer (no cast_master_weights_to_fp8: the masters are copied to bf16, 4 + 2 bytes over
// the shard as without the option). After the gather the buffer's bf16 view is zeroed (2
// bytes an element of the rank's 8,030,261,248) and the bf16 weights copied out of it (read
// and write 2: the 1,050,939,392 outside the float8 Linears).
TEST(Fp8ParamGatherMx, QuantizedOnceAfterGather) {
  Built off, on;
  BuildMx(&off, &on);
  double cast[2] = {0, 0}, copy_gain = 0;
  int opt_casts = 0;
  for (int k = 0; k < 2; k++)
    for (const Inst &x : sched_test::Expand(k ? on.s : off.s)) {
      if (x.op->type != MP_OP_COMPUTE) continue;
      if (x.op->kernel == MP_KERNEL_FP8_CAST && x.op->phase == MP_PHASE_FORWARD && x.op->when == MP_WHEN_FIRST_MICRO)
        cast[k] += x.op->bytes;
      if (x.op->kernel == MP_KERNEL_FP8_CAST && x.op->phase == MP_PHASE_OPTIMIZER) opt_casts++;
      if (x.op->kernel == MP_KERNEL_COPY && x.op->phase == MP_PHASE_OPTIMIZER) copy_gain += (k ? 1 : -1) * x.op->bytes;
    }
  EXPECT_EQ(cast[0], 4.0 * kF8All + kF8All / 16);
  EXPECT_EQ(cast[1], cast[0]);
  EXPECT_EQ(opt_casts, 0);
  EXPECT_EQ(copy_gain, 2.0 * kParams + 4.0 * (kParams - kF8All));
}

// Refused by name: what Megatron-Core refuses (no distributed optimizer: arguments.py), MXFP8
// weights under Megatron FSDP (its own MXFP8 buffers, not priced), and the option off
// Megatron's memory model.
TEST(Fp8ParamGather, Refusals) {
  const struct {
    Opts o;
    const char *says;
  } cases[] = {
      {[] { Opts o = Dopt(1); o.dist_opt = 0; return o; }(), "distributed optimizer"},
      {[] { Opts o = Mfsdp(1, MP_FP8_MXFP8); o.gpu_cc = 100; return o; }(), "Megatron FSDP's MXFP8 buffers"},
      {[] { Opts o = Dopt(1, MP_FP8_MXFP8); o.gpu_cc = 100; o.dist_opt = 0; return o; }(), "distributed optimizer"},
      {[] { Opts o = Dopt(1, MP_FP8_TENSORWISE); o.mem_model = MP_MEM_MODEL_TORCHTITAN; o.mesh = "dp_shard=8";
         o.dist_opt = o.dp_overlap = 0; return o; }(),
       "memory model keeps bf16 weights"},
  };
  for (const auto &k : cases) {
    SCOPED_TRACE(k.says);
    Built b;
    ASSERT_EQ(sched_test::PlanOnly(&b, k.o), MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find(k.says), std::string::npos) << mp_errmsg(&b.ctx);
  }
}

}  // namespace
