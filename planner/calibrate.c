/* Calibration of the CPU profile: measurement, alpha-beta fit, application to a profile
 * (see calibrate.h for what is measured and the model).
 *
 * Invariants: every rank of an "mpi" comm makes the same collective calls in the same
 * order (the shapes, sizes, reps and loop counts depend only on the options and the world
 * size, never on a rank's timings), so no rank can wait on a call another skips. Figures
 * that differ per rank are combined with one all-reduce each (mean for rates, max for
 * times), as int64 (comm.h has no fp64): FLOP/s and bytes/s rounded to integers,
 * times in picoseconds. */
#define _GNU_SOURCE
#include "planner/calibrate.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/progress.h"
#include "common/stats.h"
#include "planner/calib_store.h"

const char *mp_calib_coll_name(mp_calib_coll c) {
  switch (c) {
    case MP_CALIB_ALL_REDUCE: return "all_reduce";
    case MP_CALIB_ALL_GATHER: return "all_gather";
    case MP_CALIB_REDUCE_SCATTER: return "reduce_scatter";
    case MP_CALIB_ALL_TO_ALL: return "all_to_all";
    default: return "?";
  }
}

double mp_calib_bw_factor(mp_calib_coll c, int n) {
  if (n <= 1) return 0.0;
  double f = (double)(n - 1) / (double)n;
  return c == MP_CALIB_ALL_REDUCE ? 2.0 * f : f;
}

double mp_calib_lat_steps(mp_calib_coll c, int n) {
  if (n <= 1) return 0.0;
  return c == MP_CALIB_ALL_REDUCE ? 2.0 * (n - 1) : (double)(n - 1);
}

void mp_calib_options_init(mp_calib_options *o) {
  memset(o, 0, sizeof *o);
  o->reps = 5;
  /* tiny-dense at 4 sequences of 64 tokens: qkv-sized, MLP up, MLP down, LM head */
  static const int shapes[][3] = {{256, 64, 192}, {256, 192, 64}, {256, 64, 256},
                                  {512, 512, 512}, {1024, 1024, 1024}};
  int n = 0;
  for (int b = 0; b < 2; b++)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
      o->gemm[n].backward = b;
      o->gemm[n].N = shapes[i][0];
      o->gemm[n].K = shapes[i][1];
      o->gemm[n].M = shapes[i][2];
      n++;
    }
  o->n_gemm = n;
  static const double sizes[] = {256, 4096, 65536, 1048576, 8388608};
  o->n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
  memcpy(o->sizes_bytes, sizes, sizeof sizes);
  o->copy_bytes = 64 << 20;
}

/* ---- per-rank figures combined over the world ---------------------------------------- */

static mp_status world_mean(mp_ctx *ctx, mp_comm *comm, double *v) {
  int64_t x = llround(*v);
  MP_CHECK(mp_comm_all_reduce(ctx, comm, MP_GROUP_WORLD, &x, &x, 1, MP_COMM_DTYPE_INT64, MP_COMM_OP_SUM));
  *v = (double)x / (double)mp_comm_world_size(comm);
  return MP_OK;
}

static mp_status world_max_time(mp_ctx *ctx, mp_comm *comm, double *t_s) {
  int64_t ps = llround(*t_s * 1e12);
  MP_CHECK(mp_comm_all_reduce(ctx, comm, MP_GROUP_WORLD, &ps, &ps, 1, MP_COMM_DTYPE_INT64, MP_COMM_OP_MAX));
  *t_s = (double)ps * 1e-12;
  return MP_OK;
}

/* ---- GEMM ---------------------------------------------------------------------------- */

/* Small values of both signs, no denormals, no zeros (zeros could take a fast path in a
 * future kernel and flatter the rate). */
static void fill(float *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = 0.01f * (float)((int)((i * 2654435761u + seed) % 13u) - 6) + 0.003f;
}

static mp_status measure_gemm(mp_ctx *ctx, mp_comm *comm, const mp_backend *be, mp_kctx *kc, int reps,
                              int backward, int N, int K, int M, double *flops_per_s) {
  mp_status s = MP_OK;
  float *inp = NULL, *w = NULL, *out = NULL, *dinp = NULL, *dw = NULL;
  double *t = calloc((size_t)reps, sizeof *t);
  const size_t nk = (size_t)N * K, mk = (size_t)M * K, nm = (size_t)N * M;
  if (t == NULL) return mp_error(ctx, MP_ERR_NOMEM, "calibrate: out of memory");
  MP_CHECK_GOTO(be->alloc(kc, (void **)&inp, nk * sizeof(float)), s, done);
  MP_CHECK_GOTO(be->alloc(kc, (void **)&w, mk * sizeof(float)), s, done);
  MP_CHECK_GOTO(be->alloc(kc, (void **)&out, nm * sizeof(float)), s, done);
  if (backward) {
    MP_CHECK_GOTO(be->alloc(kc, (void **)&dinp, nk * sizeof(float)), s, done);
    MP_CHECK_GOTO(be->alloc(kc, (void **)&dw, mk * sizeof(float)), s, done);
    MP_CHECK_GOTO(be->memset_zero(kc, dinp, nk * sizeof(float)), s, done);
    MP_CHECK_GOTO(be->memset_zero(kc, dw, mk * sizeof(float)), s, done);
  }
  fill(inp, nk, 1);
  fill(w, mk, 2);
  fill(out, nm, 3); /* backward reads it as dout */
  /* Every rank starts together, so a multi-rank figure is the rate under full load. */
  MP_CHECK_GOTO(mp_comm_barrier(ctx, comm, MP_GROUP_WORLD), s, done);
  for (int r = -1; r < reps; r++) { /* r = -1: warm-up (page faults, thread start-up) */
    double t0 = mp_now_s();
    if (backward)
      s = be->matmul_backward(kc, dinp, dw, NULL, out, inp, w, N, K, M);
    else
      s = be->matmul_forward(kc, out, inp, w, NULL, N, K, M);
    if (s != MP_OK) goto done;
    MP_CHECK_GOTO(be->synchronize(kc), s, done);
    if (r >= 0) t[r] = mp_now_s() - t0;
  }
  {
    double flops = (backward ? 4.0 : 2.0) * N * (double)K * M;
    double tm = mp_median(t, (size_t)reps);
    *flops_per_s = tm > 0 ? flops / tm : 0.0;
  }
  MP_CHECK_GOTO(world_mean(ctx, comm, flops_per_s), s, done);
done:
  be->free(kc, inp);
  be->free(kc, w);
  be->free(kc, out);
  be->free(kc, dinp);
  be->free(kc, dw);
  free(t);
  return s;
}

/* ---- memory copy --------------------------------------------------------------------- */

static mp_status measure_copy(mp_ctx *ctx, mp_comm *comm, int reps, int64_t bytes, double *GBps) {
  char *a = malloc((size_t)bytes), *b = malloc((size_t)bytes);
  double *t = calloc((size_t)reps, sizeof *t);
  mp_status s = MP_OK;
  if (!a || !b || !t) {
    s = mp_error(ctx, MP_ERR_NOMEM, "calibrate: out of memory for a %lld-byte copy buffer", (long long)bytes);
    goto done;
  }
  memset(a, 1, (size_t)bytes);
  memset(b, 2, (size_t)bytes);
  MP_CHECK_GOTO(mp_comm_barrier(ctx, comm, MP_GROUP_WORLD), s, done);
  for (int r = -1; r < reps; r++) {
    double t0 = mp_now_s();
    /* The team of the element-wise kernels copies in contiguous slices, one per thread. */
#pragma omp parallel
    {
      int nt = omp_get_num_threads(), id = omp_get_thread_num();
      int64_t lo = bytes * id / nt, hi = bytes * (id + 1) / nt;
      memcpy(b + lo, a + lo, (size_t)(hi - lo));
    }
    if (r >= 0) t[r] = mp_now_s() - t0;
  }
  {
    double tm = mp_median(t, (size_t)reps);
    *GBps = tm > 0 ? 2.0 * (double)bytes / tm : 0.0; /* bytes/s, read + write */
  }
  MP_CHECK_GOTO(world_mean(ctx, comm, GBps), s, done);
  *GBps *= 1e-9;
done:
  free(a);
  free(b);
  free(t);
  return s;
}

/* ---- collectives --------------------------------------------------------------------- */

/* Elements each rank contributes so that the payload (sim/network.c's `bytes`) is as
 * close to `want` bytes as whole fp32 elements per rank allow. Returns the payload. */
static double payload(mp_calib_coll c, double want, int g, size_t *per_rank) {
  if (c == MP_CALIB_ALL_REDUCE) {
    size_t n = (size_t)llround(want / 4.0);
    *per_rank = n > 0 ? n : 1;
    return 4.0 * (double)*per_rank;
  }
  /* all-gather, reduce-scatter: the full tensor is g chunks; all-to-all: g blocks sent */
  size_t n = (size_t)llround(want / (4.0 * g));
  *per_rank = n > 0 ? n : 1;
  return 4.0 * (double)*per_rank * g;
}

static mp_status run_coll(mp_ctx *ctx, mp_comm *c, mp_calib_coll k, int g, size_t n, float *send, float *recv,
                          int64_t *counts, int64_t *displs) {
  switch (k) {
    case MP_CALIB_ALL_REDUCE:
      return mp_comm_all_reduce(ctx, c, MP_GROUP_DP_SHARD, send, recv, n, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM);
    case MP_CALIB_ALL_GATHER:
      return mp_comm_all_gather(ctx, c, MP_GROUP_DP_SHARD, send, recv, n, MP_COMM_DTYPE_FP32);
    case MP_CALIB_REDUCE_SCATTER:
      return mp_comm_reduce_scatter(ctx, c, MP_GROUP_DP_SHARD, send, recv, n, MP_COMM_DTYPE_FP32,
                                    MP_COMM_OP_SUM);
    case MP_CALIB_ALL_TO_ALL:
      for (int j = 0; j < g; j++) {
        counts[j] = (int64_t)n;
        displs[j] = (int64_t)n * j;
      }
      return mp_comm_all_to_all_v(ctx, c, MP_GROUP_DP_SHARD, send, counts, displs, recv, counts, displs,
                                  MP_COMM_DTYPE_FP32);
    default:
      return mp_error(ctx, MP_ERR_INTERNAL, "calibrate: unknown collective %d", (int)k);
  }
}

/* Calls per timed loop: enough that a small message's loop lasts well beyond the clock's
 * and the barrier's jitter, one call for the large ones. Depends on the size only, so
 * every rank runs the same count. */
static int loop_calls(double bytes) {
  double n = ceil(4194304.0 / bytes);
  return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

static mp_status measure_group(mp_ctx *ctx, mp_comm *world, int g, const mp_calib_options *o, mp_calib *out) {
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mesh.size[MP_DIM_DP_REPLICATE] = mp_comm_world_size(world) / g;
  mesh.size[MP_DIM_DP_SHARD] = g;
  mp_comm *c = NULL;
  MP_CHECK(mp_comm_create_mpi(ctx, &mesh, &c));
  mp_status s = MP_OK;
  double max_bytes = 0;
  for (int i = 0; i < o->n_sizes; i++)
    if (o->sizes_bytes[i] > max_bytes) max_bytes = o->sizes_bytes[i];
  /* the largest buffer any collective needs: a full tensor, rounded up per rank */
  size_t cap = (size_t)(max_bytes / 4.0) + (size_t)g + 1;
  float *send = malloc(cap * sizeof(float)), *recv = malloc(cap * sizeof(float));
  int64_t *counts = malloc((size_t)g * sizeof *counts), *displs = malloc((size_t)g * sizeof *displs);
  double *t = calloc((size_t)o->reps, sizeof *t);
  if (!send || !recv || !counts || !displs || !t) {
    s = mp_error(ctx, MP_ERR_NOMEM, "calibrate: out of memory for collective buffers");
    goto done;
  }
  fill(send, cap, 4);
  memset(recv, 0, cap * sizeof(float));
  for (int k = 0; k < MP_CALIB_COLL_COUNT; k++) {
    if (out->n_coll >= MP_CALIB_MAX_GROUPS * MP_CALIB_COLL_COUNT) break;
    mp_calib_coll_fit *f = &out->coll[out->n_coll];
    memset(f, 0, sizeof *f);
    f->coll = (mp_calib_coll)k;
    f->group_size = g;
    for (int i = 0; i < o->n_sizes && i < MP_CALIB_MAX_SIZES; i++) {
      size_t n;
      double bytes = payload(f->coll, o->sizes_bytes[i], g, &n);
      int calls = loop_calls(bytes);
      MP_CHECK_GOTO(run_coll(ctx, c, f->coll, g, n, send, recv, counts, displs), s, done); /* warm-up */
      for (int r = 0; r < o->reps; r++) {
        MP_CHECK_GOTO(mp_comm_barrier(ctx, c, MP_GROUP_WORLD), s, done);
        double t0 = mp_now_s();
        for (int j = 0; j < calls; j++)
          MP_CHECK_GOTO(run_coll(ctx, c, f->coll, g, n, send, recv, counts, displs), s, done);
        t[r] = (mp_now_s() - t0) / calls;
      }
      double tm = mp_median(t, (size_t)o->reps);
      MP_CHECK_GOTO(world_max_time(ctx, c, &tm), s, done);
      f->bytes[f->n_sizes] = bytes;
      f->time_s[f->n_sizes] = tm;
      f->n_sizes++;
    }
    MP_CHECK_GOTO(mp_calib_fit(ctx, f), s, done);
    out->n_coll++;
  }
done:
  free(send);
  free(recv);
  free(counts);
  free(displs);
  free(t);
  mp_comm_destroy(c);
  return s;
}

mp_status mp_calib_fit(mp_ctx *ctx, mp_calib_coll_fit *f) {
  const int g = f->group_size;
  const double bf = mp_calib_bw_factor(f->coll, g), cs = mp_calib_lat_steps(f->coll, g);
  if (f->n_sizes < 1 || g < 2)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: a %s fit needs a group of >= 2 ranks and >= 1 size",
                    mp_calib_coll_name(f->coll));
  /* Minimise sum_i (1 - u_i b - v_i a)^2 with u_i = x_i / t_i, v_i = c / t_i, x_i = f bytes_i:
   * the relative error of t = x b + c a, b = 1/beta (s/byte), a = alpha (s). */
  double suu = 0, suv = 0, svv = 0, su = 0, sv = 0;
  for (int i = 0; i < f->n_sizes; i++) {
    if (!(f->time_s[i] > 0) || !(f->bytes[i] > 0))
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: %s at %.0f bytes took %g s; sizes and times must be > 0",
                      mp_calib_coll_name(f->coll), f->bytes[i], f->time_s[i]);
    double x = bf * f->bytes[i];
    f->busbw_GBps[i] = x / f->time_s[i] * 1e-9;
    double u = x / f->time_s[i], v = cs / f->time_s[i];
    suu += u * u;
    suv += u * v;
    svv += v * v;
    su += u;
    sv += v;
  }
  double det = suu * svv - suv * suv, a = 0, b = 0;
  if (f->n_sizes >= 2 && det > 1e-12 * suu * svv) {
    b = (su * svv - sv * suv) / det;
    a = (suu * sv - suv * su) / det;
  }
  if (!(a > 0) || !(b > 0)) { /* one size, or the intercept came out negative: through the origin */
    a = 0;
    b = su / suu;
  }
  f->alpha_s = a;
  f->beta_GBps = 1.0 / b * 1e-9;
  return MP_OK;
}

static void now_iso(char *buf, size_t cap) {
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

mp_status mp_calib_measure(mp_ctx *ctx, mp_comm *comm, const mp_backend *be, mp_kctx *kc,
                           const mp_calib_options *opts, mp_calib *out) {
  mp_calib_options def;
  if (opts == NULL) {
    mp_calib_options_init(&def);
    opts = &def;
  }
  if (opts->reps < 1) return mp_error(ctx, MP_ERR_INVALID, "calibrate: reps %d; give at least 1", opts->reps);
  if (strcmp(be->name, "cpu") != 0)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "calibrate: backend %s; only the cpu backend is calibrated in this "
                    "build", be->name);
  mp_calib_options dflt;
  mp_calib_options_init(&dflt);
  memset(out, 0, sizeof *out);
  now_iso(out->created_at, sizeof out->created_at);
  snprintf(out->device, sizeof out->device, "%s", be->name);
  if (gethostname(out->host, sizeof out->host) != 0) snprintf(out->host, sizeof out->host, "unknown");
  out->host[sizeof out->host - 1] = '\0';
  out->threads = omp_get_max_threads();
  out->world = mp_comm_world_size(comm);

  int n_gemm = opts->n_gemm > 0 ? opts->n_gemm : dflt.n_gemm;
  if (n_gemm > MP_CALIB_MAX_GEMM) n_gemm = MP_CALIB_MAX_GEMM;
  for (int i = 0; i < n_gemm; i++) {
    const int bwd = opts->n_gemm > 0 ? opts->gemm[i].backward : dflt.gemm[i].backward;
    const int N = opts->n_gemm > 0 ? opts->gemm[i].N : dflt.gemm[i].N;
    const int K = opts->n_gemm > 0 ? opts->gemm[i].K : dflt.gemm[i].K;
    const int M = opts->n_gemm > 0 ? opts->gemm[i].M : dflt.gemm[i].M;
    if (N < 1 || K < 1 || M < 1)
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: GEMM shape %dx%dx%d; every size must be >= 1", N, K, M);
    mp_calib_gemm *e = &out->gemm[out->n_gemm];
    e->backward = bwd;
    e->N = N;
    e->K = K;
    e->M = M;
    MP_CHECK(measure_gemm(ctx, comm, be, kc, opts->reps, bwd, N, K, M, &e->flops_per_s));
    out->n_gemm++;
  }
  MP_CHECK(measure_copy(ctx, comm, opts->reps, opts->copy_bytes > 0 ? opts->copy_bytes : dflt.copy_bytes,
                        &out->copy_GBps));

  const int W = out->world;
  if (W > 1 && strcmp(mp_comm_backend_name(comm), "mpi") == 0) {
    mp_calib_options o = *opts;
    if (o.n_sizes <= 0) {
      o.n_sizes = dflt.n_sizes;
      memcpy(o.sizes_bytes, dflt.sizes_bytes, sizeof o.sizes_bytes);
    }
    int groups[MP_CALIB_MAX_GROUPS], n_groups = 0;
    for (int g = 2; g < W && n_groups < MP_CALIB_MAX_GROUPS - 1; g *= 2)
      if (W % g == 0) groups[n_groups++] = g;
    groups[n_groups++] = W;
    for (int i = 0; i < n_groups; i++) MP_CHECK(measure_group(ctx, comm, groups[i], &o, out));
  }
  return MP_OK;
}

/* ---- use by the simulator ------------------------------------------------------------ */

double mp_calib_gemm_peak_flops(const mp_calib *c) {
  double p = 0;
  for (int i = 0; i < c->n_gemm; i++)
    if (c->gemm[i].flops_per_s > p) p = c->gemm[i].flops_per_s;
  return p;
}

const mp_calib_coll_fit *mp_calib_link_fit(const mp_calib *c) {
  const mp_calib_coll_fit *best = NULL;
  for (int i = 0; i < c->n_coll; i++)
    if (c->coll[i].coll == MP_CALIB_ALL_REDUCE && c->coll[i].beta_GBps > 0 &&
        (best == NULL || c->coll[i].group_size > best->group_size))
      best = &c->coll[i];
  return best;
}

static void apply_gpu(const mp_calib *c, mp_gpu *g, const mp_calib_coll_fit *link) {
  double peak = mp_calib_gemm_peak_flops(c);
  if (peak > 0)
    for (int d = 0; d < MP_DTYPE_COUNT; d++) g->peak_tflops[d] = peak * 1e-12;
  if (c->copy_GBps > 0) g->hbm_GBps = c->copy_GBps;
  if (link) g->nvlink_GBps_per_dir = link->beta_GBps;
  snprintf(g->source, sizeof g->source, "calibration #%lld of %s (%d threads x %d ranks) on %s at %s",
           (long long)c->id, c->device, c->threads, c->world, c->host, c->created_at);
}

void mp_calib_apply(const mp_calib *c, mp_gpu *gpu, mp_cluster *cluster) {
  const mp_calib_coll_fit *link = mp_calib_link_fit(c);
  if (gpu) apply_gpu(c, gpu, link);
  if (cluster) {
    apply_gpu(c, &cluster->gpu, link);
    if (link) {
      /* The simulator has one intra-node bandwidth and latency for every group size and
       * collective: the all-reduce fit of the largest group stands for all of them (the
       * other fits stay in the database). */
      cluster->intra_node_GBps_per_gpu = link->beta_GBps;
      cluster->intra_node_latency_us = link->alpha_s * 1e6;
    }
  }
}

mp_status mp_calib_apply_checked(mp_ctx *ctx, const mp_calib *c, mp_gpu *gpu, mp_cluster *cluster) {
  const int cpu = strcmp(c->device, "cpu") == 0;
  const mp_gpu *targets[2] = {gpu, cluster ? &cluster->gpu : NULL};
  for (int i = 0; i < 2; i++)
    if (targets[i] && cpu != mp_gpu_is_cpu(targets[i]))
      return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld was measured on %s but profile %s is %s; simulate "
                      "with a CPU profile (--cluster cpu-local or --gpu cpu) or drop --calibration",
                      (long long)c->id, c->device, targets[i]->name, cpu ? "a GPU" : "the CPU");
  mp_calib_apply(c, gpu, cluster);
  return MP_OK;
}

mp_status mp_calib_load_apply(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                              mp_cluster *cluster) {
  mp_calib c;
  MP_CHECK(mp_calib_store_load(ctx, db_path, device, &c));
  return mp_calib_apply_checked(ctx, &c, gpu, cluster);
}

void mp_calib_summary(const mp_calib *c, char *buf, size_t cap) {
  const mp_calib_coll_fit *link = mp_calib_link_fit(c);
  int n = snprintf(buf, cap, "#%lld %s on %s, %d thread%s x %d rank%s, %s: GEMM %.2f GFLOP/s, copy %.2f GB/s",
                   (long long)c->id, c->device, c->host, c->threads, c->threads == 1 ? "" : "s", c->world,
                   c->world == 1 ? "" : "s", c->created_at, mp_calib_gemm_peak_flops(c) * 1e-9, c->copy_GBps);
  if (n < 0 || (size_t)n >= cap) return;
  if (link)
    snprintf(buf + n, cap - (size_t)n, ", link %.3f GB/s %.2f us (all_reduce, %d ranks)", link->beta_GBps,
             link->alpha_s * 1e6, link->group_size);
  else
    snprintf(buf + n, cap - (size_t)n, ", link not measured (1 rank)");
}
