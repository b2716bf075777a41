/* The step program (schedule.h, mp_schedule_step_program): one micro-batch of a schedule
 * built with a runtime memory model, read as the actions the runtime executes. Each action
 * is recognised from the ops' memory events and collectives (their buffers, phases, layers
 * and units), so the runtime follows the schedule's order and cannot drift from the memory
 * model. */
#include "exec/schedule_internal.h"

const char *mp_step_act_name(int kind) {
  static const char *n[MP_ACT_COUNT] = {
      "tokens",     "gather",   "embed_fwd", "block_fwd", "free_core", "free_block",
      "release",    "head_fwd", "grad_begin", "head_bwd", "recompute", "block_bwd",
      "grad_end",   "free_x",   "embed_bwd", "free_tokens", "rs_finish", "recv_x",
      "send_x",     "recv_dx",  "send_dx"};
  return kind >= 0 && kind < MP_ACT_COUNT ? n[kind] : "?";
}

/* The action of a memory event, or MP_ACT_COUNT for none; `last` is the action before
 * (NULL for the first), which the recompute and the reduce-scatter finish read so that one
 * action stands for several events. */
static mp_step_action mem_action(const mp_op *op, const mp_schedule_iter *it,
                                 const mp_step_action *last) {
  const int fwd = op->phase == MP_PHASE_FORWARD, bwd = op->phase == MP_PHASE_BACKWARD;
  const int rc = op->phase == MP_PHASE_RECOMPUTE;
  const int alloc = op->type == MP_OP_ALLOC, freed = op->type == MP_OP_FREE;
  mp_step_action x = {MP_ACT_COUNT, 0, 0, it->layer, 0};
  switch (op->buf) {
    case BUF_RT_TOKENS: x.kind = alloc ? MP_ACT_TOKENS : MP_ACT_FREE_TOKENS; break;
    case BUF_RT_BLOCK:
      if (alloc && fwd) x.kind = MP_ACT_BLOCK_FWD;
      else if (alloc && rc) x.kind = MP_ACT_RECOMPUTE, x.b = 1;
      else if (freed && fwd) x.kind = MP_ACT_FREE_BLOCK;
      break;
    case BUF_RT_CORE:
      if (freed && fwd) {
        x.kind = MP_ACT_FREE_CORE;
      } else if (alloc && rc && !(last && last->kind == MP_ACT_RECOMPUTE && last->a == it->layer)) {
        x.kind = MP_ACT_RECOMPUTE; /* the core alone: selective-core */
        x.b = 0;
      }
      break;
    case BUF_RT_X: if (freed && bwd) x.kind = MP_ACT_FREE_X; break;
    case BUF_RT_HEAD: if (alloc) x.kind = MP_ACT_HEAD_FWD; break;
    case BUF_DLOGITS: if (alloc) x.kind = MP_ACT_HEAD_BWD; break;
    case BUF_BWD_WS: if (alloc) x.kind = MP_ACT_BLOCK_BWD; break;
    case BUF_GRAD_UNSHARDED: if (alloc) x.kind = MP_ACT_GRAD_BEGIN, x.a = it->unit; break;
    case BUF_GATHERED: if (freed) x.kind = MP_ACT_RELEASE, x.a = it->unit; break;
    case BUF_RT_RS:
      /* the one in flight completes before the next unit's goes out, and at the end */
      if (freed && !(last && last->kind == MP_ACT_RS_FINISH)) x.kind = MP_ACT_RS_FINISH;
      break;
    default: break;
  }
  return x;
}

/* A pipeline transfer of the chunk whose layers are [l0, l1): the forward receives x[l0]
 * from the previous virtual stage and sends x[l1] to the next, the backward receives
 * dL/dx[l1] from the next and sends dL/dx[l0] to the previous. */
static mp_step_action p2p_action(const mp_op *op, int64_t l0, int64_t l1) {
  const int fwd = op->phase == MP_PHASE_FORWARD, send = op->coll == MP_COLL_SEND;
  mp_step_action x = {MP_ACT_COUNT, 0, 0, -1, 0};
  if (fwd) x.kind = send ? MP_ACT_SEND_X : MP_ACT_RECV_X;
  else x.kind = send ? MP_ACT_SEND_DX : MP_ACT_RECV_DX;
  x.a = (int32_t)(fwd == send ? l1 : l0);
  return x;
}

/* The action of an op of the micro-batch: a unit's gather or reduce-scatter, the
 * embedding, a pipeline transfer, or a memory event; MP_ACT_COUNT for none. A layer's
 * gathers are one action. */
static mp_step_action op_action(const mp_schedule *s, const mp_op *op,
                                const mp_schedule_iter *it, const mp_step_action *last) {
  mp_step_action x = {MP_ACT_COUNT, 0, 0, it->layer, 0};
  if (op->type == MP_OP_COMM && op->group == MP_GROUP_PP &&
      (op->coll == MP_COLL_SEND || op->coll == MP_COLL_RECV)) {
    int64_t l0, l1;
    mp_plan_chunk_layers(s->plan, s->pp_stage, s->segs[it->seg].chunk, &l0, &l1);
    x = p2p_action(op, l0, l1);
  } else if (op->type == MP_OP_COMM && op->coll == MP_COLL_ALL_GATHER && it->unit >= 0) {
    if (!(last && last->kind == MP_ACT_GATHER && last->a == it->layer)) x.kind = MP_ACT_GATHER;
  } else if (op->type == MP_OP_COMM && op->coll == MP_COLL_REDUCE_SCATTER && it->unit >= 0) {
    x.kind = MP_ACT_GRAD_END;
    x.a = it->unit;
  } else if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_EMBEDDING &&
             op->module == MP_MOD_TOK_EMBEDDINGS) {
    x.kind = op->phase == MP_PHASE_FORWARD ? MP_ACT_EMBED_FWD : MP_ACT_EMBED_BWD;
  } else if (op->type == MP_OP_ALLOC || op->type == MP_OP_FREE) {
    x = mem_action(op, it, last);
  }
  return x;
}

mp_status mp_schedule_step_program(mp_ctx *ctx, const mp_schedule *s, mp_arena *arena,
                                   mp_step_action **out, int32_t *n_out) {
  *out = NULL;
  *n_out = 0;
  const mem_strategy *ms = mp_sched_strategy(s->plan->opts.mem_model);
  if (ms == NULL || !ms->runtime)
    return mp_error(ctx, MP_ERR_INVALID,
                    "step program: the schedule has no runtime memory model (build the plan "
                    "with the meshplan-cpu or meshplan-cuda stack's options)");
  /* at most one action per op instance */
  const size_t cap = (size_t)(s->n_instances > 0 ? s->n_instances : 1);
  mp_step_action *a = mp_arena_alloc(arena, sizeof *a * cap);
  if (a == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the step program");
  int32_t n = 0;
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    const mp_op *op = it.op;
    if (op->phase == MP_PHASE_PROLOGUE || op->phase == MP_PHASE_OPTIMIZER) continue;
    if (op->when != MP_WHEN_EVERY_MICRO)
      return mp_error(ctx, MP_ERR_INVALID,
                      "step program: op %lld runs only in some micro-batches; the runtime runs "
                      "every micro-batch alike",
                      (long long)it.index);
    mp_step_action x = op_action(s, op, &it, n > 0 ? &a[n - 1] : NULL);
    if (x.kind == MP_ACT_COUNT) continue;
    x.chunk = s->segs[it.seg].chunk;
    x.bwd = op->phase != MP_PHASE_FORWARD;
    a[n++] = x;
  }
  *out = a;
  *n_out = n;
  return MP_OK;
}
