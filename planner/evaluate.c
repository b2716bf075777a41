/* The simulator as the planner's evaluator (see evaluate.h). */
#include "planner/evaluate.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "exec/runtime/check.h"

/* Per-thread cache of the current mesh's plans (see evaluate.h). */
#define CACHE_PLANS 24
typedef struct cached_plan {
  int fp8, all_gather, pad_vocab, reshard, sp, pp_virtual; /* the options a derived plan
                                                               cannot change */
  mp_plan *base;
  mp_sim_plan_prep *prep;
} cached_plan;

typedef struct eval_cache {
  uint64_t ev_id; /* 0: empty */
  mp_mesh mesh;
  mp_arena *arena; /* the plans and preps */
  cached_plan ent[CACHE_PLANS];
  int n;
} eval_cache;

static _Thread_local eval_cache g_cache;
static atomic_uint_fast64_t g_next_id = 1;

static void cache_clear(eval_cache *ca) {
  if (ca->arena) mp_arena_reset(ca->arena);
  ca->n = 0;
  ca->ev_id = 0;
}

mp_status mp_sim_evaluator_init(mp_ctx *ctx, mp_sim_evaluator *ev, const mp_model *m,
                                const mp_cluster *c, int64_t seq, int64_t global_batch,
                                double headroom, const char *stack_name) {
  memset(ev, 0, sizeof *ev);
  ev->id = (uint64_t)atomic_fetch_add(&g_next_id, 1);
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
  /* the stack's runtime decides the memory the schedule describes (and its dtypes) */
  mp_stack_plan_options(&ev->stack, &ev->base);
  ev->sim.cluster = c;
  ev->sim.stack = &ev->stack;
  ev->sim.mem_headroom = headroom;
  ev->sim.record_trace = 0;
  ev->sim.stage_peak_bytes = NULL;
  /* The module tree once per search: every candidate's plan copies it instead of
   * formatting ~10 FQNs per layer again (the bulk of a plan's cost for a large model). */
  MP_CHECK(mp_plan_template_create(ctx, m, &ev->tmpl));
  return MP_OK;
}

void mp_sim_search_config(mp_search_config *cfg, mp_sim_evaluator *ev, const mp_cluster *c, double headroom) {
  mp_search_config_init(cfg);
  cfg->model = ev->model;
  cfg->cluster = c;
  cfg->seq = ev->base.seq;
  cfg->global_batch = ev->base.global_batch;
  cfg->mem_capacity_bytes = (int64_t)(c->gpu.mem_gib * (1.0 - headroom) * 1073741824.0);
  /* what the stack runs: its AC policies, SP where it runs it; every stack's memory model
   * (the meshplan runtimes' included) has the interleaved schedule's chunks */
  cfg->ac_mask = ev->stack.ac_policies;
  cfg->sp = ev->stack.sp && ev->base.sp != 0;
  cfg->pp_virtual_max = 4;
  cfg->pp_keeps_params = ev->stack.mem_model == MP_MEM_MODEL_TORCHTITAN; /* mp_plan_pp_fsdp */
  cfg->dp = ev->base.dp;
  cfg->ddp_shard_optimizer = ev->base.dp == MP_DP_DDP && ev->base.ddp.shard_optimizer;
  cfg->prune_dominated = 1; /* the default objective is time */
  cfg->eval = mp_sim_evaluate;
  cfg->eval_user = ev;
  cfg->eval_thread_done = mp_sim_evaluator_thread_done;
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
  if (c->global_batch > 0) o->global_batch = c->global_batch;
  o->ac = (mp_ac_mode)c->ac;
  o->ac_every = c->ac_every > 0 ? c->ac_every : 1;
  o->fp8 = c->fp8;
  /* Float8 all-gather only without TP: with TP the scales would be per shard, not per
   * tensor (docs/design.md, the sharding passes). */
  if (c->mesh.size[MP_DIM_TP] > 1) o->fp8_opts.all_gather = 0;
  o->fsdp.reshard_after_forward = c->reshard;
  o->tp.pad_vocab = c->pads_vocab;
  o->sp = c->sp;
  o->pp_virtual = c->pp_virtual > 1 ? c->pp_virtual : 1;
  /* one chunk per stage: 1F1B, or GPipe where the base asks for it (train --pp-schedule) */
  o->pp_schedule = c->pp_virtual > 1                    ? MP_PP_INTERLEAVED
                   : ev->base.pp_schedule == MP_PP_GPIPE ? MP_PP_GPIPE
                                                          : MP_PP_1F1B;
}

/* The cached plan of c's mesh for options o, built (with its prep) on a miss. */
static mp_status cached_base(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                             const mp_plan_options *o, cached_plan **out) {
  eval_cache *ca = &g_cache;
  if (ca->arena == NULL) {
    ca->arena = mp_arena_create();
    if (ca->arena == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an arena");
  }
  if (ca->ev_id != ev->id || memcmp(&ca->mesh, &c->mesh, sizeof ca->mesh) != 0) {
    cache_clear(ca);
    ca->ev_id = ev->id;
    ca->mesh = c->mesh;
  }
  for (int i = 0; i < ca->n; i++) {
    cached_plan *e = &ca->ent[i];
    if (e->fp8 == o->fp8 && e->all_gather == o->fp8_opts.all_gather &&
        e->pad_vocab == o->tp.pad_vocab && e->reshard == o->fsdp.reshard_after_forward &&
        e->sp == o->sp && e->pp_virtual == o->pp_virtual) {
      *out = e;
      return MP_OK;
    }
  }
  if (ca->n == CACHE_PLANS) { /* not reached by the search's candidates; stay correct */
    cache_clear(ca);
    ca->ev_id = ev->id;
    ca->mesh = c->mesh;
  }
  cached_plan e = {o->fp8, o->fp8_opts.all_gather, o->tp.pad_vocab,
                   o->fsdp.reshard_after_forward, o->sp, o->pp_virtual, NULL, NULL};
  MP_CHECK(mp_build_plan_from(ctx, ev->tmpl, &c->mesh, o, ca->arena, &e.base));
  MP_CHECK(mp_sim_plan_prep_create(ctx, e.base, &ev->sim, ca->arena, &e.prep));
  ca->ent[ca->n] = e;
  *out = &ca->ent[ca->n++];
  return MP_OK;
}

mp_status mp_sim_evaluate(void *user, mp_ctx *ctx, mp_arena *scratch, const mp_candidate *c,
                          mp_sim_result *out) {
  const mp_sim_evaluator *ev = user;
  mp_plan_options o;
  mp_sim_evaluator_options(ev, c, &o);
  if (ev->tmpl == NULL || scratch == NULL)
    return mp_simulate_plan(ctx, ev->model, &c->mesh, &o, &ev->sim, out);
  /* The candidate's plan is derived in the worker's scratch arena (the search resets it
   * after each candidate) from the cached plan of its mesh and float8 setting, and its
   * schedules are built there too from the cached preps. */
  cached_plan *e = NULL;
  MP_CHECK(cached_base(ctx, ev, c, &o, &e));
  mp_plan *p = NULL;
  MP_CHECK(mp_plan_derive(ctx, e->base, &o, scratch, &p));
  return mp_simulate_prepped(ctx, p, e->prep, &ev->sim, scratch, out);
}

/* The candidate's plan on its own (not derived in a worker's scratch arena): its options
 * into *o; free the plan with mp_plan_destroy. */
static mp_status candidate_plan(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                                mp_plan_options *o, mp_plan **p) {
  mp_sim_evaluator_options(ev, c, o);
  if (ev->tmpl) return mp_build_plan_from(ctx, ev->tmpl, &c->mesh, o, NULL, p);
  return mp_build_plan(ctx, ev->model, &c->mesh, o, p);
}

/* Rank 0 of the candidate simulated with its trace: writes it to path (if any) and sums
 * it into *busy (if any). */
static mp_status traced(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                        const char *path, mp_sim_busy *busy, mp_sim_result *res) {
  mp_plan_options o;
  mp_plan *p = NULL;
  MP_CHECK(candidate_plan(ctx, ev, c, &o, &p));
  mp_arena *a = mp_arena_create();
  mp_schedule *s = NULL;
  mp_sim_trace *t = NULL;
  mp_sim_result r;
  mp_sim_config cfg = ev->sim;
  cfg.record_trace = 1;
  mp_status st = a ? MP_OK : mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an arena");
  if (st == MP_OK) st = mp_schedule_build(ctx, p, 0, MP_SCHEDULE_COMPACT, a, &s);
  if (st == MP_OK) st = mp_simulate(ctx, s, &cfg, &r, &t);
  if (st == MP_OK && path) st = mp_sim_trace_write(ctx, t, path);
  if (st == MP_OK && busy) mp_sim_trace_busy(t, busy);
  if (st == MP_OK && res) *res = r;
  mp_sim_trace_destroy(t);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
  return st;
}

mp_status mp_sim_evaluator_trace(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                                 const char *path) {
  return traced(ctx, ev, c, path, NULL, NULL);
}

mp_status mp_sim_evaluator_busy(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                                mp_sim_busy *busy, mp_sim_result *res) {
  return traced(ctx, ev, c, NULL, busy, res);
}

mp_status mp_sim_evaluator_runs(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                                int *runs, char *why, size_t cap) {
  mp_plan_options o;
  mp_plan *p = NULL;
  MP_CHECK(candidate_plan(ctx, ev, c, &o, &p));
  mp_ctx check;
  mp_ctx_init(&check);
  *runs = mp_runtime_plan_check(&check, p) == MP_OK;
  snprintf(why, cap, "%s", *runs ? "" : mp_errmsg(&check));
  mp_plan_destroy(p);
  return MP_OK;
}

void mp_sim_evaluator_thread_done(void *user) {
  (void)user;
  mp_arena_destroy(g_cache.arena);
  memset(&g_cache, 0, sizeof g_cache);
  mp_sim_thread_release();
}
