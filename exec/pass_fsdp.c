/* Pass 5: FSDP (FSDP2 style): units all-gathered before use and reduce-scattered after
 * backward; every parameter's tp-local tensor sharded on dim 0 over its FSDP group.
 *
 * Units, in forward order: "root" first (tok_embeddings, pos_embeddings, norm, output:
 * torchtitan wraps the model itself last, and its parameters are gathered first), then one
 * per block "layers.N". A MoE block under EP (ep > 1) is split into three units:
 *   "layers.N.attention"   attention_norm + attention.* (MLA's latent projections and
 *                          norms among them)                     group FSDP
 *   "layers.N.moe"         ffn_norm, router, shared expert       group FSDP
 *   "layers.N.moe.experts" routed experts                        group EFSDP (dp_shard/ep)
 * because wrapping the whole block would put the experts' all-gather between EP's two
 * all-to-alls, where ranks wait on each other in a different order (deadlock); for the
 * same reason per_block=1 with EP is refused.
 *
 * Groups: dense parameters shard over MP_GROUP_FSDP (dp_shard x cp); routed experts under
 * EP over MP_GROUP_EFSDP (they are replicated over cp). Shard: chunk = ceil(rows / group),
 * the last ranks get what is left, possibly nothing (see plan.c). */
#include <stdio.h>

#include "exec/plan.h"
#include "exec/rules.h"

enum { PART_BLOCK = 0, PART_ATTN = 0, PART_MOE = 1, PART_EXPERTS = 2 };

/* The attention part's modules; an MTP module's input side (enorm, hnorm, eh_proj), which
 * runs before its block's attention, goes with them. */
static int is_attention(mp_module m) {
  return m == MP_MOD_MTP_ENORM || m == MP_MOD_MTP_HNORM || m == MP_MOD_MTP_EH_PROJ || m == MP_MOD_ATTN_NORM || m == MP_MOD_Q || m == MP_MOD_K || m == MP_MOD_V ||
         m == MP_MOD_Q_NORM || m == MP_MOD_K_NORM || m == MP_MOD_O || m == MP_MOD_Q_A ||
         m == MP_MOD_Q_A_NORM || m == MP_MOD_Q_B || m == MP_MOD_KV_A || m == MP_MOD_KV_A_NORM ||
         m == MP_MOD_KV_B;
}

/* The orders and combinations FSDP refuses: before TP, before EP, per-block units with EP. */
static mp_status check_order(mp_ctx *ctx, const mp_plan *p, const mp_fsdp_options *o, int ep_on) {
  const mp_mesh *mesh = &p->mesh;
  const mp_model *m = &p->model;
  if (!(p->applied & MP_PASS_FSDP) && mesh->size[MP_DIM_TP] > 1 && !(p->applied & MP_PASS_TP))
    return mp_error(ctx, MP_ERR_ORDER,
                    "FSDP before TP: with tp=%d and TP not applied, FSDP would wrap the plain "
                    "Linear weights and a later TP would match no Linear; the run would be "
                    "data-parallel only with wrong gradients; apply TP first",
                    mesh->size[MP_DIM_TP]);
  MP_CHECK(mp_plan_check_pass(ctx, p, MP_PASS_FSDP));
  if (mp_model_is_moe(m) && mesh->ep > 1 && !(p->applied & MP_PASS_EP))
    return mp_error(ctx, MP_ERR_ORDER,
                    "FSDP before EP: the mesh has ep=%d but EP was not applied, so the routed "
                    "experts would be sharded over the whole FSDP group and every rank would "
                    "gather all %lld experts; apply EP before FSDP",
                    mesh->ep, (long long)m->n_experts);
  /* the meshplan runtimes keep the experts whole on a rank there (their expert-FSDP group
   * is one rank) and sum their gradients over the expert-DP group, as Megatron-Core's DDP
   * does over _EXPERT_DATA_PARALLEL_GROUP (mp_mesh_expert_replica_group) */
  if (!mp_rule_ep_grid_fsdp_ok(mesh) && !mp_mem_model_is_runtime(p->opts.mem_model))
    return mp_error(ctx, MP_ERR_INVALID,
                    "ep=%d x etp=%d reaches into dp_replicate: FSDP (torchtitan) borrows EP x ETP from "
                    "dp_shard x cp x tp = %d ranks (torchtitan/distributed/parallel_dims.py); choose ep x etp "
                    "dividing %d, or DDP (the megatron memory model)",
                    mesh->ep, mesh->etp > 1 ? mesh->etp : 1,
                    mesh->size[MP_DIM_DP_SHARD] * mesh->size[MP_DIM_CP] * mesh->size[MP_DIM_TP],
                    mesh->size[MP_DIM_DP_SHARD] * mesh->size[MP_DIM_CP] * mesh->size[MP_DIM_TP]);
  if (o->per_block && ep_on && mp_model_n_moe_layers(m) > 0)
    return mp_error(ctx, MP_ERR_ORDER,
                    "EP with per-block FSDP deadlocks between EP's two all-to-alls: a unit "
                    "holding a whole MoE block all-gathers the experts between dispatch and "
                    "combine; keep per_block=0 (attention, MoE and experts units) or set ep=1");
  return MP_OK;
}

/* Unit layout: root, then per block one unit, or three for a MoE block under EP; base[l]
 * receives block l's first unit. */
static mp_status layout_units(mp_ctx *ctx, mp_plan *p, int ep_on, int **base_out) {
  const mp_model *m = &p->model;
  const int L = (int)mp_model_n_blocks(m); /* the MTP modules' blocks are units too */
  int *base = mp_arena_alloc(p->arena, sizeof(int) * (size_t)(L + 1));
  if (base == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory building FSDP units");
  int n_units = 1;
  for (int l = 0; l < L; l++) {
    base[l] = n_units;
    n_units += (ep_on && mp_model_layer_is_moe(m, l)) ? 3 : 1;
  }
  p->units = mp_arena_alloc(p->arena, sizeof(mp_fsdp_unit) * (size_t)n_units);
  if (p->units == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory building FSDP units");
  p->n_units = n_units;
  p->units[0].name = "root";
  p->units[0].layer = -1;
  p->units[0].group = MP_GROUP_FSDP;
  for (int l = 0; l < L; l++) {
    mp_fsdp_unit *u = &p->units[base[l]];
    /* A plan built from a template names its units with the template's strings (formatted
     * once per model), one built alone formats its own. */
    const mp_plan_template *t = p->tmpl;
    if (ep_on && mp_model_layer_is_moe(m, l)) {
      u[0].name = t ? t->unit_attn[l] : mp_arena_printf(p->arena, "layers.%d.attention", l);
      u[1].name = t ? t->unit_moe[l] : mp_arena_printf(p->arena, "layers.%d.moe", l);
      u[2].name = t ? t->unit_experts[l] : mp_arena_printf(p->arena, "layers.%d.moe.experts", l);
      for (int k = 0; k < 3; k++) {
        u[k].layer = l;
        u[k].group = k == PART_EXPERTS ? MP_GROUP_EFSDP : MP_GROUP_FSDP;
        if (u[k].name == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory naming units");
      }
    } else {
      u->name = t ? t->unit_block[l] : mp_arena_printf(p->arena, "layers.%d", l);
      if (u->name == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory naming units");
      u->layer = l;
      u->group = MP_GROUP_FSDP;
    }
  }
  *base_out = base;
  return MP_OK;
}

/* Assigns each parameter to its unit, shards it and adds it to the unit's sizes (one walk
 * over the parameters), then lists the parameters per unit (in one block of indices). */
static mp_status assign_params(mp_ctx *ctx, mp_plan *p, int ep_on, const int *base) {
  const mp_model *m = &p->model;
  const int g_dense = mp_mesh_group_size(&p->mesh, MP_GROUP_FSDP);
  const int g_expert = mp_mesh_group_size(&p->mesh, MP_GROUP_EFSDP);
  for (int i = 0; i < p->n_params; i++) {
    mp_param *prm = &p->params[i];
    int unit = 0;
    if (prm->layer >= 0) {
      unit = base[prm->layer];
      if (ep_on && mp_model_layer_is_moe(m, prm->layer))
        unit += is_attention(prm->module) ? PART_ATTN : prm->is_expert ? PART_EXPERTS : PART_MOE;
    }
    prm->fsdp_unit = unit;
    prm->fsdp_group = (prm->is_expert && ep_on) ? MP_GROUP_EFSDP : MP_GROUP_FSDP;
    prm->place[MP_AXIS_FSDP].kind = MP_PLACEMENT_SHARD;
    prm->place[MP_AXIS_FSDP].dim = 0;
    mp_fsdp_unit *u = &p->units[unit];
    u->n_params++;
    const int g = prm->fsdp_group == MP_GROUP_EFSDP ? g_expert : g_dense;
    u->numel_tp += mp_param_tp_numel(prm);
    u->numel_shard += mp_param_padded_shard_numel(prm, g);
  }
  return mp_plan_list_unit_params(ctx, p);
}

mp_status mp_plan_list_unit_params(mp_ctx *ctx, mp_plan *p) {
  int *lists = mp_arena_alloc(p->arena, sizeof(int) * (size_t)(p->n_params + p->n_units));
  if (lists == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory listing the parameters of %d units", p->n_units);
  for (int u = 0; u < p->n_units; u++) {
    p->units[u].params = lists;
    lists += p->units[u].n_params + 1;
    p->units[u].n_params = 0;
  }
  for (int i = 0; i < p->n_params; i++) {
    mp_fsdp_unit *u = &p->units[p->params[i].fsdp_unit];
    u->params[u->n_params++] = i;
  }
  return MP_OK;
}

int mp_plan_is_megatron_fsdp(const mp_plan *p) {
  return p->opts.mem_model == MP_MEM_MODEL_MEGATRON && p->opts.dp == MP_DP_FSDP;
}

int mp_plan_pp_fsdp(const mp_plan *p) {
  return p->mesh.size[MP_DIM_PP] > 1 && p->opts.mem_model == MP_MEM_MODEL_TORCHTITAN;
}

mp_status mp_apply_fsdp(mp_ctx *ctx, mp_plan *p, const mp_fsdp_options *o) {
  const int ep_on = (p->applied & MP_PASS_EP) && p->mesh.ep > 1;
  mp_fsdp_options def = {1, 0, MP_DTYPE_BF16, MP_DTYPE_FP32, 0}, kept;
  if (o == NULL) o = &def;
  if (mp_plan_pp_fsdp(p) && o->reshard_after_forward) {
    kept = *o;
    kept.reshard_after_forward = 0;
    o = &kept;
  }
  MP_CHECK(check_order(ctx, p, o, ep_on));
  int *base = NULL;
  MP_CHECK(layout_units(ctx, p, ep_on, &base));
  MP_CHECK(assign_params(ctx, p, ep_on, base));
  p->opts.fsdp = *o;
  mp_plan_note_fsdp(p, o);
  mp_plan_mark_applied(p, MP_PASS_FSDP);
  return MP_OK;
}

/* Megatron FSDP as core_v0.14.0 runs it (megatron/core/distributed/fsdp/src/megatron_fsdp/
 * megatron_fsdp.py, param_and_grad_buffer.py): each TransformerLayer a unit, gathered in the
 * 16-bit model dtype before its forward and again before its backward, its gradients
 * reduce-scattered in the main gradients' dtype (fp32 with grad_reduce_in_fp32, else bf16)
 * into the rank's main-gradient shard after every backward (not only
 * the last micro-batch's), the embedding, final norm and output layer gathered once and kept;
 * the routed experts in their own parameter group over the expert-DP group. */
static void note_megatron_fsdp(mp_plan *p) {
  const mp_mesh *mesh = &p->mesh;
  const int ep_on = (p->applied & MP_PASS_EP) && mesh->ep > 1;
  const mp_dtype rd = p->opts.fsdp.reduce_dtype;
  const int state = 2 + 4 + mp_dtype_bytes(rd) + (int)mp_plan_adamw_moment_bytes(&p->opts, 1);
  /* hybrid sharding: Megatron's distributed-optimizer instances are dp_replicate
   * (mcore_fsdp_adapter.py _init_dist_index at core_v0.14.0: the intra-instance dp x cp group
   * shards, the inter-instance group is the outer one) */
  const int inst = mesh->size[MP_DIM_DP_REPLICATE];
  char hybrid[128] = "";
  if (inst > 1)
    snprintf(hybrid, sizeof hybrid,
             ", copied in dp_replicate = %d instances (main gradients all-reduced across them in the "
             "last micro-batch)", inst);
  mp_plan_note(p,
               "Megatron FSDP (%s): %d TransformerLayer units; bf16 weights, fp32 main weights, %s "
               "main gradients and Adam state sharded over dp_shard x cp = %d%s%.0d%s (%d/d bytes a "
               "parameter); 16-bit weights gathered before each layer's forward and backward (%s), "
               "gradients reduce-scattered in %s after every backward",
               mp_mfsdp_strategy_name(p->opts.mfsdp_strategy), (int)p->model.n_layers, mp_dtype_name(rd),
               mp_mesh_group_size(mesh, MP_GROUP_FSDP), ep_on ? ", routed experts over expert-DP = " : "",
               ep_on ? mp_mesh_group_size(mesh, MP_GROUP_EFSDP) : 0, hybrid, state,
               p->opts.fsdp_double_buffer ? "--fsdp-double-buffer: the next layer prefetched"
                                          : "prefetched up to 500M elements ahead",
               mp_dtype_name(rd));
}

void mp_plan_note_fsdp(mp_plan *p, const mp_fsdp_options *o) {
  const mp_mesh *mesh = &p->mesh;
  const int ep_on = (p->applied & MP_PASS_EP) && mesh->ep > 1;
  if (mp_plan_is_megatron_fsdp(p)) {
    note_megatron_fsdp(p);
    return;
  }
  /* EP reaching into dp_replicate (the runtimes' plans): the experts' replicas are their
   * expert-DP group, not dp_replicate (mp_mesh_expert_replica_group) */
  char reach[128] = "";
  if (ep_on && mp_mesh_expert_replica_group(mesh) == MP_GROUP_EDP)
    snprintf(reach, sizeof reach, " (EP reaches into dp_replicate: their gradients summed over expert-DP = %d)",
             mp_mesh_group_size(mesh, MP_GROUP_EDP));
  mp_plan_note(p,
               "FSDP: %d units; dense parameters Shard(0) over dp_shard x cp = %d%s%.0d%s; params "
               "gathered in %s, gradients reduced in %s, %s",
               p->n_units, mp_mesh_group_size(mesh, MP_GROUP_FSDP),
               ep_on ? ", routed experts over dp_shard / ep = " : "",
               ep_on ? mp_mesh_group_size(mesh, MP_GROUP_EFSDP) : 0, reach, mp_dtype_name(o->param_dtype),
               mp_dtype_name(o->reduce_dtype),
               mp_plan_pp_fsdp(p) ? "kept gathered through the pipeline step, gradients "
                                    "accumulated unsharded in the reduce dtype and reduced "
                                    "after the stage's last backward"
               : o->reshard_after_forward ? "resharded after forward"
                                          : "kept after forward");
}
