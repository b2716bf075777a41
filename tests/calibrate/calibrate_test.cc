// Tests of the CPU calibration (planner/calibrate.h, planner/calib_store.h): the
// alpha-beta fit against hand-built timings, the database round trip (equal values,
// newest wins, per device, corrupt and foreign files), which profile fields
// mp_calib_apply changes, and a small single-rank measurement.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "exec/comm/comm.h"
#include "kernels/cpu/cpu.h"
#include "planner/calib_store.h"
#include "planner/calibrate.h"
#include "planner/store.h"

namespace {

std::string tmp_path(const std::string &name) {
  const char *d = getenv("TEST_TMPDIR");
  std::string p = std::string(d ? d : "/tmp") + "/" + name;
  unlink(p.c_str());
  unlink((p + "-wal").c_str());
  unlink((p + "-shm").c_str());
  return p;
}

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
  const std::string db = tmp_path("calib.db");
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
  const std::string db = tmp_path("absent.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib got;
  EXPECT_EQ(mp_calib_store_load(&ctx, db.c_str(), "cpu", &got), MP_ERR_NOT_FOUND);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "meshplan calibrate"), nullptr) << mp_errmsg(&ctx);
  EXPECT_NE(access(db.c_str(), F_OK), 0);
}

TEST(CalibStore, PlannerDatabaseWithoutCalibrationsIsNotFound) {
  const std::string db = tmp_path("planner_only.db");
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
  const std::string db = tmp_path("corrupt.db");
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
  const std::string db = tmp_path("foreign.db");
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
  const std::string db = tmp_path("unknown_key.db");
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
  c.coll[1].coll = MP_CALIB_ALL_REDUCE;  // now all_reduce at 2 and at 4 ranks
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
  const std::string db = tmp_path("load_apply.db");
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

// ---- measuring on one rank ----------------------------------------------------------

TEST(CalibMeasure, SingleRankMeasuresGemmAndCopyOnly) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mp_comm *comm = nullptr;
  ASSERT_EQ(mp_comm_create_single(&ctx, &mesh, &comm), MP_OK);
  const mp_backend *be = mp_backend_cpu();
  mp_kctx kc = {&ctx, nullptr, 0};
  ASSERT_EQ(be->init(&kc, 0), MP_OK);
  mp_calib_options o;
  mp_calib_options_init(&o);
  o.reps = 1;
  o.n_gemm = 2;
  o.gemm[0] = {0, 32, 16, 24};
  o.gemm[1] = {1, 32, 16, 24};
  o.copy_bytes = 1 << 20;
  mp_calib c;
  ASSERT_EQ(mp_calib_measure(&ctx, comm, be, &kc, &o, &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(c.world, 1);
  EXPECT_GE(c.threads, 1);
  EXPECT_STREQ(c.device, "cpu");
  ASSERT_EQ(c.n_gemm, 2);
  EXPECT_EQ(c.gemm[1].pass, MP_CALIB_GEMM_BWD);
  EXPECT_EQ(c.gemm[1].K, 16);
  EXPECT_GT(c.gemm[0].flops_per_s, 0);
  EXPECT_GT(c.gemm[1].flops_per_s, 0);
  EXPECT_GT(c.copy_GBps, 0);
  EXPECT_EQ(c.n_coll, 0);
  EXPECT_EQ(mp_calib_gemm_peak_flops(&c),
            c.gemm[0].flops_per_s > c.gemm[1].flops_per_s ? c.gemm[0].flops_per_s : c.gemm[1].flops_per_s);
  o.reps = 0;
  EXPECT_EQ(mp_calib_measure(&ctx, comm, be, &kc, &o, &c), MP_ERR_INVALID);
  be->shutdown(&kc);
  mp_comm_destroy(comm);
}

}  // namespace
