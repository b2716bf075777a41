/* RMSNorm forward and backward, fp32 (kernels/ops.h). No mean subtraction, no bias (Llama).
 *
 * y = x * r * w with r = 1/sqrt(mean(x^2) + eps). Backward:
 * dx = r * (dn - x * r^2 * mean(dn * x)), dn = dout * w; dw = sum_rows dout * x * r,
 * reduced per channel block in row order (deterministic). */
#include <math.h>

#include "kernels/cpu/internal.h"

mp_status mp_cpu_rmsnorm_forward(mp_kctx *kc, void *out_, float *rstd, const void *x_,
                                 const void *w_, int N, int C, float eps) {
  MP_KREQUIRE(kc, N >= 0 && C > 0, "rmsnorm_forward");
  float *out = (float *)out_;
  const float *x = (const float *)x_, *w = (const float *)w_;
#pragma omp parallel for if ((long)N * C > 16384)
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * C;
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
    float r = (float)(1.0 / sqrt(ss / C + eps));
    float *o = out + (size_t)n * C;
    for (int c = 0; c < C; c++) o[c] = xr[c] * r * w[c];
    rstd[n] = r;
  }
  return MP_OK;
}

mp_status mp_cpu_rmsnorm_backward(mp_kctx *kc, void *dx_, float *dw, const void *dout_,
                                  const void *x_, const void *w_, const float *rstd, int N,
                                  int C) {
  MP_KREQUIRE(kc, N >= 0 && C > 0, "rmsnorm_backward");
  float *dx = (float *)dx_;
  const float *dout = (const float *)dout_, *x = (const float *)x_, *w = (const float *)w_;
  if (dx) {
#pragma omp parallel for if ((long)N * C > 16384)
    for (int n = 0; n < N; n++) {
      const float *g = dout + (size_t)n * C, *xr = x + (size_t)n * C;
      float r = rstd[n];
      double dot = 0.0;
      for (int c = 0; c < C; c++) dot += (double)g[c] * w[c] * xr[c];
      float coef = (float)(dot / C) * r * r;
      float *d = dx + (size_t)n * C;
      for (int c = 0; c < C; c++) d[c] += r * (g[c] * w[c] - xr[c] * coef);
    }
  }
  if (dw) {
    enum { CB = 32 };
    int nblk = (C + CB - 1) / CB;
#pragma omp parallel for if ((long)N * C > 16384)
    for (int blk = 0; blk < nblk; blk++) {
      int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
      double aw[CB] = {0};
      for (int n = 0; n < N; n++) {
        const float *g = dout + (size_t)n * C, *xr = x + (size_t)n * C;
        for (int c = c0; c < c1; c++) aw[c - c0] += (double)g[c] * xr[c] * rstd[n];
      }
      for (int c = c0; c < c1; c++) dw[c] += (float)aw[c - c0];
    }
  }
  return MP_OK;
}

/* ops.h rmsnorm_forward_amax. The CPU backend is the reference, so the fusion is the
 * composition itself: the same output and the amax f8_amax reads from it. */
mp_status mp_cpu_rmsnorm_forward_amax(mp_kctx *kc, void *out, float *rstd, const void *x,
                                      const void *w, int N, int C, float eps, float *amax) {
  MP_KREQUIRE(kc, amax != NULL, "rmsnorm_forward_amax");
  MP_CHECK(mp_cpu_rmsnorm_forward(kc, out, rstd, x, w, N, C, eps));
  return mp_cpu_f8_amax(kc, amax, out, (size_t)N * C);
}
