/* The training runtime: an MoE block's routing after the router kernel (runtime_internal.h
 * lists the runtime's files): the experts' capacity with token dropping, the grouping of
 * the kept (token, expert) pairs by expert, and the per-expert loads a step measures.
 *
 * Capacity follows Megatron-Core core_v0.14 (megatron/core/transformer/moe/moe_utils.py,
 * get_capacity and apply_router_token_dropping with moe_token_drop_policy "probs", no
 * padding to capacity; router.py applies it after top-k routing): each expert takes at
 * most ceil(Nr x k / E x cf) assignments, counted over the Nr tokens this rank routes in
 * one micro-batch (the rank's local tokens before the dispatch, as Megatron's router sees
 * them), and keeps those of the highest routing probability (the combine weight topk_w,
 * after the top-k renormalisation where the model has it, as Megatron ranks its probs);
 * equal weights keep the lower token (torch.topk leaves ties unspecified). A dropped
 * assignment takes no row in the expert's input and adds nothing to the token's output,
 * forward or backward (kernels/ops.h, moe_plan's -1); the weights of the kept ones are
 * not renormalised (Megatron multiplies probs by the capacity mask). The load-balancing
 * loss reads the routing before the drop (router.py computes its routing map again from
 * the logits: compute_routing_scores_for_aux_loss), and so does the router's backward,
 * where a dropped assignment's weight has gradient zero.
 *
 * Loads: per MoE layer and expert, the assignments the router made (before any drop) and
 * those dropped, summed over the step's micro-batches on the rank, then over the ranks
 * that route distinct tokens (runtime_step.c): every rank but the tp replicas of a rank
 * that routes all N rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec/runtime/runtime_internal.h"

static int64_t moe_capacity(int64_t tokens, int k, int E, double cf) {
  /* Megatron's get_capacity(num_tokens = tokens * k, num_experts = E, cf): ceil(n / E * cf) */
  const double c = ceil((double)(tokens * k) / E * cf);
  return c < 0 ? 0 : (int64_t)c;
}

typedef struct moe_pair {
  int32_t e, r; /* expert, pair index n * k + j */
  float w;      /* routing weight */
} moe_pair;

/* Expert ascending, then weight descending, then pair (so token) ascending. */
static int pair_order(const void *a_, const void *b_) {
  const moe_pair *a = a_, *b = b_;
  if (a->e != b->e) return a->e < b->e ? -1 : 1;
  if (a->w != b->w) return a->w > b->w ? -1 : 1;
  return a->r < b->r ? -1 : a->r > b->r;
}

/* kept (N*k): tki with -1 where an assignment is over its expert's capacity; routed and
 * dropped (E, or NULL: not measured) += the layer's assignments and drops per expert. */
static void moe_drop(const int32_t *tki, const float *tkw, int64_t nk, int64_t cap, int32_t *kept,
                    moe_pair *scratch, int64_t *routed, int64_t *dropped) {
  for (int64_t r = 0; r < nk; r++) scratch[r] = (moe_pair){tki[r], (int32_t)r, tkw[r]};
  qsort(scratch, (size_t)nk, sizeof *scratch, pair_order);
  int64_t taken = 0;
  for (int64_t i = 0; i < nk; i++) {
    const moe_pair *p = &scratch[i];
    if (i == 0 || p->e != scratch[i - 1].e) taken = 0;
    if (routed) routed[p->e]++;
    if (taken++ < cap) {
      kept[p->r] = p->e;
    } else {
      kept[p->r] = -1;
      if (dropped) dropped[p->e]++;
    }
  }
}

/* The drop of layer l on the host: its routing read back, the kept indices written to a
 * TEMP buffer *dev (the caller frees it) for moe_plan. */
static mp_status drop_to_device(mp_ctx *ctx, mp_runtime *rt, int l, int64_t *routed, int64_t *dropped,
                                void **dev) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int64_t nk = (int64_t)rt->Nr * rt->K;
  int32_t *tki = malloc((size_t)nk * sizeof *tki), *kept = malloc((size_t)nk * sizeof *kept);
  float *tkw = malloc((size_t)nk * sizeof *tkw);
  moe_pair *scratch = malloc((size_t)(nk ? nk : 1) * sizeof *scratch);
  mp_status st = tki && kept && tkw && scratch ? MP_OK : mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory "
                                                                  "for the experts' capacity");
  if (st == MP_OK) st = rt->be->memcpy_d2h(rt->kc, tki, a + y->tki, (size_t)nk * sizeof *tki);
  if (st == MP_OK) st = rt->be->memcpy_d2h(rt->kc, tkw, a + y->tkw, (size_t)nk * sizeof *tkw);
  if (st != MP_OK && st != MP_ERR_NOMEM) st = mp_error(ctx, st, "expert capacity: %s", mp_errmsg(rt->kc->err));
  if (st == MP_OK) {
    const int64_t cap = moe_capacity(rt->Nr, rt->K, rt->E, rt->opts.moe_capacity_factor);
    moe_drop(tki, tkw, nk, cap, kept, scratch, routed, dropped);
    st = mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_TEMP, (size_t)(nk ? nk : 1) * sizeof *kept, dev);
  }
  if (st == MP_OK && rt->be->memcpy_h2d(rt->kc, *dev, kept, (size_t)nk * sizeof *kept) != MP_OK)
    st = mp_error(ctx, MP_ERR_INTERNAL, "expert capacity: %s", mp_errmsg(rt->kc->err));
  free(tki);
  free(kept);
  free(tkw);
  free(scratch);
  return st;
}

mp_status mp_rt_moe_route(mp_ctx *ctx, mp_runtime *rt, int l, int measure) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l];
  const int E = rt->E;
  int32_t *counts = rt->counts_h + (size_t)l * E;
  int64_t *routed = rt->load_routed + (size_t)l * E, *dropped = rt->load_dropped + (size_t)l * E;
  if (rt->opts.moe_capacity_factor > 0) {
    void *kept = NULL;
    mp_status st = drop_to_device(ctx, rt, l, measure ? routed : NULL, measure ? dropped : NULL, &kept);
    if (st == MP_OK && rt->be->moe_plan(rt->kc, (int32_t *)(a + y->perm), (int32_t *)(a + y->inv),
                                        (int32_t *)(a + y->counts), kept, rt->Nr, E, rt->K) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "moe_plan: %s", mp_errmsg(rt->kc->err));
    if (kept) {
      mp_status s2 = mp_talloc_free(ctx, rt->ta, kept);
      if (st == MP_OK) st = s2;
    }
    MP_CHECK(st);
  } else {
    BE(moe_plan(rt->kc, (int32_t *)(a + y->perm), (int32_t *)(a + y->inv), (int32_t *)(a + y->counts),
                (const int32_t *)(a + y->tki), rt->Nr, E, rt->K));
  }
  BE(memcpy_d2h(rt->kc, counts, a + y->counts, (size_t)E * sizeof(int32_t)));
  if (rt->opts.moe_capacity_factor <= 0)
    for (int e = 0; e < E && measure; e++) routed[e] += counts[e];
  return MP_OK;
}

int64_t mp_rt_moe_placed_rows(const mp_runtime *rt, int l) {
  int64_t n = 0;
  for (int e = 0; e < rt->E; e++) n += rt->counts_h[(size_t)l * rt->E + e];
  return n;
}

/* The step's loads summed over the ranks that route distinct tokens: a tp replica of a
 * rank routing all N rows adds nothing; every other rank its own. In pieces that fit the
 * staging buffer of host-value collectives (two int64 copies each). */
mp_status mp_rt_moe_loads_reduce(mp_ctx *ctx, mp_runtime *rt) {
  const size_t n = (size_t)rt->L * rt->E;
  if (!rt->load_routed || !n) return MP_OK;
  if (!rt->grid && rt->tp_idx != 0) {
    memset(rt->load_routed, 0, n * sizeof *rt->load_routed);
    memset(rt->load_dropped, 0, n * sizeof *rt->load_dropped);
  }
  if (mp_comm_world_size(rt->comm) == 1) return MP_OK;
  const size_t piece = STAGE_FLOATS * sizeof(float) / (2 * sizeof(int64_t));
  int64_t *bufs[2] = {rt->load_routed, rt->load_dropped};
  for (int b = 0; b < 2; b++)
    for (size_t i = 0; i < n; i += piece)
      MP_CHECK(mp_rt_host_coll(ctx, rt, MP_GROUP_WORLD, bufs[b] + i, NULL, n - i < piece ? n - i : piece,
                               MP_COMM_DTYPE_INT64, MP_COMM_OP_SUM, NULL));
  return MP_OK;
}
