/* The simulator's core: costs one rank's step schedule (exec/schedule.h).
 *
 * Time. An event simulation in issue order: every stream keeps the time it is free; an op
 * starts at max(its stream free, the ends of its dependencies) and runs for its cost
 * (compute: roofline with the stack's efficiency, sim/cost below; communication:
 * sim/network.c). The compute stream's idle time while it waits on a dependency is
 * exposed communication (TP/EP collectives, which run on the compute stream, count as
 * exposed too); step time is when the last stream falls idle, plus the pipeline bubble.
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
 * Periodicity (the planner's hot path). A segment repeated R > 4 times is simulated rep by
 * rep until two consecutive repetitions advance every stream by the same amount (steady
 * state of the max-plus recurrence); the repetitions up to the last are then skipped by
 * shifting stream times, accumulators and the segment's op end times by k x that advance,
 * and the memory levels by k x the net change per repetition (the in-repetition peak is
 * linear in the repetition index, so its maximum is at the first or the last skipped one).
 * The last repetition is simulated again so the next segment sees exact end times.
 * Micro-batches are treated the same way: the first and the last are simulated, the
 * middle ones until steady, then extrapolated. With a trace nothing is extrapolated (the
 * trace shows every instance).
 *
 * Hot loop. The schedule's ops are compiled once per simulation into `cop`s (durations,
 * scaled memory deltas, cross-stream dependencies only) and each segment into a program of
 * steps (see `step`): runs of dependency-free compute-stream ops and memory events are
 * executed as separate ordered chains (time, busy sums, memory), every other op one by
 * one; only ops some dependency reads keep end times. Every shortcut performs the same
 * floating-point operations in the same order as op by op, so results are identical to
 * the bit (the trace path, which runs op by op, is the reference).
 *
 * No allocation per op: per-op arrays live in per-thread scratch buffers that grow to
 * the largest schedule seen and are reused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim/gemm_table.h"
#include "sim/sim.h"
#include "sim/sim_internal.h"
#include "sim/stack.h"

/* ---- scratch ---------------------------------------------------------------------- */

static _Thread_local double *g_scratch;
static _Thread_local size_t g_scratch_cap;

/* The hot loop's view of an op (see `cop` below), per-thread buffer like g_scratch. */
typedef struct cop {
  double dur;         /* seconds */
  int64_t mem_delta;  /* ALLOC: +bytes, FREE: -bytes; ACTIVATIONS already scaled by the
                         stack's saved_act_factor (mem_scaled) */
  int32_t dep[MP_OP_MAX_DEPS]; /* valid op indices only */
  uint8_t n_dep;
  uint8_t dep_skip0;  /* bit d: MP_DEP_PREV_REP, ignored in a first repetition */
  uint8_t dep_prev;   /* bit d: read the previous instance's end (end_prev) */
  uint8_t stream;     /* resolved (out-of-range streams run on compute, as before) */
  uint8_t kind;       /* COP_* */
  uint8_t when;
  int8_t mem_cat;     /* -1: outside the categories (no memory effect) */
  uint8_t keep_end;   /* some dependency reads its end time: only these ops keep one */
} cop;

/* Timed kinds first, then the memory events: `kind >= COP_ALLOC` is one test in the hot
 * loop. COP_ALLOC is an event whose (scaled) delta is positive, the only ones that can
 * raise a peak; COP_FREE a non-positive one; COP_NOMEM one outside the categories. */
enum { COP_COMPUTE = 0, COP_OPT, COP_COMM, COP_OTHER, COP_ALLOC, COP_FREE, COP_NOMEM };

static _Thread_local cop *g_cops;
static _Thread_local size_t g_cops_cap;

static cop *cop_buf(size_t n) {
  if (n > g_cops_cap) {
    cop *p = (cop *)realloc(g_cops, n * sizeof *p);
    if (p == NULL) return NULL;
    g_cops = p;
    g_cops_cap = n;
  }
  return g_cops;
}

/* Segment programs (run_rep's fast path). A segment's ops compile to steps: a step is
 * either one op run as in run_op (`op` >= 0), or a run of consecutive "plain" ops
 * (`op` < 0): memory events whose end time nobody reads, and dependency-free compute
 * stream ops (compute kernels or collectives) whose end time nobody reads. Such an op
 * starts when the compute stream is free, so within a run the time chain is
 * fc = fc + d op after op, the compute and collective busy sums add their ops' durations
 * in order, and the memory events apply in order; none of the three reads another, so the
 * run does each as its own loop over contiguous arrays: the same additions in the same
 * order as op by op, so the same results to the bit. */
typedef struct step {
  int32_t op;         /* >= 0: this op alone; < 0: a run */
  int32_t t_lo, t_hi; /* run: every timed op's duration, in order (prog_t) */
  int32_t c_hi;       /* compute kernels' durations prog_c[c_lo, c_hi), c_lo = previous c_hi */
  int32_t k_hi;       /* compute-stream collectives' durations prog_k[k_lo, k_hi) */
  int32_t m_hi;       /* memory events prog_m[m_lo, m_hi) */
  int32_t c_lo, k_lo, m_lo;
} step;

typedef struct mev {
  int64_t delta; /* scaled; > 0 can raise a peak */
  int32_t cat;
} mev;

/* Per-thread buffers of the compiled schedule, grown to the largest schedule seen: the
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
  mev *m;
  size_t m_cap;
  int32_t *attn; /* attention ops (context parallelism's adjustment) */
  size_t attn_cap;
} prog_buf;

static _Thread_local prog_buf g_prog;

static int grow(void **p, size_t *cap, size_t n, size_t elem) {
  if (n <= *cap) return 1;
  void *q = realloc(*p, n * elem);
  if (q == NULL) return 0;
  *p = q;
  *cap = n;
  return 1;
}

static void prog_release(prog_buf *b) {
  free(b->keep);
  free(b->seg_plain);
  free(b->seg_step);
  free(b->steps);
  free(b->t);
  free(b->c);
  free(b->k);
  free(b->m);
  free(b->attn);
  memset(b, 0, sizeof *b);
}

/* Room for a schedule of n_ops ops in n_segs segments. */
static int prog_reserve(prog_buf *b, size_t n_ops, size_t n_segs) {
  n_ops = n_ops > 0 ? n_ops : 1;
  return grow((void **)&b->keep, &b->keep_cap, n_ops, sizeof *b->keep) &&
         grow((void **)&b->seg_plain, &b->seg_plain_cap, n_segs + 1, 1) &&
         grow((void **)&b->seg_step, &b->seg_step_cap, n_segs + 1, sizeof *b->seg_step) &&
         grow((void **)&b->steps, &b->steps_cap, n_ops + n_segs, sizeof *b->steps) &&
         grow((void **)&b->t, &b->t_cap, n_ops, sizeof *b->t) &&
         grow((void **)&b->c, &b->c_cap, n_ops, sizeof *b->c) &&
         grow((void **)&b->k, &b->k_cap, n_ops, sizeof *b->k) &&
         grow((void **)&b->m, &b->m_cap, n_ops, sizeof *b->m) &&
         grow((void **)&b->attn, &b->attn_cap, n_ops, sizeof *b->attn);
}

static double *scratch(size_t n) {
  if (n > g_scratch_cap) {
    double *p = (double *)realloc(g_scratch, n * sizeof *p);
    if (p == NULL) return NULL;
    g_scratch = p;
    g_scratch_cap = n;
  }
  return g_scratch;
}

void mp_sim_thread_release(void) {
  free(g_scratch);
  g_scratch = NULL;
  g_scratch_cap = 0;
  free(g_cops);
  g_cops = NULL;
  g_cops_cap = 0;
  prog_release(&g_prog);
  mp_sim_network_release();
  mp_sim_plan_release();
}

/* ---- state ------------------------------------------------------------------------ */

/* What the time simulation accumulates; snapshots of it give per-repetition advances. */
typedef struct accum {
  double free_t[MP_STREAM_COUNT];
  double comm_busy[MP_STREAM_COUNT];
  double compute, opt, wait;
} accum;

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
  int64_t act_base, act_rise;
  const int32_t *keep; /* ops that keep an end time, ascending */
  int32_t n_keep;
  const uint8_t *seg_plain; /* per segment: every op runs in every micro-batch */
  const int32_t *seg_step;  /* per segment: its steps are steps[seg_step[i], seg_step[i+1]) */
  const step *steps;
  const double *prog_t, *prog_c, *prog_k;
  const mev *prog_m;
  int64_t n_micro;
  int extrapolate;
  int cat_max_stale; /* some level[c] may exceed cat_max[c] (after skip_mem) */
  mp_sim_trace *trace;
  int trace_failed;
} sim;

/* A memory state worth checking for peaks: the levels after an allocation, or a skipped
 * window's extreme. tot is the sum of bd. */
static void mem_candidate_tot(sim *x, const int64_t bd[MP_MEM_COUNT], int64_t tot) {
  if (tot > x->peak_tot) {
    x->peak_tot = tot;
    memcpy(x->at_peak, bd, sizeof x->at_peak);
  }
  if (x->rep_trk.on && tot > x->rep_trk.peak_tot) {
    x->rep_trk.peak_tot = tot;
    memcpy(x->rep_trk.peak_bd, bd, sizeof x->rep_trk.peak_bd);
  }
  if (x->micro_trk.on && tot > x->micro_trk.peak_tot) {
    x->micro_trk.peak_tot = tot;
    memcpy(x->micro_trk.peak_bd, bd, sizeof x->micro_trk.peak_bd);
  }
  if (bd[MP_MEM_ACTIVATIONS] - x->act_base > x->act_rise)
    x->act_rise = bd[MP_MEM_ACTIVATIONS] - x->act_base;
}

static void cat_max_all(sim *x, const int64_t bd[MP_MEM_COUNT]) {
  for (int c = 0; c < MP_MEM_COUNT; c++)
    if (bd[c] > x->cat_max[c]) x->cat_max[c] = bd[c];
}

static void mem_candidate(sim *x, const int64_t bd[MP_MEM_COUNT]) {
  int64_t tot = 0;
  for (int c = 0; c < MP_MEM_COUNT; c++) tot += bd[c];
  cat_max_all(x, bd);
  mem_candidate_tot(x, bd, tot);
}

/* The scaled delta of a memory event (ACTIVATIONS by the stack's saved_act_factor): the
 * same rounding for an ALLOC and its FREE, so levels stay balanced. */
static int64_t mem_scaled(int cat, int64_t delta, double act_factor) {
  if (cat == MP_MEM_ACTIVATIONS && act_factor != 1.0)
    delta = delta > 0 ? (int64_t)((double)delta * act_factor)
                      : -(int64_t)((double)-delta * act_factor);
  return delta;
}

/* The memory effect of a positive (already scaled) delta of category cat; *tot is the sum
 * of the levels (x->level_tot, or run_rep's register copy of it). A non-positive delta
 * only moves the levels (mem_release). */
static inline __attribute__((always_inline)) void mem_raise(sim *x, int cat, int64_t delta,
                                                            int64_t *tot) {
  x->level[cat] += delta;
  *tot += delta;
  /* the total is the exact sum of the levels (integers, kept in step). Every category's
   * high-water mark already covers its level unless a skip moved the levels: then all
   * are checked, as a candidate of the full state would be. */
  if (x->cat_max_stale) {
    cat_max_all(x, x->level);
    x->cat_max_stale = 0;
  } else if (x->level[cat] > x->cat_max[cat]) {
    x->cat_max[cat] = x->level[cat];
  }
  mem_candidate_tot(x, x->level, *tot);
}

static inline __attribute__((always_inline)) void mem_release(sim *x, int cat, int64_t delta,
                                                              int64_t *tot) {
  x->level[cat] += delta;
  *tot += delta;
}

static void trk_start(sim *x, tracker *t) {
  t->on = 1;
  memcpy(t->start, x->level, sizeof t->start);
  memcpy(t->peak_bd, x->level, sizeof t->peak_bd);
  t->peak_tot = x->level_tot;
}

static void trace_push(sim *x, int32_t op, int32_t layer, int32_t micro, double start,
                       double dur) {
  mp_sim_trace *t = x->trace;
  if (t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 1024;
    mp_sim_event *e = (mp_sim_event *)realloc(t->ev, cap * sizeof *e);
    if (e == NULL) {
      x->trace_failed = 1;
      return;
    }
    t->ev = e;
    t->cap = cap;
  }
  mp_sim_event *e = &t->ev[t->n++];
  e->start_s = start;
  e->dur_s = dur;
  e->op = op;
  e->layer = layer;
  e->micro = micro;
}

/* Runs one op instance; returns 1 with its start time when a timed op ran (for the
 * trace), 0 for a memory event or an op its `when` skips. The trace's path: every end
 * time is kept. */
static inline int run_op(sim *x, int32_t idx, int32_t rep, int32_t micro, double *t_start) {
  const cop *op = &x->ops[idx];
  if (micro >= 0) {
    if ((op->when == MP_WHEN_FIRST_MICRO || op->when == MP_WHEN_ONCE) && micro != 0) return 0;
    if (op->when == MP_WHEN_LAST_MICRO && micro != x->n_micro - 1) return 0;
  }
  const int st = op->stream;
  double *end_cur = x->end_cur, *end_prev = x->end_prev;
  if (op->kind >= COP_ALLOC) {
    if (op->kind == COP_ALLOC)
      mem_raise(x, op->mem_cat, op->mem_delta, &x->level_tot);
    else if (op->kind == COP_FREE)
      mem_release(x, op->mem_cat, op->mem_delta, &x->level_tot);
    end_prev[idx] = end_cur[idx];
    end_cur[idx] = x->a.free_t[st];
    return 0;
  }
  double t0 = x->a.free_t[st], ready = 0.0;
  for (int d = 0; d < op->n_dep; d++) {
    const unsigned bit = 1u << d;
    if ((op->dep_skip0 & bit) && rep == 0) continue;
    const double e = (op->dep_prev & bit) ? end_prev[op->dep[d]] : end_cur[op->dep[d]];
    if (e > ready) ready = e;
  }
  double start = t0 > ready ? t0 : ready, d = op->dur;
  if (st == MP_STREAM_COMPUTE) x->a.wait += start - t0;
  if (op->kind == COP_COMPUTE)
    x->a.compute += d;
  else if (op->kind == COP_OPT)
    x->a.opt += d;
  else if (op->kind == COP_COMM)
    x->a.comm_busy[st] += d;
  end_prev[idx] = end_cur[idx];
  end_cur[idx] = start + d;
  x->a.free_t[st] = start + d;
  *t_start = start;
  return 1;
}

/* The simulation state run_rep keeps in registers (see run_rep). */
typedef struct regs {
  double compute, opt, wait, fc;
  int64_t level_tot;
} regs;

/* One op as run_op runs it, without the trace: the same additions in the same order, so
 * the same results to the bit, with two shortcuts that change no result:
 *   - only ops some dependency reads (keep_end) store their end times; nothing else
 *     reads them (skip_time shifts only those too);
 *   - an op without dependencies starts when its stream is free: ready stays 0.0 and the
 *     stream's free time is >= 0, so start = t0 and the wait grows by +0.0, which leaves
 *     it unchanged (it is >= +0.0).
 * mem_raise and mem_release only touch the memory levels, never the times. */
static inline __attribute__((always_inline)) void run_one(sim *x, regs *r, int32_t idx,
                                                          int32_t rep) {
  const cop *op = &x->ops[idx];
  double *restrict free_t = x->a.free_t;
  double *restrict end_cur = x->end_cur, *restrict end_prev = x->end_prev;
  const int st = op->stream;
  const int on_c = st == MP_STREAM_COMPUTE;
  const unsigned kind = op->kind;
  if (kind >= COP_ALLOC) {
    if (kind == COP_ALLOC)
      mem_raise(x, op->mem_cat, op->mem_delta, &r->level_tot);
    else if (kind == COP_FREE)
      mem_release(x, op->mem_cat, op->mem_delta, &r->level_tot);
    if (op->keep_end) {
      end_prev[idx] = end_cur[idx];
      end_cur[idx] = on_c ? r->fc : free_t[st];
    }
    return;
  }
  const double d = op->dur;
  if (kind == COP_COMPUTE)
    r->compute += d;
  else if (kind == COP_OPT)
    r->opt += d;
  else if (kind == COP_COMM)
    x->a.comm_busy[st] += d;
  double end;
  if (op->n_dep == 0) {
    end = (on_c ? r->fc : free_t[st]) + d;
  } else {
    const double t0 = on_c ? r->fc : free_t[st];
    double ready = 0.0;
    const unsigned skip = rep == 0 ? op->dep_skip0 : 0u;
    for (int k = 0; k < op->n_dep; k++) {
      const unsigned bit = 1u << k;
      if (skip & bit) continue;
      const double e = (op->dep_prev & bit) ? end_prev[op->dep[k]] : end_cur[op->dep[k]];
      if (e > ready) ready = e;
    }
    const double start = t0 > ready ? t0 : ready;
    if (on_c) r->wait += start - t0;
    end = start + d;
  }
  if (op->keep_end) {
    end_prev[idx] = end_cur[idx];
    end_cur[idx] = end;
  }
  if (on_c)
    r->fc = end;
  else
    free_t[st] = end;
}

static void run_rep(sim *x, const mp_segment *g, int32_t rep, int32_t micro) {
  const int32_t first = g->first_op, last = g->first_op + g->n_ops;
  double t;
  if (x->trace != NULL) {
    for (int32_t idx = first; idx < last; idx++) {
      if (!run_op(x, idx, rep, micro, &t)) continue;
      int32_t l = x->s->ops[idx].layer;
      int32_t layer = l >= 0 ? l + rep * g->layer_step : l;
      trace_push(x, idx, layer, micro, t, x->ops[idx].dur);
    }
    return;
  }
  /* The accumulators in locals: end_cur and end_prev are doubles too, so through x the
   * compiler would store and reload them at every op. */
  regs r = {x->a.compute, x->a.opt, x->a.wait, x->a.free_t[MP_STREAM_COMPUTE], x->level_tot};
  const int32_t si = (int32_t)(g - x->s->segs);
  if (micro >= 0 && !x->seg_plain[si] && (micro != 0 || micro != x->n_micro - 1)) {
    /* a segment with ops some micro-batches skip: op by op, `when` tested */
    const int not_first = micro != 0, not_last = micro != x->n_micro - 1;
    for (int32_t idx = first; idx < last; idx++) {
      const cop *op = &x->ops[idx];
      if (not_first && (op->when == MP_WHEN_FIRST_MICRO || op->when == MP_WHEN_ONCE)) continue;
      if (not_last && op->when == MP_WHEN_LAST_MICRO) continue;
      run_one(x, &r, idx, rep);
    }
  } else {
    const step *restrict sp = x->steps;
    const double *restrict pt = x->prog_t, *restrict pc = x->prog_c, *restrict pk = x->prog_k;
    const mev *restrict pm = x->prog_m;
    for (int32_t j = x->seg_step[si], e = x->seg_step[si + 1]; j < e; j++) {
      const step *q = &sp[j];
      if (q->op >= 0) {
        run_one(x, &r, q->op, rep);
        continue;
      }
      double fc = r.fc, compute = r.compute;
      for (int32_t i = q->t_lo; i < q->t_hi; i++) fc += pt[i];
      for (int32_t i = q->c_lo; i < q->c_hi; i++) compute += pc[i];
      r.fc = fc;
      r.compute = compute;
      if (q->k_hi > q->k_lo) {
        double kb = x->a.comm_busy[MP_STREAM_COMPUTE];
        for (int32_t i = q->k_lo; i < q->k_hi; i++) kb += pk[i];
        x->a.comm_busy[MP_STREAM_COMPUTE] = kb;
      }
      for (int32_t i = q->m_lo; i < q->m_hi; i++) {
        if (pm[i].delta > 0)
          mem_raise(x, pm[i].cat, pm[i].delta, &r.level_tot);
        else
          mem_release(x, pm[i].cat, pm[i].delta, &r.level_tot);
      }
    }
  }
  x->level_tot = r.level_tot;
  x->a.free_t[MP_STREAM_COMPUTE] = r.fc;
  x->a.compute = r.compute;
  x->a.opt = r.opt;
  x->a.wait = r.wait;
}

static void accum_sub(const accum *a, const accum *b, accum *out) {
  for (int s = 0; s < MP_STREAM_COUNT; s++) {
    out->free_t[s] = a->free_t[s] - b->free_t[s];
    out->comm_busy[s] = a->comm_busy[s] - b->comm_busy[s];
  }
  out->compute = a->compute - b->compute;
  out->opt = a->opt - b->opt;
  out->wait = a->wait - b->wait;
}

static int close_enough(double u, double v) {
  double m = fabs(u) > fabs(v) ? fabs(u) : fabs(v);
  return fabs(u - v) <= 1e-9 * m + 1e-15;
}

static int same_advance(const accum *d1, const accum *d2) {
  for (int s = 0; s < MP_STREAM_COUNT; s++)
    if (!close_enough(d1->free_t[s], d2->free_t[s]) ||
        !close_enough(d1->comm_busy[s], d2->comm_busy[s]))
      return 0;
  return close_enough(d1->compute, d2->compute) && close_enough(d1->wait, d2->wait) &&
         close_enough(d1->opt, d2->opt);
}

/* Skips k windows that each advance time by d: shifts the state and the end times of
 * the ops in [first, first + n) that keep one (the others are never read). */
static void skip_time(sim *x, int64_t k, const accum *d, int32_t first, int32_t n) {
  double kk = (double)k;
  for (int s = 0; s < MP_STREAM_COUNT; s++) {
    x->a.free_t[s] += kk * d->free_t[s];
    x->a.comm_busy[s] += kk * d->comm_busy[s];
  }
  x->a.compute += kk * d->compute;
  x->a.opt += kk * d->opt;
  x->a.wait += kk * d->wait;
  /* the kept ops are listed ascending: find the first at or after `first` */
  int32_t lo = 0, hi = x->n_keep;
  while (lo < hi) {
    int32_t mid = (lo + hi) / 2;
    if (x->keep[mid] < first) lo = mid + 1;
    else hi = mid;
  }
  for (int32_t j = lo; j < x->n_keep && x->keep[j] < first + n; j++) {
    const int32_t i = x->keep[j];
    int st = x->ops[i].stream;
    x->end_cur[i] += kk * d->free_t[st];
    x->end_prev[i] += kk * d->free_t[st];
  }
}

/* Skips k windows with the memory pattern of the window just simulated (tracked by t,
 * which started at t->start and ends at the current level). */
static void skip_mem(sim *x, int64_t k, const tracker *t) {
  int64_t D[MP_MEM_COUNT], cand[MP_MEM_COUNT];
  for (int c = 0; c < MP_MEM_COUNT; c++) D[c] = x->level[c] - t->start[c];
  int64_t is[2] = {1, k};
  for (int j = 0; j < 2; j++) {
    for (int c = 0; c < MP_MEM_COUNT; c++) cand[c] = t->peak_bd[c] + is[j] * D[c];
    mem_candidate(x, cand);
  }
  for (int c = 0; c < MP_MEM_COUNT; c++) {
    x->level[c] += k * D[c];
    x->level_tot += k * D[c];
  }
  x->cat_max_stale = 1;
}

static void run_segment(sim *x, const mp_segment *g, int32_t micro) {
  int32_t R = g->repeat < 1 ? 1 : g->repeat;
  if (!x->extrapolate || R <= 4) {
    for (int32_t r = 0; r < R; r++) run_rep(x, g, r, micro);
    return;
  }
  accum before, delta, prev;
  int have_prev = 0;
  for (int32_t r = 0; r < R; r++) {
    before = x->a;
    trk_start(x, &x->rep_trk);
    run_rep(x, g, r, micro);
    accum_sub(&x->a, &before, &delta);
    if (have_prev && r < R - 2 && same_advance(&delta, &prev)) {
      int32_t k = R - 2 - r; /* repetitions r+1 .. R-2; R-1 is simulated */
      skip_time(x, k, &delta, g->first_op, g->n_ops);
      skip_mem(x, k, &x->rep_trk);
      r = R - 2;
      have_prev = 0;
      continue;
    }
    prev = delta;
    have_prev = 1;
  }
  x->rep_trk.on = 0;
}

static int seg_is_step(const mp_segment *g) {
  return g->phase == MP_PHASE_PROLOGUE || g->phase == MP_PHASE_OPTIMIZER;
}

static void run_micro(sim *x, int32_t micro) {
  x->act_base = x->level[MP_MEM_ACTIVATIONS];
  for (int32_t i = 0; i < x->s->n_segs; i++)
    if (!seg_is_step(&x->s->segs[i])) run_segment(x, &x->s->segs[i], micro);
}

/* ---- costs ------------------------------------------------------------------------ */

static double peak_flops(const mp_gpu *g, int dtype) {
  double p = dtype < MP_DTYPE_COUNT ? g->peak_tflops[dtype] : 0.0;
  if (p <= 0) p = g->peak_tflops[MP_DTYPE_BF16];
  return p * 1e12;
}

/* The per-GPU, per-stack constants of mp_sim_compute_op_s, worked out once per schedule:
 * the same products of the same operands, so the same values to the bit. */
typedef struct op_costs {
  double hbm;                    /* achieved HBM bytes/s */
  double peak[MP_DTYPE_COUNT];   /* peak_flops of each dtype */
  int has_peak[MP_DTYPE_COUNT];  /* the GPU states a positive peak for the dtype */
  double attn_rate;              /* bf16 peak x attention_eff */
  double gemm_eff_max, fp8_gemm_eff_max, half_mnk, kernel_overhead_s;
  const mp_gemm_table *gemm_table;     /* the stack's by-shape correction (bf16), or NULL */
  const mp_gemm_table *fp8_gemm_table; /* the same for float8 GEMMs, or NULL */
  double hbm_k[MP_KERNEL_COUNT];   /* per kernel class: hbm, or its own efficiency's */
} op_costs;

static void op_costs_init(op_costs *k, const mp_gpu *g, const mp_stack_profile *p) {
  k->hbm = g->hbm_GBps * 1e9 * p->hbm_eff;
  for (int d = 0; d < MP_DTYPE_COUNT; d++) {
    k->peak[d] = peak_flops(g, d);
    k->has_peak[d] = !(g->peak_tflops[d] <= 0);
  }
  k->attn_rate = peak_flops(g, MP_DTYPE_BF16) * p->attention_eff;
  k->gemm_eff_max = p->gemm_eff_max;
  k->fp8_gemm_eff_max = p->fp8_gemm_eff_max;
  k->half_mnk = p->gemm_eff_half_mnk;
  k->kernel_overhead_s = p->kernel_overhead_s;
  k->gemm_table = p->gemm_table;
  k->fp8_gemm_table = p->fp8_gemm_table;
  for (int c = 0; c < MP_KERNEL_COUNT; c++)
    k->hbm_k[c] = g->hbm_GBps * 1e9 * (p->hbm_eff_kernel[c] > 0 ? p->hbm_eff_kernel[c] : p->hbm_eff);
}

static inline double op_compute_s(const mp_op *op, const op_costs *k) {
  const double hbm = op->kernel < MP_KERNEL_COUNT ? k->hbm_k[op->kernel] : k->hbm;
  double t_bytes = hbm > 0 ? op->bytes / hbm : 0.0, t_flops;
  const int dt = op->dtype < MP_DTYPE_COUNT ? op->dtype : MP_DTYPE_BF16;
  int fp8 = op->dtype == MP_DTYPE_FP8_E4M3 || op->dtype == MP_DTYPE_FP8_E5M2;
  if (op->kernel == MP_KERNEL_GEMM) {
    double size = (double)op->m * (double)op->n * (double)op->k *
                  (double)(op->batch > 0 ? op->batch : 1);
    double eff = (fp8 ? k->fp8_gemm_eff_max : k->gemm_eff_max) * size / (size + k->half_mnk);
    const mp_gemm_table *table = fp8 ? k->fp8_gemm_table : k->gemm_table;
    if (fp8 && !k->has_peak[op->dtype]) /* no fp8 units: runs as bf16 (not measured so) */
      eff = k->gemm_eff_max * size / (size + k->half_mnk);
    else if (table && op->batch <= 1) /* measured by shape: batch-1 GEMMs of that dtype */
      eff *= mp_gemm_table_factor(table, op->variant, (double)op->m, (double)op->n,
                                  (double)op->k);
    /* peak_flops of an unknown dtype is the bf16 one (dt) */
    t_flops = eff > 0 ? op->flops / (k->peak[dt] * eff) : 0.0;
  } else if (op->kernel == MP_KERNEL_ATTENTION) {
    t_flops = op->flops / k->attn_rate;
  } else {
    /* element-wise, norms, optimizer: CUDA cores, no tensor cores */
    t_flops = op->flops / k->peak[MP_DTYPE_FP32];
  }
  return (t_flops > t_bytes ? t_flops : t_bytes) + k->kernel_overhead_s;
}

double mp_sim_compute_op_s(const mp_op *op, const mp_gpu *g, const mp_stack_profile *p) {
  op_costs k;
  op_costs_init(&k, g, p);
  return op_compute_s(op, &k);
}

static _Thread_local mp_stack_profile g_default_stack[2];
static _Thread_local int g_default_loaded[2];

static mp_status resolve_stack(mp_ctx *ctx, const mp_sim_config *cfg,
                               const mp_stack_profile **out) {
  if (cfg->stack) {
    *out = cfg->stack;
    return MP_OK;
  }
  int i = !mp_gpu_is_cpu(&cfg->cluster->gpu);
  if (!g_default_loaded[i]) {
    MP_CHECK(mp_stack_default(ctx, &cfg->cluster->gpu, &g_default_stack[i]));
    g_default_loaded[i] = 1;
  }
  *out = &g_default_stack[i];
  return MP_OK;
}

double mp_sim_pp_inflight(const mp_plan *p, int stage, int64_t n_micro) {
  int pp = p->mesh.size[MP_DIM_PP];
  if (pp <= 1) return 1.0;
  double f;
  if (p->opts.pp_schedule == MP_PP_GPIPE) {
    f = (double)n_micro;
  } else if (p->opts.pp_schedule == MP_PP_INTERLEAVED && p->opts.pp_virtual > 1) {
    /* Megatron's interleaved 1F1B: rank `stage` runs (pp - stage - 1) x 2 + (v - 1) x pp
     * warm-up forward chunks before its first backward; each chunk is 1/v of the
     * rank's layers. */
    int v = p->opts.pp_virtual;
    f = ((double)(pp - stage - 1) * 2.0 + (double)(v - 1) * pp + 1.0) / v;
  } else {
    f = (double)(pp - stage);
  }
  if (f > (double)n_micro) f = (double)n_micro;
  return f < 1.0 ? 1.0 : f;
}

/* Compiles every segment's ops into steps (see `step`) and lists the segment ops that keep
 * their end time (ascending: segments cover ops in order); returns how many. */
static int32_t prog_compile(prog_buf *b, const mp_schedule *s, const cop *cops) {
  int32_t n_steps = 0, nt = 0, nc = 0, nk = 0, nm = 0, n_keep = 0;
  for (int32_t si = 0; si < s->n_segs; si++) {
    const mp_segment *g = &s->segs[si];
    b->seg_step[si] = n_steps;
    step *run = NULL;
    for (int32_t i = g->first_op; i < g->first_op + g->n_ops; i++) {
      const cop *c = &cops[i];
      if (c->keep_end) b->keep[n_keep++] = i;
      const int mem = c->kind >= COP_ALLOC;
      const int plain =
          !c->keep_end &&
          (mem || (c->stream == MP_STREAM_COMPUTE && c->n_dep == 0 &&
                   (c->kind == COP_COMPUTE || c->kind == COP_COMM)));
      if (!plain) {
        b->steps[n_steps++] = (step){i, 0, 0, 0, 0, 0, 0, 0, 0};
        run = NULL;
        continue;
      }
      if (c->kind == COP_NOMEM) continue; /* no memory effect, no time, no end time */
      if (run == NULL) {
        run = &b->steps[n_steps++];
        *run = (step){-1, nt, nt, nc, nk, nm, nc, nk, nm};
      }
      if (mem) {
        b->m[nm++] = (mev){c->mem_delta, c->mem_cat};
        run->m_hi = nm;
      } else {
        b->t[nt++] = c->dur;
        run->t_hi = nt;
        if (c->kind == COP_COMPUTE) {
          b->c[nc++] = c->dur;
          run->c_hi = nc;
        } else {
          b->k[nk++] = c->dur;
          run->k_hi = nk;
        }
      }
    }
  }
  b->seg_step[s->n_segs] = n_steps;
  return n_keep;
}

/* ---- the simulation --------------------------------------------------------------- */

mp_status mp_simulate(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                      mp_sim_result *out, mp_sim_trace **trace) {
  return mp_simulate_with_links(ctx, s, cfg, NULL, out, trace);
}

mp_status mp_simulate_with_links(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                                 const mp_sim_link *links, mp_sim_result *out,
                                 mp_sim_trace **trace) {
  if (s == NULL || cfg == NULL || cfg->cluster == NULL || out == NULL || s->plan == NULL)
    return mp_error(ctx, MP_ERR_INVALID,
                    "mp_simulate needs a schedule with its plan, a config with a cluster and an "
                    "output");
  if (cfg->mem_headroom < 0 || cfg->mem_headroom > 0.5)
    return mp_error(ctx, MP_ERR_INVALID, "memory headroom %g outside 0 .. 0.5", cfg->mem_headroom);
  const mp_stack_profile *prof;
  MP_CHECK(resolve_stack(ctx, cfg, &prof));
  const mp_cluster *cl = cfg->cluster;
  const mp_plan *plan = s->plan;
  const mp_mesh *mesh = &plan->mesh;
  memset(out, 0, sizeof *out);
  if (trace) *trace = NULL;

  double *buf = scratch((size_t)(s->n_ops > 0 ? s->n_ops : 1) * 3);
  cop *cops = cop_buf((size_t)(s->n_ops > 0 ? s->n_ops : 1));
  if (buf == NULL || cops == NULL)
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory simulating %d ops", s->n_ops);
  prog_buf *pb = &g_prog;
  if (!prog_reserve(pb, (size_t)s->n_ops, (size_t)s->n_segs))
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory simulating %d ops", s->n_ops);
  uint8_t *seg_plain = pb->seg_plain;
  double *dur = buf, *end_cur = buf + s->n_ops, *end_prev = buf + 2 * (size_t)s->n_ops;
  memset(end_cur, 0, 2 * (size_t)s->n_ops * sizeof *end_cur);
  memset(seg_plain, 1, (size_t)s->n_segs);
  const double act_factor = prof->saved_act_factor > 0 ? prof->saved_act_factor : 1.0;

  /* Links of the groups the schedule uses (computed once per group). */
  mp_sim_link link[MP_GROUP_COUNT];
  unsigned have_link = 0;
  int has_cp_comm = 0, has_p2p = 0;
  /* The segment each op belongs to decides which instance a MP_DEP_PREV_REP dependency
   * reads: the previous repetition's for ops earlier in the same segment. */
  int32_t seg_of_first = 0, seg_end = 0, si = 0;
  const int cp = mesh->size[MP_DIM_CP];
  int32_t n_attn = 0; /* attention ops (pb->attn) for the context-parallel adjustment below */
  int fwd_dep = 0;
  op_costs kc;
  op_costs_init(&kc, &cl->gpu, prof);
  for (int32_t i = 0; i < s->n_ops; i++) {
    const mp_op *op = &s->ops[i];
    while (i >= seg_end && si < s->n_segs) {
      seg_of_first = s->segs[si].first_op;
      seg_end = s->segs[si].first_op + s->segs[si].n_ops;
      si++;
    }
    if (i >= seg_end) seg_of_first = i; /* an op outside every segment never runs */
    else if (op->when != MP_WHEN_EVERY_MICRO) seg_plain[si - 1] = 0;
    cop *c = &cops[i];
    c->stream = op->stream < MP_STREAM_COUNT ? op->stream : MP_STREAM_COMPUTE;
    c->when = op->when;
    c->mem_cat = -1;
    c->mem_delta = 0;
    c->n_dep = 0;
    c->dep_skip0 = c->dep_prev = 0;
    c->keep_end = 0;
    if (op->type == MP_OP_ALLOC || op->type == MP_OP_FREE) {
      c->kind = COP_NOMEM;
      if (op->mem_cat < MP_MEM_COUNT) {
        c->mem_cat = (int8_t)op->mem_cat;
        c->mem_delta = mem_scaled(op->mem_cat,
                                  op->type == MP_OP_ALLOC ? op->mem_bytes : -op->mem_bytes,
                                  act_factor);
        c->kind = c->mem_delta > 0 ? COP_ALLOC : COP_FREE;
      }
    } else {
      c->kind = op->type == MP_OP_COMPUTE
                    ? (c->stream != MP_STREAM_COMPUTE ? COP_OTHER
                       : op->phase == MP_PHASE_OPTIMIZER ? COP_OPT : COP_COMPUTE)
                    : COP_COMM;
      for (int d = 0; d < op->n_dep && d < MP_OP_MAX_DEPS; d++) {
        const int32_t j = op->dep[d];
        if (j < 0 || j >= s->n_ops) continue;
        /* An op on the same stream ended (any instance of it) no later than the stream's
         * free time, which the op waits for anyway: end times never exceed their stream's
         * free time (both start equal, an op ends at start + dur >= the free time it
         * sets, skips add the same shift to both, and rounding is monotone), so such a
         * dependency never moves a start; dropping it leaves every result unchanged. */
        const int js = s->ops[j].stream < MP_STREAM_COUNT ? s->ops[j].stream : MP_STREAM_COMPUTE;
        if (js == c->stream) continue;
        const unsigned bit = 1u << c->n_dep;
        if (op->dep_flags[d] & MP_DEP_PREV_REP) {
          c->dep_skip0 |= (uint8_t)bit;
          if (j >= seg_of_first && j < i) c->dep_prev |= (uint8_t)bit;
        }
        c->dep[c->n_dep++] = j;
        /* the ops some dependency reads keep their end times */
        if (j < i)
          cops[j].keep_end = 1;
        else
          fwd_dep = 1;
      }
    }
    if (op->type == MP_OP_COMPUTE) {
      dur[i] = op_compute_s(op, &kc);
      if (op->kernel == MP_KERNEL_ATTENTION && cp > 1) pb->attn[n_attn++] = i;
    } else if (op->type == MP_OP_COMM) {
      int g = op->group < MP_GROUP_COUNT ? op->group : MP_GROUP_WORLD;
      if (!(have_link & (1u << g))) {
        if (links)
          link[g] = links[g];
        else
          MP_CHECK(mp_sim_group_link(ctx, cl, mesh, (mp_group)g, s->rank, &link[g]));
        have_link |= 1u << g;
      }
      int p2p = op->coll == MP_COLL_SEND || op->coll == MP_COLL_RECV;
      has_cp_comm |= g == MP_GROUP_CP;
      has_p2p |= p2p;
      if (link[g].n <= 1 && !p2p)
        dur[i] = 0.0;
      else
        dur[i] = mp_sim_collective_s((mp_coll)op->coll, op->bytes, link[g].n,
                                     link[g].GBps * prof->link_eff, link[g].lat_s) +
                 prof->comm_overhead_s;
    } else {
      dur[i] = 0.0;
    }
    c->dur = dur[i];
  }
  /* a malformed forward dependency still reads a kept end */
  if (fwd_dep)
    for (int32_t i = 0; i < s->n_ops; i++)
      for (int d = 0; d < cops[i].n_dep; d++) cops[cops[i].dep[d]].keep_end = 1;

  /* Context parallelism without explicit ring ops in the schedule: ring attention passes
   * the K/V block of each of the cp ranks around the ring (backward passes K/V and their
   * gradients, twice the bytes); each of the cp - 1 transfers overlaps the attention on
   * the block already held, so attention takes t/cp + (cp-1) x max(t/cp, block). */
  if (cp > 1 && !has_cp_comm) {
    mp_sim_link l;
    if (links)
      l = links[MP_GROUP_CP];
    else
      MP_CHECK(mp_sim_group_link(ctx, cl, mesh, MP_GROUP_CP, s->rank, &l));
    int tp = mesh->size[MP_DIM_TP];
    double kv_heads = (double)plan->model.n_kv_heads / (tp > 0 ? tp : 1);
    if (kv_heads < 1) kv_heads = 1;
    double kv_bytes = (double)s->micro_batch * (double)s->seq / cp * kv_heads *
                      (double)plan->model.head_dim * 2.0 /* K and V */ * 2.0 /* bf16 */;
    for (int32_t a = 0; a < n_attn; a++) {
      const int32_t i = pb->attn[a];
      const mp_op *op = &s->ops[i];
      double bytes = op->phase == MP_PHASE_BACKWARD ? 2.0 * kv_bytes : kv_bytes;
      double blk = mp_sim_collective_s(MP_COLL_SEND, bytes, 2, l.GBps * prof->link_eff, l.lat_s);
      double t = (dur[i] - prof->kernel_overhead_s) / cp;
      dur[i] = t + (cp - 1) * (t > blk ? t : blk) + prof->kernel_overhead_s;
      cops[i].dur = dur[i];
    }
  }

  const int32_t n_keep = prog_compile(pb, s, cops);

  sim x;
  memset(&x, 0, sizeof x);
  x.s = s;
  x.ops = cops;
  x.dur = dur;
  x.end_cur = end_cur;
  x.end_prev = end_prev;
  x.n_micro = s->n_micro > 0 ? s->n_micro : 1;
  x.extrapolate = !cfg->record_trace;
  x.keep = pb->keep;
  x.n_keep = n_keep;
  x.seg_plain = seg_plain;
  x.seg_step = pb->seg_step;
  x.steps = pb->steps;
  x.prog_t = pb->t;
  x.prog_c = pb->c;
  x.prog_k = pb->k;
  x.prog_m = pb->m;
  if (cfg->record_trace && trace) {
    x.trace = (mp_sim_trace *)calloc(1, sizeof *x.trace);
    if (x.trace == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the trace");
    x.trace->s = s;
  }

  /* prologue */
  for (int32_t i = 0; i < s->n_segs; i++)
    if (s->segs[i].phase == MP_PHASE_PROLOGUE) run_segment(&x, &s->segs[i], -1);
  /* micro-batches: first, middle ones until steady, last */
  double micro_t0 = x.a.free_t[MP_STREAM_COMPUTE];
  int64_t act_rise_max = 0, n = x.n_micro;
  x.act_rise = 0;
  run_micro(&x, 0);
  if (x.act_rise > act_rise_max) act_rise_max = x.act_rise;
  accum before, delta, prev;
  int have_prev = 0;
  int32_t first_micro_op = s->n_ops, last_micro_op = 0;
  for (int32_t i = 0; i < s->n_segs; i++)
    if (!seg_is_step(&s->segs[i])) {
      if (s->segs[i].first_op < first_micro_op) first_micro_op = s->segs[i].first_op;
      if (s->segs[i].first_op + s->segs[i].n_ops > last_micro_op)
        last_micro_op = s->segs[i].first_op + s->segs[i].n_ops;
    }
  for (int64_t m = 1; m <= n - 2; m++) {
    before = x.a;
    trk_start(&x, &x.micro_trk);
    x.act_rise = 0;
    run_micro(&x, (int32_t)m);
    if (x.act_rise > act_rise_max) act_rise_max = x.act_rise;
    accum_sub(&x.a, &before, &delta);
    if (x.extrapolate && have_prev && m < n - 2 && same_advance(&delta, &prev)) {
      int64_t k = n - 2 - m;
      if (last_micro_op > first_micro_op)
        skip_time(&x, k, &delta, first_micro_op, last_micro_op - first_micro_op);
      skip_mem(&x, k, &x.micro_trk);
      m = n - 2;
      continue;
    }
    prev = delta;
    have_prev = 1;
  }
  x.micro_trk.on = 0;
  if (n >= 2) {
    x.act_rise = 0;
    run_micro(&x, (int32_t)(n - 1));
    if (x.act_rise > act_rise_max) act_rise_max = x.act_rise;
  }
  double t_micro = (x.a.free_t[MP_STREAM_COMPUTE] - micro_t0) / (double)n;
  /* optimizer */
  for (int32_t i = 0; i < s->n_segs; i++)
    if (s->segs[i].phase == MP_PHASE_OPTIMIZER) run_segment(&x, &s->segs[i], -1);

  if (x.trace_failed) {
    mp_sim_trace_destroy(x.trace);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory recording the trace");
  }

  /* pipeline bubble: (pp - 1) micro-batch times of fill and drain (1F1B and GPipe alike),
   * divided by the virtual stages for interleaved; plus the boundary transfers of the
   * fill and drain when the schedule carries no P2P ops of its own. */
  int pp = mesh->size[MP_DIM_PP];
  double bubble = 0.0;
  if (pp > 1) {
    int v = plan->opts.pp_schedule == MP_PP_INTERLEAVED && plan->opts.pp_virtual > 1
                ? plan->opts.pp_virtual
                : 1;
    bubble = (pp - 1) * t_micro / v;
    if (!has_p2p) {
      mp_sim_link l;
      if (links)
        l = links[MP_GROUP_PP];
      else
        MP_CHECK(mp_sim_group_link(ctx, cl, mesh, MP_GROUP_PP, s->rank, &l));
      double act = (double)s->micro_batch * (double)s->seq / cp * (double)plan->model.d_model *
                   2.0 /* bf16 */;
      bubble += (pp - 1) * 2.0 *
                (mp_sim_collective_s(MP_COLL_SEND, act, 2, l.GBps * prof->link_eff, l.lat_s) +
                 prof->comm_overhead_s);
    }
  }

  double end = 0.0;
  for (int st = 0; st < MP_STREAM_COUNT; st++) {
    if (x.a.free_t[st] > end) end = x.a.free_t[st];
    out->comm_s[st] = x.a.comm_busy[st];
  }
  out->compute_s = x.a.compute;
  out->optimizer_s = x.a.opt;
  out->exposed_comm_s = end - x.a.compute - x.a.opt;
  if (out->exposed_comm_s < 0) out->exposed_comm_s = 0;
  out->bubble_s = bubble;
  out->step_time_s = end + bubble;

  int gpus_per_replica = mesh->size[MP_DIM_TP] * mesh->size[MP_DIM_CP] * pp;
  if (out->step_time_s > 0 && s->tokens_per_step_per_rank > 0) {
    out->tokens_per_s_per_gpu =
        (double)s->tokens_per_step_per_rank / (out->step_time_s * gpus_per_replica);
    /* model_flops_per_step is this rank's share of the replica's model FLOPs */
    out->mfu = s->model_flops_per_step / out->step_time_s / peak_flops(&cl->gpu, MP_DTYPE_BF16);
  }

  /* memory */
  double inflight = mp_sim_pp_inflight(plan, s->pp_stage, n);
  int64_t extra = (int64_t)((inflight - 1.0) * (double)act_rise_max);
  memcpy(out->mem_at_peak, x.at_peak, sizeof out->mem_at_peak);
  memcpy(out->mem_max, x.cat_max, sizeof out->mem_max);
  out->mem_max[MP_MEM_ACTIVATIONS] += extra;
  out->mem_at_peak[MP_MEM_ACTIVATIONS] += extra;
  int64_t alloc = x.peak_tot + extra;
  double reserved = (double)alloc * prof->frag_factor;
  double overhead = cl->gpu.runtime_overhead_gib * 1073741824.0;
  out->peak_mem_bytes = (int64_t)(reserved + overhead);
  out->overhead_bytes = out->peak_mem_bytes - alloc;
  out->capacity_bytes = (int64_t)(cl->gpu.mem_gib * 1073741824.0 * (1.0 - cfg->mem_headroom));
  out->fits = out->peak_mem_bytes <= out->capacity_bytes;
  if (trace) *trace = x.trace;
  return MP_OK;
}

void mp_sim_trace_destroy(mp_sim_trace *t) {
  if (t == NULL) return;
  free(t->ev);
  free(t);
}
