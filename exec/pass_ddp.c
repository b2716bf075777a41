/* Pass 5, the DDP form: data parallelism with replicated parameters, as Megatron-LM's DDP
 * runs it (megatron/core/distributed/distributed_data_parallel.py). Every rank of the
 * data-parallel group holds every parameter of its TP/EP tile; the gradients are reduced
 * over the group in buckets, one per block and one for the root's parameters (embedding,
 * final norm, head), which are the plan's units here (group mp_plan_ddp_group, nothing
 * sharded, so a unit's shard is its whole tile). With shard_optimizer (ZeRO stage 1,
 * Megatron-LM's distributed optimizer) the gradients are reduce-scattered instead and the
 * fp32 master weights and Adam state live on the rank's 1/d; the parameters themselves stay
 * replicated (the updated ones are all-gathered back after the step).
 *
 * The data-parallel group is dp_replicate, and with context parallelism dp_replicate x cp:
 * parameters are replicated over cp too (each cp rank computes its gradient from its part
 * of the sequence), so Megatron-Core reduces over both.
 *
 * The distributed optimizer's instances (the mesh's dopt, Megatron-Core's
 * --num-distributed-optimizer-instances): the group is cut into dopt instances of
 * consecutive ranks (MP_GROUP_DOPT); the optimizer state is sharded over the instance's
 * ranks, the gradients reduce-scattered there and the rank's shard all-reduced across the
 * instances (MP_GROUP_DOPT_INTER), the updated parameters all-gathered inside the instance
 * (param_and_grad_buffer.py, start_grad_sync and start_param_sync, core_v0.14.0). Megatron
 * asserts the distributed optimizer with them ('Partial DistOpt cannot be used without
 * DistOpt', distributed_data_parallel.py). The routed experts' buffers, over their
 * expert-DP group (mp_plan_ddp_experts_apart), go the same way over that group's instance
 * slices (MP_GROUP_EDOPT, intra_expt_dp_group) and the same inter-instance group
 * (distributed_data_parallel.py hands both bucket groups inter_dist_opt_group).
 *
 * Refused: dp_shard > 1 (DDP shards nothing: use dp_replicate), before TP or EP where the
 * mesh has them, after FSDP, twice. */
#include <stdio.h>

#include "exec/plan.h"

static mp_status check_order(mp_ctx *ctx, const mp_plan *p) {
  const mp_mesh *mesh = &p->mesh;
  MP_CHECK(mp_plan_check_pass(ctx, p, MP_PASS_DDP));
  if (mesh->size[MP_DIM_TP] > 1 && !(p->applied & MP_PASS_TP))
    return mp_error(ctx, MP_ERR_ORDER,
                    "DDP before TP: with tp=%d and TP not applied, the buckets would hold whole "
                    "weights that TP later splits, reducing the wrong tensors; apply TP first",
                    mesh->size[MP_DIM_TP]);
  if (mp_model_is_moe(&p->model) && mesh->ep > 1 && !(p->applied & MP_PASS_EP))
    return mp_error(ctx, MP_ERR_ORDER,
                    "DDP before EP: the mesh has ep=%d but EP was not applied, so every rank "
                    "would hold and reduce all %lld experts; apply EP first",
                    mesh->ep, (long long)p->model.n_experts);
  if (mesh->size[MP_DIM_DP_SHARD] > 1)
    return mp_error(ctx, MP_ERR_INVALID,
                    "DDP replicates parameters over data parallelism (dp_replicate and cp), "
                    "without sharding them; use dp_replicate=%d instead of dp_shard=%d",
                    mesh->size[MP_DIM_DP_REPLICATE] * mesh->size[MP_DIM_DP_SHARD],
                    mesh->size[MP_DIM_DP_SHARD]);
  return MP_OK;
}

/* The instances need the distributed optimizer (see the file's comment). */
static mp_status check_dopt(mp_ctx *ctx, const mp_plan *p, const mp_ddp_options *o) {
  if (mp_mesh_dopt(&p->mesh) > 1 && !o->shard_optimizer)
    return mp_error(ctx, MP_ERR_INVALID,
                    "dopt=%d: distributed-optimizer instances without the distributed optimizer (Megatron-Core "
                    "asserts it): use a stack with distributed_optimizer, or drop dopt", p->mesh.dopt);
  return MP_OK;
}

/* The buckets: unit 0 the root's parameters, unit 1 + l block l's, each holding its
 * parameters' whole tiles. */
static mp_status layout_buckets(mp_ctx *ctx, mp_plan *p) {
  const int L = (int)mp_model_n_blocks(&p->model); /* the MTP modules' blocks too */
  const mp_group grp = mp_plan_ddp_group(p);
  p->n_units = 1 + L;
  p->units = mp_arena_alloc(p->arena, sizeof(mp_fsdp_unit) * (size_t)p->n_units);
  if (p->units == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory building DDP buckets");
  const mp_plan_template *t = p->tmpl;
  p->units[0].name = "root";
  p->units[0].layer = -1;
  for (int l = 0; l < L; l++) {
    mp_fsdp_unit *u = &p->units[1 + l];
    u->name = t ? t->unit_block[l] : mp_arena_printf(p->arena, "layers.%d", l);
    if (u->name == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory naming DDP buckets");
    u->layer = l;
  }
  for (int u = 0; u < p->n_units; u++) p->units[u].group = grp;
  for (int i = 0; i < p->n_params; i++) {
    mp_param *prm = &p->params[i];
    mp_fsdp_unit *u = &p->units[prm->layer < 0 ? 0 : 1 + prm->layer];
    prm->fsdp_unit = (int)(u - p->units);
    prm->fsdp_group = grp;
    u->n_params++;
    u->numel_tp += mp_param_tp_numel(prm);
    u->numel_shard += mp_param_tp_numel(prm);
  }
  return mp_plan_list_unit_params(ctx, p);
}

mp_status mp_apply_ddp(mp_ctx *ctx, mp_plan *p, const mp_ddp_options *o) {
  mp_ddp_options def = {0, 0, 0, 0, 0, 0, 0};
  if (o == NULL) o = &def;
  MP_CHECK(check_order(ctx, p));
  MP_CHECK(check_dopt(ctx, p, o));
  MP_CHECK(layout_buckets(ctx, p));
  p->opts.ddp = *o;
  mp_plan_note_ddp(p, o);
  mp_plan_mark_applied(p, MP_PASS_DDP);
  return MP_OK;
}

void mp_plan_note_ddp(mp_plan *p, const mp_ddp_options *o) {
  char experts[200] = "";
  const int inst = mp_mesh_dopt(&p->mesh);
  if (mp_plan_ddp_experts_apart(p))
    snprintf(experts, sizeof experts,
             "the routed experts (%s) over their expert-DP group of %d "
             "instead (the stage's ranks holding the same experts)",
             p->mesh.etp > 1 ? "each split over its expert-TP group" : "whole on each rank, etp=1",
             mp_mesh_group_size(&p->mesh, MP_GROUP_EDP));
  /* the fp32 master and AdamW's two moments: 12 bytes a parameter, 8 with bf16 moments; the
   * 16-bit parameter and the main gradient (4 bytes, 2 with --grad-reduce-in-bf16) whole */
  const int state = 4 + (int)mp_plan_adamw_moment_bytes(&p->opts, 1),
            whole = 2 + (int)mp_dtype_bytes(p->opts.fsdp.reduce_dtype);
  char how[384];
  if (o->shard_optimizer && inst > 1)
    snprintf(how, sizeof how, "reduce-scattered inside each of %d distributed-optimizer instances of d = %d "
             "consecutive ranks, the shard all-reduced across the instances, and the fp32 master weights and "
             "Adam state sharded over the instance (%d + %d/d bytes a parameter), the updated 16-bit parameters "
             "all-gathered back inside it", inst, mp_mesh_group_size(&p->mesh, MP_GROUP_DOPT), whole, state);
  else if (o->shard_optimizer)
    snprintf(how, sizeof how, "reduce-scattered over them, and the fp32 master weights and Adam state "
             "sharded over them (the distributed optimizer, ZeRO-1: %d + %d/d bytes a parameter), the "
             "updated 16-bit parameters all-gathered back", whole, state);
  else
    snprintf(how, sizeof how, "all-reduced over them (%d bytes a parameter at rest)", whole + state);
  mp_plan_note(p,
               "DDP: parameters replicated over dp_replicate x cp = %d, %s main gradients %s%s%s%s",
               mp_mesh_group_size(&p->mesh, MP_GROUP_DP_CP),
               mp_dtype_name(p->opts.fsdp.reduce_dtype), how,
               !o->overlap         ? ", after the step's last backward"
               : o->shard_optimizer ? ", bucket by bucket as the backward ends and the "
                                      "gathers in the next forward"
                                    : ", bucket by bucket as the backward ends",
               experts[0] && inst == 1 ? "; " : "", inst == 1 ? experts : "");
  /* with instances the experts' part is a note of its own (a note holds 511 characters) */
  if (experts[0] && inst > 1)
    mp_plan_note(p, "DDP: %s, cut into the instances' slices of %d consecutive members: reduce-scattered and "
                 "the optimizer sharded inside the slice, the shard all-reduced across the instances as the "
                 "dense weights' is, the parameters all-gathered inside the slice", experts,
                 mp_mesh_group_size(&p->mesh, MP_GROUP_EDOPT));
}

mp_group mp_plan_ddp_group(const mp_plan *p) {
  if (p->opts.dp == MP_DP_DDP && mp_mesh_dopt(&p->mesh) > 1) return MP_GROUP_DOPT;
  return p->opts.dp == MP_DP_DDP && p->mesh.size[MP_DIM_CP] > 1 ? MP_GROUP_DP_CP : MP_GROUP_DP_REPLICATE;
}

int64_t mp_plan_adamw_moment_bytes(const mp_plan_options *o, int64_t n) {
  return 2 * n * mp_dtype_bytes(o->moment_dtype);
}

void mp_plan_dp_state_bytes(const mp_mesh *mesh, const mp_plan_options *o, double bytes[2], int64_t *ways) {
  const double mb = mp_dtype_bytes(o->master_dtype), pb = mp_dtype_bytes(o->fsdp.param_dtype),
               rb = mp_dtype_bytes(o->fsdp.reduce_dtype), ob2 = (double)mp_plan_adamw_moment_bytes(o, 1);
  *ways = 1;
  if (o->dp != MP_DP_DDP) { /* FSDP: the master and m, v, cut with the parameter */
    bytes[0] = 0;
    bytes[1] = mb + ob2;
    /* Megatron FSDP also keeps its model-dtype weights' shard (optim_grads_params) */
    if (o->mem_model == MP_MEM_MODEL_MEGATRON) bytes[1] += pb;
    return;
  }
  bytes[0] = pb + rb;
  bytes[1] = mb + ob2;
  /* with instances, over one instance's dp_replicate / dopt x cp ranks */
  if (o->ddp.shard_optimizer)
    *ways = (int64_t)mesh->size[MP_DIM_DP_REPLICATE] / mp_mesh_dopt(mesh) *
            (mesh->size[MP_DIM_CP] > 1 ? mesh->size[MP_DIM_CP] : 1);
}

int mp_plan_ddp_experts_apart(const mp_plan *p) {
  return p->opts.dp == MP_DP_DDP && (p->applied & MP_PASS_EP) && p->mesh.ep > 1 &&
         mp_mesh_expert_grid(&p->mesh);
}

static void ddp_state(const mp_plan *p, int64_t n, int64_t d, int64_t *param_bytes, int64_t *grad_bytes,
                      int64_t *optimizer_bytes, int64_t *shard) {
  const int64_t mb = mp_dtype_bytes(p->opts.master_dtype);
  *shard = (n + d - 1) / d;
  *param_bytes = n * mp_dtype_bytes(p->opts.fsdp.param_dtype) + *shard * mb;
  *grad_bytes = n * mp_dtype_bytes(p->opts.fsdp.reduce_dtype);
  *optimizer_bytes = mp_plan_adamw_moment_bytes(&p->opts, *shard);
}

void mp_plan_ddp_state(const mp_plan *p, int64_t n, int64_t *param_bytes, int64_t *grad_bytes,
                       int64_t *optimizer_bytes, int64_t *shard) {
  double b[2];
  int64_t d = 1;
  mp_plan_dp_state_bytes(&p->mesh, &p->opts, b, &d);
  ddp_state(p, n, d, param_bytes, grad_bytes, optimizer_bytes, shard);
}

mp_group mp_plan_ddp_expert_group(const mp_plan *p) {
  return p->opts.dp == MP_DP_DDP && mp_mesh_dopt(&p->mesh) > 1 ? MP_GROUP_EDOPT : MP_GROUP_EDP;
}

void mp_plan_ddp_expert_state(const mp_plan *p, int64_t n, int64_t *param_bytes, int64_t *grad_bytes,
                              int64_t *optimizer_bytes, int64_t *shard) {
  const int64_t d = p->opts.ddp.shard_optimizer ? mp_mesh_group_size(&p->mesh, mp_plan_ddp_expert_group(p)) : 1;
  ddp_state(p, n, d, param_bytes, grad_bytes, optimizer_bytes, shard);
}
