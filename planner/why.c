/* `plan --why`'s ordering of the matching candidates (see why.h). */
#define _GNU_SOURCE
#include "planner/why.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double kWhyGiB = 1024.0 * 1024.0 * 1024.0;

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
  n = (int)strlen(buf);
  if (c->pp_split && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, " pp_split=embedding,loss");
}

/* --why's rule walk of candidate c: every rule in the order the search applies them
 * (search.h): the mesh's, the options', the siblings', then the simulation's; those after the
 * deciding one are not reached. Then the verdict, the prediction and the rank. */
static void why_rules(FILE *out, const mp_search_config *cfg, const mp_candidate *c, int64_t rank,
                      int64_t n_order) {
  char reason[512];
  fprintf(out, "  rule (does it reject this candidate? no / YES / - not reached)\n");
  int reached = 1;
  for (int k = 0; k < mp_search_n_rule_order; k++) {
    const mp_reject r = mp_search_rule_order[k];
    const int failed = c->reject == r;
    fprintf(out, "  %-4s %s\n", failed ? "YES" : reached ? "no" : "-", mp_reject_words(r));
    if (failed) reached = 0;
  }
  if (c->reject != MP_REJECT_NONE) {
    mp_candidate_reason(cfg, c, reason, sizeof reason);
    fprintf(out, "verdict: rejected (%s): %s\n", mp_reject_name((mp_reject)c->reject), reason);
  }
  if (c->evaluated && c->reject != MP_REJECT_EVAL_ERROR)
    fprintf(out, "prediction: step %.4f s, %.0f tokens/s/GPU, MFU %.1f %%, peak %.2f GiB of %.2f GiB\n",
            c->res.step_time_s, c->res.tokens_per_s_per_gpu, 100.0 * c->res.mfu,
            (double)c->res.peak_mem_bytes / kWhyGiB, (double)c->res.capacity_bytes / kWhyGiB);
  else if (!c->evaluated)
    fprintf(out, "prediction: none (not simulated: a rule or a sibling decided it)\n");
  if (rank > 0) fprintf(out, "rank: %lld of %lld\n", (long long)rank, (long long)n_order);
}

/* The most other matches --why lists one per line; the rest are counted by rule. */
#define WHY_MAX_OTHERS 40

/* --why's other matches, best first, one line each: options, verdict, rank or rule. */
static void why_others(FILE *out, const mp_search *s, const mp_search_config *cfg, const int64_t *order,
                       int64_t n_order, const int64_t *idx, int64_t n) {
  if (n <= 1) return;
  fprintf(out, "the other %lld matching candidates, best first:\n", (long long)(n - 1));
  int64_t by[MP_REJECT_COUNT] = {0};
  for (int64_t j = 1; j < n; j++) {
    const mp_candidate *c = &s->cands[idx[j]];
    if (j > WHY_MAX_OTHERS) {
      by[c->reject]++;
      continue;
    }
    char opts[192], reason[512];
    mp_candidate_options_str(c, opts, sizeof opts);
    const int64_t rank = mp_search_rank_of(order, n_order, idx[j]);
    if (rank > 0) {
      fprintf(out, "  %-44s ranked %lld (step %.4f s, peak %.2f GiB)\n", opts, (long long)rank,
              c->res.step_time_s, (double)c->res.peak_mem_bytes / kWhyGiB);
      continue;
    }
    mp_candidate_reason(cfg, c, reason, sizeof reason);
    fprintf(out, "  %-44s rejected (%s): %s\n", opts, mp_reject_name((mp_reject)c->reject), reason);
  }
  if (n - 1 > WHY_MAX_OTHERS) {
    fprintf(out, "  ... and %lld more:", (long long)(n - 1 - WHY_MAX_OTHERS));
    for (int r = 0; r < MP_REJECT_COUNT; r++)
      if (by[r])
        fprintf(out, " %lld %s", (long long)by[r], r == MP_REJECT_NONE ? "ranked" : mp_reject_name((mp_reject)r));
    fprintf(out, "\n");
  }
}

mp_status mp_why_print(mp_ctx *ctx, FILE *out, const mp_search *s, const mp_search_config *cfg, const int64_t *order,
                       int64_t n_order, const char *spec) {
  mp_search_fix f;
  mp_search_fix_init(&f);
  MP_CHECK(mp_search_fix_parse(ctx, spec, &f));
  int64_t *idx = NULL, n = 0;
  MP_CHECK(mp_search_matches(ctx, s, &f, order, n_order, &idx, &n));
  if (n == 0)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--why %s: no candidate of this search matches (a dim the GPUs do not factor into, "
                    "or one --fix excluded); the mesh dims multiply to %d", spec, mp_cluster_n_gpus(cfg->cluster));
  const mp_candidate *c = &s->cands[idx[0]];
  const int64_t rank = mp_search_rank_of(order, n_order, idx[0]);
  char mesh[128], ac[32];
  mp_candidate_mesh_str(c, mesh, sizeof mesh);
  mp_candidate_ac_str(c, ac, sizeof ac);
  fprintf(out, "\nwhy %s: %lld candidate%s match; the best %s, candidate %lld of %lld: %s, ac=%s, fp8=%s, "
          "micro-batch %lld, global batch %lld, reshard=%s%s\n",
          spec, (long long)n, n == 1 ? "" : "s", rank > 0 ? "ranked" : "(none is ranked: the one the search took "
          "furthest)", (long long)idx[0] + 1, (long long)s->n, mesh, ac, c->fp8 ? "on" : "off",
          (long long)c->micro_batch, (long long)c->global_batch, c->reshard ? "on" : "off", c->sp ? ", sp" : "");
  why_rules(out, cfg, c, rank, n_order);
  why_others(out, s, cfg, order, n_order, idx, n);
  return MP_OK;
}
