/* The default step size: a tokens-per-step target as production pre-training recipes set
 * it, turned into each mesh's global batch.
 *
 * The rule (mp_batch_rule_tokens): the larger of
 *   - a model-size target: 0.5M tokens below 1B parameters and 1M below 5B (GPT-3, Brown
 *     et al. 2020, Table 2.1: 0.5M for 125M-760M, 1M for 1.3B-2.7B), 4M from 5B up (Llama 2,
 *     Touvron et al. 2023: 4M tokens for 7B-70B; Llama 3, Dubey et al. 2024, section 3.4.1:
 *     405B starts at 4M tokens);
 *   - a cluster-size target: 1,024 tokens per GPU (Llama 3 405B's 16M tokens per step on
 *     16,384 GPUs, the same section), so that a large cluster is not left with a step too
 *     small to keep every GPU busy.
 * In sequences: the target over seq, rounded to the nearest whole sequence (at least 1).
 * A mesh with dp = dp_replicate x dp_shard data-parallel ranks runs the nearest multiple
 * of dp (mp_batch_for_dp): every rank takes the same number of whole sequences, and the
 * step stays within dp / 2 sequences of the target. A mesh whose dp is over the target in
 * sequences cannot run it (each of its ranks would need a whole sequence, the step up to
 * twice the target: a different recipe), and the search rejects it under the batch rule. */
#ifndef MP_PLANNER_BATCH_H
#define MP_PLANNER_BATCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MP_BATCH_TOKENS_PER_GPU 1024

/* The tokens-per-step target for a model of n_params parameters on n_gpus GPUs. */
int64_t mp_batch_rule_tokens(double n_params, int64_t n_gpus);
/* The target in sequences of seq tokens: the nearest whole number, at least 1. */
int64_t mp_batch_rule_seqs(int64_t tokens, int64_t seq);
/* The nearest multiple of dp to target_seqs (halves round up), or 0 when dp > target_seqs. */
int64_t mp_batch_for_dp(int64_t target_seqs, int64_t dp);
/* The rule in words with its figures, e.g. "4M tokens by size (Llama 2/3's from 5B
 * parameters), over 8K = 1024 per GPU x 8 GPUs", for the line the commands print. */
void mp_batch_rule_str(double n_params, int64_t n_gpus, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
