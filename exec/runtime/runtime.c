/* The training runtime (see runtime.h for the step's semantics and memory categories).
 *
 * Tensor naming follows the model: x[l] is the residual stream entering block l (x[L]
 * enters the final norm); a block saves, in one carved ACTIVATIONS allocation,
 *   xn1 (N,C) rstd1 (N) q (N,nh*hd, after RoPE) k v (N,nkv*hd) xmid (N,C) xn2 (N,C)
 *   rstd2 (N), then dense: g u h (N,F); MoE: router logits and probs (N,E), top-k idx and
 *   weights (N,k), f (E), aux (1), perm/inv (N*k), counts (E), permuted input xp (N*k,C),
 *   expert gate/up/hidden (N*k,Fe), expert out ey (N*k,C), shared gate/up/hidden (N,Fs),
 * and, in a second allocation (so selective AC can drop it), the attention core:
 *   att (N,nh*hd), lse (B,nh,T).
 * Backward of a block takes dres = dL/dx[l+1] and leaves dL/dx[l] in the same buffer: the
 * MLP branch reads dres, then the FFN norm's backward adds its input gradient into dres
 * (residual), and likewise for attention. Every kernel accumulates (ops.h), so the
 * per-block workspace is zeroed once when it is allocated. */
#include "exec/runtime/runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec/runtime/init.h"

typedef struct rt_param {
  int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM], numel;
  float *w, *g, *m, *v; /* master, gradient, AdamW state (numel each) */
  int decay;
} rt_param;

/* Offsets (in 4-byte elements) of the tensors carved from a block's allocations. */
typedef struct rt_layout {
  size_t xn1, rstd1, q, k, v, xmid, xn2, rstd2, g, u, h;
  size_t rl, probs, tki, tkw, f, aux, perm, inv, counts, xp, eg, eu, eh, ey, sg, su, sh;
  size_t total;
  size_t att, lse, core_total;
  /* backward workspace */
  size_t dxn, dh, dg, du, datt, dq, dk, dv, dqp, dkp, drl, dprobs, dtkw, dey, deh, deg, deu, dxp, dsh, dsg,
      dsu, ws_total;
} rt_layout;

struct mp_runtime {
  const mp_plan *plan;
  mp_comm *comm;
  const mp_backend *be;
  mp_kctx *kc;
  mp_runtime_options opts;
  mp_talloc *ta;
  int rank;
  int B, T, N, C, nh, nkv, hd, F, V, L, E, K, Fe, Fs;
  float eps;
  int64_t local_batch, n_micro;
  int dp_size;
  rt_param *prm;
  int *pidx;    /* [(L + 1) * MP_MOD_COUNT]: weight param index per (layer, module); row L: outside blocks */
  float *rope_cos, *rope_sin, *scalar;
  int32_t *tok_in, *tok_tgt;
  rt_layout lay_dense, lay_moe;
  float **x;        /* [L + 1] */
  float **act;      /* [L] */
  float **core;     /* [L] */
  int32_t *counts_h; /* [L * E] host copies of expert row counts */
  int step;
};

#define ALIGN16(n) (((n) + 15) & ~(size_t)15)

static void layout(rt_layout *l, const mp_runtime *rt, int moe) {
  const size_t N = (size_t)rt->N, C = (size_t)rt->C, QD = (size_t)rt->nh * rt->hd, KD = (size_t)rt->nkv * rt->hd;
  const size_t NK = N * (size_t)rt->K, E = (size_t)rt->E, F = (size_t)rt->F, Fe = (size_t)rt->Fe, Fs = (size_t)rt->Fs;
  size_t o = 0;
  memset(l, 0, sizeof *l);
#define PUT(field, n) \
  do {                \
    l->field = o;     \
    o += ALIGN16(n);  \
  } while (0)
  PUT(xn1, N * C);
  PUT(rstd1, N);
  PUT(q, N * QD);
  PUT(k, N * KD);
  PUT(v, N * KD);
  PUT(xmid, N * C);
  PUT(xn2, N * C);
  PUT(rstd2, N);
  if (!moe) {
    PUT(g, N * F);
    PUT(u, N * F);
    PUT(h, N * F);
  } else {
    PUT(rl, N * E);
    PUT(probs, N * E);
    PUT(tki, NK);
    PUT(tkw, NK);
    PUT(f, E);
    PUT(aux, 1);
    PUT(perm, NK);
    PUT(inv, NK);
    PUT(counts, E);
    PUT(xp, NK * C);
    PUT(eg, NK * Fe);
    PUT(eu, NK * Fe);
    PUT(eh, NK * Fe);
    PUT(ey, NK * C);
    if (Fs) {
      PUT(sg, N * Fs);
      PUT(su, N * Fs);
      PUT(sh, N * Fs);
    }
  }
  l->total = o;
  o = 0;
  PUT(att, N * QD);
  PUT(lse, (size_t)rt->B * rt->nh * rt->T);
  l->core_total = o;
  o = 0;
  PUT(dxn, N * C);
  PUT(datt, N * QD);
  PUT(dq, N * QD);
  PUT(dk, N * KD);
  PUT(dv, N * KD);
  PUT(dqp, N * QD);
  PUT(dkp, N * KD);
  if (!moe) {
    PUT(dh, N * F);
    PUT(dg, N * F);
    PUT(du, N * F);
  } else {
    PUT(drl, N * E);
    PUT(dprobs, N * E);
    PUT(dtkw, NK);
    PUT(dey, NK * C);
    PUT(deh, NK * Fe);
    PUT(deg, NK * Fe);
    PUT(deu, NK * Fe);
    PUT(dxp, NK * C);
    if (Fs) {
      PUT(dsh, N * Fs);
      PUT(dsg, N * Fs);
      PUT(dsu, N * Fs);
    }
  }
  l->ws_total = o;
#undef PUT
}

void mp_runtime_options_init(mp_runtime_options *o) {
  memset(o, 0, sizeof *o);
  o->seed = 1234;
  o->lr = 1e-3f;
  o->beta1 = 0.9f;
  o->beta2 = 0.95f;
  o->eps = 1e-8f;
  o->weight_decay = 0.1f;
  o->max_grad_norm = 1.0f;
}

static int *pslot(const mp_runtime *rt, int layer, mp_module m) {
  return &rt->pidx[(layer < 0 ? rt->L : layer) * MP_MOD_COUNT + m];
}
static float *W(const mp_runtime *rt, int layer, mp_module m) {
  int i = *pslot(rt, layer, m);
  return i < 0 ? NULL : rt->prm[i].w;
}
static float *G(const mp_runtime *rt, int layer, mp_module m) {
  int i = *pslot(rt, layer, m);
  return i < 0 ? NULL : rt->prm[i].g;
}

#define BE(call)                                                                                       \
  do {                                                                                                 \
    mp_status be_s_ = rt->be->call;                                                                    \
    if (be_s_ != MP_OK)                                                                                \
      return mp_error(ctx, be_s_, "%s:%d: kernel %s failed: %s", __FILE__, __LINE__, #call,            \
                      mp_errmsg(rt->kc->err));                                                         \
  } while (0)

static int is_moe_layer(const mp_runtime *rt, int l) { return mp_model_layer_is_moe(&rt->plan->model, l); }
static const rt_layout *lay_of(const mp_runtime *rt, int l) { return is_moe_layer(rt, l) ? &rt->lay_moe : &rt->lay_dense; }

static mp_status check_supported(mp_ctx *ctx, const mp_plan *p, mp_comm *comm) {
  const mp_model *m = &p->model;
  /* Pure replication (DDP over dp_replicate) is the one multi-rank layout in this build:
   * every rank holds whole parameters and gradients are all-reduced. */
  if (mp_mesh_world(&p->mesh) != mp_comm_world_size(comm) ||
      mp_mesh_world(&p->mesh) != p->mesh.size[MP_DIM_DP_REPLICATE])
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "the CPU runtime trains with world size 1 or pure dp_replicate "
                    "only in this build (mesh has %d ranks, dp_replicate=%d); FSDP/TP/EP/PP execution is not "
                    "implemented yet", mp_mesh_world(&p->mesh), p->mesh.size[MP_DIM_DP_REPLICATE]);
  if (m->family != MP_FAMILY_LLAMA)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: the runtime implements the llama family only "
                    "(RMSNorm, RoPE, SwiGLU); gpt models are not implemented yet", m->name);
  if (m->qkv_bias || m->qk_norm || m->bias)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: q/k/v biases and q/k norms (Qwen2/Qwen3) are not "
                    "implemented in the runtime yet", m->name);
  if (p->opts.fp8)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "float8 training is not implemented in the CPU runtime yet; "
                    "drop --fp8");
  if (m->head_dim % 2)
    return mp_error(ctx, MP_ERR_INVALID, "model %s: RoPE needs an even head_dim (got %lld)", m->name,
                    (long long)m->head_dim);
  return MP_OK;
}

mp_status mp_runtime_create(mp_ctx *ctx, const mp_plan *plan, mp_comm *comm, const mp_backend *be, mp_kctx *kc,
                            const mp_runtime_options *opts, mp_runtime **out) {
  *out = NULL;
  MP_CHECK(check_supported(ctx, plan, comm));
  int64_t local_batch, n_micro;
  MP_CHECK(mp_plan_batch(ctx, plan, &local_batch, &n_micro));
  const mp_model *m = &plan->model;
  if (plan->opts.seq > m->max_seq)
    return mp_error(ctx, MP_ERR_INVALID, "seq %lld exceeds model %s's max_seq %lld; use --seq <= %lld",
                    (long long)plan->opts.seq, m->name, (long long)m->max_seq, (long long)m->max_seq);
  mp_runtime *rt = calloc(1, sizeof *rt);
  MP_CHECK_ALLOC(ctx, rt);
  mp_status st = MP_OK;
  rt->plan = plan;
  rt->comm = comm;
  rt->be = be;
  rt->kc = kc;
  rt->opts = *opts;
  rt->rank = mp_comm_world_rank(comm);
  rt->B = (int)plan->opts.micro_batch;
  rt->T = (int)plan->opts.seq;
  rt->N = rt->B * rt->T;
  rt->C = (int)m->d_model;
  rt->nh = (int)m->n_heads;
  rt->nkv = (int)m->n_kv_heads;
  rt->hd = (int)m->head_dim;
  rt->F = (int)m->d_ff;
  rt->V = (int)m->vocab;
  rt->L = (int)m->n_layers;
  rt->E = (int)m->n_experts;
  rt->K = (int)m->top_k;
  rt->Fe = (int)m->d_ff_expert;
  rt->Fs = m->n_shared_experts > 0 ? (int)m->d_ff_shared : 0;
  rt->eps = (float)m->norm_eps;
  rt->local_batch = local_batch;
  rt->n_micro = n_micro;
  rt->dp_size = mp_comm_group_size(comm, MP_GROUP_DP);
  layout(&rt->lay_dense, rt, 0);
  layout(&rt->lay_moe, rt, 1);

  rt->prm = calloc((size_t)plan->n_params, sizeof *rt->prm);
  rt->pidx = malloc((size_t)(rt->L + 1) * MP_MOD_COUNT * sizeof *rt->pidx);
  rt->x = calloc((size_t)rt->L + 1, sizeof *rt->x);
  rt->act = calloc((size_t)rt->L, sizeof *rt->act);
  rt->core = calloc((size_t)rt->L, sizeof *rt->core);
  rt->counts_h = calloc((size_t)rt->L * (rt->E ? rt->E : 1), sizeof *rt->counts_h);
  if (!rt->prm || !rt->pidx || !rt->x || !rt->act || !rt->core || !rt->counts_h) {
    st = mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for bookkeeping");
    goto fail;
  }
  for (int i = 0; i < (rt->L + 1) * MP_MOD_COUNT; i++) rt->pidx[i] = -1;
  MP_CHECK_GOTO(mp_talloc_create(ctx, be, kc, &rt->ta), st, fail);

  /* Materialize: the rank's tiles only, master + grad + m + v. */
  float *host = NULL;
  for (int i = 0; i < plan->n_params; i++) {
    const mp_param *p = &plan->params[i];
    rt_param *r = &rt->prm[i];
    if (p->role == MP_ROLE_WEIGHT) *pslot(rt, p->layer, p->module) = i;
    if (!mp_param_tile(plan, p, rt->rank, r->off, r->len)) continue;
    r->numel = 1;
    for (int d = 0; d < p->ndim; d++) r->numel *= r->len[d];
    r->decay = p->ndim >= 2;
    size_t bytes = (size_t)r->numel * sizeof(float);
    MP_CHECK_GOTO(mp_talloc_alloc(ctx, rt->ta, MP_MEM_PARAMS, bytes, (void **)&r->w), st, fail);
    MP_CHECK_GOTO(mp_talloc_alloc(ctx, rt->ta, MP_MEM_GRADS, bytes, (void **)&r->g), st, fail);
    MP_CHECK_GOTO(mp_talloc_alloc(ctx, rt->ta, MP_MEM_OPTIMIZER, bytes, (void **)&r->m), st, fail);
    MP_CHECK_GOTO(mp_talloc_alloc(ctx, rt->ta, MP_MEM_OPTIMIZER, bytes, (void **)&r->v), st, fail);
    host = malloc(bytes);
    if (!host) {
      st = mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory initializing %s", p->fqn);
      goto fail;
    }
    mp_init_fill_block(opts->seed, p, r->off, r->len, host);
    st = be->memcpy_h2d(kc, r->w, host, bytes);
    free(host);
    host = NULL;
    if (st != MP_OK) goto fail;
  }
  /* Every module the forward needs must be present. */
  static const mp_module need_attn[] = {MP_MOD_ATTN_NORM, MP_MOD_Q, MP_MOD_K, MP_MOD_V, MP_MOD_O, MP_MOD_FFN_NORM};
  for (int l = 0; l < rt->L; l++) {
    for (size_t j = 0; j < sizeof need_attn / sizeof need_attn[0]; j++)
      if (*pslot(rt, l, need_attn[j]) < 0) {
        st = mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan has no %s in layer %d", mp_module_name(need_attn[j]), l);
        goto fail;
      }
  }
  if (*pslot(rt, -1, MP_MOD_TOK_EMBEDDINGS) < 0 || *pslot(rt, -1, MP_MOD_FINAL_NORM) < 0) {
    st = mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan lacks the embedding or final norm");
    goto fail;
  }

  /* RoPE tables (resident workspace) and a device scalar for reductions. */
  size_t rb = (size_t)rt->T * (rt->hd / 2) * sizeof(float);
  MP_CHECK_GOTO(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, rb, (void **)&rt->rope_cos), st, fail);
  MP_CHECK_GOTO(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, rb, (void **)&rt->rope_sin), st, fail);
  MP_CHECK_GOTO(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, sizeof(float), (void **)&rt->scalar), st, fail);
  {
    float *c = malloc(rb), *s = malloc(rb);
    if (!c || !s) {
      free(c);
      free(s);
      st = mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for RoPE tables");
      goto fail;
    }
    mp_rope_tables(c, s, rt->T, rt->hd, (float)m->rope_theta, 0);
    st = be->memcpy_h2d(kc, rt->rope_cos, c, rb);
    if (st == MP_OK) st = be->memcpy_h2d(kc, rt->rope_sin, s, rb);
    free(c);
    free(s);
    if (st != MP_OK) goto fail;
  }
  *out = rt;
  return MP_OK;
fail:
  mp_runtime_destroy(rt);
  return st;
}

void mp_runtime_destroy(mp_runtime *rt) {
  if (!rt) return;
  mp_talloc_destroy(rt->ta);
  free(rt->prm);
  free(rt->pidx);
  free(rt->x);
  free(rt->act);
  free(rt->core);
  free(rt->counts_h);
  free(rt);
}

const mp_talloc *mp_runtime_allocator(const mp_runtime *rt) { return rt->ta; }
int64_t mp_runtime_local_batch(const mp_runtime *rt) { return rt->local_batch; }
int64_t mp_runtime_n_micro(const mp_runtime *rt) { return rt->n_micro; }

/* ---- forward ------------------------------------------------------------------------- */

static mp_status attn_core_forward(mp_ctx *ctx, mp_runtime *rt, int l) {
  const rt_layout *y = lay_of(rt, l);
  float *a = rt->act[l], *c = rt->core[l];
  BE(attention_forward(rt->kc, c + y->att, c + y->lse, a + y->q, a + y->k, a + y->v, rt->B, rt->T, rt->nh, rt->nkv,
                       rt->hd));
  return MP_OK;
}

/* Block l from x_in into the saved tensors; writes x_out unless it is NULL (recompute). */
static mp_status block_forward(mp_ctx *ctx, mp_runtime *rt, int l, const float *x_in, float *x_out, float *moe_aux) {
  const rt_layout *y = lay_of(rt, l);
  float *a = rt->act[l], *c = rt->core[l];
  const int N = rt->N, C = rt->C, QD = rt->nh * rt->hd, KD = rt->nkv * rt->hd;
  BE(rmsnorm_forward(rt->kc, a + y->xn1, a + y->rstd1, x_in, W(rt, l, MP_MOD_ATTN_NORM), N, C, rt->eps));
  BE(matmul_forward(rt->kc, a + y->q, a + y->xn1, W(rt, l, MP_MOD_Q), NULL, N, C, QD));
  BE(matmul_forward(rt->kc, a + y->k, a + y->xn1, W(rt, l, MP_MOD_K), NULL, N, C, KD));
  BE(matmul_forward(rt->kc, a + y->v, a + y->xn1, W(rt, l, MP_MOD_V), NULL, N, C, KD));
  BE(rope_forward(rt->kc, a + y->q, a + y->q, rt->rope_cos, rt->rope_sin, rt->B, rt->T, rt->nh, rt->hd));
  BE(rope_forward(rt->kc, a + y->k, a + y->k, rt->rope_cos, rt->rope_sin, rt->B, rt->T, rt->nkv, rt->hd));
  MP_CHECK(attn_core_forward(ctx, rt, l));
  BE(matmul_forward(rt->kc, a + y->xmid, c + y->att, W(rt, l, MP_MOD_O), NULL, N, QD, C));
  BE(accumulate(rt->kc, a + y->xmid, x_in, (size_t)N * C));
  BE(rmsnorm_forward(rt->kc, a + y->xn2, a + y->rstd2, a + y->xmid, W(rt, l, MP_MOD_FFN_NORM), N, C, rt->eps));
  if (!is_moe_layer(rt, l)) {
    const int F = rt->F;
    BE(matmul_forward(rt->kc, a + y->g, a + y->xn2, W(rt, l, MP_MOD_GATE), NULL, N, C, F));
    BE(matmul_forward(rt->kc, a + y->u, a + y->xn2, W(rt, l, MP_MOD_UP), NULL, N, C, F));
    BE(swiglu_forward(rt->kc, a + y->h, a + y->g, a + y->u, (size_t)N * F));
    if (x_out) {
      BE(matmul_forward(rt->kc, x_out, a + y->h, W(rt, l, MP_MOD_DOWN), NULL, N, F, C));
      BE(accumulate(rt->kc, x_out, a + y->xmid, (size_t)N * C));
    }
    return MP_OK;
  }
  const int E = rt->E, K = rt->K, Fe = rt->Fe, Fs = rt->Fs;
  const mp_model *m = &rt->plan->model;
  BE(matmul_forward(rt->kc, a + y->rl, a + y->xn2, W(rt, l, MP_MOD_ROUTER), NULL, N, C, E));
  BE(router_forward(rt->kc, a + y->probs, (int32_t *)(a + y->tki), a + y->tkw, a + y->rl, N, E, K,
                    m->norm_topk_prob));
  BE(router_aux_loss_forward(rt->kc, a + y->aux, a + y->f, a + y->probs, (const int32_t *)(a + y->tki), N, E, K));
  if (moe_aux) BE(memcpy_d2h(rt->kc, moe_aux, a + y->aux, sizeof(float)));
  BE(moe_plan(rt->kc, (int32_t *)(a + y->perm), (int32_t *)(a + y->inv), (int32_t *)(a + y->counts),
              (const int32_t *)(a + y->tki), N, E, K));
  int32_t *cnt = rt->counts_h + (size_t)l * E;
  BE(memcpy_d2h(rt->kc, cnt, a + y->counts, (size_t)E * sizeof(int32_t)));
  BE(permute_forward(rt->kc, a + y->xp, a + y->xn2, (const int32_t *)(a + y->perm), N, K, C));
  const float *Wg = W(rt, l, MP_MOD_EXPERTS_GATE), *Wu = W(rt, l, MP_MOD_EXPERTS_UP), *Wd = W(rt, l, MP_MOD_EXPERTS_DOWN);
  for (int e = 0, r0 = 0; e < E; r0 += cnt[e], e++) {
    if (!cnt[e]) continue;
    BE(matmul_forward(rt->kc, a + y->eg + (size_t)r0 * Fe, a + y->xp + (size_t)r0 * C, Wg + (size_t)e * Fe * C, NULL,
                      cnt[e], C, Fe));
    BE(matmul_forward(rt->kc, a + y->eu + (size_t)r0 * Fe, a + y->xp + (size_t)r0 * C, Wu + (size_t)e * Fe * C, NULL,
                      cnt[e], C, Fe));
  }
  BE(swiglu_forward(rt->kc, a + y->eh, a + y->eg, a + y->eu, (size_t)N * K * Fe));
  for (int e = 0, r0 = 0; e < E; r0 += cnt[e], e++) {
    if (!cnt[e]) continue;
    BE(matmul_forward(rt->kc, a + y->ey + (size_t)r0 * C, a + y->eh + (size_t)r0 * Fe, Wd + (size_t)e * C * Fe, NULL,
                      cnt[e], Fe, C));
  }
  if (Fs) {
    BE(matmul_forward(rt->kc, a + y->sg, a + y->xn2, W(rt, l, MP_MOD_SHARED_GATE), NULL, N, C, Fs));
    BE(matmul_forward(rt->kc, a + y->su, a + y->xn2, W(rt, l, MP_MOD_SHARED_UP), NULL, N, C, Fs));
    BE(swiglu_forward(rt->kc, a + y->sh, a + y->sg, a + y->su, (size_t)N * Fs));
  }
  if (!x_out) return MP_OK;
  BE(unpermute_forward(rt->kc, x_out, a + y->ey, a + y->tkw, (const int32_t *)(a + y->inv), N, K, C));
  if (Fs) {
    float *tmp;
    MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, (size_t)N * C * sizeof(float), (void **)&tmp));
    mp_status s = rt->be->matmul_forward(rt->kc, tmp, a + y->sh, W(rt, l, MP_MOD_SHARED_DOWN), NULL, N, Fs, C);
    if (s == MP_OK) s = rt->be->accumulate(rt->kc, x_out, tmp, (size_t)N * C);
    mp_status s2 = mp_talloc_free(ctx, rt->ta, tmp);
    if (s != MP_OK) return mp_error(ctx, s, "shared expert forward: %s", mp_errmsg(rt->kc->err));
    MP_CHECK(s2);
  }
  BE(accumulate(rt->kc, x_out, a + y->xmid, (size_t)N * C));
  return MP_OK;
}

static mp_status alloc_block(mp_ctx *ctx, mp_runtime *rt, int l) {
  const rt_layout *y = lay_of(rt, l);
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_ACTIVATIONS, y->total * 4, (void **)&rt->act[l]));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_ACTIVATIONS, y->core_total * 4, (void **)&rt->core[l]));
  return MP_OK;
}
static mp_status free_block(mp_ctx *ctx, mp_runtime *rt, int l) {
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->core[l]));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->act[l]));
  rt->core[l] = NULL;
  rt->act[l] = NULL;
  return MP_OK;
}

/* ---- backward ------------------------------------------------------------------------ */

static mp_status block_backward(mp_ctx *ctx, mp_runtime *rt, int l, float *dres, float *ws, float dloss_aux) {
  const rt_layout *y = lay_of(rt, l);
  float *a = rt->act[l], *c = rt->core[l];
  const float *x_in = rt->x[l];
  const int N = rt->N, C = rt->C, QD = rt->nh * rt->hd, KD = rt->nkv * rt->hd;
  if (!is_moe_layer(rt, l)) {
    const int F = rt->F;
    BE(matmul_backward(rt->kc, ws + y->dh, G(rt, l, MP_MOD_DOWN), NULL, dres, a + y->h, W(rt, l, MP_MOD_DOWN), N, F,
                       C));
    BE(swiglu_backward(rt->kc, ws + y->dg, ws + y->du, ws + y->dh, a + y->g, a + y->u, (size_t)N * F));
    BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_GATE), NULL, ws + y->dg, a + y->xn2, W(rt, l, MP_MOD_GATE),
                       N, C, F));
    BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_UP), NULL, ws + y->du, a + y->xn2, W(rt, l, MP_MOD_UP), N,
                       C, F));
  } else {
    const int E = rt->E, K = rt->K, Fe = rt->Fe, Fs = rt->Fs;
    const mp_model *m = &rt->plan->model;
    const int32_t *cnt = rt->counts_h + (size_t)l * E;
    if (Fs) {
      BE(matmul_backward(rt->kc, ws + y->dsh, G(rt, l, MP_MOD_SHARED_DOWN), NULL, dres, a + y->sh,
                         W(rt, l, MP_MOD_SHARED_DOWN), N, Fs, C));
      BE(swiglu_backward(rt->kc, ws + y->dsg, ws + y->dsu, ws + y->dsh, a + y->sg, a + y->su, (size_t)N * Fs));
      BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_SHARED_GATE), NULL, ws + y->dsg, a + y->xn2,
                         W(rt, l, MP_MOD_SHARED_GATE), N, C, Fs));
      BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_SHARED_UP), NULL, ws + y->dsu, a + y->xn2,
                         W(rt, l, MP_MOD_SHARED_UP), N, C, Fs));
    }
    BE(unpermute_backward(rt->kc, ws + y->dey, ws + y->dtkw, dres, a + y->ey, a + y->tkw, (const int32_t *)(a + y->inv),
                          N, K, C));
    const float *Wg = W(rt, l, MP_MOD_EXPERTS_GATE), *Wu = W(rt, l, MP_MOD_EXPERTS_UP),
                *Wd = W(rt, l, MP_MOD_EXPERTS_DOWN);
    float *dWg = G(rt, l, MP_MOD_EXPERTS_GATE), *dWu = G(rt, l, MP_MOD_EXPERTS_UP), *dWd = G(rt, l, MP_MOD_EXPERTS_DOWN);
    for (int e = 0, r0 = 0; e < E; r0 += cnt[e], e++) {
      if (!cnt[e]) continue;
      BE(matmul_backward(rt->kc, ws + y->deh + (size_t)r0 * Fe, dWd + (size_t)e * C * Fe, NULL,
                         ws + y->dey + (size_t)r0 * C, a + y->eh + (size_t)r0 * Fe, Wd + (size_t)e * C * Fe, cnt[e], Fe,
                         C));
    }
    BE(swiglu_backward(rt->kc, ws + y->deg, ws + y->deu, ws + y->deh, a + y->eg, a + y->eu, (size_t)N * K * Fe));
    for (int e = 0, r0 = 0; e < E; r0 += cnt[e], e++) {
      if (!cnt[e]) continue;
      BE(matmul_backward(rt->kc, ws + y->dxp + (size_t)r0 * C, dWg + (size_t)e * Fe * C, NULL,
                         ws + y->deg + (size_t)r0 * Fe, a + y->xp + (size_t)r0 * C, Wg + (size_t)e * Fe * C, cnt[e], C,
                         Fe));
      BE(matmul_backward(rt->kc, ws + y->dxp + (size_t)r0 * C, dWu + (size_t)e * Fe * C, NULL,
                         ws + y->deu + (size_t)r0 * Fe, a + y->xp + (size_t)r0 * C, Wu + (size_t)e * Fe * C, cnt[e], C,
                         Fe));
    }
    BE(permute_backward(rt->kc, ws + y->dxn, ws + y->dxp, (const int32_t *)(a + y->inv), N, K, C));
    BE(router_aux_loss_backward(rt->kc, ws + y->dprobs, a + y->f, dloss_aux, N, E));
    BE(router_backward(rt->kc, ws + y->drl, ws + y->dtkw, ws + y->dprobs, a + y->probs, (const int32_t *)(a + y->tki),
                       N, E, K, m->norm_topk_prob));
    BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_ROUTER), NULL, ws + y->drl, a + y->xn2,
                       W(rt, l, MP_MOD_ROUTER), N, C, E));
  }
  BE(rmsnorm_backward(rt->kc, dres, G(rt, l, MP_MOD_FFN_NORM), ws + y->dxn, a + y->xmid, W(rt, l, MP_MOD_FFN_NORM),
                      a + y->rstd2, N, C));
  /* attention: dres now holds dL/dxmid */
  BE(memset_zero(rt->kc, ws + y->dxn, (size_t)N * C * sizeof(float)));
  BE(matmul_backward(rt->kc, ws + y->datt, G(rt, l, MP_MOD_O), NULL, dres, c + y->att, W(rt, l, MP_MOD_O), N, QD, C));
  BE(attention_backward(rt->kc, ws + y->dq, ws + y->dk, ws + y->dv, ws + y->datt, a + y->q, a + y->k, a + y->v,
                        c + y->att, c + y->lse, rt->B, rt->T, rt->nh, rt->nkv, rt->hd));
  BE(rope_backward(rt->kc, ws + y->dqp, ws + y->dq, rt->rope_cos, rt->rope_sin, rt->B, rt->T, rt->nh, rt->hd));
  BE(rope_backward(rt->kc, ws + y->dkp, ws + y->dk, rt->rope_cos, rt->rope_sin, rt->B, rt->T, rt->nkv, rt->hd));
  BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_Q), NULL, ws + y->dqp, a + y->xn1, W(rt, l, MP_MOD_Q), N, C,
                     QD));
  BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_K), NULL, ws + y->dkp, a + y->xn1, W(rt, l, MP_MOD_K), N, C,
                     KD));
  BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_V), NULL, ws + y->dv, a + y->xn1, W(rt, l, MP_MOD_V), N, C,
                     KD));
  BE(rmsnorm_backward(rt->kc, dres, G(rt, l, MP_MOD_ATTN_NORM), ws + y->dxn, x_in, W(rt, l, MP_MOD_ATTN_NORM),
                      a + y->rstd1, N, C));
  return MP_OK;
}

/* One micro-batch: forward, loss, backward. Adds this micro-batch's CE mean and aux sum. */
static mp_status micro_step(mp_ctx *ctx, mp_runtime *rt, const int32_t *seqs, double *ce, double *aux) {
  const int N = rt->N, C = rt->C, V = rt->V, L = rt->L, T = rt->T;
  const mp_ac_mode ac = rt->plan->ac;
  const mp_model *m = &rt->plan->model;
  const double dscale = 1.0 / ((double)rt->n_micro * rt->dp_size);
  /* Token ids: inputs are the first T of each T + 1 window, targets the last T. */
  int32_t *hin = malloc((size_t)N * 2 * sizeof(int32_t));
  MP_CHECK_ALLOC(ctx, hin);
  for (int b = 0; b < rt->B; b++)
    for (int t = 0; t < T; t++) {
      hin[b * T + t] = seqs[(size_t)b * (T + 1) + t];
      hin[N + b * T + t] = seqs[(size_t)b * (T + 1) + t + 1];
    }
  for (int i = 0; i < N; i++)
    if (hin[i] < 0 || hin[i] >= V || hin[N + i] < 0 || hin[N + i] >= V) {
      int bad = hin[i] < 0 || hin[i] >= V ? hin[i] : hin[N + i];
      free(hin);
      return mp_error(ctx, MP_ERR_INVALID, "token id %d is outside the model's vocabulary of %d; the data does not "
                      "match --model", bad, V);
    }
  int32_t *tok;
  mp_status st = mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, (size_t)N * 2 * sizeof(int32_t), (void **)&tok);
  if (st == MP_OK) st = rt->be->memcpy_h2d(rt->kc, tok, hin, (size_t)N * 2 * sizeof(int32_t));
  free(hin);
  MP_CHECK(st);
  rt->tok_in = tok;
  rt->tok_tgt = tok + N;
  const size_t NC = (size_t)N * C * sizeof(float);

  /* forward */
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_ACTIVATIONS, NC, (void **)&rt->x[0]));
  BE(embedding_forward(rt->kc, rt->x[0], rt->tok_in, W(rt, -1, MP_MOD_TOK_EMBEDDINGS), N, C, 0, V));
  double aux_sum = 0;
  for (int l = 0; l < L; l++) {
    MP_CHECK(alloc_block(ctx, rt, l));
    MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_ACTIVATIONS, NC, (void **)&rt->x[l + 1]));
    float auxv = 0;
    MP_CHECK(block_forward(ctx, rt, l, rt->x[l], rt->x[l + 1], &auxv));
    if (is_moe_layer(rt, l)) aux_sum += auxv;
    if (ac == MP_AC_FULL) {
      MP_CHECK(free_block(ctx, rt, l));
    } else if (ac == MP_AC_SELECTIVE) {
      MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->core[l]));
      rt->core[l] = NULL;
    }
  }
  /* head: final norm (saved xf, rstdf in one ACTIVATIONS block), logits, loss */
  float *hf, *lg;
  const size_t hf_n = ALIGN16((size_t)N * C) + ALIGN16((size_t)N);
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_ACTIVATIONS, hf_n * 4, (void **)&hf));
  float *xf = hf, *rstdf = hf + ALIGN16((size_t)N * C);
  const size_t lg_logits = 0, lg_losses = ALIGN16((size_t)N * V), lg_lse = lg_losses + ALIGN16((size_t)N),
               lg_mean = lg_lse + ALIGN16((size_t)N), lg_n = lg_mean + 16;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_LOGITS, lg_n * 4, (void **)&lg));
  const float *Wout = W(rt, -1, m->tied_embeddings ? MP_MOD_TOK_EMBEDDINGS : MP_MOD_OUTPUT);
  float *dWout = G(rt, -1, m->tied_embeddings ? MP_MOD_TOK_EMBEDDINGS : MP_MOD_OUTPUT);
  if (!Wout) return mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan has no output head");
  BE(rmsnorm_forward(rt->kc, xf, rstdf, rt->x[L], W(rt, -1, MP_MOD_FINAL_NORM), N, C, rt->eps));
  BE(matmul_forward(rt->kc, lg + lg_logits, xf, Wout, NULL, N, C, V));
  BE(cross_entropy_forward(rt->kc, lg + lg_losses, lg + lg_mean, lg + lg_lse, lg + lg_logits, rt->tok_tgt, N, V));
  float ce_mean;
  BE(memcpy_d2h(rt->kc, &ce_mean, lg + lg_mean, sizeof ce_mean));
  *ce += ce_mean * dscale;
  *aux += m->aux_loss_coef * aux_sum * dscale;

  /* backward: head */
  float *dlg, *dres, *dxf;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_LOGITS, (size_t)N * V * sizeof(float), (void **)&dlg));
  BE(ce_backward(rt->kc, dlg, lg + lg_logits, lg + lg_lse, rt->tok_tgt, (float)(dscale / N), N, V, 0));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, NC, (void **)&dres));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, NC, (void **)&dxf));
  BE(matmul_backward(rt->kc, dxf, dWout, NULL, dlg, xf, Wout, N, C, V));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, dlg));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, lg));
  BE(rmsnorm_backward(rt->kc, dres, G(rt, -1, MP_MOD_FINAL_NORM), dxf, rt->x[L], W(rt, -1, MP_MOD_FINAL_NORM), rstdf,
                      N, C));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, dxf));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, hf));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->x[L]));
  rt->x[L] = NULL;

  /* backward: blocks, last first */
  const float dloss_aux = (float)(m->aux_loss_coef * dscale);
  for (int l = L - 1; l >= 0; l--) {
    if (ac == MP_AC_FULL) { /* recompute the whole block from its saved input */
      MP_CHECK(alloc_block(ctx, rt, l));
      MP_CHECK(block_forward(ctx, rt, l, rt->x[l], NULL, NULL));
    } else if (ac == MP_AC_SELECTIVE) { /* recompute the attention core from saved q, k, v */
      MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_ACTIVATIONS, lay_of(rt, l)->core_total * 4,
                               (void **)&rt->core[l]));
      MP_CHECK(attn_core_forward(ctx, rt, l));
    }
    float *ws;
    MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, lay_of(rt, l)->ws_total * 4, (void **)&ws));
    MP_CHECK(block_backward(ctx, rt, l, dres, ws, dloss_aux));
    MP_CHECK(mp_talloc_free(ctx, rt->ta, ws));
    MP_CHECK(free_block(ctx, rt, l));
    if (l > 0) {
      MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->x[l]));
      rt->x[l] = NULL;
    }
  }
  BE(embedding_backward(rt->kc, G(rt, -1, MP_MOD_TOK_EMBEDDINGS), dres, rt->tok_in, N, C, 0, V));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, dres));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->x[0]));
  rt->x[0] = NULL;
  MP_CHECK(mp_talloc_free(ctx, rt->ta, tok));
  rt->tok_in = rt->tok_tgt = NULL;
  return MP_OK;
}

mp_status mp_runtime_forward_backward(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens, mp_step_result *res) {
  memset(res, 0, sizeof *res);
  for (int i = 0; i < rt->plan->n_params; i++)
    if (rt->prm[i].numel) BE(memset_zero(rt->kc, rt->prm[i].g, (size_t)rt->prm[i].numel * sizeof(float)));
  double ce = 0, aux = 0;
  for (int64_t mb = 0; mb < rt->n_micro; mb++)
    MP_CHECK(micro_step(ctx, rt, tokens + (size_t)mb * rt->B * (rt->T + 1), &ce, &aux));
  /* ce, aux and the gradients are already scaled by 1 / (n_micro * dp): summing them
   * over the data-parallel replicas gives the global means (identity at world size 1). */
  if (mp_comm_group_size(rt->comm, MP_GROUP_DP_REPLICATE) > 1) {
    for (int i = 0; i < rt->plan->n_params; i++) {
      rt_param *r = &rt->prm[i];
      if (r->numel)
        MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_DP_REPLICATE, r->g, r->g, (size_t)r->numel,
                                    MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM));
    }
    /* Losses in double on the host: reduce as two fp32-exact halves is overkill here;
     * fp32 sums of 2..8 values are well inside the 1e-5 parity tolerance. */
    float v[2] = {(float)ce, (float)aux};
    MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_DP_REPLICATE, v, v, 2, MP_COMM_DTYPE_FP32,
                                MP_COMM_OP_SUM));
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
  BE(memset_zero(rt->kc, rt->scalar, sizeof(float)));
  /* sum_squares accumulates in double inside but returns fp32: accumulate per parameter
   * on the host in double so the order (parameter order) is fixed. */
  double sumsq = 0;
  for (int i = 0; i < rt->plan->n_params; i++) {
    const rt_param *r = &rt->prm[i];
    if (!r->numel) continue;
    float s = 0;
    BE(memset_zero(rt->kc, rt->scalar, sizeof(float)));
    BE(sum_squares(rt->kc, rt->scalar, r->g, (size_t)r->numel));
    BE(memcpy_d2h(rt->kc, &s, rt->scalar, sizeof s));
    sumsq += s;
  }
  const double norm = sqrt(sumsq);
  const float scale = rt->opts.max_grad_norm > 0 ? mp_clip_scale((float)norm, rt->opts.max_grad_norm) : 1.0f;
  rt->step++;
  for (int i = 0; i < rt->plan->n_params; i++) {
    rt_param *r = &rt->prm[i];
    if (!r->numel) continue;
    BE(adamw_update(rt->kc, r->w, r->g, r->m, r->v, (size_t)r->numel, rt->opts.lr, rt->opts.beta1, rt->opts.beta2,
                    rt->opts.eps, r->decay ? rt->opts.weight_decay : 0.0f, rt->step, scale));
  }
  res->grad_norm = norm;
  return MP_OK;
}

mp_status mp_runtime_step(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens, mp_step_result *res) {
  mp_talloc_reset_peak(rt->ta);
  MP_CHECK(mp_runtime_forward_backward(ctx, rt, tokens, res));
  MP_CHECK(mp_runtime_optimizer_step(ctx, rt, res));
  res->peak_bytes = mp_talloc_peak_total(rt->ta);
  return MP_OK;
}

/* ---- inspection and dumps ------------------------------------------------------------ */

int64_t mp_runtime_param_tile(const mp_runtime *rt, int i, int64_t off[MP_MAX_NDIM], int64_t len[MP_MAX_NDIM]) {
  memcpy(off, rt->prm[i].off, sizeof rt->prm[i].off);
  memcpy(len, rt->prm[i].len, sizeof rt->prm[i].len);
  return rt->prm[i].numel;
}

mp_status mp_runtime_read_param(mp_ctx *ctx, const mp_runtime *rt, int i, float *dst) {
  if (rt->prm[i].numel) BE(memcpy_d2h(rt->kc, dst, rt->prm[i].w, (size_t)rt->prm[i].numel * sizeof(float)));
  return MP_OK;
}

mp_status mp_runtime_read_grad(mp_ctx *ctx, const mp_runtime *rt, int i, float *dst) {
  if (rt->prm[i].numel) BE(memcpy_d2h(rt->kc, dst, rt->prm[i].g, (size_t)rt->prm[i].numel * sizeof(float)));
  return MP_OK;
}

mp_status mp_runtime_dump(mp_ctx *ctx, const mp_runtime *rt, int grads, mp_wfile *w) {
  for (int i = 0; i < rt->plan->n_params; i++)
    if (rt->prm[i].numel != mp_param_numel(&rt->plan->params[i]))
      return mp_error(ctx, MP_ERR_UNSUPPORTED, "dumping %s needs a gather of its shards, which this build "
                      "does not do yet (whole tensors only: world size 1 or dp_replicate)",
                      rt->plan->params[i].fqn);
  for (int i = 0; i < rt->plan->n_params; i++) {
    const mp_param *p = &rt->plan->params[i];
    float *buf = malloc((size_t)(rt->prm[i].numel ? rt->prm[i].numel : 1) * sizeof(float));
    MP_CHECK_ALLOC(ctx, buf);
    mp_status st = grads ? mp_runtime_read_grad(ctx, rt, i, buf) : mp_runtime_read_param(ctx, rt, i, buf);
    if (st == MP_OK) st = mp_wfile_add(ctx, w, p->fqn, p->ndim, p->shape, buf);
    free(buf);
    MP_CHECK(st);
  }
  return MP_OK;
}

mp_status mp_runtime_dump_init(mp_ctx *ctx, const mp_plan *plan, uint64_t seed, mp_wfile *w) {
  for (int i = 0; i < plan->n_params; i++) {
    const mp_param *p = &plan->params[i];
    int64_t off[MP_MAX_NDIM] = {0, 0, 0}, len[MP_MAX_NDIM] = {1, 1, 1};
    for (int d = 0; d < p->ndim; d++) len[d] = p->shape[d];
    float *buf = malloc((size_t)mp_param_numel(p) * sizeof(float));
    MP_CHECK_ALLOC(ctx, buf);
    mp_init_fill_block(seed, p, off, len, buf);
    mp_status st = mp_wfile_add(ctx, w, p->fqn, p->ndim, p->shape, buf);
    free(buf);
    MP_CHECK(st);
  }
  return MP_OK;
}
