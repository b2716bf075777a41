/* Internals shared by the simulator's files (not an interface for other modules). */
#ifndef MP_SIM_SIM_INTERNAL_H
#define MP_SIM_SIM_INTERNAL_H

#include <stdint.h>

#include "sim/sim.h"

/* One simulated op instance on the timeline. */
typedef struct mp_sim_event {
  double start_s, dur_s;
  int64_t mem_delta; /* a memory event (ALLOC/FREE op): the bytes it adds (negative: frees)
                        as the simulator counts them (activations scaled by the stack);
                        0 for timed ops */
  int32_t op;    /* index into the schedule's ops */
  int32_t layer; /* the instance's block index (-1 outside blocks) */
  int32_t micro; /* -1 for prologue / optimizer */
  int8_t mem_cat; /* a memory event's mp_mem_cat; -1 for timed ops */
} mp_sim_event;

/* Names are formatted only when the trace is written (mp_op_name), never while
 * simulating; so the schedule must outlive the trace. */
struct mp_sim_trace {
  const mp_schedule *s;
  mp_sim_event *ev;
  size_t n, cap;
};

/* One rank's schedule simulated on its own: its micro-batches in sequence, one in flight
 * (r), and what the pipeline timeline needs of it (sim.c, sim/pipeline.c). */
typedef struct mp_sim_stage {
  mp_sim_result r;          /* the step without pipelining; memory of one micro-batch */
  mp_pp_stage_times t;      /* per chunk: forward, backward of a micro-batch; transfers */
  double head_s, tail_s;    /* before the first micro-batch; after the last (optimizer,
                               gradient reductions draining) */
  int64_t held[MP_PP_MAX_VIRTUAL]; /* ACTIVATIONS a chunk's forward leaves held */
  int64_t alloc_peak;       /* the allocated peak (before fragmentation and overhead) */
  int64_t alloc_gap;        /* what the stack's caching allocator reserves beyond it
                               (mp_calloc_replay_gap; 0 for a tracked allocator) */
  int stage;                /* the schedule's pipeline stage */
  int64_t n_micro;          /* micro-batches per step */
  double tokens, model_flops; /* the rank's tokens and model FLOPs per step (its share) */
  int stopped;              /* mp_sim_stage_run_until stopped it: t's f, b and fb_save and
                               n_micro hold, no other figure */
} mp_sim_stage;

/* A lower bound of the step of a plan with v model chunks per stage under a pipeline
 * schedule other than DualPipe, from one of its stage runs x: the pipeline timeline
 * (sim/pipeline.c run_steps) runs on the stage, one step at a time, each micro-batch's
 * forward (f) and backward (b; where W steps are split off, B takes b - w and W w) of
 * every chunk, and a forward run with another micro-batch's backward as one step (the EP
 * all-to-all overlap) saves the smaller of the two chunks' fb_save, at most the forward's
 * chunk's; so n_micro x the sum over chunks of (f + b - max(0, fb_save)), which the head,
 * the tail and the bubble only add to. */
double mp_sim_stage_step_lb_s(const mp_sim_stage *x, int v);
/* The same bound from the times t of a stage of n_micro micro-batches. */
double mp_sim_times_step_lb_s(const mp_pp_stage_times *t, int v, int64_t n_micro);

/* The saving of mp_sim_a2a_overlap_save_s (sim.h) for model chunk `chunk` of schedule s
 * from its compiled ops (the compute stream's ops of a middle micro-batch). */
struct cop;
/* sim/offload.c: Transformer Engine's layer_window_map[k] for n offloaded groups of `layers`
 * layers; the exposed time of one micro-batch's copies, each copy_s, beside layer times
 * t_fwd[l], t_bwd[l]; and the schedule's CPU offloading added to r (n_micro micro-batches). */
int32_t mp_sim_offload_window(int32_t layers, int32_t n, int32_t k);
double mp_sim_offload_exposed_s(int32_t layers, int32_t n, double copy_s, const double t_fwd[],
                                const double t_bwd[]);
mp_status mp_sim_offload(mp_ctx *ctx, const mp_schedule *s, const struct cop *cops, const mp_gpu *gpu,
                         int64_t n_micro, mp_sim_result *r);
double mp_sim_a2a_overlap_chunk_s(const mp_schedule *s, const struct cop *cops, int chunk, double slow);

/* Below, a cfg is one with a workspace (cfg->ws set: the public entry points give a
 * config without one a temporary workspace, mp_sim_ws_begin in sim/workspace.h). */

/* The stage run of s: links as for mp_simulate_with_links; *trace with cfg->record_trace. */
mp_status mp_sim_stage_run(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                           const mp_sim_link *links, mp_sim_stage *out, mp_sim_trace **trace);
/* The stage run without a trace; with stop_s > 0 (a plan with pp > 1, not under DualPipe)
 * it stops once its recorded micro-batch (the engine's rec_micro, before the ones that
 * follow it, the last and the optimizer) gives mp_sim_stage_step_lb_s past stop_s: then
 * out->stopped, with the chunk times and n_micro that bound reads (the same figures the
 * whole run gives, which records them in that micro-batch alone). */
mp_status mp_sim_stage_run_until(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                                 const mp_sim_link *links, double stop_s, mp_sim_stage *out);
/* The result of the plan's step from its stages (stage[s] for each of the pp stages; stages
 * may share one): without pipeline the stage's own; with pp > 1 the pipeline timeline for
 * the step time (the slowest stage's figures, the first of equals), every stage's
 * in-flight activations for memory (the fullest stage's figures; mem_stage >= 0: that
 * stage's alone). */
mp_status mp_sim_pipeline_result(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                 const mp_sim_stage *const *stage, int mem_stage,
                                 mp_sim_result *out);
/* The memory a stage's schedule reaches, without its time (sim/memory_pass.c): of *out
 * alloc_peak (the engine's to the byte) and alloc_gap (a stage run's), the categories at
 * that peak and their maxima (r.mem_at_peak, r.mem_max; where states tie for the peak,
 * perhaps another of them), held, stage and n_micro, the rest zero: what
 * mp_sim_stage_memory_over reads, at a fraction of mp_sim_stage_run's cost (no time run;
 * ops costed only under a caching allocator's replay). */
mp_status mp_sim_stage_memory_pass(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                                   mp_sim_stage *out);
/* A memory event's (ALLOC, FREE) scaled delta: ACTIVATIONS by the stack's saved_act_factor
 * except tensors every stack keeps (sim/cost.c, where the engine's events are compiled). */
int64_t mp_sim_mem_delta(const mp_op *op, double act_factor);
/* Whether pipeline stage k (x its stage run, standing for no earlier stage) is over the
 * capacity with what its pipeline order holds in flight: *over, and in *out the stage's
 * memory figures as mp_sim_pipeline_result reckons them, time figures zero. The plan's
 * peak is the largest stage's, so a stage over it makes the plan over it. Under DualPipe
 * (pp > 1) a rank holds two stages, so a stage alone gives no verdict: *over 0, *out as it
 * was. */
mp_status mp_sim_stage_memory_over(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                   const mp_sim_stage *x, int k, int *over, mp_sim_result *out);
/* mp_sim_pipeline in the workspace ws. */
mp_status mp_sim_pipeline_ws(mp_ctx *ctx, mp_sim_workspace *ws, mp_pp_schedule kind,
                             mp_pp_flavor flavor, int pp, int v, int64_t n_micro,
                             const mp_pp_stage_times *const *stage, double *finish);
/* What the steps stage `stage`'s order runs as combined forward-and-backward pairs save on
 * its times t, as the timeline runs them (mp_sim_pipeline): the smaller of the two chunks'
 * fb_save a pair (Megatron-Core's combined 1F1B in the steady state, DualPipe's named F&B
 * pairs); the warm-up forwards and cool-down backwards run alone and save nothing. Into
 * *save; its order is built in ws. */
mp_status mp_sim_pp_combined_save(mp_ctx *ctx, mp_sim_workspace *ws, mp_pp_schedule kind, mp_pp_flavor flavor,
                                  int pp, int v, int64_t n_micro, int stage, const mp_pp_stage_times *t,
                                  double *save);
/* The activations stage `stage` holds at most walking its pipeline order, beyond what it
 * holds with one micro-batch alone (held: per chunk what its forward leaves held); its
 * order is built in ws. */
mp_status mp_sim_pp_held_extra(mp_ctx *ctx, mp_sim_workspace *ws, mp_pp_schedule kind,
                               mp_pp_flavor flavor, int pp, int v, int64_t n_micro, int stage,
                               const int64_t *held, int64_t *extra);

/* mp_simulate with the links of every group (indexed by mp_group, as mp_sim_group_link
 * gives them for the schedule's rank) looked up beforehand; links NULL looks them up. */
mp_status mp_simulate_with_links(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                                 const mp_sim_link *links, mp_sim_result *out,
                                 mp_sim_trace **trace);

/* The link of group g for `rank`: links[g] when the caller looked the links up
 * beforehand (links not NULL), else mp_sim_group_link. */
mp_status mp_sim_link_of(mp_ctx *ctx, const mp_sim_link *links, const mp_cluster *c, const mp_mesh *mesh,
                         mp_group g, int rank, mp_sim_link *out);

#endif
