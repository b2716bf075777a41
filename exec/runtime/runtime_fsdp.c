/* The training runtime: FSDP units (runtime_internal.h lists the runtime's files).
 *
 * Gather: every rank contributes its padded shard (numel_pad) and receives group x
 * numel_pad; since shards are contiguous row chunks of the compute tensor in group order,
 * the first tp_numel elements of the slot ARE the compute tensor. Gradients: the unit's
 * backward accumulates into an unsharded, zeroed buffer with the same slots; the
 * reduce-scatter (sum) hands each rank its chunk, which is added to the gradient shard.
 * With overlapped comm (NCCL) a layer's gathers go out as one async batch before the
 * compute they hide behind, and a unit's reduce-scatter stays in flight through the next
 * unit's backward; with blocking comm (MPI) both happen where the step program asks. A
 * unit whose group has one rank is used in place: nothing is gathered or reduced. */
#include "exec/runtime/runtime_internal.h"

static mp_status unit_gather(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (!U->sharded || U->buf) return MP_OK;
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_GATHERED, (size_t)U->gather_numel * rt->xs, (void **)&U->buf));
  mp_comm_profile_unit_op(rt->comm, U->group); /* the schedule's one gather op, a call per tensor here */
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  for (int k = 0; k < pu->n_params; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (!r->sharded) continue;
    /* FSDP2 mixed precision: the fp32 shard is cast to X into its own chunk of the slot,
     * then gathered in place (X: bf16 on the GPU, so half the bytes travel) */
    void *slot = xoff(rt, U->buf, (size_t)r->unit_off);
    void *mine = xoff(rt, slot, (size_t)mp_comm_group_index(rt->comm, U->group) * (size_t)r->numel_pad);
    BE(x_from_f32(rt->kc, mine, r->w, (size_t)r->numel_pad));
    MP_CHECK(mp_comm_all_gather(ctx, rt->comm, U->group, mine, slot, (size_t)r->numel_pad, rt->xdt));
    r->cw = slot;
  }
  return MP_OK;
}

mp_status mp_rt_unit_release(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (U->holds > 1) {
    U->holds--;
    return MP_OK;
  }
  U->holds = 0;
  if (!U->buf) return MP_OK;
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  for (int k = 0; k < pu->n_params; k++)
    if (rt->prm[pu->params[k]].sharded) rt->prm[pu->params[k]].cw = NULL;
  MP_CHECK(mp_talloc_free(ctx, rt->ta, U->buf));
  U->buf = NULL;
  return MP_OK;
}

mp_status mp_rt_unit_grad_begin(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (!U->sharded) return MP_OK;
  if (U->grad_holds++ > 0) return MP_OK; /* begun by a micro-batch still in its backward */
  const size_t bytes = (size_t)U->gather_numel * sizeof(float);
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, bytes, (void **)&U->gbuf)); /* zero-filled */
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  for (int k = 0; k < pu->n_params; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (r->sharded) r->cg = U->gbuf + r->unit_off;
  }
  return MP_OK;
}

/* Overlap: the unit's reduce-scatters go out as one async batch into U->rs; unit_rs_finish
 * (at the next unit's grad_end, or the end of the micro-batch) waits for them, adds each
 * chunk into its gradient shard and frees the buffers. */
static mp_status unit_rs_issue(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  size_t total = 0;
  for (int k = 0; k < pu->n_params; k++)
    if (rt->prm[pu->params[k]].sharded) total += (size_t)mp_act_rs_slot_floats(rt->prm[pu->params[k]].numel_pad);
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_TEMP, total * sizeof(float), (void **)&U->rs));
  mp_comm_profile_unit_op(rt->comm, U->group); /* the schedule's one reduce-scatter op */
  MP_CHECK(mp_comm_async_begin(ctx, rt->comm));
  mp_status st = MP_OK;
  size_t o = 0;
  for (int k = 0; k < pu->n_params && st == MP_OK; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (!r->sharded) continue;
    st = mp_comm_reduce_scatter(ctx, rt->comm, U->group, r->cg, U->rs + o, (size_t)r->numel_pad, MP_COMM_DTYPE_FP32,
                                MP_COMM_OP_SUM);
    o += (size_t)mp_act_rs_slot_floats(r->numel_pad);
    r->cg = NULL;
  }
  mp_status s2 = mp_comm_async_end(ctx, rt->comm, &U->rs_req);
  MP_CHECK(st);
  MP_CHECK(s2);
  U->rs_pending = 1;
  return MP_OK;
}

static mp_status unit_rs_finish(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (!U->rs_pending) return MP_OK;
  U->rs_pending = 0;
  MP_CHECK(mp_comm_wait(ctx, rt->comm, &U->rs_req));
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  size_t o = 0;
  for (int k = 0; k < pu->n_params; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (!r->sharded) continue;
    BE(accumulate_f32(rt->kc, r->g, U->rs + o, (size_t)r->numel_pad));
    o += (size_t)mp_act_rs_slot_floats(r->numel_pad);
  }
  MP_CHECK(mp_talloc_free(ctx, rt->ta, U->rs));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, U->gbuf));
  U->rs = NULL;
  U->gbuf = NULL;
  return MP_OK;
}

/* Every reduce-scatter still in flight (overlap), in unit order. */
mp_status mp_rt_rs_finish_all(mp_ctx *ctx, mp_runtime *rt) {
  for (int u = 0; u < rt->n_units; u++) MP_CHECK(unit_rs_finish(ctx, rt, u));
  return MP_OK;
}

mp_status mp_rt_unit_grad_end(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (!U->sharded) return MP_OK;
  if (U->grad_holds > 1) { /* another micro-batch's backward still adds into the buffer */
    U->grad_holds--;
    return MP_OK;
  }
  U->grad_holds = 0;
  if (rt->overlap) { /* the previous unit's reduce-scatter has had this unit's backward to run */
    MP_CHECK(mp_rt_rs_finish_all(ctx, rt));
    return unit_rs_issue(ctx, rt, u);
  }
  float *tmp;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, (size_t)U->max_pad * sizeof(float), (void **)&tmp));
  mp_comm_profile_unit_op(rt->comm, U->group); /* the schedule's one reduce-scatter op */
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  mp_status st = MP_OK;
  for (int k = 0; k < pu->n_params && st == MP_OK; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (!r->sharded) continue;
    st = mp_comm_reduce_scatter(ctx, rt->comm, U->group, r->cg, tmp, (size_t)r->numel_pad, MP_COMM_DTYPE_FP32,
                                MP_COMM_OP_SUM);
    if (st == MP_OK && rt->be->accumulate_f32(rt->kc, r->g, tmp, (size_t)r->numel_pad) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "accumulating the gradient shard of %s: %s", rt->plan->params[pu->params[k]].fqn,
                    mp_errmsg(rt->kc->err));
    r->cg = NULL;
  }
  mp_status s2 = mp_talloc_free(ctx, rt->ta, tmp);
  MP_CHECK(st);
  MP_CHECK(s2);
  MP_CHECK(mp_talloc_free(ctx, rt->ta, U->gbuf));
  U->gbuf = NULL;
  return MP_OK;
}

/* Apply f to every unit of `layer` (-1: the root units outside blocks), in unit order. */
typedef mp_status (*unit_fn)(mp_ctx *, mp_runtime *, int);

static mp_status for_units(mp_ctx *ctx, mp_runtime *rt, int layer, unit_fn f) {
  for (int u = 0; u < rt->n_units; u++)
    if (rt->plan->units[u].layer == layer) MP_CHECK(f(ctx, rt, u));
  return MP_OK;
}

/* Overlap: the gathers of `layer`'s units as one async batch, issued before the compute
 * they should hide behind; gather_wait makes compute queued afterwards see them. Without
 * overlap gather_prefetch does nothing and gather_wait gathers (blocking). */
static mp_status gather_prefetch(mp_ctx *ctx, mp_runtime *rt, int layer) {
  if (!rt->overlap || layer < 0 || layer >= rt->L) return MP_OK;
  for (int u = 0; u < rt->n_units; u++) {
    rt_unit *U = &rt->units[u];
    if (rt->plan->units[u].layer != layer || !U->sharded || U->buf) continue;
    MP_CHECK(mp_comm_async_begin(ctx, rt->comm));
    mp_status st = unit_gather(ctx, rt, u);
    mp_status s2 = mp_comm_async_end(ctx, rt->comm, &U->gather_req);
    MP_CHECK(st);
    MP_CHECK(s2);
  }
  return MP_OK;
}

mp_status mp_rt_gather_wait(mp_ctx *ctx, mp_runtime *rt, int layer) {
  MP_CHECK(for_units(ctx, rt, layer, unit_gather)); /* no-op for a prefetched unit */
  for (int u = 0; u < rt->n_units; u++) {
    rt_unit *U = &rt->units[u];
    if (rt->plan->units[u].layer == layer && U->sharded) {
      MP_CHECK(mp_comm_wait(ctx, rt->comm, &U->gather_req));
      memset(&U->gather_req, 0, sizeof U->gather_req);
    }
  }
  return MP_OK;
}

/* A layer's units (-1: the root units) gathered: issued as one async batch with overlap
 * (the block waits for it, gather_wait), blocking without. A unit already gathered (held
 * by a micro-batch in flight) is held once more. */
mp_status mp_rt_gather_layer(mp_ctx *ctx, mp_runtime *rt, int layer) {
  for (int u = 0; u < rt->n_units; u++) {
    rt_unit *U = &rt->units[u];
    if (rt->plan->units[u].layer == layer && U->sharded) U->holds = U->buf ? U->holds + 1 : 1;
  }
  if (layer >= 0 && rt->overlap) return gather_prefetch(ctx, rt, layer);
  return for_units(ctx, rt, layer, unit_gather);
}
