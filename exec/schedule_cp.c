/* Step schedule builder: context parallelism's attention core as a ring (the builder's
 * overview: schedule.c).
 *
 * PyTorch's context_parallel ring attention as torchtitan runs it
 * (torch/distributed/tensor/experimental/_attention.py, _templated_ring_attention and its
 * backward, with torchtitan 9dec370's defaults): the sequence is cut into 2 x cp chunks and
 * rank i holds chunks i and 2cp - 1 - i (causal load balancing), so each rank's T tokens
 * are seq/cp and every ring step costs the same: step 0 is the causal attention of the
 * local q over the local k, v; a later step is the full attention of either both q chunks
 * over the first half of the visiting k, v or the second q chunk over all of them,
 * 2 (seq / 2cp)^2 query-key pairs either way, 1/cp of the rank's causal work.
 *
 * What travels: torchtitan's Llama expands grouped K and V to every query head before SDPA
 * (repeat_kv, torchtitan/models/llama/model.py), so the ring carries K and V of nh x hd
 * each (kw, vw), not the kv heads; MLA's decompressed K and V are per head already. They
 * are exchanged by all-gather (torchtitan's context_parallel_rotate_method default
 * "allgather", PyTorch's _AllGatherRotater): the rank's K and V, concatenated into one send
 * buffer, are gathered from all cp ranks once, issued with step 0 and waited for by step 1,
 * so the gather overlaps step 0 alone and the whole sequence's K and V stay in memory
 * through the ring. Under the other rotate method, "alltoall" (_AllToAllRotater, the plan's
 * cp_rotate), the K and V in use are copied (torch.cat) and shifted to the next rank before
 * every step but the last, the next step waiting for them: the rank holds the K, V in use,
 * the copy sent and the one arriving, three ranks' (two at cp = 2, whose only send is at step
 * 0), in forward and backward alike. The fp32 dK, dV pass from rank to rank after every
 * backward step (_AllToAllRotater's permute, one peer: a ring shift) under both.
 *
 * Per layer under allgather, forward: the K, V gather (cp x 2 T (kw + vw) bytes; its send
 * buffer a copy); cp steps of a partial flash attention (FLOPs: the core's / cp); after step
 * i > 0 the online-softmax merge of the partial output into the fp32 accumulator (out and
 * lse read and written, the partial read: 10 T q + 16 T nh bytes). Backward: the K, V gathered
 * again; cp steps of a partial attention backward (twice the forward's FLOPs); after each
 * the step's dQ added into the fp32 dQ (10 T q bytes; step 0 writes the zeroed dQ, dK, dV,
 * 6 T (q + kw + vw)); the fp32
 * dK, dV accumulated with the ones that arrive and passed on after every step (cp shifts
 * of 4 T (kw + vw) bytes, SENDRECV to the next rank; the last brings the rank's own back);
 * then the fp32 gradients cast back and repeat_kv's backward summing each head group.
 * Every transfer runs on MP_STREAM_P2P and a step waits only for what it needs, so a
 * transfer is exposed only where the compute before it is shorter (the dependencies say
 * so, the simulator times it). Under torch.compile (the plan's cp_wait_at_issue: torchtitan compiles
 * each block with the ring traced into it, where every functional collective is waited
 * for as it is issued and Inductor reorders none by default) each transfer runs on the
 * compute stream instead, between the steps, beside no compute.
 *
 * Memory (torchtitan model): forward keeps the fp32 output and log-sum-exp accumulators
 * (4 T q + 4 T nh) and the gathered K, V with the send buffer ((cp + 1) x 2 T (kw + vw),
 * COMM; alltoall: min(cp, 3) x 2 T (kw + vw)) through the ring; backward the fp32 dQ, dK,
 * dV accumulators (4 T (q + kw + vw)), the same K, V buffers and two fp32 dK, dV buffers
 * (2 x 4 T (kw + vw), COMM). The saved tensors are those of the local attention
 * (schedule_act.c). Under multi-head latent attention the decompressed K (heads x (qk_nope +
 * qk_rope)) and V (heads x v_head_dim) travel, each at its own width, and the output is v
 * wide.
 *
 * Megatron-LM (the megatron memory model) runs context parallelism through Transformer
 * Engine's ring (AttnFuncWithCPAndKVP2P, Megatron-Core's default cp_comm_type "p2p"; its
 * all_gather and a2a forms are schedule_cp_te.c's): the
 * same 2 x cp load-balanced chunks and per-step partial attention with the online-softmax
 * merge, the K and V sent to the next rank before each step as the alltoall rotate method
 * sends them (the plan must say alltoall), and the dK, dV passed on after each backward
 * step; it keeps every step's K, V buffer until the pass ends, cp of them (mp_cp_ring_kv_units). Its K
 * and V are the grouped ones, n_kv_heads / tp heads (no repeat_kv), and its
 * parameters are replicated over cp: their gradients are all-reduced over dp_replicate x cp
 * (mp_sched_ddp_group), not reduce-scattered over dp_shard x cp as under FSDP. */
#include "exec/schedule_internal.h"

/* Op i stands for n identical ones back to back (mp_op.count). */
static void times(gen *g, int32_t i, int n) {
  if (i >= 0 && n > 1) g->ops[i].count = (uint16_t)n;
}

/* The stream of the ring's transfers: their own, or the compute stream where the plan's
 * compiled ring waits for each where it is issued (cp_wait_at_issue). */
static mp_stream ring_stream(const gen *g) {
  return g->p->opts.cp_wait_at_issue ? MP_STREAM_COMPUTE : MP_STREAM_P2P;
}

/* A ring shift of `bytes` on the CP group, n of them back to back, after `after` (-1:
 * none). */
static int32_t ring_shift(gen *g, double bytes, mp_dtype dt, int32_t after, int n) {
  const int32_t i = comm(g, MP_COLL_SENDRECV, MP_GROUP_CP, ring_stream(g), bytes, dt, -1);
  if (i >= 0) g->ops[i].peer = MP_PEER_NEXT;
  add_dep(g, i, after, 0);
  times(g, i, n);
  return i;
}

/* The ring's rounds of steps. Expanded: cp rounds of one step. Compact with cp >= 5: four
 * rounds, the first two steps, the cp - 3 middle ones folded into one round of ops with
 * mp_op.count, the last step. Every step costs the same and each round's ops wait only on
 * the round before, so a step starts at a max of sums along the ring: the folded round
 * issues the backward's dK, dV shifts of its steps but the last ahead of its compute,
 * which keeps each of those sums, and the last step starts, and the ring ends, when the
 * unfolded ring's would (tests/sim/sim_plan_test.cc holds the two equal). Returns the
 * number of rounds; *fold: the folded round's steps (0: none). */
static int alltoall(const gen *g) { return g->p->opts.cp_rotate == MP_CP_ROTATE_ALLTOALL; }

static int ring_rounds(const gen *g, int *fold) {
  const int cp = g->sh.cp;
  /* alltoall's K, V shifts interleave with the dK, dV ones on the point-to-point stream
   * step by step, which a folded round would reorder: its rings stay expanded */
  *fold = g->s->mode == MP_SCHEDULE_COMPACT && cp >= 5 && !alltoall(g) ? cp - 3 : 0;
  return *fold ? 4 : cp;
}

/* The steps round r stands for. */
static int round_steps(int fold, int r) { return fold && r == 2 ? fold : 1; }

void mp_cp_ring_widths(const mp_model *m, int tp, int megatron, int64_t *kw, int64_t *vw) {
  const int mla = mp_model_is_mla(m);
  const int64_t kvh = m->n_kv_heads / tp > 0 ? m->n_kv_heads / tp : 1;
  const int64_t heads = megatron && !mla ? kvh : m->n_heads / tp;
  *kw = heads * (mla ? m->qk_nope_head_dim + m->qk_rope_head_dim : m->head_dim);
  *vw = heads * (mla ? m->v_head_dim : m->head_dim);
}

/* The K and V widths the ring carries (the file comment). */
static void ring_widths(const gen *g, int64_t *kw, int64_t *vw) {
  mp_cp_ring_widths(&g->p->model, g->sh.tp, g->ms->cp_kv_grouped, kw, vw);
}

/* The all-gather of the ring's K, V (bf16, kvb bytes a rank) after the compute issued so
 * far, on the point-to-point stream, its send buffer a copy of the rank's K and V. */
static int32_t kv_gather(gen *g, double kvb, mp_variant v) {
  const int32_t copy = elementwise(g, MP_KERNEL_COPY, v, -1, (int64_t)(kvb / 2.0), 0.0, 2.0 * kvb);
  /* after the copy, the last compute before the gather: on the compute stream (a compiled
   * ring) the gather itself becomes the stream's last op */
  const int32_t i = comm(g, MP_COLL_ALL_GATHER, MP_GROUP_CP, ring_stream(g), kvb * g->sh.cp,
                         MP_DTYPE_BF16, -1);
  add_dep(g, i, copy, 0);
  return i;
}

int mp_cp_ring_kv_units(int cp, mp_cp_rotate rotate, int megatron) {
  if (megatron) return cp;
  if (rotate == MP_CP_ROTATE_ALLTOALL) return cp < 3 ? cp : 3;
  return cp + 1;
}

static int kv_units(const gen *g) {
  return mp_cp_ring_kv_units(g->sh.cp, g->p->opts.cp_rotate, g->ms->cp_kv_grouped);
}

/* alltoall: before round r's compute, wait for the K, V the round before shifted (`prev`),
 * then copy the K, V in use into a send buffer and shift it to the next rank for every
 * step of the round but the ring's last; returns that shift (-1: none). */
static int32_t kv_shift(gen *g, double kvb, mp_variant v, int r, int R, int k, int32_t prev) {
  if (r > 0) pend_dep(g, prev, 0);
  if (r == R - 1) return -1;
  times(g, elementwise(g, MP_KERNEL_COPY, v, -1, (int64_t)(kvb / 2.0), 0.0, 2.0 * kvb), k);
  return ring_shift(g, kvb, MP_DTYPE_BF16, g->last_compute, k);
}

void mp_sched_cp_attention_fwd(gen *g) {
  if (g->p->opts.cp_comm != MP_CP_COMM_P2P) { /* Transformer Engine's collective forms */
    mp_sched_cp_te_fwd(g);
    return;
  }
  const shapes *sh = &g->sh;
  const int cp = sh->cp;
  const int64_t T = sh->tokens;
  int64_t kw, vw;
  ring_widths(g, &kw, &vw);
  const double kv = 2.0 * (double)(T * (kw + vw)); /* K and V, bf16 */
  const int64_t acc = 4 * T * sh->attn_out + 4 * T * sh->heads, held = (int64_t)(kv * kv_units(g));
  const int a2a = alltoall(g);
  int fold;
  const int R = ring_rounds(g, &fold);
  pair(g, MP_MEM_TEMP, BUF_CP_ACC, acc, 1);
  pair(g, MP_MEM_COMM, BUF_CP_KV, held, 1);
  const int32_t gather = a2a ? -1 : kv_gather(g, kv, MP_VAR_FWD);
  int32_t shift = -1;
  for (int r = 0; r < R; r++) {
    const int k = round_steps(fold, r);
    if (a2a) shift = kv_shift(g, kv, MP_VAR_FWD, r, R, k, shift);
    else if (r == 1) pend_dep(g, gather, 0);
    times(g,
          compute(g, MP_KERNEL_ATTENTION, MP_VAR_FWD, -1, T, sh->seq / cp, sh->head_dim, sh->heads,
                  attn_core_fwd_flops(sh) / cp,
                  2.0 * (double)(T * (sh->q_width + sh->attn_out + kw + vw)) + 4.0 * (double)(T * sh->heads),
                  MP_DTYPE_BF16),
          k);
    if (r > 0) /* the online-softmax merge */
      times(g,
            elementwise(g, MP_KERNEL_ATTENTION, MP_VAR_FWD, -1, T * sh->attn_out, 4.0,
                        10.0 * (double)(T * sh->attn_out) + 16.0 * (double)(T * sh->heads)),
            k);
  }
  pair(g, MP_MEM_COMM, BUF_CP_KV, held, 0);
  pair(g, MP_MEM_TEMP, BUF_CP_ACC, acc, 0);
}

/* After backward step r (k steps of a folded round), the step's bf16 gradients added into
 * the ring's accumulators. Every ring adds the step's dK, dV to the fp32 ones that arrived
 * from the previous rank (12 bytes an element: those read and written, the step's read).
 * PyTorch's ring (_templated_ring_attention_backward with _cp_options.convert_to_f32, its
 * default) keeps dQ in fp32 too and accumulates it after every step, grad_query +=
 * grad_query_, or on the second query chunk alone through _partial_update's cat, which
 * writes the whole tensor: 10 bytes a dQ element either way (the fp32 read and written, the
 * step's bf16 read); at step 0 its zero-initialized dQ, dK, dV take the step's (6: the bf16
 * read, the fp32 written). Transformer Engine's ring (cp_kv_grouped) is priced with the
 * dK, dV of the later steps alone. */
static void grads_accumulate(gen *g, int64_t kw, int64_t vw, int r, int k) {
  const int64_t T = g->sh.tokens, q = g->sh.q_width;
  const int torch_ring = !g->ms->cp_kv_grouped;
  if (r == 0) {
    if (torch_ring)
      elementwise(g, MP_KERNEL_ATTENTION, MP_VAR_BWD, -1, T * (q + kw + vw), 1.0, 6.0 * (double)(T * (q + kw + vw)));
    return;
  }
  const int64_t dq = torch_ring ? T * q : 0;
  times(g,
        elementwise(g, MP_KERNEL_ATTENTION, MP_VAR_BWD, -1, dq + T * (kw + vw), 1.0,
                    10.0 * (double)dq + 12.0 * (double)(T * (kw + vw))),
        k);
}

void mp_sched_cp_attention_bwd(gen *g) {
  if (g->p->opts.cp_comm != MP_CP_COMM_P2P) {
    mp_sched_cp_te_bwd(g);
    return;
  }
  const shapes *sh = &g->sh;
  const int cp = sh->cp;
  const int64_t T = sh->tokens;
  int64_t kw, vw;
  ring_widths(g, &kw, &vw);
  const double kv = 2.0 * (double)(T * (kw + vw)), dkv = 4.0 * (double)(T * (kw + vw));
  const int64_t acc = 4 * T * (sh->q_width + kw + vw), held = (int64_t)(kv * kv_units(g) + 2 * dkv);
  const int a2a = alltoall(g);
  int fold;
  const int R = ring_rounds(g, &fold);
  pair(g, MP_MEM_TEMP, BUF_CP_ACC, acc, 1);
  pair(g, MP_MEM_COMM, BUF_CP_KV, held, 1);
  const int32_t gather = a2a ? -1 : kv_gather(g, kv, MP_VAR_BWD);
  int32_t dshift = -1, shift = -1;
  for (int r = 0; r < R; r++) {
    const int k = round_steps(fold, r);
    if (a2a) shift = kv_shift(g, kv, MP_VAR_BWD, r, R, k, shift);
    int32_t ahead = -1; /* a folded round: the dK, dV shifts of all its steps but the last */
    if (r > 0 && k > 1) ahead = ring_shift(g, dkv, MP_DTYPE_FP32, g->last_compute, k - 1);
    if (!a2a && r == 1) pend_dep(g, gather, 0);
    times(g,
          compute(g, MP_KERNEL_ATTENTION, MP_VAR_BWD, -1, T, sh->seq / cp, sh->head_dim, sh->heads,
                  2.0 * attn_core_fwd_flops(sh) / cp,
                  2.0 * (double)(T * (2 * (sh->q_width + sh->attn_out) + 2 * (kw + vw))) +
                      4.0 * (double)(T * sh->heads),
                  MP_DTYPE_BF16),
          k);
    if (r > 0) pend_dep(g, ahead >= 0 ? ahead : dshift, 0); /* the dK, dV that arrived */
    grads_accumulate(g, kw, vw, r, k);
    dshift = ring_shift(g, dkv, MP_DTYPE_FP32, g->last_compute, 1); /* passed on to the next rank */
  }
  pend_dep(g, dshift, 0); /* the rank's own dK, dV back before they are used */
  /* dQ, dK, dV from fp32 to bf16, and repeat_kv's backward summing each head group */
  elementwise(g, MP_KERNEL_ATTENTION, MP_VAR_BWD, -1, T * (sh->q_width + kw + vw), 1.0,
              6.0 * (double)(T * (sh->q_width + kw + vw)) +
                  (kw != sh->kv_width ? 2.0 * (double)(T * (kw + vw + sh->kv_width + sh->v_width)) : 0.0));
  pair(g, MP_MEM_COMM, BUF_CP_KV, held, 0);
  pair(g, MP_MEM_TEMP, BUF_CP_ACC, acc, 0);
}

/* ---- the meshplan runtimes' ring (exec/runtime/runtime_cp.c) ---------------------------
 * The same ring without overlap (blocking point-to-point, one transfer after each step's
 * compute), its buffers the activation layout's (CP_FWD, CP_BWD: the rank's K and V, or
 * their dK and dV, as one X tensor of 2 T kv elements, a held one and an arriving one).
 * Forward: the local K, V copied into the held buffer; per step the span attention of the
 * rank's two query chunks over the two key chunks held; after every step but the last the
 * held K, V passed to the next rank; the finalize. Backward: FlashAttention-2's D, the
 * local K, V copied; per step the span backward into dQ and the travelling dK, dV; after
 * every step but the last the K, V passed on, after every step the dK, dV (the last
 * transfer brings the rank's own back); those added into the block's dK, dV. */
static mp_dtype rt_x_dtype(const gen *g) { return g->ms->x_bytes == 4 ? MP_DTYPE_FP32 : MP_DTYPE_BF16; }

/* The ring, forward (bwd = 0) or backward (1), in the runtime's order. */
static void rt_ring(gen *g, int bwd) {
  const shapes *sh = &g->sh;
  const int cp = sh->cp;
  const int64_t T = sh->tokens, kv = 2 * T * sh->kv_width;
  const double kvb = (double)g->ms->x_bytes * (double)kv;
  const mp_variant v = bwd ? MP_VAR_BWD : MP_VAR_FWD;
  const mp_act_alloc state = bwd ? MP_ACT_ALLOC_CP_BWD : MP_ACT_ALLOC_CP_FWD;
  mp_sched_rt_mem(g, state, KIND_DENSE, 1);
  if (bwd) /* D = rowsum(dout * out) */
    elementwise(g, MP_KERNEL_ATTENTION, v, -1, T * sh->q_width, 2.0,
                2.0 * g->ms->x_bytes * (double)(T * sh->q_width) + 4.0 * (double)(T * sh->heads));
  elementwise(g, MP_KERNEL_COPY, v, -1, kv, 0.0, 2.0 * kvb);
  for (int s = 0; s < cp; s++) {
    const int q_kv = bwd ? 4 : 2;
    compute(g, MP_KERNEL_ATTENTION, v, -1, T, sh->seq / cp, sh->head_dim, sh->heads,
            (bwd ? 2.0 : 1.0) * attn_core_fwd_flops(sh) / cp,
            2.0 * (double)(T * (q_kv * sh->q_width + q_kv * sh->kv_width)) + 4.0 * (double)(T * sh->heads),
            rt_x_dtype(g));
    if (s + 1 < cp) ring_shift(g, kvb, rt_x_dtype(g), g->last_compute, 1);
    if (bwd) ring_shift(g, kvb, rt_x_dtype(g), g->last_compute, 1); /* the dK, dV */
  }
  if (bwd) /* the rank's own dK, dV into the block's */
    elementwise(g, MP_KERNEL_RESIDUAL, v, -1, kv, 1.0, 3.0 * kvb);
  else /* the finalize */
    elementwise(g, MP_KERNEL_ATTENTION, v, -1, T * sh->q_width, 1.0,
                (4.0 + g->ms->x_bytes) * (double)(T * sh->q_width) + 4.0 * (double)(T * sh->heads));
  mp_sched_rt_mem(g, state, KIND_DENSE, 0);
}

void mp_sched_rt_cp_attention_fwd(gen *g) { rt_ring(g, 0); }

void mp_sched_rt_cp_attention_bwd(gen *g) { rt_ring(g, 1); }
