/* Device helpers shared by the non-GEMM CUDA kernels (elementwise.cu, norm.cu, rope.cu,
 * moe.cu, loss.cu, optim.cu, fp8.cu); their ops are declared in cuda_internal.h.
 *
 * Invariants:
 * - X tensors are __nv_bfloat16; every load widens to fp32 (mp_ldx) and every store
 *   rounds once, to nearest even (mp_stx), after all arithmetic is done in fp32.
 * - Launch shapes: elementwise kernels use grid-stride loops, so any n works with a
 *   capped grid; row kernels use one warp (32 lanes) or one block per row and reduce with
 *   shuffles in a fixed tree order, so a kernel gives the same bits on every run.
 * - Work is queued on impl->stream only; the scratch buffer (mp_cuda_scratch) is valid for
 *   the duration of one op, since ops of one context run in stream order.
 * Included by .cu files only (C++). */
#ifndef MP_KERNELS_CUDA_KERNELS_CUH
#define MP_KERNELS_CUDA_KERNELS_CUH

#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_internal.h"

typedef __nv_bfloat16 mp_bf16;

#define MP_CUDA_BLOCK 256 /* threads per block for elementwise kernels */

/* Grid for a grid-stride loop over n items: enough blocks to fill the device, capped
 * (the loop covers the rest), at least 1 so a launch with n == 0 is still valid. */
static inline unsigned mp_cuda_grid(size_t n, int block) {
  size_t g = (n + (size_t)block - 1) / (size_t)block;
  if (g > 65535) g = 65535;
  return g ? (unsigned)g : 1u;
}

#define MP_CUDA_STREAM(kc) (mp_cuda_impl_of(kc)->stream)

/* A device buffer of at least `bytes` owned by the context, valid until the next op on
 * kc (grows on demand; growing synchronizes the stream first). backend.cu. */
mp_status mp_cuda_scratch(mp_kctx *kc, size_t bytes, void **ptr);

__device__ __forceinline__ float mp_ldx(const mp_bf16 *p, size_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void mp_stx(mp_bf16 *p, size_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

/* ---- 16-byte vectors: 8 bf16 per load/store ------------------------------------------
 * Memory-bound kernels move X tensors as uint4 (8 bf16, one 16-byte transaction per lane),
 * which is what reaches HBM bandwidth; one bf16 per lane (2 bytes) leaves most of every
 * memory transaction unused. A vector path needs every pointer it touches 16-byte aligned
 * (mp_aligned16) and a row length (or n) divisible as the kernel says; kernels check on
 * the host and fall back to scalar code otherwise, so any caller's layout stays valid. */
#define MP_VEC 8 /* bf16 per 16-byte vector */

static inline bool mp_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* f[0..7] = the 8 bf16 at p (16-byte aligned), widened to fp32. Read-only path (ld.nc). */
__device__ __forceinline__ void mp_ld8(const mp_bf16 *p, float f[8]) {
  uint4 u = __ldg((const uint4 *)p);
  const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float2 t = __bfloat1622float2(h[j]);
    f[2 * j] = t.x;
    f[2 * j + 1] = t.y;
  }
}

/* The same for memory this kernel also writes (a += output): a coherent load. */
__device__ __forceinline__ void mp_ld8_rw(const mp_bf16 *p, float f[8]) {
  uint4 u = *(const uint4 *)p;
  const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float2 t = __bfloat1622float2(h[j]);
    f[2 * j] = t.x;
    f[2 * j + 1] = t.y;
  }
}

/* Widens a loaded vector (the raw uint4 a kernel kept in registers). */
__device__ __forceinline__ void mp_unpack8(uint4 u, float f[8]) {
  const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float2 t = __bfloat1622float2(h[j]);
    f[2 * j] = t.x;
    f[2 * j + 1] = t.y;
  }
}

/* f[0..7] rounded once each to nearest even (as mp_stx) and packed as a 16-byte vector in
 * memory order: what mp_st8 stores, for kernels that also look at the stored bits. */
__device__ __forceinline__ uint4 mp_pack8(const float f[8]) {
  uint4 u;
  __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
  for (int j = 0; j < 4; j++) h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
  return u;
}

/* Stores f[0..7] at p (16-byte aligned), each rounded once to nearest even (as mp_stx). */
__device__ __forceinline__ void mp_st8(mp_bf16 *p, const float f[8]) {
  *(uint4 *)p = mp_pack8(f);
}

/* ---- bytes in words: float8 codes ------------------------------------------------------
 * Word j (0..3) of a 16-byte vector, j a compile-time constant after unrolling (no
 * local-memory indexing). */
__device__ __forceinline__ uint32_t mp_u4_word(uint4 v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* The 4 x 4 byte block a[0..3] (row i in a[i], column k in byte k, little-endian memory
 * order) transposed into t[0..3] (column k in t[k], row i in its byte i): eight byte
 * permutes, no memory. The tiled float8 transposes (fp8.cu, matmul.cu) use it so that
 * every global access is a whole word or vector. */
__device__ __forceinline__ void mp_transpose4x4_u8(const uint32_t a[4], uint32_t t[4]) {
  uint32_t lo01 = __byte_perm(a[0], a[1], 0x5140), hi01 = __byte_perm(a[0], a[1], 0x7362);
  uint32_t lo23 = __byte_perm(a[2], a[3], 0x5140), hi23 = __byte_perm(a[2], a[3], 0x7362);
  t[0] = __byte_perm(lo01, lo23, 0x5410); /* bytes 0 of rows 0, 1, 2, 3 */
  t[1] = __byte_perm(lo01, lo23, 0x7632);
  t[2] = __byte_perm(hi01, hi23, 0x5410);
  t[3] = __byte_perm(hi01, hi23, 0x7632);
}

template <typename T>
__device__ __forceinline__ T mp_warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float mp_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the
 * result. `sh` holds >= 32 T. Ends with a barrier, so sh can be reused right after. */
template <typename T>
__device__ __forceinline__ T mp_block_sum(T v, T *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = mp_warp_sum(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T r = lane < nw ? sh[lane] : (T)0;
  r = mp_warp_sum(r);
  __syncthreads();
  return r;
}

/* Max over the block, same rules as mp_block_sum (NaN is ignored by fmaxf). */
__device__ __forceinline__ float mp_block_max(float v, float *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = mp_warp_max(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = lane < nw ? sh[lane] : -INFINITY;
  r = mp_warp_max(r);
  __syncthreads();
  return r;
}

/* ---- fused amax of stored bf16 values (rmsnorm_forward_amax, swiglu_*_amax) ------------
 * The same order f8_amax uses (fp8.cu): the bf16 pattern with its sign cleared orders like
 * |x| for every non-NaN value, and every NaN pattern (exponent all ones, mantissa non-zero,
 * above +inf's 0x7F80) orders above +inf. A kernel keeps, per thread, the max of the
 * patterns it stores, as two 16-bit halves (mp_amax_fold8: __vmaxu2 over a stored vector;
 * mp_amax_fold1: one stored value, in the low half); at its end every thread of the block
 * calls mp_amax_commit, which reduces the block and does one atomicMax per block on the
 * amax slot viewed as uint32, with the pattern m moved to the top: m << 16 is the fp32
 * bits of the bf16 value |x| (exact), and for non-negative fp32 bit patterns the unsigned
 * order is the float order, so the slot ends as the float max, or as a NaN pattern when
 * any stored value is NaN (m > 0x7F80 gives exponent all ones, mantissa non-zero). The
 * host zeroes the slot on the stream first (cudaMemsetAsync), so the result is written,
 * not max-accumulated, and an empty tensor gives 0, as f8_amax does. Max is exact in any
 * order, so the result is deterministic and equals f8_amax of the output bit for bit
 * (NaN: both NaN, payloads may differ). */
__device__ __forceinline__ uint32_t mp_amax_fold8(uint32_t m, uint4 u) {
  const uint32_t abs2 = 0x7FFF7FFFu;
  m = __vmaxu2(m, u.x & abs2);
  m = __vmaxu2(m, u.y & abs2);
  m = __vmaxu2(m, u.z & abs2);
  return __vmaxu2(m, u.w & abs2);
}

__device__ __forceinline__ uint32_t mp_amax_fold1(uint32_t m, mp_bf16 h) {
  return __vmaxu2(m, (uint32_t)(__bfloat16_as_ushort(h) & 0x7FFFu));
}

/* Commits K (1 or 2) per-thread maxima m[k] (fold representation) into slots[k]. Every
 * thread of the block must call it, once per kernel (it has a barrier and its own shared
 * buffer); blockDim.x a multiple of 32, blockDim.y == blockDim.z == 1. A block whose max
 * is 0 skips its atomic (the slot already holds >= 0). */
template <int K>
__device__ __forceinline__ void mp_amax_commit(float *const *slots, const uint32_t *m) {
  __shared__ uint32_t sh[K][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int k = 0; k < K; k++) {
    uint32_t v = (m[k] >> 16) > (m[k] & 0xFFFFu) ? (m[k] >> 16) : (m[k] & 0xFFFFu);
    v = __reduce_max_sync(0xffffffffu, v);
    if (lane == 0) sh[k][warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < K; k++) {
      uint32_t v = __reduce_max_sync(0xffffffffu, lane < nw ? sh[k][lane] : 0u);
      if (lane == 0 && v != 0u) atomicMax((unsigned int *)slots[k], v << 16);
    }
  }
}

/* The online-softmax merge of attention's running state (kernels/ops.h, attention_span_*):
 * a row's old lse and a pair's lse lp (natural units) give the new lse *nl and the weights
 * of the old mean (*wa) and of the pair's mean (*wb). With e = e^-|old - lp|, *nl =
 * max + log1p(e) and the weights are 1 / (1 + e) for the larger lse and e / (1 + e) for
 * the other (one exp and one log1p). An empty old state (lse -inf) gives lp, 0 and 1
 * exactly, so a first pair is written as it is. */
__device__ __forceinline__ void mp_attn_merge_weights(float old, float lp, float *nl, float *wa,
                                                      float *wb) {
  *nl = lp;
  *wa = 0.0f;
  *wb = 1.0f;
  if (old != -INFINITY) {
    const float e = expf(-fabsf(old - lp)), big = 1.0f / (1.0f + e);
    *nl = fmaxf(old, lp) + log1pf(e);
    *wa = old >= lp ? big : e * big;
    *wb = old >= lp ? e * big : big;
  }
}

#endif
