// What a dense or MoE block saves for its backward under Megatron-Core's memory model when
// its Linears are Transformer Engine's float8 ones (exec/schedule_act.c, te_f8_act): each
// float8 Linear keeps its input's quantized copy, not the bf16 one, sized by the recipe
// (te_q_bytes), each figure derived by hand below, per token and block.
#include <gtest/gtest.h>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

using namespace sched_test;

constexpr int64_t kT = 64;  // tokens of the micro-batch: one sequence of 64 (the models' max_seq)

// Megatron-Core's memory model on mesh, seq 64, float8 under recipe r on a GPU of compute
// capability cc (fp8 0: bf16).
Opts Tiny(const char *model, const char *mesh, int fp8, mp_fp8_recipe r, int cc) {
  Opts o = Megatron(mesh);
  o.model = model;
  o.seq = kT;
  o.fp8 = fp8;
  o.fp8_recipe = r;
  o.gpu_cc = cc;
  return o;
}

int64_t Saved(const Opts &o, int layer = 0) {
  Built b;
  Build(&b, o);
  return SavedByBlock(b.s, layer);
}

// tiny-dense (H 64, 8 heads and 4 kv heads of 8, SwiGLU d_ff 192, RMSNorm) at tp 1, T 64:
// bf16, per token (the megatron model's list, schedule_act.c block_act_mg): the block input
// 2H 128; attention: rstd 4, qkv's normed input 2H 128, q/k 2(q + kv) 192, v 2kv 64, lse
// 4 x 8 = 32, proj's input 2q 128 (548); MLP: its norm's input 128, rstd 4, fc1's normed input
// 128, gate, up, silu, product 4 x 2 x 192 = 1536 (1796): 2,472 bytes a token, 158,208 a block.
// Delayed scaling (Hopper): qkv's and fc1's inputs 1 byte an element (the transpose), 64
// each instead of 128; proj keeps its float8 copy of the attention output, 64, beside the bf16
// one the fused attention saves; fc2's input, the product, 192 instead of 384:
//   2,472 - 64 + 64 - 64 - 192 = 2,216 a token, 141,824 a block.
// MXFP8 (B200, cc 100): the same 1 byte an element, each copy with its column-wise E8M0
// scales [roundup(64 / 32, 4), roundup(cols, 128)]: qkv's and fc1's [4, 128] = 512 bytes a
// block, fc2's [4, 256] = 1,024; proj saves its original input (Megatron-Core's
// set_save_original_input beside every recipe but delayed): 158,208 - 2 x (4,096 - 512)
// - (12,288 - 1,024) = 139,776 a block, 2,184 a token.
// NVFP4 (cc 100): half a byte an element with E4M3 scales [roundup(cols, 128), roundup(64 /
// 16, 4)]: qkv's and fc1's 2,048 + 512 against 8,192 (5,632 each), fc2's 6,144 + 1,024
// against 24,576 (17,408), proj's copy 2,048 + 512 kept beside the bf16 (Megatron-Core sets
// save_original_input under config.fp8 alone): 158,208 - 2 x 5,632 - 17,408 + 2,560 = 132,096.
TEST(TeFp8Saved, DenseBlockPerTokenByRecipe) {
  EXPECT_EQ(Saved(Tiny("tiny-dense", "dp_shard=1", 0, MP_FP8_DEFAULT, 90)), kT * 2472);
  EXPECT_EQ(Saved(Tiny("tiny-dense", "dp_shard=1", 1, MP_FP8_DELAYED, 90)), kT * 2216);
  EXPECT_EQ(Saved(Tiny("tiny-dense", "dp_shard=1", 1, MP_FP8_MXFP8, 100)), kT * 2184);
  EXPECT_EQ(Saved(Tiny("tiny-dense", "dp_shard=1", 1, MP_FP8_NVFP4, 100)), 132096);
  // current scaling: delayed's figure without proj's copy, 2,216 - 64
  EXPECT_EQ(Saved(Tiny("tiny-dense", "dp_shard=1", 1, MP_FP8_TENSORWISE, 90)), kT * 2152);
}

// Blockwise scaling needs every local GEMM dim a multiple of 128, which the tiny models miss:
// Llama 3.1 8B (H 4096, d_ff 14336) at seq 128, tp 1, on Hopper. Each copy a byte an element
// with an fp32 scale per 1x128 tile of the transpose, [ceil(128 / 128), cols]: qkv's and fc1's
// inputs 2 x 128 x 4096 = 1,048,576 -> 524,288 + 16,384 (507,904 spared each), fc2's
// 3,670,016 -> 1,835,008 + 57,344 (1,777,664); proj saves its original input: 2,793,472 a
// block, 21,824 a token (4096 x 31/32 x 2 + 14336 x 31/32).
TEST(TeFp8Saved, BlockwiseOnLlama8B) {
  Opts bf16 = Tiny("llama3.1-8b", "dp_shard=1", 0, MP_FP8_DEFAULT, 90);
  bf16.seq = 128;
  Opts f8 = bf16;
  f8.fp8 = 1;
  f8.fp8_recipe = MP_FP8_BLOCKWISE;
  EXPECT_EQ(Saved(bf16) - Saved(f8), 128 * 21824);
}

// tiny-moe (tiny-dense's attention; 8 experts of 32, top-2, one shared expert of 64, every
// layer MoE) at tp 1, ep 1: R = 2T = 128 routed rows, 8 local experts of 16 rows each.
// bf16 per token: the block input 128, attention 548; MLP: norm input 128, rstd 4, the
// normed h 128 (the router's bf16 input), router probabilities 4 x 8 = 32, top-k weights and
// indices 12 x 2 = 24, the dispatched rows 2 x 2 x 64 = 256, the experts' gate, up, silu and
// product 4 x 2 x 2 x 32 = 512, the shared expert's 4 x 2 x 64 = 512 (1,596): 2,272 a token,
// 145,408 a block.
// Delayed: attention 0 net (qkv -64, proj's copy +64); the dispatched rows 128 instead of 256,
// the experts' fc2 input (the product) 64 instead of 128; the shared fc1 keeps a float8 copy
// of the normed h, 64, beside the router's bf16; the shared fc2's input 64 instead of 128:
//   2,272 - 128 - 64 + 64 - 64 = 2,080 a token, 133,120 a block.
// MXFP8 (cc 100), a block: qkv -(8,192 - 4,096 - 512) = -3,584; the routed fc1's rows 16,384
// -> 8,192 + 8 experts x [4, 128] = 4,096 scales: -4,096; the routed fc2's 8,192 -> 4,096 + 8 x
// [4, 128]: 0; shared fc1 + 4,096 + 512; shared fc2 8,192 -> 4,096 + 512: -3,584:
//   145,408 - 3,584 - 4,096 + 4,608 - 3,584 = 138,752 (2,168 a token).
// At ep 2 each rank holds 4 experts of 32 rows: the routed scales 4 x 512 a copy, 4,096 less
// over both copies: 134,656.
TEST(TeFp8Saved, MoeBlockPerTokenByRecipe) {
  EXPECT_EQ(Saved(Tiny("tiny-moe", "dp_shard=1", 0, MP_FP8_DEFAULT, 90)), kT * 2272);
  EXPECT_EQ(Saved(Tiny("tiny-moe", "dp_shard=1", 1, MP_FP8_DELAYED, 90)), kT * 2080);
  EXPECT_EQ(Saved(Tiny("tiny-moe", "dp_shard=1", 1, MP_FP8_MXFP8, 100)), kT * 2168);
  EXPECT_EQ(Saved(Tiny("tiny-moe", "dp_replicate=2,ep=2", 1, MP_FP8_MXFP8, 100)), 134656);
  EXPECT_EQ(Saved(Tiny("tiny-moe", "dp_replicate=2,ep=2", 1, MP_FP8_DELAYED, 90)), kT * 2080);
}

// Sequence parallelism (tp 2): the norms' outputs are gathered for qkv and fc1, and Transformer
// Engine saves the local shard ([Ts, H], Ts = 32: layernorm_linear.py's ln_out; ln_out_total,
// gathered by NCCL or userbuffers, is cleared after the GEMM), in float8 under delayed scaling
// (row-wise, the data its backward gathers again). tiny-dense at tp 2, a block: bf16 79,104;
// qkv's input 4,096 -> 2,048, fc1's likewise, proj's copy + 64 x 32 = 2,048, fc2's input
// [64, 96] 12,288 -> 6,144: 79,104 - 2,048 + 2,048 - 2,048 - 6,144 = 70,912.
TEST(TeFp8Saved, SequenceParallelKeepsTheLocalShard) {
  EXPECT_EQ(Saved(Tiny("tiny-dense", "dp_replicate=2,tp=2", 0, MP_FP8_DEFAULT, 90)), 79104);
  EXPECT_EQ(Saved(Tiny("tiny-dense", "dp_replicate=2,tp=2", 1, MP_FP8_DELAYED, 90)), 70912);
}

// Under Megatron-Core's recompute modules (selective granularity with the core recomputed:
// the lse, 2,048 a block, dropped), per block:
//   dense, delayed, selective-core alone: bf16 156,160; the core keeps no output, so proj's
//     float8 copy (4,096) replaces the bf16 8,192: 156,160 - 4,096 x 2 - 4,096 - 12,288
//     = 131,584
//   dense, current, layernorm (which delayed scaling refuses): qkv's and fc1's inputs are
//     dropped (bf16 139,776) and saved as the originals the recompute drops
//     (set_save_original_input): only fc2's 12,288 comes off: 127,488
//   MoE, current, moe_act: bf16 126,976 (silu and product dropped); the experts' fc2 saves its
//     original input, dropped: qkv -4,096, routed fc1 -8,192, shared fc1 +4,096, shared fc2
//     -4,096: 114,688
//   MoE, current, layernorm: bf16 126,976 (both normed inputs dropped); the shared fc1 saves
//     its original: routed -8,192 - 4,096, shared fc2 -4,096: 110,592
//   MoE, delayed, moe: the MoE part checkpointed whole, its input kept in bf16; the attention's
//     qkv -4,096 and proj's copy -4,096 as above: 57,856 - 8,192 = 49,664
TEST(TeFp8Saved, RecomputeModules) {
  struct Case {
    const char *model;
    mp_fp8_recipe r;
    uint32_t rc;
    int64_t bf16, f8;
  } cases[] = {
      {"tiny-dense", MP_FP8_DELAYED, 0, 156160, 131584},
      {"tiny-dense", MP_FP8_TENSORWISE, 1u << MP_RC_LAYERNORM, 139776, 127488},
      {"tiny-moe", MP_FP8_TENSORWISE, 1u << MP_RC_MOE_ACT, 126976, 114688},
      {"tiny-moe", MP_FP8_TENSORWISE, 1u << MP_RC_LAYERNORM, 126976, 110592},
      {"tiny-moe", MP_FP8_DELAYED, 1u << MP_RC_MOE, 57856, 49664},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.model);
    SCOPED_TRACE(c.rc);
    for (int f8 : {0, 1}) {
      Opts o = Tiny(c.model, "dp_shard=1", f8, c.r, 90);
      o.ac = MP_AC_SELECTIVE_CORE;
      o.recompute_modules = c.rc;
      EXPECT_EQ(Saved(o), f8 ? c.f8 : c.bf16);
    }
  }
}

// Full AC keeps the block input alone in forward, float8 or not (2H a token).
TEST(TeFp8Saved, FullRecomputeKeepsTheInput) {
  Opts o = Tiny("tiny-dense", "dp_shard=1", 1, MP_FP8_DELAYED, 90);
  o.ac = MP_AC_FULL;
  EXPECT_EQ(Saved(o), kT * 128);
}

}  // namespace
