/* Calibration: the CPU measurement (the kernels through the CPU backend, the copy, the
 * collectives), the alpha-beta fit, the stack fit shared by both devices (the GEMM curve,
 * the by-shape correction, attention, HBM, float8), and the application to a profile
 * and a stack (see calibrate.h for what is measured and the models). The measurement on
 * the GPU is calibrate_cuda.c.
 *
 * Invariants: every rank of an "mpi" comm makes the same collective calls in the same
 * order (the shapes, sizes, reps and loop counts depend only on the options and the world
 * size, never on a rank's timings: a kernel's loop count is agreed on with an all-reduce
 * MAX before it is timed), so no rank can wait on a call another skips. Figures that
 * differ per rank are combined with one all-reduce each (mean for rates and kernel
 * times, max for collective times), as int64 (comm.h has no fp64): FLOP/s and bytes/s
 * rounded to integers, times in picoseconds. */
#define _GNU_SOURCE
#include "planner/calibrate.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/progress.h"
#include "common/timeutil.h"
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

mp_calib_gemm mp_calib_gemm_point(int pass, int N, int K, int M, double time_s) {
  mp_calib_gemm g = {pass, N, K, M, mp_calib_gemm_flops(pass, N, K, M) / time_s};
  return g;
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
    case MP_CALIB_BW_ROPE_FWD: return "rope_fwd";
    case MP_CALIB_BW_ROPE_BWD: return "rope_bwd";
    case MP_CALIB_BW_CE_FWD: return "ce_fwd";
    case MP_CALIB_BW_CE_BWD: return "ce_bwd";
    case MP_CALIB_BW_RESIDUAL: return "residual";
    default: return "?";
  }
}

double mp_calib_bw_bytes(int k, double elems) {
  /* exec/schedule.c: norm_fwd 4e, norm_bwd 6e, swiglu 6e / 10e, BYTES_ADAMW 28, rope 4e
   * both ways, loss 10 (forward) and 8 (backward) per logit, residual 6e */
  static const double per[MP_CALIB_BW_COUNT] = {4.0, 6.0, 6.0, 10.0, 28.0, 4.0, 4.0, 10.0, 8.0, 6.0};
  return k >= 0 && k < MP_CALIB_BW_COUNT ? per[k] * elems : 0.0;
}

/* n attention points (B, T, nh, nkv, hd) into o. */
static void set_attn(mp_calib_options *o, const int (*a)[5], int n) {
  o->n_attn = n;
  for (int i = 0; i < n; i++) {
    o->attn[i].B = a[i][0];
    o->attn[i].T = a[i][1];
    o->attn[i].nh = a[i][2];
    o->attn[i].nkv = a[i][3];
    o->attn[i].hd = a[i][4];
  }
}

void mp_calib_options_init_cpu(mp_calib_options *o, int quick) {
  memset(o, 0, sizeof *o);
  o->reps = quick ? 3 : 5;
  /* the tiny models at 4 sequences of 64 tokens: q/o, k/v, gate/up, down, the LM head,
   * the router; their experts at 64 rows (256 x top-2 / 8); then training-sized shapes
   * (a CPU's GEMM rate rises with the size, then its caches run out) */
  static const int shapes[][3] = {{256, 64, 64},     {256, 64, 32},      {256, 64, 192},   {256, 192, 64},
                                  {256, 64, 256},    {256, 64, 8},       {64, 64, 32},     {64, 32, 64},
                                  {512, 256, 256},   {512, 256, 1024},   {512, 1024, 256}, {1024, 512, 512},
                                  {1024, 1024, 1024}, {1024, 1024, 4096}, {1024, 4096, 1024}};
  static const int quick_shapes[][3] = {{256, 64, 192}, {256, 192, 64}, {256, 64, 256}, {1024, 1024, 1024}};
  static const int passes[] = {MP_CALIB_GEMM_FWD, MP_CALIB_GEMM_DGRAD, MP_CALIB_GEMM_WGRAD};
  const int (*sh)[3] = quick ? quick_shapes : shapes;
  const int n_sh = quick ? 4 : (int)(sizeof shapes / sizeof shapes[0]);
  int n = 0;
  for (int i = 0; i < n_sh; i++)
    for (int p = 0; p < 3; p++) {
      o->gemm[n].pass = passes[p];
      o->gemm[n].N = sh[i][0];
      o->gemm[n].K = sh[i][1];
      o->gemm[n].M = sh[i][2];
      n++;
    }
  o->n_gemm = n;
  /* the tiny models' attention (hd 8) at 64 to 256 tokens, then wider heads */
  static const int attn[][5] = {{4, 64, 8, 4, 8}, {4, 128, 8, 4, 8}, {4, 256, 8, 4, 16}, {2, 256, 8, 4, 64},
                                {1, 512, 8, 4, 64}};
  static const int attn_quick[][5] = {{4, 64, 8, 4, 8}, {2, 256, 8, 4, 64}};
  set_attn(o, quick ? attn_quick : attn, quick ? 2 : 5);
  /* Element-wise: the tiny models' tensor (256 tokens, d_model 64, d_ff 192, 8 heads of
   * 8, vocabulary 256; AdamW on the gate's 64 x 192), 2^18 elements (cache-resident; the
   * kernels go parallel above 2^14 to 2^16 elements) and 2^22 (16 MiB in fp32: DRAM).
   * Forward before backward at each size: the backward reads what the forward saved. */
  static const int bw[][4][3] = {
      /* kernel pair: tiny, 2^18, 2^22 as (rows, cols) (hd for RoPE below) */
      {{256, 64}, {1024, 256}, {4096, 1024}},  /* rmsnorm */
      {{256, 192}, {1024, 256}, {4096, 1024}}, /* swiglu */
      {{256, 64}, {1024, 256}, {4096, 1024}},  /* rope: tokens x (heads x hd) */
      {{256, 256}, {512, 512}, {1024, 4096}},  /* cross-entropy: tokens x vocab */
  };
  static const int pairs[][2] = {{MP_CALIB_BW_RMSNORM_FWD, MP_CALIB_BW_RMSNORM_BWD},
                                 {MP_CALIB_BW_SWIGLU_FWD, MP_CALIB_BW_SWIGLU_BWD},
                                 {MP_CALIB_BW_ROPE_FWD, MP_CALIB_BW_ROPE_BWD},
                                 {MP_CALIB_BW_CE_FWD, MP_CALIB_BW_CE_BWD}};
  static const int singles[][3][2] = {
      {{64, 192}, {512, 512}, {2048, 2048}}, /* adamw */
      {{256, 64}, {1024, 256}, {4096, 1024}}, /* residual */
  };
  static const int single_kernel[] = {MP_CALIB_BW_ADAMW, MP_CALIB_BW_RESIDUAL};
  const int n_sizes = quick ? 1 : 3;
  n = 0;
  for (int z = 0; z < n_sizes; z++) {
    for (int k = 0; k < 4; k++)
      for (int d = 0; d < 2; d++) {
        o->bw[n].kernel = pairs[k][d];
        o->bw[n].rows = bw[k][z][0];
        o->bw[n].cols = bw[k][z][1];
        o->bw[n].hd = k == 2 ? (z == 0 ? 8 : 64) : 0;
        n++;
      }
    for (int k = 0; k < 2; k++) {
      o->bw[n].kernel = single_kernel[k];
      o->bw[n].rows = singles[k][z][0];
      o->bw[n].cols = singles[k][z][1];
      n++;
    }
  }
  o->n_bw = n;
  static const double sizes[] = {256, 4096, 65536, 1048576, 8388608};
  o->n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
  memcpy(o->sizes_bytes, sizes, sizeof sizes);
  o->copy_bytes = quick ? (int64_t)16 << 20 : (int64_t)64 << 20;
}

void mp_calib_options_init(mp_calib_options *o) { mp_calib_options_init_cpu(o, 0); }

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
  set_attn(o, quick ? attn_quick : attn, quick ? 2 : 5);
  /* float8: the same shapes and passes, as the runtime calls matmul_f8 for a Linear
   * (every size above is a multiple of 16, as the kernel needs). A float8 point costs
   * less than its bf16 one (the loop is as long, the calls shorter): about 1 to 2 s more
   * on an H100. */
  o->n_f8 = o->n_gemm;
  for (int i = 0; i < o->n_gemm; i++) {
    o->f8[i].pass = o->gemm[i].pass;
    o->f8[i].N = o->gemm[i].N;
    o->f8[i].K = o->gemm[i].K;
    o->f8[i].M = o->gemm[i].M;
  }
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
    case CK_ATTN_FWD: s = be->attention_forward(kc, f[3], f[6], f[0], f[1], f[2], o->a, o->b, o->c, o->d, o->e); break;
    case CK_ATTN_BWD:
      s = be->attention_backward(kc, f[4], f[5], f[7], f[3], f[0], f[1], f[2], f[3], f[6], o->a, o->b, o->c, o->d,
                                 o->e);
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
  size_t nk = 1, mk = 1, nm = 1;
  for (int i = 0; i < o->n_gemm; i++) {
    const size_t N = (size_t)o->gemm[i].N, K = (size_t)o->gemm[i].K, M = (size_t)o->gemm[i].M;
    if (N * K > nk) nk = N * K;
    if (M * K > mk) mk = M * K;
    if (N * M > nm) nm = N * M;
  }
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
  size_t q = 1, kv = 1, rows = 1;
  for (int i = 0; i < o->n_attn; i++) {
    const size_t B = (size_t)o->attn[i].B, T = (size_t)o->attn[i].T;
    if (B * T * o->attn[i].nh * o->attn[i].hd > q) q = B * T * o->attn[i].nh * o->attn[i].hd;
    if (B * T * o->attn[i].nkv * o->attn[i].hd > kv) kv = B * T * o->attn[i].nkv * o->attn[i].hd;
    if (B * T * o->attn[i].nh > rows) rows = B * T * o->attn[i].nh;
  }
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

  memset(out, 0, sizeof *out);
  mp_now_iso(out->created_at, sizeof out->created_at);
  snprintf(out->device, sizeof out->device, "%s", be->name);
  if (gethostname(out->host, sizeof out->host) != 0) snprintf(out->host, sizeof out->host, "unknown");
  out->host[sizeof out->host - 1] = '\0';
  out->threads = omp_get_max_threads();
  out->world = mp_comm_world_size(comm);

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

/* ---- the CUDA fits -------------------------------------------------------------------- */

static int is_linear_pass(int pass) {
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

/* A fitted curve and what it is relative to: the bf16 one (ref_bf16, gemm_eff_max) or the
 * float8 one (ref_fp8, fp8_gemm_eff_max), with the one knee and the launch figure the
 * simulator adds to every op. */
typedef struct gemm_curve {
  double peak, eff_max, half, ovh;
} gemm_curve;

static gemm_curve bf16_curve(const mp_calib *c) {
  gemm_curve cv = {c->ref_bf16_tflops * 1e12, c->fit.gemm_eff_max, c->fit.gemm_eff_half_mnk, c->launch_s};
  return cv;
}

static gemm_curve fp8_curve(const mp_calib *c) {
  gemm_curve cv = {c->ref_fp8_tflops * 1e12, c->fit.fp8_gemm_eff_max, c->fit.gemm_eff_half_mnk, c->launch_s};
  return cv;
}

/* A point a by-shape table takes: one of the schedule's three GEMMs, with a rate. */
static int table_takes(const mp_calib_gemm *g) { return is_linear_pass(g->pass) && g->flops_per_s > 0; }

/* rms of (curve + launch - measured) / measured over the points of g with a rate (0
 * without one). */
static double curve_rms(const mp_calib_gemm *g, int n, const gemm_curve *cv) {
  double se = 0;
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (!(g[i].flops_per_s > 0)) continue;
    const double flops = mp_calib_gemm_flops(g[i].pass, g[i].N, g[i].K, g[i].M);
    const double x = (double)g[i].N * g[i].K * g[i].M, t = flops / g[i].flops_per_s;
    const double e = (curve_time(flops, x, cv->peak, cv->eff_max, cv->half) + cv->ovh - t) / t;
    se += e * e;
    k++;
  }
  return k > 0 ? sqrt(se / k) : 0.0;
}

/* The curve's least squares without the ceiling: E and h of eff(x) = E x / (x + h)
 * against peak_flops (h >= 0; E may exceed 1). sp, spq, ... are returned for the refit
 * at E = 1. */
typedef struct curve_sums {
  double spp, spq, sqq, sp, sq;
} curve_sums;

static mp_status curve_lsq(mp_ctx *ctx, const mp_calib_gemm *g, int n, double peak_flops, double overhead_s,
                           double *E, double *h, curve_sums *out) {
  if (n < 1 || !(peak_flops > 0))
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: the GEMM curve needs >= 1 point and a peak (got %d, %g)", n,
                    peak_flops);
  /* pred/meas of point i = a p_i + b q_i with a = 1/E, b = h/E, y_i = tc_i peak / flops_i
   * (the inverse of its efficiency), p_i = 1/y_i, q_i = 1/(x_i y_i): minimise
   * sum (a p_i + b q_i - 1)^2, the relative error of the compute time. */
  curve_sums z = {0, 0, 0, 0, 0};
  for (int i = 0; i < n; i++) {
    const double flops = mp_calib_gemm_flops(g[i].pass, g[i].N, g[i].K, g[i].M);
    const double x = (double)g[i].N * g[i].K * g[i].M;
    if (!(g[i].flops_per_s > 0) || !(x > 0))
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: GEMM %s %dx%dx%d has rate %g; rates must be > 0",
                      mp_calib_gemm_pass_name(g[i].pass), g[i].N, g[i].K, g[i].M, g[i].flops_per_s);
    const double tc = compute_time(flops / g[i].flops_per_s, overhead_s);
    const double y = tc * peak_flops / flops, p = 1.0 / y, q = 1.0 / (x * y);
    z.spp += p * p;
    z.spq += p * q;
    z.sqq += q * q;
    z.sp += p;
    z.sq += q;
  }
  double det = z.spp * z.sqq - z.spq * z.spq, a = 0, b = 0;
  if (n >= 2 && det > 1e-12 * z.spp * z.sqq) {
    a = (z.sp * z.sqq - z.sq * z.spq) / det;
    b = (z.spp * z.sq - z.spq * z.sp) / det;
  }
  if (!(a > 0) || !(b > 0)) { /* one point, one size, or small GEMMs faster than the line: no knee */
    b = 0;
    a = z.sp / z.spp;
  }
  *E = 1.0 / a;
  *h = b / a;
  if (out) *out = z;
  return MP_OK;
}

mp_status mp_calib_fit_gemm_curve(mp_ctx *ctx, const mp_calib_gemm *g, int n, double peak_flops,
                                  double overhead_s, double *eff_max, double *half_mnk, double *rms_rel) {
  double E, h;
  curve_sums z;
  MP_CHECK(curve_lsq(ctx, g, n, peak_flops, overhead_s, &E, &h, &z));
  if (E > 1.0) {
    /* The datasheet peak is the ceiling: E = 1 (a = 1), h refitted alone. */
    E = 1.0;
    h = z.sqq > 0 ? (z.sq - z.spq) / z.sqq : 0.0; /* argmin_b sum (p + b q - 1)^2 */
    if (!(h > 0)) h = 0;
  }
  *eff_max = E;
  *half_mnk = h;
  if (rms_rel) {
    const gemm_curve cv = {peak_flops, E, h, overhead_s};
    *rms_rel = curve_rms(g, n, &cv);
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

/* One point of a table: log2(measured / curve efficiency), at the schedule's shape. */
static void table_point(const mp_calib_gemm *g, const gemm_curve *cv, mp_gemm_table_point *pt) {
  const double flops = mp_calib_gemm_flops(g->pass, g->N, g->K, g->M);
  const double x = (double)g->N * g->K * g->M;
  const double tc = compute_time(flops / g->flops_per_s, cv->ovh);
  const double tcurve = curve_time(flops, x, cv->peak, cv->eff_max, cv->half);
  int variant;
  double m, n, k;
  sched_shape(g->pass, g->N, g->K, g->M, &variant, &m, &n, &k);
  pt->variant = variant;
  pt->lm = log2(m);
  pt->ln = log2(n);
  pt->lk = log2(k);
  pt->log2_ratio = log2(tcurve / tc);
}

_Static_assert(MP_CALIB_MAX_GEMM <= MP_GEMM_TABLE_MAX && MP_CALIB_MAX_F8 <= MP_GEMM_TABLE_MAX,
               "a table holds every GEMM point of a calibration");

/* Every point of g a table takes, in order, against cv (empty without a curve). */
static void table_build(const mp_calib_gemm *g, int n, const gemm_curve *cv, mp_gemm_table *t) {
  memset(t, 0, sizeof *t);
  if (!(cv->peak > 0) || !(cv->eff_max > 0)) return;
  for (int i = 0; i < n && t->n < MP_GEMM_TABLE_MAX; i++)
    if (table_takes(&g[i])) table_point(&g[i], cv, &t->pt[t->n++]);
}

void mp_calib_gemm_table(const mp_calib *c, mp_gemm_table *t) {
  const gemm_curve cv = bf16_curve(c);
  table_build(c->gemm, c->n_gemm, &cv, t);
}

void mp_calib_fp8_gemm_table(const mp_calib *c, mp_gemm_table *t) {
  const gemm_curve cv = fp8_curve(c);
  table_build(c->f8, c->n_f8, &cv, t);
}

/* Leave-one-out check of a by-shape correction: each point of g the table takes,
 * predicted by the curve times the correction of the other points, against its
 * measurement (launch included), into *rms (the rms relative error; a point with no
 * neighbour is predicted by the curve). */
static mp_status table_loo_rms(mp_ctx *ctx, const mp_calib_gemm *g, int n, const gemm_curve *cv, double *rms) {
  mp_gemm_table *all = malloc(sizeof *all), *rest = malloc(sizeof *rest);
  if (!all || !rest) {
    free(all);
    free(rest);
    return mp_error(ctx, MP_ERR_NOMEM, "calibrate: out of memory for the by-shape GEMM check");
  }
  table_build(g, n, cv, all);
  double se = 0;
  int j = 0; /* index of the current point in `all` (the same order) */
  for (int i = 0; i < n && j < all->n; i++) {
    if (!table_takes(&g[i])) continue;
    rest->n = 0;
    for (int q = 0; q < all->n; q++)
      if (q != j) rest->pt[rest->n++] = all->pt[q];
    const double flops = mp_calib_gemm_flops(g[i].pass, g[i].N, g[i].K, g[i].M);
    const double x = (double)g[i].N * g[i].K * g[i].M, t = flops / g[i].flops_per_s;
    int variant;
    double m, nn, k;
    sched_shape(g[i].pass, g[i].N, g[i].K, g[i].M, &variant, &m, &nn, &k);
    const double f = mp_gemm_table_factor(rest, variant, m, nn, k);
    const double pred = curve_time(flops, x, cv->peak, cv->eff_max, cv->half) / f + cv->ovh;
    se += (pred - t) / t * ((pred - t) / t);
    j++;
  }
  free(all);
  free(rest);
  *rms = j > 0 ? sqrt(se / j) : 0.0;
  return MP_OK;
}

/* Whether a by-shape correction is worth using: it predicts shapes it did not see
 * clearly better than its curve, by a tenth and by a percentage point of time at least
 * (less is timing noise, and a table the curve would do as well is a complication for
 * nothing). */
static int table_pays(double curve_rms_rel, double table_rms_rel) {
  return table_rms_rel < 0.9 * curve_rms_rel && curve_rms_rel - table_rms_rel > 0.01;
}

/* 1/c minimising sum_i (c w_i - 1)^2, c = sum w / sum w^2: the efficiency E that makes
 * the relative time errors of points of efficiencies w_i (each measured against E = 1)
 * smallest, every point weighing the same. 0 when there is no point. */
static double eff_lsq(double sw, double sww) { return sw > 0 ? sww / sw : 0.0; }

/* The cpu fits of one figure E (attention_eff, hbm_eff) minimise the weighted squared
 * log ratio of predicted to measured time, sum_i v_i log^2(pred_i / t_i): an over- and an
 * under-prediction by the same factor cost the same. (The relative error (pred - t) / t
 * caps an under-prediction's cost at 1 and not an over-prediction's, so with the CPU
 * kernels' tenfold spread of rates it fits the fastest kernels and under-predicts the
 * rest: on tiny-dense, 0.46 ms of element-wise time against 1.34 ms measured.) With
 * pred_i = x_i / E, log E is the weighted mean of log(x_i / t_i), the weighted geometric
 * mean of the points' efficiencies.
 *
 * hbm_eff: the simulator costs an element-wise op as max(flops / peak, bytes / (hbm E))
 * (sim/sim.c), so the fit predicts each point the same way: pred_i = max(F_i, B_i c),
 * c = 1/E, F_i the flops term and B_i the bytes term at E = 1. Between two breakpoints
 * F_i / B_i the points in the bytes regime are fixed and the sum is a quadratic in
 * log c; its minimum, clamped to the interval, is a candidate, and the best candidate
 * over the intervals is the exact minimum. A point whose flops term exceeds its time at
 * any E says nothing of E. Returns 0 when no point weighs anything. */
static double hbm_fit_log(const double *F, const double *B, const double *t, const double *v, int n) {
  double cuts[MP_CALIB_MAX_BW + 2];
  int nc = 0;
  cuts[nc++] = 0.0;
  for (int i = 0; i < n; i++)
    if (v[i] > 0 && F[i] > 0 && B[i] > 0) cuts[nc++] = F[i] / B[i];
  cuts[nc++] = INFINITY;
  for (int i = 1; i < nc; i++) /* n <= MP_CALIB_MAX_BW: insertion sort */
    for (int j = i; j > 0 && cuts[j] < cuts[j - 1]; j--) {
      double x = cuts[j];
      cuts[j] = cuts[j - 1];
      cuts[j - 1] = x;
    }
  double best_c = 0, best = INFINITY;
  for (int k = 0; k + 1 < nc; k++) {
    const double lo = cuts[k], hi = cuts[k + 1];
    if (!(hi > lo)) continue;
    const double mid = isinf(hi) ? (lo > 0 ? 2 * lo : 1.0) : 0.5 * (lo + hi);
    double sv = 0, svl = 0; /* log c = -sum v log(B / t) / sum v over the bytes regime */
    for (int i = 0; i < n; i++)
      if (v[i] > 0 && B[i] * mid >= F[i]) {
        sv += v[i];
        svl += v[i] * log(B[i] / t[i]);
      }
    double c = sv > 0 ? exp(-svl / sv) : hi;
    if (c < lo) c = lo;
    if (c > hi) c = hi;
    if (!(c > 0) || isinf(c)) continue;
    double se = 0;
    for (int i = 0; i < n; i++) {
      if (!(v[i] > 0)) continue;
      const double e = log((B[i] * c > F[i] ? B[i] * c : F[i]) / t[i]);
      se += v[i] * e * e;
    }
    if (se < best) {
      best = se;
      best_c = c;
    }
  }
  return best_c > 0 ? 1.0 / best_c : 0.0;
}

/* Weight of a point at log2 distance d from the run's size: 1 at the run's size, fading
 * to 0 at MP_CALIB_RUN_REACH octaves (as the by-shape GEMM correction fades). */
static double run_weight(double d) {
  d = fabs(d);
  return d < MP_CALIB_RUN_REACH ? 1.0 - d / MP_CALIB_RUN_REACH : 0.0;
}

/* Elements of kernel k's tensor in a step of run (see mp_calib_run). */
static double run_elems(const mp_calib_run *r, int k) {
  const double tp = r->tp > 1 ? r->tp : 1;
  switch (k) {
    case MP_CALIB_BW_SWIGLU_FWD:
    case MP_CALIB_BW_SWIGLU_BWD: return r->tokens * (double)r->d_ff / tp;
    case MP_CALIB_BW_ROPE_FWD:
    case MP_CALIB_BW_ROPE_BWD: return r->tokens * (double)(r->n_heads * r->head_dim) / tp;
    case MP_CALIB_BW_CE_FWD:
    case MP_CALIB_BW_CE_BWD: return r->tokens * (double)r->vocab;
    case MP_CALIB_BW_ADAMW: return (double)r->d_model * (double)r->d_ff / tp;
    default: return r->tokens * (double)r->d_model; /* rmsnorm, residual */
  }
}

/* attention_eff and hbm_eff of a cpu calibration against its ref_*, every point weighing
 * the same (run NULL) or by its distance from the run's sizes; a figure keeps 0 when no
 * point weighs anything. */
/* The schedule's kernel class of an element-wise calibration kernel. */
static int bw_kernel_class(int k) {
  switch (k) {
    case MP_CALIB_BW_RMSNORM_FWD:
    case MP_CALIB_BW_RMSNORM_BWD: return MP_KERNEL_NORM;
    case MP_CALIB_BW_SWIGLU_FWD:
    case MP_CALIB_BW_SWIGLU_BWD: return MP_KERNEL_ACTIVATION;
    case MP_CALIB_BW_ADAMW: return MP_KERNEL_OPTIMIZER;
    case MP_CALIB_BW_ROPE_FWD:
    case MP_CALIB_BW_ROPE_BWD: return MP_KERNEL_ROPE;
    case MP_CALIB_BW_CE_FWD:
    case MP_CALIB_BW_CE_BWD: return MP_KERNEL_LOSS;
    case MP_CALIB_BW_RESIDUAL: return MP_KERNEL_RESIDUAL;
    default: return -1;
  }
}

static void cpu_kernel_fit(const mp_calib *c, const mp_calib_run *run, double *attention_eff, double *hbm_eff,
                           double *hbm_eff_kernel) {
  const double peak = c->ref_bf16_tflops * 1e12, hbm = c->ref_hbm_GBps * 1e9;
  const double ovh = c->launch_s > 0 ? c->launch_s : 0.0;
  *attention_eff = *hbm_eff = 0;
  if (!(peak > 0)) return;
  double sv = 0, svl = 0;
  for (int i = 0; i < c->n_attn; i++) {
    const mp_calib_attn *a = &c->attn[i];
    if (!(a->flops_per_s > 0)) continue;
    double v = 1.0;
    if (run)
      v = run_weight(fmax(fabs(log2((double)a->T / (double)run->seq)),
                          fabs(log2((double)a->hd / (double)run->head_dim))));
    const double flops = mp_calib_attn_flops(a->backward, a->B, a->T, a->nh, a->hd);
    sv += v;
    svl += v * log(flops / (peak * compute_time(flops / a->flops_per_s, ovh)));
  }
  if (sv > 0) *attention_eff = fmin(exp(svl / sv), 1.0);
  if (!(hbm > 0)) return;
  double F[MP_CALIB_MAX_BW], B[MP_CALIB_MAX_BW], T[MP_CALIB_MAX_BW], V[MP_CALIB_MAX_BW];
  int K[MP_CALIB_MAX_BW];
  int n = 0;
  for (int i = 0; i < c->n_bw && n < MP_CALIB_MAX_BW; i++) {
    const mp_calib_bw *b = &c->bw[i];
    if (!(b->GBps > 0) || !(b->elems > 0)) continue;
    const double bytes = mp_calib_bw_bytes(b->kernel, b->elems);
    F[n] = mp_calib_bw_flops(b->kernel, b->elems) / peak; /* element-wise ops at the fp32 peak */
    B[n] = bytes / hbm;
    T[n] = compute_time(bytes / (b->GBps * 1e9), ovh);
    V[n] = run ? run_weight(log2(b->elems / run_elems(run, b->kernel))) : 1.0;
    K[n] = bw_kernel_class(b->kernel);
    n++;
  }
  *hbm_eff = hbm_fit_log(F, B, T, V, n);
  if (hbm_eff_kernel == NULL) return;
  /* each class alone: its points keep their weights, the others weigh nothing */
  for (int k = 0; k < MP_KERNEL_COUNT; k++) {
    double Vk[MP_CALIB_MAX_BW];
    int any = 0;
    for (int i = 0; i < n; i++) {
      Vk[i] = K[i] == k ? V[i] : 0.0;
      any |= Vk[i] > 0;
    }
    hbm_eff_kernel[k] = any ? hbm_fit_log(F, B, T, Vk, n) : 0.0;
  }
}

/* The references of a cpu fit (see calibrate.h, "The fit"): the GEMM peak is the fastest
 * curve point, or the curve's asymptote when that is higher (the curve then has E = 1
 * exactly, never clamped); every dtype has it (the CPU computes in fp32); HBM is the
 * copy. */
static mp_status cpu_refs(mp_ctx *ctx, mp_calib *c, const mp_calib_gemm *pts, int n, double ovh) {
  double p0 = 0;
  for (int i = 0; i < n; i++)
    if (pts[i].flops_per_s > p0) p0 = pts[i].flops_per_s;
  double E = 0, h = 0;
  MP_CHECK(curve_lsq(ctx, pts, n, p0, ovh, &E, &h, NULL));
  const double peak = E > 1.0 ? p0 * E : p0;
  c->ref_bf16_tflops = c->ref_fp8_tflops = peak * 1e-12;
  c->ref_hbm_GBps = c->copy_GBps;
  return MP_OK;
}

double mp_calib_bw_flops(int k, double elems) {
  /* exec/schedule.c: FLOPS_NORM_FWD 4, _BWD 8, SWIGLU 5 / 8, ADAMW 16, ROPE 3 both ways,
   * LOSS 5 forward and 2 backward per logit, residual 1 */
  static const double per[MP_CALIB_BW_COUNT] = {4.0, 8.0, 5.0, 8.0, 16.0, 3.0, 3.0, 5.0, 2.0, 1.0};
  return k >= 0 && k < MP_CALIB_BW_COUNT ? per[k] * elems : 0.0;
}

void mp_calib_run_init(mp_calib_run *r, const mp_model *m, int64_t micro_batch, int64_t seq, int tp) {
  memset(r, 0, sizeof *r);
  r->tokens = (double)micro_batch * (double)seq;
  r->seq = seq;
  r->d_model = m->d_model;
  r->d_ff = m->d_ff;
  r->vocab = m->vocab;
  r->n_heads = m->n_heads;
  r->head_dim = m->head_dim;
  r->tp = tp > 1 ? tp : 1;
}

void mp_calib_fit_run(const mp_calib *c, const mp_calib_run *run, mp_calib_stack_fit *out) {
  *out = c->fit;
  if (run == NULL || strcmp(c->device, "cpu") != 0 || !(c->fit.gemm_eff_max > 0)) return;
  if (!(run->tokens > 0) || run->seq < 1 || run->head_dim < 1 || run->d_model < 1) return;
  double attn = 0, hbm = 0;
  cpu_kernel_fit(c, run, &attn, &hbm, out->hbm_eff_kernel);
  if (attn > 0) out->attention_eff = attn;
  if (hbm > 0) out->hbm_eff = hbm;
}

mp_status mp_calib_fit_stack(mp_ctx *ctx, mp_calib *c) {
  mp_calib_stack_fit *f = &c->fit;
  memset(f, 0, sizeof *f);
  const int cpu = strcmp(c->device, "cpu") == 0;
  const double ovh = c->launch_s > 0 ? c->launch_s : 0.0;
  mp_calib_gemm pts[MP_CALIB_MAX_GEMM];
  int n = 0;
  for (int i = 0; i < c->n_gemm; i++)
    if (is_linear_pass(c->gemm[i].pass)) pts[n++] = c->gemm[i];
  if (cpu) {
    /* an older cpu calibration (or one of BWD points only): no curve, no fit; the CPU
     * profile takes its largest rate and the stack keeps its stated figures */
    if (n == 0) return MP_OK;
    MP_CHECK(cpu_refs(ctx, c, pts, n, ovh));
  }
  const double peak = c->ref_bf16_tflops * 1e12;
  if (!(peak > 0))
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: calibration of %s has no reference bf16 peak; it needs "
                    "the GPU profile it is relative to", c->gpu_name[0] ? c->gpu_name : c->device);
  if (n == 0)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: no bf16 GEMM point (fwd, dgrad or wgrad) to fit the "
                    "efficiency curve to");
  MP_CHECK(mp_calib_fit_gemm_curve(ctx, pts, n, peak, ovh, &f->gemm_eff_max, &f->gemm_eff_half_mnk,
                                   &f->gemm_curve_rms));
  f->kernel_overhead_us = ovh * 1e6;
  const gemm_curve cv = bf16_curve(c);
  MP_CHECK(table_loo_rms(ctx, c->gemm, c->n_gemm, &cv, &f->gemm_table_rms));
  f->gemm_table = table_pays(f->gemm_curve_rms, f->gemm_table_rms);

  /* float8, every point (forward, dgrad, wgrad): the bf16 curve's knee (the stack has one
   * knee), the fp8 peak; minimise sum (w_i / E - 1)^2 with w_i = the curve's time at E = 1
   * over the measured compute time (w_i is the point's efficiency as the curve's shape
   * sees it). Then the float8 by-shape correction against that curve, kept on the same
   * terms as the bf16 one: what one number cannot say (the passes differ: fast
   * accumulation in the forward only, an fp32 output for wgrad) the points of each pass
   * say by shape. The CPU emulates float8 through its fp32 GEMM: the curve's own
   * efficiency, no points. */
  const double peak8 = c->ref_fp8_tflops * 1e12;
  if (cpu) {
    f->fp8_gemm_eff_max = f->gemm_eff_max;
  } else if (c->n_f8 > 0 && peak8 > 0) {
    double sw = 0, sww = 0;
    for (int i = 0; i < c->n_f8; i++) {
      const mp_calib_gemm *g = &c->f8[i];
      if (!(g->flops_per_s > 0)) continue;
      const double flops = mp_calib_gemm_flops(g->pass, g->N, g->K, g->M);
      const double x = (double)g->N * g->K * g->M;
      const double w = curve_time(flops, x, peak8, 1.0, f->gemm_eff_half_mnk) / compute_time(flops / g->flops_per_s, ovh);
      sw += w;
      sww += w * w;
    }
    f->fp8_gemm_eff_max = eff_lsq(sw, sww);
    if (f->fp8_gemm_eff_max > 1.0) f->fp8_gemm_eff_max = 1.0;
    if (f->fp8_gemm_eff_max > 0) {
      const gemm_curve cv8 = fp8_curve(c);
      f->fp8_gemm_curve_rms = curve_rms(c->f8, c->n_f8, &cv8);
      MP_CHECK(table_loo_rms(ctx, c->f8, c->n_f8, &cv8, &f->fp8_gemm_table_rms));
      f->fp8_gemm_table = table_pays(f->fp8_gemm_curve_rms, f->fp8_gemm_table_rms);
    }
  }
  if (cpu) { /* the log-ratio fits, every point weighing the same (cpu_kernel_fit) */
    cpu_kernel_fit(c, NULL, &f->attention_eff, &f->hbm_eff, NULL);
    return MP_OK;
  }
  /* cuda: attention, the FLOP total over the time total, forward and backward together
   * (the large GPU shapes run at one rate) */
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
  /* cuda: HBM, the element-wise kernels' bytes over their time, against the datasheet */
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

double mp_calib_cpu_peak_flops(const mp_calib *c) {
  /* with a fit, the curve's efficiencies are relative to ref_bf16: the profile must hold
   * the same figure or every GEMM would be off by their ratio */
  if (c->fit.gemm_eff_max > 0 && c->ref_bf16_tflops > 0) return c->ref_bf16_tflops * 1e12;
  return mp_calib_gemm_peak_flops(c);
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
  double peak = mp_calib_cpu_peak_flops(c);
  if (peak > 0)
    for (int d = 0; d < MP_DTYPE_COUNT; d++) g->peak_tflops[d] = peak * 1e-12;
  /* the fit's hbm_eff is relative to ref_hbm, which is this copy figure */
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

mp_status mp_calib_apply_stack(mp_ctx *ctx, const mp_calib *c, mp_stack_profile *stack, mp_calib_tables *tables) {
  return mp_calib_apply_stack_run(ctx, c, NULL, stack, tables);
}

mp_status mp_calib_apply_stack_run(mp_ctx *ctx, const mp_calib *c, const mp_calib_run *run,
                                   mp_stack_profile *stack, mp_calib_tables *tables) {
  const int cpu = strcmp(c->device, "cpu") == 0;
  mp_calib_stack_fit fit;
  mp_calib_fit_run(c, run, &fit);
  const mp_calib_stack_fit *f = &fit;
  if (cpu) {
    /* the fit describes meshplan's CPU kernels; another stack's figures are its own, and
     * an older calibration (no fit) leaves the stated meshplan-cpu figures */
    if (strcmp(stack->name, "meshplan-cpu") != 0 || !(f->gemm_eff_max > 0)) return MP_OK;
  } else if (strcmp(c->device, "cuda") != 0) {
    return MP_OK;
  } else if (strcmp(stack->name, "meshplan-cuda") != 0) {
    return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld measured meshplan's CUDA kernels: it applies to the "
                    "meshplan-cuda stack, not %s; pass --stack meshplan-cuda or drop --calibration",
                    (long long)c->id, stack->name);
  }
  if (!(f->gemm_eff_max > 0))
    return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld holds no GEMM fit; run meshplan calibrate --device "
                    "cuda again", (long long)c->id);
  stack->gemm_eff_max = f->gemm_eff_max;
  stack->gemm_eff_half_mnk = f->gemm_eff_half_mnk;
  /* figures not measured (0) keep the stack's stated ones */
  if (f->fp8_gemm_eff_max > 0) stack->fp8_gemm_eff_max = f->fp8_gemm_eff_max;
  if (f->attention_eff > 0) stack->attention_eff = f->attention_eff;
  if (f->hbm_eff > 0) stack->hbm_eff = f->hbm_eff;
  for (int k = 0; k < MP_KERNEL_COUNT; k++) stack->hbm_eff_kernel[k] = f->hbm_eff_kernel[k];
  if (f->kernel_overhead_us > 0) stack->kernel_overhead_s = f->kernel_overhead_us * 1e-6;
  /* the tables are made from c's points and stored fit (f's GEMM figures are c->fit's:
   * mp_calib_fit_run refits only attention and the element-wise kernels) */
  stack->gemm_table = NULL;
  stack->fp8_gemm_table = NULL;
  if (tables && f->gemm_table) {
    mp_calib_gemm_table(c, &tables->bf16);
    stack->gemm_table = &tables->bf16;
  }
  if (tables && f->fp8_gemm_table && f->fp8_gemm_eff_max > 0) {
    mp_calib_fp8_gemm_table(c, &tables->fp8);
    stack->fp8_gemm_table = &tables->fp8;
  }
  if (cpu)
    snprintf(stack->source, sizeof stack->source,
             "calibration #%lld of cpu (%d threads x %d ranks) on %s at %s; GEMM %s; attention and element-wise %s",
             (long long)c->id, c->threads, c->world, c->host, c->created_at,
             stack->gemm_table ? "curve with the by-shape correction" : "curve",
             run ? "at the run's sizes" : "over every size");
  else
    snprintf(stack->source, sizeof stack->source,
             "calibration #%lld of cuda on %s (%s datasheet peaks) on %s at %s; GEMM %s; float8 GEMM %s",
             (long long)c->id, c->gpu_name, c->gpu_profile, c->host, c->created_at,
             stack->gemm_table ? "curve with the by-shape correction" : "curve",
             !(f->fp8_gemm_eff_max > 0) ? "as stated (not measured)"
             : stack->fp8_gemm_table   ? "curve with the by-shape correction"
                                       : "curve");
  return MP_OK;
}

mp_status mp_calib_load_apply(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                              mp_cluster *cluster) {
  return mp_calib_load_apply_stack(ctx, db_path, device, gpu, cluster, NULL, NULL, NULL);
}

mp_status mp_calib_load_apply_stack(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                                    mp_cluster *cluster, mp_stack_profile *stack, mp_calib_tables *tables,
                                    mp_calib *out) {
  mp_calib *c = malloc(sizeof *c);
  MP_CHECK_ALLOC(ctx, c);
  mp_status s = mp_calib_store_load(ctx, db_path, device, c);
  if (s == MP_OK) s = mp_calib_apply_checked(ctx, c, gpu, cluster);
  if (s == MP_OK && stack) s = mp_calib_apply_stack(ctx, c, stack, tables);
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
    snprintf(buf + n, cap - (size_t)n,
             ", attention_eff %s, hbm_eff %.3f, fp8_gemm_eff_max %s%s, kernel_overhead %.2f us", a, f->hbm_eff, f8,
             f->fp8_gemm_eff_max > 0 && f->fp8_gemm_table ? " (+ by shape)" : "", f->kernel_overhead_us);
    return;
  }
  const mp_calib_coll_fit *link = mp_calib_link_fit(c);
  int n = snprintf(buf, cap, "#%lld %s on %s, %d thread%s x %d rank%s, %s: GEMM %.2f GFLOP/s, copy %.2f GB/s",
                   (long long)c->id, c->device, c->host, c->threads, c->threads == 1 ? "" : "s", c->world,
                   c->world == 1 ? "" : "s", c->created_at, mp_calib_cpu_peak_flops(c) * 1e-9, c->copy_GBps);
  if (n < 0 || (size_t)n >= cap) return;
  if (c->fit.gemm_eff_max > 0) {
    const mp_calib_stack_fit *f = &c->fit;
    int m = snprintf(buf + n, cap - (size_t)n,
                     ", gemm_eff_max %.2f half_mnk %.2g%s, attention_eff %.3f, hbm_eff %.3f, kernel_overhead %.2f us",
                     f->gemm_eff_max, f->gemm_eff_half_mnk, f->gemm_table ? " (+ by shape)" : "", f->attention_eff,
                     f->hbm_eff, f->kernel_overhead_us);
    if (m < 0 || (size_t)m >= cap - (size_t)n) return;
    n += m;
  }
  if (link)
    snprintf(buf + n, cap - (size_t)n, ", link %.3f GB/s %.2f us (all_reduce, %d ranks)", link->beta_GBps,
             link->alpha_s * 1e6, link->group_size);
  else
    snprintf(buf + n, cap - (size_t)n, ", link not measured (1 rank)");
}

int mp_calib_threads_now(void) { return omp_get_max_threads(); }
