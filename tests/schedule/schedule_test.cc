// Step schedule (exec/schedule.h) against hand-derived numbers: TP and EP collective bytes
// of one block, FSDP gather/reduce-scatter bytes per unit, FLOPs against the model's
// 6N + attention, recompute FLOPs under AC, saved-activation bytes, pipeline P2P, compact
// vs expanded equality, memory replay.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

using namespace sched_test;

double Sum(const std::vector<Inst> &v, int64_t n_micro, bool (*pred)(const Inst &)) {
  double f = 0;
  for (const Inst &x : v)
    if (pred(x)) f += x.op->flops * (x.op->when == MP_WHEN_EVERY_MICRO ? n_micro : 1);
  return f;
}

// llama3.1-8b: H=4096, 32 heads x 128, 8 kv heads, d_ff 14336, vocab 128256, 32 layers.
const double kH = 4096, kQ = 4096, kKV = 1024, kF = 14336, kV = 128256, kL = 32, kNH = 32,
             kHD = 128;
// Matmul parameters of one block: q, o 4096x4096; k, v 1024x4096; gate, up, down 14336x4096.
const double kBlockMatmul = 2 * kH * kQ + 2 * kH * kKV + 3 * kH * kF;  // 218,103,808
const double kBlockNorms = 2 * kH;

TEST(Schedule, TpAllReducesOfOneDenseBlock) {
  // llama3.1-8b, tp=8 without sequence parallelism, micro-batch 1 x 8192 tokens: T = 8192.
  // Each TP all-reduce carries the [T, H] bf16 activation: 2 x 8192 x 4096 = 67,108,864
  // bytes.
  Built b;
  Opts o;
  o.mesh = "tp=8";
  o.sp = 0;
  Build(&b, o);
  const double ar = 2.0 * 8192 * 4096;
  EXPECT_EQ(ar, 67108864.0);
  auto v = Expand(b.s);
  int fwd = 0, bwd = 0;
  for (const Inst &x : v) {
    if (x.layer != 5 || x.op->type != MP_OP_COMM) continue;
    ASSERT_EQ(x.op->coll, MP_COLL_ALL_REDUCE);
    ASSERT_EQ(x.op->group, MP_GROUP_TP);
    EXPECT_EQ(x.op->stream, MP_STREAM_COMPUTE);  // on the critical path
    EXPECT_EQ(x.op->bytes, ar);
    if (x.op->phase == MP_PHASE_FORWARD) fwd++;
    if (x.op->phase == MP_PHASE_BACKWARD) bwd++;
  }
  EXPECT_EQ(fwd, 2);  // after o_proj and after down_proj
  EXPECT_EQ(bwd, 2);  // input gradients of q/k/v and of gate/up
  // Local GEMM shapes: q_proj forward m=T, n=32*128/8=512, k=4096; k_proj n=8*128/8=128.
  bool seen_q = false, seen_k = false;
  for (const Inst &x : v) {
    if (x.layer != 5 || x.op->kernel != MP_KERNEL_GEMM || x.op->variant != MP_VAR_FWD ||
        x.op->type != MP_OP_COMPUTE)
      continue;
    if (x.op->module == MP_MOD_Q) {
      seen_q = true;
      EXPECT_EQ(x.op->m, 8192);
      EXPECT_EQ(x.op->n, 512);
      EXPECT_EQ(x.op->k, 4096);
      EXPECT_EQ(x.op->flops, 2.0 * 8192 * 512 * 4096);
    }
    if (x.op->module == MP_MOD_K) {
      seen_k = true;
      EXPECT_EQ(x.op->n, 128);
    }
  }
  EXPECT_TRUE(seen_q && seen_k);
  // Whole step: 32 blocks x (2 + 2) + embedding (forward) + head input gradient (backward)
  // all-reduces of [T, H], plus loss-parallel's three all-reduces of T fp32 values.
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_TP], 32 * 4 + 2 + 3);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_REDUCE][MP_GROUP_TP], 130 * ar + 3 * 4.0 * 8192);
  // no FSDP collectives with dp_shard == 1
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_FSDP], 0);
}

TEST(Schedule, ReplicatedLogitsAreAllGathered) {
  Built b;
  Opts o;
  o.model = "tiny-dense";
  o.mesh = "tp=2";
  o.seq = 64;
  o.shard_logits = 0;
  o.sp = 0;
  Build(&b, o);
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  // [T, vocab] bf16 after the all-gather: 64 x 256 x 2 bytes; no loss-parallel all-reduces.
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_TP], 1);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_TP], 64.0 * 256 * 2);
  // 2 blocks x 4 + embedding + head input gradient, each 64 x 64 x 2 bytes
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_TP], 10);
}

TEST(Schedule, SequenceParallelGathersAndScattersEachRegion) {
  // The same plan with sequence parallelism (the default with tp > 1): every all-reduce of a
  // TP region becomes an all-gather before it and a reduce-scatter after it (Korthikanti et
  // al. 2022), each of the [T, H] bf16 tensor (2 x 8192 x 4096 bytes). Per block, forward:
  // all-gather before q/k/v and before gate/up, reduce-scatter after o and after down;
  // backward: all-gather of o's and down's output gradients, reduce-scatter of the q/k/v
  // and gate/up input gradients.
  Built b;
  Opts o;
  o.mesh = "tp=8";
  Build(&b, o);
  ASSERT_EQ(b.plan->opts.sp, 1);
  const double full = 2.0 * 8192 * 4096;
  int ag[2] = {0, 0}, rs[2] = {0, 0};
  for (const Inst &x : Expand(b.s)) {
    if (x.layer != 5 || x.op->type != MP_OP_COMM) continue;
    ASSERT_EQ(x.op->group, MP_GROUP_TP);
    ASSERT_NE(x.op->coll, MP_COLL_ALL_REDUCE);
    EXPECT_EQ(x.op->bytes, full);
    const int bwd = x.op->phase == MP_PHASE_BACKWARD;
    if (x.op->coll == MP_COLL_ALL_GATHER) ag[bwd]++;
    if (x.op->coll == MP_COLL_REDUCE_SCATTER) rs[bwd]++;
  }
  EXPECT_EQ(ag[0], 2);
  EXPECT_EQ(rs[0], 2);
  EXPECT_EQ(ag[1], 2);
  EXPECT_EQ(rs[1], 2);
  // Whole step: 32 blocks x 4 of each, plus the embedding's reduce-scatter (forward) and its
  // gradient's all-gather (backward), the head input's all-gather (forward) and its
  // gradient's reduce-scatter (backward); loss-parallel's three all-reduces remain.
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_TP], 32 * 4 + 2);
  EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_TP], 32 * 4 + 2);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_TP], 3);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_TP], 130 * full);
  // The norms and residual adds run on the rank's 1/8 of the sequence.
  for (const Inst &x : Expand(b.s)) {
    if (x.layer == 5 && x.op->type == MP_OP_COMPUTE &&
        (x.op->kernel == MP_KERNEL_NORM || x.op->kernel == MP_KERNEL_RESIDUAL)) {
      EXPECT_EQ(x.op->m, 8192 / 8 * 4096) << mp_kernel_name((mp_kernel)x.op->kernel);
    }
  }
}

TEST(Schedule, FsdpGatherAndReduceScatterBytesPerUnit) {
  Built b;
  Opts o;  // llama3.1-8b on dp_shard=8, reshard after forward
  Build(&b, o);
  const mp_plan *p = b.plan;
  const double block_numel = kBlockMatmul + kBlockNorms;  // 218,112,000
  EXPECT_EQ(p->units[1].numel_tp, (int64_t)block_numel);
  auto v = Expand(b.s);
  int ag_fwd = 0, ag_bwd = 0, rs = 0;
  for (const Inst &x : v) {
    if (x.op->type != MP_OP_COMM || x.layer != 7) continue;
    if (x.op->coll == MP_COLL_ALL_GATHER) {
      EXPECT_EQ(x.op->group, MP_GROUP_FSDP);
      EXPECT_EQ(x.op->stream, MP_STREAM_GATHER);
      EXPECT_EQ(x.op->bytes, 2.0 * block_numel);  // bf16: 436,224,000 bytes
      EXPECT_EQ(x.unit, 8);                         // root is unit 0, layers.7 is unit 8
      (x.op->phase == MP_PHASE_FORWARD ? ag_fwd : ag_bwd)++;
    }
    if (x.op->coll == MP_COLL_REDUCE_SCATTER) {
      EXPECT_EQ(x.op->stream, MP_STREAM_REDUCE);
      EXPECT_EQ(x.op->bytes, 4.0 * block_numel);  // fp32 reduce: 872,448,000 bytes
      rs++;
    }
  }
  EXPECT_EQ(ag_fwd, 1);
  EXPECT_EQ(ag_bwd, 1);  // gathered again: reshard_after_forward
  EXPECT_EQ(rs, 1);
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  const double root = 2 * kV * kH + kH;  // tok_embeddings, output, norm: 1,050,681,344
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_FSDP], 1 + 2 * 32);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_FSDP],
                   2 * root + 64 * 2 * block_numel);
  EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_FSDP], 33);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_FSDP],
                   4 * root + 32 * 4 * block_numel);
  // Resident: 8,030,261,248 parameters / 8 ranks, fp32; AdamW m and v; fp32 gradients.
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_PARAMS], 8030261248LL / 8 * 4);
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_OPTIMIZER], 8030261248LL / 8 * 8);
  EXPECT_EQ(b.s->resident_bytes[MP_MEM_GRADS], 8030261248LL / 8 * 4);
  // optimizer: one float all-reduced over the world for the gradient norm
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_WORLD], 1);
  EXPECT_EQ(t.comm_bytes[MP_COLL_ALL_REDUCE][MP_GROUP_WORLD], 4.0);
}

TEST(Schedule, NoReshardGathersOnceAndFreesAfterBackward) {
  Built b;
  Opts o;
  o.reshard = 0;
  Build(&b, o);
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_FSDP], 1 + 32);
  // every block's parameters stay gathered to its backward: the forward ends with all 32
  // blocks' bf16 parameters (and the root) live
  auto v = Expand(b.s);
  int64_t gathered = 0, at_fwd_end = 0;
  for (const Inst &x : v) {
    if (x.op->type == MP_OP_ALLOC && x.op->mem_cat == MP_MEM_GATHERED) gathered += x.op->mem_bytes;
    if (x.op->type == MP_OP_FREE && x.op->mem_cat == MP_MEM_GATHERED) gathered -= x.op->mem_bytes;
    if (x.op->phase == MP_PHASE_FORWARD) at_fwd_end = gathered;
  }
  EXPECT_EQ(at_fwd_end, (int64_t)(2 * (2 * kV * kH + kH) + 32 * 2 * (kBlockMatmul + kBlockNorms)));
}

TEST(Schedule, StepFlopsMatchModelFlops) {
  Built b;
  Opts o;  // dp_shard=8: each rank runs the whole model on its own T = 8192 tokens
  Build(&b, o);
  const double T = 8192, s = 8192;
  auto v = Expand(b.s);
  const int64_t nm = b.s->n_micro;
  EXPECT_EQ(nm, 1);
  // GEMMs: forward 2 x params x T, backward DGRAD + WGRAD 4 x params x T: 6 x matmul params
  // (32 blocks + the output head V x H; the embedding lookup is no GEMM).
  const double gemm = Sum(v, nm, [](const Inst &x) {
    return x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_GEMM;
  });
  EXPECT_DOUBLE_EQ(gemm, 6 * T * (kL * kBlockMatmul + kV * kH));
  // Attention: causal half of 4 T s heads hd forward, twice that backward, per layer.
  const double attn = Sum(v, nm, [](const Inst &x) {
    return x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_ATTENTION;
  });
  EXPECT_DOUBLE_EQ(attn, kL * 3 * (4 * T * s * kNH * kHD / 2));
  // The model's count is non-causal (12 L heads hd s per token): the schedule does half of
  // that attention work, and the model counts 6 x norm parameters the schedule runs as
  // element-wise kernels instead; the rest (element-wise FLOPs) is under 1%.
  const double model = b.s->model_flops_per_step;
  EXPECT_DOUBLE_EQ(model, T * mp_model_flops_per_token(&b.model, 8192));
  const double causal_half = 6 * kL * kNH * kHD * s * T;
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_NEAR(t.flops / (model - causal_half), 1.0, 0.01);
  EXPECT_GT(t.flops, gemm + attn);  // element-wise kernels are counted too
  EXPECT_LT(t.flops, model);
}

TEST(Schedule, RecomputeAddsTheForwardItRepeats) {
  const double T = 8192, s = 8192;
  double gemm[MP_AC_COUNT], attn[MP_AC_COUNT], total[MP_AC_COUNT];
  for (int ac = 0; ac < MP_AC_COUNT; ac++) {
    Built b;
    Opts o;
    o.ac = (mp_ac_mode)ac;
    Build(&b, o);
    auto v = Expand(b.s);
    gemm[ac] = Sum(v, 1, [](const Inst &x) {
      return x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_GEMM;
    });
    attn[ac] = Sum(v, 1, [](const Inst &x) {
      return x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_ATTENTION;
    });
    mp_schedule_totals t;
    mp_schedule_totals_compute(b.s, &t);
    total[ac] = t.flops;
    int recompute_ops = 0;
    for (const Inst &x : v) recompute_ops += x.op->phase == MP_PHASE_RECOMPUTE;
    EXPECT_EQ(recompute_ops > 0, ac != MP_AC_NONE) << mp_ac_mode_name((mp_ac_mode)ac);
  }
  const double core = kL * 2 * T * s * kNH * kHD;
  // selective (the attention module): q/k/v and o forward GEMMs and the core once more
  EXPECT_DOUBLE_EQ(gemm[MP_AC_SELECTIVE] - gemm[MP_AC_NONE],
                   kL * 2 * T * kH * (kQ + 2 * kKV) + kL * 2 * T * kQ * kH);
  EXPECT_DOUBLE_EQ(attn[MP_AC_SELECTIVE] - attn[MP_AC_NONE], core);
  // selective-op: the even matmuls of the block (k #2, o #4, up #6), not the core (saved)
  EXPECT_DOUBLE_EQ(gemm[MP_AC_SELECTIVE_OP] - gemm[MP_AC_NONE],
                   kL * 2 * T * kH * (kKV + kQ + kF));
  EXPECT_DOUBLE_EQ(attn[MP_AC_SELECTIVE_OP], attn[MP_AC_NONE]);
  // selective-core: the core alone
  EXPECT_DOUBLE_EQ(gemm[MP_AC_SELECTIVE_CORE], gemm[MP_AC_NONE]);
  EXPECT_DOUBLE_EQ(attn[MP_AC_SELECTIVE_CORE] - attn[MP_AC_NONE], core);
  // full: the block forward once more up to its last saved tensor, down's input (torch's
  // non-reentrant checkpoint stops there): every GEMM but down (H x F), and the core
  EXPECT_DOUBLE_EQ(gemm[MP_AC_FULL] - gemm[MP_AC_NONE], kL * 2 * T * (kBlockMatmul - kH * kF));
  EXPECT_DOUBLE_EQ(attn[MP_AC_FULL] - attn[MP_AC_NONE], core);
  EXPECT_LT(total[MP_AC_NONE], total[MP_AC_SELECTIVE_CORE]);
  EXPECT_LT(total[MP_AC_SELECTIVE_CORE], total[MP_AC_SELECTIVE]);
  EXPECT_LT(total[MP_AC_SELECTIVE], total[MP_AC_FULL]);
  EXPECT_LT(total[MP_AC_SELECTIVE_OP], total[MP_AC_FULL]);
}

// Full AC's recompute by the runtime that runs it. torch's non-reentrant checkpoint (the
// torchtitan memory model) stops re-running the block once the last tensor it saved is
// packed again: down's input, packed before down's GEMM runs, so a recompute re-runs the
// block's GEMMs but down, 2 T (2 H q + 2 H kv + 2 H F) a block. Megatron's CheckpointFunction
// re-runs the block's forward whole, down included: 2 T (2 H q + 2 H kv + 3 H F).
TEST(Schedule, FullRecomputeStopsAtTheLastSavedTensorUnderTorch) {
  const double T = 4096;
  double extra[2];
  for (int mg = 0; mg < 2; mg++) {
    double gemm[2];
    for (int full = 0; full < 2; full++) {
      Built b;
      Opts o = mg ? Megatron("dp_replicate=8") : Opts();
      o.seq = (int64_t)T;
      o.ac = full ? MP_AC_FULL : MP_AC_NONE;
      Build(&b, o);
      gemm[full] = Sum(Expand(b.s), 1, [](const Inst &x) {
        return x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_GEMM;
      });
    }
    extra[mg] = gemm[1] - gemm[0];
  }
  EXPECT_DOUBLE_EQ(extra[0], kL * 2 * T * (2 * kH * kQ + 2 * kH * kKV + 2 * kH * kF));
  EXPECT_DOUBLE_EQ(extra[1], kL * 2 * T * kBlockMatmul);
}

TEST(Schedule, SavedActivationBytesPerBlock) {
  // Per token (bf16, llama3.1-8b, tp=1), what each op saves (exec/schedule_act.c):
  //   x (attention_norm's input)                                    8192
  //   attention: rstd 4, normed x 8192, q/k after RoPE and v 2(4096 + 2 x 1024) = 12288,
  //              output 8192, log-sum-exp 4 x 32 = 128               28804
  //   MLP: h 8192 + rstd 4, normed h 8192, gate, up, silu(gate) and their product
  //        4 x 2 x 14336 = 114688                                    131076
  // none keeps all 168072; selective keeps x, attention_norm's rstd and the module's input
  // (8196) and the MLP: 147464; selective-op keeps the block input, q before RoPE 8192, v 2048,
  // the output and log-sum-exp 8320, gate 28672 and down's output 8192: 63616;
  // selective-core drops only the log-sum-exp: 167944; full keeps the block input.
  const int64_t T = 8192;
  const int64_t x = 8192, attn = 4 + 8192 + 12288 + 8192 + 128, mlp = 8192 + 4 + 8192 + 114688;
  EXPECT_EQ(x + attn + mlp, 168072);
  int64_t want[MP_AC_COUNT];
  want[MP_AC_NONE] = T * 168072;
  want[MP_AC_SELECTIVE] = T * (x + 4 + 8192 + mlp);
  want[MP_AC_SELECTIVE_OP] = T * (x + 8192 + 2048 + 8192 + 128 + 28672 + 8192);
  want[MP_AC_SELECTIVE_CORE] = T * (168072 - 128);
  want[MP_AC_FULL] = T * x;
  EXPECT_EQ(want[MP_AC_SELECTIVE], T * 147464);
  EXPECT_EQ(want[MP_AC_SELECTIVE_OP], T * 63616);
  for (int ac = 0; ac < MP_AC_COUNT; ac++) {
    Built b;
    Opts o;
    o.ac = (mp_ac_mode)ac;
    Build(&b, o);
    EXPECT_EQ(SavedByBlock(b.s, 3), want[ac]) << mp_ac_mode_name((mp_ac_mode)ac);
  }
}

TEST(Schedule, SequenceParallelShardsTheSavedResidualStream) {
  // llama3.1-8b at tp=8 without AC, T = 8192 tokens, Ts = T/8 = 1024; tp-local q 512,
  // kv 128, d_ff 1792, 4 heads (exec/schedule_act.c's per-op list):
  //   no SP: x 2TH; attention: rstd 4T, normed x 2TH, q/k/v 2T(512 + 256), output 2T 512,
  //          log-sum-exp 4T 4; MLP: h 2TH + rstd 4T, normed h 2TH, 4 x 2T 1792:
  //          67,108,864 + 88,244,224 + 251,691,008 = 407,044,096 bytes
  //   SP:    x, h and the two rstd on Ts (the norms run on the sequence shard); the normed
  //          inputs are saved all-gathered ([T, H], what the Linears' autograd keeps):
  //          8,388,608 + 88,215,552 + 192,942,080 = 289,546,240 bytes
  for (int sp = 0; sp <= 1; sp++) {
    Built b;
    Opts o;
    o.mesh = "tp=8";
    o.sp = sp;
    Build(&b, o);
    EXPECT_EQ(SavedByBlock(b.s, 3), sp ? 289546240 : 407044096) << "sp=" << sp;
  }
}

TEST(Schedule, ContextParallelRingAttention) {
  // llama3.1-8b on dp_shard=2 x cp=4, seq 8192: each rank holds 2048 tokens (two of the 8
  // load-balanced chunks). torchtitan's ring carries K and V expanded to the 32 query heads
  // (repeat_kv): 2 x 2048 x (4096 + 4096) x 2 bytes = 32 MiB a rank, gathered from the 4
  // ranks once per pass (128 MiB, the all-gather rotater). Per layer, forward: the gather,
  // 4 partial attention steps of 1/4 of the core's FLOPs (2 x 2048 x 8192 x 32 x 128 / 4),
  // step 1 (the second) waiting for the gather and no other; backward: the gather again,
  // 4 steps of twice the FLOPs, and 4 shifts of the fp32 dK, dV to the next rank (64 MiB).
  Built b;
  Opts o;
  o.mesh = "dp_shard=2,cp=4";
  Build(&b, o);
  const double kv = 2.0 * 2048 * (4096 + 4096), dkv = 4.0 * 2048 * (4096 + 4096);
  const double step = 2.0 * 2048 * 8192 * 32 * 128 / 4;
  int gathers[2] = {0, 0}, dshifts = 0, steps[2] = {0, 0};
  std::vector<Inst> v = Expand(b.s);
  for (const Inst &x : v) {
    if (x.layer != 5) continue;
    const int bwd = x.op->phase == MP_PHASE_BACKWARD;
    if (x.op->type == MP_OP_COMM && x.op->group == MP_GROUP_CP) {
      EXPECT_EQ(x.op->stream, MP_STREAM_P2P);
      if (x.op->coll == MP_COLL_ALL_GATHER) {
        EXPECT_EQ(x.op->bytes, 4 * kv);
        EXPECT_EQ(x.op->dtype, MP_DTYPE_BF16);
        gathers[bwd]++;
      } else {
        EXPECT_EQ(x.op->coll, MP_COLL_SENDRECV);
        EXPECT_EQ(x.op->peer, MP_PEER_NEXT);
        EXPECT_EQ(x.op->bytes, dkv);
        EXPECT_EQ(x.op->dtype, MP_DTYPE_FP32);
        EXPECT_EQ(bwd, 1);
        dshifts++;
      }
    }
    if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_ATTENTION &&
        x.op->flops > 1e9) { // not the merges
      EXPECT_DOUBLE_EQ(x.op->flops, bwd ? 2 * step : step);
      steps[bwd]++;
      bool waits = false;
      mp_schedule_iter it;
      mp_schedule_iter_begin(b.s, &it);
      while (mp_schedule_iter_next(&it) && it.index != x.index) {
      }
      for (int d = 0; d < it.op->n_dep; d++) {
        const int64_t j = mp_schedule_iter_dep(&it, d);
        if (j >= 0 && v[j].op->type == MP_OP_COMM && v[j].op->group == MP_GROUP_CP) {
          waits = true;
          EXPECT_EQ(v[j].op->coll, MP_COLL_ALL_GATHER);
        }
      }
      EXPECT_EQ(waits, steps[bwd] == 2) << (bwd ? "backward" : "forward") << " step " << steps[bwd];
    }
  }
  EXPECT_EQ(steps[0], 4);
  EXPECT_EQ(steps[1], 4);
  EXPECT_EQ(gathers[0], 1);
  EXPECT_EQ(gathers[1], 1);
  EXPECT_EQ(dshifts, 4);
  // FSDP shards over dp_shard x cp = 8
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_GT(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_FSDP], 0);
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_FSDP), 8);
}

TEST(Schedule, ContextParallelRotateMethodsHoldAndMoveKAndV) {
  // The same ring as above (llama3.1-8b, dp_shard=2 x cp=4, seq 8192: kv = 32 MiB of K and
  // V a rank, dkv = 64 MiB of their fp32 gradients) under both of PyTorch's rotate methods
  // (torch/distributed/tensor/experimental/_context_parallel/_attention.py,
  // _templated_ring_attention and its backward). allgather: one all-gather of 4 x kv a
  // pass; held the 4 gathered and the send buffer, 5 kv forward, 5 kv + 2 dkv backward.
  // alltoall (_AllToAllRotater): before every step but the last, the K, V in use copied
  // (torch.cat) and shifted to the next rank, 3 shifts of kv a pass, the next step waiting
  // for the shift; held the K, V in use, the copy sent and the one arriving, 3 kv (2 at
  // cp = 2, whose only send is at step 0), and 2 dkv more backward. On an H100 PyTorch 2.11
  // holds 512 MiB more per cp rank under allgather at 32 heads and 32768 tokens (one kv
  // there) and the same from cp 4 to 8 under alltoall: bench/gpu/RESULTS.md.
  const double kv = 2.0 * 2048 * (4096 + 4096), dkv = 4.0 * 2048 * (4096 + 4096);
  for (int a2a = 0; a2a <= 1; a2a++) {
    for (int cp : {2, 4}) {
      SCOPED_TRACE((a2a ? "alltoall cp=" : "allgather cp=") + std::to_string(cp));
      Built b;
      Opts o;
      o.mesh = cp == 2 ? "dp_shard=4,cp=2" : "dp_shard=2,cp=4";
      o.cp_rotate = a2a ? MP_CP_ROTATE_ALLTOALL : MP_CP_ROTATE_ALLGATHER;
      Build(&b, o);
      const double kvr = kv * 4 / cp; /* a rank's K, V at this cp */
      const double units = a2a ? (cp < 3 ? cp : 3) : cp + 1;
      int gathers = 0, shifts[2] = {0, 0}, dshifts = 0;
      int64_t held[2] = {0, 0};
      for (const Inst &x : Expand(b.s)) {
        if (x.layer != 5) continue;
        const int bwd = x.op->phase == MP_PHASE_BACKWARD;
        if (x.op->type == MP_OP_ALLOC && x.op->mem_cat == MP_MEM_COMM) held[bwd] = x.op->mem_bytes;
        if (x.op->type != MP_OP_COMM || x.op->group != MP_GROUP_CP) continue;
        if (x.op->coll == MP_COLL_ALL_GATHER) {
          EXPECT_EQ(x.op->bytes, cp * kvr);
          gathers++;
        } else if (x.op->dtype == MP_DTYPE_BF16) {
          EXPECT_EQ(x.op->coll, MP_COLL_SENDRECV);
          EXPECT_EQ(x.op->bytes, kvr);
          shifts[bwd]++;
        } else {
          EXPECT_EQ(x.op->bytes, dkv * 4 / cp);
          dshifts++;
        }
      }
      EXPECT_EQ(gathers, a2a ? 0 : 2);
      EXPECT_EQ(shifts[0], a2a ? cp - 1 : 0);
      EXPECT_EQ(shifts[1], a2a ? cp - 1 : 0);
      EXPECT_EQ(dshifts, cp);
      EXPECT_EQ(held[0], (int64_t)(units * kvr));
      EXPECT_EQ(held[1], (int64_t)(units * kvr + 2 * dkv * 4 / cp));
    }
  }
}

TEST(Schedule, MegatronContextParallelPassesGroupedKVAndAllReducesOverDpTimesCp) {
  // Megatron-LM's context parallelism (Transformer Engine's p2p ring, Megatron-Core's
  // default cp_comm_type): llama3.1-8b on dp_replicate=2 x cp=4, seq 8192, T = 2048 tokens
  // a rank. The ring passes the grouped K and V (8 kv heads x 128, no repeat_kv): before
  // each of the 3 steps but the last, one rank's K and V, 2 x 2048 x (1024 + 1024) = 8 MiB
  // in bf16, to the next rank, in forward and backward; after every backward step the
  // fp32 dK, dV, 16 MiB. Transformer Engine keeps every step's K, V buffer until the pass
  // ends (its p2p_comm_buffers list): 4 x 8 MiB held in forward, and in backward with the
  // two fp32 dK, dV buffers. The parameters are replicated over cp, so the stage's fp32
  // gradients, 4 bytes a parameter, are all-reduced once over dp_replicate x cp (8 ranks),
  // none over dp_replicate alone and no FSDP collective.
  Built b;
  Opts o;
  o.mesh = "dp_replicate=2,cp=4";
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.attn = MP_ATTN_MATERIALIZED;  // the megatron-lm stack's; the ring's core is flash
  o.cp_rotate = MP_CP_ROTATE_ALLTOALL;
  o.ac = MP_AC_FULL;
  Build(&b, o);
  ASSERT_EQ(mp_schedule_check(&b.ctx, b.s), MP_OK) << mp_errmsg(&b.ctx);
  const double kv = 2.0 * 2048 * (1024 + 1024), dkv = 4.0 * 2048 * (1024 + 1024);
  int shifts[2] = {0, 0}, dshifts = 0, scores = 0;
  int64_t held[2] = {0, 0};
  for (const Inst &x : Expand(b.s)) {
    if (x.layer != 5) continue;
    const int bwd = x.op->phase == MP_PHASE_BACKWARD;
    if (x.op->type == MP_OP_ALLOC && x.op->mem_cat == MP_MEM_COMM) held[bwd] = x.op->mem_bytes;
    if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_GEMM && x.op->batch > 1) scores++;
    if (x.op->type != MP_OP_COMM || x.op->group != MP_GROUP_CP) continue;
    EXPECT_EQ(x.op->coll, MP_COLL_SENDRECV);
    if (x.op->dtype == MP_DTYPE_BF16) {
      EXPECT_EQ(x.op->bytes, kv);
      shifts[x.op->phase == MP_PHASE_BACKWARD]++;
    } else {
      EXPECT_EQ(x.op->bytes, dkv);
      dshifts++;
    }
  }
  // forward and its recompute under full AC, then backward
  EXPECT_EQ(shifts[0], 2 * 3);
  EXPECT_EQ(shifts[1], 3);
  EXPECT_EQ(dshifts, 4);
  EXPECT_EQ(scores, 0) << "no materialized QK^T under the ring";
  EXPECT_EQ(held[0], (int64_t)(4 * kv));
  EXPECT_EQ(held[1], (int64_t)(4 * kv + 2 * dkv));
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_DP_CP], 1);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_DP_REPLICATE], 0);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_FSDP], 0);
  EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_FSDP], 0);
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_REDUCE][MP_GROUP_DP_CP],
                   4.0 * mp_model_param_count(&b.model));
  EXPECT_EQ(mp_mesh_group_size(&b.plan->mesh, MP_GROUP_DP_CP), 8);
}

TEST(Schedule, MegatronDistributedOptimizerShardsTheStateAndReduceScattersTheGradients) {
  // Megatron-LM's distributed optimizer (--use-distributed-optimizer) on llama3.1-8b over
  // dp_replicate=4, global batch 8 (2 micro-batches a rank), n the model's parameters. Per
  // parameter (Megatron-LM docs, "bf16 param, fp32 grads": 6 + 12/d bytes): the bf16 model
  // parameter (2) and fp32 main gradient (4) whole, the fp32 master (4) and Adam m, v (8)
  // on the rank's n/4. The step's gradients, 4 n bytes, are reduce-scattered over the 4
  // ranks instead of all-reduced; AdamW and the master-to-bf16 copy run on n/4; the updated
  // bf16 parameters, 2 n bytes, are all-gathered back. Without overlap: one reduce-scatter
  // after the last backward, one all-gather after the optimizer on the compute stream.
  // With it (--overlap-grad-reduce --overlap-param-gather): a reduce-scatter per block
  // (and one for the embeddings, norm and head) in the last micro-batch, and the
  // all-gathers block by block on the gather stream in the first micro-batch's forward,
  // each block's first op waiting for its own; the bytes are the same.
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "llama3.1-8b", &m), MP_OK);
  const int64_t n = mp_model_param_count(&m), shard = (n + 3) / 4;
  for (int overlap = 0; overlap <= 1; overlap++) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    Built b;
    Opts o;
    o.mesh = "dp_replicate=4";
    o.mem_model = MP_MEM_MODEL_MEGATRON;
    o.global_batch = 8;
    o.dist_opt = 1;
    o.dp_overlap = overlap;
    Build(&b, o);
    EXPECT_EQ(b.s->n_micro, 2);
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_PARAMS], 2 * n + 4 * shard);
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_OPTIMIZER], 8 * shard);
    EXPECT_EQ(b.s->resident_bytes[MP_MEM_GRADS], 4 * n);
    mp_schedule_totals t;
    mp_schedule_totals_compute(b.s, &t);
    const int64_t blocks = overlap ? m.n_layers + 1 : 1;
    EXPECT_EQ(t.n_comm[MP_COLL_REDUCE_SCATTER][MP_GROUP_DP_REPLICATE], blocks);
    EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_DP_REPLICATE], blocks);
    EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_DP_REPLICATE], 0);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_REDUCE_SCATTER][MP_GROUP_DP_REPLICATE], 4.0 * n);
    EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_GATHER][MP_GROUP_DP_REPLICATE], 2.0 * n);
    int optimizer = 0, waited = 0;
    std::vector<Inst> v = Expand(b.s);
    for (const Inst &x : v) {
      if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_OPTIMIZER) {
        EXPECT_EQ(x.op->m, shard);
        optimizer++;
      }
      if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_GATHER) {
        EXPECT_EQ(x.op->stream, overlap ? MP_STREAM_GATHER : MP_STREAM_COMPUTE);
        EXPECT_EQ(x.op->when, overlap ? MP_WHEN_FIRST_MICRO : MP_WHEN_ONCE);
        EXPECT_EQ(x.op->phase, overlap ? MP_PHASE_FORWARD : MP_PHASE_OPTIMIZER);
      }
      if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_REDUCE_SCATTER) {
        EXPECT_EQ(x.op->when, MP_WHEN_LAST_MICRO);
      }
      for (int64_t d : x.deps)
        if (d >= 0 && v[d].op->type == MP_OP_COMM && v[d].op->coll == MP_COLL_ALL_GATHER) {
          EXPECT_EQ(v[d].layer, x.layer);
          waited++;
        }
    }
    EXPECT_EQ(optimizer, 1);
    EXPECT_EQ(waited, overlap ? m.n_layers + 2 : 0);  // each block, the embedding and the head
  }
  // a plan whose data parallelism is FSDP refuses it: FSDP shards the optimizer state with
  // the parameters
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=4", 0, &mesh), MP_OK);
  mp_plan_options po;
  mp_plan_options_init(&po);
  po.ddp.shard_optimizer = 1;
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&ctx, &m, &mesh, &po, &p), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "FSDP shards its optimizer state with the parameters"), nullptr)
      << mp_errmsg(&ctx);
}

TEST(Schedule, MegatronContextParallelNeedsTheP2pRing) {
  // Megatron-LM's ring sends K and V step by step; the all-gather rotate method is
  // PyTorch's and is refused under the megatron memory model, as is dp_shard (Megatron
  // FSDP) without the distributed optimizer it steps with.
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "llama3.1-8b", &m), MP_OK);
  for (const char *spec : {"dp_replicate=2,cp=4", "dp_shard=2,cp=4"}) {
    mp_mesh mesh;
    ASSERT_EQ(mp_mesh_parse(&ctx, spec, 0, &mesh), MP_OK);
    mp_plan_options po;
    mp_plan_options_init(&po);
    po.mem_model = MP_MEM_MODEL_MEGATRON;
    po.cp_rotate = MP_CP_ROTATE_ALLGATHER;
    mp_plan *p = nullptr;
    EXPECT_EQ(mp_build_plan(&ctx, &m, &mesh, &po, &p), MP_ERR_INVALID) << spec;
    EXPECT_NE(strstr(mp_errmsg(&ctx), spec[3] == 's' ? "Megatron FSDP steps its shards with the distributed optimizer" : "use alltoall"), nullptr)
        << mp_errmsg(&ctx);
    mp_plan_destroy(p);
  }
}

TEST(Schedule, Float8TensorParallelCastsBeforeItsGather) {
  // llama3.1-8b, tp=2 with SP, float8, seq 8192, micro-batch 1: T = 8192, Ts = 4096. As
  // torchao's float8 TP runs in torchtitan, the attention's and the MLP's input is cast to
  // float8 once on the rank's 4096 tokens and all-gathered in float8, T x H x 1 =
  // 33,554,432 bytes; q, k, v, gate and up cast only their weights. Per block forward:
  // 2 input casts of Ts x H, 7 weight casts, the input casts of o and down (T x q/tp and
  // T x f/tp) = 11 casts; without TP every Linear casts its input and weight: 14. In
  // backward q, k, v, gate and up transpose their saved float8 input (2 bytes an element)
  // instead of casting it (5). o and down close their regions with torchao's
  // Float8RowwiseParallel, whose backward casts the output gradient to E5M2 on the rank's
  // Ts x H before the sequence all-gather: two backward gathers of T x H x 1 byte, and the
  // gradient casts of o and down on Ts x H = 16,777,216 elements just before each gather,
  // none on T x H (o's input cast, T x q/tp, has the same count; the order tells them apart).
  // The gathered gradient, row-major T x H, is the weight gradient's first operand
  // transposed, which torchao's preprocess_addmm copies contiguous: o and down transpose
  // it (2 bytes an element), so 5 + 2 = 7 transposes of T x H in a block's backward.
  Built b;
  Opts o;
  o.mesh = "tp=2";
  o.fp8 = 1;
  Build(&b, o);
  int casts = 0, gathers = 0, transposes = 0, bgathers = 0, dy_shard = 0, dy_full = 0;
  const mp_op *prev = nullptr;
  for (const Inst &x : Expand(b.s)) {
    if (x.layer != 5) continue;
    const mp_op *op = x.op, *before = prev;
    prev = op;
    if (op->phase == MP_PHASE_BACKWARD && op->type == MP_OP_COMM && op->coll == MP_COLL_ALL_GATHER &&
        op->group == MP_GROUP_TP) {
      bgathers++;
      EXPECT_TRUE(op->module == MP_MOD_O || op->module == MP_MOD_DOWN);
      EXPECT_EQ(op->bytes, 8192.0 * 4096);
      EXPECT_EQ(op->dtype, MP_DTYPE_FP8_E5M2);
      dy_shard += before && before->type == MP_OP_COMPUTE && before->kernel == MP_KERNEL_FP8_CAST &&
                  before->module == op->module && before->m == 4096 * 4096;
    }
    if (op->phase == MP_PHASE_BACKWARD && op->type == MP_OP_COMPUTE &&
        op->kernel == MP_KERNEL_FP8_CAST && (op->module == MP_MOD_O || op->module == MP_MOD_DOWN))
      dy_full += op->m == 8192 * 4096 && op->bytes == 5.0 * 8192 * 4096;  // a cast, not the transpose
    if (op->phase == MP_PHASE_FORWARD && op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_FP8_CAST)
      casts++;
    if (op->phase == MP_PHASE_FORWARD && op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_FP8_CAST &&
        (op->module == MP_MOD_Q || op->module == MP_MOD_UP) && op->m == 4096 * 4096) {
      EXPECT_EQ(op->bytes, 5.0 * 4096 * 4096) << "the region's input cast on Ts x H";
    }
    if (op->phase == MP_PHASE_FORWARD && op->type == MP_OP_COMM && op->coll == MP_COLL_ALL_GATHER) {
      gathers++;
      EXPECT_EQ(op->bytes, 8192.0 * 4096);
      EXPECT_EQ(op->dtype, MP_DTYPE_FP8_E4M3);
    }
    if (op->phase == MP_PHASE_BACKWARD && op->type == MP_OP_COMPUTE &&
        op->kernel == MP_KERNEL_FP8_CAST && op->bytes == 2.0 * 8192 * 4096)
      transposes++;
  }
  EXPECT_EQ(casts, 11);
  EXPECT_EQ(gathers, 2);
  EXPECT_EQ(transposes, 7);
  EXPECT_EQ(bgathers, 2);
  EXPECT_EQ(dy_shard, 2);
  EXPECT_EQ(dy_full, 0);
  Built one;
  Opts p;
  p.mesh = "dp_shard=2";
  p.fp8 = 1;
  Build(&one, p);
  int casts1 = 0;
  for (const Inst &x : Expand(one.s))
    casts1 += x.layer == 5 && x.op->phase == MP_PHASE_FORWARD && x.op->type == MP_OP_COMPUTE &&
              x.op->kernel == MP_KERNEL_FP8_CAST;
  EXPECT_EQ(casts1, 14);
}

TEST(Schedule, MegatronActivationsFollowKorthikanti) {
  // gpt-22b (h 6144, a 64, s 2048, f 4h) at tp=8, micro-batch 1, Megatron-LM's memory model
  // with its materialized attention: Korthikanti et al. 2022, Table 2, per layer
  //   no SP:  sbh (10 + 24/t + 5as/(ht))       SP:  sbh (34/t + 5as/(ht))
  // with sbh = 2048 x 6144 = 12,582,912 and 5as/(ht) x sbh = 5 a s^2 / t = 167,772,160,
  // plus what the paper leaves out, the two LayerNorms' fp32 mean and rstd, 16 bytes per
  // token (on Ts = s/t tokens under SP):
  //   no SP: 163,577,856 + 167,772,160 + 32,768 = 331,382,784
  //   SP:     53,477,376 + 167,772,160 +  4,096 = 221,253,632
  // selective-core recomputes the core attention: the 5as/(ht) term goes; full keeps the
  // layer's input 2 sbh / t (SP) or 2 sbh. With flash attention instead the scores' term is
  // the log-sum-exp, 4 a s / t = 65,536 bytes.
  const double sbh = 2048.0 * 6144, core = 5.0 * 64 * 2048 * 2048 / 8;
  EXPECT_EQ(sbh * 13 + core + 32768, 331382784.0);
  EXPECT_EQ(sbh * 34 / 8 + core + 4096, 221253632.0);
  struct Case {
    int sp;
    mp_ac_mode ac;
    mp_attn_impl attn;
    int64_t want;
  } cases[] = {
      {0, MP_AC_NONE, MP_ATTN_MATERIALIZED, 331382784},
      {1, MP_AC_NONE, MP_ATTN_MATERIALIZED, 221253632},
      {0, MP_AC_SELECTIVE_CORE, MP_ATTN_MATERIALIZED, 331382784 - 167772160},
      {1, MP_AC_SELECTIVE_CORE, MP_ATTN_MATERIALIZED, 221253632 - 167772160},
      {1, MP_AC_FULL, MP_ATTN_MATERIALIZED, 2 * 2048 * 6144 / 8},
      {0, MP_AC_FULL, MP_ATTN_MATERIALIZED, 2 * 2048 * 6144},
      {1, MP_AC_NONE, MP_ATTN_FLASH, 221253632 - 167772160 + 4 * 8 * 2048},
  };
  for (const Case &k : cases) {
    Built b;
    Opts o;
    o.model = "gpt-22b";
    o.mesh = "tp=8";
    o.seq = 2048;
    o.sp = k.sp;
    o.ac = k.ac;
    o.attn = k.attn;
    o.mem_model = MP_MEM_MODEL_MEGATRON;
    Build(&b, o);
    EXPECT_EQ(SavedByBlock(b.s, 3), k.want) << "sp=" << k.sp << " " << mp_ac_mode_name(k.ac)
                                            << (k.attn == MP_ATTN_FLASH ? " flash" : "");
  }
}

TEST(Schedule, MoeBlockAllToAllsAndGroupedGemms) {
  // qwen3-30b-a3b on dp_shard=8, ep=8: 128 experts, top-8, H=2048, expert d_ff 768,
  // T = 8192 tokens per rank. Each all-to-all's payload is the rank's send buffer:
  // T x top_k x H x 2 = 8192 x 8 x 2048 x 2 = 268,435,456 bytes, 7/8 of it to other ranks.
  Built b;
  Opts o;
  o.model = "qwen3-30b-a3b";
  o.mesh = "dp_shard=8,ep=8";
  Build(&b, o);
  const double a2a = 8192.0 * 8 * 2048 * 2;
  int fwd = 0, bwd = 0, gemms = 0;
  for (const Inst &x : Expand(b.s)) {
    if (x.layer != 10) continue;
    if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_TO_ALL) {
      EXPECT_EQ(x.op->group, MP_GROUP_EP);
      EXPECT_EQ(x.op->bytes, a2a);
      (x.op->phase == MP_PHASE_FORWARD ? fwd : bwd)++;
    }
    if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_GEMM &&
        x.op->module == MP_MOD_EXPERTS_GATE && x.op->variant == MP_VAR_FWD) {
      gemms++;
      // 16 local experts, each receiving 8192 x 8 x 8 / 128 = 4096 tokens (balanced)
      EXPECT_EQ(x.op->batch, 16);
      EXPECT_EQ(x.op->m, 4096);
      EXPECT_EQ(x.op->n, 768);
      EXPECT_EQ(x.op->k, 2048);
      EXPECT_DOUBLE_EQ(x.op->flops, 2.0 * 8192 * 8 * 768 * 2048);
    }
  }
  EXPECT_EQ(fwd, 2);  // dispatch, combine
  EXPECT_EQ(bwd, 2);
  EXPECT_EQ(gemms, 1);
  // experts gathered over the expert-FSDP group (dp_shard / ep = 1: no collective), the
  // attention and MoE units over FSDP
  mp_schedule_totals t;
  mp_schedule_totals_compute(b.s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_EFSDP], 0);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_TO_ALL][MP_GROUP_EP], 48 * 4);
  // GEMM FLOPs: 6 x active matmul parameters x T (router 128 x 2048, top-8 experts of
  // 3 x 768 x 2048, attention q/o 4096 x 2048, k/v 512 x 2048, head 151936 x 2048)
  const double T = 8192;
  const double block = 128 * 2048 + 8 * 3 * 768 * 2048 + 2 * 4096 * 2048 + 2 * 512 * 2048;
  const double gemm = Sum(Expand(b.s), 1, [](const Inst &x) {
    return x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_GEMM;
  });
  EXPECT_DOUBLE_EQ(gemm, 6 * T * (48 * block + 151936.0 * 2048));
}

TEST(Schedule, PipelineStagesSendAndReceive) {
  // llama3.1-8b, pp=4 x dp_shard=2: 8 layers per stage; rank r has pp coordinate r / 2.
  for (int stage = 0; stage < 4; stage++) {
    Built b;
    Opts o;
    o.mesh = "pp=4,dp_shard=2";
    o.rank = stage * 2;
    Build(&b, o);
    EXPECT_EQ(b.s->pp_stage, stage);
    int send_f = 0, recv_f = 0, send_b = 0, recv_b = 0, loss = 0, emb = 0;
    int lo = 1000, hi = -1;
    for (const Inst &x : Expand(b.s)) {
      if (x.layer >= 0 && x.op->type == MP_OP_COMPUTE) {
        lo = std::min(lo, x.layer);
        hi = std::max(hi, x.layer);
      }
      if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_LOSS) loss++;
      if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_EMBEDDING) emb++;
      if (x.op->type != MP_OP_COMM) continue;
      if (x.op->coll == MP_COLL_SEND || x.op->coll == MP_COLL_RECV) {
        EXPECT_EQ(x.op->group, MP_GROUP_PP);
        EXPECT_EQ(x.op->stream, MP_STREAM_P2P);
        EXPECT_EQ(x.op->bytes, 2.0 * 8192 * 4096);  // [T, H] bf16
      }
      const bool f = x.op->phase == MP_PHASE_FORWARD;
      if (x.op->coll == MP_COLL_SEND) (f ? send_f : send_b)++;
      if (x.op->coll == MP_COLL_RECV) (f ? recv_f : recv_b)++;
    }
    EXPECT_EQ(lo, stage * 8);
    EXPECT_EQ(hi, stage * 8 + 7);
    EXPECT_EQ(recv_f, stage > 0);
    EXPECT_EQ(send_f, stage < 3);
    EXPECT_EQ(recv_b, stage < 3);
    EXPECT_EQ(send_b, stage > 0);
    EXPECT_EQ(loss > 0, stage == 3);
    EXPECT_EQ(emb > 0, stage == 0);
  }
}

TEST(Schedule, PrefetchAndReduceScatterDependencies) {
  for (int mode = 0; mode < 2; mode++) {
    Built b;
    Opts o;
    o.mode = (mp_schedule_mode)mode;
    Build(&b, o);
    auto v = Expand(b.s);
    std::map<int, int64_t> fwd_gather, first_fwd_compute;
    for (const Inst &x : v) {
      if (x.op->phase != MP_PHASE_FORWARD || x.layer < 0) continue;
      if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_GATHER) fwd_gather[x.layer] = x.index;
      if (x.op->type == MP_OP_COMPUTE && !first_fwd_compute.count(x.layer)) {
        first_fwd_compute[x.layer] = x.index;
        // the block's first compute waits on its own all-gather
        bool waits = false;
        for (int64_t d : x.deps)
          if (d >= 0 && v[d].op->type == MP_OP_COMM && v[d].op->coll == MP_COLL_ALL_GATHER &&
              v[d].layer == x.layer)
            waits = true;
        EXPECT_TRUE(waits) << "layer " << x.layer << " mode " << mode;
      }
    }
    for (int l = 1; l < 32; l++)  // prefetch: gathered before the previous block computes
      EXPECT_LT(fwd_gather[l], first_fwd_compute[l - 1]) << l;
    // each reduce-scatter waits for a backward op of its own block
    int rs = 0;
    for (const Inst &x : v) {
      if (x.op->type != MP_OP_COMM || x.op->coll != MP_COLL_REDUCE_SCATTER || x.layer < 0) continue;
      rs++;
      bool ok = false;
      for (int64_t d : x.deps)
        if (d >= 0 && v[d].layer == x.layer && v[d].op->phase == MP_PHASE_BACKWARD) ok = true;
      EXPECT_TRUE(ok) << x.layer;
    }
    EXPECT_EQ(rs, 32);
  }
}

// The same step in both modes: totals, and the expanded op streams field by field, with
// dependencies compared after dropping those implied by a later one on the same stream.
std::vector<std::vector<int64_t>> EffectiveDeps(const std::vector<Inst> &v) {
  std::vector<std::vector<int64_t>> out;
  for (const Inst &x : v) {
    std::map<int, int64_t> latest;  // stream -> latest dependency
    for (int64_t d : x.deps)
      if (d >= 0) latest[v[d].op->stream] = std::max(latest[v[d].op->stream], d);
    std::vector<int64_t> e;
    for (auto &kv : latest) e.push_back(kv.second);
    out.push_back(e);
  }
  return out;
}

void ExpectSameStep(const Opts &base) {
  Opts oe = base, oc = base;
  oe.mode = MP_SCHEDULE_EXPANDED;
  oc.mode = MP_SCHEDULE_COMPACT;
  Built e, c;
  Build(&e, oe);
  Build(&c, oc);
  if (testing::Test::HasFatalFailure()) return;
  for (int i = 0; i < e.s->n_segs; i++) EXPECT_EQ(e.s->segs[i].repeat, 1);
  // a stage of more than two blocks has a run to collapse (first and last blocks differ)
  if (c.plan->layers_per_stage > 2) EXPECT_LT(c.s->n_ops, e.s->n_ops) << base.model;
  else EXPECT_LE(c.s->n_ops, e.s->n_ops);
  mp_schedule_totals te, tc;
  mp_schedule_totals_compute(e.s, &te);
  mp_schedule_totals_compute(c.s, &tc);
  EXPECT_NEAR(tc.flops / te.flops, 1.0, 1e-12);
  for (int k = 0; k < MP_COLL_COUNT; k++)
    for (int g = 0; g < MP_GROUP_COUNT; g++) {
      EXPECT_EQ(tc.n_comm[k][g], te.n_comm[k][g]);
      EXPECT_DOUBLE_EQ(tc.comm_bytes[k][g], te.comm_bytes[k][g]);
    }
  auto ve = Expand(e.s), vc = Expand(c.s);
  ASSERT_EQ(ve.size(), vc.size());
  EXPECT_EQ((int64_t)ve.size(), e.s->n_instances);
  EXPECT_EQ(c.s->n_instances, e.s->n_instances);
  auto de = EffectiveDeps(ve), dc = EffectiveDeps(vc);
  for (size_t i = 0; i < ve.size(); i++) {
    const mp_op *a = ve[i].op, *b = vc[i].op;
    ASSERT_TRUE(a->type == b->type && a->phase == b->phase && a->stream == b->stream &&
                a->when == b->when && a->kernel == b->kernel && a->variant == b->variant &&
                a->coll == b->coll && a->group == b->group && a->dtype == b->dtype &&
                a->mem_cat == b->mem_cat && a->module == b->module && a->buf == b->buf &&
                a->m == b->m && a->n == b->n && a->k == b->k && a->batch == b->batch &&
                a->flops == b->flops && a->bytes == b->bytes && a->mem_bytes == b->mem_bytes &&
                ve[i].layer == vc[i].layer && ve[i].unit == vc[i].unit)
        << "instance " << i << " differs (" << base.model << " " << base.mesh << ")";
    ASSERT_EQ(de[i], dc[i]) << "dependencies of instance " << i;
  }
}

TEST(Schedule, CompactEqualsExpanded) {
  Opts o;
  ExpectSameStep(o);  // llama3.1-8b dp_shard=8
  o.ac = MP_AC_FULL;
  o.mesh = "dp_replicate=2,dp_shard=2,tp=2";
  ExpectSameStep(o);
  o = Opts();
  o.model = "qwen3-30b-a3b";
  o.mesh = "dp_shard=8,ep=4";
  o.ac = MP_AC_SELECTIVE;
  ExpectSameStep(o);
  o = Opts();
  o.model = "tiny-moe";
  o.mesh = "dp_shard=4,tp=2,ep=2";
  o.seq = 64;
  o.fp8 = 1;
  o.global_batch = 16;  // 4 micro-batches per rank
  ExpectSameStep(o);
  o = Opts();
  o.model = "gpt2-124m";
  o.mesh = "dp_shard=4";
  o.seq = 1024;
  o.reshard = 0;
  ExpectSameStep(o);
  o = Opts();
  o.mesh = "pp=4,dp_shard=2";
  o.rank = 3;  // stage 1
  ExpectSameStep(o);
}

TEST(Schedule, CompactCollapsesRepeatedBlocks) {
  Built b;
  Opts o;
  o.mode = MP_SCHEDULE_COMPACT;
  Build(&b, o);
  // llama3.1-8b: blocks 0 (no predecessor), 1..30, 31 (no successor), forward and backward
  int reps = 0, block_segs = 0;
  for (int i = 0; i < b.s->n_segs; i++) {
    if (b.s->segs[i].layer_step == 0) continue;
    block_segs++;
    reps = std::max(reps, (int)b.s->segs[i].repeat);
  }
  EXPECT_EQ(block_segs, 6);
  EXPECT_EQ(reps, 30);
}

TEST(Schedule, MemoryReplayReturnsToResident) {
  // Independent of mp_schedule_check: sum the events of one micro-batch.
  Opts cases[3];
  cases[1].ac = MP_AC_SELECTIVE;
  cases[1].fp8 = 1;
  cases[1].mesh = "dp_shard=4,tp=2";
  cases[2].model = "qwen3-30b-a3b";
  cases[2].mesh = "dp_shard=8,ep=8";
  for (const Opts &o : cases) {
    Built b;
    Build(&b, o);
    int64_t live = 0, peak = 0, resident = 0;
    for (int c = 0; c < MP_MEM_COUNT; c++) resident += b.s->resident_bytes[c];
    int fp8 = 0;
    for (const Inst &x : Expand(b.s)) {
      if (x.op->type == MP_OP_ALLOC) live += x.op->mem_bytes;
      if (x.op->type == MP_OP_FREE) live -= x.op->mem_bytes;
      fp8 += x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_FP8_CAST;
      EXPECT_GE(live, 0);
      peak = std::max(peak, live);
    }
    EXPECT_EQ(live, resident) << o.model << " " << o.mesh;
    EXPECT_GT(peak, resident);
    EXPECT_EQ(fp8 > 0, o.fp8 == 1);
  }
}

TEST(Schedule, Float8GemmDtypes) {
  Built b;
  Opts o;
  o.fp8 = 1;
  Build(&b, o);
  int e4 = 0, e5 = 0;
  for (const Inst &x : Expand(b.s)) {
    if (x.op->type != MP_OP_COMPUTE || x.op->kernel != MP_KERNEL_GEMM || x.layer != 2) continue;
    if (x.op->variant == MP_VAR_FWD) {
      EXPECT_EQ(x.op->dtype, MP_DTYPE_FP8_E4M3);
      e4++;
    } else {
      EXPECT_EQ(x.op->dtype, MP_DTYPE_FP8_E5M2);
      e5++;
    }
  }
  EXPECT_EQ(e4, 7);      // q, k, v, o, gate, up, down
  EXPECT_EQ(e5, 2 * 7);  // DGRAD and WGRAD each
}

TEST(Schedule, RefusesShardedMeshWithoutFsdp) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "tiny-dense", &m), MP_OK);
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=2", 0, &mesh), MP_OK);
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_plan_create(&ctx, &m, &mesh, nullptr, &p), MP_OK) << mp_errmsg(&ctx);
  mp_arena *a = mp_arena_create();
  mp_schedule *s = nullptr;
  EXPECT_EQ(mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &s), MP_ERR_ORDER);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "FSDP"), nullptr);
  EXPECT_EQ(mp_schedule_build(&ctx, p, 5, MP_SCHEDULE_EXPANDED, a, &s), MP_ERR_INVALID);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
}

TEST(Schedule, OpNames) {
  Built b;
  Opts o;
  Build(&b, o);
  std::vector<std::string> names;
  char buf[256];
  for (const Inst &x : Expand(b.s)) {
    mp_op_name(b.s, x.op, x.layer, buf, sizeof buf);
    names.push_back(buf);
  }
  auto has = [&](const char *n) {
    for (auto &s : names)
      if (s == n) return true;
    return false;
  };
  EXPECT_TRUE(has("layers.3.attention.q_proj gemm fwd"));
  EXPECT_TRUE(has("layers.3 attention core fwd"));
  EXPECT_TRUE(has("layers.4 all_gather fsdp"));
  EXPECT_TRUE(has("layers.4 reduce_scatter fsdp"));
  EXPECT_TRUE(has("root all_gather fsdp"));
}

}  // namespace

namespace {

TEST(Schedule, ResidentBytesEqualPlanTotalsOnEveryRank) {
  // dp_shard=3 does not divide tiny-dense's rows (64 -> chunks 22, 22, 20; 192 -> 64 each),
  // so the ranks hold different amounts; the schedule's resident bytes must match the
  // plan's per-rank totals exactly, rank by rank (pp=2 puts stages in the mix).
  const char *meshes[] = {"dp_shard=3", "pp=2,dp_shard=3,tp=2", "dp_replicate=2,dp_shard=2"};
  for (const char *ms : meshes) {
    Opts o;
    o.model = "tiny-dense";
    o.mesh = ms;
    o.seq = 64;
    Built b0;
    Build(&b0, o);
    const int world = mp_mesh_world(&b0.plan->mesh);
    for (int r = 0; r < world; r++) {
      mp_arena *a = mp_arena_create();
      mp_schedule *s = nullptr;
      ASSERT_EQ(mp_schedule_build(&b0.ctx, b0.plan, r, MP_SCHEDULE_COMPACT, a, &s), MP_OK);
      mp_plan_totals t;
      mp_plan_rank_totals(b0.plan, r, &t);
      EXPECT_EQ(s->resident_bytes[MP_MEM_PARAMS], t.param_bytes) << ms << " rank " << r;
      EXPECT_EQ(s->resident_bytes[MP_MEM_GRADS], t.grad_bytes);
      EXPECT_EQ(s->resident_bytes[MP_MEM_OPTIMIZER], t.optimizer_bytes);
      EXPECT_EQ(mp_schedule_check(&b0.ctx, s), MP_OK) << mp_errmsg(&b0.ctx);
      mp_arena_destroy(a);
    }
  }
  Built b;
  Opts o;
  o.model = "tiny-dense";
  o.mesh = "dp_shard=3";
  o.seq = 64;
  Build(&b, o);
  // rank 2 holds the 20-row tails of the [64]-row tensors: fewer bytes than rank 0
  mp_plan_totals t0, t2;
  mp_plan_rank_totals(b.plan, 0, &t0);
  mp_plan_rank_totals(b.plan, 2, &t2);
  EXPECT_GT(t0.param_bytes, t2.param_bytes);
}

TEST(Schedule, DdpWithoutFsdpAllReducesGradients) {
  // Passes without FSDP on dp_replicate=2: parameters used in place, one gradient
  // all-reduce per block (and the root) over dp_replicate, in fp32: 4 x block elements.
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "tiny-dense", &m), MP_OK);
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_replicate=2", 0, &mesh), MP_OK);
  mp_plan_options po;
  mp_plan_options_init(&po);
  po.seq = 64;
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_plan_create(&ctx, &m, &mesh, &po, &p), MP_OK) << mp_errmsg(&ctx);
  mp_arena *a = mp_arena_create();
  mp_schedule *s = nullptr;
  ASSERT_EQ(mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &s), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_schedule_check(&ctx, s), MP_OK) << mp_errmsg(&ctx);
  mp_schedule_totals t;
  mp_schedule_totals_compute(s, &t);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_REDUCE][MP_GROUP_DP_REPLICATE], 3);
  EXPECT_EQ(t.n_comm[MP_COLL_ALL_GATHER][MP_GROUP_FSDP], 0);
  // every parameter's gradient once: 4 bytes x all parameters of tiny-dense
  EXPECT_DOUBLE_EQ(t.comm_bytes[MP_COLL_ALL_REDUCE][MP_GROUP_DP_REPLICATE],
                   4.0 * mp_model_param_count(&m));
  mp_arena_destroy(a);
  mp_plan_destroy(p);
}

}  // namespace

namespace {

// Layer 1's forward on tiny-dense, fp8 (tensorwise) over `mesh`, float8 all-gather `ag`: its
// FSDP all-gather's bytes, float8 casts and TP all-reduces.
struct Fp8Gather {
  double ag_bytes = -1;
  int casts = 0, tp_all_reduces = 0;
};
void BuildFp8Gather(const char *mesh_spec, int ag, Fp8Gather *out) {
  Opts o;
  o.model = "tiny-dense";
  o.mesh = mesh_spec;
  o.seq = 64;
  o.fp8 = 1;
  o.fp8_all_gather = ag;
  Built b;
  Build(&b, o);
  if (b.s == nullptr) return;
  for (const Inst &x : Expand(b.s)) {
    if (x.layer != 1 || x.op->phase != MP_PHASE_FORWARD) continue;
    if (x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_GATHER && x.op->group == MP_GROUP_FSDP)
      out->ag_bytes = x.op->bytes;
    out->casts += x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_FP8_CAST;
    out->tp_all_reduces += x.op->type == MP_OP_COMM && x.op->coll == MP_COLL_ALL_REDUCE && x.op->group == MP_GROUP_TP;
  }
}

TEST(Schedule, Float8AllGatherHalvesLinearGatherBytes) {
  // tiny-dense block: Linear weights q, o 64x64, k, v 32x64, gate, up, down 192x64 = 49,152
  // elements gathered as float8 (1 byte) with float8 all-gather, bf16 (2) otherwise; the two
  // norms (128 elements) stay bf16. Forward weight casts disappear (cast before the gather).
  for (int ag = 0; ag < 2; ag++) {
    Fp8Gather g;
    BuildFp8Gather("dp_shard=2", ag, &g);
    EXPECT_EQ(g.ag_bytes, ag ? 49152.0 + 2 * 128 : 2 * (49152.0 + 128));
    EXPECT_EQ(g.casts, ag ? 7 : 14);  // input casts only, or weight + input per Linear
  }
}

// Beside TP 2 each rank gathers its TP shard of every Linear weight: q, o 64x64 -> 2,048, k, v
// 32x64 -> 1,024, gate, up, down 192x64 -> 6,144 each, 24,576 elements, one byte each with
// float8 all-gather and two without; the two norms (128 elements, replicated under TP) stay
// bf16. The weights' forward casts (one a Linear, 7) and their amax all-reduces over TP go:
// the precomputed scales are the tensors' (torchao fsdp_utils.py
// precompute_float8_dynamic_scale_for_fsdp).
TEST(Schedule, Float8AllGatherBesideTpGathersFloat8Shards) {
  Fp8Gather g[2];
  for (int ag = 0; ag < 2; ag++) {
    BuildFp8Gather("dp_shard=2,tp=2", ag, &g[ag]);
    EXPECT_EQ(g[ag].ag_bytes, ag ? 24576.0 + 2 * 128 : 2 * (24576.0 + 128));
  }
  EXPECT_EQ(g[0].casts - g[1].casts, 7);
  EXPECT_EQ(g[0].tp_all_reduces - g[1].tp_all_reduces, 7);
}

}  // namespace

// mp_schedule_prep: one prep made from a plan serves every plan mp_plan_derive makes from
// it (other micro-batch, AC, reshard): the prepped build gives exactly the schedule
// mp_schedule_build gives for the derived plan, op for op, on several ranks and stages.
// A plan with other parameter tables or another mesh is refused.
namespace {

void ExpectSameOp(const mp_op &a, const mp_op &b, int i) {
  SCOPED_TRACE("op " + std::to_string(i));
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.phase, b.phase);
  EXPECT_EQ(a.stream, b.stream);
  EXPECT_EQ(a.when, b.when);
  EXPECT_EQ(a.kernel, b.kernel);
  EXPECT_EQ(a.variant, b.variant);
  EXPECT_EQ(a.coll, b.coll);
  EXPECT_EQ(a.group, b.group);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.mem_cat, b.mem_cat);
  EXPECT_EQ(a.module, b.module);
  EXPECT_EQ(a.layer, b.layer);
  EXPECT_EQ(a.unit, b.unit);
  EXPECT_EQ(a.buf, b.buf);
  EXPECT_EQ(a.m, b.m);
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.batch, b.batch);
  EXPECT_EQ(a.flops, b.flops);  // exact: the same arithmetic
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.mem_bytes, b.mem_bytes);
  ASSERT_EQ(a.n_dep, b.n_dep);
  for (int d = 0; d < a.n_dep; d++) {
    EXPECT_EQ(a.dep[d], b.dep[d]);
    EXPECT_EQ(a.dep_flags[d], b.dep_flags[d]);
  }
}

void ExpectSameSchedule(const mp_schedule *a, const mp_schedule *b) {
  EXPECT_EQ(a->rank, b->rank);
  EXPECT_EQ(a->pp_stage, b->pp_stage);
  EXPECT_EQ(a->n_micro, b->n_micro);
  EXPECT_EQ(a->micro_batch, b->micro_batch);
  EXPECT_EQ(a->tokens_per_step_per_rank, b->tokens_per_step_per_rank);
  EXPECT_EQ(a->model_flops_per_step, b->model_flops_per_step);
  EXPECT_EQ(a->n_instances, b->n_instances);
  for (int c = 0; c < MP_MEM_COUNT; c++) EXPECT_EQ(a->resident_bytes[c], b->resident_bytes[c]);
  ASSERT_EQ(a->n_segs, b->n_segs);
  for (int i = 0; i < a->n_segs; i++) {
    EXPECT_EQ(a->segs[i].first_op, b->segs[i].first_op);
    EXPECT_EQ(a->segs[i].n_ops, b->segs[i].n_ops);
    EXPECT_EQ(a->segs[i].repeat, b->segs[i].repeat);
    EXPECT_EQ(a->segs[i].layer_step, b->segs[i].layer_step);
    EXPECT_EQ(a->segs[i].unit_step, b->segs[i].unit_step);
  }
  ASSERT_EQ(a->n_ops, b->n_ops);
  for (int i = 0; i < a->n_ops; i++) ExpectSameOp(a->ops[i], b->ops[i], i);
}

}  // namespace

TEST(Schedule, PrepServesDerivedPlans) {
  struct Case {
    const char *model, *mesh;
    int fp8;
  } cases[] = {
      {"llama3.1-8b", "pp=4,dp_replicate=2,dp_shard=2,tp=2", 1},
      {"llama3.1-8b", "dp_shard=4,cp=2", 0},
      {"tiny-moe", "dp_shard=4,ep=2", 0},
  };
  for (const Case &c : cases) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_model m;
    ASSERT_EQ(mp_model_load(&ctx, c.model, &m), MP_OK) << mp_errmsg(&ctx);
    mp_mesh mesh;
    ASSERT_EQ(mp_mesh_parse(&ctx, c.mesh, 0, &mesh), MP_OK) << mp_errmsg(&ctx);
    const int world = mp_mesh_world(&mesh);
    mp_plan_options bo;
    mp_plan_options_init(&bo);
    bo.fp8 = c.fp8;
    bo.seq = 1024;
    bo.global_batch = 64;
    bo.micro_batch = 1;
    mp_plan *base = nullptr;
    ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &bo, &base), MP_OK) << mp_errmsg(&ctx);
    mp_arena *a = mp_arena_create();
    for (int rank : {0, world / 2, world - 1}) {
      mp_schedule_prep *prep = nullptr;
      ASSERT_EQ(mp_schedule_prep_create(&ctx, base, rank, MP_SCHEDULE_COMPACT, a, &prep), MP_OK)
          << mp_errmsg(&ctx);
      for (int mb : {1, 4})
        for (mp_ac_mode ac : {MP_AC_NONE, MP_AC_SELECTIVE, MP_AC_FULL})
          for (int rs : {0, 1}) {
            SCOPED_TRACE(std::string(c.model) + " " + c.mesh + " rank " + std::to_string(rank) +
                         " mb=" + std::to_string(mb) + " ac=" + mp_ac_mode_name(ac) +
                         " rs=" + std::to_string(rs));
            mp_plan_options o = bo;
            o.micro_batch = mb;
            o.ac = ac;
            o.fsdp.reshard_after_forward = rs;
            mp_plan *d = nullptr;
            ASSERT_EQ(mp_plan_derive(&ctx, base, &o, a, &d), MP_OK) << mp_errmsg(&ctx);
            mp_schedule *ref = nullptr, *got = nullptr;
            ASSERT_EQ(mp_schedule_build(&ctx, d, rank, MP_SCHEDULE_COMPACT, a, &ref), MP_OK)
                << mp_errmsg(&ctx);
            ASSERT_EQ(mp_schedule_build_prepped(&ctx, d, prep, a, &got), MP_OK)
                << mp_errmsg(&ctx);
            ExpectSameSchedule(ref, got);
          }
    }
    // Another plan (its own tables) is refused, even with the same mesh and options.
    mp_plan *other = nullptr;
    ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &bo, &other), MP_OK) << mp_errmsg(&ctx);
    mp_schedule_prep *prep = nullptr;
    ASSERT_EQ(mp_schedule_prep_create(&ctx, base, 0, MP_SCHEDULE_COMPACT, a, &prep), MP_OK);
    mp_schedule *s = nullptr;
    EXPECT_EQ(mp_schedule_build_prepped(&ctx, other, prep, a, &s), MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("another plan"), std::string::npos);
    EXPECT_EQ(s, nullptr);
    mp_plan_destroy(other);
    mp_arena_destroy(a);
    mp_plan_destroy(base);
  }
}

// ---- float8 recipes --------------------------------------------------------------------

namespace {

// Layer 5's float8 casts in one phase of the step (kernel FP8_CAST), with each one's bytes.
struct Casts {
  int n = 0, first_micro = 0;
  std::vector<double> bytes;
};

Casts CastsOf(const mp_schedule *s, mp_phase phase, int layer = 5) {
  Casts c;
  for (const Inst &x : Expand(s)) {
    if (x.layer != layer || x.op->type != MP_OP_COMPUTE || x.op->kernel != MP_KERNEL_FP8_CAST ||
        x.op->phase != phase)
      continue;
    c.n++;
    c.first_micro += x.op->when == MP_WHEN_FIRST_MICRO;
    c.bytes.push_back(x.op->bytes);
  }
  return c;
}

int Count(const std::vector<double> &v, double x) {
  int n = 0;
  for (double y : v) n += y == x;
  return n;
}

}  // namespace

TEST(Schedule, TransformerEngineDelayedScalingCastsWeightsOnceAStep) {
  // Megatron-Core's float8 under Transformer Engine's DelayedScaling on llama3.1-8b,
  // dp_replicate=8, seq 8192, micro-batch 1 (T = 8192, H = 4096, f = 14336). Per block:
  // - each of the 7 Linears' weights is cast with its transposed copy once a step (its
  //   first micro-batch): read 2 + two 1-byte copies = 4 bytes an element, no amax pass
  //   (the scale comes from the amax history);
  // - the inputs: LayerNormLinear's norm emits q/k/v's and gate/up's float8 input itself,
  //   k, v and up are one GEMM with q and gate (linear_qkv, linear_fc1); o's input
  //   (T x 4096) and down's (T x 14336) are cast with both copies, 4 bytes an element:
  //   9 forward casts;
  // - backward: every output gradient cast with its transpose (7), and the transposed copy
  //   of the two inputs the norm emitted row-major only (2 bytes an element: a float8 read
  //   and write): 9;
  // - the amaxes of the chunk's 32 blocks x 7 Linears reduced once a pass over the data-
  //   parallel group: forward input and weight, 4 x 2 x 7 x 32 = 1792 bytes; backward the
  //   gradient's, 896.
  Built b;
  Opts o;
  o.mesh = "dp_replicate=8";
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.fp8 = 1;
  Build(&b, o);
  EXPECT_EQ(b.plan->opts.fp8_opts.recipe, MP_FP8_DELAYED);
  const double T = 8192, H = 4096, f = 14336;
  const Casts fw = CastsOf(b.s, MP_PHASE_FORWARD), bw = CastsOf(b.s, MP_PHASE_BACKWARD);
  EXPECT_EQ(fw.n, 9);
  EXPECT_EQ(fw.first_micro, 7);
  EXPECT_EQ(Count(fw.bytes, 4.0 * H * H), 2);      // q, o
  EXPECT_EQ(Count(fw.bytes, 4.0 * 1024 * H), 2);   // k, v (8 kv heads x 128)
  EXPECT_EQ(Count(fw.bytes, 4.0 * f * H), 3);      // gate, up, down
  EXPECT_EQ(Count(fw.bytes, 4.0 * T * H), 1);      // o's input
  EXPECT_EQ(Count(fw.bytes, 4.0 * T * f), 1);      // down's input
  EXPECT_EQ(bw.n, 9);
  EXPECT_EQ(bw.first_micro, 0);
  EXPECT_EQ(Count(bw.bytes, 2.0 * T * H), 2);      // q's and gate's input, transposed
  int fwd_amax = 0, bwd_amax = 0;
  for (const Inst &x : Expand(b.s)) {
    if (x.op->type != MP_OP_COMM || x.op->group != MP_GROUP_DP_CP || x.op->dtype != MP_DTYPE_FP32 ||
        x.op->coll != MP_COLL_ALL_REDUCE || x.op->bytes > 4096)
      continue;
    fwd_amax += x.op->phase == MP_PHASE_FORWARD && x.op->bytes == 1792;
    bwd_amax += x.op->phase == MP_PHASE_BACKWARD && x.op->bytes == 896;
  }
  EXPECT_EQ(fwd_amax, 1);
  EXPECT_EQ(bwd_amax, 1);
  // Transformer Engine's current scaling (tensorwise): each cast reads its source once
  // more for the amax (6 bytes an element for two copies), the norm no longer emits float8
  // (the scale is known only after it ran): q's and gate's inputs are cast too, 11 casts;
  // no amax history to reduce.
  Built cur;
  o.fp8_recipe = MP_FP8_TENSORWISE;
  Build(&cur, o);
  const Casts cfw = CastsOf(cur.s, MP_PHASE_FORWARD);
  EXPECT_EQ(cfw.n, 11);
  EXPECT_EQ(Count(cfw.bytes, 6.0 * T * H), 3);  // q's, gate's and o's inputs
  EXPECT_EQ(Count(cfw.bytes, 6.0 * H * H), 2);
  for (const Inst &x : Expand(cur.s))
    EXPECT_FALSE(x.op->type == MP_OP_COMM && x.op->group == MP_GROUP_DP_CP && x.op->phase != MP_PHASE_OPTIMIZER &&
                 x.op->dtype == MP_DTYPE_FP32 && x.op->bytes < 4096)
        << "an amax reduction under current scaling";
}

TEST(Schedule, Float8RecipesOfTorchaoPriceTheirCasts) {
  // torchtitan's float8 Linears (torchao) on llama3.1-8b, dp_shard=8, seq 8192: every Linear
  // casts its input and weight forward, its output gradient, weight and input backward.
  // tensorwise: read 2 + write 1 + the amax read 2 = 5 bytes an element, 14 forward and 21
  // backward casts a block (the backward's bytes: fp8_torchao_test.cc). rowwise scales the output gradient along both dimensions (one
  // cast for the input gradient, one for the weight gradient): 28 backward casts, 5 bytes
  // an element; its backward GEMMs run cuBLAS's per-tensor kernel with unit scales and
  // scale the bf16 output afterwards (torchao float8_ops.py addmm_float8_unwrapped without
  // fast accumulation), a read and a write, 4 bytes an element of each of the 14 outputs:
  // the 7 weight gradients [out, in] and the 7 input gradients [T, in]. MXFP8 scales 1x32 blocks inside the cast (no amax pass): 3 + 1/32 bytes an
  // element (an E8M0 scale a block), its gradient cast twice as rowwise's.
  const double H = 4096;
  Opts o;
  o.fp8 = 1;
  Built tw, rw, mx;
  Build(&tw, o);
  EXPECT_EQ(tw.plan->opts.fp8_opts.recipe, MP_FP8_TENSORWISE);
  EXPECT_EQ(CastsOf(tw.s, MP_PHASE_FORWARD).n, 14);
  EXPECT_EQ(CastsOf(tw.s, MP_PHASE_BACKWARD).n, 21);
  EXPECT_EQ(Count(CastsOf(tw.s, MP_PHASE_FORWARD).bytes, 5.0 * H * H), 2);  // q's and o's weights
  EXPECT_EQ(CastsOf(tw.s, MP_PHASE_FORWARD).first_micro, 0);
  o.fp8_recipe = MP_FP8_ROWWISE;
  Build(&rw, o);
  EXPECT_EQ(CastsOf(rw.s, MP_PHASE_FORWARD).n, 14);
  const Casts rbw = CastsOf(rw.s, MP_PHASE_BACKWARD);
  const double f = 14336;
  EXPECT_EQ(rbw.n, 28 + 14);
  EXPECT_EQ(Count(rbw.bytes, 4.0 * H * H), 2);     // q's and o's weight gradients, scaled
  EXPECT_EQ(Count(rbw.bytes, 4.0 * 1024 * H), 2);  // k's and v's
  EXPECT_EQ(Count(rbw.bytes, 4.0 * f * H), 3);     // gate's, up's and down's
  o.fp8_recipe = MP_FP8_MXFP8;
  Build(&mx, o);
  EXPECT_EQ(CastsOf(mx.s, MP_PHASE_BACKWARD).n, 28);
  EXPECT_EQ(Count(CastsOf(mx.s, MP_PHASE_FORWARD).bytes, (3.0 + 1.0 / 32) * H * H), 2);
}

TEST(Schedule, Float8TensorwiseAmaxIsReducedOverTheSequenceShards) {
  // A tensorwise scale is the whole tensor's, so a cast of a TP-sharded tensor needs the
  // amax all-reduced over tp first: one 4-byte all-reduce (torchao's float8 TP on DTensors,
  // torchao/float8/float8_tensor_parallel.py and float8_utils.py tensor_to_amax). llama,
  // tp=2, float8, one block:
  //   forward, SP: the attention's and the MLP's sequence-sharded inputs (counted under q
  //     and up), the 7 weights (Shard(0) colwise, Shard(1) rowwise; cast once, kept float8
  //     for the backward), the rowwise inputs of o and down (Shard(-1)): 2 + 7 + 2 = 11,
  //     by module q 2, k 1, v 1, o 2, gate 1, up 2, down 2;
  //   backward, SP: the output gradients of q, k, v, gate and up (colwise, Shard(-1)) and
  //     of o and down (Shard(1), the sequence shard before the gather): 7, one a Linear;
  //   without SP the inputs are replicated going in (no reduce) and o's and down's output
  //     gradients too (their outputs all-reduced, Replicate): 9 forward, 5 backward;
  //   tp=1: no DTensor, none.
  struct Case {
    const char *mesh;
    int sp, fwd, bwd;
  };
  const int by_module[] = {MP_MOD_Q, 2, MP_MOD_K, 1, MP_MOD_V, 1, MP_MOD_O, 2, MP_MOD_GATE, 1, MP_MOD_UP, 2,
                           MP_MOD_DOWN, 2};
  for (const Case &c : {Case{"tp=2", 1, 11, 7}, Case{"tp=2", 0, 9, 5}, Case{"dp_shard=2", -1, 0, 0}}) {
    Built b;
    Opts o;
    o.mesh = c.mesh;
    o.sp = c.sp;
    o.fp8 = 1;
    Build(&b, o);
    int fwd = 0, bwd = 0, fwd_of[MP_MOD_COUNT] = {0};
    for (const Inst &x : Expand(b.s)) {
      if (x.layer != 5 || x.op->type != MP_OP_COMM || x.op->group != MP_GROUP_TP || x.op->bytes != 4.0) continue;
      EXPECT_EQ(x.op->coll, MP_COLL_ALL_REDUCE);
      fwd += x.op->phase == MP_PHASE_FORWARD;
      bwd += x.op->phase == MP_PHASE_BACKWARD;
      if (x.op->phase == MP_PHASE_FORWARD && x.op->module >= 0) fwd_of[x.op->module]++;
    }
    EXPECT_EQ(fwd, c.fwd) << c.mesh << " sp " << c.sp;
    EXPECT_EQ(bwd, c.bwd) << c.mesh << " sp " << c.sp;
    if (c.sp != 1) continue;
    for (size_t i = 0; i < sizeof by_module / sizeof *by_module; i += 2) {
      EXPECT_EQ(fwd_of[by_module[i]], by_module[i + 1]) << "module " << by_module[i];
    }
  }
}
