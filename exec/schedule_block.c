/* Step schedule builder: one transformer block's ops, forward and backward, in the order
 * the step runs them (the builder's overview: schedule.c; the FLOP and byte conventions:
 * schedule_ops.c). A block's forward reads top to bottom here: attention (norm, the TP
 * region entered, q/k/v, RoPE, the core, o, the region closed, the residual add), then the
 * dense MLP (norm, gate/up, SwiGLU, down) or the MoE (router, the experts' dispatch, grouped
 * GEMMs and combine, the shared expert); its backward in reverse. What a block saves for
 * its backward under each AC policy is schedule_act.c's, multi-head latent attention's
 * projections schedule_mla.c's, the ring attention under cp schedule_cp.c's. */
#include "exec/schedule_internal.h"

/* ---- one block ------------------------------------------------------------------------ */

/* RoPE on q and k: one op, or (the runtimes call it for q, then for k) two. */
static void rope(gen *g, mp_variant v) {
  const shapes *sh = &g->sh;
  if (sh->gpt || sh->hybrid) return; /* Nemotron-H's attention has no position embedding */
  const int64_t eq = sh->tokens * sh->q_width, ek = sh->tokens * sh->kv_width;
  if (g->ms->runtime) {
    elementwise(g, MP_KERNEL_ROPE, v, -1, eq, FLOPS_ROPE, 4.0 * (double)eq);
    elementwise(g, MP_KERNEL_ROPE, v, -1, ek, FLOPS_ROPE, 4.0 * (double)ek);
  } else {
    elementwise(g, MP_KERNEL_ROPE, v, -1, eq + ek, FLOPS_ROPE, 4.0 * (double)(eq + ek));
  }
}

/* The non-gated MLP's activation on up's output (GELU, or squared ReLU: one element-wise
 * op alike, reading 2 bytes an element and writing 2 forward; backward reads the input and
 * the output gradient and writes the input gradient). */
static void plain_act(gen *g, mp_variant v, int64_t elems) {
  const int relu2 = g->sh.mlp == MP_MLP_SQUARED_RELU;
  if (v == MP_VAR_FWD)
    elementwise(g, MP_KERNEL_ACTIVATION, v, MP_MOD_UP, elems, relu2 ? FLOPS_RELU2_FWD : FLOPS_GELU_FWD,
                4.0 * (double)elems);
  else
    elementwise(g, MP_KERNEL_ACTIVATION, v, MP_MOD_UP, elems, relu2 ? FLOPS_RELU2_BWD : FLOPS_GELU_BWD,
                6.0 * (double)elems);
}

/* The residual stream's gradient: an add of its own in autograd; the runtimes' backward
 * kernels accumulate into it (ops.h: gradients accumulate), so nothing. */
static void residual_bwd(gen *g, int64_t elems) {
  if (!g->ms->runtime) mp_sched_residual(g, MP_VAR_BWD, elems);
}

/* Megatron-LM's materialized core attention on s x s scores per sequence and head
 * (Shoeybi et al. 2019): QK^T and attention x V as batched GEMMs over micro_batch x heads
 * (the full square, 2 T s q FLOPs each: the fused kernel masks, it does not skip), the
 * fused scale-mask-softmax (2 bytes read, 2 written per score) and for GPT the attention
 * dropout (its 1-byte mask written too). Backward: dV = P^T dO and dP = dO V^T, the dropout
 * and softmax backwards, dQ = dS K and dK = dS^T Q; dP lives as a TEMP. */
static void core_materialized(gen *g, int bwd) {
  const shapes *sh = &g->sh;
  const double s = (double)sh->seq, scores = (double)sh->tokens * s * (double)sh->heads;
  const int64_t batch = sh->tokens / sh->seq * sh->heads;
  if (!bwd) {
    gemm(g, MP_VAR_FWD, -1, s, sh->seq, sh->head_dim, batch, MP_DTYPE_BF16);
    compute(g, MP_KERNEL_ACTIVATION, MP_VAR_FWD, -1, (int64_t)scores, 0, 0, 1, 5.0 * scores,
            4.0 * scores, MP_DTYPE_BF16);
    if (sh->gpt)
      compute(g, MP_KERNEL_ACTIVATION, MP_VAR_FWD, -1, (int64_t)scores, 0, 0, 1, 2.0 * scores,
              5.0 * scores, MP_DTYPE_BF16);
    gemm(g, MP_VAR_FWD, -1, s, sh->v_head_dim, sh->seq, batch, MP_DTYPE_BF16);
    return;
  }
  pair(g, MP_MEM_TEMP, BUF_SCORES_GRAD, (int64_t)(2.0 * scores), 1);
  gemm(g, MP_VAR_DGRAD, -1, s, sh->v_head_dim, sh->seq, batch, MP_DTYPE_BF16);
  gemm(g, MP_VAR_DGRAD, -1, s, sh->seq, sh->v_head_dim, batch, MP_DTYPE_BF16);
  if (sh->gpt)
    compute(g, MP_KERNEL_ACTIVATION, MP_VAR_BWD, -1, (int64_t)scores, 0, 0, 1, 2.0 * scores,
            5.0 * scores, MP_DTYPE_BF16);
  compute(g, MP_KERNEL_ACTIVATION, MP_VAR_BWD, -1, (int64_t)scores, 0, 0, 1, 4.0 * scores,
          6.0 * scores, MP_DTYPE_BF16);
  gemm(g, MP_VAR_DGRAD, -1, s, sh->head_dim, sh->seq, batch, MP_DTYPE_BF16);
  gemm(g, MP_VAR_DGRAD, -1, s, sh->head_dim, sh->seq, batch, MP_DTYPE_BF16);
  pair(g, MP_MEM_TEMP, BUF_SCORES_GRAD, (int64_t)(2.0 * scores), 0);
}

/* Float8 attention's casts into cuDNN's FP8 kernel (Transformer Engine's fp8_dpa under
 * Float8CurrentScaling, as NVTE_DPA_FP8_RECIPE sets it in the MLPerf v5.1 NVFP4 configs): q, k
 * and v forward, the output gradient backward, each an amax pass and a cast (read 2 + 2,
 * write 1 byte an element, FLOPS_CAST an element). Under current scaling the kernel writes
 * its outputs (o forward, dq, dk, dv backward) in bf16 and the backward takes o in bf16
 * (NVTE_DPA_FP8CS_O_in_F16, default 1: TransformerEngine docs/envvars.rst; 'fused_attn_bwd
 * takes O in FP8 by default, this flag allows it in F16', attention/dot_product_attention/
 * context_parallel.py), so nothing is cast back. None without fp8_dpa. */
static void fp8_dpa_casts(gen *g, mp_variant v, int64_t into_fp8) {
  if (!g->sh.fp8_dpa) return;
  compute(g, MP_KERNEL_FP8_CAST, v, -1, into_fp8, 0, 0, 1, FLOPS_CAST * (double)into_fp8, 5.0 * (double)into_fp8,
          MP_DTYPE_BF16);
}

void mp_sched_attention_core_fwd(gen *g) {
  if (skipped(g, SKIP_CORE)) return;
  const shapes *sh = &g->sh;
  if (sh->cp > 1) { /* ring attention (schedule_cp.c) */
    if (g->ms->runtime) mp_sched_rt_cp_attention_fwd(g);
    else mp_sched_cp_attention_fwd(g);
    return;
  }
  if (g->p->opts.attn == MP_ATTN_MATERIALIZED) {
    core_materialized(g, 0);
    return;
  }
  const int64_t T = sh->tokens;
  fp8_dpa_casts(g, MP_VAR_FWD, T * (sh->q_width + sh->kv_width + sh->v_width));
  compute(g, MP_KERNEL_ATTENTION, MP_VAR_FWD, -1, T, sh->seq, sh->head_dim, sh->heads,
          attn_core_fwd_flops(sh),
          2.0 * (double)(T * (sh->q_width + sh->attn_out + sh->kv_width + sh->v_width)) + 4.0 * (double)(T * sh->heads),
          sh->fp8_dpa ? MP_DTYPE_FP8_E4M3 : MP_DTYPE_BF16);
}

void mp_sched_attention_core_bwd(gen *g) {
  const shapes *sh = &g->sh;
  if (sh->cp > 1) {
    if (g->ms->runtime) mp_sched_rt_cp_attention_bwd(g);
    else mp_sched_cp_attention_bwd(g);
    return;
  }
  if (g->p->opts.attn == MP_ATTN_MATERIALIZED) {
    core_materialized(g, 1);
    return;
  }
  const int64_t T = sh->tokens;
  fp8_dpa_casts(g, MP_VAR_BWD, T * sh->attn_out);
  compute(g, MP_KERNEL_ATTENTION, MP_VAR_BWD, -1, T, sh->seq, sh->head_dim, sh->heads,
          2.0 * attn_core_fwd_flops(sh),
          2.0 * (double)(T * (2 * (sh->q_width + sh->attn_out) + 2 * (sh->kv_width + sh->v_width))) +
              4.0 * (double)(T * sh->heads),
          sh->fp8_dpa ? MP_DTYPE_FP8_E5M2 : MP_DTYPE_BF16);
}

/* attention_norm on the residual stream's [Ts, H], then the attention module: the TP region
 * entered (SP: all-gather to [T, H]), q/k/v, q/k norms, RoPE, the core. */
void mp_sched_attention_fwd(gen *g, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  attach(g, pd, PART_ATTN);
  mp_sched_norm_fwd(g, MP_MOD_ATTN_NORM, sh->tokens_sp, H);
  if (sh->mla) {
    mp_sched_mla_fwd(g);
    mp_sched_attention_core_fwd(g);
    return;
  }
  const int32_t qkv = g->n_ops;
  mp_sched_tp_region_in_fwd(g, sh->tp_opens_qkv, MP_MOD_Q, mp_sched_f8_input(g, MP_MOD_Q));
  mp_sched_linear_fwd(g, MP_MOD_Q, (double)T, sh->q_width, H, 1);
  mp_sched_linear_fwd(g, MP_MOD_K, (double)T, sh->kv_width, H, 1);
  mp_sched_linear_fwd(g, MP_MOD_V, (double)T, sh->kv_width, H, 1);
  if (sh->tp_opens_qkv) mp_sched_fuse_tp(g, qkv, MP_FUSE_GATHER, MP_VAR_FWD);
  if (sh->qk_norm) {
    mp_sched_norm_fwd(g, MP_MOD_Q_NORM, T * sh->heads, sh->head_dim);
    mp_sched_norm_fwd(g, MP_MOD_K_NORM, T * sh->kv_heads, sh->head_dim);
  }
  rope(g, MP_VAR_FWD);
  mp_sched_attention_core_fwd(g);
}

/* o_proj, the region left (SP: reduce-scatter; else all-reduce), the residual add. */
void mp_sched_attention_out_fwd(gen *g) {
  const shapes *sh = &g->sh;
  mp_sched_rt_sp(g, 1);
  const int32_t o = g->n_ops;
  mp_sched_linear_fwd(g, MP_MOD_O, (double)sh->tokens, sh->d_model, sh->attn_out, 1);
  mp_sched_tp_region_out_fwd(g, sh->tp_closes_o, MP_MOD_O);
  if (sh->tp_closes_o) mp_sched_fuse_tp(g, o, MP_FUSE_SCATTER, MP_VAR_FWD);
  mp_sched_rt_sp(g, 0);
  mp_sched_residual(g, MP_VAR_FWD, sh->tokens_sp * sh->d_model);
}

/* The rows the rank's experts receive: its own routed Tk (x etp_rows, what its expert-TP
 * group gathers) when balanced, else that x the load of the slowest EP rank
 * (mp_sched_moe_rows). */
static int64_t received_rows(const shapes *sh, int64_t Tk) {
  Tk *= sh->etp_rows;
  return sh->moe_load == 1.0 ? Tk : llround((double)Tk * sh->moe_load);
}

static void swiglu(gen *g, mp_variant v, int module, int64_t elems) {
  if (v == MP_VAR_FWD)
    elementwise(g, MP_KERNEL_ACTIVATION, v, module, elems, FLOPS_SWIGLU_FWD, 6.0 * (double)elems);
  else
    elementwise(g, MP_KERNEL_ACTIVATION, v, module, elems, FLOPS_SWIGLU_BWD, 10.0 * (double)elems);
}

/* The routed experts' GEMMs: one grouped op per Linear (batch = the local experts, m_exp
 * rows each), or, in the runtimes (the runtime's experts_forward / experts_backward), one
 * GEMM per (expert-TP rank, source EP rank, local expert) block of m_exp / (ep x
 * etp_rows) rows under balanced routing (the expert-TP group's gathered blocks, etp_rows
 * of them, each holding every EP source's rows: exec/runtime/runtime_etp.c), each a launch
 * of its own and as efficient as its size: the forward's gate and up block by block, then
 * down; the backward's down, then gate and up block by block. Float8 experts keep the
 * grouped op (the runtimes run their experts without float8). */
static int expert_sources(const shapes *sh) { return sh->ep * sh->etp_rows; }

static int expert_blocks(const gen *g) {
  const shapes *sh = &g->sh;
  return g->ms->runtime && !sh->fp8[MP_MOD_EXPERTS_GATE] && !sh->fp8[MP_MOD_EXPERTS_UP] &&
                 !sh->fp8[MP_MOD_EXPERTS_DOWN]
             ? expert_sources(sh) * sh->experts_local
             : 0;
}

/* The GEMMs emitted since op `first` as grouped launches (mp_op.grouped): the frameworks'
 * grouped expert GEMMs, which the simulator prices by their padded tiles. The runtimes' own
 * experts (an op per expert and source, or their float8 ones) stay plain GEMMs. */
static void mark_grouped(gen *g, int32_t first) {
  if (g->ms->runtime || g->status != MP_OK) return;
  for (int32_t i = first; i < g->n_ops; i++)
    if (g->ops[i].type == MP_OP_COMPUTE && g->ops[i].kernel == MP_KERNEL_GEMM) g->ops[i].grouped = 1;
}

static void experts_gate_up_fwd(gen *g, int64_t H) {
  const shapes *sh = &g->sh;
  const int nb = expert_blocks(g);
  if (nb == 0) {
    const int32_t first = g->n_ops;
    mp_sched_linear_fwd(g, MP_MOD_EXPERTS_GATE, sh->tokens_per_expert, sh->d_ff_expert, H, sh->experts_local);
    mp_sched_linear_fwd(g, MP_MOD_EXPERTS_UP, sh->tokens_per_expert, sh->d_ff_expert, H, sh->experts_local);
    mark_grouped(g, first);
  }
  const double m = sh->tokens_per_expert / expert_sources(sh);
  for (int b = 0; b < nb; b++) {
    mp_sched_linear_fwd(g, MP_MOD_EXPERTS_GATE, m, sh->d_ff_expert, H, 1);
    mp_sched_linear_fwd(g, MP_MOD_EXPERTS_UP, m, sh->d_ff_expert, H, 1);
  }
}

static void experts_down_fwd(gen *g, int64_t H) {
  const shapes *sh = &g->sh;
  const int nb = expert_blocks(g);
  const int32_t first = g->n_ops;
  if (nb == 0) mp_sched_linear_fwd(g, MP_MOD_EXPERTS_DOWN, sh->tokens_per_expert, H, sh->d_ff_expert, sh->experts_local);
  mark_grouped(g, first);
  const double m = sh->tokens_per_expert / expert_sources(sh);
  for (int b = 0; b < nb; b++) mp_sched_linear_fwd(g, MP_MOD_EXPERTS_DOWN, m, H, sh->d_ff_expert, 1);
}

/* The routed experts' backward, their SwiGLU's between down and gate/up; WGRAD FLOPs with
 * the exact (fractional) rows per GEMM. */
static void experts_bwd(gen *g, int64_t H, int64_t Tk) {
  const shapes *sh = &g->sh;
  const int nb = expert_blocks(g);
  const int32_t first = g->n_ops;
  if (nb == 0) {
    mp_sched_linear_bwd(g, MP_MOD_EXPERTS_DOWN, sh->tokens_per_expert, H, sh->d_ff_expert, sh->experts_local);
    swiglu(g, MP_VAR_BWD, MP_MOD_EXPERTS_GATE, received_rows(sh, Tk) * sh->d_ff_expert);
    mp_sched_linear_bwd(g, MP_MOD_EXPERTS_GATE, sh->tokens_per_expert, sh->d_ff_expert, H, sh->experts_local);
    mp_sched_linear_bwd(g, MP_MOD_EXPERTS_UP, sh->tokens_per_expert, sh->d_ff_expert, H, sh->experts_local);
    mark_grouped(g, first);
  } else {
    const double m = sh->tokens_per_expert / expert_sources(sh);
    for (int b = 0; b < nb; b++) mp_sched_linear_bwd(g, MP_MOD_EXPERTS_DOWN, m, H, sh->d_ff_expert, 1);
    swiglu(g, MP_VAR_BWD, MP_MOD_EXPERTS_GATE, received_rows(sh, Tk) * sh->d_ff_expert);
    for (int b = 0; b < nb; b++) {
      mp_sched_linear_bwd(g, MP_MOD_EXPERTS_GATE, m, sh->d_ff_expert, H, 1);
      mp_sched_linear_bwd(g, MP_MOD_EXPERTS_UP, m, sh->d_ff_expert, H, 1);
    }
  }
  if (g->status == MP_OK)
    mp_sched_fix_wgrad_flops(g, first, nb == 0 ? sh->tokens_per_expert : sh->tokens_per_expert / expert_sources(sh));
}

/* Megatron-Core's MoE token dispatcher synchronises the host where the routed counts
 * reach it (exec/plan.h, mp_moe_host_sync): before the EP all-to-all under EP
 * ("before_ep_alltoall", DeepEP's dispatch), before the experts without it
 * ("before_finish"), in the forward and in a recompute of the layer alike. The first op the
 * host issues after it, from op `from` on, carries the mark. */
static void mark_host_sync(gen *g, int32_t from) {
  if (!mp_moe_host_sync(&g->p->model, &g->p->opts)) return;
  for (int32_t i = from; i < g->n_ops; i++)
    if (g->ops[i].type == MP_OP_COMPUTE || g->ops[i].type == MP_OP_COMM) {
      g->ops[i].host_sync = 1;
      return;
    }
}

void mp_sched_mlp_fwd(gen *g, int kind, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  /* a whole-block recompute that stops at the block's last saved tensor (rc_early_stop)
   * does not re-run a dense MLP's down projection; the runtimes' (block_forward without
   * x_out) skip a MoE block's unpermute and shared-expert output too */
  const int recompute = g->phase == MP_PHASE_RECOMPUTE;
  const int out = !(g->ms->runtime && recompute);
  const int dense_out = !(g->ms->rc_early_stop && recompute);
  attach(g, pd, PART_MOE);
  mp_sched_norm_fwd(g, MP_MOD_FFN_NORM, sh->tokens_sp, H);
  /* the MLP's region: the dense MLP's colwise Linears; a MoE block's router and experts
   * read the whole sequence too (the routed experts are replicated over tp), except where
   * Megatron-Core's MoE layer routes the shard itself (moe_on_shard), gathering only for a
   * shared expert's colwise Linears */
  const int32_t in = g->n_ops;
  const int moe_gather = sh->tp > 1 && (!sh->moe_on_shard || sh->has_shared);
  mp_sched_tp_region_in_fwd(g, kind == KIND_DENSE ? sh->tp_opens_gateup : moe_gather, MP_MOD_UP,
                   kind == KIND_DENSE && mp_sched_f8_input(g, MP_MOD_UP));
  if (kind == KIND_DENSE) {
    if (!sh->gated) {
      mp_sched_linear_fwd(g, MP_MOD_UP, (double)T, sh->d_ff, H, 1);
      if (sh->tp_opens_gateup) mp_sched_fuse_tp(g, in, MP_FUSE_GATHER, MP_VAR_FWD);
      plain_act(g, MP_VAR_FWD, T * sh->d_ff);
    } else {
      mp_sched_linear_fwd(g, MP_MOD_GATE, (double)T, sh->d_ff, H, 1);
      mp_sched_linear_fwd(g, MP_MOD_UP, (double)T, sh->d_ff, H, 1);
      if (sh->tp_opens_gateup) mp_sched_fuse_tp(g, in, MP_FUSE_GATHER, MP_VAR_FWD);
      swiglu(g, MP_VAR_FWD, MP_MOD_GATE, T * sh->d_ff);
    }
    if (!dense_out) return;
    mp_sched_rt_sp(g, 1);
    const int32_t down = g->n_ops;
    mp_sched_linear_fwd(g, MP_MOD_DOWN, (double)T, H, sh->d_ff, 1);
    mp_sched_tp_region_out_fwd(g, sh->tp_closes_down, MP_MOD_DOWN);
    if (sh->tp_closes_down) mp_sched_fuse_tp(g, down, MP_FUSE_SCATTER, MP_VAR_FWD);
    mp_sched_rt_sp(g, 0);
  } else {
    const int64_t Tk = sh->moe_tokens * sh->top_k, Tr = sh->router_tokens;
    mp_sched_linear_fwd(g, MP_MOD_ROUTER, (double)Tr, sh->experts, H, 1);
    elementwise(g, MP_KERNEL_ROUTER, MP_VAR_FWD, MP_MOD_ROUTER, Tr * sh->experts, FLOPS_ROUTER,
                6.0 * (double)(Tr * sh->experts) + 12.0 * (double)Tk);
    elementwise(g, MP_KERNEL_PERMUTE, MP_VAR_FWD, -1, Tk * H, 0.0,
                2.0 * (double)(Tr * H) + 2.0 * (double)(Tk * H));
    /* the runtimes under EP: the expert side (sized by the rows received) is saved for
     * backward; the expert outputs wait in a COMM buffer for the combine */
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EPA, kind, 1);
    const int32_t sync_from = g->n_ops;
    mp_sched_ep_alltoall(g, MP_MOD_EXPERTS_GATE, 1);
    mp_sched_etp_coll(g, MP_MOD_EXPERTS_GATE, 1);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EP_OUT, kind, 1);
    attach(g, pd, PART_EXPERTS);
    experts_gate_up_fwd(g, H);
    mark_host_sync(g, sync_from);
    swiglu(g, MP_VAR_FWD, MP_MOD_EXPERTS_GATE, received_rows(sh, Tk) * sh->d_ff_expert);
    experts_down_fwd(g, H);
    mp_sched_etp_coll(g, MP_MOD_EXPERTS_DOWN, 0);
    mp_sched_ep_alltoall(g, MP_MOD_EXPERTS_DOWN, 0);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EP_OUT, kind, 0);
    if (out) {
      mp_sched_rt_sp(g, 1); /* the runtimes' SP: the routed output on all T rows */
      elementwise(g, MP_KERNEL_UNPERMUTE, MP_VAR_FWD, -1, Tk * H, 2.0,
                  2.0 * (double)(Tk * H) + 2.0 * (double)(Tr * H));
    }
    if (sh->has_shared) {
      mp_sched_linear_fwd(g, MP_MOD_SHARED_GATE, (double)T, sh->d_ff_shared, H, 1);
      mp_sched_linear_fwd(g, MP_MOD_SHARED_UP, (double)T, sh->d_ff_shared, H, 1);
      swiglu(g, MP_VAR_FWD, MP_MOD_SHARED_GATE, T * sh->d_ff_shared);
      if (!out) return;
      mp_sched_rt_mem(g, MP_ACT_ALLOC_SHARED_OUT, kind, 1); /* the runtimes' partial sum */
      mp_sched_linear_fwd(g, MP_MOD_SHARED_DOWN, (double)T, H, sh->d_ff_shared, 1);
      mp_sched_tp_region_out_fwd(g, sh->tp_closes_shared_down, MP_MOD_SHARED_DOWN);
      mp_sched_residual(g, MP_VAR_FWD, sh->tokens_sp * H); /* routed + shared */
      mp_sched_rt_mem(g, MP_ACT_ALLOC_SHARED_OUT, kind, 0);
    }
    if (!out) return;
    mp_sched_rt_sp(g, 0); /* its rows on the shard taken */
  }
  mp_sched_residual(g, MP_VAR_FWD, sh->tokens_sp * H);
}

/* Megatron-Core's shared_experts recompute (moe/moe_layer.py experts_compute,
 * tensor_parallel.checkpoint(self.shared_experts, False, residual), core_v0.14): the shared
 * experts' forward from the MoE layer's input, kept as the layer received it (the sequence
 * shard under SP): their fc1's all-gather, gate, up, SwiGLU, down and the reduce-scatter (or
 * all-reduce) closing their TP region. */
void mp_sched_shared_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  mp_sched_tp_region_in_fwd(g, sh->tp_opens_shared_gateup, MP_MOD_SHARED_UP, 0);
  mp_sched_linear_fwd(g, MP_MOD_SHARED_GATE, (double)T, sh->d_ff_shared, H, 1);
  mp_sched_linear_fwd(g, MP_MOD_SHARED_UP, (double)T, sh->d_ff_shared, H, 1);
  swiglu(g, MP_VAR_FWD, MP_MOD_SHARED_GATE, T * sh->d_ff_shared);
  mp_sched_linear_fwd(g, MP_MOD_SHARED_DOWN, (double)T, H, sh->d_ff_shared, 1);
  mp_sched_tp_region_out_fwd(g, sh->tp_closes_shared_down, MP_MOD_SHARED_DOWN);
}

void mp_sched_mlp_bwd(gen *g, int kind, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  attach(g, pd, PART_MOE);
  if (kind == KIND_DENSE) {
    mp_sched_rt_sp(g, 1);
    const int32_t down = g->n_ops;
    mp_sched_tp_region_out_bwd(g, sh->tp_closes_down, MP_MOD_DOWN);
    mp_sched_linear_bwd(g, MP_MOD_DOWN, (double)T, H, sh->d_ff, 1);
    if (sh->tp_closes_down) mp_sched_fuse_tp(g, down, MP_FUSE_GATHER, MP_VAR_DGRAD);
    mp_sched_rt_sp(g, 0);
    const int32_t first = g->n_ops, ag = mp_sched_mg_regather(g, sh->tp_opens_gateup, MP_MOD_UP);
    if (!sh->gated) {
      plain_act(g, MP_VAR_BWD, T * sh->d_ff);
      mp_sched_linear_bwd(g, MP_MOD_UP, (double)T, sh->d_ff, H, 1);
    } else {
      swiglu(g, MP_VAR_BWD, MP_MOD_GATE, T * sh->d_ff);
      mp_sched_linear_bwd(g, MP_MOD_GATE, (double)T, sh->d_ff, H, 1);
      mp_sched_linear_bwd(g, MP_MOD_UP, (double)T, sh->d_ff, H, 1);
    }
    mp_sched_mg_regather_wait(g, ag, first);
    mp_sched_tp_region_in_bwd(g, sh->tp_opens_gateup, MP_MOD_UP);
    if (sh->tp_opens_gateup) mp_sched_bulk_tp(g, first, MP_MOD_UP);
  } else {
    const int64_t Tk = sh->moe_tokens * sh->top_k, Tr = sh->router_tokens;
    /* the runtimes' SP: the residual gradient all-gathered once for the shared expert and
     * the routed side (exec/runtime/runtime_sp.c); the routed side's input gradient is whole
     * on every tp rank, which keeps its rows on the shard: no reduce-scatter of its own */
    const int rt_sp = g->ms->runtime && sh->sp;
    mp_sched_rt_sp(g, 1);
    if (rt_sp && !sh->tp_closes_shared_down) mp_sched_tp_region_out_bwd(g, 1, MP_MOD_ROUTER);
    if (sh->has_shared) {
      mp_sched_tp_region_out_bwd(g, sh->tp_closes_shared_down, MP_MOD_SHARED_DOWN);
      mp_sched_linear_bwd(g, MP_MOD_SHARED_DOWN, (double)T, H, sh->d_ff_shared, 1);
      swiglu(g, MP_VAR_BWD, MP_MOD_SHARED_GATE, T * sh->d_ff_shared);
      mp_sched_linear_bwd(g, MP_MOD_SHARED_GATE, (double)T, sh->d_ff_shared, H, 1);
      mp_sched_linear_bwd(g, MP_MOD_SHARED_UP, (double)T, sh->d_ff_shared, H, 1);
      mp_sched_tp_region_in_bwd(g, sh->tp_opens_shared_gateup, MP_MOD_SHARED_UP);
    } else if (sh->sp && !rt_sp) { /* the routed side's to its shard, where it was gathered */
      mp_sched_tp_region_in_bwd(g, sh->tp > 1 && !sh->moe_on_shard, MP_MOD_ROUTER);
    }
    elementwise(g, MP_KERNEL_UNPERMUTE, MP_VAR_BWD, -1, Tk * H, 2.0,
                2.0 * (double)(Tr * H) + 4.0 * (double)(Tk * H));
    mp_sched_rt_sp(g, 0);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EP_WS, kind, 1); /* the expert side's gradients (EP) */
    mp_sched_ep_alltoall(g, MP_MOD_EXPERTS_DOWN, 1); /* the output gradient to the experts */
    mp_sched_etp_coll(g, MP_MOD_EXPERTS_DOWN, 1);
    attach(g, pd, PART_EXPERTS);
    experts_bwd(g, H, Tk);
    mp_sched_etp_coll(g, MP_MOD_EXPERTS_GATE, 0);
    mp_sched_ep_alltoall(g, MP_MOD_EXPERTS_GATE, 0);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EP_WS, kind, 0);
    elementwise(g, MP_KERNEL_PERMUTE, MP_VAR_BWD, -1, Tk * H, 1.0,
                2.0 * (double)(Tk * H) + 2.0 * (double)(Tr * H));
    elementwise(g, MP_KERNEL_ROUTER, MP_VAR_BWD, MP_MOD_ROUTER, Tr * sh->experts, FLOPS_ROUTER,
                10.0 * (double)(Tr * sh->experts));
    mp_sched_linear_bwd(g, MP_MOD_ROUTER, (double)Tr, sh->experts, H, 1);
  }
  mp_sched_norm_bwd(g, MP_MOD_FFN_NORM, sh->tokens_sp, H);
  residual_bwd(g, sh->tokens_sp * H);
}

void mp_sched_attention_bwd(gen *g, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  attach(g, pd, PART_ATTN);
  mp_sched_rt_sp(g, 1);
  const int32_t o = g->n_ops;
  mp_sched_tp_region_out_bwd(g, sh->tp_closes_o, MP_MOD_O);
  mp_sched_linear_bwd(g, MP_MOD_O, (double)T, H, sh->attn_out, 1);
  if (sh->tp_closes_o) mp_sched_fuse_tp(g, o, MP_FUSE_GATHER, MP_VAR_DGRAD);
  mp_sched_rt_sp(g, 0);
  mp_sched_attention_core_bwd(g);
  if (sh->mla) {
    mp_sched_mla_bwd(g);
    mp_sched_norm_bwd(g, MP_MOD_ATTN_NORM, sh->tokens_sp, H);
    residual_bwd(g, sh->tokens_sp * H);
    return;
  }
  rope(g, MP_VAR_BWD);
  if (sh->qk_norm) {
    mp_sched_norm_bwd(g, MP_MOD_K_NORM, T * sh->kv_heads, sh->head_dim);
    mp_sched_norm_bwd(g, MP_MOD_Q_NORM, T * sh->heads, sh->head_dim);
  }
  const int32_t first = g->n_ops, ag = mp_sched_mg_regather(g, sh->tp_opens_qkv, MP_MOD_Q);
  if (g->ms->runtime) { /* the runtime's order (its float8 operand of xn1 comes with q) */
    mp_sched_linear_bwd(g, MP_MOD_Q, (double)T, sh->q_width, H, 1);
    mp_sched_linear_bwd(g, MP_MOD_K, (double)T, sh->kv_width, H, 1);
    mp_sched_linear_bwd(g, MP_MOD_V, (double)T, sh->kv_width, H, 1);
  } else {
    mp_sched_linear_bwd(g, MP_MOD_V, (double)T, sh->kv_width, H, 1);
    mp_sched_linear_bwd(g, MP_MOD_K, (double)T, sh->kv_width, H, 1);
    mp_sched_linear_bwd(g, MP_MOD_Q, (double)T, sh->q_width, H, 1);
  }
  mp_sched_mg_regather_wait(g, ag, first);
  mp_sched_tp_region_in_bwd(g, sh->tp_opens_qkv, MP_MOD_Q);
  if (sh->tp_opens_qkv) mp_sched_bulk_tp(g, first, MP_MOD_Q);
  mp_sched_norm_bwd(g, MP_MOD_ATTN_NORM, sh->tokens_sp, H);
  residual_bwd(g, sh->tokens_sp * H);
}
