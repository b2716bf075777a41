/* Token shards by glob, sequences, shuffled order, per-rank batches (see dataset.h). */
#define _GNU_SOURCE
#include "common/file.h"
#include "exec/runtime/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/checked.h"
#include "common/json.h"
#include "exec/runtime/init.h"

typedef struct source {
  char *path;          /* malloc'd; NULL for a corpus */
  const void *tokens;  /* uint16 or uint32 */
  int width;           /* bytes per token */
  int64_t n_tokens, n_seq, first_seq; /* its sequences are first_seq .. first_seq + n_seq - 1 */
  void *map;           /* the mapping (NULL for a corpus) */
  size_t map_len;
} source;

struct mp_dataset {
  source *src;
  int n_src;
  int64_t seq, n_seq, n_tokens;
  int shuffle;
  uint64_t seed;
  int64_t *perm;       /* the order of perm_epoch (shuffle) */
  int64_t perm_epoch;  /* -1: none computed */
};

/* ---- shards ------------------------------------------------------------------------------ */

/* The header and length of a shard's bytes (len of them, named path in messages): the
 * format, and a token count that matches the length exactly; s->tokens then points into
 * bytes. Shared by the mapped files and the bytes entry point. */
static mp_status check_shard(mp_ctx *ctx, const void *bytes, size_t len, const char *path, source *s) {
  if (len < MP_SHARD_HEADER_INTS * 4)
    return mp_error(ctx, MP_ERR_INVALID, "%s: too short for a token shard (a header of 256 int32)", path);
  int32_t hdr[3];
  memcpy(hdr, bytes, sizeof hdr);
  if (hdr[0] == MP_SHARD_MAGIC && hdr[1] == MP_SHARD_VERSION)
    s->width = 2;
  else if (hdr[0] == MP_SHARD32_MAGIC && hdr[1] == MP_SHARD32_VERSION)
    s->width = 4;
  else
    return mp_error(ctx, MP_ERR_INVALID, "%s: not a token shard (magic %d version %d; want %d/%d for uint16 or "
                    "%d/%d for uint32 tokens)", path, hdr[0], hdr[1], MP_SHARD_MAGIC, MP_SHARD_VERSION,
                    MP_SHARD32_MAGIC, MP_SHARD32_VERSION);
  s->n_tokens = hdr[2];
  if (hdr[2] < 0 || MP_SHARD_HEADER_INTS * 4 + (size_t)s->n_tokens * (size_t)s->width != len)
    return mp_error(ctx, MP_ERR_INVALID, "%s: header says %d tokens of %d bytes but the file holds %zu bytes of "
                    "tokens", path, hdr[2], s->width, len - MP_SHARD_HEADER_INTS * 4);
  s->tokens = (const char *)bytes + MP_SHARD_HEADER_INTS * 4;
  return MP_OK;
}

static mp_status map_shard(mp_ctx *ctx, const char *path, source *s) {
  /* a regular file only: a FIFO or a device named by --data is refused, never waited on */
  int fd = -1;
  int64_t size = 0;
  MP_CHECK(mp_file_open_input(ctx, path, &fd, &size));
  if (size < MP_SHARD_HEADER_INTS * 4) { /* checked before mapping: an empty file cannot be mapped */
    close(fd);
    return check_shard(ctx, "", 0, path, s);
  }
  s->map_len = (size_t)size;
  s->map = mmap(NULL, s->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (s->map == MAP_FAILED) {
    s->map = NULL;
    return mp_error(ctx, MP_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
  }
  return check_shard(ctx, s->map, s->map_len, path, s);
}

/* By memcpy: a shard given as bytes need not be aligned (a mapped one is); compilers emit
 * one load either way. */
static int64_t token_at(const source *s, int64_t i) {
  if (s->width == 2) {
    uint16_t v;
    memcpy(&v, (const char *)s->tokens + 2 * i, 2);
    return v;
  }
  uint32_t v;
  memcpy(&v, (const char *)s->tokens + 4 * i, 4);
  return v;
}

/* Every id below vocab; without a vocabulary (vocab <= 0), every id an int32 (the batches'
 * type): a uint32 shard can hold ids up to 2^32 - 1, which would wrap negative. */
static mp_status check_vocab(mp_ctx *ctx, const source *s, int64_t vocab) {
  const int64_t limit = vocab > 0 ? vocab : (int64_t)INT32_MAX + 1;
  for (int64_t i = 0; i < s->n_tokens; i++) {
    const int64_t id = token_at(s, i);
    if (id < limit) continue;
    if (vocab <= 0)
      return mp_error(ctx, MP_ERR_INVALID, "%s: token id %lld at position %lld does not fit the int32 ids of a batch; "
                      "the shard is corrupt", s->path ? s->path : "corpus", (long long)id, (long long)i);
    return mp_error(ctx, MP_ERR_INVALID, "%s: token id %lld at position %lld is outside the model's vocabulary of "
                    "%lld; tokenize with the model's tokenizer or choose a --model whose vocab exceeds it",
                    s->path ? s->path : "corpus", (long long)id, (long long)i, (long long)vocab);
  }
  return MP_OK;
}

/* The sequence counts and offsets of the sources, and the checks every dataset needs. */
static mp_status finish(mp_ctx *ctx, mp_dataset *d) {
  for (int i = 0; i < d->n_src; i++) {
    source *s = &d->src[i];
    s->n_seq = s->n_tokens > d->seq ? (s->n_tokens - 1) / d->seq : 0;
    s->first_seq = d->n_seq;
    d->n_seq += s->n_seq;
    d->n_tokens += s->n_tokens;
  }
  if (d->n_seq == 0)
    return mp_error(ctx, MP_ERR_INVALID, "the data (%lld tokens in %d file%s) holds no sequence of %lld + 1 tokens; "
                    "use more data or a shorter --seq", (long long)d->n_tokens, d->n_src, d->n_src == 1 ? "" : "s",
                    (long long)d->seq);
  d->perm_epoch = -1;
  return MP_OK;
}

static mp_dataset *dataset_new(size_t n_src, int64_t seq, int shuffle, uint64_t seed) {
  mp_dataset *d = calloc(1, sizeof *d);
  if (d) d->src = calloc(n_src ? n_src : 1, sizeof *d->src);
  if (d && !d->src) {
    free(d);
    return NULL;
  }
  if (d) {
    d->seq = seq;
    d->shuffle = shuffle;
    d->seed = seed;
  }
  return d;
}

/* A dataset over n shards named names[i]: mapped from those paths (bytes NULL) or read
 * from bytes[i] (lens[i] of them, borrowed). */
static mp_status build(mp_ctx *ctx, size_t n, const char *const *names, const void *const *bytes, const size_t *lens,
                       int64_t seq, int64_t vocab, int shuffle, uint64_t seed, mp_dataset **out) {
  mp_dataset *d = dataset_new(n, seq, shuffle, seed);
  if (!d) return mp_error(ctx, MP_ERR_NOMEM, "out of memory opening %zu token shards", n);
  mp_status st = MP_OK;
  for (size_t i = 0; i < n && st == MP_OK; i++) {
    source *s = &d->src[d->n_src++];
    s->path = strdup(names[i]);
    if (!s->path)
      st = mp_error(ctx, MP_ERR_NOMEM, "out of memory");
    else
      st = bytes ? check_shard(ctx, bytes[i], lens[i], s->path, s) : map_shard(ctx, s->path, s);
    if (st == MP_OK) st = check_vocab(ctx, s, vocab);
  }
  if (st == MP_OK) st = finish(ctx, d);
  if (st != MP_OK) {
    mp_dataset_destroy(d);
    return st;
  }
  *out = d;
  return MP_OK;
}

mp_status mp_dataset_open(mp_ctx *ctx, const char *pattern, int64_t seq, int64_t vocab, int shuffle, uint64_t seed,
                          mp_dataset **out) {
  *out = NULL;
  glob_t g;
  memset(&g, 0, sizeof g);
  int rc = glob(pattern, GLOB_ERR, NULL, &g);
  if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
    globfree(&g);
    return mp_error(ctx, MP_ERR_NOT_FOUND, "no token shard matches %s; check the path or the glob", pattern);
  }
  if (rc != 0) {
    globfree(&g);
    return mp_error(ctx, MP_ERR_IO, "%s: cannot expand the glob (%s)", pattern, rc == GLOB_NOSPACE ? "out of memory"
                                                                                                : "a folder cannot be read");
  }
  mp_status st = build(ctx, g.gl_pathc, (const char *const *)g.gl_pathv, NULL, NULL, seq, vocab, shuffle, seed, out);
  globfree(&g);
  return st;
}

mp_status mp_dataset_from_bytes(mp_ctx *ctx, int n, const void *const *bytes, const size_t *lens,
                                const char *const *names, int64_t seq, int64_t vocab, int shuffle, uint64_t seed,
                                mp_dataset **out) {
  *out = NULL;
  if (n < 1) return mp_error(ctx, MP_ERR_INVALID, "no token shard given");
  return build(ctx, (size_t)n, names, bytes, lens, seq, vocab, shuffle, seed, out);
}

mp_status mp_dataset_from_corpus(mp_ctx *ctx, const mp_corpus *c, int64_t seq, int shuffle, uint64_t seed,
                                 mp_dataset **out) {
  *out = NULL;
  mp_dataset *d = dataset_new(1, seq, shuffle, seed);
  if (!d) return mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  d->n_src = 1;
  d->src[0] = (source){NULL, c->tokens, 2, c->n_tokens, 0, 0, NULL, 0};
  mp_status st = finish(ctx, d);
  if (st != MP_OK) {
    mp_dataset_destroy(d);
    return st;
  }
  *out = d;
  return MP_OK;
}

void mp_dataset_destroy(mp_dataset *d) {
  if (!d) return;
  for (int i = 0; i < d->n_src; i++) {
    if (d->src[i].map) munmap(d->src[i].map, d->src[i].map_len);
    free(d->src[i].path);
  }
  free(d->src);
  free(d->perm);
  free(d);
}

int64_t mp_dataset_sequences(const mp_dataset *d) { return d->n_seq; }
int64_t mp_dataset_tokens(const mp_dataset *d) { return d->n_tokens; }
int mp_dataset_files(const mp_dataset *d) { return d->n_src; }

const char *mp_dataset_file(const mp_dataset *d, int f, int *width) {
  if (width) *width = d->src[f].width;
  return d->src[f].path ? d->src[f].path : "(corpus)";
}

/* ---- order and batches -------------------------------------------------------------------- */

/* perm_e: Fisher-Yates from the end, the swap partner of i drawn as floor(u * (i + 1)) with
 * u a 64-bit counter-based uniform of (seed, e, i) (the multiply-high maps it to 0..i with
 * a bias below (i + 1) / 2^64). */
static mp_status epoch_order(mp_ctx *ctx, mp_dataset *d, int64_t e) {
  if (d->perm_epoch == e) return MP_OK;
  if (!d->perm) {
    d->perm = malloc((size_t)d->n_seq * sizeof *d->perm);
    if (!d->perm) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the order of %lld sequences", (long long)d->n_seq);
  }
  for (int64_t i = 0; i < d->n_seq; i++) d->perm[i] = i;
  const uint64_t h = mp_init_mix64(mp_init_mix64(d->seed ^ 0x73687566666C65ull) + (uint64_t)e); /* "shuffle" */
  for (int64_t i = d->n_seq - 1; i > 0; i--) {
    const uint64_t r = mp_init_mix64(h + ((uint64_t)i + 1) * 0x9E3779B97F4A7C15ull);
    const int64_t j = (int64_t)(((unsigned __int128)r * (unsigned __int128)(uint64_t)(i + 1)) >> 64);
    const int64_t t = d->perm[i];
    d->perm[i] = d->perm[j];
    d->perm[j] = t;
  }
  d->perm_epoch = e;
  return MP_OK;
}

static const source *source_of(const mp_dataset *d, int64_t idx) {
  int lo = 0, hi = d->n_src - 1; /* the last source whose first_seq <= idx */
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (d->src[mid].first_seq <= idx)
      lo = mid;
    else
      hi = mid - 1;
  }
  return &d->src[lo];
}

mp_status mp_dataset_batch(mp_ctx *ctx, mp_dataset *d, int64_t position, int64_t global_batch, int dp_index,
                           int dp_size, int32_t *out) {
  if (dp_size < 1 || global_batch % dp_size != 0)
    return mp_error(ctx, MP_ERR_INVALID, "global batch %lld does not divide over %d data-parallel ranks",
                    (long long)global_batch, dp_size);
  int64_t last;
  if (position < 0 || global_batch < 1 || dp_index < 0 || dp_index >= dp_size ||
      mp_add_i64(position, global_batch, &last))
    return mp_error(ctx, MP_ERR_INVALID, "data position %lld plus a global batch of %lld (rank %d of %d) is negative "
                    "or overflows 64 bits; the checkpoint's data_consumed is corrupt", (long long)position,
                    (long long)global_batch, dp_index, dp_size);
  const int64_t local = global_batch / dp_size, T = d->seq;
  for (int64_t j = 0; j < local; j++) {
    const int64_t g = position + (int64_t)dp_index * local + j, e = g / d->n_seq;
    int64_t idx = g % d->n_seq;
    if (d->shuffle) {
      MP_CHECK(epoch_order(ctx, d, e));
      idx = d->perm[idx];
    }
    const source *s = source_of(d, idx);
    const int64_t start = (idx - s->first_seq) * T;
    for (int64_t t = 0; t <= T; t++) out[j * (T + 1) + t] = (int32_t)token_at(s, start + t);
  }
  return MP_OK;
}

mp_status mp_shard_write(mp_ctx *ctx, const char *path, const uint32_t *tokens, int64_t n, int width) {
  if (width != 2 && width != 4) return mp_error(ctx, MP_ERR_INVALID, "token shard: width %d (2 or 4)", width);
  if (n > INT32_MAX) return mp_error(ctx, MP_ERR_INVALID, "token shard: %lld tokens exceed the int32 header", (long long)n);
  const size_t len = MP_SHARD_HEADER_INTS * 4 + (size_t)n * (size_t)width;
  char *b = calloc(1, len);
  MP_CHECK_ALLOC(ctx, b);
  const int32_t hdr[3] = {width == 2 ? MP_SHARD_MAGIC : MP_SHARD32_MAGIC,
                          width == 2 ? MP_SHARD_VERSION : MP_SHARD32_VERSION, (int32_t)n};
  memcpy(b, hdr, sizeof hdr);
  for (int64_t i = 0; i < n; i++) {
    if (width == 2 && tokens[i] > UINT16_MAX) {
      free(b);
      return mp_error(ctx, MP_ERR_INVALID, "token shard %s: token %u at %lld does not fit uint16; write the uint32 "
                      "format", path, tokens[i], (long long)i);
    }
    if (width == 2) {
      const uint16_t v = (uint16_t)tokens[i];
      memcpy(b + MP_SHARD_HEADER_INTS * 4 + (size_t)i * 2, &v, 2);
    } else {
      memcpy(b + MP_SHARD_HEADER_INTS * 4 + (size_t)i * 4, &tokens[i], 4);
    }
  }
  mp_status st = mp_write_file_atomic(ctx, path, b, len);
  free(b);
  return st;
}
