// DeepSeek-V3's low-precision storage (tech report arXiv 2412.19437, sec. 3.3.3) against hand
// derivations: the float8 activation cache's saved bytes per token of a MoE block, the MoE
// block's saved tensors under Megatron-Core (no combine input), and bf16 AdamW moments.
#include <gtest/gtest.h>

#include <string>

#include "tests/schedule/built.h"

namespace {

using sched_test::Build;
using sched_test::Built;
using sched_test::Opts;
using sched_test::SavedByBlock;

// DeepSeek-V3 as the published row runs it (PP 16, EP 64 over the 128 data-parallel ranks of
// a stage), under the megatron memory model with blockwise float8: rank 128 is stage 1,
// layers 3-6, four MoE layers. seq 4096, micro-batch 1.
Opts DeepSeekMegatron() {
  Opts o;
  o.model = "deepseek-v3", o.mesh = "pp=16,dp_replicate=128,ep=64", o.seq = 4096, o.rank = 128;
  o.mem_model = MP_MEM_MODEL_MEGATRON, o.fp8 = 1, o.fp8_recipe = MP_FP8_BLOCKWISE;
  return o;
}

const uint32_t kDeepSeekModules =
    (1u << MP_RC_LAYERNORM) | (1u << MP_RC_MLA_UP_PROJ) | (1u << MP_RC_MOE_ACT);

// The row's settings: DeepSeek's three recompute modules, the cache on or off.
void BuildRow(Built *b, int cache) {
  Opts o = DeepSeekMegatron();
  o.recompute_modules = kDeepSeekModules;
  o.fp8_act_cache = cache;
  Build(b, o);
}

// What a MoE block of DeepSeek-V3 saves per token under Megatron-Core, without AC (H 7168,
// q latent 1536, kv latent 512 + rope 64, 128 heads of q/k 192 (24,576 wide) and v 128
// (kv_b 32,768 wide, the attention output 16,384), top_k 8 experts of 2048, one shared
// expert of 2048, 256 experts; bf16 2 bytes, RMSNorm rstd 4):
//   block input 2H                                                       14,336
//   attention: rstd 4, normed input 2H 14,336, q_a's output 2 x 1536 3072, its rstd 4,
//     the normed q latent 3072, kv_a's output 2 x 576 1152, its rstd 4, the normed kv latent
//     1024, kv_b's output 65,536, q and k 2 x 49,152 98,304, the attention output 32,768,
//     the log-sum-exp 4 x 128 512                                       219,788
//   MoE: its input 2H 14,336 and rstd 4, the normed input 14,336, the router's fp32
//     probabilities 4 x 256 1024, top-k weights and indices 12 x 8 96, the dispatched rows
//     2 x 8 x 7168 114,688, the experts' gate, up, silu, product 4 x 2 x 8 x 2048 131,072,
//     the shared expert's 4 x 2 x 2048 16,384                          291,940
// 526,064 bytes a token. Megatron-Core weights the rows by their probabilities inside the
// experts' activation and its combine is an unweighted unpermute (experts.py,
// token_dispatcher.py, core_v0.14), so the expert outputs in token order are not saved.
TEST(LowPrecision, MegatronMoeBlockSavesNoCombineInput) {
  Built b;
  Opts o = DeepSeekMegatron();
  o.fp8 = 0;
  Build(&b, o);
  EXPECT_EQ(SavedByBlock(b.s, 3), 526064 * 4096LL);
}

// What the cache saves per token of a MoE block: E4M3 with an fp32 scale per 128 saves 31/32
// of a byte an element, the attention output in E5M6 (12 bits) 15/32.
//   attention output 16,384 x 15/32                                        7,680
//   the dispatched rows 8 x 7168 x 31/32                                  55,552
//   the routed SwiGLU inputs (gate's and up's outputs) 2 x 8 x 2048 x 31/32  31,744
//   the shared expert's SwiGLU inputs 2 x 2048 x 31/32 and down's input 2048 x 31/32  5,952
// 100,928 with DeepSeek's recompute modules (the normed inputs, the latents and the routed
// down's input are recomputed); without them also the normed latents (1536 + 512) x 31/32
// 1,984 and the routed down's input 8 x 2048 x 31/32 15,872: 118,784. The block's normed
// input stays bf16 either way: kv_a (576 rows, not a multiple of 128) reads it in bf16.
// Without the cache Transformer Engine's blockwise Linears of the MoE part already save their
// inputs' float8 copies with an fp32 scale per 128 (schedule_act.c te_f8_act; 4 local experts
// of 8,192 rows, whole tiles): the dispatched rows 8 x 7168 x 31/32 = 55,552 and the shared
// down's input 2048 x 31/32 = 1,984 off bf16; without the modules also the routed down's input
// 15,872, less the shared gate/up's float8 copy of the normed input beside the router's bf16,
// 7168 + 4 x 7168 / 128 = 7,392. The cache saves against that: 100,928 - 57,536 = 43,392 and
// 118,784 - (57,536 + 15,872 - 7,392) = 52,768.
TEST(LowPrecision, Fp8ActivationCacheSavesWhatDeepSeekCaches) {
  const int64_t T = 4096;
  const struct {
    uint32_t modules;
    int64_t per_token;
  } cases[] = {{kDeepSeekModules, 43392}, {0, 52768}};
  for (const auto &c : cases) {
    SCOPED_TRACE(c.modules);
    Built off, on;
    Opts o = DeepSeekMegatron();
    o.recompute_modules = c.modules;
    Build(&off, o);
    o.fp8_act_cache = 1;
    Build(&on, o);
    EXPECT_EQ(SavedByBlock(off.s, 3) - SavedByBlock(on.s, 3), c.per_token * T);
  }
}

// The cache's copies the forward writes beside its own casts and SwiGLU, per token of a MoE
// block: the attention output in E5M6 16,384 x (1.5 + 4/128) = 25,088, the routed SwiGLU
// inputs 2 x 8 x 2048 x (1 + 4/128) = 33,792 and the shared expert's 2 x 2048 x (1 + 4/128)
// = 4224: 63,104 bytes of float8 casts more in the block's forward, nothing else.
TEST(LowPrecision, Fp8ActivationCacheWritesItsCopies) {
  double cast_bytes[2] = {0, 0};
  int64_t ops[2] = {0, 0};
  for (int on : {0, 1}) {
    Built b;
    BuildRow(&b, on);
    for (const sched_test::Inst &x : sched_test::Expand(b.s)) {
      if (x.layer != 3 || x.op->type != MP_OP_COMPUTE) continue;
      ops[on]++;
      if (x.op->phase == MP_PHASE_FORWARD && x.op->kernel == MP_KERNEL_FP8_CAST) cast_bytes[on] += x.op->bytes;
    }
  }
  EXPECT_EQ(ops[1] - ops[0], 3);
  EXPECT_DOUBLE_EQ(cast_bytes[1] - cast_bytes[0], 63104.0 * 4096);
}

// moe_act's recompute reads gate's and up's outputs from the cache: e = 4096 x 8 x 2048
// elements each, read at 1 + 4/128 bytes instead of 2, the product written in bf16:
// (2 x 1.03125 + 2) e = 4.0625 e bytes, against 6 e without the cache.
TEST(LowPrecision, MoeActRecomputeReadsTheCachedInputs) {
  const double e = 4096.0 * 8 * 2048;
  for (int on : {0, 1}) {
    Built b;
    BuildRow(&b, on);
    int n = 0;
    for (const sched_test::Inst &x : sched_test::Expand(b.s)) {
      if (x.layer != 3 || x.op->phase != MP_PHASE_RECOMPUTE || x.op->kernel != MP_KERNEL_ACTIVATION) continue;
      n++;
      EXPECT_DOUBLE_EQ(x.op->bytes, (on ? 4.0625 : 6.0) * e) << on;
    }
    EXPECT_EQ(n, 1);
  }
}

// Refused: the delayed recipe (no 1x128 tiles) under Megatron, the blockwise recipe under
// torchtitan's memory model (whose saved lists the cache does not reach).
TEST(LowPrecision, Fp8ActivationCacheNeedsTheBlockwiseRecipeUnderMegatron) {
  for (int recipe_blockwise : {0, 1}) {
    Built b;
    Opts o = DeepSeekMegatron();
    o.fp8_recipe = recipe_blockwise ? MP_FP8_BLOCKWISE : MP_FP8_DELAYED;
    o.mem_model = recipe_blockwise ? MP_MEM_MODEL_TORCHTITAN : MP_MEM_MODEL_MEGATRON;
    o.fp8_act_cache = 1;
    EXPECT_EQ(sched_test::PlanOnly(&b, o), MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find("activation cache"), std::string::npos) << mp_errmsg(&b.ctx);
  }
}

// AdamW's moments on the rank's shard of the distributed optimizer: Llama 3.1 8B has
// 2 x 128,256 x 4096 (embedding, output) + 32 x (2 x 4096^2 + 2 x 1024 x 4096 + 3 x 4096 x
// 14,336 + 2 x 4096) + 4096 = 8,030,261,248 parameters, 1,003,782,656 on each of 8 ranks;
// m and v at 4 bytes 8,030,261,248 bytes, at 2 (bf16) 4,015,130,624. The masters stay fp32.
TEST(LowPrecision, Bf16MomentsHalveTheOptimizerState) {
  const int64_t shard = 1003782656;
  for (mp_dtype d : {MP_DTYPE_FP32, MP_DTYPE_BF16}) {
    Built b;
    Opts o;
    o.mesh = "dp_replicate=8";
    o.mem_model = MP_MEM_MODEL_MEGATRON;
    o.dist_opt = 1;
    o.moment_dtype = d;
    Build(&b, o);
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_OPTIMIZER], 2 * shard * (d == MP_DTYPE_BF16 ? 2 : 4));
  }
}

TEST(LowPrecision, Bf16MomentsAreRefusedUnderTheMeshplanRuntime) {
  Built b;
  Opts o;
  o.model = "tiny-dense", o.mesh = "dp_shard=2", o.mem_model = MP_MEM_MODEL_MESHPLAN_CPU;
  o.moment_dtype = MP_DTYPE_BF16;
  EXPECT_EQ(sched_test::PlanOnly(&b, o), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find("bf16 AdamW moments"), std::string::npos) << mp_errmsg(&b.ctx);
}

}  // namespace
