/* Elementwise CUDA kernels: X<->fp32 conversion, embedding lookup and its scatter-add,
 * GELU (tanh), SwiGLU, residual add and the accumulations (kernels/ops.h contracts).
 *
 * Every kernel is a grid-stride loop over elements, loads bf16 into fp32, computes in
 * fp32 with the same formula as the CPU reference (kernels/cpu/gelu.c, swiglu.c), and
 * rounds once on store; a += on an X tensor reads the old bf16 value, adds in fp32 and
 * rounds once. The embedding backward adds into fp32 dwte with atomicAdd (repeated tokens
 * add in an unspecified order: fp32 rounding differences only, not determinism of the
 * set of contributions). */
#include <math.h>

#include "kernels/cuda/cuda_kernels.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

__global__ void k_x_from_f32(mp_bf16 *dst, const float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(dst, i, src[i]);
}

__global__ void k_x_to_f32(float *dst, const mp_bf16 *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = mp_ldx(src, i);
}

mp_status mp_cuda_x_from_f32(mp_kctx *kc, void *dst_x, const float *src, size_t n) {
  if (n == 0) return MP_OK;
  k_x_from_f32<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)dst_x, src, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_x_to_f32(mp_kctx *kc, float *dst, const void *src_x, size_t n) {
  if (n == 0) return MP_OK;
  k_x_to_f32<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      dst, (const mp_bf16 *)src_x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* ---- embedding -------------------------------------------------------------------- */

__global__ void k_embedding_forward(mp_bf16 *out, const int32_t *tokens, const mp_bf16 *wte,
                                    int N, int C, int vs, int ve) {
  size_t total = (size_t)N * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t n = i / C, c = i % C;
    int t = tokens[n];
    out[i] = (t >= vs && t < ve) ? wte[(size_t)(t - vs) * C + c] : __float2bfloat16_rn(0.0f);
  }
}

__global__ void k_embedding_backward(float *dwte, const mp_bf16 *dout, const int32_t *tokens,
                                     int N, int C, int vs, int ve) {
  size_t total = (size_t)N * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t n = i / C, c = i % C;
    int t = tokens[n];
    if (t >= vs && t < ve) atomicAdd(dwte + (size_t)(t - vs) * C + c, mp_ldx(dout, i));
  }
}

mp_status mp_cuda_embedding_forward(mp_kctx *kc, void *out, const int32_t *tokens,
                                    const void *wte, int N, int C, int vs, int ve) {
  MP_CUDA_REQUIRE(kc, N >= 0 && C >= 0 && 0 <= vs && vs <= ve, "embedding_forward");
  size_t n = (size_t)N * C;
  if (n == 0) return MP_OK;
  k_embedding_forward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                        MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, tokens, (const mp_bf16 *)wte,
                                              N, C, vs, ve);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_embedding_backward(mp_kctx *kc, float *dwte, const void *dout,
                                     const int32_t *tokens, int N, int C, int vs, int ve) {
  MP_CUDA_REQUIRE(kc, N >= 0 && C >= 0 && 0 <= vs && vs <= ve, "embedding_backward");
  size_t n = (size_t)N * C;
  if (n == 0) return MP_OK;
  k_embedding_backward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                         MP_CUDA_STREAM(kc)>>>(dwte, (const mp_bf16 *)dout, tokens, N, C,
                                               vs, ve);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* ---- GELU, SwiGLU --------------------------------------------------------------------- */

__global__ void k_gelu_forward(mp_bf16 *out, const mp_bf16 *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = mp_ldx(x, i);
    mp_stx(out, i, 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v))));
  }
}

__global__ void k_gelu_backward(mp_bf16 *dx, const mp_bf16 *dout, const mp_bf16 *x,
                                size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = mp_ldx(x, i);
    float th = tanhf(GELU_K * (v + GELU_A * v * v * v));
    float d = 0.5f * (1.0f + th) +
              0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * v * v);
    mp_stx(dx, i, mp_ldx(dx, i) + d * mp_ldx(dout, i));
  }
}

__global__ void k_swiglu_forward(mp_bf16 *out, const mp_bf16 *gate, const mp_bf16 *up,
                                 size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float g = mp_ldx(gate, i);
    float sg = 1.0f / (1.0f + expf(-g));
    mp_stx(out, i, g * sg * mp_ldx(up, i));
  }
}

__global__ void k_swiglu_backward(mp_bf16 *dgate, mp_bf16 *dup, const mp_bf16 *dout,
                                  const mp_bf16 *gate, const mp_bf16 *up, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float g = mp_ldx(gate, i), u = mp_ldx(up, i), d = mp_ldx(dout, i);
    float sg = 1.0f / (1.0f + expf(-g));
    if (dgate) mp_stx(dgate, i, mp_ldx(dgate, i) + d * u * sg * (1.0f + g * (1.0f - sg)));
    if (dup) mp_stx(dup, i, mp_ldx(dup, i) + d * g * sg);
  }
}

mp_status mp_cuda_gelu_forward(mp_kctx *kc, void *out, const void *x, size_t n) {
  if (n == 0) return MP_OK;
  k_gelu_forward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)out, (const mp_bf16 *)x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_gelu_backward(mp_kctx *kc, void *dx, const void *dout, const void *x,
                                size_t n) {
  if (n == 0) return MP_OK;
  k_gelu_backward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)dx, (const mp_bf16 *)dout, (const mp_bf16 *)x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_swiglu_forward(mp_kctx *kc, void *out, const void *gate, const void *up,
                                 size_t n) {
  if (n == 0) return MP_OK;
  k_swiglu_forward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                     MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)gate,
                                           (const mp_bf16 *)up, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_swiglu_backward(mp_kctx *kc, void *dgate, void *dup, const void *dout,
                                  const void *gate, const void *up, size_t n) {
  if (n == 0 || (!dgate && !dup)) return MP_OK;
  k_swiglu_backward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                      MP_CUDA_STREAM(kc)>>>((mp_bf16 *)dgate, (mp_bf16 *)dup,
                                            (const mp_bf16 *)dout, (const mp_bf16 *)gate,
                                            (const mp_bf16 *)up, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* ---- residual and accumulation ----------------------------------------------------- */

__global__ void k_residual_forward(mp_bf16 *out, const mp_bf16 *a, const mp_bf16 *b,
                                   size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(out, i, mp_ldx(a, i) + mp_ldx(b, i));
}

__global__ void k_accumulate(mp_bf16 *y, const mp_bf16 *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(y, i, mp_ldx(y, i) + mp_ldx(x, i));
}

__global__ void k_accumulate_f32(float *y, const float *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] += x[i];
}

mp_status mp_cuda_residual_forward(mp_kctx *kc, void *out, const void *a, const void *b,
                                   size_t n) {
  if (n == 0) return MP_OK;
  k_residual_forward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                       MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)a,
                                             (const mp_bf16 *)b, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_accumulate(mp_kctx *kc, void *y, const void *x, size_t n) {
  if (n == 0) return MP_OK;
  k_accumulate<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)y, (const mp_bf16 *)x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_accumulate_f32(mp_kctx *kc, float *y, const float *x, size_t n) {
  if (n == 0) return MP_OK;
  k_accumulate_f32<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                     MP_CUDA_STREAM(kc)>>>(y, x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}
