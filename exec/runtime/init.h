/* Deterministic, plan-independent parameter initialization.
 *
 * A parameter element's initial value depends only on (seed, FQN, global index), never on
 * the mesh or on which rank holds it, so every plan starts from the same weights as the
 * single-rank run and each rank fills only its own tile (mp_param_tile) without
 * communication. The global index is the row-major flat index into the global shape.
 *
 * The generator is counter-based:
 *   h      = mix64(mix64(seed) ^ fnv1a64(fqn))
 *   r(j)   = mix64(h + (j + 1) * 0x9E3779B97F4A7C15)      (mix64: splitmix64's finalizer)
 *   u(j)   = (r(j) >> 40) * 2^-24                           in [0, 1), 24 bits, exact in fp32
 * and an element with global index i takes:
 *   Linear weights (q/k/v/o, gate/up/down, router, routed and shared experts, output head),
 *     fan_in = last dim:     (2 u(i) - 1) / sqrt(fan_in)   -> U(-1/sqrt(in), 1/sqrt(in)),
 *                                                              PyTorch nn.Linear's bound
 *   embeddings (token, position):  0.02 * z(i),  z(i) = sqrt(-2 ln(1 - u(2i))) cos(2 pi u(2i+1))
 *                                                              (Box-Muller, N(0, 1))
 *   norm weights: 1;  biases: 0.
 * Computed in double, rounded once to fp32. */
#ifndef MP_EXEC_RUNTIME_INIT_H
#define MP_EXEC_RUNTIME_INIT_H

#include <stdint.h>

#include "exec/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mp_init_kind {
  MP_INIT_LINEAR = 0, /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
  MP_INIT_EMBEDDING,  /* N(0, 0.02^2) */
  MP_INIT_ONES,
  MP_INIT_ZEROS
} mp_init_kind;

uint64_t mp_init_mix64(uint64_t x);
uint64_t mp_init_fqn_hash(uint64_t seed, const char *fqn);
mp_init_kind mp_init_kind_of(const mp_param *prm);
/* The initial value of element `global_index` of the parameter. */
float mp_init_value(uint64_t seed, const mp_param *prm, int64_t global_index);
/* Fills dst (row-major over len[]) with the block of the global tensor at off[]/len[]. */
void mp_init_fill_block(uint64_t seed, const mp_param *prm, const int64_t off[MP_MAX_NDIM],
                        const int64_t len[MP_MAX_NDIM], float *dst);

#ifdef __cplusplus
}
#endif
#endif
