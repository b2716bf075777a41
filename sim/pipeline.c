/* The pipeline timeline: a step of a pp-stage pipeline from each stage's forward and
 * backward time per model chunk of one micro-batch and its transfers, walking every
 * stage's pipeline order (mp_pp_order, exec/schedule_pp.c).
 *
 * Model. Virtual stage k = c x pp + s is stage s's chunk c (one chunk per stage without
 * interleaving). A stage runs its order's steps one at a time. F(m, k) starts when the
 * stage is free and, for k > 0, F(m, k - 1) has ended and its activations have arrived
 * (that stage's forward send time later); B(m, k) when the stage is free and, below the
 * last virtual stage, B(m, k + 1) has ended and its gradient has arrived (the backward send
 * time later). Transfers overlap compute (they run on their own stream) and occupy no
 * stage. With equal stages and free transfers this gives the closed forms: (m + pp - 1)
 * (f + b) for 1F1B and GPipe, m (f + b) + (pp - 1)(f + b) / v interleaved (tested); with
 * uneven stages the slowest paces the steady state and the others wait. Where a stage's
 * fb_save is set, a forward followed in its order by a backward of another micro-batch runs
 * with it as one step, shorter by the saving (Megatron-Core's combined 1F1B, sim/overlap.c);
 * its input is there when both steps' inputs are, and both end with it.
 *
 * DualPipe. A rank's two chunks are its two directions (exec/schedule_pp.c): f[0], b[0]
 * of model stage s, f[1], b[1] of model stage pp - 1 - s, as the caller fills them. A
 * direction's micro-batch passes its pp stages in its own order (vstage), and the order's
 * F&B pairs (mp_pp_step.paired) run as one step, shorter by the smaller of the two chunks'
 * fb_save (the all-to-all overlap of sim/overlap.c, which DualPipe performs). With equal
 * stages f = b, a saving s a pair and free transfers the two middle ranks pace the step:
 * m (f + b) less s for each of their m - pp - 1 pairs, plus the reference's bubble
 * (pp / 2 - 1)(F&B + B - 3W) with F&B = f + b - s and no W split (tested).
 *
 * Memory. A stage holds the activations of every chunk step whose forward has run and
 * whose backward has not (mp_pp_inflight); what one chunk's forward leaves held comes from
 * the stage's simulated micro-batch. Beyond the one micro-batch the stage's own replay
 * holds, the extra is the most held at the start of a step of its order less the most held
 * at the start of a step of one micro-batch's order alone. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "sim/sim_internal.h"
#include "sim/workspace.h"

/* The path a model chunk's micro-batch takes over the ranks (vstage): looped (interleaved:
 * chunk c of stage s is model chunk c x pp + s), DualPipe's two directions, or ZBV's V
 * (chunk 1 of stage s is model chunk 2 pp - 1 - s, the turn at stage pp - 1 local). */
enum { SHAPE_LOOP = 0, SHAPE_DUAL, SHAPE_VEE };

static int shape_of(mp_pp_schedule kind) {
  return kind == MP_PP_DUALPIPE ? SHAPE_DUAL : kind == MP_PP_ZBV ? SHAPE_VEE : SHAPE_LOOP;
}

/* A stage's steps: a forward and a backward per chunk and micro-batch, and a W per backward
 * under the zero-bubble schedules (mp_pp_order). */
static int64_t order_len(mp_pp_schedule kind, int v, int64_t n_micro) {
  return (mp_pp_schedule_splits_w(kind) ? 3 : 2) * n_micro * v;
}

/* Stages s0 .. s1 - 1's orders, per steps each, into out; 0 with the error on ctx. */
static int fill_orders(mp_ctx *ctx, mp_pp_step *out, mp_pp_schedule kind, mp_pp_flavor flavor,
                       int pp, int v, int64_t n_micro, int s0, int s1, int64_t per) {
  for (int s = s0; s < s1; s++) {
    int64_t n = 0;
    if (mp_pp_order(ctx, kind, flavor, pp, v, n_micro, s, out + (size_t)(s - s0) * per, &n) != MP_OK)
      return 0;
    MP_ASSERT(n == per, "stage %d: %lld steps, not %lld: a stage's order runs every chunk of every micro-batch "
              "forward and backward, once", s, (long long)n, (long long)per);
  }
  return 1;
}

/* The workspace's order slot of this key with every stage's order, per steps each: the slot
 * of this key, or the next one in turn rebuilt for it (valid until MP_SIM_ORDER_SLOTS other
 * keys were asked); NULL with the error on ctx. The orders are a function of the key alone
 * (mp_pp_order), so a kept one is exactly what building it again would give. */
static mp_sim_order_slot *order_slot(mp_ctx *ctx, mp_sim_workspace *ws, mp_pp_schedule kind,
                                     mp_pp_flavor flavor, int pp, int v, int64_t n_micro,
                                     int64_t per) {
  for (int i = 0; i < MP_SIM_ORDER_SLOTS; i++) {
    mp_sim_order_slot *o = &ws->order_slots[i];
    if (o->valid && o->kind == kind && o->flavor == flavor && o->pp == pp && o->v == v &&
        o->n_micro == n_micro)
      return o;
  }
  mp_sim_order_slot *o = &ws->order_slots[ws->order_next];
  o->valid = 0;
  if (!mp_sim_grow((void **)&o->steps, &o->steps_cap, (size_t)(per * pp), sizeof *o->steps)) {
    mp_error(ctx, MP_ERR_NOMEM, "out of memory for the pipeline orders of %d stages", pp);
    return NULL;
  }
  if (!fill_orders(ctx, o->steps, kind, flavor, pp, v, n_micro, 0, pp, per)) return NULL;
  *o = (mp_sim_order_slot){1, kind, flavor, pp, v, n_micro, o->steps, o->steps_cap, o->rec, o->rec_cap, 0};
  ws->order_next = (ws->order_next + 1) % MP_SIM_ORDER_SLOTS;
  return o;
}

/* Every stage's order from the slot of its key (order_slot). */
static const mp_pp_step *all_orders(mp_ctx *ctx, mp_sim_workspace *ws, mp_pp_schedule kind,
                                    mp_pp_flavor flavor, int pp, int v, int64_t n_micro,
                                    int64_t per) {
  const mp_sim_order_slot *o = order_slot(ctx, ws, kind, flavor, pp, v, n_micro, per);
  return o ? o->steps : NULL;
}

/* Virtual stage k of a path through the model: k = c x pp + s is stage s's chunk c; under
 * DualPipe (SHAPE_DUAL) a direction's path, k = d x pp + j its j-th stage, which direction 0
 * runs on rank j and direction 1 on rank pp - 1 - j; under ZBV (SHAPE_VEE) k = s for chunk 0
 * and 2 pp - 1 - s for chunk 1. A path's stages follow one another within each pp (dual) or
 * over all K. */
static int vstage(const mp_pp_step *q, int s, int pp, int dual) {
  return q->chunk * pp + (dual && q->chunk ? pp - 1 - s : s);
}

/* What step q of stage s waits on: the index into end[] of the step that gives its input
 * (forward) or output gradient (backward), -1 for none (ready at 0; a W, whose B runs
 * before it on its stage), and in *send the stage whose send follows that end (-1: none, a
 * last virtual stage's backward after its own forward, or ZBV's turn at stage pp - 1, whose
 * two chunks hand over on the rank: torch's _PipelineScheduleRuntime skips the send and
 * receive of adjacent stages on one rank, schedules.py, v2.6 to v2.8). A path's neighbour is
 * the next stage up, wrapping from the last stage to the first between interleaved chunks,
 * or down the ranks on DualPipe's direction 1 and ZBV's chunk 1; found without a division,
 * as the sweeps ask it every step. end[(k x 2 + bwd) x m + micro] holds the end of each
 * virtual stage's forwards and backwards. */
static inline int64_t input_of(const mp_pp_step *q, int s, int pp, int K, int shape, int64_t m, int *send) {
  const int dual = shape == SHAPE_DUAL, k = vstage(q, s, pp, shape != SHAPE_LOOP);
  const int down = shape != SHAPE_LOOP && q->chunk, turn = shape == SHAPE_VEE && s == pp - 1;
  *send = -1;
  if (q->bwd == MP_PP_STEP_W) return -1;
  if (!q->bwd) {
    if (k == 0 || (dual && k == pp)) return -1;
    if (!(turn && k == pp)) *send = down ? s + 1 : s > 0 ? s - 1 : pp - 1;
    return ((int64_t)(k - 1) * 2) * m + q->micro;
  }
  if (k == K - 1 || (dual && k == pp - 1)) return ((int64_t)k * 2) * m + q->micro;
  if (!(turn && k == pp - 1)) *send = down ? s - 1 : s < pp - 1 ? s + 1 : 0;
  return ((int64_t)(k + 1) * 2 + 1) * m + q->micro;
}

/* The ready time of step q of stage s: when its input (forward) or output gradient
 * (backward) is there (input_of); NAN while the step it waits for has not run. */
static inline double ready_s(const mp_pp_step *q, int s, int pp, int K, int shape, int64_t m, const double *end,
                             const mp_pp_stage_times *const *st) {
  int send;
  const int64_t i = input_of(q, s, pp, K, shape, m, &send);
  if (i < 0) return 0.0;
  const double e = end[i];
  if (isnan(e) || send < 0) return e;
  return e + (q->bwd ? st[send]->send_b : st[send]->send_f);
}

/* 2 where step i of a stage's order is a forward that runs combined with the backward after
 * it (the EP all-to-all overlap, fb_save != 0): a steady-state forward (mp_pp_step.paired)
 * and a backward of another micro-batch or chunk, which does not wait on that forward; else
 * 1. Megatron-LM's combined 1F1B pairs only in its steady loop
 * (forward_backward_pipelining_with_interleaving, core_v0.14): with every micro-batch in the
 * warm-up the last forward and the first backward run apart, and pairing them would make
 * each stage's forward wait on the backward of the stage after it. */
static inline int combined(const mp_pp_step *ord, int64_t i, int64_t per, int s, int pp, int K,
                           int shape, const mp_pp_stage_times *t) {
  if (shape == SHAPE_DUAL) return ord[i].paired ? 2 : 1; /* DualPipe names its F&B pairs */
  if (i + 1 >= per || ord[i].bwd || !ord[i].paired || ord[i + 1].bwd != MP_PP_STEP_B ||
      t->fb_save[ord[i].chunk] == 0.0)
    return 1;
  const int k = ord[i].chunk * pp + s;
  if (ord[i + 1].micro == ord[i].micro && ord[i + 1].chunk == ord[i].chunk && k == K - 1) return 1;
  return 2;
}

/* How long step q takes: f or b, or under a split backward (split) its B b - w and its W w.
 * On the first virtual stage torch's stage computes no input gradient and its W runs the
 * whole backward (stage.py backward_one_chunk and backward_weight_one_chunk, v2.6 to v2.8);
 * both orders run that W right after its B, so the pair takes b either way. */
static inline double step_s(const mp_pp_step *q, int split, const mp_pp_stage_times *t) {
  const int c = q->chunk;
  if (q->bwd == MP_PP_STEP_F) return t->f[c];
  if (!split) return t->b[c];
  return q->bwd == MP_PP_STEP_B ? t->b[c] - t->w[c] : t->w[c];
}

/* Runs n steps from q (one, or a forward and a backward combined) on stage s from when it is
 * free and their inputs are there (`ready`): a combined step takes f + b less the saving of
 * the pair (the smaller of the two chunks'), and both end when it ends. A W ends no step
 * another waits on. */
static void run_steps(const mp_pp_step *q, int n, double ready, int s, int pp, int shape, int split, int64_t n_micro,
                      const mp_pp_stage_times *t, double *free_s, double *end) {
  const double t0 = *free_s > ready ? *free_s : ready;
  double d = step_s(q, split, t);
  if (n == 2) {
    const double sf = t->fb_save[q[0].chunk], sb = t->fb_save[q[1].chunk];
    d += t->b[q[1].chunk] - (sf < sb ? sf : sb);
  }
  MP_ASSERT(!(d < 0.0), "stage %d: a stage's time never goes back", s);
  *free_s = t0 + d;
  if (q->bwd == MP_PP_STEP_W) return;
  for (int i = 0; i < n; i++) {
    double *slot = &end[((int64_t)vstage(&q[i], s, pp, shape != SHAPE_LOOP) * 2 + q[i].bwd) * n_micro + q[i].micro];
    MP_ASSERT(isnan(*slot), "stage %d: each step runs once (what waits on it reads one end)", s);
    *slot = *free_s;
  }
}

/* A step of the timeline as the sweeps ran it (mp_sim_order_slot.rec), enough to run it
 * again without them: its end's index into end[], the end its input waits on (-1: none,
 * ready at 0) and the stage whose send follows that end (-1: none, a last virtual stage's
 * backward after its own forward), its stage, chunk and direction. */
struct mp_pp_rec {
  int32_t slot, pred;
  int16_t stage, send;
  uint8_t chunk, bwd;
};

/* The end index of step q of stage s (run_steps's slot), and its input's (input_of). */
static struct mp_pp_rec rec_of(const mp_pp_step *q, int s, int pp, int K, int64_t m) {
  int send;
  const int64_t pred = input_of(q, s, pp, K, 0, m, &send);
  return (struct mp_pp_rec){(int32_t)(((int64_t)vstage(q, s, pp, 0) * 2 + q->bwd) * m + q->micro), (int32_t)pred,
                            (int16_t)s, (int16_t)send, q->chunk, q->bwd};
}

/* The timeline again from the steps the sweeps ran, in their order (each step's input has
 * ended before it): ready_s's and run_steps's operations on the same operands, so the same
 * ends to the bit, without the sweeps' waiting. Single steps only (no combined pair). */
static void replay(const struct mp_pp_rec *rec, int64_t n, const mp_pp_stage_times *const *stage,
                   double *end, double *free_t) {
  for (int64_t i = 0; i < n; i++) {
    const struct mp_pp_rec *r = &rec[i];
    const mp_pp_stage_times *t = stage[r->stage];
    double ready = 0.0;
    if (r->pred >= 0) ready = r->send < 0 ? end[r->pred] : end[r->pred] + (r->bwd ? stage[r->send]->send_b : stage[r->send]->send_f);
    const double t0 = free_t[r->stage] > ready ? free_t[r->stage] : ready;
    free_t[r->stage] = t0 + (r->bwd ? t->b[r->chunk] : t->f[r->chunk]);
    end[r->slot] = free_t[r->stage];
  }
}

/* Whether some stage runs a forward and a backward as one step (fb_save set): the order the
 * sweeps run steps in then depends on the times. */
static int any_combined(const mp_pp_stage_times *const *stage, int pp, int v) {
  for (int s = 0; s < pp; s++)
    for (int c = 0; c < v; c++)
      if (stage[s]->fb_save[c] != 0.0) return 1;
  return 0;
}

/* The sweeps: every stage as far as its next step's input is there, until all are done,
 * upward and downward in turn (forwards wait on the stage below, backwards on the one
 * above); a sweep without progress would be a deadlock of the orders. With o (no combined
 * steps), each step run is appended to o's record. */
static mp_status sweeps(mp_ctx *ctx, const mp_pp_step *all, mp_pp_schedule kind, int pp, int v,
                        int64_t n_micro, const mp_pp_stage_times *const *stage, double *end,
                        double *free_t, int64_t *pos, mp_sim_order_slot *o) {
  const int shape = shape_of(kind), split = mp_pp_schedule_splits_w(kind);
  const int64_t per = order_len(kind, v, n_micro);
  const int K = pp * (shape == SHAPE_DUAL ? 2 : v); /* DualPipe: two directions of pp stages */
  int64_t left = per * pp;
  for (int sweep = 0; left > 0; sweep++) {
    int64_t progress = 0;
    for (int i = 0; i < pp; i++) {
      const int s = sweep % 2 ? pp - 1 - i : i;
      const mp_pp_step *ord = all + (size_t)s * per;
      while (pos[s] < per) {
        const mp_pp_step *q = &ord[pos[s]];
        const double r = ready_s(q, s, pp, K, shape, n_micro, end, stage);
        if (isnan(r)) break;
        const int n = combined(ord, pos[s], per, s, pp, K, shape, stage[s]);
        if (n == 2) {
          const double r2 = ready_s(q + 1, s, pp, K, shape, n_micro, end, stage);
          if (isnan(r2)) break;
          run_steps(q, 2, r > r2 ? r : r2, s, pp, shape, split, n_micro, stage[s], &free_t[s], end);
        } else {
          run_steps(q, 1, r, s, pp, shape, split, n_micro, stage[s], &free_t[s], end);
          if (o) o->rec[o->n_rec++] = rec_of(q, s, pp, K, n_micro);
        }
        pos[s] += n;
        progress += n;
      }
    }
    if (progress == 0 && kind == MP_PP_INTERLEAVED && n_micro % pp)
      return mp_error(ctx, MP_ERR_INVALID,
                      "pipeline timeline: interleaved with %lld micro-batches on pp=%d, the last group "
                      "of %lld runs its %d chunks before the pipeline has filled with it and the stages "
                      "wait on each other; choose a multiple of %d micro-batches",
                      (long long)n_micro, pp, (long long)(n_micro % pp), v, pp);
    if (progress == 0)
      return mp_error(ctx, MP_ERR_INTERNAL,
                      "pipeline timeline: the stages' orders wait on each other (pp=%d, %d "
                      "chunks, %lld micro-batches)",
                      pp, v, (long long)n_micro);
    left -= progress;
  }
  return MP_OK;
}

/* The timeline run step by step over n_micro micro-batches (see mp_sim_pipeline), in the
 * workspace's buffers. Which step the sweeps can run next depends on which have run, never
 * on the times, so without combined steps (and DualPipe's pairs) the order they ran in is a function of the key:
 * the first timeline of a key records it in the key's order slot, the others replay it. */
static mp_status timeline(mp_ctx *ctx, mp_sim_workspace *ws, mp_pp_schedule kind,
                          mp_pp_flavor flavor, int pp, int v, int64_t n_micro,
                          const mp_pp_stage_times *const *stage, double *finish) {
  const int dual = kind == MP_PP_DUALPIPE;
  const int64_t per = order_len(kind, v, n_micro); /* steps per stage */
  const int K = pp * (dual ? 2 : v);                /* DualPipe: two directions of pp stages */
  if (!mp_sim_grow((void **)&ws->ends, &ws->ends_cap, (size_t)(2 * n_micro * K + pp),
                   sizeof *ws->ends) ||
      !mp_sim_grow((void **)&ws->pos, &ws->pos_cap, (size_t)pp, sizeof *ws->pos))
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the pipeline timeline of %d stages",
                    pp);
  mp_sim_order_slot *o = order_slot(ctx, ws, kind, flavor, pp, v, n_micro, per);
  if (o == NULL) return ctx->last;
  double *end = ws->ends, *free_t = ws->ends + 2 * n_micro * K;
  for (int s = 0; s < pp; s++) free_t[s] = 0.0;
  /* a record holds single whole-backward steps on the 1F1B/interleaved virtual stages
   * (rec_of) */
  const int plain = shape_of(kind) == SHAPE_LOOP && !mp_pp_schedule_splits_w(kind) && !any_combined(stage, pp, v);
  if (plain && o->n_rec == per * pp) {
    replay(o->rec, o->n_rec, stage, end, free_t);
  } else {
    int64_t *pos = ws->pos;
    for (int64_t i = 0; i < 2 * n_micro * K; i++) end[i] = NAN;
    for (int s = 0; s < pp; s++) pos[s] = 0;
    /* a record's indices are 32-bit and its stages 16-bit */
    const int record = plain && 2 * n_micro * K < INT32_MAX && pp < INT16_MAX &&
                       mp_sim_grow((void **)&o->rec, &o->rec_cap, (size_t)(per * pp), sizeof *o->rec);
    if (record) o->n_rec = 0;
    const mp_status st = sweeps(ctx, o->steps, kind, pp, v, n_micro, stage, end, free_t, pos, record ? o : NULL);
    if (st != MP_OK && record) o->n_rec = 0;
    MP_CHECK(st);
  }
  for (int s = 0; s < pp; s++) finish[s] = free_t[s];
  return MP_OK;
}

/* Beyond a few pipeline depths the timeline is periodic: every stage adds the same time per
 * group of pp micro-batches (a max-plus system of fixed step times settles into its cycle
 * once the warm-up has passed). Long pipelines are therefore run for m0, m0 + pp and m0 + 2pp
 * micro-batches (m0 the first multiple of pp from 2 pp + 8 on); when the last two groups
 * add the same to every stage, the rest is that much per group, else the whole step is run. */
mp_status mp_sim_pipeline_ws(mp_ctx *ctx, mp_sim_workspace *ws, mp_pp_schedule kind,
                             mp_pp_flavor flavor, int pp, int v, int64_t n_micro,
                             const mp_pp_stage_times *const *stage, double *finish) {
  const int64_t m0 = ((2 * (int64_t)pp + 8 + pp - 1) / pp) * pp;
  if (n_micro <= m0 + 2 * pp || (n_micro - m0) % pp != 0)
    return timeline(ctx, ws, kind, flavor, pp, v, n_micro, stage, finish);
  double a[MP_MAX_LAYERS], b[MP_MAX_LAYERS], c[MP_MAX_LAYERS];
  if (pp > MP_MAX_LAYERS) return timeline(ctx, ws, kind, flavor, pp, v, n_micro, stage, finish);
  MP_CHECK(timeline(ctx, ws, kind, flavor, pp, v, m0, stage, a));
  MP_CHECK(timeline(ctx, ws, kind, flavor, pp, v, m0 + pp, stage, b));
  MP_CHECK(timeline(ctx, ws, kind, flavor, pp, v, m0 + 2 * pp, stage, c));
  for (int s = 0; s < pp; s++) {
    const double d1 = b[s] - a[s], d2 = c[s] - b[s];
    if (fabs(d1 - d2) > 1e-9 * fabs(d2) + 1e-15)
      return timeline(ctx, ws, kind, flavor, pp, v, n_micro, stage, finish);
  }
  const double groups = (double)((n_micro - m0 - 2 * pp) / pp);
  for (int s = 0; s < pp; s++) finish[s] = c[s] + groups * (c[s] - b[s]);
  return MP_OK;
}

mp_status mp_sim_pipeline(mp_ctx *ctx, mp_pp_schedule kind, mp_pp_flavor flavor, int pp, int v,
                          int64_t n_micro, const mp_pp_stage_times *const *stage,
                          double *finish) {
  mp_sim_workspace *ws = NULL;
  MP_CHECK(mp_sim_workspace_create(ctx, &ws));
  const mp_status st = mp_sim_pipeline_ws(ctx, ws, kind, flavor, pp, v, n_micro, stage, finish);
  mp_sim_workspace_destroy(ws);
  return st;
}

/* The most a stage holds at the start of a step, walking `n` steps of `ord` (a forward's
 * chunk counted from its start, released after its backward, or its W where the order
 * splits the backward: mp_pp_inflight). */
static int64_t held_most(const mp_pp_step *ord, int64_t n, const int64_t *held) {
  const int release = mp_pp_order_splits_w(ord, n) ? MP_PP_STEP_W : MP_PP_STEP_B;
  int64_t now = 0, most = 0;
  for (int64_t i = 0; i < n; i++) {
    if (ord[i].bwd == MP_PP_STEP_F) now += held[ord[i].chunk];
    if (now > most) most = now;
    if (ord[i].bwd == release) now -= held[ord[i].chunk];
  }
  MP_ASSERT(now == 0, "every chunk a forward held is released by its backward");
  return most;
}

mp_status mp_sim_pp_combined_save(mp_ctx *ctx, mp_sim_workspace *ws, mp_pp_schedule kind, mp_pp_flavor flavor,
                                  int pp, int v, int64_t n_micro, int stage, const mp_pp_stage_times *t,
                                  double *save) {
  *save = 0.0;
  const int64_t per = order_len(kind, v, n_micro);
  if (stage < 0 || stage >= pp)
    return mp_error(ctx, MP_ERR_INVALID, "pipeline order: stage %d of pp=%d", stage, pp);
  const int shape = shape_of(kind), chunks = shape == SHAPE_DUAL ? 2 : v, K = pp * chunks;
  if (!any_combined(&t, 1, chunks)) return MP_OK; /* no pair saves: no order to walk */
  const mp_pp_step *all = all_orders(ctx, ws, kind, flavor, pp, v, n_micro, per);
  if (all == NULL) return ctx->last;
  const mp_pp_step *ord = all + (size_t)stage * per;
  /* the sweeps' rule (combined) and run_steps's saving, step for step */
  for (int64_t i = 0; i < per; i++) {
    if (combined(ord, i, per, stage, pp, K, shape, t) != 2) continue;
    const double sf = t->fb_save[ord[i].chunk], sb = t->fb_save[ord[i + 1].chunk];
    *save += sf < sb ? sf : sb;
    i++;
  }
  return MP_OK;
}

mp_status mp_sim_pp_held_extra(mp_ctx *ctx, mp_sim_workspace *ws, mp_pp_schedule kind,
                               mp_pp_flavor flavor, int pp, int v, int64_t n_micro, int stage,
                               const int64_t *held, int64_t *extra) {
  /* 1F1B and interleaved hold the most once their warm-up is done, (pp - 1) x 2 + (v - 1)
   * x pp + 1 chunk steps at most: a shorter order of whole groups of pp micro-batches holds
   * as much; GPipe holds every micro-batch */
  const int64_t warm = (int64_t)(pp - 1) * 2 + (int64_t)(v - 1) * pp + 1;
  const int64_t cap = ((warm + pp - 1) / pp + 1) * pp;
  if (kind != MP_PP_GPIPE && kind != MP_PP_DUALPIPE && !mp_pp_schedule_splits_w(kind) && n_micro > cap)
    n_micro = cap;
  const int64_t per = order_len(kind, v, n_micro);
  if (stage < 0 || stage >= pp)
    return mp_error(ctx, MP_ERR_INVALID, "pipeline order: stage %d of pp=%d", stage, pp);
  const mp_pp_step *ord = all_orders(ctx, ws, kind, flavor, pp, v, n_micro, per);
  if (ord == NULL) return ctx->last;
  const int64_t all = held_most(ord + (size_t)stage * per, per, held);
  /* one micro-batch alone: its chunks' forwards in order, then their backwards */
  mp_pp_step one[2 * MP_PP_MAX_VIRTUAL];
  for (int c = 0; c < v; c++) {
    one[c] = (mp_pp_step){0, (uint8_t)c, 0, 0};
    one[v + c] = (mp_pp_step){1, (uint8_t)(v - 1 - c), 0, 0};
  }
  *extra = all - held_most(one, 2 * v, held);
  if (*extra < 0) *extra = 0;
  return MP_OK;
}
