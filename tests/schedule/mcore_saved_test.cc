// What a dense block saves for its backward under the megatron memory model with Megatron-Core's
// Transformer Engine layer spec (plan te_spec, the megatron-core stack; exec/schedule_act.c):
// bias-SwiGLU saves fc1's output alone, and the norms fused into linear_qkv and linear_fc1 leave
// the layernorm recompute module nothing to drop on a dense layer. Each figure derived by hand,
// per token and block, beside the 2021-22 count (te_spec 0, the megatron-lm stack).
#include <gtest/gtest.h>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

using namespace sched_test;

constexpr int64_t kT = 64;  // tokens of the micro-batch: one sequence of 64
constexpr uint32_t kLayernorm = 1u << MP_RC_LAYERNORM;

// The megatron memory model at tp 1, seq 64, bf16 unless fp8 (current scaling, Hopper: the
// layernorm module refuses delayed scaling, as Megatron-Core does).
Opts Mg(const char *model, int te_spec, uint32_t rc, int fp8 = 0) {
  Opts o = Megatron("dp_shard=1");
  o.model = model;
  o.seq = kT;
  o.te_spec = te_spec;
  o.recompute_modules = rc;
  o.fp8 = fp8;
  o.fp8_recipe = fp8 ? MP_FP8_TENSORWISE : MP_FP8_DEFAULT;
  o.gpu_cc = 90;
  return o;
}

int64_t Saved(const Opts &o) {
  Built b;
  Build(&b, o);
  return SavedByBlock(b.s, 0);
}

// Ops block 0's backward recomputes (phase RECOMPUTE).
int Recomputed(const Opts &o) {
  Built b;
  Build(&b, o);
  int n = 0;
  for (const Inst &x : Expand(b.s))
    if (x.layer == 0 && x.op->phase == MP_PHASE_RECOMPUTE) n++;
  return n;
}

// tiny-dense (H 64, q 64, kv 32, 8 heads, SwiGLU d_ff 192, RMSNorm 4 bytes), per token: the
// block input 2H 128; attention: rstd 4, qkv's normed input 128, q/k 2(64 + 32) 192, v 64,
// log-sum-exp 4 x 8 = 32, proj's input 128 (548); MLP: the norm's input 128, rstd 4, fc1's
// normed input 128, then
//   Megatron-LM (2021-22 count): gate, up, silu, product 4 x 2 x 192 = 1,536: 2,472 a token
//   TE spec: fc1's output [T, 2f] 768 (bias_swiglu's saved input) and fc2's input 384: 1,152,
//            2,472 - 384 = 2,088 a token
// The layernorm module drops qkv's and fc1's normed inputs under the 2021-22 count, 2,472 -
// 2 x 128 = 2,216, and nothing under the TE spec (both norms fused: 2,088), whose backward then
// recomputes nothing.
TEST(McoreSaved, SwigluDenseBlockPerToken) {
  EXPECT_EQ(Saved(Mg("tiny-dense", 0, 0)), kT * 2472);
  EXPECT_EQ(Saved(Mg("tiny-dense", 1, 0)), kT * 2088);
  EXPECT_EQ(Saved(Mg("tiny-dense", 0, kLayernorm)), kT * 2216);
  EXPECT_EQ(Saved(Mg("tiny-dense", 1, kLayernorm)), kT * 2088);
  EXPECT_GT(Recomputed(Mg("tiny-dense", 0, kLayernorm)), 0);
  EXPECT_EQ(Recomputed(Mg("tiny-dense", 1, kLayernorm)), 0);
}

// The mlp module checkpoints the MLP whole. 2021-22 count: the norm's input, rstd and the
// checkpoint's input (the normed h) stay, 128 + 4 + 128 = 260 of the MLP's 1,796: 128 + 548 +
// 260 = 936 a token. TE spec: the checkpoint's input is the residual itself (the norm is fc1's,
// inside it), 128 of the MLP's 1,412: 128 + 548 + 128 = 804.
TEST(McoreSaved, MlpModuleKeepsTheResidualAlone) {
  const uint32_t mlp = 1u << MP_RC_MLP;
  EXPECT_EQ(Saved(Mg("tiny-dense", 0, mlp)), kT * 936);
  EXPECT_EQ(Saved(Mg("tiny-dense", 1, mlp)), kT * 804);
}

// gpt2-124m (H 768, 12 heads of 64, GeLU d_ff 3072, LayerNorm 8 bytes, dropout masks), per
// token: the block input 1,536; attention: mean and rstd 8, qkv's input 1,536, q/k 3,072, v
// 1,536, log-sum-exp 48, proj's input 1,536, the dropout mask 768 (8,504); MLP: the norm's
// input 1,536, 8, fc1's input 1,536, GeLU's input and output (bias_gelu's saved input and fc2's)
// 2 x 6,144, the mask 768 (16,136): 26,176 a token under either count. The layernorm module:
// 26,176 - 2 x 1,536 = 23,104 under the 2021-22 count, no change under the TE spec.
TEST(McoreSaved, GeluDenseBlockPerToken) {
  EXPECT_EQ(Saved(Mg("gpt2-124m", 0, 0)), kT * 26176);
  EXPECT_EQ(Saved(Mg("gpt2-124m", 1, 0)), kT * 26176);
  EXPECT_EQ(Saved(Mg("gpt2-124m", 0, kLayernorm)), kT * 23104);
  EXPECT_EQ(Saved(Mg("gpt2-124m", 1, kLayernorm)), kT * 26176);
}

// Float8 (current scaling) on tiny-dense, the TE spec: te_f8_spares comes off the TE count as
// off the 2021-22 one: qkv's and fc1's inputs 64 each instead of 128, fc2's input 192 instead
// of 384, proj saving its original input (no copy beside it): 2,088 - 64 - 64 - 192 = 1,768 a
// token (2,472 - 320 = 2,152 under the 2021-22 count, te_fp8_saved_test). With the layernorm
// module the fused norms' quantized copies stay under the TE spec (1,768); under the 2021-22
// count the module drops the bf16 inputs (2,216) and fc2's spare alone remains: 2,024.
TEST(McoreSaved, Float8SparesOnTheTeCount) {
  EXPECT_EQ(Saved(Mg("tiny-dense", 1, 0, 1)), kT * 1768);
  EXPECT_EQ(Saved(Mg("tiny-dense", 1, kLayernorm, 1)), kT * 1768);
  EXPECT_EQ(Saved(Mg("tiny-dense", 0, 0, 1)), kT * 2152);
  EXPECT_EQ(Saved(Mg("tiny-dense", 0, kLayernorm, 1)), kT * 2024);
}

}  // namespace
