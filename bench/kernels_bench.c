/* Kernel benchmark (not a test): achieved TFLOP/s or GB/s of the CUDA kernels at the main
 * shapes of a ~1B llama-style model (d_model 2048, 16 heads, 8 KV heads, head dim 128,
 * d_ff 8192, vocab 32000, sequence 2048, micro-batch 4, so N = 8192 tokens), beside the
 * device's measured peaks: a large (8192^3) bf16 cuBLASLt GEMM and a device-to-device
 * copy. One table; each figure is the median of kReps timed runs (CUDA events on the op's
 * stream) after kWarm untimed ones.
 *
 * Every op runs through the CUDA backend (kernels/cuda/cuda.h) on one context, so all
 * buffers and ops share its stream. FLOPs are the algorithmic ones (2NKM per GEMM,
 * causal attention: half of 4 B nh T^2 hd forward and 2.5x that backward, as in the
 * FlashAttention papers), so a kernel that recomputes reports less than it executes.
 * Bytes for memory-bound ops are the minimum traffic (each input read once, each output
 * written once). Inputs are pseudo-random in [-1, 1), never zeros (see fill_random).
 * Without CUDA or without a device it prints "no CUDA device" and exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cuda/cuda.h"
#include "kernels/ops.h"

#ifndef MP_HAVE_CUDA
int main(void) {
  printf("no CUDA device (built without CUDA)\n");
  return 0;
}
#else
#include <cuda_runtime_api.h>


enum { kWarm = 2, kReps = 7 };

/* Model shapes. */
enum { D = 2048, NH = 16, NKV = 8, HD = 128, FF = 8192, VOCAB = 32000, SEQ = 2048, MB = 4 };
enum { NTOK = SEQ * MB };

typedef enum op_kind {
  OP_FWD, OP_DGRAD, OP_WGRAD, OP_ATTN_FWD, OP_ATTN_BWD, OP_F8, OP_COPY, OP_RMSNORM,
  OP_SWIGLU, OP_RESIDUAL, OP_CE, OP_ADAMW, OP_F8_AMAX, OP_F8_QUANT, OP_F8_QUANT_T,
  OP_F8_TRANSPOSE, OP_F8_CAST, OP_F8_FAST, OP_F8_DGRAD, OP_F8_WGRAD, OP_RMSNORM_AMAX,
  OP_SWIGLU_AMAX, OP_SWIGLU_BWD, OP_SWIGLU_BWD_AMAX
} op_kind;

typedef struct bench_case {
  const char *name;
  op_kind kind;
  int a, b, c; /* GEMM: N K M; F8: R K S; others: see run_op */
} bench_case;

/* Device buffers shared by all cases (sized for the largest). */
typedef struct bufs {
  void *x0, *x1, *x2, *x3, *x4, *x5;
  float *f0, *f1, *f2, *f3;
  float *scale; /* (1) = 1: the float8 scales */
  int32_t *ids;
} bufs;

static mp_ctx g_err;
static mp_kctx g_kc;
static const mp_backend *g_be;

#define BENCH_CHECK(expr)                                                        \
  do {                                                                           \
    mp_status bs_ = (expr);                                                      \
    if (bs_ != MP_OK) {                                                          \
      fprintf(stderr, "kernels_bench: %s failed: %s\n", #expr, mp_errmsg(&g_err)); \
      return bs_;                                                                \
    }                                                                            \
  } while (0)

/* The GEMMs, bf16 and float8: timed in FLOP/s against the bf16 GEMM peak. */
static int is_gemm(op_kind k) {
  return k == OP_FWD || k == OP_DGRAD || k == OP_WGRAD || k == OP_F8 || k == OP_F8_FAST ||
         k == OP_F8_DGRAD || k == OP_F8_WGRAD;
}

static int is_attention(op_kind k) { return k == OP_ATTN_FWD || k == OP_ATTN_BWD; }

/* One run of a GEMM or the attention (is_gemm, is_attention). */
static mp_status run_compute_op(const bench_case *bc, const bufs *b) {
  mp_kctx *kc = &g_kc;
  switch (bc->kind) {
    case OP_FWD:
      return g_be->matmul_forward(kc, b->x2, b->x0, b->x1, NULL, bc->a, bc->b, bc->c);
    case OP_DGRAD:
      return g_be->matmul_backward(kc, b->x0, NULL, NULL, b->x2, b->x0, b->x1, bc->a, bc->b,
                                   bc->c);
    case OP_WGRAD:
      return g_be->matmul_backward(kc, NULL, b->f0, NULL, b->x2, b->x0, b->x1, bc->a, bc->b,
                                   bc->c);
    case OP_ATTN_FWD:
      return g_be->attention_forward(kc, b->x3, b->f1, b->x0, b->x1, b->x2, MB, SEQ, NH, NKV,
                                     HD, HD);
    case OP_ATTN_BWD:
      return g_be->attention_backward(kc, b->x4, b->x5,
                                      (char *)b->x5 + (size_t)NTOK * NKV * HD * 2, b->x3, b->x0, b->x1, b->x2,
                                      b->x3, b->f1, MB, SEQ, NH, NKV, HD, HD);
    case OP_F8:
      return g_be->matmul_f8(kc, b->x2, NULL, (const uint8_t *)b->x0, b->scale, MP_F8_E4M3,
                             (const uint8_t *)b->x1, b->scale, MP_F8_E4M3, bc->a, bc->b, bc->c, 0);
    /* The float8 GEMMs as runtime.c runs them (a, b, c = N, K, M of the Linear): forward
     * with fast accumulation; dgrad dx (N, K) += dy (N, M, E5M2) W (M, K), B = W^T codes;
     * wgrad dW (M, K) += dy^T (M, N, E5M2) x (N, K), B = x^T codes, into fp32. */
    case OP_F8_FAST:
      return g_be->matmul_f8(kc, b->x2, NULL, (const uint8_t *)b->x0, b->scale, MP_F8_E4M3,
                             (const uint8_t *)b->x1, b->scale, MP_F8_E4M3, bc->a, bc->b, bc->c,
                             MP_F8_GEMM_FAST_ACCUM);
    case OP_F8_DGRAD:
      return g_be->matmul_f8(kc, b->x2, NULL, (const uint8_t *)b->x0, b->scale, MP_F8_E5M2,
                             (const uint8_t *)b->x1, b->scale, MP_F8_E4M3, bc->a, bc->c, bc->b,
                             MP_F8_GEMM_ADD);
    case OP_F8_WGRAD:
      return g_be->matmul_f8(kc, NULL, b->f0, (const uint8_t *)b->x0, b->scale, MP_F8_E5M2,
                             (const uint8_t *)b->x1, b->scale, MP_F8_E4M3, bc->c, bc->a, bc->b, 0);
    default:
      return MP_ERR_INTERNAL;
  }
}

/* One run of a memory-bound op: the norms, activations, copy, residual, loss, optimizer
 * and the float8 casts. */
static mp_status run_memory_op(const bench_case *bc, const bufs *b) {
  mp_kctx *kc = &g_kc;
  switch (bc->kind) {
    case OP_RMSNORM_AMAX:
      return g_be->rmsnorm_forward_amax(kc, b->x2, b->f1, b->x0, b->x1, bc->a, bc->b, 1e-5f,
                                        b->f2);
    case OP_SWIGLU_AMAX:
      return g_be->swiglu_forward_amax(kc, b->x2, b->x0, b->x1, (size_t)bc->a * bc->b, b->f2);
    /* SwiGLU backward: gate x0, up x1, dout x2; dgate and dup carved from x2 after dout */
    case OP_SWIGLU_BWD:
    case OP_SWIGLU_BWD_AMAX: {
      const size_t n = (size_t)bc->a * bc->b;
      char *dg = (char *)b->x2 + n * 2, *du = dg + n * 2;
      if (bc->kind == OP_SWIGLU_BWD) return g_be->swiglu_backward(kc, dg, du, b->x2, b->x0, b->x1, n);
      return g_be->swiglu_backward_amax(kc, dg, du, b->x2, b->x0, b->x1, n, b->f2, b->f2 + 1);
    }
    case OP_COPY:
      return g_be->memcpy_d2d(kc, b->x2, b->x0, (size_t)bc->a << 20);
    case OP_RMSNORM:
      return g_be->rmsnorm_forward(kc, b->x2, b->f1, b->x0, b->x1, bc->a, bc->b, 1e-5f);
    case OP_SWIGLU:
      return g_be->swiglu_forward(kc, b->x2, b->x0, b->x1, (size_t)bc->a * bc->b);
    case OP_RESIDUAL:
      return g_be->residual_forward(kc, b->x2, b->x0, b->x1, (size_t)bc->a * bc->b);
    case OP_CE:
      return g_be->cross_entropy_forward(kc, b->f1, b->f2, b->f3, b->x0, b->ids, bc->a, bc->b);
    case OP_ADAMW:
      return g_be->adamw_update(kc, b->f0, b->f1, b->f2, b->f3, (size_t)bc->a * bc->b, 1e-4f,
                                0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
    /* Float8 casts of x0 (a, b) bf16: codes into x1, transposed codes into x2, amax and
     * scale into f1[0], f1[1]; the transpose moves x1's bytes into x2. */
    case OP_F8_AMAX:
      return g_be->f8_amax(kc, b->f1, b->x0, (size_t)bc->a * bc->b);
    case OP_F8_QUANT:
      return g_be->f8_quantize(kc, (uint8_t *)b->x1, b->x0, b->scale, (size_t)bc->a * bc->b,
                               MP_F8_E4M3);
    case OP_F8_QUANT_T:
      return g_be->f8_quantize_t(kc, (uint8_t *)b->x1, (uint8_t *)b->x2, b->x0, b->scale, bc->a,
                                 bc->b, MP_F8_E5M2);
    case OP_F8_TRANSPOSE:
      return g_be->f8_transpose(kc, (uint8_t *)b->x2, (const uint8_t *)b->x1, bc->a, bc->b);
    case OP_F8_CAST: { /* what the runtime runs per float8 GEMM operand in backward */
      mp_status st = g_be->f8_amax(kc, b->f1, b->x0, (size_t)bc->a * bc->b);
      if (st == MP_OK) st = g_be->f8_scale_from_amax(kc, b->f1 + 1, b->f1, MP_F8_E5M2);
      if (st == MP_OK)
        st = g_be->f8_quantize_t(kc, (uint8_t *)b->x1, (uint8_t *)b->x2, b->x0, b->f1 + 1,
                                 bc->a, bc->b, MP_F8_E5M2);
      return st;
    }
    default:
      return MP_ERR_INTERNAL;
  }
}

static mp_status run_op(const bench_case *bc, const bufs *b) {
  if (is_gemm(bc->kind) || is_attention(bc->kind)) return run_compute_op(bc, b);
  return run_memory_op(bc, b);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Median milliseconds of one run of bc, or a negative value on failure. */
static float time_case(const bench_case *bc, const bufs *b) {
  cudaStream_t s = (cudaStream_t)mp_cuda_stream(&g_kc);
  cudaEvent_t e0, e1;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) return -1.0f;
  float ms[kReps];
  float med = -1.0f;
  for (int i = 0; i < kWarm; i++)
    if (run_op(bc, b) != MP_OK) goto out;
  for (int i = 0; i < kReps; i++) {
    cudaEventRecord(e0, s);
    if (run_op(bc, b) != MP_OK) goto out;
    cudaEventRecord(e1, s);
    if (cudaEventSynchronize(e1) != cudaSuccess) goto out;
    cudaEventElapsedTime(&ms[i], e0, e1);
  }
  qsort(ms, kReps, sizeof(float), cmp_float);
  med = ms[kReps / 2];
out:
  if (med < 0) fprintf(stderr, "kernels_bench: %s failed: %s\n", bc->name, mp_errmsg(&g_err));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return med;
}

/* Work of one run: FLOPs (compute-bound ops) or bytes (memory-bound ops). */
static double work_of(const bench_case *bc, int *is_bytes) {
  double attn = 4.0 * MB * NH * (double)SEQ * SEQ * HD / 2.0;
  *is_bytes = 0;
  if (is_gemm(bc->kind)) return 2.0 * bc->a * (double)bc->b * bc->c;
  if (bc->kind == OP_ATTN_FWD) return attn;
  if (bc->kind == OP_ATTN_BWD) return 2.5 * attn;
  *is_bytes = 1;
  double n = (double)bc->a * bc->b;
  switch (bc->kind) {
    case OP_COPY: return 2.0 * ((double)bc->a * (1 << 20)); /* read + write */
    case OP_RMSNORM: case OP_RMSNORM_AMAX: return 2.0 * n * 2 + 2.0 * bc->b + 4.0 * bc->a;
    case OP_SWIGLU: case OP_SWIGLU_AMAX: case OP_RESIDUAL: return 3.0 * n * 2;
    case OP_SWIGLU_BWD: case OP_SWIGLU_BWD_AMAX: return 7.0 * n * 2; /* dout g u dg du; dg du */
    case OP_CE: return n * 2 + 3.0 * 4 * bc->a + 4.0 * bc->a;
    case OP_ADAMW: return 7.0 * 4 * n;
    /* Float8 casts: the bf16 read plus the code writes, the least any cast can move (the
     * transpose: codes read and written). The cast chain reads x twice (amax, then
     * quantize_t) but counts one read, so its % is how close it comes to the ideal. */
    case OP_F8_AMAX: return 2.0 * n;
    case OP_F8_QUANT: return 2.0 * n + n;
    case OP_F8_QUANT_T: case OP_F8_CAST: return 2.0 * n + 2.0 * n;
    case OP_F8_TRANSPOSE: return 2.0 * n;
    default: return 0;
  }
}

/* Fills n elements of an X buffer (dst_x != NULL) or of an fp32 buffer with values in
 * [-1, 1) from a fixed pseudo-random block, repeated: timings on zeros can flatter a GEMM
 * (METHOD.md: a bf16 GEMM ran 13 % faster on zeros on an H200), and every element is
 * written. */
enum { kFillBlock = 1 << 24 };
static float *g_fill;
static int fill_random(void *dst_x, float *dst_f, size_t n) {
  for (size_t i = 0; i < n; i += kFillBlock) {
    size_t m = n - i < kFillBlock ? n - i : kFillBlock;
    mp_status st = dst_x ? g_be->to_device_f32(&g_kc, (char *)dst_x + i * mp_kdtype_bytes(g_be->x_dtype), g_fill, m)
                         : g_be->memcpy_h2d(&g_kc, dst_f + i, g_fill, m * sizeof(float));
    if (st != MP_OK) return -1;
  }
  return 0;
}

static int alloc_bufs(bufs *b) {
  /* Largest needs: x: 8192^2 bf16 (peak GEMM, FF GEMMs), LM head out 8192 x 32000 bf16;
   * f0: fp32 dweight up to 32000 x 2048 and AdamW state of 64M; copy 1 GiB. */
  size_t xb = (size_t)NTOK * VOCAB * 2;
  if (xb < ((size_t)1 << 30)) xb = (size_t)1 << 30;
  size_t fb = (size_t)64 << 20 << 2;
  g_fill = malloc(kFillBlock * sizeof(float));
  if (!g_fill) return -1;
  uint64_t z = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < kFillBlock; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    g_fill[i] = (float)((z >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
  }
  void **xs[6] = {&b->x0, &b->x1, &b->x2, &b->x3, &b->x4, &b->x5};
  float **fs[4] = {&b->f0, &b->f1, &b->f2, &b->f3};
  for (int i = 0; i < 6; i++) {
    size_t bytes = i < 3 ? xb : (size_t)NTOK * NH * HD * 2;
    if (g_be->alloc(&g_kc, xs[i], bytes) != MP_OK ||
        fill_random(*xs[i], NULL, bytes / mp_kdtype_bytes(g_be->x_dtype)) != 0)
      return -1;
  }
  for (int i = 0; i < 4; i++) {
    if (i == 3) /* f3 is AdamW's second moment, which must be >= 0 */
      for (size_t j = 0; j < kFillBlock; j++) g_fill[j] = g_fill[j] * g_fill[j];
    if (g_be->alloc(&g_kc, (void **)fs[i], fb) != MP_OK || fill_random(NULL, *fs[i], fb / sizeof(float)) != 0)
      return -1;
  }
  int32_t *ids = malloc((size_t)NTOK * sizeof(int32_t));
  if (!ids) return -1;
  for (int i = 0; i < NTOK; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = (int32_t)((z >> 33) % VOCAB);
  }
  int bad = g_be->alloc(&g_kc, (void **)&b->ids, (size_t)NTOK * 4) != MP_OK ||
            g_be->memcpy_h2d(&g_kc, b->ids, ids, (size_t)NTOK * 4) != MP_OK;
  free(ids);
  if (bad) return -1;
  /* Float8 scale 1 keeps the arithmetic finite. */
  float one = 1.0f;
  if (g_be->alloc(&g_kc, (void **)&b->scale, sizeof(float)) != MP_OK ||
      g_be->memcpy_h2d(&g_kc, b->scale, &one, sizeof(one)) != MP_OK)
    return -1;
  return g_be->synchronize(&g_kc) == MP_OK ? 0 : -1;
}

/* The table's rows: the model's GEMMs (bf16, then float8 as the runtime runs them), the
 * attention, the memory-bound ops and the float8 casts. */
static const bench_case k_cases[] = {
    {"qkv fwd", OP_FWD, NTOK, D, D + 2 * NKV * HD},
    {"qkv dgrad", OP_DGRAD, NTOK, D, D + 2 * NKV * HD},
    {"qkv wgrad", OP_WGRAD, NTOK, D, D + 2 * NKV * HD},
    {"attn-out fwd", OP_FWD, NTOK, D, D},
    {"attn-out dgrad", OP_DGRAD, NTOK, D, D},
    {"attn-out wgrad", OP_WGRAD, NTOK, D, D},
    {"mlp gate/up fwd", OP_FWD, NTOK, D, FF},
    {"mlp gate/up dgrad", OP_DGRAD, NTOK, D, FF},
    {"mlp gate/up wgrad", OP_WGRAD, NTOK, D, FF},
    {"mlp down fwd", OP_FWD, NTOK, FF, D},
    {"mlp down dgrad", OP_DGRAD, NTOK, FF, D},
    {"mlp down wgrad", OP_WGRAD, NTOK, FF, D},
    {"lm-head fwd", OP_FWD, NTOK, D, VOCAB},
    {"lm-head dgrad", OP_DGRAD, NTOK, D, VOCAB},
    {"lm-head wgrad", OP_WGRAD, NTOK, D, VOCAB},
    {"attention fwd (flash)", OP_ATTN_FWD, 0, 0, 0},
    {"attention bwd (flash)", OP_ATTN_BWD, 0, 0, 0},
    {"fp8 e4m3 GEMM gate/up", OP_F8, NTOK, D, FF},
    {"fp8 qkv fwd fast", OP_F8_FAST, NTOK, D, D + 2 * NKV * HD},
    {"fp8 qkv dgrad add", OP_F8_DGRAD, NTOK, D, D + 2 * NKV * HD},
    {"fp8 qkv wgrad", OP_F8_WGRAD, NTOK, D, D + 2 * NKV * HD},
    {"fp8 attn-out fwd fast", OP_F8_FAST, NTOK, D, D},
    {"fp8 attn-out dgrad add", OP_F8_DGRAD, NTOK, D, D},
    {"fp8 attn-out wgrad", OP_F8_WGRAD, NTOK, D, D},
    {"fp8 gate/up fwd fast", OP_F8_FAST, NTOK, D, FF},
    {"fp8 gate/up dgrad add", OP_F8_DGRAD, NTOK, D, FF},
    {"fp8 gate/up wgrad", OP_F8_WGRAD, NTOK, D, FF},
    {"fp8 down fwd", OP_F8, NTOK, FF, D},
    {"fp8 down fwd fast", OP_F8_FAST, NTOK, FF, D},
    {"fp8 down dgrad add", OP_F8_DGRAD, NTOK, FF, D},
    {"fp8 down wgrad", OP_F8_WGRAD, NTOK, FF, D},
    {"rmsnorm fwd", OP_RMSNORM, NTOK, D, 0},
    {"rmsnorm fwd + amax", OP_RMSNORM_AMAX, NTOK, D, 0},
    {"swiglu fwd", OP_SWIGLU, NTOK, FF, 0},
    {"swiglu fwd + amax", OP_SWIGLU_AMAX, NTOK, FF, 0},
    {"swiglu bwd", OP_SWIGLU_BWD, NTOK, FF, 0},
    {"swiglu bwd + 2 amax", OP_SWIGLU_BWD_AMAX, NTOK, FF, 0},
    {"residual fwd", OP_RESIDUAL, NTOK, D, 0},
    {"cross-entropy fwd", OP_CE, NTOK, VOCAB, 0},
    {"adamw 64M params", OP_ADAMW, 64, 1 << 20, 0},
    {"f8 amax", OP_F8_AMAX, 8192, 8192, 0},
    {"f8 quantize e4m3", OP_F8_QUANT, 8192, 8192, 0},
    {"f8 quantize_t e5m2", OP_F8_QUANT_T, 8192, 8192, 0},
    {"f8 transpose", OP_F8_TRANSPOSE, 8192, 8192, 0},
    {"f8 cast amax+scale+q_t", OP_F8_CAST, 8192, 8192, 0},
};

/* The device's measured peaks, which the table's % column divides by. */
typedef struct peaks {
  float gemm_ms, copy_ms; /* the peak cases' medians; negative where one failed */
  double tflops, gbps;    /* 0 where its case failed */
} peaks;

static void measure_peaks(const bufs *b, peaks *pk) {
  const bench_case peak_gemm = {"peak bf16 GEMM 8192^3", OP_FWD, 8192, 8192, 8192};
  const bench_case peak_copy = {"peak d2d copy 1 GiB", OP_COPY, 1024, 0, 0};
  pk->gemm_ms = time_case(&peak_gemm, b);
  pk->copy_ms = time_case(&peak_copy, b);
  int isb;
  pk->tflops = pk->gemm_ms > 0 ? work_of(&peak_gemm, &isb) / (pk->gemm_ms * 1e-3) / 1e12 : 0;
  pk->gbps = pk->copy_ms > 0 ? work_of(&peak_copy, &isb) / (pk->copy_ms * 1e-3) / 1e9 : 0;
}

/* The shape column: N x K x M of a GEMM, the attention's batch, sequence, heads and head
 * dim, else the op's rows x columns. */
static void case_shape(const bench_case *bc, char *shape, size_t cap) {
  if (is_gemm(bc->kind))
    snprintf(shape, cap, "%dx%dx%d", bc->a, bc->b, bc->c);
  else if (is_attention(bc->kind))
    snprintf(shape, cap, "B%d T%d h%d/%d d%d", MB, SEQ, NH, NKV, HD);
  else
    snprintf(shape, cap, "%dx%d", bc->a, bc->b);
}

/* bc timed, and its row: milliseconds, the achieved rate and its share of the peak. */
static void print_case(const bench_case *bc, const bufs *b, const peaks *pk) {
  char shape[32];
  case_shape(bc, shape, sizeof(shape));
  float t = time_case(bc, b);
  if (t < 0) {
    printf("%-24s %-20s %10s %12s %8s\n", bc->name, shape, "-", "skipped", "-");
    return;
  }
  int isb;
  double w = work_of(bc, &isb);
  double rate = w / (t * 1e-3) / (isb ? 1e9 : 1e12);
  double peak = isb ? pk->gbps : pk->tflops;
  char ach[24];
  snprintf(ach, sizeof(ach), "%.1f %s", rate, isb ? "GB/s" : "TF/s");
  printf("%-24s %-20s %10.3f %12s %7.0f%%\n", bc->name, shape, t, ach,
         peak > 0 ? 100.0 * rate / peak : 0.0);
}

int main(void) {
  if (mp_cuda_device_count() == 0) {
    printf("no CUDA device\n");
    return 0;
  }
  mp_ctx_init(&g_err);
  g_kc.err = &g_err;
  g_be = mp_cuda_backend();
  BENCH_CHECK(g_be->init(&g_kc, 0));
  struct cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  bufs b;
  memset(&b, 0, sizeof(b));
  if (alloc_bufs(&b) != 0) {
    fprintf(stderr, "kernels_bench: allocation failed: %s\n", mp_errmsg(&g_err));
    return 1;
  }
  peaks pk;
  measure_peaks(&b, &pk);
  printf("device: %s (cc %d.%d, %d SMs)\n", prop.name, prop.major, prop.minor,
         prop.multiProcessorCount);
  printf("measured peaks: bf16 GEMM %.1f TFLOP/s (%.3f ms), d2d copy %.0f GB/s (%.3f ms)\n",
         pk.tflops, pk.gemm_ms, pk.gbps, pk.copy_ms);
  printf("%-24s %-20s %10s %12s %8s\n", "kernel", "shape", "ms", "achieved", "% peak");
  for (size_t i = 0; i < sizeof(k_cases) / sizeof(k_cases[0]); i++) print_case(&k_cases[i], &b, &pk);
  printf("fp8 %% is against the bf16 GEMM peak (float8 tensor cores peak at ~2x bf16).\n");
  printf("f8 cast rows: bytes = bf16 read + code writes (transpose: codes read + written), "
         "%% against the copy peak.\n");
  g_be->shutdown(&g_kc);
  return 0;
}
#endif
