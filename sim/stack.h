/* Stack profiles: how close a software stack (eager PyTorch, torch.compile, llm.c,
 * meshplan's own runtime) gets to a GPU's peaks. The figures are the simulator's only
 * per-stack knobs; each profile is a JSON file under data/stacks/ (embedded in the
 * binary) carrying its numbers and the source/reasoning behind them.
 *
 * JSON keys (all required except where noted): name, gemm_eff_max, gemm_eff_half_mnk,
 * fp8_gemm_eff_max, attention_eff, hbm_eff, link_eff, kernel_overhead_us,
 * comm_overhead_us, frag_factor, source. Efficiencies lie in (0, 1]; frag_factor in
 * [1, 16]; overheads in [0, 1e6] us; gemm_eff_half_mnk in [0, 1e18] (common/limits.h).
 * Optional: saved_act_factor, memory_model ("torchtitan", "meshplan-cpu", "meshplan-cuda" or
 * "megatron"), attention, loss, sequence_parallel, ac_policies (sim.h's mp_stack_profile
 * says what each means). */
#ifndef MP_SIM_STACK_H
#define MP_SIM_STACK_H

#include "common/status.h"
#include "exec/cluster.h"
#include "sim/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The plan options the stack's runtime implies: its memory model, its attention and loss
 * kernels, SP off where it does not run it, and the dtypes it keeps: meshplan-cpu keeps
 * and gathers every tensor in fp32 (fp32 gathered parameters and master weights),
 * meshplan-cuda keeps fp32 masters and gathers bf16. Other options are left as they
 * are. */
void mp_stack_plan_options(const mp_stack_profile *p, mp_plan_options *o);

/* By name (data/stacks stem, e.g. "torchtitan-eager") or path to a JSON file. */
mp_status mp_stack_load(mp_ctx *ctx, const char *name_or_path, mp_stack_profile *out);
/* Parses a profile from JSON text; origin names it in messages. */
mp_status mp_stack_from_text(mp_ctx *ctx, const char *text, const char *origin,
                             mp_stack_profile *out);
/* The profile used when none is given: meshplan's own runtime on that GPU
 * ("meshplan-cuda", or "meshplan-cpu" for the CPU profile, compute_capability 0). */
mp_status mp_stack_default(mp_ctx *ctx, const mp_gpu *gpu, mp_stack_profile *out);

#ifdef __cplusplus
}
#endif
#endif
