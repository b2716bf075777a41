/* Deterministic initialization (see init.h for the exact recipe). */
#include "exec/runtime/init.h"

#include <math.h>

uint64_t mp_init_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t mp_init_fqn_hash(uint64_t seed, const char *fqn) {
  uint64_t f = 0xcbf29ce484222325ull; /* FNV-1a 64 */
  for (const unsigned char *c = (const unsigned char *)fqn; *c; c++) f = (f ^ *c) * 0x100000001b3ull;
  return mp_init_mix64(mp_init_mix64(seed) ^ f);
}

static double uniform_at(uint64_t h, uint64_t j) {
  uint64_t r = mp_init_mix64(h + (j + 1) * 0x9E3779B97F4A7C15ull);
  return (double)(r >> 40) * (1.0 / 16777216.0);
}

mp_init_kind mp_init_kind_of(const mp_param *prm) {
  if (prm->role == MP_ROLE_BIAS) return MP_INIT_ZEROS;
  switch (prm->module) {
    case MP_MOD_TOK_EMBEDDINGS:
    case MP_MOD_POS_EMBEDDINGS: return MP_INIT_EMBEDDING;
    case MP_MOD_ATTN_NORM:
    case MP_MOD_FFN_NORM:
    case MP_MOD_FINAL_NORM:
    case MP_MOD_Q_NORM:
    case MP_MOD_K_NORM: return MP_INIT_ONES;
    default: return MP_INIT_LINEAR;
  }
}

static float value_with(uint64_t h, mp_init_kind kind, int64_t fan_in, int64_t i) {
  switch (kind) {
    case MP_INIT_ONES: return 1.0f;
    case MP_INIT_ZEROS: return 0.0f;
    case MP_INIT_EMBEDDING: {
      double u1 = uniform_at(h, 2 * (uint64_t)i), u2 = uniform_at(h, 2 * (uint64_t)i + 1);
      return (float)(0.02 * sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2));
    }
    case MP_INIT_LINEAR:
    default: return (float)((2.0 * uniform_at(h, (uint64_t)i) - 1.0) / sqrt((double)fan_in));
  }
}

float mp_init_value(uint64_t seed, const mp_param *prm, int64_t global_index) {
  return value_with(mp_init_fqn_hash(seed, prm->fqn), mp_init_kind_of(prm), prm->shape[prm->ndim - 1],
                    global_index);
}

void mp_init_fill_block(uint64_t seed, const mp_param *prm, const int64_t off[MP_MAX_NDIM],
                        const int64_t len[MP_MAX_NDIM], float *dst) {
  const uint64_t h = mp_init_fqn_hash(seed, prm->fqn);
  const mp_init_kind kind = mp_init_kind_of(prm);
  const int64_t fan_in = prm->shape[prm->ndim - 1];
  int64_t l[MP_MAX_NDIM] = {1, 1, 1}, o[MP_MAX_NDIM] = {0, 0, 0}, g[MP_MAX_NDIM] = {1, 1, 1};
  /* Right-align to 3 dims so one loop nest covers 1-D, 2-D and 3-D parameters. */
  for (int d = 0; d < prm->ndim; d++) {
    int k = MP_MAX_NDIM - prm->ndim + d;
    l[k] = len[d];
    o[k] = off[d];
    g[k] = prm->shape[d];
  }
  int64_t n = 0;
  for (int64_t a = 0; a < l[0]; a++)
    for (int64_t b = 0; b < l[1]; b++)
      for (int64_t c = 0; c < l[2]; c++) {
        int64_t gi = ((o[0] + a) * g[1] + (o[1] + b)) * g[2] + (o[2] + c);
        dst[n++] = value_with(h, kind, fan_in, gi);
      }
}
