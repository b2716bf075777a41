/* A plan as Megatron-LM core_v0.14.0's pretrain_gpt.py arguments (app/emit.h), one flag a
 * line after the header's comments: `pretrain_gpt.py $(grep -v '^#' FILE)` passes them.
 *
 * Flags and their meaning from NVIDIA/Megatron-LM tag core_v0.14.0 (23e00ed0),
 * megatron/training/arguments.py. The model's shape is written whole, so the reader
 * (app/from_config.c) finds the model again; the switches meshplan's megatron stacks price
 * (the distributed optimizer, the overlapped gradient reduction and parameter gather, TP
 * communication overlap, the attention kernel) are written as the plan's stack ran them. */
#include <stdio.h>
#include <string.h>

#include "app/emit_internal.h"

/* --moe-layer-freq as Megatron-LM's pattern expression (arguments.py moe_freq_type: a
 * Python list expression, 1 an expert layer), run-length encoded: "([0]*3+[1]*58)". Written
 * unquoted: the launch line passes the file's words as they are, without quote removal. */
static void write_moe_layers(const mp_model *m, mp_emit_buf *b) {
  mp_emit_printf(b, "--moe-layer-freq (");
  for (int64_t l = 0; l < m->n_layers;) {
    int64_t r = l;
    while (r < m->n_layers && m->moe_layer[r] == m->moe_layer[l]) r++;
    mp_emit_printf(b, "%s[%d]*%lld", l ? "+" : "", m->moe_layer[l] ? 1 : 0, (long long)(r - l));
    l = r;
  }
  mp_emit_printf(b, ")\n");
}

/* The experts (megatron/core/transformer/moe/, core_v0.14.0): Megatron-LM's router with
 * --moe-router-pre-softmax off takes the softmax over the top-k logits, which is meshplan's
 * softmax renormalised over the top k (norm_topk_prob); with it on, the top k of the full
 * softmax unrenormalised. Its aux loss (moe_utils.switch_load_balancing_loss_func) divides
 * each expert's token count by top_k x tokens where meshplan's (kernels/cpu/router.c, the
 * Mixtral form) divides by tokens: the same loss takes coefficient aux_loss_coef x top_k. */
static void write_moe(const mp_model *m, mp_emit_buf *b) {
  mp_emit_printf(b, "--num-experts %lld\n--moe-ffn-hidden-size %lld\n--moe-router-topk %lld\n",
                 (long long)m->n_experts, (long long)m->d_ff_expert, (long long)m->top_k);
  if (m->n_shared_experts > 0)
    mp_emit_printf(b, "--moe-shared-expert-intermediate-size %lld\n", (long long)m->d_ff_shared);
  if (mp_model_n_moe_layers(m) != m->n_layers) write_moe_layers(m, b);
  if (!m->norm_topk_prob) mp_emit_printf(b, "--moe-router-pre-softmax\n");
  if (m->n_group > 0)
    mp_emit_printf(b, "--moe-router-num-groups %lld\n--moe-router-group-topk %lld\n", (long long)m->n_group,
                   (long long)m->topk_group);
  mp_emit_printf(b, "--moe-router-load-balancing-type aux_loss\n--moe-aux-loss-coeff %g\n--moe-grouped-gemm\n",
                 m->aux_loss_coef * (double)m->top_k);
}

/* Multi-head latent attention (--multi-latent-attention, megatron/core/transformer/
 * multi_latent_attention.py): the latent ranks and the head parts; no --q-lora-rank is
 * q_proj. meshplan's RoPE is unscaled, where Megatron-LM's MLA defaults to YaRN. */
static void write_mla(const mp_model *m, mp_emit_buf *b) {
  mp_emit_printf(b, "--multi-latent-attention\n--rope-type rope\n"); /* not YaRN, MLA's default */
  if (m->q_lora_rank > 0) mp_emit_printf(b, "--q-lora-rank %lld\n", (long long)m->q_lora_rank);
  mp_emit_printf(b, "--kv-lora-rank %lld\n--qk-head-dim %lld\n--qk-pos-emb-head-dim %lld\n--v-head-dim %lld\n",
                 (long long)m->kv_lora_rank, (long long)m->qk_nope_head_dim, (long long)m->qk_rope_head_dim,
                 (long long)m->v_head_dim);
}

/* The model's shape as GPT flags; models Megatron-LM's GPT cannot take as meshplan
 * describes them are refused. */
static mp_status write_model(mp_ctx *ctx, const mp_model *m, mp_emit_buf *b) {
  /* a hybrid model is Megatron-LM's pretrain_mamba.py with --hybrid-override-pattern, not GPT */
  const char *no = mp_model_is_hybrid(m)                  ? "Mamba-2 layers (a hybrid_override_pattern)"
                   : m->sliding_window > 0                  ? "sliding-window attention"
                   : m->attn_chunk > 0                     ? "chunked attention"
                   : m->bias && m->family != MP_FAMILY_GPT ? "biases in a llama-family model"
                                                           : NULL;
  if (no)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: %s has %s, which meshplan does not write as Megatron-LM "
                    "arguments; emit torchtitan or plan a dense model", m->name, no);
  mp_emit_printf(b, "--num-layers %lld\n--hidden-size %lld\n--ffn-hidden-size %lld\n--num-attention-heads %lld\n",
                 (long long)m->n_layers, (long long)m->d_model, (long long)m->d_ff, (long long)m->n_heads);
  if (m->n_kv_heads != m->n_heads)
    mp_emit_printf(b, "--group-query-attention\n--num-query-groups %lld\n", (long long)m->n_kv_heads);
  if (mp_model_is_mla(m)) write_mla(m, b);
  else if (m->head_dim * m->n_heads != m->d_model) mp_emit_printf(b, "--kv-channels %lld\n", (long long)m->head_dim);
  if (mp_model_is_moe(m)) write_moe(m, b);
  mp_emit_printf(b, "--max-position-embeddings %lld\n--vocab-size %lld\n", (long long)m->max_seq, (long long)m->vocab);
  /* Megatron-LM's MLP is GELU unless --swiglu or --squared-relu (arguments.py, core_v0.14.0) */
  if (m->family == MP_FAMILY_LLAMA)
    mp_emit_printf(b, "--position-embedding-type rope\n--rotary-base %lld\n%s--normalization %s\n"
                   "--disable-bias-linear\n", (long long)m->rope_theta,
                   mp_model_mlp(m) == MP_MLP_SWIGLU         ? "--swiglu\n"
                   : mp_model_mlp(m) == MP_MLP_SQUARED_RELU ? "--squared-relu\n"
                                                            : "",
                   mp_model_norm(m) == MP_NORM_LAYER ? "LayerNorm" : "RMSNorm");
  else
    mp_emit_printf(b, "--position-embedding-type learned_absolute\n--normalization LayerNorm\n");
  mp_emit_printf(b, "--norm-epsilon %g\n", m->norm_eps);
  if (m->qkv_bias) mp_emit_printf(b, "--add-qkv-bias\n");
  if (m->qk_norm) mp_emit_printf(b, "--qk-layernorm\n");
  if (!m->tied_embeddings) mp_emit_printf(b, "--untie-embeddings-and-output-weights\n");
  if (m->mtp_layers > 0) mp_emit_printf(b, "--mtp-num-layers %lld\n", (long long)m->mtp_layers);
  return MP_OK;
}

/* --recompute-*: selective-core is Megatron's selective recompute of core_attn, beside which
 * (or alone) the plan's other recompute modules (layernorm, mla_up_proj, moe_act, mlp, moe,
 * shared_experts) are listed; full is every layer's input kept and the layer recomputed (uniform, one layer a
 * group), or the plan's recompute method and count. */
static mp_status write_ac(mp_ctx *ctx, const mp_plan_options *o, mp_emit_buf *b) {
  char mods[64];
  mp_recompute_modules_format(o->recompute_modules, mods, sizeof mods);
  if (o->ac == MP_AC_NONE && !mods[0]) return MP_OK;
  if (o->ac == MP_AC_NONE || o->ac == MP_AC_SELECTIVE_CORE) {
    const int core = o->ac == MP_AC_SELECTIVE_CORE;
    mp_emit_printf(b, "--recompute-granularity selective\n--recompute-modules %s%s%s\n", core ? "core_attn" : "",
                   core && mods[0] ? " " : "", mods);
    return MP_OK;
  }
  if (o->ac == MP_AC_FULL && o->ac_every <= 1 && !mods[0]) {
    const int method = o->recompute_method != MP_RECOMPUTE_NONE;
    mp_emit_printf(b, "--recompute-granularity full\n--recompute-method %s\n--recompute-num-layers %d\n",
                   method ? mp_recompute_method_name(o->recompute_method) : "uniform",
                   method ? o->recompute_num_layers : 1);
    return MP_OK;
  }
  char ac[32];
  mp_ac_format(o->ac, o->ac_every, ac, sizeof ac);
  return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: ac %s has no Megatron-LM form (--recompute-granularity "
                  "selective of core_attn, or full of every layer); plan with --ac none, selective-core or full", ac);
}

/* A stated stage layout (--pp-layers) as Megatron-LM states one: the first and last stages'
 * counts (--decoder-first/last-pipeline-num-layers) where the stages between them are equal
 * and there is one chunk a stage (middle_layers: their count), else the whole layout
 * (--pipeline-model-parallel-layout, which also sets the virtual stages; middle_layers 0). */
static int middle_layers(const mp_plan_options *o, int pp) {
  if (o->n_pp_layers != pp) return 0;
  const int mid = pp > 2 ? o->pp_layers[1] : o->pp_layers[0];
  for (int s = 1; s < pp - 1; s++)
    if (o->pp_layers[s] != mid || mid < 1) return 0;
  return o->pp_layers[0] < 1 || o->pp_layers[pp - 1] < 1 ? 0 : mid;
}

static void write_stage_layers(const mp_emit_plan *p, mp_emit_buf *b) {
  const mp_plan_options *o = p->o;
  const int pp = p->mesh->size[MP_DIM_PP], mid = middle_layers(o, pp);
  if (pp > 1 && o->pp_virtual > 1 && o->n_pp_layers == 0)
    mp_emit_printf(b, "--num-virtual-stages-per-pipeline-rank %d\n", o->pp_virtual);
  if (mid > 0) {
    if (o->pp_layers[0] != mid) mp_emit_printf(b, "--decoder-first-pipeline-num-layers %d\n", o->pp_layers[0]);
    if (o->pp_layers[pp - 1] != mid)
      mp_emit_printf(b, "--decoder-last-pipeline-num-layers %d\n", o->pp_layers[pp - 1]);
  } else if (o->n_pp_layers > 0) {
    char layout[4 * MP_PP_MAX_LAYOUT + 64];
    if (mp_pp_layout_format(o, layout, sizeof layout) > 0)
      mp_emit_printf(b, "--pipeline-model-parallel-layout %s\n", layout);
  }
}

/* What Megatron-LM cannot run as meshplan plans it, refused before anything is written. */
static mp_status check_plan(mp_ctx *ctx, const mp_emit_plan *p) {
  const mp_mesh *m = p->mesh;
  if (m->size[MP_DIM_DP_SHARD] > 1 && strcmp(p->stack->name, "megatron-core") != 0)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--emit megatron: dp_shard=%d is FSDP, which stack %s does not run (Megatron FSDP, "
                    "--use-megatron-fsdp, is Megatron-Core's): plan with --stack megatron-core, or "
                    "dp_replicate", m->size[MP_DIM_DP_SHARD], p->stack->name);
  /* the reader maps --attention-backend back to these two profiles, so only they round-trip */
  if (strcmp(p->stack->name, "megatron-core") != 0 && strcmp(p->stack->name, "megatron-lm") != 0)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--emit megatron: the plan was predicted under stack %s, not Megatron's; plan with "
                    "--stack megatron-core or megatron-lm", p->stack->name);
  if (m->size[MP_DIM_PP] > 1 && p->o->pp_schedule == MP_PP_DUALPIPE)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: Megatron-LM core_v0.14.0 runs no DualPipe schedule "
                    "(DeepSeek's HAI-LLM and deepseek-ai/DualPipe do); plan with --pp-schedule 1f1b or "
                    "interleaved");
  if (p->o->moe_dispatcher == MP_MOE_DISPATCH_HYBRIDEP)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: Megatron-LM core_v0.14.0's flex dispatcher has no "
                    "HybridEP backend (--moe-flex-dispatcher-backend hybridep is later); plan with "
                    "--moe-dispatcher deepep or alltoall");
  if (p->o->moe_fp8_dispatch)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: float8 dispatch has no pretrain_gpt.py argument in "
                    "core_v0.14.0; drop --moe-fp8-dispatch");
  if (p->o->cpu_offload_layers > 0)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: CPU offloading has no pretrain_gpt.py argument in "
                    "core_v0.14.0 (TransformerConfig's cpu_offloading fields only; --cpu-offloading-num-layers is "
                    "core_v0.16.0's); drop --cpu-offload-layers");
  if (p->o->fp8_act_cache)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: the float8 activation cache (DeepSeek-V3 sec. "
                    "3.3.3) has no pretrain_gpt.py argument in core_v0.14.0; drop --fp8-act-cache");
  if (p->o->moment_dtype != MP_DTYPE_FP32)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: core_v0.14.0 keeps bf16 moments only under "
                    "--use-precision-aware-optimizer, which also stores the fp32 masters as bf16 parameters "
                    "and 16-bit remainders (OptimizerConfig.store_param_remainders), a layout meshplan does "
                    "not price; drop --optimizer-moments bf16");
  if (m->size[MP_DIM_PP] > 1 && p->o->pp_schedule == MP_PP_GPIPE)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: Megatron-LM runs no GPipe schedule (1F1B, or "
                    "interleaved with virtual stages); plan with --pp-schedule 1f1b or interleaved");
  /* fp8.py global_amax_reduction reads it from the environment (Transformer Engine v0.13 to
   * v1.5); pretrain_gpt.py has no argument for it */
  if (p->o->fp8 && p->o->fp8_opts.amax_tp)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: the TP-only amax reduction is Transformer Engine's "
                    "NVTE_DP_AMAX_REDUCE_INTERVAL=0, not a pretrain_gpt.py argument; drop --fp8-amax-tp-only");
  /* Transformer Engine's NVTE_NVFP4_DISABLE_RHT=1 (recipe NVFP4BlockScaling.disable_rht), an
   * environment variable: pretrain_gpt.py has no argument for it */
  if (p->o->fp8 && p->o->fp8_opts.nvfp4_no_rht)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: NVFP4 without the random Hadamard transform is Transformer "
                    "Engine's NVTE_NVFP4_DISABLE_RHT=1, not a pretrain_gpt.py argument; drop --nvfp4-no-rht");
  if (p->o->fp8 && p->o->fp8_opts.recipe == MP_FP8_ROWWISE)
    return mp_error(ctx, MP_ERR_USAGE, "--emit megatron: float8 recipe rowwise is torchao's; Megatron-LM's "
                    "--fp8-recipe is tensorwise, delayed, mxfp8 or blockwise");
  return MP_OK;
}

/* The experts' grid and dispatch: each expert split over the mesh's etp (1 where it is not
 * given: whole on a rank, written out since Megatron-LM's default is the tp size), moved by
 * the all-to-all dispatcher or by DeepEP's (the flex dispatcher), with Megatron-Core's EP
 * all-to-all overlap where planned. */
static void write_experts(const mp_emit_plan *p, mp_emit_buf *b) {
  if (!mp_model_is_moe(p->model)) return;
  mp_emit_printf(b, "--expert-model-parallel-size %d\n--expert-tensor-parallel-size %d\n", p->mesh->ep,
                 p->mesh->etp > 1 ? p->mesh->etp : 1);
  if (p->o->moe_dispatcher == MP_MOE_DISPATCH_DEEPEP)
    mp_emit_printf(b, "--moe-token-dispatcher-type flex\n--moe-enable-deepep\n");
  else
    mp_emit_printf(b, "--moe-token-dispatcher-type alltoall\n");
  if (p->o->moe_a2a_overlap) mp_emit_printf(b, "--overlap-moe-expert-parallel-comm\n");
  const mp_moe_routing *r = &p->o->moe_routing;
  if (r->capacity_factor > 0) mp_emit_printf(b, "--moe-expert-capacity-factor %.17g\n", r->capacity_factor);
  if (r->pad_to_capacity) mp_emit_printf(b, "--moe-pad-expert-input-to-capacity\n");
}

/* The parallel layout, the batch and the switches of the plan's stack. */
static void write_parallel(const mp_emit_plan *p, mp_emit_buf *b) {
  const mp_mesh *m = p->mesh;
  const mp_plan_options *o = p->o;
  const int tp = m->size[MP_DIM_TP];
  mp_emit_printf(b, "--tensor-model-parallel-size %d\n", tp);
  if (tp > 1 && o->sp > 0) mp_emit_printf(b, "--sequence-parallel\n");
  if (tp > 1 && o->sp > 0 && o->tp_comm_fused) mp_emit_printf(b, "--tp-comm-overlap\n");
  mp_emit_printf(b, "--pipeline-model-parallel-size %d\n", m->size[MP_DIM_PP]);
  write_stage_layers(p, b);
  mp_emit_printf(b, "--context-parallel-size %d\n", m->size[MP_DIM_CP]);
  if (m->size[MP_DIM_CP] > 1) mp_emit_printf(b, "--cp-comm-type %s\n", mp_cp_comm_name(o->cp_comm));
  write_experts(p, b);
  mp_emit_printf(b, "--seq-length %lld\n--micro-batch-size %lld\n--global-batch-size %lld\n", (long long)o->seq,
                 (long long)o->micro_batch, (long long)o->global_batch);
  if (o->ddp.shard_optimizer) mp_emit_printf(b, "--use-distributed-optimizer\n");
  /* Megatron FSDP over dp_shard; core_v0.14.0 asserts its own checkpoint format */
  if (m->size[MP_DIM_DP_SHARD] > 1)
    mp_emit_printf(b, "--use-megatron-fsdp\n--data-parallel-sharding-strategy %s\n%s--ckpt-format fsdp_dtensor\n",
                   mp_mfsdp_strategy_name(o->mfsdp_strategy), o->fsdp_double_buffer ? "--fsdp-double-buffer\n" : "");
  /* its hybrid sharding: dp_replicate instances of the dp_shard-sharded state */
  if (m->size[MP_DIM_DP_SHARD] > 1 && m->size[MP_DIM_DP_REPLICATE] > 1)
    mp_emit_printf(b, "--num-distributed-optimizer-instances %d\n", m->size[MP_DIM_DP_REPLICATE]);
  /* the distributed optimizer's instances without FSDP: the mesh's dopt */
  if (m->size[MP_DIM_DP_SHARD] == 1 && mp_mesh_dopt(m) > 1)
    mp_emit_printf(b, "--num-distributed-optimizer-instances %d\n", m->dopt);
  if (o->ddp.overlap) mp_emit_printf(b, "--overlap-grad-reduce\n");
  if (o->ddp.overlap && o->ddp.shard_optimizer) mp_emit_printf(b, "--overlap-param-gather\n");
  mp_emit_printf(b, "--bf16\n--attention-backend %s\n", o->attn == MP_ATTN_MATERIALIZED ? "unfused" : "flash");
  if (o->loss == MP_LOSS_INPLACE_FUSED || o->loss == MP_LOSS_TE) mp_emit_printf(b, "--cross-entropy-loss-fusion\n");
  if (o->loss == MP_LOSS_TE) mp_emit_printf(b, "--cross-entropy-fusion-impl te\n");
  if (!o->ddp.scale_grads) mp_emit_printf(b, "--ddp-average-in-collective\n");
  if (!o->ddp.check_grads) mp_emit_printf(b, "--no-check-for-nan-in-loss-and-grad\n");
  if (o->ddp.align_param_gather) mp_emit_printf(b, "--align-param-gather\n");
  if (o->ddp.wgrad_unfused) mp_emit_printf(b, "--no-gradient-accumulation-fusion\n");
  if (o->ddp.bucket_size > 0) mp_emit_printf(b, "--ddp-bucket-size %lld\n", (long long)o->ddp.bucket_size);
  if (o->fsdp.reduce_dtype == MP_DTYPE_BF16) mp_emit_printf(b, "--grad-reduce-in-bf16\n");
  /* attn is Transformer Engine's graphs the training loop captures (training.py,
   * TECudaGraphHelper); layers and iteration Megatron's own (CudaGraphManager,
   * FullCudaGraphWrapper); the moe_router scope lists core_v0.16.0's --cuda-graph-impl */
  static const char *const graphs[MP_CUDA_GRAPHS_COUNT] = {
      "", "--external-cuda-graph\n--cuda-graph-scope attn\n", "--enable-cuda-graph\n",
      "--enable-cuda-graph\n--cuda-graph-scope full_iteration\n",
      "--cuda-graph-impl transformer_engine\n--cuda-graph-scope attn moe_router\n",
      "--cuda-graph-impl transformer_engine\n--cuda-graph-scope attn moe_router moe_preprocess\n"};
  if ((unsigned)o->cuda_graphs < MP_CUDA_GRAPHS_COUNT) mp_emit_printf(b, "%s", graphs[o->cuda_graphs]);
  /* NVFP4 is Megatron-Core's FP4 options (arguments.py, core_v0.15.0: --fp4-format e2m1,
   * --fp4-recipe nvfp4), which refuses them beside --fp8-format */
  if (o->fp8 && o->fp8_opts.recipe == MP_FP8_NVFP4) mp_emit_printf(b, "--fp4-format e2m1\n--fp4-recipe nvfp4\n");
  else if (o->fp8)
    mp_emit_printf(b, "--fp8-format hybrid\n--fp8-recipe %s\n", mp_fp8_recipe_name(o->fp8_opts.recipe));
  if (o->fp8 && o->fp8_opts.param_gather) mp_emit_printf(b, "--fp8-param-gather\n");
  /* MXFP8 weights are priced on the shared parameter/gradient buffer's path
   * (exec/pass_float8.c), which Megatron-Core takes under this flag (optimizer_config.py warns
   * without it, core_v0.14.0) */
  if (o->fp8 && o->fp8_opts.param_gather && o->fp8_opts.recipe == MP_FP8_MXFP8)
    mp_emit_printf(b, "--reuse-grad-buf-for-mxfp8-param-ag\n");
  if (o->fp8 && o->fp8_opts.dpa) mp_emit_printf(b, "--fp8-dot-product-attention\n");
}

mp_status mp_emit_megatron(mp_ctx *ctx, const mp_emit_plan *p, const char *file_name, mp_emit_buf *b) {
  MP_CHECK(check_plan(ctx, p));
  char launch[1200];
  snprintf(launch, sizeof launch, "pretrain_gpt.py $(grep -v '^#' %s) --data-path DATA --tokenizer-type "
           "HuggingFaceTokenizer --tokenizer-model TOKENIZER", file_name);
  mp_emit_header(b, MP_EMIT_MEGATRON, p, launch);
  mp_emit_printf(b, "# Data parallelism: the world over tp x pp x cp, %d ranks here.\n", mp_emit_dp(p->mesh));
  MP_CHECK(write_model(ctx, p->model, b));
  write_parallel(p, b);
  MP_CHECK(write_ac(ctx, p->o, b));
  mp_emit_printf(b, "--train-iters 1000\n");
  return MP_OK;
}
