/* libFuzzer harness: the llm.c token-shard reader (`meshplan train --data FILE`): the
 * header checked against the bytes, then the batches a run would take from the corpus,
 * with a step, global batch, sequence length and data-parallel split taken from the input
 * (the first 8 bytes after the header's 1 KiB when there are any). Every token of every
 * batch must come from the corpus, and the output buffer is exactly the documented size
 * (ASan reports a write past it). */
#include "exec/runtime/data.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_corpus c;
  mp_status st = mp_corpus_from_shard_bytes(&ctx, data, size, "fuzz.bin", &c);
  fuzz_check_refusal(&ctx, st);
  if (st != MP_OK) return 0;
  FUZZ_ASSERT(c.n_tokens >= 2 && c.vocab >= 1 && c.vocab <= 65536);
  FUZZ_ASSERT((size_t)c.n_tokens * 2 + 1024 == size);
  /* batch parameters from the first tokens: small enough to run fast, any shape */
  const uint8_t *p = data + 1024;
  const int64_t seq = 1 + p[0] % 64;
  const int dp = 1 + p[1] % 4;
  const int64_t gb = dp * (1 + p[2] % 4);
  const int64_t step = ((int64_t)p[3] << 8 | (c.n_tokens > 2 ? p[4] : 0)) * (p[1] & 0x80 ? 1000003 : 1);
  const int64_t local = gb / dp;
  int32_t *out = (int32_t *)malloc((size_t)(local * (seq + 1)) * sizeof *out);
  if (out == NULL) abort();
  for (int d = 0; d < dp; d++) {
    mp_ctx_init(&ctx);
    mp_status b = mp_corpus_batch(&ctx, &c, step, gb, seq, d, dp, out);
    fuzz_check_refusal(&ctx, b);
    if (b == MP_OK)
      for (int64_t i = 0; i < local * (seq + 1); i++) FUZZ_ASSERT(out[i] >= 0 && out[i] < c.vocab);
    else
      FUZZ_ASSERT(c.n_tokens < seq + 1);
  }
  free(out);
  mp_corpus_free(&c);
  return 0;
}
