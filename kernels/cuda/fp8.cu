/* Float8 cast kernels on CUDA: amax, scale from amax, quantize (row-major and, in the same
 * pass, transposed), dequantize and fake quantize, tensorwise scaling (kernels/ops.h;
 * reference kernels/cpu/fp8.c).
 *
 * Scales and amax stay on the device: every kernel reads *scale itself, so the float8
 * path never synchronises with the host. Encoding uses cuda_fp8.h's
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE (round to nearest even; the hardware cvt on
 * sm_89+, NVIDIA's software path below), after two guards that pin the cases where the
 * CPU's mp_f8_encode is the contract: NaN maps to the format's canonical NaN code (0x7F
 * E4M3, 0x7E E5M2, sign dropped) whatever the cvt would give, and values (infinities
 * included) are clamped to +-max first, which cannot change a finite in-range result and
 * makes saturation explicit. The vector paths encode two values per cvt
 * (__nv_cvt_float2_to_fp8x2: the same cvt.rn.satfinite instruction with both halves used,
 * two scalar casts on sm_80) behind the same guards, so every path gives the same bits.
 * Decoding is bit arithmetic on the code, the same formula as mp_f8_decode, and exact in
 * fp32.
 *
 * Bandwidth. The casts sit around every float8 GEMM, so they must cost about one read of
 * the bf16 tensor plus the code writes:
 * - amax reads 16 bytes (8 bf16) per load, four loads in flight per thread, over a grid
 *   of 8 blocks of 256 threads per SM (full occupancy), and takes the max of the bf16 bit
 *   patterns with the sign cleared: for non-NaN values the pattern of |x| orders like
 *   |x|, and every NaN (exponent all ones, mantissa non-zero, > 0x7F80) orders above
 *   +inf, so an unsigned max (__vmaxu2, two bf16 per instruction) is max |x| and is NaN
 *   exactly when some element is, as on the CPU. Per-block partial maxima go to the
 *   context's scratch and one block reduces them: max is exact in any order, so the
 *   result is deterministic.
 * - quantize: one thread per 8 elements, one 16-byte load and one 8-byte store.
 * - quantize_t: 64 x 64 tiles, 128 threads, each thread 4 rows x 8 columns (four 16-byte
 *   loads); it writes its row-major codes as 8-byte stores, transposes its two 4 x 4 byte
 *   blocks in registers (__byte_perm), stores the 8 column words into a shared tile of
 *   the transposed codes, and the block writes that tile as 16-byte stores.
 * The vector paths need aligned pointers and shapes (each host function says which); a
 * misaligned start of a flat tensor is peeled (up to 7 scalar elements) and other cases
 * take the scalar kernels, so every layout stays valid. */
#include <cuda_fp8.h>
#include <math.h>

#include "kernels/cuda/cuda_kernels.cuh"

enum {
  AMAX_BLOCKS_PER_SM = 8,  /* x 256 threads = 2048, the most an SM holds */
  AMAX_UNROLL = 4,         /* 16-byte loads in flight per thread */
  QT_TILE = 64,            /* quantize_t: tile rows = tile columns */
  QT_THREADS = 128,        /* (QT_TILE / 4 row groups) x (QT_TILE / 8 column groups) */
};

__device__ __forceinline__ uint8_t f8_encode(float v, int e5m2) {
  if (isnan(v)) return e5m2 ? 0x7E : 0x7F;
  float mx = e5m2 ? MP_F8_E5M2_MAX : MP_F8_E4M3_MAX;
  v = fminf(fmaxf(v, -mx), mx);
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

/* Codes of a (low byte) and b (high byte): f8_encode of each, two per cvt. */
template <int E5M2>
__device__ __forceinline__ uint32_t f8_encode2(float a, float b) {
  const float mx = E5M2 ? MP_F8_E5M2_MAX : MP_F8_E4M3_MAX;
  const uint32_t nan_code = E5M2 ? 0x7Eu : 0x7Fu;
  float2 v = make_float2(fminf(fmaxf(a, -mx), mx), fminf(fmaxf(b, -mx), mx));
  uint32_t c = __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, E5M2 ? __NV_E5M2 : __NV_E4M3);
  if (isnan(a)) c = (c & 0xFF00u) | nan_code;
  if (isnan(b)) c = (c & 0x00FFu) | (nan_code << 8);
  return c;
}

/* The 8 codes of 8 bf16 (a 16-byte vector) times s, element j in byte j % 4 of word
 * j / 4 (memory order on a little-endian device). */
template <int E5M2>
__device__ __forceinline__ uint2 f8_encode8(uint4 u, float s) {
  float f[8];
  mp_unpack8(u, f);
  uint2 w;
  w.x = f8_encode2<E5M2>(f[0] * s, f[1] * s) | (f8_encode2<E5M2>(f[2] * s, f[3] * s) << 16);
  w.y = f8_encode2<E5M2>(f[4] * s, f[5] * s) | (f8_encode2<E5M2>(f[6] * s, f[7] * s) << 16);
  return w;
}

__device__ __forceinline__ float f8_decode(uint8_t code, int e5m2) {
  int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  int ef = (code >> mbits) & ((1 << (7 - mbits)) - 1);
  int mant = code & ((1 << mbits) - 1);
  float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (!e5m2 && ef == 15 && mant == 7) return NAN;
  if (e5m2 && ef == 31) return mant ? NAN : sign * INFINITY;
  float v = ef == 0 ? ldexpf((float)mant, 1 - bias - mbits)
                    : ldexpf(1.0f + (float)mant / (float)(1 << mbits), ef - bias);
  return sign * v;
}

/* Elements before the first 16-byte boundary of a bf16 tensor at p (at most n): the
 * scalar head a flat vector kernel peels. */
static size_t head_to_align16(const void *p, size_t n) {
  size_t h = ((16u - ((uintptr_t)p & 15u)) & 15u) / 2u;
  return h < n ? h : n;
}

/* ---- amax ------------------------------------------------------------------------------ */

/* Max over the block of unsigned v (blockDim.x a multiple of 32); valid in thread 0. */
__device__ __forceinline__ uint32_t block_max_u32(uint32_t v, uint32_t *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = __reduce_max_sync(0xffffffffu, v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) v = __reduce_max_sync(0xffffffffu, lane < nw ? sh[lane] : 0u);
  return v;
}


/* part[block] = max |x| pattern over the block's share: the head [0, h) and the tail
 * [h + 8 nvec, n) element by element in block 0, vectors [0, nvec) of x + h grid-stride. */
__global__ void k_amax_partials(uint32_t *part, const mp_bf16 *x, size_t n, size_t h,
                                size_t nvec) {
  __shared__ uint32_t sh[32];
  const uint16_t *xs = (const uint16_t *)x;
  const uint4 *xv = (const uint4 *)(x + h);
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  uint32_t m = 0;
  size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; v + (AMAX_UNROLL - 1) * stride < nvec; v += AMAX_UNROLL * stride) {
    uint4 u[AMAX_UNROLL];
#pragma unroll
    for (int k = 0; k < AMAX_UNROLL; k++) u[k] = __ldg(xv + v + k * stride);
#pragma unroll
    for (int k = 0; k < AMAX_UNROLL; k++) m = mp_amax_fold8(m, u[k]);
  }
  for (; v < nvec; v += stride) m = mp_amax_fold8(m, __ldg(xv + v));
  if (blockIdx.x == 0) {
    size_t t0 = h + nvec * MP_VEC;
    if (threadIdx.x < h) m = __vmaxu2(m, xs[threadIdx.x] & 0x7FFFu);
    if (t0 + threadIdx.x < n) m = __vmaxu2(m, xs[t0 + threadIdx.x] & 0x7FFFu);
  }
  m = (m >> 16) > (m & 0xFFFFu) ? (m >> 16) : (m & 0xFFFFu); /* the two halves' max */
  m = block_max_u32(m, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = m;
}

__global__ void k_amax_finish(float *amax, const uint32_t *part, int nparts) {
  __shared__ uint32_t sh[32];
  uint32_t m = 0;
  for (int b = threadIdx.x; b < nparts; b += blockDim.x) m = m > part[b] ? m : part[b];
  m = block_max_u32(m, sh);
  /* A pattern above +inf's 0x7F80 is a NaN; otherwise it is |x| as bf16, exact in fp32. */
  if (threadIdx.x == 0) *amax = m > 0x7F80u ? NAN : __uint_as_float(m << 16);
}

__global__ void k_scale_from_amax(float *scale, const float *amax, float fmax) {
  float a = *amax > 1e-12f ? *amax : 1e-12f; /* torchao's EPS clamp; NaN -> 1e-12 too */
  *scale = fmax / a;
}

/* ---- quantize ---------------------------------------------------------------------------- */

__global__ void k_f8_quantize(uint8_t *codes, const mp_bf16 *x, const float *scale, size_t n,
                              int e5m2) {
  float s = *scale;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    codes[i] = f8_encode(mp_ldx(x, i) * s, e5m2);
}

/* Vectors [0, nvec) of x + h as one 16-byte load and one 8-byte store each (codes + h is
 * 8-byte aligned); the head [0, h) and tail [h + 8 nvec, n) element by element in block 0
 * (threads 0..7 and 32..39: different warps, so neither waits for the other). */
template <int E5M2>
__global__ void k_f8_quantize_vec(uint8_t *codes, const mp_bf16 *x, const float *scale,
                                  size_t n, size_t h, size_t nvec) {
  const float s = *scale;
  const uint4 *xv = (const uint4 *)(x + h);
  uint2 *cv = (uint2 *)(codes + h);
  for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < nvec;
       v += (size_t)gridDim.x * blockDim.x)
    cv[v] = f8_encode8<E5M2>(__ldg(xv + v), s);
  if (blockIdx.x == 0) {
    size_t i = threadIdx.x < 32 ? threadIdx.x : h + nvec * MP_VEC + (threadIdx.x - 32);
    bool mine = threadIdx.x < 32 ? i < h : (threadIdx.x < 64 && i < n);
    if (mine) codes[i] = f8_encode(mp_ldx(x, i) * s, E5M2);
  }
}

/* ---- quantize with transpose --------------------------------------------------------------- */

/* Word index in a shared tile of the transposed codes: tile row cc (a column of the input
 * tile) is 64 bytes = four 16-byte chunks, chunk q holding input rows 16q..16q+15; chunk q
 * sits at position q ^ ((cc / w) & 3), where w is the input columns one thread holds, so
 * the 4-byte stores of a warp (8 column groups at the same offset) spread over twice the
 * banks a plain layout uses (2-way instead of 8-way conflicts) while each chunk stays a
 * 16-byte vector for the read-out, which is conflict-free. */
__device__ __forceinline__ int tile_t_word(int cc, int rg, int w) {
  return cc * 16 + (((rg >> 2) ^ ((cc / w) & 3)) << 2) + (rg & 3);
}
__device__ __forceinline__ int tile_t_chunk(int cc, int q, int w) {
  return cc * 4 + (q ^ ((cc / w) & 3));
}

/* codes (R, C) (if non-NULL) and codes_t (C, R) of x (R, C), one 64 x 64 tile per block
 * iteration (column tile blockIdx.x, row tiles blockIdx.y + k gridDim.y). Needs x 16-byte
 * aligned and C % 8 == 0 (rows of whole vectors), codes_t 16-byte aligned and R % 16 == 0
 * (columns of whole chunks); codes is then 8-byte aligned if its base is. Thread (rg, cg)
 * owns rows 4 rg .. 4 rg + 3 and columns 8 cg .. 8 cg + 7 of the tile. */
template <int E5M2>
__global__ void __launch_bounds__(QT_THREADS)
    k_f8_quantize_t_vec(uint8_t *codes, uint8_t *codes_t, const mp_bf16 *x,
                        const float *scale, int R, int C) {
  __shared__ uint4 tile_t[QT_TILE * 4]; /* (64 columns, 64 rows) of codes */
  uint32_t *tw = (uint32_t *)tile_t;
  const float s = *scale;
  const int rg = threadIdx.x >> 3, cg = threadIdx.x & 7;
  const int c = blockIdx.x * QT_TILE + cg * 8;
  const int row_tiles = (R + QT_TILE - 1) / QT_TILE;
  for (int ty = blockIdx.y; ty < row_tiles; ty += gridDim.y) {
    const int r0 = ty * QT_TILE;
    uint4 u[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int r = r0 + rg * 4 + i;
      u[i] = (r < R && c < C) ? __ldg((const uint4 *)(x + (size_t)r * C + c))
                              : make_uint4(0, 0, 0, 0);
    }
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      uint2 w = f8_encode8<E5M2>(u[i], s);
      lo[i] = w.x;
      hi[i] = w.y;
      int r = r0 + rg * 4 + i;
      if (codes && r < R && c < C) *(uint2 *)(codes + (size_t)r * C + c) = w;
    }
    uint32_t t[8];
    mp_transpose4x4_u8(lo, t);
    mp_transpose4x4_u8(hi, t + 4);
#pragma unroll
    for (int k = 0; k < 8; k++) tw[tile_t_word(cg * 8 + k, rg, 8)] = t[k];
    __syncthreads();
#pragma unroll
    for (int it = 0; it < QT_TILE * 4 / QT_THREADS; it++) {
      int u_ = threadIdx.x + it * QT_THREADS, cc = u_ >> 2, q = u_ & 3;
      int col = blockIdx.x * QT_TILE + cc, row = r0 + q * 16;
      if (col < C && row < R)
        *(uint4 *)(codes_t + (size_t)col * R + row) = tile_t[tile_t_chunk(cc, q, 8)];
    }
    __syncthreads(); /* the next row tile overwrites tile_t */
  }
}

/* Any shape and alignment: element by element through a 64 x 64 shared tile (rows padded
 * to 68 bytes, so a warp reading a tile column touches 32 different banks). 256 threads:
 * 64 columns x 4 rows per step. */
template <int E5M2>
__global__ void k_f8_quantize_t_scalar(uint8_t *codes, uint8_t *codes_t, const mp_bf16 *x,
                                       const float *scale, int R, int C) {
  __shared__ uint8_t tile[QT_TILE][QT_TILE + 4];
  const float s = *scale;
  const int tx = threadIdx.x & (QT_TILE - 1), ty0 = threadIdx.x / QT_TILE;
  const int c0 = blockIdx.x * QT_TILE;
  const int row_tiles = (R + QT_TILE - 1) / QT_TILE;
  for (int ty = blockIdx.y; ty < row_tiles; ty += gridDim.y) {
    const int r0 = ty * QT_TILE;
    for (int j = ty0; j < QT_TILE; j += 4) {
      int r = r0 + j, c = c0 + tx;
      if (r < R && c < C) {
        uint8_t code = f8_encode(mp_ldx(x, (size_t)r * C + c) * s, E5M2);
        if (codes) codes[(size_t)r * C + c] = code;
        tile[j][tx] = code;
      }
    }
    __syncthreads();
    for (int j = ty0; j < QT_TILE; j += 4) {
      int cc = c0 + j, r = r0 + tx;
      if (cc < C && r < R) codes_t[(size_t)cc * R + r] = tile[tx][j];
    }
    __syncthreads();
  }
}

/* ---- dequantize, fake quantize ------------------------------------------------------------- */

__global__ void k_f8_dequantize(mp_bf16 *x, const uint8_t *codes, const float *scale,
                                size_t n, int e5m2) {
  float s = *scale;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(x, i, f8_decode(codes[i], e5m2) / s);
}

__global__ void k_f8_fake_quantize(mp_bf16 *out, const mp_bf16 *x, const float *scale,
                                   size_t n, int e5m2) {
  float s = *scale;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(out, i, f8_decode(f8_encode(mp_ldx(x, i) * s, e5m2), e5m2) / s);
}

/* ---- host entry points ------------------------------------------------------------------- */

mp_status mp_cuda_f8_amax(mp_kctx *kc, float *amax, const void *x, size_t n) {
  MP_KREQUIRE(kc, amax && (x || n == 0), "f8_amax");
  MP_KREQUIRE(kc, ((uintptr_t)x & 1u) == 0, "f8_amax");
  size_t h = head_to_align16(x, n), nvec = (n - h) / MP_VEC;
  size_t want = (nvec + MP_CUDA_BLOCK - 1) / MP_CUDA_BLOCK;
  size_t cap = (size_t)mp_cuda_impl_of(kc)->n_sms * AMAX_BLOCKS_PER_SM;
  if (cap == 0) cap = 1;
  int blocks = (int)(want < 1 ? 1 : (want > cap ? cap : want));
  void *scratch = NULL;
  MP_CHECK(mp_cuda_scratch(kc, sizeof(uint32_t) * (size_t)blocks, &scratch));
  k_amax_partials<<<blocks, MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (uint32_t *)scratch, (const mp_bf16 *)x, n, h, nvec);
  MP_CUDA_LAUNCH_CHECK(kc);
  k_amax_finish<<<1, MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(amax, (const uint32_t *)scratch,
                                                           blocks);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_f8_scale_from_amax(mp_kctx *kc, float *scale, const float *amax,
                                     mp_f8_format fmt) {
  k_scale_from_amax<<<1, 1, 0, MP_CUDA_STREAM(kc)>>>(
      scale, amax, fmt == MP_F8_E5M2 ? MP_F8_E5M2_MAX : MP_F8_E4M3_MAX);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* The vector kernel when x is 2-byte aligned and codes, after the same head, is 8-byte
 * aligned (x and codes start at the same offset within a 16 / 8-byte word); the scalar
 * grid-stride kernel otherwise. */
mp_status mp_cuda_f8_quantize(mp_kctx *kc, uint8_t *codes, const void *x,
                              const float *scale, size_t n, mp_f8_format fmt) {
  if (n == 0) return MP_OK;
  const int e5m2 = fmt == MP_F8_E5M2;
  size_t h = head_to_align16(x, n);
  if (((uintptr_t)x & 1u) == 0 && (((uintptr_t)codes + h) & 7u) == 0) {
    size_t nvec = (n - h) / MP_VEC;
    unsigned grid = mp_cuda_grid(nvec, MP_CUDA_BLOCK);
    if (e5m2)
      k_f8_quantize_vec<1><<<grid, MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
          codes, (const mp_bf16 *)x, scale, n, h, nvec);
    else
      k_f8_quantize_vec<0><<<grid, MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
          codes, (const mp_bf16 *)x, scale, n, h, nvec);
  } else {
    k_f8_quantize<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
        codes, (const mp_bf16 *)x, scale, n, e5m2);
  }
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* Without codes_t this is f8_quantize. With it: the tiled vector kernel when x is 16-byte
 * aligned with C % 8 == 0, codes (if any) 8-byte aligned and codes_t 16-byte aligned with
 * R % 16 == 0 (every matmul_f8 operand: its dimensions are multiples of 16); the scalar
 * tiled kernel otherwise. */
mp_status mp_cuda_f8_quantize_t(mp_kctx *kc, uint8_t *codes, uint8_t *codes_t, const void *x,
                                const float *scale, int R, int C, mp_f8_format fmt) {
  MP_KREQUIRE(kc, R >= 0 && C >= 0, "f8_quantize_t");
  MP_KREQUIRE(kc, codes || codes_t, "f8_quantize_t");
  if (R == 0 || C == 0) return MP_OK;
  MP_KREQUIRE(kc, x && scale, "f8_quantize_t");
  MP_KREQUIRE(kc, codes_t != codes, "f8_quantize_t");
  if (!codes_t) return mp_cuda_f8_quantize(kc, codes, x, scale, (size_t)R * C, fmt);
  const int e5m2 = fmt == MP_F8_E5M2;
  const int row_tiles = (R + QT_TILE - 1) / QT_TILE;
  dim3 grid((unsigned)((C + QT_TILE - 1) / QT_TILE),
            (unsigned)(row_tiles < 65535 ? row_tiles : 65535));
  cudaStream_t st = MP_CUDA_STREAM(kc);
  const mp_bf16 *xb = (const mp_bf16 *)x;
  bool vec = mp_aligned16(x) && C % 8 == 0 && ((uintptr_t)codes & 7u) == 0 &&
             mp_aligned16(codes_t) && R % 16 == 0;
  if (vec && e5m2)
    k_f8_quantize_t_vec<1><<<grid, QT_THREADS, 0, st>>>(codes, codes_t, xb, scale, R, C);
  else if (vec)
    k_f8_quantize_t_vec<0><<<grid, QT_THREADS, 0, st>>>(codes, codes_t, xb, scale, R, C);
  else if (e5m2)
    k_f8_quantize_t_scalar<1><<<grid, 256, 0, st>>>(codes, codes_t, xb, scale, R, C);
  else
    k_f8_quantize_t_scalar<0><<<grid, 256, 0, st>>>(codes, codes_t, xb, scale, R, C);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_f8_dequantize(mp_kctx *kc, void *x, const uint8_t *codes,
                                const float *scale, size_t n, mp_f8_format fmt) {
  if (n == 0) return MP_OK;
  k_f8_dequantize<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)x, codes, scale, n, fmt == MP_F8_E5M2);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_f8_fake_quantize(mp_kctx *kc, void *out, const void *x,
                                   const float *scale, size_t n, mp_f8_format fmt) {
  if (n == 0) return MP_OK;
  k_f8_fake_quantize<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                       MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)x, scale, n,
                                             fmt == MP_F8_E5M2);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}
