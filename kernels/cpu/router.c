/* MoE router: softmax over experts, top-k, optional renormalisation, and the Switch/
 * Mixtral load-balancing loss, forward and backward (kernels/ops.h).
 *
 * Top-k is k rounds of argmax with a strict '>' so ties go to the lower expert index (the
 * same order torch.topk gives on the CPU for distinct values; with exact ties the CUDA
 * kernel must follow this rule, not torch's). Backward of the renormalisation w = p/S,
 * S = sum over the selected p: dp_i = (dw_i - sum_j dw_j w_j) / S for selected i, 0 for
 * the rest; then the softmax backward dl = p (dp - <dp, p>). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/internal.h"

mp_status mp_cpu_router_forward(mp_kctx *kc, float *probs, int32_t *topk_idx,
                                float *topk_w, const void *logits_, int N, int E, int k,
                                int norm_topk_prob) {
  MP_KREQUIRE(kc, N >= 0 && E > 0 && k > 0 && k <= E, "router_forward");
  const float *logits = (const float *)logits_;
#pragma omp parallel for if ((long)N * E > 16384)
  for (int n = 0; n < N; n++) {
    const float *l = logits + (size_t)n * E;
    float *p = probs + (size_t)n * E;
    float m = -INFINITY;
    for (int e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
    double sum = 0.0;
    for (int e = 0; e < E; e++) {
      p[e] = expf(l[e] - m);
      sum += p[e];
    }
    for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
    int32_t *idx = topk_idx + (size_t)n * k;
    float *w = topk_w + (size_t)n * k;
    double wsum = 0.0;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int i = 0; i < j; i++) taken |= idx[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      idx[j] = best;
      w[j] = p[best];
      wsum += p[best];
    }
    if (norm_topk_prob)
      for (int j = 0; j < k; j++) w[j] = (float)(w[j] / wsum);
  }
  return MP_OK;
}

mp_status mp_cpu_router_backward(mp_kctx *kc, void *dlogits_, const float *dtopk_w,
                                 const float *dprobs, const float *probs,
                                 const int32_t *topk_idx, int N, int E, int k,
                                 int norm_topk_prob) {
  MP_KREQUIRE(kc, N >= 0 && E > 0 && k > 0 && k <= E, "router_backward");
  float *dlogits = (float *)dlogits_;
  int failed = 0;
#pragma omp parallel
  {
    double *dp = (double *)malloc(sizeof(double) * (size_t)E);
    if (!dp) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for
    for (int n = 0; n < N; n++) {
      if (!dp) continue;
      const float *p = probs + (size_t)n * E;
      const int32_t *idx = topk_idx + (size_t)n * k;
      const float *dw = dtopk_w ? dtopk_w + (size_t)n * k : NULL;
      for (int e = 0; e < E; e++) dp[e] = dprobs ? dprobs[(size_t)n * E + e] : 0.0;
      if (dw) {
        if (norm_topk_prob) {
          double S = 0.0, dot = 0.0;
          for (int j = 0; j < k; j++) S += p[idx[j]];
          for (int j = 0; j < k; j++) dot += dw[j] * (p[idx[j]] / S);
          for (int j = 0; j < k; j++) dp[idx[j]] += (dw[j] - dot) / S;
        } else {
          for (int j = 0; j < k; j++) dp[idx[j]] += dw[j];
        }
      }
      double s = 0.0;
      for (int e = 0; e < E; e++) s += dp[e] * p[e];
      float *dl = dlogits + (size_t)n * E;
      for (int e = 0; e < E; e++) dl[e] += (float)(p[e] * (dp[e] - s));
    }
    free(dp);
  }
  if (failed) return mp_error(kc->err, MP_ERR_NOMEM, "router_backward: out of memory");
  return MP_OK;
}

mp_status mp_cpu_router_aux_loss_forward(mp_kctx *kc, float *aux, float *f,
                                         const float *probs, const int32_t *topk_idx,
                                         int N, int E, int k) {
  MP_KREQUIRE(kc, N > 0 && E > 0 && k > 0 && k <= E, "router_aux_loss_forward");
  double total = 0.0;
  for (int e = 0; e < E; e++) {
    long count = 0;
    double P = 0.0;
    for (int n = 0; n < N; n++) {
      for (int j = 0; j < k; j++) count += topk_idx[(size_t)n * k + j] == e;
      P += probs[(size_t)n * E + e];
    }
    f[e] = (float)((double)count / N);
    total += (double)f[e] * (P / N);
  }
  *aux = (float)(E * total);
  return MP_OK;
}

mp_status mp_cpu_router_aux_loss_backward(mp_kctx *kc, float *dprobs, const float *f,
                                          float dloss, int N, int E) {
  MP_KREQUIRE(kc, N > 0 && E > 0, "router_aux_loss_backward");
  for (int n = 0; n < N; n++)
    for (int e = 0; e < E; e++)
      dprobs[(size_t)n * E + e] += (float)((double)dloss * E * f[e] / N);
  return MP_OK;
}
