/* The planner's search, its parallel evaluation (see search.h): worker threads claim chunks
 * of candidates in order, decide some from their siblings, simulate the rest through the
 * evaluator, and the calling thread delivers each chunk in order.
 *
 * Invariants: candidates are stored in enumeration order and never move; a candidate's
 * reject code is set once (by the pruning rules at enumeration, or by its worker after
 * evaluation) before it is delivered to the sink; workers write only the candidates of
 * the chunks they claimed, and the calling thread reads a chunk only after the worker
 * marked it done under the mutex (which orders the writes before the reads). What a worker
 * decides for a candidate depends only on its chunk (never on the threads' timing). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/timeutil.h"
#include "planner/search.h"

/* ---- parallel evaluation -------------------------------------------------------------- */

/* Chunks: runs of consecutive candidates a worker claims at once. A chunk ends where the
 * mesh changes once it holds at least CHUNK_MIN candidates, so a mesh's candidates stay
 * with one worker (the evaluator caches per mesh what they share: one plan per float8
 * setting); CHUNK_MAX bounds a chunk inside one huge mesh, ending it only between families
 * (candidates differing in micro-batch, AC, float8 and reshard alone, a few hundred at
 * most) so that a candidate's siblings are in its own chunk. Small enough that the
 * workers stay balanced when candidates cost differently (pp, MoE). */
#define CHUNK_MIN 32
#define CHUNK_MAX 256
/* bound_top_k: chunk k's bound comes from the chunks up to k - BOUND_LAG, a fixed lag
 * (never the number of threads) so that the outcomes do not depend on the threads; larger
 * than the workers of a small machine, which then seldom wait for it. */
#define BOUND_LAG 8

/* a and b are of one family: the same mesh, model chunks and SP */
static int same_family(const mp_candidate *a, const mp_candidate *b) {
  return memcmp(&a->mesh, &b->mesh, sizeof a->mesh) == 0 && a->pp_virtual == b->pp_virtual &&
         a->pp_split == b->pp_split && a->sp == b->sp;
}

/* AC policy q recomputes a subset of what p recomputes (the dominance order of search.h). */
static int recomputes_less(int q, int p) {
  if (q == p) return 0;
  if (q == MP_AC_NONE) return 1;
  if (p != MP_AC_FULL) return q == MP_AC_SELECTIVE_CORE && p == MP_AC_SELECTIVE;
  return 1;
}

static int over_capacity(const mp_candidate *d) {
  return d->reject == MP_REJECT_MEMORY || d->reject == MP_REJECT_MEMORY_MB ||
         d->reject == MP_REJECT_MEMORY_AC;
}

/* A lower bound of c's step from sibling d, a smaller micro-batch with no more recompute
 * whose step has a lower bound (a bounded stage run's, or one this rule gave it), or 0.
 * The stage bound is n_micro x (forward + backward of a micro-batch); c's micro-batch of
 * r = c/d times d's sequences runs 1/r as many micro-batches, each with every op of d's on
 * r times the rows (the same layers, the same collectives on r times the bytes), so, on
 * the premise that an op on more rows is never faster (the premise the dominance rule
 * takes for more recompute), c's stage bound is at least d's / r (and its batch ratio). */
static double sibling_step_lb(const mp_candidate *c, const mp_candidate *d) {
  if (d->reject != MP_REJECT_BOUNDED || !(d->res.step_lb_s > 0.0) || d->micro_batch >= c->micro_batch ||
      d->global_batch <= 0 || c->ac_every > 1 || d->ac_every > 1 ||
      (d->ac != c->ac && !recomputes_less(d->ac, c->ac)))
    return 0.0;
  return d->res.step_lb_s * ((double)c->global_batch / (double)d->global_batch) *
         ((double)d->micro_batch / (double)c->micro_batch);
}

/* What c's siblings before it in its chunk (from lo; the same worker decided them, so
 * the outcome does not depend on timing) decide: MP_REJECT_MEMORY_MB, MP_REJECT_MEMORY_AC,
 * MP_REJECT_DOMINATED (with prune_dominated), MP_REJECT_BOUNDED (with a step bound:
 * bound_s, the chunk's per sequence, > 0; *lb_s then the step's lower bound a smaller
 * micro-batch gives, 0 where a sibling recomputing less gave it), or MP_REJECT_NONE:
 * simulate it. */
static mp_reject sibling_verdict(const mp_search *s, int prune_dominated, int64_t lo,
                                 int64_t i, double bound_s, double *lb_s) {
  const mp_candidate *c = &s->cands[i];
  *lb_s = 0.0;
  for (int64_t j = i - 1; j >= lo; j--) {
    const mp_candidate *d = &s->cands[j];
    if (!same_family(c, d)) break;
    if (d->fp8 != c->fp8 || d->reshard != c->reshard) continue;
    const double lb = bound_s > 0.0 ? sibling_step_lb(c, d) : 0.0;
    if (lb > bound_s * (double)c->global_batch) {
      *lb_s = lb;
      return MP_REJECT_BOUNDED;
    }
    if (d->micro_batch * 2 == c->micro_batch && d->ac == c->ac &&
        d->ac_every == c->ac_every && over_capacity(d))
      return MP_REJECT_MEMORY_MB;
    if (d->micro_batch != c->micro_batch) continue;
    if (d->ac == MP_AC_FULL && d->ac_every <= 1 && c->ac != MP_AC_FULL && over_capacity(d))
      return MP_REJECT_MEMORY_AC;
    if (prune_dominated && c->ac_every <= 1 && d->ac_every <= 1 && d->evaluated &&
        d->reject == MP_REJECT_NONE && recomputes_less(d->ac, c->ac))
      return MP_REJECT_DOMINATED;
    /* the dominance rule's premise (more recompute is never faster) puts c's step past
     * the bound d's step is past */
    if (prune_dominated && c->ac_every <= 1 && d->ac_every <= 1 && d->reject == MP_REJECT_BOUNDED &&
        recomputes_less(d->ac, c->ac))
      return MP_REJECT_BOUNDED;
  }
  return MP_REJECT_NONE;
}

typedef struct run_shared {
  const mp_search_config *cfg;
  mp_search *s;
  int64_t n_chunks;
  int64_t *chunk_lo;  /* chunk k is candidates [chunk_lo[k], chunk_lo[k + 1]) */
  int64_t next_chunk; /* guarded by mu */
  unsigned char *done; /* per chunk, guarded by mu */
  int64_t wake_at;     /* guarded by mu: the chunk whose completion wakes the calling thread
                          (-1: it is not waiting) */
  int stop;            /* guarded by mu: the caller gave up */
  mp_status fatal;     /* a worker could not go on (out of memory) */
  int64_t set_aside;   /* guarded by mu: the workers' n_set_aside (mp_search) */
  /* bound_top_k: the K smallest costs (step per sequence) of the plans that fit in chunks
   * [0, folded), ascending (n_best of them), and per folded chunk k the cost bound of
   * chunk k + BOUND_LAG (bound_after[k]; 0: fewer than K plans fit yet). Guarded by mu. */
  double *best;
  int n_best;
  int64_t folded;
  double *bound_after;
  mp_ctx fatal_ctx;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} run_shared;

static void eval_one(run_shared *sh, void *user, mp_ctx *ctx, mp_arena *scratch,
                     mp_candidate *c, double bound) {
  mp_ctx_init(ctx);
  mp_sim_result r;
  memset(&r, 0, sizeof r);
  c->step_bound_s = bound > 0.0 ? bound * (double)c->global_batch : 0.0;
  mp_status st = sh->cfg->eval(user, ctx, scratch, c, &r);
  mp_arena_reset(scratch);
  c->evaluated = 1;
  if (st != MP_OK) {
    c->reject = MP_REJECT_EVAL_ERROR;
    /* Evaluator errors are rare: their messages go to the search arena, under the mutex
     * because the arena is not thread-safe. NULL (out of memory) reads "evaluation failed". */
    pthread_mutex_lock(&sh->mu);
    c->error = mp_arena_strdup(sh->s->arena, mp_errmsg(ctx)[0] ? mp_errmsg(ctx) : mp_status_name(st));
    pthread_mutex_unlock(&sh->mu);
    return;
  }
  c->res = r;
  c->reject = r.bounded ? MP_REJECT_BOUNDED : r.fits ? MP_REJECT_NONE : MP_REJECT_MEMORY;
}

/* A worker's set-up: its scratch arena and the evaluator's state for it (*user, from
 * eval_thread_init). 0 when either fails: the search then stops with the error. */
static int worker_start(run_shared *sh, mp_ctx *ctx, mp_arena **scratch, void **user) {
  *user = sh->cfg->eval_user;
  *scratch = mp_arena_create();
  mp_status st = *scratch ? MP_OK
                          : mp_error(ctx, MP_ERR_NOMEM, "out of memory creating a worker arena");
  if (st == MP_OK && sh->cfg->eval_thread_init)
    st = sh->cfg->eval_thread_init(sh->cfg->eval_user, ctx, user);
  if (st == MP_OK) return 1;
  mp_arena_destroy(*scratch);
  pthread_mutex_lock(&sh->mu);
  if (sh->fatal == MP_OK) {
    sh->fatal = st;
    sh->fatal_ctx = *ctx;
  }
  sh->stop = 1;
  pthread_cond_broadcast(&sh->cv);
  pthread_mutex_unlock(&sh->mu);
  return 0;
}

/* A worker's means of deciding candidates: the search, the worker's context, scratch arena
 * and evaluator state, and the chunk it works on. */
typedef struct worker {
  run_shared *sh;
  mp_ctx ctx;
  mp_arena *scratch;
  void *user;
  int64_t lo, hi; /* the chunk: candidates [lo, hi) */
  double bound;   /* the chunk's cost bound (bound_top_k; 0: none) */
  int64_t set_aside; /* simulations whose result this worker set aside */
} worker;

/* c decided by its siblings (sibling_verdict): rule v, and with a step's lower bound lb_s
 * from a smaller micro-batch that bound and the chunk's (what the reason states, and what
 * a larger micro-batch after c scales again). */
static void sibling_decided(const worker *w, mp_candidate *c, mp_reject v, double lb_s) {
  c->reject = (uint8_t)v;
  if (!(lb_s > 0.0)) return;
  c->res.step_lb_s = lb_s;
  c->step_bound_s = w->bound * (double)c->global_batch;
}

static int no_recompute(const mp_candidate *c) { return c->ac == MP_AC_NONE && c->ac_every <= 1; }

/* Candidate i decided as enumeration order decides it: by its siblings before it, else
 * simulated. A candidate already decided is left as it is. */
static void decide(worker *w, int64_t i) {
  mp_candidate *c = &w->sh->s->cands[i];
  if (c->reject != MP_REJECT_NONE || c->evaluated) return;
  double lb = 0.0;
  const mp_reject v = sibling_verdict(w->sh->s, w->sh->cfg->prune_dominated, w->lo, i, w->bound, &lb);
  if (v != MP_REJECT_NONE)
    sibling_decided(w, c, v, lb);
  else
    eval_one(w->sh, w->user, &w->ctx, w->scratch, c, w->bound);
}

/* The full-AC sibling after none-AC candidate i in its chunk (the same family, micro-batch,
 * float8 and reshard, every block recomputed; the AC policies come none, full, then those
 * between, search.h), or -1. */
static int64_t full_sibling(const worker *w, int64_t i) {
  const mp_candidate *c = &w->sh->s->cands[i];
  for (int64_t j = i + 1; j < w->hi; j++) {
    const mp_candidate *d = &w->sh->s->cands[j];
    if (!same_family(c, d) || d->micro_batch != c->micro_batch) break;
    if (d->ac == MP_AC_FULL && d->ac_every <= 1 && d->fp8 == c->fp8 && d->reshard == c->reshard)
      return j;
  }
  return -1;
}

/* None-AC candidate i with its full-AC sibling j decided first (full_ac_ahead): over
 * capacity without a simulation when full AC is (MP_REJECT_MEMORY_AC: AC none saves every
 * activation full AC saves, and more), else simulated; when it then fits, j is what
 * enumeration order makes it, dominated (prune_dominated), its simulation set aside. */
static void decide_none_after_full(worker *w, int64_t i, int64_t j) {
  mp_candidate *c = &w->sh->s->cands[i], *d = &w->sh->s->cands[j];
  decide(w, j);
  if (over_capacity(d)) {
    c->reject = MP_REJECT_MEMORY_AC;
    return;
  }
  eval_one(w->sh, w->user, &w->ctx, w->scratch, c, w->bound);
  if (c->reject != MP_REJECT_NONE || !w->sh->cfg->prune_dominated) return;
  w->set_aside += d->evaluated;
  d->reject = MP_REJECT_DOMINATED;
  d->evaluated = 0;
  d->error = NULL;
  memset(&d->res, 0, sizeof d->res);
}

static int full_recompute(const mp_candidate *c) { return c->ac == MP_AC_FULL && c->ac_every <= 1; }

/* The chunk [w->lo, w->hi). With full_ac_ahead a none-AC candidate's full-AC sibling is
 * decided first when the chunk's last full-AC candidate was over capacity (or none was
 * decided yet): neighbouring meshes and micro-batches hold about as much, so this one
 * likely is too, and then the none-AC candidate needs no simulation; where full AC fits,
 * enumeration order is kept, as simulating full AC first would be for nothing when none
 * fits (it makes full AC dominated). The hint is the chunk's own, so decisions do not
 * depend on the threads. */
static void run_chunk(worker *w) {
  const mp_search_config *cfg = w->sh->cfg;
  int full_over = 1;
  for (int64_t i = w->lo; i < w->hi; i++) {
    mp_candidate *c = &w->sh->s->cands[i];
    if (c->reject != MP_REJECT_NONE || c->evaluated) continue;
    double lb = 0.0;
    const mp_reject v = sibling_verdict(w->sh->s, cfg->prune_dominated, w->lo, i, w->bound, &lb);
    const int64_t j = v == MP_REJECT_NONE && cfg->full_ac_ahead && full_over && no_recompute(c)
                          ? full_sibling(w, i)
                          : -1;
    if (v != MP_REJECT_NONE)
      sibling_decided(w, c, v, lb);
    else if (j >= 0)
      decide_none_after_full(w, i, j);
    else
      eval_one(w->sh, w->user, &w->ctx, w->scratch, c, w->bound);
    if (j >= 0) full_over = over_capacity(&w->sh->s->cands[j]);
    if (full_recompute(c)) full_over = over_capacity(c);
  }
}

/* The chunks folded into the bound: candidates of chunk ch that fit, by cost, into the K
 * best (insertion into the sorted array: K is what plan shows, a few). Caller holds mu. */
static void fold_chunk(run_shared *sh, int64_t ch) {
  const int K = sh->cfg->bound_top_k;
  for (int64_t i = sh->chunk_lo[ch]; i < sh->chunk_lo[ch + 1]; i++) {
    const mp_candidate *c = &sh->s->cands[i];
    if (!c->evaluated || c->reject != MP_REJECT_NONE || c->global_batch <= 0) continue;
    const double cost = c->res.step_time_s / (double)c->global_batch;
    if (sh->n_best == K && !(cost < sh->best[K - 1])) continue;
    int j = sh->n_best < K ? sh->n_best++ : K - 1;
    for (; j > 0 && sh->best[j - 1] > cost; j--) sh->best[j] = sh->best[j - 1];
    sh->best[j] = cost;
  }
  sh->bound_after[ch] = sh->n_best == K ? sh->best[K - 1] * (1.0 + MP_RANK_TIE_TOL) : 0.0;
}

/* Chunk ch done: marked, and the chunks done in order from the last folded one folded
 * (bound_top_k). Caller holds mu. */
static void chunk_done(run_shared *sh, int64_t ch) {
  sh->done[ch] = 1;
  if (sh->cfg->bound_top_k <= 0) return;
  while (sh->folded < sh->n_chunks && sh->done[sh->folded]) fold_chunk(sh, sh->folded++);
}

/* Chunk ch's cost bound: the K-th best cost of the chunks up to ch - BOUND_LAG, waited
 * for (they were claimed before ch, so their workers never wait on ch), with the tie
 * tolerance: a plan past it is never among the K shown (rank.c ranks a plan in the first
 * K only within the tolerance of a cost at most the K-th best). Fixed chunks, not the
 * threads' progress, decide it, so a candidate's outcome does not depend on timing. */
static double chunk_bound(run_shared *sh, int64_t ch) {
  if (sh->cfg->bound_top_k <= 0 || ch < BOUND_LAG) return 0.0;
  pthread_mutex_lock(&sh->mu);
  while (sh->folded <= ch - BOUND_LAG && !sh->stop) pthread_cond_wait(&sh->cv, &sh->mu);
  const double b = sh->folded > ch - BOUND_LAG ? sh->bound_after[ch - BOUND_LAG] : 0.0;
  pthread_mutex_unlock(&sh->mu);
  return b;
}

static void *worker_main(void *arg) {
  worker w;
  memset(&w, 0, sizeof w);
  w.sh = arg;
  run_shared *sh = w.sh;
  mp_ctx_init(&w.ctx);
  if (!worker_start(sh, &w.ctx, &w.scratch, &w.user)) return NULL;
  for (;;) {
    pthread_mutex_lock(&sh->mu);
    int64_t ch = sh->stop ? sh->n_chunks : sh->next_chunk++;
    pthread_mutex_unlock(&sh->mu);
    if (ch >= sh->n_chunks) break;
    w.lo = sh->chunk_lo[ch];
    w.hi = sh->chunk_lo[ch + 1];
    w.bound = chunk_bound(sh, ch);
    run_chunk(&w);
    pthread_mutex_lock(&sh->mu);
    const int64_t folded = sh->folded;
    chunk_done(sh, ch);
    if (ch == sh->wake_at || sh->folded != folded) pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
  }
  pthread_mutex_lock(&sh->mu);
  sh->set_aside += w.set_aside;
  pthread_mutex_unlock(&sh->mu);
  mp_arena_destroy(w.scratch);
  if (sh->cfg->eval_thread_done) sh->cfg->eval_thread_done(w.user);
  return NULL;
}

/* The calling thread, holding sh->mu, waits for chunk ch: woken by the completion of the
 * last not yet done of the WAKE_BATCH chunks from ch (or by an error), so that it sleeps and
 * wakes once per batch of chunks rather than once per chunk, the workers running ahead.
 * Delivery stays in order: the caller re-checks done[ch]. */
#define WAKE_BATCH 64
static void wait_chunks(run_shared *sh, int64_t ch) {
  int64_t last = ch + WAKE_BATCH - 1 < sh->n_chunks ? ch + WAKE_BATCH - 1 : sh->n_chunks - 1;
  while (last > ch && sh->done[last]) last--;
  sh->wake_at = last;
  pthread_cond_wait(&sh->cv, &sh->mu);
}

/* The run's counts of s (search.h, mp_search) from its candidates' outcomes. */
static void count_outcomes(mp_search *s, int64_t set_aside) {
  s->n_evaluated = s->n_feasible = s->n_failed = s->n_dominated = s->n_implied = 0;
  s->n_set_aside = set_aside;
  for (int64_t i = 0; i < s->n; i++) {
    const mp_candidate *c = &s->cands[i];
    s->n_dominated += c->reject == MP_REJECT_DOMINATED;
    s->n_implied += c->reject == MP_REJECT_MEMORY_MB || c->reject == MP_REJECT_MEMORY_AC;
    if (!c->evaluated) continue;
    s->n_evaluated++;
    if (c->reject == MP_REJECT_NONE) s->n_feasible++;
    if (c->reject == MP_REJECT_EVAL_ERROR) s->n_failed++;
  }
}

/* The per-chunk state after the chunk boundaries: done flags, the bound's K best and
 * per-chunk bounds. 0 when out of memory (chunks_free then frees what was made). */
static int chunks_alloc(run_shared *sh) {
  const size_t n = (size_t)(sh->n_chunks > 0 ? sh->n_chunks : 1);
  const int K = sh->cfg->bound_top_k > 0 ? sh->cfg->bound_top_k : 0;
  sh->done = calloc(n, 1);
  sh->best = malloc(sizeof(double) * (size_t)(K + 1));
  sh->bound_after = calloc(n, sizeof(double));
  return sh->done && sh->best && sh->bound_after;
}

static void chunks_free(run_shared *sh) {
  free(sh->done);
  free(sh->best);
  free(sh->bound_after);
  free(sh->chunk_lo);
}

mp_status mp_search_run(mp_ctx *ctx, const mp_search_config *cfg, mp_search *s,
                        mp_search_sink_fn sink, void *sink_user,
                        mp_search_progress_fn progress, void *progress_user) {
  if (!cfg->eval) return mp_error(ctx, MP_ERR_INVALID, "search has no evaluator");
  double t0 = mp_now_s();
  int nt = cfg->n_threads;
  if (nt <= 0) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    nt = ncpu > 0 ? (int)ncpu : 1;
  }
  if (nt > 64) nt = 64;
  run_shared sh;
  memset(&sh, 0, sizeof sh);
  sh.cfg = cfg;
  sh.s = s;
  /* chunk boundaries (see CHUNK_MIN): at most one chunk per CHUNK_MIN candidates */
  sh.chunk_lo = malloc(sizeof(int64_t) * (size_t)(s->n / CHUNK_MIN + 2));
  MP_CHECK_ALLOC(ctx, sh.chunk_lo);
  sh.n_chunks = 0;
  for (int64_t i = 0; i < s->n; i++) {
    const int64_t len = sh.n_chunks ? i - sh.chunk_lo[sh.n_chunks - 1] : 0;
    const int group_ends = i > 0 && !same_family(&s->cands[i], &s->cands[i - 1]);
    if (sh.n_chunks == 0 || (len >= CHUNK_MAX && group_ends) ||
        (len >= CHUNK_MIN &&
         memcmp(&s->cands[i].mesh, &s->cands[i - 1].mesh, sizeof s->cands[i].mesh) != 0))
      sh.chunk_lo[sh.n_chunks++] = i;
  }
  sh.chunk_lo[sh.n_chunks] = s->n;
  if (!chunks_alloc(&sh)) {
    chunks_free(&sh);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory starting the search");
  }
  mp_ctx_init(&sh.fatal_ctx);
  sh.wake_at = -1;
  pthread_mutex_init(&sh.mu, NULL);
  pthread_cond_init(&sh.cv, NULL);
  pthread_t th[64];
  int started = 0;
  for (int i = 0; i < nt; i++) {
    if (pthread_create(&th[i], NULL, worker_main, &sh) != 0) break;
    started++;
  }
  mp_status st = MP_OK;
  if (started == 0) st = mp_error(ctx, MP_ERR_INTERNAL, "could not start a search thread");
  for (int64_t ch = 0; ch < sh.n_chunks && st == MP_OK; ch++) {
    pthread_mutex_lock(&sh.mu);
    while (!sh.done[ch] && sh.fatal == MP_OK) wait_chunks(&sh, ch);
    sh.wake_at = -1;
    mp_status fatal = sh.fatal;
    pthread_mutex_unlock(&sh.mu);
    if (fatal != MP_OK) {
      *ctx = sh.fatal_ctx;
      st = fatal;
      break;
    }
    int64_t lo = sh.chunk_lo[ch], hi = sh.chunk_lo[ch + 1];
    for (int64_t i = lo; i < hi && st == MP_OK; i++)
      if (sink) st = sink(sink_user, ctx, i, &s->cands[i]);
    if (progress) progress(progress_user, hi, s->n);
  }
  pthread_mutex_lock(&sh.mu);
  sh.stop = 1;
  pthread_mutex_unlock(&sh.mu);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&sh.mu);
  pthread_cond_destroy(&sh.cv);
  chunks_free(&sh);
  count_outcomes(s, sh.set_aside);
  s->run_s = mp_now_s() - t0;
  return st;
}

