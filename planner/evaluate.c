/* The simulator as the planner's evaluator (see evaluate.h). */
#include "planner/evaluate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/rules.h"
#include "exec/runtime/check.h"

/* A worker's cache of the current mesh's plans (see evaluate.h). */
#define CACHE_PLANS 24
typedef struct cached_plan {
  int fp8, all_gather, pad_vocab, sp, pp_virtual, n_pp_layers; /* the options a derived plan
                                                                   cannot change */
  mp_plan *base;
  mp_sim_plan_prep *prep;
} cached_plan;

struct mp_sim_eval_worker {
  const mp_sim_evaluator *ev;
  mp_sim_config sim;   /* ev->sim with the worker's workspace */
  mp_sim_workspace *ws;
  int have_mesh;       /* 0: the cache is empty */
  mp_mesh mesh;        /* the mesh of the cached plans */
  mp_arena *arena;     /* the cached plans and preps */
  cached_plan ent[CACHE_PLANS];
  int n;
};

/* Empties the cache and ties it to mesh m. */
static void cache_reset(mp_sim_eval_worker *w, const mp_mesh *m) {
  mp_arena_reset(w->arena);
  w->n = 0;
  w->have_mesh = 1;
  w->mesh = *m;
}

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
  /* meshplan's CUDA runtime's stack describes kernels that exist on CUDA GPUs alone */
  if (ev->stack.mem_model == MP_MEM_MODEL_MESHPLAN_CUDA)
    MP_CHECK(mp_gpu_check_cuda(ctx, &c->gpu, "meshplan's CUDA runtime (stack meshplan-cuda)"));
  /* the stack's runtime decides the memory the schedule describes (and its dtypes) */
  mp_stack_plan_options(&ev->stack, &c->gpu, &ev->base);
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

void mp_sim_evaluator_settings(const mp_sim_evaluator *ev, mp_plan_settings *out) {
  out->stack = ev->stack.name;
  out->loss_chunks = ev->base.loss_chunks > 1 ? ev->base.loss_chunks : 1;
  out->nccl_version = ev->stack.nccl_version;
  out->moe_imbalance = ev->base.moe_routing.imbalance;
  out->moe_capacity_factor = ev->base.moe_routing.capacity_factor;
  out->fp8_recipe = mp_fp8_recipe_name(mp_fp8_recipe_of(ev->base.fp8_opts.recipe, ev->base.mem_model));
  out->mtp_layers = (int)ev->model->mtp_layers;
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
  cfg->pp_split = ev->stack.mem_model == MP_MEM_MODEL_MEGATRON && ev->base.n_pp_layers == 0;
  cfg->dp = ev->base.dp;
  cfg->ddp_shard_optimizer = ev->base.dp == MP_DP_DDP && ev->base.ddp.shard_optimizer;
  cfg->ep_only = mp_moe_dispatch_by_node(ev->base.moe_dispatcher);
  cfg->fp8_param_gather = ev->base.fp8_opts.param_gather;
  /* the recipe float8 candidates run (its tile multiple decides which Linears cast) */
  cfg->fp8_recipe = mp_fp8_recipe_of(ev->base.fp8_opts.recipe, ev->stack.mem_model);
  cfg->prune_dominated = 1; /* the default objective is time */
  cfg->eval = mp_sim_evaluate;
  cfg->eval_user = ev;
  cfg->eval_thread_init = mp_sim_evaluator_thread_init;
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
  /* the stated imbalance, at most what the candidate's ep ranks can hold */
  const double f_max = mp_rule_moe_imbalance_max(ev->model, c->mesh.ep);
  if (o->moe_routing.imbalance > f_max) o->moe_routing.imbalance = f_max;
  /* Float8 all-gather only without TP: with TP the scales would be per shard, not per
   * tensor (docs/design.md, the sharding passes). */
  if (c->mesh.size[MP_DIM_TP] > 1) o->fp8_opts.all_gather = 0;
  o->fsdp.reshard_after_forward = c->reshard;
  o->tp.pad_vocab = c->pads_vocab;
  o->sp = c->sp;
  o->pp_virtual = c->pp_virtual > 1 ? c->pp_virtual : 1;
  if (c->pp_split)
    mp_pp_layout_embedding_loss(ev->model->n_layers, c->mesh.size[MP_DIM_PP], o->pp_virtual, o);
  /* one chunk per stage: 1F1B, or GPipe where the base asks for it (train --pp-schedule) */
  o->pp_schedule = c->pp_virtual > 1                    ? MP_PP_INTERLEAVED
                   : ev->base.pp_schedule == MP_PP_GPIPE ? MP_PP_GPIPE
                                                          : MP_PP_1F1B;
}

mp_status mp_sim_evaluator_thread_init(void *user, mp_ctx *ctx, void **worker) {
  *worker = NULL;
  mp_sim_eval_worker *w = (mp_sim_eval_worker *)calloc(1, sizeof *w);
  if (w == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating a search worker");
  w->ev = (const mp_sim_evaluator *)user;
  w->arena = mp_arena_create();
  mp_status st = w->arena ? mp_sim_workspace_create(ctx, &w->ws)
                          : mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an arena");
  if (st != MP_OK) {
    mp_sim_evaluator_thread_done(w);
    return st;
  }
  w->sim = w->ev->sim;
  w->sim.ws = w->ws;
  *worker = w;
  return MP_OK;
}

void mp_sim_evaluator_thread_done(void *worker) {
  mp_sim_eval_worker *w = (mp_sim_eval_worker *)worker;
  if (w == NULL) return;
  mp_sim_workspace_destroy(w->ws);
  mp_arena_destroy(w->arena);
  free(w);
}

/* The cached plan of c's mesh for options o, built (with its prep) on a miss. */
static mp_status cached_base(mp_ctx *ctx, mp_sim_eval_worker *w, const mp_candidate *c,
                             const mp_plan_options *o, cached_plan **out) {
  if (!w->have_mesh || memcmp(&w->mesh, &c->mesh, sizeof w->mesh) != 0) cache_reset(w, &c->mesh);
  for (int i = 0; i < w->n; i++) {
    cached_plan *e = &w->ent[i];
    if (e->fp8 == o->fp8 && e->all_gather == o->fp8_opts.all_gather &&
        e->pad_vocab == o->tp.pad_vocab &&
        e->sp == o->sp && e->pp_virtual == o->pp_virtual && e->n_pp_layers == o->n_pp_layers) {
      *out = e;
      return MP_OK;
    }
  }
  /* not reached by the search's candidates; stay correct */
  if (w->n == CACHE_PLANS) cache_reset(w, &c->mesh);
  cached_plan e = {o->fp8, o->fp8_opts.all_gather, o->tp.pad_vocab, o->sp, o->pp_virtual, o->n_pp_layers,
                   NULL, NULL};
  MP_CHECK(mp_build_plan_from(ctx, w->ev->tmpl, &c->mesh, o, w->arena, &e.base));
  MP_CHECK(mp_sim_plan_prep_create(ctx, e.base, &w->sim, w->arena, &e.prep));
  w->ent[w->n] = e;
  *out = &w->ent[w->n++];
  return MP_OK;
}

mp_status mp_sim_evaluate(void *user, mp_ctx *ctx, mp_arena *scratch, const mp_candidate *c,
                          mp_sim_result *out) {
  mp_sim_eval_worker *w = user;
  const mp_sim_evaluator *ev = w->ev;
  mp_plan_options o;
  mp_sim_evaluator_options(ev, c, &o);
  w->sim.step_bound_s = c->step_bound_s;
  if (ev->tmpl == NULL || scratch == NULL)
    return mp_simulate_plan(ctx, ev->model, &c->mesh, &o, &w->sim, out);
  /* The candidate's plan is derived in the worker's scratch arena (the search resets it
   * after each candidate) from the cached plan of its mesh and float8 setting, and its
   * schedules are built there too from the cached preps. */
  cached_plan *e = NULL;
  MP_CHECK(cached_base(ctx, w, c, &o, &e));
  mp_plan *p = NULL;
  MP_CHECK(mp_plan_derive(ctx, e->base, &o, scratch, &p));
  return mp_simulate_prepped(ctx, p, e->prep, &w->sim, scratch, out);
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
  const mp_gpu *g = &ev->sim.cluster->gpu;
  if (!mp_gpu_runtime_drives(g)) {
    *runs = 0;
    snprintf(why, cap, "GPU %s has no CUDA (%s): meshplan's runtime drives CUDA GPUs and CPUs", g->name,
             mp_gpu_api_name(mp_gpu_api_of(g)));
    return MP_OK;
  }
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
