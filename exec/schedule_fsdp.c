/* Step schedule builder: FSDP's collectives and buffers (the builder's overview:
 * schedule.c).
 *
 * FSDP2 defaults as torchtitan runs them (MP_MEM_MODEL_TORCHTITAN):
 *   - The root unit (embedding, final norm, head) is gathered at the start of forward and
 *     kept until the end of backward (FSDP2 does not reshard the root after forward).
 *   - Prefetch granularity is one block: at the start of block l's forward the all-gathers
 *     of all of block l+1's units are issued on MP_STREAM_GATHER (one unit for a dense
 *     block, attention + MoE + experts for an EP block), each waiting for block l-1's
 *     compute to finish (that is when FSDP2 issues it); the first op that uses a unit waits
 *     for its gather. With reshard_after_forward the gathered parameters are freed at the
 *     end of the block's forward and gathered again in backward, prefetched one block
 *     ahead the same way; otherwise they are freed after the block's backward.
 *   - Gradient accumulation (n_micro > 1): FSDP2 reshards after backward and
 *     reduce-scatters in every micro-batch by default (torchtitan does not turn gradient
 *     sync off), so gathers and reduce-scatters are EVERY_MICRO; only the prologue and the
 *     optimizer are ONCE.
 *   - Backward of a unit: its unsharded gradients (param dtype) are TEMP from the block's
 *     backward start; at the reduce-scatter they are copied to a reduce-dtype buffer (TEMP,
 *     FSDP2's reduce-scatter input), reduce-scattered on MP_STREAM_REDUCE into the resident
 *     GRADS, then all-reduced over dp_replicate (HSDP) and freed. A unit whose FSDP group
 *     has one rank keeps the local cast (GATHERED memory) but has no collective.
 *   - Under a pipeline (pp > 1; mp_plan_pp_fsdp): torchtitan keeps a stage's parameters
 *     gathered between micro-batches (parallelize_llama: reshard_after_forward = not
 *     pp_enabled) and torch.distributed.pipelining runs every backward but the stage's
 *     last without gradient sync and without resharding (PipelineStage's
 *     backward_maybe_with_nosync), so: the gathers are FIRST_MICRO, the gathered
 *     parameters freed LAST_MICRO after the unit's backward; each micro-batch's unsharded
 *     gradients (param dtype) are added into the unit's accumulator in the reduce dtype
 *     (FSDP2's unsharded_accumulated_grad: GRADS from the first micro-batch; the first
 *     micro-batch's conversion costs as one add), and after the chunk's last backward
 *     every unit's accumulator is reduce-scattered (its post_backward, called for all of
 *     the stage module's units at once), all-reduced over dp_replicate and freed.
 *   - Without FSDP applied (dp_shard == 1): parameters are used in place; gradients are
 *     all-reduced per block over dp_replicate when it is > 1 (DDP-style; under a pipeline
 *     only in the last micro-batch, DDP's no_sync before it).
 * The meshplan runtimes' FSDP (schedule_rt.c describes their memory): a one-rank group is
 * used in place; a unit's gathered buffer and unsharded gradients are the runtime's slots
 * (exec/act_layout.h, mp_act_gather_slot_bytes); blocking comm (MPI) reduce-scatters
 * through one staging shard, overlapped comm (NCCL) keeps one reduce-scatter in flight. */
#include "common/assert.h"
#include "exec/schedule_internal.h"

/* A unit's shard in the reduce dtype: what the dp_replicate all-reduce carries. */
static int64_t shard_bytes(const gen *g, const unit_info *ui) {
  return ui->numel_shard * mp_dtype_bytes(g->reduce_dtype);
}

/* A unit's gathered parameters in bytes: in the param dtype (torchtitan; float8 weights
 * in one byte with float8 all-gather), or the runtime's slots of X elements. 0 for a unit
 * with nothing on this stage, and for one the runtimes use in place (a one-rank group). */
static int64_t gathered_bytes(const gen *g, const unit_info *ui) {
  if (ui->numel_tp == 0) return 0;
  if (!g->ms->runtime) return (int64_t)ui->gather_bytes;
  return ui->gsize > 1 ? (g->ms->x_bytes == 2 ? ui->rt_gather_x2 : ui->rt_gather_x4) : 0;
}

/* A unit's unsharded gradients in bytes: in the param dtype (torchtitan), or fp32 slots of
 * the runtime's gathered layout (as many elements as the gathered slots hold); 0 where the
 * runtimes accumulate into the resident gradients (a one-rank group). */
static int64_t unsharded_grad_bytes(const gen *g, const unit_info *ui) {
  if (!g->ms->runtime) return ui->numel_tp * mp_dtype_bytes(g->param_dtype);
  return gathered_bytes(g, ui) / g->ms->x_bytes * 4;
}

/* Issues the all-gathers of block `layer`'s units (or the root unit when layer < 0 and
 * unit >= 0) on the gather stream. gidx receives per part the gather's op index. */
void mp_sched_gather_units(gen *g, int32_t layer, int32_t unit0, int n, int32_t gidx[N_PARTS],
                           int32_t dep_prev, int32_t *patch, int *n_patch) {
  for (int k = 0; k < N_PARTS; k++) gidx[k] = -1;
  if (!g->has_fsdp) return;
  for (int k = 0; k < n; k++) {
    const int32_t u = unit0 + k;
    const unit_info *ui = &g->ui[u];
    const int64_t gb = gathered_bytes(g, ui);
    if (gb == 0) continue;
    int32_t i = mem(g, MP_OP_ALLOC, MP_MEM_GATHERED, BUF_GATHERED, gb, layer, u, MP_STREAM_GATHER);
    if (i >= 0 && g->pp_fsdp) g->ops[i].when = MP_WHEN_FIRST_MICRO;
    /* one-rank group: the cast to the param dtype is local; the dependency anchor stays the
     * ALLOC, so users still wait for "the gathered parameters" */
    if (ui->gsize > 1) {
      i = comm(g, MP_COLL_ALL_GATHER, (mp_group)ui->group, MP_STREAM_GATHER, ui->gather_bytes,
               (mp_dtype)ui->gather_dtype, -1);
      if (i >= 0 && g->pp_fsdp) g->ops[i].when = MP_WHEN_FIRST_MICRO;
    }
    if (i >= 0) {
      g->ops[i].layer = layer;
      g->ops[i].unit = u;
      add_dep(g, i, dep_prev, 0);
      if (patch) patch[(*n_patch)++] = i;
    }
    gidx[k] = i;
  }
}

/* FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py at torch main 010ae4a8;
 * _composable/fsdp/_fsdp_collectives.py in torch 2.4-2.5, the same copy-out): a unit's parameters are gathered into
 * one flat buffer, and the first use waits for the gather on the current (compute) stream in
 * wait_for_unshard, whose foreach_all_gather_copy_out copies every parameter out of the flat
 * buffer into its own tensor (split_with_sizes_copy): one kernel on the compute stream that
 * reads and writes the gathered bytes, in the gather's dtype (float8 with float8
 * all-gather, the torchao post-all-gather hook only wrapping the copied bytes with their
 * scale). The copy runs where the gathered parameters are first used: each block part's
 * first op, the root unit's before the embedding (gathered once a micro-batch). FSDP1's flat
 * parameter is the gather's output itself (fsdp.flat_params): no copy. */
void mp_sched_gather_wait(gen *g, const int32_t dep[2], const uint8_t flags[2], int32_t unit) {
  int32_t gather = -1;
  for (int k = 0; k < 2; k++) {
    pend_dep(g, dep[k], flags[k]);
    const mp_op *o = dep[k] >= 0 ? &g->ops[dep[k]] : NULL;
    if (gather < 0 && o && o->type == MP_OP_COMM && o->coll == MP_COLL_ALL_GATHER && o->unit >= 0) gather = dep[k];
  }
  if (!g->fsdp2_copies || gather < 0 || unit < 0) return;
  /* both gathers are the unit's (one of them its previous repetition's): one copy-out, of
   * the unit's bytes; the unit is the caller's, as a compact schedule's repetitions shift it */
  const mp_op ga = g->ops[gather];
  const int32_t i = compute(g, MP_KERNEL_COPY, MP_VAR_FWD, -1, (int64_t)(ga.bytes / mp_dtype_bytes((mp_dtype)ga.dtype)),
                            0, 0, 1, 0.0, 2.0 * ga.bytes, (mp_dtype)ga.dtype);
  if (i < 0) return;
  g->ops[i].unit = unit;
  if (ga.when == MP_WHEN_FIRST_MICRO) g->ops[i].when = ga.when; /* kept gathered between micro-batches */
}

/* Megatron-LM's distributed optimizer with --overlap-param-gather: the updated
 * model-dtype parameters of units [unit0, unit0 + n) (block `layer`, or the root unit)
 * all-gathered over the data-parallel group on the gather stream in the first
 * micro-batch's forward, issued ahead of the compute (Megatron dispatches the next
 * bucket's gather as the forward reaches a bucket; issued at once, the gather stream runs
 * them in the same order), the block waiting for its own. With `after` >= 0 (the gather
 * dispatched at the block's own forward pre-hook, mp_sched_dopt_gather_at_use) it starts
 * once the compute op `after` is done, and in a repeated segment once the previous
 * repetition's compute is (the caller patches it, as mp_sched_gather_units' gathers).
 * Returns the gather, -1 where there is none. */
static int32_t dopt_gather_op(gen *g, mp_group grp, int64_t numel, int64_t f8, int32_t layer, int32_t unit0,
                              int32_t after, int32_t *patch, int *n_patch) {
  /* --fp8-param-gather: the f8 float8 weights' elements travel in their 1 byte (the param
   * buffer holds their raw float8 data: param_and_grad_buffer.py, modify_underlying_storage);
   * MXFP8's in bf16 through the gradient buffer (fp8_param_gather_bf16) */
  if (g->sh.fp8_param_gather_bf16) f8 = 0;
  const double bytes = (double)(numel - f8) * mp_dtype_bytes(g->param_dtype) + (double)f8;
  const int32_t i = comm(g, MP_COLL_ALL_GATHER, grp, MP_STREAM_GATHER, bytes, g->param_dtype, -1);
  if (i >= 0) {
    g->ops[i].layer = layer;
    g->ops[i].unit = unit0;
    g->ops[i].when = MP_WHEN_FIRST_MICRO;
    if (after >= 0) {
      add_dep(g, i, after, 0);
      MP_ASSERT(*n_patch < N_PARTS, "at most %d gathers a block to patch", N_PARTS);
      patch[(*n_patch)++] = i;
    }
  }
  return i;
}

/* The dense gather of a one-unit block split into its Megatron-Core buckets
 * (mp_sched_ddp_buckets), each its own all-gather in bucket order; the first waits for
 * `after`, the rest follow it on the gather stream. Returns the last, -1 where the unit
 * stays one bucket. */
static int32_t dopt_gather_buckets(gen *g, int32_t layer, int32_t unit0, int32_t after, int32_t *patch,
                                   int *n_patch) {
  int64_t numel[UNIT_MAX_PRM], f8[UNIT_MAX_PRM];
  const int nb = mp_sched_ddp_buckets(g, &g->ui[unit0], numel, f8);
  int32_t last = -1;
  for (int b = 0; b < nb; b++) {
    const int32_t i = dopt_gather_op(g, mp_sched_ddp_group(g), numel[b], f8[b], layer, unit0, b == 0 ? after : -1,
                                     patch, n_patch);
    if (i >= 0) last = i;
  }
  return last;
}

/* Megatron-Core's --align-param-gather where the schedule never dispatches the gathers
 * (mp_ddp_options.align_param_gather): no pipelining or 1F1B without interleaving. */
int mp_sched_dopt_gather_at_use(const gen *g) {
  return g->p->opts.ddp.align_param_gather &&
         !(g->p->mesh.size[MP_DIM_PP] > 1 && g->p->opts.pp_schedule == MP_PP_INTERLEAVED);
}

int32_t mp_sched_dopt_gather(gen *g, int32_t layer, int32_t unit0, int n, int32_t after, int32_t *patch,
                             int *n_patch) {
  if (!g->shard_optimizer || !g->p->opts.ddp.overlap) return -1;
  /* the experts' group may span ranks where an instance's dense one does not (tp wider than
   * ep x etp), or the other way round */
  const mp_group eg = mp_plan_ddp_expert_group(g->p);
  const int dense = mp_sched_dopt_ways(g) > 1, expert = mp_mesh_group_size(&g->p->mesh, eg) > 1;
  if (!dense && !expert) return -1;
  int64_t numel = 0, experts = 0, f8 = 0, f8e = 0;
  for (int k = 0; k < n; k++) {
    const unit_info *ui = &g->ui[unit0 + k];
    numel += ui->numel_tp, experts += ui->numel_expert, f8 += ui->numel_f8, f8e += ui->numel_f8_expert;
  }
  if (numel == 0) return -1;
  if (n == 1 && unit0 != g->root_unit && dense) {
    const int32_t i = dopt_gather_buckets(g, layer, unit0, after, patch, n_patch);
    if (i >= 0) return i;
  }
  /* the experts' (over expert-DP) first: the gather stream runs in order, so waiting for the
   * dense gather returned below waits for both */
  int32_t last = -1;
  if (experts > 0 && expert) last = dopt_gather_op(g, eg, experts, f8e, layer, unit0, after, patch, n_patch);
  if (numel > experts && dense)
    last = dopt_gather_op(g, mp_sched_ddp_group(g), numel - experts, f8 - f8e, layer, unit0, after, patch, n_patch);
  return last;
}

/* The all-gathers of every unit of block l (see mp_sched_gather_units). */
void mp_sched_gather_block(gen *g, int32_t l, int32_t gidx[N_PARTS], int32_t dep_prev,
                           int32_t *patch, int *n_patch) {
  mp_sched_gather_units(g, l, g->first_unit[l], g->n_units[l], gidx, dep_prev, patch, n_patch);
}

void mp_sched_free_units(gen *g, int32_t layer, int32_t unit0, int n, int part_lo, int part_hi) {
  if (!g->has_fsdp) return;
  for (int k = part_lo; k < n && k <= part_hi; k++) {
    const int32_t u = unit0 + k;
    const int64_t gb = gathered_bytes(g, &g->ui[u]);
    if (gb <= 0) continue;
    const int32_t i = mem(g, MP_OP_FREE, MP_MEM_GATHERED, BUF_GATHERED, gb, layer, u, MP_STREAM_COMPUTE);
    if (i >= 0 && g->pp_fsdp) g->ops[i].when = MP_WHEN_LAST_MICRO;
  }
}

void mp_sched_grads_alloc(gen *g, int32_t layer, int32_t unit0, int n) {
  if (!g->has_fsdp) return;
  for (int k = 0; k < n; k++) {
    const int32_t u = unit0 + k;
    const int64_t b = unsharded_grad_bytes(g, &g->ui[u]);
    if (b > 0) mem(g, MP_OP_ALLOC, MP_MEM_TEMP, BUF_GRAD_UNSHARDED, b, layer, u, MP_STREAM_COMPUTE);
  }
}

/* NCCL: the reduce-scatter in flight is finished (the runtime's unit_rs_finish): its output
 * and the unit's unsharded gradients go. */
void mp_sched_rt_rs_finish(gen *g) {
  if (!g->rs_in_flight.on) return;
  mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_RT_RS, g->rs_in_flight.rs, g->rs_in_flight.layer, g->rs_in_flight.unit,
      MP_STREAM_COMPUTE);
  mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_UNSHARDED, g->rs_in_flight.gbuf, g->rs_in_flight.layer, g->rs_in_flight.unit,
      MP_STREAM_COMPUTE);
  g->rs_in_flight.on = 0;
}

/* The group over which unit ui's gradient shards are summed over their replicas: the
 * experts' under the expert grid reaching into dp_replicate is their expert-DP group
 * (mp_mesh_expert_replica_group), every other unit's dp_replicate. */
static mp_group rep_group(const gen *g, const unit_info *ui) {
  return ui->group == MP_GROUP_EFSDP ? mp_mesh_expert_replica_group(&g->p->mesh) : MP_GROUP_DP_REPLICATE;
}

static int rep_size(const gen *g, const unit_info *ui) { return mp_mesh_group_size(&g->p->mesh, rep_group(g, ui)); }

/* Runtime models: unit u's gradients after its backward (the runtime's unit_grad_end), one
 * function per comm mode (unit_reducer picks it): rt_reduce_blocking for blocking comm
 * (MPI; the CPU), rt_reduce_overlapped for NCCL; a unit in a one-rank group alike in
 * either (rt_one_rank_done). */

/* Unit u's collectives in the runtimes: the reduce-scatter over its FSDP group when it has
 * more than one rank, then the shard's all-reduce over its replicas (rep_group) when they
 * are more than one. Returns the last, -1 where there is none. */
static int32_t rt_unit_collectives(gen *g, int32_t layer, int32_t u, int32_t after) {
  const unit_info *ui = &g->ui[u];
  const int64_t rb = ui->numel_tp * mp_dtype_bytes(g->reduce_dtype);
  int32_t last = -1;
  if (ui->gsize > 1)
    last = grad_comm(g, MP_COLL_REDUCE_SCATTER, (mp_group)ui->group, rb, layer, u, after);
  if (rep_size(g, ui) > 1)
    last = grad_comm(g, MP_COLL_ALL_REDUCE, rep_group(g, ui), shard_bytes(g, ui), layer, u, last >= 0 ? last : after);
  return last;
}

/* A unit in a one-rank group, which the runtimes accumulate into its resident gradients:
 * no buffer and no reduce-scatter, only the replicas' all-reduce. Returns 1 for such a unit
 * (its reduction done), 0 for a sharded one. */
static int rt_one_rank_done(gen *g, int32_t layer, int32_t u, int32_t after) {
  if (g->ui[u].gsize > 1) return 0;
  rt_unit_collectives(g, layer, u, after);
  return 1;
}

/* Blocking comm (MPI; the CPU): per parameter an in-place reduce-scatter from the unsharded
 * buffer into one staging shard (the largest padded shard), added into the gradient shard;
 * the staging, then the buffer, freed once the collectives are done. */
static void rt_reduce_blocking(gen *g, int32_t layer, int32_t u, int32_t after) {
  if (rt_one_rank_done(g, layer, u, after)) return;
  const unit_info *ui = &g->ui[u];
  const int64_t stage = ui->rt_max_pad * 4;
  mem(g, MP_OP_ALLOC, MP_MEM_TEMP, BUF_GRAD_RS_IN, stage, layer, u, MP_STREAM_COMPUTE);
  const int32_t last = rt_unit_collectives(g, layer, u, after);
  int32_t f = mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_RS_IN, stage, layer, u, MP_STREAM_REDUCE);
  add_dep(g, f, last >= 0 ? last : after, 0);
  mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_UNSHARDED, unsharded_grad_bytes(g, ui), layer, u,
      MP_STREAM_REDUCE);
}

/* NCCL (overlapped comm): the reduce-scatter in flight is finished first, then this unit's
 * goes out into an output buffer of one 16-float-aligned slot per sharded parameter and
 * stays in flight (mp_sched_rt_rs_finish frees its output and the unit's unsharded
 * gradients). */
static void rt_reduce_overlapped(gen *g, int32_t layer, int32_t u, int32_t after) {
  if (rt_one_rank_done(g, layer, u, after)) return;
  const unit_info *ui = &g->ui[u];
  const int64_t out = ui->rt_rs_numel * 4;
  mp_sched_rt_rs_finish(g);
  mem(g, MP_OP_ALLOC, MP_MEM_TEMP, BUF_RT_RS, out, layer, u, MP_STREAM_COMPUTE);
  rt_unit_collectives(g, layer, u, after);
  g->rs_in_flight.on = 1;
  g->rs_in_flight.layer = layer;
  g->rs_in_flight.unit = u;
  g->rs_in_flight.rs = out;
  g->rs_in_flight.gbuf = unsharded_grad_bytes(g, ui);
}

int32_t mp_sched_ddp_bucket_prep(gen *g, int64_t n, int32_t after) {
  const double rb = (double)mp_dtype_bytes(g->reduce_dtype), e = (double)n;
  const mp_ddp_options *d = &g->p->opts.ddp;
  /* these run only in the last micro-batch, so what the compute stream's next op waits for,
   * and the last compute op others wait for, stay those of every micro-batch */
  const int n_pend = g->n_pend;
  const int32_t last = g->last_compute;
  g->n_pend = 0;
  for (int k = 0; k < 2; k++) {
    if (!(k == 0 ? d->check_grads : d->scale_grads)) continue;
    /* the norm reads the bucket; the scaling reads and writes it */
    const int32_t i = compute(g, k == 0 ? MP_KERNEL_GRAD_NORM : MP_KERNEL_COPY, MP_VAR_BWD, -1, n, 0, 0, 1,
                              (k == 0 ? 2.0 : 1.0) * e, (k == 0 ? 1.0 : 2.0) * rb * e, g->reduce_dtype);
    if (i < 0) continue;
    g->ops[i].when = MP_WHEN_LAST_MICRO;
    add_dep(g, i, after, 0);
    after = i;
  }
  g->n_pend = n_pend;
  g->last_compute = last;
  return after;
}

/* Megatron-Core's buckets (param_and_grad_buffer.py at core_v0.14.0, _ParamAndGradBuffer
 * __init__): the parameters taken in reverse order, a bucket closing once it holds at least
 * bucket_size elements, so a bucket size below every parameter's makes each parameter its
 * own bucket. Float8 parameters gathered in float8 (--fp8-param-gather) sit in a buffer of
 * their own whose buckets these are; the model-dtype ones (the norms) are counted in the
 * unit's last bucket (Megatron merges their buffer's buckets into one, partition_buckets).
 * Blocks with routed experts (reduced over expert-DP apart) stay one bucket. */
int mp_sched_ddp_buckets(const gen *g, const unit_info *ui, int64_t numel[UNIT_MAX_PRM], int64_t f8[UNIT_MAX_PRM]) {
  const int64_t size = g->p->opts.ddp.bucket_size;
  if (size <= 0 || !g->ddp || ui->numel_expert > 0 || ui->n_prm == 0) return 0;
  int any_f8 = 0, nb = 0;
  for (int k = 0; k < ui->n_prm; k++) any_f8 |= ui->prm_f8[k];
  int64_t held = 0, rest = 0;
  for (int k = ui->n_prm - 1; k >= 0; k--) {
    if (any_f8 && !ui->prm_f8[k]) {
      rest += ui->prm_numel[k];
      continue;
    }
    if (held == 0) numel[nb] = 0, f8[nb] = 0, nb++;
    numel[nb - 1] += ui->prm_numel[k];
    f8[nb - 1] += any_f8 ? ui->prm_numel[k] : 0;
    held += ui->prm_numel[k];
    if (held >= size) held = 0;
  }
  if (nb == 0) return 0;
  numel[nb - 1] += rest;
  return nb;
}

/* DDP-style: n elements' gradients of unit u all-reduced (reduce-scattered with the
 * optimizer sharded) over grp when it has more than one rank, after the bucket's
 * preparation under Megatron-LM's DDP (mp_sched_ddp_bucket_prep). */
static void ddp_reduce(gen *g, mp_group grp, int64_t n, int32_t layer, int32_t u, int32_t after) {
  /* an instance of one rank reduce-scatters nothing, but its gradients still cross the
   * instances (an expert-DP group of dopt ranks: one member an instance) */
  const int inside = mp_mesh_group_size(&g->p->mesh, grp) > 1;
  if (n <= 0 || (!inside && !(g->ddp && mp_sched_dopt_across(g, grp)))) return;
  if (g->ddp) after = mp_sched_ddp_bucket_prep(g, n, after);
  const int32_t i = inside ? grad_comm(g, g->shard_optimizer ? MP_COLL_REDUCE_SCATTER : MP_COLL_ALL_REDUCE, grp,
                                       n * mp_dtype_bytes(g->reduce_dtype), layer, u, after)
                           : after;
  if (inside && i >= 0 && (g->ddp || g->p->mesh.size[MP_DIM_PP] > 1)) g->ops[i].when = MP_WHEN_LAST_MICRO;
  if (g->ddp) mp_sched_dopt_inter(g, grp, n, layer, u, i);
}

int mp_sched_dopt_across(const gen *g, mp_group grp) {
  return (grp == MP_GROUP_DOPT || grp == MP_GROUP_EDOPT) && mp_mesh_group_size(&g->p->mesh, MP_GROUP_DOPT_INTER) > 1;
}

int32_t mp_sched_dopt_inter(gen *g, mp_group grp, int64_t n, int32_t layer, int32_t u, int32_t rs) {
  if (!mp_sched_dopt_across(g, grp) || rs < 0) return -1;
  const int64_t d = mp_mesh_group_size(&g->p->mesh, grp), shard = (n + d - 1) / d;
  const int32_t i = grad_comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_DOPT_INTER, shard * mp_dtype_bytes(g->reduce_dtype),
                              layer, u, rs);
  if (i >= 0) g->ops[i].when = MP_WHEN_LAST_MICRO;
  return i;
}

/* The copy on the compute stream that makes a unit's reduce-scatter input.
 * FSDP2's reduce-scatter copy-in (foreach_reduce, _fsdp_collectives.py as above): the unit's
 * unsharded gradients chunk-cat into the reduce-scatter input in the reduce dtype
 * (torch._chunk_cat, the widening cast in the same kernel) on the current (compute) stream,
 * the reduce-scatter stream waiting for it (torch 2.5 on; torch 2.4 ran it on the
 * reduce-scatter stream and made the current stream wait for it: the compute waits either
 * way): one kernel reading and writing `bytes` (the gradients in the param dtype and the
 * input in the reduce dtype). A copy of the last micro-batch only (`when`) leaves the
 * compute op the next micro-batch's ops follow the backward's.
 * FSDP1's flat gradient (fsdp1_flat_grad; torch v2.2.0 torch/distributed/fsdp/_flat_param.py,
 * FlatParamHandle._use_unsharded_views): the forward uses each parameter as a view that
 * torch.split cuts out of the unit's flat parameter, so autograd's split_with_sizes backward
 * (torch/csrc/autograd/FunctionsManual.cpp, split_with_sizes_backward: at::cat of the views'
 * gradients) writes the flat gradient once the unit's last gradient is computed, on the
 * compute stream: the gradients' bytes read and written in the param dtype, whatever the
 * reduce dtype (a cast to it, and _runtime_utils.py _reduce_grad's pre-division of the flat
 * gradient, run on FSDP1's post-backward stream beside the compute and are not priced, as
 * FSDP2's all-gather copy-in is not). fms-fsdp's eager runs (use_orig_params False) and its
 * compiled ones (True: the parameters are the same split views in the forward) alike.
 * Returns it, or -1 where the unit has no collective or neither FSDP copies. */
static int32_t rs_copy_in(gen *g, const unit_info *ui, int64_t bytes, int32_t after, uint8_t when) {
  if (!(g->fsdp2_copies || g->fsdp1_flat_grad) || ui->gsize <= 1) return -1;
  /* the next op's pending waits (gathers) are not this copy's */
  const int n_pend = g->n_pend;
  const int32_t last_c = g->last_compute;
  g->n_pend = 0;
  const int32_t i = compute(g, MP_KERNEL_COPY, MP_VAR_BWD, -1, ui->numel_tp, 0, 0, 1, 0.0, (double)bytes,
                            g->reduce_dtype);
  g->n_pend = n_pend;
  if (when != MP_WHEN_EVERY_MICRO) g->last_compute = last_c;
  if (i < 0) return i;
  add_dep(g, i, after, 0);
  g->ops[i].unit = (int32_t)(ui - g->ui);
  g->ops[i].when = when;
  return i;
}

/* How one unit's gradients leave its backward, `after` the backward's last compute op: one
 * function per data-parallel strategy, chosen once per call of mp_sched_reduce_units
 * (unit_reducer). */
typedef void (*unit_reduce_fn)(gen *g, int32_t layer, int32_t u, int32_t after);

/* DDP-style (no FSDP applied): all-reduce the block's gradients over dp_replicate (x cp:
 * mp_sched_ddp_group); Megatron-LM only in the last micro-batch (gradients accumulate in
 * main_grad until then), here with overlap (a bucket per block), else once after the
 * backward (schedule.c). */
static void ddp_reduce_unit(gen *g, int32_t layer, int32_t u, int32_t after) {
  const unit_info *ui = &g->ui[u];
  int64_t bn[UNIT_MAX_PRM], bf8[UNIT_MAX_PRM];
  const int nb = u != g->root_unit ? mp_sched_ddp_buckets(g, ui, bn, bf8) : 0;
  for (int b = 0; b < nb && g->p->opts.ddp.overlap; b++) /* Megatron-Core's buckets */
    ddp_reduce(g, mp_sched_ddp_group(g), bn[b], layer, u, after);
  if (nb == 0 && (!g->ddp || g->p->opts.ddp.overlap)) {
    ddp_reduce(g, mp_sched_ddp_group(g), ui->numel_tp - ui->numel_expert, layer, u, after);
    ddp_reduce(g, mp_plan_ddp_expert_group(g->p), ui->numel_expert, layer, u, after); /* the experts' bucket */
  }
}

/* FSDP under a pipeline (torchtitan, mp_plan_pp_fsdp): each micro-batch's unsharded
 * gradients added into the unit's accumulator in the reduce dtype (allocated in the first
 * micro-batch), which mp_sched_pp_fsdp_reduce reduces after the chunk's last backward; the
 * unsharded gradients freed. The add waits for the backward as the compute stream orders
 * it, so `after` is not needed. */
static void pp_fsdp_accumulate_unit(gen *g, int32_t layer, int32_t u, int32_t after) {
  (void)after;
  const unit_info *ui = &g->ui[u];
  const int64_t rb = ui->numel_tp * mp_dtype_bytes(g->reduce_dtype);
  int32_t a = mem(g, MP_OP_ALLOC, MP_MEM_GRADS, BUF_GRAD_ACC, rb, layer, u, MP_STREAM_COMPUTE);
  if (a >= 0) g->ops[a].when = MP_WHEN_FIRST_MICRO;
  a = compute(g, MP_KERNEL_COPY, MP_VAR_BWD, -1, ui->numel_tp, 0, 0, 1, (double)ui->numel_tp,
              (double)(ui->numel_tp * mp_dtype_bytes(g->param_dtype) + 2 * rb), g->reduce_dtype);
  if (a >= 0) g->ops[a].unit = u;
  mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_UNSHARDED, ui->numel_tp * mp_dtype_bytes(g->param_dtype),
      layer, u, MP_STREAM_COMPUTE);
}

/* The part every FSDP strategy shares: the reduce-dtype input allocated, the copy into it
 * (rs_copy_in), the unsharded gradients freed, and the reduce-scatter over the unit's FSDP
 * group when it has more than one rank. Returns the reduce-scatter (-1: none); *from is
 * what the next collective waits for without it (the copy, else `after`). */
static int32_t fsdp_reduce_scatter(gen *g, int32_t layer, int32_t u, int32_t after, int32_t *from) {
  const unit_info *ui = &g->ui[u];
  const int64_t gb = ui->numel_tp * mp_dtype_bytes(g->param_dtype);
  const int64_t rb = ui->numel_tp * mp_dtype_bytes(g->reduce_dtype);
  mem(g, MP_OP_ALLOC, MP_MEM_TEMP, BUF_GRAD_RS_IN, rb, layer, u, MP_STREAM_COMPUTE);
  const int32_t in = rs_copy_in(g, ui, g->fsdp1_flat_grad ? 2 * gb : gb + rb, after, MP_WHEN_EVERY_MICRO);
  mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_UNSHARDED, gb, layer, u, MP_STREAM_COMPUTE);
  *from = in >= 0 ? in : after;
  return ui->gsize > 1 ? grad_comm(g, MP_COLL_REDUCE_SCATTER, (mp_group)ui->group, rb, layer, u, *from) : -1;
}

/* FSDP2's (and FSDP1's) HSDP: the reduce-scatter's output all-reduced over the unit's
 * replicas every micro-batch, then the reduce-scatter input freed. */
static void fsdp_reduce_unit(gen *g, int32_t layer, int32_t u, int32_t after) {
  const unit_info *ui = &g->ui[u];
  const int64_t rb = ui->numel_tp * mp_dtype_bytes(g->reduce_dtype);
  int32_t from = after;
  const int32_t rs = fsdp_reduce_scatter(g, layer, u, after, &from);
  int32_t ar = -1;
  if (rep_size(g, ui) > 1)
    ar = grad_comm(g, MP_COLL_ALL_REDUCE, rep_group(g, ui), shard_bytes(g, ui), layer, u, rs >= 0 ? rs : from);
  const int32_t f = mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_RS_IN, rb, layer, u, MP_STREAM_REDUCE);
  add_dep(g, f, ar >= 0 ? ar : rs >= 0 ? rs : after, 0);
}

/* Megatron FSDP's hybrid sharding (--num-distributed-optimizer-instances, dp_replicate
 * instances; megatron_fsdp.py and param_and_grad_buffer.py at core_v0.14.0,
 * _bucket_group_gradient_reduce): the bucket is reduce-scattered over the instance's
 * dp_shard x cp ranks every micro-batch and the result added into the resident
 * main-gradient shard, which the last micro-batch alone (outer_fsdp_group_grad_reduce on
 * is_last_microbatch) all-reduces in place across the instances (outer_dp_sharding_strategy
 * no_shard, the default): the bucket goes once its reduce-scatter is done. Megatron issues
 * that all-reduce on a stream of its own; here it queues on the reduce stream behind its
 * reduce-scatter. */
static void mfsdp_reduce_unit(gen *g, int32_t layer, int32_t u, int32_t after) {
  const unit_info *ui = &g->ui[u];
  const int64_t rb = ui->numel_tp * mp_dtype_bytes(g->reduce_dtype);
  int32_t from = after;
  const int32_t rs = fsdp_reduce_scatter(g, layer, u, after, &from);
  const int32_t f = mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_RS_IN, rb, layer, u, MP_STREAM_REDUCE);
  if (rep_size(g, ui) > 1) {
    const int32_t ar =
        grad_comm(g, MP_COLL_ALL_REDUCE, rep_group(g, ui), shard_bytes(g, ui), layer, u, rs >= 0 ? rs : from);
    if (ar >= 0) g->ops[ar].when = MP_WHEN_LAST_MICRO;
  }
  add_dep(g, f, rs >= 0 ? rs : after, 0);
}

/* The strategy of g's data parallelism, as mp_sched_reduce_units applies it to each unit:
 * DDP without FSDP; the meshplan runtimes' FSDP by their comm mode; FSDP under a pipeline
 * (accumulated, reduced after the chunk); Megatron FSDP; FSDP2 / FSDP1. */
static unit_reduce_fn unit_reducer(const gen *g) {
  if (!g->has_fsdp) return ddp_reduce_unit;
  if (g->ms->runtime) return g->ms->overlap ? rt_reduce_overlapped : rt_reduce_blocking;
  if (g->pp_fsdp) return pp_fsdp_accumulate_unit;
  return mp_plan_is_megatron_fsdp(g->p) ? mfsdp_reduce_unit : fsdp_reduce_unit;
}

/* After the backward of units [lo, hi] of a block: each unit with parameters on this stage
 * reduced by g's strategy (unit_reducer), all waiting for the backward's last compute op. */
void mp_sched_reduce_units(gen *g, int32_t layer, int32_t unit0, int n, int lo, int hi) {
  const int32_t after = g->last_compute;
  const unit_reduce_fn reduce = unit_reducer(g);
  for (int k = lo; k < n && k <= hi; k++) {
    const int32_t u = unit0 + k;
    if (g->ui[u].numel_tp == 0) continue;
    reduce(g, layer, u, after);
  }
}

/* FSDP under a pipeline, after the last micro-batch's backward of a chunk (layers [l0, l1),
 * and the root unit when `root`): each unit's accumulated gradients reduce-scattered into
 * its resident shard, all-reduced over dp_replicate, freed; all LAST_MICRO, on the reduce
 * stream in unit order once the chunk's backward compute is done. */
void mp_sched_pp_fsdp_reduce(gen *g, int32_t l0, int32_t l1, int root) {
  int32_t after = g->last_compute;
  for (int32_t k = root ? -1 : 0; k < l1 - l0; k++) {
    const int32_t l = k < 0 ? -1 : l0 + k; /* the root unit first */
    const int32_t u0 = l < 0 ? g->root_unit : g->first_unit[l], n = l < 0 ? 1 : g->n_units[l];
    for (int32_t u = u0; u < u0 + n; u++) {
      const unit_info *ui = &g->ui[u];
      if (ui->numel_tp == 0) continue;
      const int64_t rb = ui->numel_tp * mp_dtype_bytes(g->reduce_dtype);
      /* FSDP2's copy-in of the accumulated gradients, in the last micro-batch only (FSDP1's
       * flat gradient is written by each micro-batch's backward and not priced here) */
      const int32_t in = g->fsdp2_copies ? rs_copy_in(g, ui, 2 * rb, after, MP_WHEN_LAST_MICRO) : -1;
      if (in >= 0) after = in;
      int32_t last = -1;
      if (ui->gsize > 1)
        last = grad_comm(g, MP_COLL_REDUCE_SCATTER, (mp_group)ui->group, rb, l, u, after);
      if (last >= 0) g->ops[last].when = MP_WHEN_LAST_MICRO;
      if (rep_size(g, ui) > 1) {
        last = grad_comm(g, MP_COLL_ALL_REDUCE, rep_group(g, ui), shard_bytes(g, ui), l, u, last >= 0 ? last : after);
        if (last >= 0) g->ops[last].when = MP_WHEN_LAST_MICRO;
      }
      const int32_t f = mem(g, MP_OP_FREE, MP_MEM_GRADS, BUF_GRAD_ACC, rb, l, u, MP_STREAM_REDUCE);
      add_dep(g, f, last >= 0 ? last : after, 0);
      if (f >= 0) g->ops[f].when = MP_WHEN_LAST_MICRO;
    }
  }
}
