/* `plan --why`'s ordering of the matching candidates (see why.h). */
#define _GNU_SOURCE
#include "planner/why.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t mp_search_rank_of(const int64_t *order, int64_t n_order, int64_t i) {
  for (int64_t r = 0; r < n_order; r++)
    if (order[r] == i) return r + 1;
  return 0;
}

/* How far the search took a rejected candidate: the position of its rule in
 * mp_search_rule_order (later is further), -1 for a rule outside it. */
static int rule_reach(int reject) {
  for (int k = 0; k < mp_search_n_rule_order; k++)
    if ((int)mp_search_rule_order[k] == reject) return k;
  return -1;
}

typedef struct match_key {
  int64_t index, rank; /* rank 0: not ranked */
  int reach;
  int64_t peak;        /* simulated: its peak; else INT64_MAX */
} match_key;

static int by_best(const void *pa, const void *pb) {
  const match_key *a = pa, *b = pb;
  if ((a->rank > 0) != (b->rank > 0)) return a->rank > 0 ? -1 : 1;
  if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
  if (a->reach != b->reach) return a->reach > b->reach ? -1 : 1;
  if (a->peak != b->peak) return a->peak < b->peak ? -1 : 1;
  return a->index < b->index ? -1 : a->index > b->index;
}

mp_status mp_search_matches(mp_ctx *ctx, const mp_search *s, const mp_search_fix *fix, const int64_t *order,
                            int64_t n_order, int64_t **out, int64_t *n) {
  *out = NULL;
  *n = 0;
  int64_t m = 0;
  for (int64_t i = 0; i < s->n; i++) m += mp_search_fix_matches(fix, &s->cands[i]);
  match_key *keys = malloc((size_t)(m > 0 ? m : 1) * sizeof *keys);
  int64_t *rank = calloc((size_t)(s->n > 0 ? s->n : 1), sizeof *rank);
  int64_t *idx = mp_arena_alloc(s->arena, (size_t)(m > 0 ? m : 1) * sizeof *idx);
  if (!keys || !rank || !idx) {
    free(keys);
    free(rank);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory matching %lld candidates", (long long)m);
  }
  for (int64_t r = 0; r < n_order; r++) rank[order[r]] = r + 1;
  int64_t k = 0;
  for (int64_t i = 0; i < s->n; i++) {
    const mp_candidate *c = &s->cands[i];
    if (!mp_search_fix_matches(fix, c)) continue;
    const int simulated = c->evaluated && c->reject != MP_REJECT_EVAL_ERROR;
    keys[k++] = (match_key){i, rank[i], rule_reach(c->reject), simulated ? c->res.peak_mem_bytes : INT64_MAX};
  }
  qsort(keys, (size_t)m, sizeof *keys, by_best);
  for (int64_t j = 0; j < m; j++) idx[j] = keys[j].index;
  free(keys);
  free(rank);
  *out = idx;
  *n = m;
  return MP_OK;
}

void mp_candidate_options_str(const mp_candidate *c, char *buf, size_t cap) {
  char mesh[128], ac[32];
  mp_candidate_mesh_str(c, mesh, sizeof mesh);
  mp_candidate_ac_str(c, ac, sizeof ac);
  int n = snprintf(buf, cap, "%s ac=%s mb=%lld", mesh, ac, (long long)c->micro_batch);
  if (n < 0 || (size_t)n >= cap) return;
  snprintf(buf + n, cap - (size_t)n, "%s%s%s", c->reshard ? " reshard=1" : "", c->fp8 ? " fp8=1" : "",
           c->sp ? " sp=1" : "");
  n = (int)strlen(buf);
  if (c->pp_virtual > 1 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, " v=%d", c->pp_virtual);
}
