/* Token permute/unpermute for MoE: group (token, slot) pairs by expert and combine expert
 * outputs weighted by the router (kernels/ops.h).
 *
 * moe_plan is a counting sort on expert index (stable: token order, then slot order within
 * an expert), which is what makes each expert's rows contiguous for the grouped matmul and
 * for EP's all-to-all. Backward of the gather (permute) is written through the inverse
 * permutation as a gather too (dx[n] sums its k rows), so no thread ever scatters into a
 * row another thread owns.
 *
 * A pair whose expert index is -1 is dropped (an expert's capacity, exec/runtime/
 * runtime_moe.c): it takes no row (inv -1), the rows after the last placed pair have perm
 * -1 and are zero, and permute/unpermute skip it, so it contributes nothing forward or
 * backward. */
#include <string.h>

#include "common/assert.h"
#include "kernels/cpu/internal.h"

mp_status mp_cpu_moe_plan(mp_kctx *kc, int32_t *perm, int32_t *inv, int32_t *counts,
                          const int32_t *topk_idx, int N, int E, int k) {
  MP_KREQUIRE(kc, N >= 0 && E > 0 && k > 0, "moe_plan");
  memset(counts, 0, sizeof(int32_t) * (size_t)E);
  long nk = (long)N * k, placed = 0;
  for (long r = 0; r < nk; r++) {
    int e = topk_idx[r];
    if (e == -1) continue; /* dropped */
    if (e < 0 || e >= E)
      return mp_error(kc->err, MP_ERR_INVALID, "moe_plan: expert index %d at pair %ld is "
                      "outside [0, %d); the router output is corrupt", e, r, E);
    counts[e]++;
    placed++;
  }
  /* offsets of each expert's first row, then place pairs in order. */
  int32_t off = 0;
  for (int e = 0; e < E; e++) {
    int32_t c = counts[e];
    counts[e] = off; /* temporarily the running write position */
    off += c;
  }
  for (long r = 0; r < nk; r++) {
    if (topk_idx[r] == -1) {
      inv[r] = -1;
      continue;
    }
    int32_t dst = counts[topk_idx[r]]++;
    perm[dst] = (int32_t)r;
    inv[r] = dst;
  }
  for (long r = placed; r < nk; r++) perm[r] = -1;
  MP_ASSERT(counts[E - 1] == placed, "the last expert's write position ends at the placed pairs: each fills one row");
  /* counts[e] now holds the end offset of e; convert back to sizes. */
  for (int e = E - 1; e > 0; e--) counts[e] -= counts[e - 1];
  return MP_OK;
}

mp_status mp_cpu_permute_forward(mp_kctx *kc, void *out_, const void *x_,
                                 const int32_t *perm, int N, int k, int C) {
  MP_KREQUIRE(kc, N >= 0 && k > 0 && C >= 0, "permute_forward");
  float *out = (float *)out_;
  const float *x = (const float *)x_;
  long rows = (long)N * k;
#pragma omp parallel for if (rows * C > 65536)
  for (long r = 0; r < rows; r++) {
    if (perm[r] < 0) memset(out + (size_t)r * C, 0, sizeof(float) * (size_t)C);
    else memcpy(out + (size_t)r * C, x + (size_t)(perm[r] / k) * C, sizeof(float) * (size_t)C);
  }
  return MP_OK;
}

mp_status mp_cpu_permute_backward(mp_kctx *kc, void *dx_, const void *dout_,
                                  const int32_t *inv, int N, int k, int C) {
  MP_KREQUIRE(kc, N >= 0 && k > 0 && C >= 0, "permute_backward");
  float *dx = (float *)dx_;
  const float *dout = (const float *)dout_;
#pragma omp parallel for if ((long)N * k * C > 65536)
  for (int n = 0; n < N; n++) {
    float *d = dx + (size_t)n * C;
    for (int j = 0; j < k; j++) {
      if (inv[(size_t)n * k + j] < 0) continue;
      const float *g = dout + (size_t)inv[(size_t)n * k + j] * C;
      for (int c = 0; c < C; c++) d[c] += g[c];
    }
  }
  return MP_OK;
}

mp_status mp_cpu_unpermute_forward(mp_kctx *kc, void *out_, const void *y_,
                                   const float *topk_w, const int32_t *inv, int N, int k,
                                   int C) {
  MP_KREQUIRE(kc, N >= 0 && k > 0 && C >= 0, "unpermute_forward");
  float *out = (float *)out_;
  const float *y = (const float *)y_;
#pragma omp parallel for if ((long)N * k * C > 65536)
  for (int n = 0; n < N; n++) {
    float *o = out + (size_t)n * C;
    for (int c = 0; c < C; c++) o[c] = 0.0f;
    for (int j = 0; j < k; j++) {
      if (inv[(size_t)n * k + j] < 0) continue;
      float w = topk_w[(size_t)n * k + j];
      const float *yr = y + (size_t)inv[(size_t)n * k + j] * C;
      for (int c = 0; c < C; c++) o[c] += w * yr[c];
    }
  }
  return MP_OK;
}

mp_status mp_cpu_unpermute_backward(mp_kctx *kc, void *dy_, float *dtopk_w,
                                    const void *dout_, const void *y_, const float *topk_w,
                                    const int32_t *inv, int N, int k, int C) {
  MP_KREQUIRE(kc, N >= 0 && k > 0 && C >= 0, "unpermute_backward");
  float *dy = (float *)dy_;
  const float *dout = (const float *)dout_, *y = (const float *)y_;
#pragma omp parallel for if ((long)N * k * C > 65536)
  for (int n = 0; n < N; n++) {
    const float *g = dout + (size_t)n * C;
    for (int j = 0; j < k; j++) {
      if (inv[(size_t)n * k + j] < 0) continue;
      size_t r = (size_t)inv[(size_t)n * k + j];
      float w = topk_w[(size_t)n * k + j];
      const float *yr = y + r * C;
      double dot = 0.0;
      for (int c = 0; c < C; c++) dot += (double)g[c] * yr[c];
      if (dtopk_w) dtopk_w[(size_t)n * k + j] += (float)dot;
      if (dy) {
        float *d = dy + r * C;
        for (int c = 0; c < C; c++) d[c] += w * g[c];
      }
    }
  }
  return MP_OK;
}
