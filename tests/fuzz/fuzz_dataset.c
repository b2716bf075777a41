/* libFuzzer harness: the token-shard dataset (`meshplan train --data GLOB --val-data GLOB`):
 * llm.c's uint16 shards (magic 20240520, version 1) and uint32 ones (20240801, version 7),
 * several files, sequences that never cross a file, shuffling, per-rank batches.
 *
 * Input: 8 bytes of run parameters, then the shards: each but the last as a little-endian
 * uint32 length and that many bytes, the last taking what remains (1 to 4 files), read
 * through mp_dataset_from_bytes (the parsing of mapped files).
 *   [0] seq T = 1 + b % 64      [1] dp = 1 + b % 4; bit 7: shuffle
 *   [2] global batch = dp * (1 + b % 4)    [3] files = 1 + b % 4; bits 2-3: the vocabulary
 *   checked (none, 1 + [4], 2^17)          [4..7] the position (sequences consumed, as a
 *   checkpoint's data_consumed gives it): uint32, or near INT64_MAX when [7] bit 7 is set.
 *
 * On an accepted input: the counts against an independent count of the files' sequences,
 * then the batch of every data-parallel rank: each row is the T + 1 tokens of one
 * sequence, found by walking the files (unshuffled: exactly the sequence the position
 * names; shuffled: some sequence of the data), every id below the vocabulary. A refusal
 * must be one line. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exec/runtime/dataset.h"
#include "tests/fuzz/fuzz_util.h"

#define MAX_FILES 4

typedef struct files {
  int n;
  const uint8_t *b[MAX_FILES];
  size_t len[MAX_FILES];
} files;

static int width_of(const uint8_t *b) {
  int32_t magic;
  memcpy(&magic, b, 4);
  return magic == MP_SHARD_MAGIC ? 2 : 4;
}

static int64_t token(const files *f, int i, int64_t k) {
  const uint8_t *p = f->b[i] + 1024 + k * width_of(f->b[i]);
  if (width_of(f->b[i]) == 2) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
  }
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static int64_t n_tokens(const files *f, int i) { return (int64_t)(f->len[i] - 1024) / width_of(f->b[i]); }

/* Sequence q of the data by walking the files: file and first token. */
static void locate(const files *f, int64_t T, int64_t q, int *file, int64_t *first) {
  for (int i = 0; i < f->n; i++) {
    const int64_t n = n_tokens(f, i), s = n > T ? (n - 1) / T : 0;
    if (q < s) {
      *file = i;
      *first = q * T;
      return;
    }
    q -= s;
  }
  FUZZ_ASSERT(0 && "sequence beyond the data");
}

static int row_is(const files *f, int64_t T, int64_t q, const int32_t *row) {
  int file;
  int64_t first;
  locate(f, T, q, &file, &first);
  for (int64_t t = 0; t <= T; t++)
    if (row[t] != token(f, file, first + t)) return 0;
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 8) return 0;
  const int64_t T = 1 + data[0] % 64;
  const int dp = 1 + data[1] % 4, shuffle = data[1] >> 7;
  const int64_t gb = dp * (1 + data[2] % 4);
  const int want_files = 1 + data[3] % 4, vk = (data[3] >> 2) & 3;
  const int64_t vocab = vk == 1 ? 1 + data[4] : vk == 2 ? 1 << 17 : 0;
  uint32_t p32;
  memcpy(&p32, data + 4, 4);
  const int64_t position = data[7] & 0x80 ? INT64_MAX - (p32 & 0xffff) : (int64_t)p32;
  files f = {0};
  const uint8_t *p = data + 8, *end = data + size;
  char names[MAX_FILES][16];
  const char *np[MAX_FILES];
  while (f.n < want_files) {
    size_t n = (size_t)(end - p);
    if (f.n < want_files - 1 && n >= 4) {
      uint32_t l;
      memcpy(&l, p, 4);
      p += 4;
      n = l < (size_t)(end - p) ? l : (size_t)(end - p);
    }
    f.b[f.n] = p;
    f.len[f.n] = n;
    snprintf(names[f.n], sizeof names[f.n], "fuzz%d.bin", f.n);
    np[f.n] = names[f.n];
    f.n++;
    p += n;
  }
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_dataset *d = NULL;
  mp_status st = mp_dataset_from_bytes(&ctx, f.n, (const void *const *)f.b, f.len, np, T, vocab, shuffle, 42, &d);
  fuzz_check_refusal(&ctx, st);
  if (st != MP_OK) return 0;
  /* the counts, independently */
  int64_t S = 0, N = 0;
  for (int i = 0; i < f.n; i++) {
    FUZZ_ASSERT(f.len[i] >= 1024 && (f.len[i] - 1024) % width_of(f.b[i]) == 0);
    const int64_t n = n_tokens(&f, i);
    N += n;
    S += n > T ? (n - 1) / T : 0;
  }
  FUZZ_ASSERT(mp_dataset_sequences(d) == S && S > 0 && mp_dataset_tokens(d) == N && mp_dataset_files(d) == f.n);
  const int64_t local = gb / dp;
  int32_t *out = malloc((size_t)(local * (T + 1)) * sizeof *out);
  if (!out) abort();
  for (int r = 0; r < dp; r++) {
    mp_ctx_init(&ctx);
    st = mp_dataset_batch(&ctx, d, position, gb, r, dp, out);
    fuzz_check_refusal(&ctx, st);
    if (st != MP_OK) {
      FUZZ_ASSERT(position > INT64_MAX - gb); /* only a position whose sequence numbers overflow */
      break;
    }
    for (int64_t j = 0; j < local; j++) {
      const int32_t *row = out + j * (T + 1);
      for (int64_t t = 0; t <= T; t++) FUZZ_ASSERT(row[t] >= 0 && (vocab == 0 || row[t] < vocab));
      if (!shuffle) {
        FUZZ_ASSERT(row_is(&f, T, (position + r * local + j) % S, row));
      } else {
        int found = 0;
        for (int64_t q = 0; q < S && !found; q++) found = row_is(&f, T, q, row);
        FUZZ_ASSERT(found);
      }
    }
  }
  free(out);
  mp_dataset_destroy(d);
  return 0;
}
