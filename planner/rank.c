/* The ranking of a search's feasible plans (see search.h): by the objective, with ties
 * within MP_RANK_TIE_TOL decided toward the simpler plan (mp_candidate_simplicity).
 *
 * Invariant: the order is a permutation of the feasible candidates, deterministic for a
 * given search (ties end at the enumeration index). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "planner/search.h"

/* ---- ranking -------------------------------------------------------------------------- */

mp_status mp_objective_parse(mp_ctx *ctx, const char *str, mp_objective *out) {
  if (strcmp(str, "time") == 0) *out = MP_OBJECTIVE_TIME;
  else if (strcmp(str, "memory") == 0) *out = MP_OBJECTIVE_MEMORY;
  else if (strcmp(str, "tokens-per-dollar") == 0) *out = MP_OBJECTIVE_TOKENS_PER_DOLLAR;
  else if (strcmp(str, "days") == 0) *out = MP_OBJECTIVE_DAYS;
  else if (strcmp(str, "cost") == 0) *out = MP_OBJECTIVE_COST;
  else
    return mp_error(ctx, MP_ERR_USAGE, "--objective %s: use time, memory, tokens-per-dollar, days or cost", str);
  return MP_OK;
}

const char *mp_objective_name(mp_objective o) {
  switch (o) {
    case MP_OBJECTIVE_TIME: return "time";
    case MP_OBJECTIVE_MEMORY: return "memory";
    case MP_OBJECTIVE_TOKENS_PER_DOLLAR: return "tokens-per-dollar";
    case MP_OBJECTIVE_DAYS: return "days";
    case MP_OBJECTIVE_COST: return "cost";
  }
  return "?";
}

double mp_tokens_per_dollar(const mp_candidate *c, double price_per_gpu_hour) {
  if (price_per_gpu_hour <= 0) return 0;
  return c->res.tokens_per_s_per_gpu * 3600.0 / price_per_gpu_hour;
}

int mp_objective_needs_price(mp_objective o) {
  return o == MP_OBJECTIVE_TOKENS_PER_DOLLAR || o == MP_OBJECTIVE_COST;
}

int mp_objective_is_time(mp_objective o) { return o == MP_OBJECTIVE_TIME || o == MP_OBJECTIVE_DAYS; }

/* Lower is better: time per sequence (days to train a number of tokens on the search's
 * GPUs are proportional to it), or the inverse of tokens per dollar (so is the cost). */
static double rank_cost(const mp_candidate *c, mp_objective obj, double price) {
  if (mp_objective_needs_price(obj)) {
    const double t = mp_tokens_per_dollar(c, price);
    return t > 0 ? 1.0 / t : 1e300;
  }
  if (obj == MP_OBJECTIVE_MEMORY) return (double)c->res.peak_mem_bytes;
  return c->res.step_time_s / (double)(c->global_batch > 0 ? c->global_batch : 1);
}

/* Recompute of an AC policy, in the order of mp_candidate_simplicity. */
static int ac_recompute_rank(int ac) {
  switch (ac) {
    case MP_AC_NONE: return 0;
    case MP_AC_SELECTIVE_CORE: return 1;
    case MP_AC_SELECTIVE: return 2;
    case MP_AC_SELECTIVE_OP: return 3;
    default: return 4;
  }
}

int64_t mp_candidate_simplicity(const mp_candidate *c) {
  int dims = c->mesh.ep > 1;
  for (int d = 0; d < MP_MESH_NDIMS; d++) dims += c->mesh.size[d] > 1;
  int64_t k = c->mesh.size[MP_DIM_CP] > 1;
  k = k * 2 + (c->fp8 != 0);
  k = k * 8 + dims;
  k = k * 2 + (c->pp_virtual > 1);
  k = k * 2 + (c->pp_split != 0);
  k = k * 8 + ac_recompute_rank(c->ac);
  return k;
}

typedef struct rank_ctx {
  const mp_candidate *cands;
  const double *cost;    /* per candidate index */
  const int64_t *sorted; /* candidate indices by cost (the heap holds positions in it) */
} rank_ctx;

static int cmp_d(double a, double b) { return a < b ? -1 : a > b ? 1 : 0; }
static int cmp_i(int64_t a, int64_t b) { return a < b ? -1 : a > b ? 1 : 0; }

/* By cost, then peak memory, step time and enumeration order. */
static int by_cost(const void *pa, const void *pb, void *arg) {
  const rank_ctx *r = arg;
  int64_t ia = *(const int64_t *)pa, ib = *(const int64_t *)pb;
  int c = cmp_d(r->cost[ia], r->cost[ib]);
  if (!c) c = cmp_i(r->cands[ia].res.peak_mem_bytes, r->cands[ib].res.peak_mem_bytes);
  if (!c) c = cmp_d(r->cands[ia].res.step_time_s, r->cands[ib].res.step_time_s);
  return c ? c : cmp_i(ia, ib);
}

/* The tie order inside the tolerance, of positions pa, pb in sorted: simpler, then lower
 * memory, cost, enumeration order. */
static int by_simplicity(const rank_ctx *r, int64_t pa, int64_t pb) {
  const int64_t ia = r->sorted[pa], ib = r->sorted[pb];
  const mp_candidate *a = &r->cands[ia], *b = &r->cands[ib];
  int c = cmp_i(mp_candidate_simplicity(a), mp_candidate_simplicity(b));
  if (!c) c = cmp_i(a->res.peak_mem_bytes, b->res.peak_mem_bytes);
  if (!c) c = cmp_d(r->cost[ia], r->cost[ib]);
  return c ? c : cmp_i(ia, ib);
}

/* A binary min-heap of positions under by_simplicity. */
static void heap_push(const rank_ctx *r, int64_t *h, int64_t *n, int64_t v) {
  int64_t i = (*n)++;
  h[i] = v;
  while (i > 0 && by_simplicity(r, h[i], h[(i - 1) / 2]) < 0) {
    int64_t p = (i - 1) / 2, t = h[p];
    h[p] = h[i];
    h[i] = t;
    i = p;
  }
}

static int64_t heap_pop(const rank_ctx *r, int64_t *h, int64_t *n) {
  int64_t top = h[0];
  h[0] = h[--(*n)];
  for (int64_t i = 0;;) {
    int64_t l = 2 * i + 1, m = i;
    if (l < *n && by_simplicity(r, h[l], h[m]) < 0) m = l;
    if (l + 1 < *n && by_simplicity(r, h[l + 1], h[m]) < 0) m = l + 1;
    if (m == i) break;
    int64_t t = h[m];
    h[m] = h[i];
    h[i] = t;
    i = m;
  }
  return top;
}

/* Rank k: the simplest unranked plan whose cost is within MP_RANK_TIE_TOL of the cheapest
 * unranked one. The window of plans within the tolerance only moves forward in cost order
 * (the cheapest unranked cost never falls), so each plan enters the heap once: O(n log n). */
static mp_status rank_with_ties(mp_ctx *ctx, const rank_ctx *r, int64_t n, int64_t *out) {
  int64_t *heap = malloc((size_t)(n > 0 ? n : 1) * sizeof *heap);
  unsigned char *taken = calloc((size_t)(n > 0 ? n : 1), 1);
  if (!heap || !taken) {
    free(heap);
    free(taken);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory ranking %lld plans", (long long)n);
  }
  int64_t nh = 0, lo = 0, hi = 0;
  for (int64_t k = 0; k < n; k++) {
    while (taken[lo]) lo++; /* the cheapest unranked plan; k < n leaves one */
    const double limit = r->cost[r->sorted[lo]] * (1.0 + MP_RANK_TIE_TOL);
    while (hi < n && (hi <= lo || r->cost[r->sorted[hi]] <= limit)) heap_push(r, heap, &nh, hi++);
    const int64_t p = heap_pop(r, heap, &nh);
    taken[p] = 1;
    out[k] = r->sorted[p];
  }
  free(heap);
  free(taken);
  return MP_OK;
}

mp_status mp_search_rank(mp_ctx *ctx, const mp_search *s, mp_objective obj,
                         double price_per_gpu_hour, int64_t **order, int64_t *n_order) {
  *order = NULL;
  *n_order = 0;
  if (mp_objective_needs_price(obj) && !(price_per_gpu_hour > 0))
    return mp_error(ctx, MP_ERR_USAGE,
                    "--objective %s needs a price: pass --price USD_PER_GPU_HOUR "
                    "or use a cluster with price_per_gpu_hour", mp_objective_name(obj));
  int64_t n = 0;
  for (int64_t i = 0; i < s->n; i++)
    if (s->cands[i].evaluated && s->cands[i].reject == MP_REJECT_NONE) n++;
  int64_t *idx = mp_arena_alloc(s->arena, (size_t)(n > 0 ? n : 1) * sizeof *idx);
  MP_CHECK_ALLOC(ctx, idx);
  n = 0;
  for (int64_t i = 0; i < s->n; i++)
    if (s->cands[i].evaluated && s->cands[i].reject == MP_REJECT_NONE) idx[n++] = i;
  double *cost = malloc((size_t)(s->n > 0 ? s->n : 1) * sizeof *cost);
  MP_CHECK_ALLOC(ctx, cost);
  for (int64_t k = 0; k < n; k++) cost[idx[k]] = rank_cost(&s->cands[idx[k]], obj, price_per_gpu_hour);
  rank_ctx rc = {s->cands, cost, idx};
  qsort_r(idx, (size_t)n, sizeof *idx, by_cost, &rc);
  mp_status st = MP_OK;
  if (obj != MP_OBJECTIVE_MEMORY) {
    /* ties within the tolerance: the simpler plan (search.h) */
    int64_t *ranked = mp_arena_alloc(s->arena, (size_t)(n > 0 ? n : 1) * sizeof *ranked);
    st = ranked ? rank_with_ties(ctx, &rc, n, ranked) : mp_error(ctx, MP_ERR_NOMEM, "out of memory ranking");
    idx = ranked;
  }
  free(cost);
  MP_CHECK(st);
  *order = idx;
  *n_order = n;
  return MP_OK;
}

