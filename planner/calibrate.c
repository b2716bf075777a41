/* Calibration: the CPU measurement, the alpha-beta fit, the CUDA fits (the GEMM curve,
 * the by-shape correction, attention, HBM, float8), and the application to a profile
 * and a stack (see calibrate.h for what is measured and the models). The measurement on
 * the GPU is calibrate_cuda.c.
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

const char *mp_calib_gemm_pass_name(int pass) {
  switch (pass) {
    case MP_CALIB_GEMM_FWD: return "fwd";
    case MP_CALIB_GEMM_BWD: return "bwd";
    case MP_CALIB_GEMM_DGRAD: return "dgrad";
    case MP_CALIB_GEMM_WGRAD: return "wgrad";
    default: return "?";
  }
}

double mp_calib_gemm_flops(int pass, int N, int K, int M) {
  return (pass == MP_CALIB_GEMM_BWD ? 4.0 : 2.0) * (double)N * (double)K * (double)M;
}

double mp_calib_attn_flops(int backward, int B, int T, int nh, int hd) {
  /* exec/schedule.c attn_fwd_flops: 2 x tokens x seq x heads x hd, tokens = B T */
  double f = 2.0 * (double)B * (double)T * (double)T * (double)nh * (double)hd;
  return backward ? 2.0 * f : f;
}

const char *mp_calib_bw_name(int k) {
  switch (k) {
    case MP_CALIB_BW_RMSNORM_FWD: return "rmsnorm_fwd";
    case MP_CALIB_BW_RMSNORM_BWD: return "rmsnorm_bwd";
    case MP_CALIB_BW_SWIGLU_FWD: return "swiglu_fwd";
    case MP_CALIB_BW_SWIGLU_BWD: return "swiglu_bwd";
    case MP_CALIB_BW_ADAMW: return "adamw";
    default: return "?";
  }
}

double mp_calib_bw_bytes(int k, double elems) {
  /* exec/schedule.c: norm_fwd 4e, norm_bwd 6e, swiglu 6e / 10e, BYTES_ADAMW 28 */
  static const double per[MP_CALIB_BW_COUNT] = {4.0, 6.0, 6.0, 10.0, 28.0};
  return k >= 0 && k < MP_CALIB_BW_COUNT ? per[k] * elems : 0.0;
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
      o->gemm[n].pass = b ? MP_CALIB_GEMM_BWD : MP_CALIB_GEMM_FWD;
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

void mp_calib_options_init_cuda(mp_calib_options *o, int quick) {
  memset(o, 0, sizeof *o);
  o->reps = quick ? 3 : 7;
  /* Linear (in K, out M) of Llama models: q/o of 1B-, 8B- and 70B-class models, the MLP
   * up/down of the 1B (2048 x 8192) and 8B (4096 x 14336) models, a 32000 LM head. */
  static const int km[][2] = {{1024, 1024}, {2048, 2048}, {2048, 8192},  {8192, 2048}, {4096, 4096},
                               {4096, 14336}, {14336, 4096}, {4096, 32000}, {8192, 8192}};
  static const int km_quick[][2] = {{2048, 2048}, {4096, 4096}, {4096, 14336}};
  static const int tokens[] = {512, 2048, 8192}, tokens_quick[] = {2048};
  static const int passes[] = {MP_CALIB_GEMM_FWD, MP_CALIB_GEMM_DGRAD, MP_CALIB_GEMM_WGRAD};
  const int (*shapes)[2] = quick ? km_quick : km;
  const int n_shapes = quick ? 3 : 9, n_tok = quick ? 1 : 3;
  const int *tok = quick ? tokens_quick : tokens;
  int n = 0;
  for (int t = 0; t < n_tok; t++)
    for (int i = 0; i < n_shapes; i++)
      for (int p = 0; p < 3 && n < MP_CALIB_MAX_GEMM; p++) {
        o->gemm[n].pass = passes[p];
        o->gemm[n].N = tok[t];
        o->gemm[n].K = shapes[i][0];
        o->gemm[n].M = shapes[i][1];
        n++;
      }
  o->n_gemm = n;
  /* 16384 tokens per call at every sequence length, GQA 2:1 as the 1B model; hd 64 with
   * twice the heads keeps the width */
  static const int attn[][5] = {{16, 1024, 16, 8, 128}, {8, 2048, 16, 8, 128}, {4, 4096, 16, 8, 128},
                                {2, 8192, 16, 8, 128},  {8, 2048, 32, 8, 64}};
  static const int attn_quick[][5] = {{8, 2048, 16, 8, 128}, {2, 8192, 16, 8, 128}};
  o->n_attn = quick ? 2 : 5;
  for (int i = 0; i < o->n_attn; i++) {
    const int *a = quick ? attn_quick[i] : attn[i];
    o->attn[i].B = a[0];
    o->attn[i].T = a[1];
    o->attn[i].nh = a[2];
    o->attn[i].nkv = a[3];
    o->attn[i].hd = a[4];
  }
  static const int f8_km[][2] = {{4096, 4096}, {4096, 14336}, {14336, 4096}};
  static const int f8_tok[] = {2048, 8192};
  n = 0;
  for (int t = 0; t < (quick ? 1 : 2); t++)
    for (int i = 0; i < (quick ? 2 : 3); i++) {
      o->f8[n].N = f8_tok[quick ? 1 : t];
      o->f8[n].K = f8_km[i][0];
      o->f8[n].M = f8_km[i][1];
      n++;
    }
  o->n_f8 = n;
  /* training-sized tensors, each far beyond the 50 MB L2 of an H100 */
  o->norm_rows = 8192;
  o->norm_cols = 4096;
  o->swiglu_elems = (int64_t)8192 * 14336;
  o->adamw_elems = (int64_t)1 << 26;
  o->copy_bytes = (int64_t)256 << 20;
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
                              int pass, int N, int K, int M, double *flops_per_s) {
  const int backward = pass == MP_CALIB_GEMM_BWD;
  if (pass != MP_CALIB_GEMM_FWD && !backward)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: GEMM pass %s; the cpu calibration times fwd and bwd",
                    mp_calib_gemm_pass_name(pass));
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
    double flops = mp_calib_gemm_flops(pass, N, K, M);
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
  if (strcmp(be->name, "cuda") == 0) {
    /* One GPU per calibration: the figures are per device, and its collectives (NCCL)
     * are not the CPU calibration's MPI ones. opts NULL: the CUDA defaults. */
    if (mp_comm_world_size(comm) != 1)
      return mp_error(ctx, MP_ERR_USAGE, "calibrate --device cuda measures one GPU; run it as one process "
                      "(without mpirun), once per GPU type");
    MP_CHECK(mp_calib_measure_cuda(ctx, be, kc, opts, out));
    return mp_calib_fit_stack(ctx, out);
  }
  mp_calib_options def;
  if (opts == NULL) {
    mp_calib_options_init(&def);
    opts = &def;
  }
  if (opts->reps < 1) return mp_error(ctx, MP_ERR_INVALID, "calibrate: reps %d; give at least 1", opts->reps);
  if (strcmp(be->name, "cpu") != 0)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "calibrate: backend %s; choose the cpu or cuda backend", be->name);
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
    const int bwd = opts->n_gemm > 0 ? opts->gemm[i].pass : dflt.gemm[i].pass;
    const int N = opts->n_gemm > 0 ? opts->gemm[i].N : dflt.gemm[i].N;
    const int K = opts->n_gemm > 0 ? opts->gemm[i].K : dflt.gemm[i].K;
    const int M = opts->n_gemm > 0 ? opts->gemm[i].M : dflt.gemm[i].M;
    if (N < 1 || K < 1 || M < 1)
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: GEMM shape %dx%dx%d; every size must be >= 1", N, K, M);
    mp_calib_gemm *e = &out->gemm[out->n_gemm];
    e->pass = bwd;
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

/* ---- the CUDA fits -------------------------------------------------------------------- */

static int is_bf16_pass(int pass) {
  return pass == MP_CALIB_GEMM_FWD || pass == MP_CALIB_GEMM_DGRAD || pass == MP_CALIB_GEMM_WGRAD;
}

/* What the simulator calls compute: the measured time less the launch figure that it
 * adds to every op. At least half the time stays: the launch figure is another kernel's
 * median, and its noise must not leave a point with no time at all. */
static double compute_time(double t_s, double overhead_s) {
  double c = t_s - overhead_s;
  return c > 0.5 * t_s ? c : 0.5 * t_s;
}

/* The curve's compute time for a GEMM of `flops` and size x = N K M. */
static double curve_time(double flops, double x, double peak, double eff_max, double half) {
  return flops / (peak * eff_max) * (1.0 + half / x);
}

mp_status mp_calib_fit_gemm_curve(mp_ctx *ctx, const mp_calib_gemm *g, int n, double peak_flops,
                                  double overhead_s, double *eff_max, double *half_mnk, double *rms_rel) {
  if (n < 1 || !(peak_flops > 0))
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: the GEMM curve needs >= 1 point and a peak (got %d, %g)", n,
                    peak_flops);
  /* pred/meas of point i = a p_i + b q_i with a = 1/E, b = h/E, y_i = tc_i peak / flops_i
   * (the inverse of its efficiency), p_i = 1/y_i, q_i = 1/(x_i y_i): minimise
   * sum (a p_i + b q_i - 1)^2, the relative error of the compute time. */
  double spp = 0, spq = 0, sqq = 0, sp = 0, sq = 0;
  for (int i = 0; i < n; i++) {
    const double flops = mp_calib_gemm_flops(g[i].pass, g[i].N, g[i].K, g[i].M);
    const double x = (double)g[i].N * g[i].K * g[i].M;
    if (!(g[i].flops_per_s > 0) || !(x > 0))
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: GEMM %s %dx%dx%d has rate %g; rates must be > 0",
                      mp_calib_gemm_pass_name(g[i].pass), g[i].N, g[i].K, g[i].M, g[i].flops_per_s);
    const double tc = compute_time(flops / g[i].flops_per_s, overhead_s);
    const double y = tc * peak_flops / flops, p = 1.0 / y, q = 1.0 / (x * y);
    spp += p * p;
    spq += p * q;
    sqq += q * q;
    sp += p;
    sq += q;
  }
  double det = spp * sqq - spq * spq, a = 0, b = 0;
  if (n >= 2 && det > 1e-12 * spp * sqq) {
    a = (sp * sqq - sq * spq) / det;
    b = (spp * sq - spq * sp) / det;
  }
  if (!(a > 0) || !(b > 0)) { /* one point, one size, or small GEMMs faster than the line: no knee */
    b = 0;
    a = sp / spp;
  }
  double E = 1.0 / a, h = b / a;
  if (E > 1.0) {
    /* The datasheet peak is the ceiling: E = 1 (a = 1), h refitted alone. */
    E = 1.0;
    h = sqq > 0 ? (sq - spq) / sqq : 0.0; /* argmin_b sum (p + b q - 1)^2 */
    if (!(h > 0)) h = 0;
  }
  *eff_max = E;
  *half_mnk = h;
  if (rms_rel) {
    double se = 0;
    for (int i = 0; i < n; i++) {
      const double flops = mp_calib_gemm_flops(g[i].pass, g[i].N, g[i].K, g[i].M);
      const double x = (double)g[i].N * g[i].K * g[i].M, t = flops / g[i].flops_per_s;
      const double e = (curve_time(flops, x, peak_flops, E, h) + overhead_s - t) / t;
      se += e * e;
    }
    *rms_rel = sqrt(se / n);
  }
  return MP_OK;
}

/* The schedule's (variant, m, n, k) of a Linear GEMM (exec/schedule.c linear_fwd /
 * linear_bwd): forward [N, K] x [K, M]; dgrad [N, M] x [M, K]; wgrad [M, N] x [N, K]. */
static void sched_shape(int pass, int N, int K, int M, int *variant, double *m, double *n, double *k) {
  switch (pass) {
    case MP_CALIB_GEMM_DGRAD:
      *variant = MP_VAR_DGRAD, *m = N, *n = K, *k = M;
      break;
    case MP_CALIB_GEMM_WGRAD:
      *variant = MP_VAR_WGRAD, *m = M, *n = K, *k = N;
      break;
    default:
      *variant = MP_VAR_FWD, *m = N, *n = M, *k = K;
      break;
  }
}

/* Point i of the table (bf16 point gi of c): log2(measured / curve efficiency). */
static void table_point(const mp_calib *c, const mp_calib_gemm *g, double peak, mp_gemm_table_point *pt) {
  const double flops = mp_calib_gemm_flops(g->pass, g->N, g->K, g->M);
  const double x = (double)g->N * g->K * g->M;
  const double tc = compute_time(flops / g->flops_per_s, c->launch_s);
  const double tcurve = curve_time(flops, x, peak, c->fit.gemm_eff_max, c->fit.gemm_eff_half_mnk);
  int variant;
  double m, n, k;
  sched_shape(g->pass, g->N, g->K, g->M, &variant, &m, &n, &k);
  pt->variant = variant;
  pt->lm = log2(m);
  pt->ln = log2(n);
  pt->lk = log2(k);
  pt->log2_ratio = log2(tcurve / tc);
}

void mp_calib_gemm_table(const mp_calib *c, mp_gemm_table *t) {
  memset(t, 0, sizeof *t);
  const double peak = c->ref_bf16_tflops * 1e12;
  if (!(peak > 0) || !(c->fit.gemm_eff_max > 0)) return;
  for (int i = 0; i < c->n_gemm && t->n < MP_GEMM_TABLE_MAX; i++)
    if (is_bf16_pass(c->gemm[i].pass) && c->gemm[i].flops_per_s > 0) table_point(c, &c->gemm[i], peak, &t->pt[t->n++]);
}

/* Leave-one-out check of the by-shape correction: each bf16 point predicted by the curve
 * times the correction of the other points, against its measurement (overhead included).
 * Returns the rms relative error; a point with no neighbour is predicted by the curve. */
static double table_loo_rms(const mp_calib *c) {
  mp_gemm_table *all = malloc(sizeof *all), *rest = malloc(sizeof *rest);
  double se = 0;
  int n = 0;
  if (all && rest) {
    mp_calib_gemm_table(c, all);
    const double peak = c->ref_bf16_tflops * 1e12;
    int j = 0; /* index of the current point in `all` (same order as the bf16 points) */
    for (int i = 0; i < c->n_gemm; i++) {
      const mp_calib_gemm *g = &c->gemm[i];
      if (!is_bf16_pass(g->pass) || !(g->flops_per_s > 0)) continue;
      rest->n = 0;
      for (int q = 0; q < all->n; q++)
        if (q != j) rest->pt[rest->n++] = all->pt[q];
      const double flops = mp_calib_gemm_flops(g->pass, g->N, g->K, g->M);
      const double x = (double)g->N * g->K * g->M, t = flops / g->flops_per_s;
      int variant;
      double m, nn, k;
      sched_shape(g->pass, g->N, g->K, g->M, &variant, &m, &nn, &k);
      const double f = mp_gemm_table_factor(rest, variant, m, nn, k);
      const double pred = curve_time(flops, x, peak, c->fit.gemm_eff_max, c->fit.gemm_eff_half_mnk) / f + c->launch_s;
      se += (pred - t) / t * ((pred - t) / t);
      n++;
      j++;
    }
  }
  free(all);
  free(rest);
  return n > 0 ? sqrt(se / n) : 0.0;
}

mp_status mp_calib_fit_stack(mp_ctx *ctx, mp_calib *c) {
  mp_calib_stack_fit *f = &c->fit;
  memset(f, 0, sizeof *f);
  const double peak = c->ref_bf16_tflops * 1e12, ovh = c->launch_s > 0 ? c->launch_s : 0.0;
  if (!(peak > 0))
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: calibration of %s has no reference bf16 peak; it needs "
                    "the GPU profile it is relative to", c->gpu_name[0] ? c->gpu_name : c->device);
  mp_calib_gemm pts[MP_CALIB_MAX_GEMM];
  int n = 0;
  for (int i = 0; i < c->n_gemm; i++)
    if (is_bf16_pass(c->gemm[i].pass)) pts[n++] = c->gemm[i];
  if (n == 0)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: no bf16 GEMM point (fwd, dgrad or wgrad) to fit the "
                    "efficiency curve to");
  MP_CHECK(mp_calib_fit_gemm_curve(ctx, pts, n, peak, ovh, &f->gemm_eff_max, &f->gemm_eff_half_mnk,
                                   &f->gemm_curve_rms));
  f->kernel_overhead_us = ovh * 1e6;
  f->gemm_table_rms = table_loo_rms(c);
  /* Only when it predicts shapes it did not see clearly better than the curve does: by
   * a tenth and by a percentage point of time at least (less is timing noise, and a
   * table the curve would do as well is a complication for nothing). */
  f->gemm_table = f->gemm_table_rms < 0.9 * f->gemm_curve_rms && f->gemm_curve_rms - f->gemm_table_rms > 0.01;

  /* float8: the bf16 curve's knee, the fp8 peak; minimise sum (w_i / E - 1)^2 with w_i =
   * the curve's time at E = 1 over the measured compute time (w_i is the point's
   * efficiency as the curve's shape sees it). */
  const double peak8 = c->ref_fp8_tflops * 1e12;
  if (c->n_f8 > 0 && peak8 > 0) {
    double sw = 0, sww = 0;
    for (int i = 0; i < c->n_f8; i++) {
      const mp_calib_gemm *g = &c->f8[i];
      if (!(g->flops_per_s > 0)) continue;
      const double flops = mp_calib_gemm_flops(MP_CALIB_GEMM_FWD, g->N, g->K, g->M);
      const double x = (double)g->N * g->K * g->M;
      const double w = curve_time(flops, x, peak8, 1.0, f->gemm_eff_half_mnk) / compute_time(flops / g->flops_per_s, ovh);
      sw += w;
      sww += w * w;
    }
    if (sw > 0) {
      f->fp8_gemm_eff_max = sww / sw; /* 1 / argmin_c sum (c w_i - 1)^2, argmin = sum w / sum w^2 */
      if (f->fp8_gemm_eff_max > 1.0) f->fp8_gemm_eff_max = 1.0;
    }
  }
  /* attention: the FLOP total over the time total, forward and backward together */
  double fl = 0, ts = 0;
  for (int i = 0; i < c->n_attn; i++) {
    const mp_calib_attn *a = &c->attn[i];
    if (!(a->flops_per_s > 0)) continue;
    const double flops = mp_calib_attn_flops(a->backward, a->B, a->T, a->nh, a->hd);
    fl += flops;
    ts += compute_time(flops / a->flops_per_s, ovh);
  }
  if (ts > 0) {
    f->attention_eff = fl / (peak * ts);
    if (f->attention_eff > 1.0) f->attention_eff = 1.0;
  }
  /* HBM: the element-wise kernels' bytes over their time, against the datasheet */
  double by = 0;
  ts = 0;
  for (int i = 0; i < c->n_bw; i++) {
    const mp_calib_bw *b = &c->bw[i];
    if (!(b->GBps > 0)) continue;
    const double bytes = mp_calib_bw_bytes(b->kernel, b->elems);
    by += bytes;
    ts += compute_time(bytes / (b->GBps * 1e9), ovh);
  }
  if (ts > 0 && c->ref_hbm_GBps > 0) {
    f->hbm_eff = by / (c->ref_hbm_GBps * 1e9 * ts);
    if (f->hbm_eff > 1.0) f->hbm_eff = 1.0;
  }
  return MP_OK;
}

const char *mp_calib_gpu_profile_for(const char *name, int cc, double mem_bytes) {
  if (name == NULL) return NULL;
  const double gib = mem_bytes / 1073741824.0;
  /* The datasheet peaks differ between SXM, PCIe and NVL parts of one GPU, and a
   * Grace-Hopper GH200 is not an H200: only names that say which part it is match. */
  if (strstr(name, "PCIe") || strstr(name, "NVL") || strstr(name, "GH200")) return NULL;
  if (strstr(name, "H200") && cc == 90) return "h200";
  if (strstr(name, "H100") && cc == 90) return gib > 88.0 ? "h100-96gb-500w" : "h100-sxm";
  if (strstr(name, "A100") && cc == 80) return gib > 60.0 ? "a100-80gb-sxm" : NULL;
  if (strstr(name, "B200") && cc == 100) return "b200";
  return NULL;
}

mp_status mp_calib_cuda_profile(mp_ctx *ctx, const mp_calib_device *dev, const char *requested, mp_gpu *out) {
  const char *name = requested && *requested ? requested
                                             : mp_calib_gpu_profile_for(dev->name, dev->compute_capability,
                                                                        dev->mem_bytes);
  if (name == NULL)
    return mp_error(ctx, MP_ERR_USAGE, "no GPU profile in data/gpus is known to match '%s' (sm_%d, %.1f GiB); pass "
                    "--gpu PROFILE (a data/gpus stem or a JSON file with this GPU's datasheet peaks)",
                    dev->name, dev->compute_capability, dev->mem_bytes / 1073741824.0);
  MP_CHECK(mp_gpu_load(ctx, name, out));
  if (out->compute_capability != dev->compute_capability)
    return mp_error(ctx, MP_ERR_INVALID, "GPU profile %s is compute capability %d but the device %s is %d: its "
                    "datasheet peaks are another GPU's; pass the --gpu profile of this GPU",
                    out->name, out->compute_capability, dev->name, dev->compute_capability);
  if (!(out->peak_tflops[MP_DTYPE_BF16] > 0) || !(out->hbm_GBps > 0))
    return mp_error(ctx, MP_ERR_INVALID, "GPU profile %s has no bf16 peak or HBM bandwidth to fit against",
                    out->name);
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
  /* cuda: the profile keeps its datasheet figures, which the fit is relative to; what
   * was measured reaches the simulator through the stack (mp_calib_apply_stack). */
  if (strcmp(c->device, "cuda") == 0) return;
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
  if (strcmp(c->device, "cuda") == 0) {
    /* The efficiencies are relative to one datasheet: only that profile can take them. */
    for (int i = 0; i < 2; i++)
      if (targets[i] && (mp_gpu_is_cpu(targets[i]) || strcmp(targets[i]->name, c->gpu_profile) != 0))
        return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld was measured on %s and fitted against profile %s, "
                        "but the profile here is %s; simulate with --gpu %s (or a cluster of them) or drop "
                        "--calibration", (long long)c->id, c->gpu_name, c->gpu_profile, targets[i]->name,
                        c->gpu_profile);
    mp_calib_apply(c, gpu, cluster);
    return MP_OK;
  }
  for (int i = 0; i < 2; i++)
    if (targets[i] && cpu != mp_gpu_is_cpu(targets[i]))
      return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld was measured on %s but profile %s is %s; simulate "
                      "with a CPU profile (--cluster cpu-local or --gpu cpu) or drop --calibration",
                      (long long)c->id, c->device, targets[i]->name, cpu ? "a GPU" : "the CPU");
  mp_calib_apply(c, gpu, cluster);
  return MP_OK;
}

mp_status mp_calib_apply_stack(mp_ctx *ctx, const mp_calib *c, mp_stack_profile *stack, mp_gemm_table *table) {
  if (strcmp(c->device, "cuda") != 0) return MP_OK;
  if (strcmp(stack->name, "meshplan-cuda") != 0)
    return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld measured meshplan's CUDA kernels: it applies to the "
                    "meshplan-cuda stack, not %s; pass --stack meshplan-cuda or drop --calibration",
                    (long long)c->id, stack->name);
  const mp_calib_stack_fit *f = &c->fit;
  if (!(f->gemm_eff_max > 0))
    return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld holds no GEMM fit; run meshplan calibrate --device "
                    "cuda again", (long long)c->id);
  stack->gemm_eff_max = f->gemm_eff_max;
  stack->gemm_eff_half_mnk = f->gemm_eff_half_mnk;
  /* figures not measured (0) keep the stack's stated ones */
  if (f->fp8_gemm_eff_max > 0) stack->fp8_gemm_eff_max = f->fp8_gemm_eff_max;
  if (f->attention_eff > 0) stack->attention_eff = f->attention_eff;
  if (f->hbm_eff > 0) stack->hbm_eff = f->hbm_eff;
  if (f->kernel_overhead_us > 0) stack->kernel_overhead_s = f->kernel_overhead_us * 1e-6;
  stack->gemm_table = NULL;
  if (table && f->gemm_table) {
    mp_calib_gemm_table(c, table);
    stack->gemm_table = table;
  }
  snprintf(stack->source, sizeof stack->source,
           "calibration #%lld of cuda on %s (%s datasheet peaks) on %s at %s; GEMM %s", (long long)c->id,
           c->gpu_name, c->gpu_profile, c->host, c->created_at,
           stack->gemm_table ? "curve with the by-shape correction" : "curve");
  return MP_OK;
}

mp_status mp_calib_load_apply(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                              mp_cluster *cluster) {
  return mp_calib_load_apply_stack(ctx, db_path, device, gpu, cluster, NULL, NULL, NULL);
}

mp_status mp_calib_load_apply_stack(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                                    mp_cluster *cluster, mp_stack_profile *stack, mp_gemm_table *table,
                                    mp_calib *out) {
  mp_calib *c = malloc(sizeof *c);
  MP_CHECK_ALLOC(ctx, c);
  mp_status s = mp_calib_store_load(ctx, db_path, device, c);
  if (s == MP_OK) s = mp_calib_apply_checked(ctx, c, gpu, cluster);
  if (s == MP_OK && stack) s = mp_calib_apply_stack(ctx, c, stack, table);
  if (s == MP_OK && out) *out = *c;
  free(c);
  return s;
}

void mp_calib_summary(const mp_calib *c, char *buf, size_t cap) {
  if (strcmp(c->device, "cuda") == 0) {
    const mp_calib_stack_fit *f = &c->fit;
    int n = snprintf(buf, cap, "#%lld cuda on %s, %s (%s, sm_%d), %s: gemm_eff_max %.3f half_mnk %.3g%s",
                     (long long)c->id, c->host, c->gpu_name, c->gpu_profile, c->compute_capability, c->created_at,
                     f->gemm_eff_max, f->gemm_eff_half_mnk, f->gemm_table ? " (+ by shape)" : "");
    if (n < 0 || (size_t)n >= cap) return;
    char a[32] = "not measured", f8[32] = "not measured";
    if (f->attention_eff > 0) snprintf(a, sizeof a, "%.3f", f->attention_eff);
    if (f->fp8_gemm_eff_max > 0) snprintf(f8, sizeof f8, "%.3f", f->fp8_gemm_eff_max);
    snprintf(buf + n, cap - (size_t)n, ", attention_eff %s, hbm_eff %.3f, fp8_gemm_eff_max %s, kernel_overhead %.2f us",
             a, f->hbm_eff, f8, f->kernel_overhead_us);
    return;
  }
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
