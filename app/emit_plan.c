/* meshplan plan --emit: the ranked plans, each as the target's file (app/emit.h).
 *
 * A candidate becomes the plan options the search simulated (mp_sim_evaluator_options) and
 * is built once more (mp_build_plan) so the file states the options the plan resolves (SP,
 * seq, global batch, the float8 recipe); the header carries the candidate's own prediction. */
#include <stdio.h>
#include <stdlib.h>

#include "app/emit.h"
#include "app/emit_internal.h"
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
  /* refusals before the first plan written wait here: when none is written the command
   * fails with one line, the first refusal */
  mp_emit_buf pending = {NULL, 0, 0, 0};
  mp_status st = MP_OK;
  for (int64_t r = 0; r < n && (st == MP_OK || st == MP_ERR_USAGE); r++) {
    char path[4096];
    st = emit_one(ctx, t, ev, c, &s->cands[order[r]], r + 1, command, dir, path, sizeof path);
    if (st == MP_OK) {
      if (report && pending.s) fputs(pending.s, report);
      pending.n = 0;
      if (pending.s) pending.s[0] = '\0';
      if (report) fprintf(report, "emit    plan %lld: %s\n", (long long)r + 1, path);
      written++;
    } else if (st == MP_ERR_USAGE) { /* a plan the framework cannot express: skipped */
      if (!first[0]) snprintf(first, sizeof first, "%s", mp_errmsg(ctx));
      if (written) {
        if (report) fprintf(report, "emit    plan %lld not emitted: %s\n", (long long)r + 1, mp_errmsg(ctx));
      } else {
        mp_emit_printf(&pending, "emit    plan %lld not emitted: %s\n", (long long)r + 1, mp_errmsg(ctx));
      }
    }
  }
  free(pending.s);
  if (st != MP_OK && st != MP_ERR_USAGE) return st; /* the disk, memory: the command fails */
  if (written == 0 && n > 0)
    return mp_error(ctx, MP_ERR_USAGE, "%s (none of the %lld plans shown can be written for %s)", first,
                    (long long)n, mp_emit_target_release(t));
  return MP_OK;
}
