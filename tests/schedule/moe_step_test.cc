// DeepSeek-V3's step mechanisms in the schedule, against hand derivations: the float8
// dispatch's bytes (tech report arXiv 2412.19437, sec. 3.3.3) and Megatron-Core's
// output-discarding recompute modules (transformer_config.py recompute_modules, core_v0.14):
// what each stops saving and what its recompute runs.
#include <gtest/gtest.h>

#include <string>

#include "tests/schedule/built.h"

namespace {

using sched_test::Build;
using sched_test::Built;
using sched_test::Expand;
using sched_test::Inst;
using sched_test::Opts;
using sched_test::SavedByBlock;

// DeepSeek-V3 on pp=16 x dp_shard=128 x ep=64 with EP inside dp_shard (torchtitan's memory
// model): rank 128 is stage 1, layers 3-6, four MoE layers. seq 4096, micro-batch 1.
Opts DeepSeekStage1() {
  Opts o;
  o.model = "deepseek-v3";
  o.mesh = "pp=16,dp_shard=128,ep=64";
  o.seq = 4096;
  o.rank = 128;
  return o;
}

// A MoE layer moves E = 4096 tokens x top_k 8 x 7168 elements each way. Without AC its
// forward dispatches and combines, its backward sends the output gradient to the experts
// and their input gradient back: four all-to-alls. Under float8 dispatch the two towards
// the experts (forward dispatch, the gradient before the down projections) carry 1 byte an
// element and an fp32 scale per 128 (1 + 4/128 bytes), the two combines 2 bytes (bf16).
// Under full AC the recomputed forward dispatches and combines again: 3 + 3.
TEST(MoeStep, Fp8DispatchHalvesTheTransfersToTheExperts) {
  const double E = 4096.0 * 8 * 7168;
  for (mp_ac_mode ac : {MP_AC_NONE, MP_AC_FULL}) {
    SCOPED_TRACE(mp_ac_mode_name(ac));
    const int per = ac == MP_AC_FULL ? 3 : 2;  // each way, per layer
    for (int on : {0, 1}) {
      Built b;
      Opts o = DeepSeekStage1();
      o.ac = ac;
      o.fp8 = 1;
      o.moe_fp8_dispatch = on;
      Build(&b, o);
      mp_schedule_totals t;
      mp_schedule_totals_compute(b.s, &t);
      EXPECT_EQ(t.n_comm[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 4 * 2 * per);
      const double to_experts = on ? 1.0 + 4.0 / 128.0 : 2.0;
      EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 4.0 * per * E * (to_experts + 2.0)) << on;
    }
  }
}

TEST(MoeStep, Fp8DispatchNeedsFloat8AndExpertParallelism) {
  Built b;
  Opts o = DeepSeekStage1();
  mp_ctx_init(&b.ctx);
  ASSERT_EQ(mp_model_load(&b.ctx, o.model, &b.model), MP_OK);
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&b.ctx, o.mesh, 0, &mesh), MP_OK);
  mp_plan_options po;
  mp_plan_options_init(&po);
  po.seq = 4096;
  po.moe_fp8_dispatch = 1;  // fp8 off
  EXPECT_EQ(mp_build_plan(&b.ctx, &b.model, &mesh, &po, &b.plan), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find("float8 dispatch"), std::string::npos) << mp_errmsg(&b.ctx);
}

// What the recompute modules stop saving in a MoE block of DeepSeek-V3 (T = 4096 tokens,
// H 7168, q latent 1536, kv latent 512, 128 heads of q/k 192 and v 128: q and k 24,576
// wide, kv_b 32,768; top_k 8 experts of 2048), per token in bytes:
//   layernorm    the attention's normed input 2H and the MoE's normed input 2H = 28,672
//   mla_up_proj  the normed latents 2 x 1536 + 2 x 512 and their rstd 4 + 4, kv_b's output
//                2 x 32,768, the assembled q and k 2 x (24,576 + 24,576) = 167,944
//   moe_act      the experts' silu and product 2 x 2 x 8 x 2048 = 65,536
// 262,152 bytes a token together.
TEST(MoeStep, RecomputeModulesSaveWhatTheyRecompute) {
  const int64_t T = 4096;
  const struct {
    uint32_t bits;
    int64_t per_token;
  } cases[] = {{1u << MP_RC_LAYERNORM, 28672},
               {1u << MP_RC_MLA_UP_PROJ, 167944},
               {1u << MP_RC_MOE_ACT, 65536},
               {(1u << MP_RC_LAYERNORM) | (1u << MP_RC_MLA_UP_PROJ) | (1u << MP_RC_MOE_ACT), 262152}};
  Built none;
  Build(&none, DeepSeekStage1());
  const int64_t all = SavedByBlock(none.s, 3);
  for (const auto &c : cases) {
    SCOPED_TRACE(c.bits);
    Built b;
    Opts o = DeepSeekStage1();
    o.recompute_modules = c.bits;
    Build(&b, o);
    EXPECT_EQ(all - SavedByBlock(b.s, 3), c.per_token * T);
  }
}

// What their recompute runs per MoE layer, in the backward (the recompute phase): the four
// RMSNorms (attention, MoE input, the q and kv latents), q_b's and kv_b's GEMMs, 2 T (24,576
// x 1536 + 32,768 x 512) FLOPs, and the experts' SwiGLU; nothing else, and nothing of it
// without the modules.
TEST(MoeStep, RecomputeModulesRunTheirModulesAgain) {
  const double T = 4096;
  Opts o = DeepSeekStage1();
  o.recompute_modules = (1u << MP_RC_LAYERNORM) | (1u << MP_RC_MLA_UP_PROJ) | (1u << MP_RC_MOE_ACT);
  Built b;
  Build(&b, o);
  int norms = 0, acts = 0, gemms = 0, other = 0;
  double gemm_flops = 0;
  for (const Inst &x : Expand(b.s)) {
    if (x.op->phase != MP_PHASE_RECOMPUTE || x.op->type != MP_OP_COMPUTE) continue;
    if (x.op->kernel == MP_KERNEL_NORM) norms++;
    else if (x.op->kernel == MP_KERNEL_ACTIVATION) acts++;
    else if (x.op->kernel == MP_KERNEL_GEMM) gemms++, gemm_flops += x.op->flops;
    else if (x.op->kernel != MP_KERNEL_ROPE && x.op->kernel != MP_KERNEL_COPY) other++;
  }
  EXPECT_EQ(norms, 4 * 4);
  EXPECT_EQ(acts, 4);
  EXPECT_EQ(gemms, 4 * 2);
  EXPECT_EQ(other, 0);
  EXPECT_DOUBLE_EQ(gemm_flops, 4 * 2 * T * (24576.0 * 1536 + 32768.0 * 512));
  Built none;
  Build(&none, DeepSeekStage1());
  for (const Inst &x : Expand(none.s)) EXPECT_NE(x.op->phase, MP_PHASE_RECOMPUTE);
}

}  // namespace
