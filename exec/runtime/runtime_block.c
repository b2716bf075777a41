/* The training runtime: a block's forward and backward, the routed experts and expert
 * parallelism's exchange (runtime_internal.h lists the runtime's files).
 *
 * A block's tensors are the activation layout's (exec/act_layout.h): act[l] is its BLOCK
 * allocation, core[l] its CORE, a backward's workspace its WS; under EP the expert side
 * lives in epa[l] (EPA), sized by the rows the rank receives. Under sequence parallelism
 * the residual stream and the norms run on the rank's Ns rows and each tensor-parallel
 * region's boundary is a gather or a scatter of runtime_sp.c; the routed experts, which
 * are replicated over tp, run on all N rows and keep the rows of the shard. Under the
 * expert grid (rt->grid: EP spans the tp ranks, experts whole on each with etp = 1, split
 * over their expert-TP group with etp > 1) each tp rank routes only its shard's Nr = Ns
 * rows, read from its chunk of the gathered xn2 (torchtitan's ReordererSequenceParallel,
 * torchtitan/distributed/expert_parallel.py, v0.2; Megatron-Core's token dispatcher, whose
 * tp group is the expert-TP one).
 *
 * Expert parallelism: permuted rows are grouped by expert, experts in order, so the rows
 * bound for EP rank j (experts [j El, (j+1) El)) are contiguous. Counts go first (El per
 * destination), then the rows; the received rows are laid out [source rank][local expert].
 * The combine is the same exchange reversed. Under expert tensor parallelism (etp > 1) the
 * expert side holds the expert-TP group's received rows, [ETP rank][source][local expert]
 * (runtime_etp.c): the dispatch lands in the rank's own block and the combine reads it. */
#include "exec/runtime/runtime_internal.h"

/* ---- expert parallelism ---------------------------------------------------------------- */

typedef struct ep_xfer {
  int64_t sc[64], sd[64], rc[64], rd[64]; /* elements, per EP rank */
} ep_xfer;

static void ep_counts(const mp_runtime *rt, int l, int64_t width, ep_xfer *x) {
  const int32_t *cnt = rt->counts_h + (size_t)l * rt->E;
  const int64_t *rc = rt->ep_rc + ((size_t)l * rt->etp + rt->etp_idx) * rt->ep * rt->El;
  int64_t so = 0, ro = 0;
  for (int j = 0; j < rt->ep; j++) {
    int64_t s = 0, r = 0;
    for (int e = 0; e < rt->El; e++) {
      s += cnt[j * rt->El + e];
      r += rc[j * rt->El + e];
    }
    x->sc[j] = s * width;
    x->sd[j] = so;
    so += s * width;
    x->rc[j] = r * width;
    x->rd[j] = ro;
    ro += r * width;
  }
}

/* dispatch (dir 0): send-side (N*k rows, permuted) -> expert side (R rows; under etp the
 * rank's own block of them, the side's first row given); combine (1): back. */
static mp_status ep_exchange(mp_ctx *ctx, mp_runtime *rt, int l, int dir, const void *send, void *recv, int64_t width) {
  ep_xfer x;
  ep_counts(rt, l, width, &x);
  const int64_t own = mp_rt_etp_block_start(rt, l, rt->etp_idx) * width;
  if (dir == 0) recv = xoff(rt, recv, (size_t)own);
  else send = xoff(rt, send, (size_t)own);
  if (dir == 0)
    return mp_comm_all_to_all_v(ctx, rt->comm, MP_GROUP_EP, send, x.sc, x.sd, recv, x.rc, x.rd, rt->xdt);
  return mp_comm_all_to_all_v(ctx, rt->comm, MP_GROUP_EP, send, x.rc, x.rd, recv, x.sc, x.sd, rt->xdt);
}

/* Exchange the per-expert counts (under etp gathered over the group too) and size the
 * expert side. */
static mp_status ep_plan(mp_ctx *ctx, mp_runtime *rt, int l) {
  const int ep = rt->ep, El = rt->El;
  const int32_t *cnt = rt->counts_h + (size_t)l * rt->E;
  int64_t send[64 * 8];
  int64_t *recv = rt->ep_rc + ((size_t)l * rt->etp + rt->etp_idx) * ep * El;
  if (rt->E > 64 * 8 || ep > 64)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "the runtime's EP exchange handles up to 512 experts and ep <= 64");
  for (int e = 0; e < rt->E; e++) send[e] = cnt[e];
  MP_CHECK(mp_rt_host_coll(ctx, rt, MP_GROUP_EP, send, recv, (size_t)El, MP_COMM_DTYPE_INT64, -1, NULL));
  MP_CHECK(mp_rt_etp_counts(ctx, rt, l));
  int64_t R = 0;
  for (int t = 0; t < rt->etp; t++) R += mp_rt_etp_block_rows(rt, l, t);
  rt->ep_R[l] = R;
  if (R > rt->ep_R_max) rt->ep_R_max = R;
  return MP_OK;
}

/* The expert side's layout (EPA, EP_OUT, EP_WS) of layer l: its R rows and, under etp,
 * the largest block's. */
static void ep_layout(const mp_runtime *rt, int l, mp_act_layout *y) {
  mp_act_dims d = rt->dims;
  d.R = rt->ep_R[l];
  d.RB = mp_rt_etp_block_max(rt, l);
  mp_act_layout_fill(y, &d, 1);
}

/* The rows the rank routes within an [N, C] tensor (xn2, its gradient dxn, the gathered
 * residual gradient): all N, or under the expert grid its shard's chunk. */
static void *routed_rows(const mp_runtime *rt, const void *full) {
  return rt->grid ? mp_rt_sp_slot(rt, full) : (void *)full;
}

/* The load-balancing loss of the whole micro-batch under the expert grid, where each tp
 * rank routes its own shard: f_e (the share of top-k picks of expert e) and P_e (its mean
 * router probability) are means over all N tokens (Switch Transformer, Fedus et al. 2022,
 * eq. 4), so the shards' per-expert counts and probability sums are summed over tp, and
 * aux = E sum_e f_e P_e is formed as router_aux_loss_forward forms it on one rank
 * (kernels/cpu/router.c). f goes to the block's f for the backward, aux to *aux_out. */
static mp_status grid_aux(mp_ctx *ctx, mp_runtime *rt, int l, float *aux_out) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int Nr = rt->Nr, E = rt->E, K = rt->K;
  float *probs = malloc((size_t)Nr * E * sizeof(float)), *v = calloc(2 * (size_t)E, sizeof(float));
  int32_t *tki = malloc((size_t)Nr * K * sizeof(int32_t));
  mp_status st = probs && v && tki ? MP_OK : mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for the aux loss");
  if (st == MP_OK) st = rt->be->memcpy_d2h(rt->kc, probs, a + y->probs, (size_t)Nr * E * sizeof(float));
  if (st == MP_OK) st = rt->be->memcpy_d2h(rt->kc, tki, a + y->tki, (size_t)Nr * K * sizeof(int32_t));
  if (st == MP_OK) {
    for (int64_t i = 0; i < (int64_t)Nr * K; i++) v[tki[i]] += 1.0f; /* counts: exact in fp32 */
    for (int e = 0; e < E; e++) {
      double p = 0.0;
      for (int n = 0; n < Nr; n++) p += probs[(size_t)n * E + e];
      v[E + e] = (float)p;
    }
    st = mp_rt_host_coll(ctx, rt, MP_GROUP_TP, v, NULL, 2 * (size_t)E, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM, NULL);
  }
  if (st == MP_OK) {
    double total = 0.0;
    for (int e = 0; e < E; e++) {
      v[e] = (float)((double)v[e] / rt->N);
      total += (double)v[e] * ((double)v[E + e] / rt->N);
    }
    *aux_out = (float)(E * total);
    st = rt->be->memcpy_h2d(rt->kc, a + y->f, v, (size_t)E * sizeof(float));
  }
  if (st == MP_OK) st = rt->be->memcpy_h2d(rt->kc, a + y->aux, aux_out, sizeof(float));
  free(probs);
  free(v);
  free(tki);
  return st;
}

/* ---- forward ------------------------------------------------------------------------- */

/* The attention core of block l from its saved q, k, v into its CORE (att, lse). */
mp_status mp_rt_attn_core_forward(mp_ctx *ctx, mp_runtime *rt, int l) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l], *c = rt->core[l];
  if (rt->cp > 1) return mp_rt_cp_attn_forward(ctx, rt, l);
  BE(attention_forward(rt->kc, c + y->att, F32(c + y->lse), a + y->q, a + y->k, a + y->v, rt->B, rt->T, rt->nhl,
                       rt->nkvl, rt->hd, rt->dv));
  return MP_OK;
}

/* Rows of block (s, e) on the expert side, blocks laid out [source][local expert]: rows
 * EP rank s sent for local expert e, or expert e's rows without EP (one source). Under etp
 * s runs over the group's (ETP rank, source) pairs, ep x etp of them. */
static int expert_block_rows(const mp_runtime *rt, int l, int s, int e) {
  return rt->ep > 1 ? (int)rt->ep_rc[((size_t)l * rt->ep * rt->etp + s) * rt->El + e]
                    : rt->counts_h[(size_t)l * rt->E + e];
}

/* The routed experts' forward on the expert side: per (source, local expert) block under
 * EP, per expert otherwise. in: rows (R, C); writes gate/up/hidden (R, Fe) and out (R, C). */
static mp_status experts_forward(mp_ctx *ctx, mp_runtime *rt, int l, const void *in, void *eg, void *eu, void *eh,
                                 void *out, int64_t R) {
  const size_t C = (size_t)rt->C, Fe = (size_t)rt->Fe;
  const int El = rt->El;
  const void *Wg = W(rt, l, MP_MOD_EXPERTS_GATE), *Wu = W(rt, l, MP_MOD_EXPERTS_UP), *Wd = W(rt, l, MP_MOD_EXPERTS_DOWN);
  size_t r0 = 0;
  for (int s = 0; s < rt->ep * rt->etp; s++)
    for (int e = 0; e < El; e++) {
      const int n = expert_block_rows(rt, l, s, e);
      if (!n) continue;
      BE(matmul_forward(rt->kc, xoff(rt, eg, r0 * Fe), xoff(rt, in, r0 * C), xoff(rt, Wg, (size_t)e * Fe * C), NULL,
                        n, (int)C, (int)Fe));
      BE(matmul_forward(rt->kc, xoff(rt, eu, r0 * Fe), xoff(rt, in, r0 * C), xoff(rt, Wu, (size_t)e * Fe * C), NULL,
                        n, (int)C, (int)Fe));
      r0 += (size_t)n;
    }
  BE(swiglu_forward(rt->kc, eh, eg, eu, (size_t)R * Fe));
  r0 = 0;
  for (int s = 0; s < rt->ep * rt->etp; s++)
    for (int e = 0; e < El; e++) {
      const int n = expert_block_rows(rt, l, s, e);
      if (!n) continue;
      BE(matmul_forward(rt->kc, xoff(rt, out, r0 * C), xoff(rt, eh, r0 * Fe), xoff(rt, Wd, (size_t)e * C * Fe), NULL,
                        n, (int)Fe, (int)C));
      r0 += (size_t)n;
    }
  return MP_OK;
}

/* A block's RMSNorm into xn1 (src 0) or xn2 (src 2), with its amax in the same kernel when
 * a float8 Linear on codes reads it (f8_fused_amax). Under SP the norm runs on the shard x
 * into the rank's chunk of out, then all-gathered there: the region entered (check.c runs
 * no float8 with SP). */
static mp_status norm_fwd(mp_ctx *ctx, mp_runtime *rt, int l, int src, void *out, float *rstd, const void *x,
                          const void *w) {
  const int N = rt->N, C = rt->C;
  float *am = mp_rt_f8_fused_amax(rt, l, src, src == 0 ? MP_MOD_Q : MP_MOD_GATE);
  if (rt->sp) {
    BE(rmsnorm_forward(rt->kc, mp_rt_sp_slot(rt, out), rstd, x, w, rt->Ns, C, rt->eps));
    return mp_rt_sp_gather(ctx, rt, NULL, out);
  }
  if (!am) {
    BE(rmsnorm_forward(rt->kc, out, rstd, x, w, N, C, rt->eps));
    return MP_OK;
  }
  BE(rmsnorm_forward_amax(rt->kc, out, rstd, x, w, N, C, rt->eps, am));
  mp_rt_f8_produced(rt, l, src, out, (size_t)N * C);
  return MP_OK;
}

/* A rowwise Linear closing a tensor-parallel region, forward: its partial sums over tp
 * reduced onto dst, in place on [N, C], or under SP computed on SP_FULL and
 * reduce-scattered onto dst's [Ns, C]. */
static mp_status row_fwd(mp_ctx *ctx, mp_runtime *rt, int l, mp_module mod, void *dst, const void *inp, int K) {
  const int N = rt->N, C = rt->C;
  if (!rt->sp) {
    MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, mod, dst, inp, N, K, C));
    return tp_sum(ctx, rt, dst, (size_t)N * C);
  }
  void *full;
  MP_CHECK(mp_rt_sp_full_alloc(ctx, rt, 0, &full));
  mp_status st = mp_rt_lin_fwd(ctx, rt, l, mod, full, inp, N, K, C);
  if (st == MP_OK) st = mp_rt_sp_scatter(ctx, rt, full, dst);
  return mp_rt_sp_full_free(ctx, rt, st, full);
}

/* A dense block's MLP from its saved xn2: gate, up, SwiGLU (its amax fused when the down
 * projection reads it in float8 on codes), then, unless x_out is NULL (recompute), down
 * (rowwise under tp: reduced) added to the residual xmid. */
static mp_status dense_mlp_forward(mp_ctx *ctx, mp_runtime *rt, int l, void *x_out) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int N = rt->N, C = rt->C, F = rt->Fl;
  MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, MP_MOD_GATE, a + y->g, a + y->xn2, N, C, F));
  MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, MP_MOD_UP, a + y->u, a + y->xn2, N, C, F));
  float *am = mp_rt_f8_fused_amax(rt, l, 3, MP_MOD_DOWN);
  if (am) {
    BE(swiglu_forward_amax(rt->kc, a + y->h, a + y->g, a + y->u, (size_t)N * F, am));
    mp_rt_f8_produced(rt, l, 3, a + y->h, (size_t)N * F);
  } else {
    BE(swiglu_forward(rt->kc, a + y->h, a + y->g, a + y->u, (size_t)N * F));
  }
  if (!x_out) return MP_OK;
  MP_CHECK(row_fwd(ctx, rt, l, MP_MOD_DOWN, x_out, a + y->h, F));
  BE(accumulate(rt->kc, x_out, a + y->xmid, (size_t)rt->Ns * C));
  return MP_OK;
}

/* The routed experts of MoE block l on its placed permuted rows (all Nr x k, or fewer after
 * the capacity's drops): on the rank (ep == 1), or on the expert side under EP (counts
 * exchanged, rows dispatched, the outputs combined back into ey). */
static mp_status moe_experts_forward(mp_ctx *ctx, mp_runtime *rt, int l) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int C = rt->C;
  if (rt->ep == 1)
    return experts_forward(ctx, rt, l, a + y->xp, a + y->eg, a + y->eu, a + y->eh, a + y->ey,
                           mp_rt_moe_placed_rows(rt, l));
  MP_CHECK(ep_plan(ctx, rt, l));
  const int64_t R = rt->ep_R[l];
  mp_act_layout ey;
  ep_layout(rt, l, &ey);
  if (!rt->epa[l])
    MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, ey.bytes[MP_ACT_ALLOC_EPA], (void **)&rt->epa[l]));
  char *xr = rt->epa[l] + ey.ep_xr, *eg = rt->epa[l] + ey.ep_eg, *eu = rt->epa[l] + ey.ep_eu,
       *eh = rt->epa[l] + ey.ep_eh;
  MP_CHECK(ep_exchange(ctx, rt, l, 0, a + y->xp, xr, C));
  MP_CHECK(mp_rt_etp_gather(ctx, rt, l, xr, C));
  void *eyl;
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_COMM, ey.bytes[MP_ACT_ALLOC_EP_OUT], &eyl));
  mp_status st = experts_forward(ctx, rt, l, xr, eg, eu, eh, eyl, R);
  /* under etp: the partial sums reduce-scattered, received after ep_out's R rows */
  if (st == MP_OK) st = mp_rt_etp_scatter(ctx, rt, l, eyl, xoff(rt, eyl, (size_t)(R > 0 ? R : 1) * C), C);
  if (st == MP_OK) st = ep_exchange(ctx, rt, l, 1, eyl, a + y->ey, C);
  mp_status s2 = mp_talloc_free(ctx, rt->ta, eyl);
  MP_CHECK(st);
  return s2;
}

/* The shared expert's output: its down projection's partial sums on SHARED_OUT, reduced
 * over tp onto x_out: added to it (which holds the routed output of all N rows), or under
 * SP reduce-scattered into it (the shard's rows, written). */
static mp_status shared_out(mp_ctx *ctx, mp_runtime *rt, int l, void *x_out) {
  const mp_act_layout *y = lay_of(rt, l);
  const int N = rt->N, C = rt->C;
  void *tmp;
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_TEMP, y->bytes[MP_ACT_ALLOC_SHARED_OUT], &tmp));
  mp_status s = rt->be->matmul_forward(rt->kc, tmp, rt->act[l] + y->sh, W(rt, l, MP_MOD_SHARED_DOWN), NULL, N,
                                       rt->Fsl, C);
  if (s != MP_OK) s = mp_error(ctx, s, "shared expert forward: %s", mp_errmsg(rt->kc->err));
  if (s == MP_OK) s = rt->sp ? mp_rt_sp_scatter(ctx, rt, tmp, x_out) : tp_sum(ctx, rt, tmp, (size_t)N * C);
  if (s == MP_OK && !rt->sp && rt->be->accumulate(rt->kc, x_out, tmp, (size_t)N * C) != MP_OK)
    s = mp_error(ctx, MP_ERR_INTERNAL, "shared expert forward: %s", mp_errmsg(rt->kc->err));
  mp_status s2 = mp_talloc_free(ctx, rt->ta, tmp);
  MP_CHECK(s);
  return s2;
}

/* An MoE block's output under SP: the routed experts' on all N rows (SP_FULL), whole on
 * every tp rank, of which the shard's rows are kept (under the expert grid the rank's own
 * Nr rows, unpermuted straight into that chunk); the shared expert's partial sums
 * reduce-scattered onto the shard; the residual xmid. */
static mp_status moe_out_sp_body(mp_ctx *ctx, mp_runtime *rt, int l, void *x_out, void *full) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int C = rt->C, K = rt->K;
  const size_t ns = (size_t)rt->Ns * (size_t)C;
  BE(unpermute_forward(rt->kc, routed_rows(rt, full), a + y->ey, F32(a + y->tkw), (const int32_t *)(a + y->inv),
                       rt->Nr, K, C));
  if (rt->Fsl) {
    MP_CHECK(shared_out(ctx, rt, l, x_out));
    BE(accumulate(rt->kc, x_out, mp_rt_sp_slot(rt, full), ns));
  } else {
    BE(memcpy_d2d(rt->kc, x_out, mp_rt_sp_slot(rt, full), ns * rt->xs));
  }
  return MP_OK;
}

static mp_status moe_out_sp(mp_ctx *ctx, mp_runtime *rt, int l, void *x_out) {
  void *full;
  MP_CHECK(mp_rt_sp_full_alloc(ctx, rt, 0, &full));
  MP_CHECK(mp_rt_sp_full_free(ctx, rt, moe_out_sp_body(ctx, rt, l, x_out, full), full));
  BE(accumulate(rt->kc, x_out, rt->act[l] + lay_of(rt, l)->xmid, (size_t)rt->Ns * rt->C));
  return MP_OK;
}

/* An MoE block's MLP from its saved xn2: router, top-k and aux loss (into *moe_aux when
 * asked), permutation, the routed experts, the shared expert; then, unless x_out is NULL
 * (recompute), the unpermuted, weighted expert outputs plus the shared expert's (rowwise
 * down under tp: reduced before joining) added to the residual xmid. */
static mp_status moe_forward(mp_ctx *ctx, mp_runtime *rt, int l, void *x_out, float *moe_aux) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int N = rt->N, C = rt->C, E = rt->E, K = rt->K, Fs = rt->Fsl, Nr = rt->Nr;
  const mp_model *m = &rt->plan->model;
  const void *xin = routed_rows(rt, a + y->xn2);
  BE(matmul_forward(rt->kc, a + y->rl, xin, W(rt, l, MP_MOD_ROUTER), NULL, Nr, C, E));
  BE(router_forward(rt->kc, F32(a + y->probs), (int32_t *)(a + y->tki), F32(a + y->tkw), a + y->rl, Nr, E, K,
                    m->norm_topk_prob));
  if (rt->grid) {
    float auxv;
    MP_CHECK(grid_aux(ctx, rt, l, &auxv));
    if (moe_aux) *moe_aux = auxv;
  } else {
    BE(router_aux_loss_forward(rt->kc, F32(a + y->aux), F32(a + y->f), F32(a + y->probs),
                               (const int32_t *)(a + y->tki), N, E, K));
    if (moe_aux) BE(memcpy_d2h(rt->kc, moe_aux, a + y->aux, sizeof(float)));
  }
  MP_CHECK(mp_rt_moe_route(ctx, rt, l, x_out != NULL));
  BE(permute_forward(rt->kc, a + y->xp, xin, (const int32_t *)(a + y->perm), Nr, K, C));
  MP_CHECK(moe_experts_forward(ctx, rt, l));
  if (Fs) {
    BE(matmul_forward(rt->kc, a + y->sg, a + y->xn2, W(rt, l, MP_MOD_SHARED_GATE), NULL, N, C, Fs));
    BE(matmul_forward(rt->kc, a + y->su, a + y->xn2, W(rt, l, MP_MOD_SHARED_UP), NULL, N, C, Fs));
    BE(swiglu_forward(rt->kc, a + y->sh, a + y->sg, a + y->su, (size_t)N * Fs));
  }
  if (!x_out) return MP_OK;
  if (rt->sp) return moe_out_sp(ctx, rt, l, x_out);
  BE(unpermute_forward(rt->kc, x_out, a + y->ey, F32(a + y->tkw), (const int32_t *)(a + y->inv), N, K, C));
  if (Fs) MP_CHECK(shared_out(ctx, rt, l, x_out));
  BE(accumulate(rt->kc, x_out, a + y->xmid, (size_t)N * C));
  return MP_OK;
}

/* Block l from x_in into the saved tensors; writes x_out unless it is NULL (recompute). */
static mp_status block_forward_body(mp_ctx *ctx, mp_runtime *rt, int l, const void *x_in, void *x_out,
                                    float *moe_aux) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l], *c = rt->core[l];
  const int N = rt->N, C = rt->C, QD = rt->nhl * rt->hd, KD = rt->nkvl * rt->hd;
  MP_CHECK(norm_fwd(ctx, rt, l, 0, a + y->xn1, F32(a + y->rstd1), x_in, W(rt, l, MP_MOD_ATTN_NORM)));
  if (rt->mla) {
    MP_CHECK(mp_rt_mla_forward(ctx, rt, l));
  } else {
    MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, MP_MOD_Q, a + y->q, a + y->xn1, N, C, QD));
    MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, MP_MOD_K, a + y->k, a + y->xn1, N, C, KD));
    MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, MP_MOD_V, a + y->v, a + y->xn1, N, C, KD));
    BE(rope_forward(rt->kc, a + y->q, a + y->q, rt->rope_cos, rt->rope_sin, rt->B, rt->Tl, rt->nhl, rt->hd));
    BE(rope_forward(rt->kc, a + y->k, a + y->k, rt->rope_cos, rt->rope_sin, rt->B, rt->Tl, rt->nkvl, rt->hd));
  }
  MP_CHECK(mp_rt_attn_core_forward(ctx, rt, l));
  /* o is rowwise under tp: partial sums, reduced before the residual */
  MP_CHECK(row_fwd(ctx, rt, l, MP_MOD_O, a + y->xmid, c + y->att, rt->nhl * rt->dv));
  BE(accumulate(rt->kc, a + y->xmid, x_in, (size_t)rt->Ns * C));
  MP_CHECK(norm_fwd(ctx, rt, l, 2, a + y->xn2, F32(a + y->rstd2), a + y->xmid, W(rt, l, MP_MOD_FFN_NORM)));
  if (!is_moe_layer(rt, l)) return dense_mlp_forward(ctx, rt, l, x_out);
  return moe_forward(ctx, rt, l, x_out, moe_aux);
}

/* A block's float8 activations are shared by its Linears (f8_scope_begin) and freed with it. */
mp_status mp_rt_block_forward(mp_ctx *ctx, mp_runtime *rt, int l, const void *x_in, void *x_out, float *moe_aux) {
  mp_rt_f8_scope_begin(rt);
  mp_status st = block_forward_body(ctx, rt, l, x_in, x_out, moe_aux);
  mp_status s2 = mp_rt_f8_scope_end(ctx, rt);
  MP_CHECK(st);
  return s2;
}

/* Block l's BLOCK and CORE allocations (written whole by its forward: no fill). */
mp_status mp_rt_alloc_block(mp_ctx *ctx, mp_runtime *rt, int l) {
  const mp_act_layout *y = lay_of(rt, l);
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, y->bytes[MP_ACT_ALLOC_BLOCK], (void **)&rt->act[l]));
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, y->bytes[MP_ACT_ALLOC_CORE], (void **)&rt->core[l]));
  return MP_OK;
}

/* Block l's saved tensors go: BLOCK, CORE and, under EP, its expert side. */
mp_status mp_rt_free_block(mp_ctx *ctx, mp_runtime *rt, int l) {
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->core[l]));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->act[l]));
  if (rt->epa[l]) MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->epa[l]));
  rt->core[l] = NULL;
  rt->act[l] = NULL;
  rt->epa[l] = NULL;
  return MP_OK;
}

/* ---- backward ------------------------------------------------------------------------ */

/* Routed experts' backward on the expert side: dout (R, C) -> din (R, C) (+=), weight
 * gradients of the local experts. */
static mp_status experts_backward(mp_ctx *ctx, mp_runtime *rt, int l, void *din, void *deg, void *deu, void *deh,
                                  const void *dout, const void *in, const void *eg, const void *eu,
                                  const void *eh, int64_t R) {
  const size_t C = (size_t)rt->C, Fe = (size_t)rt->Fe;
  const int El = rt->El;
  const void *Wg = W(rt, l, MP_MOD_EXPERTS_GATE), *Wu = W(rt, l, MP_MOD_EXPERTS_UP), *Wd = W(rt, l, MP_MOD_EXPERTS_DOWN);
  float *dWg = G(rt, l, MP_MOD_EXPERTS_GATE), *dWu = G(rt, l, MP_MOD_EXPERTS_UP), *dWd = G(rt, l, MP_MOD_EXPERTS_DOWN);
  size_t r0 = 0;
  for (int s = 0; s < rt->ep * rt->etp; s++)
    for (int e = 0; e < El; e++) {
      const int n = expert_block_rows(rt, l, s, e);
      if (!n) continue;
      BE(matmul_backward(rt->kc, xoff(rt, deh, r0 * Fe), dWd + (size_t)e * C * Fe, NULL, xoff(rt, dout, r0 * C),
                         xoff(rt, eh, r0 * Fe), xoff(rt, Wd, (size_t)e * C * Fe), n, (int)Fe, (int)C));
      r0 += (size_t)n;
    }
  BE(swiglu_backward(rt->kc, deg, deu, deh, eg, eu, (size_t)R * Fe));
  r0 = 0;
  for (int s = 0; s < rt->ep * rt->etp; s++)
    for (int e = 0; e < El; e++) {
      const int n = expert_block_rows(rt, l, s, e);
      if (!n) continue;
      BE(matmul_backward(rt->kc, xoff(rt, din, r0 * C), dWg + (size_t)e * Fe * C, NULL, xoff(rt, deg, r0 * Fe),
                         xoff(rt, in, r0 * C), xoff(rt, Wg, (size_t)e * Fe * C), n, (int)C, (int)Fe));
      BE(matmul_backward(rt->kc, xoff(rt, din, r0 * C), dWu + (size_t)e * Fe * C, NULL, xoff(rt, deu, r0 * Fe),
                         xoff(rt, in, r0 * C), xoff(rt, Wu, (size_t)e * Fe * C), n, (int)C, (int)Fe));
      r0 += (size_t)n;
    }
  return MP_OK;
}

/* A rowwise Linear's backward, from the residual gradient dres: as it is, or under SP
 * all-gathered from the shards onto SP_FULL first (the region left, backward). */
static mp_status row_bwd(mp_ctx *ctx, mp_runtime *rt, int l, mp_module mod, void *dinp, const void *dres,
                         const void *inp, int K) {
  const int N = rt->N, C = rt->C;
  if (!rt->sp) return mp_rt_lin_bwd(ctx, rt, l, mod, dinp, dres, inp, N, K, C);
  void *full;
  MP_CHECK(mp_rt_sp_full_alloc(ctx, rt, 0, &full));
  mp_status st = mp_rt_sp_gather(ctx, rt, dres, full);
  if (st == MP_OK) st = mp_rt_lin_bwd(ctx, rt, l, mod, dinp, full, inp, N, K, C);
  return mp_rt_sp_full_free(ctx, rt, st, full);
}

/* The colwise Linears' partial input gradient dxn [N, C] summed over tp (the region
 * entered, backward): all-reduced in place, or under SP reduce-scattered onto dxs. */
static mp_status region_in_bwd(mp_ctx *ctx, mp_runtime *rt, const mp_act_layout *y, char *ws) {
  if (!rt->sp) return tp_sum(ctx, rt, ws + y->dxn, (size_t)rt->N * rt->C);
  return mp_rt_sp_scatter(ctx, rt, ws + y->dxn, ws + y->dxs);
}

/* The input gradient a norm's backward reads: dxs (the shard's rows) under SP, else dxn. */
static void *norm_dx(const mp_runtime *rt, const mp_act_layout *y, char *ws) {
  return ws + (rt->sp ? y->dxs : y->dxn);
}

/* A dense block's MLP backward into the workspace: down, SwiGLU (gate's and up's output
 * gradients each with its amax when both run float8 on codes), gate and up adding into dxn
 * (colwise under tp: partial input gradients, reduced). */
static mp_status dense_mlp_backward(mp_ctx *ctx, mp_runtime *rt, int l, void *dres, char *ws) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int N = rt->N, C = rt->C, F = rt->Fl;
  MP_CHECK(row_bwd(ctx, rt, l, MP_MOD_DOWN, ws + y->dh, dres, a + y->h, F));
  if (rt->f8_codes && F8(rt, l, MP_MOD_GATE) && F8(rt, l, MP_MOD_UP) && rt->be->swiglu_backward_amax) {
    /* the amaxes into rt->scalar[2], [3] */
    BE(swiglu_backward_amax(rt->kc, ws + y->dg, ws + y->du, ws + y->dh, a + y->g, a + y->u, (size_t)N * F,
                            rt->scalar + 2, rt->scalar + 3));
    mp_rt_f8_known_set(rt, ws + y->dg, (size_t)N * F, rt->scalar + 2, 0);
    mp_rt_f8_known_set(rt, ws + y->du, (size_t)N * F, rt->scalar + 3, 0);
  } else {
    BE(swiglu_backward(rt->kc, ws + y->dg, ws + y->du, ws + y->dh, a + y->g, a + y->u, (size_t)N * F));
  }
  MP_CHECK(mp_rt_lin_bwd(ctx, rt, l, MP_MOD_GATE, ws + y->dxn, ws + y->dg, a + y->xn2, N, C, F));
  MP_CHECK(mp_rt_lin_bwd(ctx, rt, l, MP_MOD_UP, ws + y->dxn, ws + y->du, a + y->xn2, N, C, F));
  return region_in_bwd(ctx, rt, y, ws);
}

/* The routed experts' backward of MoE block l, from dey into dxp: on the rank, or on the
 * expert side under EP (dey dispatched, the input gradients combined back), its workspace
 * (zero-filled) allocated around it. */
static mp_status moe_experts_backward(mp_ctx *ctx, mp_runtime *rt, int l, char *ws) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int C = rt->C;
  if (rt->ep == 1)
    return experts_backward(ctx, rt, l, ws + y->dxp, ws + y->deg, ws + y->deu, ws + y->deh, ws + y->dey, a + y->xp,
                            a + y->eg, a + y->eu, a + y->eh, mp_rt_moe_placed_rows(rt, l));
  const int64_t R = rt->ep_R[l];
  mp_act_layout ey;
  ep_layout(rt, l, &ey);
  const char *xr = rt->epa[l] + ey.ep_xr, *eg = rt->epa[l] + ey.ep_eg, *eu = rt->epa[l] + ey.ep_eu,
             *eh = rt->epa[l] + ey.ep_eh;
  char *w2;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, ey.bytes[MP_ACT_ALLOC_EP_WS], (void **)&w2));
  char *deyl = w2 + ey.ep_dey, *dxr = w2 + ey.ep_dxr, *deh = w2 + ey.ep_deh, *deg = w2 + ey.ep_deg,
       *deu = w2 + ey.ep_deu;
  mp_status st = ep_exchange(ctx, rt, l, 0, ws + y->dey, deyl, C);
  if (st == MP_OK) st = mp_rt_etp_gather(ctx, rt, l, deyl, C);
  if (st == MP_OK) st = experts_backward(ctx, rt, l, dxr, deg, deu, deh, deyl, xr, eg, eu, eh, R);
  /* under etp: the input gradients' partial sums reduce-scattered, received into the
   * output gradient's rows, read no more */
  if (st == MP_OK) st = mp_rt_etp_scatter(ctx, rt, l, dxr, deyl, C);
  if (st == MP_OK) st = ep_exchange(ctx, rt, l, 1, dxr, ws + y->dxp, C);
  mp_status s2 = mp_talloc_free(ctx, rt->ta, w2);
  MP_CHECK(st);
  return s2;
}

/* An MoE block's MLP backward into the workspace from the output gradient dout: the
 * shared expert (tp-sharded alone, so its partial input gradient is reduced before the
 * replicated routed experts and router add their whole contributions), unpermute, the
 * routed experts, permute, the aux loss and the router. Under SP dout is *full, the
 * gathered residual gradient, freed once unpermute has read it; the shared expert's
 * gradient is reduce-scattered onto dxs and the routed side's (whole on every tp rank)
 * rows of the shard are added to it. */
static mp_status moe_backward_body(mp_ctx *ctx, mp_runtime *rt, int l, const void *dout, char *ws, float dloss_aux,
                                   void **full) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int N = rt->N, C = rt->C, E = rt->E, K = rt->K, Fs = rt->Fsl, Nr = rt->Nr;
  const mp_model *m = &rt->plan->model;
  const void *dres = dout;
  if (Fs) {
    BE(matmul_backward(rt->kc, ws + y->dsh, G(rt, l, MP_MOD_SHARED_DOWN), NULL, dres, a + y->sh,
                       W(rt, l, MP_MOD_SHARED_DOWN), N, Fs, C));
    BE(swiglu_backward(rt->kc, ws + y->dsg, ws + y->dsu, ws + y->dsh, a + y->sg, a + y->su, (size_t)N * Fs));
    BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_SHARED_GATE), NULL, ws + y->dsg, a + y->xn2,
                       W(rt, l, MP_MOD_SHARED_GATE), N, C, Fs));
    BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_SHARED_UP), NULL, ws + y->dsu, a + y->xn2,
                       W(rt, l, MP_MOD_SHARED_UP), N, C, Fs));
    MP_CHECK(region_in_bwd(ctx, rt, y, ws));
    if (rt->sp) BE(memset_zero(rt->kc, ws + y->dxn, (size_t)N * C * rt->xs));
  }
  BE(unpermute_backward(rt->kc, ws + y->dey, F32(ws + y->dtkw), routed_rows(rt, dres), a + y->ey, F32(a + y->tkw),
                        (const int32_t *)(a + y->inv), Nr, K, C));
  if (*full) {
    void *f = *full;
    *full = NULL;
    MP_CHECK(mp_talloc_free(ctx, rt->ta, f));
  }
  MP_CHECK(moe_experts_backward(ctx, rt, l, ws));
  void *dxr = routed_rows(rt, ws + y->dxn);
  BE(permute_backward(rt->kc, dxr, ws + y->dxp, (const int32_t *)(a + y->inv), Nr, K, C));
  /* the aux loss's gradient, dloss E f_e / N for every token, on the Nr routed rows */
  BE(router_aux_loss_backward(rt->kc, F32(ws + y->dprobs), F32(a + y->f), dloss_aux * (float)Nr / (float)N, Nr, E));
  BE(router_backward(rt->kc, ws + y->drl, F32(ws + y->dtkw), F32(ws + y->dprobs), F32(a + y->probs),
                     (const int32_t *)(a + y->tki), Nr, E, K, m->norm_topk_prob));
  BE(matmul_backward(rt->kc, dxr, G(rt, l, MP_MOD_ROUTER), NULL, ws + y->drl, routed_rows(rt, a + y->xn2),
                     W(rt, l, MP_MOD_ROUTER), Nr, C, E));
  if (rt->sp) {
    const size_t ns = (size_t)rt->Ns * C;
    if (Fs) BE(accumulate(rt->kc, ws + y->dxs, mp_rt_sp_slot(rt, ws + y->dxn), ns));
    else BE(memcpy_d2d(rt->kc, ws + y->dxs, mp_rt_sp_slot(rt, ws + y->dxn), ns * rt->xs));
  }
  return MP_OK;
}

static mp_status moe_backward(mp_ctx *ctx, mp_runtime *rt, int l, void *dres, char *ws, float dloss_aux) {
  void *full = NULL;
  mp_status st = MP_OK;
  if (rt->sp) {
    st = mp_rt_sp_full_alloc(ctx, rt, 0, &full);
    if (st == MP_OK) st = mp_rt_sp_gather(ctx, rt, dres, full);
  }
  if (st == MP_OK) st = moe_backward_body(ctx, rt, l, full ? full : dres, ws, dloss_aux, &full);
  if (full) {
    mp_status s2 = mp_talloc_free(ctx, rt->ta, full);
    if (st == MP_OK) st = s2;
  }
  return st;
}

/* The attention norm's backward: its input gradient (dxn, or dxs under SP) into dres. */
static mp_status attn_norm_bwd(mp_ctx *ctx, mp_runtime *rt, int l, void *dres, char *ws) {
  const mp_act_layout *y = lay_of(rt, l);
  BE(rmsnorm_backward(rt->kc, dres, G(rt, l, MP_MOD_ATTN_NORM), norm_dx(rt, y, ws), rt->x[l],
                      W(rt, l, MP_MOD_ATTN_NORM), F32(rt->act[l] + y->rstd1), rt->Ns, rt->C));
  return MP_OK;
}

/* Block l's backward: dres holds dL/dx[l+1] and is left holding dL/dx[l]; the MLP's
 * backward, the FFN norm's, then attention's into the workspace ws. */
static mp_status block_backward_body(mp_ctx *ctx, mp_runtime *rt, int l, void *dres, char *ws, float dloss_aux) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l], *c = rt->core[l];
  const int N = rt->N, C = rt->C, QD = rt->nhl * rt->hd, KD = rt->nkvl * rt->hd, AD = rt->nhl * rt->dv;
  if (!is_moe_layer(rt, l)) MP_CHECK(dense_mlp_backward(ctx, rt, l, dres, ws));
  else MP_CHECK(moe_backward(ctx, rt, l, dres, ws, dloss_aux));
  BE(rmsnorm_backward(rt->kc, dres, G(rt, l, MP_MOD_FFN_NORM), norm_dx(rt, y, ws), a + y->xmid,
                      W(rt, l, MP_MOD_FFN_NORM), F32(a + y->rstd2), rt->Ns, C));
  /* attention: dres holds dL/dxmid */
  BE(memset_zero(rt->kc, ws + y->dxn, (size_t)N * C * rt->xs));
  MP_CHECK(row_bwd(ctx, rt, l, MP_MOD_O, ws + y->datt, dres, c + y->att, AD));
  if (rt->cp > 1) MP_CHECK(mp_rt_cp_attn_backward(ctx, rt, l, ws));
  else BE(attention_backward(rt->kc, ws + y->dq, ws + y->dk, ws + y->dv, ws + y->datt, a + y->q, a + y->k, a + y->v,
                             c + y->att, F32(c + y->lse), rt->B, rt->T, rt->nhl, rt->nkvl, rt->hd, rt->dv));
  if (rt->mla) {
    MP_CHECK(mp_rt_mla_backward(ctx, rt, l, ws));
    return attn_norm_bwd(ctx, rt, l, dres, ws);
  }
  BE(rope_backward(rt->kc, ws + y->dqp, ws + y->dq, rt->rope_cos, rt->rope_sin, rt->B, rt->Tl, rt->nhl, rt->hd));
  BE(rope_backward(rt->kc, ws + y->dkp, ws + y->dk, rt->rope_cos, rt->rope_sin, rt->B, rt->Tl, rt->nkvl, rt->hd));
  MP_CHECK(mp_rt_lin_bwd(ctx, rt, l, MP_MOD_Q, ws + y->dxn, ws + y->dqp, a + y->xn1, N, C, QD));
  MP_CHECK(mp_rt_lin_bwd(ctx, rt, l, MP_MOD_K, ws + y->dxn, ws + y->dkp, a + y->xn1, N, C, KD));
  MP_CHECK(mp_rt_lin_bwd(ctx, rt, l, MP_MOD_V, ws + y->dxn, ws + y->dv, a + y->xn1, N, C, KD));
  MP_CHECK(region_in_bwd(ctx, rt, y, ws)); /* colwise q/k/v: partial input gradients */
  return attn_norm_bwd(ctx, rt, l, dres, ws);
}

/* Block l's backward inside its float8 scope, where the amaxes its forward kept are known. */
mp_status mp_rt_block_backward(mp_ctx *ctx, mp_runtime *rt, int l, void *dres, char *ws, float dloss_aux) {
  mp_rt_f8_scope_begin(rt);
  if (rt->f8_codes) { /* the weight gradients' inputs: their amax from this micro-batch's forward */
    const mp_act_layout *y = lay_of(rt, l);
    char *a = rt->act[l], *c = rt->core[l];
    const size_t N = (size_t)rt->N;
    const void *x[4] = {a + y->xn1, c + y->att, a + y->xn2, a + y->h};
    const size_t n[4] = {N * rt->C, N * rt->nhl * rt->dv, N * rt->C, N * rt->Fl};
    /* every float8 Linear's forward wrote its activation's slot in this micro-batch */
    unsigned kept = 0;
    for (int m = 0; m < MP_MOD_COUNT; m++)
      if (mp_module_f8_source((mp_module)m) >= 0 && F8(rt, l, (mp_module)m)) kept |= 1u << mp_module_f8_source((mp_module)m);
    for (int src = 0; src < 4; src++)
      if (kept & (1u << src)) mp_rt_f8_known_set(rt, x[src], n[src], mp_rt_f8_fwd_slot(rt, l, src), 1);
  }
  mp_status st = block_backward_body(ctx, rt, l, dres, ws, dloss_aux);
  mp_status s2 = mp_rt_f8_scope_end(ctx, rt);
  MP_CHECK(st);
  return s2;
}
