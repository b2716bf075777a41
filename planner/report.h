/* A search's results as `plan` reports them: a ranked plan as JSON, the rejection counts by
 * rule (in order and as JSON), and what a plan costs to train on a given number of tokens;
 * and a stored plan's settings in words, as `report` and `train --plan-id` state them.
 *
 * Time and cost to train: a plan running at t tokens/s per GPU on n GPUs trains T tokens in
 * T / (t x n) seconds, days = that / 86,400; at P dollars per GPU-hour the cost is
 * days x 24 x n x P = T / t / 3,600 x P. */
#ifndef MP_PLANNER_REPORT_H
#define MP_PLANNER_REPORT_H

#include "planner/search.h"
#include "planner/store.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;

/* The settings a plans row was predicted under, in words: "stack S" (or "stack not
 * recorded"), "NCCL X.Y.Z" (or "the newest NCCL modelled") and, where not off, "loss in N
 * chunks", "expert imbalance F" and "expert capacity factor C", split by ", ". */
void mp_plan_row_settings_str(const mp_plan_row *r, char *buf, size_t cap);

/* The rules that rejected candidates (by[r] > 0, r != NONE) into order, largest count first
 * (ties: rule order); returns how many. */
int mp_reject_order_by_count(const int64_t by[MP_REJECT_COUNT], int order[MP_REJECT_COUNT]);
/* s's rejection counts as a JSON array of {"rule", "words", "count"}, largest first. NULL
 * when out of memory. */
struct cJSON *mp_reject_counts_json(const mp_search *s);
/* A ranked plan as `plan --json` prints it: rank, plan_id (once stored), mesh, options,
 * the prediction and the memory at the peak; tokens_per_dollar with a price > 0. NULL when
 * out of memory. */
struct cJSON *mp_candidate_json(const mp_candidate *c, int64_t rank, double price);

/* Days to train `tokens` tokens with c on n_gpus GPUs (above); 0 when c has no throughput. */
double mp_train_days(const mp_candidate *c, int64_t n_gpus, double tokens);
/* Its cost in dollars at price_per_gpu_hour (0 when the price or the throughput is 0). */
double mp_train_cost(const mp_candidate *c, double tokens, double price_per_gpu_hour);
/* Both into JSON object o as "train_days" and, with a price > 0, "train_cost_usd". */
void mp_train_json(struct cJSON *o, const mp_candidate *c, int64_t n_gpus, double tokens, double price_per_gpu_hour);

#ifdef __cplusplus
}
#endif
#endif
