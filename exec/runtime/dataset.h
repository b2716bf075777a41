/* Training data as the runtime reads it: token shards (one or many, by glob) or an
 * in-memory corpus, cut into sequences, optionally shuffled, sliced per data-parallel
 * rank, with a position (sequences consumed) that a checkpoint saves.
 *
 * Shard formats (all integers little-endian; a header of 256 int32, then the tokens):
 *   uint16  [0] = 20240520 (magic), [1] = 1 (version), [2] = token count; uint16 tokens.
 *           llm.c's GPT-2 shards (dev/data/data_common.py) and nanoGPT's; ids < 65,536.
 *   uint32  [0] = 20240801 (magic), [1] = 7 (version), [2] = token count; uint32 tokens.
 *           llm.c's Llama-3 shards (same file), for vocabularies over 65,536 ids
 *           (Llama 3: 128,256; Qwen 2: 151,936).
 * The token count must match the file's length exactly. Files are memory-mapped, so a
 * rank touches only the pages of the sequences it reads.
 *
 * Sequences: a source of n tokens holds S = floor((n - 1) / T) sequences; sequence i is
 * the T + 1 tokens from i * T (inputs the first T, targets the last T; consecutive
 * sequences share one token, as llm.c's loader reads B*T + 1 tokens per step). Sequences
 * never cross files; the sources' sequences are numbered in the (sorted) glob's order.
 *
 * Order: global sequence g (0, 1, 2, ... over the run) is, in epoch e = g / S_total,
 * position j = g mod S_total of that epoch's order: j itself unshuffled, else perm_e(j),
 * a Fisher-Yates permutation of 0..S_total-1 drawn with the counter-based generator of
 * init.h from (seed, e). So the order depends only on the seed, and every rank computes
 * the same one without communication.
 *
 * Batching: a step with global batch G starting at position P (sequences consumed before
 * it) gives the data-parallel rank d of dp the sequences P + d*(G/dp) .. + G/dp - 1, its
 * micro-batch m the B of them from m*B; the step then advances P by G. Every mesh sees the
 * same global batch in each step, split into micro-batches of B the same way. */
#ifndef MP_EXEC_RUNTIME_DATASET_H
#define MP_EXEC_RUNTIME_DATASET_H

#include <stdint.h>

#include "common/status.h"
#include "exec/runtime/data.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_SHARD32_MAGIC 20240801
#define MP_SHARD32_VERSION 7

typedef struct mp_dataset mp_dataset;

/* Opens every file the glob pattern matches (sorted; a plain path is a pattern matching
 * itself), checks each header and length, and that every token id is below vocab (vocab
 * <= 0: below 2^31, the batches being int32), naming the file and the position of the
 * first that is not. seq: T. */
mp_status mp_dataset_open(mp_ctx *ctx, const char *pattern, int64_t seq, int64_t vocab, int shuffle, uint64_t seed,
                          mp_dataset **out);
/* The same over n shards given as bytes (bytes[i], lens[i] of them; borrowed: they must
 * outlive the dataset), named names[i] in messages: the checks of mp_dataset_open, the
 * files' parsing shared (a mapped file is read as its bytes). */
mp_status mp_dataset_from_bytes(mp_ctx *ctx, int n, const void *const *bytes, const size_t *lens,
                                const char *const *names, int64_t seq, int64_t vocab, int shuffle, uint64_t seed,
                                mp_dataset **out);
/* A dataset over a corpus's tokens (borrowed: the corpus must outlive it). */
mp_status mp_dataset_from_corpus(mp_ctx *ctx, const mp_corpus *c, int64_t seq, int shuffle, uint64_t seed,
                                 mp_dataset **out);
void mp_dataset_destroy(mp_dataset *d);

int64_t mp_dataset_sequences(const mp_dataset *d); /* S_total: sequences per epoch */
int64_t mp_dataset_tokens(const mp_dataset *d);
int mp_dataset_files(const mp_dataset *d);
/* File f's path and its token width in bytes (2 or 4). */
const char *mp_dataset_file(const mp_dataset *d, int f, int *width);

/* The rank's G/dp sequences of T + 1 int32 tokens for the step that starts at `position`
 * (see above). */
mp_status mp_dataset_batch(mp_ctx *ctx, mp_dataset *d, int64_t position, int64_t global_batch, int dp_index,
                           int dp_size, int32_t *out);

/* Writes tokens as a shard of token width 2 (uint16 format) or 4 (uint32 format),
 * atomically. A token that does not fit the width is refused. */
mp_status mp_shard_write(mp_ctx *ctx, const char *path, const uint32_t *tokens, int64_t n, int width);

#ifdef __cplusplus
}
#endif
#endif
