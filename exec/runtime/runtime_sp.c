/* The training runtime: sequence parallelism's layout and collectives (runtime_internal.h
 * lists the runtime's files).
 *
 * Sequence parallelism with tp (Korthikanti et al. 2022, "Reducing Activation Recomputation
 * in Large Transformer Models", section 4.2.2; Megatron-LM's sequence_parallel, torchtitan's
 * SequenceParallel with PrepareModuleInput): outside the tensor-parallel regions every
 * token-wise op (the norms, the residual adds) runs on the rank's sequence shard, the
 * contiguous chunk tp_idx of Ns = N / tp rows of the micro-batch's N token rows (the
 * activation layout, exec/act_layout.h). A region's boundaries become:
 *   entering, forward   the norm writes its rank's chunk of the region's [N, C] input,
 *                       all-gathered there in place (Megatron's g)
 *   leaving, forward    the rowwise Linear's partial sums on [N, C] (SP_FULL),
 *                       reduce-scattered onto the shard (Megatron's g-bar)
 *   leaving, backward   the residual gradient all-gathered to [N, C] (SP_FULL) for the
 *                       rowwise Linear's backward
 *   entering, backward  the colwise Linears' partial input gradient reduce-scattered onto
 *                       the shard (dxs) for the norm's backward
 * The vocab-parallel embedding reduce-scatters its lookup; the head all-gathers the final
 * norm's output and reduce-scatters its input gradient, the loss being unchanged.
 *
 * The norms' weights are replicated over tp, and each rank's gradient covers its own rows
 * only: mp_rt_sp_norm_grads sums them over tp once per step, as Megatron-LM's
 * finalize_model_grads all-reduces the sequence-parallel LayerNorm gradients. Under the
 * expert grid the router is such a weight too: each tp rank routes its own shard
 * (runtime_block.c), as Megatron-Core marks the router's weight sequence_parallel
 * (megatron/core/transformer/moe/router.py, core_r0.12). */
#include "exec/runtime/runtime_internal.h"

void *mp_rt_sp_slot(const mp_runtime *rt, const void *full) {
  return xoff(rt, full, (size_t)rt->tp_idx * (size_t)rt->Ns * (size_t)rt->C);
}

mp_status mp_rt_sp_gather(mp_ctx *ctx, mp_runtime *rt, const void *shard, void *full) {
  if (!rt->sp) return MP_OK;
  const size_t n = (size_t)rt->Ns * (size_t)rt->C;
  return mp_comm_all_gather(ctx, rt->comm, MP_GROUP_TP, shard ? shard : mp_rt_sp_slot(rt, full), full, n, rt->xdt);
}

mp_status mp_rt_sp_full_alloc(mp_ctx *ctx, mp_runtime *rt, int zero, void **out) {
  const size_t b = act_bytes(rt, MP_ACT_ALLOC_SP_FULL);
  if (zero) return mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, b, out);
  return mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_TEMP, b, out);
}

mp_status mp_rt_sp_scatter(mp_ctx *ctx, mp_runtime *rt, const void *full, void *shard) {
  const size_t n = (size_t)rt->Ns * (size_t)rt->C;
  return mp_comm_reduce_scatter(ctx, rt->comm, MP_GROUP_TP, full, shard, n, rt->xdt, MP_COMM_OP_SUM);
}

mp_status mp_rt_sp_full_free(mp_ctx *ctx, mp_runtime *rt, mp_status st, void *full) {
  mp_status s2 = mp_talloc_free(ctx, rt->ta, full);
  MP_CHECK(st);
  return s2;
}

/* The weights whose gradient covers the shard's rows: the block norms' and the final
 * norm's, and under the expert grid the router's. */
static int shard_rows_grad(const mp_runtime *rt, mp_module m) {
  return m == MP_MOD_ATTN_NORM || m == MP_MOD_FFN_NORM || m == MP_MOD_FINAL_NORM || (rt->grid && m == MP_MOD_ROUTER);
}

mp_status mp_rt_sp_norm_grads(mp_ctx *ctx, mp_runtime *rt) {
  if (!rt->sp) return MP_OK;
  for (int i = 0; i < rt->plan->n_params; i++) {
    rt_param *r = &rt->prm[i];
    if (!r->g || !shard_rows_grad(rt, rt->plan->params[i].module)) continue;
    /* the shards of an FSDP-sharded norm are the same rows on every rank of the tp group */
    MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_TP, r->g, r->g, (size_t)r->numel_pad, MP_COMM_DTYPE_FP32,
                                MP_COMM_OP_SUM));
  }
  return MP_OK;
}
