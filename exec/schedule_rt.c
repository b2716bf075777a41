/* Step schedule builder: the meshplan runtimes' memory models (the builder's overview:
 * schedule.c).
 *
 * MP_MEM_MODEL_MESHPLAN_CPU is the runtime (exec/runtime/) on the CPU, event for event, so
 * the replayed peak is the tracked allocator's peak (checked per plan by
 * tests/runtime/parity_matrix.py and schedule_memory_test). The tensors it allocates outside
 * the parameters, their sizes and how they are carved are the activation layout's
 * (exec/act_layout.h), which the runtime carves by and rt_mem sizes every event by. Its
 * differences from the torchtitan model:
 *   - every tensor fp32; resident: the padded FSDP shards (FSDP2's equal chunks) x 4 (master,
 *     gradient, AdamW m and v), plus the layout's resident allocations (RoPE tables,
 *     scalars; TEMP);
 *   - per micro-batch: token ids (TEMP); x[0] (the stage input) and each block's output
 *     x[l + 1] (ACTIVATIONS), x[l + 1] freed as block l's backward starts;
 *   - a block: its BLOCK allocation (the saved tensors) and its CORE (the attention core);
 *     selective-core frees the core after forward and recomputes only it (from the saved q,
 *     k, v), full frees both and refills them without the block's output projections (the
 *     runtime runs no other AC policy: mp_plan_create refuses them);
 *   - backward: one WS workspace per block, DRES and DXF from the head; the HEAD and LOGITS
 *     allocations kept to the head's backward, with DLOGITS;
 *   - FSDP: no prefetch (blocking MPI collectives): a block's units are gathered as it
 *     starts; a one-rank group is used in place (no gathered or unsharded buffer); gathered
 *     and unsharded-gradient buffers hold a 64-byte-aligned slot of gsize padded shards per
 *     parameter; the reduce-scatter stages one padded shard; all of a block's units are
 *     reduced after its whole backward, then resharded (schedule_fsdp.c);
 *   - float8: fake-quantized fp32 copies of input and weight (and output gradient in
 *     backward) around each float8 GEMM (FP8), or, with the plan's f8_codes, float8 on codes
 *     as meshplan-cuda runs it;
 *   - EP: the expert side (EPA: received rows, gate/up/hidden) is saved apart, the expert
 *     outputs wait in EP_OUT (COMM) for the combine, backward has an EP_WS workspace. Their
 *     size is the rows a rank receives, which routing decides at run time; the model uses
 *     the balanced count N x top_k (the mean over the EP group, exactly: every row sent
 *     is received), so the busiest rank measures more (tests/runtime/parity_matrix.py
 *     bounds the excess by the rows the run really received).
 * MP_MEM_MODEL_MESHPLAN_CUDA is the same runtime on the CUDA backend (bf16 X tensors), also
 * event for event: the model above with the backend's properties (its mem_strategy: x_bytes,
 * host_mem, overlap), not a copy of it (checked byte for byte, per category, against an accounting
 * backend with bf16 X tensors by tests/runtime/schedule_memory_test). Its differences:
 *   - X tensors (activations, their gradients, logits, compute copies) are bf16, 2 bytes;
 *     statistics (rstd, lse, router probabilities, losses) stay fp32 and ids int32 (the
 *     layout's element types), so the CPU model is the case X = 4;
 *   - resident besides the fp32 state: a bf16 compute copy (PARAMS) of every parameter
 *     that is not FSDP-sharded; the layout's STAGE for host-value collectives (TEMP: the
 *     backend's memory is not host memory); the float8 codes of every float8 weight that is
 *     not FSDP-sharded (FP8; made at its first use in the first step and kept, so the
 *     schedule holds them from the prologue: a later step's memory);
 *   - FSDP units gathered in bf16, one ALIGN64(gsize x padded shard x 2 bytes) slot per
 *     parameter; the unsharded gradients have as many fp32 elements as the slots have bf16;
 *   - float8 as real codes: an operand is one FP8 allocation of its codes in both
 *     orientations, amax and scale (mp_act_f8_operand_bytes). A block's E4M3 activations
 *     (xn1 for q/k/v, the attention output for o, xn2 for gate/up, the SwiGLU output for
 *     down) are quantized once in its forward (and once in its backward, where only the
 *     transposed codes are wanted, written directly) and freed when it ends; an
 *     FSDP-sharded weight is quantized around each GEMM; backward adds the output
 *     gradient's operand (E5M2) around each GEMM, whose input gradient is added into X;
 *   - NCCL when ranks > 1 (the model assumes a GPU per rank; ranks sharing a GPU stage
 *     through MPI, which has neither of these two and is the CPU model's order): forward
 *     gathers the next block's units as a block starts (torchtitan's one block of
 *     prefetch), backward prefetches the block below when resharded (the top block
 *     gathers its own once the head is done); a unit's reduce-scatter goes out into a
 *     buffer of one 16-float-aligned slot per sharded parameter and is finished at the
 *     next sharded unit's turn or the end of the micro-batch, so that buffer and the
 *     unit's unsharded gradients live through the next unit's backward. */
#include "exec/schedule_internal.h"

/* The memory event of an allocation of the runtime's activation layout (exec/act_layout.h)
 * for a block of `kind` (outside blocks both kinds agree), with the category the runtime
 * allocates it in. Nothing where the allocation does not exist (the table's condition
 * gives it no bytes: the expert side without EP, say) and nothing under the torchtitan
 * model, whose memory has events of its own. */
void mp_sched_rt_mem(gen *g, mp_act_alloc a, int kind, int alloc) {
  if (!g->ms->runtime) return;
  static const struct {
    uint8_t cat, buf;
  } k_ev[MP_ACT_ALLOC_COUNT] = {
      [MP_ACT_ALLOC_BLOCK] = {MP_MEM_ACTIVATIONS, BUF_RT_BLOCK},
      [MP_ACT_ALLOC_CORE] = {MP_MEM_ACTIVATIONS, BUF_RT_CORE},
      [MP_ACT_ALLOC_WS] = {MP_MEM_TEMP, BUF_BWD_WS},
      [MP_ACT_ALLOC_EPA] = {MP_MEM_ACTIVATIONS, BUF_RT_EPA},
      [MP_ACT_ALLOC_EP_WS] = {MP_MEM_TEMP, BUF_RT_EP_WS},
      [MP_ACT_ALLOC_HEAD] = {MP_MEM_ACTIVATIONS, BUF_RT_HEAD},
      [MP_ACT_ALLOC_LOGITS] = {MP_MEM_LOGITS, BUF_LOGITS},
      [MP_ACT_ALLOC_DLOGITS] = {MP_MEM_LOGITS, BUF_DLOGITS},
      [MP_ACT_ALLOC_X] = {MP_MEM_ACTIVATIONS, BUF_RT_X},
      [MP_ACT_ALLOC_DRES] = {MP_MEM_TEMP, BUF_RT_DRES},
      [MP_ACT_ALLOC_DXF] = {MP_MEM_TEMP, BUF_RT_DXF},
      [MP_ACT_ALLOC_SHARED_OUT] = {MP_MEM_TEMP, BUF_RT_SHARED},
      [MP_ACT_ALLOC_EP_OUT] = {MP_MEM_COMM, BUF_RT_EP_OUT},
      [MP_ACT_ALLOC_TOKENS] = {MP_MEM_TEMP, BUF_RT_TOKENS},
      [MP_ACT_ALLOC_SP_FULL] = {MP_MEM_TEMP, BUF_RT_SP_FULL},
      [MP_ACT_ALLOC_CP_FWD] = {MP_MEM_TEMP, BUF_RT_CP},
      [MP_ACT_ALLOC_CP_BWD] = {MP_MEM_TEMP, BUF_RT_CP},
  };
  pair(g, (mp_mem_cat)k_ev[a].cat, k_ev[a].buf, (int64_t)g->layout[kind].bytes[a], alloc);
}

/* The runtimes' SP: the [N, C] side of a region's boundary collective (SP_FULL) allocated
 * (alloc) or freed around it, in the runtime's order: before a rowwise Linear's forward
 * and freed after its reduce-scatter; before the residual gradient's all-gather and freed
 * after the Linear's backward that reads it (exec/runtime/runtime_sp.c). Nothing without
 * SP or outside the runtime models. */
void mp_sched_rt_sp(gen *g, int alloc) {
  if (g->ms->runtime && g->sh.sp) mp_sched_rt_mem(g, MP_ACT_ALLOC_SP_FULL, KIND_DENSE, alloc);
}

/* Runtime models: the activation layout (exec/act_layout.h) for one micro-batch of this
 * rank, from its local shapes. X elements are g->ms->x_bytes bytes (fp32 on the CPU, bf16 on CUDA).
 * Under EP the expert side is sized by the rows a rank receives, which routing decides at
 * run time: the balanced count NR x top_k is used (each rank sends NR x top_k rows, NR the
 * tokens it routes; with uniform routing it receives as many), and under expert tensor
 * parallelism the etp x NR x top_k rows its expert-TP group gathers, with one rank's block
 * (NR x top_k rows) of receive space for the outputs' reduce-scatter (runtime_etp.c). */
void mp_sched_rt_layout_fill(gen *g, int64_t micro_batch) {
  const shapes *sh = &g->sh;
  const mp_act_dims d = {.B = micro_batch, .S = sh->seq / sh->cp, .N = sh->tokens, .NS = sh->tokens_sp, .C = sh->d_model,
                         .HD = sh->head_dim, .DV = sh->v_head_dim, .RD = sh->mla ? sh->rope_dim : sh->head_dim,
                         .mla = sh->mla, .QL = sh->q_lora, .KL = sh->kv_lora,
                         .DN = sh->head_dim - sh->rope_dim, .DR = sh->rope_dim,
                         .NH = sh->heads, .NKV = sh->kv_heads, .F = sh->d_ff, .E = sh->experts, .K = sh->top_k,
                         .Fe = sh->d_ff_expert, .Fs = sh->has_shared ? sh->d_ff_shared : 0, .Vl = sh->vocab_local,
                         .NR = sh->moe_tokens, .R = sh->moe_tokens * sh->top_k * sh->etp_rows,
                         .RB = sh->etp_rows > 1 ? sh->moe_tokens * sh->top_k : 0, .L = g->p->model.n_layers,
                         .NP = g->p->n_params, .xs = g->ms->x_bytes, .tp = sh->tp, .ep = sh->ep,
                         .sp = sh->sp, .cp = sh->cp, .host_mem = g->ms->host_mem};
  mp_act_layout_fill(&g->layout[KIND_DENSE], &d, 0);
  mp_act_layout_fill(&g->layout[KIND_MOE], &d, 1);
}

/* ---- float8 on codes (meshplan-cuda, and meshplan-cpu with f8_codes) ------------------ */

/* The activation a block's float8 Linear reads (mp_module_f8_source; the runtimes run no
 * other module's Linear in float8, so the rest share slot 3). Linears reading the same one
 * share its operand. */
int mp_sched_f8_source(int module) {
  const int src = mp_module_f8_source((mp_module)module);
  return src >= 0 ? src : 3;
}

/* The E4M3 operand of that activation: quantized by the first Linear of the block's
 * forward (or backward) that reads it, kept to the block's end (the runtime's f8 scope).
 * Backward wants only its transposed codes, which f8_quantize_t writes directly (no
 * temporary), into an operand of the same size. */
void mp_sched_rt_f8_act(gen *g, int module, int64_t elems) {
  const int src = mp_sched_f8_source(module);
  if (g->fp8_scope & (1u << src)) return;
  g->fp8_scope |= 1u << src;
  g->fp8_scope_bytes[src] = mp_act_f8_operand_bytes(elems);
  pair(g, MP_MEM_FP8, BUF_F8_ACT + src, g->fp8_scope_bytes[src], 1);
}

/* The runtime's float8 cast on codes (f8_quant), kernel by kernel: f8_amax over the X
 * tensor unless its amax is known (computed by the kernel that produced the tensor, or
 * kept from the forward), f8_scale_from_amax, and f8_quantize_t reading the tensor once
 * and writing `orient` orientations of one-byte codes. */
void mp_sched_rt_f8_cast(gen *g, int module, int64_t elems, int amax, int orient, mp_variant v) {
  if (amax)
    compute(g, MP_KERNEL_FP8_CAST, v, module, elems, 0, 0, 1, 2.0 * (double)elems,
            (double)g->ms->x_bytes * (double)elems, MP_DTYPE_BF16);
  compute(g, MP_KERNEL_FP8_CAST, v, module, 1, 0, 0, 1, 1.0, 8.0, MP_DTYPE_FP32);
  compute(g, MP_KERNEL_FP8_CAST, v, module, elems, 0, 0, 1, FLOPS_CAST * (double)elems,
          (double)(g->ms->x_bytes + orient) * (double)elems, MP_DTYPE_BF16);
}

/* The end of a block's forward or backward: its activation operands go. */
void mp_sched_rt_f8_scope_close(gen *g) {
  for (int src = 0; src < 4; src++)
    if (g->fp8_scope & (1u << src)) pair(g, MP_MEM_FP8, BUF_F8_ACT + src, g->fp8_scope_bytes[src], 0);
  g->fp8_scope = 0;
}

/* ---- a block, the resident state, the optimizer --------------------------------------- */

/* A block's forward ops as the runtimes run them, into its allocated tensors; its float8
 * activation codes go at the end. */
static void rt_forward_ops(gen *g, int kind, const part_deps *pd) {
  mp_sched_attention_fwd(g, pd);
  mp_sched_attention_out_fwd(g);
  mp_sched_mlp_fwd(g, kind, pd);
  mp_sched_rt_f8_scope_close(g);
}

/* A block's forward as the meshplan runtimes run it: the block's saved tensors, its
 * attention core and its output x[l + 1] allocated at its start; full AC then keeps only
 * x[l], selective-core drops the core. */
void mp_sched_rt_block_fwd(gen *g, int kind, const part_deps *pd) {
  const mp_ac_mode ac = g->p->opts.ac;
  mp_sched_rt_mem(g, MP_ACT_ALLOC_BLOCK, kind, 1);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_CORE, kind, 1);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_X, kind, 1);
  rt_forward_ops(g, kind, pd);
  if (ac != MP_AC_NONE) mp_sched_rt_mem(g, MP_ACT_ALLOC_CORE, kind, 0); /* selective-core, full */
  if (ac == MP_AC_FULL) {
    mp_sched_rt_mem(g, MP_ACT_ALLOC_BLOCK, kind, 0);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EPA, kind, 0);
  }
}

/* A block's backward as the meshplan runtimes run it: recompute (full: the block's saved
 * tensors; selective-core: only the attention core, from the saved q, k, v), the workspace, MLP
 * then attention backward, then the block's buffers go and its units are reduced and
 * released. */
void mp_sched_rt_block_bwd(gen *g, int32_t l, int kind, const part_deps *pd) {
  const mp_ac_mode ac = g->p->opts.ac;
  if (ac == MP_AC_FULL) {
    g->phase = MP_PHASE_RECOMPUTE;
    mp_sched_rt_mem(g, MP_ACT_ALLOC_BLOCK, kind, 1);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_CORE, kind, 1);
    rt_forward_ops(g, kind, pd);
    g->phase = MP_PHASE_BACKWARD;
  } else {
    attach(g, pd, PART_ATTN); /* the first op waits for the gathered attention part */
    if (ac == MP_AC_SELECTIVE_CORE) {
      g->phase = MP_PHASE_RECOMPUTE;
      mp_sched_rt_mem(g, MP_ACT_ALLOC_CORE, kind, 1);
      mp_sched_attention_core_fwd(g);
      g->phase = MP_PHASE_BACKWARD;
    }
  }
  mp_sched_rt_mem(g, MP_ACT_ALLOC_WS, kind, 1);
  mp_sched_mlp_bwd(g, kind, ac == MP_AC_FULL ? NULL : pd);
  mp_sched_attention_bwd(g, NULL);
  mp_sched_rt_f8_scope_close(g);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_WS, kind, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_CORE, kind, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_BLOCK, kind, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_EPA, kind, 0);
  /* all of the block's units are reduced after its whole backward, then resharded */
  mp_sched_reduce_units(g, l, g->first_unit[l], g->n_units[l], 0, N_PARTS - 1);
  mp_sched_free_units(g, l, g->first_unit[l], g->n_units[l], 0, N_PARTS - 1);
}

/* The runtimes' resident state: fp32 master, gradient and AdamW m, v of the padded shards;
 * X compute copies of the parameters not sharded when X is not fp32; the resident tensors
 * of the activation layout; the float8 codes of the weights not sharded. */
void mp_sched_rt_resident(gen *g, const mp_schedule_prep *pr) {
  int64_t param_bytes = 4 * pr->rest.numel_pad;
  if (g->ms->x_bytes != 4) param_bytes += g->ms->x_bytes * pr->rest.numel_rep;
  mp_sched_resident(g, MP_MEM_PARAMS, BUF_PARAMS, param_bytes);
  mp_sched_resident(g, MP_MEM_OPTIMIZER, BUF_OPTIMIZER, 8 * pr->rest.numel_pad);
  mp_sched_resident(g, MP_MEM_GRADS, BUF_GRADS, 4 * pr->rest.numel_pad);
  mp_sched_resident(g, MP_MEM_TEMP, BUF_RT_RESIDENT, mp_act_resident_bytes(&g->layout[KIND_DENSE]));
  if (g->fp8_codes && pr->rest.f8w_bytes > 0) mp_sched_resident(g, MP_MEM_FP8, BUF_RT_F8W, pr->rest.f8w_bytes);
}

/* The runtime's end of a chunk's backward: dres and x[0] go; after the stage's last chunk
 * the root's reduce-scatter (and every one still in flight), its gathered parameters and
 * the token ids. */
void mp_sched_rt_chunk_bwd_end(gen *g, int last_chunk) {
  mp_sched_rt_mem(g, MP_ACT_ALLOC_DRES, KIND_DENSE, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_X, KIND_DENSE, 0);
  if (!last_chunk) return;
  if (g->root_unit >= 0) mp_sched_reduce_units(g, -1, g->root_unit, 1, 0, 0);
  mp_sched_rt_rs_finish(g);
  if (g->root_unit >= 0) mp_sched_free_units(g, -1, g->root_unit, 1, 0, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_TOKENS, KIND_DENSE, 0);
}

/* What the runtime models hold of one parameter of the stage (sharded over a group of
 * gs, its tile `local` elements of n tp-local ones). A sharded parameter keeps the padded
 * chunk on every rank of its group (FSDP2's equal shards), whatever its own tile; the
 * gathered buffer holds gs such chunks per parameter, each slot 64-byte aligned. One not
 * sharded has a resident compute copy when X is not fp32 (CUDA), and, float8, the codes
 * of that copy from its first GEMM on. */
void mp_sched_rt_add_param(rt_rest *rest, unit_info *ui, const mp_param *prm, int gs,
                           int64_t local, int64_t n) {
  const int64_t pad = gs > 1 ? mp_param_padded_shard_numel(prm, gs) : local;
  rest->numel_pad += pad;
  rest->t_pad[rest->n_t] = pad;
  rest->t_f8[rest->n_t] = gs <= 1 && prm->float8;
  rest->t_spn[rest->n_t] = prm->module == MP_MOD_ATTN_NORM || prm->module == MP_MOD_FFN_NORM ||
                           prm->module == MP_MOD_FINAL_NORM;
  rest->t_rep[rest->n_t++] = gs <= 1;
  if (gs > 1) {
    ui->rt_gather_x4 += mp_act_gather_slot_bytes(gs, pad, 4);
    ui->rt_gather_x2 += mp_act_gather_slot_bytes(gs, pad, 2);
    ui->rt_rs_numel += mp_act_rs_slot_floats(pad);
    if (pad > ui->rt_max_pad) ui->rt_max_pad = pad;
  } else {
    rest->numel_rep += pad;
    if (prm->float8) rest->f8w_bytes += mp_act_f8_operand_bytes(n);
  }
}

/* The runtimes' optimizer step (mp_runtime_optimizer_step), tensor by tensor as it runs:
 * per parameter tensor a sum of squares of its gradient shard (4 bytes an
 * element read), the norm's all-reduce over the world, then per tensor AdamW (7 fp32
 * tensors) and, for a resident compute copy (not sharded, X not fp32: CUDA), its refresh
 * from the master (fp32 read, X written). Then the gradients' zero fill, which the runtime
 * makes at the start of the next step (mp_runtime_forward_backward): costed here, where
 * nothing overlaps it either. One op per tensor, so each pays the kernel overhead the
 * runtime's launches do. (The runtime sums squares only of the tensors this rank owns
 * once over tp and dp_replicate; every local tensor is counted here, a few norm weights
 * more under tp.) */
void mp_sched_rt_optimizer(gen *g, const mp_schedule_prep *pr, int world_reduce) {
  const rt_rest *r = &pr->rest;
  /* SP: each norm weight's gradient summed over the sequence shards, in place over tp
   * (Megatron-LM's all-reduce of the sequence-parallel norms' gradients, finalize_model_grads),
   * once per step before the norm */
  for (int32_t t = 0; t < r->n_t && g->sh.sp; t++)
    if (r->t_spn[t]) {
      const int32_t i = comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_TP, MP_STREAM_COMPUTE,
                             4.0 * (double)r->t_pad[t], MP_DTYPE_FP32, -1);
      add_dep(g, i, g->last_reduce, 0);
    }
  /* CP: the gradients of the parameters not reduce-scattered over dp_shard x cp (not
   * FSDP-sharded), summed over cp (exec/runtime/runtime_cp.c, mp_rt_cp_grads) */
  for (int32_t t = 0; t < r->n_t && g->sh.cp > 1; t++)
    if (r->t_rep[t]) {
      const int32_t i = comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_CP, MP_STREAM_COMPUTE,
                             4.0 * (double)r->t_pad[t], MP_DTYPE_FP32, -1);
      add_dep(g, i, g->last_reduce, 0);
    }
  for (int32_t t = 0; t < r->n_t; t++) {
    const int64_t n = r->t_pad[t];
    int32_t i = compute(g, MP_KERNEL_GRAD_NORM, MP_VAR_FWD, -1, n, 0, 0, 1, 2.0 * (double)n,
                        4.0 * (double)n, MP_DTYPE_FP32);
    if (t == 0) add_dep(g, i, g->last_reduce, 0);
  }
  if (world_reduce)
    comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_WORLD, MP_STREAM_COMPUTE, 4.0, MP_DTYPE_FP32, -1);
  for (int32_t t = 0; t < r->n_t; t++) {
    const int64_t n = r->t_pad[t];
    compute(g, MP_KERNEL_OPTIMIZER, MP_VAR_FWD, -1, n, 0, 0, 1, FLOPS_ADAMW * (double)n,
            BYTES_ADAMW * (double)n, MP_DTYPE_FP32);
    if (r->t_rep[t] && g->ms->x_bytes != 4)
      compute(g, MP_KERNEL_COPY, MP_VAR_FWD, -1, n, 0, 0, 1, 0.0, (4.0 + g->ms->x_bytes) * (double)n,
              MP_DTYPE_FP32);
    /* the resident codes of an updated float8 weight: the runtime quantizes them again at
     * their first GEMM of the next step (f8_weight), costed here, once per step */
    if (g->fp8_codes && r->t_f8[t]) mp_sched_rt_f8_cast(g, -1, n, 1, 2, MP_VAR_FWD);
  }
  for (int32_t t = 0; t < r->n_t; t++)
    compute(g, MP_KERNEL_COPY, MP_VAR_FWD, -1, r->t_pad[t], 0, 0, 1, 0.0, 4.0 * (double)r->t_pad[t],
            MP_DTYPE_FP32);
}
