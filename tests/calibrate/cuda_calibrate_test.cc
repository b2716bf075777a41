// The CUDA calibration without a GPU (calib/calibrate.h "CUDA", sim/gemm_table.h): the
// fits recover the parameters of synthetic measurements made from known curves, the
// by-shape correction, the database round trip of a cuda calibration, its application to
// the meshplan-cuda stack (and the refusals), the simulator's op times with a calibrated
// stack against hand arithmetic, the GPU-profile matching, and the refusal without a
// device. Every "measurement" here is made from a formula, so each expectation is exact
// up to rounding.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "exec/plan.h"
#include "kernels/cuda/cuda.h"
#include "calib/store.h"
#include "calib/calibrate.h"
#include "planner/store.h"
#include "sim/gemm_table.h"
#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/tmp_path.h"

namespace {

// The h100-sxm datasheet (data/gpus/h100-sxm.json).
const double kPeak = 989.4e12, kPeak8 = 1978.9e12, kHbm = 3350.0;

// Known "hardware": the curve E x / (x + h) plus a launch cost per call.
struct Truth {
  double E = 0.78, h = 1.9e9, ovh = 3e-6;
  double att = 0.5, hbm = 0.8, E8 = 0.6;
};

double gemm_time(const Truth &tr, int pass, int N, int K, int M, double peak, double E) {
  const double flops = mp_calib_gemm_flops(pass, N, K, M), x = (double)N * K * M;
  return flops / (peak * E * x / (x + tr.h)) + tr.ovh;
}

// A cuda calibration whose every figure comes from `tr`, at the default shapes.
mp_calib synthetic(const Truth &tr) {
  mp_calib c;
  memset(&c, 0, sizeof c);
  snprintf(c.created_at, sizeof c.created_at, "2026-11-02T10:00:00Z");
  snprintf(c.device, sizeof c.device, "cuda");
  snprintf(c.host, sizeof c.host, "gpuhost");
  c.threads = 1;
  c.world = 1;
  snprintf(c.gpu_name, sizeof c.gpu_name, "NVIDIA H100 80GB HBM3");
  snprintf(c.gpu_profile, sizeof c.gpu_profile, "h100-sxm");
  c.compute_capability = 90;
  c.ref_bf16_tflops = kPeak * 1e-12;
  c.ref_fp8_tflops = kPeak8 * 1e-12;
  c.ref_hbm_GBps = kHbm;
  c.launch_s = tr.ovh;
  mp_calib_options o;
  mp_calib_options_init_cuda(&o, 0);
  c.n_gemm = o.n_gemm;
  for (int i = 0; i < o.n_gemm; i++) {
    mp_calib_gemm &g = c.gemm[i];
    g.pass = o.gemm[i].pass;
    g.N = o.gemm[i].N;
    g.K = o.gemm[i].K;
    g.M = o.gemm[i].M;
    g.flops_per_s = mp_calib_gemm_flops(g.pass, g.N, g.K, g.M) / gemm_time(tr, g.pass, g.N, g.K, g.M, kPeak, tr.E);
  }
  for (int i = 0; i < o.n_attn; i++)
    for (int b = 0; b < 2; b++) {
      mp_calib_attn &a = c.attn[c.n_attn++];
      a.backward = b;
      a.B = o.attn[i].B;
      a.T = o.attn[i].T;
      a.nh = o.attn[i].nh;
      a.nkv = o.attn[i].nkv;
      a.hd = o.attn[i].hd;
      const double f = mp_calib_attn_flops(b, a.B, a.T, a.nh, a.hd);
      a.flops_per_s = f / (f / (kPeak * tr.att) + tr.ovh);
    }
  const double elems[MP_CALIB_BW_CUDA_COUNT] = {8192.0 * 4096, 8192.0 * 4096, 8192.0 * 14336, 8192.0 * 14336,
                                           67108864.0};
  for (int k = 0; k < MP_CALIB_BW_CUDA_COUNT; k++) {
    mp_calib_bw &b = c.bw[c.n_bw++];
    b.kernel = k;
    b.elems = elems[k];
    const double by = mp_calib_bw_bytes(k, b.elems);
    b.GBps = by / (by / (kHbm * 1e9 * tr.hbm) + tr.ovh) * 1e-9;
  }
  c.copy_GBps = 0.9 * kHbm;
  for (int i = 0; i < o.n_f8; i++) {
    mp_calib_gemm &g = c.f8[c.n_f8++];
    g.pass = o.f8[i].pass;
    g.N = o.f8[i].N;
    g.K = o.f8[i].K;
    g.M = o.f8[i].M;
    g.flops_per_s = mp_calib_gemm_flops(g.pass, g.N, g.K, g.M) / gemm_time(tr, g.pass, g.N, g.K, g.M, kPeak8, tr.E8);
  }
  return c;
}

// ---- the fits ---------------------------------------------------------------------------

TEST(CudaFit, CurveRecoversKnownParameters) {
  const Truth tr;
  mp_calib c = synthetic(tr);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  double E = 0, h = 0, rms = 1;
  ASSERT_EQ(mp_calib_fit_gemm_curve(&ctx, c.gemm, c.n_gemm, kPeak, tr.ovh, &E, &h, &rms), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(E, tr.E, 1e-9 * tr.E);
  EXPECT_NEAR(h, tr.h, 1e-6 * tr.h);
  EXPECT_LT(rms, 1e-9);
}

TEST(CudaFit, LaunchCostIsIndistinguishableFromTheKnee) {
  // The curve's time is flops / (peak E) + 2 h / (peak E): a constant per GEMM, as the
  // launch cost is. Fitted as if there were no launch cost, the same points fit exactly
  // with h' = h + ovh peak E / 2 = 1.9e9 + 3e-6 x 989.4e12 x 0.78 / 2 = 3.0576e9. That is
  // why the fit removes the launch figure first: the simulator adds it to every op.
  const Truth tr;
  mp_calib c = synthetic(tr);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  double E = 0, h = 0, rms = 1;
  ASSERT_EQ(mp_calib_fit_gemm_curve(&ctx, c.gemm, c.n_gemm, kPeak, 0.0, &E, &h, &rms), MP_OK);
  EXPECT_NEAR(E, tr.E, 1e-9);
  EXPECT_NEAR(h, tr.h + tr.ovh * kPeak * tr.E / 2, 1e-6 * h);
  EXPECT_NEAR(h, 3.0576e9, 0.0001e9);
  EXPECT_LT(rms, 1e-9);
}

TEST(CudaFit, CurveAboveTheDatasheetClampsToOne) {
  // Every GEMM at 1.2 x the datasheet (h = 0): the line gives E = 1.2; the datasheet is
  // the ceiling, so E = 1, and h refitted alone would be negative, so 0.
  mp_calib_gemm g[3] = {{MP_CALIB_GEMM_FWD, 1024, 1024, 1024, 1.2 * kPeak},
                        {MP_CALIB_GEMM_FWD, 4096, 4096, 4096, 1.2 * kPeak},
                        {MP_CALIB_GEMM_WGRAD, 8192, 4096, 14336, 1.2 * kPeak}};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  double E = 0, h = 1, rms = 0;
  ASSERT_EQ(mp_calib_fit_gemm_curve(&ctx, g, 3, kPeak, 0.0, &E, &h, &rms), MP_OK);
  EXPECT_EQ(E, 1.0);
  EXPECT_EQ(h, 0.0);
  // every point predicted 1.2 x slower than measured: relative error 0.2
  EXPECT_NEAR(rms, 0.2, 1e-12);
}

TEST(CudaFit, NoKneeFitsThroughTheOrigin) {
  // Small GEMMs faster than large ones (h < 0 would fit): clamped to h = 0 and E the
  // relative-error least squares of a constant: E = sum(e^2) / sum(e) for e = {0.5, 0.7}:
  // argmin_a sum (a e_i - 1)^2 = sum e / sum e^2 = 1.2 / 0.74, E = 1 / a = 0.74 / 1.2.
  mp_calib_gemm g[2] = {{MP_CALIB_GEMM_FWD, 512, 512, 512, 0.7 * kPeak},
                        {MP_CALIB_GEMM_FWD, 8192, 8192, 8192, 0.5 * kPeak}};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  double E = 0, h = 1;
  ASSERT_EQ(mp_calib_fit_gemm_curve(&ctx, g, 2, kPeak, 0.0, &E, &h, nullptr), MP_OK);
  EXPECT_EQ(h, 0.0);
  EXPECT_NEAR(E, 0.74 / 1.2, 1e-12);
}

TEST(CudaFit, RejectsNoPointsAndBadRates) {
  mp_calib_gemm g[1] = {{MP_CALIB_GEMM_FWD, 512, 512, 512, 0.0}};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  double E, h;
  EXPECT_EQ(mp_calib_fit_gemm_curve(&ctx, g, 0, kPeak, 0.0, &E, &h, nullptr), MP_ERR_INVALID);
  EXPECT_EQ(mp_calib_fit_gemm_curve(&ctx, g, 1, kPeak, 0.0, &E, &h, nullptr), MP_ERR_INVALID);
  mp_calib c;
  memset(&c, 0, sizeof c);
  snprintf(c.device, sizeof c.device, "cuda");
  EXPECT_EQ(mp_calib_fit_stack(&ctx, &c), MP_ERR_INVALID);  // no reference peak
  c.ref_bf16_tflops = 989.4;
  EXPECT_EQ(mp_calib_fit_stack(&ctx, &c), MP_ERR_INVALID);  // no GEMM point
}

TEST(CudaFit, StackRecoversEveryFigure) {
  const Truth tr;
  mp_calib c = synthetic(tr);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK) << mp_errmsg(&ctx);
  const mp_calib_stack_fit &f = c.fit;
  EXPECT_NEAR(f.gemm_eff_max, tr.E, 1e-9);
  EXPECT_NEAR(f.gemm_eff_half_mnk, tr.h, 1e-6 * tr.h);
  EXPECT_NEAR(f.kernel_overhead_us, 3.0, 1e-12);
  EXPECT_NEAR(f.attention_eff, tr.att, 1e-9);
  EXPECT_NEAR(f.hbm_eff, tr.hbm, 1e-9);
  EXPECT_NEAR(f.fp8_gemm_eff_max, tr.E8, 1e-9);
  // The curve explains every point: the by-shape correction is no better, so unused.
  EXPECT_LT(f.gemm_curve_rms, 1e-9);
  EXPECT_LT(f.gemm_table_rms, 1e-9);
  EXPECT_EQ(f.gemm_table, 0);
}

TEST(CudaFit, UnmeasuredFiguresStayZero) {
  const Truth tr;
  mp_calib c = synthetic(tr);
  c.n_attn = 0;
  c.n_f8 = 0;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  EXPECT_EQ(c.fit.attention_eff, 0.0);
  EXPECT_EQ(c.fit.fp8_gemm_eff_max, 0.0);
  EXPECT_GT(c.fit.hbm_eff, 0.0);
}

// ---- GEMM efficiency by shape ---------------------------------------------------------

TEST(GemmTable, FactorFadesWithDistance) {
  // One point: forward (m, n, k) = (2048, 4096, 4096) at 0.8 x the curve.
  mp_gemm_table t;
  memset(&t, 0, sizeof t);
  t.n = 1;
  t.pt[0].variant = MP_VAR_FWD;
  t.pt[0].lm = 11;
  t.pt[0].ln = 12;
  t.pt[0].lk = 12;
  t.pt[0].log2_ratio = log2(0.8);
  EXPECT_NEAR(mp_gemm_table_factor(&t, MP_VAR_FWD, 2048, 4096, 4096), 0.8, 1e-12);
  // m x 2 (a tp=2 shard): one binary order of the two the correction reaches: 0.8^0.5
  EXPECT_NEAR(mp_gemm_table_factor(&t, MP_VAR_FWD, 4096, 4096, 4096), std::sqrt(0.8), 1e-12);
  EXPECT_NEAR(mp_gemm_table_factor(&t, MP_VAR_FWD, 2048, 2048, 4096), std::sqrt(0.8), 1e-12);
  // the largest distance counts: n x 2^0.5 and k x 2^1.5 -> 0.8^(1 - 1.5 / 2)
  EXPECT_NEAR(mp_gemm_table_factor(&t, MP_VAR_FWD, 2048, 4096 * std::sqrt(2.0), 4096 * std::pow(2.0, 1.5)),
              std::pow(0.8, 0.25), 1e-12);
  EXPECT_EQ(mp_gemm_table_factor(&t, MP_VAR_FWD, 8192, 4096, 4096), 1.0);   // four times as large
  EXPECT_EQ(mp_gemm_table_factor(&t, MP_VAR_WGRAD, 2048, 4096, 4096), 1.0);  // another pass
  // two points: the one with the smaller largest distance wins
  t.n = 2;
  t.pt[1] = t.pt[0];
  t.pt[1].lm = 13;  // m = 8192
  t.pt[1].log2_ratio = log2(0.5);
  EXPECT_NEAR(mp_gemm_table_factor(&t, MP_VAR_FWD, 8192, 4096, 4096), 0.5, 1e-12);
  EXPECT_NEAR(mp_gemm_table_factor(&t, MP_VAR_FWD, 2048 * std::pow(2.0, 0.5), 4096, 4096), std::pow(0.8, 0.75),
              1e-12);
  EXPECT_EQ(mp_gemm_table_factor(nullptr, MP_VAR_FWD, 2048, 4096, 4096), 1.0);
}

// The bf16 weight-gradient points of c at 0.7 x the curve's compute time rate (a real
// library's wgrad reduces over tokens): what the curve cannot say and the table can.
void slow_wgrad(mp_calib &c, const Truth &tr) {
  for (int i = 0; i < c.n_gemm; i++) {
    mp_calib_gemm &g = c.gemm[i];
    if (g.pass != MP_CALIB_GEMM_WGRAD) continue;
    const double tc = gemm_time(tr, g.pass, g.N, g.K, g.M, kPeak, tr.E) - tr.ovh;
    g.flops_per_s = mp_calib_gemm_flops(g.pass, g.N, g.K, g.M) / (tc / 0.7 + tr.ovh);
  }
}

TEST(GemmTable, UsedWhenItPredictsHeldOutShapesBetter) {
  // The "hardware" runs every weight-gradient GEMM at 0.7 x the curve (a real library's
  // wgrad reduces over tokens): the curve cannot say so, neighbours can.
  Truth tr;
  mp_calib c = synthetic(tr);
  slow_wgrad(c, tr);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  EXPECT_GT(c.fit.gemm_curve_rms, 0.05);
  EXPECT_LT(c.fit.gemm_table_rms, c.fit.gemm_curve_rms);
  EXPECT_EQ(c.fit.gemm_table, 1);

  // Applied: the simulator reproduces a measured GEMM exactly. The wgrad point N 2048,
  // K 4096, M 14336 is, in the schedule's terms, [m=14336, k=2048] x [k, n=4096].
  mp_stack_profile st;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &st), MP_OK);
  mp_calib_tables tables;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &c, &st, &tables), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(st.gemm_table, &tables.bf16);
  EXPECT_EQ(st.fp8_gemm_table, nullptr);  // every float8 point on its curve
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &g), MP_OK);
  int found = 0;
  for (int i = 0; i < c.n_gemm; i++) {
    const mp_calib_gemm &p = c.gemm[i];
    if (!(p.pass == MP_CALIB_GEMM_WGRAD && p.N == 2048 && p.K == 4096 && p.M == 14336)) continue;
    found = 1;
    mp_op op;
    memset(&op, 0, sizeof op);
    op.type = MP_OP_COMPUTE;
    op.kernel = MP_KERNEL_GEMM;
    op.variant = MP_VAR_WGRAD;
    op.dtype = MP_DTYPE_BF16;
    op.m = 14336;
    op.n = 4096;
    op.k = 2048;
    op.batch = 1;
    op.flops = mp_calib_gemm_flops(p.pass, p.N, p.K, p.M);
    op.bytes = 0;
    const double measured = op.flops / p.flops_per_s;
    EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), measured, 1e-9 * measured);
  }
  EXPECT_TRUE(found);
}

// ---- float8 GEMMs by pass and shape ------------------------------------------------------

// Float8 "hardware": each pass at its own efficiency of the fp8 peak, with a knee of its
// own (a real float8 forward uses fast accumulation, wgrad an fp32 output: one number
// cannot say both). The bf16 GEMMs stay those of Truth.
struct F8Truth {
  double E[MP_CALIB_GEMM_PASS_COUNT] = {0.70, 0.0, 0.55, 0.50};  // fwd, (bwd), dgrad, wgrad
  double h = 2.5e9;
};

double f8_time(const Truth &tr, const F8Truth &f8, int pass, int N, int K, int M) {
  const double flops = mp_calib_gemm_flops(pass, N, K, M), x = (double)N * K * M;
  return flops / (kPeak8 * f8.E[pass] * x / (x + f8.h)) + tr.ovh;
}

// c's float8 points (the default shapes and passes) measured on f8.
void set_f8(mp_calib &c, const Truth &tr, const F8Truth &f8) {
  for (int i = 0; i < c.n_f8; i++) {
    mp_calib_gemm &g = c.f8[i];
    g.flops_per_s = mp_calib_gemm_flops(g.pass, g.N, g.K, g.M) / f8_time(tr, f8, g.pass, g.N, g.K, g.M);
  }
}

// The schedule's op for pass at the Linear N x K x M (exec/schedule_ops.c linear_fwd and
// linear_bwd: forward [N, K] x [K, M], dgrad [N, M] x [M, K], wgrad [M, N] x [N, K]), in
// dtype dt, with no bytes (compute-bound).
mp_op linear_op(int pass, int N, int K, int M, mp_dtype dt) {
  mp_op op;
  memset(&op, 0, sizeof op);
  op.type = MP_OP_COMPUTE;
  op.kernel = MP_KERNEL_GEMM;
  op.dtype = dt;
  op.batch = 1;
  op.flops = mp_calib_gemm_flops(pass, N, K, M);
  if (pass == MP_CALIB_GEMM_DGRAD)
    op.variant = MP_VAR_DGRAD, op.m = N, op.n = K, op.k = M;
  else if (pass == MP_CALIB_GEMM_WGRAD)
    op.variant = MP_VAR_WGRAD, op.m = M, op.n = K, op.k = N;
  else
    op.variant = MP_VAR_FWD, op.m = N, op.n = M, op.k = K;
  return op;
}

// The schedule's dtype of a float8 GEMM: E4M3 forward, E5M2 backward (exec/schedule_ops.c).
mp_dtype f8_dtype(int pass) { return pass == MP_CALIB_GEMM_FWD ? MP_DTYPE_FP8_E4M3 : MP_DTYPE_FP8_E5M2; }

TEST(Float8ByPass, DefaultsMeasureEveryBf16ShapeAndPass) {
  for (int quick = 0; quick < 2; quick++) {
    mp_calib_options o;
    mp_calib_options_init_cuda(&o, quick);
    ASSERT_EQ(o.n_f8, o.n_gemm) << quick;
    int per_pass[MP_CALIB_GEMM_PASS_COUNT] = {0};
    for (int i = 0; i < o.n_f8; i++) {
      EXPECT_EQ(o.f8[i].pass, o.gemm[i].pass);
      EXPECT_EQ(o.f8[i].N, o.gemm[i].N);
      EXPECT_EQ(o.f8[i].K, o.gemm[i].K);
      EXPECT_EQ(o.f8[i].M, o.gemm[i].M);
      EXPECT_EQ(o.f8[i].N % 16 + o.f8[i].K % 16 + o.f8[i].M % 16, 0) << i;  // matmul_f8's rule
      per_pass[o.f8[i].pass]++;
    }
    EXPECT_EQ(per_pass[MP_CALIB_GEMM_FWD], quick ? 3 : 27);
    EXPECT_EQ(per_pass[MP_CALIB_GEMM_DGRAD], quick ? 3 : 27);
    EXPECT_EQ(per_pass[MP_CALIB_GEMM_WGRAD], quick ? 3 : 27);
    EXPECT_EQ(per_pass[MP_CALIB_GEMM_BWD], 0);
  }
}

TEST(Float8ByPass, OperandFillIsFiniteInBothFormats) {
  // calib/measure_cuda.c fills every float8 operand with random bytes & 0xBF (bit 6,
  // the exponent's top bit in E4M3 and in E5M2, cleared): read as either format, every
  // such code is finite and below 2 in magnitude, so the E5M2 dy operands of dgrad and
  // wgrad never hold inf or NaN, as the E4M3 ones never hold NaN.
  for (int b = 0; b < 256; b++) {
    const uint8_t code = (uint8_t)(b & 0xBF);
    for (mp_f8_format fmt : {MP_F8_E4M3, MP_F8_E5M2}) {
      const float v = mp_f8_decode(code, fmt);
      EXPECT_TRUE(std::isfinite(v)) << b << " " << fmt;
      EXPECT_LT(std::fabs(v), 2.0f) << b << " " << fmt;
    }
  }
  // and the bit matters: with it set, both formats reach their specials
  EXPECT_TRUE(std::isnan(mp_f8_decode(0x7F, MP_F8_E4M3)));
  EXPECT_TRUE(std::isinf(mp_f8_decode(0x7C, MP_F8_E5M2)));
}

TEST(Float8ByPass, FitReproducesEveryMeasuredPoint) {
  // Forward, dgrad and wgrad float8 GEMMs at 0.70, 0.55 and 0.50 of the fp8 peak: one
  // fp8_gemm_eff_max lies between them and misses each pass; the float8 by-shape table
  // predicts held-out shapes better, so the simulator uses it, and then reproduces every
  // measured float8 point from its op as the schedule makes it.
  const Truth tr;
  const F8Truth f8;
  mp_calib c = synthetic(tr);
  set_f8(c, tr, f8);
  c.id = 7;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK) << mp_errmsg(&ctx);
  const mp_calib_stack_fit &f = c.fit;
  EXPECT_GT(f.fp8_gemm_eff_max, 0.45);
  EXPECT_LT(f.fp8_gemm_eff_max, 0.75);
  EXPECT_GT(f.fp8_gemm_curve_rms, 0.05);
  EXPECT_LT(f.fp8_gemm_table_rms, 0.9 * f.fp8_gemm_curve_rms);
  EXPECT_EQ(f.fp8_gemm_table, 1);
  EXPECT_EQ(f.gemm_table, 0);  // the bf16 points lie on their curve
  char line[768];
  mp_calib_summary(&c, line, sizeof line);
  EXPECT_NE(strstr(line, "fp8_gemm_eff_max 0."), nullptr) << line;
  EXPECT_NE(strstr(line, " (+ by shape), kernel_overhead"), nullptr) << line;

  mp_stack_profile st;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &st), MP_OK);
  mp_stack_profile curve_only = st;
  mp_calib_tables tables;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &c, &st, &tables), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(st.gemm_table, nullptr);
  ASSERT_EQ(st.fp8_gemm_table, &tables.fp8);
  EXPECT_EQ(tables.fp8.n, c.n_f8);
  EXPECT_NE(strstr(st.source, "float8 GEMM curve with the by-shape correction"), nullptr) << st.source;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &c, &curve_only, nullptr), MP_OK);
  EXPECT_EQ(curve_only.fp8_gemm_table, nullptr);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &g), MP_OK);
  ASSERT_EQ(g.peak_tflops[MP_DTYPE_FP8_E5M2], g.peak_tflops[MP_DTYPE_FP8_E4M3]);
  double worst_curve = 0;
  for (int i = 0; i < c.n_f8; i++) {
    const mp_calib_gemm &p = c.f8[i];
    const mp_op op = linear_op(p.pass, p.N, p.K, p.M, f8_dtype(p.pass));
    const double measured = op.flops / p.flops_per_s;
    EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), measured, 1e-9 * measured)
        << mp_calib_gemm_pass_name(p.pass) << " " << p.N << "x" << p.K << "x" << p.M;
    const double e = std::fabs(mp_sim_compute_op_s(&op, &g, &curve_only) - measured) / measured;
    if (e > worst_curve) worst_curve = e;
  }
  EXPECT_GT(worst_curve, 0.1);  // the curve alone misses some pass by more than 10 %

  // The passes keep their order at a shape the calibration did not measure (tp=2 shards
  // of the 8B model's MLP: every dimension within 4x of a measured one): forward fastest.
  const mp_op fwd = linear_op(MP_CALIB_GEMM_FWD, 4096, 4096, 7168, MP_DTYPE_FP8_E4M3);
  const mp_op wgrad = linear_op(MP_CALIB_GEMM_WGRAD, 4096, 4096, 7168, MP_DTYPE_FP8_E5M2);
  EXPECT_LT(mp_sim_compute_op_s(&fwd, &g, &st), 0.9 * mp_sim_compute_op_s(&wgrad, &g, &st));
}

TEST(Float8ByPass, Bf16PredictionsUnchangedByFloat8Points) {
  // The same bf16 points (weight gradients at 0.7 x the curve, so the bf16 table is in
  // use) with and without float8 points: the bf16 fit, its table and every bf16 op time
  // are the same to the bit; and the bf16 table never reaches a float8 op.
  Truth tr;
  mp_calib with = synthetic(tr);
  slow_wgrad(with, tr);
  set_f8(with, tr, F8Truth());
  mp_calib without = with;
  without.n_f8 = 0;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &with), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &without), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(with.fit.gemm_eff_max, without.fit.gemm_eff_max);
  EXPECT_EQ(with.fit.gemm_eff_half_mnk, without.fit.gemm_eff_half_mnk);
  EXPECT_EQ(with.fit.gemm_curve_rms, without.fit.gemm_curve_rms);
  EXPECT_EQ(with.fit.gemm_table_rms, without.fit.gemm_table_rms);
  EXPECT_EQ(with.fit.gemm_table, 1);
  EXPECT_EQ(without.fit.gemm_table, 1);
  EXPECT_EQ(with.fit.fp8_gemm_table, 1);
  EXPECT_EQ(without.fit.fp8_gemm_eff_max, 0.0);  // not measured: the stack's stays
  EXPECT_EQ(without.fit.fp8_gemm_table, 0);

  mp_stack_profile a, b;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &a), MP_OK);
  b = a;
  mp_calib_tables ta, tb;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &with, &a, &ta), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &without, &b, &tb), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(a.gemm_table, &ta.bf16);
  ASSERT_EQ(b.gemm_table, &tb.bf16);
  EXPECT_EQ(a.fp8_gemm_table, &ta.fp8);
  EXPECT_EQ(b.fp8_gemm_table, nullptr);
  ASSERT_EQ(ta.bf16.n, tb.bf16.n);
  EXPECT_EQ(memcmp(ta.bf16.pt, tb.bf16.pt, sizeof ta.bf16.pt[0] * ta.bf16.n), 0);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &g), MP_OK);
  for (int i = 0; i < with.n_gemm; i++) {
    const mp_calib_gemm &p = with.gemm[i];
    const mp_op op = linear_op(p.pass, p.N, p.K, p.M, MP_DTYPE_BF16);
    EXPECT_EQ(mp_sim_compute_op_s(&op, &g, &a), mp_sim_compute_op_s(&op, &g, &b)) << i;
    const double measured = op.flops / p.flops_per_s;
    EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &a), measured, 1e-9 * measured) << i;
  }
  for (int pass : {MP_CALIB_GEMM_FWD, MP_CALIB_GEMM_DGRAD, MP_CALIB_GEMM_WGRAD}) {  // unmeasured shapes
    const mp_op op = linear_op(pass, 4096, 4096, 11008, MP_DTYPE_BF16);
    EXPECT_EQ(mp_sim_compute_op_s(&op, &g, &a), mp_sim_compute_op_s(&op, &g, &b)) << pass;
  }
  // a float8 op takes the float8 table alone: without it, the float8 curve (the bf16
  // table, 0.7 on this very wgrad shape, stays out)
  mp_stack_profile a_no8 = a;
  a_no8.fp8_gemm_table = nullptr;
  const mp_op op8 = linear_op(MP_CALIB_GEMM_WGRAD, 2048, 4096, 14336, MP_DTYPE_FP8_E5M2);
  const double x = 2048.0 * 4096 * 14336;
  EXPECT_NEAR(mp_sim_compute_op_s(&op8, &g, &a_no8),
              op8.flops / (kPeak8 * a.fp8_gemm_eff_max * x / (x + a.gemm_eff_half_mnk)) + tr.ovh, 1e-15);
}

TEST(Float8ByPass, PlanUsesTheFloat8TableForFloat8PlansOnly) {
  // A 1-GPU step of the 1B bench model through the simulator, with the calibrated stack
  // and with the same stack less its float8 table: a float8 plan's compute time changes
  // (its Linears are float8 GEMMs of every pass), a bf16 plan's does not (to the bit).
  const Truth tr;
  mp_calib c = synthetic(tr);
  set_f8(c, tr, F8Truth());
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  mp_stack_profile st;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &st), MP_OK);
  mp_calib_tables tables;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &c, &st, &tables), MP_OK) << mp_errmsg(&ctx);
  ASSERT_NE(st.fp8_gemm_table, nullptr);
  mp_stack_profile no8 = st;
  no8.fp8_gemm_table = nullptr;
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "llama-1b-bench", &m), MP_OK) << mp_errmsg(&ctx);
  mp_cluster cl;
  ASSERT_EQ(mp_cluster_make(&ctx, "h100-sxm", 1, 1, &cl), MP_OK) << mp_errmsg(&ctx);
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  for (int fp8 = 0; fp8 < 2; fp8++) {
    mp_plan_options o;
    mp_plan_options_init(&o);
    o.seq = 2048;
    o.micro_batch = 4;
    o.global_batch = 4;
    o.fp8 = fp8;
    mp_stack_plan_options(&st, &cl.gpu, &o);
    double compute[2];
    for (int k = 0; k < 2; k++) {
      mp_sim_config cfg;
      memset(&cfg, 0, sizeof cfg);
      cfg.cluster = &cl;
      cfg.stack = k ? &no8 : &st;
      mp_sim_result r;
      ASSERT_EQ(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, &r), MP_OK) << mp_errmsg(&ctx);
      compute[k] = r.compute_s;
    }
    if (fp8)
      EXPECT_GT(std::fabs(compute[0] - compute[1]), 1e-3 * compute[1]) << compute[0] << " vs " << compute[1];
    else
      EXPECT_EQ(compute[0], compute[1]);
  }
}

TEST(Float8ByPass, ForwardPointsOnlyKeepTheCurve) {
  // A calibration with float8 forward points only: six of them (f8gemm.fwd rows at
  // d_model 4096 shapes) and no fit.fp8_gemm_* rows beyond the eff. It loads, applies,
  // and the simulator costs every float8 GEMM, forward or backward, on the float8 curve
  // alone.
  const std::string db = FreshDbPath("cuda_old_f8.db");
  Truth tr;
  mp_calib c = synthetic(tr);
  const int old_km[3][2] = {{4096, 4096}, {4096, 14336}, {14336, 4096}};
  c.n_f8 = 0;
  for (int N : {2048, 8192})
    for (auto &km : old_km) {
      mp_calib_gemm &g = c.f8[c.n_f8++];
      g = {MP_CALIB_GEMM_FWD, N, km[0], km[1], 0.0};
      // the 14336-wide ones at 0.5, the others at 0.65: not on one curve
      const double E = km[0] == 14336 || km[1] == 14336 ? 0.5 : 0.65;
      const double x = (double)N * km[0] * km[1], flops = mp_calib_gemm_flops(g.pass, N, km[0], km[1]);
      g.flops_per_s = flops / (flops / (kPeak8 * E * x / (x + tr.h)) + tr.ovh);
    }
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK) << mp_errmsg(&ctx);
  // the forward-only fit: sum w^2 / sum w with w the points' efficiencies
  // on the bf16 curve's knee (here that knee is the truth's, so w = 0.5 four times and
  // 0.65 twice)
  EXPECT_NEAR(c.fit.fp8_gemm_eff_max, (4 * 0.25 + 2 * 0.4225) / (4 * 0.5 + 2 * 0.65), 1e-9);
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &c), MP_OK) << mp_errmsg(&ctx);
  sqlite3 *h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "DELETE FROM calibrations WHERE key IN ('fit.fp8_gemm_curve_rms', "
                            "'fit.fp8_gemm_table_rms', 'fit.fp8_gemm_table')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_stmt *q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h, "SELECT count(*) FROM calibrations WHERE key LIKE 'f8gemm.fwd.%'", -1, &q, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(q, 0), 6);
  sqlite3_finalize(q);
  sqlite3_close(h);

  mp_calib *got = new mp_calib;
  mp_stack_profile st;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &st), MP_OK);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &g), MP_OK);
  mp_calib_tables tables;
  ASSERT_EQ(mp_calib_load_apply_stack(&ctx, db.c_str(), "cuda", &g, nullptr, &st, &tables, got), MP_OK)
      << mp_errmsg(&ctx);
  ASSERT_EQ(got->n_f8, 6);
  for (int i = 0; i < got->n_f8; i++) EXPECT_EQ(got->f8[i].pass, MP_CALIB_GEMM_FWD);
  EXPECT_EQ(got->fit.fp8_gemm_table, 0);
  EXPECT_EQ(got->fit.fp8_gemm_eff_max, c.fit.fp8_gemm_eff_max);
  EXPECT_EQ(st.fp8_gemm_eff_max, c.fit.fp8_gemm_eff_max);
  EXPECT_EQ(st.fp8_gemm_table, nullptr);
  char line[768], want[64];
  mp_calib_summary(got, line, sizeof line);
  snprintf(want, sizeof want, "fp8_gemm_eff_max %.3f, kernel_overhead", c.fit.fp8_gemm_eff_max);
  EXPECT_NE(strstr(line, want), nullptr) << line;  // no "(+ by shape)" 
  const double E8 = c.fit.fp8_gemm_eff_max, h8 = c.fit.gemm_eff_half_mnk;
  for (int pass : {MP_CALIB_GEMM_FWD, MP_CALIB_GEMM_DGRAD, MP_CALIB_GEMM_WGRAD}) {
    const mp_op op = linear_op(pass, 8192, 4096, 14336, f8_dtype(pass));
    const double x = 8192.0 * 4096 * 14336;
    EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), op.flops / (kPeak8 * E8 * x / (x + h8)) + tr.ovh, 1e-15) << pass;
  }
  delete got;
}

// ---- the database ---------------------------------------------------------------------

void expect_same_cuda(const mp_calib &a, const mp_calib &b) {
  EXPECT_STREQ(a.device, b.device);
  EXPECT_STREQ(a.host, b.host);
  EXPECT_STREQ(a.created_at, b.created_at);
  EXPECT_STREQ(a.gpu_name, b.gpu_name);
  EXPECT_STREQ(a.gpu_profile, b.gpu_profile);
  EXPECT_STREQ(a.f8_unavailable, b.f8_unavailable);
  EXPECT_STREQ(a.attn_unavailable, b.attn_unavailable);
  EXPECT_EQ(a.compute_capability, b.compute_capability);
  EXPECT_EQ(a.ref_bf16_tflops, b.ref_bf16_tflops);
  EXPECT_EQ(a.ref_fp8_tflops, b.ref_fp8_tflops);
  EXPECT_EQ(a.ref_hbm_GBps, b.ref_hbm_GBps);
  EXPECT_EQ(a.launch_s, b.launch_s);
  EXPECT_EQ(a.copy_GBps, b.copy_GBps);
  ASSERT_EQ(a.n_gemm, b.n_gemm);
  for (int i = 0; i < a.n_gemm; i++) {
    EXPECT_EQ(a.gemm[i].pass, b.gemm[i].pass) << i;
    EXPECT_EQ(a.gemm[i].N, b.gemm[i].N) << i;
    EXPECT_EQ(a.gemm[i].K, b.gemm[i].K) << i;
    EXPECT_EQ(a.gemm[i].M, b.gemm[i].M) << i;
    EXPECT_EQ(a.gemm[i].flops_per_s, b.gemm[i].flops_per_s) << i;
  }
  ASSERT_EQ(a.n_attn, b.n_attn);
  for (int i = 0; i < a.n_attn; i++) {
    EXPECT_EQ(a.attn[i].backward, b.attn[i].backward);
    EXPECT_EQ(a.attn[i].B, b.attn[i].B);
    EXPECT_EQ(a.attn[i].T, b.attn[i].T);
    EXPECT_EQ(a.attn[i].nh, b.attn[i].nh);
    EXPECT_EQ(a.attn[i].nkv, b.attn[i].nkv);
    EXPECT_EQ(a.attn[i].hd, b.attn[i].hd);
    EXPECT_EQ(a.attn[i].flops_per_s, b.attn[i].flops_per_s);
  }
  ASSERT_EQ(a.n_bw, b.n_bw);
  for (int i = 0; i < a.n_bw; i++) {
    EXPECT_EQ(a.bw[i].kernel, b.bw[i].kernel);
    EXPECT_EQ(a.bw[i].elems, b.bw[i].elems);
    EXPECT_EQ(a.bw[i].GBps, b.bw[i].GBps);
  }
  ASSERT_EQ(a.n_f8, b.n_f8);
  for (int i = 0; i < a.n_f8; i++) {
    EXPECT_EQ(a.f8[i].pass, b.f8[i].pass);
    EXPECT_EQ(a.f8[i].N, b.f8[i].N);
    EXPECT_EQ(a.f8[i].K, b.f8[i].K);
    EXPECT_EQ(a.f8[i].M, b.f8[i].M);
    EXPECT_EQ(a.f8[i].flops_per_s, b.f8[i].flops_per_s);
  }
  EXPECT_EQ(memcmp(&a.fit, &b.fit, sizeof a.fit), 0);
}

TEST(CudaStore, RoundTripKeepsPointsFitAndNotes) {
  const std::string db = FreshDbPath("cuda_calib.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c = synthetic(Truth());
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  c.n_f8 = 0;
  snprintf(c.f8_unavailable, sizeof c.f8_unavailable, "matmul_f8: 'E4M3' refused; \"no kernel\" (status 15)");
  mp_calib *got = new mp_calib;
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(c.id, 1);
  ASSERT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cuda", got), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(got->id, 1);
  expect_same_cuda(c, *got);
  // a cpu load does not see it
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", got), MP_ERR_NOT_FOUND);

  // Rows: 81 GEMMs + copy + gpu.cc + 3 ref + launch + 10 attention + 5 bandwidth + 9 fit
  // + 3 float8 fit (curve rms, table rms, table) = 114; notes: gpu.name, gpu.profile,
  // f8.unavailable (attention was measured) = 3.
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, db.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  int64_t n = 0;
  ASSERT_EQ(mp_store_query_i64(&ctx, st, "SELECT count(*) FROM calibrations WHERE id = 1", &n), MP_OK);
  EXPECT_EQ(n, 114);
  ASSERT_EQ(mp_store_query_i64(&ctx, st, "SELECT count(*) FROM calibration_notes WHERE id = 1", &n), MP_OK);
  EXPECT_EQ(n, 3);
  ASSERT_EQ(mp_store_query_i64(&ctx, st, "SELECT count(*) FROM calibrations WHERE key = 'gemm.wgrad.8192x4096x32000'",
                               &n),
            MP_OK);
  EXPECT_EQ(n, 1);
  mp_store_close(st);
  delete got;
}

TEST(CudaStore, Float8PointsRoundTripByPass) {
  // Every float8 point keeps its pass (f8gemm.fwd|dgrad|wgrad rows), and the float8 fit
  // its table verdict; a float8 row of another pass is a row this meshplan cannot read.
  const std::string db = FreshDbPath("cuda_f8_calib.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c = synthetic(Truth());
  set_f8(c, Truth(), F8Truth());
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  ASSERT_EQ(c.fit.fp8_gemm_table, 1);
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &c), MP_OK) << mp_errmsg(&ctx);
  mp_calib *got = new mp_calib;
  ASSERT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cuda", got), MP_OK) << mp_errmsg(&ctx);
  expect_same_cuda(c, *got);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, db.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  int64_t n = 0;
  for (const char *pass : {"fwd", "dgrad", "wgrad"}) {
    const std::string q = std::string("SELECT count(*) FROM calibrations WHERE key LIKE 'f8gemm.") + pass + ".%'";
    ASSERT_EQ(mp_store_query_i64(&ctx, st, q.c_str(), &n), MP_OK);
    EXPECT_EQ(n, 27) << pass;
  }
  ASSERT_EQ(mp_store_query_i64(&ctx, st, "SELECT value FROM calibrations WHERE key = 'fit.fp8_gemm_table'", &n),
            MP_OK);
  EXPECT_EQ(n, 1);
  mp_store_close(st);
  sqlite3 *h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "INSERT INTO calibrations VALUES (1, '2026-11-02T10:00:00Z', 'cuda', 'gpuhost', 1, 1, "
                            "'f8gemm.bwd.512x1024x1024', 1, 1e14, 'FLOP/s')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(h);
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cuda", got), MP_ERR_DB);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "f8gemm.bwd.512x1024x1024"), nullptr) << mp_errmsg(&ctx);
  delete got;
}

TEST(CudaStore, UnknownNoteIsDbError) {
  const std::string db = FreshDbPath("cuda_note.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c = synthetic(Truth());
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &c), MP_OK);
  sqlite3 *h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "INSERT INTO calibration_notes VALUES (1, 'gpu.colour', 'green')", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  sqlite3_close(h);
  mp_calib *got = new mp_calib;
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cuda", got), MP_ERR_DB);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "gpu.colour"), nullptr) << mp_errmsg(&ctx);
  delete got;
}

// ---- applying to the stack and the profile -------------------------------------------

TEST(CudaApply, StackTakesTheFitProfileStays) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c = synthetic(Truth());
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  c.id = 5;
  mp_stack_profile st, before;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &st), MP_OK);
  before = st;
  mp_calib_tables tables;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &c, &st, &tables), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(st.gemm_eff_max, 0.78, 1e-9);
  EXPECT_NEAR(st.gemm_eff_half_mnk, 1.9e9, 1e-6 * 1.9e9);
  EXPECT_NEAR(st.attention_eff, 0.5, 1e-9);
  EXPECT_NEAR(st.hbm_eff, 0.8, 1e-9);
  EXPECT_NEAR(st.fp8_gemm_eff_max, 0.6, 1e-9);
  EXPECT_NEAR(st.kernel_overhead_s, 3e-6, 1e-15);
  EXPECT_EQ(st.gemm_table, nullptr);      // the curve explains the points
  EXPECT_EQ(st.fp8_gemm_table, nullptr);  // and the float8 curve the float8 ones
  EXPECT_NE(strstr(st.source, "calibration #5"), nullptr) << st.source;
  // unmeasured figures stay: link, comm, memory
  EXPECT_EQ(st.link_eff, before.link_eff);
  EXPECT_EQ(st.comm_overhead_s, before.comm_overhead_s);
  EXPECT_EQ(st.frag_factor, before.frag_factor);
  EXPECT_STREQ(st.name, "meshplan-cuda");

  // attention and float8 not measured: the stated figures stay
  mp_calib c2 = c;
  c2.fit.attention_eff = 0;
  c2.fit.fp8_gemm_eff_max = 0;
  mp_stack_profile st2 = before;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &c2, &st2, nullptr), MP_OK);
  EXPECT_EQ(st2.attention_eff, before.attention_eff);
  EXPECT_EQ(st2.fp8_gemm_eff_max, before.fp8_gemm_eff_max);

  // The GPU profile and its cluster keep their datasheet figures.
  mp_cluster cl, cl0;
  ASSERT_EQ(mp_cluster_load(&ctx, "h100-8", &cl), MP_OK);
  cl0 = cl;
  ASSERT_EQ(mp_calib_apply_checked(&ctx, &c, &cl.gpu, &cl), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(memcmp(&cl, &cl0, sizeof cl), 0);
}

TEST(CudaApply, Refusals) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c = synthetic(Truth());
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  // another GPU's profile: the efficiencies are relative to the H100's datasheet
  mp_gpu a100;
  ASSERT_EQ(mp_gpu_load(&ctx, "a100-80gb-sxm", &a100), MP_OK);
  EXPECT_EQ(mp_calib_apply_checked(&ctx, &c, &a100, nullptr), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "--gpu h100-sxm"), nullptr) << mp_errmsg(&ctx);
  // the CPU profile
  mp_cluster cpu;
  ASSERT_EQ(mp_cluster_load(&ctx, "cpu-local", &cpu), MP_OK);
  EXPECT_EQ(mp_calib_apply_checked(&ctx, &c, nullptr, &cpu), MP_ERR_INVALID);
  // another stack: the calibration measured meshplan's kernels, not torch.compile's
  mp_stack_profile tt, tt0;
  ASSERT_EQ(mp_stack_load(&ctx, "torchtitan-compile", &tt), MP_OK);
  tt0 = tt;
  EXPECT_EQ(mp_calib_apply_stack(&ctx, &c, &tt, nullptr), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "meshplan-cuda"), nullptr) << mp_errmsg(&ctx);
  EXPECT_EQ(memcmp(&tt, &tt0, sizeof tt), 0);
  // a cpu calibration leaves any stack alone
  mp_calib cpu_cal = c;
  snprintf(cpu_cal.device, sizeof cpu_cal.device, "cpu");
  EXPECT_EQ(mp_calib_apply_stack(&ctx, &cpu_cal, &tt, nullptr), MP_OK);
  EXPECT_EQ(memcmp(&tt, &tt0, sizeof tt), 0);
}

TEST(CudaApply, SimulatorOpTimesByHand) {
  // The fitted stack (E 0.78, h 1.9e9, attention 0.5, HBM 0.8, 3 us) on the h100-sxm
  // datasheet (989.4 TFLOP/s bf16, 3350 GB/s):
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c = synthetic(Truth());
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  mp_stack_profile st;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &st), MP_OK);
  mp_stack_profile stated = st;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &c, &st, nullptr), MP_OK);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &g), MP_OK);
  mp_op op;
  memset(&op, 0, sizeof op);
  op.type = MP_OP_COMPUTE;
  op.dtype = MP_DTYPE_BF16;
  op.batch = 1;
  // GEMM 8192 x 4096 x 4096: x = 1.374e11, eff = 0.78 x / (x + 1.9e9) = 0.76936;
  // 2.749e11 FLOP / (989.4e12 x 0.76936) = 361.1 us, + 3 us. Bytes (2 x (m k + k n) +
  // 2 m n = 1.7e8) / (3350e9 x 0.8) = 63 us: compute-bound.
  op.kernel = MP_KERNEL_GEMM;
  op.variant = MP_VAR_FWD;
  op.m = 8192;
  op.n = 4096;
  op.k = 4096;
  op.flops = 2.0 * 8192 * 4096 * 4096;
  op.bytes = 2.0 * (8192.0 * 4096 + 4096.0 * 4096) + 2.0 * 8192 * 4096;
  const double x = 8192.0 * 4096 * 4096;
  const double eff = 0.78 * x / (x + 1.9e9);
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), op.flops / (kPeak * eff) + 3e-6, 1e-6 * 364e-6);
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), 364.1e-6, 0.05e-6);
  // and it changed: the stated 0.75, 2e9 and 4 us give 2.749e11 / (989.4e12 x 0.73929) + 4 us
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &stated), op.flops / (kPeak * 0.75 * x / (x + 2e9)) + 4e-6, 1e-12);
  // attention at 0.5 of the bf16 peak: 1e12 FLOP -> 2.0214 ms + 3 us
  op.kernel = MP_KERNEL_ATTENTION;
  op.flops = 1e12;
  op.bytes = 1e6;
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), 1e12 / (kPeak * 0.5) + 3e-6, 1e-12);
  // an element-wise kernel at 0.8 of 3350 GB/s: 1.34e8 bytes -> 50 us + 3 us
  op.kernel = MP_KERNEL_NORM;
  op.flops = 1e6;
  op.bytes = 1.34e8;
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), 50e-6 + 3e-6, 1e-12);
}

TEST(CudaApply, PlanComputeTimeDoublesWhenEfficienciesHalve) {
  // Two calibrations of the same curve knee, the second with every efficiency halved and
  // no launch cost in either: every op of a 1-GPU Llama-3.1-8B step (GEMMs, attention,
  // element-wise kernels, AdamW: all bound by tensor cores or HBM) takes twice as long,
  // so the simulator's compute time doubles exactly.
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "llama3.1-8b", &m), MP_OK) << mp_errmsg(&ctx);
  mp_cluster cl;
  ASSERT_EQ(mp_cluster_make(&ctx, "h100-sxm", 1, 1, &cl), MP_OK) << mp_errmsg(&ctx);
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = 2048;
  o.micro_batch = 1;
  o.global_batch = 1;
  o.ac = MP_AC_FULL;
  mp_stack_profile base;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &base), MP_OK);
  base.kernel_overhead_s = 0;
  double compute[2], step[2];
  for (int half = 0; half < 2; half++) {
    mp_calib c = synthetic(Truth());
    ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
    const double s = half ? 0.5 : 1.0;
    c.fit.gemm_eff_max = 0.7 * s;
    c.fit.gemm_eff_half_mnk = 2e9;
    c.fit.attention_eff = 0.4 * s;
    c.fit.hbm_eff = 0.8 * s;
    c.fit.fp8_gemm_eff_max = 0.6 * s;
    c.fit.kernel_overhead_us = 0;  // not measured: the base's 0 stays
    c.fit.gemm_table = 0;
    mp_stack_profile st = base;
    ASSERT_EQ(mp_calib_apply_stack(&ctx, &c, &st, nullptr), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(st.kernel_overhead_s, 0.0);
    mp_sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.cluster = &cl;
    cfg.stack = &st;
    mp_sim_result r;
    ASSERT_EQ(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, &r), MP_OK) << mp_errmsg(&ctx);
    compute[half] = r.compute_s;
    step[half] = r.step_time_s;
  }
  ASSERT_GT(compute[0], 0);
  EXPECT_NEAR(compute[1] / compute[0], 2.0, 1e-9);
  EXPECT_NEAR(step[1] / step[0], 2.0, 1e-9);
}

TEST(CudaApply, LoadApplyStackUsesTheNewestCuda) {
  const std::string db = FreshDbPath("cuda_load_apply.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib a = synthetic(Truth()), b = synthetic(Truth());
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &a), MP_OK);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &b), MP_OK);
  b.fit.hbm_eff = 0.9;
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &a), MP_OK);
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &b), MP_OK);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &g), MP_OK);
  mp_stack_profile st;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &st), MP_OK);
  mp_calib_tables tables;
  mp_calib *got = new mp_calib;
  ASSERT_EQ(mp_calib_load_apply_stack(&ctx, db.c_str(), "cuda", &g, nullptr, &st, &tables, got), MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_EQ(got->id, 2);
  EXPECT_EQ(st.hbm_eff, 0.9);
  // the trainer's entry point (no stack) still works for a cuda calibration
  EXPECT_EQ(mp_calib_load_apply(&ctx, db.c_str(), "cuda", &g, nullptr), MP_OK) << mp_errmsg(&ctx);
  mp_gpu a100;
  ASSERT_EQ(mp_gpu_load(&ctx, "a100-80gb-sxm", &a100), MP_OK);
  EXPECT_EQ(mp_calib_load_apply(&ctx, db.c_str(), "cuda", &a100, nullptr), MP_ERR_INVALID);
  delete got;
}

// ---- the device -----------------------------------------------------------------------

TEST(CudaDevice, ProfileFromTheDeviceName) {
  const double gib = 1073741824.0;
  EXPECT_STREQ(mp_calib_gpu_profile_for("NVIDIA H100 80GB HBM3", 90, 79.1 * gib), "h100-sxm");
  EXPECT_STREQ(mp_calib_gpu_profile_for("NVIDIA H100", 90, 94.5 * gib), "h100-96gb-500w");
  EXPECT_STREQ(mp_calib_gpu_profile_for("NVIDIA H200", 90, 139.8 * gib), "h200");
  EXPECT_STREQ(mp_calib_gpu_profile_for("NVIDIA A100-SXM4-80GB", 80, 79.2 * gib), "a100-80gb-sxm");
  EXPECT_STREQ(mp_calib_gpu_profile_for("NVIDIA B200", 100, 178 * gib), "b200");
  EXPECT_STREQ(mp_calib_gpu_profile_for("NVIDIA GB200", 100, 184 * gib), "gb200");
  // parts whose datasheet differs, or that the data does not describe
  EXPECT_EQ(mp_calib_gpu_profile_for("NVIDIA H100 PCIe", 90, 79.6 * gib), nullptr);
  EXPECT_EQ(mp_calib_gpu_profile_for("NVIDIA H100 NVL", 90, 93.1 * gib), nullptr);
  EXPECT_EQ(mp_calib_gpu_profile_for("NVIDIA GH200 480GB", 90, 94.5 * gib), nullptr);
  EXPECT_EQ(mp_calib_gpu_profile_for("NVIDIA A100-SXM4-40GB", 80, 39.4 * gib), nullptr);
  EXPECT_EQ(mp_calib_gpu_profile_for("NVIDIA GeForce RTX 4090", 89, 23.6 * gib), nullptr);
  EXPECT_EQ(mp_calib_gpu_profile_for(nullptr, 90, 0), nullptr);

  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib_device dev;
  memset(&dev, 0, sizeof dev);
  snprintf(dev.name, sizeof dev.name, "NVIDIA GeForce RTX 4090");
  dev.compute_capability = 89;
  dev.mem_bytes = 23.6 * gib;
  mp_gpu g;
  EXPECT_EQ(mp_calib_cuda_profile(&ctx, &dev, nullptr, &g), MP_ERR_USAGE);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "pass --gpu"), nullptr) << mp_errmsg(&ctx);
  // a profile of another compute capability: its datasheet is another GPU's
  EXPECT_EQ(mp_calib_cuda_profile(&ctx, &dev, "h100-sxm", &g), MP_ERR_INVALID);
  snprintf(dev.name, sizeof dev.name, "NVIDIA H100 80GB HBM3");
  dev.compute_capability = 90;
  dev.mem_bytes = 79.1 * gib;
  ASSERT_EQ(mp_calib_cuda_profile(&ctx, &dev, "", &g), MP_OK) << mp_errmsg(&ctx);
  EXPECT_STREQ(g.name, "h100-sxm");
}

TEST(CudaDevice, WithoutADeviceTheProbeSaysWhatIsMissing) {
  if (mp_cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib_device dev;
  EXPECT_EQ(mp_calib_cuda_probe(&ctx, 0, &dev), MP_ERR_UNSUPPORTED);
  EXPECT_EQ(strncmp(mp_errmsg(&ctx), "no CUDA device visible", 22), 0) << mp_errmsg(&ctx);
  EXPECT_EQ(strchr(mp_errmsg(&ctx), '\n'), nullptr);
}

}  // namespace
