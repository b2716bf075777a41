// Multi-head latent attention through the plan and the schedule (exec/schedule_mla.c):
// parameter shapes after the TP pass, the FSDP attention unit, the GEMMs and their FLOPs per
// layer, the TP collectives, the saved activations per AC policy, the step's FLOPs against
// the model's, and the refusals, all against figures derived by hand from DeepSeek-V3's and
// DeepSeek-V2-Lite's published configs (data/models/deepseek-*.json).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "exec/act_layout.h"
#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

using namespace sched_test;

// model's plan on mesh at seq 4096 under ac, and rank 0's schedule.
void BuildMla(Built *b, const char *model, const char *mesh, mp_ac_mode ac = MP_AC_NONE) {
  Opts o;
  o.model = model;
  o.mesh = mesh;
  o.seq = 4096;
  o.ac = ac;
  Build(b, o);
}

// The weight of module `mod` of block `layer`.
const mp_param *Weight(const mp_plan *p, int layer, mp_module mod) {
  for (int i = 0; i < p->n_params; i++)
    if (p->params[i].layer == layer && p->params[i].module == mod &&
        p->params[i].role == MP_ROLE_WEIGHT)
      return &p->params[i];
  return nullptr;
}

struct Shape {
  mp_module mod;
  int64_t out, in, tp_out, tp_in;
  mp_tp_style style;
};

// DeepSeek-V3 at tp=8 (128 heads: 16 per rank; q/k head 128 + 64 = 192, v head 128):
//   q_a_proj           [1536, 7168]            replicated (the latent is needed whole)
//   q_a_layernorm      [1536]                  replicated
//   q_b_proj           [128 x 192 = 24576, 1536]  colwise -> [3072, 1536]
//   kv_a_proj_with_mqa [512 + 64 = 576, 7168]  replicated
//   kv_a_layernorm     [512]                   replicated
//   kv_b_proj          [128 x (128 + 128) = 32768, 512] colwise -> [4096, 512]
//   o_proj             [7168, 128 x 128 = 16384]  rowwise -> [7168, 2048]
TEST(Mla, DeepSeekV3ShapesAfterTensorParallel) {
  Built b;
  BuildMla(&b, "deepseek-v3", "dp_shard=8,tp=8");
  const Shape want[] = {
      {MP_MOD_Q_A, 1536, 7168, 1536, 7168, MP_TP_NONE},
      {MP_MOD_Q_A_NORM, 1536, 1, 1536, 1, MP_TP_NONE},
      {MP_MOD_Q_B, 24576, 1536, 3072, 1536, MP_TP_COLWISE},
      {MP_MOD_KV_A, 576, 7168, 576, 7168, MP_TP_NONE},
      {MP_MOD_KV_A_NORM, 512, 1, 512, 1, MP_TP_NONE},
      {MP_MOD_KV_B, 32768, 512, 4096, 512, MP_TP_COLWISE},
      {MP_MOD_O, 7168, 16384, 7168, 2048, MP_TP_ROWWISE},
  };
  for (int layer : {0, 3}) {  // a dense block and an MoE block
    for (const Shape &w : want) {
      SCOPED_TRACE(mp_module_name(w.mod));
      const mp_param *prm = Weight(b.plan, layer, w.mod);
      ASSERT_NE(prm, nullptr);
      EXPECT_EQ(prm->shape[0], w.out);
      EXPECT_EQ(prm->shape[1], w.in);
      EXPECT_EQ(prm->tp_shape[0], w.tp_out);
      EXPECT_EQ(prm->tp_shape[1], w.tp_in);
      EXPECT_EQ(prm->tp_style, w.style);
    }
    // no q/k/v Linears of the grouped-query kind
    EXPECT_EQ(Weight(b.plan, layer, MP_MOD_Q), nullptr);
    EXPECT_EQ(Weight(b.plan, layer, MP_MOD_K), nullptr);
    EXPECT_EQ(Weight(b.plan, layer, MP_MOD_V), nullptr);
  }
  EXPECT_STREQ(Weight(b.plan, 0, MP_MOD_KV_A)->fqn, "layers.0.attention.kv_a_proj_with_mqa.weight");
  // The plan's parameters add up to the model's count and its MTP module's (DeepSeek-V3's
  // 671,026,404,352 and 11,610,067,968: tests/schedule/mtp_test.cc derives the latter).
  int64_t total = 0;
  for (int i = 0; i < b.plan->n_params; i++) total += mp_param_numel(&b.plan->params[i]);
  EXPECT_EQ(total, mp_model_param_count(&b.model) + mp_model_mtp_params(&b.model));
  EXPECT_EQ(mp_model_param_count(&b.model), 671026404352LL);
}

// DeepSeek-V2-Lite at tp=8 (16 heads: 2 per rank), no q latent: q_proj [16 x 192 = 3072,
// 2048] colwise -> [384, 2048]; kv_b_proj [16 x 256 = 4096, 512] -> [512, 512]; o_proj
// [2048, 16 x 128 = 2048] rowwise -> [2048, 256].
TEST(Mla, DeepSeekV2LiteShapesAfterTensorParallel) {
  Built b;
  BuildMla(&b, "deepseek-v2-lite", "tp=8");
  const mp_param *q = Weight(b.plan, 1, MP_MOD_Q), *kvb = Weight(b.plan, 1, MP_MOD_KV_B),
                 *out = Weight(b.plan, 1, MP_MOD_O);
  ASSERT_TRUE(q && kvb && out);
  EXPECT_EQ(q->shape[0], 3072);
  EXPECT_EQ(q->tp_shape[0], 384);
  EXPECT_EQ(q->tp_style, MP_TP_COLWISE);
  EXPECT_EQ(kvb->tp_shape[0], 512);
  EXPECT_EQ(out->shape[1], 2048);
  EXPECT_EQ(out->tp_shape[1], 256);
  EXPECT_EQ(Weight(b.plan, 1, MP_MOD_Q_A), nullptr);
  EXPECT_EQ(Weight(b.plan, 1, MP_MOD_Q_B), nullptr);
}

// Under EP an MoE block is split into attention, MoE and experts units; MLA's latent
// projections and norms belong to the attention unit.
TEST(Mla, FsdpAttentionUnitHoldsTheLatents) {
  Built b;
  BuildMla(&b, "deepseek-v2-lite", "dp_shard=8,ep=8");
  for (mp_module mod : {MP_MOD_ATTN_NORM, MP_MOD_Q, MP_MOD_KV_A, MP_MOD_KV_A_NORM, MP_MOD_KV_B,
                        MP_MOD_O}) {
    const mp_param *prm = Weight(b.plan, 5, mod);
    ASSERT_NE(prm, nullptr) << mp_module_name(mod);
    EXPECT_STREQ(b.plan->units[prm->fsdp_unit].name, "layers.5.attention") << mp_module_name(mod);
  }
}

// tp must divide the heads: V2-Lite's 16 heads refuse tp=3 (it also divides neither
// d_model 2048 nor the vocab; n_heads is checked first and named).
TEST(Mla, TensorParallelMustDivideTheHeads) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "deepseek-v2-lite", &m), MP_OK) << mp_errmsg(&ctx);
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&ctx, "tp=3", 0, &mesh), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options po;
  mp_plan_options_init(&po);
  po.seq = 4096;
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&ctx, &m, &mesh, &po, &p), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("tp=3 does not divide n_heads=16"), std::string::npos)
      << mp_errmsg(&ctx);
  mp_plan_destroy(p);
}

// GEMM FLOPs of block `layer`'s module `mod` in one micro-batch's forward or backward.
double GemmFlops(const std::vector<Inst> &v, int layer, int mod, mp_phase phase) {
  double f = 0;
  for (const Inst &x : v)
    if (x.layer == layer && x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_GEMM &&
        x.op->module == mod && x.op->phase == phase)
      f += x.op->flops;
  return f;
}

// DeepSeek-V3, T = 4096 tokens per rank. Forward GEMMs of one block's attention, 2 T out in:
//   tp=1: q_a 2T x 1536 x 7168, q_b 2T x 24576 x 1536, kv_a 2T x 576 x 7168,
//         kv_b 2T x 32768 x 512, o 2T x 7168 x 16384: 2T x 187,105,280 = T x 374,210,560
//   tp=8: q_b, kv_b and o an eighth; q_a and kv_a whole on every rank (replicated):
//         2T (11,010,048 + 4,128,768 + (37,748,736 + 16,777,216 + 117,440,512) / 8)
//         = T x 73,269,248
// Backward: DGRAD and WGRAD, twice the forward. The attention core, causal: forward
// 2 T (s/2) heads (192 + 128) = 2 x 4096 x 2048 x 128 x 320 at tp=1, backward twice that.
TEST(Mla, GemmFlopsPerLayer) {
  const double T = 4096;
  for (int tp : {1, 8}) {
    SCOPED_TRACE(tp);
    Built b;
    BuildMla(&b, "deepseek-v3", tp == 1 ? "dp_shard=8" : "dp_shard=8,tp=8");
    auto v = Expand(b.s);
    const double split = tp;
    const std::map<int, double> per_module = {
        {MP_MOD_Q_A, 2 * T * 1536 * 7168},
        {MP_MOD_Q_B, 2 * T * 24576 * 1536 / split},
        {MP_MOD_KV_A, 2 * T * 576 * 7168},
        {MP_MOD_KV_B, 2 * T * 32768 * 512 / split},
        {MP_MOD_O, 2 * T * 7168 * 16384 / split},
    };
    double sum = 0;
    for (const auto &kv : per_module) {
      SCOPED_TRACE(mp_module_name((mp_module)kv.first));
      EXPECT_DOUBLE_EQ(GemmFlops(v, 4, kv.first, MP_PHASE_FORWARD), kv.second);
      EXPECT_DOUBLE_EQ(GemmFlops(v, 4, kv.first, MP_PHASE_BACKWARD), 2 * kv.second);
      sum += kv.second;
    }
    EXPECT_DOUBLE_EQ(sum, tp == 1 ? T * 374210560.0 : T * 73269248.0);
    double core_f = 0, core_b = 0;
    for (const Inst &x : v)
      if (x.layer == 4 && x.op->kernel == MP_KERNEL_ATTENTION && x.op->type == MP_OP_COMPUTE)
        (x.op->phase == MP_PHASE_FORWARD ? core_f : core_b) += x.op->flops;
    EXPECT_DOUBLE_EQ(core_f, 2 * T * 2048 * (128 / split) * 320);
    EXPECT_DOUBLE_EQ(core_b, 2 * core_f);
  }
}

// TP collectives of one block at tp=8 with sequence parallelism, T = 4096 tokens, X bf16:
//   forward   all-gather [T, 7168] before the down projections, reduce-scatter after o_proj
//             (and the MLP's pair)
//   backward  all-gather of o_proj's output gradient; all-reduce of the latents' gradients,
//             [T, 512 + 64] after kv_b and, V3, [T, 1536] after q_b; V3 leaves the region
//             without a collective (the down projections' input gradient is whole), V2-Lite
//             reduce-scatters q_proj's partial input gradient [T, 2048]
TEST(Mla, TensorParallelCollectivesOfTheAttention) {
  const double T = 4096;
  struct Case {
    const char *model;
    double H;
    int q_latent;
  } cases[] = {{"deepseek-v3", 7168, 1}, {"deepseek-v2-lite", 2048, 0}};
  for (const Case &c : cases) {
    SCOPED_TRACE(c.model);
    Built b;
    BuildMla(&b, c.model, "tp=8");
    std::vector<std::string> fwd, bwd;
    for (const Inst &x : Expand(b.s)) {
      if (x.layer != 0 || x.op->type != MP_OP_COMM || x.op->group != MP_GROUP_TP) continue;
      const int m = x.op->module;
      const bool attn = m == MP_MOD_KV_A || m == MP_MOD_Q || m == MP_MOD_Q_B ||
                        m == MP_MOD_KV_B || m == MP_MOD_O;
      if (!attn) continue;
      std::string s = std::string(mp_module_name((mp_module)m)) + ":" +
                      std::to_string((int)x.op->coll) + ":" + std::to_string((int64_t)x.op->bytes);
      (x.op->phase == MP_PHASE_FORWARD ? fwd : bwd).push_back(s);
    }
    auto name = [](mp_module m, mp_coll c, double bytes) {
      return std::string(mp_module_name(m)) + ":" + std::to_string((int)c) + ":" +
             std::to_string((int64_t)bytes);
    };
    const std::vector<std::string> want_fwd = {
        name(MP_MOD_KV_A, MP_COLL_ALL_GATHER, 2 * T * c.H),
        name(MP_MOD_O, MP_COLL_REDUCE_SCATTER, 2 * T * c.H)};
    std::vector<std::string> want_bwd = {name(MP_MOD_O, MP_COLL_ALL_GATHER, 2 * T * c.H),
                                         name(MP_MOD_KV_B, MP_COLL_ALL_REDUCE, 2 * T * 576)};
    if (c.q_latent) want_bwd.push_back(name(MP_MOD_Q_B, MP_COLL_ALL_REDUCE, 2 * T * 1536));
    else want_bwd.push_back(name(MP_MOD_Q, MP_COLL_REDUCE_SCATTER, 2 * T * c.H));
    EXPECT_EQ(fwd, want_fwd);
    EXPECT_EQ(bwd, want_bwd);
  }
}

// Saved bytes per token of DeepSeek-V3's block 0 (dense MLP), tp=1, bf16 (schedule_mla.c's
// list; 4-byte RMSNorm statistics):
//   x, the block input 2 x 7168                                            14336
//   attention: rstd 4, normed x 14336; q_a's output 3072, rstd 4, normed q latent 3072;
//     kv_a's output 2 x 576 = 1152, rstd 4, normed kv latent 1024; kv_b's output
//     2 x 128 x 256 = 65536 (v a view of it); q and k 2 x 2 x 128 x 192 = 98304;
//     output 2 x 128 x 128 = 32768; log-sum-exp 4 x 128 = 512                219788
//   MLP: h 14336 + rstd 4, normed h 14336, gate, up, silu and product
//     4 x 2 x 18432 = 147456                                               176132
// none keeps 410256; full the block input 14336; selective-core all but the log-sum-exp;
// selective the block input, attention_norm's rstd and its output, and the MLP;
// selective-op (torchtitan's: the odd-numbered mm outputs, q_a #1, kv_a #3, o #5, up #7,
// and the attention's output and log-sum-exp) 14336 + 3072 + 1152 + 14336 + 32768 + 512 +
// 36864 = 103040.
TEST(Mla, SavedActivationBytesPerToken) {
  const int64_t x = 14336, attn = 4 + 14336 + 3072 + 4 + 3072 + 1152 + 4 + 1024 + 65536 +
                                       98304 + 32768 + 512,
                mlp = 14336 + 4 + 14336 + 147456;
  EXPECT_EQ(attn, 219788);
  EXPECT_EQ(x + attn + mlp, 410256);
  const int64_t T = 4096;
  std::map<mp_ac_mode, int64_t> want = {
      {MP_AC_NONE, T * 410256},
      {MP_AC_FULL, T * 14336},
      {MP_AC_SELECTIVE_CORE, T * (410256 - 512)},
      {MP_AC_SELECTIVE, T * (x + 4 + 14336 + mlp)},
      {MP_AC_SELECTIVE_OP, T * 103040},
  };
  EXPECT_EQ(x + 3072 + 1152 + 14336 + 32768 + 512 + 36864, 103040);
  for (const auto &w : want) {
    SCOPED_TRACE(mp_ac_mode_name(w.first));
    Built b;
    BuildMla(&b, "deepseek-v3", "dp_shard=8", w.first);
    EXPECT_EQ(SavedByBlock(b.s, 0), w.second);
  }
}

// Selective-op's recompute runs the matmuls whose outputs it does not keep, up to the block's
// last saved tensor (torch's non-reentrant checkpoint stops there: down's input, packed
// before down's GEMM runs): V3 with a query latent recomputes q_b, kv_b and gate, not down,
// whose output nothing in the backward reads; V2-Lite (q_proj #1, kv_a #2, kv_b #3, o #4,
// gate #5, up #6, down #7) recomputes kv_a, o and up. Its saved bytes per token for block 0:
// x 4096, q_proj's output 2 x 3072, kv_b's 2 x 4096, the attention's output 2 x 2048 and
// log-sum-exp 4 x 16, gate 2 x 10944, down's output 4096: 48576.
TEST(Mla, SelectiveOpRecomputesTheOtherMatmuls) {
  struct Case {
    const char *model;
    std::vector<int> recomputed;
  } cases[] = {{"deepseek-v3", {MP_MOD_Q_B, MP_MOD_KV_B, MP_MOD_GATE}},
               {"deepseek-v2-lite", {MP_MOD_KV_A, MP_MOD_O, MP_MOD_UP}}};
  for (const Case &c : cases) {
    SCOPED_TRACE(c.model);
    Built b;
    BuildMla(&b, c.model, "dp_shard=8", MP_AC_SELECTIVE_OP);
    std::vector<int> got;
    for (const Inst &x : Expand(b.s))
      if (x.layer == 0 && x.op->phase == MP_PHASE_RECOMPUTE && x.op->kernel == MP_KERNEL_GEMM &&
          x.op->type == MP_OP_COMPUTE)
        got.push_back(x.op->module);
    EXPECT_EQ(got, c.recomputed);
  }
  Built b;
  BuildMla(&b, "deepseek-v2-lite", "dp_shard=8", MP_AC_SELECTIVE_OP);
  EXPECT_EQ(4096 + 6144 + 8192 + 4096 + 64 + 21888 + 4096, 48576);
  EXPECT_EQ(SavedByBlock(b.s, 0), 4096 * 48576);
}

// The step's FLOPs against the model's 6 N + attention (V2-Lite, one rank's whole model on
// T = 4096 tokens): the schedule runs the causal half of the attention the model counts
// (6 L heads (192 + 128) s per token) and the norms as element-wise kernels; the rest
// (element-wise work) is under 1 %.
TEST(Mla, StepFlopsMatchModelFlops) {
  Built b;
  BuildMla(&b, "deepseek-v2-lite", "dp_shard=8");
  const double T = 4096, s = 4096, L = 27, heads = 16;
  const double model = b.s->model_flops_per_step;
  EXPECT_DOUBLE_EQ(model, T * 18105996288.0);  // tests/exec/model_test.cc's hand count
  const double causal_half = 3 * L * heads * (192 + 128) * s * T;
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_NEAR(t.flops / (model - causal_half), 1.0, 0.01);
  EXPECT_LT(t.flops, model);
}

// Ring attention under cp=2 (V2-Lite, seq 4096: T = 2048 tokens per rank, 16 heads): the
// decompressed K (16 x 192 = 3072) and V (16 x 128 = 2048) travel at their own widths (per
// head already, nothing for repeat_kv to expand), bf16: each pass gathers the 2 ranks' 2 T
// (3072 + 2048) = 20,971,520 bytes, 41,943,040 in all; backward's fp32 dK, dV shifts carry
// 4 T (3072 + 2048);
// the steps' FLOPs add up to the local causal attention 2 T (s/2) heads (192 + 128), over the
// whole sequence's keys: 2 x 2048 x 2048 x 16 x 320.
TEST(Mla, ContextParallelRingCarriesKAndVAtTheirWidths) {
  Built b;
  BuildMla(&b, "deepseek-v2-lite", "cp=2");
  const double T = 2048;
  double fwd_flops = 0;
  int kv_gathers = 0, dkv_shifts = 0;
  for (const Inst &x : Expand(b.s)) {
    if (x.layer != 0) continue;
    if (x.op->type == MP_OP_COMM && x.op->group == MP_GROUP_CP) {
      if (x.op->coll == MP_COLL_ALL_GATHER && x.op->bytes == 2 * 2 * T * 5120) kv_gathers++;
      else if (x.op->coll == MP_COLL_SENDRECV && x.op->bytes == 4 * T * 5120) dkv_shifts++;
      else ADD_FAILURE() << "ring transfer of " << x.op->bytes << " bytes";
    }
    if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_ATTENTION &&
        x.op->phase == MP_PHASE_FORWARD && x.op->flops > 1e9)  // not the merges
      fwd_flops += x.op->flops * (x.op->count > 1 ? x.op->count : 1);
  }
  EXPECT_EQ(kv_gathers, 2);  // forward and backward
  EXPECT_EQ(dkv_shifts, 2);  // one per backward step
  EXPECT_DOUBLE_EQ(fwd_flops, 2 * T * 2048 * 16 * 320);
}

// What the schedule does not describe for MLA is refused with the reason.
// The runtime's activation layout for MLA (exec/act_layout.h's MLA rows, which the runtime
// carves and the meshplan-cpu/-cuda memory models allocate): tiny-mla's dense block, one
// micro-batch of B = 2 x S = 16 tokens on one rank, fp32. Hand-derived from the model (C 64,
// 4 heads of qk_nope 8 + qk_rope 4 = 12, v_head 6, kv_lora 16, no q latent, d_ff 96), in
// floats (every tensor a multiple of 16 floats, so no 64-byte padding): xn1, xmid, xn2 N C =
// 2048 each; rstd1, rstd2, rstdkv N = 32 each; q, k N 4 x 12 = 1536 each; v N 4 x 6 = 768;
// kva N (16 + 4) = 640; kvn N 16 = 512; kvb N 4 (8 + 6) = 1792; qpe N 4 x 4 = 512; g, u, h
// N 96 = 3072 each. Core: att N 4 x 6 = 768, lse B 4 S = 128. RoPE tables S x qk_rope / 2.
TEST(Mla, RuntimeLayout) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "tiny-mla", &m), MP_OK) << mp_errmsg(&ctx);
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=1", 0, &mesh), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options po;
  mp_plan_options_init(&po);
  po.seq = 16;
  po.micro_batch = 2;
  po.global_batch = 2;
  po.mem_model = MP_MEM_MODEL_MESHPLAN_CPU;
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &po, &p), MP_OK) << mp_errmsg(&ctx);
  mp_arena *a = mp_arena_create();
  mp_schedule *s = nullptr;
  ASSERT_EQ(mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_COMPACT, a, &s), MP_OK) << mp_errmsg(&ctx);
  mp_act_dims d = {};
  d.B = 2, d.S = 16, d.N = 32, d.NS = 32, d.C = 64, d.HD = 12, d.DV = 6, d.RD = 4, d.NH = 4, d.NKV = 4;
  d.mla = 1, d.KL = 16, d.DN = 8, d.DR = 4, d.F = 96, d.L = 3, d.NP = 1, d.xs = 4, d.tp = 1, d.ep = 1, d.cp = 1;
  d.host_mem = 1;
  mp_act_layout l;
  mp_act_layout_fill(&l, &d, 0);
  const size_t block = 3 * 2048 + 3 * 32 + 2 * 1536 + 768 + 640 + 512 + 1792 + 512 + 3 * 3072;
  EXPECT_EQ(l.bytes[MP_ACT_ALLOC_BLOCK], 4 * block);
  EXPECT_EQ(l.bytes[MP_ACT_ALLOC_CORE], 4u * (768 + 128));
  EXPECT_EQ(l.bytes[MP_ACT_ALLOC_ROPE_COS], 4u * 16 * 2);
  // WS: dxn N C 2048; datt 768, dq 1536, dk 1536, dv 768, dqp 1536 (no dkp under MLA);
  // dqr, dqrp N 4 x 4 = 512 each, dkr N 4 = 128, dkvb 1792, dlat 640, dkv 512; dh, dg, du 3072
  const size_t ws = 2048 + 768 + 3 * 1536 + 768 + 2 * 512 + 128 + 1792 + 640 + 512 + 3 * 3072;
  EXPECT_EQ(l.bytes[MP_ACT_ALLOC_WS], 4 * ws);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
}

}  // namespace
