/* The simulator as the planner's evaluator (see evaluate.h). */
#include "planner/evaluate.h"

#include <string.h>

mp_status mp_sim_evaluator_init(mp_ctx *ctx, mp_sim_evaluator *ev, const mp_model *m,
                                const mp_cluster *c, int64_t seq, int64_t global_batch,
                                double headroom, const char *stack_name) {
  memset(ev, 0, sizeof *ev);
  if (!(headroom >= 0 && headroom <= 0.5))
    return mp_error(ctx, MP_ERR_USAGE, "--headroom %g: use a fraction between 0 and 0.5", headroom);
  ev->model = m;
  mp_plan_options_init(&ev->base);
  ev->base.seq = seq;
  ev->base.global_batch = global_batch;
  if (stack_name)
    MP_CHECK(mp_stack_load(ctx, stack_name, &ev->stack));
  else
    MP_CHECK(mp_stack_default(ctx, &c->gpu, &ev->stack));
  ev->sim.cluster = c;
  ev->sim.stack = &ev->stack;
  ev->sim.mem_headroom = headroom;
  ev->sim.record_trace = 0;
  /* The module tree once per search: every candidate's plan copies it instead of
   * formatting ~10 FQNs per layer again (the bulk of a plan's cost for a large model). */
  MP_CHECK(mp_plan_template_create(ctx, m, &ev->tmpl));
  return MP_OK;
}

void mp_sim_evaluator_free(mp_sim_evaluator *ev) {
  if (ev == NULL) return;
  mp_plan_template_destroy(ev->tmpl);
  ev->tmpl = NULL;
}

void mp_sim_evaluator_options(const mp_sim_evaluator *ev, const mp_candidate *c,
                              mp_plan_options *o) {
  *o = ev->base;
  o->micro_batch = c->micro_batch;
  o->ac = (mp_ac_mode)c->ac;
  o->fp8 = c->fp8;
  /* DESIGN: float8 all-gather only without TP. */
  if (c->mesh.size[MP_DIM_TP] > 1) o->fp8_opts.all_gather = 0;
  o->fsdp.reshard_after_forward = c->reshard;
  o->tp.pad_vocab = c->pads_vocab;
}

mp_status mp_sim_evaluate(void *user, mp_ctx *ctx, mp_arena *scratch, const mp_candidate *c,
                          mp_sim_result *out) {
  const mp_sim_evaluator *ev = user;
  mp_plan_options o;
  mp_sim_evaluator_options(ev, c, &o);
  /* The plan is built from the shared template in the worker's scratch arena, and the
   * schedules after it there too (the search resets scratch after each candidate);
   * mp_simulate_built_plan picks the stages to simulate as mp_simulate_plan does. */
  if (ev->tmpl == NULL || scratch == NULL)
    return mp_simulate_plan(ctx, ev->model, &c->mesh, &o, &ev->sim, out);
  mp_plan *p = NULL;
  MP_CHECK(mp_build_plan_from(ctx, ev->tmpl, &c->mesh, &o, scratch, &p));
  return mp_simulate_built_plan(ctx, p, &ev->sim, scratch, out);
}

mp_status mp_sim_evaluator_trace(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                                 const char *path) {
  mp_plan_options o;
  mp_sim_evaluator_options(ev, c, &o);
  mp_plan *p = NULL;
  if (ev->tmpl)
    MP_CHECK(mp_build_plan_from(ctx, ev->tmpl, &c->mesh, &o, NULL, &p));
  else
    MP_CHECK(mp_build_plan(ctx, ev->model, &c->mesh, &o, &p));
  mp_arena *a = mp_arena_create();
  mp_schedule *s = NULL;
  mp_sim_trace *t = NULL;
  mp_sim_result r;
  mp_sim_config cfg = ev->sim;
  cfg.record_trace = 1;
  mp_status st = a ? MP_OK : mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an arena");
  if (st == MP_OK) st = mp_schedule_build(ctx, p, 0, MP_SCHEDULE_COMPACT, a, &s);
  if (st == MP_OK) st = mp_simulate(ctx, s, &cfg, &r, &t);
  if (st == MP_OK) st = mp_sim_trace_write(ctx, t, path);
  mp_sim_trace_destroy(t);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
  return st;
}

void mp_sim_evaluator_thread_done(void *user) {
  (void)user;
  mp_sim_thread_release();
}
