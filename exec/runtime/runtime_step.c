/* The training runtime: the step (runtime_internal.h lists the runtime's files).
 *
 * One micro-batch is the schedule's step program (exec/schedule.h,
 * mp_schedule_step_program, built at creation from this rank's schedule under the memory
 * model of this backend): the schedule decides the order, where gathers are issued and
 * released, what AC drops and recomputes, where gradients are reduced; each action below
 * is this runtime's kernels and collectives for it. The program's actions come in chunk
 * steps (a model chunk's forward or backward), which runtime_pp.c runs in the pipeline
 * order of the rank's stage. The step then reduces over the replicas (and the tied
 * embedding's two stages), clips the global gradient norm and runs AdamW. */
#include "exec/runtime/runtime_internal.h"

#include <math.h>

/* ---- the step program, walked -------------------------------------------------------- */

typedef rt_micro micro_state;

static mp_status act_tokens(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  const int N = rt->N, V = rt->V, T = rt->T, Tl = rt->Tl, cs = rt->Tl / 2;
  /* Token ids: inputs are the first T of each T + 1 window, targets the last T; under CP the
   * rank's local rows, its two chunks (runtime_cp.c) */
  int32_t *hin = malloc((size_t)N * 2 * sizeof(int32_t));
  MP_CHECK_ALLOC(ctx, hin);
  for (int b = 0; b < rt->B; b++)
    for (int t = 0; t < Tl; t++) {
      const int g = rt->cp == 1 ? t : mp_rt_cp_pos(rt, rt->cp_idx, t / cs) + t % cs;
      hin[b * Tl + t] = ms->seqs[(size_t)b * (T + 1) + g];
      hin[N + b * Tl + t] = ms->seqs[(size_t)b * (T + 1) + g + 1];
    }
  for (int i = 0; i < N; i++)
    if (hin[i] < 0 || hin[i] >= V || hin[N + i] < 0 || hin[N + i] >= V) {
      int bad = hin[i] < 0 || hin[i] >= V ? hin[i] : hin[N + i];
      free(hin);
      return mp_error(ctx, MP_ERR_INVALID, "token id %d is outside the model's vocabulary of %d; the data does not "
                      "match --model", bad, V);
    }
  const size_t tb = act_bytes(rt, MP_ACT_ALLOC_TOKENS); /* ids, then targets */
  mp_status st = mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, tb, (void **)&ms->tok);
  if (st == MP_OK) st = rt->be->memcpy_h2d(rt->kc, ms->tok, hin, tb);
  free(hin);
  MP_CHECK(st);
  rt->tok_in = ms->tok;
  rt->tok_tgt = ms->tok + N;
  return MP_OK;
}

/* The vocab-parallel lookup of all N tokens, its partial sums reduced over tp into x[0]
 * (SP: on SP_FULL, reduce-scattered onto the shard). */
static mp_status embed_lookup(mp_ctx *ctx, mp_runtime *rt, void *out) {
  BE(embedding_forward(rt->kc, out, rt->tok_in, W(rt, -1, MP_MOD_TOK_EMBEDDINGS), rt->N, rt->C, rt->v0,
                       rt->v0 + rt->Vl));
  if (rt->sp) return mp_rt_sp_scatter(ctx, rt, out, rt->x[0]);
  return tp_sum(ctx, rt, rt->x[0], (size_t)rt->N * rt->C);
}

static mp_status act_embed_fwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, act_bytes(rt, MP_ACT_ALLOC_X), (void **)&rt->x[0]));
  void *full = NULL;
  if (rt->sp) MP_CHECK(mp_rt_sp_full_alloc(ctx, rt, 0, &full));
  mp_status st = embed_lookup(ctx, rt, full ? full : rt->x[0]);
  if (full) st = mp_rt_sp_full_free(ctx, rt, st, full);
  MP_CHECK(st);
  ms->x_top = 0;
  return MP_OK;
}

static mp_status act_block_fwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms, int l) {
  MP_CHECK(mp_rt_gather_wait(ctx, rt, l));
  MP_CHECK(mp_rt_alloc_block(ctx, rt, l));
  MP_CHECK(
      mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, act_bytes(rt, MP_ACT_ALLOC_X), (void **)&rt->x[l + 1]));
  float auxv = 0;
  MP_CHECK(mp_rt_block_forward(ctx, rt, l, rt->x[l], rt->x[l + 1], &auxv));
  /* the load-balancing loss where its layer runs: under a pipeline every stage adds its
   * own MoE layers' (summed over pp with the loss), each micro-batch's scaled like its
   * cross-entropy, so the step's aux loss is the single-rank run's mean over micro-batches */
  if (is_moe_layer(rt, l)) *ms->aux += rt->plan->model.aux_loss_coef * auxv * ms->dscale;
  ms->x_top = l + 1;
  return MP_OK;
}

/* head: final norm (its saved tensors in one HEAD block), logits (the rank's vocabulary
 * slice under tp) and loss (vocab-parallel under tp) in one LOGITS block. The head's
 * weight is the output projection, or for a tied model the embedding itself (under a
 * pipeline, the last stage's copy of it: the plan's output.weight). */
static mp_module head_module(const mp_runtime *rt) {
  return *pslot(rt, -1, MP_MOD_OUTPUT) >= 0 ? MP_MOD_OUTPUT : MP_MOD_TOK_EMBEDDINGS;
}

static const void *head_weight(const mp_runtime *rt) { return W(rt, -1, head_module(rt)); }

static mp_status act_head_fwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  const int N = rt->N, C = rt->C, V = rt->V, L = rt->L, Vl = rt->Vl;
  const mp_act_layout *y = &rt->lay_dense;
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, y->bytes[MP_ACT_ALLOC_HEAD], (void **)&ms->hf));
  void *xf = ms->hf + y->xf;
  float *rstdf = F32(ms->hf + y->rstdf);
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_LOGITS, y->bytes[MP_ACT_ALLOC_LOGITS], (void **)&ms->lg));
  char *lg = ms->lg;
  void *logits = lg + y->logits;
  float *losses = F32(lg + y->losses), *lse = F32(lg + y->ce_lse), *mean = F32(lg + y->ce_mean);
  const void *Wout = head_weight(rt);
  if (!Wout) return mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan has no output head");
  /* SP: the norm on the shard into the rank's rows of xf, all-gathered (the head's region) */
  BE(rmsnorm_forward(rt->kc, rt->sp ? mp_rt_sp_slot(rt, xf) : xf, rstdf, rt->x[L], W(rt, -1, MP_MOD_FINAL_NORM),
                     rt->Ns, C, rt->eps));
  MP_CHECK(mp_rt_sp_gather(ctx, rt, NULL, xf));
  BE(matmul_forward(rt->kc, logits, xf, Wout, NULL, N, C, Vl));
  if (rt->tp == 1) {
    BE(cross_entropy_forward(rt->kc, losses, mean, lse, logits, rt->tok_tgt, N, V));
  } else {
    float *gmax = F32(lg + y->vp_max), *gsum = F32(lg + y->vp_sumexp), *gtgt = F32(lg + y->vp_target);
    BE(ce_local_max(rt->kc, gmax, logits, N, Vl));
    MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_TP, gmax, gmax, (size_t)N, MP_COMM_DTYPE_FP32, MP_COMM_OP_MAX));
    BE(ce_local_sumexp(rt->kc, gsum, logits, gmax, N, Vl));
    BE(ce_local_target(rt->kc, gtgt, logits, rt->tok_tgt, N, Vl, rt->v0));
    MP_CHECK(tp_sum_f32(ctx, rt, gsum, (size_t)N));
    MP_CHECK(tp_sum_f32(ctx, rt, gtgt, (size_t)N));
    BE(ce_vp_combine(rt->kc, losses, mean, lse, gmax, gsum, gtgt, rt->tok_tgt, N));
  }
  if (rt->logits_out) { /* mp_runtime_capture_logits: fp32 X, tp 1 (checked there) */
    BE(memcpy_d2h(rt->kc, rt->logits_out + rt->logits_at, logits, (size_t)N * Vl * sizeof(float)));
    rt->logits_at += (int64_t)N * Vl;
  }
  float ce_mean;
  BE(memcpy_d2h(rt->kc, &ce_mean, mean, sizeof ce_mean));
  *ms->ce += ce_mean * ms->dscale;
  return MP_OK;
}

static mp_status act_head_bwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  const int N = rt->N, C = rt->C, L = rt->L, Vl = rt->Vl;
  const mp_act_layout *y = &rt->lay_dense;
  void *xf = ms->hf + y->xf, *logits = ms->lg + y->logits;
  float *rstdf = F32(ms->hf + y->rstdf), *lse = F32(ms->lg + y->ce_lse);
  const void *Wout = head_weight(rt);
  float *dWout = G(rt, -1, head_module(rt));
  void *dlg, *dxf;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_LOGITS, y->bytes[MP_ACT_ALLOC_DLOGITS], &dlg));
  BE(ce_backward(rt->kc, dlg, logits, lse, rt->tok_tgt, (float)(ms->dscale / N), N, Vl, rt->v0));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, y->bytes[MP_ACT_ALLOC_DRES], &ms->dres));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, y->bytes[MP_ACT_ALLOC_DXF], &dxf));
  /* colwise head: partial over the vocabulary, summed over tp (SP: reduce-scattered) */
  if (rt->sp) {
    void *full;
    MP_CHECK(mp_rt_sp_full_alloc(ctx, rt, 1, &full));
    mp_status st = rt->be->matmul_backward(rt->kc, full, dWout, NULL, dlg, xf, Wout, N, C, Vl);
    if (st != MP_OK) st = mp_error(ctx, st, "head backward: %s", mp_errmsg(rt->kc->err));
    if (st == MP_OK) st = mp_rt_sp_scatter(ctx, rt, full, dxf);
    MP_CHECK(mp_rt_sp_full_free(ctx, rt, st, full));
  } else {
    BE(matmul_backward(rt->kc, dxf, dWout, NULL, dlg, xf, Wout, N, C, Vl));
    MP_CHECK(tp_sum(ctx, rt, dxf, (size_t)N * C));
  }
  MP_CHECK(mp_talloc_free(ctx, rt->ta, dlg));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, ms->lg));
  ms->lg = NULL;
  BE(rmsnorm_backward(rt->kc, ms->dres, G(rt, -1, MP_MOD_FINAL_NORM), dxf, rt->x[L], W(rt, -1, MP_MOD_FINAL_NORM),
                      rstdf, rt->Ns, C));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, dxf));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, ms->hf));
  ms->hf = NULL;
  return MP_OK;
}

static mp_status act_recompute(mp_ctx *ctx, mp_runtime *rt, int l, int full) {
  MP_CHECK(mp_rt_gather_wait(ctx, rt, l));
  if (full) { /* the whole block from its saved input */
    MP_CHECK(mp_rt_alloc_block(ctx, rt, l));
    return mp_rt_block_forward(ctx, rt, l, rt->x[l], NULL, NULL);
  }
  /* the attention core from the saved q, k, v */
  const size_t cb = lay_of(rt, l)->bytes[MP_ACT_ALLOC_CORE];
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, cb, (void **)&rt->core[l]));
  return mp_rt_attn_core_forward(ctx, rt, l);
}

static mp_status act_block_bwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms, int l) {
  MP_CHECK(mp_rt_gather_wait(ctx, rt, l)); /* no-op when already gathered */
  char *ws;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, lay_of(rt, l)->bytes[MP_ACT_ALLOC_WS], (void **)&ws));
  MP_CHECK(mp_rt_block_backward(ctx, rt, l, ms->dres, ws, (float)(rt->plan->model.aux_loss_coef * ms->dscale)));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, ws));
  return mp_rt_free_block(ctx, rt, l);
}

/* The highest residual-stream tensor held goes (a stage's chunks hold disjoint runs of
 * them: the indices between are empty). */
static mp_status act_free_x(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  while (ms->x_top >= 0 && rt->x[ms->x_top] == NULL) ms->x_top--;
  if (ms->x_top < 0) return mp_error(ctx, MP_ERR_INTERNAL, "step program: frees a residual-stream tensor too many");
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->x[ms->x_top]));
  rt->x[ms->x_top--] = NULL;
  return MP_OK;
}

static mp_status act_embed_bwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  if (rt->sp) { /* every token's gradient, for the rank's vocabulary rows */
    void *full;
    MP_CHECK(mp_rt_sp_full_alloc(ctx, rt, 0, &full));
    mp_status st = mp_rt_sp_gather(ctx, rt, ms->dres, full);
    if (st == MP_OK) {
      st = rt->be->embedding_backward(rt->kc, G(rt, -1, MP_MOD_TOK_EMBEDDINGS), full, rt->tok_in, rt->N, rt->C,
                                      rt->v0, rt->v0 + rt->Vl);
      if (st != MP_OK) st = mp_error(ctx, st, "embedding backward: %s", mp_errmsg(rt->kc->err));
    }
    MP_CHECK(mp_rt_sp_full_free(ctx, rt, st, full));
  } else {
    BE(embedding_backward(rt->kc, G(rt, -1, MP_MOD_TOK_EMBEDDINGS), ms->dres, rt->tok_in, rt->N, rt->C, rt->v0,
                          rt->v0 + rt->Vl));
  }
  MP_CHECK(mp_talloc_free(ctx, rt->ta, ms->dres));
  ms->dres = NULL;
  return MP_OK;
}

static mp_status act_run(mp_ctx *ctx, mp_runtime *rt, micro_state *ms, const mp_step_action *a) {
  switch ((mp_step_act)a->kind) {
    case MP_ACT_TOKENS: return act_tokens(ctx, rt, ms);
    case MP_ACT_GATHER: return mp_rt_gather_layer(ctx, rt, a->a);
    case MP_ACT_EMBED_FWD: return act_embed_fwd(ctx, rt, ms);
    case MP_ACT_BLOCK_FWD: return act_block_fwd(ctx, rt, ms, a->a);
    case MP_ACT_FREE_CORE: {
      MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->core[a->a]));
      rt->core[a->a] = NULL;
      return MP_OK;
    }
    case MP_ACT_FREE_BLOCK: return mp_rt_free_block(ctx, rt, a->a);
    case MP_ACT_RELEASE: return mp_rt_unit_release(ctx, rt, a->a);
    case MP_ACT_HEAD_FWD: return act_head_fwd(ctx, rt, ms);
    case MP_ACT_GRAD_BEGIN: return mp_rt_unit_grad_begin(ctx, rt, a->a);
    case MP_ACT_HEAD_BWD: return act_head_bwd(ctx, rt, ms);
    case MP_ACT_RECOMPUTE: return act_recompute(ctx, rt, a->a, a->b);
    case MP_ACT_BLOCK_BWD: return act_block_bwd(ctx, rt, ms, a->a);
    case MP_ACT_GRAD_END: return mp_rt_unit_grad_end(ctx, rt, a->a);
    case MP_ACT_FREE_X: return act_free_x(ctx, rt, ms);
    case MP_ACT_EMBED_BWD: return act_embed_bwd(ctx, rt, ms);
    case MP_ACT_FREE_TOKENS: {
      MP_CHECK(mp_talloc_free(ctx, rt->ta, ms->tok));
      ms->tok = NULL;
      rt->tok_in = rt->tok_tgt = NULL;
      return MP_OK;
    }
    case MP_ACT_RS_FINISH: return mp_rt_rs_finish_all(ctx, rt);
    case MP_ACT_RECV_X:
    case MP_ACT_SEND_X:
    case MP_ACT_RECV_DX:
    case MP_ACT_SEND_DX: return mp_rt_p2p(ctx, rt, ms, a);
    default: return mp_error(ctx, MP_ERR_INTERNAL, "step program: unknown action %d", a->kind);
  }
}

/* One chunk step of a micro-batch: the program's actions of the chunk's forward (bwd 0) or
 * backward, in order. The micro-batch's last step (the backward of chunk 0) leaves
 * nothing of it held. */
mp_status mp_rt_chunk_step(mp_ctx *ctx, mp_runtime *rt, rt_micro *ms, int chunk, int bwd) {
  for (int32_t i = 0; i < rt->n_prog; i++)
    if (rt->prog[i].chunk == chunk && rt->prog[i].bwd == bwd) MP_CHECK(act_run(ctx, rt, ms, &rt->prog[i]));
  if (!bwd || chunk != 0) return MP_OK;
  while (ms->x_top >= 0 && rt->x[ms->x_top] == NULL) ms->x_top--;
  if (ms->tok || ms->hf || ms->lg || ms->dres || ms->x_top >= 0)
    return mp_error(ctx, MP_ERR_INTERNAL, "step program: the micro-batch ended holding its %s",
                    ms->tok ? "tokens" : ms->hf || ms->lg ? "head tensors" : ms->dres ? "residual gradient"
                                                                                  : "residual stream");
  return MP_OK;
}

/* ---- the step -------------------------------------------------------------------------- */

mp_status mp_runtime_capture_logits(mp_ctx *ctx, mp_runtime *rt, float *dst) {
  if (dst && (rt->xs != sizeof(float) || rt->tp != 1 || rt->Vl != rt->V))
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "logits are captured from an fp32 backend with tp 1 and an unpadded "
                    "vocabulary; this run has %s X, tp %d", rt->xs == sizeof(float) ? "fp32" : "bf16", rt->tp);
  rt->logits_out = dst;
  rt->logits_at = 0;
  return MP_OK;
}

mp_status mp_runtime_forward_backward(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens, mp_step_result *res) {
  memset(res, 0, sizeof *res);
  for (int i = 0; i < rt->plan->n_params; i++)
    if (rt->prm[i].g) BE(memset_zero(rt->kc, rt->prm[i].g, (size_t)rt->prm[i].numel_pad * sizeof(float)));
  double ce = 0, aux = 0;
  if (rt->load_routed) {
    memset(rt->load_routed, 0, (size_t)rt->L * rt->E * sizeof *rt->load_routed);
    memset(rt->load_dropped, 0, (size_t)rt->L * rt->E * sizeof *rt->load_dropped);
  }
  MP_CHECK(mp_rt_walk(ctx, rt, tokens, &ce, &aux));
  MP_CHECK(mp_rt_moe_loads_reduce(ctx, rt));
  MP_CHECK(mp_rt_sp_norm_grads(ctx, rt));
  MP_CHECK(mp_rt_cp_grads(ctx, rt));
  MP_CHECK(mp_rt_tied_grads(ctx, rt));
  /* ce, aux and the gradients are already scaled by 1 / (n_micro * dp): the FSDP
   * reduce-scatters summed the gradient shards over dp_shard (a routed expert's over its
   * expert-FSDP group); summing over the replicas (dp_replicate, or a routed expert's
   * expert-DP group where the expert grid reaches into dp_replicate: r->rep) gives the
   * global means (identity at world size 1). */
  for (int i = 0; i < rt->plan->n_params; i++) {
    rt_param *r = &rt->prm[i];
    if (r->g && mp_comm_group_size(rt->comm, r->rep) > 1)
      MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, r->rep, r->g, r->g, (size_t)r->numel_pad, MP_COMM_DTYPE_FP32,
                                  MP_COMM_OP_SUM));
  }
  if (rt->dp_size > 1 || rt->pp > 1) {
    /* fp32 sums of a few values: far inside the 1e-5 parity tolerance. Under a pipeline
     * only the last stage computed the loss (the others hold 0): the sum over pp hands it
     * to every stage (printing, metrics and the optimizer's finite-loss check). */
    float v[2] = {(float)ce, (float)aux};
    if (rt->dp_size > 1)
      MP_CHECK(mp_rt_host_coll(ctx, rt, MP_GROUP_DP, v, NULL, 2, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM, NULL));
    if (rt->pp > 1)
      MP_CHECK(mp_rt_host_coll(ctx, rt, MP_GROUP_PP, v, NULL, 2, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM, NULL));
    ce = v[0];
    aux = v[1];
  }
  if (rt->cp > 1) { /* the mean over the whole sequences */
    float v[2] = {(float)ce, (float)aux};
    MP_CHECK(mp_rt_host_coll(ctx, rt, MP_GROUP_CP, v, NULL, 2, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM, NULL));
    ce = v[0];
    aux = v[1];
  }
  res->ce_loss = ce;
  res->aux_loss = aux;
  res->loss = ce + aux;
  res->tokens = rt->local_batch * rt->T;
  return MP_OK;
}

mp_status mp_runtime_optimizer_step(mp_ctx *ctx, mp_runtime *rt, mp_step_result *res) {
  /* Global norm: each parameter counted once (its owner's shard; shards are disjoint),
   * per-parameter sums (each into its own device slot, read back in one copy) added in a
   * fixed order, then one all-reduce over the world. */
  const int np = rt->plan->n_params;
  float *sq = rt->scalar + 8, *hsq = malloc((size_t)(np ? np : 1) * sizeof(float));
  MP_CHECK_ALLOC(ctx, hsq);
  mp_status st = rt->be->memset_zero(rt->kc, sq, (size_t)np * sizeof(float));
  for (int i = 0; i < np && st == MP_OK; i++) {
    const rt_param *r = &rt->prm[i];
    if (r->g && r->owner) st = rt->be->sum_squares(rt->kc, sq + i, r->g, (size_t)r->numel_pad);
  }
  if (st == MP_OK) st = rt->be->memcpy_d2h(rt->kc, hsq, sq, (size_t)np * sizeof(float));
  double sumsq = 0;
  for (int i = 0; i < np; i++)
    if (rt->prm[i].g && rt->prm[i].owner) sumsq += hsq[i];
  free(hsq);
  /* A loss that is not finite poisons the norm before its all-reduce, so every rank sees
   * a NaN norm and skips the update alike: whether a rank takes the optimizer's
   * collectives must never depend on a value only some ranks hold. */
  if (!isfinite(res->loss)) sumsq = NAN;
  if (st != MP_OK) return mp_error(ctx, st, "gradient norm: %s", mp_errmsg(rt->kc->err));
  if (mp_comm_world_size(rt->comm) > 1) {
    float v = (float)sumsq;
    MP_CHECK(mp_rt_host_coll(ctx, rt, MP_GROUP_WORLD, &v, NULL, 1, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM, NULL));
    sumsq = v;
  }
  const double norm = sqrt(sumsq);
  res->grad_norm = norm;
  res->skipped = !isfinite(norm);
  if (res->skipped) return MP_OK; /* a diverged step changes nothing (runtime.h) */
  const float scale = rt->opts.max_grad_norm > 0 ? mp_clip_scale((float)norm, rt->opts.max_grad_norm) : 1.0f;
  rt->step++;
  for (int i = 0; i < rt->plan->n_params; i++) {
    rt_param *r = &rt->prm[i];
    if (!r->g) continue;
    BE(adamw_update(rt->kc, r->w, r->g, r->m, r->v, (size_t)r->numel_pad, rt->opts.lr, rt->opts.beta1,
                    rt->opts.beta2, rt->opts.eps, r->decay ? rt->opts.weight_decay : 0.0f, (int)rt->step, scale));
    /* a resident compute copy follows its master (sharded ones are cast at each gather),
     * and so do its cached float8 codes */
    if (r->cw && r->cw != (void *)r->w && !r->sharded) BE(x_from_f32(rt->kc, r->cw, r->w, (size_t)r->numel_pad));
    r->f8w_valid = 0;
  }
  return MP_OK;
}

mp_status mp_runtime_step(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens, mp_step_result *res) {
  mp_talloc_reset_peak(rt->ta);
  MP_CHECK(mp_runtime_forward_backward(ctx, rt, tokens, res));
  MP_CHECK(mp_runtime_optimizer_step(ctx, rt, res));
  MP_CHECK(mp_runtime_synchronize(ctx, rt));
  res->peak_bytes = mp_talloc_peak_total(rt->ta);
  return MP_OK;
}
