/* The training runtime: context parallelism (runtime_internal.h lists the runtime's files).
 *
 * Layout (Megatron-LM's context parallelism and torchtitan's context_parallel, both with
 * causal load balancing): each sequence of S tokens is cut into 2 cp chunks of cs = S / 2cp
 * and rank c of the cp group holds chunks c and 2cp - 1 - c, its Tl = S / cp local rows
 * ordered chunk c first. Every causal ring step then costs a rank the same. The token ids,
 * targets and RoPE positions of the local rows are those global positions (mp_rt_cp_pos);
 * every token-wise op runs on the Tl local rows unchanged.
 *
 * Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; PyTorch's
 * _templated_ring_attention): forward, the rank's K and V travel the cp ring, one step per
 * rank; at each step the rank's two query chunks attend to the two key chunks it holds
 * through the span kernels (kernels/ops.h, attention_span_*: the online-softmax merge into
 * an fp32 running output and log-sum-exp, causal by global position), then passes them on
 * with mp_comm_sendrecv (to the next rank, from the previous). Backward, from the final
 * log-sum-exp and FlashAttention-2's D, K and V travel again together with their dK and
 * dV, which collect each rank's contribution; one more transfer after the last step brings
 * every rank its own. The loss is the mean over the whole sequence: each rank's mean over
 * its rows is scaled by 1 / cp and summed over the cp group (runtime_step.c). Gradients are
 * summed over cp by the FSDP reduce-scatter where a parameter is sharded over dp_shard x cp
 * (MP_GROUP_FSDP), and by mp_rt_cp_grads for the parameters that are not. */
#include "exec/runtime/runtime_internal.h"

int mp_rt_cp_pos(const mp_runtime *rt, int owner, int chunk) {
  const int cs = rt->Tl / 2;
  return (chunk == 0 ? owner : 2 * rt->cp - 1 - owner) * cs;
}

/* The span of query chunk qi of this rank against key chunk ki of rank src. */
static mp_attn_span span_of(const mp_runtime *rt, int qi, int src, int ki) {
  const int cs = rt->Tl / 2;
  return (mp_attn_span){.B = rt->B, .nh = rt->nhl, .nkv = rt->nkvl, .hd = rt->hd,
                        .Sq = rt->Tl, .q_row = qi * cs, .Tq = cs, .q_pos = mp_rt_cp_pos(rt, rt->cp_idx, qi),
                        .Sk = rt->Tl, .kv_row = ki * cs, .Tk = cs, .kv_pos = mp_rt_cp_pos(rt, src, ki)};
}

/* buf (2 N KD X: K then V) passed to the next rank of the ring, the previous rank's into
 * recv. */
static mp_status ring_shift(mp_ctx *ctx, mp_runtime *rt, const void *buf, void *recv) {
  const size_t n = 2 * (size_t)rt->N * (size_t)rt->nkvl * (size_t)rt->hd;
  return mp_comm_sendrecv(ctx, rt->comm, buf, n, rt->cp_next, recv, n, rt->cp_prev, rt->xdt);
}

static mp_status cp_forward_body(mp_ctx *ctx, mp_runtime *rt, int l, char *w) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l], *c = rt->core[l];
  const size_t kd = (size_t)rt->N * (size_t)rt->nkvl * (size_t)rt->hd;
  float *acc = F32(w + y->cp_acc), *lse = F32(c + y->lse);
  char *held = w + y->cp_kv0, *next = w + y->cp_kv1;
  BE(memcpy_d2d(rt->kc, held, a + y->k, kd * rt->xs));
  BE(memcpy_d2d(rt->kc, xoff(rt, held, kd), a + y->v, kd * rt->xs));
  BE(attention_span_init(rt->kc, lse, (size_t)rt->B * rt->nhl * rt->Tl));
  for (int s = 0; s < rt->cp; s++) {
    const int src = (rt->cp_idx - s + rt->cp) % rt->cp;
    for (int qi = 0; qi < 2; qi++)
      for (int ki = 0; ki < 2; ki++) {
        const mp_attn_span sp = span_of(rt, qi, src, ki);
        BE(attention_span_forward(rt->kc, acc, lse, a + y->q, held, xoff(rt, held, kd), &sp));
      }
    if (s + 1 < rt->cp) {
      MP_CHECK(ring_shift(ctx, rt, held, next));
      char *t = held;
      held = next;
      next = t;
    }
  }
  BE(attention_span_finalize(rt->kc, c + y->att, acc, lse, rt->B, rt->Tl, rt->nhl, rt->hd));
  return MP_OK;
}

mp_status mp_rt_cp_attn_forward(mp_ctx *ctx, mp_runtime *rt, int l) {
  char *w;
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_TEMP, act_bytes(rt, MP_ACT_ALLOC_CP_FWD), (void **)&w));
  mp_status st = cp_forward_body(ctx, rt, l, w);
  mp_status s2 = mp_talloc_free(ctx, rt->ta, w);
  MP_CHECK(st);
  return s2;
}

static mp_status cp_backward_body(mp_ctx *ctx, mp_runtime *rt, int l, char *ws, char *w) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l], *c = rt->core[l];
  const size_t kd = (size_t)rt->N * (size_t)rt->nkvl * (size_t)rt->hd;
  const float *lse = F32(c + y->lse);
  float *D = F32(w + y->cp_d);
  char *held = w + y->cp_bkv0, *next = w + y->cp_bkv1, *dheld = w + y->cp_dkv0, *dnext = w + y->cp_dkv1;
  BE(attention_span_dot(rt->kc, D, ws + y->datt, c + y->att, rt->B, rt->Tl, rt->nhl, rt->hd));
  BE(memcpy_d2d(rt->kc, held, a + y->k, kd * rt->xs));
  BE(memcpy_d2d(rt->kc, xoff(rt, held, kd), a + y->v, kd * rt->xs));
  for (int s = 0; s < rt->cp; s++) {
    const int src = (rt->cp_idx - s + rt->cp) % rt->cp;
    for (int qi = 0; qi < 2; qi++)
      for (int ki = 0; ki < 2; ki++) {
        const mp_attn_span sp = span_of(rt, qi, src, ki);
        BE(attention_span_backward(rt->kc, ws + y->dq, dheld, xoff(rt, dheld, kd), ws + y->datt, a + y->q, held,
                                   xoff(rt, held, kd), lse, D, &sp));
      }
    if (s + 1 < rt->cp) {
      MP_CHECK(ring_shift(ctx, rt, held, next));
      char *t = held;
      held = next;
      next = t;
    }
    MP_CHECK(ring_shift(ctx, rt, dheld, dnext));
    char *t = dheld;
    dheld = dnext;
    dnext = t;
  }
  /* dheld: this rank's own K, V gradients, back from the ring; dk and dv (WS) are zero */
  BE(accumulate(rt->kc, ws + y->dk, dheld, kd));
  BE(accumulate(rt->kc, ws + y->dv, xoff(rt, dheld, kd), kd));
  return MP_OK;
}

mp_status mp_rt_cp_attn_backward(mp_ctx *ctx, mp_runtime *rt, int l, char *ws) {
  char *w; /* zero-filled: the travelling dK, dV start at zero */
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, act_bytes(rt, MP_ACT_ALLOC_CP_BWD), (void **)&w));
  mp_status st = cp_backward_body(ctx, rt, l, ws, w);
  mp_status s2 = mp_talloc_free(ctx, rt->ta, w);
  MP_CHECK(st);
  return s2;
}

mp_status mp_rt_cp_grads(mp_ctx *ctx, mp_runtime *rt) {
  if (rt->cp == 1) return MP_OK;
  for (int i = 0; i < rt->plan->n_params; i++) {
    rt_param *r = &rt->prm[i];
    /* sharded over MP_GROUP_FSDP (dp_shard x cp): the reduce-scatter summed over cp */
    if (!r->g || (r->sharded && r->group == MP_GROUP_FSDP)) continue;
    MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_CP, r->g, r->g, (size_t)r->numel_pad, MP_COMM_DTYPE_FP32,
                                MP_COMM_OP_SUM));
  }
  return MP_OK;
}
