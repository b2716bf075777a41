/* Fused AdamW, the gradient sum of squares and the in-place scale on CUDA (kernels/ops.h;
 * reference kernels/cpu/adamw.c and gradnorm.c).
 *
 * AdamW: the step-dependent scalars (bias corrections, decay factor) are computed on the
 * host in double exactly as the CPU reference does, then one elementwise kernel applies
 * the same fp32 operation sequence (nvcc may contract a*b+c into an FMA, so results
 * differ from the CPU by fp32 rounding only).
 *
 * sum_squares: two passes, deterministic for a given n on any device: pass 1 uses a grid
 * whose size depends only on n (at most SUMSQ_BLOCKS blocks), each thread accumulates
 * x^2 in double over a grid-stride slice and the block combines its threads in a fixed
 * shuffle tree into one double partial (scratch); pass 2 adds the partials in block
 * order on one thread and accumulates (float) into *sumsq. */
#include <math.h>

#include "kernels/cuda/cuda_kernels.cuh"

enum { SUMSQ_BLOCKS = 512 };

__global__ void k_adamw(float *param, const float *grad, float *m, float *v, size_t n,
                        float beta1, float beta2, float eps, float step_size, float bc2_sqrt,
                        float decay, float grad_scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float g = grad[i] * grad_scale;
    float p = param[i] * decay;
    float mi = m[i] * beta1 + g * (1.0f - beta1);
    float vi = v[i] * beta2 + g * g * (1.0f - beta2);
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    param[i] = p - step_size * (mi / denom);
  }
}

__global__ void k_sumsq_partials(double *part, const float *x, size_t n) {
  __shared__ double sh[32];
  double s = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    s += (double)x[i] * x[i];
  s = mp_block_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sumsq_finish(float *sumsq, const double *part, int nparts) {
  double total = 0.0;
  for (int b = 0; b < nparts; b++) total += part[b];
  *sumsq += (float)total;
}

__global__ void k_scale(float *x, size_t n, float s) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] *= s;
}

mp_status mp_cuda_adamw_update(mp_kctx *kc, float *param, const float *grad, float *m,
                               float *v, size_t n, float lr, float beta1, float beta2,
                               float eps, float weight_decay, int step, float grad_scale) {
  MP_KREQUIRE(kc, step >= 1, "adamw_update");
  if (n == 0) return MP_OK;
  double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
  float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  float decay = (float)(1.0 - (double)lr * weight_decay);
  k_adamw<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      param, grad, m, v, n, beta1, beta2, eps, step_size, bc2_sqrt, decay, grad_scale);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_sum_squares(mp_kctx *kc, float *sumsq, const float *x, size_t n) {
  size_t g = (n + MP_CUDA_BLOCK - 1) / MP_CUDA_BLOCK;
  int blocks = g > SUMSQ_BLOCKS ? SUMSQ_BLOCKS : (g ? (int)g : 1);
  void *scratch = NULL;
  MP_CHECK(mp_cuda_scratch(kc, sizeof(double) * (size_t)blocks, &scratch));
  k_sumsq_partials<<<blocks, MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>((double *)scratch, x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  k_sumsq_finish<<<1, 1, 0, MP_CUDA_STREAM(kc)>>>(sumsq, (const double *)scratch, blocks);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_scale_f32(mp_kctx *kc, float *x, size_t n, float s) {
  if (n == 0) return MP_OK;
  k_scale<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(x, n, s);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}
