/* Gradient-norm pieces: the local sum of squares (global norm = sqrt of its all-reduce
 * over every shard and group) and the in-place scale that applies the clip factor.
 *
 * The sum is split into a fixed number of chunks that depends only on n, each summed in
 * double by one thread, then the partials are added in chunk order: deterministic for any
 * thread count. */
#include <math.h>

#include "kernels/cpu/internal.h"

enum { SUMSQ_CHUNKS = 64 };

float mp_clip_scale(float global_norm, float max_norm) {
  float c = max_norm / (global_norm + 1e-6f);
  return c < 1.0f ? c : 1.0f;
}

mp_status mp_cpu_sum_squares(mp_kctx *kc, float *sumsq, const float *x, size_t n) {
  (void)kc;
  double part[SUMSQ_CHUNKS] = {0};
  size_t chunk = (n + SUMSQ_CHUNKS - 1) / SUMSQ_CHUNKS;
#pragma omp parallel for if (n > 65536)
  for (int c = 0; c < SUMSQ_CHUNKS; c++) {
    size_t i0 = (size_t)c * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
    double s = 0.0;
    for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
    part[c] = s;
  }
  double total = 0.0;
  for (int c = 0; c < SUMSQ_CHUNKS; c++) total += part[c];
  *sumsq += (float)total;
  return MP_OK;
}

mp_status mp_cpu_scale_f32(mp_kctx *kc, float *x, size_t n, float s) {
  (void)kc;
#pragma omp parallel for if (n > 262144)
  for (size_t i = 0; i < n; i++) x[i] *= s;
  return MP_OK;
}
