/* The CPU measurement (the kernels through the CPU backend, the memory copy, the
 * collectives per group size) and mp_calib_measure, the entry point of both devices.
 * docs/calibration.md says what is timed and why; measure_cuda.c measures a GPU and
 * fit.c fits what either measured.
 *
 * Invariants: every rank of an "mpi" comm makes the same collective calls in the same
 * order (the shapes, sizes, reps and loop counts depend only on the options and the world
 * size, never on a rank's timings: a kernel's loop count is agreed on with an all-reduce
 * MAX before it is timed), so no rank can wait on a call another skips. Figures that
 * differ per rank are combined with one all-reduce each (mean for rates and kernel
 * times, max for collective times), as int64 (comm.h has no fp64): FLOP/s and bytes/s
 * rounded to integers, times in picoseconds. */
#include "calib/calibrate.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib_internal.h"
#include "common/progress.h"
#include "common/stats.h"
#include "common/timeutil.h"

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

/* ---- the CPU kernels ------------------------------------------------------------------
 * Each figure is one op of the backend table called in a timed loop (see calibrate.h).
 * Buffers are the backend's (host memory on the CPU), allocated per group (GEMM,
 * attention, element-wise) at the largest size any of its points needs and filled once.
 * Every point is set up first, then timed in rounds (cpu_time_rounds). */

enum { CPU_WARM_CALLS = 1, CPU_MAX_LOOP_CALLS = 1000, CPU_MAX_BUFS = 32 };
#define CPU_LOOP_TARGET_S 2e-3 /* a repetition lasts about this long */
#define CPU_MAX_OPS (1 + MP_CALIB_MAX_GEMM + 2 * MP_CALIB_MAX_ATTN + MP_CALIB_MAX_BW)

typedef enum cpu_kind {
  CK_LAUNCH, CK_GEMM_FWD, CK_GEMM_DGRAD, CK_GEMM_WGRAD, CK_GEMM_BWD, CK_ATTN_FWD, CK_ATTN_BWD, CK_RMS_FWD,
  CK_RMS_BWD, CK_SWI_FWD, CK_SWI_BWD, CK_ROPE_FWD, CK_ROPE_BWD, CK_CE_FWD, CK_CE_BWD, CK_ADAMW, CK_RESIDUAL
} cpu_kind;

/* One call of one backend entry: which, its buffers and its sizes (see cpu_run). */
typedef struct cpu_op {
  cpu_kind kind;
  float *f[8];
  int32_t *tgt;
  int a, b, c, d, e;
  size_t n;
} cpu_op;

typedef struct cpu_cal {
  mp_ctx *ctx;
  mp_comm *comm;
  const mp_backend *be;
  mp_kctx *kc;
  int reps;
  void *buf[CPU_MAX_BUFS]; /* every buffer of the measurement, freed together */
  int n_buf;
  cpu_op ops[CPU_MAX_OPS]; /* in measurement order */
  int n_ops;
} cpu_cal;

static mp_status cpu_run(cpu_cal *C, const cpu_op *o) {
  const mp_backend *be = C->be;
  mp_kctx *kc = C->kc;
  float *const *f = o->f;
  mp_status s;
  switch (o->kind) {
    case CK_LAUNCH: s = be->scale_f32(kc, f[0], 1, 1.0f); break;
    /* a = N, b = K, c = M: f0 inp (N, K), f1 W (M, K), f2 out / dout (N, M), f3 dinp, f4 dW */
    case CK_GEMM_FWD: s = be->matmul_forward(kc, f[2], f[0], f[1], NULL, o->a, o->b, o->c); break;
    case CK_GEMM_DGRAD: s = be->matmul_backward(kc, f[3], NULL, NULL, f[2], f[0], f[1], o->a, o->b, o->c); break;
    case CK_GEMM_WGRAD: s = be->matmul_backward(kc, NULL, f[4], NULL, f[2], f[0], f[1], o->a, o->b, o->c); break;
    case CK_GEMM_BWD: s = be->matmul_backward(kc, f[3], f[4], NULL, f[2], f[0], f[1], o->a, o->b, o->c); break;
    /* a = B, b = T, c = nh, d = nkv, e = hd: f0 q, f1 k, f2 v, f3 out / dout, f4 dq, f5 dk,
     * f7 dv, f6 lse */
    case CK_ATTN_FWD: s = be->attention_forward(kc, f[3], f[6], f[0], f[1], f[2], o->a, o->b, o->c, o->d, o->e, o->e); break;
    case CK_ATTN_BWD:
      s = be->attention_backward(kc, f[4], f[5], f[7], f[3], f[0], f[1], f[2], f[3], f[6], o->a, o->b, o->c, o->d,
                                 o->e, o->e);
      break;
    /* a = rows, b = cols: f0 x, f1 w, f2 out / dout, f3 dx, f4 rstd, f5 dw */
    case CK_RMS_FWD: s = be->rmsnorm_forward(kc, f[2], f[4], f[0], f[1], o->a, o->b, 1e-5f); break;
    case CK_RMS_BWD: s = be->rmsnorm_backward(kc, f[3], f[5], f[2], f[0], f[1], f[4], o->a, o->b); break;
    /* n elements: f0 gate, f1 up, f2 out / dout, f3 dgate, f4 dup */
    case CK_SWI_FWD: s = be->swiglu_forward(kc, f[2], f[0], f[1], o->n); break;
    case CK_SWI_BWD: s = be->swiglu_backward(kc, f[3], f[4], f[2], f[0], f[1], o->n); break;
    /* a = tokens, b = heads, c = hd: f0 x / dout, f1 out / dx, f2 cos, f3 sin */
    case CK_ROPE_FWD: s = be->rope_forward(kc, f[1], f[0], f[2], f[3], 1, o->a, o->b, o->c); break;
    case CK_ROPE_BWD: s = be->rope_backward(kc, f[1], f[0], f[2], f[3], 1, o->a, o->b, o->c); break;
    /* a = tokens, b = vocab: f0 logits, f1 losses, f2 mean, f3 lse, f4 dlogits */
    case CK_CE_FWD: s = be->cross_entropy_forward(kc, f[1], f[2], f[3], f[0], o->tgt, o->a, o->b); break;
    case CK_CE_BWD: s = be->ce_backward(kc, f[4], f[0], f[3], o->tgt, 1.0f / (float)o->a, o->a, o->b, 0); break;
    /* n elements: f0 param, f1 grad, f2 m, f3 v (>= 0) */
    case CK_ADAMW:
      s = be->adamw_update(kc, f[0], f[1], f[2], f[3], o->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
      break;
    /* n elements: f0 x, f1 y += x (the runtime's residual add) */
    case CK_RESIDUAL: s = be->accumulate(kc, f[1], f[0], o->n); break;
    default: return mp_error(C->ctx, MP_ERR_INTERNAL, "calibrate: unknown cpu op %d", (int)o->kind);
  }
  if (s != MP_OK && kc->err != C->ctx) mp_error(C->ctx, s, "%s", mp_errmsg(kc->err));
  return s;
}

/* Seconds per call of every op of C (see calibrate.h) into per_call_s: each op's warm-up
 * and one timed call to size its loop; the loop counts agreed on over the world (the
 * largest asked for, one all-reduce); then `reps` rounds, each timing one loop of every
 * op in order, the ranks starting each round together. The repetitions of an op lie a
 * round apart, so a burst of other load on the machine spoils one repetition of many
 * points rather than every repetition of a few, and the median drops it. Per op, the
 * median over rounds, averaged over ranks (one all-reduce). Ops that read what another
 * wrote (a backward after its forward) follow it in the list. */
static mp_status cpu_time_rounds(cpu_cal *C, double *per_call_s) {
  const int n = C->n_ops, reps = C->reps;
  mp_status st = MP_OK;
  int64_t *calls = calloc((size_t)n, sizeof *calls), *ps = calloc((size_t)n, sizeof *ps);
  double *t = calloc((size_t)n * (size_t)reps, sizeof *t);
  mp_progress prog;
  memset(&prog, 0, sizeof prog);
  if (!calls || !ps || !t) {
    st = mp_error(C->ctx, MP_ERR_NOMEM, "calibrate: out of memory for %d timings", n * reps);
    goto done;
  }
  /* the bar on rank 0 only (a terminal shared by the ranks would get one line each) */
  if (mp_comm_world_rank(C->comm) == 0) mp_progress_begin(&prog, "calibrating the cpu kernels", (int64_t)n * (reps + 1));
  for (int i = 0; i < n; i++) {
    for (int w = 0; w < CPU_WARM_CALLS; w++) MP_CHECK_GOTO(cpu_run(C, &C->ops[i]), st, done); /* page faults, threads */
    const double t0 = mp_now_s();
    MP_CHECK_GOTO(cpu_run(C, &C->ops[i]), st, done);
    const double t1 = mp_now_s() - t0;
    const double k = t1 > 0 ? ceil(CPU_LOOP_TARGET_S / t1) : CPU_MAX_LOOP_CALLS;
    calls[i] = k < 1 ? 1 : k > CPU_MAX_LOOP_CALLS ? CPU_MAX_LOOP_CALLS : (int64_t)k;
    mp_progress_update(&prog, i + 1);
  }
  MP_CHECK_GOTO(mp_comm_all_reduce(C->ctx, C->comm, MP_GROUP_WORLD, calls, calls, (size_t)n, MP_COMM_DTYPE_INT64,
                                   MP_COMM_OP_MAX), st, done);
  for (int r = 0; r < reps; r++) {
    /* every rank starts together, so a multi-rank figure is the rate under full load */
    MP_CHECK_GOTO(mp_comm_barrier(C->ctx, C->comm, MP_GROUP_WORLD), st, done);
    for (int i = 0; i < n; i++) {
      const double t0 = mp_now_s();
      for (int64_t j = 0; j < calls[i]; j++) MP_CHECK_GOTO(cpu_run(C, &C->ops[i]), st, done);
      t[(size_t)i * reps + r] = (mp_now_s() - t0) / (double)calls[i];
      mp_progress_update(&prog, (int64_t)n * (r + 1) + i + 1);
    }
  }
  for (int i = 0; i < n; i++) ps[i] = llround(mp_median(t + (size_t)i * reps, (size_t)reps) * 1e12);
  MP_CHECK_GOTO(mp_comm_all_reduce(C->ctx, C->comm, MP_GROUP_WORLD, ps, ps, (size_t)n, MP_COMM_DTYPE_INT64,
                                   MP_COMM_OP_SUM), st, done);
  for (int i = 0; i < n; i++) {
    per_call_s[i] = (double)ps[i] * 1e-12 / (double)mp_comm_world_size(C->comm);
    if (!(per_call_s[i] > 0)) {
      st = mp_error(C->ctx, MP_ERR_INTERNAL, "calibrate: cpu op %d timed at %g s per call; the clock gave no time",
                    (int)C->ops[i].kind, per_call_s[i]);
      goto done;
    }
  }
done:
  mp_progress_end(&prog);
  free(calls);
  free(ps);
  free(t);
  return st;
}

/* n floats (at least one) filled with small values of both signs (pos: in (0, 0.1]). */
static mp_status cpu_buf(cpu_cal *C, size_t n, int pos, unsigned seed, float **out) {
  *out = NULL;
  if (C->n_buf >= CPU_MAX_BUFS) return mp_error(C->ctx, MP_ERR_INTERNAL, "calibrate: too many cpu buffers");
  if (n == 0) n = 1;
  mp_status st = C->be->alloc(C->kc, (void **)out, n * sizeof(float));
  if (st != MP_OK) {
    if (C->kc->err != C->ctx) mp_error(C->ctx, st, "%s", mp_errmsg(C->kc->err));
    return st;
  }
  C->buf[C->n_buf++] = *out;
  fill(*out, n, seed);
  if (pos)
    for (size_t i = 0; i < n; i++) (*out)[i] = fabsf((*out)[i]) + 0.001f;
  return MP_OK;
}

static void cpu_free(cpu_cal *C) {
  for (int i = 0; i < C->n_buf; i++) C->be->free(C->kc, C->buf[i]);
  C->n_buf = 0;
}

static mp_status cpu_add(cpu_cal *C, const cpu_op *o) {
  if (C->n_ops >= CPU_MAX_OPS) return mp_error(C->ctx, MP_ERR_INTERNAL, "calibrate: too many cpu points");
  C->ops[C->n_ops++] = *o;
  return MP_OK;
}

static mp_status cpu_setup_launch(cpu_cal *C) {
  cpu_op o = {.kind = CK_LAUNCH};
  MP_CHECK(cpu_buf(C, 16, 1, 5, &o.f[0]));
  return cpu_add(C, &o);
}

static mp_status cpu_setup_gemm(cpu_cal *C, const mp_calib_options *o) {
  size_t nk, mk, nm;
  mp_calib_gemm_extents(o->gemm, o->n_gemm, &nk, &mk, &nm);
  cpu_op b = {.kind = CK_GEMM_FWD};
  /* the gradients accumulate (+=): they start from data, as a second micro-batch does */
  MP_CHECK(cpu_buf(C, nk, 0, 1, &b.f[0]));
  MP_CHECK(cpu_buf(C, mk, 0, 2, &b.f[1]));
  MP_CHECK(cpu_buf(C, nm, 0, 3, &b.f[2]));
  MP_CHECK(cpu_buf(C, nk, 0, 4, &b.f[3]));
  MP_CHECK(cpu_buf(C, mk, 0, 5, &b.f[4]));
  for (int i = 0; i < o->n_gemm; i++) {
    const int pass = o->gemm[i].pass;
    b.kind = pass == MP_CALIB_GEMM_DGRAD ? CK_GEMM_DGRAD
             : pass == MP_CALIB_GEMM_WGRAD ? CK_GEMM_WGRAD
             : pass == MP_CALIB_GEMM_BWD  ? CK_GEMM_BWD
                                          : CK_GEMM_FWD;
    b.a = o->gemm[i].N;
    b.b = o->gemm[i].K;
    b.c = o->gemm[i].M;
    MP_CHECK(cpu_add(C, &b));
  }
  return MP_OK;
}

static mp_status cpu_setup_attention(cpu_cal *C, const mp_calib_options *o) {
  size_t q, kv, rows;
  mp_calib_attn_extents(o, &q, &kv, &rows);
  cpu_op a = {.kind = CK_ATTN_FWD};
  MP_CHECK(cpu_buf(C, q, 0, 1, &a.f[0]));
  MP_CHECK(cpu_buf(C, kv, 0, 2, &a.f[1]));
  MP_CHECK(cpu_buf(C, kv, 0, 3, &a.f[2]));
  MP_CHECK(cpu_buf(C, q, 0, 4, &a.f[3]));
  MP_CHECK(cpu_buf(C, q, 0, 5, &a.f[4]));
  MP_CHECK(cpu_buf(C, kv, 0, 6, &a.f[5]));
  MP_CHECK(cpu_buf(C, rows, 1, 7, &a.f[6]));
  MP_CHECK(cpu_buf(C, kv, 0, 8, &a.f[7]));
  for (int i = 0; i < o->n_attn; i++) {
    a.a = o->attn[i].B;
    a.b = o->attn[i].T;
    a.c = o->attn[i].nh;
    a.d = o->attn[i].nkv;
    a.e = o->attn[i].hd;
    /* the forward first: it leaves the lse and output the backward reads (f3 then serves
     * as both the forward output and dout, as the CUDA calibration does) */
    a.kind = CK_ATTN_FWD;
    MP_CHECK(cpu_add(C, &a));
    a.kind = CK_ATTN_BWD;
    MP_CHECK(cpu_add(C, &a));
  }
  return MP_OK;
}

static cpu_kind bw_kind(int k) {
  static const cpu_kind m[MP_CALIB_BW_COUNT] = {CK_RMS_FWD, CK_RMS_BWD,  CK_SWI_FWD, CK_SWI_BWD, CK_ADAMW,
                                                CK_ROPE_FWD, CK_ROPE_BWD, CK_CE_FWD,  CK_CE_BWD,  CK_RESIDUAL};
  return m[k];
}

static mp_status cpu_setup_bandwidth(cpu_cal *C, const mp_calib_options *o) {
  size_t e = 1, rows = 1, cols = 1, rope = 1;
  int vocab = 0; /* the smallest cross-entropy vocabulary: the targets must lie in every one */
  for (int i = 0; i < o->n_bw; i++) {
    const size_t R = (size_t)o->bw[i].rows, Cc = (size_t)o->bw[i].cols;
    const int k = o->bw[i].kernel;
    if (R * Cc > e) e = R * Cc;
    if (R > rows) rows = R;
    if (Cc > cols) cols = Cc;
    if (k == MP_CALIB_BW_ROPE_FWD || k == MP_CALIB_BW_ROPE_BWD)
      if (R * (size_t)o->bw[i].hd / 2 > rope) rope = R * (size_t)o->bw[i].hd / 2;
    if ((k == MP_CALIB_BW_CE_FWD || k == MP_CALIB_BW_CE_BWD) && (vocab == 0 || o->bw[i].cols < vocab))
      vocab = o->bw[i].cols;
  }
  float *x[6], *w, *row[3], *tab[2];
  int32_t *tgt = NULL;
  for (int i = 0; i < 6; i++) MP_CHECK(cpu_buf(C, e, i == 3 || i == 5, 10 + i, &x[i]));
  MP_CHECK(cpu_buf(C, cols, 1, 20, &w));
  for (int i = 0; i < 3; i++) MP_CHECK(cpu_buf(C, rows, 1, 21 + i, &row[i]));
  for (int i = 0; i < 2; i++) MP_CHECK(cpu_buf(C, rope, 0, 24 + i, &tab[i]));
  MP_CHECK(cpu_buf(C, rows, 0, 26, (float **)&tgt));
  for (size_t r = 0; r < rows; r++) tgt[r] = vocab > 0 ? (int32_t)(((int64_t)r * 7919) % vocab) : 0;
  for (int i = 0; i < o->n_bw; i++) {
    const int k = o->bw[i].kernel, R = o->bw[i].rows, Cc = o->bw[i].cols;
    cpu_op b = {.kind = bw_kind(k), .a = R, .b = Cc, .n = (size_t)R * Cc};
    switch (b.kind) {
      case CK_RMS_FWD:
      case CK_RMS_BWD: /* x, w, out / dout, dx, rstd (> 0), dw */
        b.f[0] = x[0], b.f[1] = w, b.f[2] = x[1], b.f[3] = x[2], b.f[4] = row[0], b.f[5] = x[3];
        break;
      case CK_ROPE_FWD:
      case CK_ROPE_BWD: /* tokens R, heads C / hd */
        b.b = Cc / o->bw[i].hd;
        b.c = o->bw[i].hd;
        b.f[0] = x[0], b.f[1] = x[1], b.f[2] = tab[0], b.f[3] = tab[1];
        break;
      case CK_CE_FWD:
      case CK_CE_BWD: /* targets spread over the vocabulary; lse (> 0) before a forward */
        b.tgt = tgt;
        b.f[0] = x[0], b.f[1] = row[1], b.f[2] = row[2], b.f[3] = row[0], b.f[4] = x[1];
        break;
      case CK_ADAMW: /* v >= 0 */
        b.f[0] = x[0], b.f[1] = x[1], b.f[2] = x[2], b.f[3] = x[3];
        break;
      default: /* swiglu: gate, up, out / dout, dgate, dup; residual: x, y */
        for (int j = 0; j < 5; j++) b.f[j] = x[j];
        break;
    }
    MP_CHECK(cpu_add(C, &b));
  }
  return MP_OK;
}

/* Every kernel point of o on C's backend into out (launch_s, gemm, attn, bw). */
static mp_status cpu_measure_kernels(mp_ctx *ctx, mp_comm *comm, const mp_backend *be, mp_kctx *kc,
                                     const mp_calib_options *o, mp_calib *out) {
  cpu_cal *C = calloc(1, sizeof *C);
  double *ts = calloc(CPU_MAX_OPS, sizeof *ts);
  mp_status st = MP_OK;
  if (!C || !ts) {
    free(C);
    free(ts);
    return mp_error(ctx, MP_ERR_NOMEM, "calibrate: out of memory");
  }
  C->ctx = ctx;
  C->comm = comm;
  C->be = be;
  C->kc = kc;
  C->reps = o->reps;
  MP_CHECK_GOTO(cpu_setup_launch(C), st, done);
  const int g0 = C->n_ops;
  st = cpu_setup_gemm(C, o);
  if (st != MP_OK) {
    mp_error_prefix(ctx, "calibrate: GEMMs");
    goto done;
  }
  const int a0 = C->n_ops;
  st = cpu_setup_attention(C, o);
  if (st != MP_OK) {
    mp_error_prefix(ctx, "calibrate: attention");
    goto done;
  }
  const int b0 = C->n_ops;
  st = cpu_setup_bandwidth(C, o);
  if (st != MP_OK) {
    mp_error_prefix(ctx, "calibrate: element-wise kernels");
    goto done;
  }
  MP_CHECK_GOTO(cpu_time_rounds(C, ts), st, done);
  out->launch_s = ts[0];
  for (int i = g0; i < a0; i++) {
    const cpu_op *op = &C->ops[i];
    out->gemm[out->n_gemm++] = mp_calib_gemm_point(o->gemm[i - g0].pass, op->a, op->b, op->c, ts[i]);
  }
  for (int i = a0; i < b0; i++) {
    const cpu_op *op = &C->ops[i];
    mp_calib_attn *e = &out->attn[out->n_attn++];
    e->backward = op->kind == CK_ATTN_BWD;
    e->B = op->a, e->T = op->b, e->nh = op->c, e->nkv = op->d, e->hd = op->e;
    e->flops_per_s = mp_calib_attn_flops(e->backward, e->B, e->T, e->nh, e->hd) / ts[i];
  }
  for (int i = b0; i < C->n_ops; i++) {
    mp_calib_bw *r = &out->bw[out->n_bw++];
    r->kernel = o->bw[i - b0].kernel;
    r->elems = (double)o->bw[i - b0].rows * o->bw[i - b0].cols;
    r->GBps = mp_calib_bw_bytes(r->kernel, r->elems) / ts[i] * 1e-9;
  }
done:
  cpu_free(C);
  free(C);
  free(ts);
  return st;
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

/* ---- entry point ----------------------------------------------------------------------- */

/* The cpu points are sane before anything is measured (every rank checks the same
 * options, so all refuse together, before any collective). */
static mp_status check_cpu_options(mp_ctx *ctx, const mp_calib_options *o) {
  if (o->n_gemm > MP_CALIB_MAX_GEMM || o->n_attn > MP_CALIB_MAX_ATTN || o->n_bw > MP_CALIB_MAX_BW ||
      o->n_sizes > MP_CALIB_MAX_SIZES)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: %d GEMM, %d attention, %d element-wise points, %d sizes; at most "
                    "%d, %d, %d, %d", o->n_gemm, o->n_attn, o->n_bw, o->n_sizes, MP_CALIB_MAX_GEMM,
                    MP_CALIB_MAX_ATTN, MP_CALIB_MAX_BW, MP_CALIB_MAX_SIZES);
  for (int i = 0; i < o->n_gemm; i++) {
    const int p = o->gemm[i].pass, N = o->gemm[i].N, K = o->gemm[i].K, M = o->gemm[i].M;
    if (N < 1 || K < 1 || M < 1)
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: GEMM shape %dx%dx%d; every size must be >= 1", N, K, M);
    if (p < 0 || p >= MP_CALIB_GEMM_PASS_COUNT)
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: GEMM pass %d; choose fwd, bwd, dgrad or wgrad", p);
  }
  for (int i = 0; i < o->n_attn; i++) {
    const int B = o->attn[i].B, T = o->attn[i].T, nh = o->attn[i].nh, nkv = o->attn[i].nkv, hd = o->attn[i].hd;
    if (B < 1 || T < 1 || nh < 1 || nkv < 1 || hd < 1 || nh % nkv != 0)
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: attention (B %d, T %d, nh %d, nkv %d, hd %d); every size "
                      "must be >= 1 and nkv must divide nh", B, T, nh, nkv, hd);
  }
  for (int i = 0; i < o->n_bw; i++) {
    const int k = o->bw[i].kernel, R = o->bw[i].rows, Cc = o->bw[i].cols, hd = o->bw[i].hd;
    if (k < 0 || k >= MP_CALIB_BW_COUNT || R < 1 || Cc < 1)
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: element-wise point %d (kernel %d, %d x %d); the kernel must "
                      "be one of mp_calib_bw_kernel and the sizes >= 1", i, k, R, Cc);
    if ((k == MP_CALIB_BW_ROPE_FWD || k == MP_CALIB_BW_ROPE_BWD) && (hd < 2 || hd % 2 != 0 || Cc % hd != 0))
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: RoPE point %d x %d with head dimension %d; hd must be even "
                      "and divide the columns", R, Cc, hd);
  }
  return MP_OK;
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
  mp_calib_options_init_cpu(&dflt, 0);
  /* opts' points where it gives some, the defaults for a group it leaves empty */
  mp_calib_options o = *opts;
  if (o.n_gemm <= 0) {
    o.n_gemm = dflt.n_gemm;
    memcpy(o.gemm, dflt.gemm, sizeof o.gemm);
  }
  if (o.n_attn <= 0) {
    o.n_attn = dflt.n_attn;
    memcpy(o.attn, dflt.attn, sizeof o.attn);
  }
  if (o.n_bw <= 0) {
    o.n_bw = dflt.n_bw;
    memcpy(o.bw, dflt.bw, sizeof o.bw);
  }
  if (o.n_sizes <= 0) {
    o.n_sizes = dflt.n_sizes;
    memcpy(o.sizes_bytes, dflt.sizes_bytes, sizeof o.sizes_bytes);
  }
  if (o.copy_bytes <= 0) o.copy_bytes = dflt.copy_bytes;
  MP_CHECK(check_cpu_options(ctx, &o));

  mp_calib_begin(out, be->name, omp_get_max_threads(), mp_comm_world_size(comm));

  MP_CHECK(cpu_measure_kernels(ctx, comm, be, kc, &o, out));
  MP_CHECK(measure_copy(ctx, comm, o.reps, o.copy_bytes, &out->copy_GBps));

  const int W = out->world;
  if (W > 1 && strcmp(mp_comm_backend_name(comm), "mpi") == 0) {
    int groups[MP_CALIB_MAX_GROUPS], n_groups = 0;
    for (int g = 2; g < W && n_groups < MP_CALIB_MAX_GROUPS - 1; g *= 2)
      if (W % g == 0) groups[n_groups++] = g;
    groups[n_groups++] = W;
    for (int i = 0; i < n_groups; i++) MP_CHECK(measure_group(ctx, comm, groups[i], &o, out));
  }
  return mp_calib_fit_stack(ctx, out);
}
