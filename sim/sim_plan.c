/* mp_simulate_plan: plan -> compact schedule(s) -> simulation, in one call.
 *
 * Without pipeline parallelism rank 0 stands for every rank (ranks of one plan differ
 * only in which shard they hold; the last FSDP ranks may hold a little less, never more).
 * With pp > 1 the first rank of every stage stands for its stage: each stage's schedule is
 * simulated on its own (mp_sim_stage_run) and the pipeline timeline runs all of them
 * (mp_sim_pipeline_result): time figures from the slowest stage, memory from the fullest.
 *
 * Distinct stages only (the planner's hot path). Stage 0 (embedding) and the last stage
 * (norm, head, loss) are simulated on their own. Two middle stages whose blocks match
 * (same layer counts per chunk, same MoE pattern, block parameters alike in shape,
 * placement, float8 and FSDP unit layout) build the same schedule but for the stage index,
 * so their stage runs agree to the bit: only the earliest of such a class is simulated and
 * stands for the others in the timeline (each stage still walks its own pipeline order).
 * That also needs every stage's rank (stage x world/pp, the pp dim is outermost) to see the
 * same links: true when world/pp is a multiple or a divisor of the NVLink domain (the node,
 * or mp_cluster_nvlink_domain's ranks; the group is then the stage-0 group moved by whole
 * domains, or each stage stays inside one);
 * otherwise every stage is simulated. mp_simulate_built_plan_all_stages is the reference
 * the tests compare against.
 *
 * Schedules are built in the workspace's arena, reset (not freed) between stages, or in
 * the caller's scratch arena (never reset here: it may hold the caller's plan). The stage
 * grouping and the stage runs live in the workspace's buffers (sim/workspace.h). */
#include <stdlib.h>
#include <string.h>

#include "sim/sim.h"
#include "sim/sim_internal.h"
#include "sim/workspace.h"

/* The stage run of `stage`'s first rank, its compact schedule built in arena. */
static mp_status sim_stage(mp_ctx *ctx, const mp_plan *p, int stage, const mp_sim_config *cfg,
                           mp_arena *arena, int reset, mp_sim_stage *r) {
  int coords[MP_MESH_NDIMS] = {0};
  coords[MP_DIM_PP] = stage;
  int rank = mp_mesh_rank_of(&p->mesh, coords);
  if (reset) mp_arena_reset(arena);
  mp_schedule *s = NULL;
  MP_CHECK(mp_schedule_build(ctx, p, rank, MP_SCHEDULE_COMPACT, arena, &s));
  return mp_sim_stage_run(ctx, s, cfg, NULL, r, NULL);
}

/* The layers of a stage's chunk, as the schedule assigns them (mp_plan_chunk_layers). */
static void chunk_layers(const mp_plan *p, int stage, int chunk, int *l0, int *l1) {
  int64_t a, b;
  mp_plan_chunk_layers(p, stage, chunk, &a, &b);
  *l0 = (int)a;
  *l1 = (int)b;
}

static int param_alike(const mp_param *a, const mp_param *b, int la0, int lb0, int ua0, int ub0) {
  if (a->layer - la0 != b->layer - lb0 || a->module != b->module || a->role != b->role ||
      a->ndim != b->ndim || a->is_linear != b->is_linear || a->is_expert != b->is_expert ||
      a->float8 != b->float8 || a->fsdp_group != b->fsdp_group || a->tp_style != b->tp_style)
    return 0;
  if ((a->fsdp_unit < 0) != (b->fsdp_unit < 0)) return 0;
  if (a->fsdp_unit >= 0 && a->fsdp_unit - ua0 != b->fsdp_unit - ub0) return 0;
  if (memcmp(a->tp_shape, b->tp_shape, sizeof a->tp_shape) != 0 ||
      memcmp(a->shape, b->shape, sizeof a->shape) != 0 ||
      memcmp(a->place, b->place, sizeof a->place) != 0)
    return 0;
  return 1;
}

/* Middle stages a and b build the same schedule but for the stage index (start, idx: the
 * block parameters grouped by stage, pick_stages). */
static int stages_alike(const mp_plan *p, const int *start, const int *idx, int a, int b) {
  const int v = mp_plan_virtual_stages(p);
  int la0 = 0, lb0 = 0;
  for (int c = 0; c < v; c++) {
    int a0, a1, b0, b1;
    chunk_layers(p, a, c, &a0, &a1);
    chunk_layers(p, b, c, &b0, &b1);
    if (c == 0) la0 = a0, lb0 = b0;
    if (a1 - a0 != b1 - b0) return 0;
    for (int i = 0; i < a1 - a0; i++)
      if (mp_model_layer_is_moe(&p->model, a0 + i) != mp_model_layer_is_moe(&p->model, b0 + i) ||
          mp_model_layer_kind(&p->model, a0 + i) != mp_model_layer_kind(&p->model, b0 + i))
        return 0;
  }
  int na = start[a + 1] - start[a], nb = start[b + 1] - start[b];
  if (na != nb) return 0;
  if (na == 0) return 1;
  const mp_param *pa0 = &p->params[idx[start[a]]], *pb0 = &p->params[idx[start[b]]];
  for (int i = 0; i < na; i++)
    if (!param_alike(&p->params[idx[start[a] + i]], &p->params[idx[start[b] + i]], la0, lb0,
                     pa0->fsdp_unit, pb0->fsdp_unit))
      return 0;
  return 1;
}

/* Which stages to simulate, in increasing order: *n_out of them into sel (capacity pp); and
 * for every stage k the index rep[k] into sel of the stage that stands for it. The stage
 * grouping goes to the workspace's stage_buf, which buf_room has sized. */
static mp_status pick_stages(const mp_plan *p, const mp_sim_config *cfg, int *sel, int *rep,
                             int *n_out) {
  const int pp = p->mesh.size[MP_DIM_PP];
  int n = 0;
  int world = mp_mesh_world(&p->mesh), S = world / pp;
  int gpn = mp_cluster_nvlink_domain(cfg->cluster);
  int links_alike = S % gpn == 0 || gpn % S == 0;
  if (pp <= 3 || !links_alike) {
    for (int k = 0; k < pp; k++) rep[k] = n, sel[n++] = k;
    *n_out = n;
    return MP_OK;
  }
  /* counting sort of the block parameters by stage */
  int *start = cfg->ws->stage_buf, *idx = start + pp + 2;
  memset(start, 0, ((size_t)pp + 2) * sizeof *start);
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *q = &p->params[i];
    if (q->layer >= 0 && q->pp_stage >= 0 && q->pp_stage < pp) start[q->pp_stage + 2]++;
  }
  for (int k = 0; k < pp; k++) start[k + 2] += start[k + 1];
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *q = &p->params[i];
    if (q->layer >= 0 && q->pp_stage >= 0 && q->pp_stage < pp) idx[start[q->pp_stage + 1]++] = i;
  }
  /* from here start[k] .. start[k + 1] are stage k's block parameters, in parameter order */
  rep[0] = n;
  sel[n++] = 0;
  int first_mid = n;
  for (int k = 1; k < pp - 1; k++) {
    int dup = -1;
    for (int j = first_mid; j < n && dup < 0; j++)
      if (stages_alike(p, start, idx, sel[j], k)) dup = j;
    if (dup < 0) dup = n, sel[n++] = k;
    rep[k] = dup;
  }
  rep[pp - 1] = n;
  sel[n++] = pp - 1;
  *n_out = n;
  return MP_OK;
}

/* Room in ws for the stage runs of up to n stages, and for pp stage pointers. */
static mp_status stage_room(mp_ctx *ctx, mp_sim_workspace *ws, size_t n, size_t pp) {
  if (!mp_sim_grow((void **)&ws->stages, &ws->stages_cap, n, sizeof *ws->stages))
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory simulating %zu stages", n);
  if (!mp_sim_grow((void **)&ws->stage_of, &ws->stage_of_cap, pp, sizeof *ws->stage_of))
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory simulating %zu stages", pp);
  return MP_OK;
}

/* The plan's result from the stage runs ws->stages[0 .. n) standing for the stages by rep. */
static mp_status finish_plan(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                             const int *rep, mp_sim_result *out) {
  const int pp = p->mesh.size[MP_DIM_PP] > 0 ? p->mesh.size[MP_DIM_PP] : 1;
  mp_sim_workspace *ws = cfg->ws;
  for (int k = 0; k < pp; k++) ws->stage_of[k] = &ws->stages[rep[k]];
  return mp_sim_pipeline_result(ctx, p, cfg, ws->stage_of, -1, out);
}

/* ws->stage_buf with room for the stage grouping of p: the offsets and parameter indices,
 * the selected stages, and rep. */
static mp_status buf_room(mp_ctx *ctx, mp_sim_workspace *ws, const mp_plan *p, int **sel,
                          int **rep) {
  const int pp = p->mesh.size[MP_DIM_PP] > 0 ? p->mesh.size[MP_DIM_PP] : 1;
  size_t need = (size_t)p->n_params + 3 * (size_t)pp + 2;
  if (!mp_sim_grow((void **)&ws->stage_buf, &ws->stage_buf_cap, need, sizeof *ws->stage_buf))
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory grouping pipeline stages");
  *sel = ws->stage_buf + (size_t)p->n_params + (size_t)pp + 2;
  *rep = *sel + pp;
  return MP_OK;
}

/* scratch, or the workspace's arena (created on first use) when scratch is NULL. */
static mp_status schedule_arena(mp_ctx *ctx, mp_sim_workspace *ws, mp_arena *scratch,
                                mp_arena **out) {
  if (scratch == NULL && ws->arena == NULL) {
    ws->arena = mp_arena_create();
    if (ws->arena == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an arena");
  }
  *out = scratch ? scratch : ws->arena;
  return MP_OK;
}

/* simulate_built in cfg->ws. */
mp_status mp_sim_fp8_recipe_check(mp_ctx *ctx, const mp_gpu *g, mp_fp8_recipe r) {
  if ((!mp_gpu_has_float8(g) && r != MP_FP8_NVFP4) || mp_gpu_is_cpu(g)) return MP_OK;
  if (r == MP_FP8_NVFP4 && g->compute_capability >= 100 && !(g->fp4_tflops > 0 && g->kernel_eff.fp4_gemm > 0))
    return mp_error(ctx, MP_ERR_INVALID,
                    "float8 recipe nvfp4: the GPU profile %s states no FP4 peak and NVFP4 GEMM efficiency "
                    "(peak_tflops.fp4, kernel_eff.fp4_gemm); add them from its datasheet, or choose mxfp8",
                    g->name);
  const int need = r == MP_FP8_MXFP8 || r == MP_FP8_NVFP4 ? 100 : r == MP_FP8_BLOCKWISE ? 90 : 0;
  if (g->compute_capability >= need) return MP_OK;
  return mp_error(ctx, MP_ERR_INVALID,
                  "float8 recipe %s needs %s (compute capability %d.%d or later); %s is %d.%d: "
                  "choose tensorwise or delayed there",
                  mp_fp8_recipe_name(r),
                  r == MP_FP8_NVFP4   ? "Blackwell's FP4 tensor cores"
                  : r == MP_FP8_MXFP8 ? "Blackwell's block-scaled tensor cores"
                                      : "Hopper's float8 tensor cores",
                  need / 10, need % 10, g->name, g->compute_capability / 10, g->compute_capability % 10);
}

/* A float8 plan's recipe on the cluster's GPU (mp_sim_fp8_recipe_check); under Transformer
 * Engine (the megatron memory model) the plan's float8 layouts must be the GPU's
 * (mp_fp8_gemm_any_layout: its schedule writes transposed copies or none). */
static mp_status plan_recipe_check(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg) {
  if (!(p->applied & MP_PASS_FLOAT8)) return MP_OK;
  const mp_gpu *g = &cfg->cluster->gpu;
  const int cc = p->opts.fp8_opts.gpu_cc;
  if (p->opts.mem_model == MP_MEM_MODEL_MEGATRON &&
      mp_fp8_gemm_any_layout(cc) != mp_fp8_gemm_any_layout(g->compute_capability))
    return mp_error(ctx, MP_ERR_INVALID,
                    "the plan's float8 GEMMs were laid out for compute capability %d.%d but %s is "
                    "%d.%d: build the plan's options with mp_stack_plan_options on this cluster's GPU",
                    cc / 10, cc % 10, g->name, g->compute_capability / 10, g->compute_capability % 10);
  return mp_sim_fp8_recipe_check(ctx, g, p->opts.fp8_opts.recipe);
}

/* The flex dispatcher's expert-TP copies are priced with one expert's etp ranks inside one
 * NVLink domain (mp_sim_ep_shares_etp: one network copy a remote node); an etp spanning
 * domains would send the copies over the NICs as well, which that price leaves out. */
static mp_status flex_etp_check(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg) {
  const int etp = p->mesh.etp, domain = mp_cluster_nvlink_domain(cfg->cluster);
  if (etp <= 1 || p->mesh.ep <= 1 || !mp_moe_dispatch_by_node(p->opts.moe_dispatcher) || etp <= domain)
    return MP_OK;
  return mp_error(ctx, MP_ERR_UNSUPPORTED,
                  "etp=%d with the DeepEP/HybridEP dispatcher spans NVLink domains of %d GPUs: the flex "
                  "dispatcher's copies to an expert's etp ranks are modelled inside one domain; choose "
                  "etp <= %d or the all-to-all dispatcher", etp, domain, domain);
}

/* What the plan asks of the cluster it is simulated on, checked once for simulate and the
 * search's prepared plans alike: the float8 recipe (plan_recipe_check) and the flex
 * dispatcher's expert-TP copies inside an NVLink domain (flex_etp_check). */
static mp_status plan_cluster_check(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg) {
  MP_CHECK(plan_recipe_check(ctx, p, cfg));
  return flex_etp_check(ctx, p, cfg);
}

static mp_status simulate_built_in(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                   mp_arena *scratch, int all, mp_sim_result *out) {
  MP_CHECK(plan_cluster_check(ctx, p, cfg));
  mp_sim_workspace *ws = cfg->ws;
  const int reset = scratch == NULL;
  MP_CHECK(schedule_arena(ctx, ws, scratch, &scratch));
  const int pp = p->mesh.size[MP_DIM_PP] > 0 ? p->mesh.size[MP_DIM_PP] : 1;
  int *sel = NULL, *rep = NULL;
  MP_CHECK(buf_room(ctx, ws, p, &sel, &rep));
  int n = 0;
  mp_status st = MP_OK;
  if (all) {
    for (int k = 0; k < pp; k++) rep[k] = n, sel[n++] = k;
  } else {
    MP_CHECK_GOTO(pick_stages(p, cfg, sel, rep, &n), st, done);
  }
  MP_CHECK_GOTO(stage_room(ctx, ws, (size_t)n, (size_t)pp), st, done);
  for (int i = 0; i < n; i++)
    MP_CHECK_GOTO(sim_stage(ctx, p, sel[i], cfg, scratch, reset, &ws->stages[i]), st, done);
  st = finish_plan(ctx, p, cfg, rep, out);
done:
  if (reset) mp_arena_reset(scratch);
  return st;
}

static mp_status simulate_built(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                mp_arena *scratch, int all, mp_sim_result *out) {
  if (p == NULL || cfg == NULL || cfg->cluster == NULL || out == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "mp_simulate_built_plan needs a plan, a config with a "
                                         "cluster and an output");
  mp_sim_config local;
  const mp_sim_config *use = NULL;
  MP_CHECK(mp_sim_ws_begin(ctx, cfg, &local, &use));
  const mp_status st = simulate_built_in(ctx, p, use, scratch, all, out);
  mp_sim_ws_end(use, cfg);
  return st;
}

/* ---- prepared plans (the planner's hot path) ----------------------------------------- */

struct mp_sim_plan_prep {
  const mp_cluster *cluster; /* pick_stages read its gpus_per_node */
  const mp_plan *plan;       /* the plan the prep was made from (the caller keeps it) */
  mp_arena *arena;           /* where the stages' preps are made */
  int n_sel;
  int *sel;                  /* stages to simulate, increasing */
  int *rep;                  /* per stage: the index into sel of the stage standing for it */
  mp_schedule_prep **sched;  /* per selected stage: its first rank's schedule prep (NULL
                                until its first simulation, stage_prep) */
  mp_sim_link (*links)[MP_GROUP_COUNT]; /* per selected stage: every group's link, with it */
};

/* Selected stage i's schedule prep and links, made on its first simulation: under
 * memory_first a stage over capacity ends a plan's simulation before the later stages,
 * and most of the search's plans with pp > 1 are over capacity at stage 0, so their other
 * stages' preps would be made for nothing. Made from the prep's own plan, in its arena: the
 * same prep, whichever derived plan asks first. */
static mp_status stage_prep(mp_ctx *ctx, mp_sim_plan_prep *pr, int i) {
  if (pr->sched[i] != NULL) return MP_OK;
  const mp_plan *p = pr->plan;
  int coords[MP_MESH_NDIMS] = {0};
  coords[MP_DIM_PP] = pr->sel[i];
  const int rank = mp_mesh_rank_of(&p->mesh, coords);
  mp_schedule_prep *sp = NULL;
  MP_CHECK(mp_schedule_prep_create(ctx, p, rank, MP_SCHEDULE_COMPACT, pr->arena, &sp));
  for (int g = 0; g < MP_GROUP_COUNT; g++)
    MP_CHECK(mp_sim_group_link(ctx, pr->cluster, &p->mesh, (mp_group)g, rank, &pr->links[i][g]));
  pr->sched[i] = sp;
  return MP_OK;
}

/* mp_sim_plan_prep_create in cfg->ws (its stage grouping). */
static mp_status prep_create_in(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                mp_arena *arena, mp_sim_plan_prep **out) {
  MP_CHECK(plan_cluster_check(ctx, p, cfg));
  const int pp = p->mesh.size[MP_DIM_PP] > 0 ? p->mesh.size[MP_DIM_PP] : 1;
  int *sel = NULL, *rep = NULL;
  MP_CHECK(buf_room(ctx, cfg->ws, p, &sel, &rep));
  int n = 0;
  MP_CHECK(pick_stages(p, cfg, sel, rep, &n));
  mp_sim_plan_prep *pr = mp_arena_alloc(arena, sizeof *pr);
  int *keep = mp_arena_alloc_raw(arena, sizeof(int) * (size_t)(n + pp));
  mp_schedule_prep **sp = mp_arena_alloc(arena, sizeof(*sp) * (size_t)n);
  mp_sim_link (*links)[MP_GROUP_COUNT] = mp_arena_alloc(arena, sizeof(*links) * (size_t)n);
  if (pr == NULL || keep == NULL || sp == NULL || links == NULL)
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory preparing a plan for the simulator");
  memcpy(keep, sel, sizeof(int) * (size_t)n);
  memcpy(keep + n, rep, sizeof(int) * (size_t)pp);
  for (int i = 0; i < n; i++) sp[i] = NULL; /* made on first use (stage_prep) */
  pr->cluster = cfg->cluster;
  pr->plan = p;
  pr->arena = arena;
  pr->n_sel = n;
  pr->sel = keep;
  pr->rep = keep + n;
  pr->sched = sp;
  pr->links = links;
  *out = pr;
  return MP_OK;
}

mp_status mp_sim_plan_prep_create(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                  mp_arena *arena, mp_sim_plan_prep **out) {
  *out = NULL;
  if (p == NULL || cfg == NULL || cfg->cluster == NULL || arena == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "mp_sim_plan_prep_create needs a plan, a config with a "
                                         "cluster and an arena");
  mp_sim_config local;
  const mp_sim_config *use = NULL;
  MP_CHECK(mp_sim_ws_begin(ctx, cfg, &local, &use));
  const mp_status st = prep_create_in(ctx, p, use, arena, out);
  mp_sim_ws_end(use, cfg);
  return st;
}

/* Selected stage i's schedule, built in arena from its prep (made on first use). */
static mp_status stage_schedule(mp_ctx *ctx, const mp_plan *p, mp_sim_plan_prep *prep, int i,
                                mp_arena *arena, mp_schedule **s) {
  MP_CHECK(stage_prep(ctx, prep, i));
  return mp_schedule_build_prepped(ctx, p, prep->sched[i], arena, s);
}

/* Selected stage i judged by its memory alone (mp_sim_stage_memory_pass: the stage run's
 * verdict and peak): *over, and out as mp_sim_stage_memory_over gives it. */
static mp_status memory_verdict(mp_ctx *ctx, const mp_plan *p, const mp_sim_plan_prep *prep, int i,
                                const mp_schedule *s, const mp_sim_config *cfg, int *over,
                                mp_sim_result *out) {
  MP_CHECK(mp_sim_stage_memory_pass(ctx, s, cfg, &cfg->ws->stages[i]));
  return mp_sim_stage_memory_over(ctx, p, cfg, &cfg->ws->stages[i], prep->sel[i], over, out);
}

double mp_sim_times_step_lb_s(const mp_pp_stage_times *t, int v, int64_t n_micro) {
  double busy = 0.0;
  for (int c = 0; c < v && c < MP_PP_MAX_VIRTUAL; c++)
    busy += t->f[c] + t->b[c] - (t->fb_save[c] > 0.0 ? t->fb_save[c] : 0.0);
  return (double)n_micro * busy;
}

double mp_sim_stage_step_lb_s(const mp_sim_stage *x, int v) {
  return mp_sim_times_step_lb_s(&x->t, v, x->n_micro);
}

/* What a stage run may stop past (mp_sim_stage_run_until): cfg->step_bound_s where the
 * step is bounded (pp > 1, not DualPipe), else 0. */
static double step_stop_s(const mp_plan *p, const mp_sim_config *cfg) {
  if (!(cfg->step_bound_s > 0.0) || p->mesh.size[MP_DIM_PP] <= 1 ||
      p->opts.pp_schedule == MP_PP_DUALPIPE)
    return 0.0;
  return cfg->step_bound_s;
}

/* cfg->step_bound_s after selected stage i's run: 1 (out bounded, its lower bound kept)
 * when the stage's lower bound of the step exceeds the bound. */
static int step_bounded(const mp_plan *p, const mp_sim_config *cfg, const mp_sim_stage *x,
                        mp_sim_result *out) {
  if (step_stop_s(p, cfg) <= 0.0) return 0;
  const double lb = mp_sim_stage_step_lb_s(x, mp_plan_virtual_stages(p));
  if (!(lb > cfg->step_bound_s)) return 0;
  memset(out, 0, sizeof *out);
  out->bounded = 1;
  out->step_lb_s = lb;
  return 1;
}

/* One run of mp_simulate_prepped over the selected stages: what one stage's step hands the
 * next. */
typedef struct {
  mp_arena *scratch;  /* where the stages' schedules are built */
  int reset;          /* scratch is the workspace's arena, reset before each stage */
  int gate;           /* cfg->memory_first applies (memory_gate) */
  mp_schedule *last;  /* the last stage's schedule when mtp_precheck built it, else NULL */
  int over;           /* a stage is over capacity: out holds the plan's verdict */
  int bounded;        /* a stage's lower bound passed cfg->step_bound_s: out holds it */
} prepped_run;

/* Whether cfg->memory_first may end the plan at a stage over capacity. The selected stages
 * are the first of their classes (pick_stages), each reckoned as mp_sim_pipeline_result
 * reckons it, so one over capacity is the plan's verdict. Not when the caller wants every
 * stage's peak (stage_peak_bytes), nor under DualPipe, whose ranks hold two stages (one
 * selected stage's memory is not a rank's). */
static int memory_gate(const mp_plan *p, const mp_sim_config *cfg, int pp) {
  return cfg->memory_first && cfg->stage_peak_bytes == NULL &&
         !(pp > 1 && p->opts.pp_schedule == MP_PP_DUALPIPE);
}

/* Selected stage i's schedule in run->scratch (reset first when it is the workspace's
 * arena); the last stage's is the one mtp_precheck built, when it built one. */
static mp_status run_schedule(mp_ctx *ctx, const mp_plan *p, mp_sim_plan_prep *prep,
                              prepped_run *run, int i, mp_schedule **s) {
  if (run->reset) mp_arena_reset(run->scratch);
  *s = i == prep->n_sel - 1 && run->last ? run->last : NULL;
  if (*s != NULL) return MP_OK;
  return stage_schedule(ctx, p, prep, i, run->scratch, s);
}

/* With multi-token prediction, the last stage judged by its memory alone after stage 0
 * fits: it holds the MTP modules (DeepSeek-V3 sec. 2.2: a block, and the head and its loss
 * again) on top of the head and the loss, which puts it over where stage 0 fits often
 * enough that the pass saves the middle stages' runs; without MTP it is seldom over first,
 * and the pass would cost the plans that fit more than it saves. Its schedule is built
 * once, kept in the caller's scratch (run->last) for its stage run, so not where the arena
 * is reset between stages. */
static mp_status mtp_precheck(mp_ctx *ctx, const mp_plan *p, mp_sim_plan_prep *prep,
                              const mp_sim_config *cfg, prepped_run *run, mp_sim_result *out) {
  const int n = prep->n_sel;
  if (n <= 1 || run->reset || p->model.mtp_layers <= 0) return MP_OK;
  MP_CHECK(stage_schedule(ctx, p, prep, n - 1, run->scratch, &run->last));
  return memory_verdict(ctx, p, prep, n - 1, run->last, cfg, &run->over, out);
}

/* Before stage 0's time run under the memory gate: stage 0 (without pipeline parallelism
 * the plan's one stage), which holds the most micro-batches in flight, judged by its memory
 * alone (memory_verdict), then the MTP stage (mtp_precheck). Most of the search's plans
 * over capacity are over at stage 0, and need no time run. The other stages are judged by
 * their stage runs (run_stage): a memory pass before each would cost the plans that fit
 * more than it saves. */
static mp_status memory_precheck(mp_ctx *ctx, const mp_plan *p, mp_sim_plan_prep *prep,
                                 const mp_sim_config *cfg, prepped_run *run, const mp_schedule *s,
                                 mp_sim_result *out) {
  MP_CHECK(memory_verdict(ctx, p, prep, 0, s, cfg, &run->over, out));
  if (run->over) return MP_OK;
  return mtp_precheck(ctx, p, prep, cfg, run, out);
}

/* Selected stage i's time run into the workspace's stage runs, stopped where its lower bound
 * of the step passes the bound (mp_sim_stage_run_until); then the step bound (step_bounded:
 * the plan's step is already past cfg->step_bound_s) and, under the memory
 * gate, the stage's verdict from its run (mp_sim_stage_memory_over). */
static mp_status run_stage(mp_ctx *ctx, const mp_plan *p, const mp_sim_plan_prep *prep,
                           const mp_sim_config *cfg, prepped_run *run, int i,
                           const mp_schedule *s, mp_sim_result *out) {
  mp_sim_stage *x = &cfg->ws->stages[i];
  MP_CHECK(mp_sim_stage_run_until(ctx, s, cfg, prep->links[i], step_stop_s(p, cfg), x));
  run->bounded = step_bounded(p, cfg, x, out);
  /* a stopped run's bound is step_bounded's, past the same bound */
  if (!run->bounded && x->stopped)
    return mp_error(ctx, MP_ERR_INTERNAL, "a stage run stopped short of the step bound");
  if (run->bounded || !run->gate) return MP_OK;
  return mp_sim_stage_memory_over(ctx, p, cfg, x, prep->sel[i], &run->over, out);
}

/* One selected stage of a prepared plan: its schedule, stage 0's memory pre-checks under
 * the gate, and its stage run unless a pre-check found the plan over capacity. */
static mp_status simulate_stage(mp_ctx *ctx, const mp_plan *p, mp_sim_plan_prep *prep,
                                const mp_sim_config *cfg, prepped_run *run, int i,
                                mp_sim_result *out) {
  mp_schedule *s = NULL;
  MP_CHECK(run_schedule(ctx, p, prep, run, i, &s));
  if (run->gate && i == 0) MP_CHECK(memory_precheck(ctx, p, prep, cfg, run, s, out));
  if (run->over) return MP_OK;
  return run_stage(ctx, p, prep, cfg, run, i, s, out);
}

/* mp_simulate_prepped in cfg->ws: the selected stages in order until one is over capacity
 * or past the step bound, then the pipeline's result from their runs. */
static mp_status simulate_prepped_in(mp_ctx *ctx, const mp_plan *p, mp_sim_plan_prep *prep,
                                     const mp_sim_config *cfg, mp_arena *scratch,
                                     mp_sim_result *out) {
  mp_sim_workspace *ws = cfg->ws;
  prepped_run run = {.reset = scratch == NULL};
  MP_CHECK(schedule_arena(ctx, ws, scratch, &run.scratch));
  const int pp = p->mesh.size[MP_DIM_PP] > 0 ? p->mesh.size[MP_DIM_PP] : 1, n = prep->n_sel;
  run.gate = memory_gate(p, cfg, pp);
  mp_status st = stage_room(ctx, ws, (size_t)n, (size_t)pp);
  for (int i = 0; i < n && st == MP_OK && !run.over && !run.bounded; i++)
    st = simulate_stage(ctx, p, prep, cfg, &run, i, out);
  if (st == MP_OK && !run.over && !run.bounded) st = finish_plan(ctx, p, cfg, prep->rep, out);
  if (run.reset) mp_arena_reset(run.scratch);
  return st;
}

mp_status mp_simulate_prepped(mp_ctx *ctx, const mp_plan *p, mp_sim_plan_prep *prep,
                              const mp_sim_config *cfg, mp_arena *scratch, mp_sim_result *out) {
  if (p == NULL || prep == NULL || cfg == NULL || cfg->cluster == NULL || out == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "mp_simulate_prepped needs a plan, its prep, a config "
                                         "with a cluster and an output");
  if (cfg->cluster != prep->cluster)
    return mp_error(ctx, MP_ERR_INVALID, "the simulator prep was made for another cluster; make "
                                         "one with mp_sim_plan_prep_create for this config");
  mp_sim_config local;
  const mp_sim_config *use = NULL;
  MP_CHECK(mp_sim_ws_begin(ctx, cfg, &local, &use));
  const mp_status st = simulate_prepped_in(ctx, p, prep, use, scratch, out);
  mp_sim_ws_end(use, cfg);
  return st;
}

mp_status mp_simulate_built_plan(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                 mp_arena *scratch, mp_sim_result *out) {
  return simulate_built(ctx, p, cfg, scratch, 0, out);
}

mp_status mp_simulate_built_plan_all_stages(mp_ctx *ctx, const mp_plan *p,
                                            const mp_sim_config *cfg, mp_arena *scratch,
                                            mp_sim_result *out) {
  return simulate_built(ctx, p, cfg, scratch, 1, out);
}

mp_status mp_simulate_plan_scratch(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                                   const mp_plan_options *opts, const mp_sim_config *cfg,
                                   mp_arena *scratch, mp_sim_result *out) {
  mp_plan *p = NULL;
  MP_CHECK(mp_build_plan(ctx, m, mesh, opts, &p));
  mp_status st = simulate_built(ctx, p, cfg, scratch, 0, out);
  mp_plan_destroy(p);
  return st;
}

mp_status mp_simulate_plan(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                           const mp_plan_options *opts, const mp_sim_config *cfg,
                           mp_sim_result *out) {
  return mp_simulate_plan_scratch(ctx, m, mesh, opts, cfg, NULL, out);
}
