/* Float8 in a plan: the recipes that scale a float8 GEMM's operands, the plan's float8
 * options, and the float8 weight copies Transformer Engine holds (exec/plan.h includes it;
 * the Float8 pass, exec/pass_float8.c, applies them). */
#ifndef MP_EXEC_PLAN_FP8_H
#define MP_EXEC_PLAN_FP8_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How a float8 GEMM's operands are scaled: the recipe (exec/pass_float8.c decides which
 * Linears it can run, exec/schedule_ops.c prices its casts):
 *   TENSORWISE  one scale per tensor from that tensor's own amax, taken as it is cast
 *               (torchao's dynamic recipe; Transformer Engine's Float8CurrentScaling, which
 *               Megatron-LM names --fp8-recipe tensorwise)
 *   DELAYED     one scale per tensor from the amax history of earlier iterations
 *               (Transformer Engine's DelayedScaling): no amax pass before a cast
 *   ROWWISE     a scale per row of each operand along its GEMM's reduction dim (torchao's
 *               rowwise recipe)
 *   MXFP8       a power-of-two scale per 32 consecutive elements along the reduction dim
 *               (OCP Microscaling; Blackwell's block-scaled tensor cores)
 *   BLOCKWISE   a scale per 1x128 tile of activations and gradients and per 128x128 tile of
 *               weights (DeepSeek-V3, arXiv 2412.19437 sec. 3.3.2; Transformer Engine's
 *               Float8BlockScaling)
 *   NVFP4       four-bit E2M1 operands (Transformer Engine's NVFP4BlockScaling, recipe.py
 *               v2.9; arXiv 2509.25149): an E4M3 scale per 1x16 block and an fp32 scale per
 *               tensor, weights in 16x16 blocks, a 16x16 random Hadamard transform on the
 *               weight-gradient GEMM's operands and stochastic rounding of gradients; every
 *               Linear GEMM (fprop, dgrad, wgrad) on Blackwell's FP4 tensor cores
 * DEFAULT is the runtime's own: DELAYED under the megatron memory model (Megatron-LM's
 * --fp8-recipe default), TENSORWISE otherwise; mp_plan_create resolves it. */
typedef enum mp_fp8_recipe {
  MP_FP8_DEFAULT = 0,
  MP_FP8_TENSORWISE,
  MP_FP8_DELAYED,
  MP_FP8_ROWWISE,
  MP_FP8_MXFP8,
  MP_FP8_BLOCKWISE,
  MP_FP8_NVFP4,
  MP_FP8_RECIPE_COUNT
} mp_fp8_recipe;

/* The GEMMs a torchtitan plan runs in float8 (mp_float8_options.scope). */
typedef enum { MP_FP8_SCOPE_LINEARS = 0, MP_FP8_SCOPE_EXPERTS, MP_FP8_SCOPE_ALL } mp_fp8_scope;

/* "linears", "experts" or "all" into *out; 0 for another name. */
int mp_fp8_scope_parse(const char *name, mp_fp8_scope *out);

typedef struct mp_float8_options {
  int all_gather; /* FSDP all-gathers float8 weights (only without TP, tensorwise) */
  mp_fp8_recipe recipe;
  int gpu_cc;     /* the GPU's compute capability (90 for sm_90; 0: none named, priced as
                     Hopper's), which decides whether Transformer Engine's per-tensor float8
                     keeps transposed copies (mp_fp8_gemm_any_layout). Set from the cluster's
                     GPU by mp_stack_plan_options; the simulator refuses a Transformer Engine
                     float8 plan whose GPU differs from the cluster's in that respect */
  int param_gather; /* Megatron-Core's --fp8-param-gather (megatron memory model): the float8
                       Linears' model weights kept as Transformer Engine float8 tensors
                       (fp8_model_init), 1 byte at rest and in the distributed optimizer's or
                       Megatron FSDP's parameter all-gather; the fp32 main weights stay. MXFP8
                       weights (the distributed optimizer) are gathered in bf16 through the
                       gradient buffer and quantized after the gather (exec/schedule_prep.c) */
  int nvfp4_no_rht; /* NVFP4 without the random Hadamard transform on the weight-gradient
                       GEMM's operands (Transformer Engine's NVTE_NVFP4_DISABLE_RHT=1,
                       recipe NVFP4BlockScaling.disable_rht): their column-wise copies quantized
                       with the row-wise ones in one kernel */
  int dpa;          /* Transformer Engine's float8 dot-product attention (Megatron-Core's
                       --fp8-dot-product-attention, TE's fp8_dpa / NVTE_FP8_DPA=1): the fused
                       attention core in cuDNN's FP8 kernels, q, k, v and the output gradient
                       cast to float8 per tensor with current scaling (sim/cluster.c,
                       mp_attn_fp8_flops; exec/schedule_block.c) */
  int amax_tp;      /* delayed scaling's amaxes all-reduced over the TP group only: Transformer
                       Engine v0.13 to v1.5 under NVTE_DP_AMAX_REDUCE_INTERVAL=0
                       (transformer_engine/pytorch/fp8.py global_amax_reduction, v1.5: "AMAX is
                       reduced only in TP domain"; v1.6rc1 does not read the variable), and
                       Megatron-Core from 2e429097 (2024-07-25: core_v0.8.0, 24.09-alpha.rc0)
                       until its revert 98abe378 (2024-09-06), whose parallel_state.py
                       get_amax_reduction_group returns the TP x CP group (TP at CP 1), and
                       from core_v0.9 under TransformerConfig.tp_only_amax_red */
  mp_fp8_scope scope; /* which GEMMs run float8 under torchtitan (torchao): the Linears
                         (quantize.linear.*), the routed experts' grouped GEMMs
                         (quantize.grouped_mm.* fqns ["experts"]: torchao's
                         prototype/moe_training _scaled_grouped_mm), or both; Megatron-Core
                         runs both always (TEGroupedMLP) */
} mp_float8_options;

/* Whether a GPU of compute capability cc runs float8 GEMMs on operands of any layout, not
 * only TN (both row-major along the reduction dim): Transformer Engine's
 * nvte_is_non_tn_fp8_gemm_supported (transformer_engine/common/transformer_engine.cpp,
 * v2.8), true for 10.x, 11.x and 13.x and later. Where it is, the per-tensor quantizers
 * (delayed and current scaling) write no transposed copy of a tensor used transposed
 * (transformer_engine/pytorch/csrc/quantizer.cpp, Float8Quantizer and
 * Float8CurrentScalingQuantizer: with_transpose = columnwise_usage && !that). */
int mp_fp8_gemm_any_layout(int cc);

/* The float8 copies Transformer Engine holds of one float8 Linear weight of rows x cols (its
 * [out, in] on the rank; a grouped expert's each) beyond the model weight itself, scales
 * included, under recipe r on a GPU of compute capability cc (v2.8):
 *   without param_gather  the cached workspace (TransformerEngineBaseModule.
 *       get_weight_workspace, module/base.py, keyed "weight", "fc1_weight", "weight{i}" when
 *       Megatron-Core passes is_first_microbatch: megatron/core/transformer/module.py
 *       set_is_first_microbatch, core_v0.14.0): delayed and current scaling a row-major copy
 *       and, where float8 GEMMs take TN operands alone (mp_fp8_gemm_any_layout false), its
 *       transpose, sharing one fp32 scale_inv (quantizer.cpp, Float8Quantizer::create_tensor:
 *       with_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported); MXFP8 a
 *       row-wise and a column-wise copy, each with an E8M0 scale per 32 elements padded to
 *       [roundup(rows, 128), roundup(cols / 32, 4)] and [roundup(rows / 32, 4),
 *       roundup(cols, 128)] (MXFP8Quantizer::get_scale_shape); blockwise (128 x 128 weight
 *       tiles) a row-wise and a column-wise copy, with fp32 scales of [ceil(rows / 128),
 *       roundup(ceil(cols / 128), 4)] and [ceil(cols / 128), roundup(ceil(rows / 128), 4)]
 *       (Float8BlockQuantizer::get_scale_shape, block_scaling_dim 2); NVFP4 a row-wise and a
 *       column-wise copy of E2M1 codes (half a byte an element each) with E4M3 scales of
 *       [roundup(rows, 128), roundup(cols / 16, 4)] and [roundup(cols, 128),
 *       roundup(rows / 16, 4)] and an fp32 amax each (NVFP4Quantizer::get_scale_shape,
 *       quantizer.cpp v2.9, which takes no 2-D flag: the 16x16 weight blocks keep the 1x16
 *       scales' shape).
 *   with param_gather  the model weight is the row-wise copy (counted with the parameters):
 *       delayed and current scaling add the transpose where the GPU needs one
 *       (Float8TensorBase.update_usage, tensor/_internal/float8_tensor_base.py), blockwise the
 *       column-wise copy and its scales (Float8BlockwiseQTensorBase._create_columnwise).
 * The workspaces and the float8 weight's transpose are written in place each step
 * (quantize_ into the cached tensor; tex.fp8_transpose(out=self._transpose), which
 * _reset_caches only marks stale): held through every step. Blockwise's column-wise copy of a
 * float8 weight is dropped after each update (cast_master_weights_to_fp8's
 * update_usage(columnwise_usage=False), tensor/utils.py): held from the layer's first forward
 * of a step to the optimizer step (mp_fp8_te_copy_per_step). */
int64_t mp_fp8_te_weight_copy_bytes(mp_fp8_recipe r, int cc, int param_gather, int64_t rows, int64_t cols);

/* The bytes of one usage's scales of a rows x cols tensor Transformer Engine quantizes with
 * recipe r (quantizer.cpp get_scale_shape, v2.8; NVFP4 v2.9): MXFP8 E8M0 per 32 and NVFP4
 * E4M3 per 16, row-wise (rowwise 1) or column-wise, padded as above; blockwise fp32, 128 x 128
 * tiles (block_2d 1: weights) or 1 x 128 (activations, column-wise [ceil(rows / 128),
 * roundup(cols, 4)], row-wise [ceil(cols / 128), roundup(rows, 4)]); per-tensor recipes 0
 * (their one fp32 scale left to the caller). */
int64_t mp_fp8_te_scale_bytes(mp_fp8_recipe r, int rowwise, int block_2d, int64_t rows, int64_t cols);

/* Bytes an element of such copies takes, scales left out: 0, 1 or 2 (NVFP4's two: 1). */
int mp_fp8_te_copies_per_elem(mp_fp8_recipe r, int cc, int param_gather);

/* Whether those copies live from the layer's first forward of a step to the optimizer step
 * (blockwise under param_gather) rather than through every step. */
int mp_fp8_te_copy_per_step(mp_fp8_recipe r, int param_gather);

#ifdef __cplusplus
}
#endif

#endif /* MP_EXEC_PLAN_FP8_H */
