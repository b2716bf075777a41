/* Step schedule builder: the multi-token-prediction (MTP) modules on the last pipeline stage
 * (DeepSeek-V3, arXiv 2412.19437 sec. 2.2; Megatron-Core's MultiTokenPredictionLayer,
 * megatron/core/transformer/multi_token_prediction.py at core_v0.14.0). The builder's
 * overview: schedule.c; the FLOP and byte conventions: schedule_ops.c.
 *
 * Module k (block layer n_layers + k) after the trunk, forward:
 *   the token ids (and positions) rolled one place left (roll_tensor: under context
 *   parallelism each rank's boundary token comes from its ring neighbour), looked up in the
 *   embedding (the last stage's copy, or the one it shares); enorm on that embedding, hnorm on
 *   the previous depth's hidden state (the trunk's output for k = 0); the two concatenated to
 *   [T, 2H] and projected by eh_proj [H, 2H]; one block; the module's final norm, the shared
 *   output head and a second cross-entropy loss (weighted by lambda, a scalar folded into
 *   the loss's gradient). Megatron runs the MTP heads and losses before the main head's
 *   (gpt_model.py's _postprocess), so every depth's logits state and the main one's are held
 *   together until the backward.
 * Backward mirrors it: the module's head and loss, its block, eh_proj, the concat's halves
 * through the two norms, hnorm's input gradient added into the trunk's output gradient and
 * enorm's scattered into the embedding's gradient.
 *
 * Under tensor parallelism eh_proj is column-parallel with its output gathered
 * (gather_from_tensor_model_parallel_region: an all-gather of [T, H / tp] to [T, H]) and,
 * under SP, its input [Ts, 2H] all-gathered to [T, 2H] first and its output split back to
 * [Ts, H] (scatter_to_sequence_parallel_region, no communication); backward, the split's
 * gradient all-gathered (SP), the gather's split, and the input gradient's partial sums
 * reduce-scattered (SP) or all-reduced over tp.
 *
 * Memory of the input side (ACTIVATIONS, BUF_ACT_MTP_IN): the embedding output enorm saves
 * [Ts, H] bf16 and both norms' fp32 statistics [Ts]; eh_proj's input [Ts, 2H], bf16 or, under
 * DeepSeek-V3's float8 activation cache, E4M3 with a scale per 128 (under SP gathered, or
 * kept on the shard and gathered again in backward where the stack does so); hnorm's input
 * is the trunk's output, which the main head keeps already. Under full AC of the module's
 * block, Megatron-Core checkpoints the input side with the block (_checkpointed_forward of
 * _proj_and_transformer_layer): the embedding output is kept and the norms, the concat and
 * eh_proj run again in the backward (here just before eh_proj's backward, BUF_RC_MTP_IN
 * holding what they recompute until the side's backward is done). */
#include "exec/schedule_internal.h"

static void eh_tp_comm(gen *g, mp_coll c, int64_t width);

static int full_ac(const gen *g) { return mp_plan_layer_ac(g->p, g->layer) == MP_AC_FULL; }

/* The input side's saved bytes beside the embedding output (the file comment). */
static int64_t mtp_in_rest_bytes(const gen *g) {
  const shapes *sh = &g->sh;
  /* eh_proj's input: under SP the gathered [T, 2H], or the shard where the stack gathers it
   * again in backward (Megatron) */
  const int64_t in = 2 * (sh->sp && !g->ms->sp_regathers ? sh->tokens : sh->tokens_sp) * sh->d_model;
  const int cached = g->p->opts.fp8_act_cache && sh->fp8[MP_MOD_MTP_EH_PROJ];
  const int64_t eh_in = cached ? in + in * 4 / 128 : 2 * in;
  return 2 * 4 * sh->tokens_sp + eh_in;
}

/* The norms, the concat and eh_proj (with its TP gathers), forward or recomputed. */
static void in_side_ops(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t Ts = sh->tokens_sp, H = sh->d_model;
  mp_sched_norm_fwd(g, MP_MOD_MTP_ENORM, Ts, H);
  mp_sched_norm_fwd(g, MP_MOD_MTP_HNORM, Ts, H);
  elementwise(g, MP_KERNEL_COPY, MP_VAR_FWD, MP_MOD_MTP_EH_PROJ, 2 * Ts * H, 0.0, 8.0 * (double)(Ts * H));
  if (sh->sp) eh_tp_comm(g, MP_COLL_ALL_GATHER, 2 * H);
  mp_sched_linear_fwd(g, MP_MOD_MTP_EH_PROJ, (double)sh->tokens, H / sh->tp, 2 * H, 1);
  if (sh->tp > 1) eh_tp_comm(g, MP_COLL_ALL_GATHER, H);
}

/* roll_tensor under context parallelism: the token ids and the position ids each shifted
 * one place along the ring of cp ranks, every rank sending its chunks' first elements (two
 * chunks a sequence under the load-balanced layout, int64 each) to its neighbour. */
static void mtp_roll(gen *g) {
  const shapes *sh = &g->sh;
  if (sh->cp <= 1) return;
  const double micro_batch = (double)sh->tokens * sh->cp / (double)sh->seq;
  for (int i = 0; i < 2; i++) {
    const int32_t c = comm(g, MP_COLL_SENDRECV, MP_GROUP_CP, MP_STREAM_COMPUTE, 2.0 * 8.0 * micro_batch,
                           MP_DTYPE_FP32, MP_MOD_TOK_EMBEDDINGS);
    if (c >= 0) g->ops[c].peer = MP_PEER_NEXT;
  }
}

/* eh_proj's TP collective c of a [T, width] bf16 tensor (the payload convention: schedule.h). */
static void eh_tp_comm(gen *g, mp_coll c, int64_t width) {
  comm(g, c, MP_GROUP_TP, MP_STREAM_COMPUTE, 2.0 * (double)(g->sh.tokens * width), MP_DTYPE_BF16,
       MP_MOD_MTP_EH_PROJ);
}

/* The module's input side, forward: the first ops of its block's forward segment (after its
 * units' gathers: the block's first unit holds eh_proj and the norms), so the input side
 * waits for them as the block does. */
void mp_sched_mtp_in_fwd(gen *g) {
  const int64_t TH = g->sh.tokens_sp * g->sh.d_model;
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_MTP_IN, 2 * TH + (full_ac(g) ? 0 : mtp_in_rest_bytes(g)), 1);
  mtp_roll(g);
  mp_sched_embedding_fwd(g);
  in_side_ops(g);
}

/* The module's input side, backward (the file comment): in its block's backward segment
 * after the block's own ops, before its units are freed and their gradients reduced. */
void mp_sched_mtp_in_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t Ts = sh->tokens_sp, H = sh->d_model;
  const int full = full_ac(g);
  if (full) {
    g->phase = MP_PHASE_RECOMPUTE;
    pair(g, MP_MEM_ACTIVATIONS, BUF_RC_MTP_IN, mtp_in_rest_bytes(g), 1);
    in_side_ops(g);
    g->phase = MP_PHASE_BACKWARD;
  }
  if (sh->sp) eh_tp_comm(g, MP_COLL_ALL_GATHER, H);
  if (sh->sp && g->ms->sp_regathers) eh_tp_comm(g, MP_COLL_ALL_GATHER, 2 * H); /* its saved input */
  mp_sched_linear_bwd(g, MP_MOD_MTP_EH_PROJ, (double)sh->tokens, H / sh->tp, 2 * H, 1);
  if (sh->tp > 1) eh_tp_comm(g, sh->sp ? MP_COLL_REDUCE_SCATTER : MP_COLL_ALL_REDUCE, 2 * H);
  mp_sched_norm_bwd(g, MP_MOD_MTP_HNORM, Ts, H);
  mp_sched_residual(g, MP_VAR_BWD, Ts * H); /* into the previous depth's output gradient */
  mp_sched_norm_bwd(g, MP_MOD_MTP_ENORM, Ts, H);
  mp_sched_embedding_bwd(g);
  if (full) pair(g, MP_MEM_ACTIVATIONS, BUF_RC_MTP_IN, mtp_in_rest_bytes(g), 0);
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_MTP_IN, 2 * Ts * H + (full ? 0 : mtp_in_rest_bytes(g)), 0);
}

/* Module layer's head and loss, forward and backward, in their own segments. */
void mp_sched_mtp_head_fwd(gen *g, int32_t layer) {
  mp_sched_seg_open(g, MP_PHASE_FORWARD, layer, 0);
  mp_sched_head_norm_fwd(g, MP_MOD_MTP_NORM);
  mp_sched_seg_close(g, MP_PHASE_FORWARD, 1, 0, 0);
}

void mp_sched_mtp_head_bwd(gen *g, int32_t layer) {
  mp_sched_seg_open(g, MP_PHASE_BACKWARD, layer, 0);
  mp_sched_head_norm_bwd(g, MP_MOD_MTP_NORM);
  mp_sched_seg_close(g, MP_PHASE_BACKWARD, 1, 0, 0);
}
