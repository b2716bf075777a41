// Megatron-Core's --recompute-method under full recompute, per model chunk
// (megatron/core/transformer/transformer_block.py _checkpointed_forward, core_v0.14.0):
// block N checkpoints each chunk's first N layers alone, uniform N checkpoints groups of N
// layers at the group's input and re-runs the group's forward whole before its backward.
// Saved bytes, recompute FLOPs and the backward's activation peak by hand, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

using namespace sched_test;

constexpr int64_t kT = 64;  // tokens of the one micro-batch: one sequence of 64

// llama3.1-8b (32 layers; H 4096, q 4096, kv 1024, 32 heads, SwiGLU d_ff 14336, RMSNorm rstd
// 4 bytes) under the megatron memory model's 2021-22 count (te_spec 0; exec/schedule_act.c
// block_act_mg), tp 1, per token:
//   x  the block input 2H                                                        8,192
//   A  rstd 4, qkv's normed input 2H 8,192, q/k 2(q + kv) 10,240, v 2kv 2,048,
//      log-sum-exp 4 x 32 = 128, proj's input 2q 8,192                           28,804
//   M  the norm's input 2H 8,192, rstd 4, fc1's normed input 8,192, gate, up,
//      silu, product 4 x 2 x 14,336 = 114,688                                   131,076
// pp 2: 16 layers a chunk, one chunk a stage.
constexpr int64_t kX = 8192, kA = 28804, kM = 131076;

Opts Mg(mp_recompute_method m, int n, int rank = 0, mp_ac_mode ac = MP_AC_FULL) {
  Opts o = Megatron("pp=2");
  o.seq = kT;
  o.ac = ac;
  o.recompute_method = m;
  o.recompute_num_layers = n;
  o.rank = rank;
  return o;
}

// FLOPs of the stage's ops under RECOMPUTE, and of those of `layer`.
double RecomputeFlops(const mp_schedule *s, int layer = -1) {
  double f = 0;
  for (const Inst &x : Expand(s))
    if (x.op->phase == MP_PHASE_RECOMPUTE && x.op->type == MP_OP_COMPUTE && (layer < 0 || x.layer == layer))
      f += x.op->flops;
  return f;
}

// The most ACTIVATIONS bytes live at once during the backward (allocations minus frees in
// schedule order).
int64_t BackwardActPeak(const mp_schedule *s) {
  int64_t live = 0, peak = 0;
  for (const Inst &x : Expand(s)) {
    if (x.op->mem_cat != MP_MEM_ACTIVATIONS) continue;
    if (x.op->type == MP_OP_ALLOC) live += x.op->mem_bytes;
    if (x.op->type == MP_OP_FREE) live -= x.op->mem_bytes;
    if (x.op->phase != MP_PHASE_FORWARD) peak = std::max(peak, live);
  }
  return peak;
}

// Every block recomputed alone (meshplan's full, Megatron's uniform 1) keeps x, nothing else.
TEST(RecomputeMethod, FullKeepsEachInput) {
  Built none, full;
  Build(&none, Mg(MP_RECOMPUTE_NONE, 0, 0, MP_AC_NONE));
  Build(&full, Mg(MP_RECOMPUTE_NONE, 0));
  EXPECT_EQ(SavedByBlock(none.s, 5), kT * (kX + kA + kM));
  EXPECT_EQ(SavedByBlock(full.s, 5), kT * kX);
}

// block 4: on stage 0 layers 0-3 keep x alone and recompute, 4-15 keep everything and do
// not; on stage 1 the count restarts at its chunk's first layer, 16.
TEST(RecomputeMethod, BlockCheckpointsEachChunksFirstLayers) {
  Built full, s0, s1;
  Build(&full, Mg(MP_RECOMPUTE_NONE, 0));
  Build(&s0, Mg(MP_RECOMPUTE_BLOCK, 4));
  Build(&s1, Mg(MP_RECOMPUTE_BLOCK, 4, 1));
  for (int l : {0, 3}) EXPECT_EQ(SavedByBlock(s0.s, l), kT * kX) << l;
  for (int l : {4, 15}) EXPECT_EQ(SavedByBlock(s0.s, l), kT * (kX + kA + kM)) << l;
  for (int l : {16, 19}) EXPECT_EQ(SavedByBlock(s1.s, l), kT * kX) << l;
  for (int l : {20, 31}) EXPECT_EQ(SavedByBlock(s1.s, l), kT * (kX + kA + kM)) << l;
  // each checkpointed layer re-runs its forward: 4 of the stage's 16 layers
  const double per_layer = RecomputeFlops(full.s, 0);
  ASSERT_GT(per_layer, 0);
  EXPECT_DOUBLE_EQ(RecomputeFlops(full.s), 16 * per_layer);
  EXPECT_DOUBLE_EQ(RecomputeFlops(s0.s, 3), per_layer);
  EXPECT_EQ(RecomputeFlops(s0.s, 4), 0);
  EXPECT_DOUBLE_EQ(RecomputeFlops(s0.s), 4 * per_layer);
  EXPECT_DOUBLE_EQ(RecomputeFlops(s1.s), 4 * per_layer);
  // a count past the chunk's 16 layers recomputes them all, as full does
  Built all;
  Build(&all, Mg(MP_RECOMPUTE_BLOCK, 20));
  EXPECT_DOUBLE_EQ(RecomputeFlops(all.s), 16 * per_layer);
  EXPECT_EQ(BackwardActPeak(all.s), BackwardActPeak(full.s));
}

// uniform 4: each group of 4 saves its first layer's input alone and every layer recomputes
// (the FLOPs of full). The backward of the stage's top group (layers 12-15, the first run)
// holds the group's recompute whole: its 4 layers' A + M and the inputs of 13, 14 and 15
// beside the 4 groups' saved inputs, 4x + 3x + 4(A + M), where full holds its 16 inputs and
// one layer's A + M: the peaks differ by 4(A + M) + 7x - (16x + A + M) = 3(A + M) - 9x.
TEST(RecomputeMethod, UniformSavesOneInputAGroupAndHoldsTheGroupInBackward) {
  Built full, u4, u1;
  Build(&full, Mg(MP_RECOMPUTE_NONE, 0));
  Build(&u4, Mg(MP_RECOMPUTE_UNIFORM, 4));
  Build(&u1, Mg(MP_RECOMPUTE_UNIFORM, 1));
  for (int l : {0, 4, 12}) EXPECT_EQ(SavedByBlock(u4.s, l), kT * kX) << l;
  for (int l : {1, 3, 13, 15}) EXPECT_EQ(SavedByBlock(u4.s, l), 0) << l;
  EXPECT_DOUBLE_EQ(RecomputeFlops(u4.s), RecomputeFlops(full.s));
  EXPECT_EQ(BackwardActPeak(u4.s) - BackwardActPeak(full.s), kT * (3 * (kA + kM) - 9 * kX));
  // uniform 1 is full
  EXPECT_EQ(BackwardActPeak(u1.s), BackwardActPeak(full.s));
  EXPECT_DOUBLE_EQ(RecomputeFlops(u1.s), RecomputeFlops(full.s));
  EXPECT_EQ(SavedByBlock(u1.s, 1), kT * kX);
}

// What Megatron-Core refuses, and what meshplan does not model.
TEST(RecomputeMethod, Refusals) {
  struct Case {
    Opts o;
    const char *says;
  };
  Opts tt = Mg(MP_RECOMPUTE_BLOCK, 2);
  tt.mem_model = MP_MEM_MODEL_TORCHTITAN;
  tt.loss = MP_LOSS_EAGER;
  tt.mesh = "pp=2";
  const Case cases[] = {
      {Mg(MP_RECOMPUTE_UNIFORM, 3), "which 3 does not divide"},        // 16 layers a chunk
      {Mg(MP_RECOMPUTE_BLOCK, 2, 0, MP_AC_SELECTIVE_CORE), "applies to full AC"},
      {Mg(MP_RECOMPUTE_BLOCK, 0), "--recompute-num-layers N >= 1"},
      {Mg(MP_RECOMPUTE_NONE, 2), "without a recompute method"},
      {tt, "Megatron-Core's TransformerBlock"},
  };
  for (const Case &c : cases) {
    Built b;
    EXPECT_NE(PlanOnly(&b, c.o), MP_OK) << c.says;
    EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find(c.says), std::string::npos) << mp_errmsg(&b.ctx);
  }
}

}  // namespace
