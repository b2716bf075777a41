/* `plan --why`: the candidates of a search that match a spec, best first, and each one's
 * fate in words.
 *
 * Best first: the ranked ones by rank; then the rejected ones by how far the search took
 * them (the rule that rejected them latest in mp_search_rule_order first: a plan over
 * memory after its simulation got further than one a mesh rule stopped), among those the
 * simulated ones by lower peak memory (the nearest to fitting), then enumeration order.
 * So the first match is the candidate the spec names at its best, not the first one
 * enumerated. */
#ifndef MP_PLANNER_WHY_H
#define MP_PLANNER_WHY_H

#include <stdio.h>

#include "planner/search.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The indices of s's candidates matching fix (mp_search_find's test), best first, into an
 * array from s->arena (*out, *n; *n 0 when none matches). order[0..n_order) is the ranking
 * (mp_search_rank). */
mp_status mp_search_matches(mp_ctx *ctx, const mp_search *s, const mp_search_fix *fix, const int64_t *order,
                            int64_t n_order, int64_t **out, int64_t *n);
/* Candidate i's rank (1-based) in order[0..n_order), 0 when it is not ranked. */
int64_t mp_search_rank_of(const int64_t *order, int64_t n_order, int64_t i);
/* A candidate's options in a few words, as --fix names them: "dp_shard=64 ac=full mb=1
 * reshard=1 fp8=1 sp=1 v=2" (mesh dims of 1, reshard and fp8 off and pp_virtual 1 left out). */
void mp_candidate_options_str(const mp_candidate *c, char *buf, size_t cap);

/* --why SPEC's answer into out: the best matching candidate (above) with every rule it
 * passed or failed in the search's order (mp_search_rule_order), its verdict and reason
 * (cfg's), its prediction and rank; then the other matches, best first, one line each
 * (options, rank or rule and reason; past 40 of them, counted by rule). A spec that does not
 * parse (mp_search_fix_parse) or matches nothing is MP_ERR_USAGE. */
mp_status mp_why_print(mp_ctx *ctx, FILE *out, const mp_search *s, const mp_search_config *cfg, const int64_t *order,
                       int64_t n_order, const char *spec);

#ifdef __cplusplus
}
#endif
#endif
