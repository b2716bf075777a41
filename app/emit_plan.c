/* meshplan plan --emit: the ranked plans, each as the target's file (app/emit.h).
 *
 * A candidate becomes the plan options the search simulated (mp_sim_evaluator_options) and
 * is built once more (mp_build_plan) so the file states the options the plan resolves (SP,
 * seq, global batch, the float8 recipe); the header carries the candidate's own prediction. */
#include <stdio.h>
#include <stdlib.h>

#include "app/emit.h"
#include "planner/evaluate.h"
#include "planner/search.h"

/* One ranked candidate (rank from 1) into dir/plan-<rank>.<ext>; its path into path. */
static mp_status emit_one(mp_ctx *ctx, mp_emit_target t, const mp_sim_evaluator *ev, const mp_cluster *c,
                          const mp_candidate *x, int64_t rank, const char *command, const char *dir,
                          char *path, size_t cap) {
  mp_plan_options o;
  mp_sim_evaluator_options(ev, x, &o);
  mp_plan *plan = NULL;
  MP_CHECK(mp_build_plan(ctx, ev->model, &x->mesh, &o, &plan));
  const mp_emit_plan p = {ev->model, c, &x->mesh, &plan->opts, &ev->stack, x->res.step_time_s,
                          x->res.tokens_per_s_per_gpu, x->res.peak_mem_bytes, command};
  char stem[32];
  snprintf(stem, sizeof stem, "plan-%lld", (long long)rank);
  mp_status st = mp_emit_write(ctx, t, &p, dir, stem, path, cap);
  mp_plan_destroy(plan);
  return st;
}

mp_status mp_emit_ranked(mp_ctx *ctx, mp_emit_target t, const struct mp_sim_evaluator *ev, const mp_cluster *c,
                         const struct mp_search *s, const int64_t *order, int64_t n, const char *command,
                         const char *dir, FILE *report) {
  int64_t written = 0;
  char first[1024] = ""; /* the first plan's refusal (the context's message is overwritten) */
  for (int64_t r = 0; r < n; r++) {
    char path[4096];
    mp_status st = emit_one(ctx, t, ev, c, &s->cands[order[r]], r + 1, command, dir, path, sizeof path);
    /* a plan the framework cannot express is skipped with its reason; other failures
     * (the disk, memory) end the command */
    if (st != MP_OK && st != MP_ERR_USAGE) return st;
    if (st == MP_OK) {
      written++;
      if (report) fprintf(report, "emit    plan %lld: %s\n", (long long)r + 1, path);
      continue;
    }
    if (!first[0]) snprintf(first, sizeof first, "%s", mp_errmsg(ctx));
    if (report) fprintf(report, "emit    plan %lld not emitted: %s\n", (long long)r + 1, mp_errmsg(ctx));
  }
  if (written == 0 && n > 0)
    return mp_error(ctx, MP_ERR_USAGE, "%s (none of the %lld plans shown can be written for %s)", first,
                    (long long)n, mp_emit_target_release(t));
  return MP_OK;
}
