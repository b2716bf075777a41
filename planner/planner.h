/* One planner run: enumerate and prune (search.h), evaluate on worker threads, rank by the
 * objective, then write the run, every candidate (its ranked plans alone with ranked_only), the
 * ranks and the rejection counts by rule to the store (store.h) in one transaction from the
 * calling thread. The search is finished before the transaction
 * opens, so concurrent planners on one database queue for the seconds of writing, not for
 * each other's searches. Shared by `meshplan plan` and the
 * benchmark; the evaluator is whatever the search config names (the simulator in the CLI,
 * a fake in tests). */
#ifndef MP_PLANNER_PLANNER_H
#define MP_PLANNER_PLANNER_H

#include "planner/search.h"
#include "planner/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_planner_request {
  mp_search_config search;
  mp_objective objective;
  double price_per_gpu_hour; /* for tokens-per-dollar; <= 0 unknown */
  mp_run_info info;          /* what the runs row records */
  int ranked_only;           /* 1: only the ranked plans get plans rows (plan's default);
                                0: every candidate (plan --log-all, and train's small
                                searches, whose pick may be a plan that does not fit) */
  int show_progress;         /* progress bar on stderr (common/progress.h) */
} mp_planner_request;

typedef struct mp_planner_result {
  mp_search *search;   /* every candidate */
  int64_t *order;      /* feasible candidates, best first (in search's arena) */
  int64_t n_order;
  int64_t run_id;      /* 0 without a store */
  double wall_s;       /* enumerate + evaluate + store */
} mp_planner_result;

/* store may be NULL (--no-db). On failure nothing of the run is in the store. */
mp_status mp_planner_run(mp_ctx *ctx, const mp_planner_request *req, mp_store *store,
                         mp_planner_result *out);
void mp_planner_result_free(mp_planner_result *r);

#ifdef __cplusplus
}
#endif
#endif
