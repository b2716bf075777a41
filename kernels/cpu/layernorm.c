/* LayerNorm (with optional bias) forward and backward, fp32 (kernels/ops.h).
 *
 * Statistics are computed in double per row (two passes: mean, then centred variance), so
 * the reference is not limited by cancellation on rows with a large mean. Backward is the
 * llm.c formulation: dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), with
 * dnorm = dout * w. Parameter gradients dw, db are reduced over rows; to stay
 * deterministic each thread owns a channel block and walks all rows in order. */
#include <math.h>

#include "kernels/cpu/internal.h"

mp_status mp_cpu_layernorm_forward(mp_kctx *kc, void *out_, float *mean, float *rstd,
                                   const void *x_, const void *w_, const void *b_, int N,
                                   int C, float eps) {
  MP_KREQUIRE(kc, N >= 0 && C > 0, "layernorm_forward");
  float *out = (float *)out_;
  const float *x = (const float *)x_, *w = (const float *)w_, *b = (const float *)b_;
#pragma omp parallel for if ((long)N * C > 16384)
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * C;
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; c++) m += xr[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
    v /= C;
    float s = (float)(1.0 / sqrt(v + eps));
    float mf = (float)m;
    float *o = out + (size_t)n * C;
    for (int c = 0; c < C; c++) o[c] = (xr[c] - mf) * s * w[c] + (b ? b[c] : 0.0f);
    if (mean) mean[n] = mf;
    rstd[n] = s;
  }
  return MP_OK;
}

mp_status mp_cpu_layernorm_backward(mp_kctx *kc, void *dx_, float *dw, float *db,
                                    const void *dout_, const void *x_, const void *w_,
                                    const float *mean, const float *rstd, int N, int C) {
  MP_KREQUIRE(kc, N >= 0 && C > 0, "layernorm_backward");
  float *dx = (float *)dx_;
  const float *dout = (const float *)dout_, *x = (const float *)x_, *w = (const float *)w_;
  if (dx) {
#pragma omp parallel for if ((long)N * C > 16384)
    for (int n = 0; n < N; n++) {
      const float *g = dout + (size_t)n * C, *xr = x + (size_t)n * C;
      float m = mean[n], s = rstd[n];
      double sum_dn = 0.0, sum_dn_xh = 0.0;
      for (int c = 0; c < C; c++) {
        float xh = (xr[c] - m) * s, dn = g[c] * w[c];
        sum_dn += dn;
        sum_dn_xh += (double)dn * xh;
      }
      float a = (float)(sum_dn / C), bb = (float)(sum_dn_xh / C);
      float *d = dx + (size_t)n * C;
      for (int c = 0; c < C; c++) {
        float xh = (xr[c] - m) * s;
        d[c] += s * (g[c] * w[c] - a - xh * bb);
      }
    }
  }
  enum { CB = 32 };
  int nblk = (C + CB - 1) / CB;
#pragma omp parallel for if ((long)N * C > 16384)
  for (int blk = 0; blk < nblk; blk++) {
    int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
    double aw[CB] = {0}, ab[CB] = {0};
    for (int n = 0; n < N; n++) {
      const float *g = dout + (size_t)n * C, *xr = x + (size_t)n * C;
      for (int c = c0; c < c1; c++) {
        aw[c - c0] += (double)g[c] * ((xr[c] - mean[n]) * rstd[n]);
        ab[c - c0] += g[c];
      }
    }
    for (int c = c0; c < c1; c++) {
      if (dw) dw[c] += (float)aw[c - c0];
      if (db) db[c] += (float)ab[c - c0];
    }
  }
  return MP_OK;
}
