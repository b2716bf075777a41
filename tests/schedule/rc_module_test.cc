// Megatron-Core's whole-module recompute (transformer_config.py recompute_modules mlp, moe
// and shared_experts, core_v0.14): a dense MLP checkpointed by transformer_layer.py
// (tensor_parallel.checkpoint(self.mlp, False, pre_mlp_layernorm_output)), a MoE layer by
// moe/moe_layer.py (tensor_parallel.checkpoint(custom_forward, False, hidden_states)) and its
// shared experts (checkpoint(self.shared_experts, False, residual)). Each keeps its input,
// drops what it saves inside, and re-runs its forward, collectives included, in the backward.
// Figures by hand from the test models' shapes under Megatron-LM's memory model.
#include <gtest/gtest.h>

#include <string>

#include "tests/schedule/built.h"

namespace {

using sched_test::Build;
using sched_test::Built;
using sched_test::Expand;
using sched_test::Inst;
using sched_test::Megatron;
using sched_test::Opts;
using sched_test::PlanOnly;
using sched_test::SavedByBlock;

constexpr uint32_t kMlp = 1u << MP_RC_MLP, kMoe = 1u << MP_RC_MOE, kShared = 1u << MP_RC_SHARED_EXPERTS;

// What the recompute phase of a schedule runs.
struct Rc {
  int gemms = 0, norms = 0, acts = 0;
  double gemm_flops = 0;
  int n_comm[MP_COLL_COUNT][MP_GROUP_COUNT] = {};
  double comm_bytes[MP_COLL_COUNT][MP_GROUP_COUNT] = {};
};

// What the recompute phase runs in the schedule of `base` with the recompute modules `bits`.
Rc Recomputed(Opts base, uint32_t bits) {
  Rc r;
  Built b;
  base.recompute_modules = bits;
  Build(&b, base);
  for (const Inst &x : Expand(b.s)) {
    if (x.op->phase != MP_PHASE_RECOMPUTE) continue;
    if (x.op->type == MP_OP_COMM) {
      r.n_comm[x.op->coll][x.op->group]++;
      r.comm_bytes[x.op->coll][x.op->group] += x.op->bytes;
    }
    if (x.op->type != MP_OP_COMPUTE) continue;
    if (x.op->kernel == MP_KERNEL_GEMM) r.gemms++, r.gemm_flops += x.op->flops;
    if (x.op->kernel == MP_KERNEL_NORM) r.norms++;
    if (x.op->kernel == MP_KERNEL_ACTIVATION) r.acts++;
  }
  return r;
}

// What the recompute modules `bits` stop saving in each of the two blocks of `base`'s model:
// the blocks' saved bytes without them less with them.
void ExpectDropped(const Opts &base, uint32_t bits, int64_t dropped) {
  SCOPED_TRACE(bits);
  Built none, b;
  Build(&none, base);
  Opts o = base;
  o.recompute_modules = bits;
  Build(&b, o);
  for (int l = 0; l < 2; l++) EXPECT_EQ(SavedByBlock(none.s, l) - SavedByBlock(b.s, l), dropped) << l;
}

// A test model on `mesh` under Megatron-LM's memory model, one sequence of 64 tokens.
Opts Tiny(const char *model, const char *mesh) {
  Opts o = Megatron(mesh);
  o.model = model;
  o.seq = 64;
  return o;
}

// tiny-dense (H 64, d_ff 192, SwiGLU, two layers) on tp=2 with SP, seq 64: T = 64 tokens,
// Ts = 32, f = 96 a rank.
Opts DenseTp2() { return Tiny("tiny-dense", "tp=2"); }

// mlp drops the MLP's gate, up, silu and product, 4 x 2 T f = 8 x 64 x 96 = 49,152 bytes a
// block, and keeps its input (the normed h, 2 Ts H sharded under SP) with the pre-MLP norm's
// input and rstd; with layernorm the checkpoint's input goes too: + 2 x 32 x 64 = 4,096.
TEST(RcModule, MlpKeepsTheDenseMlpsInputAlone) {
  ExpectDropped(DenseTp2(), kMlp, 49152);
  ExpectDropped(DenseTp2(), kMlp | (1u << MP_RC_LAYERNORM), 49152 + 4096 + 4096);
}

// Its backward re-runs gate, up and down, 3 x 2 T f H = 3 x 2 x 64 x 96 x 64 = 2,359,296
// FLOPs, and the SwiGLU, without the norm; the TP region's all-gather of the sequence
// shards and the reduce-scatter of down's partial sums run again, each on the [T, H] bf16
// tensor, 2 x 64 x 64 = 8,192 bytes: once a block, two blocks.
TEST(RcModule, MlpRecomputesTheMlpAndItsTpCollectives) {
  const Rc r = Recomputed(DenseTp2(), kMlp);
  EXPECT_EQ(r.gemms, 2 * 3);
  EXPECT_DOUBLE_EQ(r.gemm_flops, 2 * 3 * 2.0 * 64 * 96 * 64);
  EXPECT_EQ(r.acts, 2);
  EXPECT_EQ(r.norms, 0);
  EXPECT_EQ(r.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_TP], 2);
  EXPECT_EQ(r.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_TP], 2);
  EXPECT_DOUBLE_EQ(r.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_TP], 2 * 8192.0);
  EXPECT_DOUBLE_EQ(r.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_TP], 2 * 8192.0);
  EXPECT_EQ(Recomputed(DenseTp2(), 0).gemms, 0);
}

// tiny-moe (H 64, 8 experts of 32, top-2, one shared expert of 64, two MoE layers) on
// dp_replicate=2 x ep=2, seq 64: T = 64 tokens, R = 2T = 128 routed rows, balanced.
Opts MoeEp2() { return Tiny("tiny-moe", "dp_replicate=2,ep=2"); }

// moe keeps the pre-MLP norm's input and rstd and the MoE layer's input (2TH without SP) and
// drops, per token: the router's fp32 probabilities 4 x 8 = 32, the top-k weights and
// indices 12 x 2 = 24, the dispatched rows 2 x 2 x 64 = 256, the experts' gate, up, silu and
// product 4 x 2 x 2 x 32 = 512, the shared expert's 4 x 2 x 64 = 512: 1,336 bytes, 85,504 a
// block. shared_experts alone drops the shared expert's 512 a token, 32,768 a block, and
// nothing more beside moe.
TEST(RcModule, MoeKeepsTheMoeLayersInputAlone) {
  ExpectDropped(MoeEp2(), kMoe, 1336 * 64);
  ExpectDropped(MoeEp2(), kShared, 512 * 64);
  ExpectDropped(MoeEp2(), kMoe | kShared, 1336 * 64);
  ExpectDropped(MoeEp2(), kMoe | (1u << MP_RC_MOE_ACT), 1336 * 64);
}

// moe's backward re-runs the router 2 T E H = 65,536 FLOPs, the experts' gate, up and down
// 3 x 2 R H f_e = 1,572,864 and the shared expert's 3 x 2 T H f_s = 1,572,864 (3,211,264 a
// layer, seven GEMMs), both SwiGLUs, and the dispatch and combine all-to-alls again, each
// R x H bf16 = 128 x 64 x 2 = 16,384 bytes; shared_experts within it runs the shared expert
// a second time (moe_layer.py nests its checkpoint in moe's): three more GEMMs.
TEST(RcModule, MoeRecomputesTheLayerAndItsAllToAlls) {
  const double router = 2.0 * 64 * 8 * 64, experts = 3 * 2.0 * 128 * 64 * 32, shared = 3 * 2.0 * 64 * 64 * 64;
  const Rc r = Recomputed(MoeEp2(), kMoe);
  EXPECT_EQ(r.gemms, 2 * 7);
  EXPECT_DOUBLE_EQ(r.gemm_flops, 2 * (router + experts + shared));
  EXPECT_EQ(r.acts, 2 * 2);
  EXPECT_EQ(r.norms, 0);
  EXPECT_EQ(r.n_comm[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 2 * 2);
  EXPECT_DOUBLE_EQ(r.comm_bytes[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 2 * 2 * 16384.0);

  const Rc rn = Recomputed(MoeEp2(), kMoe | kShared);
  EXPECT_EQ(rn.gemms, 2 * 10);
  EXPECT_DOUBLE_EQ(rn.gemm_flops, 2 * (router + experts + 2 * shared));

  const Rc rs = Recomputed(MoeEp2(), kShared);
  EXPECT_EQ(rs.gemms, 2 * 3);
  EXPECT_DOUBLE_EQ(rs.gemm_flops, 2 * shared);
  EXPECT_EQ(rs.n_comm[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 0);
}

// Under FSDP2 (tiny-moe on dp_shard=4 x ep=2, torchtitan's memory model: a MoE block's
// attention, MoE and experts units) the recompute waits for the backward's gathers of the
// units it runs, whose copy-outs (COPY kernels) it then runs, once: as many copy-outs as
// without it, in the recompute phase the MoE unit's of each of the two layers under
// shared_experts (2), the MoE and the experts units' under moe (4); the schedule's
// dependencies check (Build).
TEST(RcModule, RecomputeWaitsForTheBackwardsGathersOnce) {
  Opts o;
  o.model = "tiny-moe";
  o.mesh = "dp_shard=4,ep=2";
  o.seq = 64;
  struct Copies {
    int all = 0, recompute = 0;
  };
  auto copies = [&](uint32_t bits) {
    Opts x = o;
    x.recompute_modules = bits;
    Built b;
    Build(&b, x);
    Copies c;
    for (const Inst &i : Expand(b.s)) {
      if (i.op->type != MP_OP_COMPUTE || i.op->kernel != MP_KERNEL_COPY) continue;
      c.all++;
      c.recompute += i.op->phase == MP_PHASE_RECOMPUTE;
    }
    return c;
  };
  const Copies none = copies(0);
  EXPECT_GT(none.all, 0);
  EXPECT_EQ(none.recompute, 0);
  const struct {
    uint32_t bits;
    int recompute;
  } cases[] = {{kShared, 2}, {kMoe, 4}, {kMoe | kShared, 4}};
  for (const auto &k : cases) {
    const Copies c = copies(k.bits);
    EXPECT_EQ(c.all, none.all) << k.bits;
    EXPECT_EQ(c.recompute, k.recompute) << k.bits;
  }
}

// What Megatron-Core would leave a no-op, or refuses, is refused by name.
TEST(RcModule, RefusesWhatTheModelOrTheOptionsLack) {
  const struct {
    const char *model, *mesh;
    uint32_t bits;
    int a2a_overlap;
    const char *want;
  } cases[] = {
      {"tiny-moe", "dp_replicate=2,ep=2", kMlp, 0, "recompute module mlp: every layer of tiny-moe is a MoE layer"},
      {"tiny-dense", "tp=2", kMoe, 0, "recompute module moe: model tiny-dense has no routed experts"},
      {"tiny-dense", "tp=2", kShared, 0, "recompute module shared_experts: model tiny-dense has no routed experts"},
      {"tiny-moe", "dp_replicate=2,ep=2", kMoe, 1, "recompute module moe: Megatron-Core's EP all-to-all overlap"},
  };
  for (const auto &c : cases) {
    Built b;
    Opts o = Tiny(c.model, c.mesh);
    o.recompute_modules = c.bits;
    mp_ctx_init(&b.ctx);
    ASSERT_EQ(mp_model_load(&b.ctx, o.model, &b.model), MP_OK);
    mp_mesh mesh;
    ASSERT_EQ(mp_mesh_parse(&b.ctx, o.mesh, 0, &mesh), MP_OK);
    mp_plan_options po;
    sched_test::FillOptions(o, &po);
    po.moe_a2a_overlap = c.a2a_overlap;
    EXPECT_EQ(mp_build_plan(&b.ctx, &b.model, &mesh, &po, &b.plan), MP_ERR_INVALID) << c.want;
    EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find(c.want), std::string::npos) << mp_errmsg(&b.ctx);
  }
}

// Megatron-Core refuses layernorm and moe_act under float8's delayed scaling
// (transformer_config.py); mlp checkpoints under te_checkpoint with any recipe. Megatron's
// float8 default recipe is delayed.
TEST(RcModule, DelayedScalingRefusesTheOutputDiscardingNormsOnly) {
  Opts o = DenseTp2();
  o.fp8 = 1;
  o.recompute_modules = 1u << MP_RC_LAYERNORM;
  Built b;
  EXPECT_EQ(PlanOnly(&b, o), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find("Megatron-Core refuses them with delayed scaling"), std::string::npos)
      << mp_errmsg(&b.ctx);
  o.fp8_recipe = MP_FP8_TENSORWISE;
  Built t;
  EXPECT_EQ(PlanOnly(&t, o), MP_OK) << mp_errmsg(&t.ctx);
  o.fp8_recipe = MP_FP8_DEFAULT;
  o.recompute_modules = kMlp;
  Built m;
  EXPECT_EQ(PlanOnly(&m, o), MP_OK) << mp_errmsg(&m.ctx);
}

}  // namespace
