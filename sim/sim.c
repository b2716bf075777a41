/* The simulator's core: costs one rank's step schedule (exec/schedule.h).
 *
 * Time. An event simulation in issue order: every stream keeps the time it is free; an op
 * starts at max(its stream free, the ends of its dependencies) and runs for its cost
 * (compute: roofline with the stack's efficiency, cost.c; communication: network.c). The
 * compute stream's idle time while it waits on a dependency is exposed communication
 * (TP/EP collectives, which run on the compute stream, count as exposed too); step time
 * is when the last stream falls idle, plus the pipeline bubble.
 *   compute_s      busy time of compute ops on the compute stream (not optimizer)
 *   optimizer_s    busy time of optimizer-phase compute ops
 *   exposed_comm_s everything else of the step before the bubble
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
 * moment are kept; then peak_mem = peak x frag_factor + the GPU's runtime overhead.
 * Under pipeline parallelism a stage holds several micro-batches' activations at once
 * (mp_sim_pp_inflight); the peak gains (inflight - 1) x the activation rise of one
 * micro-batch, as ACTIVATIONS. ACTIVATIONS events are scaled by the stack's
 * saved_act_factor (what a compiler's rematerialisation leaves saved).
 *
 * The pieces: cost.c costs every op and compiles the schedule into the engine's form;
 * engine.c runs it (periodicity, the hot loop, per-thread buffers); this file checks the
 * request, runs them, and turns the engine's state into the result: step time with the
 * pipeline bubble, throughput, MFU and memory. */
#include <stdlib.h>
#include <string.h>

#include "sim/engine.h"
#include "sim/sim.h"
#include "sim/sim_internal.h"

mp_status mp_simulate(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                      mp_sim_result *out, mp_sim_trace **trace) {
  return mp_simulate_with_links(ctx, s, cfg, NULL, out, trace);
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

/* The pipeline bubble: (pp - 1) micro-batch times of fill and drain (1F1B and GPipe
 * alike), divided by the virtual stages for interleaved; plus the boundary transfers of
 * the fill and drain when the schedule carries no P2P ops of its own. */
static mp_status pipeline_bubble(mp_ctx *ctx, const mp_schedule *s, const mp_cluster *cl,
                                 const mp_stack_profile *prof, const mp_sim_link *links, int has_p2p,
                                 double t_micro, double *out) {
  const mp_plan *plan = s->plan;
  const mp_mesh *mesh = &plan->mesh;
  int pp = mesh->size[MP_DIM_PP];
  double bubble = 0.0;
  if (pp > 1) {
    int v = plan->opts.pp_schedule == MP_PP_INTERLEAVED && plan->opts.pp_virtual > 1
                ? plan->opts.pp_virtual
                : 1;
    bubble = (pp - 1) * t_micro / v;
    if (!has_p2p) {
      mp_sim_link l;
      MP_CHECK(mp_sim_link_of(ctx, links, cl, mesh, MP_GROUP_PP, s->rank, &l));
      double act = (double)s->micro_batch * (double)s->seq / mesh->size[MP_DIM_CP] *
                   (double)plan->model.d_model * 2.0 /* bf16 */;
      bubble += (pp - 1) * 2.0 *
                (mp_sim_collective_s(MP_COLL_SEND, act, 2, l.GBps * prof->link_eff, l.lat_s) +
                 prof->comm_overhead_s);
    }
  }
  *out = bubble;
  return MP_OK;
}

/* Time: the step ends when the last stream falls idle, plus the bubble; what the compute
 * stream did not spend computing is exposed communication. */
static void fill_time(const sim *x, const mp_schedule *s, const mp_cluster *cl, double bubble,
                      mp_sim_result *out) {
  const mp_mesh *mesh = &s->plan->mesh;
  double end = 0.0;
  for (int st = 0; st < MP_STREAM_COUNT; st++) {
    if (x->a.free_t[st] > end) end = x->a.free_t[st];
    out->comm_s[st] = x->a.comm_busy[st];
  }
  out->compute_s = x->a.compute;
  out->optimizer_s = x->a.opt;
  out->exposed_comm_s = end - x->a.compute - x->a.opt;
  if (out->exposed_comm_s < 0) out->exposed_comm_s = 0;
  out->bubble_s = bubble;
  out->step_time_s = end + bubble;

  int gpus_per_replica = mesh->size[MP_DIM_TP] * mesh->size[MP_DIM_CP] * mesh->size[MP_DIM_PP];
  if (out->step_time_s > 0 && s->tokens_per_step_per_rank > 0) {
    out->tokens_per_s_per_gpu =
        (double)s->tokens_per_step_per_rank / (out->step_time_s * gpus_per_replica);
    /* model_flops_per_step is this rank's share of the replica's model FLOPs */
    out->mfu = s->model_flops_per_step / out->step_time_s / mp_sim_peak_flops(&cl->gpu, MP_DTYPE_BF16);
  }
}

/* Memory: the peak and its categories, with the activations of the micro-batches a
 * pipeline stage holds at once; then reserved (x frag_factor) plus the runtime overhead
 * against the usable capacity. */
static void fill_memory(const sim *x, const mp_schedule *s, const mp_sim_config *cfg,
                        const mp_stack_profile *prof, int64_t act_rise_max, mp_sim_result *out) {
  const mp_cluster *cl = cfg->cluster;
  double inflight = mp_sim_pp_inflight(s->plan, s->pp_stage, x->n_micro);
  int64_t extra = (int64_t)((inflight - 1.0) * (double)act_rise_max);
  memcpy(out->mem_at_peak, x->at_peak, sizeof out->mem_at_peak);
  memcpy(out->mem_max, x->cat_max, sizeof out->mem_max);
  out->mem_max[MP_MEM_ACTIVATIONS] += extra;
  out->mem_at_peak[MP_MEM_ACTIVATIONS] += extra;
  int64_t alloc = x->peak_tot + extra;
  double reserved = (double)alloc * prof->frag_factor;
  double overhead = cl->gpu.runtime_overhead_gib * 1073741824.0;
  out->peak_mem_bytes = (int64_t)(reserved + overhead);
  out->overhead_bytes = out->peak_mem_bytes - alloc;
  out->capacity_bytes = (int64_t)(cl->gpu.mem_gib * 1073741824.0 * (1.0 - cfg->mem_headroom));
  out->fits = out->peak_mem_bytes <= out->capacity_bytes;
}

mp_status mp_simulate_with_links(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                                 const mp_sim_link *links, mp_sim_result *out,
                                 mp_sim_trace **trace) {
  MP_CHECK(check_request(ctx, s, cfg, out));
  const mp_stack_profile *prof;
  MP_CHECK(mp_sim_resolve_stack(ctx, cfg, &prof));
  memset(out, 0, sizeof *out);
  if (trace) *trace = NULL;
  sim_bufs b;
  MP_CHECK(mp_sim_bufs_get(ctx, s, &b));
  int has_p2p = 0;
  MP_CHECK(mp_sim_compile_ops(ctx, s, cfg->cluster, prof, links, &b, &has_p2p));

  sim x;
  mp_sim_engine_init(&x, s, &b, !cfg->record_trace);
  if (cfg->record_trace && trace) {
    x.trace = (mp_sim_trace *)calloc(1, sizeof *x.trace);
    if (x.trace == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the trace");
    x.trace->s = s;
  }
  int64_t act_rise_max = 0;
  double t_micro = 0.0;
  mp_sim_run_step(&x, &act_rise_max, &t_micro);
  if (x.trace_failed) {
    mp_sim_trace_destroy(x.trace);
    if (x.trace_failed == MP_SIM_TRACE_FAILED_TOO_LONG)
      return mp_error(ctx, MP_ERR_INVALID,
                      "the trace of %lld micro-batches would hold more than %zu events; trace a step "
                      "of fewer micro-batches (a smaller global batch or a larger micro-batch)",
                      (long long)x.n_micro, MP_SIM_TRACE_MAX_EVENTS);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory recording the trace");
  }

  double bubble = 0.0;
  MP_CHECK(pipeline_bubble(ctx, s, cfg->cluster, prof, links, has_p2p, t_micro, &bubble));
  fill_time(&x, s, cfg->cluster, bubble, out);
  fill_memory(&x, s, cfg, prof, act_rise_max, out);
  if (trace) *trace = x.trace;
  return MP_OK;
}

void mp_sim_trace_destroy(mp_sim_trace *t) {
  if (t == NULL) return;
  free(t->ev);
  free(t);
}
