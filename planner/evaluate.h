/* The simulator as the planner's evaluator: a candidate becomes plan options
 * (exec/plan.h) and is costed by mp_simulate_plan (sim/sim.h). Also draws the chosen
 * plan's simulated timeline as a Chrome trace for the plots.
 *
 * Thread safety: the search's workers share one evaluator and only read it (its plan
 * template included, read-only after init). What a worker writes is its own: its state
 * (mp_sim_evaluator_thread_init: its plan cache and its simulator workspace, sim/sim.h)
 * and its scratch arena, where it builds each candidate's plan and schedules.
 *
 * Speed: the candidates of one mesh differ in float8, reshard_after_forward, AC and
 * micro-batch; only float8 (and the mesh) changes a plan's parameters and units (FSDP's units
 * are laid out whatever the resharding, exec/pass_fsdp.c, and the simulator's prep reads no
 * resharding). Each worker therefore keeps the plans of the mesh it is on, one per (float8,
 * vocab padding, float8 all-gather, SP, pipeline chunks), with their simulator preps
 * (mp_sim_plan_prep_create), and derives each candidate's plan from one (mp_plan_derive):
 * the same plan and schedules mp_build_plan_from would give, without the passes. The key
 * is complete: mp_plan_derive changes only micro-batch, AC, resharding and the global
 * batch and refuses any other difference, so a prediction does not depend on which
 * candidate built the cached plan (tests/planner/evaluate_test.cc). The cache is dropped
 * when the mesh changes and freed with the worker's state. */
#ifndef MP_PLANNER_EVALUATE_H
#define MP_PLANNER_EVALUATE_H

#include "exec/plan.h"
#include "planner/search.h"
#include "planner/store.h"
#include "sim/sim.h"
#include "sim/stack.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_sim_evaluator {
  const mp_model *model;
  mp_plan_options base; /* seq, global batch and defaults; per-candidate fields overwritten */
  mp_stack_profile stack;
  mp_sim_config sim;    /* sim.stack points at stack */
  mp_plan_template *tmpl; /* the model's module tree, built once by init, read-only after:
                             the workers build their plans from it (mp_build_plan_from) */
} mp_sim_evaluator;

/* stack_name NULL: the default profile for the cluster's GPU. headroom: fraction of GPU
 * memory kept free (0 .. 0.5). The evaluator must not move after init (sim.stack points
 * into it). */
mp_status mp_sim_evaluator_init(mp_ctx *ctx, mp_sim_evaluator *ev, const mp_model *m,
                                const mp_cluster *c, int64_t seq, int64_t global_batch,
                                double headroom, const char *stack_name);
/* Frees what init allocated (the template); the evaluator may be zeroed or never
 * initialised. */
void mp_sim_evaluator_free(mp_sim_evaluator *ev);
/* The search of ev's model on cluster c at ev's seq and global batch, with ev as the
 * evaluator (mp_sim_evaluate, one mp_sim_eval_worker per worker), a capacity of the GPU's
 * memory less the fraction headroom, and what ev's stack runs: its AC policies, SP with
 * tp > 1 where it runs it, interleaved pipelines of 2 and 4 chunks outside the meshplan
 * runtime; dominated AC policies pruned (the time objective; a caller ranking by memory
 * clears prune_dominated): what meshplan plan, train and plan_bench search. The rest of
 * *cfg is mp_search_config_init's; the caller adds its constraints. */
void mp_sim_search_config(mp_search_config *cfg, mp_sim_evaluator *ev, const mp_cluster *c, double headroom);
/* The settings ev predicts every candidate under that the store keeps beside the candidate
 * (planner/store.h, version 11): the stack's name and the NCCL version (ev->stack), the
 * chunked loss's count, the experts' load and the float8 recipe (ev->base, the stack's
 * default resolved), the model's MTP modules (ev->model). out->stack points into ev; out->fp8_recipe is a static name. */
void mp_sim_evaluator_settings(const mp_sim_evaluator *ev, mp_plan_settings *out);
/* The plan options of a candidate: micro-batch, AC, float8 (float8 all-gather only
 * without TP), reshard_after_forward, vocab padded when tp does not divide it, SP, the
 * pipeline schedule (interleaved with its chunks, else 1F1B). */
void mp_sim_evaluator_options(const mp_sim_evaluator *ev, const mp_candidate *c,
                              mp_plan_options *out);
/* One search worker's state (opaque): the evaluator it serves, the plan cache of the mesh
 * it is on (above) and its simulator workspace. Used by one thread at a time. */
typedef struct mp_sim_eval_worker mp_sim_eval_worker;
/* For mp_search_config.eval_thread_init: user is the mp_sim_evaluator (which must outlive
 * the worker); *worker receives a new mp_sim_eval_worker. MP_ERR_NOMEM when out of memory. */
mp_status mp_sim_evaluator_thread_init(void *user, mp_ctx *ctx, void **worker);
/* For mp_search_config.eval_thread_done: frees the mp_sim_eval_worker (NULL: a no-op). */
void mp_sim_evaluator_thread_done(void *worker);
/* mp_search_eval_fn: user is the calling worker's mp_sim_eval_worker. */
mp_status mp_sim_evaluate(void *user, mp_ctx *ctx, mp_arena *scratch, const mp_candidate *c,
                          mp_sim_result *out);
/* Whether the runtime executes the candidate's plan: the runtime's own check
 * (exec/runtime/check.h, mp_runtime_plan_check) on the plan built for it. *runs 1, or 0
 * with the check's one-line reason in why. A plan that cannot be built is an error. */
mp_status mp_sim_evaluator_runs(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                                int *runs, char *why, size_t cap);
/* Simulates rank 0 of the candidate with record_trace and writes the Chrome trace to path. */
mp_status mp_sim_evaluator_trace(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                                 const char *path);
/* Simulates rank 0 of the candidate with record_trace; fills *busy with its busy time by
 * kernel class and collective group (mp_sim_trace_busy) and *res with its result (the
 * same as the search's for that candidate). For `meshplan train --profile`. */
mp_status mp_sim_evaluator_busy(mp_ctx *ctx, const mp_sim_evaluator *ev, const mp_candidate *c,
                                mp_sim_busy *busy, mp_sim_result *res);

#ifdef __cplusplus
}
#endif
#endif
