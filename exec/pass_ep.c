/* Pass 2: expert parallelism. The routed experts of every MoE layer, stored as one 3-D
 * parameter per projection [n_experts, out, in], are split on dim 0 over the ep group
 * (carved out of dp_shard, see exec/mesh.h): each rank holds n_experts / ep whole experts.
 * Tokens reach their experts by an all-to-all over ep (dispatch) and return by a second
 * one (combine); the schedule emits those, this pass only places the weights.
 *
 * Expert tensor parallelism (etp > 1 in the mesh, Megatron-Core's
 * --expert-tensor-parallel-size, torchtitan's expert_tensor_parallel_degree) splits each
 * local expert over the etp ranks of its expert-TP group (exec/mesh.h, MP_GROUP_ETP): gate
 * and up column-parallel (their [E, F, H] on F, each rank F / etp of an expert's hidden
 * width), down row-parallel ([E, H, F] on F, its output a partial sum over the group), as
 * Megatron-Core's TEGroupedMLP/SequentialMLP (megatron/core/transformer/moe/experts.py,
 * core_v0.14.0, linear_fc1 column-parallel and linear_fc2 row-parallel over the expert TP
 * group) and torchtitan's ExpertTensorParallel (torchtitan/distributed/expert_parallel.py:
 * w1 and w3 [Shard(0), Shard(1)], w2 [Shard(0), Shard(2)] over the [ep, tp] mesh). So an
 * expert's weights are split ep x etp ways. Megatron-Core's all-to-all dispatcher then
 * all-gathers the dispatched rows over the expert-TP group and reduce-scatters the partial
 * outputs; its flex dispatcher (DeepEP, HybridEP) sends each token over the expert-TP x EP
 * ranks to every expert-TP rank of its expert and sums the copies in its combine (the
 * schedule's mp_sched_flex_etp, exec/schedule_ops.c).
 *
 * Refused: EP on a dense model (nothing to split), ep not dividing n_experts, EP after
 * FSDP (the experts would already be sharded over the whole FSDP group) and the generic
 * order rules. */
#include "exec/plan.h"
#include "exec/rules.h"

/* How the plan's note names the dispatch: the all-to-all over EP (and under etp its
 * expert-TP all-gather and reduce-scatter), or the flex dispatcher's backend, over the
 * expert-TP x EP ranks under etp (mp_sched_flex_etp, exec/schedule_ops.c). */
static const char *dispatch_words(mp_moe_dispatcher d, int etp) {
  if (!mp_moe_dispatch_by_node(d))
    return etp > 1 ? "all-to-all over the ep group, then all-gathered (reduce-scattered) over etp"
                   : "all-to-all over the ep group";
  if (etp > 1)
    return d == MP_MOE_DISPATCH_DEEPEP ? "DeepEP over the etp x ep ranks (a token to each etp rank of its expert, "
                                         "once per remote node; no etp all-gather)"
                                       : "HybridEP over the etp x ep ranks (a token to each etp rank of its "
                                         "expert, once per remote node; no etp all-gather)";
  return d == MP_MOE_DISPATCH_DEEPEP ? "DeepEP (a token once per remote node, forwarded over NVLink) over the ep group"
                                     : "HybridEP (a token once per remote node, forwarded over NVLink) over the ep "
                                       "group";
}

mp_status mp_apply_expert_parallel(mp_ctx *ctx, mp_plan *p) {
  const mp_model *m = &p->model;
  const int ep = p->mesh.ep;
  if (p->applied & MP_PASS_FSDP)
    return mp_error(ctx, MP_ERR_ORDER,
                    "EP after FSDP: FSDP has already sharded the routed experts over the whole "
                    "dp_shard x cp group, so EP would split shards instead of whole experts and "
                    "the all-to-alls would send tokens to ranks without their experts; apply EP "
                    "before FSDP");
  MP_CHECK(mp_plan_check_pass(ctx, p, MP_PASS_EP));
  if (!mp_model_is_moe(m))
    return mp_error(ctx, MP_ERR_INVALID,
                    "EP on a dense model: %s has no routed experts, so ep=%d, etp=%d would partition "
                    "nothing while its ranks still wait in all-to-alls; set ep=1 and leave etp out",
                    m->name, ep, p->mesh.etp);
  if (!mp_rule_ep_ok(m, ep))
    return mp_error(ctx, MP_ERR_INVALID,
                    "ep=%d does not divide n_experts=%lld of %s; each EP rank must hold the same "
                    "number of whole experts",
                    ep, (long long)m->n_experts, m->name);
  const int etp = p->mesh.etp > 1 ? p->mesh.etp : 1;
  if (etp > 1 && m->d_ff_expert % etp != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "etp=%d does not divide %s's expert width d_ff_expert=%lld; each expert-TP rank "
                    "holds an equal slice of every local expert", etp, m->name, (long long)m->d_ff_expert);
  for (int i = 0; i < p->n_params; i++) {
    mp_param *prm = &p->params[i];
    if (!prm->is_expert) continue;
    if (ep > 1) {
      prm->place[MP_AXIS_EP].kind = MP_PLACEMENT_SHARD;
      prm->place[MP_AXIS_EP].dim = 0;
      prm->tp_shape[0] = prm->shape[0] / ep;
    }
    if (etp == 1) continue;
    const int dim = prm->module == MP_MOD_EXPERTS_DOWN ? 2 : 1; /* F: rowwise down, colwise gate/up */
    prm->place[MP_AXIS_TP].kind = MP_PLACEMENT_SHARD;
    prm->place[MP_AXIS_TP].dim = dim;
    prm->tp_shape[dim] = prm->shape[dim] / etp;
  }
  if (ep > 1)
    mp_plan_note(p,
                 "EP: %lld routed experts per MoE layer over ep=%d: %lld per rank%s; tokens "
                 "dispatched and combined by %s%s",
                 (long long)m->n_experts, ep, (long long)(m->n_experts / ep),
                 etp > 1 ? ", each split over etp (gate/up column-parallel, down row-parallel)" : "",
                 dispatch_words(p->opts.moe_dispatcher, etp),
                 p->opts.moe_a2a_overlap ? "; the all-to-alls of one micro-batch overlap the compute of "
                                           "another (combined forward and backward steps)"
                                         : "");
  if (ep == 1 && etp > 1)
    mp_plan_note(p, "ETP: every rank holds all %lld routed experts of a MoE layer, each split over etp=%d "
                 "(gate/up column-parallel, down row-parallel)", (long long)m->n_experts, etp);
  mp_plan_mark_applied(p, MP_PASS_EP);
  return MP_OK;
}
