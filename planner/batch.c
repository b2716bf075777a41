/* The default step size (see batch.h). */
#include "planner/batch.h"

#include <stdio.h>

/* 2^20 tokens: the "M" of the recipes' "4M tokens" (Llama 3's 4M at seq 4096 is 1,024
 * sequences: 4,194,304 tokens). */
#define MTOK 1048576LL

static int64_t size_tokens(double n_params) {
  if (n_params < 1e9) return MTOK / 2;
  if (n_params < 5e9) return MTOK;
  return 4 * MTOK;
}

int64_t mp_batch_rule_tokens(double n_params, int64_t n_gpus) {
  const int64_t by_size = size_tokens(n_params);
  const int64_t by_gpus = n_gpus * MP_BATCH_TOKENS_PER_GPU;
  return by_size > by_gpus ? by_size : by_gpus;
}

int64_t mp_batch_rule_seqs(int64_t tokens, int64_t seq) {
  if (seq < 1) return 1;
  const int64_t s = (tokens + seq / 2) / seq;
  return s < 1 ? 1 : s;
}

int64_t mp_batch_for_dp(int64_t target_seqs, int64_t dp) {
  if (dp < 1 || target_seqs < 1 || dp > target_seqs) return 0;
  return (target_seqs + dp / 2) / dp * dp;
}

/* "4M", "512K", "8,192": tokens in the recipes' units */
static void tokens_str(int64_t t, char *buf, size_t cap) {
  if (t >= MTOK && t % (MTOK / 4) == 0) snprintf(buf, cap, "%gM", (double)t / MTOK);
  else if (t >= 1024 && t % 1024 == 0) snprintf(buf, cap, "%lldK", (long long)(t / 1024));
  else snprintf(buf, cap, "%lld", (long long)t);
}

void mp_batch_rule_str(double n_params, int64_t n_gpus, char *buf, size_t cap) {
  const int64_t by_size = size_tokens(n_params), by_gpus = n_gpus * MP_BATCH_TOKENS_PER_GPU;
  const char *size_src = n_params < 5e9 ? "GPT-3's batch for the model's size" : "Llama 2/3's from 5B parameters";
  char ts[32], tg[32];
  tokens_str(by_size, ts, sizeof ts);
  tokens_str(by_gpus, tg, sizeof tg);
  if (by_gpus > by_size)
    snprintf(buf, cap, "%s tokens = %d per GPU x %lld GPUs (Llama 3 405B: 16M on 16,384), over %s by size (%s)",
             tg, MP_BATCH_TOKENS_PER_GPU, (long long)n_gpus, ts, size_src);
  else
    snprintf(buf, cap, "%s tokens by size (%s), over %s = %d per GPU x %lld GPUs", ts, size_src, tg,
             MP_BATCH_TOKENS_PER_GPU, (long long)n_gpus);
}
