/* One planner run (see planner.h). The search runs to the end first; then one store
 * transaction writes the run, its ranked plans (or every candidate), ranks and rejection
 * counts, so a failure anywhere leaves no partial run and other writers wait only for the
 * writing. */
#include "planner/planner.h"

#include <string.h>

#include "common/progress.h"
#include "common/timeutil.h"

/* The run into the store, after the search: its runs row, its candidates (the ranked ones
 * with ranked_only, in rank order; else every one in enumeration order with its
 * reason), the ranks, the rejection counts by rule and the summary, in one transaction.
 * Other writers wait only for this, not for the search. */
static mp_status store_run(mp_ctx *ctx, const mp_planner_request *req, mp_store *store, mp_search *s,
                           const mp_planner_result *out, double t0, int64_t *run_id) {
  MP_CHECK(mp_store_run_begin(ctx, store, &req->info, run_id));
  char reason[512];
  mp_status st = MP_OK;
  const int all = !req->ranked_only;
  const int64_t n = all ? s->n : out->n_order;
  for (int64_t k = 0; k < n && st == MP_OK; k++) {
    const int64_t i = all ? k : out->order[k];
    mp_candidate *c = &s->cands[i];
    reason[0] = '\0';
    if (c->reject != MP_REJECT_NONE) mp_candidate_reason(&req->search, c, reason, sizeof reason);
    st = mp_store_add_candidate(ctx, store, *run_id, i, c, reason);
  }
  for (int64_t r = 0; r < out->n_order && st == MP_OK; r++)
    st = mp_store_set_rank(ctx, store, s->cands[out->order[r]].plan_id, r + 1);
  if (st == MP_OK) st = mp_store_set_logged(ctx, store, *run_id, req->ranked_only);
  if (st == MP_OK) {
    int64_t by[MP_REJECT_COUNT];
    mp_search_reject_counts(s, by);
    st = mp_store_add_rejections(ctx, store, *run_id, by);
  }
  if (st == MP_OK) {
    mp_run_summary sum = {s->n, s->n_pruned, s->n_evaluated, s->n_feasible,
                          out->n_order ? s->cands[out->order[0]].plan_id : 0, mp_now_s() - t0};
    st = mp_store_run_commit(ctx, store, *run_id, &sum);
  }
  if (st != MP_OK) mp_store_run_abort(store);
  return st;
}

static void on_progress(void *user, int64_t done, int64_t total) {
  (void)total;
  mp_progress_update((mp_progress *)user, done);
}

mp_status mp_planner_run(mp_ctx *ctx, const mp_planner_request *req, mp_store *store,
                         mp_planner_result *out) {
  memset(out, 0, sizeof *out);
  double t0 = mp_now_s();
  /* Check the objective before any work: a missing price is a usage error. */
  if (mp_objective_needs_price(req->objective) && !(req->price_per_gpu_hour > 0))
    return mp_error(ctx, MP_ERR_USAGE,
                    "--objective %s needs a price: pass --price USD_PER_GPU_HOUR or "
                    "use a cluster with price_per_gpu_hour", mp_objective_name(req->objective));
  mp_search *s = NULL;
  MP_CHECK(mp_search_enumerate(ctx, &req->search, &s));
  mp_status st = MP_OK;
  int64_t run_id = 0;
  mp_progress prog;
  mp_progress_begin(&prog, "planning", s->n);
  if (!req->show_progress) prog.enabled = 0;
  st = mp_search_run(ctx, &req->search, s, NULL, NULL, on_progress, &prog);
  mp_progress_end(&prog);
  if (st != MP_OK) goto fail;
  MP_CHECK_GOTO(mp_search_rank(ctx, s, req->objective, req->price_per_gpu_hour, &out->order,
                               &out->n_order), st, fail);
  if (store) MP_CHECK_GOTO(store_run(ctx, req, store, s, out, t0, &run_id), st, fail);
  out->search = s;
  out->run_id = run_id;
  out->wall_s = mp_now_s() - t0;
  return MP_OK;
fail:
  mp_search_destroy(s);
  memset(out, 0, sizeof *out);
  return st;
}

void mp_planner_result_free(mp_planner_result *r) {
  if (!r) return;
  mp_search_destroy(r->search);
  memset(r, 0, sizeof *r);
}
