/* AdamW step on fp32 master parameters, operation for operation as PyTorch 1.13's
 * single-tensor torch.optim.AdamW (so a PyTorch reference matches to rounding):
 *   p *= 1 - lr*wd; m = m*b1 + g*(1-b1); v = v*b2 + g*g*(1-b2);
 *   denom = sqrt(v) / sqrt(1 - b2^t) + eps; p -= (lr / (1 - b1^t)) * m / denom,
 * with g = grad * grad_scale (the global-norm clip factor, 1 when not clipping). */
#include <math.h>

#include "kernels/cpu/internal.h"

mp_status mp_cpu_adamw_update(mp_kctx *kc, float *param, const float *grad, float *m,
                              float *v, size_t n, float lr, float beta1, float beta2,
                              float eps, float weight_decay, int step, float grad_scale) {
  MP_KREQUIRE(kc, step >= 1, "adamw_update");
  /* PyTorch computes these on Python floats (double), then uses them as scalars. */
  double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
  float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  float decay = (float)(1.0 - (double)lr * weight_decay);
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    float g = grad[i] * grad_scale;
    float p = param[i] * decay;
    m[i] = m[i] * beta1 + g * (1.0f - beta1);
    v[i] = v[i] * beta2 + g * g * (1.0f - beta2);
    float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    param[i] = p - step_size * (m[i] / denom);
  }
  return MP_OK;
}
