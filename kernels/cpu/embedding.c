/* Embedding lookup, whole-table and vocab-parallel (kernels/ops.h for the contract).
 *
 * The shard holds global rows [vs, ve); a token outside gives a zero row so that the sum
 * over shards is the full lookup. Backward is parallel over channel blocks, not tokens:
 * each thread owns a column range of dwte and walks the tokens in order, so repeated
 * tokens add in a fixed order and the result is deterministic. */
#include <string.h>

#include "kernels/cpu/internal.h"

mp_status mp_cpu_embedding_forward(mp_kctx *kc, void *out_, const int32_t *tokens,
                                   const void *wte_, int N, int C, int vs, int ve) {
  MP_KREQUIRE(kc, N >= 0 && C >= 0 && 0 <= vs && vs <= ve, "embedding_forward");
  float *out = (float *)out_;
  const float *wte = (const float *)wte_;
#pragma omp parallel for if ((long)N * C > 32768)
  for (int n = 0; n < N; n++) {
    int t = tokens[n];
    float *o = out + (size_t)n * C;
    if (t >= vs && t < ve)
      memcpy(o, wte + (size_t)(t - vs) * C, (size_t)C * sizeof(float));
    else
      memset(o, 0, (size_t)C * sizeof(float));
  }
  return MP_OK;
}

mp_status mp_cpu_embedding_backward(mp_kctx *kc, float *dwte, const void *dout_,
                                    const int32_t *tokens, int N, int C, int vs, int ve) {
  MP_KREQUIRE(kc, N >= 0 && C >= 0 && 0 <= vs && vs <= ve, "embedding_backward");
  const float *dout = (const float *)dout_;
  enum { CB = 64 }; /* channels per task: a cache line multiple, enough tasks for C >= 128 */
  int nblk = (C + CB - 1) / CB;
#pragma omp parallel for if ((long)N * C > 32768)
  for (int b = 0; b < nblk; b++) {
    int c0 = b * CB, c1 = c0 + CB < C ? c0 + CB : C;
    for (int n = 0; n < N; n++) {
      int t = tokens[n];
      if (t < vs || t >= ve) continue;
      float *d = dwte + (size_t)(t - vs) * C;
      const float *g = dout + (size_t)n * C;
      for (int c = c0; c < c1; c++) d[c] += g[c];
    }
  }
  return MP_OK;
}
