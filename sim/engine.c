/* The simulator's event engine: runs one rank's compiled schedule (engine.h) through the
 * step, op instance by op instance, keeping the streams' free times, the busy sums and
 * the memory levels and peaks (sim.c's opening comment gives the model).
 *
 * Periodicity (the planner's hot path). A segment repeated R > 4 times is simulated rep by
 * rep until two consecutive repetitions advance every stream by the same amount (steady
 * state of the max-plus recurrence) and no collective holding SMs from earlier work is
 * still in flight on a stream the repetition leaves behind (sm_settled: the repetitions
 * it slows advance alike, the one after it faster); the repetitions up to the last are
 * then skipped by shifting stream times, accumulators and the segment's op end times by
 * k x that advance (the compute stream's last start after a wait only where they waited),
 * and the memory levels by k x the net change per repetition (the in-repetition peak is
 * linear in the repetition index, so its maximum is at the first or the last skipped one).
 * The last repetition is simulated again so the next segment sees exact end times.
 * Micro-batches are treated the same way: the first and the last are simulated, the
 * middle ones until steady, then extrapolated. With a trace nothing is extrapolated (the
 * trace shows every instance).
 *
 * Hot loop. The schedule's ops are compiled once per simulation into `cop`s (cost.c:
 * durations, scaled memory deltas, cross-stream dependencies only) and each segment into
 * a program of steps (see `step`): runs of dependency-free compute-stream ops and memory
 * events are executed as separate ordered chains (time, busy sums, memory), every other
 * op one by one; only ops some dependency reads keep end times. Every shortcut performs
 * the same floating-point operations in the same order as op by op, so results are
 * identical to the bit (the trace path, which runs op by op, is the reference).
 *
 * No allocation per op: per-op arrays live in the caller's workspace (sim/workspace.h),
 * grown to the largest schedule seen and reused. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "sim/engine.h"
#include "sim/workspace.h"

/* ---- the workspace's buffers -------------------------------------------------------- */

/* Room for a schedule of n_ops ops in n_segs segments. */
static int prog_reserve(prog_buf *b, size_t n_ops, size_t n_segs) {
  n_ops = n_ops > 0 ? n_ops : 1;
  return mp_sim_grow((void **)&b->keep, &b->keep_cap, n_ops, sizeof *b->keep) &&
         mp_sim_grow((void **)&b->seg_plain, &b->seg_plain_cap, n_segs + 1, 1) &&
         mp_sim_grow((void **)&b->seg_step, &b->seg_step_cap, n_segs + 1, sizeof *b->seg_step) &&
         mp_sim_grow((void **)&b->steps, &b->steps_cap, n_ops + n_segs, sizeof *b->steps) &&
         mp_sim_grow((void **)&b->t, &b->t_cap, n_ops, sizeof *b->t) &&
         mp_sim_grow((void **)&b->c, &b->c_cap, n_ops, sizeof *b->c) &&
         mp_sim_grow((void **)&b->k, &b->k_cap, n_ops, sizeof *b->k) &&
         mp_sim_grow((void **)&b->sb, &b->sb_cap, n_ops, sizeof *b->sb) &&
         mp_sim_grow((void **)&b->m, &b->m_cap, n_ops, sizeof *b->m);
}

mp_status mp_sim_bufs_get(mp_ctx *ctx, mp_sim_workspace *ws, const mp_schedule *s,
                          sim_bufs *out) {
  const size_t n = (size_t)(s->n_ops > 0 ? s->n_ops : 1);
  if (!mp_sim_grow((void **)&ws->op_times, &ws->op_times_cap, n * 3, sizeof *ws->op_times) ||
      !mp_sim_grow((void **)&ws->cops, &ws->cops_cap, n, sizeof *ws->cops) ||
      !prog_reserve(&ws->prog, (size_t)s->n_ops, (size_t)s->n_segs))
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory simulating %d ops", s->n_ops);
  double *buf = ws->op_times;
  out->dur = buf;
  out->end_cur = buf + s->n_ops;
  out->end_prev = buf + 2 * (size_t)s->n_ops;
  out->cops = ws->cops;
  out->prog = &ws->prog;
  memset(out->end_cur, 0, 2 * (size_t)s->n_ops * sizeof *out->end_cur);
  memset(ws->prog.seg_plain, 1, (size_t)s->n_segs);
  return MP_OK;
}

/* ---- the state and its steps -------------------------------------------------------- */

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
  if (x->trace_failed) return;
  if (t->n == t->cap) {
    if (t->n >= MP_SIM_TRACE_MAX_EVENTS) {
      x->trace_failed = MP_SIM_TRACE_FAILED_TOO_LONG;
      return;
    }
    size_t cap = t->cap ? 2 * t->cap : 1024;
    if (cap > MP_SIM_TRACE_MAX_EVENTS) cap = MP_SIM_TRACE_MAX_EVENTS;
    mp_sim_event *e = (mp_sim_event *)realloc(t->ev, cap * sizeof *e);
    if (e == NULL) {
      x->trace_failed = MP_SIM_TRACE_FAILED_NOMEM;
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
  e->mem_delta = 0;
  e->mem_cat = -1;
}

/* A memory event in the trace (its time: its stream's, when it is issued), for the
 * trace's memory counter track. */
static void trace_push_mem(sim *x, int32_t idx, int32_t layer, int32_t micro) {
  const cop *op = &x->ops[idx];
  if (op->mem_cat < 0 || (op->kind != COP_ALLOC && op->kind != COP_FREE)) return;
  if (micro >= 0) {
    if ((op->when == MP_WHEN_FIRST_MICRO || op->when == MP_WHEN_ONCE) && micro != 0) return;
    if (op->when == MP_WHEN_LAST_MICRO && micro != x->n_micro - 1) return;
  }
  const size_t n = x->trace->n;
  trace_push(x, idx, layer, micro, x->a.free_t[op->stream], 0.0);
  if (x->trace->n == n + 1) {
    x->trace->ev[n].mem_delta = op->mem_delta;
    x->trace->ev[n].mem_cat = op->mem_cat;
  }
}

/* ---- SM contention ------------------------------------------------------------------ */

/* A collective that holds SMs (cop.sms) ran on stream st over [start, end): queued for the
 * compute stream's kernels that run beside it. */
static inline void sm_push(sim *x, int st, int sms, double start, double end) {
  if (sms <= 0 || x->gpu_sms <= 0 || !(end > start)) return;
  sm_queue *q = &x->smq[st];
  if (q->n == MP_SIM_SM_QUEUE) {
    sm_interval *last = &q->iv[(q->head + q->n - 1) % MP_SIM_SM_QUEUE];
    if (end > last->end_s) last->end_s = end;
    if (sms > last->sms) last->sms = sms;
    return;
  }
  q->iv[(q->head + q->n) % MP_SIM_SM_QUEUE] = (sm_interval){start, end, sms};
  q->n++;
  x->sm_pending++;
}

/* Drops the intervals that end by t: the compute stream's time never goes back. */
static void sm_drop(sim *x, double t) {
  for (int st = 0; st < MP_STREAM_COUNT; st++) {
    sm_queue *q = &x->smq[st];
    while (q->n > 0 && !(q->iv[q->head].end_s > t)) {
      q->head = (q->head + 1) % MP_SIM_SM_QUEUE;
      q->n--;
      x->sm_pending--;
    }
  }
}

/* The end of a flops-bound compute kernel that starts at t0 and takes d on the whole GPU.
 * Its CTAs run in waves over the SMs, so while collectives hold c of the GPU's S SMs it
 * progresses at (S - c) / S of its rate: the asymptote of ceil(tiles / (S - c)) waves
 * against ceil(tiles / S), the simulator knowing no kernel's tile count (cuBLAS picks the
 * tile at run time). The kernel is walked across the queued intervals' starts and ends:
 * its remaining work (seconds at the full rate) shrinks by the span x the rate of each
 * piece. With nothing in flight over [t0, t0 + d) it ends at t0 + d to the bit. */
static double contended_end(sim *x, double t0, double d) {
  sm_drop(x, t0);
  double t = t0, left = d;
  const double S = (double)x->gpu_sms;
  for (;;) {
    int held = 0;
    double next = HUGE_VAL;
    for (int st = 0; st < MP_STREAM_COUNT; st++) {
      const sm_queue *q = &x->smq[st];
      for (int j = 0; j < q->n; j++) {
        const sm_interval *v = &q->iv[(q->head + j) % MP_SIM_SM_QUEUE];
        if (!(v->end_s > t)) continue;
        if (v->start_s <= t) {
          held += v->sms;
          if (v->end_s < next) next = v->end_s;
        } else if (v->start_s < next) {
          next = v->start_s;
        }
        break;
      }
    }
    const double rate = held <= 0 ? 1.0 : held >= x->gpu_sms ? 1.0 / S : (S - (double)held) / S;
    if (next == HUGE_VAL || left <= (next - t) * rate) return t + left / rate;
    left -= (next - t) * rate;
    t = next;
  }
}

/* A collective that holds SMs ran over [start, end) while the compute stream's time is fc:
 * queued for the kernels to come, and where it started before fc (issued after kernels it
 * runs beside: a prefetch issued once the previous layer's kernels are in the stream)
 * those kernels lost its SMs over [start, min(end, fc)) after the compute stream last
 * waited (busy_since: its kernels ran back to back since): sms / S of that span's work,
 * done at fc at the rate the collectives in flight leave. The compute stream's time
 * after that work. The kernels over that span are taken to be flops-bound ones. */
static double sm_collective(sim *x, int st, int sms, double start, double end, double fc) {
  sm_push(x, st, sms, start, end);
  if (start < x->busy_since) start = x->busy_since;
  if (x->gpu_sms <= 0 || !(start < fc) || !(end > start)) return fc;
  const double span = (end < fc ? end : fc) - start;
  return contended_end(x, fc, span * (double)sms / (double)x->gpu_sms);
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
  if (st == MP_STREAM_COMPUTE && start > t0) x->busy_since = start;
  if (op->kind == COP_COMPUTE)
    x->a.compute += d;
  else if (op->kind == COP_OPT)
    x->a.opt += d;
  else if (op->kind == COP_COMM)
    x->a.comm_busy[st] += d;
  const double end = op->sm_bound && x->sm_pending ? contended_end(x, start, d) : start + d;
  MP_ASSERT(!(end < t0), "op %d: a stream's time never goes back", (int)idx);
  if (op->sms)
    x->a.free_t[MP_STREAM_COMPUTE] =
        sm_collective(x, st, op->sms, start, end, x->a.free_t[MP_STREAM_COMPUTE]);
  end_prev[idx] = end_cur[idx];
  end_cur[idx] = end;
  x->a.free_t[st] = end;
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
    const double start = on_c ? r->fc : free_t[st];
    end = op->sm_bound && x->sm_pending ? contended_end(x, start, d) : start + d;
    if (op->sms) r->fc = sm_collective(x, st, op->sms, start, end, r->fc);
  } else {
    const double t0 = on_c ? r->fc : free_t[st];
    double ready = 0.0;
    const unsigned skip = rep == 0 ? op->dep_skip0 : 0u;
    for (int k = 0; k < op->n_dep; k++) {
      const unsigned bit = 1u << k;
      if (skip & bit) continue;
      MP_ASSERT(op->dep[k] >= 0 && op->dep[k] < x->s->n_ops && x->ops[op->dep[k]].keep_end,
                "op %d: only ops that keep their end time store it; a dependency on another would read a stale one",
                (int)idx);
      const double e = (op->dep_prev & bit) ? end_prev[op->dep[k]] : end_cur[op->dep[k]];
      if (e > ready) ready = e;
    }
    const double start = t0 > ready ? t0 : ready;
    if (on_c) r->wait += start - t0;
    if (on_c && start > t0) x->busy_since = start;
    end = op->sm_bound && x->sm_pending ? contended_end(x, start, d) : start + d;
    if (op->sms) r->fc = sm_collective(x, st, op->sms, start, end, r->fc);
  }
  MP_ASSERT(!(end < (on_c ? r->fc : free_t[st])), "op %d: a stream's time never goes back (durations are not negative)",
            (int)idx);
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
      int32_t l = x->s->ops[idx].layer;
      int32_t layer = l >= 0 ? l + rep * g->layer_step : l;
      if (!run_op(x, idx, rep, micro, &t)) {
        trace_push_mem(x, idx, layer, micro);
        continue;
      }
      trace_push(x, idx, layer, micro, t, x->ops[idx].dur);
    }
    return;
  }
  /* The accumulators in locals: end_cur and end_prev are doubles too, so through x the
   * compiler would store and reload them at every op. */
  regs r = {x->a.compute, x->a.opt, x->a.wait, x->a.free_t[MP_STREAM_COMPUTE], x->level_tot};
  const int32_t si = (int32_t)(g - x->s->segs);
  /* the `when` values this micro-batch skips (bit per MP_WHEN_*; the step's prologue and
   * optimizer, micro < 0, run every op): run_op's test. Only single-op steps can carry
   * one (prog_compile), and a skipped one does nothing, as run_op does with it. */
  unsigned skip = 0;
  if (micro >= 0 && !x->seg_plain[si]) {
    if (micro != 0) skip |= 1u << MP_WHEN_FIRST_MICRO | 1u << MP_WHEN_ONCE;
    if (micro != x->n_micro - 1) skip |= 1u << MP_WHEN_LAST_MICRO;
  }
  const step *restrict sp = x->steps;
  const double *restrict pt = x->prog_t, *restrict pc = x->prog_c, *restrict pk = x->prog_k;
  const uint8_t *restrict psb = x->prog_sb;
  const mev *restrict pm = x->prog_m;
  for (int32_t j = x->seg_step[si], e = x->seg_step[si + 1]; j < e; j++) {
    const step *q = &sp[j];
    if (q->op >= 0) {
      if (!(skip >> x->ops[q->op].when & 1u)) run_one(x, &r, q->op, rep);
      continue;
    }
    double fc = r.fc, compute = r.compute;
    /* pc is pt's compute kernels with 0.0 for the collectives: adding +0.0 leaves a sum of
     * durations (never -0.0) as it is, so compute takes the kernels' additions in order,
     * and one loop carries both sums side by side */
    if (x->sm_pending) { /* collectives in flight: each kernel as run_one runs it */
      for (int32_t i = q->t_lo; i < q->t_hi; i++) fc = psb[i] && x->sm_pending ? contended_end(x, fc, pt[i]) : fc + pt[i];
      for (int32_t i = q->t_lo; i < q->t_hi; i++) compute += pc[i];
    } else {
      for (int32_t i = q->t_lo; i < q->t_hi; i++) {
        fc += pt[i];
        compute += pc[i];
      }
    }
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
  MP_ASSERT(!(r.fc < x->a.free_t[MP_STREAM_COMPUTE]), "the compute stream's time never goes back");
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

/* Whether the SM contention the next window meets repeats with the window just run (d:
 * its advance): every collective still in flight past the compute stream's time lies on a
 * stream that advanced as the compute stream did, so it sits where the window's own
 * collectives sat one window earlier. A collective of an earlier phase on a stream this
 * window leaves idle (a backward's reduce-scatter under the next micro-batch's forward)
 * keeps its end: the windows it slows until the compute stream passes it advance alike
 * but are no steady state, and the window after it advances less. */
static int sm_settled(sim *x, const accum *d) {
  const double fc = x->a.free_t[MP_STREAM_COMPUTE];
  for (int s = 0; s < MP_STREAM_COUNT; s++) {
    const sm_queue *q = &x->smq[s];
    if (s == MP_STREAM_COMPUTE || q->n == 0 || close_enough(d->free_t[s], d->free_t[MP_STREAM_COMPUTE]))
      continue;
    for (int j = 0; j < q->n; j++)
      if (q->iv[(q->head + j) % MP_SIM_SM_QUEUE].end_s > fc) return 0;
  }
  return 1;
}

/* Whether the window just run (advance d) repeats the one before it (advance prev): the
 * same advance of every stream and accumulator, and the same SM contention ahead. */
static int steady(sim *x, const accum *d, const accum *prev) {
  return same_advance(d, prev) && sm_settled(x, d);
}

/* Skips k windows that each advance time by d: shifts the state and the end times of
 * the ops in [first, first + n) that keep one (the others are never read). */
static void skip_time(sim *x, int64_t k, const accum *d, int32_t first, int32_t n) {
  double kk = (double)k;
  for (int s = 0; s < MP_STREAM_COUNT; s++) {
    MP_ASSERT(k >= 0 && !(d->free_t[s] < 0.0), "stream %d: a skipped window moves no stream back", s);
    x->a.free_t[s] += kk * d->free_t[s];
    x->a.comm_busy[s] += kk * d->comm_busy[s];
  }
  x->a.compute += kk * d->compute;
  x->a.opt += kk * d->opt;
  x->a.wait += kk * d->wait;
  /* the compute stream's last wait moves with it only where the window waited (a wait
   * sets it); a window without one leaves it where it was */
  if (d->wait > 0.0) x->busy_since += kk * d->free_t[MP_STREAM_COMPUTE];
  /* the collectives in flight move with their streams, as their ops' end times do */
  for (int s = 0; s < MP_STREAM_COUNT; s++)
    for (int j = 0; j < x->smq[s].n; j++) {
      sm_interval *v = &x->smq[s].iv[(x->smq[s].head + j) % MP_SIM_SM_QUEUE];
      v->start_s += kk * d->free_t[s];
      v->end_s += kk * d->free_t[s];
    }
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
    if (have_prev && r < R - 2 && steady(x, &delta, &prev)) {
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

/* What a micro-batch's forward leaves held for its backward: its saved activations; under
 * the meshplan runtimes' models (schedule_rt.c) also its token ids (TEMP) and, on the last
 * stage, its logits (LOGITS), which each micro-batch in flight keeps apart (exec/runtime/
 * runtime_pp.c). Gathered parameters are not counted: micro-batches in flight share them. */
static int64_t held_level(const sim *x) {
  int64_t v = x->level[MP_MEM_ACTIVATIONS];
  if (mp_mem_model_is_runtime(x->s->plan->opts.mem_model))
    v += x->level[MP_MEM_TEMP] + x->level[MP_MEM_LOGITS];
  return v;
}

/* One micro-batch's segments; in micro-batch rec_micro the compute stream's time per model
 * chunk and direction, in micro-batch 0 what each chunk's forward leaves held. */
static void run_micro(sim *x, int32_t micro) {
  const int rec = micro == x->rec_micro, held = micro == 0;
  for (int32_t i = 0; i < x->s->n_segs; i++) {
    const mp_segment *g = &x->s->segs[i];
    if (seg_is_step(g)) continue;
    const double t0 = x->a.free_t[MP_STREAM_COMPUTE];
    const int64_t a0 = held_level(x);
    run_segment(x, g, micro);
    /* a segment's chunk is below the plan's pp_virtual <= MP_PP_MAX_VIRTUAL */
    const int c = g->chunk, bwd = g->phase != MP_PHASE_FORWARD;
    if (rec) x->chunk_s[bwd][c] += x->a.free_t[MP_STREAM_COMPUTE] - t0;
    if (held && !bwd) x->chunk_held[c] += held_level(x) - a0;
  }
}

/* ---- compiling the segments' programs ---------------------------------------------- */

/* Compiles every segment's ops into steps (see `step`) and lists the segment ops that keep
 * their end time (ascending: segments cover ops in order); returns how many. */
static int32_t prog_compile(prog_buf *b, const mp_schedule *s, const cop *cops) {
  int32_t n_steps = 0, nt = 0, nk = 0, nm = 0, n_keep = 0;
  for (int32_t si = 0; si < s->n_segs; si++) {
    const mp_segment *g = &s->segs[si];
    b->seg_step[si] = n_steps;
    step *run = NULL;
    /* a micro-batch segment's op that some micro-batches skip (its `when`) is a step of
     * its own, tested in run_rep; the prologue's and the optimizer's run every op */
    const int every = seg_is_step(g);
    for (int32_t i = g->first_op; i < g->first_op + g->n_ops; i++) {
      const cop *c = &cops[i];
      if (c->keep_end) b->keep[n_keep++] = i;
      const int mem = c->kind >= COP_ALLOC;
      const int plain =
          !c->keep_end && (every || c->when == MP_WHEN_EVERY_MICRO) &&
          (mem || (c->stream == MP_STREAM_COMPUTE && c->n_dep == 0 &&
                   (c->kind == COP_COMPUTE || c->kind == COP_COMM)));
      if (!plain) {
        b->steps[n_steps++] = (step){i, 0, 0, 0, 0, 0, 0};
        run = NULL;
        continue;
      }
      if (c->kind == COP_NOMEM) continue; /* no memory effect, no time, no end time */
      if (run == NULL) {
        run = &b->steps[n_steps++];
        *run = (step){-1, nt, nt, nk, nm, nk, nm};
      }
      if (mem) {
        b->m[nm++] = (mev){c->mem_delta, c->mem_cat};
        run->m_hi = nm;
      } else {
        b->sb[nt] = c->sm_bound;
        b->c[nt] = c->kind == COP_COMPUTE ? c->dur : 0.0;
        b->t[nt++] = c->dur;
        run->t_hi = nt;
        if (c->kind != COP_COMPUTE) {
          b->k[nk++] = c->dur;
          run->k_hi = nk;
        }
      }
    }
  }
  b->seg_step[s->n_segs] = n_steps;
  return n_keep;
}

/* ---- the step ----------------------------------------------------------------------- */

void mp_sim_engine_init(sim *x, const mp_schedule *s, const sim_bufs *b, int gpu_sms, int extrapolate) {
  prog_buf *pb = b->prog;
  const int32_t n_keep = prog_compile(pb, s, b->cops);
  /* the queues' intervals are read only below their counts */
  memset(x, 0, offsetof(sim, smq));
  for (int st = 0; st < MP_STREAM_COUNT; st++) x->smq[st].head = x->smq[st].n = 0;
  x->gpu_sms = gpu_sms > 0 ? gpu_sms : 0;
  x->s = s;
  x->ops = b->cops;
  x->dur = b->dur;
  x->end_cur = b->end_cur;
  x->end_prev = b->end_prev;
  x->n_micro = s->n_micro > 0 ? s->n_micro : 1;
  x->extrapolate = extrapolate;
  x->keep = pb->keep;
  x->n_keep = n_keep;
  x->seg_plain = pb->seg_plain;
  x->seg_step = pb->seg_step;
  x->steps = pb->steps;
  x->prog_t = pb->t;
  x->prog_c = pb->c;
  x->prog_k = pb->k;
  x->prog_sb = pb->sb;
  x->prog_m = pb->m;
  x->rec_micro = x->n_micro >= 2 ? 1 : 0;
}

/* After micro-batch rec_micro: whether its chunk times put the step's lower bound past
 * stop_s (then stopped). */
static int past_stop(sim *x) {
  if (!(x->stop_s > 0.0)) return 0;
  mp_pp_stage_times t;
  memset(&t, 0, sizeof t);
  memcpy(t.f, x->chunk_s[0], sizeof t.f);
  memcpy(t.b, x->chunk_s[1], sizeof t.b);
  memcpy(t.fb_save, x->fb_save, sizeof t.fb_save);
  x->stopped = mp_sim_times_step_lb_s(&t, x->stop_v, x->n_micro) > x->stop_s;
  return x->stopped;
}

void mp_sim_run_step(sim *x) {
  const mp_schedule *s = x->s;
  /* prologue */
  for (int32_t i = 0; i < s->n_segs; i++)
    if (s->segs[i].phase == MP_PHASE_PROLOGUE) run_segment(x, &s->segs[i], -1);
  /* micro-batches: first, middle ones until steady, last */
  x->mb_start_s = x->a.free_t[MP_STREAM_COMPUTE];
  int64_t n = x->n_micro;
  run_micro(x, 0);
  accum before, delta, prev;
  int have_prev = 0;
  int32_t first_micro_op = s->n_ops, last_micro_op = 0;
  for (int32_t i = 0; i < s->n_segs; i++)
    if (!seg_is_step(&s->segs[i])) {
      if (s->segs[i].first_op < first_micro_op) first_micro_op = s->segs[i].first_op;
      if (s->segs[i].first_op + s->segs[i].n_ops > last_micro_op)
        last_micro_op = s->segs[i].first_op + s->segs[i].n_ops;
    }
  /* a trace that could not grow ends the step: what is left would be simulated for nothing */
  for (int64_t m = 1; m <= n - 2 && !x->trace_failed; m++) {
    before = x->a;
    trk_start(x, &x->micro_trk);
    run_micro(x, (int32_t)m);
    if (m == x->rec_micro && past_stop(x)) return;
    accum_sub(&x->a, &before, &delta);
    if (x->extrapolate && have_prev && m < n - 2 && steady(x, &delta, &prev)) {
      int64_t k = n - 2 - m;
      if (last_micro_op > first_micro_op)
        skip_time(x, k, &delta, first_micro_op, last_micro_op - first_micro_op);
      skip_mem(x, k, &x->micro_trk);
      m = n - 2;
      continue;
    }
    prev = delta;
    have_prev = 1;
  }
  x->micro_trk.on = 0;
  if (x->trace_failed) return;
  const double last0 = x->a.free_t[MP_STREAM_COMPUTE];
  if (n >= 2) run_micro(x, (int32_t)(n - 1));
  x->mb_end_s = x->a.free_t[MP_STREAM_COMPUTE];
  x->last_micro_s = n >= 2 ? x->mb_end_s - last0 : 0.0;
  /* optimizer */
  for (int32_t i = 0; i < s->n_segs; i++)
    if (s->segs[i].phase == MP_PHASE_OPTIMIZER) run_segment(x, &s->segs[i], -1);
}
