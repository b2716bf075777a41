/* Pass 1: tensor parallelism over the tp group (Megatron-style, as torchtitan plans it).
 *
 *   colwise  Shard(0) of [out, in]: attention q/k/v, MLP gate/up, shared-expert gate/up,
 *            the output head; their biases Shard(0) too
 *   rowwise  Shard(1) of [out, in]: attention o, MLP down, shared-expert down; their biases
 *            stay replicated (added once, after the partial sums are reduced)
 *   vocab    tok_embeddings [vocab, H] Shard(0): each rank looks up its vocabulary slice
 *   none     norms, q/k norms, learned positions, the MoE router and routed experts (TP
 *            plans skip the MoE mlp names; experts are EP's business)
 *
 * Multi-head latent attention (torchtitan's deepseek_v3 parallelize): the up projections
 * q_b_proj (or q_proj without a q latent) and kv_b_proj colwise, their output heads split;
 * o_proj rowwise; the down projections q_a_proj and kv_a_proj_with_mqa and the two latent
 * norms replicated (every tp rank needs the whole latents, and the shared RoPE key head, to
 * decompress its heads). With sequence parallelism the all-gather of the normed input comes
 * before the replicated down projections, which then run on the whole sequence on every
 * rank.
 *
 * Output head: the weight is colwise either way (vocab rows split over tp). With
 * shard_logits=1 the logits stay vocab-sharded and the loss is computed in parallel;
 * with shard_logits=0 the logits are all-gathered over tp before the loss (each rank
 * holds [B, S, vocab]). The choice is recorded on the plan (opts.tp) and in a note.
 *
 * Checks (exec/rules.h, mp_rule_tp_check): tp divides n_heads (under MLA the heads kv_b_proj
 * decompresses), n_kv_heads, d_ff (when a dense MLP exists), d_model, d_ff_shared (when
 * shared experts exist) and vocab; vocab may instead be padded up to a multiple of tp
 * (pad_vocab=1), which enlarges tok_embeddings and output and is noted. */
#include <stdio.h>
#include <string.h>

#include "exec/plan.h"
#include "exec/rules.h"

static void shard(mp_param *prm, mp_tp_style style, int dim, int tp) {
  prm->tp_style = style;
  prm->place[MP_AXIS_TP].kind = MP_PLACEMENT_SHARD;
  prm->place[MP_AXIS_TP].dim = (int8_t)dim;
  prm->tp_shape[dim] = prm->shape[dim] / tp;
}

/* Every parameter's TP placement (the file comment), the vocabulary rows padded. */
static void shard_params(mp_plan *p, int tp) {
  for (int i = 0; i < p->n_params; i++) {
    mp_param *prm = &p->params[i];
    if (prm->module == MP_MOD_TOK_EMBEDDINGS || prm->module == MP_MOD_OUTPUT) {
      prm->shape[0] = p->vocab_padded;
      prm->tp_shape[0] = p->vocab_padded;
    }
    if (tp == 1) continue; /* the pass is a no-op on shapes; recorded as applied */
    switch (prm->module) {
      case MP_MOD_TOK_EMBEDDINGS: shard(prm, MP_TP_VOCAB, 0, tp); break;
      case MP_MOD_Q:
      case MP_MOD_K:
      case MP_MOD_V:
      case MP_MOD_Q_B:
      case MP_MOD_KV_B:
      case MP_MOD_GATE:
      case MP_MOD_UP:
      case MP_MOD_SHARED_GATE:
      case MP_MOD_SHARED_UP:
      case MP_MOD_OUTPUT:
      case MP_MOD_MTP_EH_PROJ: /* Megatron-Core's column-parallel eh_proj */
      /* the Mamba-2 mixer's heads and groups split over tp (MambaMixer, mamba_mixer.py at
       * core_v0.14.0: nheads_local_tp, ngroups_local_tp): in_proj column-parallel, conv1d's
       * channels, dt_bias, A_log, D and the gated norm's weight with them */
      case MP_MOD_MAMBA_IN:
      case MP_MOD_MAMBA_CONV:
      case MP_MOD_MAMBA_DT_BIAS:
      case MP_MOD_MAMBA_A_LOG:
      case MP_MOD_MAMBA_D:
      case MP_MOD_MAMBA_NORM:
        shard(prm, MP_TP_COLWISE, 0, tp); /* weight [out, in] and bias [out]: dim 0 */
        break;
      case MP_MOD_O:
      case MP_MOD_DOWN:
      case MP_MOD_SHARED_DOWN:
      case MP_MOD_MAMBA_OUT: /* row-parallel out_proj */
        if (prm->role == MP_ROLE_WEIGHT) shard(prm, MP_TP_ROWWISE, 1, tp);
        break;
      default: break; /* norms, positions, router, routed experts, MLA's down projections and
                         latent norms: replicated over tp */
    }
  }
}

/* The MoE words of the TP note: the routed experts are left to the EP pass, which splits
 * them over their own expert-TP group where the mesh gives etp > 1 (exec/pass_ep.c). */
static const char *moe_words(const mp_plan *p) {
  if (!mp_model_is_moe(&p->model)) return "";
  return p->mesh.etp > 1 ? " and MoE router (the routed experts split over etp by EP)"
                         : ", MoE router and routed experts (skipped)";
}

/* What the pass did, in the plan's notes. */
static void note_tp(mp_plan *p, const mp_tp_options *o, int tp, int64_t vocab) {
  if (tp > 1 && mp_model_is_mla(&p->model))
    mp_plan_note(p,
                 "TP: tp=%d: %s, kv_b_proj, gate/up%s and output colwise (%lld heads per rank); "
                 "o and down rowwise; tok_embeddings vocab-parallel; %skv_a_proj_with_mqa, the "
                 "latent norms, norms%s replicated (the latents run whole on every rank; their "
                 "gradients are all-reduced over tp in backward)",
                 tp, p->model.q_lora_rank > 0 ? "q_b_proj" : "q_proj",
                 p->model.n_shared_experts > 0 ? ", shared-expert gate/up" : "",
                 (long long)(p->model.n_heads / tp), p->model.q_lora_rank > 0 ? "q_a_proj, " : "",
                 moe_words(p));
  else if (tp > 1)
    mp_plan_note(p,
                 "TP: tp=%d: q/k/v, gate/up%s and output colwise; o and down rowwise; "
                 "tok_embeddings vocab-parallel; norms%s replicated",
                 tp, p->model.n_shared_experts > 0 ? ", shared-expert gate/up" : "",
                 moe_words(p));
  if (tp > 1 && mp_model_n_layers_of(&p->model, MP_LAYER_MAMBA) > 0)
    mp_plan_note(p, "TP: Mamba-2 layers: %lld heads and %lld groups per rank (Megatron-Core's MambaMixer): "
                    "in_proj, conv1d, dt_bias, A_log, D and the gated norm colwise, out_proj rowwise",
                 (long long)(p->model.mamba_num_heads / tp), (long long)(p->model.n_groups / tp));
  if (tp > 1) {
    if (p->opts.sp == 1)
      mp_plan_note(p, "TP: sequence parallel: norms, residual adds and the embedding's output on "
                      "each rank's 1/%d of the sequence; an all-gather into and a reduce-scatter "
                      "out of every TP region instead of its all-reduce",
                   tp);
    else
      mp_plan_note(p, "TP: no sequence parallelism: activations replicated over tp, every TP "
                      "region closed by an all-reduce");
    if (p->opts.sp == 1 && p->opts.tp_comm_fused)
      mp_plan_note(p, "TP: %s: the all-gathers into q/k/v and gate/up and the "
                      "reduce-scatters out of o and down (and in backward the output-gradient "
                      "all-gathers into o's and down's input-gradient GEMMs) run in %d chunks "
                      "beside those GEMMs",
                   p->opts.mem_model == MP_MEM_MODEL_MEGATRON
                       ? "tp comm overlap (Transformer Engine's userbuffers)"
                       : "AsyncTP",
                   tp);
    if (p->model.tied_embeddings)
      mp_plan_note(p, "TP: output head tied to tok_embeddings: it uses the vocab-sharded "
                      "embedding as a colwise head");
    mp_plan_note(p,
                 o->shard_logits
                     ? "TP: logits stay vocab-sharded over tp (loss parallel)"
                     : "TP: logits all-gathered over tp before the loss (replicated logits, "
                       "[B, S, vocab] on every rank)");
  }
  if (p->vocab_padded != vocab)
    mp_plan_note(p, "TP: vocab %lld padded to %lld for tp=%d (%lld unused rows in "
                    "tok_embeddings%s)",
                 (long long)vocab, (long long)p->vocab_padded, tp,
                 (long long)(p->vocab_padded - vocab),
                 p->model.tied_embeddings ? "" : " and output");
}

mp_status mp_apply_tensor_parallel(mp_ctx *ctx, mp_plan *p, const mp_tp_options *o) {
  if (p->applied & MP_PASS_FSDP)
    return mp_error(ctx, MP_ERR_ORDER,
                    "TP after FSDP: FSDP has already replaced the Linear weights by sharded "
                    "parameters, so TP would match no Linear; the run would be data-parallel "
                    "only with wrong gradients; apply TP before FSDP");
  MP_CHECK(mp_plan_check_pass(ctx, p, MP_PASS_TP));
  mp_tp_options def = {1, 0};
  if (o == NULL) o = &def;
  const int tp = p->mesh.size[MP_DIM_TP];
  MP_CHECK(mp_rule_tp_check(ctx, &p->model, tp, o->pad_vocab));

  const int64_t vocab = p->model.vocab;
  p->vocab_padded = (vocab + tp - 1) / tp * tp;
  p->opts.tp = *o;

  shard_params(p, tp);

  note_tp(p, o, tp, vocab);
  mp_plan_mark_applied(p, MP_PASS_TP);
  return MP_OK;
}
