/* Float8 cast kernels on CUDA: amax, scale from amax, quantize, dequantize and fake
 * quantize, tensorwise scaling (kernels/ops.h; reference kernels/cpu/fp8.c).
 *
 * Scales and amax stay on the device: every kernel reads *scale itself, so the float8
 * path never synchronises with the host. Encoding uses cuda_fp8.h's
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE (round to nearest even; the hardware cvt on
 * sm_89+, NVIDIA's software path below), after two guards that pin the cases where the
 * CPU's mp_f8_encode is the contract: NaN maps to the format's canonical NaN code (0x7F
 * E4M3, 0x7E E5M2, sign dropped) whatever the cvt would give, and values (infinities
 * included) are clamped to +-max first, which cannot change a finite in-range result and
 * makes saturation explicit. Decoding is bit arithmetic on the code, the same formula as
 * mp_f8_decode, and exact in fp32.
 *
 * amax is a two-pass reduction like sum_squares: max is exact in any order, and NaN
 * anywhere gives NaN, as on the CPU. */
#include <cuda_fp8.h>
#include <math.h>

#include "kernels/cuda/cuda_kernels.cuh"

enum { AMAX_BLOCKS = 512 };

__device__ __forceinline__ uint8_t f8_encode(float v, int e5m2) {
  if (isnan(v)) return e5m2 ? 0x7E : 0x7F;
  float mx = e5m2 ? MP_F8_E5M2_MAX : MP_F8_E4M3_MAX;
  v = fminf(fmaxf(v, -mx), mx);
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
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

__global__ void k_amax_partials(float *part, const mp_bf16 *x, size_t n) {
  __shared__ float shm[32];
  __shared__ int shn[32];
  float m = 0.0f;
  int nan = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float a = fabsf(mp_ldx(x, i));
    nan |= isnan(a) ? 1 : 0;
    m = fmaxf(m, a); /* fmaxf ignores the NaN; the flag carries it */
  }
  m = mp_block_max(m, shm);
  nan = mp_block_sum(nan, shn);
  if (threadIdx.x == 0) part[blockIdx.x] = nan ? NAN : m;
}

__global__ void k_amax_finish(float *amax, const float *part, int nparts) {
  float m = 0.0f;
  int nan = 0;
  for (int b = 0; b < nparts; b++) {
    nan |= isnan(part[b]) ? 1 : 0;
    m = fmaxf(m, part[b]);
  }
  *amax = nan ? NAN : m;
}

__global__ void k_scale_from_amax(float *scale, const float *amax, float fmax) {
  float a = *amax > 1e-12f ? *amax : 1e-12f; /* torchao's EPS clamp; NaN -> 1e-12 too */
  *scale = fmax / a;
}

__global__ void k_f8_quantize(uint8_t *codes, const mp_bf16 *x, const float *scale, size_t n,
                              int e5m2) {
  float s = *scale;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    codes[i] = f8_encode(mp_ldx(x, i) * s, e5m2);
}

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

mp_status mp_cuda_f8_amax(mp_kctx *kc, float *amax, const void *x, size_t n) {
  size_t g = (n + MP_CUDA_BLOCK - 1) / MP_CUDA_BLOCK;
  int blocks = g > AMAX_BLOCKS ? AMAX_BLOCKS : (g ? (int)g : 1);
  void *scratch = NULL;
  MP_CHECK(mp_cuda_scratch(kc, sizeof(float) * (size_t)blocks, &scratch));
  k_amax_partials<<<blocks, MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (float *)scratch, (const mp_bf16 *)x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  k_amax_finish<<<1, 1, 0, MP_CUDA_STREAM(kc)>>>(amax, (const float *)scratch, blocks);
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

mp_status mp_cuda_f8_quantize(mp_kctx *kc, uint8_t *codes, const void *x,
                              const float *scale, size_t n, mp_f8_format fmt) {
  if (n == 0) return MP_OK;
  k_f8_quantize<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      codes, (const mp_bf16 *)x, scale, n, fmt == MP_F8_E5M2);
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
