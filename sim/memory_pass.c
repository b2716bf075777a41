/* A stage's memory without its time (see mp_sim_stage_memory_pass, sim_internal.h).
 *
 * The engine (engine.c) replays a schedule's ALLOC and FREE events in issue order, and
 * nothing in that order depends on time: an event's `when` picks the micro-batches it runs
 * in, and timing only decides where the engine skips repetitions. So the memory levels it
 * reaches are those of the plain replay here. The allocated peak is the largest total after
 * an allocation. Repetitions of a segment within one micro-batch, and the middle
 * micro-batches (neither the first nor the last), apply the same events, each starting
 * where the one before ended: a window's states are the first window's shifted by D (the
 * window's change of every level) per window, so over k more windows a total peaks in the
 * first or the last of them (linear in the window's index). Each is replayed once and its
 * peak carried to the last window, exactly as a full replay finds it; the engine's skips
 * (skip_mem) carry the same states, so the peak is the engine's to the byte. A stack
 * replaying a caching allocator adds its gap as a stage run does. The
 * categories at the peak and their maxima are reckoned the same way; where two states tie
 * for the peak they may name another of them than the engine's (memory_first shows none). */
#include <stdint.h>
#include <string.h>

#include "sim/caching_alloc.h"
#include "sim/engine.h"
#include "sim/sim_internal.h"

/* A window's highest total after an allocation and its categories then, and every
 * category's highest level after one of its allocations (INT64_MIN: none yet). */
typedef struct mwin {
  int on;
  int64_t peak_tot, peak_bd[MP_MEM_COUNT], cmax[MP_MEM_COUNT];
} mwin;

typedef struct mstate {
  const mp_schedule *s;
  double act_factor;
  int64_t n_micro;
  int64_t level[MP_MEM_COUNT], tot;
  int64_t peak_tot, at_peak[MP_MEM_COUNT], cat_max[MP_MEM_COUNT]; /* the engine's */
  mwin win[2]; /* 0: the middle micro-batch replayed, 1: the repetition replayed */
  mev *ev;        /* the segments' memory events (list_events), in the workspace */
  int32_t *ev_of; /* per segment its first event; [n_segs] their count */
} mstate;

/* A total tot with categories bd after an allocation (or a window's carried peak): the
 * step's and the open windows' peaks. */
static void peak_at(mstate *m, const int64_t bd[MP_MEM_COUNT], int64_t tot) {
  if (tot > m->peak_tot) {
    m->peak_tot = tot;
    memcpy(m->at_peak, bd, sizeof m->at_peak);
  }
  for (int w = 0; w < 2; w++)
    if (m->win[w].on && tot > m->win[w].peak_tot) {
      m->win[w].peak_tot = tot;
      memcpy(m->win[w].peak_bd, bd, sizeof m->win[w].peak_bd);
    }
}

/* Category cat at level v after an allocation of it (or a window's carried maximum): the
 * step's and the open windows' maxima. The engine raises only the allocated category's
 * (mem_raise): the others' levels have only fallen since their own allocations. */
static void cat_at(mstate *m, int cat, int64_t v) {
  if (v > m->cat_max[cat]) m->cat_max[cat] = v;
  for (int w = 0; w < 2; w++)
    if (m->win[w].on && v > m->win[w].cmax[cat]) m->win[w].cmax[cat] = v;
}

/* One repetition of segment si in micro-batch `micro` (< 0: the prologue or the optimizer,
 * every event), its events filtered by `when` as the engine filters them. */
static void walk_rep(mstate *m, int32_t si, int64_t micro) {
  for (int32_t i = m->ev_of[si]; i < m->ev_of[si + 1]; i++) {
    const mev *e = &m->ev[i];
    const int when = e->cat >> 8, cat = e->cat & 0xff;
    if (micro >= 0) {
      if ((when == MP_WHEN_FIRST_MICRO || when == MP_WHEN_ONCE) && micro != 0) continue;
      if (when == MP_WHEN_LAST_MICRO && micro != m->n_micro - 1) continue;
    }
    m->level[cat] += e->delta;
    m->tot += e->delta;
    if (e->delta > 0) {
      peak_at(m, m->level, m->tot);
      cat_at(m, cat, m->level[cat]);
    }
  }
}

/* The memory events of every segment, in order, into ev (segment si's from ev_of[si]): each
 * its scaled delta, and its category with its `when` above the low 8 bits. */
static void list_events(mstate *m) {
  const mp_schedule *s = m->s;
  int32_t n = 0;
  for (int32_t si = 0; si < s->n_segs; si++) {
    m->ev_of[si] = n;
    for (int32_t i = s->segs[si].first_op; i < s->segs[si].first_op + s->segs[si].n_ops; i++) {
      const mp_op *op = &s->ops[i];
      if ((op->type != MP_OP_ALLOC && op->type != MP_OP_FREE) || op->mem_cat >= MP_MEM_COUNT) continue;
      m->ev[n++] = (mev){mp_sim_mem_delta(op, m->act_factor), (int32_t)(op->mem_cat | op->when << 8)};
    }
  }
  m->ev_of[s->n_segs] = n;
}

/* Opens window w at the current levels; *start receives them. */
static void win_open(mstate *m, int w, int64_t start[MP_MEM_COUNT]) {
  memcpy(start, m->level, sizeof m->level);
  m->win[w].on = 1;
  m->win[w].peak_tot = INT64_MIN;
  for (int c = 0; c < MP_MEM_COUNT; c++) m->win[w].cmax[c] = INT64_MIN;
}

/* Closes window w, replayed once from start, and carries it over k more windows. */
static void win_carry(mstate *m, int w, const int64_t start[MP_MEM_COUNT], int64_t k) {
  mwin x = m->win[w];
  m->win[w].on = 0;
  if (k <= 0) return;
  int64_t D[MP_MEM_COUNT], bd[MP_MEM_COUNT], dt = 0;
  for (int c = 0; c < MP_MEM_COUNT; c++) D[c] = m->level[c] - start[c], dt += D[c];
  if (x.peak_tot != INT64_MIN) {
    for (int c = 0; c < MP_MEM_COUNT; c++) bd[c] = x.peak_bd[c] + k * D[c];
    peak_at(m, bd, x.peak_tot + k * dt);
  }
  for (int c = 0; c < MP_MEM_COUNT; c++)
    if (x.cmax[c] != INT64_MIN) cat_at(m, c, x.cmax[c] + k * D[c]);
  for (int c = 0; c < MP_MEM_COUNT; c++) m->level[c] += k * D[c];
  m->tot += k * dt;
}

static void run_seg(mstate *m, int32_t si, int64_t micro) {
  const mp_segment *g = &m->s->segs[si];
  const int32_t R = g->repeat < 1 ? 1 : g->repeat;
  if (R == 1) {
    walk_rep(m, si, micro);
    return;
  }
  int64_t start[MP_MEM_COUNT];
  win_open(m, 1, start);
  walk_rep(m, si, micro);
  win_carry(m, 1, start, R - 1);
}

static int64_t held_level(const mstate *m) {
  int64_t v = m->level[MP_MEM_ACTIVATIONS];
  if (mp_mem_model_is_runtime(m->s->plan->opts.mem_model)) v += m->level[MP_MEM_TEMP] + m->level[MP_MEM_LOGITS];
  return v;
}

/* One micro-batch's segments (the engine's run_micro); in micro-batch 0 what each chunk's
 * forward leaves held. */
static void run_micro(mstate *m, int64_t micro, int64_t held[MP_PP_MAX_VIRTUAL]) {
  for (int32_t i = 0; i < m->s->n_segs; i++) {
    const mp_segment *g = &m->s->segs[i];
    if (g->phase == MP_PHASE_PROLOGUE || g->phase == MP_PHASE_OPTIMIZER) continue;
    const int64_t a0 = held_level(m);
    run_seg(m, i, micro);
    if (micro == 0 && g->phase == MP_PHASE_FORWARD) held[g->chunk] += held_level(m) - a0;
  }
}

static void run_phase(mstate *m, int phase) {
  for (int32_t i = 0; i < m->s->n_segs; i++)
    if (m->s->segs[i].phase == phase) run_seg(m, i, -1);
}

mp_status mp_sim_stage_memory_pass(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                                   mp_sim_stage *out) {
  const mp_stack_profile *prof;
  MP_CHECK(mp_sim_resolve_stack(ctx, cfg, &prof));
  /* the event lists in the buffers of the engine's programs, sized for s (a stage run
   * after this one fills them again) */
  sim_bufs b;
  MP_CHECK(mp_sim_bufs_get(ctx, cfg->ws, s, &b));
  mstate m;
  memset(&m, 0, sizeof m);
  m.s = s;
  m.act_factor = prof->saved_act_factor > 0 ? prof->saved_act_factor : 1.0;
  m.n_micro = s->n_micro > 0 ? s->n_micro : 1;
  m.ev = b.prog->m;
  m.ev_of = b.prog->seg_step;
  list_events(&m);
  memset(out, 0, sizeof *out);
  /* a stack that replays a caching allocator adds its gap (sim.c, mp_sim_stage_run): the
   * replay reads the compiled memory events (their bytes do not depend on the links) */
  if (prof->alloc_replay) {
    double p2p[2];
    MP_CHECK(mp_sim_compile_ops(ctx, s, cfg->cluster, prof, NULL, &b, p2p));
    MP_CHECK(mp_calloc_replay_gap(ctx, s, b.cops, &out->alloc_gap));
  }
  run_phase(&m, MP_PHASE_PROLOGUE);
  run_micro(&m, 0, out->held);
  if (m.n_micro >= 3) { /* micro-batches 1 .. n - 2 alike */
    int64_t start[MP_MEM_COUNT];
    win_open(&m, 0, start);
    run_micro(&m, 1, out->held);
    win_carry(&m, 0, start, m.n_micro - 3);
  }
  if (m.n_micro >= 2) run_micro(&m, m.n_micro - 1, out->held);
  run_phase(&m, MP_PHASE_OPTIMIZER);
  memcpy(out->r.mem_at_peak, m.at_peak, sizeof out->r.mem_at_peak);
  memcpy(out->r.mem_max, m.cat_max, sizeof out->r.mem_max);
  out->alloc_peak = m.peak_tot;
  out->stage = s->pp_stage;
  out->n_micro = m.n_micro;
  return MP_OK;
}
