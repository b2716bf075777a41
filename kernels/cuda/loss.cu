/* Cross-entropy on CUDA: the fused whole-vocabulary forward, the vocab-parallel pieces and
 * the backward (kernels/ops.h; reference kernels/cpu/crossentropy.c).
 *
 * Row reductions (max, sum of exponentials) are one block per row: each thread reduces
 * its share of the row in fp32, then a fixed shuffle/shared-memory tree combines the
 * block, so a row gives the same bits on every run. The mean over valid rows is a
 * single-block reduction in double, in a fixed order. A target >= V cannot be reported
 * without a host synchronisation, so the fused forward writes NaN as that row's loss (the
 * CPU backend returns MP_ERR_INVALID instead); a NaN loss_mean is the caller's signal.
 *
 * Bandwidth. The logits (N x V bf16, 0.5 GB at 8192 x 32000) dominate the traffic, so:
 * - rows are read as 16-byte vectors (8 bf16), four per thread in flight, whatever the row
 *   alignment: the elements before the row's first 16-byte boundary and after its last
 *   whole vector are done one by one (row_visit);
 * - the fused forward reads each row once, keeping a running (max m, sum s of
 *   exp(x - m)) per thread and rescaling s when the max grows (the online softmax of
 *   Milakov & Gimelshein, 2018), instead of one pass for the max and one for the sum;
 *   exp(x - m) is exp2f(x log2e - m log2e), one FMA and one MUFU.EX2 per element;
 * - the backward is one block per row too (no 64-bit division per element), skips
 *   ignored rows without reading them, and streams logits and dlogits as vectors when
 *   both have the same alignment within 16 bytes (else the original elementwise kernel). */
#include <math.h>

#include "kernels/cuda/cuda_kernels.cuh"

enum { CE_BLOCK = 256, MEAN_BLOCK = 1024, CE_UNROLL = 4 };

#define CE_LOG2E 1.4426950408889634f

/* Elements of the row p[0..L) before its first 16-byte boundary (p is 2-byte aligned). */
__device__ __forceinline__ int row_head(const mp_bf16 *p, int L) {
  int h = (int)(((16u - ((unsigned)(uintptr_t)p & 15u)) & 15u) >> 1);
  return h < L ? h : L;
}

/* Calls acc.one(x) or acc.vec(f) (8 consecutive values) on this thread's share of the row
 * p[0..L): scalar head and tail elements, whole 16-byte vectors between, CE_UNROLL vector
 * loads issued before any is used. Which thread sees which element depends only on L, p
 * and blockDim, so the per-thread results are the same on every run. */
template <class Acc>
__device__ __forceinline__ void row_visit(const mp_bf16 *p, int L, Acc &acc) {
  const int t = threadIdx.x, T = blockDim.x;
  const int head = row_head(p, L);
  const int nvec = (L - head) / MP_VEC;
  if (t < head) acc.one(__bfloat162float(p[t]));
  const uint4 *body = (const uint4 *)(p + head);
  for (int v0 = t; v0 < nvec; v0 += CE_UNROLL * T) {
    uint4 u[CE_UNROLL];
#pragma unroll
    for (int q = 0; q < CE_UNROLL; q++)
      if (v0 + q * T < nvec) u[q] = __ldg(body + v0 + q * T);
#pragma unroll
    for (int q = 0; q < CE_UNROLL; q++)
      if (v0 + q * T < nvec) {
        float f[8];
        mp_unpack8(u[q], f);
        acc.vec(f);
      }
  }
  for (int i = head + nvec * MP_VEC + t; i < L; i += T) acc.one(__bfloat162float(p[i]));
}

struct max_acc {
  float m = -INFINITY;
  __device__ void one(float x) { m = fmaxf(m, x); }
  __device__ void vec(const float f[8]) {
#pragma unroll
    for (int k = 0; k < 8; k++) m = fmaxf(m, f[k]);
  }
};

/* sum exp(x - g) for a given g, in expf as the CPU reference. */
struct sumexp_acc {
  float g, s = 0.0f;
  __device__ explicit sumexp_acc(float g_) : g(g_) {}
  __device__ void one(float x) { s += expf(x - g); }
  __device__ void vec(const float f[8]) {
#pragma unroll
    for (int k = 0; k < 8; k++) s += expf(f[k] - g);
  }
};

/* Online softmax statistics: m = max so far, s = sum of exp(x - m) so far. A vector raises
 * m once (one rescale of s), then adds its 8 terms. While m is -inf every value seen is
 * -inf or NaN: -inf adds nothing (exp2f(-inf - -inf) would be NaN), NaN makes s NaN, as
 * it makes the reference's sum NaN. m is never NaN (fmaxf and > ignore NaN). */
struct online_acc {
  float m = -INFINITY, s = 0.0f;
  __device__ void raise(float mx) {
    if (mx > m) {
      s *= exp2f((m - mx) * CE_LOG2E);
      m = mx;
    }
  }
  __device__ void one(float x) {
    raise(x);
    if (m != -INFINITY || x != x) s += exp2f(fmaf(x, CE_LOG2E, -m * CE_LOG2E));
  }
  __device__ void vec(const float f[8]) {
    float mx = f[0];
#pragma unroll
    for (int k = 1; k < 8; k++) mx = fmaxf(mx, f[k]);
    raise(mx);
    if (m == -INFINITY) {
#pragma unroll
      for (int k = 0; k < 8; k++)
        if (f[k] != f[k]) s = NAN;
      return;
    }
    const float ml = m * CE_LOG2E;
#pragma unroll
    for (int k = 0; k < 8; k++) s += exp2f(fmaf(f[k], CE_LOG2E, -ml));
  }
};

/* (m, s) <- the statistics of the union of two parts. A part whose max is the union's
 * keeps its sum as it is (no inf - inf); the other is scaled by exp(its max - M), which is
 * 0 for an empty (-inf) part. */
__device__ __forceinline__ void online_merge(float &m, float &s, float mo, float so) {
  const float M = fmaxf(m, mo);
  s = s * (m == M ? 1.0f : exp2f((m - M) * CE_LOG2E)) +
      so * (mo == M ? 1.0f : exp2f((mo - M) * CE_LOG2E));
  m = M;
}

/* Merges (m, s) over the block in a fixed tree; every thread gets the result. */
__device__ __forceinline__ void online_block(float &m, float &s, float2 *sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1)
    online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if (lane == 0) sh[warp] = make_float2(m, s);
  __syncthreads();
  float2 r = lane < nw ? sh[lane] : make_float2(-INFINITY, 0.0f);
  m = r.x;
  s = r.y;
  for (int o = 16; o > 0; o >>= 1)
    online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  __syncthreads();
}

__global__ void k_ce_max(float *lmax, const mp_bf16 *logits, int Vl) {
  __shared__ float sh[32];
  max_acc acc;
  row_visit(logits + (size_t)blockIdx.x * Vl, Vl, acc);
  const float m = mp_block_max(acc.m, sh);
  if (threadIdx.x == 0) lmax[blockIdx.x] = m;
}

__global__ void k_ce_sumexp(float *lsum, const mp_bf16 *logits, const float *gmax, int Vl) {
  __shared__ float sh[32];
  sumexp_acc acc(gmax[blockIdx.x]);
  row_visit(logits + (size_t)blockIdx.x * Vl, Vl, acc);
  const float s = mp_block_sum(acc.s, sh);
  if (threadIdx.x == 0) lsum[blockIdx.x] = s;
}

/* Whole vocabulary, one block per row, one pass: lse and the row's loss. */
__global__ void k_ce_fused(float *losses, float *lse, const mp_bf16 *logits,
                           const int32_t *targets, int V) {
  __shared__ float2 sh[32];
  const int n = blockIdx.x;
  const mp_bf16 *l = logits + (size_t)n * V;
  /* The target's logit is loaded before the row pass, so its latency overlaps the pass. */
  const int t = threadIdx.x == 0 ? targets[n] : -1;
  const float lt = t >= 0 && t < V ? mp_ldx(l, t) : 0.0f;
  online_acc acc;
  row_visit(l, V, acc);
  float m = acc.m, s = acc.s;
  online_block(m, s, sh);
  if (threadIdx.x == 0) {
    const float z = m + logf(s);
    lse[n] = z;
    losses[n] = t < 0 ? 0.0f : (t < V ? z - lt : NAN);
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

/* The scalar backward for any layout (one thread per element). */
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

/* One block per row; logits and dlogits have the same alignment within 16 bytes, so the
 * row's head, vectors and tail line up in both. Same per-element formula as above. */
__global__ void k_ce_backward_rows(mp_bf16 *dlogits, const mp_bf16 *logits, const float *lse,
                                   const int32_t *targets, float dloss, int Vl,
                                   int vocab_start) {
  const int n = blockIdx.x, tg = targets[n];
  if (tg < 0) return; /* ignored row: no gradient, nothing read */
  const size_t base = (size_t)n * Vl;
  const mp_bf16 *l = logits + base;
  mp_bf16 *d = dlogits + base;
  const float z = lse[n];
  const int tl = tg - vocab_start; /* the target's column here, possibly outside [0, Vl) */
  const int t = threadIdx.x, T = blockDim.x;
  const int head = row_head(l, Vl), nvec = (Vl - head) / MP_VEC;
  for (int i = t; i < head; i += T)
    mp_stx(d, i, mp_ldx(d, i) + dloss * (expf(mp_ldx(l, i) - z) - (i == tl ? 1.0f : 0.0f)));
  for (int v = t; v < nvec; v += T) {
    const int c0 = head + v * MP_VEC;
    float fl[8], fd[8];
    mp_ld8(l + c0, fl);
    mp_ld8_rw(d + c0, fd);
#pragma unroll
    for (int k = 0; k < 8; k++)
      fd[k] = fd[k] + dloss * (expf(fl[k] - z) - (c0 + k == tl ? 1.0f : 0.0f));
    mp_st8(d + c0, fd);
  }
  for (int i = head + nvec * MP_VEC + t; i < Vl; i += T)
    mp_stx(d, i, mp_ldx(d, i) + dloss * (expf(mp_ldx(l, i) - z) - (i == tl ? 1.0f : 0.0f)));
}

mp_status mp_cuda_cross_entropy_forward(mp_kctx *kc, float *losses, float *loss_mean,
                                        float *lse, const void *logits,
                                        const int32_t *targets, int N, int V) {
  MP_KREQUIRE(kc, N >= 0 && V > 0, "cross_entropy_forward");
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
  MP_KREQUIRE(kc, N >= 0 && Vl >= 0, "ce_local_max");
  if (N == 0) return MP_OK;
  k_ce_max<<<N, CE_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(lmax, (const mp_bf16 *)logits, Vl);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_ce_local_sumexp(mp_kctx *kc, float *lsum, const void *logits,
                                  const float *gmax, int N, int Vl) {
  MP_KREQUIRE(kc, N >= 0 && Vl >= 0, "ce_local_sumexp");
  if (N == 0) return MP_OK;
  k_ce_sumexp<<<N, CE_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(lsum, (const mp_bf16 *)logits, gmax,
                                                       Vl);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_ce_local_target(mp_kctx *kc, float *ltgt, const void *logits,
                                  const int32_t *targets, int N, int Vl, int vocab_start) {
  MP_KREQUIRE(kc, N >= 0 && Vl >= 0 && vocab_start >= 0, "ce_local_target");
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
  MP_KREQUIRE(kc, N >= 0, "ce_vp_combine");
  k_ce_combine<<<1, MEAN_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(losses, loss_mean, lse, gmax, gsum,
                                                         gtgt, targets, N);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_ce_backward(mp_kctx *kc, void *dlogits, const void *logits,
                              const float *lse, const int32_t *targets, float dloss, int N,
                              int Vl, int vocab_start) {
  MP_KREQUIRE(kc, N >= 0 && Vl >= 0 && vocab_start >= 0, "ce_backward");
  size_t n = (size_t)N * Vl;
  if (n == 0) return MP_OK;
  if (((uintptr_t)dlogits & 15u) == ((uintptr_t)logits & 15u)) {
    k_ce_backward_rows<<<N, CE_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)dlogits, (const mp_bf16 *)logits, lse, targets, dloss, Vl, vocab_start);
    MP_CUDA_LAUNCH_CHECK(kc);
    return MP_OK;
  }
  k_ce_backward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)dlogits, (const mp_bf16 *)logits, lse, targets, dloss, Vl, vocab_start, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}
