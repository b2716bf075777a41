/* A planner search described apart from its cluster, so that one question can be asked of
 * several clusters: `plan` runs it on the cluster it was given, its no-plan advice on more
 * GPUs or another GPU, `--gpus A..B` on each size of a sweep.
 *
 * The setup holds what `plan` reads from its options (the model, the sequence, the batch or
 * the default batch rule, the headroom, the stack, PyTorch's ring rotation and AsyncTP,
 * the search's constraints and switches, the objective and its price); for a cluster it
 * gives the batch (the default rule is per cluster size: planner/batch.h), the simulator
 * as the evaluator, and the search config, the same three `plan` uses, so that a probe on
 * the user's own cluster would find the user's own search. */
#ifndef MP_PLANNER_PROBE_H
#define MP_PLANNER_PROBE_H

#include "planner/evaluate.h"
#include "planner/planner.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_plan_setup {
  const mp_model *model;
  int64_t seq;
  int64_t global_batch;    /* > 0: every cluster runs it; 0: the default batch rule per cluster */
  double headroom;         /* fraction of GPU memory kept free */
  const char *stack;       /* NULL: the GPU's default (mp_stack_default) */
  int cp_rotate_given;     /* --cp-rotate: cp_rotate on the stacks that run PyTorch's ring */
  mp_cp_rotate cp_rotate;
  mp_cp_comm cp_comm;      /* --cp-comm-type: cp_comm on the megatron stacks (default p2p) */
  int async_tp;            /* 1 (--async-tp): AsyncTP on the stacks that run it; -1
                              (--no-async-tp): off on every stack; 0: each stack's default */
  mp_moe_routing moe_routing; /* --moe-imbalance, --moe-capacity-factor: every candidate's */
  mp_moe_dispatcher moe_dispatcher; /* --moe-dispatcher: every candidate's, on megatron stacks */
  int loss_chunks;         /* --loss-chunks: every candidate's, on torchtitan stacks (0: off) */
  mp_search_fix fix;       /* --fix, --mesh, --ep, --ac, --micro-batch, --sp, --no-sp, --fp8 */
  int fp8_auto;            /* --fp8 auto: float8 searched beside bf16 where the cluster's GPU
                              has it */
  mp_fp8_recipe fp8_recipe; /* --fp8 RECIPE; MP_FP8_DEFAULT: the stack's own */
  int allow_cross_node_tp, executable_only, n_threads;
  int gpus_per_node;       /* > 0: every cluster of the setup's GPU has this many per node;
                              0: min(8, N) (plan --gpus N's default) */
  mp_objective objective;
  double price_per_gpu_hour;
} mp_plan_setup;

/* The global batch of setup on cluster c: the setup's own, or the default rule's target for
 * c's size (*target_seqs, 0 with an explicit batch) and the rule in words into rule. */
void mp_plan_setup_batch(const mp_plan_setup *s, const mp_cluster *c, int64_t *global_batch, int64_t *target_seqs,
                         char *rule, size_t cap);
/* The evaluator of setup on c (mp_sim_evaluator_init at mp_plan_setup_batch's batch, with
 * the setup's ring rotation and AsyncTP where its stack runs them). ev must stay put and be
 * freed with mp_sim_evaluator_free; c must outlive it. */
mp_status mp_plan_setup_evaluator(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, mp_sim_evaluator *ev);
/* The search of setup on c with ev (from mp_plan_setup_evaluator) as its evaluator:
 * mp_sim_search_config with the setup's constraints and switches; dominated AC policies
 * pruned unless the objective is memory. */
/* A named float8 recipe (s->fp8_recipe) into ev's base options, checked once against ev's
 * stack (mp_rule_fp8_recipe_check) and c's GPU (mp_sim_fp8_recipe_check) rather than
 * refused candidate by candidate; nothing for MP_FP8_DEFAULT. */
mp_status mp_plan_setup_fp8_recipe(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, mp_sim_evaluator *ev);
/* The setup's MoE routing (--moe-imbalance, --moe-capacity-factor) into ev's base options,
 * every candidate's (the planner caps the imbalance at what a candidate's ep ranks can hold:
 * exec/rules.h, mp_rule_moe_imbalance_max); MP_ERR_USAGE on a dense model or under
 * meshplan's runtime stacks, which route the real tokens. */
mp_status mp_plan_setup_moe_routing(mp_ctx *ctx, const mp_plan_setup *s, mp_sim_evaluator *ev);
/* Both of the above: the setup's plan options into ev's base. */
mp_status mp_plan_setup_options(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, mp_sim_evaluator *ev);
void mp_plan_setup_search(const mp_plan_setup *s, const mp_cluster *c, mp_sim_evaluator *ev,
                          mp_search_config *cfg);

/* What a probe found. */
typedef struct mp_probe_result {
  int64_t n_candidates, n_ranked;
  int64_t global_batch;  /* the step the setup ran on the cluster (the rule's target) */
  mp_candidate best;     /* the best ranked plan (n_ranked > 0) */
} mp_probe_result;
/* The search of setup on c, run to the end without a store or a progress bar, ranked by the
 * setup's objective. A cluster the setup cannot be searched on (a stack the GPU cannot run,
 * a model that does not fit its limits) is an error with its message. */
mp_status mp_plan_probe(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, mp_probe_result *out);

/* The cluster of c's GPU and links at n GPUs (1..MP_LIM_GPUS), named "<n>x<gpu>":
 * gpus_per_node per node (0: 8, `plan --gpus N`'s default), all n in one node when n is
 * fewer. MP_ERR_INVALID when n is not a whole number of nodes. For the more-GPUs advice and
 * the sweep. */
mp_status mp_cluster_resize(mp_ctx *ctx, const mp_cluster *c, int64_t n, int gpus_per_node, mp_cluster *out);
/* c with another GPU: its profile, and its NVLink inside a node (as mp_cluster_make sets a
 * cluster's); the inter-node links stay c's. */
void mp_cluster_with_gpu(const mp_cluster *c, const mp_gpu *g, mp_cluster *out);

#ifdef __cplusplus
}
#endif
#endif
