/* Cross-entropy on CUDA: the fused whole-vocabulary forward, the vocab-parallel pieces and
 * the backward (kernels/ops.h; reference kernels/cpu/crossentropy.c).
 *
 * Row reductions (max, sum of exponentials) are one block per row, fp32 per thread and a
 * shuffle tree across the block, so a 50k-128k vocabulary row is read by 256 threads in
 * parallel. The mean over valid rows is a single-block reduction in double, in a fixed
 * order (deterministic). A target >= V cannot be reported without a host
 * synchronisation, so the fused forward writes NaN as that row's loss (the CPU backend
 * returns MP_ERR_INVALID instead); a NaN loss_mean is the caller's signal. */
#include <math.h>

#include "kernels/cuda/cuda_kernels.cuh"

enum { CE_BLOCK = 256, MEAN_BLOCK = 1024 };

__global__ void k_ce_max(float *lmax, const mp_bf16 *logits, int Vl) {
  __shared__ float sh[32];
  const mp_bf16 *l = logits + (size_t)blockIdx.x * Vl;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) m = fmaxf(m, mp_ldx(l, v));
  m = mp_block_max(m, sh);
  if (threadIdx.x == 0) lmax[blockIdx.x] = m;
}

__global__ void k_ce_sumexp(float *lsum, const mp_bf16 *logits, const float *gmax, int Vl) {
  __shared__ float sh[32];
  const mp_bf16 *l = logits + (size_t)blockIdx.x * Vl;
  float g = gmax[blockIdx.x], s = 0.0f;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) s += expf(mp_ldx(l, v) - g);
  s = mp_block_sum(s, sh);
  if (threadIdx.x == 0) lsum[blockIdx.x] = s;
}

/* Whole vocabulary, one block per row: lse and the row's loss in one pass pair. */
__global__ void k_ce_fused(float *losses, float *lse, const mp_bf16 *logits,
                           const int32_t *targets, int V) {
  __shared__ float sh[32];
  int n = blockIdx.x;
  const mp_bf16 *l = logits + (size_t)n * V;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, mp_ldx(l, v));
  m = mp_block_max(m, sh);
  float s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(mp_ldx(l, v) - m);
  s = mp_block_sum(s, sh);
  if (threadIdx.x == 0) {
    float z = m + logf(s);
    int t = targets[n];
    lse[n] = z;
    losses[n] = t < 0 ? 0.0f : (t < V ? z - mp_ldx(l, t) : NAN);
  }
}

/* loss_mean = mean of losses over rows with target >= 0 (0 when none). One block. */
__global__ void k_ce_mean(float *loss_mean, const float *losses, const int32_t *targets,
                          int N) {
  __shared__ double sh[32];
  double total = 0.0, valid = 0.0;
  for (int n = threadIdx.x; n < N; n += blockDim.x)
    if (targets[n] >= 0) {
      total += losses[n];
      valid += 1.0;
    }
  total = mp_block_sum(total, sh);
  valid = mp_block_sum(valid, sh);
  if (threadIdx.x == 0) *loss_mean = valid > 0.0 ? (float)(total / valid) : 0.0f;
}

__global__ void k_ce_target(float *ltgt, const mp_bf16 *logits, const int32_t *targets,
                            int N, int Vl, int vocab_start) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    int t = targets[n] - vocab_start;
    ltgt[n] = targets[n] >= 0 && t >= 0 && t < Vl ? mp_ldx(logits, (size_t)n * Vl + t) : 0.0f;
  }
}

/* One block: per-row lse and loss, then the mean over valid rows. */
__global__ void k_ce_combine(float *losses, float *loss_mean, float *lse, const float *gmax,
                             const float *gsum, const float *gtgt, const int32_t *targets,
                             int N) {
  __shared__ double sh[32];
  double total = 0.0, valid = 0.0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    float z = gmax[n] + logf(gsum[n]);
    float loss = targets[n] >= 0 ? z - gtgt[n] : 0.0f;
    lse[n] = z;
    losses[n] = loss;
    if (targets[n] >= 0) {
      total += loss;
      valid += 1.0;
    }
  }
  total = mp_block_sum(total, sh);
  valid = mp_block_sum(valid, sh);
  if (threadIdx.x == 0 && loss_mean) *loss_mean = valid > 0.0 ? (float)(total / valid) : 0.0f;
}

__global__ void k_ce_backward(mp_bf16 *dlogits, const mp_bf16 *logits, const float *lse,
                              const int32_t *targets, float dloss, int Vl, int vocab_start,
                              size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t row = i / Vl;
    int v = (int)(i % Vl);
    int tg = targets[row];
    if (tg < 0) continue;
    float p = expf(mp_ldx(logits, i) - lse[row]);
    float onehot = v == tg - vocab_start ? 1.0f : 0.0f;
    mp_stx(dlogits, i, mp_ldx(dlogits, i) + dloss * (p - onehot));
  }
}

mp_status mp_cuda_cross_entropy_forward(mp_kctx *kc, float *losses, float *loss_mean,
                                        float *lse, const void *logits,
                                        const int32_t *targets, int N, int V) {
  MP_CUDA_REQUIRE(kc, N >= 0 && V > 0, "cross_entropy_forward");
  if (N > 0) {
    k_ce_fused<<<N, CE_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(losses, lse, (const mp_bf16 *)logits,
                                                       targets, V);
    MP_CUDA_LAUNCH_CHECK(kc);
  }
  if (loss_mean) {
    k_ce_mean<<<1, MEAN_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(loss_mean, losses, targets, N);
    MP_CUDA_LAUNCH_CHECK(kc);
  }
  return MP_OK;
}

mp_status mp_cuda_ce_local_max(mp_kctx *kc, float *lmax, const void *logits, int N, int Vl) {
  MP_CUDA_REQUIRE(kc, N >= 0 && Vl >= 0, "ce_local_max");
  if (N == 0) return MP_OK;
  k_ce_max<<<N, CE_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(lmax, (const mp_bf16 *)logits, Vl);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_ce_local_sumexp(mp_kctx *kc, float *lsum, const void *logits,
                                  const float *gmax, int N, int Vl) {
  MP_CUDA_REQUIRE(kc, N >= 0 && Vl >= 0, "ce_local_sumexp");
  if (N == 0) return MP_OK;
  k_ce_sumexp<<<N, CE_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(lsum, (const mp_bf16 *)logits, gmax,
                                                       Vl);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_ce_local_target(mp_kctx *kc, float *ltgt, const void *logits,
                                  const int32_t *targets, int N, int Vl, int vocab_start) {
  MP_CUDA_REQUIRE(kc, N >= 0 && Vl >= 0 && vocab_start >= 0, "ce_local_target");
  if (N == 0) return MP_OK;
  k_ce_target<<<mp_cuda_grid((size_t)N, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                MP_CUDA_STREAM(kc)>>>(ltgt, (const mp_bf16 *)logits, targets, N, Vl,
                                      vocab_start);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_ce_vp_combine(mp_kctx *kc, float *losses, float *loss_mean, float *lse,
                                const float *gmax, const float *gsum, const float *gtgt,
                                const int32_t *targets, int N) {
  MP_CUDA_REQUIRE(kc, N >= 0, "ce_vp_combine");
  k_ce_combine<<<1, MEAN_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(losses, loss_mean, lse, gmax, gsum,
                                                         gtgt, targets, N);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_ce_backward(mp_kctx *kc, void *dlogits, const void *logits,
                              const float *lse, const int32_t *targets, float dloss, int N,
                              int Vl, int vocab_start) {
  MP_CUDA_REQUIRE(kc, N >= 0 && Vl >= 0 && vocab_start >= 0, "ce_backward");
  size_t n = (size_t)N * Vl;
  if (n == 0) return MP_OK;
  k_ce_backward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)dlogits, (const mp_bf16 *)logits, lse, targets, dloss, Vl, vocab_start, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}
