/* Step schedule builder: the token embedding, the output head and the loss (the builder's
 * overview: schedule.c; the FLOP and byte conventions: schedule_ops.c).
 *
 * Head and loss memory under torchtitan (LOGITS): bf16 logits [T, V_l] from the head GEMM,
 * an fp32 copy for the cross-entropy (log-softmax saved for backward); the bf16 logits are
 * freed after the loss's forward. Backward: fp32 gradient of the logits, then its bf16 cast
 * for the head's GEMMs; the saved fp32 is freed. V_l = V/tp with sharded logits, V after
 * the all-gather. The runtimes keep the head's tensors in the activation layout's HEAD,
 * LOGITS and DLOGITS allocations (exec/act_layout.h). */
#include "exec/schedule_internal.h"

/* ---- embedding, head and loss --------------------------------------------------------- */

/* The token embedding: a masked lookup of the rank's vocabulary rows for all T tokens, the
 * partial sums combined (SP: reduce-scatter to [Ts, H]; else all-reduce); GPT's learned
 * positions added on the rank's [Ts, H]. */
void mp_sched_embedding_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t e = sh->tokens * sh->d_model, es = sh->tokens_sp * sh->d_model;
  mp_sched_rt_sp(g, 1);
  elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_FWD, MP_MOD_TOK_EMBEDDINGS, e, 0.0,
              4.0 * (double)e + 8.0 * (double)sh->tokens);
  mp_sched_tp_region_out_fwd(g, sh->tp_emb_vocab, MP_MOD_TOK_EMBEDDINGS);
  mp_sched_rt_sp(g, 0);
  if (sh->gpt) {
    elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_FWD, MP_MOD_POS_EMBEDDINGS, es, 0.0,
                4.0 * (double)es);
    mp_sched_residual(g, MP_VAR_FWD, es);
  }
}

void mp_sched_embedding_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t e = sh->tokens * sh->d_model, es = sh->tokens_sp * sh->d_model;
  if (sh->gpt)
    elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_BWD, MP_MOD_POS_EMBEDDINGS, es, 1.0,
                6.0 * (double)es);
  mp_sched_rt_sp(g, 1);
  mp_sched_tp_region_out_bwd(g, sh->tp_emb_vocab, MP_MOD_TOK_EMBEDDINGS);
  elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_BWD, MP_MOD_TOK_EMBEDDINGS, e, 1.0,
              6.0 * (double)e + 8.0 * (double)sh->tokens);
  mp_sched_rt_sp(g, 0);
}

static int head_module(const shapes *sh) {
  return sh->tied ? MP_MOD_TOK_EMBEDDINGS : MP_MOD_OUTPUT;
}

/* What the head saves besides the logits: the final norm's input [Ts, H] and statistics,
 * the head GEMM's input (normed; all-gathered to [T, H] under SP). */
static int64_t head_act_bytes(const shapes *sh) {
  return 2 * sh->tokens_sp * sh->d_model + (sh->layernorm ? 8 : 4) * sh->tokens_sp + 2 * sh->tokens * sh->d_model;
}

/* The loss forward's memory and op under the plan's cross-entropy (mp_loss_impl): on entry
 * the bf16 logits [T, V_loss] are allocated (LOGITS); on exit what backward reads is held.
 * EAGER with vocab-sharded logits is DTensor's loss_parallel (torchtitan's default with tp > 1;
 * torch/distributed/tensor/parallel/loss.py), which replaces aten's fused log_softmax and nll
 * by decomposed element-wise ops on the rank's fp32 [T, V/tp] shard: forward
 * shifted = x - amax (all-reduced), exp(shifted) summed (all-reduced), result = shifted -
 * log(sum), so x, shifted and exp(shifted) (then result) are live at once beside the bf16
 * logits; backward (nll and log_softmax fused) grad_input = zeros_like(x) with -1 scattered,
 * (grad_input + exp(x)) * grad_output: the saved output, grad_input, the sum and the product
 * live at once. */
static void loss_fwd(gen *g, int64_t T) {
  const shapes *sh = &g->sh;
  const int64_t TV = T * sh->vocab_loss;
  const mp_loss_impl li = g->p->opts.loss;
  const int dtensor = li == MP_LOSS_EAGER && sh->loss_parallel;
  double bytes = 10.0 * (double)TV;
  if (li == MP_LOSS_EAGER) {
    pair(g, MP_MEM_LOGITS, BUF_LOGITS_F32, 4 * TV, 1); /* pred.float() */
    if (dtensor) {
      pair(g, MP_MEM_LOGITS, BUF_LP_SHIFTED, 4 * TV, 1);
      pair(g, MP_MEM_LOGITS, BUF_LP_EXP, 4 * TV, 1);
      pair(g, MP_MEM_LOGITS, BUF_LP_EXP, 4 * TV, 0); /* summed, released */
      /* the cast 2+4, amax 4, sub 4+4, exp 4+4, sum 4, sub 4+4 bytes per element */
      bytes = 38.0 * (double)TV;
    }
    pair(g, MP_MEM_LOGITS, BUF_LOGITS_LSM, 4 * TV, 1); /* log_softmax's output, saved */
    if (dtensor) pair(g, MP_MEM_LOGITS, BUF_LP_SHIFTED, 4 * TV, 0);
  } else if (li == MP_LOSS_INPLACE || li == MP_LOSS_INPLACE_FUSED) {
    pair(g, MP_MEM_LOGITS, BUF_LOGITS_F32, 4 * TV, 1); /* the softmax, in place, saved */
    /* Megatron-LM's _VocabParallelCrossEntropy.forward (megatron/core/tensor_parallel/
     * cross_entropy.py, core_v0.14.0), one eager kernel each: the cast 2+4, max 4, -= max
     * 4+4, exp (out=) 4+4, sum 4, div_ 4+4 bytes per element. Fused (megatron/core/fusions/
     * fused_cross_entropy.py): its three jit_fuser functions (torch.compile), one pass each:
     * cast with max 2+4, subtract, exp and sum 4+4, div 4+4 */
    bytes = (li == MP_LOSS_INPLACE ? 38.0 : 22.0) * (double)TV;
  } else if (li == MP_LOSS_TE) {
    /* Transformer Engine's cross_entropy_forward (v2.6): online_softmax_kernel reads the bf16
     * logits for each row's max, sum and target logit (2), cross_entropy_kernel reads them
     * again and writes the gradient over them (2 + 2) */
    bytes = 6.0 * (double)TV;
  }
  elementwise(g, MP_KERNEL_LOSS, MP_VAR_FWD, head_module(sh), TV, FLOPS_LOSS, bytes);
  if (sh->loss_parallel && li == MP_LOSS_TE) /* each rank's three fp32 a row, all-gathered */
    comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, MP_STREAM_COMPUTE, 12.0 * (double)(T * sh->tp),
         MP_DTYPE_FP32, head_module(sh));
  else if (sh->loss_parallel)
    for (int i = 0; i < 3; i++)
      comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_TP, MP_STREAM_COMPUTE, 4.0 * (double)T,
           MP_DTYPE_FP32, head_module(sh));
  if (li == MP_LOSS_TE) return; /* the logits, now holding their gradient, saved */
  if (li == MP_LOSS_FUSED) {
    pair(g, MP_MEM_LOGITS, BUF_LSE, 4 * T, 1); /* the bf16 logits stay, with the lse */
    return;
  }
  if (li == MP_LOSS_EAGER) pair(g, MP_MEM_LOGITS, BUF_LOGITS_F32, 4 * TV, 0);
  pair(g, MP_MEM_LOGITS, BUF_LOGITS, 2 * TV, 0); /* torchtitan's `del pred` */
}

/* The loss backward down to the bf16 gradient of the rank's V_l logit columns (DLOGITS,
 * allocated on exit), everything loss_fwd held released. */
static void loss_bwd(gen *g, int64_t T) {
  const shapes *sh = &g->sh;
  const int64_t TV = T * sh->vocab_loss, dl = 2 * T * sh->vocab_local;
  const mp_loss_impl li = g->p->opts.loss;
  const int dtensor = li == MP_LOSS_EAGER && sh->loss_parallel;
  double bytes = 8.0 * (double)TV;
  if (dtensor) {
    pair(g, MP_MEM_LOGITS, BUF_DLOGITS_F32, 4 * TV, 1); /* grad_input = zeros_like(x) */
    pair(g, MP_MEM_LOGITS, BUF_LP_EXP, 4 * TV, 1);      /* exp(x) */
    pair(g, MP_MEM_LOGITS, BUF_LP_SUM, 4 * TV, 1);      /* grad_input + exp(x) */
    pair(g, MP_MEM_LOGITS, BUF_LP_EXP, 4 * TV, 0);
    pair(g, MP_MEM_LOGITS, BUF_DLSM_F32, 4 * TV, 1);    /* ... * grad_output */
    pair(g, MP_MEM_LOGITS, BUF_LP_SUM, 4 * TV, 0);
    /* zeros 4, exp 4+4, add 8+4, mul 4+4, the bf16 cast 4+2 bytes per element */
    bytes = 38.0 * (double)TV;
  } else if (li == MP_LOSS_INPLACE || li == MP_LOSS_INPLACE_FUSED) {
    /* Megatron-LM's backward (cross_entropy.py, core_v0.14.0): the target column's update
     * (T elements), mul_(grad_output) 4+4, then autograd's cast of the fp32 gradient to the
     * bf16 logits' dtype 4+2 bytes per element. Fused: calculate_gradients in one pass,
     * the saved softmax read, updated in place and cast to bf16, 4+4+2 */
    bytes = (li == MP_LOSS_INPLACE ? 14.0 : 10.0) * (double)TV;
  } else if (li == MP_LOSS_TE) {
    bytes = 4.0 * (double)TV; /* element_mul_kernel: the saved gradient scaled in place */
  } else if (li == MP_LOSS_EAGER) {
    pair(g, MP_MEM_LOGITS, BUF_DLOGITS_F32, 4 * TV, 1); /* nll_loss's gradient */
    pair(g, MP_MEM_LOGITS, BUF_DLSM_F32, 4 * TV, 1);    /* log_softmax's input gradient */
  }
  elementwise(g, MP_KERNEL_LOSS, MP_VAR_BWD, head_module(sh), TV, 2.0, bytes);
  if (li == MP_LOSS_EAGER) {
    pair(g, MP_MEM_LOGITS, BUF_DLOGITS_F32, 4 * TV, 0);
    pair(g, MP_MEM_LOGITS, BUF_LOGITS_LSM, 4 * TV, 0);
  }
  if (li == MP_LOSS_TE) pair(g, MP_MEM_LOGITS, BUF_LOGITS, 2 * TV, 0); /* its storage is the gradient's */
  pair(g, MP_MEM_LOGITS, BUF_DLOGITS, dl, 1); /* the bf16 cast (a slice when gathered) */
  if (li == MP_LOSS_EAGER) pair(g, MP_MEM_LOGITS, BUF_DLSM_F32, 4 * TV, 0);
  if (li == MP_LOSS_INPLACE || li == MP_LOSS_INPLACE_FUSED) pair(g, MP_MEM_LOGITS, BUF_LOGITS_F32, 4 * TV, 0);
  if (li == MP_LOSS_FUSED) {
    pair(g, MP_MEM_LOGITS, BUF_LSE, 4 * T, 0);
    pair(g, MP_MEM_LOGITS, BUF_LOGITS, 2 * TV, 0);
  }
}

/* The head's forward up to its GEMM's input: the final norm on [Ts, H], the head's region
 * entered (SP: all-gather). */
static void head_in_fwd(gen *g, int norm) {
  const shapes *sh = &g->sh;
  mp_sched_norm_fwd(g, norm, sh->tokens_sp, sh->d_model);
  mp_sched_tp_region_in_fwd(g, sh->tp > 1, head_module(sh), 0);
}

/* The head GEMM on T rows, the logits gathered when not kept vocab-sharded; `logits` is
 * called where the logits' memory is allocated (before the GEMM). */
static void head_gemm_fwd(gen *g, void (*logits)(gen *g, int64_t T), int64_t T) {
  const shapes *sh = &g->sh;
  logits(g, T);
  mp_sched_linear_fwd(g, head_module(sh), (double)T, sh->vocab_local, sh->d_model, 1);
  if (sh->logits_gather)
    comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, MP_STREAM_COMPUTE, 2.0 * (double)(T * sh->vocab_loss),
         MP_DTYPE_BF16, head_module(sh));
}

static void logits_tt(gen *g, int64_t T) { pair(g, MP_MEM_LOGITS, BUF_LOGITS, 2 * T * g->sh.vocab_loss, 1); }
static void logits_rt(gen *g, int64_t T) {
  (void)T;
  mp_sched_rt_mem(g, MP_ACT_ALLOC_LOGITS, KIND_DENSE, 1);
}

/* torchtitan's ChunkedLossWrapper (components/loss.py; added as ChunkedCELoss in 786e26f8e,
 * April 2026, num_chunks 8 by default, the llama3 configs' loss from then on): the decoder
 * runs without its head, the hidden states [T, H] are detached and split along the sequence
 * into loss_chunks contiguous copies, and each chunk runs the head GEMM, the loss and at once
 * their backward (chunk_loss.backward()), its input gradient summed into an fp32 [T, H]
 * (GradAccumulator) that the decoder's backward takes at the step's backward. Nothing is
 * recomputed: the head's three GEMMs run once a token, on T/N rows at a time. Held through
 * the loop: the copies (2 T H) and the sum (4 T H); under FSDP the head's weight stays
 * gathered and its unsharded gradient sums over the chunks (set_requires_gradient_sync off
 * to the last). The last chunk's backward runs where the step's backward begins. */
static int loss_chunks(const gen *g) { return g->p->opts.loss_chunks > 1 ? g->p->opts.loss_chunks : 1; }

/* Chunk c's rows of T split in n: T/n each, n dividing the rank's sequence (the plan's
 * mp_plan_loss_check, torchtitan's own check); rows a chunk differing by at most one where
 * the plan was checked before its sequence was resolved. */
static int64_t chunk_rows(int64_t T, int c, int n) { return T * (c + 1) / n - T * c / n; }

static int64_t loss_chunks_bytes(const gen *g) {
  return loss_chunks(g) > 1 ? 6 * g->sh.tokens * g->sh.d_model : 0;
}

static int64_t head_dw_bytes(const gen *g) {
  if (loss_chunks(g) == 1 || !g->has_fsdp || g->ms->runtime) return 0;
  return g->sh.vocab_local * g->sh.d_model * mp_dtype_bytes(g->param_dtype);
}

/* One chunk's backward from its loss down to the head's input gradient: the loss, the
 * head's dgrad and wgrad on its T rows, its logits' gradient released. */
static void head_chunk_bwd(gen *g, int64_t T) {
  const shapes *sh = &g->sh;
  loss_bwd(g, T);
  mp_sched_linear_bwd(g, head_module(sh), (double)T, sh->vocab_local, sh->d_model, 1);
  pair(g, MP_MEM_LOGITS, BUF_DLOGITS, 2 * T * sh->vocab_local, 0);
}

/* The head and the loss under PyTorch's autograd (torchtitan, Megatron-LM): the final norm's
 * saved tensors, the logits, the loss as the stack computes it (loss_fwd); with loss_chunks
 * the chunks' forward and backward but the last one's backward. */
void mp_sched_head_fwd(gen *g) { mp_sched_head_norm_fwd(g, MP_MOD_FINAL_NORM); }

/* The same after norm module `norm` (an MTP module's own final norm: schedule_mtp.c). */
void mp_sched_head_norm_fwd(gen *g, int norm) {
  const int64_t T = g->sh.tokens;
  const int n = loss_chunks(g);
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_HEAD, head_act_bytes(&g->sh), 1);
  head_in_fwd(g, norm);
  pair(g, MP_MEM_LOGITS, BUF_LOSS_CHUNKS, loss_chunks_bytes(g), 1);
  for (int c = 0; c < n; c++) {
    head_gemm_fwd(g, logits_tt, chunk_rows(T, c, n));
    loss_fwd(g, chunk_rows(T, c, n));
    if (c == n - 1) break;
    if (c == 0) pair(g, MP_MEM_TEMP, BUF_HEAD_DW, head_dw_bytes(g), 1);
    head_chunk_bwd(g, chunk_rows(T, c, n));
  }
  /* the step's unsharded gradients take the head's from here (emit_backward_head) */
  pair(g, MP_MEM_TEMP, BUF_HEAD_DW, head_dw_bytes(g), 0);
}

/* The runtimes' head: xf and rstdf in one block; one LOGITS block of the X logits, the
 * per-token losses and log-sum-exp (and the vocab-parallel reductions), kept for the
 * backward; the loss one kernel, its vocab-parallel max, sum and target all-reduced. */
void mp_sched_head_fwd_rt(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens;
  mp_sched_rt_mem(g, MP_ACT_ALLOC_HEAD, KIND_DENSE, 1);
  head_in_fwd(g, MP_MOD_FINAL_NORM);
  head_gemm_fwd(g, logits_rt, T);
  elementwise(g, MP_KERNEL_LOSS, MP_VAR_FWD, head_module(sh), T * sh->vocab_loss, FLOPS_LOSS,
              10.0 * (double)(T * sh->vocab_loss));
  if (sh->loss_parallel)
    for (int i = 0; i < 3; i++)
      comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_TP, MP_STREAM_COMPUTE, 4.0 * (double)T, MP_DTYPE_FP32,
           head_module(sh));
}

/* The runtimes' head backward: dlogits (X), the residual-stream gradient dres
 * (kept through the blocks' backward) and dxf; the logits go after the head's GEMMs. */
void mp_sched_head_bwd_rt(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  mp_sched_rt_mem(g, MP_ACT_ALLOC_DLOGITS, KIND_DENSE, 1);
  elementwise(g, MP_KERNEL_LOSS, MP_VAR_BWD, head_module(sh), T * sh->vocab_loss, 2.0,
              8.0 * (double)(T * sh->vocab_loss));
  mp_sched_rt_mem(g, MP_ACT_ALLOC_DRES, KIND_DENSE, 1);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_DXF, KIND_DENSE, 1);
  mp_sched_rt_sp(g, 1); /* SP: the head's partial input gradient on all T rows */
  mp_sched_linear_bwd(g, head_module(sh), (double)T, sh->vocab_local, H, 1);
  mp_sched_tp_region_in_bwd(g, sh->tp_head_split, head_module(sh));
  mp_sched_rt_sp(g, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_DLOGITS, KIND_DENSE, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_LOGITS, KIND_DENSE, 0);
  mp_sched_norm_bwd(g, MP_MOD_FINAL_NORM, sh->tokens_sp, H);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_DXF, KIND_DENSE, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_HEAD, KIND_DENSE, 0);
}

void mp_sched_head_bwd(gen *g) { mp_sched_head_norm_bwd(g, MP_MOD_FINAL_NORM); }

void mp_sched_head_norm_bwd(gen *g, int norm) {
  const shapes *sh = &g->sh;
  const int n = loss_chunks(g);
  head_chunk_bwd(g, chunk_rows(sh->tokens, n - 1, n));
  pair(g, MP_MEM_LOGITS, BUF_LOSS_CHUNKS, loss_chunks_bytes(g), 0);
  mp_sched_tp_region_in_bwd(g, sh->tp_head_split, head_module(sh));
  mp_sched_norm_bwd(g, norm, sh->tokens_sp, sh->d_model);
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_HEAD, head_act_bytes(sh), 0);
}
