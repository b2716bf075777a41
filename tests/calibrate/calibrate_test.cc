// Tests of the CPU calibration (calib/calibrate.h, calib/store.h): the
// alpha-beta fit against hand-built timings, the database round trip (equal values,
// newest wins, per device, corrupt and foreign files), which profile fields
// mp_calib_apply changes, the fit of the cpu kernels into the meshplan-cpu stack on
// synthetic measurements with hand-derived answers (and the simulator's op times with it),
// the round trip of a calibration with its kernels and the loading of one of GEMM and copy
// only, and a small single-rank measurement.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "exec/comm/comm.h"
#include "kernels/cpu/cpu.h"
#include "calib/store.h"
#include "calib/calibrate.h"
#include "planner/store.h"
#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/tmp_path.h"

namespace {

// A calibration with every kind of figure, values chosen by hand (not measured).
mp_calib sample(double scale) {
  mp_calib c;
  memset(&c, 0, sizeof c);
  snprintf(c.created_at, sizeof c.created_at, "2026-11-02T10:00:00Z");
  snprintf(c.device, sizeof c.device, "cpu");
  snprintf(c.host, sizeof c.host, "testhost");
  c.threads = 2;
  c.world = 4;
  c.n_gemm = 3;
  c.gemm[0] = {0, 256, 64, 192, 1.25e10 * scale};
  c.gemm[1] = {1, 256, 64, 192, 1.5e10 * scale};
  c.gemm[2] = {0, 1024, 1024, 1024, 4.0e10 * scale};
  c.copy_GBps = 9.75 * scale;
  c.n_coll = 2;
  const int groups[2] = {2, 4};
  for (int i = 0; i < 2; i++) {
    mp_calib_coll_fit &f = c.coll[i];
    f.coll = i == 0 ? MP_CALIB_ALL_REDUCE : MP_CALIB_ALL_TO_ALL;
    f.group_size = groups[i];
    f.n_sizes = 3;
    const double bytes[3] = {256, 65536, 8388608};
    for (int k = 0; k < 3; k++) {
      f.bytes[k] = bytes[k];
      f.time_s[k] = (1e-6 + bytes[k] / 3e9) * scale;
      f.busbw_GBps[k] = 0.5 + k + i;
    }
    f.alpha_s = 1.5e-6 * (i + 1);
    f.beta_GBps = 3.0 * scale + i;
  }
  return c;
}

void expect_same(const mp_calib &a, const mp_calib &b) {
  EXPECT_STREQ(a.created_at, b.created_at);
  EXPECT_STREQ(a.device, b.device);
  EXPECT_STREQ(a.host, b.host);
  EXPECT_EQ(a.threads, b.threads);
  EXPECT_EQ(a.world, b.world);
  ASSERT_EQ(a.n_gemm, b.n_gemm);
  for (int i = 0; i < a.n_gemm; i++) {
    EXPECT_EQ(a.gemm[i].pass, b.gemm[i].pass);
    EXPECT_EQ(a.gemm[i].N, b.gemm[i].N);
    EXPECT_EQ(a.gemm[i].K, b.gemm[i].K);
    EXPECT_EQ(a.gemm[i].M, b.gemm[i].M);
    EXPECT_EQ(a.gemm[i].flops_per_s, b.gemm[i].flops_per_s);
  }
  EXPECT_EQ(a.copy_GBps, b.copy_GBps);
  ASSERT_EQ(a.n_coll, b.n_coll);
  for (int i = 0; i < a.n_coll; i++) {
    const mp_calib_coll_fit &x = a.coll[i], &y = b.coll[i];
    EXPECT_EQ(x.coll, y.coll);
    EXPECT_EQ(x.group_size, y.group_size);
    ASSERT_EQ(x.n_sizes, y.n_sizes);
    for (int k = 0; k < x.n_sizes; k++) {
      EXPECT_EQ(x.bytes[k], y.bytes[k]);
      EXPECT_EQ(x.time_s[k], y.time_s[k]);
      EXPECT_EQ(x.busbw_GBps[k], y.busbw_GBps[k]);
    }
    EXPECT_EQ(x.alpha_s, y.alpha_s);
    EXPECT_EQ(x.beta_GBps, y.beta_GBps);
  }
}

// ---- the fit ------------------------------------------------------------------------

TEST(CalibFit, RingFactorsAreTheSimulators) {
  // sim/network.c: all-reduce 2(n-1)/n bytes/bw + 2(n-1) lat; the others (n-1)/n, (n-1).
  EXPECT_DOUBLE_EQ(mp_calib_bw_factor(MP_CALIB_ALL_REDUCE, 4), 1.5);
  EXPECT_DOUBLE_EQ(mp_calib_lat_steps(MP_CALIB_ALL_REDUCE, 4), 6.0);
  EXPECT_DOUBLE_EQ(mp_calib_bw_factor(MP_CALIB_ALL_GATHER, 4), 0.75);
  EXPECT_DOUBLE_EQ(mp_calib_lat_steps(MP_CALIB_REDUCE_SCATTER, 4), 3.0);
  EXPECT_DOUBLE_EQ(mp_calib_bw_factor(MP_CALIB_ALL_TO_ALL, 2), 0.5);
  EXPECT_DOUBLE_EQ(mp_calib_lat_steps(MP_CALIB_ALL_TO_ALL, 2), 1.0);
}

TEST(CalibFit, RecoversAlphaBetaFromExactTimings) {
  // All-reduce over 4 ranks at beta = 2.5 GB/s, alpha = 3 us:
  // t = 1.5 bytes / 2.5e9 + 6 x 3e-6.
  mp_calib_coll_fit f;
  memset(&f, 0, sizeof f);
  f.coll = MP_CALIB_ALL_REDUCE;
  f.group_size = 4;
  const double bytes[4] = {256, 4096, 1 << 20, 8 << 20};
  f.n_sizes = 4;
  for (int k = 0; k < 4; k++) {
    f.bytes[k] = bytes[k];
    f.time_s[k] = 1.5 * bytes[k] / 2.5e9 + 6 * 3e-6;
  }
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit(&ctx, &f), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(f.beta_GBps, 2.5, 2.5e-9);
  EXPECT_NEAR(f.alpha_s, 3e-6, 3e-15);
  // bus bandwidth of the 1 MiB point: 1.5 x 1 MiB / t, by hand
  const double t2 = 1.5 * 1048576.0 / 2.5e9 + 18e-6;
  EXPECT_NEAR(f.busbw_GBps[2], 1.5 * 1048576.0 / t2 * 1e-9, 1e-12);
}

TEST(CalibFit, NegativeInterceptClampsAlphaToZero) {
  // Times below the line through the origin at small sizes would give alpha < 0.
  mp_calib_coll_fit f;
  memset(&f, 0, sizeof f);
  f.coll = MP_CALIB_ALL_GATHER;
  f.group_size = 2;
  f.n_sizes = 2;
  f.bytes[0] = 1000;
  f.time_s[0] = 0.5 * 1000 / 1e9 * 0.5;  // half the pure-bandwidth time
  f.bytes[1] = 1e6;
  f.time_s[1] = 0.5 * 1e6 / 1e9;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit(&ctx, &f), MP_OK);
  EXPECT_EQ(f.alpha_s, 0.0);
  // through the origin, relative errors: b = sum(u) / sum(u^2), u_i = x_i / t_i = {2e9, 1e9}
  const double b = (2e9 + 1e9) / (4e18 + 1e18);
  EXPECT_NEAR(f.beta_GBps, 1.0 / b * 1e-9, 1e-12);
}

TEST(CalibFit, RejectsNonPositiveTimes) {
  mp_calib_coll_fit f;
  memset(&f, 0, sizeof f);
  f.coll = MP_CALIB_ALL_REDUCE;
  f.group_size = 2;
  f.n_sizes = 1;
  f.bytes[0] = 1024;
  f.time_s[0] = 0;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_calib_fit(&ctx, &f), MP_ERR_INVALID);
}

// ---- the database -------------------------------------------------------------------

TEST(CalibStore, RoundTripNewestWinsPerDevice) {
  const std::string db = FreshDbPath("calib.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib a = sample(1.0), b = sample(2.0), other = sample(3.0), got;
  snprintf(other.device, sizeof other.device, "cuda");
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &a), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(a.id, 1);
  ASSERT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", &got), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(got.id, 1);
  expect_same(a, got);

  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &b), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &other), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(b.id, 2);
  EXPECT_EQ(other.id, 3);
  ASSERT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", &got), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(got.id, 2);  // the newest cpu one, not the newer cuda one
  expect_same(b, got);
  ASSERT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cuda", &got), MP_OK);
  EXPECT_EQ(got.id, 3);
  EXPECT_EQ(got.copy_GBps, 3.0 * 9.75);
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "tpu", &got), MP_ERR_NOT_FOUND);

  // The file is still a planner database, and holds one row per figure: 3 GEMMs + copy +
  // per fit 3 sizes x (time, busbw) + alpha + beta = 4 + 2 x 8 = 20 per cpu calibration
  // (a cuda one adds its own rows: cuda_calibrate_test counts those).
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, db.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  int64_t n = 0;
  ASSERT_EQ(mp_store_query_i64(&ctx, st, "SELECT count(*) FROM calibrations WHERE device = 'cpu'", &n), MP_OK);
  EXPECT_EQ(n, 40);
  ASSERT_EQ(mp_store_query_i64(&ctx, st, "SELECT count(*) FROM calibrations WHERE id = 2 AND unit = 'FLOP/s'", &n),
            MP_OK);
  EXPECT_EQ(n, 3);
  ASSERT_EQ(mp_store_query_i64(&ctx, st,
                               "SELECT group_size FROM calibrations WHERE id = 1 AND key = 'all_to_all.beta'", &n),
            MP_OK);
  EXPECT_EQ(n, 4);
  mp_store_close(st);
}

TEST(CalibStore, MissingFileIsNotFoundAndNotCreated) {
  const std::string db = FreshDbPath("absent.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib got;
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", &got), MP_ERR_NOT_FOUND);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "meshplan calibrate"), nullptr) << mp_errmsg(&ctx);
  EXPECT_NE(access(db.c_str(), F_OK), 0);
}

TEST(CalibStore, PlannerDatabaseWithoutCalibrationsIsNotFound) {
  const std::string db = FreshDbPath("planner_only.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, db.c_str(), &st), MP_OK);
  mp_store_close(st);
  mp_calib got;
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", &got), MP_ERR_NOT_FOUND);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "holds no cpu calibration"), nullptr) << mp_errmsg(&ctx);
}

TEST(CalibStore, CorruptFileIsDbError) {
  const std::string db = FreshDbPath("corrupt.db");
  FILE *f = fopen(db.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  for (int i = 0; i < 4096; i++) fputc("not a database "[i % 15], f);
  fclose(f);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c = sample(1.0), got;
  EXPECT_EQ(mp_calib_store_save(&ctx, db.c_str(), &c), MP_ERR_DB);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "not a meshplan database"), nullptr) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", &got), MP_ERR_DB);
  EXPECT_EQ(mp_calib_store_check(&ctx, db.c_str()), MP_ERR_DB);
}

TEST(CalibStore, ForeignSqliteFileIsDbError) {
  const std::string db = FreshDbPath("foreign.db");
  sqlite3 *h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "CREATE TABLE photos (id INTEGER, path TEXT)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(h);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c = sample(1.0), got;
  EXPECT_EQ(mp_calib_store_save(&ctx, db.c_str(), &c), MP_ERR_DB);
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", &got), MP_ERR_DB);
}

TEST(CalibStore, UnknownKeyIsDbErrorNotDropped) {
  const std::string db = FreshDbPath("unknown_key.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c = sample(1.0), got;
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &c), MP_OK);
  sqlite3 *h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h,
                         "INSERT INTO calibrations VALUES (1, '2026-11-02T10:00:00Z', 'cpu', 'h', 2, 4,"
                         " 'warp_speed', 1, 9.0, 'c')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(h);
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", &got), MP_ERR_DB);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "warp_speed"), nullptr) << mp_errmsg(&ctx);
}

// ---- applying to a profile ----------------------------------------------------------

TEST(CalibApply, ChangesExactlyTheMeasuredFields) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster cl;
  ASSERT_EQ(mp_cluster_load(&ctx, "cpu-local", &cl), MP_OK) << mp_errmsg(&ctx);
  mp_calib c = sample(1.0);
  c.id = 7;
  // Hand-derived expectation: the largest GEMM rate is 4e10 FLOP/s = 0.04 TFLOP/s for
  // every dtype; hbm 9.75; the link is the all_reduce fit (the only one, group 2:
  // beta 3.0 GB/s, alpha 1.5 us), even though an all_to_all fit at 4 ranks exists.
  mp_cluster want = cl;
  for (int d = 0; d < MP_DTYPE_COUNT; d++) want.gpu.peak_tflops[d] = 0.04;
  want.gpu.hbm_GBps = 9.75;
  want.gpu.nvlink_GBps_per_dir = 3.0;
  want.intra_node_GBps_per_gpu = 3.0;
  want.intra_node_latency_us = 1.5;
  mp_cluster got = cl;
  ASSERT_EQ(mp_calib_apply_checked(&ctx, &c, nullptr, &got), MP_OK) << mp_errmsg(&ctx);
  for (int d = 0; d < MP_DTYPE_COUNT; d++) EXPECT_NEAR(got.gpu.peak_tflops[d], 0.04, 1e-15) << d;
  EXPECT_NE(strstr(got.gpu.source, "calibration #7"), nullptr) << got.gpu.source;
  EXPECT_NEAR(got.intra_node_latency_us, 1.5, 1e-12);
  // Everything else byte for byte: copy the fields with rounding or text into want.
  want.intra_node_latency_us = got.intra_node_latency_us;
  memcpy(want.gpu.peak_tflops, got.gpu.peak_tflops, sizeof want.gpu.peak_tflops);
  memcpy(want.gpu.source, got.gpu.source, sizeof want.gpu.source);
  EXPECT_EQ(memcmp(&want, &got, sizeof want), 0);
  EXPECT_EQ(got.inter_node_Gbitps_per_gpu, cl.inter_node_Gbitps_per_gpu);
  EXPECT_EQ(got.inter_node_latency_us, cl.inter_node_latency_us);
  EXPECT_EQ(got.gpu.mem_gib, cl.gpu.mem_gib);
}

TEST(CalibApply, LargestAllReduceGroupIsTheLink) {
  mp_calib c = sample(1.0);
  c.coll[1].coll = MP_CALIB_ALL_REDUCE;  // so all_reduce at 2 and at 4 ranks
  const mp_calib_coll_fit *l = mp_calib_link_fit(&c);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->group_size, 4);
  mp_gpu g;
  memset(&g, 0, sizeof g);
  mp_calib_apply(&c, &g, nullptr);
  EXPECT_EQ(g.nvlink_GBps_per_dir, 4.0);  // beta of the second fit: 3 x 1 + 1
}

TEST(CalibApply, OneRankLeavesTheLinkAlone) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster cl;
  ASSERT_EQ(mp_cluster_load(&ctx, "cpu-local", &cl), MP_OK);
  mp_calib c = sample(1.0);
  c.n_coll = 0;
  c.world = 1;
  EXPECT_EQ(mp_calib_link_fit(&c), nullptr);
  mp_cluster got = cl;
  mp_calib_apply(&c, nullptr, &got);
  EXPECT_EQ(got.gpu.hbm_GBps, 9.75);
  EXPECT_EQ(got.gpu.nvlink_GBps_per_dir, cl.gpu.nvlink_GBps_per_dir);
  EXPECT_EQ(got.intra_node_GBps_per_gpu, cl.intra_node_GBps_per_gpu);
  EXPECT_EQ(got.intra_node_latency_us, cl.intra_node_latency_us);
}

TEST(CalibApply, CpuCalibrationRefusesAGpuProfile) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster cl;
  ASSERT_EQ(mp_cluster_load(&ctx, "h100-8", &cl), MP_OK);
  mp_cluster before = cl;
  mp_calib c = sample(1.0);
  EXPECT_EQ(mp_calib_apply_checked(&ctx, &c, nullptr, &cl), MP_ERR_INVALID);
  EXPECT_EQ(memcmp(&before, &cl, sizeof cl), 0);
}

TEST(CalibApply, LoadApplyUsesTheNewest) {
  const std::string db = FreshDbPath("load_apply.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib a = sample(1.0), b = sample(2.0);
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &a), MP_OK);
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), &b), MP_OK);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "cpu", &g), MP_OK);
  ASSERT_EQ(mp_calib_load_apply(&ctx, db.c_str(), "cpu", &g, nullptr), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(g.hbm_GBps, 2.0 * 9.75);
  EXPECT_NEAR(g.peak_tflops[MP_DTYPE_BF16], 0.08, 1e-15);
}

// ---- the cpu kernels' fit ---------------------------------------------------------------
// A cpu calibration whose every figure comes from a known "machine" (below): each expected
// figure is derived by hand in the test, so the fits are checked exactly (up to rounding).

struct CpuTruth {
  double A = 120e9;   // the GEMM curve's asymptote (FLOP/s): above every measured point
  double h = 4e5;     // its knee (N K M)
  double ovh = 0.5e-6;  // per call of every kernel
  double copy = 50.0;   // GB/s
};

double cpu_gemm_time(const CpuTruth &tr, int pass, int N, int K, int M) {
  const double flops = mp_calib_gemm_flops(pass, N, K, M), x = (double)N * K * M;
  return flops / (tr.A * x / (x + tr.h)) + tr.ovh;
}

void add_attn(mp_calib &c, const CpuTruth &tr, int backward, int B, int T, int nh, int nkv, int hd, double eff) {
  mp_calib_attn &a = c.attn[c.n_attn++];
  a.backward = backward;
  a.B = B, a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd;
  const double f = mp_calib_attn_flops(backward, B, T, nh, hd);
  a.flops_per_s = f / (f / (tr.A * eff) + tr.ovh);
}

// An element-wise point running at eff x the copy bandwidth (bytes as the simulator counts).
void add_bw(mp_calib &c, const CpuTruth &tr, int kernel, double elems, double eff) {
  mp_calib_bw &b = c.bw[c.n_bw++];
  b.kernel = kernel;
  b.elems = elems;
  const double by = mp_calib_bw_bytes(kernel, elems);
  b.GBps = by / (by / (tr.copy * 1e9 * eff) + tr.ovh) * 1e-9;
}

// The default GEMM shapes on the curve, attention at the tiny models' shape (6 % of the
// asymptote, forward and backward) and at (2, 256, 8, 4, 64) (20 % forward, 10 %
// backward), every element-wise kernel at the tiny models' size at 10 % of the copy and
// at 2^22 elements at 60 %.
mp_calib cpu_synthetic(const CpuTruth &tr) {
  mp_calib c = sample(1.0);
  c.n_coll = 0;
  c.world = 1;
  c.launch_s = tr.ovh;
  c.copy_GBps = tr.copy;
  mp_calib_options o;
  mp_calib_options_init_cpu(&o, 0);
  c.n_gemm = o.n_gemm;
  for (int i = 0; i < o.n_gemm; i++) {
    mp_calib_gemm &g = c.gemm[i];
    g.pass = o.gemm[i].pass;
    g.N = o.gemm[i].N, g.K = o.gemm[i].K, g.M = o.gemm[i].M;
    g.flops_per_s = mp_calib_gemm_flops(g.pass, g.N, g.K, g.M) / cpu_gemm_time(tr, g.pass, g.N, g.K, g.M);
  }
  for (int b = 0; b < 2; b++) add_attn(c, tr, b, 4, 64, 8, 4, 8, 0.06);
  add_attn(c, tr, 0, 2, 256, 8, 4, 64, 0.2);
  add_attn(c, tr, 1, 2, 256, 8, 4, 64, 0.1);
  const double tiny[MP_CALIB_BW_COUNT] = {16384, 16384, 49152, 49152, 12288, 16384, 16384, 65536, 65536, 16384};
  for (int k = 0; k < MP_CALIB_BW_COUNT; k++) add_bw(c, tr, k, tiny[k], 0.1);
  for (int k = 0; k < MP_CALIB_BW_COUNT; k++) add_bw(c, tr, k, 4194304.0, 0.6);
  return c;
}

// tiny-dense (d_model 64, d_ff 192, vocab 256, 8 heads of 8) at 4 x 64 tokens
mp_calib_run tiny_run() {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  EXPECT_EQ(mp_model_load(&ctx, "tiny-dense", &m), MP_OK) << mp_errmsg(&ctx);
  mp_calib_run r;
  mp_calib_run_init(&r, &m, 4, 64, 1);
  return r;
}

TEST(CpuFit, ReferenceIsTheCurvesAsymptoteAboveTheFastestPoint) {
  // Every GEMM lies on A x / (x + h): the fastest point (1024 x 4096 x 1024, x = 2^32)
  // reaches A x / (x + h) < A, so against it the curve would need E = A / fastest > 1.
  // The reference is the asymptote A instead, and the curve fits exactly with E = 1: no
  // clamp bends it.
  const CpuTruth tr;
  mp_calib c = cpu_synthetic(tr);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_GT(tr.A, mp_calib_gemm_peak_flops(&c));
  EXPECT_NEAR(c.ref_bf16_tflops, tr.A * 1e-12, 1e-9 * tr.A * 1e-12);
  EXPECT_EQ(c.ref_fp8_tflops, c.ref_bf16_tflops);  // the CPU computes every dtype in fp32
  EXPECT_EQ(c.ref_hbm_GBps, tr.copy);              // the copy is the HBM reference
  EXPECT_NEAR(c.fit.gemm_eff_max, 1.0, 1e-9);
  EXPECT_NEAR(c.fit.gemm_eff_half_mnk, tr.h, 1e-6 * tr.h);
  EXPECT_LT(c.fit.gemm_curve_rms, 1e-9);
  EXPECT_EQ(c.fit.gemm_table, 0);                           // the curve explains every point
  EXPECT_EQ(c.fit.fp8_gemm_eff_max, c.fit.gemm_eff_max);    // float8 is emulated in fp32
  EXPECT_NEAR(c.fit.kernel_overhead_us, 0.5, 1e-12);
  // The profile gets the same peak the curve is relative to, and the copy as HBM.
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "cpu", &g), MP_OK);
  ASSERT_EQ(mp_calib_apply_checked(&ctx, &c, &g, nullptr), MP_OK) << mp_errmsg(&ctx);
  for (int d = 0; d < MP_DTYPE_COUNT; d++) EXPECT_EQ(g.peak_tflops[d], c.ref_bf16_tflops) << d;
  EXPECT_EQ(g.hbm_GBps, c.ref_hbm_GBps);
}

TEST(CpuFit, ReferenceIsTheFastestPointWhenTheCurveLiesBelow) {
  // No knee: 256^3 at 80 GFLOP/s, 1024^3 at 60 (the caches run out). Against the fastest,
  // efficiencies e = {1, 0.75}; the line through the origin (h = 0) has E = sum e^2 /
  // sum e = 1.5625 / 1.75 < 1, so the reference stays the fastest point.
  mp_calib c;
  memset(&c, 0, sizeof c);
  snprintf(c.device, sizeof c.device, "cpu");
  c.copy_GBps = 10;
  c.n_gemm = 2;
  c.gemm[0] = {MP_CALIB_GEMM_FWD, 256, 256, 256, 80e9};
  c.gemm[1] = {MP_CALIB_GEMM_WGRAD, 1024, 1024, 1024, 60e9};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(c.ref_bf16_tflops, 0.08, 1e-15);
  EXPECT_EQ(c.fit.gemm_eff_half_mnk, 0.0);
  EXPECT_NEAR(c.fit.gemm_eff_max, 1.5625 / 1.75, 1e-12);
  EXPECT_NEAR(mp_calib_cpu_peak_flops(&c), 80e9, 1e-3);
}

TEST(CpuFit, AttentionAndElementWiseAreGeometricMeans) {
  // Stored fit, every point weighing the same, log-ratio least squares: the geometric mean
  // of the points' efficiencies. Attention: (0.06 x 0.06 x 0.2 x 0.1)^(1/4); element-wise:
  // ten points at 0.1 and ten at 0.6 of the copy: (0.1 x 0.6)^(1/2) (every point in the
  // bytes regime: the flops at 120 GFLOP/s take far less than the bytes).
  const CpuTruth tr;
  mp_calib c = cpu_synthetic(tr);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  EXPECT_NEAR(c.fit.attention_eff, std::pow(0.06 * 0.06 * 0.2 * 0.1, 0.25), 1e-9);
  EXPECT_NEAR(c.fit.hbm_eff, std::sqrt(0.1 * 0.6), 1e-9);
  // The relative-error fit of the GPU (sum e^2 / sum e) would say 0.35 for the
  // element-wise kernels, predicting the tiny models' ones 3.5 x too fast.
  EXPECT_LT(c.fit.hbm_eff, 0.3);
}

TEST(CpuFit, ElementWiseAboveTheCopyIsNotCapped) {
  // Cache-resident kernels outrun a copy far larger than the caches: 2 x and 3 x the copy
  // (a peak of 1 TFLOP/s keeps their flops terms far below their bytes: at 120 GFLOP/s
  // rmsnorm's 4 FLOP per element would bound it at these speeds).
  CpuTruth tr;
  tr.A = 1e12;
  mp_calib c = cpu_synthetic(tr);
  c.n_bw = 0;
  add_bw(c, tr, MP_CALIB_BW_RMSNORM_FWD, 16384, 2.0);
  add_bw(c, tr, MP_CALIB_BW_RESIDUAL, 16384, 3.0);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  EXPECT_NEAR(c.fit.hbm_eff, std::sqrt(6.0), 1e-9);
}

TEST(CpuFit, ElementWiseBoundByFlopsSaysNothingOfTheBandwidth) {
  // The simulator's element-wise time is max(flops / peak, bytes / (copy E)). With a peak
  // of 1 GFLOP/s, rmsnorm (4 FLOP, 4 bytes per element) measured at exactly its flops time
  // (4 ns per element, 0.02 of the copy's 0.08 ns) is flops-bound at any E below 50;
  // the residual add (1 FLOP, 6 bytes) at 0.1 of the copy (1.2 ns > its 1 ns of flops)
  // sets E = 0.1, and then both are predicted exactly. The bytes alone would say
  // (0.02 x 0.1)^(1/2) = 0.045.
  CpuTruth tr;
  tr.A = 1e9;
  mp_calib c = cpu_synthetic(tr);
  c.n_bw = 0;
  const double e = 16384;
  mp_calib_bw &r = c.bw[c.n_bw++];
  r.kernel = MP_CALIB_BW_RMSNORM_FWD;
  r.elems = e;
  r.GBps = 4 * e / (4 * e / 1e9 + tr.ovh) * 1e-9;
  add_bw(c, tr, MP_CALIB_BW_RESIDUAL, e, 0.1);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  EXPECT_NEAR(c.ref_bf16_tflops, 1e-3, 1e-12);  // the curve's asymptote
  EXPECT_NEAR(c.fit.hbm_eff, 0.1, 1e-9);
}

TEST(CpuFit, RunWeighsThePointsNearItsSizes) {
  const CpuTruth tr;
  mp_calib c = cpu_synthetic(tr);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  const mp_calib_run tiny = tiny_run();
  mp_calib_stack_fit f;
  // tiny-dense: attention T 64, hd 8 is the (4, 64, 8, 4, 8) point (distance 0, weight 1);
  // (2, 256, .., 64) is 3 octaves away in hd (weight 0): 0.06. Element-wise: every
  // kernel's tiny point is the run's size (rmsnorm 256 x 64 = 16384, swiglu x 192 = 49152,
  // RoPE 256 x 64, cross-entropy 256 x 256 = 65536, AdamW 64 x 192 = 12288); the 2^22
  // points are 6 octaves or more away: 0.1.
  mp_calib_fit_run(&c, &tiny, &f);
  EXPECT_NEAR(f.attention_eff, 0.06, 1e-9);
  EXPECT_NEAR(f.hbm_eff, 0.1, 1e-9);
  EXPECT_EQ(f.gemm_eff_max, c.fit.gemm_eff_max);  // the GEMMs have the by-shape table
  EXPECT_EQ(f.gemm_eff_half_mnk, c.fit.gemm_eff_half_mnk);
  EXPECT_EQ(f.kernel_overhead_us, c.fit.kernel_overhead_us);

  // Attention points at (T 64, hd 8) at 6 % and (T 128, hd 16) at 12 %, a run at seq 128,
  // head_dim 16: the first 1 octave away (weight 1/2), the second the run's (weight 1):
  // log E = (1/2 (2 ln 0.06) + 1 (2 ln 0.12)) / (2 x 1/2 + 2 x 1).
  mp_calib a = c;
  a.n_attn = 0;
  for (int b = 0; b < 2; b++) add_attn(a, tr, b, 4, 64, 8, 4, 8, 0.06);
  for (int b = 0; b < 2; b++) add_attn(a, tr, b, 4, 128, 8, 4, 16, 0.12);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &a), MP_OK);
  mp_calib_run r = tiny;
  r.seq = 128;
  r.head_dim = 16;
  mp_calib_fit_run(&a, &r, &f);
  EXPECT_NEAR(f.attention_eff, std::pow(0.06, 1.0 / 3) * std::pow(0.12, 2.0 / 3), 1e-9);

  // Element-wise with rmsnorm points at 2^14 elements (0.1) and 2^15 (0.4) only, a run
  // whose rmsnorm is 2^14 (tokens x d_model): weights 1 and 1/2, E = 0.1^(2/3) 0.4^(1/3).
  mp_calib d = c;
  d.n_bw = 0;
  add_bw(d, tr, MP_CALIB_BW_RMSNORM_FWD, 16384, 0.1);
  add_bw(d, tr, MP_CALIB_BW_RMSNORM_FWD, 32768, 0.4);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &d), MP_OK);
  mp_calib_fit_run(&d, &tiny, &f);
  EXPECT_NEAR(f.hbm_eff, std::pow(0.1, 2.0 / 3) * std::pow(0.4, 1.0 / 3), 1e-9);
  // 2^17 elements: both points 2 octaves or more away, none weighs: the stored fit stays
  mp_calib_run r17 = tiny;
  r17.tokens = 2048;
  mp_calib_fit_run(&d, &r17, &f);
  EXPECT_EQ(f.hbm_eff, d.fit.hbm_eff);
  EXPECT_NEAR(d.fit.hbm_eff, std::sqrt(0.1 * 0.4), 1e-9);

  // no run, or a cuda calibration: the stored fit
  mp_calib_fit_run(&c, nullptr, &f);
  EXPECT_EQ(memcmp(&f, &c.fit, sizeof f), 0);
}

TEST(CpuFit, BwdPointsOnlyGetNoFitAndNoError) {
  // GEMM points of pass BWD only (matmul_backward with both outputs): no curve, no fit,
  // no reference; the profile takes the largest rate.
  mp_calib c = sample(1.0);
  c.n_gemm = 1;
  c.gemm[0] = {MP_CALIB_GEMM_BWD, 256, 64, 192, 1.5e10};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK) << mp_errmsg(&ctx);
  mp_calib_stack_fit zero;
  memset(&zero, 0, sizeof zero);
  EXPECT_EQ(memcmp(&c.fit, &zero, sizeof zero), 0);
  EXPECT_EQ(c.ref_bf16_tflops, 0.0);
  EXPECT_EQ(mp_calib_cpu_peak_flops(&c), 1.5e10);
  mp_stack_profile st, st0;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cpu", &st), MP_OK);
  st0 = st;
  mp_calib_tables tables;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, &c, &st, &tables), MP_OK);
  EXPECT_EQ(memcmp(&st, &st0, sizeof st), 0);
}

// ---- the cpu fit applied: the stack, the profile, the simulator -------------------------

TEST(CpuApply, SimulatorReproducesTheMeasuredKernels) {
  // With the fit applied to the meshplan-cpu stack and the CPU profile (for tiny-dense),
  // the simulator's op times are the measured ones: a GEMM on the curve, the tiny
  // attention, an element-wise kernel at the tiny size; each measured time includes the
  // call (the stack's kernel_overhead).
  const CpuTruth tr;
  mp_calib c = cpu_synthetic(tr);
  c.id = 9;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "cpu", &g), MP_OK);
  ASSERT_EQ(mp_calib_apply_checked(&ctx, &c, &g, nullptr), MP_OK);
  mp_stack_profile st, st0;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cpu", &st), MP_OK);
  st0 = st;
  const mp_calib_run run = tiny_run();
  mp_calib_tables tables;
  ASSERT_EQ(mp_calib_apply_stack_run(&ctx, &c, &run, &st, &tables), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(st.gemm_eff_max, 1.0, 1e-9);
  EXPECT_NEAR(st.attention_eff, 0.06, 1e-9);
  EXPECT_NEAR(st.hbm_eff, 0.1, 1e-9);
  EXPECT_NEAR(st.kernel_overhead_s, tr.ovh, 1e-18);
  EXPECT_EQ(st.fp8_gemm_eff_max, st.gemm_eff_max);
  EXPECT_EQ(st.fp8_gemm_table, nullptr);  // float8 is emulated on the CPU: no float8 points
  EXPECT_EQ(st.link_eff, st0.link_eff);
  EXPECT_EQ(st.comm_overhead_s, st0.comm_overhead_s);
  EXPECT_EQ(st.mem_model, st0.mem_model);
  EXPECT_NE(strstr(st.source, "calibration #9 of cpu"), nullptr) << st.source;

  mp_op op;
  memset(&op, 0, sizeof op);
  op.type = MP_OP_COMPUTE;
  op.kernel = MP_KERNEL_GEMM;  // the forward of gate_proj: [256, 64] x [64, 192]
  op.variant = MP_VAR_FWD;
  op.dtype = MP_DTYPE_BF16;
  op.m = 256, op.n = 192, op.k = 64, op.batch = 1;
  op.flops = mp_calib_gemm_flops(MP_CALIB_GEMM_FWD, 256, 64, 192);
  const double tg = cpu_gemm_time(tr, MP_CALIB_GEMM_FWD, 256, 64, 192);
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), tg, 1e-9 * tg);

  op.kernel = MP_KERNEL_ATTENTION;
  op.flops = mp_calib_attn_flops(1, 4, 64, 8, 8);
  const double ta = op.flops / (tr.A * 0.06) + tr.ovh;
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), ta, 1e-9 * ta);

  op.kernel = MP_KERNEL_NORM;  // the schedule's rmsnorm forward: 4 FLOP and 4 bytes per element
  op.flops = 4.0 * 16384;
  op.bytes = mp_calib_bw_bytes(MP_CALIB_BW_RMSNORM_FWD, 16384);
  const double tn = op.bytes / (tr.copy * 1e9 * 0.1) + tr.ovh;
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), tn, 1e-9 * tn);

  // another stack keeps its own figures
  mp_stack_profile tt, tt0;
  ASSERT_EQ(mp_stack_load(&ctx, "torchtitan-compile", &tt), MP_OK);
  tt0 = tt;
  ASSERT_EQ(mp_calib_apply_stack_run(&ctx, &c, &run, &tt, &tables), MP_OK);
  EXPECT_EQ(memcmp(&tt, &tt0, sizeof tt), 0);
}

TEST(CpuApply, EachElementWiseClassKeepsItsOwnRate) {
  // The tiny-size points of SwiGLU run at 5 % of the copy, AdamW's at 30 %, the rest at
  // 10 %: applied for tiny-dense, each class's simulated op takes its own kernel's time,
  // and a class the calibration has no kernel of (the gradient norm) takes the pooled
  // figure.
  const CpuTruth tr;
  mp_calib c = cpu_synthetic(tr);
  c.n_bw = 0;
  const double tiny[MP_CALIB_BW_COUNT] = {16384, 16384, 49152, 49152, 12288, 16384, 16384, 65536, 65536, 16384};
  for (int k = 0; k < MP_CALIB_BW_COUNT; k++) {
    const bool swiglu = k == MP_CALIB_BW_SWIGLU_FWD || k == MP_CALIB_BW_SWIGLU_BWD;
    add_bw(c, tr, k, tiny[k], swiglu ? 0.05 : k == MP_CALIB_BW_ADAMW ? 0.3 : 0.1);
  }
  for (int k = 0; k < MP_CALIB_BW_COUNT; k++) add_bw(c, tr, k, 4194304.0, 0.6);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, &c), MP_OK);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "cpu", &g), MP_OK);
  ASSERT_EQ(mp_calib_apply_checked(&ctx, &c, &g, nullptr), MP_OK);
  mp_stack_profile st;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cpu", &st), MP_OK);
  const mp_calib_run run = tiny_run();
  mp_calib_tables tables;
  ASSERT_EQ(mp_calib_apply_stack_run(&ctx, &c, &run, &st, &tables), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(st.hbm_eff_kernel[MP_KERNEL_ACTIVATION], 0.05, 1e-9);
  EXPECT_NEAR(st.hbm_eff_kernel[MP_KERNEL_OPTIMIZER], 0.3, 1e-9);
  EXPECT_NEAR(st.hbm_eff_kernel[MP_KERNEL_NORM], 0.1, 1e-9);
  EXPECT_EQ(st.hbm_eff_kernel[MP_KERNEL_GRAD_NORM], 0.0);
  EXPECT_EQ(st.hbm_eff_kernel[MP_KERNEL_GEMM], 0.0);

  struct Case {
    int kernel, bw;
    double elems, eff;
  } cases[] = {{MP_KERNEL_ACTIVATION, MP_CALIB_BW_SWIGLU_FWD, 49152, 0.05},
               {MP_KERNEL_OPTIMIZER, MP_CALIB_BW_ADAMW, 12288, 0.3},
               {MP_KERNEL_NORM, MP_CALIB_BW_RMSNORM_FWD, 16384, 0.1}};
  for (const Case &k : cases) {
    mp_op op;
    memset(&op, 0, sizeof op);
    op.type = MP_OP_COMPUTE;
    op.kernel = (uint8_t)k.kernel;
    op.dtype = MP_DTYPE_FP32;
    op.bytes = mp_calib_bw_bytes(k.bw, k.elems);
    const double want = op.bytes / (tr.copy * 1e9 * k.eff) + tr.ovh;
    EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), want, 1e-9 * want) << mp_kernel_name((mp_kernel)k.kernel);
  }
  // the gradient norm: the pooled fit over every class's points
  mp_op op;
  memset(&op, 0, sizeof op);
  op.type = MP_OP_COMPUTE;
  op.kernel = MP_KERNEL_GRAD_NORM;
  op.dtype = MP_DTYPE_FP32;
  op.bytes = 4.0 * 16384;
  const double want = op.bytes / (tr.copy * 1e9 * st.hbm_eff) + tr.ovh;
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &st), want, 1e-9 * want);
  EXPECT_GT(st.hbm_eff, 0.05);
  EXPECT_LT(st.hbm_eff, 0.3);
}

// ---- the database: a cpu calibration with its kernels, and one of GEMM and copy only -----

TEST(CpuStore, RoundTripKeepsKernelsRefsAndFit) {
  const std::string db = FreshDbPath("cpu_kernels.db");
  const CpuTruth tr;
  mp_calib *c = new mp_calib, *got = new mp_calib;
  *c = cpu_synthetic(tr);
  c->n_coll = sample(1.0).n_coll;  // with collectives too
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_calib_fit_stack(&ctx, c), MP_OK);
  ASSERT_EQ(mp_calib_store_save(&ctx, db.c_str(), c), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", got), MP_OK) << mp_errmsg(&ctx);
  expect_same(*c, *got);
  EXPECT_EQ(got->launch_s, c->launch_s);
  EXPECT_EQ(got->ref_bf16_tflops, c->ref_bf16_tflops);
  EXPECT_EQ(got->ref_fp8_tflops, c->ref_fp8_tflops);
  EXPECT_EQ(got->ref_hbm_GBps, c->ref_hbm_GBps);
  ASSERT_EQ(got->n_attn, c->n_attn);
  for (int i = 0; i < c->n_attn; i++) {
    EXPECT_EQ(got->attn[i].backward, c->attn[i].backward);
    EXPECT_EQ(got->attn[i].T, c->attn[i].T);
    EXPECT_EQ(got->attn[i].hd, c->attn[i].hd);
    EXPECT_EQ(got->attn[i].flops_per_s, c->attn[i].flops_per_s);
  }
  ASSERT_EQ(got->n_bw, 2 * MP_CALIB_BW_COUNT);  // more than the cuda five, every kernel
  for (int i = 0; i < c->n_bw; i++) {
    EXPECT_EQ(got->bw[i].kernel, c->bw[i].kernel) << i;
    EXPECT_EQ(got->bw[i].elems, c->bw[i].elems) << i;
    EXPECT_EQ(got->bw[i].GBps, c->bw[i].GBps) << i;
  }
  EXPECT_EQ(memcmp(&got->fit, &c->fit, sizeof c->fit), 0);
  EXPECT_EQ(got->n_f8, 0);
  EXPECT_STREQ(got->gpu_name, "");
  // applied from the file, the same stack as from memory
  mp_stack_profile a, b;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cpu", &a), MP_OK);
  b = a;
  ASSERT_EQ(mp_calib_apply_stack(&ctx, c, &a, nullptr), MP_OK);
  ASSERT_EQ(mp_calib_apply_stack(&ctx, got, &b, nullptr), MP_OK);
  EXPECT_EQ(memcmp(&a, &b, sizeof a), 0);
  delete c;
  delete got;
}

TEST(CpuStore, GemmAndCopyOnlyLoadsWithoutAFit) {
  // The rows of a cpu calibration without kernel rows: GEMM fwd and bwd, copy,
  // collectives. It loads with no kernels and no fit, and applies with the largest GEMM
  // rate as the peak and the stated meshplan-cpu stack.
  const std::string db = FreshDbPath("cpu_old.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, db.c_str(), &st), MP_OK);
  mp_store_close(st);
  sqlite3 *h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  const char *sql =
      "CREATE TABLE calibrations (id INTEGER NOT NULL, created_at TEXT NOT NULL, device TEXT NOT NULL,"
      " host TEXT NOT NULL, threads INTEGER NOT NULL, world INTEGER NOT NULL, key TEXT NOT NULL,"
      " group_size INTEGER NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL);"
      "INSERT INTO calibrations VALUES (1, '2026-10-01T10:00:00Z', 'cpu', 'old', 2, 2, 'gemm.fwd.256x64x192', 1,"
      " 1.25e10, 'FLOP/s');"
      "INSERT INTO calibrations VALUES (1, '2026-10-01T10:00:00Z', 'cpu', 'old', 2, 2, 'gemm.bwd.256x64x192', 1,"
      " 1.5e10, 'FLOP/s');"
      "INSERT INTO calibrations VALUES (1, '2026-10-01T10:00:00Z', 'cpu', 'old', 2, 2, 'copy', 1, 9.75, 'GB/s');"
      "INSERT INTO calibrations VALUES (1, '2026-10-01T10:00:00Z', 'cpu', 'old', 2, 2, 'all_reduce.alpha', 2,"
      " 2e-6, 's');"
      "INSERT INTO calibrations VALUES (1, '2026-10-01T10:00:00Z', 'cpu', 'old', 2, 2, 'all_reduce.beta', 2,"
      " 3.0, 'GB/s');";
  ASSERT_EQ(sqlite3_exec(h, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(h);
  sqlite3_close(h);
  mp_calib *c = new mp_calib;
  ASSERT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(c->n_gemm, 2);
  EXPECT_EQ(c->gemm[1].pass, MP_CALIB_GEMM_BWD);
  EXPECT_EQ(c->n_attn, 0);
  EXPECT_EQ(c->n_bw, 0);
  EXPECT_EQ(c->launch_s, 0.0);
  EXPECT_EQ(c->ref_bf16_tflops, 0.0);
  EXPECT_EQ(c->fit.gemm_eff_max, 0.0);
  mp_cluster cl;
  ASSERT_EQ(mp_cluster_load(&ctx, "cpu-local", &cl), MP_OK);
  mp_stack_profile s0, s1;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cpu", &s0), MP_OK);
  s1 = s0;
  const mp_calib_run run = tiny_run();
  ASSERT_EQ(mp_calib_apply_checked(&ctx, c, &cl.gpu, &cl), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_calib_apply_stack_run(&ctx, c, &run, &s1, nullptr), MP_OK);
  EXPECT_NEAR(cl.gpu.peak_tflops[MP_DTYPE_BF16], 0.015, 1e-15);
  EXPECT_EQ(cl.gpu.hbm_GBps, 9.75);
  EXPECT_EQ(cl.intra_node_GBps_per_gpu, 3.0);
  EXPECT_EQ(memcmp(&s0, &s1, sizeof s0), 0);
  char line[768];
  mp_calib_summary(c, line, sizeof line);
  EXPECT_EQ(strstr(line, "gemm_eff_max"), nullptr) << line;
  EXPECT_NE(strstr(line, "GEMM 15.00 GFLOP/s"), nullptr) << line;
  delete c;
}

// ---- measuring on one rank ----------------------------------------------------------

TEST(CalibMeasure, DefaultPointsAreTheDocumentedOnes) {
  mp_calib_options o, q;
  mp_calib_options_init_cpu(&o, 0);
  mp_calib_options_init_cpu(&q, 1);
  EXPECT_EQ(o.reps, 5);
  EXPECT_EQ(o.n_gemm, 45);  // 15 shapes x fwd, dgrad, wgrad
  EXPECT_EQ(o.n_attn, 5);
  EXPECT_EQ(o.n_bw, 3 * MP_CALIB_BW_COUNT);  // every kernel at three sizes
  EXPECT_EQ(o.copy_bytes, 64 << 20);
  EXPECT_EQ(q.reps, 3);
  EXPECT_EQ(q.n_gemm, 12);
  EXPECT_EQ(q.n_attn, 2);
  EXPECT_EQ(q.n_bw, MP_CALIB_BW_COUNT);
  // the tiny models' own shapes are among the defaults: gate_proj forward, attention
  int gate = 0;
  for (int i = 0; i < o.n_gemm; i++)
    gate += o.gemm[i].pass == MP_CALIB_GEMM_FWD && o.gemm[i].N == 256 && o.gemm[i].K == 64 && o.gemm[i].M == 192;
  EXPECT_EQ(gate, 1);
  EXPECT_EQ(o.attn[0].T, 64);
  EXPECT_EQ(o.attn[0].hd, 8);
}

TEST(CalibMeasure, SingleRankMeasuresEveryKernelGroupAndFits) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mp_comm *comm = nullptr;
  ASSERT_EQ(mp_comm_create_single(&ctx, &mesh, &comm), MP_OK);
  const mp_backend *be = mp_backend_cpu();
  mp_kctx kc = {&ctx, nullptr, 0};
  ASSERT_EQ(be->init(&kc, 0), MP_OK);
  mp_calib_options *o = new mp_calib_options;
  mp_calib_options_init_cpu(o, 1);
  o->reps = 1;
  o->n_gemm = 3;
  o->gemm[0] = {MP_CALIB_GEMM_FWD, 32, 16, 24};
  o->gemm[1] = {MP_CALIB_GEMM_WGRAD, 64, 32, 48};
  o->gemm[2] = {MP_CALIB_GEMM_BWD, 32, 16, 24};
  o->n_attn = 1;
  o->attn[0] = {1, 16, 2, 1, 8};
  o->n_bw = MP_CALIB_BW_COUNT;  // every kernel, 8 x 16 (RoPE: two heads of 8)
  for (int k = 0; k < MP_CALIB_BW_COUNT; k++) o->bw[k] = {k, 8, 16, 8};
  o->copy_bytes = 1 << 20;
  mp_calib *c = new mp_calib;
  ASSERT_EQ(mp_calib_measure(&ctx, comm, be, &kc, o, c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(c->world, 1);
  EXPECT_GE(c->threads, 1);
  EXPECT_STREQ(c->device, "cpu");
  EXPECT_GT(c->launch_s, 0);
  ASSERT_EQ(c->n_gemm, 3);
  EXPECT_EQ(c->gemm[1].pass, MP_CALIB_GEMM_WGRAD);
  EXPECT_EQ(c->gemm[1].K, 32);
  EXPECT_EQ(c->gemm[2].pass, MP_CALIB_GEMM_BWD);
  for (int i = 0; i < 3; i++) EXPECT_GT(c->gemm[i].flops_per_s, 0) << i;
  ASSERT_EQ(c->n_attn, 2);
  EXPECT_EQ(c->attn[0].backward, 0);
  EXPECT_EQ(c->attn[1].backward, 1);
  EXPECT_GT(c->attn[1].flops_per_s, 0);
  ASSERT_EQ(c->n_bw, MP_CALIB_BW_COUNT);
  for (int k = 0; k < MP_CALIB_BW_COUNT; k++) {
    EXPECT_EQ(c->bw[k].kernel, k);
    EXPECT_EQ(c->bw[k].elems, 128.0);
    EXPECT_GT(c->bw[k].GBps, 0) << mp_calib_bw_name(k);
  }
  EXPECT_GT(c->copy_GBps, 0);
  EXPECT_EQ(c->n_coll, 0);
  // the fit ran: its references are the profile's figures, the curve below the peak
  const double fastest = c->gemm[0].flops_per_s > c->gemm[1].flops_per_s ? c->gemm[0].flops_per_s
                                                                         : c->gemm[1].flops_per_s;
  EXPECT_GE(c->ref_bf16_tflops * 1e12, fastest * (1 - 1e-12));  // the BWD point is not a curve point
  EXPECT_EQ(c->ref_hbm_GBps, c->copy_GBps);
  EXPECT_GT(c->fit.gemm_eff_max, 0);
  EXPECT_LE(c->fit.gemm_eff_max, 1.0);
  EXPECT_EQ(c->fit.fp8_gemm_eff_max, c->fit.gemm_eff_max);
  EXPECT_GT(c->fit.attention_eff, 0);
  EXPECT_GT(c->fit.hbm_eff, 0);
  EXPECT_NEAR(c->fit.kernel_overhead_us, c->launch_s * 1e6, 1e-9);
  EXPECT_EQ(mp_calib_cpu_peak_flops(c), c->ref_bf16_tflops * 1e12);

  // refused before measuring: reps 0, a RoPE head dimension that does not divide the row
  o->reps = 0;
  EXPECT_EQ(mp_calib_measure(&ctx, comm, be, &kc, o, c), MP_ERR_INVALID);
  o->reps = 1;
  o->bw[MP_CALIB_BW_ROPE_FWD].hd = 6;
  EXPECT_EQ(mp_calib_measure(&ctx, comm, be, &kc, o, c), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "RoPE"), nullptr) << mp_errmsg(&ctx);
  be->shutdown(&kc);
  mp_comm_destroy(comm);
  delete o;
  delete c;
}

}  // namespace
