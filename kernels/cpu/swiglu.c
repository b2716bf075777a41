/* SwiGLU gating (Llama MLP): out = silu(gate) * up, elementwise (kernels/ops.h).
 *
 * silu(g) = g * sigmoid(g); silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g))). The two
 * matmuls around it (gate/up projections, down projection) are matmul ops. */
#include <math.h>

#include "kernels/cpu/internal.h"

mp_status mp_cpu_swiglu_forward(mp_kctx *kc, void *out_, const void *gate_, const void *up_,
                                size_t n) {
  (void)kc;
  float *out = (float *)out_;
  const float *g = (const float *)gate_, *u = (const float *)up_;
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    float sg = 1.0f / (1.0f + expf(-g[i]));
    out[i] = g[i] * sg * u[i];
  }
  return MP_OK;
}

mp_status mp_cpu_swiglu_backward(mp_kctx *kc, void *dgate_, void *dup_, const void *dout_,
                                 const void *gate_, const void *up_, size_t n) {
  (void)kc;
  float *dg = (float *)dgate_, *du = (float *)dup_;
  const float *d = (const float *)dout_, *g = (const float *)gate_, *u = (const float *)up_;
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    float sg = 1.0f / (1.0f + expf(-g[i]));
    if (dg) dg[i] += d[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
    if (du) du[i] += d[i] * g[i] * sg;
  }
  return MP_OK;
}
