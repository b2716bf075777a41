/* Attention benchmark (not a test), in three modes:
 *   attention_bench        the tuning sweep of the tensor-core kernels on one GPU (below);
 *   attention_bench --cpu  the CPU backend's attention, monolithic and as ring attention
 *                          from the span ops (span_main says what it times), built with or
 *                          without CUDA;
 *   attention_bench --ring the same on the GPU at the sweep's shapes (no device: it says so
 *                          and exits 0).
 *
 * The sweep times every compiled tile configuration of the
 * tensor-core attention kernels (kernels/cuda/attention_fa2.cu: forward, dK/dV, dQ) on one
 * GPU, checks each against configuration 0 on the same inputs, and prints one table and
 * the environment that selects the fastest: "best: MP_ATTENTION_FWD_CFG=a
 * MP_ATTENTION_DKDV_CFG=b MP_ATTENTION_DQ_CFG=c" for the benchmark shape of kernels_bench
 * (B4 T2048 nh16 nkv8 hd128; the last line), after one "best for <shape>:" line per shape
 * (that one and a head-dim 64 shape, B8 T2048 nh32 nkv8 hd64).
 *
 * Method. Inputs q, k, v, dout are pseudo-random in [-1, 1), never zeros (timings on zeros
 * can flatter tensor-core kernels, see kernels_bench.c). Each figure is the median of
 * kReps runs timed with CUDA events on the backend's stream after kWarm untimed ones. The
 * backward's inputs are configuration 0's forward outputs (out, lse). dK/dV and dQ are
 * timed alone: the hook mp_cuda_attention_fa2_bwd_kernels makes attention_backward launch
 * one kernel, which reads the D = rowsum(dout * out) that the dot kernel (its own row)
 * left in the backend's scratch; nothing between uses that scratch. The "bwd" rows time
 * the whole backward (dot + dK/dV + dQ) with configurations 0 and with the fastest.
 *
 * Columns: regs, spill (local bytes), smem (dynamic shared bytes per block) and blk/SM
 * (resident blocks per SM) come from the CUDA runtime for the compiled kernel. TF/s counts
 * the GEMMs each kernel executes over the causal half, G = B nh T^2 hd FLOPs per GEMM:
 * fwd 2G (S, PV), dK/dV 4G (S, dV, dP, dK), dQ 3G (S, dP, dQ); the "bwd" rows count 5G,
 * the algorithmic backward of kernels_bench ("2.5x forward"), so they compare with it
 * and with PyTorch. "diff" is max |x - x0| / max |x0| over the kernel's outputs (forward:
 * out and lse; dK/dV: dk, dv; dQ: dq) against configuration 0; the backward
 * configurations do the same sums in the same order and should give 0, the forward ones
 * a few bf16 ulps at most where the key tile (and so the softmax rescaling) differs. A
 * configuration whose diff exceeds kTolDiff is marked MISMATCH and never chosen.
 *
 * Run on the device (no arguments): bazel-bin/bench/attention_bench. Without CUDA or
 * without a device it prints "no CUDA device" and exits 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <time.h>

#include "common/status.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "kernels/ops.h"

/* ---- span attention against monolithic: --cpu, --ring --------------------------------
 * span_main times one backend's attention at two shapes (the CPU's: B2 T512 nh8 nkv4 hd64,
 * long rows where the score loops dominate, and B8 T64 nh8 nkv4 hd8, tiny-dense's, where
 * the per-call costs show; on a GPU the sweep's two shapes). Rows:
 *   monolithic   attention_forward, attention_backward on the whole sequence;
 *   ring cp=N    the same attention from the span ops as context parallelism runs it
 *                (tests/kernels/ring_attention.h): 2N chunks, rank r holding chunks r and
 *                2N-1-r, every rank's pairs over N ring steps; forward = span_init, the
 *                pairs, span_finalize; backward = span_dot, the pairs. "all ranks" is the
 *                sum over the N ranks (the work, to compare with monolithic: the ratio is
 *                what splitting costs), "max rank" the busiest rank's share (what a step
 *                takes on N devices without communication; ideal: monolithic / N).
 * Inputs are pseudo-random in [-1, 1). One sample is the mean time of enough back-to-back
 * calls to fill kSpanSampleS (at least one), each call followed by the backend's
 * synchronize; each figure is the median of kSpanSamples samples after one untimed call,
 * in wall time and, on the CPU, in the process's CPU time (on a shared machine the CPU
 * time is what compares two builds of a kernel; the ratio column uses it there and the
 * wall time on a GPU). GFLOP/s counts the causal half as the sweep does (forward 2G,
 * backward 5G, G = B nh T^2 hd) on the wall time. CPU threads: OMP_NUM_THREADS. */
enum { kSpanSamples = 9, kSpanMaxCp = 4 };
static const double kSpanSampleS = 0.05;

typedef struct span_shape {
  int B, T, nh, nkv, hd;
} span_shape;

/* The backend's tensors of one shape (X tensors void *, fp32 float *). */
typedef struct span_bufs {
  void *q, *k, *v, *dout, *out, *dq, *dk, *dv;
  float *lse;
} span_bufs;

/* One simulated rank of a ring: its two chunks, laid out as its local sequence. */
typedef struct span_rank {
  int chunk[2], row[2], L; /* global chunk ids, their first local rows, local length */
  void *q, *k, *v, *dout, *out, *dq, *dk, *dv;
  float *acc, *lse, *D;
} span_rank;

typedef struct span_ring {
  int cp;
  int bounds[2 * kSpanMaxCp + 1];
  span_rank rank[kSpanMaxCp];
} span_ring;

/* What one timed call runs: the op on the shape's tensors, or one rank's share of a ring. */
typedef struct span_job {
  const mp_backend *be;
  mp_kctx *kc;
  const span_shape *s;
  span_bufs *b;
  span_ring *ring;
  int rank;
} span_job;

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef mp_status (*span_op_fn)(const span_job *j);

static mp_status mono_fwd(const span_job *j) {
  const span_shape *s = j->s;
  span_bufs *b = j->b;
  return j->be->attention_forward(j->kc, b->out, b->lse, b->q, b->k, b->v, s->B, s->T, s->nh,
                                  s->nkv, s->hd, s->hd);
}

static mp_status mono_bwd(const span_job *j) {
  const span_shape *s = j->s;
  span_bufs *b = j->b;
  return j->be->attention_backward(j->kc, b->dq, b->dk, b->dv, b->dout, b->q, b->k, b->v,
                                   b->out, b->lse, s->B, s->T, s->nh, s->nkv, s->hd, s->hd);
}

/* The pair (query chunk a of rank me, kv chunk c of rank kv). */
static mp_attn_span ring_span(const span_shape *s, const span_ring *rg, const span_rank *me,
                              int a, const span_rank *kv, int c) {
  const int qa = me->chunk[a], kc = kv->chunk[c];
  mp_attn_span sp = {s->B, s->nh, s->nkv, s->hd,
                     me->L, me->row[a], rg->bounds[qa + 1] - rg->bounds[qa], rg->bounds[qa],
                     kv->L, kv->row[c], rg->bounds[kc + 1] - rg->bounds[kc], rg->bounds[kc]};
  return sp;
}

/* Rank j->rank's forward: its state from empty, its pairs at every ring step, finalize. */
static mp_status ring_fwd(const span_job *j) {
  const span_shape *s = j->s;
  const span_ring *rg = j->ring;
  const span_rank *me = &rg->rank[j->rank];
  MP_CHECK(j->be->attention_span_init(j->kc, me->lse, (size_t)s->B * s->nh * me->L));
  for (int st = 0; st < rg->cp; st++) {
    const span_rank *kv = &rg->rank[(j->rank - st + rg->cp) % rg->cp];
    for (int a = 0; a < 2; a++)
      for (int c = 0; c < 2; c++) {
        const mp_attn_span sp = ring_span(s, rg, me, a, kv, c);
        MP_CHECK(j->be->attention_span_forward(j->kc, me->acc, me->lse, me->q, kv->k, kv->v, &sp));
      }
  }
  return j->be->attention_span_finalize(j->kc, me->out, me->acc, me->lse, s->B, me->L, s->nh,
                                        s->hd);
}

/* Rank j->rank's backward: D, then its pairs, dk and dv into the kv owner's buffers. */
static mp_status ring_bwd(const span_job *j) {
  const span_shape *s = j->s;
  const span_ring *rg = j->ring;
  const span_rank *me = &rg->rank[j->rank];
  MP_CHECK(j->be->attention_span_dot(j->kc, me->D, me->dout, me->out, s->B, me->L, s->nh, s->hd));
  for (int st = 0; st < rg->cp; st++) {
    const span_rank *kv = &rg->rank[(j->rank - st + rg->cp) % rg->cp];
    for (int a = 0; a < 2; a++)
      for (int c = 0; c < 2; c++) {
        const mp_attn_span sp = ring_span(s, rg, me, a, kv, c);
        MP_CHECK(j->be->attention_span_backward(j->kc, me->dq, kv->dk, kv->dv, me->dout, me->q,
                                                kv->k, kv->v, me->lse, me->D, &sp));
      }
  }
  return MP_OK;
}

/* One call of fn and the backend's synchronize. */
static mp_status span_call(const span_job *j, span_op_fn fn) {
  MP_CHECK(fn(j));
  return j->be->synchronize(j->kc);
}

/* Median seconds per call of fn, wall clock (return value) and CPU time of the process
 * (*cpu_s: every thread's, so on a shared machine it stays near the work done while the
 * wall clock also counts time the threads waited for a core); negative on failure
 * (message on kc->err). */
static double span_time(const span_job *j, span_op_fn fn, double *cpu_s) {
  if (span_call(j, fn) != MP_OK) return -1.0;
  double t0 = now_s();
  if (span_call(j, fn) != MP_OK) return -1.0;
  const double one = now_s() - t0;
  const int inner = one >= kSpanSampleS ? 1 : (int)(kSpanSampleS / (one > 1e-7 ? one : 1e-7)) + 1;
  double wall[kSpanSamples], cpu[kSpanSamples];
  for (int i = 0; i < kSpanSamples; i++) {
    t0 = now_s();
    const double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (int k = 0; k < inner; k++)
      if (span_call(j, fn) != MP_OK) return -1.0;
    cpu[i] = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / inner;
    wall[i] = (now_s() - t0) / inner;
  }
  qsort(wall, kSpanSamples, sizeof(double), cmp_double);
  qsort(cpu, kSpanSamples, sizeof(double), cmp_double);
  *cpu_s = cpu[kSpanSamples / 2];
  return wall[kSpanSamples / 2];
}

/* n host values in [-1, 1) from a fixed pseudo-random sequence; NULL out of memory. */
static float *host_random(size_t n, uint64_t seed) {
  float *x = malloc((n ? n : 1) * sizeof(float));
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; x && i < n; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((z >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
  }
  return x;
}

/* A backend tensor of n elements (X when x, else fp32) holding h, or pseudo-random values
 * from `seed` when h is NULL. */
static mp_status put_tensor(const span_job *j, void **dst, size_t n, int x, const float *h,
                            uint64_t seed) {
  const size_t es = x ? mp_kdtype_bytes(j->be->x_dtype) : sizeof(float);
  *dst = NULL;
  MP_CHECK(j->be->alloc(j->kc, dst, (n ? n : 1) * es));
  float *r = h ? NULL : host_random(n, seed);
  if (!h && !r) return mp_error(j->kc->err, MP_ERR_NOMEM, "attention_bench: out of host memory");
  const float *src = h ? h : r;
  mp_status st = x ? j->be->to_device_f32(j->kc, *dst, src, n)
                   : j->be->memcpy_h2d(j->kc, *dst, src, n * sizeof(float));
  free(r);
  return st;
}

static void span_free_bufs(const span_job *j, span_bufs *b) {
  void *p[] = {b->q, b->k, b->v, b->dout, b->out, b->dq, b->dk, b->dv, b->lse};
  for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) j->be->free(j->kc, p[i]);
  memset(b, 0, sizeof(*b));
}

/* The shape's tensors; the host copies of q, k, v, dout go to *hq .. *hdout (the ring's
 * local copies are cut from them); the caller frees both. */
static mp_status span_alloc_bufs(const span_job *j, span_bufs *b, float **hq, float **hk, float **hv,
                            float **hdout) {
  const span_shape *s = j->s;
  const size_t nq = (size_t)s->B * s->T * s->nh * s->hd, nk = (size_t)s->B * s->T * s->nkv * s->hd;
  memset(b, 0, sizeof(*b));
  *hq = host_random(nq, 1);
  *hk = host_random(nk, 2);
  *hv = host_random(nk, 3);
  *hdout = host_random(nq, 4);
  if (!*hq || !*hk || !*hv || !*hdout)
    return mp_error(j->kc->err, MP_ERR_NOMEM, "attention_bench: out of host memory");
  MP_CHECK(put_tensor(j, &b->q, nq, 1, *hq, 0));
  MP_CHECK(put_tensor(j, &b->k, nk, 1, *hk, 0));
  MP_CHECK(put_tensor(j, &b->v, nk, 1, *hv, 0));
  MP_CHECK(put_tensor(j, &b->dout, nq, 1, *hdout, 0));
  MP_CHECK(put_tensor(j, &b->out, nq, 1, NULL, 5));
  MP_CHECK(put_tensor(j, &b->dq, nq, 1, NULL, 7));
  MP_CHECK(put_tensor(j, &b->dk, nk, 1, NULL, 8));
  MP_CHECK(put_tensor(j, &b->dv, nk, 1, NULL, 9));
  return put_tensor(j, (void **)&b->lse, (size_t)s->B * s->nh * s->T, 0, NULL, 6);
}

static void free_ring(const span_job *j, span_ring *rg) {
  for (int r = 0; r < rg->cp; r++) {
    span_rank *k = &rg->rank[r];
    void *p[] = {k->q, k->k, k->v, k->dout, k->out, k->dq, k->dk, k->dv, k->acc, k->lse, k->D};
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) j->be->free(j->kc, p[i]);
  }
  memset(rg, 0, sizeof(*rg));
}

/* Rank k's local (B, L, w) copy of a global (B, T, w) host tensor. */
static void local_rows(const span_shape *s, const span_ring *rg, const span_rank *k, float *dst,
                       const float *src, size_t w) {
  for (int b = 0; b < s->B; b++)
    for (int c = 0; c < 2; c++) {
      const int ch = k->chunk[c];
      memcpy(dst + ((size_t)b * k->L + k->row[c]) * w, src + ((size_t)b * s->T + rg->bounds[ch]) * w,
             (size_t)(rg->bounds[ch + 1] - rg->bounds[ch]) * w * sizeof(float));
    }
}

/* cp ranks, 2cp chunks as even as possible, each rank's inputs cut from the host copies. */
static mp_status alloc_ring(const span_job *j, int cp, const float *hq, const float *hk,
                            const float *hv, const float *hdout, span_ring *rg) {
  const span_shape *s = j->s;
  memset(rg, 0, sizeof(*rg));
  rg->cp = cp;
  for (int c = 0; c < 2 * cp; c++)
    rg->bounds[c + 1] = rg->bounds[c] + s->T / (2 * cp) + (c < s->T % (2 * cp) ? 1 : 0);
  const size_t qw = (size_t)s->nh * s->hd, kw = (size_t)s->nkv * s->hd;
  for (int r = 0; r < cp; r++) {
    span_rank *k = &rg->rank[r];
    k->chunk[0] = r;
    k->chunk[1] = 2 * cp - 1 - r;
    k->row[0] = 0;
    k->row[1] = rg->bounds[r + 1] - rg->bounds[r];
    k->L = k->row[1] + rg->bounds[2 * cp - r] - rg->bounds[2 * cp - 1 - r];
    const size_t nq = (size_t)s->B * k->L * qw, nk = (size_t)s->B * k->L * kw;
    const size_t nl = (size_t)s->B * s->nh * k->L;
    float *hl = malloc((nq > nk ? nq : nk) * sizeof(float));
    if (!hl) return mp_error(j->kc->err, MP_ERR_NOMEM, "attention_bench: out of host memory");
    mp_status st = MP_OK;
    const float *src[4] = {hq, hdout, hk, hv};
    void **dst[4] = {&k->q, &k->dout, &k->k, &k->v};
    for (int t = 0; t < 4 && st == MP_OK; t++) {
      local_rows(s, rg, k, hl, src[t], t < 2 ? qw : kw);
      st = put_tensor(j, dst[t], t < 2 ? nq : nk, 1, hl, 0);
    }
    free(hl);
    MP_CHECK(st);
    MP_CHECK(put_tensor(j, &k->out, nq, 1, NULL, 12));
    MP_CHECK(put_tensor(j, &k->dq, nq, 1, NULL, 13));
    MP_CHECK(put_tensor(j, &k->dk, nk, 1, NULL, 14));
    MP_CHECK(put_tensor(j, &k->dv, nk, 1, NULL, 15));
    MP_CHECK(put_tensor(j, (void **)&k->acc, nq, 0, NULL, 11));
    MP_CHECK(put_tensor(j, (void **)&k->lse, nl, 0, NULL, 16));
    MP_CHECK(put_tensor(j, (void **)&k->D, nl, 0, NULL, 17));
  }
  return MP_OK;
}

/* One row: wall and CPU milliseconds per call (CPU time on the CPU backend only), GFLOP/s
 * on the wall clock, and the time as a ratio to `base` (the monolithic op's; <= 0: none). */
static void span_row(const span_job *j, const char *op, const char *path, double t, double c,
                     double flops, double base) {
  const span_shape *s = j->s;
  const int on_cpu = j->be->x_dtype == MP_KDTYPE_F32;
  char sh[48], cms[16] = "-", ratio[16] = "-";
  snprintf(sh, sizeof(sh), "B%d T%d h%d/%d d%d", s->B, s->T, s->nh, s->nkv, s->hd);
  if (on_cpu) snprintf(cms, sizeof(cms), "%.3f", c * 1e3);
  const double x = on_cpu ? c : t;
  if (base > 0 && x > 0) snprintf(ratio, sizeof(ratio), "%.3f", x / base);
  printf("%-22s %-4s %-22s %10.3f %10s %9.2f %9s\n", sh, op, path, t * 1e3, cms,
         flops / t / 1e9, ratio);
  fflush(stdout);
}

/* The ring rows of one shape at cp ranks (ratios to the monolithic times bf, bb). */
static mp_status ring_rows(const span_job *j0, int cp, double G, double bf, double bb,
                           const float *hq, const float *hk, const float *hv, const float *hdout) {
  span_ring rg;
  span_job j = *j0;
  j.ring = &rg;
  mp_status st = alloc_ring(&j, cp, hq, hk, hv, hdout, &rg);
  double sum_t[2] = {0, 0}, sum_c[2] = {0, 0}, max_t[2] = {0, 0}, max_c[2] = {0, 0};
  const int on_cpu = j.be->x_dtype == MP_KDTYPE_F32;
  for (int r = 0; r < cp && st == MP_OK; r++) {
    j.rank = r;
    for (int d = 0; d < 2 && st == MP_OK; d++) {
      double c = 0;
      const double t = span_time(&j, d ? ring_bwd : ring_fwd, &c);
      if (t < 0) {
        st = MP_ERR_INTERNAL;
        break;
      }
      sum_t[d] += t;
      sum_c[d] += c;
      if ((on_cpu ? c : t) > (on_cpu ? max_c[d] : max_t[d])) {
        max_c[d] = c;
        max_t[d] = t;
      }
    }
  }
  if (st == MP_OK) {
    char path[32];
    for (int d = 0; d < 2; d++) {
      const double flops = (d ? 5 : 2) * G, base = d ? bb : bf;
      snprintf(path, sizeof(path), "ring cp=%d all ranks", cp);
      span_row(&j, d ? "bwd" : "fwd", path, sum_t[d], sum_c[d], flops, base);
      snprintf(path, sizeof(path), "ring cp=%d max rank", cp);
      span_row(&j, d ? "bwd" : "fwd", path, max_t[d], max_c[d], flops, base);
    }
  }
  free_ring(&j, &rg);
  return st;
}

/* Monolithic and ring rows for every shape on be (initialised on kc); 0 when every row
 * ran. */
static int span_main(const mp_backend *be, mp_kctx *kc, const span_shape *shapes, int n_shapes) {
  const int on_cpu = be->x_dtype == MP_KDTYPE_F32;
  if (on_cpu)
    printf("cpu attention, %d OpenMP threads; median of %d samples\n", omp_get_max_threads(),
           kSpanSamples);
  else
    printf("%s attention, monolithic and ring; median of %d samples\n", be->name, kSpanSamples);
  printf("%-22s %-4s %-22s %10s %10s %9s %9s\n", "shape", "op", "path", "wall ms", "cpu ms",
         "GFLOP/s", "ratio");
  for (int i = 0; i < n_shapes; i++) {
    const span_shape *s = &shapes[i];
    const double G = (double)s->B * s->nh * (double)s->T * s->T * s->hd;
    span_bufs b;
    span_job j = {be, kc, s, &b, NULL, 0};
    float *hq = NULL, *hk = NULL, *hv = NULL, *hdout = NULL;
    mp_status st = span_alloc_bufs(&j, &b, &hq, &hk, &hv, &hdout);
    double cf = 0, cb = 0, tf = -1, tb = -1;
    if (st == MP_OK) tf = span_time(&j, mono_fwd, &cf);
    if (tf > 0) tb = span_time(&j, mono_bwd, &cb);
    if (tf < 0 || tb < 0) st = MP_ERR_INTERNAL;
    if (st == MP_OK) {
      span_row(&j, "fwd", "monolithic", tf, cf, 2 * G, 0);
      span_row(&j, "bwd", "monolithic", tb, cb, 5 * G, 0);
      for (int cp = 2; cp <= kSpanMaxCp && st == MP_OK; cp *= 2)
        st = ring_rows(&j, cp, G, on_cpu ? cf : tf, on_cpu ? cb : tb, hq, hk, hv, hdout);
    }
    span_free_bufs(&j, &b);
    free(hq);
    free(hk);
    free(hv);
    free(hdout);
    if (st != MP_OK) {
      fprintf(stderr, "attention_bench: %s\n", mp_errmsg(kc->err));
      return 1;
    }
  }
  return 0;
}

static int cpu_main(void) {
  mp_ctx err;
  mp_ctx_init(&err);
  mp_kctx kc = {&err, NULL, 0};
  const span_shape shapes[] = {{2, 512, 8, 4, 64}, {8, 64, 8, 4, 8}};
  return span_main(mp_backend_cpu(), &kc, shapes, 2);
}

#ifdef MP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/attention_hooks.h"

enum { kWarm = 2, kReps = 7, kMaxCfgs = 16 };
/* 4 bf16 ulps at the largest magnitude (one ulp is 2^-8 of [1, 2)). */
static const double kTolDiff = 4.0 / 256.0;

typedef struct shape {
  int B, T, nh, nkv, hd;
} shape;

/* Device buffers of one shape; q, k, v, dout inputs; out0, lse0 configuration 0's
 * forward (the backward's inputs); out, lse the forward of the configuration under test. */
typedef struct bufs {
  void *q, *k, *v, *dout, *out0, *out, *dq, *dk, *dv;
  float *lse0, *lse;
  size_t nq, nkv, nl; /* elements of (B, T, nh, hd), (B, T, nkv, hd), (B, nh, T) */
} bufs;

static mp_ctx g_err;
static mp_kctx g_kc;
static const mp_backend *g_be;
static const char *const kKernelName[] = {"fwd", "dkdv", "dq", "dot"};
static const char *const kEnv[] = {"MP_ATTENTION_FWD_CFG", "MP_ATTENTION_DKDV_CFG",
                                   "MP_ATTENTION_DQ_CFG"};

#define BENCH_CHECK(expr)                                                              \
  do {                                                                                 \
    mp_status bs_ = (expr);                                                            \
    if (bs_ != MP_OK) {                                                                \
      fprintf(stderr, "attention_bench: %s failed: %s\n", #expr, mp_errmsg(&g_err));   \
      return bs_;                                                                      \
    }                                                                                  \
  } while (0)

/* One run of the op under test. */
typedef enum op_kind { OP_FWD, OP_BWD } op_kind;
typedef struct op {
  op_kind kind;
  const shape *s;
  const bufs *b;
  void *out;  /* OP_FWD: where the forward writes */
  float *lse;
} op;

static mp_status run_op(const op *o) {
  const shape *s = o->s;
  const bufs *b = o->b;
  if (o->kind == OP_FWD)
    return g_be->attention_forward(&g_kc, o->out, o->lse, b->q, b->k, b->v, s->B, s->T, s->nh,
                                   s->nkv, s->hd, s->hd);
  return g_be->attention_backward(&g_kc, b->dq, b->dk, b->dv, b->dout, b->q, b->k, b->v,
                                  b->out0, b->lse0, s->B, s->T, s->nh, s->nkv, s->hd, s->hd);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Median milliseconds of one run of o, or a negative value on failure (the message is
 * then on g_err). */
static float time_op(const op *o) {
  cudaStream_t st = (cudaStream_t)mp_cuda_stream(&g_kc);
  cudaEvent_t e0, e1;
  if (cudaEventCreate(&e0) != cudaSuccess) return -1.0f;
  if (cudaEventCreate(&e1) != cudaSuccess) {
    cudaEventDestroy(e0);
    return -1.0f;
  }
  float ms[kReps], med = -1.0f;
  for (int i = 0; i < kWarm; i++)
    if (run_op(o) != MP_OK) goto out;
  for (int i = 0; i < kReps; i++) {
    cudaEventRecord(e0, st);
    if (run_op(o) != MP_OK) goto out;
    cudaEventRecord(e1, st);
    if (cudaEventSynchronize(e1) != cudaSuccess) {
      mp_error(&g_err, MP_ERR_CUDA, "event synchronize: %s",
               cudaGetErrorString(cudaGetLastError()));
      goto out;
    }
    cudaEventElapsedTime(&ms[i], e0, e1);
  }
  qsort(ms, kReps, sizeof(float), cmp_float);
  med = ms[kReps / 2];
out:
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return med;
}

/* Host copies for the comparisons: raw bf16 (or fp32) bytes, so no conversion kernel runs
 * (from_device_f32 would stage through the scratch that holds D). */
static mp_status fetch(void *host, const void *dev, size_t bytes) {
  BENCH_CHECK(g_be->synchronize(&g_kc));
  BENCH_CHECK(g_be->memcpy_d2h(&g_kc, host, dev, bytes));
  return MP_OK;
}

/* Running max |x - x0| and max |x0| over n elements (bf16 when f32 == 0); a NaN or inf in
 * x makes the difference infinite. */
typedef struct diff {
  double num, den;
} diff;
static void diff_add(diff *d, const void *x, const void *x0, size_t n, int f32) {
  for (size_t i = 0; i < n; i++) {
    double a = f32 ? ((const float *)x)[i] : mp_bf16_to_f32(((const uint16_t *)x)[i]);
    double b = f32 ? ((const float *)x0)[i] : mp_bf16_to_f32(((const uint16_t *)x0)[i]);
    if (!isfinite(a)) a = INFINITY;
    double e = fabs(a - b);
    if (!(e <= d->num)) d->num = e; /* also takes inf and NaN */
    if (fabs(b) > d->den) d->den = fabs(b);
  }
}
static double diff_of(const diff *d) { return d->num / (d->den > 0 ? d->den : 1.0); }

/* Fills n bf16 elements with values in [-1, 1) from a fixed pseudo-random sequence. */
static mp_status fill_random(void *dst, size_t n, uint64_t seed, float *stage, size_t chunk) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += chunk) {
    size_t m = n - i < chunk ? n - i : chunk;
    for (size_t j = 0; j < m; j++) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      stage[j] = (float)((z >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
    }
    BENCH_CHECK(g_be->to_device_f32(&g_kc, (char *)dst + i * 2, stage, m));
  }
  return MP_OK;
}

static void free_bufs(bufs *b) {
  void *p[] = {b->q, b->k, b->v, b->dout, b->out0, b->out, b->dq, b->dk, b->dv, b->lse0, b->lse};
  for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) g_be->free(&g_kc, p[i]);
  memset(b, 0, sizeof(*b));
}

static mp_status alloc_bufs(const shape *s, bufs *b) {
  memset(b, 0, sizeof(*b));
  b->nq = (size_t)s->B * s->T * s->nh * s->hd;
  b->nkv = (size_t)s->B * s->T * s->nkv * s->hd;
  b->nl = (size_t)s->B * s->nh * s->T;
  void **x[] = {&b->q, &b->dout, &b->out0, &b->out, &b->dq, &b->k, &b->v, &b->dk, &b->dv};
  for (int i = 0; i < 9; i++) BENCH_CHECK(g_be->alloc(&g_kc, x[i], (i < 5 ? b->nq : b->nkv) * 2));
  BENCH_CHECK(g_be->alloc(&g_kc, (void **)&b->lse0, b->nl * sizeof(float)));
  BENCH_CHECK(g_be->alloc(&g_kc, (void **)&b->lse, b->nl * sizeof(float)));
  enum { kChunk = 1 << 22 };
  float *stage = malloc(kChunk * sizeof(float));
  if (!stage) return mp_error(&g_err, MP_ERR_NOMEM, "attention_bench: out of host memory");
  mp_status st = MP_OK;
  void *in[] = {b->q, b->k, b->v, b->dout};
  size_t n[] = {b->nq, b->nkv, b->nkv, b->nq};
  for (int i = 0; i < 4 && st == MP_OK; i++) st = fill_random(in[i], n[i], 17 + i, stage, kChunk);
  /* The gradients start non-zero too (the += is part of the work). */
  void *g[] = {b->dq, b->dk, b->dv};
  size_t ng[] = {b->nq, b->nkv, b->nkv};
  for (int i = 0; i < 3 && st == MP_OK; i++) st = fill_random(g[i], ng[i], 31 + i, stage, kChunk);
  free(stage);
  return st;
}

/* One row of the table. */
typedef struct row {
  int kernel, cfg;
  float ms;      /* < 0: failed (msg) */
  double diff;   /* vs configuration 0 */
  int ok;        /* ran and diff <= kTolDiff */
} row;

static void print_header(void) {
  printf("%-22s %-5s %-3s %-26s %4s %5s %7s %6s %8s %7s %9s\n", "shape", "kern", "cfg",
         "description", "regs", "spill", "smem", "blk/SM", "ms", "TF/s", "diff");
}

static void print_row(const shape *s, const char *kern, int cfg, const char *desc, int regs,
                      int spill, int smem, int blocks, float ms, double flops, double diff,
                      int show_diff, const char *note) {
  char sh[32], c[8], r[8], sp[8], sm[12], bl[8], t[12], tf[12], df[16];
  snprintf(sh, sizeof(sh), "B%d T%d h%d/%d d%d", s->B, s->T, s->nh, s->nkv, s->hd);
  snprintf(c, sizeof(c), cfg >= 0 ? "%d" : "-", cfg);
  snprintf(r, sizeof(r), regs > 0 ? "%d" : "-", regs);
  snprintf(sp, sizeof(sp), regs > 0 ? "%d" : "-", spill);
  snprintf(sm, sizeof(sm), smem > 0 ? "%.1fK" : "-", smem / 1024.0);
  snprintf(bl, sizeof(bl), regs > 0 ? "%d" : "-", blocks);
  snprintf(t, sizeof(t), ms >= 0 ? "%.3f" : "-", ms);
  snprintf(tf, sizeof(tf), ms > 0 && flops > 0 ? "%.1f" : "-", flops / (ms * 1e-3) / 1e12);
  if (show_diff)
    snprintf(df, sizeof(df), "%.2e", diff);
  else
    snprintf(df, sizeof(df), "-");
  printf("%-22s %-5s %-3s %-26s %4s %5s %7s %6s %8s %7s %9s%s%s\n", sh, kern, c, desc, r, sp, sm,
         bl, t, tf, df, note && *note ? "  " : "", note ? note : "");
}

/* Host copies of one kernel's outputs, configuration 0's (ref) and the current one's
 * (cur): ref0, cur0 the forward's out, dK/dV's dk or dQ's dq; ref1, cur1 dK/dV's dv;
 * lref, lcur the forward's lse. */
typedef struct host_outs {
  size_t n_main; /* elements of ref0, ref1, cur0, cur1 */
  uint16_t *ref0, *ref1, *cur0, *cur1;
  float *lref, *lcur;
} host_outs;

static void host_outs_free(host_outs *h) {
  free(h->ref0);
  free(h->ref1);
  free(h->cur0);
  free(h->cur1);
  free(h->lref);
  free(h->lcur);
}

static mp_status host_outs_alloc(host_outs *h, const bufs *b, int kernel) {
  h->n_main = kernel == MP_FA2_DKDV ? b->nkv : b->nq;
  h->ref0 = malloc(h->n_main * 2);
  h->ref1 = malloc(h->n_main * 2);
  h->cur0 = malloc(h->n_main * 2);
  h->cur1 = malloc(h->n_main * 2);
  h->lref = malloc(b->nl * 4);
  h->lcur = malloc(b->nl * 4);
  if (!h->ref0 || !h->ref1 || !h->cur0 || !h->cur1 || !h->lref || !h->lcur)
    return mp_error(&g_err, MP_ERR_NOMEM, "attention_bench: out of host memory");
  return MP_OK;
}

/* One checked forward of configuration c: out and lse fetched (configuration 0's as the
 * reference) and, for c > 0, compared with the reference into *d. */
static mp_status check_fwd(const op *o, const bufs *b, int c, host_outs *h, diff *d) {
  mp_status rs = run_op(o);
  if (rs == MP_OK) rs = fetch(c == 0 ? h->ref0 : h->cur0, o->out, b->nq * 2);
  if (rs == MP_OK) rs = fetch(c == 0 ? h->lref : h->lcur, o->lse, b->nl * 4);
  if (rs == MP_OK && c > 0) {
    diff_add(d, h->cur0, h->ref0, b->nq, 0);
    diff_add(d, h->lcur, h->lref, b->nl, 1);
  }
  return rs;
}

/* One checked dK/dV or dQ of configuration c from a known state: D into the scratch, the
 * gradients zeroed, the kernel alone; its gradients fetched and, for c > 0, compared with
 * configuration 0's into *d. */
static mp_status check_bwd(const op *o, const bufs *b, int kernel, int c, host_outs *h, diff *d) {
  void *g0 = kernel == MP_FA2_DKDV ? b->dk : b->dq, *g1 = kernel == MP_FA2_DKDV ? b->dv : NULL;
  mp_cuda_attention_fa2_bwd_kernels(1u << MP_FA2_DOT); /* D into the scratch */
  mp_status rs = run_op(o);
  if (rs == MP_OK) rs = g_be->memset_zero(&g_kc, g0, h->n_main * 2);
  if (rs == MP_OK && g1) rs = g_be->memset_zero(&g_kc, g1, h->n_main * 2);
  mp_cuda_attention_fa2_bwd_kernels(1u << kernel);
  if (rs == MP_OK) rs = run_op(o);
  if (rs == MP_OK) rs = fetch(c == 0 ? h->ref0 : h->cur0, g0, h->n_main * 2);
  if (rs == MP_OK && g1) rs = fetch(c == 0 ? h->ref1 : h->cur1, g1, h->n_main * 2);
  if (rs == MP_OK && c > 0) {
    diff_add(d, h->cur0, h->ref0, h->n_main, 0);
    if (g1) diff_add(d, h->cur1, h->ref1, h->n_main, 0);
  }
  return rs;
}

/* Configuration c of kernel (forced already): one checked run, its difference from
 * configuration 0 into r->diff, then its median time into r->ms. */
static mp_status measure_config(const op *o, const bufs *b, int kernel, int c, host_outs *h,
                                row *r) {
  diff d = {0, 0};
  mp_status rs = kernel == MP_FA2_FWD ? check_fwd(o, b, c, h, &d) : check_bwd(o, b, kernel, c, h, &d);
  if (rs != MP_OK) return rs;
  r->diff = c > 0 ? diff_of(&d) : 0.0;
  r->ms = time_op(o);
  return r->ms < 0 ? MP_ERR_CUDA : MP_OK;
}

/* Sweeps one kernel's configurations; rows[c] gets each result. The forward writes cfg
 * 0's outputs into out0 / lse0 (the backward's inputs), the others into out / lse. */
static mp_status sweep(const shape *s, bufs *b, int kernel, double G, row *rows, int *n_rows) {
  const int n = mp_cuda_attention_fa2_n_configs(kernel);
  const double flops = (kernel == MP_FA2_FWD ? 2 : kernel == MP_FA2_DKDV ? 4 : 3) * G;
  host_outs h;
  mp_status st = host_outs_alloc(&h, b, kernel);
  if (st != MP_OK) goto done;
  *n_rows = n;
  for (int c = 0; c < n; c++) {
    row *r = &rows[c];
    *r = (row){.kernel = kernel, .cfg = c, .ms = -1.0f, .diff = INFINITY, .ok = 0};
    char desc[64] = "", note[200] = "";
    int regs = 0, smem = 0, local = 0, blocks = 0;
    if (mp_cuda_attention_fa2_config_info(&g_kc, kernel, c, s->hd, desc, sizeof(desc), &regs,
                                          &smem, &local, &blocks) != MP_OK)
      snprintf(note, sizeof(note), "info: %s", mp_errmsg(&g_err));
    mp_cuda_attention_fa2_force_config(kernel, c);
    op o = {kernel == MP_FA2_FWD ? OP_FWD : OP_BWD, s, b, c == 0 ? b->out0 : b->out,
            c == 0 ? b->lse0 : b->lse};
    mp_status rs = measure_config(&o, b, kernel, c, &h, r);
    if (rs != MP_OK) {
      snprintf(note, sizeof(note), "skipped: %s", mp_errmsg(&g_err));
      r->ms = -1.0f;
      if (c == 0) { /* nothing to compare with: give up on this kernel */
        print_row(s, kKernelName[kernel], c, desc, regs, local, smem, blocks, -1, flops, 0, 0,
                  note);
        st = rs;
        goto done;
      }
    } else {
      r->ok = r->diff <= kTolDiff;
      if (!r->ok) snprintf(note, sizeof(note), "MISMATCH");
    }
    print_row(s, kKernelName[kernel], c, desc, regs, local, smem, blocks, r->ms, flops,
              r->diff, rs == MP_OK, note);
    fflush(stdout);
  }
done:
  mp_cuda_attention_fa2_force_config(kernel, -1);
  mp_cuda_attention_fa2_bwd_kernels(0);
  host_outs_free(&h);
  return st;
}

/* Index of the fastest row that ran and matched; 0 when none did. */
static int best_of(const row *rows, int n) {
  int best = 0;
  for (int c = 0; c < n; c++)
    if (rows[c].ok && rows[c].ms >= 0 &&
        (!rows[best].ok || rows[best].ms < 0 || rows[c].ms < rows[best].ms))
      best = c;
  return best;
}

/* Sweeps one shape; best[3] gets the fastest configuration of each kernel. */
static mp_status bench_shape(const shape *s, int best[3]) {
  bufs b;
  mp_status st = alloc_bufs(s, &b);
  if (st != MP_OK) {
    fprintf(stderr, "attention_bench: allocation failed: %s\n", mp_errmsg(&g_err));
    free_bufs(&b);
    return st;
  }
  const double G = (double)s->B * s->nh * (double)s->T * s->T * s->hd; /* one causal GEMM */
  row rows[3][kMaxCfgs];
  int n[3] = {0, 0, 0};
  best[0] = best[1] = best[2] = 0;
  st = sweep(s, &b, MP_FA2_FWD, G, rows[MP_FA2_FWD], &n[MP_FA2_FWD]);
  if (st == MP_OK) {
    /* D alone (every backward pays it once). */
    op o = {OP_BWD, s, &b, NULL, NULL};
    mp_cuda_attention_fa2_bwd_kernels(1u << MP_FA2_DOT);
    float t = time_op(&o);
    mp_cuda_attention_fa2_bwd_kernels(0);
    char note[200];
    if (t > 0) /* reads dout and out, writes D */
      snprintf(note, sizeof(note), "%.0f GB/s", (4.0 * b.nq + 4.0 * b.nl) / (t * 1e-3) / 1e9);
    else
      snprintf(note, sizeof(note), "%s", mp_errmsg(&g_err));
    print_row(s, "dot", -1, "D = rowsum(dout*out)", 0, 0, 0, 0, t, 0.0, 0, 0, note);
    st = sweep(s, &b, MP_FA2_DKDV, G, rows[MP_FA2_DKDV], &n[MP_FA2_DKDV]);
  }
  if (st == MP_OK) st = sweep(s, &b, MP_FA2_DQ, G, rows[MP_FA2_DQ], &n[MP_FA2_DQ]);
  if (st == MP_OK) {
    for (int k = 0; k < 3; k++) best[k] = best_of(rows[k], n[k]);
    /* The whole backward, default and best, as attention_backward runs it. */
    for (int pass = 0; pass < 2; pass++) {
      const int kv = pass ? best[MP_FA2_DKDV] : 0, q = pass ? best[MP_FA2_DQ] : 0;
      char desc[64];
      snprintf(desc, sizeof(desc), "dot+dkdv %d+dq %d%s", kv, q, pass ? " (best)" : "");
      mp_cuda_attention_fa2_force_config(MP_FA2_DKDV, kv);
      mp_cuda_attention_fa2_force_config(MP_FA2_DQ, q);
      op o = {OP_BWD, s, &b, NULL, NULL};
      float t = time_op(&o);
      print_row(s, "bwd", -1, desc, 0, 0, 0, 0, t, 5 * G, 0, 0, t < 0 ? mp_errmsg(&g_err) : "");
    }
    mp_cuda_attention_fa2_force_config(MP_FA2_DKDV, -1);
    mp_cuda_attention_fa2_force_config(MP_FA2_DQ, -1);
  }
  free_bufs(&b);
  return st;
}

static int cuda_main(void) {
  if (mp_cuda_device_count() == 0) {
    printf("no CUDA device\n");
    return 0;
  }
  mp_ctx_init(&g_err);
  g_kc.err = &g_err;
  g_be = mp_cuda_backend();
  BENCH_CHECK(g_be->init(&g_kc, 0));
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    printf("device: %s (cc %d.%d, %d SMs)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
  /* The 1B model's attention (kernels_bench's shape), then a head-dim 64 shape. */
  const shape shapes[] = {{4, 2048, 16, 8, 128}, {8, 2048, 32, 8, 64}};
  const int n_shapes = (int)(sizeof(shapes) / sizeof(shapes[0]));
  int best[2][3], failed = 0;
  print_header();
  for (int i = 0; i < n_shapes; i++)
    if (bench_shape(&shapes[i], best[i]) != MP_OK) {
      failed = 1;
      best[i][0] = best[i][1] = best[i][2] = -1;
    }
  for (int i = n_shapes - 1; i >= 0; i--) {
    const shape *s = &shapes[i];
    if (best[i][0] >= 0)
      printf("best for B%d T%d nh%d nkv%d hd%d: %s=%d %s=%d %s=%d\n", s->B, s->T, s->nh, s->nkv,
             s->hd, kEnv[0], best[i][0], kEnv[1], best[i][1], kEnv[2], best[i][2]);
  }
  /* The last line: the benchmark shape's choice (shapes[0]). */
  if (best[0][0] >= 0)
    printf("best: %s=%d %s=%d %s=%d\n", kEnv[0], best[0][0], kEnv[1], best[0][1], kEnv[2],
           best[0][2]);
  g_be->shutdown(&g_kc);
  return failed;
}
#endif

/* --ring on the GPU: span_main at the sweep's two shapes. */
static int cuda_ring_main(void) {
#ifdef MP_HAVE_CUDA
  if (mp_cuda_device_count() == 0) {
    printf("no CUDA device\n");
    return 0;
  }
  mp_ctx err;
  mp_ctx_init(&err);
  mp_kctx kc = {&err, NULL, 0};
  const mp_backend *be = mp_cuda_backend();
  if (be->init(&kc, 0) != MP_OK) {
    fprintf(stderr, "attention_bench: %s\n", mp_errmsg(&err));
    return 1;
  }
  const span_shape shapes[] = {{4, 2048, 16, 8, 128}, {8, 2048, 32, 8, 64}};
  const int rc = span_main(be, &kc, shapes, 2);
  be->shutdown(&kc);
  return rc;
#else
  printf("no CUDA device (built without CUDA)\n");
  return 0;
#endif
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--cpu") == 0) return cpu_main();
  if (argc == 2 && strcmp(argv[1], "--ring") == 0) return cuda_ring_main();
  if (argc > 1) {
    fprintf(stderr, "usage: attention_bench [--cpu | --ring]: no argument sweeps the CUDA "
            "tensor-core kernels' tile configurations, --cpu times the CPU backend's "
            "monolithic and ring attention, --ring the CUDA backend's\n");
    return 2;
  }
#ifdef MP_HAVE_CUDA
  return cuda_main();
#else
  printf("no CUDA device (built without CUDA)\n");
  return 0;
#endif
}
