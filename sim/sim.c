/* The simulator's core: costs one rank's step schedule (exec/schedule.h).
 *
 * Time. An event simulation in issue order: every stream keeps the time it is free; an op
 * starts at max(its stream free, the ends of its dependencies) and runs for its cost
 * (compute: roofline with the stack's efficiency, cost.c; communication: network.c). The
 * compute stream's idle time while it waits on a dependency is exposed communication
 * (TP/EP collectives, which run on the compute stream, count as exposed too); without
 * pipeline parallelism the step time is when the last stream falls idle.
 *   compute_s      busy time of compute ops on the compute stream (not optimizer)
 *   optimizer_s    busy time of optimizer-phase compute ops
 *   exposed_comm_s everything else of the step before the bubble
 *
 * Pipeline. A rank's schedule is one stage's micro-batch; the simulation of it gives each
 * model chunk's forward and backward time (the compute stream's time in its segments) and
 * the transfers between stages (the pp group's sends and receives, which take no time in
 * the engine). The pipeline timeline (sim/pipeline.c) runs every stage's pipeline order
 * (mp_pp_order) over them: the step is the slowest stage's head (before its first
 * micro-batch) + timeline + tail (its optimizer and the reductions draining after its
 * last micro-batch); bubble_s is what that adds to the stage's busy micro-batches. Alone,
 * a schedule of a pipeline stage stands for every stage.
 *
 * Dependencies. dep[i] names an op index; without MP_DEP_PREV_REP it means the op's most
 * recent instance (the same repetition for ops earlier in the segment, the last one for
 * ops of earlier segments or micro-batches); with it, the instance in the previous
 * repetition of the same segment (none in the first repetition). Two end times per op
 * (current and previous instance) answer both.
 *
 * Memory. ALLOC/FREE are replayed in issue order: prologue, each micro-batch (its `when`
 * respected: FIRST only in micro-batch 0, LAST only in the last, ONCE inside a micro-batch
 * segment only in micro-batch 0), optimizer. The peak total and the categories at that
 * moment are kept; then peak_mem = (peak + gap) x frag_factor + the GPU's runtime overhead,
 * gap being what a stack's caching allocator reserves beyond the allocated peak where its
 * profile replays one (sim/caching_alloc.h; one micro-batch's events), else 0. Under
 * pipeline parallelism a stage holds several micro-batches' activations at once: what its
 * pipeline order holds beyond one micro-batch is added to the peak, as ACTIVATIONS.
 * ACTIVATIONS events are scaled by the stack's saved_act_factor (what a compiler's
 * rematerialisation leaves saved), except those flagged MP_MEM_KEPT.
 *
 * The pieces: cost.c costs every op and compiles the schedule into the engine's form;
 * engine.c runs it (periodicity, the hot loop); pipeline.c the pipeline timeline;
 * workspace.c the caller's scratch they run in (mp_sim_workspace); this file checks the
 * request, runs them, and turns the engine's state into the result: step time,
 * throughput, MFU and memory. */
#include <stdlib.h>
#include <string.h>

#include "sim/caching_alloc.h"
#include "sim/engine.h"
#include "sim/sim.h"
#include "sim/sim_internal.h"
#include "sim/workspace.h"

mp_status mp_simulate(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                      mp_sim_result *out, mp_sim_trace **trace) {
  mp_sim_config local;
  const mp_sim_config *use = NULL;
  MP_CHECK(mp_sim_ws_begin(ctx, cfg, &local, &use));
  const mp_status st = mp_simulate_with_links(ctx, s, use, NULL, out, trace);
  mp_sim_ws_end(use, cfg);
  return st;
}

static mp_status check_request(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                               const mp_sim_result *out) {
  if (s == NULL || cfg == NULL || cfg->cluster == NULL || out == NULL || s->plan == NULL)
    return mp_error(ctx, MP_ERR_INVALID,
                    "mp_simulate needs a schedule with its plan, a config with a cluster and an "
                    "output");
  if (cfg->mem_headroom < 0 || cfg->mem_headroom > 0.5)
    return mp_error(ctx, MP_ERR_INVALID, "memory headroom %g outside 0 .. 0.5", cfg->mem_headroom);
  return MP_OK;
}

/* Throughput and MFU of a step time from the rank's tokens and model FLOPs per step (its
 * share of its replica's). */
static void set_rates(mp_sim_result *out, const mp_mesh *mesh, double tokens, double flops,
                      const mp_cluster *cl) {
  const int gpus_per_replica = mesh->size[MP_DIM_TP] * mesh->size[MP_DIM_CP] * mesh->size[MP_DIM_PP];
  out->tokens_per_s_per_gpu = out->mfu = 0.0;
  if (out->step_time_s > 0 && tokens > 0) {
    out->tokens_per_s_per_gpu = tokens / (out->step_time_s * gpus_per_replica);
    out->mfu = flops / out->step_time_s / mp_sim_peak_flops(&cl->gpu, MP_DTYPE_BF16);
  }
}

/* Time: the step ends when the last stream falls idle; what the compute stream did not
 * spend computing is exposed communication. */
static void fill_time(const sim *x, const mp_schedule *s, const mp_cluster *cl, mp_sim_result *out) {
  double end = 0.0;
  for (int st = 0; st < MP_STREAM_COUNT; st++) {
    if (x->a.free_t[st] > end) end = x->a.free_t[st];
    out->comm_s[st] = x->a.comm_busy[st];
  }
  out->compute_s = x->a.compute;
  out->optimizer_s = x->a.opt;
  out->exposed_comm_s = end - x->a.compute - x->a.opt;
  if (out->exposed_comm_s < 0) out->exposed_comm_s = 0;
  out->bubble_s = 0.0;
  out->step_time_s = end;
  set_rates(out, &s->plan->mesh, (double)s->tokens_per_step_per_rank, s->model_flops_per_step, cl);
}

/* Memory of the stage with `extra` in-flight activations on top of its replayed peak:
 * reserved (with the caching allocator's gap over the allocated peak, x frag_factor) plus
 * the runtime overhead against the usable capacity. */
static void fill_memory(const int64_t at_peak[MP_MEM_COUNT], const int64_t cat_max[MP_MEM_COUNT],
                        int64_t alloc_peak, int64_t gap, int64_t extra, const mp_sim_config *cfg,
                        const mp_stack_profile *prof, mp_sim_result *out) {
  const mp_cluster *cl = cfg->cluster;
  memcpy(out->mem_at_peak, at_peak, sizeof out->mem_at_peak);
  memcpy(out->mem_max, cat_max, sizeof out->mem_max);
  out->mem_max[MP_MEM_ACTIVATIONS] += extra;
  out->mem_at_peak[MP_MEM_ACTIVATIONS] += extra;
  int64_t alloc = alloc_peak + extra;
  double reserved = (double)(alloc + gap) * prof->frag_factor;
  double overhead = cl->gpu.runtime_overhead_gib * 1073741824.0;
  out->peak_mem_bytes = (int64_t)(reserved + overhead);
  out->overhead_bytes = out->peak_mem_bytes - alloc;
  out->capacity_bytes = (int64_t)(cl->gpu.mem_gib * 1073741824.0 * (1.0 - cfg->mem_headroom));
  out->fits = out->peak_mem_bytes <= out->capacity_bytes;
}

/* The EP all-to-all overlap (plan option moe_a2a_overlap), and DualPipe, which overlaps a
 * forward and a backward chunk as Megatron-Core's combined 1F1B does (DeepSeek-V3 sec.
 * 3.2.1, Fig. 4): each chunk's saving for the pipeline timeline (fb_save, from the
 * compiled ops, before the step runs: a bound on the step reads it, mp_sim_stage_run_until). */
static int a2a_overlaps(const mp_schedule *s) {
  return s->plan->opts.moe_a2a_overlap ||
         (s->plan->opts.pp_schedule == MP_PP_DUALPIPE && s->plan->mesh.size[MP_DIM_PP] > 1);
}

static void a2a_saves(const mp_schedule *s, const cop *cops, const mp_cluster *cl,
                      const mp_stack_profile *prof, double fb_save[MP_PP_MAX_VIRTUAL]) {
  double slow = 1.0; /* beside DeepEP's or HybridEP's SMs (sim/overlap.c) */
  const mp_moe_dispatcher d = s->plan->opts.moe_dispatcher;
  const int held = d == MP_MOE_DISPATCH_DEEPEP ? prof->deepep_sms : d == MP_MOE_DISPATCH_HYBRIDEP ? prof->hybridep_sms : 0;
  if (held > 0 && cl->gpu.sms > held) slow = (double)cl->gpu.sms / (double)(cl->gpu.sms - held);
  for (int c = 0; c < mp_plan_virtual_stages(s->plan) && c < MP_PP_MAX_VIRTUAL; c++)
    fb_save[c] = mp_sim_a2a_overlap_chunk_s(s, cops, c, slow);
}

/* The overlap's saving in the step without pipelining: Megatron-Core's
 * combined_1f1b_schedule_for_no_pipelining runs the first forward alone, then m - 1
 * combined steps (the forward of micro-batch i + 1 with the backward of i), then the last
 * backward, so the step is (m - 1) savings shorter, all of them exposed communication
 * hidden (a negative saving, compute slowed by DeepEP's SMs more than it hides, makes it
 * longer). */
static void a2a_overlap(const sim *x, const mp_schedule *s, const mp_cluster *cl, mp_sim_stage *out) {
  if (s->plan->mesh.size[MP_DIM_PP] > 1 || x->n_micro < 2) return;
  const double save = (double)(x->n_micro - 1) * out->t.fb_save[0];
  out->r.step_time_s -= save;
  out->r.exposed_comm_s = out->r.exposed_comm_s > save ? out->r.exposed_comm_s - save : 0.0;
  if (save < 0) out->r.compute_s -= save;
  set_rates(&out->r, &s->plan->mesh, (double)s->tokens_per_step_per_rank, s->model_flops_per_step, cl);
}

/* Each chunk's weight-gradient time of one micro-batch's backward: its WGRAD kernels on the
 * compute stream that every micro-batch runs, what a zero-bubble schedule's W step runs
 * (torch's stage_backward_weight computes the parameters' gradients; Qi et al., arXiv
 * 2401.10241, sec. 2: W is the weight-gradient GEMMs), the rest of the backward its B. */
static void wgrad_times(const mp_schedule *s, const cop *cops, mp_pp_stage_times *t) {
  for (int32_t i = 0; i < s->n_segs; i++) {
    const mp_segment *g = &s->segs[i];
    if (g->phase != MP_PHASE_BACKWARD) continue; /* a chunk is below MP_PP_MAX_VIRTUAL */
    double one = 0.0;
    for (int32_t j = g->first_op; j < g->first_op + g->n_ops; j++)
      if (cops[j].kind == COP_COMPUTE && cops[j].stream == MP_STREAM_COMPUTE && cops[j].when == MP_WHEN_EVERY_MICRO &&
          s->ops[j].variant == MP_VAR_WGRAD)
        one += cops[j].dur;
    t->w[g->chunk] += one * (g->repeat > 0 ? g->repeat : 1);
  }
  for (int c = 0; c < MP_PP_MAX_VIRTUAL; c++)
    if (t->w[c] > t->b[c]) t->w[c] = t->b[c];
}

/* A stage run's figures from its step x (mp_sim_stage_run). */
static void stage_figures(const sim *x, const mp_schedule *s, const mp_sim_config *cfg,
                          const mp_stack_profile *prof, const cop *cops, const double p2p[2],
                          mp_sim_stage *out) {
  fill_time(x, s, cfg->cluster, &out->r);
  fill_memory(x->at_peak, x->cat_max, x->peak_tot, out->alloc_gap, 0, cfg, prof, &out->r);
  for (int c = 0; c < MP_PP_MAX_VIRTUAL; c++) {
    out->t.f[c] = x->chunk_s[0][c];
    out->t.b[c] = x->chunk_s[1][c];
    out->held[c] = x->chunk_held[c];
  }
  out->t.send_f = p2p[0];
  out->t.send_b = p2p[1];
  if (mp_pp_schedule_splits_w(s->plan->opts.pp_schedule)) wgrad_times(s, cops, &out->t);
  if (a2a_overlaps(s)) a2a_overlap(x, s, cfg->cluster, out);
  out->head_s = x->mb_start_s;
  out->tail_s = out->r.step_time_s - x->mb_end_s;
  /* the pipeline runs every micro-batch at the steady one's chunk times; what the last one
   * adds on the compute stream beyond them (Megatron's DDP bucket preparation, ops only the
   * last micro-batch runs) is the stage's past the pipeline */
  double steady = 0.0;
  for (int c = 0; c < MP_PP_MAX_VIRTUAL; c++) steady += out->t.f[c] + out->t.b[c];
  if (x->n_micro >= 2 && x->last_micro_s > steady) out->tail_s += x->last_micro_s - steady;
}

/* mp_sim_stage_run, stopping as mp_sim_stage_run_until does where stop_s > 0. */
static mp_status stage_run(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                           const mp_sim_link *links, double stop_s, mp_sim_stage *out,
                           mp_sim_trace **trace) {
  MP_CHECK(check_request(ctx, s, cfg, &out->r));
  const mp_stack_profile *prof;
  MP_CHECK(mp_sim_resolve_stack(ctx, cfg, &prof));
  memset(out, 0, sizeof *out);
  if (trace) *trace = NULL;
  sim_bufs b;
  MP_CHECK(mp_sim_bufs_get(ctx, cfg->ws, s, &b));
  double p2p[2];
  MP_CHECK(mp_sim_compile_ops(ctx, s, cfg->cluster, prof, links, &b, p2p));
  if (prof->alloc_replay) MP_CHECK(mp_calloc_replay_gap(ctx, s, b.cops, &out->alloc_gap));
  if (a2a_overlaps(s)) a2a_saves(s, b.cops, cfg->cluster, prof, out->t.fb_save);

  sim x;
  mp_sim_engine_init(&x, s, &b, cfg->cluster->gpu.sms, !cfg->record_trace);
  if (cfg->record_trace && trace) {
    x.trace = (mp_sim_trace *)calloc(1, sizeof *x.trace);
    if (x.trace == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the trace");
    x.trace->s = s;
  }
  x.stop_s = trace ? 0.0 : stop_s;
  x.stop_v = mp_plan_virtual_stages(s->plan);
  memcpy(x.fb_save, out->t.fb_save, sizeof x.fb_save);
  mp_sim_run_step(&x);
  if (x.trace_failed) {
    mp_sim_trace_destroy(x.trace);
    if (x.trace_failed == MP_SIM_TRACE_FAILED_TOO_LONG)
      return mp_error(ctx, MP_ERR_INVALID,
                      "the trace of %lld micro-batches would hold more than %zu events; trace a step "
                      "of fewer micro-batches (a smaller global batch or a larger micro-batch)",
                      (long long)x.n_micro, MP_SIM_TRACE_MAX_EVENTS);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory recording the trace");
  }
  if (x.stopped) {
    memcpy(out->t.f, x.chunk_s[0], sizeof out->t.f);
    memcpy(out->t.b, x.chunk_s[1], sizeof out->t.b);
    out->n_micro = x.n_micro;
    out->stopped = 1;
    return MP_OK;
  }
  stage_figures(&x, s, cfg, prof, b.cops, p2p, out);
  MP_CHECK(mp_sim_offload(ctx, s, b.cops, &cfg->cluster->gpu, x.n_micro, &out->r));
  if (out->r.offload_exposed_s > 0)
    set_rates(&out->r, &s->plan->mesh, (double)s->tokens_per_step_per_rank, s->model_flops_per_step, cfg->cluster);
  out->alloc_peak = x.peak_tot;
  out->stage = s->pp_stage;
  out->n_micro = x.n_micro;
  out->tokens = (double)s->tokens_per_step_per_rank;
  out->model_flops = s->model_flops_per_step;
  if (trace) *trace = x.trace;
  return MP_OK;
}

mp_status mp_sim_stage_run(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                           const mp_sim_link *links, mp_sim_stage *out, mp_sim_trace **trace) {
  return stage_run(ctx, s, cfg, links, 0.0, out, trace);
}

mp_status mp_sim_stage_run_until(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                                 const mp_sim_link *links, double stop_s, mp_sim_stage *out) {
  return stage_run(ctx, s, cfg, links, stop_s, out, NULL);
}

/* DualPipe's rank k as one stage of the timeline (sim/pipeline.c): its direction-0 chunk
 * is model stage k (stage a), its direction-1 chunk model stage pp - 1 - k (stage b); it
 * holds both stages' parameters, gradients, optimizer state and float8 weight copies (the
 * reference's two modules a rank, parameters 2x: DeepSeek-V3 sec. 3.2.1), and drains both
 * stages' reductions and optimizer steps. */
static void dual_rank(const mp_sim_stage *a, const mp_sim_stage *b, mp_sim_stage *out) {
  *out = *a;
  out->t.f[1] = b->t.f[0];
  out->t.b[1] = b->t.b[0];
  out->t.fb_save[1] = b->t.fb_save[0];
  out->held[1] = b->held[0];
  out->head_s = a->head_s + b->head_s;
  out->tail_s = a->tail_s + b->tail_s;
  out->r.compute_s = (a->r.compute_s + b->r.compute_s) / 2.0; /* half the micro-batches each */
  out->r.exposed_comm_s = (a->r.exposed_comm_s + b->r.exposed_comm_s) / 2.0;
  static const int statics[] = {MP_MEM_PARAMS, MP_MEM_OPTIMIZER, MP_MEM_GRADS, MP_MEM_FP8};
  for (size_t i = 0; i < sizeof statics / sizeof statics[0]; i++) {
    const int c = statics[i];
    out->r.mem_at_peak[c] += b->r.mem_at_peak[c];
    out->r.mem_max[c] += b->r.mem_at_peak[c];
    out->alloc_peak += b->r.mem_at_peak[c];
  }
}

/* The timeline's stages: stage_in itself, or under DualPipe its ranks built in the
 * workspace into ranks (pp of them). */
static mp_status timeline_stages(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                 const mp_sim_stage *const *stage_in, const mp_sim_stage **ranks,
                                 const mp_sim_stage *const **stage) {
  const int pp = p->mesh.size[MP_DIM_PP];
  *stage = stage_in;
  if (p->opts.pp_schedule != MP_PP_DUALPIPE) return MP_OK;
  if (!mp_sim_grow((void **)&cfg->ws->dual, &cfg->ws->dual_cap, (size_t)pp, sizeof *cfg->ws->dual))
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory for DualPipe's %d ranks", pp);
  for (int k = 0; k < pp; k++) {
    dual_rank(stage_in[k], stage_in[pp - 1 - k], &cfg->ws->dual[k]);
    ranks[k] = &cfg->ws->dual[k];
  }
  *stage = ranks;
  return MP_OK;
}

/* The pipeline's flavor of p's orders (sim/pipeline.c): the stack's, or Megatron-Core's
 * combined steps under the EP all-to-all overlap. */
static mp_pp_flavor plan_pp_flavor(const mp_plan *p, const mp_stack_profile *prof) {
  return p->opts.moe_a2a_overlap ? MP_PP_FLAVOR_MEGATRON_A2A : prof->pp_flavor;
}

/* Pipeline stage k's memory from its stage run x: its replayed peak with what its pipeline
 * order holds in flight beyond one micro-batch (*extra); the memory fields of *m. */
static mp_status stage_memory(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                              const mp_stack_profile *prof, const mp_sim_stage *x, int k,
                              mp_sim_result *m, int64_t *extra) {
  const int pp = p->mesh.size[MP_DIM_PP], v = mp_plan_virtual_stages(p);
  MP_CHECK(mp_sim_pp_held_extra(ctx, cfg->ws, p->opts.pp_schedule, plan_pp_flavor(p, prof), pp, v,
                                x->n_micro, k, x->held, extra));
  fill_memory(x->r.mem_at_peak, x->r.mem_max, x->alloc_peak, x->alloc_gap, *extra, cfg, prof, m);
  return MP_OK;
}

mp_status mp_sim_stage_memory_over(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                   const mp_sim_stage *x, int k, int *over, mp_sim_result *out) {
  *over = 0;
  /* under DualPipe a rank holds two stages' parameters and activations (dual_rank): one
   * stage's figures are not a rank's, so they give no verdict */
  if (p->opts.pp_schedule == MP_PP_DUALPIPE && p->mesh.size[MP_DIM_PP] > 1) return MP_OK;
  const mp_stack_profile *prof;
  MP_CHECK(mp_sim_resolve_stack(ctx, cfg, &prof));
  int64_t extra = 0;
  memset(out, 0, sizeof *out);
  if (p->mesh.size[MP_DIM_PP] > 1) MP_CHECK(stage_memory(ctx, p, cfg, prof, x, k, out, &extra));
  else fill_memory(x->r.mem_at_peak, x->r.mem_max, x->alloc_peak, x->alloc_gap, 0, cfg, prof, out);
  *over = !out->fits;
  return MP_OK;
}

/* The stage that finishes its step last (the critical one), and that step in *step_s:
 * each stage's head, its finish on the pipeline timeline, and its tail. */
static int critical_stage(const mp_sim_stage *const *stage, const double *finish, int pp, double *step_s) {
  int crit = 0;
  double step = -1.0;
  for (int k = 0; k < pp; k++) {
    const double t = stage[k]->head_s + finish[k] + stage[k]->tail_s;
    if (t > step) step = t, crit = k;
  }
  *step_s = step;
  return crit;
}

/* Whether stage k stands for the same simulated stage as an earlier one (under DualPipe
 * both of its ranks' stages): it holds no more, since a stage's warm-up, and so what it
 * holds in flight, shrinks with its index. Not so where W steps defer the release: every
 * stage is walked. */
static int stage_seen(const mp_plan *p, const mp_sim_stage *const *stage_in, int k) {
  if (mp_pp_schedule_splits_w(p->opts.pp_schedule)) return 0;
  const int pp = p->mesh.size[MP_DIM_PP], dual = p->opts.pp_schedule == MP_PP_DUALPIPE;
  for (int j = 0; j < k; j++)
    if (stage_in[j] == stage_in[k] && (!dual || stage_in[pp - 1 - j] == stage_in[pp - 1 - k])) return 1;
  return 0;
}

/* The stage whose memory peaks highest (*full; stage mem_stage alone when >= 0), and what
 * its pipeline order holds in flight beyond one micro-batch (*extra_full); each reckoned
 * stage's peak into cfg->stage_peak_bytes when the caller wants them, so stages that
 * stand for an earlier one are skipped only when it does not. */
static mp_status fullest_stage(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                               const mp_stack_profile *prof, const mp_sim_stage *const *stage_in,
                               const mp_sim_stage *const *stage, int mem_stage, int *full,
                               int64_t *extra_full) {
  const int pp = p->mesh.size[MP_DIM_PP];
  int64_t peak = -1;
  *full = 0;
  *extra_full = 0;
  for (int k = 0; k < pp; k++) {
    if (mem_stage >= 0 && k != mem_stage) continue;
    if (mem_stage < 0 && cfg->stage_peak_bytes == NULL && stage_seen(p, stage_in, k)) continue;
    int64_t extra = 0;
    mp_sim_result m;
    MP_CHECK(stage_memory(ctx, p, cfg, prof, stage[k], k, &m, &extra));
    if (cfg->stage_peak_bytes) cfg->stage_peak_bytes[k] = m.peak_mem_bytes;
    if (m.peak_mem_bytes > peak) peak = m.peak_mem_bytes, *full = k, *extra_full = extra;
  }
  return MP_OK;
}

/* The critical stage c's busy time a micro-batch: its chunks' forwards and backwards
 * (DualPipe runs each direction's chunk for half the micro-batches), less what the
 * combined forward and backward steps save over the step (save, mp_sim_pp_combined_save). */
static double busy_per_micro_s(const mp_plan *p, const mp_sim_stage *c, double save, int64_t n_micro) {
  const int dual = p->opts.pp_schedule == MP_PP_DUALPIPE;
  double busy = 0.0;
  for (int k = 0; k < (dual ? 2 : mp_plan_virtual_stages(p)); k++) busy += c->t.f[k] + c->t.b[k];
  if (dual) busy /= 2.0;
  return busy - save / (double)n_micro;
}

/* The plan's result from its stages' runs on the pipeline timeline: time figures from the
 * critical stage (critical_stage), memory from the fullest (fullest_stage). */
mp_status mp_sim_pipeline_result(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                 const mp_sim_stage *const *stage_in, int mem_stage,
                                 mp_sim_result *out) {
  const int pp = p->mesh.size[MP_DIM_PP], v = mp_plan_virtual_stages(p);
  if (pp <= 1) {
    *out = stage_in[0]->r;
    return MP_OK;
  }
  if (pp > MP_MAX_LAYERS)
    return mp_error(ctx, MP_ERR_INVALID, "pp=%d: at most %d pipeline stages", pp, MP_MAX_LAYERS);
  const mp_sim_stage *ranks[MP_MAX_LAYERS];
  const mp_sim_stage *const *stage;
  MP_CHECK(timeline_stages(ctx, p, cfg, stage_in, ranks, &stage));
  const mp_stack_profile *prof;
  MP_CHECK(mp_sim_resolve_stack(ctx, cfg, &prof));
  const int64_t n_micro = stage[0]->n_micro;
  double finish[MP_MAX_LAYERS];
  const mp_pp_stage_times *times[MP_MAX_LAYERS];
  for (int k = 0; k < pp; k++) times[k] = &stage[k]->t;
  const mp_pp_flavor flavor = plan_pp_flavor(p, prof);
  MP_CHECK(mp_sim_pipeline_ws(ctx, cfg->ws, p->opts.pp_schedule, flavor, pp, v, n_micro, times, finish));
  double step = 0.0;
  const int crit = critical_stage(stage, finish, pp, &step);
  int full = 0;
  int64_t extra_full = 0;
  MP_CHECK(fullest_stage(ctx, p, cfg, prof, stage_in, stage, mem_stage, &full, &extra_full));
  const mp_sim_stage *c = stage[crit], *f = stage[full];
  *out = c->r;
  double save = 0.0;
  /* a combined forward and backward (the EP all-to-all overlap) is busy for less: the
   * communication it hides is no longer exposed (compute slowed beside DeepEP's SMs, a
   * negative saving, is compute). Only the pairs the critical stage's order runs save
   * (the steady state's; the warm-up forwards and cool-down backwards run alone, their
   * all-to-alls exposed), each the smaller of its two chunks' savings, as the timeline runs
   * them */
  MP_CHECK(mp_sim_pp_combined_save(ctx, cfg->ws, p->opts.pp_schedule, flavor, pp, v, n_micro, crit, &c->t, &save));
  const double busy = busy_per_micro_s(p, c, save, n_micro);
  if (save > 0) out->exposed_comm_s = out->exposed_comm_s > save ? out->exposed_comm_s - save : 0.0;
  else out->compute_s -= save;
  out->step_time_s = step;
  /* the stage's transfers: a send per chunk and direction per micro-batch */
  out->comm_s[MP_STREAM_P2P] += (double)n_micro * v * (c->t.send_f + c->t.send_b);
  out->bubble_s = step - c->head_s - c->tail_s - (double)n_micro * busy;
  if (out->bubble_s < 0) out->bubble_s = 0.0;
  fill_memory(f->r.mem_at_peak, f->r.mem_max, f->alloc_peak, f->alloc_gap, extra_full, cfg, prof, out);
  set_rates(out, &p->mesh, c->tokens, c->model_flops, cfg->cluster);
  return MP_OK;
}

mp_status mp_simulate_with_links(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                                 const mp_sim_link *links, mp_sim_result *out,
                                 mp_sim_trace **trace) {
  mp_sim_stage st;
  MP_CHECK(mp_sim_stage_run(ctx, s, cfg, links, &st, trace));
  const int pp = s->plan->mesh.size[MP_DIM_PP];
  if (pp <= 1) {
    *out = st.r;
    return MP_OK;
  }
  /* alone, the stage stands for every stage of the pipeline */
  const mp_sim_stage *all[MP_MAX_LAYERS];
  for (int k = 0; k < pp && k < MP_MAX_LAYERS; k++) all[k] = &st;
  mp_status rc = mp_sim_pipeline_result(ctx, s->plan, cfg, all, s->pp_stage, out);
  if (rc != MP_OK && trace) {
    mp_sim_trace_destroy(*trace);
    *trace = NULL;
  }
  return rc;
}

void mp_sim_trace_destroy(mp_sim_trace *t) {
  if (t == NULL) return;
  free(t->ev);
  free(t);
}
