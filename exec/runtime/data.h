/* Training data: a synthetic corpus whose entropy is known, the llm.c / nanoGPT token
 * shard format, and each data-parallel rank's slice of the global batch.
 *
 * Synthetic corpus: a first-order Markov chain over the vocabulary. State a moves to one
 * of `fanout` successors (distinct, chosen by a counter-based hash of (seed, a)) with
 * hashed positive weights, normalised. Its entropy rate
 *   H = sum_a pi(a) * H(P(. | a))          (pi: the stationary distribution, by power
 *                                            iteration in double)
 * is the lowest mean cross-entropy any next-token predictor can reach on it, so a test can
 * assert that the loss falls from ln(V) toward H. The tokens are drawn from the chain
 * started at state 0 with the same counter-based hash (deterministic, plan-independent).
 *
 * Shard format (llm.c dev/data, nanoGPT): a header of 256 int32 (little-endian):
 * [0] = 20240520 (magic), [1] = 1 (version), [2] = number of tokens; then the tokens as
 * uint16. The vocabulary must fit in uint16.
 *
 * Batching: step s of a run with global batch G sequences of T tokens uses global
 * sequences g = s*G .. s*G + G - 1; sequence g is the T + 1 tokens starting at
 * (g * T) mod (n_tokens - T) (inputs are the first T, targets the last T). The
 * data-parallel rank with index d (mp_mesh_group_index over MP_GROUP_DP) takes sequences
 * s*G + d*(G/dp) .. + G/dp - 1, its micro-batch m the B of them from m*B. So every plan
 * sees the same global batch in each step, split the same way into micro-batches of B. */
#ifndef MP_EXEC_RUNTIME_DATA_H
#define MP_EXEC_RUNTIME_DATA_H

#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_SHARD_MAGIC 20240520
#define MP_SHARD_VERSION 1
#define MP_SHARD_HEADER_INTS 256

typedef struct mp_corpus {
  uint16_t *tokens; /* malloc'ed */
  int64_t n_tokens;
  int64_t vocab;    /* 0 when unknown (read from a shard: max token + 1 is checked by the caller) */
  double entropy_nats; /* the synthetic chain's entropy rate; < 0 when unknown */
} mp_corpus;

/* Synthetic Markov corpus of n_tokens over vocab (2 .. 65536) with `fanout` successors
 * per state (1 .. vocab). */
mp_status mp_corpus_synthetic(mp_ctx *ctx, int64_t vocab, int fanout, int64_t n_tokens, uint64_t seed,
                              mp_corpus *out);
/* The chain's entropy rate alone (nats per token). */
mp_status mp_markov_entropy(mp_ctx *ctx, int64_t vocab, int fanout, uint64_t seed, double *out);
mp_status mp_corpus_read_shard(mp_ctx *ctx, const char *path, mp_corpus *out);
/* The same from the shard's bytes (len of them; origin names them in messages): the header
 * is checked against len before any token is read. */
mp_status mp_corpus_from_shard_bytes(mp_ctx *ctx, const void *bytes, size_t len, const char *origin,
                                     mp_corpus *out);
mp_status mp_corpus_write_shard(mp_ctx *ctx, const mp_corpus *c, const char *path);
void mp_corpus_free(mp_corpus *c);

/* Writes the rank's local_batch sequences of T + 1 tokens (int32) for `step`: see above.
 * out holds local_batch x (seq + 1) elements; sizes whose sequence numbers or element
 * count would not fit in 64 bits are MP_ERR_INVALID. */
mp_status mp_corpus_batch(mp_ctx *ctx, const mp_corpus *c, int64_t step, int64_t global_batch,
                          int64_t seq, int dp_index, int dp_size, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
