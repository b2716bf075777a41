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
 * uneven stages the slowest paces the steady state and the others wait.
 *
 * Memory. A stage holds the activations of every chunk step whose forward has run and
 * whose backward has not (mp_pp_inflight); what one chunk's forward leaves held comes from
 * the stage's simulated micro-batch. Beyond the one micro-batch the stage's own replay
 * holds, the extra is the most held at the start of a step of its order less the most held
 * at the start of a step of one micro-batch's order alone. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim_internal.h"

/* Per-thread scratch for the orders and the end times, grown to the largest pipeline. */
static _Thread_local mp_pp_step *g_steps;
static _Thread_local size_t g_steps_cap;
static _Thread_local double *g_ends;
static _Thread_local size_t g_ends_cap;
static _Thread_local int64_t *g_pos;
static _Thread_local size_t g_pos_cap;

void mp_sim_pipeline_release(void) {
  free(g_steps);
  free(g_ends);
  free(g_pos);
  g_steps = NULL;
  g_ends = NULL;
  g_pos = NULL;
  g_steps_cap = g_ends_cap = g_pos_cap = 0;
}

static int grow(void **p, size_t *cap, size_t n, size_t elem) {
  if (n <= *cap) return 1;
  void *q = realloc(*p, n * elem);
  if (q == NULL) return 0;
  *p = q;
  *cap = n;
  return 1;
}

/* The ready time of step q of stage s: when its input (forward) or output gradient
 * (backward) is there; NAN while the step it waits for has not run. end[(k x 2 + bwd) x m
 * + micro] holds the end of each virtual stage's steps (NAN: not yet). */
static double ready_s(const mp_pp_step *q, int s, int pp, int K, int64_t m, const double *end,
                      const mp_pp_stage_times *const *st) {
  const int k = q->chunk * pp + s;
  if (!q->bwd) {
    if (k == 0) return 0.0;
    const int kp = k - 1, sp = kp % pp;
    const double e = end[((int64_t)kp * 2) * m + q->micro];
    return isnan(e) ? NAN : e + st[sp]->send_f;
  }
  if (k == K - 1) return end[((int64_t)k * 2) * m + q->micro];
  const int kn = k + 1, sn = kn % pp;
  const double e = end[((int64_t)kn * 2 + 1) * m + q->micro];
  return isnan(e) ? NAN : e + st[sn]->send_b;
}

mp_status mp_sim_pipeline(mp_ctx *ctx, mp_pp_schedule kind, int pp, int v, int64_t n_micro,
                          const mp_pp_stage_times *const *stage, double *finish) {
  const int64_t per = 2 * n_micro * v; /* steps per stage */
  const int K = pp * v;
  if (!grow((void **)&g_steps, &g_steps_cap, (size_t)(per * pp), sizeof *g_steps) ||
      !grow((void **)&g_ends, &g_ends_cap, (size_t)(2 * n_micro * K + pp), sizeof *g_ends) ||
      !grow((void **)&g_pos, &g_pos_cap, (size_t)pp, sizeof *g_pos))
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the pipeline timeline of %d stages",
                    pp);
  double *end = g_ends, *free_t = g_ends + 2 * n_micro * K;
  int64_t *pos = g_pos;
  for (int64_t i = 0; i < 2 * n_micro * K; i++) end[i] = NAN;
  for (int s = 0; s < pp; s++) {
    int64_t n = 0;
    MP_CHECK(mp_pp_order(ctx, kind, pp, v, n_micro, s, g_steps + (size_t)s * per, &n));
    free_t[s] = 0.0;
    pos[s] = 0;
  }
  /* Sweep the stages, each as far as its next step's input is there, until all are done;
   * a sweep without progress would be a deadlock of the orders. */
  int64_t left = per * pp;
  while (left > 0) {
    int64_t progress = 0;
    for (int s = 0; s < pp; s++) {
      const mp_pp_step *ord = g_steps + (size_t)s * per;
      while (pos[s] < per) {
        const mp_pp_step *q = &ord[pos[s]];
        const double r = ready_s(q, s, pp, K, n_micro, end, stage);
        if (isnan(r)) break;
        const double t0 = free_t[s] > r ? free_t[s] : r;
        const double d = q->bwd ? stage[s]->b[q->chunk] : stage[s]->f[q->chunk];
        free_t[s] = t0 + d;
        end[((int64_t)(q->chunk * pp + s) * 2 + q->bwd) * n_micro + q->micro] = free_t[s];
        pos[s]++;
        progress++;
      }
    }
    if (progress == 0)
      return mp_error(ctx, MP_ERR_INTERNAL,
                      "pipeline timeline: the stages' orders wait on each other (pp=%d, %d "
                      "chunks, %lld micro-batches)",
                      pp, v, (long long)n_micro);
    left -= progress;
  }
  for (int s = 0; s < pp; s++) finish[s] = free_t[s];
  return MP_OK;
}

/* The most a stage holds at the start of a step, walking `n` steps of `ord` (a forward's
 * chunk counted from its start, released after its backward). */
static int64_t held_most(const mp_pp_step *ord, int64_t n, const int64_t *held) {
  int64_t now = 0, most = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!ord[i].bwd) now += held[ord[i].chunk];
    if (now > most) most = now;
    if (ord[i].bwd) now -= held[ord[i].chunk];
  }
  return most;
}

mp_status mp_sim_pp_held_extra(mp_ctx *ctx, mp_pp_schedule kind, int pp, int v, int64_t n_micro,
                               int stage, const int64_t *held, int64_t *extra) {
  const int64_t per = 2 * n_micro * v;
  if (!grow((void **)&g_steps, &g_steps_cap, (size_t)per, sizeof *g_steps))
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory for a pipeline order");
  int64_t n = 0;
  MP_CHECK(mp_pp_order(ctx, kind, pp, v, n_micro, stage, g_steps, &n));
  const int64_t all = held_most(g_steps, n, held);
  /* one micro-batch alone: its chunks' forwards in order, then their backwards */
  mp_pp_step one[2 * MP_PP_MAX_VIRTUAL];
  for (int c = 0; c < v; c++) {
    one[c] = (mp_pp_step){0, (uint8_t)c, 0};
    one[v + c] = (mp_pp_step){1, (uint8_t)(v - 1 - c), 0};
  }
  *extra = all - held_most(one, 2 * v, held);
  if (*extra < 0) *extra = 0;
  return MP_OK;
}
