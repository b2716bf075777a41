/* Step schedule builder: Megatron-Core's context parallelism in Transformer Engine's two
 * collective forms, --cp-comm-type all_gather and a2a (megatron/training/arguments.py of
 * core_v0.14.0 passes the type to TE's DotProductAttention; the ring, p2p, is
 * schedule_cp.c's). Both from transformer_engine/pytorch/attention/dot_product_attention/
 * context_parallel.py. Every collective here is waited for where it is issued: TE calls
 * gather_along_first_dim and reduce_scatter_along_first_dim synchronously, and its all-to-all
 * helper (flash_attn_a2a_communicate) makes the compute stream wait for all of them before
 * it returns, so each runs on the compute stream, beside no compute: the exposed
 * communication Llama 3 states of its all-gather context parallelism ("the all-gather
 * communication latency is exposed in the critical path", arXiv 2407.21783 sec. 3.3.2).
 *
 * all_gather (AttnFuncWithCPAndKVAllGather). The rank holds the sequence's chunks i and
 * 2cp - 1 - i of 2 cp (the ring's load balancing), T tokens, and K and V of the grouped heads
 * (kw, vw wide, mp_cp_ring_widths). Forward: K and V all-gathered, cp x 2 T kw and cp x 2 T vw
 * bytes (two collectives); both copied into sequence order (index_select); each local query
 * chunk's attention over the keys up to its own end, (i + 1) T / 2 and (2cp - i) T / 2 keys,
 * the rank's whole causal work (the ring's cp steps together) in two launches; each chunk's
 * output copied into the returned one, so the core keeps its per-chunk outputs beside it
 * (schedule_act.c saves 2 T attn_out more). Backward: K and V gathered and reordered
 * again, the full-length dK, dV zeroed, the two chunks' attention backward, dQ copied and
 * each chunk's dK, dV added into the full ones ((2cp + 1) T / 2 keys' worth), those reordered
 * and reduce-scattered, cp x 2 T kw and cp x 2 T vw bytes in (two collectives).
 * Memory (COMM): forward the gathered K, V and, while each is reordered, the copy in order,
 * cp x 2 T (kw + vw + max(kw, vw)); backward the gathered K, V, the full dK, dV, the chunks'
 * own dK, dV and a reorder copy: 2 cp x 2 T (kw + vw) + (2cp + 1) T (kw + vw) +
 * cp x 2 T max(kw, vw).
 *
 * a2a (AttnFuncWithCPAndQKVOA2A, DeepSpeed-Ulysses' form): Q, K and V all-to-all'd from the
 * rank's sequence chunks over all heads to the whole sequence over heads / cp (each a
 * collective of its own, the rank's 2 T q_width, 2 T kw, 2 T vw bytes), a layout copy before
 * (the heads split to the front) and a reorder after (the chunks into sequence order); the
 * attention of the whole sequence on heads / cp, the same FLOPs as the rank's causal share;
 * the output all-to-all'd back (2 T attn_out bytes) with its copies. Backward: the saved
 * output and its gradient all-to-all'd (two of 2 T attn_out), the attention backward, dQ,
 * dK, dV all-to-all'd back. Memory (COMM): each all-to-all's send copies and receive
 * buffers, 2 x its bytes, while it runs; the received out and dout through the backward.
 * cp must divide the rank's query and key heads (exec/rules.c, mp_rule_cp_comm_check). */
#include "exec/schedule_internal.h"

/* A collective of `bytes` (the convention of sim/network.c) on the CP group, on the compute
 * stream: waited for where it is issued (the file comment). */
static void exposed(gen *g, mp_coll c, double bytes) {
  comm(g, c, MP_GROUP_CP, MP_STREAM_COMPUTE, bytes, MP_DTYPE_BF16, -1);
}

/* A device copy of `bytes`, read and written. */
static void copy(gen *g, mp_variant v, double bytes) {
  elementwise(g, MP_KERNEL_COPY, v, -1, (int64_t)(bytes / 2.0), 0.0, 2.0 * bytes);
}

/* The grouped K, V widths Megatron's context parallelism moves (no repeat_kv). */
static void kv_widths(const gen *g, int64_t *kw, int64_t *vw) {
  mp_cp_ring_widths(&g->p->model, g->sh.tp, 1, kw, vw);
}

/* ---- all_gather ------------------------------------------------------------------------- */

/* The two local query chunks' attention (bwd 0) or its backward (1) over the gathered keys:
 * the rank's causal FLOPs in two launches of half each; bytes: the chunk's q, out (and
 * dout, dq backward) and the (2cp + 1) T / 4 keys' K, V (and dK, dV) a chunk reads on
 * average. */
static void ag_chunks(gen *g, int bwd, int64_t kw, int64_t vw) {
  const shapes *sh = &g->sh;
  const double half = (double)sh->tokens / 2.0, keys = (2.0 * sh->cp + 1.0) * (double)sh->tokens / 4.0;
  const double io = bwd ? 2.0 : 1.0;
  for (int c = 0; c < 2; c++)
    compute(g, MP_KERNEL_ATTENTION, bwd ? MP_VAR_BWD : MP_VAR_FWD, -1, (int64_t)half, sh->seq, sh->head_dim,
            sh->heads, io * attn_core_fwd_flops(sh) / 2.0,
            2.0 * io * (half * (double)(sh->q_width + sh->attn_out) + keys * (double)(kw + vw)) +
                4.0 * half * (double)sh->heads,
            MP_DTYPE_BF16);
}

/* K and V gathered from the cp ranks (two collectives) and copied into sequence order. */
static void ag_gather(gen *g, mp_variant v, double kb, double vb) {
  const int cp = g->sh.cp;
  exposed(g, MP_COLL_ALL_GATHER, cp * kb);
  exposed(g, MP_COLL_ALL_GATHER, cp * vb);
  copy(g, v, cp * (kb + vb));
}

static void ag_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const int cp = sh->cp;
  int64_t kw, vw;
  kv_widths(g, &kw, &vw);
  const double kb = 2.0 * (double)(sh->tokens * kw), vb = 2.0 * (double)(sh->tokens * vw);
  const int64_t gathered = (int64_t)(cp * (kb + vb)), reorder = (int64_t)(cp * (kb > vb ? kb : vb));
  pair(g, MP_MEM_COMM, BUF_CP_KV, gathered, 1);
  pair(g, MP_MEM_COMM, BUF_CP_ACC, reorder, 1);
  ag_gather(g, MP_VAR_FWD, kb, vb);
  pair(g, MP_MEM_COMM, BUF_CP_ACC, reorder, 0);
  ag_chunks(g, 0, kw, vw);
  copy(g, MP_VAR_FWD, 2.0 * (double)(sh->tokens * sh->attn_out)); /* the chunks' outputs into one */
  pair(g, MP_MEM_COMM, BUF_CP_KV, gathered, 0);
}

static void ag_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const int cp = sh->cp;
  const int64_t T = sh->tokens;
  int64_t kw, vw;
  kv_widths(g, &kw, &vw);
  const double kb = 2.0 * (double)(T * kw), vb = 2.0 * (double)(T * vw);
  const double gathered = cp * (kb + vb), chunks = (2.0 * cp + 1.0) / 2.0 * (kb + vb);
  const int64_t held = (int64_t)(2.0 * gathered + chunks + cp * (kb > vb ? kb : vb));
  pair(g, MP_MEM_COMM, BUF_CP_KV, held, 1);
  ag_gather(g, MP_VAR_BWD, kb, vb);
  elementwise(g, MP_KERNEL_COPY, MP_VAR_BWD, -1, (int64_t)(gathered / 2.0), 0.0, gathered); /* dK, dV zeroed */
  ag_chunks(g, 1, kw, vw);
  copy(g, MP_VAR_BWD, 2.0 * (double)(T * sh->q_width)); /* the chunks' dQ into one */
  /* each chunk's dK, dV added into the full ones: both read, the sum written */
  elementwise(g, MP_KERNEL_RESIDUAL, MP_VAR_BWD, -1, (int64_t)(chunks / 2.0), 1.0, 3.0 * chunks);
  copy(g, MP_VAR_BWD, gathered); /* into the ranks' chunk order */
  exposed(g, MP_COLL_REDUCE_SCATTER, cp * kb);
  exposed(g, MP_COLL_REDUCE_SCATTER, cp * vb);
  pair(g, MP_MEM_COMM, BUF_CP_KV, held, 0);
}

/* ---- a2a -------------------------------------------------------------------------------- */

/* The all-to-alls of n tensors of bytes[k] each with their layout copies before and after,
 * and their send and receive buffers while they run. */
static void a2a_group(gen *g, mp_variant v, const double *bytes, int n) {
  double all = 0.0;
  for (int k = 0; k < n; k++) all += bytes[k];
  pair(g, MP_MEM_COMM, BUF_CP_KV, (int64_t)(2.0 * all), 1);
  copy(g, v, all);
  for (int k = 0; k < n; k++) exposed(g, MP_COLL_ALL_TO_ALL, bytes[k]);
  copy(g, v, all);
  pair(g, MP_MEM_COMM, BUF_CP_KV, (int64_t)(2.0 * all), 0);
}

/* The attention of the whole sequence on heads / cp (bwd 0) or its backward (1): the
 * rank's causal FLOPs, its own tensors' bytes (the same sizes as the local ones). */
static void a2a_core(gen *g, int bwd, int64_t kw, int64_t vw) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens;
  const double io = bwd ? 2.0 : 1.0;
  compute(g, MP_KERNEL_ATTENTION, bwd ? MP_VAR_BWD : MP_VAR_FWD, -1, T * sh->cp, sh->seq, sh->head_dim,
          sh->heads / sh->cp, io * attn_core_fwd_flops(sh),
          2.0 * io * (double)(T * (sh->q_width + sh->attn_out + kw + vw)) + 4.0 * (double)(T * sh->heads),
          MP_DTYPE_BF16);
}

static void a2a_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const double T = (double)sh->tokens;
  int64_t kw, vw;
  kv_widths(g, &kw, &vw);
  const double qkv[3] = {2.0 * T * (double)sh->q_width, 2.0 * T * (double)kw, 2.0 * T * (double)vw};
  const double out = 2.0 * T * (double)sh->attn_out;
  a2a_group(g, MP_VAR_FWD, qkv, 3);
  a2a_core(g, 0, kw, vw);
  a2a_group(g, MP_VAR_FWD, &out, 1);
}

static void a2a_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const double T = (double)sh->tokens;
  int64_t kw, vw;
  kv_widths(g, &kw, &vw);
  const double out = 2.0 * T * (double)sh->attn_out, o_do[2] = {out, out};
  const double dqkv[3] = {2.0 * T * (double)sh->q_width, 2.0 * T * (double)kw, 2.0 * T * (double)vw};
  a2a_group(g, MP_VAR_BWD, o_do, 2);
  pair(g, MP_MEM_COMM, BUF_CP_ACC, (int64_t)(2.0 * out), 1); /* out and dout received */
  a2a_core(g, 1, kw, vw);
  pair(g, MP_MEM_COMM, BUF_CP_ACC, (int64_t)(2.0 * out), 0);
  a2a_group(g, MP_VAR_BWD, dqkv, 3);
}

void mp_sched_cp_te_fwd(gen *g) {
  if (g->p->opts.cp_comm == MP_CP_COMM_A2A) a2a_fwd(g);
  else ag_fwd(g);
}

void mp_sched_cp_te_bwd(gen *g) {
  if (g->p->opts.cp_comm == MP_CP_COMM_A2A) a2a_bwd(g);
  else ag_bwd(g);
}
