/* Pass 3: float8 training (torchao's Float8Linear as torchtitan applies it, or Transformer
 * Engine's float8 Linears under Megatron-LM): Linear layers run their GEMMs in E4M3 forward
 * and E5M2 backward (MXFP8: E4M3 throughout, as Transformer Engine's MXFP8BlockScaling and
 * torchao's MX recipes default) with the plan's recipe of scales (exec/plan.h,
 * mp_fp8_recipe); master weights stay in their dtype (bf16 gathered, fp32 at rest).
 *
 * Excluded, as torchtitan's filter does: FQNs containing "experts", "shared_expert" or
 * "router" (MoE GEMMs are grouped, not Float8Linear), the output head ("output"), the
 * embeddings (a lookup, not a GEMM), and any Linear whose GEMM dims are not multiples of
 * the recipe's tile (exec/rules.h, mp_rule_fp8_multiple: 16, 32 for MXFP8, 128 for
 * blockwise). The dims checked are the rank's tp-local ones, which are the GEMM the rank
 * actually runs (a routed expert's [out, in] behind its expert dim).
 * The routed experts run float8 under torchtitan when the plan's scope asks
 * (mp_float8_options.scope: torchtitan's quantize.grouped_mm.float8 / .mx with fqns
 * ["experts"], torchtitan/components/quantization/float8.py and mx.py), priced as the
 * Linears' casts and GEMMs batched over the rank's experts (exec/schedule_ops.c).
 * Under Megatron-Core (the megatron memory model) the routed experts and the shared expert
 * run in float8 too: TEGroupedMLP's linear_fc1/linear_fc2 are Transformer Engine
 * GroupedLinear modules and SharedExpertMLP is built of TE Linears, all inside
 * fp8_autocast (megatron/core/transformer/moe/experts.py, shared_experts.py; Transformer
 * Engine transformer_engine/pytorch/module/grouped_linear.py), as DeepSeek-V3 ran its
 * expert GEMMs in float8 (arXiv 2412.19437, sec. 3.3); its router (TopKRouter's gating
 * GEMM, fp32 or bf16) and output layer (ColumnParallelLinear, not TE) stay excluded.
 *
 * Refused: a recipe the plan's runtime does not run (mp_rule_fp8_recipe_check); float8
 * all-gather with TP (tp > 1): torchtitan only supports FSDP's float8 all-gather on weights
 * that TP has not sharded; and the order rules (after FSDP). */
#include <stdio.h>
#include <string.h>

#include "exec/plan.h"
#include "exec/rules.h"

/* torchtitan's name filter, decided on the module kind: the FQNs containing "shared_expert"
 * or "router" are exactly those of the shared expert and the router (see mp_module_name),
 * plus the output head; the routed experts' are scoped's. */
static int excluded_by_name(const mp_param *prm, mp_mem_model mm) {
  switch (prm->module) {
    case MP_MOD_ROUTER:
    case MP_MOD_OUTPUT: return 1;
    case MP_MOD_SHARED_GATE:
    case MP_MOD_SHARED_UP:
    case MP_MOD_SHARED_DOWN: return !mp_rule_fp8_experts(mm);
    default: return 0;
  }
}

static int routed_expert(const mp_param *prm) {
  return prm->ndim == 3 && (prm->module == MP_MOD_EXPERTS_GATE || prm->module == MP_MOD_EXPERTS_UP ||
                            prm->module == MP_MOD_EXPERTS_DOWN);
}

/* Whether the pass runs parameter prm's GEMMs in float8 by name and scope. Megatron-Core:
 * every Linear and the routed experts (TEGroupedMLP). torchtitan: the 2-d Linears under
 * quantize.linear.* (scope linears or all), the routed experts' 3-d weights under
 * quantize.grouped_mm.* with fqns ["experts"] (scope experts or all): torchao's
 * MoETrainingConfig swaps the parameters of the modules whose FQN matches for
 * ScaledGroupedMMTensor, which only reroutes torch._grouped_mm (torchao
 * prototype/moe_training/tensor.py); the shared expert's nn.Linear weights, although its
 * FQN holds "experts", are 2-d and run F.linear in bf16. */
static int scoped(const mp_param *prm, mp_mem_model mm, mp_fp8_scope scope) {
  if (excluded_by_name(prm, mm)) return 0;
  if (mp_rule_fp8_experts(mm)) return prm->ndim == 2 || prm->ndim == 3;
  if (routed_expert(prm)) return scope != MP_FP8_SCOPE_LINEARS;
  if (prm->module == MP_MOD_EXPERTS_GATE || prm->module == MP_MOD_EXPERTS_UP || prm->module == MP_MOD_EXPERTS_DOWN)
    return 0;
  return prm->ndim == 2 && scope != MP_FP8_SCOPE_EXPERTS;
}

/* torchao's float8 grouped GEMMs (prototype/moe_training/scaled_grouped_mm.py,
 * _scaled_grouped_mm): rowwise float8 (_Float8GroupedMM, E4M3 with per-row scales, cuBLAS
 * or FBGEMM's grouped kernel, Hopper and later) or MXFP8 (_MXFP8GroupedMM, Blackwell); a
 * torchtitan stack only (Megatron-Core's experts are float8 with its Linears). */
static mp_status scope_check(mp_ctx *ctx, const mp_plan *p, const mp_float8_options *o) {
  if (o->scope == MP_FP8_SCOPE_LINEARS) return MP_OK;
  if (p->opts.mem_model == MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-scope %s is torchtitan's (torchao's grouped GEMMs); Megatron-Core runs its routed "
                    "experts in float8 with its Linears: drop --fp8-scope",
                    o->scope == MP_FP8_SCOPE_ALL ? "all" : "experts");
  if (o->recipe != MP_FP8_ROWWISE && o->recipe != MP_FP8_MXFP8)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-scope with recipe %s: torchao's float8 grouped GEMMs scale rowwise "
                    "(_Float8GroupedMM) or in MXFP8 blocks (_MXFP8GroupedMM): choose --fp8 rowwise or mxfp8",
                    mp_fp8_recipe_name(o->recipe));
  if (o->all_gather)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-scope with --fp8-all-gather: torchao's grouped GEMMs gather their weights in bf16; "
                    "drop one of them");
  return MP_OK;
}

/* A Linear's GEMM dims [out, in] on the rank: a routed expert's behind its expert dim. */
static int dims_ok(const mp_param *prm, mp_fp8_recipe r) {
  const int e = prm->ndim == 3;
  return mp_rule_fp8_linear_ok(prm->tp_shape[e], prm->tp_shape[e + 1], r);
}

/* Megatron-Core's --fp8-param-gather (core_v0.14.0) as meshplan prices it: Transformer
 * Engine's float8 model weights (fp8_model_init; TransformerConfig.fp8_param) under the
 * distributed optimizer or Megatron FSDP, which megatron/training/arguments.py requires
 * ("--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron
 * fsdp"); under the delayed, current (tensorwise) and blockwise recipes, whose weights
 * Transformer Engine's cast_master_weights_to_fp8 refreshes from the masters
 * (transformer_engine/pytorch/tensor/utils.py, v2.6). MXFP8 weights take another path, the
 * one Megatron-Bridge's bf16_with_mxfp8_mixed turns on with reuse_grad_buf_for_mxfp8_param_ag
 * (megatron/core/distributed/param_and_grad_buffer.py and distrib_optimizer.py
 * _copy_main_params_to_param_buffer, core_v0.14.0 to core_v0.16.0): the masters copied to
 * bf16 into a buffer shared with the gradients, gathered in bf16, and quantized into the
 * MXFP8 weights after the gather (shapes.fp8_param_gather_bf16, schedule_prep.c); meshplan
 * prices it under the distributed optimizer only (Megatron FSDP runs its own MXFP8 buffers:
 * megatron_fsdp/param_and_grad_buffer.py, and core_v0.16.0's arguments.py turns the shared
 * buffer off under it). Without the flag the distributed optimizer would map MXFP8 weights
 * onto its buffer through Transformer Engine's replace_raw_data, which raises
 * NotImplementedError for MXFP8Tensor from v2.2 through v2.18 (tensor/utils.py;
 * cast_master_weights_to_fp8 casts MXFP8 from v2.11), so the flag's path is the one that
 * runs. */
static mp_status param_gather_check(mp_ctx *ctx, const mp_plan *p, mp_fp8_recipe r) {
  if (p->opts.mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-param-gather is Megatron-Core's (Transformer Engine's float8 weights); the %s "
                    "memory model keeps bf16 weights: drop it or use a megatron stack",
                    mp_mem_model_name(p->opts.mem_model));
  if (r == MP_FP8_NVFP4)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-param-gather with the nvfp4 recipe: Megatron-Core keeps NVFP4 model weights "
                    "under its own --fp4-param-gather, which meshplan does not price; drop "
                    "--fp8-param-gather");
  if (p->opts.dp == MP_DP_DDP && !p->opts.ddp.shard_optimizer)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-param-gather is only supported with the distributed optimizer or Megatron "
                    "FSDP (Megatron-Core's arguments.py); turn on the distributed optimizer or drop it");
  if (r == MP_FP8_MXFP8 && mp_plan_is_megatron_fsdp(p))
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-param-gather with the mxfp8 recipe is priced under the distributed optimizer "
                    "(MXFP8 weights gathered in bf16 through the gradient buffer, "
                    "reuse_grad_buf_for_mxfp8_param_ag); Megatron FSDP's MXFP8 buffers are not priced: "
                    "use dp_replicate with the distributed optimizer, or drop --fp8-param-gather");
  return MP_OK;
}

/* Transformer Engine's float8 dot-product attention (Megatron-Core's
 * --fp8-dot-product-attention, TransformerConfig.fp8_dot_product_attention) as meshplan prices
 * it: Transformer Engine's fused attention (a megatron stack), and on a GPU whose attention
 * states its exponentials apart (attention_exp), which the price of cuDNN's FP8 kernels
 * builds on (sim/cluster.c, mp_attn_fp8_flops): Blackwell (compute capability 10.x), where
 * cudnn-frontend's SDPA training benchmark publishes FP8 figures beside the bf16 ones on the
 * GB200 and GB300; without context parallelism. Hopper's FP8 attention is not priced. */
static mp_status dpa_check(mp_ctx *ctx, const mp_plan *p, const mp_float8_options *o) {
  if (p->opts.mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-dpa is Transformer Engine's float8 attention (Megatron-Core's "
                    "--fp8-dot-product-attention); the %s stack does not run it: use a megatron stack",
                    mp_mem_model_name(p->opts.mem_model));
  if (o->gpu_cc < 100)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-dpa is priced from cuDNN's FP8 attention on Blackwell (cudnn-frontend's SDPA "
                    "benchmark, GB200 and GB300); not priced on compute capability %d: drop --fp8-dpa",
                    o->gpu_cc);
  if (p->mesh.size[MP_DIM_CP] > 1)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-dpa with cp %d: the ring attention's per-step kernels are not priced in FP8; "
                    "drop --fp8-dpa or use cp 1", p->mesh.size[MP_DIM_CP]);
  if (p->opts.attn == MP_ATTN_MATERIALIZED)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-dpa runs cuDNN's fused FP8 attention; the materialized attention has none: "
                    "drop one of them");
  return MP_OK;
}

mp_status mp_apply_float8(mp_ctx *ctx, mp_plan *p, const mp_float8_options *o) {
  if (p->applied & MP_PASS_FSDP)
    return mp_error(ctx, MP_ERR_ORDER,
                    "Float8 after FSDP: FSDP has already replaced the Linear weights by sharded "
                    "parameters, so the float8 swap would miss them (and float8 all-gather "
                    "would not hook into FSDP); the run would train in bf16 while the plan says "
                    "float8; apply Float8 before FSDP");
  MP_CHECK(mp_plan_check_pass(ctx, p, MP_PASS_FLOAT8));
  mp_float8_options f = {0};
  if (o != NULL) f = *o;
  f.recipe = mp_fp8_recipe_of(f.recipe, p->opts.mem_model);
  MP_CHECK(mp_rule_fp8_recipe_check(ctx, p->opts.mem_model, f.recipe, f.all_gather));
  if (f.param_gather) MP_CHECK(param_gather_check(ctx, p, f.recipe));
  if (f.dpa) MP_CHECK(dpa_check(ctx, p, &f));
  MP_CHECK(scope_check(ctx, p, &f));
  if (f.amax_tp && (p->opts.mem_model != MP_MEM_MODEL_MEGATRON || f.recipe != MP_FP8_DELAYED))
    return mp_error(ctx, MP_ERR_INVALID,
                    "--fp8-amax-tp-only is Transformer Engine's delayed scaling under "
                    "NVTE_DP_AMAX_REDUCE_INTERVAL=0 (v0.13 to v1.5): it needs --fp8 delayed on a megatron stack");
  o = &f;
  /* With TP the float8 all-gather gathers the float8 casts of TP-sharded weights: torchao's
   * precompute_float8_dynamic_scale_for_fsdp (torchao/float8/fsdp_utils.py) takes each
   * weight's amax over its whole DTensor, the FSDP and TP shards, in one all-reduce (the scale
   * is the tensor's, not a shard's), and its FSDP2 x TP test runs it
   * (test/float8/test_fsdp2_tp.py, Float8ColwiseParallel / Float8RowwiseParallel with
   * enable_fsdp_float8_all_gather); torchtitan's Llama 3 405B config runs it at TP 8. */
  int n_fp8 = 0, n_dims = 0;
  const mp_param *first_dims = NULL;
  for (int i = 0; i < p->n_params; i++) {
    mp_param *prm = &p->params[i];
    if (!prm->is_linear || !scoped(prm, p->opts.mem_model, o->scope)) continue;
    if (!dims_ok(prm, o->recipe)) {
      if (n_dims++ == 0) first_dims = prm;
      continue;
    }
    prm->float8 = 1;
    n_fp8++;
  }
  p->opts.fp8 = 1;
  p->opts.fp8_opts = *o;
  mp_plan_note(p,
               "Float8: %d Linear layers in float8 (%s, %s); %s excluded%s",
               n_fp8,
               o->recipe == MP_FP8_NVFP4   ? "E2M1 forward and backward, fprop, dgrad and wgrad"
               : o->recipe == MP_FP8_MXFP8 ? "E4M3 forward and backward"
                                           : "E4M3 forward, E5M2 backward",
               mp_fp8_recipe_words(o->recipe),
               mp_rule_fp8_experts(p->opts.mem_model) ? "router, output and embeddings"
               : o->scope == MP_FP8_SCOPE_EXPERTS     ? "all but the routed experts' grouped GEMMs"
               : o->scope == MP_FP8_SCOPE_ALL ? "shared_expert, router, output and embeddings"
                                              : "experts, shared_expert, router, output and embeddings",
               o->all_gather    ? "; FSDP all-gathers float8 weights"
               : o->param_gather && o->recipe == MP_FP8_MXFP8
                   ? "; MXFP8 model weights, gathered in bf16 through the gradient buffer (--fp8-param-gather)"
               : o->param_gather ? "; float8 model weights, gathered in float8 (--fp8-param-gather)"
               : o->recipe == MP_FP8_NVFP4 && o->nvfp4_no_rht ? "; no random Hadamard transform (NVTE_NVFP4_DISABLE_RHT)"
                                 : "");
  if (n_dims > 0)
    mp_plan_note(p,
                 "Float8: %d Linear layers left in bf16: dims not multiples of %d (e.g. %s, "
                 "[%lld, %lld] on each rank)",
                 n_dims, mp_rule_fp8_multiple(o->recipe), first_dims->module_fqn,
                 (long long)first_dims->tp_shape[0], (long long)first_dims->tp_shape[1]);
  if (o->dpa)
    mp_plan_note(p, "Float8: attention in cuDNN's FP8 fused kernels (--fp8-dpa), q, k, v and the output "
                    "gradient cast to float8 per tensor (current scaling), the outputs in bf16");
  mp_plan_mark_applied(p, MP_PASS_FLOAT8);
  return MP_OK;
}

mp_fp8_recipe mp_fp8_recipe_of(mp_fp8_recipe r, mp_mem_model mm) {
  if (r != MP_FP8_DEFAULT) return r;
  return mm == MP_MEM_MODEL_MEGATRON ? MP_FP8_DELAYED : MP_FP8_TENSORWISE;
}

mp_status mp_plan_fp8_linears(mp_ctx *ctx, const mp_model *m, int tp, mp_fp8_recipe recipe, int *n_fp8) {
  *n_fp8 = 0;
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mesh.size[MP_DIM_TP] = tp;
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.fp8 = 1;
  /* the dims rule only: under a runtime that runs the recipe */
  o.fp8_opts.recipe = recipe == MP_FP8_DEFAULT ? MP_FP8_TENSORWISE : recipe;
  o.mem_model = mp_rule_fp8_recipe_ok(MP_MEM_MODEL_TORCHTITAN, o.fp8_opts.recipe) ? MP_MEM_MODEL_TORCHTITAN
                                                                                 : MP_MEM_MODEL_MEGATRON;
  o.tp.pad_vocab = 1;
  o.sp = 0;
  mp_plan *p = NULL;
  MP_CHECK(mp_build_plan(ctx, m, &mesh, &o, &p));
  for (int i = 0; i < p->n_params; i++) *n_fp8 += p->params[i].float8;
  mp_plan_destroy(p);
  return MP_OK;
}

/* The gradient reduction dtype: fp32 or bf16. FSDP's: fp32 (torchtitan's
 * mixed_precision_reduce) or bf16 (FSDP1's MixedPrecision(reduce_dtype=torch.bfloat16), IBM's
 * fms-fsdp policies/mixed_precision.py bfSixteen). Megatron's main_grad buffers: fp32 by
 * default with --bf16 (core_v0.14.0 megatron/training/arguments.py sets
 * accumulate_allreduce_grads_in_fp32 unless --grad-reduce-in-bf16, which training.py passes
 * on as DistributedDataParallelConfig.grad_reduce_in_fp32), bf16 with --grad-reduce-in-bf16
 * (NeMo's DistributedDataParallelConfig(grad_reduce_in_fp32=False), as NVIDIA's MLPerf
 * Training v5.0 Llama 3.1 405B pretrain.py sets it). The meshplan runtimes reduce fp32 slots. */
static mp_status reduce_dtype_check(mp_ctx *ctx, const mp_plan_options *o) {
  const mp_dtype r = o->fsdp.reduce_dtype;
  if (r != MP_DTYPE_FP32 && r != MP_DTYPE_BF16 && !mp_mem_model_is_runtime(o->mem_model))
    return mp_error(ctx, MP_ERR_INVALID, "gradients reduced in %s: choose fp32 or bf16", mp_dtype_name(r));
  if (r == MP_DTYPE_BF16 && mp_mem_model_is_runtime(o->mem_model))
    return mp_error(ctx, MP_ERR_INVALID,
                    "bf16 gradient reduction: the %s memory model (the meshplan runtime) reduces in "
                    "fp32: drop --fsdp-reduce-dtype bf16 or use a torchtitan or megatron stack",
                    mp_mem_model_name(o->mem_model));
  return MP_OK;
}

/* DeepSeek-V3's low-precision storage (arXiv 2412.19437, sec. 3.3.3) is priced where its
 * mechanism lives: the activation cache in the megatron model's saved lists under the
 * blockwise recipe whose 1x128 tiles it reuses, bf16 moments in the autograd runtimes'
 * optimizer state (the meshplan runtimes keep theirs in fp32). */
mp_status mp_plan_storage_check(mp_ctx *ctx, const mp_plan_options *o) {
  if (o->fp8_act_cache &&
      (!o->fp8 || mp_fp8_recipe_of(o->fp8_opts.recipe, o->mem_model) != MP_FP8_BLOCKWISE ||
       o->mem_model != MP_MEM_MODEL_MEGATRON))
    return mp_error(ctx, MP_ERR_INVALID,
                    "the float8 activation cache keeps the Linears' saved inputs in the blockwise "
                    "recipe's 1x128 tiles (DeepSeek-V3 sec. 3.3.3); here fp8 %s, the %s memory model: "
                    "it needs --fp8 blockwise under stack megatron-core, or drop it",
                    o->fp8 ? "on" : "off", mp_mem_model_name(o->mem_model));
  if (o->moment_dtype != MP_DTYPE_FP32 && o->moment_dtype != MP_DTYPE_BF16)
    return mp_error(ctx, MP_ERR_INVALID, "AdamW moments in %s: choose fp32 or bf16",
                    mp_dtype_name(o->moment_dtype));
  if (o->moment_dtype == MP_DTYPE_BF16 && mp_mem_model_is_runtime(o->mem_model))
    return mp_error(ctx, MP_ERR_INVALID,
                    "bf16 AdamW moments: the %s memory model (the meshplan runtime) keeps them in fp32; "
                    "drop --optimizer-moments bf16 or use a megatron or torchtitan stack",
                    mp_mem_model_name(o->mem_model));
  return reduce_dtype_check(ctx, o);
}
