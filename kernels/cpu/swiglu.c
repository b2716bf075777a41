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

/* ops.h swiglu_forward_amax and swiglu_backward_amax: as rmsnorm_forward_amax, the
 * reference is the composition (the plain op, then f8_amax of each output as updated). */
mp_status mp_cpu_swiglu_forward_amax(mp_kctx *kc, void *out, const void *gate, const void *up,
                                     size_t n, float *amax) {
  MP_KREQUIRE(kc, amax != NULL, "swiglu_forward_amax");
  MP_CHECK(mp_cpu_swiglu_forward(kc, out, gate, up, n));
  return mp_cpu_f8_amax(kc, amax, out, n);
}

mp_status mp_cpu_swiglu_backward_amax(mp_kctx *kc, void *dgate, void *dup, const void *dout,
                                      const void *gate, const void *up, size_t n,
                                      float *amax_dgate, float *amax_dup) {
  MP_KREQUIRE(kc, dgate && dup && amax_dgate && amax_dup, "swiglu_backward_amax");
  MP_CHECK(mp_cpu_swiglu_backward(kc, dgate, dup, dout, gate, up, n));
  MP_CHECK(mp_cpu_f8_amax(kc, amax_dgate, dgate, n));
  return mp_cpu_f8_amax(kc, amax_dup, dup, n);
}
