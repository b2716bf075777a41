/* MoE on CUDA: router softmax + top-k and its backward, the load-balancing loss, the
 * stable expert grouping (moe_plan) and token permute/unpermute (kernels/ops.h; reference
 * kernels/cpu/router.c and permute.c).
 *
 * Router: one warp per token. Top-k takes k rounds of a warp argmax under the total order
 * "higher probability first, then lower expert index"; round j only considers experts
 * strictly after round j-1's winner in that order, which selects exactly what the CPU's
 * k rounds of argmax-with-exclusion select (ties: lower index first), with no per-row
 * "taken" storage. Each lane re-reads only the probabilities it wrote itself.
 *
 * moe_plan: one block per expert e. The block counts pairs with expert < e (its first
 * row) and == e (its count), then walks the N*k pairs in order in chunks of blockDim and
 * places its pairs by a ballot prefix sum, so within an expert rows keep pair order
 * (stable, like the CPU counting sort) and no atomics are needed. Work is O(E * N * k)
 * reads of int32, spread over E blocks: fine for router sizes (E <= a few hundred).
 * Pairs whose expert index lies outside [0, E) are not placed and get inv = -1; the CPU
 * backend reports them as an error, which would need a host synchronisation here, so a
 * caller that copies counts to the host can check sum(counts) == N*k instead.
 *
 * Permute/unpermute: the gathers are elementwise; unpermute_backward is one warp per
 * (token, slot) pair, which owns row inv[pair] of dy (inv is a permutation) and the dot
 * product for dtopk_w, so nothing is written by two threads. */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda_kernels.cuh"

enum { WARPS = 8 }; /* warps (rows or pairs) per block in warp-per-row kernels */

__global__ void k_router_forward(float *probs, int32_t *topk_idx, float *topk_w,
                                 const mp_bf16 *logits, int N, int E, int k, int norm) {
  int row = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const mp_bf16 *l = logits + (size_t)row * E;
  float *p = probs + (size_t)row * E;
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, mp_ldx(l, e));
  m = mp_warp_max(m);
  float sum = 0.0f;
  for (int e = lane; e < E; e += 32) sum += expf(mp_ldx(l, e) - m);
  sum = mp_warp_sum(sum);
  for (int e = lane; e < E; e += 32) p[e] = expf(mp_ldx(l, e) - m) / sum;

  int32_t *idx = topk_idx + (size_t)row * k;
  float *w = topk_w + (size_t)row * k;
  float prev_p = INFINITY, wsum = 0.0f;
  int prev_i = -1;
  for (int j = 0; j < k; j++) {
    float best_p = -INFINITY;
    int best_i = INT_MAX;
    for (int e = lane; e < E; e += 32) {
      float pe = p[e]; /* written by this lane above */
      int after_prev = pe < prev_p || (pe == prev_p && e > prev_i);
      if (after_prev && (pe > best_p || (pe == best_p && e < best_i))) {
        best_p = pe;
        best_i = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      float op = __shfl_xor_sync(0xffffffffu, best_p, o);
      int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (op > best_p || (op == best_p && oi < best_i)) {
        best_p = op;
        best_i = oi;
      }
    }
    if (lane == 0) {
      idx[j] = best_i == INT_MAX ? -1 : best_i; /* -1 only when probabilities are NaN */
      w[j] = best_p;
    }
    wsum += best_p;
    prev_p = best_p;
    prev_i = best_i;
  }
  if (norm && lane == 0)
    for (int j = 0; j < k; j++) w[j] = w[j] / wsum;
}

__global__ void k_router_backward(mp_bf16 *dlogits, const float *dtopk_w,
                                  const float *dprobs, const float *probs,
                                  const int32_t *topk_idx, int N, int E, int k, int norm) {
  int row = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *p = probs + (size_t)row * E;
  const int32_t *idx = topk_idx + (size_t)row * k;
  const float *dw = dtopk_w ? dtopk_w + (size_t)row * k : NULL;
  /* Renormalisation backward: dp_i = (dw_i - <dw, w>) / S for selected i. */
  float S = 0.0f, dot = 0.0f;
  if (dw && norm) {
    for (int j = 0; j < k; j++) S += p[idx[j]];
    for (int j = 0; j < k; j++) dot += dw[j] * (p[idx[j]] / S);
  }
  float s = 0.0f;
  for (int pass = 0; pass < 2; pass++) {
    for (int e = lane; e < E; e += 32) {
      float dp = dprobs ? dprobs[(size_t)row * E + e] : 0.0f;
      if (dw)
        for (int j = 0; j < k; j++)
          if (idx[j] == e) dp += norm ? (dw[j] - dot) / S : dw[j];
      if (pass == 0) {
        s += dp * p[e];
      } else {
        size_t i = (size_t)row * E + e;
        mp_stx(dlogits, i, mp_ldx(dlogits, i) + p[e] * (dp - s));
      }
    }
    if (pass == 0) s = mp_warp_sum(s);
  }
}

/* Block e: f[e] = (#pairs choosing e) / N, part[e] = f[e] * mean_n probs[n, e]. */
__global__ void k_aux_loss_partials(float *f, double *part, const float *probs,
                                    const int32_t *topk_idx, int N, int E, int k) {
  __shared__ double sh[32];
  int e = blockIdx.x;
  double cnt = 0.0, P = 0.0;
  size_t nk = (size_t)N * k;
  for (size_t r = threadIdx.x; r < nk; r += blockDim.x) cnt += topk_idx[r] == e ? 1.0 : 0.0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) P += probs[(size_t)n * E + e];
  cnt = mp_block_sum(cnt, sh);
  P = mp_block_sum(P, sh);
  if (threadIdx.x == 0) {
    float fe = (float)(cnt / N);
    f[e] = fe;
    part[e] = (double)fe * (P / N);
  }
}

__global__ void k_aux_loss_finish(float *aux, const double *part, int E) {
  double total = 0.0;
  for (int e = 0; e < E; e++) total += part[e]; /* expert order, as the CPU */
  *aux = (float)(E * total);
}

__global__ void k_aux_loss_backward(float *dprobs, const float *f, double coef, int E,
                                    size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dprobs[i] += (float)(coef * f[i % E]);
}

__global__ void k_moe_plan(int32_t *perm, int32_t *inv, int32_t *counts,
                           const int32_t *topk_idx, int E, int nk) {
  __shared__ int sh[32];
  int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int nw = blockDim.x >> 5;
  int lt = 0, eq = 0;
  for (int r = threadIdx.x; r < nk; r += blockDim.x) {
    int x = topk_idx[r];
    lt += x >= 0 && x < e;
    eq += x == e;
  }
  int base = mp_block_sum(lt, sh);
  int count = mp_block_sum(eq, sh);
  if (threadIdx.x == 0) counts[e] = count;
  int running = 0;
  for (int r0 = 0; r0 < nk; r0 += blockDim.x) {
    int r = r0 + threadIdx.x;
    int x = r < nk ? topk_idx[r] : -1;
    int flag = x == e;
    unsigned ballot = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) sh[warp] = __popc(ballot);
    __syncthreads();
    int woff = 0, total = 0;
    for (int w = 0; w < nw; w++) {
      woff += w < warp ? sh[w] : 0;
      total += sh[w];
    }
    if (flag) {
      int dst = base + running + woff + __popc(ballot & ((1u << lane) - 1u));
      perm[dst] = r;
      inv[r] = dst;
    }
    if (e == 0 && r < nk && (x < 0 || x >= E)) inv[r] = -1; /* invalid: not placed */
    running += total;
    __syncthreads(); /* sh is rewritten by the next chunk */
  }
}

__global__ void k_permute_forward(mp_bf16 *out, const mp_bf16 *x, const int32_t *perm, int k,
                                  int C, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / C, c = i % C;
    out[i] = x[(size_t)(perm[r] / k) * C + c];
  }
}

__global__ void k_permute_backward(mp_bf16 *dx, const mp_bf16 *dout, const int32_t *inv,
                                   int k, int C, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t t = i / C, c = i % C;
    float acc = mp_ldx(dx, i);
    for (int j = 0; j < k; j++) acc += mp_ldx(dout, (size_t)inv[t * k + j] * C + c);
    mp_stx(dx, i, acc);
  }
}

__global__ void k_unpermute_forward(mp_bf16 *out, const mp_bf16 *y, const float *topk_w,
                                    const int32_t *inv, int k, int C, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t t = i / C, c = i % C;
    float acc = 0.0f;
    for (int j = 0; j < k; j++)
      acc += topk_w[t * k + j] * mp_ldx(y, (size_t)inv[t * k + j] * C + c);
    mp_stx(out, i, acc);
  }
}

__global__ void k_unpermute_backward(mp_bf16 *dy, float *dtopk_w, const mp_bf16 *dout,
                                     const mp_bf16 *y, const float *topk_w,
                                     const int32_t *inv, int k, int C, size_t npairs) {
  size_t pair = (size_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (pair >= npairs) return;
  size_t t = pair / k, r = (size_t)inv[pair];
  float w = topk_w[pair], dot = 0.0f;
  const mp_bf16 *g = dout + t * C, *yr = y + r * C;
  for (int c = lane; c < C; c += 32) {
    float gv = mp_ldx(g, c);
    dot += gv * mp_ldx(yr, c);
    if (dy) mp_stx(dy, r * C + c, mp_ldx(dy, r * C + c) + w * gv);
  }
  dot = mp_warp_sum(dot);
  if (lane == 0 && dtopk_w) dtopk_w[pair] += dot;
}

mp_status mp_cuda_router_forward(mp_kctx *kc, float *probs, int32_t *topk_idx,
                                 float *topk_w, const void *logits, int N, int E, int k,
                                 int norm_topk_prob) {
  MP_KREQUIRE(kc, N >= 0 && E > 0 && k > 0 && k <= E, "router_forward");
  if (N == 0) return MP_OK;
  k_router_forward<<<(N + WARPS - 1) / WARPS, WARPS * 32, 0, MP_CUDA_STREAM(kc)>>>(
      probs, topk_idx, topk_w, (const mp_bf16 *)logits, N, E, k, norm_topk_prob);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_router_backward(mp_kctx *kc, void *dlogits, const float *dtopk_w,
                                  const float *dprobs, const float *probs,
                                  const int32_t *topk_idx, int N, int E, int k,
                                  int norm_topk_prob) {
  MP_KREQUIRE(kc, N >= 0 && E > 0 && k > 0 && k <= E, "router_backward");
  if (N == 0) return MP_OK;
  k_router_backward<<<(N + WARPS - 1) / WARPS, WARPS * 32, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)dlogits, dtopk_w, dprobs, probs, topk_idx, N, E, k, norm_topk_prob);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_router_aux_loss_forward(mp_kctx *kc, float *aux, float *f,
                                          const float *probs, const int32_t *topk_idx,
                                          int N, int E, int k) {
  MP_KREQUIRE(kc, N > 0 && E > 0 && k > 0 && k <= E, "router_aux_loss_forward");
  void *scratch = NULL;
  MP_CHECK(mp_cuda_scratch(kc, sizeof(double) * (size_t)E, &scratch));
  k_aux_loss_partials<<<E, MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      f, (double *)scratch, probs, topk_idx, N, E, k);
  MP_CUDA_LAUNCH_CHECK(kc);
  k_aux_loss_finish<<<1, 1, 0, MP_CUDA_STREAM(kc)>>>(aux, (const double *)scratch, E);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_router_aux_loss_backward(mp_kctx *kc, float *dprobs, const float *f,
                                           float dloss, int N, int E) {
  MP_KREQUIRE(kc, N > 0 && E > 0, "router_aux_loss_backward");
  size_t n = (size_t)N * E;
  /* dprobs[n, e] += dloss * E * f_e / N, the CPU's (double)dloss * E * f[e] / N. */
  double coef = (double)dloss * E;
  k_aux_loss_backward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                        MP_CUDA_STREAM(kc)>>>(dprobs, f, coef / N, E, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_moe_plan(mp_kctx *kc, int32_t *perm, int32_t *inv, int32_t *counts,
                           const int32_t *topk_idx, int N, int E, int k) {
  MP_KREQUIRE(kc, N >= 0 && E > 0 && k > 0 && (long long)N * k <= INT_MAX, "moe_plan");
  k_moe_plan<<<E, MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(perm, inv, counts, topk_idx, E,
                                                          N * k);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_permute_forward(mp_kctx *kc, void *out, const void *x,
                                  const int32_t *perm, int N, int k, int C) {
  MP_KREQUIRE(kc, N >= 0 && k > 0 && C >= 0, "permute_forward");
  size_t n = (size_t)N * k * C;
  if (n == 0) return MP_OK;
  k_permute_forward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                      MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)x, perm, k, C,
                                            n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_permute_backward(mp_kctx *kc, void *dx, const void *dout,
                                   const int32_t *inv, int N, int k, int C) {
  MP_KREQUIRE(kc, N >= 0 && k > 0 && C >= 0, "permute_backward");
  size_t n = (size_t)N * C;
  if (n == 0) return MP_OK;
  k_permute_backward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                       MP_CUDA_STREAM(kc)>>>((mp_bf16 *)dx, (const mp_bf16 *)dout, inv, k, C,
                                             n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_unpermute_forward(mp_kctx *kc, void *out, const void *y,
                                    const float *topk_w, const int32_t *inv, int N, int k,
                                    int C) {
  MP_KREQUIRE(kc, N >= 0 && k > 0 && C >= 0, "unpermute_forward");
  size_t n = (size_t)N * C;
  if (n == 0) return MP_OK;
  k_unpermute_forward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                        MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)y, topk_w,
                                              inv, k, C, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_unpermute_backward(mp_kctx *kc, void *dy, float *dtopk_w,
                                     const void *dout, const void *y, const float *topk_w,
                                     const int32_t *inv, int N, int k, int C) {
  MP_KREQUIRE(kc, N >= 0 && k > 0 && C >= 0, "unpermute_backward");
  size_t npairs = (size_t)N * k;
  if (npairs == 0 || (!dy && !dtopk_w)) return MP_OK;
  size_t blocks = (npairs + WARPS - 1) / WARPS;
  MP_KREQUIRE(kc, blocks <= 0x7fffffffu, "unpermute_backward");
  k_unpermute_backward<<<(unsigned)blocks, WARPS * 32, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)dy, dtopk_w, (const mp_bf16 *)dout, (const mp_bf16 *)y, topk_w, inv, k, C,
      npairs);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}
