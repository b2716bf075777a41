/* Step schedule builder: emission primitives, GEMMs and Linears (float8 included), the
 * tensor- and expert-parallel collectives, norms and residual adds: what a block's, the
 * embedding's and the head's ops are made of (the builder's overview: schedule.c).
 *
 * Conventions (units: elements, bytes, FLOPs; T = tokens of one micro-batch on this rank =
 * micro_batch x seq / cp; e = 2 bytes, bf16 activations):
 *   GEMM C[m,n] = A[m,k] B[k,n]: FLOPs 2mnk x batch; bytes = batch (mk + kn) x input bytes
 *     + mn x 2 (bf16 output). A Linear [out, in] on T tokens: forward m=T, n=out, k=in;
 *     DGRAD dx = dy W: m=T, n=in, k=out; WGRAD dW = dy^T x: m=out, n=in, k=T. Biases are
 *     folded into the GEMM epilogue (their out x T adds are not counted).
 *   Attention (flash, causal): forward 4 x T x seq x heads_local x hd / 2, the causal half
 *     of QK^T and PV (a query attends to seq/2 keys on average); backward twice the forward
 *     (dQ, dK, dV, dP: the algorithmic count; flash's recomputation of QK^T in backward is
 *     left to the simulator's attention efficiency). mp_model_flops_per_token counts
 *     12 L heads hd seq per token, i.e. non-causal forward + backward, so a schedule's
 *     FLOPs are the model FLOPs less 6 L heads hd seq per token (tested), plus the small
 *     element-wise FLOPs, less 6 x (norm parameters) which the model counts.
 *   Element-wise kernels carry a nominal FLOP count per element (FLOPS_*,
 *     schedule_internal.h); they are memory-bound, so their bytes (read + written) are what
 *     the simulator uses.
 *   Float8 Linear, torchao (torchtitan): forward casts the weight and the input to E4M3
 *     and runs the GEMM in E4M3; backward casts dy to E5M2 (tensorwise: a row-major and a
 *     transposed copy, dy_copies) and re-casts the input (torchao saves the high-precision
 *     input; a float8 input saved by float8 TP is transposed instead) and the weight
 *     (tensorwise saves the float8 weight, transposed instead),
 *     DGRAD and WGRAD in E5M2 (op dtype E5M2: one operand is E5M2, the other E4M3). A
 *     cast reads the bf16 source (2 bytes an element) and writes one float8 copy (1), after
 *     an amax pass (2 more) where the scale is the tensor's own (none in a recompute whose
 *     policy kept the amax: amax_kept): tensorwise 5 bytes, so is each of rowwise's casts, of which the
 *     backward needs two more (dy and the weight scaled along another dim), MXFP8 3 plus a
 *     scale byte per 32 (no amax pass: each block's scale is local). With float8 all-gather
 *     the gathered weight already is float8 and its casts are dropped (the cast of the shard
 *     happens before the all-gather).
 *   Float8 Linear, Transformer Engine (Megatron-LM; transformer_engine/pytorch/module/
 *     linear.py, layernorm_linear.py): the weight is cast once a step with its transposed
 *     copy and kept for every micro-batch (Megatron-Core passes is_first_microbatch), an
 *     input or output gradient is cast with its transposed copy in one kernel
 *     (cast_transpose: read 2, write 1 + 1; current scaling's amax pass 2 more), the
 *     transposed copies only where the GPU's float8 GEMMs take TN operands alone (Hopper;
 *     shapes.fp8_te_copies, schedule_prep.c: on Blackwell the row-major codes alone), a fused
 *     LayerNormLinear's norm emits float8 itself under delayed scaling (the transposed copy
 *     made in backward, read 1 write 1), q/k/v and gate/up are one Linear each (linear_qkv,
 *     linear_fc1) sharing one cast input, and the amaxes of each model chunk's pass are
 *     reduced in one all-reduce under delayed scaling (fp8_autocast's reduce_amax).
 *   The runtimes' float8 (emulated, or on codes) is schedule_rt.c's.
 *   MoE: balanced routing by default: each local expert receives T x top_k x ep / E tokens
 *     (m of the grouped GEMMs, rounded up; FLOPs use the exact value), batch = E / ep; under
 *     the plan's routing (imbalance, capacity) the slowest EP rank's rows instead
 *     (schedule_prep.c, mp_sched_moe_rows), its all-to-all bytes scaled alike.
 *   Collective payloads (schedule.h): TP all-reduce of [T, H] bf16: 2TH bytes. All-to-all:
 *     the rank's whole send buffer, T x top_k x H x 2 bytes, of which (ep-1)/ep crosses
 *     the network (the simulator's (n-1)/n factor, as nccl-tests count all-to-all). FSDP
 *     (schedule_fsdp.c): all-gather of the unit's tp-local elements (this stage's) x param
 *     dtype; reduce-scatter of the same elements x reduce dtype; dp_replicate all-reduce of
 *     the unit's shard x reduce dtype. Send/recv: [T, H] bf16.
 *   torchtitan's sequence parallelism shards dim 1 of [batch, seq, H]: a copy of the whole
 *     [T, H] beside each TP all-gather and reduce-scatter (sp_cat), AsyncTP's fused ops their
 *     own kernels (fused_shard_copy, fused_partials_sum).
 *   No sequence parallelism: TP's activations are replicated [T, H] (all-reduce, not
 *     reduce-scatter + all-gather). Vocab-parallel embedding: masked lookup + all-reduce
 *     forward, no communication backward. Loss: with vocab-sharded logits three TP
 *     all-reduces of T fp32 values (max, sum of exp, target logit); with replicated
 *     logits an all-gather of [T, V] bf16 before the loss.
 *
 * A block's ops are schedule_block.c's, the embedding's and the head's schedule_head.c's;
 * the conventions above hold for all three. */
#include <stdarg.h>

#include "exec/schedule_internal.h"

/* ---- emission primitives -------------------------------------------------------------- */

void mp_sched_fail(gen *g, mp_status code, const char *fmt, ...) {
  if (g->status != MP_OK) return;
  va_list ap;
  va_start(ap, fmt);
  g->status = mp_verror(g->ctx, code, fmt, ap);
  va_end(ap);
}

int mp_sched_grow_ops(gen *g) {
  int32_t cap = g->cap_ops ? 2 * g->cap_ops : g->ops_hint;
  /* not zeroed: ops are copied in or cleared one by one (new_op) */
  mp_op *n = mp_arena_alloc_raw(g->arena, sizeof(mp_op) * (size_t)cap);
  if (n == NULL) {
    mp_sched_fail(g, MP_ERR_NOMEM, "out of memory building the step schedule");
    return 0;
  }
  if (g->n_ops) memcpy(n, g->ops, sizeof(mp_op) * (size_t)g->n_ops);
  g->ops = n;
  g->cap_ops = cap;
  return 1;
}

void mp_sched_seg_open(gen *g, mp_phase phase, int32_t layer, int32_t layer_step) {
  (void)layer_step;
  g->phase = (uint8_t)phase;
  g->when = phase == MP_PHASE_PROLOGUE || phase == MP_PHASE_OPTIMIZER ? MP_WHEN_ONCE
                                                                      : MP_WHEN_EVERY_MICRO;
  g->layer = layer;
  g->seg_first = g->n_ops;
}

void mp_sched_seg_close(gen *g, mp_phase phase, int32_t repeat, int32_t layer_step,
                        int32_t unit_step) {
  if (g->status != MP_OK) return;
  if (g->n_ops == g->seg_first) return; /* nothing emitted (e.g. a middle stage's head) */
  if (g->n_segs == g->cap_segs) {
    int32_t cap = g->cap_segs ? 2 * g->cap_segs : 32;
    mp_segment *n = mp_arena_alloc(g->arena, sizeof(mp_segment) * (size_t)cap);
    if (n == NULL) {
      mp_sched_fail(g, MP_ERR_NOMEM, "out of memory building the step schedule");
      return;
    }
    if (g->n_segs) memcpy(n, g->segs, sizeof(mp_segment) * (size_t)g->n_segs);
    g->segs = n;
    g->cap_segs = cap;
  }
  mp_segment *sg = &g->segs[g->n_segs++];
  sg->first_op = g->seg_first;
  sg->n_ops = g->n_ops - g->seg_first;
  sg->repeat = repeat;
  sg->layer_step = layer_step;
  sg->unit_step = unit_step;
  sg->phase = (uint8_t)phase;
  sg->chunk = g->chunk;
}

/* ---- GEMMs and Linears ---------------------------------------------------------------- */

/* Whether a torchao tensorwise cast finds its amax kept by the AC policy: torchtitan's
 * op-level SAC saves the output of aten.max.default ("for low precision training, it's
 * useful to always save the result of max", _save_list in torchtitan 820504e
 * models/llama3/parallelize_llama.py), which torchao's tensorwise amax is
 * (torch.max(torch.abs(x)), torchao 6243040 float8/float8_utils.py tensor_to_amax): the
 * recompute of a block under that policy casts from the kept amax without the amax pass.
 * Rowwise's amax (torch.amax along a dim) is another op, recomputed. */
static int amax_kept(const gen *g) {
  return g->phase == MP_PHASE_RECOMPUTE && g->sh.fp8_recipe == MP_FP8_TENSORWISE && !g->sh.fp8_te &&
         !g->ms->runtime && mp_plan_layer_ac(g->p, g->layer) == MP_AC_SELECTIVE_OP;
}

/* Bytes a float8 cast moves per element of its bf16 source when it writes `copies` float8
 * copies (the row-major one, and Transformer Engine's transposed or MXFP8's column-scaled
 * one): the read (2), a byte a copy, an amax pass (2) where the scale is the tensor's own
 * and no AC policy kept its amax (amax_kept) (tensorwise and rowwise; delayed scaling's
 * comes from the history, MXFP8's and
 * blockwise's blocks are scaled within the cast), and the scales (MXFP8: an E8M0 byte per
 * 32 elements; blockwise: an fp32 per 128). NVFP4 is nvfp4_cast_bytes'. */
static double cast_bytes(const gen *g, int copies) {
  const mp_fp8_recipe r = g->sh.fp8_recipe;
  double b = 2.0 + copies;
  if ((r == MP_FP8_TENSORWISE || r == MP_FP8_ROWWISE) && !amax_kept(g)) b += 2.0;
  if (r == MP_FP8_MXFP8) b += copies / 32.0;
  if (r == MP_FP8_BLOCKWISE) b += copies * 4.0 / 128.0;
  return b;
}

/* Transformer Engine's NVFP4Quantizer::quantize_impl (pytorch/csrc/quantizer.cpp, v2.9), per
 * element of the bf16 source writing `copies` NVFP4 copies (MP_NVFP4_BYTES each: E2M1 codes
 * and an E4M3 scale per 16): the per-tensor fp32 scale's amax pass first (2: nvte_compute_amax,
 * or with the random Hadamard transform nvte_hadamard_transform_amax, which takes the input's
 * amax and its transform's in one read), then the quantize. A weight (no transform, its 16x16
 * blocks: recipe fp4_quant_fwd_weight) writes both copies in one nvte_quantize_v2 (read 2);
 * an input or an output gradient, whose column-wise copy feeds the weight-gradient GEMM
 * through the transform (fp4_quant_fwd_inp, fp4_quant_bwd_grad), writes the row-wise copy in
 * one kernel and the column-wise one in nvte_hadamard_transform_cast_fusion_columnwise, which
 * reads the source again (2 more); stochastic rounding of gradients is within that kernel.
 * Without the transform (NVTE_NVFP4_DISABLE_RHT=1: `rht` 0) every tensor is cast as a weight
 * is, both copies in one kernel. */
static double nvfp4_cast_bytes(int copies, int rht) {
  return 2.0 + 2.0 + copies * MP_NVFP4_BYTES + (rht && copies > 1 ? 2.0 : 0.0);
}

static int32_t cast_op(gen *g, int module, int64_t elems, mp_variant v, int copies, int weight) {
  const double b = g->sh.fp8_recipe == MP_FP8_NVFP4 ? nvfp4_cast_bytes(copies, !weight && g->sh.nvfp4_rht)
                                                    : cast_bytes(g, copies);
  return compute(g, MP_KERNEL_FP8_CAST, v, module, elems, 0, 0, 1, FLOPS_CAST * (double)elems,
                 b * (double)elems, MP_DTYPE_BF16);
}

static int32_t cast_copies(gen *g, int module, int64_t elems, mp_variant v, int copies) {
  return cast_op(g, module, elems, v, copies, 0);
}

static void cast(gen *g, int module, int64_t elems, mp_variant v) { cast_copies(g, module, elems, v, 1); }

/* A per-tensor scale of a tensor cast on the rank's sequence shard (SP) is the whole
 * tensor's: its amax all-reduced over tp first (torchao's float8 TP on a DTensor,
 * Transformer Engine's current scaling with its amax_reduction_group); 4 bytes. */
static void amax_tp(gen *g, int module) {
  if ((g->sh.fp8_recipe != MP_FP8_TENSORWISE && g->sh.fp8_recipe != MP_FP8_NVFP4) || !g->sh.sp) return;
  comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_TP, MP_STREAM_COMPUTE, 4.0, MP_DTYPE_FP32, module);
}

/* torchao's float8 tensor parallelism (torchtitan's Float8ColwiseParallel and
 * Float8RowwiseParallel, torchao/float8/float8_tensor_parallel.py) runs its Linears on
 * DTensors, and a tensorwise scale is the whole tensor's: the amax of a TP-sharded tensor
 * (torch.max(torch.abs(x)), torchao/float8/float8_utils.py tensor_to_amax) is a partial
 * max that amax_to_scale's arithmetic all-reduces over tp before the cast, 4 bytes. The
 * sharded tensors a Linear casts: its weight (Shard(0) colwise, Shard(1) rowwise; FSDP
 * gathers the data-parallel dim only; cast once in the forward, kept float8 for the
 * backward: float8_linear.py), a rowwise Linear's input (Shard(-1), the region's
 * activations; Float8RowwiseParallel._prepare_input_fn) and a colwise Linear's output
 * gradient (NoopFwToFloat8BwDynamic on its Shard(-1) output). The sequence-sharded casts
 * are amax_tp's. Whether Linear `module`'s `role` cast (MP_TP_COLWISE or MP_TP_ROWWISE:
 * the Linears whose activation it is; MP_TP_NONE: the weight, any split) emits it.
 * The rowwise recipe's Linears are DTensors under torchtitan's plain TP too; each amax is
 * torch.amax(torch.abs(x), dim): DTensor's Partial("max") where that dim is sharded,
 * all-reduced before the scale's arithmetic, the bf16 vector of `rows` (2 bytes each): a
 * rowwise Linear's input and weight (along in) forward, a colwise Linear's output gradient
 * and weight (along out) backward; its other casts reduce along unsharded dims. */
static void dtensor_amax_tp(gen *g, int module, mp_tp_style role, int64_t rows) {
  const shapes *sh = &g->sh;
  const int rw = sh->fp8_recipe == MP_FP8_ROWWISE && g->ms->dtensor_tp && sh->tp > 1 && role != MP_TP_NONE;
  if ((!sh->fp8_tp_codes && !rw) || sh->fp8_te || sh->tp_style[module] == MP_TP_NONE) return;
  if (role == MP_TP_NONE || sh->tp_style[module] == role)
    comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_TP, MP_STREAM_COMPUTE, rw ? 2.0 * (double)rows : 4.0,
         rw ? MP_DTYPE_BF16 : MP_DTYPE_FP32, module);
}

/* Transformer Engine: q/k/v and gate/up are one Linear each (Megatron-Core's linear_qkv and
 * linear_fc1, the experts' grouped linear_fc1 too), so k, v and up take q's and gate's cast
 * input as it is. */
static int te_shares_input(const gen *g, int module) {
  return g->sh.fp8_te && (module == MP_MOD_K || module == MP_MOD_V || module == MP_MOD_UP ||
                          module == MP_MOD_SHARED_UP || module == MP_MOD_EXPERTS_UP);
}

/* Transformer Engine's GroupedLinear (Megatron-Core's routed experts, batch > 1 local
 * experts in one Linear) quantizes expert by expert: each expert's weight by its own
 * quantizer in turn (_GroupedLinear.forward's loop over weight_quantizers, module/
 * grouped_linear.py), and the input and the output gradient with tex.split_quantize, whose
 * multi_tensor_quantize_impl (pytorch/csrc/extensions/cast.cpp) runs one quantize kernel a
 * split, fusing them into one nvte_multi_cast_transpose for delayed scaling's quantizers
 * alone (v2.6 at 07afda98, the Megatron-MoE-ModelZoo's, to v2.16; v2.14 the Megatron-LM
 * MoE recipes' release). Cast op `i` of such a Linear so launches a kernel an expert
 * (mp_op.grouped on a cast, sim/cost.c launches_of); `act`: an activation's or gradient's
 * cast, the fused one under delayed scaling. */
static void te_expert_casts(gen *g, int32_t i, int64_t batch, int act) {
  if (i < 0 || batch <= 1 || !g->sh.fp8_te || g->ms->runtime) return;
  if (act && g->sh.fp8_recipe == MP_FP8_DELAYED) return;
  g->ops[i].batch = batch;
  g->ops[i].grouped = 1;
}

/* Transformer Engine's LayerNormLinear: the norm before q/k/v and gate/up emits the float8
 * input itself under delayed scaling (its scale known before the norm runs); the
 * transposed copy for the weight gradient, where the GPU needs one, is made in backward. */
static int te_norm_emits(const gen *g, int module) {
  return g->sh.fp8_te && g->sh.fp8_recipe == MP_FP8_DELAYED &&
         (module == MP_MOD_Q || module == MP_MOD_GATE || module == MP_MOD_SHARED_GATE);
}

/* torchtitan's float8 tensor parallelism (torchao's PrepareFloat8ModuleInput in front of
 * Float8ColwiseParallel, parallelize_llama): the attention's and the dense MLP's input is
 * cast to float8 once, on the rank's tokens, and all-gathered in float8 (one byte an
 * element); q/k/v (gate/up) take that tensor as it is, and their backward the float8
 * input they saved, transposed for the weight gradient instead of cast again. Whether
 * Linear `module` reads such an input. */
int mp_sched_f8_input(const gen *g, int module) {
  const shapes *sh = &g->sh;
  if (!sh->fp8_tp_codes) return 0;
  if (module == MP_MOD_Q || module == MP_MOD_K || module == MP_MOD_V)
    return sh->tp_opens_qkv && sh->fp8[MP_MOD_Q];
  if (module == MP_MOD_GATE || module == MP_MOD_UP) return sh->tp_opens_gateup && sh->fp8[MP_MOD_UP];
  return 0;
}

/* torchao's Float8RowwiseParallel (the closing Linears o and down under torchtitan's float8
 * tensor parallelism) ends its output with _NoopFwToFloat8BwDynamic: a no-op forward whose
 * backward casts the output gradient to float8 E5M2 before the backward of the sequence
 * reduce-scatter, the all-gather of that gradient, so the gather moves one byte an element
 * and the Linear's backward takes the gathered float8 gradient as it is
 * (torchao/float8/float8_tensor_parallel.py). Whether Linear `module` closes such a region
 * under sequence parallelism. */
static int f8_grad_out(const gen *g, int module) {
  const shapes *sh = &g->sh;
  if (!sh->fp8_tp_codes || !sh->sp) return 0;
  if (module == MP_MOD_O) return sh->tp_closes_o && sh->fp8[MP_MOD_O];
  if (module == MP_MOD_DOWN) return sh->tp_closes_down && sh->fp8[MP_MOD_DOWN];
  return 0;
}

/* A float8 tensor's transposed copy (one byte read, one written an element). */
static int32_t transpose8(gen *g, int module, int64_t elems, mp_variant v) {
  return compute(g, MP_KERNEL_FP8_CAST, v, module, elems, 0, 0, 1, 0.0, 2.0 * (double)elems,
          MP_DTYPE_FP8_E4M3);
}

/* torchao's rowwise recipe runs the backward's GEMMs without fast accumulation, which its
 * row-scaled CUTLASS kernel is too slow for, so addmm_float8_unwrapped calls cuBLAS's
 * per-tensor GEMM with unit scales and multiplies the bf16 output by the row and column
 * scales afterwards (torchao/float8/float8_ops.py and config.py's ROWWISE recipe, the
 * 890e0ac8 commit torchao's H100 rowwise benchmark ran); under torch.compile that multiply
 * is a Triton kernel of its own after each GEMM, since Inductor runs _scaled_mm as an extern
 * kernel and fuses no pointwise epilogue into it: the output read and written, 4 bytes an
 * element. */
static void rowwise_post_scale(gen *g, int module, int64_t elems) {
  if (g->sh.fp8_recipe != MP_FP8_ROWWISE || g->sh.fp8_te || g->ms->runtime) return;
  /* torchao's float8 grouped GEMMs pass the row scales to torch._scaled_grouped_mm, which
   * applies them in its epilogue (prototype/moe_training/fp8_grouped_mm.py) */
  if (module == MP_MOD_EXPERTS_GATE || module == MP_MOD_EXPERTS_UP || module == MP_MOD_EXPERTS_DOWN) return;
  elementwise(g, MP_KERNEL_FP8_CAST, MP_VAR_BWD, module, elems, 1.0, 4.0 * (double)elems);
}

/* The float8 copies a torchao tensorwise cast of an output gradient writes: torchao's
 * backward hands the cast gradient to both GEMMs, the input gradient's as its row-major
 * first operand and the weight gradient's as dy^T, a column-major view that
 * preprocess_addmm copies contiguous (a_data.contiguous(), torchao 6243040
 * float8/float8_ops.py); under torch.compile the cast writes that transposed copy from the
 * same read of dy, as torchao's roofline counts a grad_output cast ("read in bf16, write
 * twice in float8 (row-major and col-major)", torchao/testing/float8/roofline_utils.py): 2.
 * Rowwise casts dy twice, scaled along each dim, each copy in its GEMM's layout: 1. */
static int dy_copies(const gen *g) { return g->sh.fp8_recipe == MP_FP8_TENSORWISE ? 2 : 1; }

/* torchao's Float8RowwiseParallel (the rowwise Linears o and down under torchtitan's float8
 * tensor parallelism) casts the Linear's input to float8 in its _prepare_input_fn, before
 * the Linear runs (torchao 6243040 float8/float8_tensor_parallel.py), and the Linear's
 * matmul_with_hp_or_float8_args saves that float8 input and takes it as it is in backward
 * (tensor_already_casted_to_fp8, float8/float8_linear.py): the weight gradient's second
 * operand is its transposed copy (preprocess_addmm's b_data.t().contiguous().t()), not a
 * cast of the bf16 input. Whether Linear `module` reads such an input. */
static int f8_row_input(const gen *g, int module) {
  const shapes *sh = &g->sh;
  return sh->fp8_tp_codes && !sh->fp8_te && sh->tp_style[module] == MP_TP_ROWWISE && sh->fp8[module];
}

/* y[T, out] = x[T, in] W^T (batch > 1: grouped expert GEMMs, m tokens per expert). */
void mp_sched_linear_fwd(gen *g, int module, double m, int64_t out, int64_t in, int64_t batch) {
  if (skipped(g, SKIP_MOD(module))) return; /* its output kept by the AC policy */
  const int f8 = g->sh.fp8[module];
  if (!f8) {
    gemm(g, MP_VAR_FWD, module, m, out, in, batch, MP_DTYPE_BF16);
    return;
  }
  const int64_t mi = (int64_t)ceil(m) * batch;
  const int64_t w = out * in * batch, x = mi * in;
  if (g->fp8_codes) {
    /* codes: the input's (shared in the block; its amax from RMSNorm's or SwiGLU's kernel,
     * the attention output's read for it), then the weight's when FSDP-sharded (else the
     * resident codes, quantized once per step: rt_optimizer) */
    const int64_t wb = g->fp8_weights_sharded ? mp_act_f8_operand_bytes(w) : 0;
    const int src = mp_sched_f8_source(module);
    if (!(g->fp8_scope & (1u << src))) mp_sched_rt_f8_cast(g, module, x, src == 1, 1, MP_VAR_FWD);
    mp_sched_rt_f8_act(g, module, x);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 1);
    if (wb) mp_sched_rt_f8_cast(g, module, w, 1, 2, MP_VAR_FWD);
    gemm(g, MP_VAR_FWD, module, m, out, in, batch, MP_DTYPE_FP8_E4M3);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 0);
    return;
  }
  if (g->sh.fp8_te) {
    /* the weight with its transposed copy (where the GPU needs one) once a step (not re-run
     * by a recompute); a float8 model weight (--fp8-param-gather) is not cast: its transposed
     * copy, which cast_master_weights_to_fp8 drops after each update (_reset_caches), is made
     * from it in the first micro-batch where the GPU needs one (Float8Tensor's _transpose,
     * transformer_engine/pytorch/tensor/float8_tensor.py v2.6), none where it does not; an
     * MXFP8 model weight is quantized, both usages, from the bf16 it is gathered in
     * (fp8_param_gather_bf16): the bf16 weight's cast, once a step */
    const int copies = g->sh.fp8_te_copies;
    if (g->phase != MP_PHASE_RECOMPUTE) {
      int32_t i = -1;
      if (!g->sh.fp8_param_gather || g->sh.fp8_param_gather_bf16)
        i = cast_op(g, module, w, MP_VAR_FWD, copies, 1);
      else if (copies > 1)
        i = transpose8(g, module, w, MP_VAR_FWD);
      /* under Megatron FSDP the transpose is dropped after the layer (f8_held_per_layer):
       * made again in every forward */
      if (i >= 0 && !g->sh.f8_held_per_layer) g->ops[i].when = MP_WHEN_FIRST_MICRO;
      te_expert_casts(g, i, batch, 0);
    }
    if (!mp_sched_f8_input(g, module) && !te_shares_input(g, module) && !te_norm_emits(g, module))
      te_expert_casts(g, cast_copies(g, module, x, MP_VAR_FWD, copies), batch, 1);
  } else {
    const int rw = g->sh.fp8_recipe == MP_FP8_ROWWISE;
    if (!g->sh.fp8_all_gather) {
      dtensor_amax_tp(g, module, rw ? MP_TP_ROWWISE : MP_TP_NONE, out * batch);
      cast(g, module, w, MP_VAR_FWD);
    }
    if (!mp_sched_f8_input(g, module)) {
      dtensor_amax_tp(g, module, MP_TP_ROWWISE, mi);
      cast(g, module, x, MP_VAR_FWD);
    }
  }
  /* meshplan-cpu emulates float8 in fp32: one buffer of the quantized input (aligned) and
   * weight; the runtimes never all-gather float8; Transformer Engine's weight copies are
   * held (BUF_F8_HELD, schedule_mem.c) */
  const int64_t wq = g->sh.fp8_all_gather || g->sh.fp8_te ? 0 : w;
  const int64_t fb = g->ms->runtime ? mp_act_f8_emul_fwd_floats(x, w) * 4 : wq + x;
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 1);
  gemm(g, MP_VAR_FWD, module, m, out, in, batch, MP_DTYPE_FP8_E4M3);
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 0);
}

/* Megatron-LM without gradient accumulation fusion (the plan's ddp.wgrad_unfused): the
 * weight-gradient GEMM writes the bf16 param.grad (its own op's bytes), and the parameter's
 * hook then moves it into the main_grad in the run's gradient dtype (fsdp.reduce_dtype):
 * Megatron FSDP under optim_grads_params copies it (megatron/core/distributed/fsdp/src/
 * megatron_fsdp/megatron_fsdp.py core_v0.14.0, _grad_acc: main_grad.copy_, as
 * custom_fsdp/fully_sharded_data_parallel.py core_v0.13.0), Megatron's DDP and distributed
 * optimizer add it (distributed_data_parallel.py core_v0.14.0: main_grad.add_): a read of
 * the 2-byte gradient and a write of the main_grad, the add reading it too. One kernel a
 * parameter: `batch` for a layer's routed experts, each expert its own weight
 * (Transformer Engine's GroupedLinear weight0..weightN). */
static void unfused_grad_accum(gen *g, int module, int64_t out, int64_t in, int64_t batch) {
  if (!g->p->opts.ddp.wgrad_unfused) return;
  const int add = !mp_plan_is_megatron_fsdp(g->p);
  const double main_grad = (double)mp_dtype_bytes(g->p->opts.fsdp.reduce_dtype);
  const int64_t e = out * in;
  const int32_t i = elementwise(g, MP_KERNEL_COPY, MP_VAR_BWD, module, e, add ? 1.0 : 0.0,
                                (2.0 + main_grad * (add ? 2.0 : 1.0)) * (double)e);
  if (batch > 1) g->ops[i].count = (uint16_t)batch;
}

/* Transformer Engine's casts in a Linear's backward: dy with its transposed copy (gathered
 * in float8 under SP: its transpose here); the weight's copies kept from the forward; the
 * input's transposed copy made here where the forward wrote only the row-major one
 * (gathered, or the norm's). Where the GPU takes any layout (fp8_te_copies 1) the row-major
 * codes serve both GEMMs. The experts' gate and up gradients are linear_fc1's one output
 * gradient, split-quantized once: its per-expert launches counted on gate's cast. */
static void te_bwd_casts(gen *g, int module, int64_t dy, int64_t x, int64_t batch) {
  /* NVFP4 gathers both copies (f8_gather_bytes): none is made here */
  const int two = g->sh.fp8_te_copies == 2 && g->sh.fp8_recipe != MP_FP8_NVFP4;
  if (!f8_grad_out(g, module)) {
    const int32_t i = cast_copies(g, module, dy, MP_VAR_BWD, g->sh.fp8_te_copies);
    if (!te_shares_input(g, module)) te_expert_casts(g, i, batch, 1);
  } else if (two) {
    transpose8(g, module, dy, MP_VAR_BWD);
  }
  if (two && !te_shares_input(g, module) && (mp_sched_f8_input(g, module) || te_norm_emits(g, module)))
    transpose8(g, module, x, MP_VAR_BWD);
}

void mp_sched_linear_bwd(gen *g, int module, double m, int64_t out, int64_t in, int64_t batch) {
  const int f8 = g->sh.fp8[module];
  if (!f8) {
    gemm(g, MP_VAR_DGRAD, module, m, in, out, batch, MP_DTYPE_BF16);
    gemm(g, MP_VAR_WGRAD, module, out, in, (int64_t)ceil(m), batch, MP_DTYPE_BF16);
    unfused_grad_accum(g, module, out, in, batch);
    return;
  }
  const int64_t mi = (int64_t)ceil(m) * batch;
  const int64_t w = out * in * batch, x = mi * in, dy = mi * out;
  if (g->fp8_codes) {
    /* codes: dy's (E5M2, both orientations; gate's and up's amax from SwiGLU's backward
     * kernel), the weight's when sharded, DGRAD adding into the input gradient, then the
     * input's transposed codes (shared in the block; the amax its forward kept) */
    const int64_t db = mp_act_f8_operand_bytes(dy);
    const int64_t wb = g->fp8_weights_sharded ? mp_act_f8_operand_bytes(w) : 0;
    const int dy_known = (module == MP_MOD_GATE || module == MP_MOD_UP) && g->sh.gated &&
                         g->sh.fp8[MP_MOD_GATE] && g->sh.fp8[MP_MOD_UP];
    const int src = mp_sched_f8_source(module);
    pair(g, MP_MEM_FP8, BUF_F8_DY, db, 1);
    mp_sched_rt_f8_cast(g, module, dy, !dy_known, 2, MP_VAR_BWD);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 1);
    if (wb) mp_sched_rt_f8_cast(g, module, w, 1, 2, MP_VAR_BWD);
    gemm(g, MP_VAR_DGRAD, module, m, in, out, batch, MP_DTYPE_FP8_E5M2);
    if (!(g->fp8_scope & (1u << src))) mp_sched_rt_f8_cast(g, module, x, 0, 1, MP_VAR_BWD);
    mp_sched_rt_f8_act(g, module, x);
    gemm(g, MP_VAR_WGRAD, module, out, in, (int64_t)ceil(m), batch, MP_DTYPE_FP8_E5M2);
    unfused_grad_accum(g, module, out, in, batch);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 0);
    pair(g, MP_MEM_FP8, BUF_F8_DY, db, 0);
    return;
  }
  if (g->sh.fp8_te) {
    te_bwd_casts(g, module, dy, x, batch);
    /* and the float8 weight's transpose again, Megatron FSDP having dropped it after the
     * forward (f8_held_per_layer) */
    if (g->sh.f8_held_per_layer) te_expert_casts(g, transpose8(g, module, w, MP_VAR_BWD), batch, 0);
  } else {
    /* dy gathered in float8 (f8_grad_out) is row-major [T, out]; the weight gradient's
     * _scaled_mm takes dy^T as its row-major first operand, which torchao's
     * preprocess_addmm makes with a contiguous copy (torchao/float8/float8_ops.py): a
     * transposed copy of the whole gathered gradient, which no cast can fuse */
    if (!f8_grad_out(g, module)) {
      dtensor_amax_tp(g, module, MP_TP_COLWISE, mi);
      cast_copies(g, module, dy, MP_VAR_BWD, dy_copies(g));
    } else {
      transpose8(g, module, dy, MP_VAR_BWD);
    }
    /* rowwise: dy scaled along tokens for the weight gradient as well */
    if (g->sh.fp8_recipe == MP_FP8_ROWWISE || g->sh.fp8_recipe == MP_FP8_MXFP8) cast(g, module, dy, MP_VAR_BWD);
    /* tensorwise: the weight cast once in Float8Linear.forward and saved in float8 (or
     * gathered so), the input gradient's second operand its transposed copy
     * (preprocess_addmm, b_data.t().contiguous().t()); rowwise scales it along the other
     * dim: a cast from the bf16 weight */
    if (g->sh.fp8_recipe == MP_FP8_ROWWISE) dtensor_amax_tp(g, module, MP_TP_COLWISE, in * batch);
    if (g->sh.fp8_recipe == MP_FP8_TENSORWISE) transpose8(g, module, w, MP_VAR_BWD);
    else if (!g->sh.fp8_all_gather) cast(g, module, w, MP_VAR_BWD);
    if (mp_sched_f8_input(g, module) || f8_row_input(g, module))
      transpose8(g, module, x, MP_VAR_BWD);
    else
      cast(g, module, x, MP_VAR_BWD);
  }
  /* torchao's float8 output gradient in its copies (dy_copies); Transformer Engine's are its own */
  const int64_t wq = g->sh.fp8_all_gather || g->sh.fp8_te ? 0 : w, dq = g->sh.fp8_te ? dy : dy * dy_copies(g);
  const int64_t fb = g->ms->runtime ? mp_act_f8_emul_bwd_floats(dy, x, w) * 4 : dq + wq + x;
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 1);
  gemm(g, MP_VAR_DGRAD, module, m, in, out, batch, MP_DTYPE_FP8_E5M2);
  rowwise_post_scale(g, module, x);
  /* WGRAD's FLOPs with the exact token count: dW[out, in] = dy^T x, k = m x batch tokens
   * spread over the batch of experts. */
  gemm(g, MP_VAR_WGRAD, module, out, in, (int64_t)ceil(m), batch, MP_DTYPE_FP8_E5M2);
  rowwise_post_scale(g, module, w);
  unfused_grad_accum(g, module, out, in, batch);
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 0);
}

/* WGRAD with k = m tokens: 2 x out x in x m x batch, the same as the forward. The gemm()
 * above takes m as the first size; for WGRAD m=out, k=tokens, so the FLOPs are exact
 * only when m is integral: fix them up for fractional expert token counts. */
void mp_sched_fix_wgrad_flops(gen *g, int32_t first, double m_tokens) {
  for (int32_t i = first; i < g->n_ops; i++) {
    mp_op *op = &g->ops[i];
    if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_GEMM && op->variant == MP_VAR_WGRAD)
      op->flops = 2.0 * (double)op->m * (double)op->n * m_tokens * (double)op->batch;
  }
}

/* ---- tensor- and expert-parallel collectives ------------------------------------------ */

/* Activations travel as X elements: bf16 under torchtitan, the runtimes' X (fp32 on the CPU). */
static double act_comm_bytes(const gen *g) { return (double)g->ms->x_bytes; }

static mp_dtype act_comm_dtype(const gen *g) { return g->ms->x_bytes == 4 ? MP_DTYPE_FP32 : MP_DTYPE_BF16; }

/* A TP region's boundary collectives on [T, H] X elements (payload: the full tensor, as
 * schedule.h counts all-gather, reduce-scatter and all-reduce alike). A region is the
 * colwise Linears after a norm, up to the rowwise Linear that closes it (Megatron's f and
 * g operators, Shoeybi et al. 2019; with sequence parallelism Korthikanti et al. 2022's
 * g and g-bar):
 *   entering, forward   SP: all-gather of the sequence shards; else nothing
 *   leaving, forward    SP: reduce-scatter of the partial sums; else all-reduce
 *   leaving, backward   SP: all-gather of the output gradient; else nothing
 *   entering, backward  SP: reduce-scatter of the input gradient; else all-reduce
 * `on`: the region's Linears are tensor-parallel (tp > 1). Under RECOMPUTE a collective
 * whose output the AC policy keeps is skipped (SKIP_RS). */
static void tp_coll(gen *g, mp_coll c, int module) {
  const shapes *sh = &g->sh;
  comm(g, c, MP_GROUP_TP, MP_STREAM_COMPUTE, act_comm_bytes(g) * (double)(sh->tokens * sh->d_model),
       act_comm_dtype(g), module);
}

/* AsyncTP (mp_fuse, schedule.h): the plan asks for it and the block's TP regions run SP's
 * all-gathers and reduce-scatters. torchtitan's is torch.compile's micro-pipeline pass;
 * Megatron-Core's --tp-comm-overlap pipelines the same pairs in Transformer Engine
 * (userbuffers: ring-exchange all-gather into the qkv and fc1 GEMMs, pipelined
 * reduce-scatter out of proj and fc2, the output-gradient all-gather into proj's and fc2's
 * input-gradient GEMMs; transformer_engine/pytorch/module/base.py, initialize_ub), and
 * runs the "bulk" overlaps of the qkv and fc1 regions' backward (bulk_tp). The meshplan
 * runtimes have no such fusion; the plan refuses tp_comm_fused under their memory models. */
static int async_tp(const gen *g) {
  return g->p->opts.tp_comm_fused && g->sh.sp && g->sh.tp > 1 && !g->ms->runtime;
}

/* AsyncTP's fused pairs (mp_sched_fuse_tp's patterns): the collective of the region Linear
 * `module` opens or closes runs inside a fused pair (under torchtitan, torch's
 * fused_all_gather_matmul or fused_matmul_reduce_scatter). */
static int fused_region(const gen *g, int module) {
  const shapes *sh = &g->sh;
  if (!async_tp(g)) return 0;
  return (module == MP_MOD_Q && sh->tp_opens_qkv) || (module == MP_MOD_UP && sh->tp_opens_gateup) ||
         (module == MP_MOD_O && sh->tp_closes_o) || (module == MP_MOD_DOWN && sh->tp_closes_down);
}

/* torchtitan's TP plan shards the sequence as dim 1 of the [batch, seq, H] activations
 * (SequenceParallel, PrepareModuleInput and RowwiseParallel(output_layouts=Shard(1)),
 * torchtitan 820504e models/llama3/parallelize_llama.py, whose comment names folding batch
 * and sequence as the way to avoid this), while NCCL gathers and scatters along dim 0:
 * DTensor's Shard(1) redistributions call funcol.all_gather_tensor(gather_dim=1), which
 * follows the gather with torch.cat(torch.chunk(out, tp), dim=1), and
 * reduce_scatter_tensor(scatter_dim=1), which precedes it with
 * torch.cat(torch.chunk(x, tp, dim=1)) (torch/distributed/_functional_collectives.py). A cat
 * whose inputs are views of an extern kernel's output (the collective's, a GEMM's) stays a
 * copy kernel of its own under Inductor (ConcatKernel copies what it cannot realize in
 * place), at any batch size: the whole [T, H] tensor read and written at its element size `e`. The one a pointwise op
 * produces, the sum of a compiled block's input-gradient GEMMs before the backward
 * reduce-scatter, is written in the concatenated order by that sum (no copy); the head runs
 * eagerly in torchtitan (only the blocks are compiled), so its cat is a copy. AsyncTP's
 * fused ops take the chunk + cat pattern in (micro_pipeline_tp.py's NonZeroDimAllGather and
 * NonZeroDimReduceScatter) and gather sequence-major, returning the gathered tensor as a
 * movedim view of it (symm_mem's _fused_all_gather_matmul_impl, unflatten); a bf16 weight
 * gradient's reshape of that view to [batch x seq, H] copies it where the batch is above 1
 * (sp_cat_wgrad; float8's transposed copy for the weight gradient absorbs it). */
static void sp_cat(gen *g, int module, double e, mp_variant v) {
  const shapes *sh = &g->sh;
  if (!g->ms->dtensor_tp || !sh->sp) return;
  const int64_t n = sh->tokens * sh->d_model;
  /* the copy's source and destination live at once: one [T, H] beside what the region holds */
  pair(g, MP_MEM_TEMP, BUF_SP_CAT, (int64_t)e * n, 1);
  compute(g, MP_KERNEL_COPY, v, module, n, 0, 0, 1, 0.0, 2.0 * e * (double)n, MP_DTYPE_BF16);
  pair(g, MP_MEM_TEMP, BUF_SP_CAT, (int64_t)e * n, 0);
}

/* The copy of a fused all-gather's sequence-major output for a bf16 weight gradient (sp_cat):
 * with more than one sequence in the micro-batch, and not where float8's transposed copy
 * (f8: the gathered operand is float8) serves the weight gradient. */
static void sp_cat_wgrad(gen *g, int module, int f8) {
  const shapes *sh = &g->sh;
  if (f8 || !fused_region(g, module) || sh->tokens * sh->cp / sh->seq <= 1) return;
  sp_cat(g, module, act_comm_bytes(g), MP_VAR_BWD);
}

/* AsyncTP's fused ops run kernels of their own on the compute stream beside the GEMM chunks
 * (torch/distributed/_symmetric_memory/__init__.py): fused_all_gather_matmul first copies
 * the rank's shard into its symmetric buffer, before the first chunk, so that the peers'
 * copies can start (_pipelined_all_gather_and_consume's "mv"): [T/tp, H] read and written
 * at the element size e; fused_matmul_reduce_scatter's chunks leave every rank's partial
 * sums of its tokens in stacked_partials, which one reduction kernel adds after the last
 * chunk (reduce_fn over the tp partials): [T, H] read, [T/tp, H] written. NCCL's
 * reduce-scatter adds inside the collective, so an unfused region has neither. */
static void fused_shard_copy(gen *g, int module, double e, mp_variant v) {
  if (!g->ms->dtensor_tp || !fused_region(g, module)) return;
  const int64_t n = g->sh.tokens_sp * g->sh.d_model;
  compute(g, MP_KERNEL_COPY, v, module, n, 0, 0, 1, 0.0, 2.0 * e * (double)n, MP_DTYPE_BF16);
}

static void fused_partials_sum(gen *g, int module) {
  const shapes *sh = &g->sh;
  if (!g->ms->dtensor_tp || !fused_region(g, module)) return;
  const int64_t n = sh->tokens * sh->d_model, out = sh->tokens_sp * sh->d_model;
  compute(g, MP_KERNEL_RESIDUAL, MP_VAR_FWD, module, n, 0, 0, 1, (double)n,
          act_comm_bytes(g) * (double)(n + out), MP_DTYPE_BF16);
}

/* Bytes an element of a float8 tensor Transformer Engine or torchao gathers over tp: 1;
 * NVFP4 gathers the row-wise and the column-wise copy, each with its scales
 * (_all_gather_nvfp4, transformer_engine/pytorch/distributed.py v2.9), so the cast before it
 * writes both. */
static double f8_gather_bytes(const gen *g) { return g->sh.fp8_recipe == MP_FP8_NVFP4 ? 2.0 * MP_NVFP4_BYTES : 1.0; }
static int f8_gather_copies(const gen *g) { return g->sh.fp8_recipe == MP_FP8_NVFP4 ? 2 : 1; }

/* Entering a region forward; with `f8` (f8_input) its input cast to float8 first and, under
 * SP, gathered in float8. */
void mp_sched_tp_region_in_fwd(gen *g, int on, int module, int f8) {
  const shapes *sh = &g->sh;
  if (!on) return;
  if (f8 && !te_norm_emits(g, module == MP_MOD_UP ? MP_MOD_GATE : module == MP_MOD_SHARED_UP ? MP_MOD_SHARED_GATE : module)) {
    amax_tp(g, module);
    cast_copies(g, module, sh->tokens_sp * sh->d_model, MP_VAR_FWD, f8_gather_copies(g));
  }
  if (!sh->sp) return;
  fused_shard_copy(g, module, f8 ? 1.0 : act_comm_bytes(g), MP_VAR_FWD);
  if (f8)
    comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, MP_STREAM_COMPUTE,
         (double)(sh->tokens * sh->d_model) * f8_gather_bytes(g), MP_DTYPE_FP8_E4M3, module);
  else
    tp_coll(g, MP_COLL_ALL_GATHER, module);
  if (!fused_region(g, module)) sp_cat(g, module, f8 ? 1.0 : act_comm_bytes(g), MP_VAR_FWD);
}

void mp_sched_tp_region_out_fwd(gen *g, int on, int module) {
  if (!on || (g->sh.sp && skipped(g, SKIP_RS))) return;
  if (!fused_region(g, module)) sp_cat(g, module, act_comm_bytes(g), MP_VAR_FWD);
  tp_coll(g, g->sh.sp ? MP_COLL_REDUCE_SCATTER : MP_COLL_ALL_REDUCE, module);
  fused_partials_sum(g, module);
}

void mp_sched_tp_region_out_bwd(gen *g, int on, int module) {
  const shapes *sh = &g->sh;
  if (!on || !sh->sp) return;
  if (f8_grad_out(g, module)) { /* cast on the rank's shard, gathered in float8 */
    amax_tp(g, module);
    cast_copies(g, module, sh->tokens_sp * sh->d_model, MP_VAR_BWD, f8_gather_copies(g));
    fused_shard_copy(g, module, 1.0, MP_VAR_BWD);
    comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, MP_STREAM_COMPUTE,
         (double)(sh->tokens * sh->d_model) * f8_gather_bytes(g), MP_DTYPE_FP8_E5M2, module);
    if (!fused_region(g, module)) sp_cat(g, module, 1.0, MP_VAR_BWD);
    return;
  }
  fused_shard_copy(g, module, act_comm_bytes(g), MP_VAR_BWD);
  tp_coll(g, MP_COLL_ALL_GATHER, module);
  if (fused_region(g, module)) sp_cat_wgrad(g, module, 0);
  else sp_cat(g, module, act_comm_bytes(g), MP_VAR_BWD);
}

void mp_sched_tp_region_in_bwd(gen *g, int on, int module) {
  if (!on) return;
  /* the region's gathered input, for its weight gradients (sp_cat_wgrad); the head's
   * input-gradient cat (eager: sp_cat) */
  sp_cat_wgrad(g, module, mp_sched_f8_input(g, module));
  if (module == MP_MOD_OUTPUT || module == MP_MOD_TOK_EMBEDDINGS)
    sp_cat(g, module, act_comm_bytes(g), MP_VAR_BWD);
  tp_coll(g, g->sh.sp ? MP_COLL_REDUCE_SCATTER : MP_COLL_ALL_REDUCE, module);
}

/* Transformer Engine's "bulk" overlaps under Megatron-Core's --tp-comm-overlap (the megatron
 * memory model, whose SP re-gathers the saved input): initialize_ub's default config runs
 * qkv_dgrad, qkv_wgrad, fc1_dgrad and fc1_wgrad by the "bulk" method (num_sm 16, cga_size 2,
 * set_sm_margin; transformer_engine/pytorch/module/base.py v2.2 to v2.8), and Megatron-Core
 * turns ub_bulk_dgrad and ub_bulk_wgrad on for TELayerNormColumnParallelLinear
 * (tp_comm_bulk_dgrad, tp_comm_bulk_wgrad default True; megatron/core/extensions/
 * transformer_engine.py core_v0.14.0). _LayerNormLinear.backward (layernorm_linear.py, and
 * layernorm_mlp.py's fc1 alike) then all-gathers the saved norm output beside the
 * input-gradient GEMM and reduce-scatters the input gradient beside the weight-gradient
 * GEMM; CommOverlapBase::bulk_overlap (common/comm_gemm_overlap/comm_gemm_overlap.cpp)
 * launches the collective on its communication stream, the GEMM on the SMs the collective
 * leaves (_math_sms), and makes the main stream wait for both. The q, k, v (gate, up) region
 * that opens with Megatron's linear_qkv (linear_fc1) is that Linear. */
static int bulk_tp(const gen *g, int module) {
  return async_tp(g) && g->ms->sp_regathers && (module == MP_MOD_Q || module == MP_MOD_UP);
}

/* Marks the TP collective of `kind` (all-gather or reduce-scatter) emitted since op `from`
 * and the GEMMs of variant v emitted since then as one fused pair. The patterns torch's
 * micro-pipeline pass fuses in a torchtitan block: the sequence all-gather into q, k, v
 * and into gate, up; o's and down's output into their reduce-scatter (forward, and the
 * recompute under AC); in backward the all-gather of o's and down's output gradient into
 * their input-gradient GEMMs. The reduce-scatters of the regions' input gradients are not
 * fused: each sums several GEMMs' outputs (q, k and v; gate and up) before it, and the
 * weight-gradient GEMMs take the gathered tensor transposed, which the pass does not
 * match. */
void mp_sched_fuse_tp(gen *g, int32_t from, mp_fuse kind, mp_variant v) {
  if (!async_tp(g)) return;
  const mp_coll c = kind == MP_FUSE_GATHER ? MP_COLL_ALL_GATHER : MP_COLL_REDUCE_SCATTER;
  int32_t coll = -1;
  for (int32_t i = from; i < g->n_ops && coll < 0; i++)
    if (g->ops[i].type == MP_OP_COMM && g->ops[i].group == MP_GROUP_TP && g->ops[i].coll == c &&
        g->ops[i].stream == MP_STREAM_COMPUTE)
      coll = i;
  if (coll < 0) return; /* none (a recompute that keeps the region's output) */
  g->ops[coll].fused = (uint8_t)kind;
  for (int32_t i = from; i < g->n_ops; i++) {
    mp_op *op = &g->ops[i];
    if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_GEMM && op->variant == v &&
        (kind == MP_FUSE_GATHER ? i > coll : i < coll))
      op->fused = (uint8_t)kind;
  }
}

/* Megatron-Core's flex dispatcher (MoEFlexTokenDispatcher, token_dispatcher.py,
 * core_v0.14.0 and core_v0.19.0, DeepEP and HybridEP backends alike) under expert tensor
 * parallelism: its communication group is the expert-TP x EP group (tp_ep_group,
 * parallel_state.py's _EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP, ranks "tp-ep" of the expert
 * grid), and _initialize_metadata expands each token's routing map from [tokens, E] to
 * [tokens, ep x etp, E / ep], replicated over the etp ranks of its expert's group (the
 * DeepEP manager built with num_experts etp x E and router_topk etp x top_k). So the
 * dispatch sends each token to every expert-TP rank of each expert it picked, and each rank
 * receives etp x its routed rows directly, the rows the all-to-all dispatcher's ETP
 * all-gather makes; the combine sums the etp row-parallel partial outputs as it returns
 * them, in place of the ETP reduce-scatter. Neither ETP collective is emitted. */
int mp_sched_flex_etp(const gen *g) {
  return g->sh.etp_rows > 1 && mp_moe_dispatch_by_node(g->p->opts.moe_dispatcher);
}

/* The slowest EP rank's all-to-all: its rows received (dispatch) or sent back (combine) are
 * its routed ones x its load (mp_sched_moe_rows: the imbalance, bounded or padded by the
 * capacity), and the collective ends when that rank's transfer does. to_experts: the
 * transfer toward the experts (the dispatch, and the backward's gradients into the experts'
 * down projections), which DeepSeek-V3's float8 dispatch sends as E4M3. */
void mp_sched_ep_alltoall(gen *g, int module, int to_experts) {
  const shapes *sh = &g->sh;
  if (sh->ep <= 1) return;
  double elems = (double)(sh->moe_tokens * sh->top_k * sh->d_model);
  if (mp_sched_flex_etp(g)) elems *= sh->etp_rows; /* a copy to each expert-TP rank */
  if (sh->moe_load != 1.0) elems *= sh->moe_load;
  if (to_experts && g->p->opts.moe_fp8_dispatch) {
    /* DeepSeek-V3 sec. 3.3.3: E4M3 with an fp32 scale per 1x128 tile */
    comm(g, MP_COLL_ALL_TO_ALL, MP_GROUP_EP, MP_STREAM_COMPUTE, elems * (1.0 + 4.0 / 128.0),
         MP_DTYPE_FP8_E4M3, module);
    return;
  }
  comm(g, MP_COLL_ALL_TO_ALL, MP_GROUP_EP, MP_STREAM_COMPUTE, act_comm_bytes(g) * elems, act_comm_dtype(g),
       module);
}

/* Megatron-Core's all-to-all dispatcher under expert tensor parallelism (tp_size = etp,
 * token_dispatcher.py, MoEAlltoAllTokenDispatcher, core_v0.14.0): after the all-to-all
 * over EP each rank of the expert-TP group holds the rows its own tokens sent, and
 * dispatch_postprocess all-gathers them over the group (gather_from_sequence_parallel_region
 * with the groups' split sizes) so each rank's slice of an expert runs every row the group
 * received; combine_preprocess reduce-scatters the row-parallel fc2's partial sums back
 * (reduce_scatter_to_sequence_parallel_region). Their backwards swap them: the output
 * gradient all-gathered before the experts' backward, the input gradient reduce-scattered
 * after. Payload: the gathered [etp x rows, H] tensor (the all-gather's output, the
 * reduce-scatter's input), x the slowest rank's load. */
void mp_sched_etp_coll(gen *g, int module, int gather) {
  const shapes *sh = &g->sh;
  if (sh->etp_rows <= 1 || mp_sched_flex_etp(g)) return;
  double elems = (double)(sh->moe_tokens * sh->top_k * sh->etp_rows * sh->d_model);
  if (sh->moe_load != 1.0) elems *= sh->moe_load;
  comm(g, gather ? MP_COLL_ALL_GATHER : MP_COLL_REDUCE_SCATTER, MP_GROUP_ETP, MP_STREAM_COMPUTE,
       act_comm_bytes(g) * elems, act_comm_dtype(g), module);
}

/* Megatron-LM's sequence parallelism saves a column-parallel region's input on the
 * sequence shard and all-gathers it again in backward for the weight gradients, the
 * gather overlapping the input-gradient GEMMs (Korthikanti et al. 2022, section 4.2.2):
 * the gather (on the gather stream, which Megatron's FSDP-free layout leaves free) and its
 * [T, H] buffer before the region's backward GEMMs; mg_regather_wait makes the region's
 * first weight gradient wait for it. Returns the gather, -1 where there is none. */
int32_t mp_sched_mg_regather(gen *g, int on, int module) {
  const shapes *sh = &g->sh;
  if (!(g->ms->sp_regathers && sh->sp && on)) return -1;
  /* Transformer Engine saves and re-gathers a float8 Linear's input in float8 */
  const int f8 = sh->fp8_te && sh->fp8[module];
  pair(g, MP_MEM_TEMP, BUF_SP_GATHER, (f8 ? 1 : 2) * sh->tokens * sh->d_model, 1);
  /* a bulk overlap's (bulk_tp): on the compute stream, which waits for it where the
   * input-gradient GEMMs beside it end (sim/cost.c prices the pair; mp_sched_bulk_tp) */
  const int bulk = bulk_tp(g, module);
  const int32_t i = comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, bulk ? MP_STREAM_COMPUTE : MP_STREAM_GATHER,
                         (f8 ? 1.0 : 2.0) * (double)(sh->tokens * sh->d_model),
                         f8 ? MP_DTYPE_FP8_E4M3 : MP_DTYPE_BF16, module);
  if (!bulk) add_dep(g, i, g->last_compute, 0);
  return i;
}

/* Marks a qkv or fc1 region's bulk overlaps (bulk_tp): the re-gather emitted since op
 * `from` (mp_sched_mg_regather) with the region's input-gradient GEMMs after it, and the
 * input gradient's reduce-scatter (mp_sched_tp_region_in_bwd, last) with the region's
 * weight-gradient GEMMs before it; the simulator runs each collective beside its GEMMs on
 * the SMs the stack's userbuffers leave (sim/cost.c, price_bulk). */
void mp_sched_bulk_tp(gen *g, int32_t from, int module) {
  if (!bulk_tp(g, module)) return;
  int32_t ag = -1, rs = -1;
  for (int32_t i = from; i < g->n_ops; i++) {
    const mp_op *op = &g->ops[i];
    if (op->type != MP_OP_COMM || op->group != MP_GROUP_TP || op->stream != MP_STREAM_COMPUTE) continue;
    if (op->coll == MP_COLL_ALL_GATHER && ag < 0) ag = i;
    if (op->coll == MP_COLL_REDUCE_SCATTER) rs = i;
  }
  if (ag < 0 || rs < 0) return;
  g->ops[ag].fused = g->ops[rs].fused = MP_FUSE_BULK;
  for (int32_t i = ag + 1; i < rs; i++) {
    mp_op *op = &g->ops[i];
    if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_GEMM) op->fused = MP_FUSE_BULK;
  }
}

void mp_sched_mg_regather_wait(gen *g, int32_t gather, int32_t first_op) {
  if (gather < 0) return;
  for (int32_t i = first_op; i < g->n_ops; i++)
    if (g->ops[i].type == MP_OP_COMPUTE && g->ops[i].kernel == MP_KERNEL_GEMM &&
        g->ops[i].variant == MP_VAR_WGRAD) {
      add_dep(g, i, gather, 0);
      break;
    }
  const int f8 = g->ops[gather].dtype == MP_DTYPE_FP8_E4M3;
  pair(g, MP_MEM_TEMP, BUF_SP_GATHER, (f8 ? 1 : 2) * g->sh.tokens * g->sh.d_model, 0);
}

/* Transformer Engine's delayed scaling: as a model chunk's forward (backward) pass ends,
 * the amaxes its float8 Linears recorded (input and weight; output gradient) are reduced in
 * one all-reduce over the amax-reduction group (Megatron-Core's data-parallel x context x
 * tensor group; priced on the data-parallel x context group, the larger), fp32 each, on the
 * compute stream (fp8_autocast's reduce_amax); over the TP group alone under amax_tp (when
 * and why a run reduces so: exec/plan_fp8.h), none at TP 1. `blocks`: the chunk's blocks. */
void mp_sched_f8_amax_reduce(gen *g, int32_t blocks, int backward) {
  const shapes *sh = &g->sh;
  if (!sh->fp8_te || sh->fp8_recipe != MP_FP8_DELAYED || blocks <= 0) return;
  int n = 0;
  for (int m = 0; m < MP_MOD_COUNT; m++) n += sh->fp8[m] != 0;
  if (n == 0) return;
  const double bytes = 4.0 * (backward ? 1 : 2) * n * (double)blocks;
  const mp_group grp = sh->fp8_amax_tp ? MP_GROUP_TP : MP_GROUP_DP_CP;
  if (sh->fp8_amax_tp && mp_mesh_group_size(&g->p->mesh, grp) < 2) return;
  comm(g, MP_COLL_ALL_REDUCE, grp, MP_STREAM_COMPUTE, bytes, MP_DTYPE_FP32, -1);
}

/* --fp8-param-gather's weight refresh after the optimizer step (Megatron-Core's
 * quantize_param_shard into Transformer Engine's cast_master_weights_to_fp8, transformer_engine/
 * pytorch/tensor/utils.py v2.6) on the rank's `elems` float8 elements of `tensors` weights,
 * after the fp32 masters were copied to the model dtype (the copy the caller prices: TE casts
 * the master to the weight's bf16 dtype first): the current and blockwise recipes compute the
 * shard's amax (tex.compute_amax, fp8_block_scaling_compute_partial_amax: 2 bytes read), every
 * recipe all-reduces the amaxes (MAX) over the data-parallel group `grp` (an fp32 a tensor of
 * `tensors`, a 128 x 128 block's of the `whole` weights' under blockwise) and casts the shard into the float8 weight (read 2,
 * write 1; update_quantized, or blockwise's partial cast with an fp32 scale per 128 x 128). */
void mp_sched_f8_weight_refresh(gen *g, int64_t elems, int64_t whole, int64_t tensors, mp_group grp) {
  if (elems <= 0) return;
  const mp_fp8_recipe r = g->sh.fp8_recipe;
  const double amax = r == MP_FP8_DELAYED ? 0.0 : 2.0;
  const double scales = r == MP_FP8_BLOCKWISE ? 4.0 / 16384.0 : 0.0;
  compute(g, MP_KERNEL_FP8_CAST, MP_VAR_FWD, -1, elems, 0, 0, 1, FLOPS_CAST * (double)elems,
          (amax + 3.0 + scales) * (double)elems, MP_DTYPE_BF16);
  const double n = r == MP_FP8_BLOCKWISE ? ceil((double)whole / 16384.0) : (double)tensors;
  if (mp_mesh_group_size(&g->p->mesh, grp) > 1 && n > 0)
    comm(g, MP_COLL_ALL_REDUCE, grp, MP_STREAM_COMPUTE, 4.0 * n, MP_DTYPE_FP32, -1);
}

/* ---- norms and residual adds (a block's, the head's) ---------------------------------- */

void mp_sched_norm_fwd(gen *g, int module, int64_t rows, int64_t width) {
  if (skipped(g, SKIP_MOD(module))) return;
  const int64_t e = rows * width;
  elementwise(g, MP_KERNEL_NORM, MP_VAR_FWD, module, e, FLOPS_NORM_FWD, 4.0 * (double)e);
}

void mp_sched_norm_bwd(gen *g, int module, int64_t rows, int64_t width) {
  const int64_t e = rows * width;
  elementwise(g, MP_KERNEL_NORM, MP_VAR_BWD, module, e, FLOPS_NORM_BWD, 6.0 * (double)e);
}

void mp_sched_residual(gen *g, mp_variant v, int64_t elems) {
  if (skipped(g, SKIP_RESIDUAL)) return;
  elementwise(g, MP_KERNEL_RESIDUAL, v, -1, elems, 1.0, 6.0 * (double)elems);
}
