// One float8 Linear as the torchtitan-compile profile prices it, against torchao's own
// microbenchmark of the same Linear: benchmarks/float8/bench_linear_float8.py (pytorch/ao
// 81e48a33f), run on an H100 and published by torchao's authors in May 2025: forward, a
// .sum() and backward of one nn.Linear(K, N) and its Float8Linear copy with per-row scales,
// compiled, at Llama 70B's TP 8 shapes with M = 4 x 4096 tokens:
//   attn.w0 (16384, 1024, 8192): bf16 1.701 ms, float8 1.193 ms, 1.426x
//   ffn.w2  (16384, 3584, 8192): bf16 5.192 ms, float8 3.034 ms, 1.711x
// Llama 3.1 70B under tp=8 (no FSDP, no AC, micro-batch 2 of 8192 tokens, the rowwise
// recipe, which torchtitan runs without float8 TP) gives o and down exactly these shapes: o
// reads the rank's attention output [16384, 1024] and writes [16384, 8192] before its
// reduce-scatter; down reads the rank's SwiGLU output [16384, 3584]. The test sums layer 5's
// GEMM and cast kernels of each Linear (the collectives and the sequence-parallel copies are
// TP's, which the microbenchmark has not) and derives every one by hand.
#include <gtest/gtest.h>

#include <cstring>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "sim/cluster.h"
#include "sim/sim.h"
#include "sim/stack.h"

namespace {

// torchtitan-compile's kernel constants (data/stacks/torchtitan-compile.json) on the H100
// SXM (data/gpus/h100-sxm.json), whose kernel_eff figures are the fit GPU's, so the
// efficiencies carry over unscaled.
constexpr double kBf16Peak = 989.4e12, kFp8Peak = 1978.9e12, kHbm = 3350e9 * 0.85;
constexpr double kGemmEff = 0.50, kFp8Eff = 0.47, kHalfMnk = 2e9, kLaunch = 2e-6;

// A GEMM [m x k] x [k x n]: max(FLOPs / (peak x eff x size / (size + half_mnk)), bytes / HBM)
// + a launch, bytes (mk + kn) x operand bytes + 2 mn (bf16 output).
double Gemm(double m, double n, double k, bool fp8) {
  const double size = m * n * k, eff = (fp8 ? kFp8Eff : kGemmEff) * size / (size + kHalfMnk);
  const double t_flops = 2 * m * n * k / ((fp8 ? kFp8Peak : kBf16Peak) * eff);
  const double t_bytes = ((m * k + k * n) * (fp8 ? 1 : 2) + 2 * m * n) / kHbm;
  return (t_flops > t_bytes ? t_flops : t_bytes) + kLaunch;
}

// A memory-bound kernel moving `bytes`.
double Mem(double bytes) { return bytes / kHbm + kLaunch; }

// Forward, input gradient and weight gradient GEMMs of Linear (M, K, N).
double Bf16Linear(double M, double K, double N) {
  return Gemm(M, N, K, false) + Gemm(M, K, N, false) + Gemm(N, K, M, false);
}

// The rowwise recipe (exec/schedule_ops.c): forward casts the weight and the input (amax 2 +
// read 2 + write 1 = 5 bytes an element); backward casts the output gradient twice (scaled
// along each dim), the weight and the input along their other dim (5 each), and multiplies
// the input gradient's and weight gradient's bf16 outputs by their scales (4 bytes an element).
double RowwiseLinear(double M, double K, double N) {
  const double x = M * K, w = K * N, dy = M * N;
  return Gemm(M, N, K, true) + Gemm(M, K, N, true) + Gemm(N, K, M, true) + Mem(5 * w) +
         Mem(5 * x) + 2 * Mem(5 * dy) + Mem(5 * w) + Mem(5 * x) + Mem(4 * x) + Mem(4 * w);
}

struct Priced {
  double o = 0, down = 0;
};

// Layer 5's GEMM and float8 cast kernels of o and down, each at its simulated time.
void Price(int fp8, Priced *out) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_gpu g;
  mp_stack_profile p;
  mp_mesh mesh;
  ASSERT_EQ(mp_model_load(&ctx, "llama3.1-70b", &m), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &g), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_stack_load(&ctx, "torchtitan-compile", &p), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_mesh_parse(&ctx, "tp=8", 8, &mesh), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options o;
  mp_plan_options_init(&o);
  mp_stack_plan_options(&p, &g, &o);
  o.seq = 8192;
  o.micro_batch = 2;
  o.global_batch = 2;
  o.ac = MP_AC_NONE;
  o.fp8 = fp8;
  o.fp8_opts.recipe = MP_FP8_ROWWISE;
  mp_plan *plan = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &plan), MP_OK) << mp_errmsg(&ctx);
  mp_arena *arena = mp_arena_create();
  mp_schedule *s = nullptr;
  ASSERT_EQ(mp_schedule_build(&ctx, plan, 0, MP_SCHEDULE_EXPANDED, arena, &s), MP_OK) << mp_errmsg(&ctx);
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    const mp_op *op = it.op;
    if (it.layer != 5 || op->type != MP_OP_COMPUTE) continue;
    if (op->kernel != MP_KERNEL_GEMM && op->kernel != MP_KERNEL_FP8_CAST) continue;
    const double t = mp_sim_compute_op_in_plan_s(op, &g, &p, plan) * (op->count > 1 ? op->count : 1);
    if (op->module == MP_MOD_O) out->o += t;
    if (op->module == MP_MOD_DOWN) out->down += t;
  }
  mp_arena_destroy(arena);
  mp_plan_destroy(plan);
}

}  // namespace

TEST(Fp8LinearBench, RowwiseLinearPricedAsDerived) {
  Priced bf, f8;
  Price(0, &bf);
  Price(1, &f8);
  // o (16384, 1024, 8192): bf16 3 x (2.749e11 FLOPs / (989.4e12 x 0.4928) + 2 us) = 1.697 ms;
  // float8 GEMMs 3 x (2.749e11 / (1978.9e12 x 0.4632) + 2 us) = 0.906 ms, casts and rescales
  // (5 w, 5 x, 2 x 5 dy, 5 w, 5 x, 4 x, 4 w bytes at 2847.5 GB/s, 2 us each) 0.611 ms: 1.517 ms
  EXPECT_NEAR(bf.o, Bf16Linear(16384, 1024, 8192), 1e-9);
  EXPECT_NEAR(f8.o, RowwiseLinear(16384, 1024, 8192), 1e-9);
  EXPECT_NEAR(bf.down, Bf16Linear(16384, 3584, 8192), 1e-9);
  EXPECT_NEAR(f8.down, RowwiseLinear(16384, 3584, 8192), 1e-9);
}

TEST(Fp8LinearBench, GainNotAboveTorchaosMicrobenchmark) {
  // The priced gains, 1.119x (o) and 1.451x (down), sit below the published 1.426x and 1.711x:
  // at these shapes the profile does not over-state float8's per-Linear gain.
  Priced bf, f8;
  Price(0, &bf);
  Price(1, &f8);
  EXPECT_NEAR(bf.o / f8.o, 1.119, 0.005);
  EXPECT_NEAR(bf.down / f8.down, 1.451, 0.005);
  EXPECT_LT(bf.o / f8.o, 1.701 / 1.193);
  EXPECT_LT(bf.down / f8.down, 5.192 / 3.034);
}
