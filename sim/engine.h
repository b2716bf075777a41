/* The simulator's event engine, as its files share it (not an interface for other
 * modules): the compiled form of a schedule's ops (cost.c fills it), the programs the
 * segments compile to, and the state of one simulation (engine.c runs it; sim.c reads
 * the result). sim.c's opening comment describes the model; engine.c's the engine. */
#ifndef MP_SIM_ENGINE_H
#define MP_SIM_ENGINE_H

#include <stdint.h>

#include "sim/sim.h"
#include "sim/sim_internal.h"

/* The hot loop's view of an op: the schedule's op compiled by cost.c (its duration, its
 * scaled memory delta, its cross-stream dependencies only). */
typedef struct cop {
  double dur;         /* seconds */
  int64_t mem_delta;  /* ALLOC: +bytes, FREE: -bytes; ACTIVATIONS already scaled by the
                         stack's saved_act_factor */
  int32_t dep[MP_OP_MAX_DEPS]; /* valid op indices only */
  uint8_t n_dep;
  uint8_t dep_skip0;  /* bit d: MP_DEP_PREV_REP, ignored in a first repetition */
  uint8_t dep_prev;   /* bit d: read the previous instance's end (end_prev) */
  uint8_t stream;     /* resolved (an out-of-range stream runs on compute) */
  uint8_t kind;       /* COP_* */
  uint8_t when;
  int8_t mem_cat;     /* -1: outside the categories (no memory effect) */
  uint8_t keep_end;   /* some dependency reads its end time: only these ops keep one */
  uint8_t sms;        /* a collective off the compute stream: the SMs its kernel holds
                         while it runs (the stack's nccl_channels; 0: none) */
  uint8_t sm_bound;   /* a compute-stream kernel whose time is its arithmetic: it runs on
                         the SMs the collectives in flight leave it (engine.c) */
} cop;

/* Timed kinds first, then the memory events: `kind >= COP_ALLOC` is one test in the hot
 * loop. COP_ALLOC is an event whose (scaled) delta is positive, the only ones that can
 * raise a peak; COP_FREE a non-positive one; COP_NOMEM one outside the categories. */
enum { COP_COMPUTE = 0, COP_OPT, COP_COMM, COP_OTHER, COP_ALLOC, COP_FREE, COP_NOMEM };

/* Segment programs (run_rep's fast path). A segment's ops compile to steps: a step is
 * either one op run as in run_op (`op` >= 0), or a run of consecutive "plain" ops
 * (`op` < 0): memory events whose end time nobody reads, and dependency-free compute
 * stream ops (compute kernels or collectives) whose end time nobody reads, in a
 * micro-batch segment only those every micro-batch runs (MP_WHEN_EVERY_MICRO: an op some
 * skip is a step of its own, its `when` tested as run_op tests it). Such an op
 * starts when the compute stream is free, so within a run the time chain is
 * fc = fc + d op after op, the compute and collective busy sums add their ops' durations
 * in order, and the memory events apply in order; none of the three reads another, so the
 * run does each as its own loop over contiguous arrays: the same additions in the same
 * order as op by op, so the same results to the bit (the compute sum also adds +0.0 for
 * each collective, which leaves a sum of durations unchanged). */
typedef struct step {
  int32_t op;         /* >= 0: this op alone; < 0: a run */
  int32_t t_lo, t_hi; /* run: every timed op's duration, in order (prog_t), and beside it
                         prog_c: a compute kernel's duration, 0.0 for a collective */
  int32_t k_hi;       /* compute-stream collectives' durations prog_k[k_lo, k_hi) */
  int32_t m_hi;       /* memory events prog_m[m_lo, m_hi) */
  int32_t k_lo, m_lo;
} step;

typedef struct mev {
  int64_t delta; /* scaled; > 0 can raise a peak */
  int32_t cat;
} mev;

/* Buffers of the compiled schedule (a workspace's), grown to the largest schedule seen: the
 * ops whose end time is kept (ascending), per segment whether every op runs in every
 * micro-batch (no `when` filtering) and its first step, the steps and the runs' arrays. */
typedef struct prog_buf {
  int32_t *keep;
  size_t keep_cap;
  uint8_t *seg_plain;
  size_t seg_plain_cap;
  int32_t *seg_step;
  size_t seg_step_cap;
  step *steps;
  size_t steps_cap;
  double *t, *c, *k;
  size_t t_cap, c_cap, k_cap;
  uint8_t *sb; /* per timed op of a run, as t: its sm_bound */
  size_t sb_cap;
  mev *m;
  size_t m_cap;
} prog_buf;

/* What the time simulation accumulates; snapshots of it give per-repetition advances. */
typedef struct accum {
  double free_t[MP_STREAM_COUNT];
  double comm_busy[MP_STREAM_COUNT];
  double compute, opt, wait;
} accum;

/* The collectives in flight beside the compute stream that hold SMs (cop.sms): per stream,
 * in order, the intervals the compute stream has not yet passed. A stream runs one op at a
 * time, so its intervals are disjoint and ascending. Past MP_SIM_SM_QUEUE pending intervals
 * on a stream, a new one is merged into the last (its end extended, the larger SM count
 * kept): collectives queued that deep run back to back. */
#define MP_SIM_SM_QUEUE 256
typedef struct sm_interval {
  double start_s, end_s;
  int sms;
} sm_interval;
typedef struct sm_queue {
  int head, n;
  sm_interval iv[MP_SIM_SM_QUEUE];
} sm_queue;

/* Peak of a window (a repetition or a micro-batch). */
typedef struct tracker {
  int on;
  int64_t start[MP_MEM_COUNT];
  int64_t peak_tot;
  int64_t peak_bd[MP_MEM_COUNT];
} tracker;

typedef struct sim {
  const mp_schedule *s;
  const cop *ops;     /* the schedule's ops compiled for the loop */
  const double *dur;
  double *end_cur, *end_prev;
  accum a;
  int64_t level[MP_MEM_COUNT], level_tot, peak_tot, at_peak[MP_MEM_COUNT], cat_max[MP_MEM_COUNT];
  tracker rep_trk, micro_trk;
  const int32_t *keep; /* ops that keep an end time, ascending */
  int32_t n_keep;
  const uint8_t *seg_plain; /* per segment: every op runs in every micro-batch */
  const int32_t *seg_step;  /* per segment: its steps are steps[seg_step[i], seg_step[i+1]) */
  const step *steps;
  const double *prog_t, *prog_c, *prog_k;
  const uint8_t *prog_sb;
  const mev *prog_m;
  int64_t n_micro;
  /* the pipeline's view of a micro-batch (sim/pipeline.c): per model chunk the compute
   * stream's time in its forward and backward segments, in micro-batch rec_micro (a steady
   * one: the second when there are several); the ACTIVATIONS a chunk's forward leaves held
   * (micro-batch 0); the compute stream's time when the micro-batches start and end, and
   * the last micro-batch's (0 with one micro-batch) */
  int32_t rec_micro;
  double chunk_s[2][MP_PP_MAX_VIRTUAL];
  int64_t chunk_held[MP_PP_MAX_VIRTUAL];
  double mb_start_s, mb_end_s, last_micro_s;
  int extrapolate;
  /* stop_s > 0: the step stops after micro-batch rec_micro (stopped 1) when its chunk
   * times with fb_save give mp_sim_times_step_lb_s over stop_v chunks past stop_s
   * (mp_sim_stage_run_until) */
  double stop_s;
  double fb_save[MP_PP_MAX_VIRTUAL];
  int stop_v, stopped;
  int cat_max_stale; /* some level[c] may exceed cat_max[c] (after skip_mem) */
  mp_sim_trace *trace;
  int trace_failed; /* 0, or why the trace stopped: MP_SIM_TRACE_FAILED_* (the step then
                       ends early and its figures are not used) */
  int gpu_sms;      /* the GPU's SMs (0: the profile states none: no contention priced) */
  int sm_pending;   /* intervals in the queues below, all streams */
  double busy_since; /* when the compute stream last started after a wait */
  /* last (mp_sim_engine_init zeroes only the fields above and the queues' counts) */
  sm_queue smq[MP_STREAM_COUNT];
} sim;

/* The most events a trace holds: the JSON of 2^20 events is about 150 MB, what the Chrome
 * trace viewer and Perfetto's UI still load; the cJSON tree built to write it is several
 * times that. */
#define MP_SIM_TRACE_MAX_EVENTS ((size_t)1 << 20)
enum { MP_SIM_TRACE_FAILED_NOMEM = 1, MP_SIM_TRACE_FAILED_TOO_LONG = 2 };

/* The buffers of one simulation, sized for its schedule: views into the workspace
 * (sim/workspace.h), valid until its next simulation. */
typedef struct sim_bufs {
  double *dur, *end_cur, *end_prev; /* per op: duration, end of the current and the
                                       previous instance */
  cop *cops;                        /* per op */
  prog_buf *prog;                   /* the segments' programs; per segment seg_plain */
} sim_bufs;

/* ---- engine.c ---- */

/* Buffers for s: end times zeroed, every segment plain (cost.c clears seg_plain where an
 * op's `when` filters). MP_ERR_NOMEM when they cannot grow. */
mp_status mp_sim_bufs_get(mp_ctx *ctx, mp_sim_workspace *ws, const mp_schedule *s,
                          sim_bufs *out);
/* x ready to run s from the compiled ops in b (their programs compiled here) on a GPU of
 * gpu_sms SMs (0: no SM contention priced); extrapolate 0 runs every instance (with a
 * trace). */
void mp_sim_engine_init(sim *x, const mp_schedule *s, const sim_bufs *b, int gpu_sms, int extrapolate);
/* Runs the step: the prologue, the micro-batches (first, middle ones until steady, last),
 * the optimizer (the pipeline's view of a micro-batch recorded on the way). */
void mp_sim_run_step(sim *x);

/* ---- cost.c ---- */

/* Peak FLOP/s of a dtype on g (the bf16 one where g states none for it). */
double mp_sim_peak_flops(const mp_gpu *g, int dtype);
/* cfg's stack, or the default one of its cluster's GPU (loaded once per workspace,
 * cfg->ws, which must be set). */
mp_status mp_sim_resolve_stack(mp_ctx *ctx, const mp_sim_config *cfg, const mp_stack_profile **out);
/* Compiles s's ops into b->cops and b->dur with the costs of cluster cl and stack prof
 * (links: the groups' links, or NULL to look them up), and clears b->prog->seg_plain of
 * the segments whose ops some micro-batches skip. The pipeline's sends and receives (pp
 * group) take no time in the engine: their durations go to *p2p (the forward's and the
 * backward's send of one chunk), which the pipeline timeline charges between stages. */
mp_status mp_sim_compile_ops(mp_ctx *ctx, const mp_schedule *s, const mp_cluster *cl, const mp_stack_profile *prof,
                             const mp_sim_link *links, sim_bufs *b, double p2p[2]);

#endif
