/* Synthetic Markov corpus, llm.c token shards and batch slicing (see data.h). */
#include "exec/runtime/data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/checked.h"
#include "common/json.h"
#include "exec/runtime/init.h"

static double u01(uint64_t h, uint64_t j) {
  return (double)(mp_init_mix64(h + (j + 1) * 0x9E3779B97F4A7C15ull) >> 11) * (1.0 / 9007199254740992.0);
}

/* succ[a*fanout + j], prob[a*fanout + j]. */
static mp_status chain_build(mp_ctx *ctx, int64_t V, int fanout, uint64_t seed, int32_t **succ_out,
                             double **prob_out) {
  if (V < 2 || V > 65536 || fanout < 1 || fanout > V)
    return mp_error(ctx, MP_ERR_INVALID, "synthetic data: vocab %lld must be in 2..65536 and fanout %d in 1..vocab",
                    (long long)V, fanout);
  int32_t *succ = malloc((size_t)V * fanout * sizeof *succ);
  double *prob = malloc((size_t)V * fanout * sizeof *prob);
  if (!succ || !prob) {
    free(succ);
    free(prob);
    return mp_error(ctx, MP_ERR_NOMEM, "synthetic data: out of memory");
  }
  const uint64_t h = mp_init_mix64(seed ^ 0x6D61726B6F76ull); /* "markov" */
  for (int64_t a = 0; a < V; a++) {
    double sum = 0;
    uint64_t ctr = (uint64_t)a << 20;
    for (int j = 0; j < fanout; j++) {
      int32_t s;
      int dup;
      do { /* distinct successors */
        s = (int32_t)(u01(h, ctr++) * (double)V);
        dup = 0;
        for (int i = 0; i < j; i++) dup |= succ[a * fanout + i] == s;
      } while (dup);
      succ[a * fanout + j] = s;
      double w = 0.05 + u01(h, ctr++); /* bounded away from 0: every successor is seen */
      prob[a * fanout + j] = w;
      sum += w;
    }
    for (int j = 0; j < fanout; j++) prob[a * fanout + j] /= sum;
  }
  *succ_out = succ;
  *prob_out = prob;
  return MP_OK;
}

static mp_status chain_entropy(mp_ctx *ctx, int64_t V, int fanout, const int32_t *succ, const double *prob,
                               double *out) {
  double *pi = malloc((size_t)V * sizeof *pi), *nx = malloc((size_t)V * sizeof *nx);
  if (!pi || !nx) {
    free(pi);
    free(nx);
    return mp_error(ctx, MP_ERR_NOMEM, "synthetic data: out of memory");
  }
  /* Power iteration from the chain's start state 0, averaged (Cesaro) so periodic chains
   * converge too: the long-run token frequencies of the generated corpus. */
  double *avg = calloc((size_t)V, sizeof *avg);
  if (!avg) {
    free(pi);
    free(nx);
    return mp_error(ctx, MP_ERR_NOMEM, "synthetic data: out of memory");
  }
  for (int64_t a = 0; a < V; a++) pi[a] = a == 0;
  const int iters = 4000;
  for (int it = 0; it < iters; it++) {
    memset(nx, 0, (size_t)V * sizeof *nx);
    for (int64_t a = 0; a < V; a++)
      for (int j = 0; j < fanout; j++) nx[succ[a * fanout + j]] += pi[a] * prob[a * fanout + j];
    memcpy(pi, nx, (size_t)V * sizeof *pi);
    if (it >= iters / 2)
      for (int64_t a = 0; a < V; a++) avg[a] += pi[a] / (iters - iters / 2);
  }
  double H = 0;
  for (int64_t a = 0; a < V; a++) {
    double ha = 0;
    for (int j = 0; j < fanout; j++) ha -= prob[a * fanout + j] * log(prob[a * fanout + j]);
    H += avg[a] * ha;
  }
  free(pi);
  free(nx);
  free(avg);
  *out = H;
  return MP_OK;
}

mp_status mp_markov_entropy(mp_ctx *ctx, int64_t vocab, int fanout, uint64_t seed, double *out) {
  int32_t *succ;
  double *prob;
  MP_CHECK(chain_build(ctx, vocab, fanout, seed, &succ, &prob));
  mp_status st = chain_entropy(ctx, vocab, fanout, succ, prob, out);
  free(succ);
  free(prob);
  return st;
}

mp_status mp_corpus_synthetic(mp_ctx *ctx, int64_t vocab, int fanout, int64_t n_tokens, uint64_t seed,
                              mp_corpus *out) {
  memset(out, 0, sizeof *out);
  if (n_tokens < 2) return mp_error(ctx, MP_ERR_INVALID, "synthetic data: need at least 2 tokens");
  int32_t *succ;
  double *prob;
  MP_CHECK(chain_build(ctx, vocab, fanout, seed, &succ, &prob));
  mp_status st = chain_entropy(ctx, vocab, fanout, succ, prob, &out->entropy_nats);
  if (st != MP_OK) goto done;
  out->tokens = malloc((size_t)n_tokens * sizeof *out->tokens);
  if (!out->tokens) {
    st = mp_error(ctx, MP_ERR_NOMEM, "synthetic data: out of memory for %lld tokens", (long long)n_tokens);
    goto done;
  }
  const uint64_t h = mp_init_mix64(seed ^ 0x73616D706C65ull); /* "sample" */
  int64_t a = 0;
  for (int64_t i = 0; i < n_tokens; i++) {
    out->tokens[i] = (uint16_t)a;
    double u = u01(h, (uint64_t)i), c = 0;
    int j = 0;
    for (; j < fanout - 1; j++) {
      c += prob[a * fanout + j];
      if (u < c) break;
    }
    a = succ[a * fanout + j];
  }
  out->n_tokens = n_tokens;
  out->vocab = vocab;
done:
  free(succ);
  free(prob);
  return st;
}

mp_status mp_corpus_from_shard_bytes(mp_ctx *ctx, const void *bytes, size_t len, const char *origin,
                                     mp_corpus *out) {
  memset(out, 0, sizeof *out);
  out->entropy_nats = -1;
  int32_t hdr[MP_SHARD_HEADER_INTS];
  if (len < sizeof hdr)
    return mp_error(ctx, MP_ERR_INVALID, "%s: too short for a token shard (header of 256 int32)", origin);
  memcpy(hdr, bytes, sizeof hdr);
  if (hdr[0] != MP_SHARD_MAGIC || hdr[1] != MP_SHARD_VERSION)
    return mp_error(ctx, MP_ERR_INVALID, "%s: not an llm.c token shard (magic %d version %d; want %d and %d)",
                    origin, hdr[0], hdr[1], MP_SHARD_MAGIC, MP_SHARD_VERSION);
  /* n is an int32 from the file: compared with the bytes there in 64 bits, so a negative
   * or huge count cannot wrap the size */
  const int64_t n = hdr[2];
  if (n < 2 || (int64_t)(len - sizeof hdr) != n * 2)
    return mp_error(ctx, MP_ERR_INVALID, "%s: header says %lld tokens but the file holds %zu bytes of tokens",
                    origin, (long long)n, len - sizeof hdr);
  out->tokens = malloc((size_t)n * 2);
  if (!out->tokens) return mp_error(ctx, MP_ERR_NOMEM, "%s: out of memory", origin);
  memcpy(out->tokens, (const char *)bytes + sizeof hdr, (size_t)n * 2);
  out->n_tokens = n;
  int64_t mx = 0;
  for (int64_t i = 0; i < n; i++)
    if (out->tokens[i] > mx) mx = out->tokens[i];
  out->vocab = mx + 1;
  return MP_OK;
}

mp_status mp_corpus_read_shard(mp_ctx *ctx, const char *path, mp_corpus *out) {
  memset(out, 0, sizeof *out);
  out->entropy_nats = -1;
  char *b = NULL;
  size_t len = 0;
  MP_CHECK(mp_read_file(ctx, path, &b, &len));
  mp_status st = mp_corpus_from_shard_bytes(ctx, b, len, path, out);
  free(b);
  return st;
}

mp_status mp_corpus_write_shard(mp_ctx *ctx, const mp_corpus *c, const char *path) {
  if (c->n_tokens > INT32_MAX)
    return mp_error(ctx, MP_ERR_INVALID, "token shard: %lld tokens exceed the int32 header", (long long)c->n_tokens);
  size_t len = MP_SHARD_HEADER_INTS * 4 + (size_t)c->n_tokens * 2;
  char *b = calloc(1, len);
  MP_CHECK_ALLOC(ctx, b);
  int32_t hdr[3] = {MP_SHARD_MAGIC, MP_SHARD_VERSION, (int32_t)c->n_tokens};
  memcpy(b, hdr, sizeof hdr);
  memcpy(b + MP_SHARD_HEADER_INTS * 4, c->tokens, (size_t)c->n_tokens * 2);
  mp_status st = mp_write_file_atomic(ctx, path, b, len);
  free(b);
  return st;
}

void mp_corpus_free(mp_corpus *c) {
  if (!c) return;
  free(c->tokens);
  memset(c, 0, sizeof *c);
}

mp_status mp_corpus_batch(mp_ctx *ctx, const mp_corpus *c, int64_t step, int64_t global_batch, int64_t seq,
                          int dp_index, int dp_size, int32_t *out) {
  if (seq < 1 || c->n_tokens < seq + 1)
    return mp_error(ctx, MP_ERR_INVALID, "data has %lld tokens, fewer than one sequence of %lld + 1; "
                    "use a longer corpus or a shorter --seq", (long long)c->n_tokens, (long long)seq);
  if (dp_size < 1 || global_batch < 1 || global_batch % dp_size != 0 || dp_index < 0 || dp_index >= dp_size)
    return mp_error(ctx, MP_ERR_INVALID, "global batch %lld does not divide over %d data-parallel ranks",
                    (long long)global_batch, dp_size);
  const int64_t local = global_batch / dp_size, span = c->n_tokens - seq;
  /* every index below fits: the first sequence number of the step and the rank's last
   * output element */
  int64_t first = 0, elems = 0;
  if (step < 0 || mp_mul_i64(step, global_batch, &first) || mp_add_i64(first, global_batch, &first) ||
      mp_mul_i64(local, seq + 1, &elems))
    return mp_error(ctx, MP_ERR_INVALID, "step %lld of %lld sequences of %lld tokens: the sequence numbers do "
                    "not fit in 64 bits", (long long)step, (long long)global_batch, (long long)seq);
  for (int64_t j = 0; j < local; j++) {
    int64_t g = step * global_batch + (int64_t)dp_index * local + j;
    int64_t start = (int64_t)(((unsigned __int128)g * (unsigned __int128)seq) % (unsigned __int128)span);
    for (int64_t t = 0; t <= seq; t++) out[j * (seq + 1) + t] = c->tokens[start + t];
  }
  return MP_OK;
}
