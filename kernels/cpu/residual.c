/* Residual add and the elementwise accumulations used by every backward (kernels/ops.h). */
#include "kernels/cpu/internal.h"

mp_status mp_cpu_residual_forward(mp_kctx *kc, void *out_, const void *a_, const void *b_,
                                  size_t n) {
  (void)kc;
  float *out = (float *)out_;
  const float *a = (const float *)a_, *b = (const float *)b_;
#pragma omp parallel for if (n > 262144)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
  return MP_OK;
}

mp_status mp_cpu_accumulate(mp_kctx *kc, void *y_, const void *x_, size_t n) {
  return mp_cpu_accumulate_f32(kc, (float *)y_, (const float *)x_, n);
}

mp_status mp_cpu_accumulate_f32(mp_kctx *kc, float *y, const float *x, size_t n) {
  (void)kc;
#pragma omp parallel for if (n > 262144)
  for (size_t i = 0; i < n; i++) y[i] += x[i];
  return MP_OK;
}

mp_status mp_cpu_copy2d(mp_kctx *kc, void *dst_, size_t ld_dst, const void *src_, size_t ld_src,
                        size_t rows, size_t cols, int add) {
  MP_KREQUIRE(kc, (dst_ && src_) || rows == 0 || cols == 0, "copy2d");
  MP_KREQUIRE(kc, ld_dst >= cols && ld_src >= cols, "copy2d");
  float *dst = (float *)dst_;
  const float *src = (const float *)src_;
#pragma omp parallel for if (rows * cols > 262144)
  for (size_t r = 0; r < rows; r++) {
    float *d = dst + r * ld_dst;
    const float *s = src + r * ld_src;
    if (add)
      for (size_t c = 0; c < cols; c++) d[c] += s[c];
    else
      for (size_t c = 0; c < cols; c++) d[c] = s[c];
  }
  return MP_OK;
}
