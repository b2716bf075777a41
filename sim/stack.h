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
 * "megatron"), attention, loss, sequence_parallel, ac_policies, fit_gpu, gemm_fit, pp_microbatches, pp_order,
 * attention_by_span, cp_rotate, dp_overlap, async_tp (torchtitan), distributed_optimizer, tp_comm_overlap and
 * deepep_sms and hybridep_sms (megatron), grouped_gemm_tile_m, grouped_gemm_tile_k and grouped_gemm_streams (sim.h's
 * mp_stack_profile says what each means).
 *
 * Kernel efficiencies across GPUs. A stack's GEMM, float8 GEMM and attention efficiencies
 * are fitted on one GPU (fit_gpu) as fractions of that GPU's peak. The same kernels reach
 * different fractions of peak on different GPUs (cuBLAS sustains 82.4 % of the A100's bf16
 * peak on random data and 68.5 % of the 700 W H100 SXM's, whose power cap takes more of its
 * clock; FlashAttention-2: 50-73 % of the A100's, about 35 % of the H100's), so each GPU
 * profile states the fractions the reference kernels reach on it
 * (exec/cluster.h, mp_kernel_eff, with sources) and a stack evaluated on GPU g runs at
 *
 *   eff_on_g = min(1, eff_fitted x kernel_eff(g) / kernel_eff(fit_gpu))
 *
 * per kernel class: GEMMs (and the batched GEMMs of materialized attention) by the bf16
 * GEMM ratio, float8 GEMMs by the fp8 ratio, flash attention by the flash ratio. The
 * stack's own share (framework overhead, fusion, the overlap with communication) carries
 * across unchanged. A class is left as stated where either GPU states no figure for it.
 * Where that share is measured not to carry, a profile states the GEMM efficiency it was
 * fitted to on another GPU's rows (gemm_fit: gpu, gemm_eff_max), and on that GPU the GEMM
 * multiplier is gemm_fit's over gemm_eff_max instead of the ratio. */
#ifndef MP_SIM_STACK_H
#define MP_SIM_STACK_H

#include "common/status.h"
#include "sim/cluster.h"
#include "sim/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The plan options the stack's runtime implies: its memory model, its attention and loss
 * kernels, SP off where it does not run it, and the dtypes it keeps: meshplan-cpu keeps
 * and gathers every tensor in fp32 (fp32 gathered parameters and master weights),
 * meshplan-cuda keeps fp32 masters and gathers bf16. Other options are left as they
 * are. The GPU the plan runs on (the cluster's) gives the float8 options its compute
 * capability: every caller names it, so no schedule prices another GPU's float8 layouts. */
void mp_stack_plan_options(const mp_stack_profile *p, const mp_gpu *g, mp_plan_options *o);

/* The multipliers mp_stack_kernel_scale gives for a stack on a GPU. */
typedef struct mp_stack_kernel_scale {
  double gemm;  /* on gemm_eff_max (bf16/fp16 GEMMs, materialized attention's GEMMs, and
                   float8 GEMMs on a GPU without fp8 units, which run as bf16) */
  double fp8_gemm; /* on fp8_gemm_eff_max */
  double flash;    /* on attention_eff */
  int scaled;      /* the stack names a fit GPU other than g (multipliers may still be 1) */
} mp_stack_kernel_scale;

/* The kernel-efficiency ratios of stack p evaluated on GPU g (the rule above): each 1 when
 * p names no fit GPU, when g is that GPU, or when either states no figure for the class. */
void mp_stack_kernel_scale_of(const mp_stack_profile *p, const mp_gpu *g, mp_stack_kernel_scale *out);
/* One line for a user: "torchtitan-eager fitted on h100-96gb-500w; on a100-80gb-sxm GEMM
 * x1.440 (fitted there), flash attention x1.771, fp8 GEMM as bf16 (a100-80gb-sxm has no fp8
 * units)", or
 * "meshplan-cuda: efficiencies as stated on every GPU (no fit GPU)"; where g states
 * attention_exp, "; attention's softmax exponentials 141.6 FLOPs of tensor-core time each
 * (MUFU.EX2 16 a clock an SM)" after it (sim/cluster.h, mp_gpu_attn_exp_flops). */
void mp_stack_kernel_scale_format(const mp_stack_profile *p, const mp_gpu *g, char *buf, size_t cap);

/* Stack p's attention efficiency on its fit GPU, a fraction of the bf16 peak in meshplan's
 * FLOP count (a backward op twice its forward's FLOPs), for one call over `span` keys,
 * forward (bwd 0) or backward (1): from attention_by_span where the profile states it and
 * span > 0 (sim.h, mp_stack_profile.attn_span), else attention_eff. */
double mp_stack_attention_eff(const mp_stack_profile *p, double span, int bwd);

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
