/* Step schedule builder: what a block saves for its backward under each activation
 * checkpointing policy, and what its backward recomputes (the builder's overview:
 * schedule.c). The torchtitan and the Megatron-LM memory models here (block_act_mg has
 * the latter's list); the meshplan runtimes' in schedule_rt.c.
 *
 * The torchtitan model (PyTorch eager autograd under torchtitan's parallelisms): a block's
 * forward saves the tensors its ops save for backward. Per op, T tokens of the micro-batch
 * on the rank, Ts = T / tp under sequence parallelism (else T), tp-local sizes q = heads_l
 * x hd, kv = kv_heads_l x hd, f = d_ff / tp, nh heads_l, st = 4 bytes of RMSNorm statistics
 * per token (rstd; 8 for LayerNorm: mean, rstd), bf16 tensors (2 bytes):
 *   attention_norm     its input x [Ts, H] 2TsH (the block input) and st Ts
 *   q/k/v              their input, the normed x (all-gathered to [T, H] under SP) 2TH
 *   q/k norms (Qwen3)  their inputs 2T(q + kv) and rstd 4T(nh + nkv)
 *   RoPE               nothing per token (the rotation table is a constant)
 *   attention (flash)  q, k (after RoPE), v 2T(q + 2kv), output 2Tq, log-sum-exp 4T nh
 *   o_proj             its input: the attention output, already counted
 *   residual adds      nothing
 *   ffn_norm           its input h [Ts, H] 2TsH and st Ts
 *   gate/up (llama)    their input, the normed h 2TH; silu saves gate, the product saves
 *                      silu(gate) and up, down saves the product: 4 x 2Tf
 *   up/down (gpt,      the normed h 2TH; the activation (GELU; squared ReLU, whose relu
 *   Nemotron-4)        saves its output, the square's input) saves up's output, down its
 *                      input: 2 x 2Tf
 *   MoE                h 2TsH + st Ts, normed h 2TH; router probabilities (fp32) 4TE; top-k
 *                      weights and indices 12 R; dispatched tokens 2 R H; the experts' gate,
 *                      up, silu, product 4 x 2 R f_e; expert outputs in token order 2 R H;
 *                      shared expert 4 x 2 T f_s. R = Tr top_k routed rows, Tr the tokens
 *                      the rank routes: T, or T / tp under the expert grid (etp 1), where
 *                      each TP rank dispatches its own sequence shard (Megatron-Core's
 *                      token dispatcher; the rows the expert GEMMs run, schedule_block.c).
 *                      The dispatched rows and the experts' tensors are the slowest EP
 *                      rank's: x its load under an imbalance or a capacity (schedule_prep.c,
 *                      mp_sched_moe_rows). Where Megatron-Core's MoE layer routes the rank's
 *                      SP shard itself (shapes.moe_on_shard) the router scores Tr tokens,
 *                      not T: probabilities 4 Tr E, and without a shared expert (whose
 *                      Linears gather the sequence) the normed h 2 Tr H
 * These group into the block input X (2TsH), the attention part A and the MLP part M; the
 * policies keep:
 *   none            X + A + M
 *   selective       the Attention module (KempnerForge wraps `attention`): X, attention_norm's
 *                   statistics st Ts and the module's input, the normed x on [Ts, H] (the
 *                   all-gather runs inside the module), 2TsH; M. The module's forward (its
 *                   all-gather, q/k/v, RoPE, core, o_proj and its reduce-scatter or
 *                   all-reduce) is recomputed before the attention's backward.
 *   selective-op    torchtitan's op-level SAC (torchtitan/distributed/activation_checkpoint.py,
 *                   _save_list): the block input (the checkpoint's input) and the outputs of
 *                   mm, flash attention and reduce_scatter_tensor, except every second mm
 *                   counted in forward order within the block. Llama's mm order q #1, k #2,
 *                   v #3, o #4, gate (w1) #5, up (w3) #6, down (w2) #7 keeps q before RoPE
 *                   2Tq, v 2T kv, gate 2Tf and down's output 2TH; the attention output and
 *                   log-sum-exp 2Tq + 4T nh; under SP the two reduce-scatter outputs 2 x
 *                   2TsH. GPT: q #1, k #2, v #3, o #4, up #5, down #6: q, v, up's output 2Tf.
 *                   MoE: q #1 .. o #4, router #5 (its [T, E] logits 2TE), shared gate #6,
 *                   shared up #7 (2T f_s), shared down #8; grouped expert GEMMs are not mm
 *                   and are recomputed. The whole block is recomputed at the start of its
 *                   backward (non-reentrant checkpoint), the saved ops' outputs reused: the
 *                   recompute runs everything else, collectives included (the all-gathers,
 *                   and without SP the all-reduces).
 *   selective-core  Megatron-LM's selective recompute (Korthikanti et al. 2022): the core
 *                   attention recomputed from the saved q, k, v before the attention's
 *                   backward; with flash attention what it does not keep is the log-sum-exp
 *                   4T nh (its output is o_proj's input, kept)
 * Multi-head latent attention's attention part A is schedule_mla.c's list (its latents, q,
 * k, v and output); the policies keep of it what they keep of q/k/v attention's (selective:
 * the normed input; selective-core: all but the log-sum-exp; full: nothing); selective-op
 * keeps the outputs of its odd-numbered matmuls (schedule_mla.c), and with a query latent
 * (five matmuls) the MLP's even-numbered ones.
 *   full            X only; the whole block (collectives included) recomputed at the start
 *                   of its backward
 * Kept tensors a compiler cannot rematerialize (a checkpoint's input, an op-level policy's
 * forced saves) are flagged MP_MEM_KEPT, so the stack's saved_act_factor (torch.compile's
 * partitioner recomputing element-wise outputs) leaves them alone.
 *
 * For GPT with tp=1 and no AC (f = 4H): 2 + 2 + 6 + 2 + 2 + 2 + 2 x 8 = 32 sbh bytes plus
 * 4 a s b (log-sum-exp) and 16 sb (LayerNorm statistics). Korthikanti et al. 2022 count
 * 34 sbh + 5 a s^2 b with two dropout masks (2 sbh, no dropout here) and the materialized
 * attention scores, which flash attention replaces by the log-sum-exp.
 *
 * Backward holds a TEMP workspace for activation gradients, 2 x 2TH (the residual stream's
 * and the current input's) plus the MLP's largest set (SwiGLU 3 x 2Tf, up/down 2 x 2Tf, MoE 3 x
 * 2 R f_e + 2 R H). */
#include "exec/schedule_internal.h"

/* ---- the torchtitan model's tensors (see above) ---------------------------------------- */

static int64_t stat_bytes(const shapes *sh) { return sh->layernorm ? 8 : 4; }

/* A: everything the attention part saves without AC. */
static int64_t attn_all(const shapes *sh) {
  const int64_t T = sh->tokens;
  if (sh->mla) return mp_sched_mla_attn_saved(sh, 2 * T * sh->d_model); /* schedule_mla.c's list */
  int64_t b = stat_bytes(sh) * sh->tokens_sp + 2 * T * sh->d_model + 2 * T * (sh->q_width + 2 * sh->kv_width) +
              2 * T * sh->q_width + 4 * T * sh->heads;
  if (sh->qk_norm) b += 2 * T * (sh->q_width + sh->kv_width) + 4 * T * (sh->heads + sh->kv_heads);
  return b;
}

/* Bytes of the expert side (the dispatched rows and what the experts make of them), sized
 * by the rows the slowest EP rank receives: x_balanced x its load (mp_sched_moe_rows). */
static int64_t received(const shapes *sh, int64_t x_balanced) {
  x_balanced *= sh->etp_rows; /* the rows its expert-TP group gathers (schedule_ops.c) */
  return sh->moe_load == 1.0 ? x_balanced : llround((double)x_balanced * sh->moe_load);
}

/* M: everything the MLP part saves without AC. */
static int64_t mlp_all(const shapes *sh, int kind) {
  const int64_t T = sh->tokens;
  /* the normed h the MLP reads: [Tr, H] where the MoE layer routes the shard itself and no
   * shared expert gathers it (see the file comment) */
  const int64_t Tn = kind != KIND_DENSE && sh->moe_on_shard && !sh->has_shared ? sh->router_tokens : T;
  int64_t b = 2 * sh->tokens_sp * sh->d_model + stat_bytes(sh) * sh->tokens_sp + 2 * Tn * sh->d_model;
  if (kind == KIND_DENSE) return b + (sh->gated ? 4 : 2) * 2 * T * sh->d_ff;
  const int64_t R = sh->moe_tokens * sh->top_k; /* the routed rows (see the file comment) */
  b += 4 * sh->router_tokens * sh->experts + 12 * R +
       received(sh, 2 * R * sh->d_model + 4 * 2 * R * sh->d_ff_expert) + 2 * R * sh->d_model;
  if (sh->has_shared) b += 4 * 2 * T * sh->d_ff_shared;
  return b;
}

static int64_t bwd_workspace(const shapes *sh, int kind) {
  const int64_t T = kind != KIND_DENSE && sh->moe_on_shard && !sh->has_shared ? sh->router_tokens : sh->tokens;
  int64_t b = 2 * 2 * T * sh->d_model;
  if (kind == KIND_DENSE) return b + (sh->gated ? 3 : 2) * 2 * T * sh->d_ff;
  const int64_t R = sh->moe_tokens * sh->top_k;
  return b + received(sh, 3 * 2 * R * sh->d_ff_expert + 2 * R * sh->d_model);
}

/* A block's saved bytes under one policy: the block input, what each part keeps past its
 * forward, and what the recompute allocates again (see the file comment). */
typedef struct block_act {
  int64_t x;                 /* the block input [Ts, H] */
  int64_t attn, mlp;         /* kept past the part's forward */
  int64_t attn_tmp, mlp_tmp; /* saved without AC, dropped after the part's forward */
  int64_t rc_attn, rc_mlp;   /* allocated by the recompute */
  int kept;                  /* the parts' kept tensors are forced saves (MP_MEM_KEPT) */
  int rc_first;              /* the recompute runs at the start of the backward (whole
                                block), else right before the attention's backward */
  int mlp_whole;             /* the MLP part is checkpointed whole (recompute module mlp on a
                                dense block, moe on a MoE block): its input kept */
  uint64_t skip;             /* what the recompute does not run */
  int64_t off_attn, off_mlp; /* CPU offloading: what the layer copies to the host of its input
                                and attention part, of its MLP part (offload_act) */
} block_act;

/* Selective-op's forced saves of the MLP part (see the file comment); `shifted`: the
 * attention ran an odd number of mm (MLA with a query latent: five), so the MLP's saved
 * matmuls are the other ones: up #7 of a dense llama MLP; shared gate #7 and shared down #9
 * of an MoE block. */
static void op_sac_mlp(const shapes *sh, int kind, int shifted, int64_t *keep, int64_t *in_all,
                       uint64_t *skip) {
  const int64_t T = sh->tokens, rs = sh->sp ? 2 * sh->tokens_sp * sh->d_model : 0;
  if (shifted && kind == KIND_MOE) {
    *keep = (sh->has_shared ? 2 * T * sh->d_ff_shared + 2 * T * sh->d_model : 0) + rs;
    *in_all = sh->has_shared ? 2 * T * sh->d_ff_shared : 0; /* shared gate is silu's saved input */
    if (sh->has_shared) *skip |= SKIP_MOD(MP_MOD_SHARED_GATE) | SKIP_MOD(MP_MOD_SHARED_DOWN);
  } else if (shifted) {
    *keep = 2 * T * sh->d_ff + rs; /* up #7, saved by the product */
    *in_all = 2 * T * sh->d_ff;
    *skip |= SKIP_MOD(MP_MOD_UP);
  } else if (kind == KIND_MOE) {
    /* router #5 (its logits), shared up #7 */
    *keep = 2 * T * sh->experts + (sh->has_shared ? 2 * T * sh->d_ff_shared : 0) + rs;
    *in_all = sh->has_shared ? 2 * T * sh->d_ff_shared : 0;
    *skip |= SKIP_MOD(MP_MOD_ROUTER) | SKIP_MOD(MP_MOD_SHARED_UP);
  } else if (!sh->gated) {
    *keep = 2 * T * sh->d_ff; /* up #5: the activation's input */
    *in_all = *keep;
    *skip |= SKIP_MOD(MP_MOD_UP);
  } else {
    *keep = 2 * T * sh->d_ff + 2 * T * sh->d_model + rs; /* gate #5, down #7 */
    *in_all = 2 * T * sh->d_ff;                    /* gate is silu's saved input */
    *skip |= SKIP_MOD(MP_MOD_GATE) | SKIP_MOD(MP_MOD_DOWN);
  }
}

static void block_act_tt(const shapes *sh, int kind, mp_ac_mode ac, block_act *a) {
  memset(a, 0, sizeof *a);
  const int64_t T = sh->tokens, A = attn_all(sh), M = mlp_all(sh, kind);
  const int64_t core = 2 * T * sh->attn_out + 4 * T * sh->heads;
  a->x = 2 * sh->tokens_sp * sh->d_model;
  a->attn = A;
  a->mlp = M;
  switch (ac) {
    case MP_AC_NONE: break;
    case MP_AC_SELECTIVE: {
      const int64_t in = stat_bytes(sh) * sh->tokens_sp + 2 * sh->tokens_sp * sh->d_model;
      a->attn = in;
      a->attn_tmp = A - in;
      a->rc_attn = A - stat_bytes(sh) * sh->tokens_sp;
      a->kept = 1;
      a->skip = SKIP_MOD(MP_MOD_ATTN_NORM) | SKIP_RESIDUAL;
      break;
    }
    case MP_AC_SELECTIVE_OP: {
      const int64_t rs = sh->sp ? 2 * sh->tokens_sp * sh->d_model : 0;
      int64_t mk = 0, m_in_all = 0;
      a->skip = SKIP_CORE | SKIP_RS;
      op_sac_mlp(sh, kind, sh->mla && sh->q_lora > 0, &mk, &m_in_all, &a->skip);
      if (sh->mla) { /* schedule_mla.c's matmuls */
        int64_t in_a = 0;
        a->attn = mp_sched_mla_op_sac(sh, &in_a, &a->skip) + core + rs;
        a->attn_tmp = A - (in_a + core);
      } else {
        a->skip |= SKIP_MOD(MP_MOD_Q) | SKIP_MOD(MP_MOD_V);
        a->attn = 2 * T * sh->q_width + 2 * T * sh->kv_width + core + rs;
        a->attn_tmp = A - (2 * T * sh->kv_width + core);
      }
      a->rc_attn = a->attn_tmp;
      a->mlp = mk;
      a->mlp_tmp = M - m_in_all;
      a->rc_mlp = a->mlp_tmp;
      a->kept = 1;
      a->rc_first = 1;
      break;
    }
    case MP_AC_SELECTIVE_CORE:
      a->attn = A - 4 * T * sh->heads;
      a->attn_tmp = 4 * T * sh->heads;
      a->rc_attn = core;
      break;
    case MP_AC_FULL:
      a->attn = a->mlp = 0;
      a->attn_tmp = a->rc_attn = A;
      a->mlp_tmp = a->rc_mlp = M;
      a->rc_first = 1;
      break;
    default: break;
  }
}

/* ---- the megatron model's tensors ----------------------------------------------------- */

/* Megatron-LM's saved tensors per block (Korthikanti et al. 2022, section 4.1, with their
 * names; T tokens, Ts = T/tp under SP, a = heads_l, s = seq, bf16/fp16 2 bytes, masks 1):
 *   LayerNorm 1 input          2TsH + 8Ts (the block input and LayerNorm's mean and rstd)
 *   QKV input                  2TsH under SP (re-gathered in backward), else 2TH
 *   Q, K / V                   2T(q + kv) / 2T kv
 *   core attention             materialized: softmax output 2 a s T, and for GPT its
 *                              dropout mask a s T and output 2 a s T; flash: the log-sum-exp
 *                              4 T a
 *   context (proj input)       2Tq
 *   hidden dropout mask (GPT)  Ts H
 *   LayerNorm 2 input          2TsH + 8Ts
 *   MLP input                  2TsH under SP, else 2TH
 *   GeLU input, output         2 x 2Tf (SwiGLU: gate, up, silu, product 4 x 2Tf)
 *   hidden dropout mask (GPT)  Ts H
 * Megatron-Core's Transformer Engine spec (shapes te_spec) fuses the SwiGLU: bias_swiglu_impl
 * (megatron/core/fusions/fused_bias_swiglu.py, core_v0.14.0; bias_activation_fusion, on by
 * default: --no-bias-swiglu-fusion) saves only its input, fc1's output [T, 2f], and fc2
 * (TERowParallelLinear) its input [T, f]: 3 x 2Tf. GeLU's bias_gelu_impl saves fc1's output
 * and fc2 its input, the same 2 x 2Tf. q, k, v, the output and the softmax statistics of TE's
 * fused attention (v a contiguous copy beside the RoPE'd q and k, whose layout get_qkv_layout
 * finds not_supported, dot_product_attention/utils.py at TE v2.8; without RoPE views of
 * linear_qkv's output, the same bytes), the norms' inputs and statistics (the norms fused into linear_qkv and
 * linear_fc1, TELayerNormColumnParallelLinear, which saves the norm's input, ln_out, mu and
 * rsigma) and the GPT masks (--hidden-dropout 0.1 by default; with 0 torch's dropout returns
 * its input and saves nothing, the Llama-family count) are the list's.
 * For GPT (f = 4H, LayerNorm statistics aside) the sum is sbh(10 + 24/t + 5as/(ht))
 * without SP and sbh(34/t + 5as/(ht)) with it, Korthikanti et al.'s Table 2 (tested).
 * selective-core drops the core attention's scores (recomputed from the saved Q, K, V
 * before the attention's backward, with the context again); full keeps the block input.
 * A MoE MLP saves the torchtitan model's list less the expert outputs in token order
 * (2 R H): Megatron-Core weights each routed row by its router probability inside the
 * experts' activation (megatron/core/transformer/moe/experts.py, activation_func_with_probs,
 * core_v0.14) and its combine is an unweighted unpermute (token_dispatcher.py, unpermute
 * without probs; DeepEP's combine likewise), whose backward reads no saved tensor. */
static int64_t mg_act_tf(const shapes *sh);
static void block_act_mg(const shapes *sh, int kind, mp_ac_mode ac, int materialized, int64_t core_more,
                         block_act *a) {
  memset(a, 0, sizeof *a);
  const int64_t T = sh->tokens, Ts = sh->tokens_sp, H = sh->d_model, st = stat_bytes(sh), drop = sh->gpt;
  const int64_t in = sh->sp ? 2 * Ts * H : 2 * T * H;
  const int64_t sT = sh->seq * T;
  const int64_t core = (materialized ? 2 * sh->heads * sT + drop * 3 * sh->heads * sT : 4 * T * sh->heads) + core_more;
  int64_t A = st * Ts + in + 2 * T * (sh->q_width + sh->kv_width) + 2 * T * sh->kv_width + core + 2 * T * sh->q_width +
              drop * Ts * H;
  if (sh->qk_norm) A += 2 * T * (sh->q_width + sh->kv_width) + 4 * T * (sh->heads + sh->kv_heads);
  if (sh->mla) /* Megatron-LM's MLA saves what torchtitan's does, its input SP-sharded */
    A = mp_sched_mla_attn_saved(sh, in) - 4 * T * sh->heads + core;
  int64_t M;
  if (kind == KIND_DENSE)
    M = 2 * Ts * H + st * Ts + in + mg_act_tf(sh) * 2 * T * sh->d_ff + drop * Ts * H;
  else
    M = mlp_all(sh, kind) - 2 * sh->moe_tokens * sh->top_k * H; /* no combine input (above) */
  a->x = 2 * Ts * H;
  a->attn = A;
  a->mlp = M;
  if (ac == MP_AC_SELECTIVE_CORE) {
    a->attn = A - core;
    a->attn_tmp = core;
    a->rc_attn = core + 2 * T * sh->attn_out;
  } else if (ac == MP_AC_FULL) {
    a->attn = a->mlp = 0;
    a->attn_tmp = a->rc_attn = A;
    a->mlp_tmp = a->rc_mlp = M;
    a->rc_first = 1;
  }
}

/* How many [T, f] bf16 tensors a dense MLP's activation and fc2 save under the megatron model
 * (block_act_mg's list): GeLU 2, SwiGLU 4, SwiGLU fused under the TE spec 3; fc2's input is
 * one of them. */
static int64_t mg_act_tf(const shapes *sh) { return sh->gated ? (sh->te_spec ? 3 : 4) : 2; }

static void modules_act(const gen *g, int kind, block_act *a);

/* Whether the layernorm recompute module drops a part's normed input (attn: the attention's,
 * else the MLP's of a `kind` block). Megatron-Core recomputes only a norm that is a module of
 * its own (transformer_layer.py at core_v0.14.0: recompute_input_layernorm and
 * recompute_pre_mlp_layernorm are set only where the norm is not an IdentityOp); under its TE
 * spec (gpt_layer_specs.py get_gpt_layer_with_transformer_engine_spec, mamba_layer_specs.py)
 * input_layernorm is an IdentityOp but for MLA and pre_mlp_layernorm but for MoE layers, the
 * norm fused into TELayerNormColumnParallelLinear (linear_qkv, linear_fc1), which saves its
 * normed output whatever the module list. */
static int ln_drops(const shapes *sh, uint32_t rc, int attn, int kind) {
  if (!(rc & (1u << MP_RC_LAYERNORM))) return 0;
  return !sh->te_spec || (attn ? sh->mla : kind != KIND_DENSE);
}

/* Megatron-Core's CPU offloading (--cpu-offloading-num-layers N, the first N layers): the
 * layer runs under Transformer Engine's offload context (transformer_block.py, core_v0.14.0,
 * get_cpu_offload_context), whose saved-tensor hook copies to the host the tensors TE's
 * modules mark (transformer_engine/pytorch/cpu_offload.py, v2.8, mark_activation_offload):
 * LayerNormLinear's input, norm statistics and normed output (q/k/v's: the block input; fc1's:
 * the MLP input), the fused attention's q, k, v, output and softmax statistics, q/k norms'
 * inputs and statistics, Linear's input (proj's: the attention output; fc2's: the activation
 * output), and the fused SwiGLU's saved input, fc1's output [T, 2f]: Megatron-Core's MLP hands
 * bias_swiglu_impl cpu_offload_input under --cpu-offloading with its activations
 * (megatron/core/transformer/mlp.py, config.cpu_offloading and cpu_offloading_activations,
 * core_v0.13.0 to core_v0.19.0), and SwiGLUFunction / BiasSwiGLUFunction set
 * activation_offloading on the tensor they save (fused_bias_swiglu.py), the attribute TE's
 * hook offloads by (tensor_need_offloading_checker_activations), so under the TE spec the whole
 * 3 x 2Tf goes. What Megatron's other functions save stays on the GPU: bias_gelu_impl's input,
 * fc1's output 2Tf (fused_bias_gelu.py marks nothing), the unfused SwiGLU's torch ops (of
 * its 4 x 2Tf, all but fc2's input 2Tf), and the two dropout masks of a GPT block (the
 * bias-dropout-add's, Ts H each). Weights are never offloaded (offload_weights has had no
 * effect since v2.5: 'Offloading weights is deprecated'). Under the megatron memory model only
 * (mp_rule_cpu_offload_check keeps it to dense layers). */
static void offload_act(const gen *g, block_act *a) {
  if (g->ms->saved != SAVED_KORTHIKANTI || g->layer < 0 || g->layer >= g->p->opts.cpu_offload_layers) return;
  const shapes *sh = &g->sh;
  const int64_t mask = sh->gpt * sh->tokens_sp * sh->d_model;
  /* the activation's saved tensors that stay: all but fc2's input, none of the fused SwiGLU's */
  const int64_t act_in = sh->gated && sh->te_spec ? 0 : (mg_act_tf(sh) - 1) * 2 * sh->tokens * sh->d_ff;
  a->off_attn = a->x + a->attn - mask;
  a->off_mlp = a->mlp - mask - act_in;
  a->x = 0;
  a->attn = mask;
  a->mlp = mask + act_in;
}
static void f8_cache_act(const gen *g, int kind, block_act *a);

/* The bytes of the quantized copy of a rows x cols input that a float8 Linear of Transformer
 * Engine saves for its weight gradient (transformer_engine/pytorch/module/linear.py and
 * layernorm_linear.py v2.8, grouped_linear.py for one expert: saved_inputmat / ln_out /
 * inputmats are the quantized input with its row-wise data discarded, update_usage(
 * rowwise_usage=False), except a per-tensor or NVFP4 input gathered under sequence
 * parallelism, whose quantizer supports_only_rowwise_all_gather: its row-wise data kept,
 * `rowwise`). The local shard is saved in either case (ln_out, not ln_out_total, which the
 * forward clears after its GEMM, with NCCL's all-gather or userbuffers' alike); the backward
 * gathers it again. By recipe (quantizer.cpp v2.8 get_scale_shape; NVFP4 v2.9):
 *   delayed, tensorwise  1 byte an element (the transpose on Hopper, the data itself where
 *                        float8 GEMMs take any layout); its one fp32 scale left out
 *   mxfp8                1 byte an element and an E8M0 scale per 32 rows, column-wise
 *                        [roundup(rows / 32, 4), roundup(cols, 128)]
 *   blockwise            1 byte an element and an fp32 scale per 128 rows (1x128 tiles of
 *                        the transpose), [ceil(rows / 128), roundup(cols, 4)]
 *   nvfp4                half a byte an element and an E4M3 scale per 16, column-wise
 *                        [roundup(cols, 128), roundup(rows / 16, 4)], row-wise
 *                        [roundup(rows, 128), roundup(cols / 16, 4)]
 * Other recipes (torchao's rowwise) are not Transformer Engine's: the bf16 copy, 2 bytes. */
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t te_q_data(const shapes *sh, int64_t elems) {
  switch (sh->fp8_recipe) {
    case MP_FP8_DELAYED:
    case MP_FP8_TENSORWISE:
    case MP_FP8_MXFP8:
    case MP_FP8_BLOCKWISE: return elems;
    case MP_FP8_NVFP4: return elems / 2;
    default: return 2 * elems;
  }
}

/* column-wise but where a per-tensor or NVFP4 input gathered under SP keeps its row-wise data
 * (`rowwise`; per-tensor scales are 0): mp_fp8_te_scale_bytes, exec/plan_fp8.h */
static int64_t te_q_scales(const shapes *sh, int64_t rows, int64_t cols, int rowwise) {
  return mp_fp8_te_scale_bytes(sh->fp8_recipe, rowwise && sh->fp8_recipe == MP_FP8_NVFP4, 0, rows, cols);
}

static int64_t te_q_bytes(const shapes *sh, int64_t rows, int64_t cols, int rowwise) {
  return te_q_data(sh, rows * cols) + te_q_scales(sh, rows, cols, rowwise);
}

/* What the quantized copy spares against the bf16 input of rows x cols where it replaces it
 * (the Linear's module runs float8 under Transformer Engine), else 0. */
static int64_t te_f8_spares(const shapes *sh, int module, int64_t rows, int64_t cols, int rowwise) {
  return sh->fp8_te && sh->fp8[module] ? 2 * rows * cols - te_q_bytes(sh, rows, cols, rowwise) : 0;
}

/* The attention projection's quantized copy of the attention output, saved beside the bf16
 * output the fused attention keeps for its own backward: Megatron-Core sets the projection
 * to save its original input (set_save_original_input, attention.py at core_v0.14.0 and
 * core_v0.15.0) under config.fp8 with any recipe but delayed, Transformer Engine 2.6 or
 * later; delayed scaling, and NVFP4 (config.fp4, not fp8), keep the quantized copy. */
static int64_t te_proj_copy(const shapes *sh) {
  const int keeps = sh->fp8_recipe == MP_FP8_DELAYED || sh->fp8_recipe == MP_FP8_NVFP4;
  return sh->fp8_te && sh->fp8[MP_MOD_O] && keeps ? te_q_bytes(sh, sh->tokens, sh->attn_out, 0) : 0;
}

/* A hybrid model's layer (exec/model.h) has one part: a Mamba-2 mixer, whose saved tensors
 * (schedule_mamba.c) take the attention part's place, the attention alone, or the MLP alone
 * less the MLP input the block's list counts beside the block's input (here the layer's
 * input, x). Under Transformer Engine's float8 (Megatron-Core's layers: mamba_layer_specs.py
 * at core_v0.14.0, TELayerNormColumnParallelLinear and TERowParallelLinear) each float8
 * Linear's saved input is its float8 copy (te_f8_spares):
 *   Mamba      in_proj's normed input `in` and out_proj's input, the gated norm's output
 *              (the norm saves its own input), T di/tp elements
 *   attention  q/k/v's normed input; the projection's quantized copy of the attention
 *              output beside the bf16 one the flash attention keeps (te_proj_copy)
 *   MLP        fc1's normed input; fc2's input, the square of squared ReLU (torch.pow saves
 *              its input, relu's output, which relu saves too), T f elements
 * AC none or full only (pass_ac.c refuses the others). */
static void hybrid_act(const gen *g, mp_ac_mode ac, block_act *a) {
  const mp_model *m = &g->p->model;
  const shapes *sh = &g->sh;
  int64_t A = a->attn + a->attn_tmp, M = a->mlp + a->mlp_tmp;
  const int64_t T = sh->tokens;
  const int64_t rows = g->ms->saved == SAVED_KORTHIKANTI && sh->sp ? sh->tokens_sp : T;
  const int64_t in = 2 * rows * sh->d_model;
  if (mp_model_layer_has_mamba(m, g->layer)) {
    const int64_t out_in = 2 * T * sh->mb_inner - te_f8_spares(sh, MP_MOD_MAMBA_OUT, T, sh->mb_inner, 0);
    A = mp_sched_mamba_saved(sh, stat_bytes(sh) * sh->tokens_sp,
                             in - te_f8_spares(sh, MP_MOD_MAMBA_IN, rows, sh->d_model, sh->sp), out_in);
    M = 0;
  } else if (mp_model_layer_has_attn(m, g->layer)) {
    A += te_proj_copy(sh) - te_f8_spares(sh, MP_MOD_Q, rows, sh->d_model, sh->sp);
    M = 0;
  } else {
    A = 0;
    M -= 2 * sh->tokens_sp * sh->d_model + te_f8_spares(sh, MP_MOD_UP, rows, sh->d_model, sh->sp) +
         te_f8_spares(sh, MP_MOD_DOWN, T, sh->d_ff, 0);
  }
  const int full = ac == MP_AC_FULL;
  a->attn = full ? 0 : A;
  a->mlp = full ? 0 : M;
  a->attn_tmp = a->rc_attn = full ? A : 0;
  a->mlp_tmp = a->rc_mlp = full ? M : 0;
}

/* What Transformer Engine's float8 Linears of a dense or MoE block spare of its saved
 * tensors under the megatron model (Megatron-Core's TE layers: TELayerNormColumnParallelLinear
 * for qkv and fc1, TERowParallelLinear for proj and fc2, TEColumnParallelLinear and
 * TERowParallelLinear for the shared experts, TEGroupedLinear for the routed experts,
 * gpt_layer_specs.py and moe/experts.py at core_v0.14.0), each float8 Linear's saved input
 * being its quantized copy (te_q_bytes) in place of the bf16 one the list counts:
 *   qkv, fc1     their normed input `in` ([Ts, H] under SP: the local shard), unless the
 *                layernorm module dropped it (a recompute-module input saves its original:
 *                set_save_original_input, transformer_layer.py)
 *   proj         the attention output's quantized copy beside the bf16 one (te_proj_copy);
 *                under selective-core (the core's checkpoint keeps no output) and beside a
 *                materialized core (which saves its softmax and v, not its output) the copy
 *                replaces the bf16 2Tq
 *   fc2          its input, the activation's output [T, f]
 *   routed       fc1's dispatched rows [R, H] and fc2's input [R, f_e] (the slowest EP rank's,
 *                received), the scales per local expert (split_quantize quantizes each with its
 *                own quantizer); fc2's not under moe_act, whose fc2 saves the original input
 *                the recompute drops (experts.py set_save_original_input)
 *   shared       fc1's quantized copy of the normed h beside the bf16 one the router keeps
 *                (the router stays bf16), but under layernorm (moe_layer.py
 *                set_for_recompute_pre_mlp_layernorm); fc2's input [T, f_s]; neither under
 *                shared_experts
 * A part checkpointed whole (full AC, mlp or moe) re-runs these Linears in its recompute: the
 * same spares come off what the recompute allocates (`whole` 1 under full AC, 2 under mlp or
 * moe, whose checkpoint keeps the part's bf16 input; 0 for the part's own forward). MLA's
 * attention keeps its bf16 list. */
static int64_t te_f8_mlp(const shapes *sh, uint32_t rc, int kind, int64_t rows_in, int whole) {
  const int64_t T = sh->tokens, H = sh->d_model;
  const int ln = whole != 1 && ln_drops(sh, rc, 0, kind);
  if (kind == KIND_DENSE) {
    const int up = sh->fp8_te && sh->fp8[MP_MOD_UP] && (!sh->gated || sh->fp8[MP_MOD_GATE]);
    /* under mlp the checkpoint keeps fc1's bf16 input and the recompute's fc1 its copy; under
     * the TE spec the checkpoint's input is the un-normed residual and the recompute's fc1 saves
     * its copy of the normed input in place of the bf16 one (modules_act) */
    const int64_t fc1 = whole == 2 && !sh->te_spec ? -te_q_bytes(sh, rows_in, H, sh->sp)
                                   : te_f8_spares(sh, MP_MOD_UP, rows_in, H, sh->sp);
    return (up && !ln ? fc1 : 0) + te_f8_spares(sh, MP_MOD_DOWN, T, sh->d_ff, 0);
  }
  /* the routed experts: each local expert's rows quantized apart, R / n of the R received */
  const int64_t n = sh->experts_local > 0 ? sh->experts_local : 1;
  const int64_t R = received(sh, sh->moe_tokens * sh->top_k), Re = ceil_div(R, n), fe = sh->d_ff_expert;
  int64_t d = 0;
  if (sh->fp8_te && sh->fp8[MP_MOD_EXPERTS_GATE] && sh->fp8[MP_MOD_EXPERTS_UP])
    d += 2 * R * H - te_q_data(sh, R * H) - n * te_q_scales(sh, Re, H, 0);
  if (sh->fp8_te && sh->fp8[MP_MOD_EXPERTS_DOWN] && (whole || !(rc & (1u << MP_RC_MOE_ACT))))
    d += 2 * R * fe - te_q_data(sh, R * fe) - n * te_q_scales(sh, Re, fe, 0);
  if (!sh->has_shared || (!whole && (rc & (1u << MP_RC_SHARED_EXPERTS)))) return d;
  if (!ln && sh->fp8_te && sh->fp8[MP_MOD_SHARED_UP] && sh->fp8[MP_MOD_SHARED_GATE])
    d -= te_q_bytes(sh, sh->sp ? sh->tokens_sp : T, H, sh->sp);
  return d + te_f8_spares(sh, MP_MOD_SHARED_DOWN, T, sh->d_ff_shared, 0);
}

/* The spares off a dense or MoE block's parts (te_f8_mlp's list); the whole list under full
 * AC, off what its recompute allocates, and the recompute's own list under mlp or moe. */
static void te_f8_act(const gen *g, int kind, mp_ac_mode ac, int materialized, block_act *a) {
  const shapes *sh = &g->sh;
  const uint32_t rc = g->p->opts.recompute_modules;
  const int64_t rows_in = sh->sp ? sh->tokens_sp : sh->tokens;
  const int full = ac == MP_AC_FULL;
  int64_t da = 0;
  if (!sh->mla) {
    const int qkv = sh->fp8[MP_MOD_Q] && sh->fp8[MP_MOD_K] && sh->fp8[MP_MOD_V];
    if (qkv && (full || !ln_drops(sh, rc, 1, kind)))
      da += te_f8_spares(sh, MP_MOD_Q, rows_in, sh->d_model, sh->sp);
    const int64_t copy = te_proj_copy(sh);
    const int core_keeps_out = ac != MP_AC_SELECTIVE_CORE && !materialized;
    da += copy && !core_keeps_out ? 2 * sh->tokens * sh->attn_out - copy : -copy;
  }
  if (full) {
    a->attn_tmp -= da;
    a->rc_attn -= da;
    const int64_t dm = te_f8_mlp(sh, rc, kind, rows_in, 1);
    a->mlp_tmp -= dm;
    a->rc_mlp -= dm;
    return;
  }
  a->attn -= da;
  if (a->mlp_whole) a->rc_mlp -= te_f8_mlp(sh, rc, kind, rows_in, 2);
  else a->mlp -= te_f8_mlp(sh, rc, kind, rows_in, 0);
}

/* The block's saved tensors under the plan's memory model, the layer's policy and the
 * plan's recompute modules. */
static void block_act_of(const gen *g, int kind, mp_ac_mode ac, block_act *a) {
  /* with cp > 1 the core is the ring's flash attention (Transformer Engine's under
   * Megatron-LM), whatever the stack runs without it */
  /* Transformer Engine's all-gather context parallelism saves its two chunks' outputs beside
   * the one it returns (schedule_cp_te.c) */
  const int ag = g->p->opts.cp_comm == MP_CP_COMM_ALL_GATHER && g->sh.cp > 1;
  if (g->ms->saved == SAVED_KORTHIKANTI)
    block_act_mg(&g->sh, kind, ac, g->p->opts.attn == MP_ATTN_MATERIALIZED && g->sh.cp == 1,
                 ag ? 2 * g->sh.tokens * g->sh.attn_out : 0, a);
  else block_act_tt(&g->sh, kind, ac, a);
  if (g->sh.hybrid) hybrid_act(g, ac, a);
  if (g->p->opts.recompute_modules) modules_act(g, kind, a);
  if (g->sh.fp8_te && !g->sh.hybrid && !g->p->opts.fp8_act_cache)
    te_f8_act(g, kind, ac, g->p->opts.attn == MP_ATTN_MATERIALIZED && g->sh.cp == 1, a);
  if (g->p->opts.fp8_act_cache) f8_cache_act(g, kind, a);
  offload_act(g, a);
}

/* An ALLOC or FREE of the open block's activations, flagged MP_MEM_KEPT when kept. */
static void act(gen *g, int buf, int64_t bytes, int alloc, int kept) {
  if (bytes <= 0) return;
  int32_t i = mem(g, alloc ? MP_OP_ALLOC : MP_OP_FREE, MP_MEM_ACTIVATIONS, buf, bytes, g->layer,
                  -1, MP_STREAM_COMPUTE);
  if (i >= 0 && kept) g->ops[i].variant = MP_MEM_KEPT;
}

/* ---- Megatron-Core's output-discarding recompute modules (exec/plan.h, mp_rc_module) ---- */

/* What each recompute module stops saving past the forward (the lists above), allocated
 * again by its recompute before the part's backward (rc_attn, rc_mlp):
 *   layernorm       each part's normed input: the attention's `in` (2TsH where the megatron
 *                   model keeps it sharded under SP, else 2TH), the MLP's (the same for a dense
 *                   MLP, the MoE's normed h 2TH; `in` where the MoE is checkpointed whole, whose
 *                   saved input it is)
 *   mla_up_proj     schedule_mla.c's mp_sched_mla_up_saved (latents normed, kv_b's output, q, k)
 *   moe_act         the routed experts' SwiGLU outputs, silu and the product: 2 x 2 T top_k f_e
 *   mlp, moe        the whole MLP part but what stays outside the module: the pre-MLP norm's
 *                   input 2TsH and statistics st Ts, the checkpoint's input `in` (Megatron's
 *                   tensor_parallel.checkpoint saves its inputs, CheckpointFunction.forward) and
 *                   the megatron model's hidden dropout mask Ts H of a dense GPT block (the
 *                   bias-dropout-add after the module); the module's output is not saved (the
 *                   residual add after it saves nothing). A dense MLP drops (4 or 2) x 2Tf; a
 *                   MoE block the router's probabilities, the dispatched rows, the experts' and
 *                   the shared experts' tensors (moe_act's among them)
 *   shared_experts  the shared experts' gate, up, silu and product: 4 x 2 T f_s (their input is
 *                   the MoE layer's, kept; subsumed by moe)
 * Beside selective-core the core's recompute allocates rc_attn whole (recompute below). */
static void modules_act(const gen *g, int kind, block_act *a) {
  const uint32_t rc = g->p->opts.recompute_modules;
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  const int mg = g->ms->saved == SAVED_KORTHIKANTI;
  const int64_t in = mg && sh->sp ? 2 * sh->tokens_sp * H : 2 * T * H;
  a->mlp_whole = (kind == KIND_DENSE && (rc & (1u << MP_RC_MLP))) || (kind == KIND_MOE && (rc & (1u << MP_RC_MOE)));
  int64_t da = 0, dm = 0;
  if (ln_drops(sh, rc, 1, kind)) da += in;
  if (ln_drops(sh, rc, 0, kind)) dm += kind == KIND_DENSE || a->mlp_whole ? in : 2 * T * H;
  if ((rc & (1u << MP_RC_MLA_UP_PROJ)) && sh->mla) da += mp_sched_mla_up_saved(sh);
  if (a->mlp_whole) {
    const int64_t drop = mg && kind == KIND_DENSE ? sh->gpt * sh->tokens_sp * H : 0;
    /* under the TE spec a dense MLP's checkpoint input is the residual itself (its norm is
     * fc1's, inside the checkpoint: its statistics and normed output dropped too) */
    const int fused = sh->te_spec && kind == KIND_DENSE;
    dm += a->mlp - 2 * sh->tokens_sp * H - drop - (fused ? 0 : stat_bytes(sh) * sh->tokens_sp + in);
  } else if (kind == KIND_MOE) {
    if (rc & (1u << MP_RC_MOE_ACT)) dm += 2 * 2 * T * sh->top_k * sh->d_ff_expert;
    if (rc & (1u << MP_RC_SHARED_EXPERTS)) dm += 4 * 2 * T * sh->d_ff_shared;
  }
  a->attn -= da;
  a->rc_attn += da;
  a->mlp -= dm;
  a->rc_mlp += dm;
}

/* ---- DeepSeek-V3's float8 activation cache (exec/plan.h, fp8_act_cache) ---------------- */

/* What caching n bf16 elements in float8 saves (arXiv 2412.19437, sec. 3.3.3: fine-grained
 * 1x128 tiles, an fp32 scale each, 4/128 bytes an element): E4M3, 1 byte, saves 2 - 1 - 1/32
 * = 31/32 bytes an element; the attention output, cached in DeepSeek's E5M6, 12 bits (1.5
 * bytes, the format's width packed; the report states the format, not its container),
 * saves 2 - 1.5 - 1/32 = 15/32. */
static int64_t e4m3_saves(int64_t n) { return n * 31 / 32; }
static int64_t e5m6_saves(int64_t n) { return n * 15 / 32; }

/* The attention part's tensors the cache holds in float8 past what the recompute modules
 * dropped: the attention output (o's input, read by the attention's backward too) in E5M6;
 * the normed input where every Linear reading it runs float8 (a bf16 one, MLA's kv_a when
 * its 576 rows miss the 128 tile, keeps the bf16 copy saved) and MLA's normed latents (q_b's
 * and kv_b's inputs), each unless its module recomputes it. */
static int64_t f8_cache_attn(const shapes *sh, uint32_t rc, int64_t in_elems) {
  const int64_t T = sh->tokens;
  int64_t d = sh->fp8[MP_MOD_O] ? e5m6_saves(T * sh->attn_out) : 0;
  const int in_f8 = sh->mla ? sh->fp8[sh->q_lora > 0 ? MP_MOD_Q_A : MP_MOD_Q] && sh->fp8[MP_MOD_KV_A]
                            : sh->fp8[MP_MOD_Q] && sh->fp8[MP_MOD_K] && sh->fp8[MP_MOD_V];
  if (!ln_drops(sh, rc, 1, KIND_DENSE) && in_f8) d += e4m3_saves(in_elems);
  if (sh->mla && !(rc & (1u << MP_RC_MLA_UP_PROJ))) {
    if (sh->q_lora > 0 && sh->fp8[MP_MOD_Q_B]) d += e4m3_saves(T * sh->q_lora);
    if (sh->fp8[MP_MOD_KV_B]) d += e4m3_saves(T * sh->kv_lora);
  }
  return d;
}

/* The MLP part's: a dense MLP's normed input (gate and up in float8) and down's input; a MoE
 * MLP's dispatched rows (the experts' gate/up input), the SwiGLU inputs of the routed and
 * the shared experts (gate's and up's outputs, cached whatever reads them: sec. 3.3.3 (2))
 * and down's inputs where moe_act does not recompute them. The MoE's normed input stays
 * bf16 (the router's GEMM reads it). The routed tensors are the slowest EP rank's. */
static int64_t f8_cache_mlp(const shapes *sh, uint32_t rc, int kind, int64_t in_elems) {
  const int64_t T = sh->tokens;
  if (kind == KIND_DENSE) {
    int64_t d = sh->fp8[MP_MOD_DOWN] ? e4m3_saves(T * sh->d_ff) : 0;
    const int in_f8 = sh->fp8[MP_MOD_UP] && (!sh->gated || sh->fp8[MP_MOD_GATE]);
    if (!ln_drops(sh, rc, 0, KIND_DENSE) && in_f8) d += e4m3_saves(in_elems);
    return d;
  }
  const int64_t R = sh->moe_tokens * sh->top_k, fe = sh->d_ff_expert;
  int64_t routed = e4m3_saves(2 * R * fe);
  if (sh->fp8[MP_MOD_EXPERTS_GATE] && sh->fp8[MP_MOD_EXPERTS_UP]) routed += e4m3_saves(R * sh->d_model);
  if (!(rc & (1u << MP_RC_MOE_ACT)) && sh->fp8[MP_MOD_EXPERTS_DOWN]) routed += e4m3_saves(R * fe);
  int64_t d = received(sh, routed);
  if (sh->has_shared && !(rc & (1u << MP_RC_SHARED_EXPERTS))) { /* else dropped, above */
    d += e4m3_saves(2 * T * sh->d_ff_shared);
    if (sh->fp8[MP_MOD_SHARED_DOWN]) d += e4m3_saves(T * sh->d_ff_shared);
  }
  return d;
}

/* The cache's saving off each part's kept tensors (the megatron model: the plan check);
 * under full AC a block keeps only its input, the residual stream, in bf16. */
static void f8_cache_act(const gen *g, int kind, block_act *a) {
  if (a->rc_first) return;
  const shapes *sh = &g->sh;
  const uint32_t rc = g->p->opts.recompute_modules;
  const int64_t in_elems = (sh->sp ? sh->tokens_sp : sh->tokens) * sh->d_model; /* SP: kept sharded */
  a->attn -= f8_cache_attn(sh, rc, in_elems);
  if (!a->mlp_whole) a->mlp -= f8_cache_mlp(sh, rc, kind, in_elems); /* else its bf16 input alone */
}

/* The cache's copies a block's forward writes beside what it computes anyway: the attention
 * output in E5M6 (1.5 + 4/128 bytes an element), written by the kernel that casts o's input
 * to E4M3 for its GEMM, and the SwiGLU inputs in E4M3 (1 + 4/128), written by the SwiGLU
 * that reads them, each costing its write; the Linears' other cached inputs are the E4M3
 * operands their GEMMs read. Part `attn`, else the MLP of `kind`; none under full AC. */
static void f8_cache_writes(gen *g, int attn, int kind) {
  const shapes *sh = &g->sh;
  if (!g->p->opts.fp8_act_cache || mp_plan_layer_ac(g->p, g->layer) == MP_AC_FULL) return;
  const int64_t T = sh->tokens;
  if (attn) {
    const int64_t e = T * sh->attn_out;
    if (sh->fp8[MP_MOD_O]) elementwise(g, MP_KERNEL_FP8_CAST, MP_VAR_FWD, MP_MOD_O, e, 0.0, (1.5 + 4.0 / 128) * e);
    return;
  }
  if (kind != KIND_MOE) return;
  const int64_t e = received(sh, 2 * sh->moe_tokens * sh->top_k * sh->d_ff_expert);
  elementwise(g, MP_KERNEL_FP8_CAST, MP_VAR_FWD, MP_MOD_EXPERTS_GATE, e, 0.0, (1.0 + 4.0 / 128) * e);
  if (sh->has_shared)
    elementwise(g, MP_KERNEL_FP8_CAST, MP_VAR_FWD, MP_MOD_SHARED_GATE, 2 * T * sh->d_ff_shared, 0.0,
                (1.0 + 4.0 / 128) * (double)(2 * T * sh->d_ff_shared));
}

/* The recompute of part `attn` (else the MLP) under the plan's recompute modules, before
 * the part's backward (Megatron-Core's CheckpointWithoutOutput recomputes in the backward
 * hook of the output's consumer, its reentrant checkpoint when the backward reaches the
 * module); alloc: its rc buffer is allocated here. A module checkpointed whole re-runs its
 * forward from its saved input: the MLP part without its norm and the residual add after it,
 * collectives included (SP's all-gather and reduce-scatter or the all-reduce, a MoE block's
 * dispatch and combine); moe_act's SwiGLU and the shared experts run again inside it, being
 * checkpointed again within the recomputed forward (moe_layer.py nests shared_experts'
 * checkpoint in moe's). pd: the part's pending gathers, waited for by the recompute. */
static void recompute_modules(gen *g, const block_act *a, int kind, int attn, int alloc, const part_deps *pd) {
  const uint32_t rc = g->p->opts.recompute_modules;
  const shapes *sh = &g->sh;
  if (!rc) return;
  g->phase = MP_PHASE_RECOMPUTE;
  g->recompute_skips = 0;
  if (attn) {
    if (alloc) act(g, BUF_RC_ATTN, a->rc_attn, 1, 0);
    if (ln_drops(sh, rc, 1, kind)) mp_sched_norm_fwd(g, MP_MOD_ATTN_NORM, sh->tokens_sp, sh->d_model);
    if ((rc & (1u << MP_RC_MLA_UP_PROJ)) && sh->mla) mp_sched_mla_up_fwd(g);
  } else {
    if (alloc) act(g, BUF_RC_MLP, a->rc_mlp, 1, 0);
    if (ln_drops(sh, rc, 0, kind)) mp_sched_norm_fwd(g, MP_MOD_FFN_NORM, sh->tokens_sp, sh->d_model);
    if (a->mlp_whole) {
      /* under the TE spec a dense MLP's norm is fc1's, run again inside the checkpoint */
      g->recompute_skips = (sh->te_spec && kind == KIND_DENSE ? 0 : SKIP_MOD(MP_MOD_FFN_NORM)) | SKIP_RESIDUAL;
      mp_sched_mlp_fwd(g, kind, pd);
      g->recompute_skips = 0;
      /* the routed and shared outputs' sum, inside MoELayer.combine */
      if (kind == KIND_MOE && sh->has_shared) mp_sched_residual(g, MP_VAR_FWD, sh->tokens_sp * sh->d_model);
    }
    if ((rc & (1u << MP_RC_SHARED_EXPERTS)) && kind == KIND_MOE) {
      if (!a->mlp_whole) attach(g, pd, PART_MOE); /* the shared experts' weights, gathered for the backward */
      mp_sched_shared_fwd(g);
    }
    if ((rc & (1u << MP_RC_MOE_ACT)) && kind == KIND_MOE) {
      /* gate and up read (bf16, or E4M3 with their scales from the float8 cache), the
       * product written in bf16 */
      const int64_t e = sh->moe_tokens * sh->top_k * sh->etp_rows * sh->d_ff_expert;
      const double in = g->p->opts.fp8_act_cache ? 1.0 + 4.0 / 128 : 2.0;
      elementwise(g, MP_KERNEL_ACTIVATION, MP_VAR_FWD, MP_MOD_EXPERTS_GATE, e, FLOPS_SWIGLU_FWD,
                  (2.0 * in + 2.0) * (double)e);
    }
  }
  g->phase = MP_PHASE_BACKWARD;
}

/* ---- a block's forward and backward under the torchtitan model ------------------------- */

/* The block's first part forward: the attention, or a hybrid model's Mamba-2 mixer, or
 * nothing in its MLP layers. */
static void mixer_fwd(gen *g, const part_deps *pd) {
  const mp_model *m = &g->p->model;
  if (mp_model_layer_has_mamba(m, g->layer)) {
    mp_sched_mamba_fwd(g, pd);
  } else if (mp_model_layer_has_attn(m, g->layer)) {
    mp_sched_attention_fwd(g, pd);
    mp_sched_attention_out_fwd(g);
  }
}

/* A block's forward: what autograd saves allocated as its ops run; the policy's drops freed
 * at the end of each part. */
void mp_sched_block_fwd_tt(gen *g, int kind, const part_deps *pd) {
  block_act a;
  block_act_of(g, kind, mp_plan_layer_ac(g->p, g->layer), &a);
  mp_sched_f8_held_fwd(g);
  mp_sched_f8_held_layer(g, 0, 1);
  int64_t first, n;
  if (!mp_plan_layer_rc_group(g->p, g->layer, &first, &n) || first == g->layer) /* a uniform group saves its input */
    act(g, BUF_ACT_X, a.x, 1, 1);
  act(g, BUF_ACT_ATTN, a.attn, 1, a.kept);
  act(g, BUF_ACT_OFF_ATTN, a.off_attn, 1, 0);
  act(g, BUF_ACT_ATTN_TMP, a.attn_tmp, 1, 0);
  mixer_fwd(g, pd);
  f8_cache_writes(g, 1, kind);
  act(g, BUF_ACT_ATTN_TMP, a.attn_tmp, 0, 0);
  act(g, BUF_ACT_MLP, a.mlp, 1, a.kept);
  act(g, BUF_ACT_OFF_MLP, a.off_mlp, 1, 0);
  act(g, BUF_ACT_MLP_TMP, a.mlp_tmp, 1, 0);
  if (mp_model_layer_has_mlp(&g->p->model, g->layer)) mp_sched_mlp_fwd(g, kind, pd);
  f8_cache_writes(g, 0, kind);
  act(g, BUF_ACT_MLP_TMP, a.mlp_tmp, 0, 0);
  /* an offloaded layer's marked tensors leave the GPU once copied to the host (the copies and
   * their overlap are priced by the simulator, sim/offload.c) */
  act(g, BUF_ACT_OFF_ATTN, a.off_attn, 0, 0);
  act(g, BUF_ACT_OFF_MLP, a.off_mlp, 0, 0);
  if (a.off_attn + a.off_mlp > 0) g->s->offload_bytes = a.off_attn + a.off_mlp;
  mp_sched_f8_held_layer(g, 0, 0);
}

/* The recompute of a block part (or the whole block) under RECOMPUTE, skipping what the
 * policy keeps. */
static void recompute(gen *g, const block_act *a, int kind, const part_deps *pd, int whole) {
  g->phase = MP_PHASE_RECOMPUTE;
  g->recompute_skips = a->skip;
  if (whole) {
    act(g, BUF_RC_ATTN, a->rc_attn, 1, 0);
    act(g, BUF_RC_MLP, a->rc_mlp, 1, 0);
    mixer_fwd(g, pd);
    if (mp_model_layer_has_mlp(&g->p->model, g->layer)) mp_sched_mlp_fwd(g, kind, pd);
  } else {
    act(g, BUF_RC_ATTN, a->rc_attn, 1, 0);
    if (a->skip) { /* the attention module */
      mp_sched_attention_fwd(g, pd);
      mp_sched_attention_out_fwd(g);
    } else { /* the core alone */
      mp_sched_attention_core_fwd(g);
    }
  }
  g->recompute_skips = 0;
  g->phase = MP_PHASE_BACKWARD;
}

/* Megatron-Core's uniform recompute (exec/plan.h, mp_recompute_method) re-runs a group's
 * forward whole before the backward of its top layer l: what that recompute saves for the
 * group's layers below l (their parts' tensors, and their inputs but the group's saved one)
 * and l's own input are allocated here, each under its layer, and freed by its backward as
 * full AC frees them. Their recompute ops stay in each layer's backward (one compute stream:
 * the same time); the memory is held from the group's top. Returns 1 for a layer of a group
 * below its top, whose recompute allocates nothing. */
static int rc_group_hold(gen *g, int32_t l, const block_act *own) {
  int64_t first, n;
  if (!mp_plan_layer_rc_group(g->p, l, &first, &n) || n < 2) return 0;
  if (l != first + n - 1) return 1;
  for (int64_t k = first; k < l; k++) {
    block_act a;
    g->layer = (int32_t)k;
    block_act_of(g, mp_model_layer_is_moe(&g->p->model, k) ? KIND_MOE : KIND_DENSE, MP_AC_FULL, &a);
    act(g, BUF_RC_ATTN, a.rc_attn, 1, 0);
    act(g, BUF_RC_MLP, a.rc_mlp, 1, 0);
    if (k > first) act(g, BUF_ACT_X, a.x, 1, 1);
  }
  g->layer = l;
  act(g, BUF_ACT_X, own->x, 1, 1);
  return 0;
}

/* A block's backward: the workspace, the recompute where the policy puts it, the MLP's
 * backward and the release of its part (the MoE and experts units resharded and reduced
 * once it is done), the attention's backward, then the block input and the attention unit
 * (or the block's one unit). */
void mp_sched_block_bwd_tt(gen *g, int32_t l, int kind, const part_deps *pd) {
  const mp_ac_mode ac = mp_plan_layer_ac(g->p, l);
  block_act a;
  block_act_of(g, kind, ac, &a);
  const int nu = g->n_units[l];
  const int32_t u0 = g->first_unit[l];
  const int64_t ws = bwd_workspace(&g->sh, kind);
  pair(g, MP_MEM_TEMP, BUF_BWD_WS, ws, 1);
  mp_sched_f8_held_layer(g, 1, 1);
  /* an offloaded layer's tensors copied back before its backward */
  act(g, BUF_ACT_OFF_ATTN, a.off_attn, 1, 0);
  act(g, BUF_ACT_OFF_MLP, a.off_mlp, 1, 0);
  if (a.rc_first) {
    block_act held = a; /* a uniform group's lower layer: its recompute's tensors held already */
    if (rc_group_hold(g, l, &a)) held.rc_attn = held.rc_mlp = 0;
    recompute(g, &held, kind, pd, 1);
  } else recompute_modules(g, &a, kind, 0, 1, pd);
  part_deps rest = pd ? *pd : (part_deps){0}; /* what the MLP's backward still waits for */
  if (kind == KIND_MOE && (g->p->opts.recompute_modules & (1u << MP_RC_SHARED_EXPERTS)))
    rest.dep[PART_MOE][0] = rest.dep[PART_MOE][1] = -1; /* waited for by the shared experts' recompute */
  const mp_model *m = &g->p->model;
  if (mp_model_layer_has_mlp(m, l))
    mp_sched_mlp_bwd(g, kind, a.rc_first || a.mlp_whole || !pd ? NULL : &rest);
  act(g, BUF_ACT_MLP, a.mlp, 0, a.kept);
  act(g, BUF_ACT_OFF_MLP, a.off_mlp, 0, 0);
  act(g, BUF_RC_MLP, a.rc_mlp, 0, 0);
  if (nu > 1) {
    mp_sched_free_units(g, l, u0, nu, PART_MOE, PART_EXPERTS);
    mp_sched_reduce_units(g, l, u0, nu, PART_MOE, PART_EXPERTS);
  }
  const int rc_attn = !a.rc_first && (ac == MP_AC_SELECTIVE || ac == MP_AC_SELECTIVE_CORE);
  if (rc_attn) recompute(g, &a, kind, ac == MP_AC_SELECTIVE ? pd : NULL, 0);
  if (!a.rc_first) recompute_modules(g, &a, kind, 1, !rc_attn, NULL);
  if (mp_model_layer_has_mamba(m, l)) mp_sched_mamba_bwd(g, a.rc_first ? NULL : pd);
  else if (mp_model_layer_has_attn(m, l))
    mp_sched_attention_bwd(g, a.rc_first || ac == MP_AC_SELECTIVE ? NULL : pd);
  act(g, BUF_ACT_ATTN, a.attn, 0, a.kept);
  act(g, BUF_ACT_OFF_ATTN, a.off_attn, 0, 0);
  act(g, BUF_RC_ATTN, a.rc_attn, 0, 0);
  act(g, BUF_ACT_X, a.x, 0, 1);
  if (mp_model_layer_is_mtp(&g->p->model, l)) mp_sched_mtp_in_bwd(g); /* its input side */
  pair(g, MP_MEM_TEMP, BUF_BWD_WS, ws, 0);
  mp_sched_f8_held_layer(g, 1, 0);
  mp_sched_free_units(g, l, u0, nu, 0, nu > 1 ? PART_ATTN : N_PARTS - 1);
  mp_sched_reduce_units(g, l, u0, nu, 0, nu > 1 ? PART_ATTN : N_PARTS - 1);
}
