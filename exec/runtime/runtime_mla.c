/* The training runtime: multi-head latent attention's projections (DeepSeek-V2, arXiv
 * 2405.04434 section 2.1; DeepSeek-V3, arXiv 2412.19437 section 2.1.1), between the
 * attention norm's output xn1 and the attention core, forward and backward. The module
 * layout is Hugging Face transformers' DeepseekV3Attention (modeling_deepseek_v3.py,
 * v4.57), with its RoPE in the rotate_half convention (rope_interleave false; hf.c
 * permutes the rope rows of DeepSeek's interleaved checkpoints on import and export):
 *
 *   q    = q_b_proj(q_a_layernorm(q_a_proj(xn1)))  or q_proj(xn1) without a query latent,
 *          per head [qk_nope | qk_rope], the rope part rotated
 *   kva  = kv_a_proj_with_mqa(xn1) = [latent (kv_lora) | k_pe (qk_rope)], k_pe rotated as
 *          one key head shared by every head
 *   kvb  = kv_b_proj(kv_a_layernorm(latent)), per head [k_nope (qk_nope) | v (v_head)]
 *   k    = per head [k_nope | k_pe];  v  as kvb's v parts
 * and the core attends with softmax scale 1/sqrt(qk_nope + qk_rope) (the config's
 * rope_scaling, whose YaRN mscale would change it, is refused by check.c).
 *
 * Tensors are the activation layout's MLA rows (exec/act_layout.h); the order and the
 * collectives are exec/schedule_mla.c's. Tensor parallelism (torchtitan's deepseek_v3
 * parallelize.py, v0.2.0): q_proj / q_b_proj and kv_b_proj are colwise (this rank's heads),
 * q_a_proj, kv_a_proj_with_mqa and the two latent norms replicated, so everything up to
 * kv_b and q_b runs on all N rows on every rank; backward, the latents' gradients are
 * partial sums over the rank's heads and are all-reduced over tp before the latent norms
 * (the rope key's with them), after which the down projections' weight and input
 * gradients are whole on every rank. Only q_proj's input gradient (no query latent) is
 * partial: it leaves by the region's all-reduce or reduce-scatter, and the whole
 * contributions are added after it. */
#include "exec/runtime/runtime_internal.h"

/* RoPE on the query's rope parts: taken out of every head into qpe, rotated, put back. */
static mp_status q_rope_fwd(mp_ctx *ctx, mp_runtime *rt, char *q, char *qpe) {
  const size_t rows = (size_t)rt->N * rt->nhl, hd = (size_t)rt->hd, dr = (size_t)rt->dr;
  BE(copy2d(rt->kc, qpe, dr, xoff(rt, q, (size_t)rt->dn), hd, rows, dr, 0));
  BE(rope_forward(rt->kc, qpe, qpe, rt->rope_cos, rt->rope_sin, rt->B, rt->Tl, rt->nhl, rt->dr));
  BE(copy2d(rt->kc, xoff(rt, q, (size_t)rt->dn), hd, qpe, dr, rows, dr, 0));
  return MP_OK;
}

/* k and v for the core from kv_b's output and the rotated rope key. */
static mp_status assemble_kv(mp_ctx *ctx, mp_runtime *rt, char *k, char *v, const char *kvb, const char *kpe) {
  const size_t rows = (size_t)rt->N * rt->nhl, hd = (size_t)rt->hd, dn = (size_t)rt->dn, dv = (size_t)rt->dv;
  const size_t w = dn + dv;
  BE(copy2d(rt->kc, k, hd, kvb, w, rows, dn, 0));
  BE(copy2d(rt->kc, v, dv, xoff(rt, kvb, dn), w, rows, dv, 0));
  for (int h = 0; h < rt->nhl; h++) /* the one rope key head, broadcast */
    BE(copy2d(rt->kc, xoff(rt, k, (size_t)h * hd + dn), (size_t)rt->nhl * hd, kpe, (size_t)rt->dr, (size_t)rt->N,
              (size_t)rt->dr, 0));
  return MP_OK;
}

mp_status mp_rt_mla_forward(mp_ctx *ctx, mp_runtime *rt, int l) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int N = rt->N, C = rt->C, QD = rt->nhl * rt->hd, KL = rt->kvl, DR = rt->dr;
  if (rt->ql > 0) {
    MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, MP_MOD_Q_A, a + y->qa, a + y->xn1, N, C, rt->ql));
    BE(rmsnorm_forward(rt->kc, a + y->qan, F32(a + y->rstdqa), a + y->qa, W(rt, l, MP_MOD_Q_A_NORM), N, rt->ql,
                       rt->eps));
    MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, MP_MOD_Q_B, a + y->q, a + y->qan, N, rt->ql, QD));
  } else {
    MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, MP_MOD_Q, a + y->q, a + y->xn1, N, C, QD));
  }
  /* kv_a_proj_with_mqa as two GEMMs on its weight's row blocks: the latent and the rope key
   * land in their own contiguous tensors */
  const char *wkv = W(rt, l, MP_MOD_KV_A);
  char *lat = a + y->kva, *kpe = xoff(rt, a + y->kva, (size_t)N * KL);
  BE(matmul_forward(rt->kc, lat, a + y->xn1, wkv, NULL, N, C, KL));
  BE(matmul_forward(rt->kc, kpe, a + y->xn1, xoff(rt, wkv, (size_t)KL * C), NULL, N, C, DR));
  BE(rmsnorm_forward(rt->kc, a + y->kvn, F32(a + y->rstdkv), lat, W(rt, l, MP_MOD_KV_A_NORM), N, KL, rt->eps));
  MP_CHECK(mp_rt_lin_fwd(ctx, rt, l, MP_MOD_KV_B, a + y->kvb, a + y->kvn, N, KL, rt->nhl * (rt->dn + rt->dv)));
  BE(rope_forward(rt->kc, kpe, kpe, rt->rope_cos, rt->rope_sin, rt->B, rt->Tl, 1, DR));
  MP_CHECK(q_rope_fwd(ctx, rt, a + y->q, a + y->qpe));
  return assemble_kv(ctx, rt, a + y->k, a + y->v, a + y->kvb, kpe);
}

/* The core's gradients dq, dk, dv taken apart: dqp (q's projection output gradient, the
 * rope parts rotated back), dkvb (kv_b's) and, in dlat's rope block, the rope key's before
 * RoPE (summed over the heads). */
static mp_status disassemble_bwd(mp_ctx *ctx, mp_runtime *rt, const mp_act_layout *y, char *ws) {
  const size_t N = (size_t)rt->N, rows = N * rt->nhl, hd = (size_t)rt->hd, dn = (size_t)rt->dn,
               dv = (size_t)rt->dv, dr = (size_t)rt->dr, w = dn + dv;
  char *dq = ws + y->dq, *dk = ws + y->dk;
  BE(copy2d(rt->kc, ws + y->dqr, dr, xoff(rt, dq, dn), hd, rows, dr, 0));
  BE(rope_backward(rt->kc, ws + y->dqrp, ws + y->dqr, rt->rope_cos, rt->rope_sin, rt->B, rt->Tl, rt->nhl, rt->dr));
  BE(copy2d(rt->kc, ws + y->dqp, hd, dq, hd, rows, dn, 0));
  BE(copy2d(rt->kc, xoff(rt, ws + y->dqp, dn), hd, ws + y->dqrp, dr, rows, dr, 0));
  BE(copy2d(rt->kc, ws + y->dkvb, w, dk, hd, rows, dn, 0));
  BE(copy2d(rt->kc, xoff(rt, ws + y->dkvb, dn), w, ws + y->dv, dv, rows, dv, 0));
  for (int h = 0; h < rt->nhl; h++)
    BE(copy2d(rt->kc, ws + y->dkr, dr, xoff(rt, dk, (size_t)h * hd + dn), (size_t)rt->nhl * hd, N, dr, 1));
  BE(rope_backward(rt->kc, xoff(rt, ws + y->dlat, N * rt->kvl), ws + y->dkr, rt->rope_cos, rt->rope_sin, rt->B,
                   rt->Tl, 1, rt->dr));
  return MP_OK;
}

/* The query path's backward from dqp into dxn: q_proj's partial input gradient, reduced
 * over tp (the region entered), or q_b's, its latent's gradient all-reduced, the latent
 * norm's and q_a's (whole). 1 in *reduced when the region's reduction ran. */
static mp_status q_path_bwd(mp_ctx *ctx, mp_runtime *rt, int l, const mp_act_layout *y, char *ws, int *reduced) {
  char *a = rt->act[l];
  const int N = rt->N, C = rt->C, QD = rt->nhl * rt->hd, QL = rt->ql;
  *reduced = QL == 0;
  if (QL == 0) {
    MP_CHECK(mp_rt_lin_bwd(ctx, rt, l, MP_MOD_Q, ws + y->dxn, ws + y->dqp, a + y->xn1, N, C, QD));
    if (!rt->sp) return tp_sum(ctx, rt, ws + y->dxn, (size_t)N * C);
    MP_CHECK(mp_rt_sp_scatter(ctx, rt, ws + y->dxn, ws + y->dxs));
    BE(memset_zero(rt->kc, ws + y->dxn, (size_t)N * C * rt->xs));
    return MP_OK;
  }
  MP_CHECK(mp_rt_lin_bwd(ctx, rt, l, MP_MOD_Q_B, ws + y->dqan, ws + y->dqp, a + y->qan, N, QL, QD));
  MP_CHECK(tp_sum(ctx, rt, ws + y->dqan, (size_t)N * QL));
  BE(rmsnorm_backward(rt->kc, ws + y->dqa, G(rt, l, MP_MOD_Q_A_NORM), ws + y->dqan, a + y->qa,
                      W(rt, l, MP_MOD_Q_A_NORM), F32(a + y->rstdqa), N, QL));
  return mp_rt_lin_bwd(ctx, rt, l, MP_MOD_Q_A, ws + y->dxn, ws + y->dqa, a + y->xn1, N, C, QL);
}

mp_status mp_rt_mla_backward(mp_ctx *ctx, mp_runtime *rt, int l, char *ws) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int N = rt->N, C = rt->C, KL = rt->kvl, DR = rt->dr;
  MP_CHECK(disassemble_bwd(ctx, rt, y, ws));
  MP_CHECK(mp_rt_lin_bwd(ctx, rt, l, MP_MOD_KV_B, ws + y->dlat, ws + y->dkvb, a + y->kvn, N, KL,
                         rt->nhl * (rt->dn + rt->dv)));
  MP_CHECK(tp_sum(ctx, rt, ws + y->dlat, (size_t)N * (KL + DR))); /* the latent and rope key, whole */
  BE(rmsnorm_backward(rt->kc, ws + y->dkv, G(rt, l, MP_MOD_KV_A_NORM), ws + y->dlat, a + y->kva,
                      W(rt, l, MP_MOD_KV_A_NORM), F32(a + y->rstdkv), N, KL));
  int reduced;
  MP_CHECK(q_path_bwd(ctx, rt, l, y, ws, &reduced));
  const char *wkv = W(rt, l, MP_MOD_KV_A);
  float *gkv = G(rt, l, MP_MOD_KV_A);
  BE(matmul_backward(rt->kc, ws + y->dxn, gkv, NULL, ws + y->dkv, a + y->xn1, wkv, N, C, KL));
  BE(matmul_backward(rt->kc, ws + y->dxn, gkv + (size_t)KL * C, NULL, xoff(rt, ws + y->dlat, (size_t)N * KL),
                     a + y->xn1, xoff(rt, wkv, (size_t)KL * C), N, C, DR));
  if (!rt->sp) return MP_OK;
  /* the whole contributions' rows of the shard, beside the reduced ones (or alone) */
  const size_t ns = (size_t)rt->Ns * C;
  if (reduced) BE(accumulate(rt->kc, ws + y->dxs, mp_rt_sp_slot(rt, ws + y->dxn), ns));
  else BE(memcpy_d2d(rt->kc, ws + y->dxs, mp_rt_sp_slot(rt, ws + y->dxn), ns * rt->xs));
  return MP_OK;
}
