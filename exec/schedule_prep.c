/* Step schedule builder: what it reads from a plan for one rank, computed once
 * (mp_schedule_prep, schedule.h): the model's and the plan's local shapes, the FSDP units as
 * the rank's stage sees them, the rank's elements at rest, and the runs of identical blocks
 * COMPACT mode collapses. The builder's overview: schedule.c.
 *
 * Invariants: the prep is read-only once made; it serves exactly the plans with its plan's
 * parameter and unit tables, mesh, seq, float8 all-gather and FSDP dtypes (prep_serves), so
 * a derived plan (mp_plan_derive: another micro-batch, AC mode or reshard setting) builds
 * from it the schedule mp_schedule_build gives. */
#include "exec/schedule_internal.h"

/* The rows each local expert of the slowest EP rank computes (mp_moe_routing, exec/plan.h),
 * from r = tokens x top_k / E, the rows a rank routes to one expert under balanced routing:
 *   dropless           ep x r x f                      (f the imbalance; 1 when balanced
 *                                                        or ep = 1)
 *   capacity C         min(ep x r x f, ep x ceil(r C))  (each rank keeps at most ceil(r C)
 *                                                        rows an expert: Megatron-Core's
 *                                                        get_capacity on the rank's tokens)
 *   C, padded          ep x ceil(r C)
 * and *load, those rows over the balanced ep x r: what the rank's all-to-all bytes and its
 * experts' element-wise work scale by. Balanced and dropless: ep x r and 1 exactly. The
 * rank's excess is spread evenly over its local experts (the slowest rank's GEMMs are as
 * long either way: the grouped GEMM's rows are summed, sim/cost.c).
 * Under HybridEP's rank capacity C_r (rt->rank_capacity, core_v0.18.0 token_dispatcher.py
 * _HybridEPManager.setup_metadata) a rank keeps at most tokens x top_k x C_r rows, ep x r x C_r
 * an expert, the excess dropped in the dispatch; that kept count is *load's. Each local expert's
 * rows are then padded up to a multiple of `align` (dispatch's pad_multiple under float8:
 * get_align_size_for_quantization, 256 with Transformer Engine's op fuser, which the rank
 * capacity needs); the grouped GEMM runs over those padded counts, read on the GPU
 * (Transformer Engine's graph-safe GroupedTensor path, ops/basic/grouped_linear.py), not over
 * the budget-sized buffer. align 1: no padding. */
double mp_sched_moe_rows(const mp_moe_routing *rt, double tokens, int64_t top_k, int64_t experts, int ep,
                         int align, double *load) {
  *load = 1.0;
  if (experts <= 0) return 0.0;
  const double even = tokens * (double)top_k * (double)ep / (double)experts, r = even / (double)ep;
  const double f = rt->imbalance > 1.0 && ep > 1 ? rt->imbalance : 1.0; /* one rank: no other to wait for */
  double rows = even * f;
  if (rt->capacity_factor > 0.0) {
    const double cap = (double)ep * ceil(r * rt->capacity_factor);
    rows = rt->pad_to_capacity || cap < rows ? cap : rows;
  }
  if (rt->rank_capacity > 0.0) {
    const double budget = even * rt->rank_capacity;
    const double kept = rows < budget ? rows : budget;
    *load = kept / even;
    return align > 1 ? ceil(kept / align) * align : kept;
  }
  if (rows == even) return even;
  *load = rows / even;
  return rows;
}

int mp_sched_moe_align(const mp_plan *p) {
  return p->opts.moe_routing.rank_capacity > 0.0 && (p->applied & MP_PASS_FLOAT8) ? MP_MOE_HYBRIDEP_ALIGN : 1;
}

int64_t mp_sched_moe_routed(const mp_plan *p, int64_t tokens, int *etp_rows) {
  /* the meshplan runtimes run Megatron-Core's way (exec/runtime/runtime_etp.c) */
  const int gathers = p->opts.mem_model == MP_MEM_MODEL_MEGATRON || mp_mem_model_is_runtime(p->opts.mem_model);
  const int etp = (p->applied & MP_PASS_EP) && p->mesh.etp > 1 ? p->mesh.etp : 1;
  const int shard = mp_mesh_expert_grid(&p->mesh) && (etp == 1 || gathers);
  *etp_rows = gathers ? etp : 1;
  return shard ? tokens / p->mesh.size[MP_DIM_TP] : tokens;
}

/* The micro-batch's part of the shapes: tokens per micro-batch on the rank and per local
 * expert. */
void mp_sched_shapes_for_batch(shapes *sh, const mp_plan *p, int64_t micro_batch) {
  const int cp = p->mesh.size[MP_DIM_CP];
  sh->seq = p->opts.seq;
  sh->attended = mp_model_attended_keys(&p->model, p->opts.seq);
  sh->tokens = micro_batch * p->opts.seq / cp;
  sh->tokens_sp = sh->sp ? sh->tokens / sh->tp : sh->tokens;
  sh->moe_tokens = mp_sched_moe_routed(p, sh->tokens, &sh->etp_rows);
  sh->moe_on_shard = p->opts.mem_model == MP_MEM_MODEL_MEGATRON && sh->sp && sh->tp > 1 && mp_mesh_expert_grid(&p->mesh);
  sh->router_tokens = sh->moe_on_shard ? sh->moe_tokens : sh->tokens;
  sh->tokens_per_expert = mp_sched_moe_rows(&p->opts.moe_routing, (double)(sh->moe_tokens * sh->etp_rows), sh->top_k,
                                            sh->experts, sh->ep, mp_sched_moe_align(p), &sh->moe_load);
}

/* The float8 recipe's side of the shapes (after sh->tp). */
static void read_fp8_shapes(const mp_plan *p, shapes *sh) {
  const int on = (p->applied & MP_PASS_FLOAT8) != 0;
  const mem_strategy *ms = mp_sched_strategy(p->opts.mem_model);
  sh->fp8_all_gather = p->opts.fp8_opts.all_gather && on;
  sh->fp8_recipe = p->opts.fp8_opts.recipe;
  sh->fp8_te = on && ms->fp8_te;
  /* Transformer Engine's layers of Megatron-Core, float8 or not (schedule_act.c) */
  sh->te_spec = p->opts.te_spec && ms->saved == SAVED_KORTHIKANTI;
  /* Transformer Engine's per-tensor quantizers (delayed and current scaling) write a
   * transposed copy only where float8 GEMMs take TN operands alone
   * (mp_fp8_gemm_any_layout); MXFP8's column-wise copy is scaled per 32 elements along the
   * other dim, a second quantization on every GPU (MXFP8Quantizer, quantizer.cpp, v2.8),
   * and blockwise's likewise (Float8BlockQuantizer) */
  const int per_tensor = sh->fp8_recipe == MP_FP8_DELAYED || sh->fp8_recipe == MP_FP8_TENSORWISE;
  sh->fp8_te_copies = per_tensor && mp_fp8_gemm_any_layout(p->opts.fp8_opts.gpu_cc) ? 1 : 2;
  sh->fp8_param_gather = sh->fp8_te && p->opts.fp8_opts.param_gather;
  /* MXFP8 model weights (Megatron-Core core_v0.14.0 to core_v0.16.0 with
   * reuse_grad_buf_for_mxfp8_param_ag, which Megatron-Bridge's bf16_with_mxfp8_mixed sets with
   * fp8_param_gather): MXFP8Tensors holding row-wise and column-wise codes with their E8M0
   * scales (fp8_model_init: TransformerEngineBaseModule.reset_parameters sets the weight
   * quantizer's usage rowwise=True, columnwise=torch.is_grad_enabled(), module/base.py
   * v2.8; counted as the float8 weight's byte plus
   * mp_fp8_te_weight_copy_bytes), and no bf16 parameter buffer: the buffer's param_data is
   * the gradient buffer itself, its first half viewed as bf16 under fp32 gradients
   * (param_and_grad_buffer.py _ParamAndGradBuffer.__init__, shared_buffer). The optimizer
   * copies the fp32 masters into its shard in bf16 (distrib_optimizer.py
   * _copy_main_params_to_param_buffer, not cast_master_weights_to_fp8), the all-gather moves
   * bf16, and each bucket's weights are quantized from it after the gather
   * (param.data.copy_(param_slice), finish_param_sync, or start_param_sync without overlap
   * in distributed_data_parallel.py), then the bucket's bf16 view zeroed for the gradients.
   * The float8 weights still form a buffer of their own (DDP groups parameters by
   * (param_dtype, grad_dtype), a QuantizedTensor's uint8: distributed_data_parallel.py
   * _allocate_buffers_for_parameters); the bf16 one keeps its bf16 parameter buffer but the
   * flag leaves its parameters off it, so they hold their own storage beside it */
  sh->fp8_param_gather_bf16 = sh->fp8_param_gather && sh->fp8_recipe == MP_FP8_MXFP8;
  sh->f8_held_per_step = sh->fp8_te && mp_fp8_te_copy_per_step(sh->fp8_recipe, sh->fp8_param_gather);
  /* Megatron FSDP (optim_grads_params, keep_fp8_transpose_cache False, its default) drops
   * each float8 model weight's transpose after its module's forward and backward
   * (megatron_fsdp.py core_v0.14.0: release_module_parameters from _post_forward and
   * _post_backward sets param._transpose = None), so Transformer Engine makes it again in
   * each (update_usage(columnwise_usage=True) in _Linear.forward and backward, linear.py
   * v2.8): a transient of the layer, not a copy held through the step */
  sh->f8_held_per_layer = sh->fp8_param_gather && per_tensor && sh->fp8_te_copies == 2 && mp_plan_is_megatron_fsdp(p);
  /* Blockwise GEMMs on Hopper are cuBLASLt's block-scaled kernels: Transformer Engine sets
   * CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F for a 1x128-scaled operand (activations and
   * gradients) and BLK128x128_32F for a 128x128-scaled one (weights): fprop and dgrad 1x128
   * by 128x128, wgrad 1x128 by 1x128 (transformer_engine/common/gemm/cublaslt_gemm.cu and
   * recipe Float8BlockScaling, x, w and grad block dims 1, 2, 1, v2.5), every GEMM with the
   * split accumulator, as the recipe asserts: the block scales enter along K, applied to the
   * fp32 partial sums each 128-deep K block. On Blackwell (cc 10.0 and later) Transformer
   * Engine runs the recipe's GEMMs as MXFP8 instead (NVIDIA/TransformerEngine pull request
   * 2157), the MXFP8 recipe's kernels: cuBLASLt's block-scaled GEMMs with an E8M0 scale per
   * 32 elements of each operand along K (CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
   * transformer_engine/common/gemm/cublaslt_gemm.cu), priced at the stack's MXFP8 rate */
  const int blockwise = on && sh->fp8_recipe == MP_FP8_BLOCKWISE;
  sh->fp8_block_gemm = blockwise && p->opts.fp8_opts.gpu_cc < 100;
  sh->mxfp8_gemm = (blockwise && p->opts.fp8_opts.gpu_cc >= 100) || (on && sh->fp8_recipe == MP_FP8_MXFP8);
  /* NVFP4BlockScaling quantizes every Linear GEMM's operands (recipe.py v2.9: fwd input,
   * fwd weight, bwd grad): fprop, dgrad and wgrad on the FP4 tensor cores */
  sh->fp4_gemm = on && sh->fp8_recipe == MP_FP8_NVFP4;
  sh->nvfp4_rht = sh->fp4_gemm && !p->opts.fp8_opts.nvfp4_no_rht;
  sh->fp8_dpa = on && p->opts.fp8_opts.dpa;
  sh->fp8_amax_tp = on && p->opts.fp8_opts.amax_tp;
  /* torchao's float8 TP modules scale tensorwise; Transformer Engine gathers float8 under
   * every recipe */
  sh->fp8_tp_codes = sh->tp > 1 && on && ms->fp8_tp_codes && (ms->fp8_te || sh->fp8_recipe == MP_FP8_TENSORWISE);
}

/* A hybrid model's Mamba-2 widths before TP (schedule_mamba.c). */
static void mamba_shapes(const mp_model *m, shapes *sh) {
  sh->hybrid = mp_model_is_hybrid(m);
  sh->mb_in = mp_model_mamba_in_rows(m);
  sh->mb_conv = mp_model_mamba_conv_dim(m);
  sh->mb_inner = mp_model_mamba_d_inner(m);
  sh->mb_heads = m->mamba_num_heads;
  sh->mb_groups = m->n_groups;
  sh->mb_state = m->ssm_state_size;
  sh->mb_head_dim = m->mamba_head_dim;
  sh->mb_chunk = m->chunk_size;
  sh->mb_kernel = m->conv_kernel;
}

/* ... and after it, from in_proj's weight: the heads and groups split alike over tp
 * (pass_tp.c), so every width by in_proj's split. */
static void mamba_tp(const mp_plan *p, const mp_param *prm, shapes *sh) {
  sh->tp_closes_mamba = 0; /* out_proj rowwise wherever in_proj is colwise (pass_tp.c) */
  for (int i = 0; i < p->n_params; i++)
    if (p->params[i].module == MP_MOD_MAMBA_OUT) sh->tp_closes_mamba = p->params[i].tp_style == MP_TP_ROWWISE;
  sh->mb_in = prm->tp_shape[0];
  sh->tp_opens_mamba = prm->tp_style == MP_TP_COLWISE;
  if (!sh->tp_opens_mamba) return;
  const int64_t split = prm->shape[0] / prm->tp_shape[0];
  sh->mb_conv /= split, sh->mb_inner /= split, sh->mb_heads /= split, sh->mb_groups /= split;
}

/* Everything else: from the model and the plan's parameters (mp_schedule_prep keeps it). */
static void read_shapes(gen *g) {
  const mp_plan *p = g->p;
  const mp_model *m = &p->model;
  shapes *sh = &g->sh;
  memset(sh, 0, sizeof *sh);
  sh->tp = p->mesh.size[MP_DIM_TP];
  sh->cp = p->mesh.size[MP_DIM_CP];
  sh->sp = sh->tp > 1 && p->opts.sp == 1;
  sh->ep = p->mesh.ep > 1 && (p->applied & MP_PASS_EP) ? p->mesh.ep : 1;
  sh->d_model = m->d_model;
  sh->head_dim = m->head_dim;
  sh->gpt = m->family == MP_FAMILY_GPT;
  sh->gated = mp_model_mlp_gated(m);
  sh->mlp = mp_model_mlp(m);
  sh->layernorm = mp_model_norm(m) == MP_NORM_LAYER;
  sh->qk_norm = m->qk_norm;
  sh->tied = m->tied_embeddings;
  sh->experts = m->n_experts;
  sh->top_k = m->top_k;
  sh->has_shared = m->n_shared_experts > 0;
  read_fp8_shapes(p, sh);
  /* defaults before TP */
  sh->q_width = m->n_heads * m->head_dim;
  sh->kv_width = m->n_kv_heads * m->head_dim;
  sh->d_ff = m->d_ff;
  sh->d_ff_expert = m->d_ff_expert;
  sh->d_ff_shared = m->d_ff_shared;
  sh->experts_local = m->n_experts;
  sh->vocab_local = p->vocab_padded;
  sh->mla = mp_model_is_mla(m);
  sh->v_head_dim = mp_model_v_head_dim(m);
  sh->q_lora = m->q_lora_rank;
  sh->kv_lora = m->kv_lora_rank;
  sh->rope_dim = m->qk_rope_head_dim;
  sh->kv_b_rows = m->n_heads * (m->qk_nope_head_dim + m->v_head_dim);
  mamba_shapes(m, sh);
  int seen[MP_MOD_COUNT] = {0};
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *prm = &p->params[i];
    if (prm->role != MP_ROLE_WEIGHT || seen[prm->module]) continue;
    seen[prm->module] = 1;
    sh->fp8[prm->module] = prm->float8;
    sh->tp_style[prm->module] = (uint8_t)prm->tp_style;
    const int col = prm->tp_style == MP_TP_COLWISE, row = prm->tp_style == MP_TP_ROWWISE;
    switch (prm->module) {
      case MP_MOD_TOK_EMBEDDINGS:
        sh->tp_emb_vocab = prm->tp_style == MP_TP_VOCAB;
        if (sh->tied) sh->vocab_local = prm->tp_shape[0];
        break;
      case MP_MOD_Q: sh->q_width = prm->tp_shape[0]; sh->tp_opens_qkv = col; break;
      case MP_MOD_Q_B: sh->q_width = prm->tp_shape[0]; break;
      case MP_MOD_KV_B: sh->kv_b_rows = prm->tp_shape[0]; sh->tp_opens_mla = col; break;
      case MP_MOD_K: sh->kv_width = prm->tp_shape[0]; break;
      case MP_MOD_O: sh->tp_closes_o = row; break;
      case MP_MOD_UP: sh->d_ff = prm->tp_shape[0]; sh->tp_opens_gateup = col; break;
      case MP_MOD_DOWN: sh->tp_closes_down = row; break;
      case MP_MOD_EXPERTS_GATE: sh->experts_local = prm->tp_shape[0]; sh->d_ff_expert = prm->tp_shape[1]; break;
      case MP_MOD_SHARED_UP: sh->d_ff_shared = prm->tp_shape[0]; sh->tp_opens_shared_gateup = col; break;
      case MP_MOD_SHARED_DOWN: sh->tp_closes_shared_down = row; break;
      case MP_MOD_OUTPUT: sh->vocab_local = prm->tp_shape[0]; break;
      case MP_MOD_MAMBA_IN: mamba_tp(p, prm, sh); break;
      default: break;
    }
  }
  if (sh->tied && seen[MP_MOD_TOK_EMBEDDINGS]) sh->fp8[MP_MOD_TOK_EMBEDDINGS] = 0;
  if (sh->mla) { /* one decompressed key per query head; v and the output v_head_dim wide */
    sh->kv_width = sh->q_width;
    sh->tp_opens_qkv = 0; /* MLA's region has no float8 input of its own (schedule_mla.c) */
  }
  sh->heads = sh->q_width / sh->head_dim;
  sh->kv_heads = sh->kv_width / sh->head_dim;
  sh->v_width = sh->mla ? sh->heads * sh->v_head_dim : sh->kv_width;
  sh->attn_out = sh->mla ? sh->heads * sh->v_head_dim : sh->q_width;
  /* the head is colwise whenever its rows are split; its input gradient is partial */
  const int head_split = sh->vocab_local != p->vocab_padded;
  sh->tp_head_split = head_split;
  sh->loss_parallel = head_split && p->opts.tp.shard_logits;
  sh->logits_gather = head_split && !p->opts.tp.shard_logits;
  sh->vocab_loss = sh->logits_gather ? p->vocab_padded : sh->vocab_local;
}

/* The builder's unit tables (per plan unit, or per pseudo unit without FSDP) and the
 * runtime models' per-tensor arrays, in the arena, zeroed. */
static mp_status units_alloc(gen *g, rt_rest *rest) {
  const mp_plan *p = g->p;
  const int L = (int)mp_model_n_blocks(&p->model); /* the MTP modules' blocks too */
  const size_t np = (size_t)(p->n_params > 0 ? p->n_params : 1);
  g->has_fsdp = (p->applied & MP_PASS_FSDP) && p->n_units > 0;
  g->first_unit = mp_arena_alloc(g->arena, sizeof(int32_t) * (size_t)(L + 1));
  g->n_units = mp_arena_alloc(g->arena, (size_t)(L + 1));
  g->n_ui = g->has_fsdp ? p->n_units : L + 1;
  g->ui = mp_arena_alloc(g->arena, sizeof(unit_info) * (size_t)g->n_ui);
  memset(rest, 0, sizeof *rest);
  rest->t_pad = mp_arena_alloc(g->arena, sizeof(int64_t) * np);
  rest->t_rep = mp_arena_alloc(g->arena, np);
  rest->t_f8 = mp_arena_alloc(g->arena, np);
  rest->t_spn = mp_arena_alloc(g->arena, np);
  if (g->first_unit == NULL || g->n_units == NULL || g->ui == NULL || rest->t_pad == NULL ||
      rest->t_rep == NULL || rest->t_f8 == NULL || rest->t_spn == NULL)
    return mp_error(g->ctx, MP_ERR_NOMEM, "out of memory building the step schedule");
  for (int l = 0; l < L; l++) g->first_unit[l] = -1;
  g->root_unit = -1;
  return MP_OK;
}

/* Megatron-Core's fused Transformer Engine Linears: linear_qkv's weight is [q + k + v, in],
 * linear_fc1's [gate + up, in] (a grouped expert's each: TEGroupedMLP; megatron/core/
 * transformer/attention.py, mlp.py, core_v0.14.0), so k, v and up extend the weight q or gate
 * opened and Transformer Engine quantizes it whole (any other weight closes it). */
static int te_fused_follows(int module) {
  return module == MP_MOD_K || module == MP_MOD_V || module == MP_MOD_UP || module == MP_MOD_SHARED_UP ||
         module == MP_MOD_EXPERTS_UP;
}

static int te_fused_leads(int module) {
  return module == MP_MOD_Q || module == MP_MOD_GATE || module == MP_MOD_SHARED_GATE || module == MP_MOD_EXPERTS_GATE;
}

/* Transformer Engine's float8 copies of float8 weight prm (n tp-local elements): of each of
 * its [out, in] weights (a grouped expert's behind its expert dim), what it adds to the fused
 * weight it extends (mp_fp8_te_weight_copy_bytes of the grown weight less the one before). */
static void add_f8_held(gen *g, const mp_param *prm, unit_info *ui, int64_t n) {
  const int e = prm->ndim == 3;
  const int64_t r = prm->tp_shape[e], c = prm->tp_shape[e + 1];
  const int64_t r0 = te_fused_follows(prm->module) && ui->f8_fused_cols == c ? ui->f8_fused_rows : 0;
  const mp_fp8_recipe rc = g->sh.fp8_recipe;
  const int cc = g->p->opts.fp8_opts.gpu_cc, pg = g->sh.fp8_param_gather;
  ui->f8_held_bytes += n / (r * c) * (mp_fp8_te_weight_copy_bytes(rc, cc, pg, r0 + r, c) -
                                      (r0 > 0 ? mp_fp8_te_weight_copy_bytes(rc, cc, pg, r0, c) : 0));
  ui->f8_fused_rows = r0 + r;
  ui->f8_fused_cols = te_fused_leads(prm->module) || te_fused_follows(prm->module) ? c : 0;
}

/* Parameter prm of the stage into its unit: its tp-local elements, its padded shard, the
 * gather's bytes, and the rank's elements at rest (its tile: gi is the rank's index in
 * the group of gs). */
static void add_param(gen *g, const mp_param *prm, unit_info *ui, int gs, int gi,
                      int64_t *params_numel, rt_rest *rest) {
  const int64_t n = mp_param_tp_numel(prm), rows = prm->tp_shape[0];
  int64_t local = n;
  if (g->has_fsdp && prm->place[MP_AXIS_FSDP].kind == MP_PLACEMENT_SHARD && rows > 0) {
    const int64_t chunk = mp_fsdp_chunk_rows(rows, gs), start = (int64_t)gi * chunk;
    const int64_t end = start + chunk < rows ? start + chunk : rows;
    local = end > start ? (end - start) * (n / rows) : 0;
  }
  *params_numel += local;
  ui->numel_tp += n;
  if (!g->has_fsdp && prm->is_expert && mp_plan_ddp_experts_apart(g->p)) ui->numel_expert += n;
  ui->numel_shard += mp_param_padded_shard_numel(prm, gs);
  mp_sched_rt_add_param(rest, ui, prm, gs, local, n);
  /* gathered in float8: torchtitan's float8 all-gather, Megatron-Core's float8 weights but MXFP8's */
  const int f8 = (g->sh.fp8_all_gather || (g->sh.fp8_param_gather && !g->sh.fp8_param_gather_bf16)) && prm->float8;
  ui->gather_bytes += (double)n * (f8 ? 1 : mp_dtype_bytes(g->param_dtype));
  if (g->sh.fp8_param_gather && prm->float8) ui->numel_f8_local += local;
  if (g->sh.fp8_param_gather && f8) {
    ui->numel_f8 += n;
    ui->n_f8++;
    if (!g->has_fsdp && prm->is_expert && mp_plan_ddp_experts_apart(g->p)) ui->numel_f8_expert += n;
  }
  if (g->sh.fp8_te && prm->float8) add_f8_held(g, prm, ui, n);
  if (ui->n_prm < UNIT_MAX_PRM) {
    ui->prm_f8[ui->n_prm] = (uint8_t)(g->sh.fp8_param_gather && prm->float8);
    ui->prm_numel[ui->n_prm++] = n;
  } else {
    ui->prm_numel[UNIT_MAX_PRM - 1] += n;
  }
  ui->gsize = gs;
  ui->group = (uint8_t)(g->has_fsdp ? prm->fsdp_group : mp_sched_ddp_group(g));
  ui->gather_dtype = (uint8_t)g->param_dtype;
}

/* Each layer's first unit and unit count, and the root unit; a block's units must be
 * consecutive, at most N_PARTS (exec/pass_fsdp.c's layout). */
static mp_status units_by_layer(gen *g) {
  for (int u = 0; u < g->n_ui; u++) {
    const int layer = g->has_fsdp ? g->p->units[u].layer : u - 1;
    if (layer < 0) {
      if (g->ui[u].numel_tp > 0) g->root_unit = u;
      continue;
    }
    if (g->first_unit[layer] < 0) g->first_unit[layer] = u;
    g->n_units[layer]++;
    if (g->n_units[layer] > N_PARTS || g->first_unit[layer] + g->n_units[layer] - 1 != u)
      return mp_error(g->ctx, MP_ERR_INTERNAL,
                      "FSDP units of layer %d are not consecutive or more than %d; the "
                      "schedule expects the layout of exec/pass_fsdp.c",
                      layer, N_PARTS);
  }
  return MP_OK;
}

/* Units as this rank's stage sees them, and the rank's elements at rest (the same sums as
 * mp_plan_rank_totals, which is too slow for the planner's loop: it asks the mesh per
 * parameter; here the group sizes and indices are asked once per group kind). */
static mp_status read_units(gen *g, int stage, int rank, int64_t *params_numel,
                            rt_rest *rest) {
  const mp_plan *p = g->p;
  MP_CHECK(units_alloc(g, rest));
  int gsize[MP_GROUP_COUNT], gidx[MP_GROUP_COUNT];
  for (int k = 0; k < MP_GROUP_COUNT; k++) gsize[k] = gidx[k] = -1;
  *params_numel = 0;
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *prm = &p->params[i];
    if (prm->pp_stage != stage) continue;
    /* without FSDP: pseudo unit 0 = root, 1 + l = block l (gradient all-reduce buckets) */
    const int u = g->has_fsdp ? prm->fsdp_unit : (prm->layer < 0 ? 0 : 1 + prm->layer);
    if (u < 0 || u >= g->n_ui)
      return mp_error(g->ctx, MP_ERR_INTERNAL, "parameter %s has FSDP unit %d of %d", prm->fqn,
                      u, g->n_ui);
    const int grp = prm->fsdp_group;
    if (g->has_fsdp && gsize[grp] < 0) {
      gsize[grp] = mp_mesh_group_size(&p->mesh, (mp_group)grp);
      gidx[grp] = mp_mesh_group_index(&p->mesh, (mp_group)grp, rank);
    }
    add_param(g, prm, &g->ui[u], g->has_fsdp ? gsize[grp] : 1, g->has_fsdp ? gidx[grp] : 0,
              params_numel, rest);
  }
  return units_by_layer(g);
}

/* The embedding's copy on this stage under pp > 1 (stage 0's tok_embeddings, the last
 * stage's copy: a tied model's output, or the MTP modules' embedding): its gradient at rest in the reduce dtype, the payload of the
 * two copies' all-reduce; 0 without one. */
static int64_t tied_grad_bytes(const gen *g, int stage, int rank) {
  const mp_plan *p = g->p;
  int copied = 0; /* the last stage's copy (mp_plan_tree_add_tied_copy: tied, or for MTP) */
  for (int i = p->n_params - 1; i >= 0 && !copied; i--) copied = p->params[i].tied_copy;
  if (!copied || p->mesh.size[MP_DIM_PP] <= 1) return 0;
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *prm = &p->params[i];
    const int tok = prm->module == MP_MOD_TOK_EMBEDDINGS && prm->role == MP_ROLE_WEIGHT;
    if (prm->pp_stage != stage || !(tok || prm->tied_copy)) continue;
    const int64_t n = g->has_fsdp && prm->place[MP_AXIS_FSDP].kind == MP_PLACEMENT_SHARD
                          ? mp_param_local_numel(p, prm, rank)
                          : mp_param_tp_numel(prm);
    return n * mp_dtype_bytes(g->reduce_dtype);
  }
  return 0;
}

/* ---- runs of identical blocks --------------------------------------------------------- */

/* Layer l's kind in a hybrid model (mp_model_layer_kind; MP_LAYER_BLOCK outside one): blocks
 * of a run share it. */
static int layer_kind(const gen *g, int32_t l) { return (int)mp_model_layer_kind(&g->p->model, l); }

int mp_sched_kind_of(const gen *g, int32_t l, const stage_info *st) {
  if (l < st->l0 || l >= st->l1) return KIND_NONE;
  return mp_model_layer_is_moe(&g->p->model, l) ? KIND_MOE : KIND_DENSE;
}

/* Can layer b be a later repetition of the run that layer a starts (b = a + r)? */
static int same_block(const gen *g, int32_t a, int32_t b, const stage_info *st) {
  if (mp_sched_kind_of(g, a, st) != mp_sched_kind_of(g, b, st)) return 0;
  if (mp_sched_kind_of(g, a - 1, st) != mp_sched_kind_of(g, b - 1, st)) return 0;
  if (mp_sched_kind_of(g, a + 1, st) != mp_sched_kind_of(g, b + 1, st)) return 0;
  for (int d = -1; d <= 1; d++)
    if (layer_kind(g, a + d) != layer_kind(g, b + d)) return 0;
  const int n = g->n_units[a];
  if (g->n_units[b] != n) return 0;
  const int32_t r = b - a, step = n;
  /* unit indices advance regularly, sizes match, for the block and its neighbours */
  for (int d = -1; d <= 1; d++) {
    const int32_t la = a + d, lb = b + d;
    if (mp_sched_kind_of(g, la, st) == KIND_NONE) continue;
    if (g->n_units[la] != g->n_units[lb]) return 0;
    if (g->first_unit[lb] - g->first_unit[la] != r * step) return 0;
    for (int k = 0; k < g->n_units[la]; k++) {
      const unit_info *x = &g->ui[g->first_unit[la] + k], *y = &g->ui[g->first_unit[lb] + k];
      if (x->numel_tp != y->numel_tp || x->numel_shard != y->numel_shard ||
          x->gather_bytes != y->gather_bytes || x->group != y->group ||
          x->rt_gather_x4 != y->rt_gather_x4 || x->rt_gather_x2 != y->rt_gather_x2 ||
          x->rt_rs_numel != y->rt_rs_numel || x->rt_max_pad != y->rt_max_pad)
        return 0;
    }
  }
  return 1;
}

/* Runs of identical blocks in a chunk's [l0, l1): run_len[l] for run starts, 0 inside
 * runs. */
static void find_runs(gen *g, const stage_info *st, mp_schedule_mode mode, int32_t *run_len) {
  for (int32_t l = st->l0; l < st->l1;) {
    int32_t r = 1;
    if (mode == MP_SCHEDULE_COMPACT)
      while (l + r < st->l1 && same_block(g, l, l + r, st)) r++;
    run_len[l] = r;
    for (int32_t k = 1; k < r; k++) run_len[l + k] = 0;
    l += r;
  }
}

/* ---- the prep ------------------------------------------------------------------------- */

mp_status mp_sched_check_plan_rank(mp_ctx *ctx, const mp_plan *p, int rank) {
  const mp_mesh *mesh = &p->mesh;
  if (rank < 0 || rank >= mp_mesh_world(mesh))
    return mp_error(ctx, MP_ERR_INVALID, "rank %d is outside the mesh's %d ranks", rank,
                    mp_mesh_world(mesh));
  if (!(p->applied & MP_PASS_FSDP) && mesh->size[MP_DIM_DP_SHARD] > 1)
    return mp_error(ctx, MP_ERR_ORDER,
                    "the plan has dp_shard=%d but FSDP was not applied, so no rank would hold "
                    "its parameter shard; apply FSDP (mp_apply_fsdp) before building the "
                    "schedule",
                    mesh->size[MP_DIM_DP_SHARD]);
  if ((unsigned)p->opts.mem_model >= MP_MEM_MODEL_COUNT)
    return mp_error(ctx, MP_ERR_INVALID, "unknown memory model %d; choose torchtitan, "
                    "meshplan-cpu, meshplan-cuda or megatron", (int)p->opts.mem_model);
  if ((p->applied & MP_PASS_TP) == 0 && mesh->size[MP_DIM_TP] > 1)
    return mp_error(ctx, MP_ERR_ORDER,
                    "the mesh has tp=%d but TP was not applied; apply the passes in order "
                    "(mp_build_plan) before building the schedule",
                    mesh->size[MP_DIM_TP]);
  return MP_OK;
}

static void gen_dtypes(const mp_plan *p, mp_dtype *pdt, mp_dtype *rdt) {
  *pdt = p->opts.fsdp.param_dtype;
  *rdt = p->opts.fsdp.reduce_dtype;
  if (mp_dtype_bytes(*pdt) <= 0) *pdt = MP_DTYPE_BF16;
  if (mp_dtype_bytes(*rdt) <= 0) *rdt = MP_DTYPE_FP32;
}

mp_status mp_sched_prep_fill(mp_ctx *ctx, const mp_plan *p, int rank, mp_schedule_mode mode,
                             mp_arena *arena, mp_schedule_prep **out) {
  *out = NULL;
  mp_schedule_prep *pr = mp_arena_alloc(arena, sizeof *pr);
  MP_CHECK_ALLOC(ctx, pr);
  gen g;
  memset(&g, 0, sizeof g);
  g.ctx = ctx;
  g.arena = arena;
  g.p = p;
  gen_dtypes(p, &g.param_dtype, &g.reduce_dtype);
  const mp_mesh *mesh = &p->mesh;
  int coords[MP_MESH_NDIMS];
  mp_mesh_coords(mesh, rank, coords);
  const int stage = coords[MP_DIM_PP], pp = mesh->size[MP_DIM_PP];
  const int L = (int)mp_model_n_blocks(&p->model), v = mp_plan_virtual_stages(p);
  for (int c = 0; c < v; c++) {
    int64_t l0, l1;
    mp_plan_chunk_layers(p, stage, c, &l0, &l1);
    /* the chunks holding the first and the last model chunk (ZBV's V: both on stage 0) */
    const int64_t k = mp_plan_chunk_index(p, stage, c);
    pr->chunk[c] = (stage_info){(int32_t)l0, (int32_t)l1, k == 0, k == (int64_t)pp * v - 1};
  }
  pr->v = v;
  /* the MTP modules' blocks follow the trunk on the last stage's last chunk, whose range
   * then covers them (what its blocks prefetch, its gathers and reductions see) */
  pr->mtp_l0 = pr->mtp_l1 = (int32_t)p->model.n_layers;
  if (stage == mp_plan_last_stage(p)) {
    pr->mtp_l1 = L;
    pr->chunk[v - 1].l1 = L;
  }
  stage_info st = {pr->chunk[0].l0, pr->chunk[v - 1].l1, stage == 0, stage == mp_plan_last_stage(p)};
  read_shapes(&g);
  int64_t params_numel = 0;
  rt_rest rest;
  MP_CHECK(read_units(&g, stage, rank, &params_numel, &rest));
  pr->tied_grad_bytes = tied_grad_bytes(&g, stage, rank);
  int32_t *run_len = mp_arena_alloc(arena, sizeof(int32_t) * (size_t)(L + 1));
  MP_CHECK_ALLOC(ctx, run_len);
  for (int c = 0; c < v; c++) { /* the trunk's runs; an MTP block is a run of one */
    stage_info trunk = pr->chunk[c];
    if (trunk.l1 > pr->mtp_l0) trunk.l1 = pr->mtp_l0;
    find_runs(&g, &trunk, mode, run_len);
  }
  for (int32_t l = pr->mtp_l0; l < pr->mtp_l1; l++) run_len[l] = 1;
  pr->params = p->params;
  pr->units = p->units;
  pr->n_params = p->n_params;
  pr->n_plan_units = p->n_units;
  pr->applied = p->applied;
  pr->mesh = *mesh;
  pr->seq = p->opts.seq;
  pr->fp8_all_gather = p->opts.fp8_opts.all_gather;
  pr->fp8_param_gather = p->opts.fp8_opts.param_gather;
  pr->gpu_cc = p->opts.fp8_opts.gpu_cc;
  pr->param_dtype = g.param_dtype;
  pr->reduce_dtype = g.reduce_dtype;
  pr->rank = rank;
  pr->stage = stage;
  pr->mode = mode;
  pr->st = st;
  pr->sh = g.sh;
  pr->has_fsdp = g.has_fsdp;
  pr->ui = g.ui;
  pr->n_ui = g.n_ui;
  pr->first_unit = g.first_unit;
  pr->n_units = g.n_units;
  pr->root_unit = g.root_unit;
  pr->params_numel = params_numel;
  pr->rest = rest;
  pr->run_len = run_len;
  pr->flops_per_token = mp_model_flops_per_token(&p->model, p->opts.seq);
  *out = pr;
  return MP_OK;
}

mp_status mp_schedule_prep_create(mp_ctx *ctx, const mp_plan *p, int rank,
                                  mp_schedule_mode mode, mp_arena *arena,
                                  mp_schedule_prep **out) {
  *out = NULL;
  MP_CHECK(mp_sched_check_plan_rank(ctx, p, rank));
  return mp_sched_prep_fill(ctx, p, rank, mode, arena, out);
}

/* The prep serves p: same parameters and units (the same tables), mesh and the options
 * that shape what it read. */
int mp_sched_prep_serves(const mp_schedule_prep *pr, const mp_plan *p) {
  mp_dtype pdt, rdt;
  gen_dtypes(p, &pdt, &rdt);
  return pr->params == p->params && pr->units == p->units && pr->n_params == p->n_params &&
         pr->n_plan_units == p->n_units && pr->applied == p->applied &&
         memcmp(&pr->mesh, &p->mesh, sizeof pr->mesh) == 0 && pr->seq == p->opts.seq &&
         pr->fp8_all_gather == p->opts.fp8_opts.all_gather &&
         pr->fp8_param_gather == p->opts.fp8_opts.param_gather && pr->gpu_cc == p->opts.fp8_opts.gpu_cc &&
         pr->sh.fp8_recipe == p->opts.fp8_opts.recipe &&
         pr->param_dtype == pdt && pr->reduce_dtype == rdt &&
         pr->sh.sp == (p->mesh.size[MP_DIM_TP] > 1 && p->opts.sp == 1);
}
