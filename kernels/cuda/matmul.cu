/* Linear layers on cuBLASLt: bf16 forward/backward with fp32 accumulation, float8 GEMMs on
 * codes with tensorwise scales, and the float8 byte transpose (kernels/ops.h).
 *
 * Row-major to column-major. cuBLASLt is column-major; a row-major (r, c) matrix with
 * leading dimension c is the column-major (c, r) matrix, its transpose. So each row-major
 * product is written for the transposes (D^T = op(B)^T op(A)^T):
 *   forward  out (N,M) = inp W^T      ->  out^T (M,N)  = W^T' inp^T   : A=W   T, B=inp  N
 *   dgrad    dinp (N,K) += dout W     ->  dinp^T (K,N) = W^T dout^T   : A=W   N, B=dout N
 *   wgrad    dW (M,K) += dout^T inp   ->  dW^T (K,M)   = inp^T dout   : A=inp N, B=dout T
 *   float8   out (R,S) = A B^T        ->  out^T (S,R)  = B' A^T       : A=B   T, B=A    N
 * (X' meaning the column-major view transposed by the op). The float8 line is the "TN"
 * layout cuBLASLt's float8 kernels require on Ada and Hopper ("A must be transposed and B
 * non-transposed", cuBLAS docs, cublasLtMatmul, FP8 requirements): both operands of
 * matmul_f8 are K-contiguous by contract (ops.h), so no transpose is needed here; the
 * runtime makes W^T, dy^T and x^T K-contiguous with f8_transpose before calling.
 *
 * Float8 requirements (same doc section) and how they are met:
 * - compute type CUBLAS_COMPUTE_32F, scale type CUDA_R_32F: every descriptor here;
 * - 16-byte aligned pointers and leading dimensions: R, K, S multiples of 16 and
 *   16-byte aligned operands, checked before any call;
 * - A/B types E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3 (E5M2 x E5M2 has no kernel) with
 *   C/D bf16/bf16 or fp32/fp32 (the type table of that section).
 * The first H100 run (CUDA 13) got NOT_SUPPORTED from cublasLtMatmul, after the heuristic
 * had answered, for the written (beta = 0) float8 GEMM, which passed C = D = out with two
 * layout objects. Since CUDA 13 cuBLASLt checks that a C pointer equal to D comes with
 * D's layout; XLA met this on its float8 path and fixed it by passing no C when beta = 0
 * (openxla/xla#34912). So here C is NULL whenever beta = 0 (PyTorch's scaled_gemm passes
 * NULL too), and an in-place update (C == D, beta = 1) passes one layout object for both.
 * That covers the three float8 outputs: bf16 written (beta 0, no C), bf16 accumulated
 * (MP_F8_GEMM_ADD, the dgrad dx += dy W: C = D = out_x, beta 1; the type table allows
 * bf16 C/D with beta != 0, and TransformerEngine's float8 GEMM accumulates into its bf16
 * D the same way) and fp32 accumulated (C = D = out_f32, beta 1).
 * Two more guards, since float8 is cuBLASLt's least exercised path here: lt_run asks the
 * heuristic for several algorithms and runs the first one cublasLtMatmul accepts (what
 * NVIDIA's LtFp8Matmul sample advises when the first answer may not run), and if none
 * accepts the direct form, matmul_f8 runs the plainest float8 form (fp32 D, no C, no
 * fast accumulation) into scratch and rounds it into the output, or adds it to the output
 * (bf16: rounding once, out = bf16(out + tmp); fp32: out += tmp), with one elementwise
 * kernel.
 *
 * Accumulation. "+=" outputs use beta = 1 with C = D: cuBLASLt reads C before writing D
 * element by element, so the update is in place; the weight gradient is an fp32 C/D with
 * bf16 A/B (CUBLAS_COMPUTE_32F supports that mix). The bias gradient is a column sum of
 * dout in two deterministic passes (per-chunk partial sums into the workspace, then a
 * fixed-order sum added into dbias), since the BGRADB epilogue overwrites rather than adds.
 *
 * Float8 scales. ops.h stores the quantisation scale s (code = x * s); cuBLASLt's
 * A/B_SCALE_POINTER take the dequantisation factor 1/s, so a one-thread kernel writes the
 * two reciprocals into a device buffer owned by the GEMM state; the host never reads a
 * scale (no synchronisation). The buffer is reused by every float8 GEMM of the context,
 * which is safe because all of them run in stream order.
 *
 * Fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t 1) is the caller's choice,
 * MP_F8_GEMM_FAST_ACCUM: without it Hopper promotes the tensor-core partial sums to full
 * fp32 periodically; with it the MMA keeps accumulating in its own narrower format. The
 * runtime asks for it on the forward GEMM only (torchao's default: K is a layer width);
 * dgrad and wgrad keep full promotion (the weight gradient's K is the token count, and
 * fp32 weight gradients need the precision). The attribute is set before the heuristic
 * runs (it may choose other kernels with it) and is part of the cache key.
 *
 * Algorithm cache. cublasLtMatmulAlgoGetHeuristic costs tens of microseconds, comparable
 * to a small GEMM, so the first algorithm that runs is cached per problem: shape, ops,
 * leading dimensions, dtypes, epilogue, whether C is read, fast accumulation (an algorithm
 * chosen with it is never reused without it, or the other way round), and the operands'
 * pointer alignments (an algorithm chosen for 256-byte aligned pointers may not run on less
 * aligned ones). A problem no algorithm accepts is cached as refused, so the float8
 * fallback does not ask again. Open addressing in a fixed table; when the table is 3/4
 * full new problems are solved without caching. One cache per context, so no locking
 * (one mp_kctx per thread of work).
 *
 * Every cuBLASLt status and kernel launch is checked; descriptors are released on every
 * path. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_kernels.cuh" /* mp_cuda_scratch for the float8 fallback */
#include "kernels/cuda/gemm.h"

namespace {

/* 32 MiB: what NVIDIA recommends for Hopper cuBLASLt (and more than Ampere needs). */
const size_t kWorkspaceBytes = (size_t)32 << 20;
const int kCacheSlots = 512;
/* Heuristic answers tried in order until cublasLtMatmul accepts one (NVIDIA's LtFp8Matmul
 * sample suggests asking for several when the first may not run). */
const int kMaxAlgos = 8;
/* The two float8 scale factors sit 256 bytes apart, each as aligned as a separate
 * cudaMalloc, the way every other cuBLASLt user passes them (cuBLASLt documents no
 * alignment for scale pointers; this takes the question off the table). */
const int kScaleStride = 64;

/* All int32 fields, so the struct has no padding and memcmp / hashing of a
 * zero-initialised key is well defined. */
struct gemm_key {
  int32_t m, n, k, lda, ldb, ldc;
  int32_t transa, transb;
  int32_t atype, btype, ctype, dtype;
  int32_t epilogue, scaled;
  int32_t c_read; /* 1: C == D read in place (beta != 0); 0: C NULL (beta == 0) */
  int32_t fast_accum; /* 1: CUBLASLT_MATMUL_DESC_FAST_ACCUM set (float8 only) */
  int32_t align_a, align_b, align_c, align_d;
};

struct gemm_slot {
  int used;
  int refused; /* no algorithm ran this problem: lt_run answers MP_ERR_UNSUPPORTED */
  gemm_key key;
  cublasLtMatmulAlgo_t algo;
};

struct gemm_state {
  gemm_slot slots[kCacheSlots];
  int n_used;
  float *inv_scales; /* device (2 * kScaleStride): dequant factors of the float8 operands,
                        at [0] (cuBLASLt A) and [kScaleStride] (cuBLASLt B) */
};

/* One cuBLASLt problem in column-major terms (see the file comment). C is either NULL
 * (beta must be 0: nothing is read) or equal to D (an in-place update, same type and
 * leading dimension); no call here reads a C distinct from D. */
struct lt_call {
  const char *what;
  cublasOperation_t ta, tb;
  int m, n, k;
  cudaDataType_t atype, btype, ctype, dtype;
  const void *A;
  int lda;
  const void *B;
  int ldb;
  const void *C;
  void *D;
  int ldc; /* C and D share it */
  float alpha, beta;
  cublasLtEpilogue_t epilogue;
  const void *bias;
  const float *a_scale, *b_scale; /* device dequant factors (float8) or NULL */
  int fast_accum;                 /* float8: allow fast accumulation (the caller's flag) */
};

/* Largest power of two <= 256 dividing the address. */
int32_t pointer_alignment(const void *p) {
  uintptr_t u = (uintptr_t)p;
  int32_t a = 256;
  while (a > 1 && (u % (uintptr_t)a) != 0) a >>= 1;
  return a;
}

uint32_t hash_key(const gemm_key *k) {
  const unsigned char *p = (const unsigned char *)k;
  uint32_t h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < sizeof(*k); i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

/* The slot holding key, or the empty slot where it would go, or NULL (table full). */
gemm_slot *cache_find(gemm_state *gs, const gemm_key *key) {
  uint32_t h = hash_key(key);
  for (int probe = 0; probe < kCacheSlots; probe++) {
    gemm_slot *s = &gs->slots[(h + (uint32_t)probe) % (uint32_t)kCacheSlots];
    if (!s->used || memcmp(&s->key, key, sizeof(*key)) == 0) return s;
  }
  return NULL;
}

#define LT_TRY(stmt)                                                                        \
  do {                                                                                      \
    cublasStatus_t lt_cs_ = (stmt);                                                         \
    if (lt_cs_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      st = mp_error(kc->err, MP_ERR_CUDA, "%s:%d: %s failed on cuda device %d (%s, m=%d "  \
                    "n=%d k=%d): cublas status %d (%s)", __FILE__, __LINE__, #stmt,         \
                    kc->device, c->what, c->m, c->n, c->k, (int)lt_cs_,                     \
                    cublasLtGetStatusString(lt_cs_));                                       \
      goto done;                                                                            \
    }                                                                                       \
  } while (0)

/* Runs one problem. MP_ERR_UNSUPPORTED (message on kc->err) when cuBLASLt has no
 * algorithm that accepts it, so a caller can fall back; any other failure is MP_ERR_CUDA. */
mp_status lt_run(mp_kctx *kc, const lt_call *c) {
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  gemm_state *gs = (gemm_state *)im->gemm_cache;
  mp_status st = MP_OK;
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, ld = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res[kMaxAlgos];
  int n_res = 0;
  gemm_key key;
  gemm_slot *slot = NULL;
  int32_t ta = (int32_t)c->ta, tb = (int32_t)c->tb;
  uint32_t epi = (uint32_t)c->epilogue;
  uint64_t ws_bytes = (uint64_t)im->workspace_bytes;
  const int c_read = c->C != NULL;
  cublasStatus_t last = CUBLAS_STATUS_NOT_SUPPORTED;
  memset(res, 0, sizeof(res));
  memset(&key, 0, sizeof(key));
  /* Invariants of every caller (see lt_call); a violation is a bug here, not bad input. */
  if ((c_read && (c->C != c->D || c->ctype != c->dtype)) || (!c_read && c->beta != 0.0f))
    return mp_error(kc->err, MP_ERR_INTERNAL, "%s: C must be NULL (beta 0) or equal to D "
                    "with D's type", c->what);

  LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (c->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                          sizeof(epi)));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c->bias,
                                          sizeof(c->bias)));
  }
  /* Scales are set before the heuristic runs: it may pick a kernel that cannot apply
   * them otherwise (openxla/xla#40747). */
  if (c->a_scale)
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                          &c->a_scale, sizeof(c->a_scale)));
  if (c->b_scale)
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                          &c->b_scale, sizeof(c->b_scale)));
  /* Likewise fast accumulation; left unset (cuBLASLt's default 0) when not asked for. */
  if (c->fast_accum) {
    const int8_t fast = 1;
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                          sizeof(fast)));
  }
  /* Stored shapes: op(A) is (m, k), op(B) is (k, n), C and D are (m, n). */
  LT_TRY(cublasLtMatrixLayoutCreate(&la, c->atype, c->ta == CUBLAS_OP_N ? c->m : c->k,
                                    c->ta == CUBLAS_OP_N ? c->k : c->m, c->lda));
  LT_TRY(cublasLtMatrixLayoutCreate(&lb, c->btype, c->tb == CUBLAS_OP_N ? c->k : c->n,
                                    c->tb == CUBLAS_OP_N ? c->n : c->k, c->ldb));
  LT_TRY(cublasLtMatrixLayoutCreate(&ld, c->dtype, c->m, c->n, c->ldc));
  /* In place: one layout object for C and D (CUDA 13 checks that C == D comes with D's
   * layout). Not read: a layout of D's type still describes C, as cuBLASLt wants one. */
  if (c_read)
    lc = ld;
  else
    LT_TRY(cublasLtMatrixLayoutCreate(&lc, c->ctype, c->m, c->n, c->ldc));

  key.m = c->m;
  key.n = c->n;
  key.k = c->k;
  key.lda = c->lda;
  key.ldb = c->ldb;
  key.ldc = c->ldc;
  key.transa = ta;
  key.transb = tb;
  key.atype = (int32_t)c->atype;
  key.btype = (int32_t)c->btype;
  key.ctype = (int32_t)c->ctype;
  key.dtype = (int32_t)c->dtype;
  key.epilogue = (int32_t)c->epilogue;
  key.scaled = c->a_scale != NULL;
  key.c_read = c_read;
  key.fast_accum = c->fast_accum ? 1 : 0;
  key.align_a = pointer_alignment(c->A);
  key.align_b = pointer_alignment(c->B);
  key.align_c = pointer_alignment(c->C);
  key.align_d = pointer_alignment(c->D);
  slot = cache_find(gs, &key);
  if (slot && slot->used) {
    if (slot->refused) goto refused;
    LT_TRY(cublasLtMatmul(im->lt, op, &c->alpha, c->A, la, c->B, lb, &c->beta, c->C, lc, c->D,
                          ld, &slot->algo, im->workspace, im->workspace_bytes, im->stream));
    goto done;
  }
  {
    uint32_t al[4] = {(uint32_t)key.align_a, (uint32_t)key.align_b, (uint32_t)key.align_c,
                      (uint32_t)key.align_d};
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws_bytes, sizeof(ws_bytes)));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof(al[0])));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof(al[1])));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof(al[2])));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], sizeof(al[3])));
    /* NOT_SUPPORTED from the heuristic means "no algorithm", like n_res == 0. */
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(im->lt, op, la, lb, lc, ld, pref,
                                                       kMaxAlgos, res, &n_res);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED) n_res = 0;
    else LT_TRY(hs);
  }
  /* The first answer that cublasLtMatmul accepts; NOT_SUPPORTED is decided on the host
   * before anything is queued, so trying the next one is safe. */
  for (int i = 0; i < n_res; i++) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    last = cublasLtMatmul(im->lt, op, &c->alpha, c->A, la, c->B, lb, &c->beta, c->C, lc, c->D,
                          ld, &res[i].algo, im->workspace, im->workspace_bytes, im->stream);
    if (last == CUBLAS_STATUS_NOT_SUPPORTED) continue;
    LT_TRY(last);
    if (slot && gs->n_used < kCacheSlots * 3 / 4) {
      slot->used = 1;
      slot->refused = 0;
      slot->key = key;
      slot->algo = res[i].algo;
      gs->n_used++;
    }
    goto done;
  }
  if (slot && gs->n_used < kCacheSlots * 3 / 4) {
    slot->used = 1;
    slot->refused = 1;
    slot->key = key;
    gs->n_used++;
  }
refused:
  st = mp_error(kc->err, MP_ERR_UNSUPPORTED, "%s: cuBLASLt has no algorithm that runs m=%d "
                "n=%d k=%d (A/B/D types %d/%d/%d, %d heuristic answers, last status %d: %s) "
                "on cuda device %d; check the dtypes and alignment of the operands", c->what,
                c->m, c->n, c->k, (int)c->atype, (int)c->btype, (int)c->dtype, n_res,
                (int)last, cublasLtGetStatusString(last), kc->device);
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc && lc != ld) cublasLtMatrixLayoutDestroy(lc);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return st;
}

#undef LT_TRY

/* ---- small kernels ------------------------------------------------------------------ */

/* out (N, M) = broadcast bias, or 0: the K == 0 forward (an empty sum). */
__global__ void fill_rows_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *bias, size_t total,
                                 int M) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = bias ? bias[i % (size_t)M] : __float2bfloat16(0.0f);
}

enum { kColsumRows = 8 }; /* blockDim (32, kColsumRows): 32 columns per block */

/* Column sums of dout over the row chunk blockIdx.y: partial[chunk, c] = sum, or, with one
 * chunk, dbias[c] += sum directly. Each thread sums a strided subset of rows, then one
 * thread per column adds the kColsumRows partials in a fixed order: deterministic. */
__global__ void colsum_kernel(float *dst, int direct, const __nv_bfloat16 *dout, int N, int M,
                              int rows_per_chunk) {
  __shared__ float sh[kColsumRows][33];
  int c = blockIdx.x * 32 + threadIdx.x;
  int r0 = blockIdx.y * rows_per_chunk;
  int r1 = min(N, r0 + rows_per_chunk);
  float s = 0.0f;
  if (c < M)
    for (int r = r0 + (int)threadIdx.y; r < r1; r += kColsumRows)
      s += __bfloat162float(dout[(size_t)r * M + c]);
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < M) {
    float t = 0.0f;
    for (int y = 0; y < kColsumRows; y++) t += sh[y][threadIdx.x];
    if (direct)
      dst[c] += t;
    else
      dst[(size_t)blockIdx.y * M + c] = t;
  }
}

/* dbias[c] += sum over chunks of partial[chunk, c], chunks in order. */
__global__ void colsum_finish_kernel(float *dbias, const float *partial, int chunks, int M) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= M) return;
  float t = 0.0f;
  for (int i = 0; i < chunks; i++) t += partial[(size_t)i * M + c];
  dbias[c] += t;
}

__global__ void reciprocal2_kernel(float *inv, const float *s0, const float *s1) {
  inv[0] = 1.0f / *s0;
  inv[kScaleStride] = 1.0f / *s1;
}

/* The float8 fallback's second half: out_x = round(tmp), or with add out_x = round(out_x +
 * tmp) (bf16, the sum in fp32, rounded once to nearest even, as cuBLASLt's epilogue rounds
 * alpha AB + beta C), or out_f32 += tmp. Exactly one of out_x, out_f32 is non-NULL. */
__global__ void f8_finish_kernel(__nv_bfloat16 *out_x, float *out_f32, const float *tmp,
                                 size_t n, int add) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    if (out_x)
      out_x[i] = __float2bfloat16_rn(add ? __bfloat162float(out_x[i]) + tmp[i] : tmp[i]);
    else
      out_f32[i] += tmp[i];
  }
}

enum { kTransposeTile = 32, kTransposeRows = 8 };

/* out (C, R) = in (R, C) for bytes, any shape and alignment, through a 32 x 32 shared tile
 * so that both the reads and the writes are row-contiguous. Tile rows loop over blockIdx.y
 * with a grid stride (gridDim.y is capped at 65535). */
__global__ void f8_transpose_kernel(uint8_t *out, const uint8_t *in, int R, int C) {
  __shared__ uint8_t tile[kTransposeTile][kTransposeTile + 1];
  const int row_tiles = (R + kTransposeTile - 1) / kTransposeTile;
  const int c0 = blockIdx.x * kTransposeTile;
  for (int ty = blockIdx.y; ty < row_tiles; ty += gridDim.y) {
    const int r0 = ty * kTransposeTile;
    int c = c0 + threadIdx.x;
    for (int j = threadIdx.y; j < kTransposeTile; j += kTransposeRows) {
      int r = r0 + j;
      if (r < R && c < C) tile[j][threadIdx.x] = in[(size_t)r * C + c];
    }
    __syncthreads();
    int r = r0 + threadIdx.x;
    for (int j = threadIdx.y; j < kTransposeTile; j += kTransposeRows) {
      int cc = c0 + j;
      if (cc < C && r < R) out[(size_t)cc * R + r] = tile[threadIdx.x][j];
    }
    __syncthreads(); /* the next tile overwrites the shared buffer */
  }
}

/* The vector transpose: 64 x 128 byte tiles (rows x columns), 128 threads, 16-byte loads
 * and stores only. Thread (rg, cg) = (threadIdx.x / 8, threadIdx.x % 8) loads rows
 * 4 rg .. 4 rg + 3, columns 16 cg .. 16 cg + 15 of the tile (four 16-byte loads; a warp
 * reads 4 rows x 128 contiguous bytes per load), transposes its four 4 x 4 byte blocks in
 * registers (mp_transpose4x4_u8) and stores the 16 column words into a shared tile of
 * the output, (128 rows, 64 bytes); the block then writes that tile as 16-byte stores (a
 * warp writes 8 output rows x 64 contiguous bytes). In the shared tile, output row cc is
 * four 16-byte chunks (input rows 16q .. 16q + 15) and chunk q sits at position
 * q ^ ((cc / 16) & 3): a warp's word stores (8 column groups at one offset) then hit
 * 2-way instead of 8-way bank conflicts, and every chunk is still one aligned vector for
 * the conflict-free read-out. Needs in 16-byte aligned with C % 16 == 0 and out 16-byte
 * aligned with R % 16 == 0, so every row segment a thread touches is whole. */
enum { kTransposeVecRows = 64, kTransposeVecCols = 128, kTransposeVecThreads = 128 };

__global__ void __launch_bounds__(kTransposeVecThreads)
    f8_transpose_vec_kernel(uint8_t *out, const uint8_t *in, int R, int C) {
  __shared__ uint4 tile[kTransposeVecCols * 4];
  uint32_t *tw = (uint32_t *)tile;
  const int rg = threadIdx.x >> 3, cg = threadIdx.x & 7;
  const int c0 = blockIdx.x * kTransposeVecCols, c = c0 + cg * 16;
  const int row_tiles = (R + kTransposeVecRows - 1) / kTransposeVecRows;
  for (int ty = blockIdx.y; ty < row_tiles; ty += gridDim.y) {
    const int r0 = ty * kTransposeVecRows;
    uint4 u[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int r = r0 + rg * 4 + i;
      u[i] = (r < R && c < C) ? __ldg((const uint4 *)(in + (size_t)r * C + c))
                              : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) { /* columns 4j .. 4j + 3 of the thread's 16 */
      uint32_t a[4], t[4];
#pragma unroll
      for (int i = 0; i < 4; i++) a[i] = mp_u4_word(u[i], j);
      mp_transpose4x4_u8(a, t);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        int cc = cg * 16 + j * 4 + k;
        tw[cc * 16 + (((rg >> 2) ^ ((cc >> 4) & 3)) << 2) + (rg & 3)] = t[k];
      }
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < kTransposeVecCols * 4 / kTransposeVecThreads; it++) {
      int v = threadIdx.x + it * kTransposeVecThreads, cc = v >> 2, q = v & 3;
      int col = c0 + cc, row = r0 + q * 16;
      if (col < C && row < R)
        *(uint4 *)(out + (size_t)col * R + row) = tile[cc * 4 + (q ^ ((cc >> 4) & 3))];
    }
    __syncthreads(); /* the next row tile overwrites the shared buffer */
  }
}

mp_status dbias_accumulate(mp_kctx *kc, float *dbias, const __nv_bfloat16 *dout, int N, int M) {
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  /* Enough chunks of >= 128 rows to fill the device, at most 64, and no more partial
   * sums than the workspace holds (it is free: cuBLASLt calls before us are finished in
   * stream order before this kernel starts). */
  int chunks = (N + 127) / 128;
  if (chunks > 64) chunks = 64;
  size_t fit = im->workspace_bytes / ((size_t)M * sizeof(float));
  if ((size_t)chunks > fit) chunks = (int)fit;
  if (chunks < 1) chunks = 1;
  int rows_per_chunk = (N + chunks - 1) / chunks;
  dim3 block(32, kColsumRows), grid((unsigned)((M + 31) / 32), (unsigned)chunks);
  if (chunks == 1) {
    colsum_kernel<<<grid, block, 0, im->stream>>>(dbias, 1, dout, N, M, rows_per_chunk);
    MP_CUDA_LAUNCH_CHECK(kc);
    return MP_OK;
  }
  float *partial = (float *)im->workspace;
  colsum_kernel<<<grid, block, 0, im->stream>>>(partial, 0, dout, N, M, rows_per_chunk);
  MP_CUDA_LAUNCH_CHECK(kc);
  colsum_finish_kernel<<<(unsigned)((M + 255) / 256), 256, 0, im->stream>>>(dbias, partial,
                                                                           chunks, M);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status require_ready(mp_kctx *kc, const char *op) {
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  if (!im || !im->lt || !im->gemm_cache)
    return mp_error(kc->err, MP_ERR_INVALID, "%s: the CUDA context has no cuBLASLt state; "
                    "initialise it with the backend's init (mp_cuda_gemm_init)", op);
  return MP_OK;
}

}  // namespace

/* ---- lifecycle ----------------------------------------------------------------------- */

mp_status mp_cuda_gemm_init(mp_kctx *kc) {
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  if (!im)
    return mp_error(kc->err, MP_ERR_INVALID, "mp_cuda_gemm_init: kc->impl is NULL; the "
                    "backend must create its mp_cuda_impl first");
  mp_status st = MP_OK;
  gemm_state *gs = NULL;
  cublasStatus_t cs = cublasLtCreate(&im->lt);
  if (cs != CUBLAS_STATUS_SUCCESS) {
    im->lt = NULL;
    return mp_error(kc->err, MP_ERR_CUDA, "cublasLtCreate failed on cuda device %d: cublas "
                    "status %d (%s)", kc->device, (int)cs, cublasLtGetStatusString(cs));
  }
  cudaError_t ce = cudaMalloc(&im->workspace, kWorkspaceBytes);
  if (ce != cudaSuccess) {
    im->workspace = NULL;
    st = mp_error(kc->err, MP_ERR_CUDA, "cudaMalloc of the %zu-byte cuBLASLt workspace failed "
                  "on cuda device %d: %s", kWorkspaceBytes, kc->device, cudaGetErrorString(ce));
    goto fail;
  }
  im->workspace_bytes = kWorkspaceBytes;
  gs = (gemm_state *)calloc(1, sizeof(gemm_state));
  if (!gs) {
    st = mp_error(kc->err, MP_ERR_NOMEM, "mp_cuda_gemm_init: out of host memory for the "
                  "GEMM algorithm cache (%zu bytes)", sizeof(gemm_state));
    goto fail;
  }
  im->gemm_cache = gs;
  ce = cudaMalloc(&gs->inv_scales, 2 * kScaleStride * sizeof(float));
  if (ce != cudaSuccess) {
    gs->inv_scales = NULL;
    st = mp_error(kc->err, MP_ERR_CUDA, "cudaMalloc of the float8 scale buffer failed on "
                  "cuda device %d: %s", kc->device, cudaGetErrorString(ce));
    goto fail;
  }
  return MP_OK;
fail:
  mp_cuda_gemm_shutdown(kc);
  return st;
}

void mp_cuda_gemm_shutdown(mp_kctx *kc) {
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  if (!im) return;
  gemm_state *gs = (gemm_state *)im->gemm_cache;
  if (gs) {
    if (gs->inv_scales) cudaFree(gs->inv_scales);
    free(gs);
    im->gemm_cache = NULL;
  }
  if (im->workspace) cudaFree(im->workspace);
  im->workspace = NULL;
  im->workspace_bytes = 0;
  if (im->lt) cublasLtDestroy(im->lt);
  im->lt = NULL;
}

/* ---- bf16 Linear ------------------------------------------------------------------- */

mp_status mp_cuda_matmul_forward(mp_kctx *kc, void *out, const void *inp, const void *weight,
                                 const void *bias, int N, int K, int M) {
  MP_KREQUIRE(kc, N >= 0 && K >= 0 && M >= 0, "matmul_forward");
  if (N == 0 || M == 0) return MP_OK;
  MP_KREQUIRE(kc, out != NULL, "matmul_forward");
  MP_CHECK(require_ready(kc, "matmul_forward"));
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  if (K == 0) {
    size_t total = (size_t)N * M;
    unsigned grid = (unsigned)((total + 255) / 256 < 65535 ? (total + 255) / 256 : 65535);
    fill_rows_kernel<<<grid, 256, 0, im->stream>>>((__nv_bfloat16 *)out,
                                                   (const __nv_bfloat16 *)bias, total, M);
    MP_CUDA_LAUNCH_CHECK(kc);
    return MP_OK;
  }
  MP_KREQUIRE(kc, inp != NULL && weight != NULL, "matmul_forward");
  lt_call c;
  memset(&c, 0, sizeof(c));
  c.what = "matmul_forward";
  c.ta = CUBLAS_OP_T;
  c.tb = CUBLAS_OP_N;
  c.m = M;
  c.n = N;
  c.k = K;
  c.atype = c.btype = c.ctype = c.dtype = CUDA_R_16BF;
  c.A = weight;
  c.lda = K;
  c.B = inp;
  c.ldb = K;
  c.C = out;
  c.D = out;
  c.ldc = M;
  c.alpha = 1.0f;
  c.beta = 0.0f;
  c.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  c.bias = bias;
  return lt_run(kc, &c);
}

mp_status mp_cuda_matmul_backward(mp_kctx *kc, void *dinp, float *dweight, float *dbias,
                                  const void *dout, const void *inp, const void *weight, int N,
                                  int K, int M) {
  MP_KREQUIRE(kc, N >= 0 && K >= 0 && M >= 0, "matmul_backward");
  if (N == 0 || M == 0) return MP_OK; /* every gradient gets += 0 */
  MP_KREQUIRE(kc, dout != NULL, "matmul_backward");
  MP_CHECK(require_ready(kc, "matmul_backward"));
  if (dinp && K > 0) {
    MP_KREQUIRE(kc, weight != NULL, "matmul_backward");
    lt_call c;
    memset(&c, 0, sizeof(c));
    c.what = "matmul_backward (dinp)";
    c.ta = CUBLAS_OP_N;
    c.tb = CUBLAS_OP_N;
    c.m = K;
    c.n = N;
    c.k = M;
    c.atype = c.btype = c.ctype = c.dtype = CUDA_R_16BF;
    c.A = weight;
    c.lda = K;
    c.B = dout;
    c.ldb = M;
    c.C = dinp;
    c.D = dinp;
    c.ldc = K;
    c.alpha = 1.0f;
    c.beta = 1.0f;
    c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    MP_CHECK(lt_run(kc, &c));
  }
  if (dweight && K > 0) {
    MP_KREQUIRE(kc, inp != NULL, "matmul_backward");
    lt_call c;
    memset(&c, 0, sizeof(c));
    c.what = "matmul_backward (dweight)";
    c.ta = CUBLAS_OP_N;
    c.tb = CUBLAS_OP_T;
    c.m = K;
    c.n = M;
    c.k = N;
    c.atype = c.btype = CUDA_R_16BF;
    c.ctype = c.dtype = CUDA_R_32F;
    c.A = inp;
    c.lda = K;
    c.B = dout;
    c.ldb = M;
    c.C = dweight;
    c.D = dweight;
    c.ldc = K;
    c.alpha = 1.0f;
    c.beta = 1.0f;
    c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    MP_CHECK(lt_run(kc, &c));
  }
  if (dbias) MP_CHECK(dbias_accumulate(kc, dbias, (const __nv_bfloat16 *)dout, N, M));
  return MP_OK;
}

/* ---- float8 ---------------------------------------------------------------------------- */

mp_status mp_cuda_matmul_f8(mp_kctx *kc, void *out_x, float *out_f32, const uint8_t *a,
                            const float *a_scale, mp_f8_format fmt_a, const uint8_t *b,
                            const float *b_scale, mp_f8_format fmt_b, int R, int K, int S,
                            unsigned flags) {
  /* Unknown bits are refused like any other bad argument (MP_ERR_INVALID), on every
   * device, before anything is queued: a flag this build does not know must not be
   * silently dropped. */
  const unsigned known = MP_F8_GEMM_ADD | MP_F8_GEMM_FAST_ACCUM;
  if (flags & ~known)
    return mp_error(kc->err, MP_ERR_INVALID, "matmul_f8: unknown flags 0x%x in 0x%x; the "
                    "known ones are MP_F8_GEMM_ADD (0x%x) and MP_F8_GEMM_FAST_ACCUM (0x%x)",
                    flags & ~known, flags, MP_F8_GEMM_ADD, MP_F8_GEMM_FAST_ACCUM);
  MP_KREQUIRE(kc, R >= 0 && K >= 0 && S >= 0, "matmul_f8");
  MP_KREQUIRE(kc, (out_x == NULL) != (out_f32 == NULL), "matmul_f8");
  MP_KREQUIRE(kc, a && b && a_scale && b_scale, "matmul_f8");
  MP_CHECK(require_ready(kc, "matmul_f8"));
  /* out_f32 is accumulated whatever the flags; ADD only changes the bf16 output. */
  const int add_x = out_x != NULL && (flags & MP_F8_GEMM_ADD) != 0;
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  if (im->cc_major * 10 + im->cc_minor < 89)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "matmul_f8: float8 GEMMs need compute "
                    "capability >= 8.9 (Ada, Hopper); cuda device %d is %d.%d. Train this "
                    "model in bf16, or emulate float8 with f8_fake_quantize + matmul",
                    kc->device, im->cc_major, im->cc_minor);
  if (R % 16 || K % 16 || S % 16)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "matmul_f8: R=%d, K=%d, S=%d must all be "
                    "multiples of 16 for cuBLASLt float8 GEMMs; pad the layer widths and "
                    "token count to multiples of 16 or run this layer in bf16", R, K, S);
  if (fmt_a == MP_F8_E5M2 && fmt_b == MP_F8_E5M2)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "matmul_f8: E5M2 x E5M2 has no cuBLASLt "
                    "kernel; quantise one operand (weights or activations) to E4M3");
  const void *out = out_x ? out_x : (const void *)out_f32;
  if (pointer_alignment(a) < 16 || pointer_alignment(b) < 16 || pointer_alignment(out) < 16)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "matmul_f8: operands must be 16-byte aligned "
                    "for cuBLASLt float8 GEMMs (a=%p b=%p out=%p); allocate them separately "
                    "or at aligned offsets", (const void *)a, (const void *)b, out);
  if (R == 0 || S == 0) return MP_OK;
  if (K == 0) { /* empty sum: written output is zero, accumulated outputs unchanged */
    if (out_x && !add_x)
      MP_CUDA_CHECK(kc, cudaMemsetAsync(out_x, 0, (size_t)R * S * sizeof(__nv_bfloat16),
                                        im->stream));
    return MP_OK;
  }
  gemm_state *gs = (gemm_state *)im->gemm_cache;
  /* cuBLASLt A is our B and cuBLASLt B is our A (TN, see the file comment). */
  reciprocal2_kernel<<<1, 1, 0, im->stream>>>(gs->inv_scales, b_scale, a_scale);
  MP_CUDA_LAUNCH_CHECK(kc);
  lt_call c;
  memset(&c, 0, sizeof(c));
  c.what = "matmul_f8";
  c.ta = CUBLAS_OP_T;
  c.tb = CUBLAS_OP_N;
  c.m = S;
  c.n = R;
  c.k = K;
  c.atype = fmt_b == MP_F8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
  c.btype = fmt_a == MP_F8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
  c.A = b;
  c.lda = K;
  c.B = a;
  c.ldb = K;
  c.ldc = S;
  c.alpha = 1.0f;
  c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  c.a_scale = gs->inv_scales;
  c.b_scale = gs->inv_scales + kScaleStride;
  c.fast_accum = (flags & MP_F8_GEMM_FAST_ACCUM) != 0;
  /* Direct form: bf16 D written with no C (beta 0), bf16 C = D updated in place (ADD,
   * beta 1), or fp32 C = D updated in place. C == D shares D's layout (lt_run). */
  if (out_x) {
    c.ctype = c.dtype = CUDA_R_16BF;
    c.C = add_x ? out_x : NULL;
    c.D = out_x;
    c.beta = add_x ? 1.0f : 0.0f;
  } else {
    c.ctype = c.dtype = CUDA_R_32F;
    c.C = out_f32;
    c.D = out_f32;
    c.beta = 1.0f;
  }
  mp_status st = lt_run(kc, &c);
  if (st != MP_ERR_UNSUPPORTED) return st;
  /* Fallback: the plainest float8 form, fp32 D with no C and full promotion (FAST_ACCUM
   * only allows fast accumulation, so dropping it is within the contract and can only
   * gain precision), into scratch, then one elementwise pass rounds it into out_x (with
   * ADD: adds it to out_x, rounding once) or adds it to out_f32. Costs R*S*4 bytes of
   * scratch and one extra pass over the output. */
  const size_t n = (size_t)R * S;
  void *tmp = NULL;
  MP_CHECK(mp_cuda_scratch(kc, n * sizeof(float), &tmp));
  c.what = "matmul_f8 (fp32 fallback)";
  c.fast_accum = 0;
  c.ctype = c.dtype = CUDA_R_32F;
  c.C = NULL;
  c.D = tmp;
  c.beta = 0.0f;
  st = lt_run(kc, &c);
  if (st != MP_OK) {
    if (st == MP_ERR_UNSUPPORTED)
      mp_error_prefix(kc->err, "matmul_f8: cuBLASLt refused both the %s output and the fp32 "
                      "fallback (%s x %s, R=%d K=%d S=%d); ",
                      out_x ? (add_x ? "accumulated bf16" : "bf16") : "accumulated fp32",
                      fmt_a == MP_F8_E5M2 ? "E5M2" : "E4M3",
                      fmt_b == MP_F8_E5M2 ? "E5M2" : "E4M3", R, K, S);
    return st;
  }
  f8_finish_kernel<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, im->stream>>>(
      (__nv_bfloat16 *)out_x, out_f32, (const float *)tmp, n, add_x);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* The vector kernel for aligned operands with R and C multiples of 16 (every matmul_f8
 * operand), the byte-wise kernel for anything else. */
mp_status mp_cuda_f8_transpose(mp_kctx *kc, uint8_t *out, const uint8_t *in, int R, int C) {
  MP_KREQUIRE(kc, R >= 0 && C >= 0, "f8_transpose");
  if (R == 0 || C == 0) return MP_OK;
  MP_KREQUIRE(kc, out && in && out != in, "f8_transpose");
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  MP_KREQUIRE(kc, im != NULL, "f8_transpose");
  if (mp_aligned16(in) && mp_aligned16(out) && R % 16 == 0 && C % 16 == 0) {
    int row_tiles = (R + kTransposeVecRows - 1) / kTransposeVecRows;
    dim3 grid((unsigned)((C + kTransposeVecCols - 1) / kTransposeVecCols),
              (unsigned)(row_tiles < 65535 ? row_tiles : 65535));
    f8_transpose_vec_kernel<<<grid, kTransposeVecThreads, 0, im->stream>>>(out, in, R, C);
    MP_CUDA_LAUNCH_CHECK(kc);
    return MP_OK;
  }
  int row_tiles = (R + kTransposeTile - 1) / kTransposeTile;
  dim3 block(kTransposeTile, kTransposeRows);
  dim3 grid((unsigned)((C + kTransposeTile - 1) / kTransposeTile),
            (unsigned)(row_tiles < 65535 ? row_tiles : 65535));
  f8_transpose_kernel<<<grid, block, 0, im->stream>>>(out, in, R, C);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}
