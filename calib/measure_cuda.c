/* Calibration on one CUDA GPU: which GPU profile's datasheet a device is measured
 * against, and the measurement half of `meshplan calibrate --device cuda`
 * (docs/calibration.md, "CUDA", says what is timed and why; fit.c fits it).
 *
 * Every op runs through the CUDA backend table (kernels/ops.h, mp_cuda_backend()), never a
 * kernel directly, so the figures are those of the kernels the runtime trains with, and
 * the float8 and attention kernels can change underneath. Times come from two CUDA
 * events on the backend's stream (mp_cuda_stream) around a loop of calls.
 *
 * Invariants: every device buffer is allocated and freed within its phase (the GEMMs,
 * the bandwidth kernels, attention, float8), so a failed phase leaks nothing and the
 * largest phase, not the sum, bounds device memory (about 2 GiB with the defaults); an
 * optional phase (attention, float8) that fails records its message and frees what it
 * took. Without CUDA at build time the two entry points report it and do nothing. */
#include "calib/calibrate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib_internal.h"
#include "common/progress.h"
#include "common/stats.h"
#include "kernels/cuda/cuda.h"

/* ---- the GPU profile ------------------------------------------------------------------- */

const char *mp_calib_gpu_profile_for(const char *name, int cc, double mem_bytes) {
  if (name == NULL) return NULL;
  const double gib = mem_bytes / 1073741824.0;
  /* The datasheet peaks differ between SXM, PCIe and NVL parts of one GPU, and a
   * Grace-Hopper GH200 is not an H200: only names that say which part it is match. */
  if (strstr(name, "PCIe") || strstr(name, "NVL") || strstr(name, "GH200")) return NULL;
  if (strstr(name, "H200") && cc == 90) return "h200";
  if (strstr(name, "H100") && cc == 90) return gib > 88.0 ? "h100-96gb-500w" : "h100-sxm";
  if (strstr(name, "A100") && cc == 80) return gib > 60.0 ? "a100-80gb-sxm" : NULL;
  if (strstr(name, "GB300") && cc == 103) return "gb300";
  if (strstr(name, "GB200") && cc == 100) return "gb200"; /* before "B200", which it contains */
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

#ifndef MP_HAVE_CUDA

mp_status mp_calib_cuda_probe(mp_ctx *ctx, int device, mp_calib_device *out) {
  (void)device;
  memset(out, 0, sizeof *out);
  return mp_error(ctx, MP_ERR_UNSUPPORTED, "no CUDA device visible: this meshplan was built without CUDA (no "
                  "toolkit at build time, or MESHPLAN_NO_CUDA=1); build it with the CUDA toolkit and run on a "
                  "machine with an NVIDIA GPU");
}

mp_status mp_calib_measure_cuda(mp_ctx *ctx, const mp_backend *be, mp_kctx *kc, const mp_calib_options *opts,
                                mp_calib *out) {
  (void)be, (void)kc, (void)opts, (void)out;
  return mp_error(ctx, MP_ERR_UNSUPPORTED, "calibrate: this meshplan was built without CUDA");
}

#else
#include <cuda_runtime_api.h>

#define CAL_CUDA(ctx, stmt)                                                                           \
  do {                                                                                                \
    cudaError_t cal_e_ = (stmt);                                                                      \
    if (cal_e_ != cudaSuccess)                                                                        \
      return mp_error((ctx), MP_ERR_CUDA, "%s:%d: %s failed: %s", __FILE__, __LINE__, #stmt,          \
                      cudaGetErrorString(cal_e_));                                                    \
  } while (0)

mp_status mp_calib_cuda_probe(mp_ctx *ctx, int device, mp_calib_device *out) {
  memset(out, 0, sizeof *out);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    const char *why = cudaGetErrorString(e);
    cudaGetLastError(); /* no driver / no device is an answer, not an error for later calls */
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "no CUDA device visible (cudaGetDeviceCount: %s); run on a machine "
                    "with an NVIDIA GPU", why);
  }
  if (n == 0) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "no CUDA device visible (cudaGetDeviceCount: 0 devices%s%s); run on "
                    "a machine with an NVIDIA GPU", vis ? ", CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "");
  }
  if (device < 0 || device >= n)
    return mp_error(ctx, MP_ERR_USAGE, "CUDA device %d does not exist (%d visible); choose 0 .. %d", device, n,
                    n - 1);
  struct cudaDeviceProp p;
  e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess) {
    const char *why = cudaGetErrorString(e);
    cudaGetLastError();
    return mp_error(ctx, MP_ERR_CUDA, "CUDA device %d: cudaGetDeviceProperties: %s", device, why);
  }
  snprintf(out->name, sizeof out->name, "%s", p.name);
  out->compute_capability = p.major * 10 + p.minor;
  out->mem_bytes = (double)p.totalGlobalMem;
  out->n_sms = p.multiProcessorCount;
  return MP_OK;
}

/* ---- timing ---------------------------------------------------------------------------- */

enum {
  WARM_CALLS = 2,        /* untimed: cuBLASLt heuristics, first-touch, clocks */
  MAX_LOOP_CALLS = 256,  /* per timed repetition */
  LAUNCH_CALLS = 256,    /* the launch figure's loop */
  FILL_BLOCK = 1 << 22   /* host floats copied over and over into large buffers */
};
#define LOOP_TARGET_S 1e-3 /* a repetition lasts about this long: event resolution is ~0.5 us */

typedef enum op_kind {
  OP_LAUNCH, OP_GEMM_FWD, OP_GEMM_DGRAD, OP_GEMM_WGRAD, OP_COPY, OP_RMS_FWD, OP_RMS_BWD, OP_SWI_FWD,
  OP_SWI_BWD, OP_ADAMW, OP_ATTN_FWD, OP_ATTN_BWD, OP_F8_FWD, OP_F8_DGRAD, OP_F8_WGRAD
} op_kind;

/* One call of one backend entry: which, its buffers and its sizes. */
typedef struct op {
  op_kind kind;
  void *x[6];        /* X tensors (bf16) */
  float *f[4];       /* fp32 tensors */
  const uint8_t *u[2]; /* float8 codes */
  int a, b, c, d, e; /* sizes, per kind (see run) */
  size_t n;          /* elements or bytes, per kind */
} op;

typedef struct cal {
  mp_ctx *ctx;
  const mp_backend *be;
  mp_kctx *kc;
  cudaStream_t stream;
  cudaEvent_t e0, e1;
  int events;    /* e0 and e1 exist */
  int reps;
  double *t;     /* reps */
  float *rnd;    /* FILL_BLOCK values in [-1, 1) */
  float *pos;    /* FILL_BLOCK values in [0, 1) (AdamW's second moment must be >= 0) */
  uint8_t *f8b;  /* FILL_BLOCK float8 codes of magnitude < 2, valid E4M3 and E5M2 alike */
  mp_progress prog;
  int64_t done;
} cal;

static mp_status run(cal *C, const op *o) {
  const mp_backend *be = C->be;
  mp_kctx *kc = C->kc;
  switch (o->kind) {
    case OP_LAUNCH: return be->scale_f32(kc, o->f[0], 1, 1.0f);
    /* a = N, b = K, c = M; x0 inp (N, K), x1 W (M, K), x2 out / dout (N, M), x3 dinp, f0 dW */
    case OP_GEMM_FWD: return be->matmul_forward(kc, o->x[2], o->x[0], o->x[1], NULL, o->a, o->b, o->c);
    case OP_GEMM_DGRAD:
      return be->matmul_backward(kc, o->x[3], NULL, NULL, o->x[2], o->x[0], o->x[1], o->a, o->b, o->c);
    case OP_GEMM_WGRAD:
      return be->matmul_backward(kc, NULL, o->f[0], NULL, o->x[2], o->x[0], o->x[1], o->a, o->b, o->c);
    case OP_COPY: return be->memcpy_d2d(kc, o->x[1], o->x[0], o->n);
    /* a = rows, b = cols: x0 x, x1 w, x2 out / dout, x3 dx; f0 rstd, f1 dw */
    case OP_RMS_FWD: return be->rmsnorm_forward(kc, o->x[2], o->f[0], o->x[0], o->x[1], o->a, o->b, 1e-5f);
    case OP_RMS_BWD:
      return be->rmsnorm_backward(kc, o->x[3], o->f[1], o->x[2], o->x[0], o->x[1], o->f[0], o->a, o->b);
    /* n elements: x0 gate, x1 up, x2 out / dout, x3 dgate, x4 dup */
    case OP_SWI_FWD: return be->swiglu_forward(kc, o->x[2], o->x[0], o->x[1], o->n);
    case OP_SWI_BWD: return be->swiglu_backward(kc, o->x[3], o->x[4], o->x[2], o->x[0], o->x[1], o->n);
    case OP_ADAMW:
      return be->adamw_update(kc, o->f[0], o->f[1], o->f[2], o->f[3], o->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1,
                              1.0f);
    /* a = B, b = T, c = nh, d = nkv, e = hd: x0 q, x1 k, x2 v, x3 out / dout, x4 dq, x5 dk
     * then dv right after dk in x5; f0 lse */
    case OP_ATTN_FWD:
      return be->attention_forward(kc, o->x[3], o->f[0], o->x[0], o->x[1], o->x[2], o->a, o->b, o->c, o->d, o->e, o->e);
    case OP_ATTN_BWD: {
      void *dv = (char *)o->x[5] + (size_t)o->a * o->b * o->d * o->e * mp_kdtype_bytes(be->x_dtype);
      return be->attention_backward(kc, o->x[4], o->x[5], dv, o->x[3], o->x[0], o->x[1], o->x[2], o->x[3], o->f[0],
                                    o->a, o->b, o->c, o->d, o->e, o->e);
    }
    /* The Linear's three GEMMs as exec/runtime/runtime.c calls them (lin_fwd, lin_bwd),
     * a = N, b = K, c = M: u0 the A codes, u1 the B codes, f0 the two scales, x0 the bf16
     * output, f1 the fp32 one. forward: out (N, M) = x (N, K) E4M3 . W (M, K)^T E4M3,
     * fast accumulation; dgrad: dinp (N, K) += dy (N, M) E5M2 . (W^T) (K, M)^T E4M3;
     * wgrad: dW (M, K) += (dy^T) (M, N) E5M2 . (x^T) (K, N)^T E4M3, fp32. */
    case OP_F8_FWD:
      return be->matmul_f8(kc, o->x[0], NULL, o->u[0], o->f[0], MP_F8_E4M3, o->u[1], o->f[0] + 1, MP_F8_E4M3,
                           o->a, o->b, o->c, MP_F8_GEMM_FAST_ACCUM);
    case OP_F8_DGRAD:
      return be->matmul_f8(kc, o->x[0], NULL, o->u[0], o->f[0], MP_F8_E5M2, o->u[1], o->f[0] + 1, MP_F8_E4M3,
                           o->a, o->c, o->b, MP_F8_GEMM_ADD);
    case OP_F8_WGRAD:
      return be->matmul_f8(kc, NULL, o->f[1], o->u[0], o->f[0], MP_F8_E5M2, o->u[1], o->f[0] + 1, MP_F8_E4M3,
                           o->c, o->a, o->b, 0);
  }
  return mp_error(C->ctx, MP_ERR_INTERNAL, "calibrate: unknown op %d", (int)o->kind);
}

/* Seconds per call of o: WARM_CALLS untimed calls, then `reps` repetitions of a loop of
 * calls between two events (calls > 0: that many; 0: enough for LOOP_TARGET_S, from one
 * timed call), median over repetitions. */
static mp_status time_op(cal *C, const op *o, int calls, double *per_call_s) {
  float ms = 0;
  for (int i = 0; i < WARM_CALLS; i++) MP_CHECK(run(C, o));
  CAL_CUDA(C->ctx, cudaStreamSynchronize(C->stream)); /* a kernel's own fault surfaces here */
  if (calls <= 0) {
    CAL_CUDA(C->ctx, cudaEventRecord(C->e0, C->stream));
    MP_CHECK(run(C, o));
    CAL_CUDA(C->ctx, cudaEventRecord(C->e1, C->stream));
    CAL_CUDA(C->ctx, cudaEventSynchronize(C->e1));
    CAL_CUDA(C->ctx, cudaEventElapsedTime(&ms, C->e0, C->e1));
    double k = ms > 0 ? ceil(LOOP_TARGET_S / (ms * 1e-3)) : MAX_LOOP_CALLS;
    calls = k < 1 ? 1 : k > MAX_LOOP_CALLS ? MAX_LOOP_CALLS : (int)k;
  }
  for (int r = 0; r < C->reps; r++) {
    CAL_CUDA(C->ctx, cudaEventRecord(C->e0, C->stream));
    for (int i = 0; i < calls; i++) MP_CHECK(run(C, o));
    CAL_CUDA(C->ctx, cudaEventRecord(C->e1, C->stream));
    CAL_CUDA(C->ctx, cudaEventSynchronize(C->e1));
    CAL_CUDA(C->ctx, cudaEventElapsedTime(&ms, C->e0, C->e1));
    C->t[r] = (double)ms * 1e-3 / calls;
  }
  *per_call_s = mp_median(C->t, (size_t)C->reps);
  if (!(*per_call_s > 0))
    return mp_error(C->ctx, MP_ERR_CUDA, "calibrate: op %d timed at %g s per call; CUDA events gave no time",
                    (int)o->kind, *per_call_s);
  mp_progress_update(&C->prog, ++C->done);
  return MP_OK;
}

/* ---- device buffers -------------------------------------------------------------------- */

/* Fills n elements of an X tensor from the pseudo-random block (never zeros: a GEMM on
 * zeros runs faster than on data). */
static mp_status fill_x(cal *C, void *dst, size_t n) {
  const size_t eb = mp_kdtype_bytes(C->be->x_dtype);
  for (size_t i = 0; i < n; i += FILL_BLOCK) {
    size_t m = n - i < FILL_BLOCK ? n - i : FILL_BLOCK;
    MP_CHECK(C->be->to_device_f32(C->kc, (char *)dst + i * eb, C->rnd, m));
  }
  return MP_OK;
}

static mp_status fill_f32(cal *C, float *dst, size_t n, const float *src) {
  for (size_t i = 0; i < n; i += FILL_BLOCK) {
    size_t m = n - i < FILL_BLOCK ? n - i : FILL_BLOCK;
    MP_CHECK(C->be->memcpy_h2d(C->kc, dst + i, src, m * sizeof(float)));
  }
  return MP_OK;
}

static mp_status fill_u8(cal *C, uint8_t *dst, size_t n) {
  for (size_t i = 0; i < n; i += FILL_BLOCK) {
    size_t m = n - i < FILL_BLOCK ? n - i : FILL_BLOCK;
    MP_CHECK(C->be->memcpy_h2d(C->kc, dst + i, C->f8b, m));
  }
  return MP_OK;
}

/* A set of device buffers freed together. */
#define MAX_BUFS 12
typedef struct bufset {
  void *p[MAX_BUFS];
  int n;
} bufset;

static mp_status balloc(cal *C, bufset *s, size_t bytes, void **out) {
  *out = NULL;
  if (s->n >= MAX_BUFS) return mp_error(C->ctx, MP_ERR_INTERNAL, "calibrate: too many buffers in one phase");
  MP_CHECK(C->be->alloc(C->kc, out, bytes > 0 ? bytes : 256));
  s->p[s->n++] = *out;
  return MP_OK;
}

static void bfree(cal *C, bufset *s) {
  /* queued work may still use them: cudaFree waits for the device */
  for (int i = 0; i < s->n; i++) C->be->free(C->kc, s->p[i]);
  s->n = 0;
}

/* ---- phases ---------------------------------------------------------------------------- */

static mp_status phase_launch(cal *C, mp_calib *out) {
  bufset s = {{0}, 0};
  op o = {.kind = OP_LAUNCH};
  mp_status st = balloc(C, &s, 256, (void **)&o.f[0]);
  if (st == MP_OK) st = fill_f32(C, o.f[0], 1, C->pos);
  if (st == MP_OK) st = time_op(C, &o, LAUNCH_CALLS, &out->launch_s);
  bfree(C, &s);
  return st;
}

/* Times each shape's GEMM with tmpl's buffers: kinds[] is the op of the pass FWD, DGRAD,
 * WGRAD; the points are appended to pts (*n_pts of them). */
static mp_status time_gemms(cal *C, const op *tmpl, const op_kind kinds[3], const mp_calib_gemm_shape *shape,
                            int n, mp_calib_gemm *pts, int *n_pts) {
  for (int i = 0; i < n; i++) {
    op g = *tmpl;
    const int pass = shape[i].pass;
    g.kind = kinds[pass == MP_CALIB_GEMM_DGRAD ? 1 : pass == MP_CALIB_GEMM_WGRAD ? 2 : 0];
    g.a = shape[i].N;
    g.b = shape[i].K;
    g.c = shape[i].M;
    double t = 0;
    MP_CHECK(time_op(C, &g, 0, &t));
    pts[(*n_pts)++] = mp_calib_gemm_point(pass, g.a, g.b, g.c, t);
  }
  return MP_OK;
}

static mp_status phase_gemm(cal *C, const mp_calib_options *o, mp_calib *out) {
  size_t nk, mk, nm;
  mp_calib_gemm_extents(o->gemm, o->n_gemm, &nk, &mk, &nm);
  const size_t eb = mp_kdtype_bytes(C->be->x_dtype);
  bufset s = {{0}, 0};
  op b = {.kind = OP_GEMM_FWD};
  mp_status st = MP_OK;
  MP_CHECK_GOTO(balloc(C, &s, nk * eb, &b.x[0]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, mk * eb, &b.x[1]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, nm * eb, &b.x[2]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, nk * eb, &b.x[3]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, mk * sizeof(float), (void **)&b.f[0]), st, done);
  MP_CHECK_GOTO(fill_x(C, b.x[0], nk), st, done);
  MP_CHECK_GOTO(fill_x(C, b.x[1], mk), st, done);
  MP_CHECK_GOTO(fill_x(C, b.x[2], nm), st, done);
  /* the gradients accumulate (+=): start from data, as a second micro-batch does */
  MP_CHECK_GOTO(fill_x(C, b.x[3], nk), st, done);
  MP_CHECK_GOTO(fill_f32(C, b.f[0], mk, C->rnd), st, done);
  {
    const op_kind kinds[3] = {OP_GEMM_FWD, OP_GEMM_DGRAD, OP_GEMM_WGRAD};
    MP_CHECK_GOTO(time_gemms(C, &b, kinds, o->gemm, o->n_gemm, out->gemm, &out->n_gemm), st, done);
  }
done:
  bfree(C, &s);
  if (st != MP_OK) mp_error_prefix(C->ctx, "calibrate: bf16 GEMMs");
  return st;
}

static mp_status phase_bandwidth(cal *C, const mp_calib_options *o, mp_calib *out) {
  const size_t eb = mp_kdtype_bytes(C->be->x_dtype);
  bufset s = {{0}, 0};
  mp_status st = MP_OK;
  double t = 0;
  /* the copy: the reference the kernels are compared with */
  {
    op c = {.kind = OP_COPY, .n = (size_t)o->copy_bytes};
    MP_CHECK_GOTO(balloc(C, &s, c.n, &c.x[0]), st, done);
    MP_CHECK_GOTO(balloc(C, &s, c.n, &c.x[1]), st, done);
    MP_CHECK_GOTO(fill_x(C, c.x[0], c.n / eb), st, done);
    MP_CHECK_GOTO(time_op(C, &c, 0, &t), st, done);
    out->copy_GBps = 2.0 * (double)c.n / t * 1e-9; /* read + write */
    bfree(C, &s);
  }
  {
    const size_t R = (size_t)o->norm_rows, Cc = (size_t)o->norm_cols, e = R * Cc;
    op r = {.kind = OP_RMS_FWD, .a = o->norm_rows, .b = o->norm_cols};
    MP_CHECK_GOTO(balloc(C, &s, e * eb, &r.x[0]), st, done);
    MP_CHECK_GOTO(balloc(C, &s, Cc * eb, &r.x[1]), st, done);
    MP_CHECK_GOTO(balloc(C, &s, e * eb, &r.x[2]), st, done);
    MP_CHECK_GOTO(balloc(C, &s, e * eb, &r.x[3]), st, done);
    MP_CHECK_GOTO(balloc(C, &s, R * sizeof(float), (void **)&r.f[0]), st, done);
    MP_CHECK_GOTO(balloc(C, &s, Cc * sizeof(float), (void **)&r.f[1]), st, done);
    MP_CHECK_GOTO(fill_x(C, r.x[0], e), st, done);
    MP_CHECK_GOTO(fill_x(C, r.x[1], Cc), st, done);
    MP_CHECK_GOTO(fill_x(C, r.x[3], e), st, done);
    MP_CHECK_GOTO(fill_f32(C, r.f[1], Cc, C->rnd), st, done);
    for (int k = 0; k < 2; k++) {
      r.kind = k == 0 ? OP_RMS_FWD : OP_RMS_BWD; /* the forward leaves rstd and dout for the backward */
      MP_CHECK_GOTO(time_op(C, &r, 0, &t), st, done);
      mp_calib_bw *b = &out->bw[out->n_bw++];
      b->kernel = k == 0 ? MP_CALIB_BW_RMSNORM_FWD : MP_CALIB_BW_RMSNORM_BWD;
      b->elems = (double)e;
      b->GBps = mp_calib_bw_bytes(b->kernel, b->elems) / t * 1e-9;
    }
    bfree(C, &s);
  }
  {
    const size_t n = (size_t)o->swiglu_elems;
    op w = {.kind = OP_SWI_FWD, .n = n};
    for (int i = 0; i < 5; i++) MP_CHECK_GOTO(balloc(C, &s, n * eb, &w.x[i]), st, done);
    for (int i = 0; i < 5; i++) MP_CHECK_GOTO(fill_x(C, w.x[i], n), st, done);
    for (int k = 0; k < 2; k++) {
      w.kind = k == 0 ? OP_SWI_FWD : OP_SWI_BWD;
      MP_CHECK_GOTO(time_op(C, &w, 0, &t), st, done);
      mp_calib_bw *b = &out->bw[out->n_bw++];
      b->kernel = k == 0 ? MP_CALIB_BW_SWIGLU_FWD : MP_CALIB_BW_SWIGLU_BWD;
      b->elems = (double)n;
      b->GBps = mp_calib_bw_bytes(b->kernel, b->elems) / t * 1e-9;
    }
    bfree(C, &s);
  }
  {
    const size_t n = (size_t)o->adamw_elems;
    op a = {.kind = OP_ADAMW, .n = n};
    for (int i = 0; i < 4; i++) MP_CHECK_GOTO(balloc(C, &s, n * sizeof(float), (void **)&a.f[i]), st, done);
    for (int i = 0; i < 4; i++) MP_CHECK_GOTO(fill_f32(C, a.f[i], n, i == 3 ? C->pos : C->rnd), st, done);
    MP_CHECK_GOTO(time_op(C, &a, 0, &t), st, done);
    mp_calib_bw *b = &out->bw[out->n_bw++];
    b->kernel = MP_CALIB_BW_ADAMW;
    b->elems = (double)n;
    b->GBps = mp_calib_bw_bytes(b->kernel, b->elems) / t * 1e-9;
  }
done:
  bfree(C, &s);
  if (st != MP_OK) mp_error_prefix(C->ctx, "calibrate: bandwidth kernels");
  return st;
}

/* Optional: an error is returned to the caller, which records it. */
static mp_status phase_attention(cal *C, const mp_calib_options *o, mp_calib *out) {
  size_t q, kv, rows;
  mp_calib_attn_extents(o, &q, &kv, &rows);
  const size_t eb = mp_kdtype_bytes(C->be->x_dtype);
  bufset s = {{0}, 0};
  op a = {.kind = OP_ATTN_FWD};
  mp_status st = MP_OK;
  MP_CHECK_GOTO(balloc(C, &s, q * eb, &a.x[0]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, kv * eb, &a.x[1]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, kv * eb, &a.x[2]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, q * eb, &a.x[3]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, q * eb, &a.x[4]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, 2 * kv * eb, &a.x[5]), st, done); /* dk, then dv */
  MP_CHECK_GOTO(balloc(C, &s, rows * sizeof(float), (void **)&a.f[0]), st, done);
  for (int i = 0; i < 4; i++) MP_CHECK_GOTO(fill_x(C, a.x[i], i == 1 || i == 2 ? kv : q), st, done);
  MP_CHECK_GOTO(fill_x(C, a.x[4], q), st, done);
  MP_CHECK_GOTO(fill_x(C, a.x[5], 2 * kv), st, done);
  for (int i = 0; i < o->n_attn; i++) {
    a.a = o->attn[i].B;
    a.b = o->attn[i].T;
    a.c = o->attn[i].nh;
    a.d = o->attn[i].nkv;
    a.e = o->attn[i].hd;
    /* the forward first: it leaves the lse the backward reads (x3 then serves as both the
     * forward output and dout, as the kernel benchmark does) */
    for (int k = 0; k < 2; k++) {
      a.kind = k == 0 ? OP_ATTN_FWD : OP_ATTN_BWD;
      double t = 0;
      MP_CHECK_GOTO(time_op(C, &a, 0, &t), st, done);
      mp_calib_attn *e = &out->attn[out->n_attn++];
      e->backward = k;
      e->B = a.a;
      e->T = a.b;
      e->nh = a.c;
      e->nkv = a.d;
      e->hd = a.e;
      e->flops_per_s = mp_calib_attn_flops(k, a.a, a.b, a.c, a.e) / t;
    }
  }
done:
  bfree(C, &s);
  return st;
}

/* Optional, as attention. One A buffer, one B buffer and one output of each kind, at
 * the largest size any point needs; the codes are valid in both formats (see the fill),
 * so a buffer serves as E4M3 or E5M2 as the pass reads it. */
static mp_status phase_f8(cal *C, const mp_calib_options *o, mp_calib *out) {
  size_t na = 16, nb = 16, nx = 16, nf = 16; /* A and B codes, bf16 and fp32 outputs (elements) */
  for (int i = 0; i < o->n_f8; i++) {
    const size_t N = (size_t)o->f8[i].N, K = (size_t)o->f8[i].K, M = (size_t)o->f8[i].M;
    size_t a = N * K, b = M * K, x = N * M, f = 0; /* forward */
    if (o->f8[i].pass == MP_CALIB_GEMM_DGRAD) a = N * M, b = K * M, x = N * K;
    if (o->f8[i].pass == MP_CALIB_GEMM_WGRAD) a = M * N, b = K * N, x = 0, f = M * K;
    if (a > na) na = a;
    if (b > nb) nb = b;
    if (x > nx) nx = x;
    if (f > nf) nf = f;
  }
  bufset s = {{0}, 0};
  op f = {.kind = OP_F8_FWD};
  mp_status st = MP_OK;
  uint8_t *a = NULL, *b = NULL;
  const float ones[2] = {1.0f, 1.0f};
  MP_CHECK_GOTO(balloc(C, &s, na, (void **)&a), st, done);
  MP_CHECK_GOTO(balloc(C, &s, nb, (void **)&b), st, done);
  MP_CHECK_GOTO(balloc(C, &s, nx * mp_kdtype_bytes(C->be->x_dtype), &f.x[0]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, nf * sizeof(float), (void **)&f.f[1]), st, done);
  MP_CHECK_GOTO(balloc(C, &s, sizeof ones, (void **)&f.f[0]), st, done);
  MP_CHECK_GOTO(fill_u8(C, a, na), st, done);
  MP_CHECK_GOTO(fill_u8(C, b, nb), st, done);
  /* dgrad and wgrad accumulate (+=): start from data, as the bf16 gradients do */
  MP_CHECK_GOTO(fill_x(C, f.x[0], nx), st, done);
  MP_CHECK_GOTO(fill_f32(C, f.f[1], nf, C->rnd), st, done);
  MP_CHECK_GOTO(C->be->memcpy_h2d(C->kc, f.f[0], ones, sizeof ones), st, done);
  f.u[0] = a;
  f.u[1] = b;
  {
    const op_kind kinds[3] = {OP_F8_FWD, OP_F8_DGRAD, OP_F8_WGRAD};
    MP_CHECK_GOTO(time_gemms(C, &f, kinds, o->f8, o->n_f8, out->f8, &out->n_f8), st, done);
  }
done:
  bfree(C, &s);
  return st;
}

/* An optional phase's failure, as one line in `why` (the calibration keeps it; the
 * command prints it beside the figures). */
static void record_unavailable(cal *C, char *why, size_t cap) {
  snprintf(why, cap, "%s", mp_errmsg(C->ctx));
  /* a fault inside a kernel is sticky: say so, since every later figure would fail too */
  cudaError_t e = cudaStreamSynchronize(C->stream);
  if (e != cudaSuccess) {
    size_t n = strlen(why);
    snprintf(why + n, cap - n, " (the CUDA context is now unusable: %s)", cudaGetErrorString(e));
  }
  cudaGetLastError();
}

/* ---- entry point ----------------------------------------------------------------------- */

static mp_status check_options(mp_ctx *ctx, const mp_calib_options *o) {
  if (o->n_gemm < 1 || o->n_gemm > MP_CALIB_MAX_GEMM || o->n_attn > MP_CALIB_MAX_ATTN || o->n_f8 > MP_CALIB_MAX_F8)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: %d GEMM, %d attention, %d float8 points; at most %d, %d, %d "
                    "and at least one GEMM", o->n_gemm, o->n_attn, o->n_f8, MP_CALIB_MAX_GEMM, MP_CALIB_MAX_ATTN,
                    MP_CALIB_MAX_F8);
  for (int i = 0; i < o->n_gemm; i++) {
    const int p = o->gemm[i].pass;
    if (o->gemm[i].N < 1 || o->gemm[i].K < 1 || o->gemm[i].M < 1 ||
        (p != MP_CALIB_GEMM_FWD && p != MP_CALIB_GEMM_DGRAD && p != MP_CALIB_GEMM_WGRAD))
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: GEMM %s %dx%dx%d; sizes must be >= 1 and the pass fwd, "
                      "dgrad or wgrad", mp_calib_gemm_pass_name(p), o->gemm[i].N, o->gemm[i].K, o->gemm[i].M);
  }
  for (int i = 0; i < o->n_attn; i++)
    if (o->attn[i].B < 1 || o->attn[i].T < 1 || o->attn[i].nkv < 1 || o->attn[i].hd < 1 ||
        o->attn[i].nh % o->attn[i].nkv != 0 || o->attn[i].nh < 1)
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: attention point B=%d T=%d nh=%d nkv=%d hd=%d; sizes >= 1, "
                      "nkv dividing nh", o->attn[i].B, o->attn[i].T, o->attn[i].nh, o->attn[i].nkv, o->attn[i].hd);
  for (int i = 0; i < o->n_f8; i++) {
    const int p = o->f8[i].pass;
    if (o->f8[i].N < 16 || o->f8[i].K < 16 || o->f8[i].M < 16 || o->f8[i].N % 16 || o->f8[i].K % 16 ||
        o->f8[i].M % 16 || (p != MP_CALIB_GEMM_FWD && p != MP_CALIB_GEMM_DGRAD && p != MP_CALIB_GEMM_WGRAD))
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: float8 GEMM %s %dx%dx%d; every size must be a multiple of "
                      "16 and the pass fwd, dgrad or wgrad", mp_calib_gemm_pass_name(p), o->f8[i].N, o->f8[i].K,
                      o->f8[i].M);
  }
  if (o->norm_rows < 1 || o->norm_cols < 1 || o->swiglu_elems < 1 || o->adamw_elems < 1 || o->copy_bytes < 256)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: bandwidth sizes must be >= 1 (copy >= 256 bytes)");
  return MP_OK;
}

/* The defaults, with the caller's sets in place of them one group at a time (a group
 * with no points, or a size 0: the default). */
static void merge_options(const mp_calib_options *opts, mp_calib_options *o) {
  mp_calib_options_init_cuda(o, 0);
  if (!opts) return;
  o->reps = opts->reps;
  o->device = opts->device;
  snprintf(o->gpu_profile, sizeof o->gpu_profile, "%s", opts->gpu_profile);
  if (opts->n_gemm > 0) {
    o->n_gemm = opts->n_gemm;
    memcpy(o->gemm, opts->gemm, sizeof o->gemm);
  }
  if (opts->n_attn > 0) {
    o->n_attn = opts->n_attn;
    memcpy(o->attn, opts->attn, sizeof o->attn);
  }
  if (opts->n_f8 > 0) {
    o->n_f8 = opts->n_f8;
    memcpy(o->f8, opts->f8, sizeof o->f8);
  }
  if (opts->norm_rows > 0) o->norm_rows = opts->norm_rows;
  if (opts->norm_cols > 0) o->norm_cols = opts->norm_cols;
  if (opts->swiglu_elems > 0) o->swiglu_elems = opts->swiglu_elems;
  if (opts->adamw_elems > 0) o->adamw_elems = opts->adamw_elems;
  if (opts->copy_bytes > 0) o->copy_bytes = opts->copy_bytes;
}

/* The host blocks every device buffer is filled from, and the timing events. */
static mp_status host_inputs(cal *C) {
  C->t = calloc((size_t)C->reps, sizeof *C->t);
  C->rnd = malloc(FILL_BLOCK * sizeof *C->rnd);
  C->pos = malloc(FILL_BLOCK * sizeof *C->pos);
  C->f8b = malloc(FILL_BLOCK);
  if (!C->t || !C->rnd || !C->pos || !C->f8b) return mp_error(C->ctx, MP_ERR_NOMEM, "calibrate: out of host memory");
  uint64_t z = 0x9E3779B97F4A7C15ull; /* a fixed LCG: the same data on every run */
  for (size_t i = 0; i < FILL_BLOCK; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    C->rnd[i] = (float)((z >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
    C->pos[i] = C->rnd[i] * C->rnd[i];
    /* Bit 6 is the exponent's top bit in both float8 formats (E4M3: S EEEE MMM, bias
     * 7; E5M2: S EEEEE MM, bias 15). Clearing it caps the exponent field at 0111
     * (E4M3) or 01111 (E5M2), i.e. 2^0 unbiased: |x| < 2 in either reading, and never
     * the specials, which need the field all ones (E4M3 NaN S.1111.111; E5M2 inf
     * S.11111.00 and NaN S.11111.xx). So one block serves as x and W codes (E4M3) and
     * as dy codes (E5M2). */
    C->f8b[i] = (uint8_t)((z >> 24) & 0xBF);
  }
  if (cudaEventCreate(&C->e0) != cudaSuccess || cudaEventCreate(&C->e1) != cudaSuccess)
    return mp_error(C->ctx, MP_ERR_CUDA, "calibrate: cudaEventCreate failed: %s",
                    cudaGetErrorString(cudaGetLastError()));
  C->events = 1;
  return MP_OK;
}

static void release(cal *C) {
  if (C->events) {
    cudaEventDestroy(C->e0);
    cudaEventDestroy(C->e1);
  }
  free(C->t);
  free(C->rnd);
  free(C->pos);
  free(C->f8b);
}

/* The phases: the required figures first (without them there is no fit), then the
 * optional ones, whose failure is recorded, not returned; float8 last: a kernel fault is
 * sticky in a CUDA context, so the kernels likeliest to fault run once every other figure
 * is in. */
static mp_status run_phases(cal *C, const mp_calib_options *o, mp_calib *out) {
  MP_CHECK(phase_launch(C, out));
  MP_CHECK(phase_gemm(C, o, out));
  MP_CHECK(phase_bandwidth(C, o, out));
  if (phase_attention(C, o, out) != MP_OK) {
    out->n_attn = 0;
    record_unavailable(C, out->attn_unavailable, sizeof out->attn_unavailable);
  }
  if (out->compute_capability < 89) {
    snprintf(out->f8_unavailable, sizeof out->f8_unavailable,
             "compute capability %d.%d < 8.9: no float8 tensor cores", out->compute_capability / 10,
             out->compute_capability % 10);
  } else if (C->be->matmul_f8 == NULL) {
    snprintf(out->f8_unavailable, sizeof out->f8_unavailable, "the CUDA backend has no matmul_f8");
  } else if (out->attn_unavailable[0] && strstr(out->attn_unavailable, "context is now unusable")) {
    snprintf(out->f8_unavailable, sizeof out->f8_unavailable, "not tried: the attention fault left the CUDA "
             "context unusable");
  } else if (phase_f8(C, o, out) != MP_OK) {
    out->n_f8 = 0;
    record_unavailable(C, out->f8_unavailable, sizeof out->f8_unavailable);
  }
  return MP_OK;
}

mp_status mp_calib_measure_cuda(mp_ctx *ctx, const mp_backend *be, mp_kctx *kc, const mp_calib_options *opts,
                                mp_calib *out) {
  mp_calib_options o;
  merge_options(opts, &o);
  if (o.reps < 1) return mp_error(ctx, MP_ERR_INVALID, "calibrate: reps %d; give at least 1", o.reps);
  MP_CHECK(check_options(ctx, &o));
  if (strcmp(be->name, "cuda") != 0 || mp_cuda_stream(kc) == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: the cuda measurement needs an initialised CUDA backend");

  mp_calib_device dev;
  mp_gpu prof;
  MP_CHECK(mp_calib_cuda_probe(ctx, kc->device, &dev));
  MP_CHECK(mp_calib_cuda_profile(ctx, &dev, o.gpu_profile, &prof));
  mp_calib_begin(out, "cuda", 1, 1);
  snprintf(out->gpu_name, sizeof out->gpu_name, "%s", dev.name);
  snprintf(out->gpu_profile, sizeof out->gpu_profile, "%s", prof.name);
  out->compute_capability = dev.compute_capability;
  out->ref_bf16_tflops = prof.peak_tflops[MP_DTYPE_BF16];
  out->ref_fp8_tflops = prof.peak_tflops[MP_DTYPE_FP8_E4M3];
  out->ref_hbm_GBps = prof.hbm_GBps;

  cal C;
  memset(&C, 0, sizeof C);
  C.ctx = kc->err ? kc->err : ctx;
  C.be = be;
  C.kc = kc;
  C.stream = (cudaStream_t)mp_cuda_stream(kc);
  C.reps = o.reps;
  mp_status st = host_inputs(&C);
  if (st == MP_OK) {
    mp_progress_begin(&C.prog, "calibrate cuda", 1 + o.n_gemm + 6 + 2 * o.n_attn + o.n_f8);
    st = run_phases(&C, &o, out);
    mp_progress_end(&C.prog);
  }
  /* The backend leaves its messages on kc->err, which every phase shares (C.ctx). */
  if (st != MP_OK && C.ctx != ctx) mp_error(ctx, st, "%s", mp_errmsg(C.ctx));
  release(&C);
  return st;
}

#endif /* MP_HAVE_CUDA */
