/* Whether the runtime executes a plan, decided from the plan alone (no comm, no device,
 * no allocation): the planner asks it to mark plans "runs" and to restrict train --auto,
 * and mp_runtime_create asks it before building anything. The world-size check against a
 * launched job is the runtime's own (runtime.c), since it needs the job. */
#ifndef MP_EXEC_RUNTIME_CHECK_H
#define MP_EXEC_RUNTIME_CHECK_H

#include "common/status.h"
#include "exec/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MP_OK when the runtime executes plan p; otherwise MP_ERR_UNSUPPORTED (a feature the
 * runtime does not implement) or MP_ERR_INVALID/MP_ERR_INTERNAL (a plan that no runtime
 * could execute) with one line on ctx naming the feature or rule and what to do. */
mp_status mp_runtime_plan_check(mp_ctx *ctx, const mp_plan *p);
/* The same rules read from what they depend on, without a plan: the model, the mesh, the
 * options (sequence parallelism, float8, the pipeline schedule, the batch) and the passes
 * applied (MP_PASS_* bits: FSDP where dp_shard > 1, Float8). The planner's search asks it
 * for each candidate before any plan is built. */
mp_status mp_runtime_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh, const mp_plan_options *o,
                           unsigned applied);

/* The model's part of those rules (its family, biases and norms, RoPE's head_dim, a
 * sliding window shorter than seq), for a caller that has a model and a sequence length
 * but no plan yet (train reading its options). mp_runtime_plan_check applies it. */
mp_status mp_runtime_model_check(mp_ctx *ctx, const mp_model *m, int64_t seq);

/* The experts' capacity factor cf (mp_runtime_options.moe_capacity_factor; 0: none) for a
 * run of model m under options o: a finite positive factor, on a model with routed
 * experts, on the CPU backend (o->mem_model: the CPU kernels place dropped pairs,
 * kernels/ops.h moe_plan; the CUDA ones do not). */
mp_status mp_runtime_capacity_check(mp_ctx *ctx, const mp_model *m, const mp_plan_options *o, double cf);

#ifdef __cplusplus
}
#endif
#endif
