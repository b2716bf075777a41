/* Rotary position embedding, HF Llama rotate_half convention (kernels/ops.h).
 *
 * Pair (i, i + hd/2) of every head rotates by angle pos * theta^(-2i/hd). We use
 * rotate_half because HF Llama/Qwen checkpoints and torchtitan's HF-compatible path do;
 * the interleaved (2i, 2i+1) convention of Meta's original code would permute q/k weights.
 * Forward may run in place (each pair is read before it is written). Backward is the
 * transpose of the rotation: angle -theta. */
#include <math.h>

#include "common/assert.h"
#include "kernels/cpu/internal.h"

void mp_rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta, int pos0) {
  MP_ASSERT(T >= 0 && hd > 0 && hd % 2 == 0, "head_dim %d: ops.h's pairs (i, i + hd/2)", hd);
  int h2 = hd / 2;
  for (int i = 0; i < h2; i++) {
    /* inv_freq as HF computes it: 1 / theta^(2i/hd), in float64 here then rounded. */
    double inv_freq = 1.0 / pow((double)theta, (2.0 * i) / hd);
    for (int t = 0; t < T; t++) {
      double a = (double)(pos0 + t) * inv_freq;
      cos_t[(size_t)t * h2 + i] = (float)cos(a);
      sin_t[(size_t)t * h2 + i] = (float)sin(a);
    }
  }
}

/* dir = +1 rotates by theta (forward), -1 by -theta (backward, accumulating). */
static void rope_apply(float *out, const float *x, const float *cos_t, const float *sin_t,
                       int B, int T, int nh, int hd, float dir, int accumulate) {
  int h2 = hd / 2;
  long rows = (long)B * T * nh;
#pragma omp parallel for if (rows * hd > 32768)
  for (long r = 0; r < rows; r++) {
    int t = (int)((r / nh) % T);
    const float *c = cos_t + (size_t)t * h2, *s = sin_t + (size_t)t * h2;
    const float *xi = x + (size_t)r * hd;
    float *o = out + (size_t)r * hd;
    for (int i = 0; i < h2; i++) {
      float x1 = xi[i], x2 = xi[i + h2], sn = dir * s[i];
      float y1 = x1 * c[i] - x2 * sn, y2 = x2 * c[i] + x1 * sn;
      if (accumulate) {
        o[i] += y1;
        o[i + h2] += y2;
      } else {
        o[i] = y1;
        o[i + h2] = y2;
      }
    }
  }
}

mp_status mp_cpu_rope_forward(mp_kctx *kc, void *out, const void *x, const float *cos_t,
                              const float *sin_t, int B, int T, int nh, int hd) {
  MP_KREQUIRE(kc, B >= 0 && T >= 0 && nh >= 0 && hd > 0 && hd % 2 == 0, "rope_forward");
  rope_apply((float *)out, (const float *)x, cos_t, sin_t, B, T, nh, hd, 1.0f, 0);
  return MP_OK;
}

mp_status mp_cpu_rope_backward(mp_kctx *kc, void *dx, const void *dout,
                               const float *cos_t, const float *sin_t, int B, int T,
                               int nh, int hd) {
  MP_KREQUIRE(kc, B >= 0 && T >= 0 && nh >= 0 && hd > 0 && hd % 2 == 0 && dx != dout,
                 "rope_backward");
  rope_apply((float *)dx, (const float *)dout, cos_t, sin_t, B, T, nh, hd, -1.0f, 1);
  return MP_OK;
}
