/* The pipeline order of a stage (schedule.h, mp_pp_order): in which order a pipeline stage
 * runs the forward and backward steps of its model chunks over the micro-batches of one
 * training step. The one description of it: the simulator's pipeline timeline
 * (sim/pipeline.c) walks it, the in-flight activations a stage holds come from it
 * (mp_pp_inflight), and the runtime is to execute it.
 *
 *   GPipe        every micro-batch's forward, then every backward in micro-batch order
 *                (torch.distributed.pipelining's ScheduleGPipe)
 *   1F1B         stage s runs min(pp - s - 1, m) warm-up forwards, then alternates one
 *                forward and one backward, then drains the remaining backwards
 *                (PipeDream-Flush; Megatron-LM's forward_backward_pipelining_without_
 *                interleaving, Narayanan et al. 2021; torch.distributed.pipelining's
 *                Schedule1F1B runs min(pp - s, m) forwards, then a backward and a forward
 *                alternately: the same sequence)
 *   interleaved  v model chunks per stage, model chunk c x pp + s on stage s; the m x v
 *                chunk steps are taken in groups of pp micro-batches per chunk: virtual step
 *                k runs chunk (k mod pp v) / pp (backward: v - 1 minus it) of micro-batch
 *                (k / (pp v)) pp + k mod pp; stage s runs (pp - s - 1) x 2 + (v - 1) x pp
 *                warm-up forwards, then one forward and one backward alternately, then the
 *                rest of the backwards (Megatron-LM's forward_backward_pipelining_with_
 *                interleaving). Megatron-Core takes any m >= pp: its schedule table
 *                (schedules.py get_schedule_table, microbatch_group_size_per_vp_stage
 *                defaulting to pp, core_v0.14.0) runs the last group of m mod pp
 *                micro-batches chunk by chunk as it runs the full ones;
 *                torch.distributed.pipelining needs m a multiple of pp. The flavors differ in one
 *                case: with m == pp Megatron-LM runs every forward first on every stage
 *                (its all_warmup_microbatches), torch.distributed.pipelining's
 *                ScheduleInterleaved1F1B keeps the formula (its get_rank_warmup_ops, capped
 *                at m x v only), so its last stage starts backwards after (v - 1) x pp
 *                forwards and holds fewer chunks. Everything else is the same in both.
 *                With --overlap-moe-expert-parallel-comm Megatron-LM runs one more warm-up
 *                forward (forward_backward_pipelining_with_interleaving, core_v0.14: the
 *                combined 1F1B runs a forward and a backward of different micro-batches as
 *                one step, which the last stage's first backward needs).
 *   DualPipe     DeepSeek-V3's bidirectional schedule (arXiv 2412.19437, sec. 3.2.1, Fig. 5;
 *                deepseek-ai/DualPipe): half the micro-batches enter at stage 0, half at
 *                stage pp - 1; rank s runs model stage s for the first and pp - 1 - s for
 *                the second, and in the steady state a forward of one direction and a
 *                backward of the other as one overlapped step (order_dualpipe).
 *   ZBV          torch.distributed.pipelining's ScheduleZBVZeroBubble (schedules.py,
 *                _calculate_single_rank_operations, PyTorch v2.6 to v2.8; Qi et al., arXiv
 *                2401.10241, sec. 6): two chunks a rank in a V, chunk 0 model stage s, chunk 1
 *                model stage 2 pp - 1 - s; each backward split into B (input gradient) and W
 *                (weight gradient); order_zbv.
 *   interleaved_zb  ScheduleInterleavedZeroBubble (the paper's ZB-H1 over looped chunks):
 *                the interleaved warm-up with one forward fewer a hop, B in place of each
 *                backward, and stage s deferring each W by s backwards; order_interleaved_zb.
 * A step's bwd: MP_PP_STEP_F, MP_PP_STEP_B (the backward; under the zero-bubble schedules
 * its input-gradient part) or MP_PP_STEP_W (the weight-gradient part of a B before it). */
#include "exec/schedule.h"

/* Megatron's chunk and micro-batch of virtual step k (forward or backward) of m micro-
 * batches: groups of pp micro-batches, each run chunk by chunk; the last group holds the m
 * mod pp left over (none when pp divides m). */
static mp_pp_step interleaved_step(int pp, int v, int64_t m, int64_t k, int bwd) {
  const int64_t group = (int64_t)pp * v, full = m / pp * group;
  int64_t chunk, mb;
  if (k < full) {
    chunk = (k % group) / pp;
    mb = (k / group) * pp + k % pp;
  } else { /* the last, short group */
    const int64_t rest = m % pp;
    chunk = (k - full) / rest;
    mb = m / pp * pp + (k - full) % rest;
  }
  if (bwd) chunk = v - 1 - chunk;
  mp_pp_step s = {(uint8_t)bwd, (uint8_t)chunk, (int32_t)mb, 0};
  return s;
}

static int64_t order_interleaved(int pp, int v, int64_t m, int stage, mp_pp_flavor flavor,
                                 mp_pp_step *out) {
  const int64_t total = m * v;
  const int mg = flavor == MP_PP_FLAVOR_MEGATRON || flavor == MP_PP_FLAVOR_MEGATRON_A2A;
  int64_t warm = m == pp && mg ? total
                               : (int64_t)(pp - stage - 1) * 2 + (int64_t)(v - 1) * pp +
                                     (flavor == MP_PP_FLAVOR_MEGATRON_A2A);
  if (warm > total) warm = total;
  int64_t n = 0;
  for (int64_t k = 0; k < warm; k++) out[n++] = interleaved_step(pp, v, m, k, 0);
  for (int64_t k = 0; k < total - warm; k++) {
    out[n] = interleaved_step(pp, v, m, warm + k, 0);
    out[n++].paired = 1; /* a steady-state forward: the one Megatron's combined 1F1B can pair */
    out[n++] = interleaved_step(pp, v, m, k, 1);
  }
  for (int64_t k = total - warm; k < total; k++) out[n++] = interleaved_step(pp, v, m, k, 1);
  return n;
}

static int64_t order_1f1b(int pp, int64_t m, int stage, mp_pp_step *out) {
  int64_t warm = pp - stage - 1, n = 0;
  if (warm > m) warm = m;
  for (int64_t i = 0; i < warm; i++) out[n++] = (mp_pp_step){0, 0, (int32_t)i, 0};
  for (int64_t i = 0; i < m - warm; i++) {
    out[n++] = (mp_pp_step){0, 0, (int32_t)(warm + i), 1};
    out[n++] = (mp_pp_step){1, 0, (int32_t)i, 0};
  }
  for (int64_t i = m - warm; i < m; i++) out[n++] = (mp_pp_step){1, 0, (int32_t)i, 0};
  return n;
}

/* DualPipe (deepseek-ai/DualPipe, dualpipe/dualpipe.py, DualPipe.step): a rank's phase 0
 * is the direction entering at its end of the pipeline (direction 0 on the first half of
 * the ranks, 1 on the second), each direction numbering its micro-batches as it runs them. */
typedef struct dualpipe_walk {
  mp_pp_step *out;
  int64_t n, next[2][2]; /* [bwd][direction]: the next micro-batch */
  int flip;              /* the rank is in the second half: phase p is direction 1 - p */
} dualpipe_walk;

static void dp_step(dualpipe_walk *w, int bwd, int phase) {
  const int dir = phase ^ w->flip;
  w->out[w->n++] = (mp_pp_step){(uint8_t)bwd, (uint8_t)dir, (int32_t)w->next[bwd][dir]++, 0};
}

/* A forward of phase f and a backward of phase b run overlapped as one step (F&B). */
static void dp_pair(dualpipe_walk *w, int f, int b) {
  dp_step(w, 0, f);
  w->out[w->n - 1].paired = 1;
  dp_step(w, 1, b);
}

/* The reference's eight steps with half = pp / 2, h = min(s, pp - 1 - s), m / 2 micro-
 * batches a direction: nF0 (2(half - h - 1)), nF0F1 (h + 1), nB1W1F1 (half - h - 1),
 * nF0B1F1B0 (m / 2 - pp + h + 1, each F0B1 and F1B0 pair one overlapped step), nB1F1B0
 * (half - h - 1), nB1B0 (h + 1), nWB0 (half - h - 1), nW (h + 1). The zero-bubble split of a
 * backward into its input and weight gradients (the W chunks) is not modelled: a backward
 * computes both, so the W steps are empty. On the two middle ranks the first steady F0 and
 * B1 run one after the other, not overlapped, as the reference does. */
static int64_t order_dualpipe(int pp, int64_t m, int stage, mp_pp_step *out) {
  const int64_t half = pp / 2, h = stage < pp - 1 - stage ? stage : pp - 1 - stage;
  dualpipe_walk w = {out, 0, {{0, 0}, {0, 0}}, stage >= pp / 2};
  const int middle = h == half - 1;
  for (int64_t i = 0; i < 2 * (half - h - 1); i++) dp_step(&w, 0, 0);
  for (int64_t i = 0; i < h + 1; i++) dp_step(&w, 0, 0), dp_step(&w, 0, 1);
  for (int64_t i = 0; i < half - h - 1; i++) dp_step(&w, 1, 1), dp_step(&w, 0, 1);
  for (int64_t i = 0; i < m / 2 - pp + h + 1; i++) {
    if (i == 0 && middle) dp_step(&w, 0, 0), dp_step(&w, 1, 1);
    else dp_pair(&w, 0, 1);
    dp_pair(&w, 1, 0);
  }
  for (int64_t i = 0; i < half - h - 1; i++) dp_step(&w, 1, 1), dp_pair(&w, 1, 0);
  for (int64_t i = 0; i < h + 1; i++) dp_step(&w, 1, 1), dp_step(&w, 1, 0);
  for (int64_t i = 0; i < half - h - 1; i++) dp_step(&w, 1, 0);
  return w.n;
}

/* ScheduleZBVZeroBubble's rank operations (schedules.py, v2.6 to v2.8): with n = max(2 pp -
 * 1, m) micro-batches, rank s runs 2 (pp - s) - 1 forwards of chunk 0, s pairs F1 F0, pp - s
 * triples F1 B1 W1, then while chunk 1 lags or chunk 0 has forwards left: F0 (while any left)
 * B0 W0 F1 B1 W1; then s pairs B0 B1, pp - s pairs B0 W0, the remaining W1 and W0. Steps of
 * micro-batches past m (the n - m torch adds for a short step) are dropped, as it drops them
 * (None). */
typedef struct zbv_walk {
  mp_pp_step *out;
  int64_t n, m, next[3][2]; /* [F, B, W][chunk] */
} zbv_walk;

static void zbv_step(zbv_walk *w, int kind, int chunk) {
  const int64_t mb = w->next[kind][chunk]++;
  if (mb < w->m) w->out[w->n++] = (mp_pp_step){(uint8_t)kind, (uint8_t)chunk, (int32_t)mb, 0};
}

static int64_t order_zbv(int pp, int64_t m, int s, mp_pp_step *out) {
  const int64_t n = m > 2 * (int64_t)pp - 1 ? m : 2 * (int64_t)pp - 1;
  zbv_walk w = {out, 0, m, {{0, 0}, {0, 0}, {0, 0}}};
  enum { F = MP_PP_STEP_F, B = MP_PP_STEP_B, W = MP_PP_STEP_W };
  for (int64_t i = 0; i < 2 * (int64_t)(pp - s) - 1; i++) zbv_step(&w, F, 0);
  for (int i = 0; i < s; i++) zbv_step(&w, F, 1), zbv_step(&w, F, 0);
  for (int i = 0; i < pp - s; i++) zbv_step(&w, F, 1), zbv_step(&w, B, 1), zbv_step(&w, W, 1);
  while (w.next[F][1] < w.next[F][0] || w.next[F][0] < n) {
    if (w.next[F][0] < n) zbv_step(&w, F, 0);
    zbv_step(&w, B, 0), zbv_step(&w, W, 0);
    zbv_step(&w, F, 1), zbv_step(&w, B, 1), zbv_step(&w, W, 1);
  }
  for (int i = 0; i < s; i++) zbv_step(&w, B, 0), zbv_step(&w, B, 1);
  for (int i = 0; i < pp - s; i++) zbv_step(&w, B, 0), zbv_step(&w, W, 0);
  while (w.next[W][1] < w.next[B][1]) zbv_step(&w, W, 1);
  while (w.next[W][0] < w.next[B][0]) zbv_step(&w, W, 0);
  return w.n;
}

/* ScheduleInterleavedZeroBubble's rank operations (schedules.py _get_1f1b_rank_ops with
 * enable_zero_bubble, v2.6 to v2.8): r = m / max(1, m / pp) micro-batches a round; stage s
 * runs min((v - 1) r + pp - 1 - s, m v) warm-up forwards, forward step k of chunk (k / r)
 * mod v; then a forward and a B alternately, B step k (counted from the warm-up's end) of
 * chunk v - 1 - (k / r) mod v, each chunk numbering its micro-batches in turn; after each B
 * past its first s, the W of the oldest B without one; the rest of the B's, each followed
 * likewise by a W; then the W's left. */
static int64_t order_interleaved_zb(int pp, int v, int64_t m, int s, mp_pp_step *out) {
  const int64_t r = m / (m / pp > 1 ? m / pp : 1), total = m * v;
  int64_t warm = (int64_t)(v - 1) * r + pp - 1 - s;
  if (warm > total) warm = total;
  int64_t next[3][MP_PP_MAX_VIRTUAL] = {{0}}, n = 0, nw = 0;
#define ZB_PUSH(kind, c) (out[n++] = (mp_pp_step){(uint8_t)(kind), (uint8_t)(c), (int32_t)next[kind][c]++, 0})
  for (int64_t op = 0; op < total + warm; op++) {
    if (op < total) ZB_PUSH(MP_PP_STEP_F, (op / r) % v);
    if (op < warm) continue;
    const int64_t b = op - warm; /* the b-th B */
    ZB_PUSH(MP_PP_STEP_B, v - 1 - (b / r) % v);
    if (b >= s) ZB_PUSH(MP_PP_STEP_W, v - 1 - (nw / r) % v), nw++;
  }
  for (; nw < total; nw++) ZB_PUSH(MP_PP_STEP_W, v - 1 - (nw / r) % v);
#undef ZB_PUSH
  return n;
}

static int64_t order_gpipe(int64_t m, mp_pp_step *out) {
  int64_t n = 0;
  for (int64_t i = 0; i < m; i++) out[n++] = (mp_pp_step){0, 0, (int32_t)i, 0};
  for (int64_t i = 0; i < m; i++) out[n++] = (mp_pp_step){1, 0, (int32_t)i, 0};
  return n;
}

/* The zero-bubble orders with torch.distributed.pipelining's refusals (schedules.py, v2.6 to
 * v2.8): ZBV needs exactly 2 chunks a stage; the interleaved one m a multiple of its rounds
 * (max(1, m / pp)). */
static mp_status order_zb(mp_ctx *ctx, mp_pp_schedule kind, int pp, int v, int64_t m, int stage,
                          mp_pp_step *out, int64_t *n_out) {
  if (kind == MP_PP_ZBV) {
    if (v != 2)
      return mp_error(ctx, MP_ERR_INVALID, "ZBV runs exactly 2 chunks a stage (ScheduleZBVZeroBubble "
                      "requires 2 stages per rank), not %d", v);
    *n_out = order_zbv(pp, m, stage, out);
    return MP_OK;
  }
  const int64_t rounds = m / pp > 1 ? m / pp : 1;
  if (m % rounds)
    return mp_error(ctx, MP_ERR_INVALID, "the interleaved zero-bubble schedule runs %lld micro-batches in "
                    "%lld rounds of pp=%d or more; they must divide evenly (ScheduleInterleavedZeroBubble "
                    "requires a multiple of the rounds): choose a multiple of %lld micro-batches",
                    (long long)m, (long long)rounds, pp, (long long)rounds);
  *n_out = order_interleaved_zb(pp, v, m, stage, out);
  return MP_OK;
}

mp_status mp_pp_order(mp_ctx *ctx, mp_pp_schedule kind, mp_pp_flavor flavor, int pp, int v,
                      int64_t n_micro, int stage, mp_pp_step *out, int64_t *n_out) {
  *n_out = 0;
  if (pp < 1 || stage < 0 || stage >= pp || n_micro < 1 || n_micro > INT32_MAX || v < 1 ||
      v > MP_PP_MAX_VIRTUAL)
    return mp_error(ctx, MP_ERR_INVALID,
                    "pipeline order: stage %d of pp=%d, %d chunks, %lld micro-batches out of range",
                    stage, pp, v, (long long)n_micro);
  if (mp_pp_schedule_splits_w(kind)) return order_zb(ctx, kind, pp, v, n_micro, stage, out, n_out);
  if (kind == MP_PP_INTERLEAVED && v > 1) {
    if (flavor == MP_PP_FLAVOR_TORCH ? n_micro % pp != 0 : n_micro < pp)
      return mp_error(ctx, MP_ERR_INVALID,
                      "the interleaved schedule runs micro-batches in groups of pp=%d; %lld "
                      "micro-batches are %s",
                      pp, (long long)n_micro,
                      flavor == MP_PP_FLAVOR_TORCH ? "not a multiple of it (torch.distributed.pipelining)"
                                                   : "fewer (Megatron-LM needs at least pp)");
    *n_out = order_interleaved(pp, v, n_micro, stage, flavor, out);
  } else if (kind == MP_PP_DUALPIPE) {
    if (v != 1 || pp % 2 || n_micro % 2 || n_micro < 2 * (int64_t)pp)
      return mp_error(ctx, MP_ERR_INVALID,
                      "DualPipe on pp=%d with %lld micro-batches: it feeds half of them from each "
                      "end and needs an even pp, an even number of micro-batches and at least 2 x "
                      "pp = %d of them (deepseek-ai/DualPipe asserts num_chunks %% 2 == 0 and "
                      "num_chunks >= num_ranks * 2); choose a global batch that gives that",
                      pp, (long long)n_micro, 2 * pp);
    *n_out = order_dualpipe(pp, n_micro, stage, out);
  } else if (v > 1) {
    return mp_error(ctx, MP_ERR_INVALID, "pipeline order: %d chunks per stage need the "
                    "interleaved schedule", v);
  } else if (kind == MP_PP_GPIPE) {
    *n_out = order_gpipe(n_micro, out);
  } else {
    *n_out = order_1f1b(pp, n_micro, stage, out);
  }
  return MP_OK;
}

int mp_pp_order_splits_w(const mp_pp_step *order, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (order[i].bwd == MP_PP_STEP_W) return 1;
  return 0;
}

int64_t mp_pp_inflight(const mp_pp_step *order, int64_t n) {
  /* a split backward keeps its chunk's saved tensors until its W: torch's
   * stage_backward_input runs autograd with retain_graph and keeps the graph's state for
   * stage_backward_weight (torch/distributed/pipelining/_backward.py, stage.py
   * backward_state, v2.6 to v2.8) */
  const int release = mp_pp_order_splits_w(order, n) ? MP_PP_STEP_W : MP_PP_STEP_B;
  int64_t held = 0, most = 0;
  for (int64_t i = 0; i < n; i++) {
    if (order[i].bwd == MP_PP_STEP_F) held++;
    if (held > most) most = held;
    if (order[i].bwd == release) held--;
  }
  return most;
}
