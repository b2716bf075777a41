/* When no plan fits: the changes that would make one fit, each found by searching it, and
 * the constraints that are usage mistakes before any search.
 *
 * A hint is only given once a search under it ranked a plan (mp_plan_probe), so every hint
 * is true for the case. The changes are tried smallest first: a constraint of the user's
 * relaxed (the micro-batch searched, full AC for a policy that saves less, a global batch
 * that the data-parallel sizes divide, the fixed mesh and options dropped), then more GPUs
 * of the same kind (how many: doubled until a search fits, then narrowed to whole nodes
 * between the last that did not and the first that did), then a GPU with more memory at the
 * same count. A change is tried only where it can help: full AC where the search did not
 * already try it, the batch where the user gave one and the batch rule rejected candidates,
 * another GPU where memory rejected them. */
#ifndef MP_PLANNER_ADVISE_H
#define MP_PLANNER_ADVISE_H

#include "planner/probe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most hints mp_advise gives (one per kind). */
#define MP_ADVICE_MAX 6
/* The most searches the more-GPUs hint runs: doublings and then halvings of the interval. */
#define MP_ADVICE_MAX_GPU_PROBES 16

typedef enum mp_advice_kind {
  MP_ADVICE_MICRO_BATCH = 0, /* --micro-batch given: the one the search picks */
  MP_ADVICE_FULL_AC,         /* an AC policy given: full AC */
  MP_ADVICE_BATCH,           /* --global-batch given: the nearest one that divides */
  MP_ADVICE_UNCONSTRAINED,   /* the fixed mesh dims and options dropped */
  MP_ADVICE_MORE_GPUS,       /* more GPUs of the same kind */
  MP_ADVICE_BIGGER_GPU       /* a GPU with more memory, as many */
} mp_advice_kind;

typedef struct mp_advice {
  mp_advice_kind kind;
  char change[128];       /* the options that make it: "--gpus 32", "--ac full", ... */
  char words[256];        /* what was searched: "32 x h100-sxm: 41 plans fit; 24 GPUs: none" */
  mp_cluster cluster;     /* the cluster searched */
  mp_probe_result probe;  /* the search under the change: its best plan */
} mp_advice;

/* The usage mistakes among the setup's constraints on cluster c, MP_ERR_USAGE naming the
 * rule: ep on a dense model, ep not dividing the experts, fixed mesh dims whose product does
 * not divide the GPUs, a micro-batch larger than the given global batch. */
mp_status mp_plan_setup_check(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c);

/* Whether the setup fits on n GPUs: a search of it (the caller's probe). */
typedef mp_status (*mp_gpu_count_fits_fn)(void *user, mp_ctx *ctx, int64_t n_gpus, int *fits);
/* The fewest GPUs above n0 that fit among those searched: n0 doubled until a search fits
 * (up to max_gpus), then, from a node up, the interval between the last count that did not
 * fit and the first that did halved in whole nodes of `node` GPUs until they are a node
 * apart; at most max_probes searches. *fit the count found (0: none up to max_gpus), *no_fit
 * the largest count searched below it that did not fit (n0 when none was). */
mp_status mp_advise_gpu_count(mp_ctx *ctx, int64_t n0, int64_t node, int64_t max_gpus, int max_probes,
                              mp_gpu_count_fits_fn fits, void *user, int64_t *fit, int64_t *no_fit);

/* The changes that make setup fit on c where the search `failed` (of setup on c) ranked no
 * plan, smallest first, each verified by a search: into out[0..*n), *n <= MP_ADVICE_MAX (0:
 * none of those tried fits). A change whose search fails (a GPU the stack cannot run) is
 * skipped; out of memory is an error. */
mp_status mp_advise(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, const mp_search *failed,
                    mp_advice *out, int *n);

#ifdef __cplusplus
}
#endif
#endif
