/* Causal self-attention with grouped-query heads, fp32 (kernels/ops.h).
 *
 * Forward, per (batch, query head, position t): scores s_j = <q_t, k_j> / sqrt(hd) for
 * j <= t, p = softmax(s), out_t = sum_j p_j v_j; only lse_t = log sum_j exp(s_j) is kept.
 * Backward recomputes p_j = exp(s_j - lse_t) and uses the softmax identity
 *   ds_j = p_j (<dout_t, v_j> - D_t),   D_t = <dout_t, out_t> = sum_j p_j <dout_t, v_j>,
 * then dq_t += ds_j k_j / sqrt(hd), dk_j += ds_j q_t / sqrt(hd), dv_j += p_j dout_t.
 * Backward parallelises over (batch, kv head): one thread owns dk, dv of that kv head and
 * dq of the query heads that read it, so there are no races and the sum order is fixed.
 * Each thread keeps one score row of T floats. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/internal.h"

mp_status mp_cpu_attention_forward(mp_kctx *kc, void *out_, float *lse, const void *q_,
                                   const void *k_, const void *v_, int B, int T, int nh,
                                   int nkv, int hd) {
  MP_KREQUIRE(kc, B >= 0 && T >= 0 && nh > 0 && nkv > 0 && hd > 0 && nh % nkv == 0,
                 "attention_forward");
  float *out = (float *)out_;
  const float *q = (const float *)q_, *k = (const float *)k_, *v = (const float *)v_;
  const int grp = nh / nkv;
  const float scale = 1.0f / sqrtf((float)hd);
  int failed = 0;
#pragma omp parallel
  {
    float *s = (float *)malloc((size_t)(T > 0 ? T : 1) * sizeof(float));
    if (!s) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int b = 0; b < B; b++)
      for (int h = 0; h < nh; h++)
        for (int t = 0; t < T; t++) {
          if (!s) continue;
          int g = h / grp;
          const float *qt = q + (((size_t)b * T + t) * nh + h) * hd;
          float m = -INFINITY;
          for (int j = 0; j <= t; j++) {
            const float *kj = k + (((size_t)b * T + j) * nkv + g) * hd;
            float d = 0.0f;
            for (int i = 0; i < hd; i++) d += qt[i] * kj[i];
            s[j] = d * scale;
            if (s[j] > m) m = s[j];
          }
          double sum = 0.0;
          for (int j = 0; j <= t; j++) {
            s[j] = expf(s[j] - m);
            sum += s[j];
          }
          float inv = (float)(1.0 / sum);
          float *o = out + (((size_t)b * T + t) * nh + h) * hd;
          for (int i = 0; i < hd; i++) o[i] = 0.0f;
          for (int j = 0; j <= t; j++) {
            const float *vj = v + (((size_t)b * T + j) * nkv + g) * hd;
            float p = s[j] * inv;
            for (int i = 0; i < hd; i++) o[i] += p * vj[i];
          }
          lse[((size_t)b * nh + h) * T + t] = m + (float)log(sum);
        }
    free(s);
  }
  if (failed) return mp_error(kc->err, MP_ERR_NOMEM, "attention_forward: out of memory "
                              "for a score row of %d floats", T);
  return MP_OK;
}

mp_status mp_cpu_attention_backward(mp_kctx *kc, void *dq_, void *dk_, void *dv_,
                                    const void *dout_, const void *q_, const void *k_,
                                    const void *v_, const void *out_, const float *lse,
                                    int B, int T, int nh, int nkv, int hd) {
  MP_KREQUIRE(kc, B >= 0 && T >= 0 && nh > 0 && nkv > 0 && hd > 0 && nh % nkv == 0,
                 "attention_backward");
  float *dq = (float *)dq_, *dk = (float *)dk_, *dv = (float *)dv_;
  const float *dout = (const float *)dout_, *q = (const float *)q_, *k = (const float *)k_,
              *v = (const float *)v_, *out = (const float *)out_;
  const int grp = nh / nkv;
  const float scale = 1.0f / sqrtf((float)hd);
  int failed = 0;
#pragma omp parallel
  {
    float *p = (float *)malloc((size_t)(T > 0 ? T : 1) * sizeof(float));
    if (!p) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
      for (int g = 0; g < nkv; g++) {
        if (!p) continue;
        for (int h = g * grp; h < (g + 1) * grp; h++)
          for (int t = 0; t < T; t++) {
            size_t qo = (((size_t)b * T + t) * nh + h) * hd;
            const float *qt = q + qo, *gt = dout + qo, *ot = out + qo;
            float l = lse[((size_t)b * nh + h) * T + t];
            float D = 0.0f;
            for (int i = 0; i < hd; i++) D += gt[i] * ot[i];
            for (int j = 0; j <= t; j++) {
              const float *kj = k + (((size_t)b * T + j) * nkv + g) * hd;
              float d = 0.0f;
              for (int i = 0; i < hd; i++) d += qt[i] * kj[i];
              p[j] = expf(d * scale - l);
            }
            float *dqt = dq + qo;
            for (int j = 0; j <= t; j++) {
              size_t ko = (((size_t)b * T + j) * nkv + g) * hd;
              const float *kj = k + ko, *vj = v + ko;
              float dp = 0.0f;
              for (int i = 0; i < hd; i++) dp += gt[i] * vj[i];
              float ds = p[j] * (dp - D) * scale;
              float *dkj = dk + ko, *dvj = dv + ko;
              for (int i = 0; i < hd; i++) {
                dqt[i] += ds * kj[i];
                dkj[i] += ds * qt[i];
                dvj[i] += p[j] * gt[i];
              }
            }
          }
      }
    free(p);
  }
  if (failed) return mp_error(kc->err, MP_ERR_NOMEM, "attention_backward: out of memory "
                              "for a probability row of %d floats", T);
  return MP_OK;
}
