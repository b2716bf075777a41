/* GELU, tanh approximation as in GPT-2 (PyTorch approximate="tanh"), forward and backward.
 *
 * g(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3);
 * g'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2). */
#include <math.h>

#include "kernels/cpu/internal.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

mp_status mp_cpu_gelu_forward(mp_kctx *kc, void *out_, const void *x_, size_t n) {
  (void)kc;
  float *out = (float *)out_;
  const float *x = (const float *)x_;
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v)));
  }
  return MP_OK;
}

mp_status mp_cpu_gelu_backward(mp_kctx *kc, void *dx_, const void *dout_, const void *x_,
                               size_t n) {
  (void)kc;
  float *dx = (float *)dx_;
  const float *dout = (const float *)dout_, *x = (const float *)x_;
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    float th = tanhf(GELU_K * (v + GELU_A * v * v * v));
    float d = 0.5f * (1.0f + th) +
              0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * v * v);
    dx[i] += d * dout[i];
  }
  return MP_OK;
}
