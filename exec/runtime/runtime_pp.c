/* The training runtime: the order of chunk steps and pipeline stages (runtime_internal.h
 * lists the runtime's files).
 *
 * A rank runs its step program (exec/schedule.h) in chunk steps: the forward or backward
 * of one of its stage's model chunks for one micro-batch. Their order over a step's
 * micro-batches is the stage's pipeline order (mp_pp_order, exec/schedule_pp.c: 1F1B,
 * interleaved with pp_virtual chunks per stage, GPipe), the one the simulator's pipeline
 * timeline and its in-flight memory walk; without a pipeline it is one micro-batch after
 * the other (1F1B on one stage: F0 B0 F1 B1 ...). A micro-batch keeps its own tables of
 * saved tensors (rt_micro) from its first chunk step to its last, so a stage holds the
 * activations of every micro-batch whose forward has run and whose backward has not, as
 * the schedule predicts.
 *
 * MoE. A MoE block's routing (rows per expert, and under EP the rows received from each
 * EP rank) is the micro-batch's own from the block's forward to its backward: a stage's
 * later forwards route other tokens in between. EP's all-to-alls run over the EP group
 * inside the stage (the ranks with this rank's pp coordinate), so each stage exchanges
 * only its own layers' rows, as under Megatron-Core, whose expert-parallel groups lie
 * inside one pipeline rank (megatron/core/parallel_state.py, the expert RankGenerator's
 * order "tp-ep-dp-pp", core_r0.12).
 * The load-balancing loss is added by the stage that runs its layer (runtime_step.c).
 *
 * Stages. A rank holds the parameters of its stage only (exec/plan.c: blocks by their
 * model chunk, the embedding on the first stage, final norm and head on the last; a tied
 * model's last stage holds a copy of the embedding as its head). Inside a stage FSDP
 * shards them over the stage's dp_shard group and gathers, releases and reduce-scatters
 * each micro-batch as the step program says. The plan's reshard_after_forward decides
 * whether a block's units are gathered again for its backward: on (the plans' default) is
 * the memory-lean choice; off keeps a stage's parameters gathered across its micro-batches
 * and amortizes the all-gathers over them, which KempnerForge recommends for PP
 * (docs/distributed/pipeline-parallelism.md, "FSDP2 interaction"; the planner searches
 * both, so train --auto may pick either). A unit gathered by one micro-batch's forward and
 * still held when the next one's forward asks for it (the root unit, or every unit without
 * resharding) is used as it is: the parameters do not change inside a step.
 *
 * Transfers. The activation x[l1] leaving a chunk goes to the next virtual stage, the
 * gradient dL/dx[l0] to the previous one, point to point by world rank (the neighbouring
 * stage with this rank's other mesh coordinates). A send is held, at most one per
 * direction: it goes out with this rank's next receive as one sendrecv (to the send's
 * peer, from the receive's: 1F1B's steady state pairs a forward's output going down with
 * the next backward's gradient coming up, as Megatron-LM's send_forward_recv_backward
 * does, and on the interleaved schedule's ring every stage shifts at once), or completes
 * alone when a second send of its direction comes first (a warm-up's forwards: the next
 * stage is waiting in its receive), or at the end of the step's chunk steps. Held sends go
 * oldest first, so messages between two ranks keep their order (point to point has no
 * tags). So no cycle of stages blocks in sends to each other, which MPI's rendezvous
 * protocol for large messages would deadlock. A peer that never answers fails the call at
 * MESHPLAN_COMM_TIMEOUT_S, named with the stage, the transfer and the peer.
 *
 * Tied embeddings. Stage 0's embedding and the last stage's copy have their gradients
 * summed between the two stages before the optimizer (Megatron-LM's embedding group,
 * finalize_model_grads / _allreduce_word_embedding_grads): each sends its shard and adds
 * the other's, so both hold the same sum bit for bit (fp32 addition commutes) and AdamW
 * keeps the two copies equal. */
#include "exec/runtime/runtime_internal.h"

#include "exec/mesh.h"

/* World rank of the rank with this rank's coordinates but pipeline stage `stage`. */
static int stage_rank(const mp_runtime *rt, int stage) {
  int c[MP_MESH_NDIMS];
  mp_mesh_coords(&rt->plan->mesh, rt->rank, c);
  c[MP_DIM_PP] = stage;
  return mp_mesh_rank_of(&rt->plan->mesh, c);
}

int mp_rt_param_on_stage(const mp_runtime *rt, int i) { return rt->plan->params[i].pp_stage == rt->pp_stage; }

/* A micro-batch's layer tables; slot 0 uses the runtime's own (runtime.c). */
static mp_status micro_tables(mp_ctx *ctx, mp_runtime *rt, rt_micro *m, int own) {
  if (own) {
    m->x = rt->x, m->act = rt->act, m->core = rt->core, m->epa = rt->epa, m->ep_R = rt->ep_R;
    m->counts_h = rt->counts_h, m->ep_rc = rt->ep_rc;
    return MP_OK;
  }
  m->x = calloc((size_t)rt->L + 1, sizeof *m->x);
  m->act = calloc((size_t)rt->L, sizeof *m->act);
  m->core = calloc((size_t)rt->L, sizeof *m->core);
  m->epa = calloc((size_t)rt->L, sizeof *m->epa);
  m->ep_R = calloc((size_t)rt->L, sizeof *m->ep_R);
  m->counts_h = calloc((size_t)rt->L * (rt->E ? rt->E : 1), sizeof *m->counts_h);
  m->ep_rc = calloc((size_t)rt->L * rt->etp * rt->ep * (rt->El ? rt->El : 1), sizeof *m->ep_rc);
  if (!m->x || !m->act || !m->core || !m->epa || !m->ep_R || !m->counts_h || !m->ep_rc)
    return mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for the micro-batches' tables");
  return MP_OK;
}

mp_status mp_rt_pp_init(mp_ctx *ctx, mp_runtime *rt) {
  const mp_plan *p = rt->plan;
  rt->pp = p->mesh.size[MP_DIM_PP];
  rt->pp_stage = mp_plan_rank_stage(p, rt->rank);
  rt->vst = mp_plan_virtual_stages(p);
  rt->peer_prev = stage_rank(rt, (rt->pp_stage + rt->pp - 1) % rt->pp);
  rt->peer_next = stage_rank(rt, (rt->pp_stage + 1) % rt->pp);
  rt->tied_peer = -1;
  if (rt->pp > 1 && p->model.tied_embeddings && (rt->pp_stage == 0 || rt->pp_stage == rt->pp - 1))
    rt->tied_peer = stage_rank(rt, rt->pp_stage == 0 ? rt->pp - 1 : 0);
  /* one stage runs its micro-batches one after the other (1F1B with pp 1) */
  const mp_pp_schedule kind = rt->pp > 1 ? p->opts.pp_schedule : MP_PP_1F1B;
  rt->order = malloc(sizeof *rt->order * (size_t)(2 * rt->n_micro * rt->vst));
  MP_CHECK_ALLOC(ctx, rt->order);
  MP_CHECK(mp_pp_order(ctx, kind, MP_PP_FLAVOR_MEGATRON, rt->pp, rt->vst, rt->n_micro, rt->pp_stage, rt->order, &rt->n_order));
  rt->n_mic = rt->pp > 1 ? (int)rt->n_micro : 1;
  rt->mic = calloc((size_t)rt->n_mic, sizeof *rt->mic);
  MP_CHECK_ALLOC(ctx, rt->mic);
  for (int i = 0; i < rt->n_mic; i++) MP_CHECK(micro_tables(ctx, rt, &rt->mic[i], i == 0));
  return MP_OK;
}

void mp_rt_pp_free(mp_runtime *rt) {
  for (int i = 1; rt->mic && i < rt->n_mic; i++) {
    free(rt->mic[i].x);
    free(rt->mic[i].act);
    free(rt->mic[i].core);
    free(rt->mic[i].epa);
    free(rt->mic[i].ep_R);
    free(rt->mic[i].counts_h);
    free(rt->mic[i].ep_rc);
  }
  if (rt->mic) { /* the runtime's own tables go with it (runtime.c) */
    rt->x = rt->mic[0].x, rt->act = rt->mic[0].act, rt->core = rt->mic[0].core;
    rt->epa = rt->mic[0].epa, rt->ep_R = rt->mic[0].ep_R;
    rt->counts_h = rt->mic[0].counts_h, rt->ep_rc = rt->mic[0].ep_rc;
  }
  free(rt->mic);
  free(rt->order);
  free(rt->pend);
  rt->pend = NULL;
  rt->mic = NULL;
  rt->order = NULL;
}

/* The micro-batch's tables become the runtime's for its chunk step. */
static void micro_enter(mp_runtime *rt, rt_micro *m) {
  rt->x = m->x, rt->act = m->act, rt->core = m->core, rt->epa = m->epa, rt->ep_R = m->ep_R;
  rt->counts_h = m->counts_h, rt->ep_rc = m->ep_rc;
  rt->tok_in = m->tok;
  rt->tok_tgt = m->tok ? m->tok + rt->N : NULL;
}

/* Held send k completes: alone (blocking), or with a receive from world rank src into
 * recv. */
static mp_status pend_complete(mp_ctx *ctx, mp_runtime *rt, int k, void *recv, size_t rcount, int src) {
  rt_p2p_pending q = rt->pend[k];
  memmove(&rt->pend[k], &rt->pend[k + 1], sizeof *rt->pend * (size_t)(rt->n_pend - k - 1));
  rt->n_pend--;
  mp_status st = recv ? mp_comm_sendrecv(ctx, rt->comm, q.buf, q.count, q.peer, recv, rcount, src, rt->xdt)
                      : mp_comm_send(ctx, rt->comm, q.buf, q.count, rt->xdt, q.peer);
  if (st != MP_OK) {
    mp_error_prefix(ctx, "pipeline stage %d of pp=%d: %s to world rank %d%s on group pp", rt->pp_stage, rt->pp,
                    mp_step_act_name(q.act), q.peer, recv ? " with a receive" : "");
    if (q.free_after) mp_talloc_free(ctx, rt->ta, q.free_after);
    return st;
  }
  return q.free_after ? mp_talloc_free(ctx, rt->ta, q.free_after) : MP_OK;
}

/* A receive from world rank src into recv: with the oldest send held (one sendrecv, to
 * that send's peer and from src: a shift along the pipeline when they differ), else
 * alone. Held sends go oldest first, so messages between two ranks keep their order. */
static mp_status recv_from(mp_ctx *ctx, mp_runtime *rt, void *recv, size_t count, int src, int act) {
  if (rt->n_pend > 0) return pend_complete(ctx, rt, 0, recv, count, src);
  mp_status st = mp_comm_recv(ctx, rt->comm, recv, count, rt->xdt, src);
  if (st != MP_OK)
    mp_error_prefix(ctx, "pipeline stage %d of pp=%d: %s from world rank %d on group pp", rt->pp_stage, rt->pp,
                    mp_step_act_name(act), src);
  return st;
}

/* Every held send completes, oldest first (the end of the step's transfers). */
static mp_status pend_flush_all(mp_ctx *ctx, mp_runtime *rt) {
  while (rt->n_pend > 0) MP_CHECK(pend_complete(ctx, rt, 0, NULL, 0, -1));
  return MP_OK;
}

static mp_status pend_push(mp_ctx *ctx, mp_runtime *rt, rt_p2p_pending q) {
  if (rt->n_pend == rt->cap_pend) {
    const int cap = rt->cap_pend ? 2 * rt->cap_pend : 8;
    rt_p2p_pending *p = realloc(rt->pend, sizeof *p * (size_t)cap);
    if (!p) return mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for the held sends");
    rt->pend = p;
    rt->cap_pend = cap;
  }
  rt->pend[rt->n_pend++] = q;
  return MP_OK;
}

mp_status mp_rt_p2p(mp_ctx *ctx, mp_runtime *rt, rt_micro *ms, const mp_step_action *a) {
  /* the residual stream and its gradient: the rank's Ns rows (N / tp under SP) */
  const size_t n = (size_t)rt->Ns * rt->C, xb = act_bytes(rt, MP_ACT_ALLOC_X);
  const int l = a->a;
  if (l < 0 || l > rt->L) return mp_error(ctx, MP_ERR_INTERNAL, "step program: %s of layer %d", mp_step_act_name(a->kind), l);
  switch ((mp_step_act)a->kind) {
    case MP_ACT_RECV_X:
      MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, xb, (void **)&rt->x[l]));
      if (l > ms->x_top) ms->x_top = l;
      return recv_from(ctx, rt, rt->x[l], n, rt->peer_prev, a->kind);
    case MP_ACT_RECV_DX:
      MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, act_bytes(rt, MP_ACT_ALLOC_DRES), &ms->dres));
      return recv_from(ctx, rt, ms->dres, n, rt->peer_next, a->kind);
    case MP_ACT_SEND_X:
    case MP_ACT_SEND_DX: {
      const int down = a->kind == MP_ACT_SEND_X;
      if (down && !rt->x[l]) return mp_error(ctx, MP_ERR_INTERNAL, "step program: sends x[%d], not held", l);
      if (!down && !ms->dres) return mp_error(ctx, MP_ERR_INTERNAL, "step program: sends a gradient not held");
      rt_p2p_pending q = {down ? (const void *)rt->x[l] : ms->dres, n, down ? rt->peer_next : rt->peer_prev,
                          down ? NULL : ms->dres, a->kind};
      if (!down) ms->dres = NULL; /* the held send frees it */
      /* one send held per direction: an earlier one of this direction completes first */
      for (int k = 0; k < rt->n_pend; k++)
        if (rt->pend[k].act == a->kind) MP_CHECK(pend_complete(ctx, rt, k--, NULL, 0, -1));
      return pend_push(ctx, rt, q);
    }
    default: return mp_error(ctx, MP_ERR_INTERNAL, "step program: action %d is no transfer", a->kind);
  }
}

mp_status mp_rt_walk(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens, double *ce, double *aux) {
  /* each rank's mean over its rows; under CP each of the cp ranks holds 1 / cp of every
   * sequence's tokens */
  const double dscale = 1.0 / ((double)rt->n_micro * rt->dp_size * rt->cp);
  for (int64_t i = 0; i < rt->n_order; i++) {
    const mp_pp_step *q = &rt->order[i];
    rt_micro *m = &rt->mic[q->micro % rt->n_mic];
    if (!q->bwd && q->chunk == 0) { /* the micro-batch's first step */
      m->seqs = tokens + (size_t)q->micro * rt->B * (rt->T + 1);
      m->tok = NULL, m->hf = m->lg = NULL, m->dres = NULL;
      m->x_top = -1;
      m->dscale = dscale;
      m->ce = ce;
      m->aux = aux;
    }
    micro_enter(rt, m);
    mp_status st = mp_rt_chunk_step(ctx, rt, m, q->chunk, q->bwd);
    if (st != MP_OK) {
      if (rt->pp > 1)
        mp_error_prefix(ctx, "%s of chunk %d, micro-batch %d", q->bwd ? "backward" : "forward", q->chunk, q->micro);
      return st;
    }
  }
  micro_enter(rt, &rt->mic[0]);
  return pend_flush_all(ctx, rt);
}

mp_status mp_rt_tied_grads(mp_ctx *ctx, mp_runtime *rt) {
  if (rt->tied_peer < 0) return MP_OK;
  const int i = *pslot(rt, -1, rt->pp_stage == 0 ? MP_MOD_TOK_EMBEDDINGS : MP_MOD_OUTPUT);
  if (i < 0 || !rt->prm[i].g) return mp_error(ctx, MP_ERR_INTERNAL, "runtime: stage %d holds no tied embedding", rt->pp_stage);
  rt_param *r = &rt->prm[i];
  float *other;
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_TEMP, (size_t)r->numel_pad * sizeof(float), (void **)&other));
  mp_status st = mp_comm_sendrecv(ctx, rt->comm, r->g, (size_t)r->numel_pad, rt->tied_peer, other,
                                  (size_t)r->numel_pad, rt->tied_peer, MP_COMM_DTYPE_FP32);
  if (st != MP_OK)
    mp_error_prefix(ctx, "pipeline stage %d: the tied embedding's gradient exchange with world rank %d on group pp",
                    rt->pp_stage, rt->tied_peer);
  if (st == MP_OK && rt->be->accumulate_f32(rt->kc, r->g, other, (size_t)r->numel_pad) != MP_OK)
    st = mp_error(ctx, MP_ERR_INTERNAL, "runtime: adding the tied embedding's gradient: %s", mp_errmsg(rt->kc->err));
  mp_status s2 = mp_talloc_free(ctx, rt->ta, other);
  MP_CHECK(st);
  return s2;
}
