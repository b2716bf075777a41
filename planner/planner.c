/* One planner run (see planner.h). The store transaction opens before the first candidate
 * is written and commits after the ranks, so a failure anywhere leaves no partial run. */
#include "planner/planner.h"

#include <string.h>

#include "common/progress.h"
#include "common/timeutil.h"

typedef struct sink_state {
  const mp_search_config *cfg;
  mp_store *store;
  int64_t run_id;
} sink_state;

static mp_status sink_store(void *user, mp_ctx *ctx, int64_t index, mp_candidate *c) {
  sink_state *ss = user;
  char reason[512];
  reason[0] = 0;
  if (c->reject != MP_REJECT_NONE) mp_candidate_reason(ss->cfg, c, reason, sizeof reason);
  return mp_store_add_candidate(ctx, ss->store, ss->run_id, index, c, reason);
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
  if (req->objective == MP_OBJECTIVE_TOKENS_PER_DOLLAR && !(req->price_per_gpu_hour > 0))
    return mp_error(ctx, MP_ERR_USAGE,
                    "--objective tokens-per-dollar needs a price: pass --price USD_PER_GPU_HOUR or "
                    "use a cluster with price_per_gpu_hour");
  mp_search *s = NULL;
  MP_CHECK(mp_search_enumerate(ctx, &req->search, &s));
  mp_status st = MP_OK;
  sink_state ss = {&req->search, store, 0};
  if (store) MP_CHECK_GOTO(mp_store_run_begin(ctx, store, &req->info, &ss.run_id), st, fail);
  mp_progress prog;
  mp_progress_begin(&prog, "planning", s->n);
  if (!req->show_progress) prog.enabled = 0;
  st = mp_search_run(ctx, &req->search, s, store ? sink_store : NULL, &ss, on_progress, &prog);
  mp_progress_end(&prog);
  if (st != MP_OK) goto fail;
  MP_CHECK_GOTO(mp_search_rank(ctx, s, req->objective, req->price_per_gpu_hour, &out->order,
                               &out->n_order), st, fail);
  if (store) {
    for (int64_t r = 0; r < out->n_order; r++)
      MP_CHECK_GOTO(mp_store_set_rank(ctx, store, s->cands[out->order[r]].plan_id, r + 1), st, fail);
    mp_run_summary sum = {s->n, s->n_pruned, s->n_evaluated, s->n_feasible,
                          out->n_order ? s->cands[out->order[0]].plan_id : 0, mp_now_s() - t0};
    MP_CHECK_GOTO(mp_store_run_commit(ctx, store, ss.run_id, &sum), st, fail);
  }
  out->search = s;
  out->run_id = ss.run_id;
  out->wall_s = mp_now_s() - t0;
  return MP_OK;
fail:
  if (store) mp_store_run_abort(store);
  mp_search_destroy(s);
  memset(out, 0, sizeof *out);
  return st;
}

void mp_planner_result_free(mp_planner_result *r) {
  if (!r) return;
  mp_search_destroy(r->search);
  memset(r, 0, sizeof *r);
}
