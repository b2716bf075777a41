/* Step schedule builder: multi-head latent attention's projections (DeepSeek-V2, arXiv
 * 2405.04434 section 2.1; DeepSeek-V3, arXiv 2412.19437), between the attention norm and the
 * attention core (the builder's overview: schedule.c; the model: exec/model.h).
 *
 * Forward, on T tokens of the micro-batch (all of them on every tp rank), tp-local widths
 * q = heads_l x (qk_nope + qk_rope), kvb = heads_l x (qk_nope + v), v = heads_l x v:
 *   TP region entered: SP all-gathers the normed input to [T, H] before the down
 *     projections, which are replicated over tp (torchtitan's deepseek_v3 parallelize)
 *   q   q_a_proj [T, ql], q_a_layernorm, q_b_proj [T, q]  (or q_proj [T, q] when ql == 0)
 *   kv  kv_a_proj_with_mqa [T, kvl + rope], kv_a_layernorm on [T, kvl], kv_b_proj [T, kvb]
 *   RoPE on the query's rope part [T, heads_l x rope] and the shared key head [T, rope]
 *   q and k assembled (torch.cat of the nope and rope parts, the key's rope head broadcast
 *     to every head): a copy of [T, q] and [T, k]
 * Backward, the reverse: the copy's (the key's rope gradient summed over heads), RoPE's, then
 * kv_b's GEMMs and the all-reduce over tp of the latent's gradient [T, kvl + rope] (the
 * colwise up projection's input is replicated, so its input gradient is a partial sum over
 * the heads: Megatron's f operator; the rope key head's gradient likewise), kv_a's norm and
 * GEMMs; the same for the q path with [T, ql]. The down projections then see the whole
 * gradient on every rank, so their weight gradients need no reduction and their input
 * gradient is whole: with a q latent the region is left without a collective (under SP each
 * rank keeps its rows); q_proj's input gradient (ql == 0) is partial and leaves by the
 * region's reduce-scatter (SP) or all-reduce.
 *
 * What autograd saves (the torchtitan memory model, bf16 2 bytes, RMSNorm statistics 4 per
 * row): the normed input 2TH (the down projections' input), q_a's output 2T ql (its norm's
 * input) and rstd 4T, the normed q latent 2T ql (q_b's input), kv_a's output 2T (kvl + rope)
 * (its norm's input is a view of it) and rstd 4T, the normed kv latent 2T kvl (kv_b's input),
 * kv_b's output 2T kvb (v is a view of it, saved by the attention), the assembled q and k
 * 2T (q + k), the attention output 2T v and its log-sum-exp 4T heads_l. */
#include "exec/schedule_internal.h"

/* torchtitan's op-level SAC keeps the outputs of the odd-numbered mm of a block (schedule_act.c):
 * with a query latent q_a #1 [T, ql], kv_a #3 [T, kvl + rope] and o #5 [T, H] (q_b #2 and
 * kv_b #4 recomputed); without, q_proj #1 [T, q] and kv_b #3 [T, kvb] (kv_a #2 and o #4
 * recomputed). */
int64_t mp_sched_mla_op_sac(const shapes *sh, int64_t *in_saved, uint64_t *skip) {
  const int64_t T = sh->tokens;
  if (sh->q_lora > 0) {
    *skip |= SKIP_MOD(MP_MOD_Q_A) | SKIP_MOD(MP_MOD_KV_A) | SKIP_MOD(MP_MOD_O);
    *in_saved = 2 * T * sh->q_lora + 2 * T * (sh->kv_lora + sh->rope_dim); /* both are saved without AC */
    return *in_saved + 2 * T * sh->d_model;
  }
  *skip |= SKIP_MOD(MP_MOD_Q) | SKIP_MOD(MP_MOD_KV_B);
  *in_saved = 2 * T * sh->kv_b_rows; /* v's base; q_proj's output is not saved without AC */
  return 2 * T * sh->q_width + *in_saved;
}

int64_t mp_sched_mla_attn_saved(const shapes *sh, int64_t in) {
  const int64_t T = sh->tokens;
  int64_t b = 4 * sh->tokens_sp + in;
  if (sh->q_lora > 0) b += 2 * T * sh->q_lora + 4 * T + 2 * T * sh->q_lora;
  b += 2 * T * (sh->kv_lora + sh->rope_dim) + 4 * T + 2 * T * sh->kv_lora + 2 * T * sh->kv_b_rows;
  return b + 2 * T * (sh->q_width + sh->kv_width) + 2 * T * sh->attn_out + 4 * T * sh->heads;
}

/* RoPE on the query's rope part of every local head and on the one shared key head. */
static void mla_rope(gen *g, mp_variant v) {
  const shapes *sh = &g->sh;
  const int64_t e = sh->tokens * (sh->heads + 1) * sh->rope_dim;
  elementwise(g, MP_KERNEL_ROPE, v, -1, e, FLOPS_ROPE, 4.0 * (double)e);
}

/* The assembly of q and k for the core (forward: read the parts, write the whole; backward:
 * the reverse, the rope key's gradient summed over the heads). */
static void mla_assemble(gen *g, mp_variant v) {
  const shapes *sh = &g->sh;
  const int64_t e = sh->tokens * (sh->q_width + sh->kv_width);
  elementwise(g, MP_KERNEL_COPY, v, -1, e, v == MP_VAR_BWD ? 1.0 : 0.0, 4.0 * (double)e);
}

/* The latent's gradient summed over tp (see the file comment). */
static void latent_all_reduce(gen *g, int module, int64_t width) {
  const shapes *sh = &g->sh;
  if (!sh->tp_opens_mla) return;
  comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_TP, MP_STREAM_COMPUTE,
       (double)g->ms->x_bytes * (double)(sh->tokens * width), g->ms->x_bytes == 4 ? MP_DTYPE_FP32 : MP_DTYPE_BF16,
       module);
}

void mp_sched_mla_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const double T = (double)sh->tokens;
  const int64_t H = sh->d_model;
  mp_sched_tp_region_in_fwd(g, sh->tp > 1, MP_MOD_KV_A, 0);
  if (sh->q_lora > 0) {
    mp_sched_linear_fwd(g, MP_MOD_Q_A, T, sh->q_lora, H, 1);
    mp_sched_norm_fwd(g, MP_MOD_Q_A_NORM, sh->tokens, sh->q_lora);
    mp_sched_linear_fwd(g, MP_MOD_Q_B, T, sh->q_width, sh->q_lora, 1);
  } else {
    mp_sched_linear_fwd(g, MP_MOD_Q, T, sh->q_width, H, 1);
  }
  mp_sched_linear_fwd(g, MP_MOD_KV_A, T, sh->kv_lora + sh->rope_dim, H, 1);
  mp_sched_norm_fwd(g, MP_MOD_KV_A_NORM, sh->tokens, sh->kv_lora);
  mp_sched_linear_fwd(g, MP_MOD_KV_B, T, sh->kv_b_rows, sh->kv_lora, 1);
  mla_rope(g, MP_VAR_FWD);
  mla_assemble(g, MP_VAR_FWD);
}

void mp_sched_mla_up_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const double T = (double)sh->tokens;
  if (sh->q_lora > 0) {
    mp_sched_norm_fwd(g, MP_MOD_Q_A_NORM, sh->tokens, sh->q_lora);
    mp_sched_linear_fwd(g, MP_MOD_Q_B, T, sh->q_width, sh->q_lora, 1);
  }
  mp_sched_norm_fwd(g, MP_MOD_KV_A_NORM, sh->tokens, sh->kv_lora);
  mp_sched_linear_fwd(g, MP_MOD_KV_B, T, sh->kv_b_rows, sh->kv_lora, 1);
  mla_rope(g, MP_VAR_FWD);
  mla_assemble(g, MP_VAR_FWD);
}

int64_t mp_sched_mla_up_saved(const shapes *sh) {
  const int64_t T = sh->tokens;
  int64_t b = 4 * T + 2 * T * sh->kv_lora + 2 * T * sh->kv_b_rows + 2 * T * (sh->q_width + sh->kv_width);
  if (sh->q_lora > 0) b += 4 * T + 2 * T * sh->q_lora;
  return b;
}

void mp_sched_mla_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const double T = (double)sh->tokens;
  const int64_t H = sh->d_model;
  mla_assemble(g, MP_VAR_BWD);
  mla_rope(g, MP_VAR_BWD);
  const int32_t first = g->n_ops, ag = mp_sched_mg_regather(g, sh->tp > 1, MP_MOD_KV_A);
  mp_sched_linear_bwd(g, MP_MOD_KV_B, T, sh->kv_b_rows, sh->kv_lora, 1);
  latent_all_reduce(g, MP_MOD_KV_B, sh->kv_lora + sh->rope_dim);
  mp_sched_norm_bwd(g, MP_MOD_KV_A_NORM, sh->tokens, sh->kv_lora);
  mp_sched_linear_bwd(g, MP_MOD_KV_A, T, sh->kv_lora + sh->rope_dim, H, 1);
  if (sh->q_lora > 0) {
    mp_sched_linear_bwd(g, MP_MOD_Q_B, T, sh->q_width, sh->q_lora, 1);
    latent_all_reduce(g, MP_MOD_Q_B, sh->q_lora);
    mp_sched_norm_bwd(g, MP_MOD_Q_A_NORM, sh->tokens, sh->q_lora);
    mp_sched_linear_bwd(g, MP_MOD_Q_A, T, sh->q_lora, H, 1);
  } else {
    mp_sched_linear_bwd(g, MP_MOD_Q, T, sh->q_width, H, 1);
  }
  mp_sched_mg_regather_wait(g, ag, first);
  mp_sched_tp_region_in_bwd(g, sh->q_lora == 0 && sh->tp_opens_mla, MP_MOD_Q);
}
