/* Cross-entropy over the vocabulary with mean reduction, whole and vocab-parallel
 * (kernels/ops.h).
 *
 * The whole-vocabulary forward is literally the vocab-parallel pieces with one shard, so
 * the two paths cannot drift apart: lse = max + log(sum exp(l - max)), loss = lse - l_t.
 * Sums of exponentials are accumulated in double. Rows with a negative target are
 * ignored (loss 0, no gradient, not counted in the mean). */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/internal.h"

mp_status mp_cpu_ce_local_max(mp_kctx *kc, float *lmax, const void *logits_, int N, int Vl) {
  MP_KREQUIRE(kc, N >= 0 && Vl >= 0, "ce_local_max");
  const float *logits = (const float *)logits_;
#pragma omp parallel for if ((long)N * Vl > 65536)
  for (int n = 0; n < N; n++) {
    const float *l = logits + (size_t)n * Vl;
    float m = -INFINITY;
    for (int v = 0; v < Vl; v++) m = l[v] > m ? l[v] : m;
    lmax[n] = m;
  }
  return MP_OK;
}

mp_status mp_cpu_ce_local_sumexp(mp_kctx *kc, float *lsum, const void *logits_,
                                 const float *gmax, int N, int Vl) {
  MP_KREQUIRE(kc, N >= 0 && Vl >= 0, "ce_local_sumexp");
  const float *logits = (const float *)logits_;
#pragma omp parallel for if ((long)N * Vl > 65536)
  for (int n = 0; n < N; n++) {
    const float *l = logits + (size_t)n * Vl;
    double s = 0.0;
    for (int v = 0; v < Vl; v++) s += expf(l[v] - gmax[n]);
    lsum[n] = (float)s;
  }
  return MP_OK;
}

mp_status mp_cpu_ce_local_target(mp_kctx *kc, float *ltgt, const void *logits_,
                                 const int32_t *targets, int N, int Vl, int vocab_start) {
  MP_KREQUIRE(kc, N >= 0 && Vl >= 0 && vocab_start >= 0, "ce_local_target");
  const float *logits = (const float *)logits_;
  for (int n = 0; n < N; n++) {
    int t = targets[n] - vocab_start;
    ltgt[n] = targets[n] >= 0 && t >= 0 && t < Vl ? logits[(size_t)n * Vl + t] : 0.0f;
  }
  return MP_OK;
}

mp_status mp_cpu_ce_vp_combine(mp_kctx *kc, float *losses, float *loss_mean, float *lse,
                               const float *gmax, const float *gsum, const float *gtgt,
                               const int32_t *targets, int N) {
  MP_KREQUIRE(kc, N >= 0, "ce_vp_combine");
  double total = 0.0;
  long valid = 0;
  for (int n = 0; n < N; n++) {
    lse[n] = gmax[n] + logf(gsum[n]);
    losses[n] = targets[n] >= 0 ? lse[n] - gtgt[n] : 0.0f;
    if (targets[n] >= 0) {
      total += losses[n];
      valid++;
    }
  }
  if (loss_mean) *loss_mean = valid ? (float)(total / valid) : 0.0f;
  return MP_OK;
}

mp_status mp_cpu_cross_entropy_forward(mp_kctx *kc, float *losses, float *loss_mean,
                                       float *lse, const void *logits,
                                       const int32_t *targets, int N, int V) {
  MP_KREQUIRE(kc, N >= 0 && V > 0, "cross_entropy_forward");
  for (int n = 0; n < N; n++)
    if (targets[n] >= V)
      return mp_error(kc->err, MP_ERR_INVALID, "cross_entropy_forward: target %d at row %d "
                      "is outside the vocabulary of %d", targets[n], n, V);
  /* Scratch for the pieces; three rows of N floats. */
  float *tmp = (float *)malloc(sizeof(float) * 3 * (size_t)(N > 0 ? N : 1));
  MP_CHECK_ALLOC(kc->err, tmp);
  float *gmax = tmp, *gsum = tmp + N, *gtgt = tmp + 2 * (size_t)N;
  mp_cpu_ce_local_max(kc, gmax, logits, N, V);
  mp_cpu_ce_local_sumexp(kc, gsum, logits, gmax, N, V);
  mp_cpu_ce_local_target(kc, gtgt, logits, targets, N, V, 0);
  mp_status st = mp_cpu_ce_vp_combine(kc, losses, loss_mean, lse, gmax, gsum, gtgt,
                                      targets, N);
  free(tmp);
  return st;
}

mp_status mp_cpu_ce_backward(mp_kctx *kc, void *dlogits_, const void *logits_,
                             const float *lse, const int32_t *targets, float dloss, int N,
                             int Vl, int vocab_start) {
  MP_KREQUIRE(kc, N >= 0 && Vl >= 0 && vocab_start >= 0, "ce_backward");
  float *dlogits = (float *)dlogits_;
  const float *logits = (const float *)logits_;
#pragma omp parallel for if ((long)N * Vl > 65536)
  for (int n = 0; n < N; n++) {
    if (targets[n] < 0) continue;
    const float *l = logits + (size_t)n * Vl;
    float *d = dlogits + (size_t)n * Vl;
    int t = targets[n] - vocab_start;
    for (int v = 0; v < Vl; v++) {
      float p = expf(l[v] - lse[n]);
      d[v] += dloss * (p - (v == t ? 1.0f : 0.0f));
    }
  }
  return MP_OK;
}
