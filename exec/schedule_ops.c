/* Step schedule builder: emission primitives and the compute and communication ops of a
 * block, the embedding and the head (the builder's overview: schedule.c).
 *
 * Conventions (units: elements, bytes, FLOPs; T = tokens of one micro-batch on this rank =
 * micro_batch x seq / cp; e = 2 bytes, bf16 activations):
 *   GEMM C[m,n] = A[m,k] B[k,n]: FLOPs 2mnk x batch; bytes = batch (mk + kn) x input bytes
 *     + mn x 2 (bf16 output). A Linear [out, in] on T tokens: forward m=T, n=out, k=in;
 *     DGRAD dx = dy W: m=T, n=in, k=out; WGRAD dW = dy^T x: m=out, n=in, k=T. Biases are
 *     folded into the GEMM epilogue (their out x T adds are not counted).
 *   Attention (flash, causal): forward 4 x T x seq x heads_local x hd / 2, the causal half
 *     of QK^T and PV (a query attends to seq/2 keys on average); backward twice the forward
 *     (dQ, dK, dV, dP: the algorithmic count; flash's recomputation of QK^T in backward is
 *     left to the simulator's attention efficiency). mp_model_flops_per_token counts
 *     12 L heads hd seq per token, i.e. non-causal forward + backward, so a schedule's
 *     FLOPs are the model FLOPs less 6 L heads hd seq per token (tested), plus the small
 *     element-wise FLOPs, less 6 x (norm parameters) which the model counts.
 *   Element-wise kernels carry a nominal FLOP count per element (FLOPS_*,
 *     schedule_internal.h); they are memory-bound, so their bytes (read + written) are what
 *     the simulator uses.
 *   Float8 Linear (torchao tensorwise, as torchtitan uses it): forward casts the weight and
 *     the input to E4M3 (amax pass + scaled cast: 2+2+1 bytes per element) and runs the GEMM
 *     in E4M3; backward casts dy to E5M2 and re-casts the weight and the input (torchao saves
 *     the high-precision tensors), DGRAD and WGRAD in E5M2 (op dtype E5M2: one operand is
 *     E5M2, the other E4M3). With float8 all-gather the gathered weight already is float8
 *     and its casts are dropped (the cast of the shard happens before the all-gather). The
 *     runtimes' float8 (emulated, or on codes) is schedule_rt.c's.
 *   MoE: balanced routing assumed: each local expert receives T x top_k x ep / E tokens
 *     (m of the grouped GEMMs, rounded up; FLOPs use the exact value), batch = E / ep.
 *   Collective payloads (schedule.h): TP all-reduce of [T, H] bf16: 2TH bytes. All-to-all:
 *     the rank's whole send buffer, T x top_k x H x 2 bytes, of which (ep-1)/ep crosses
 *     the network (the simulator's (n-1)/n factor, as nccl-tests count all-to-all). FSDP
 *     (schedule_fsdp.c): all-gather of the unit's tp-local elements (this stage's) x param
 *     dtype; reduce-scatter of the same elements x reduce dtype; dp_replicate all-reduce of
 *     the unit's shard x reduce dtype. Send/recv: [T, H] bf16.
 *   No sequence parallelism: TP's activations are replicated [T, H] (all-reduce, not
 *     reduce-scatter + all-gather). Vocab-parallel embedding: masked lookup + all-reduce
 *     forward, no communication backward. Loss: with vocab-sharded logits three TP
 *     all-reduces of T fp32 values (max, sum of exp, target logit); with replicated
 *     logits an all-gather of [T, V] bf16 before the loss.
 *
 * Head and loss memory under torchtitan (LOGITS): bf16 logits [T, V_l] from the head GEMM,
 * an fp32 copy for the cross-entropy (log-softmax saved for backward); the bf16 logits are
 * freed after the loss's forward. Backward: fp32 gradient of the logits, then its bf16 cast
 * for the head's GEMMs; the saved fp32 is freed. V_l = V/tp with sharded logits, V after
 * the all-gather. The runtimes keep the head's tensors in the activation layout's HEAD,
 * LOGITS and DLOGITS allocations (exec/act_layout.h). */
#include <stdarg.h>

#include "exec/schedule_internal.h"

/* ---- emission primitives -------------------------------------------------------------- */

void mp_sched_fail(gen *g, mp_status code, const char *fmt, ...) {
  if (g->status != MP_OK) return;
  va_list ap;
  va_start(ap, fmt);
  g->status = mp_verror(g->ctx, code, fmt, ap);
  va_end(ap);
}

int mp_sched_grow_ops(gen *g) {
  int32_t cap = g->cap_ops ? 2 * g->cap_ops : g->ops_hint;
  /* not zeroed: ops are copied in or cleared one by one (new_op) */
  mp_op *n = mp_arena_alloc_raw(g->arena, sizeof(mp_op) * (size_t)cap);
  if (n == NULL) {
    mp_sched_fail(g, MP_ERR_NOMEM, "out of memory building the step schedule");
    return 0;
  }
  if (g->n_ops) memcpy(n, g->ops, sizeof(mp_op) * (size_t)g->n_ops);
  g->ops = n;
  g->cap_ops = cap;
  return 1;
}

void mp_sched_seg_open(gen *g, mp_phase phase, int32_t layer, int32_t layer_step) {
  (void)layer_step;
  g->phase = (uint8_t)phase;
  g->when = phase == MP_PHASE_PROLOGUE || phase == MP_PHASE_OPTIMIZER ? MP_WHEN_ONCE
                                                                      : MP_WHEN_EVERY_MICRO;
  g->layer = layer;
  g->seg_first = g->n_ops;
}

void mp_sched_seg_close(gen *g, mp_phase phase, int32_t repeat, int32_t layer_step,
                        int32_t unit_step) {
  if (g->status != MP_OK) return;
  if (g->n_ops == g->seg_first) return; /* nothing emitted (e.g. a middle stage's head) */
  if (g->n_segs == g->cap_segs) {
    int32_t cap = g->cap_segs ? 2 * g->cap_segs : 32;
    mp_segment *n = mp_arena_alloc(g->arena, sizeof(mp_segment) * (size_t)cap);
    if (n == NULL) {
      mp_sched_fail(g, MP_ERR_NOMEM, "out of memory building the step schedule");
      return;
    }
    if (g->n_segs) memcpy(n, g->segs, sizeof(mp_segment) * (size_t)g->n_segs);
    g->segs = n;
    g->cap_segs = cap;
  }
  mp_segment *sg = &g->segs[g->n_segs++];
  sg->first_op = g->seg_first;
  sg->n_ops = g->n_ops - g->seg_first;
  sg->repeat = repeat;
  sg->layer_step = layer_step;
  sg->unit_step = unit_step;
  sg->phase = (uint8_t)phase;
  sg->chunk = g->chunk;
}

/* ---- GEMMs and Linears ---------------------------------------------------------------- */

static void cast(gen *g, int module, int64_t elems, mp_variant v) {
  compute(g, MP_KERNEL_FP8_CAST, v, module, elems, 0, 0, 1, FLOPS_CAST * (double)elems,
          5.0 * (double)elems, MP_DTYPE_BF16);
}

/* torchtitan's float8 tensor parallelism (torchao's PrepareFloat8ModuleInput in front of
 * Float8ColwiseParallel, parallelize_llama): the attention's and the dense MLP's input is
 * cast to float8 once, on the rank's tokens, and all-gathered in float8 (one byte an
 * element); q/k/v (gate/up) take that tensor as it is, and their backward the float8
 * input they saved, transposed for the weight gradient instead of cast again. Whether
 * Linear `module` reads such an input. */
static int f8_input(const gen *g, int module) {
  const shapes *sh = &g->sh;
  if (!sh->fp8_tp_codes) return 0;
  if (module == MP_MOD_Q || module == MP_MOD_K || module == MP_MOD_V)
    return sh->tp_opens_qkv && sh->fp8[MP_MOD_Q];
  if (module == MP_MOD_GATE || module == MP_MOD_UP) return sh->tp_opens_gateup && sh->fp8[MP_MOD_UP];
  return 0;
}

/* torchao's Float8RowwiseParallel (the closing Linears o and down under torchtitan's float8
 * tensor parallelism) ends its output with _NoopFwToFloat8BwDynamic: a no-op forward whose
 * backward casts the output gradient to float8 E5M2 before the backward of the sequence
 * reduce-scatter, the all-gather of that gradient, so the gather moves one byte an element
 * and the Linear's backward takes the gathered float8 gradient as it is
 * (torchao/float8/float8_tensor_parallel.py). Whether Linear `module` closes such a region
 * under sequence parallelism. */
static int f8_grad_out(const gen *g, int module) {
  const shapes *sh = &g->sh;
  if (!sh->fp8_tp_codes || !sh->sp) return 0;
  if (module == MP_MOD_O) return sh->tp_closes_o && sh->fp8[MP_MOD_O];
  if (module == MP_MOD_DOWN) return sh->tp_closes_down && sh->fp8[MP_MOD_DOWN];
  return 0;
}

/* A float8 tensor's transposed copy (one byte read, one written an element). */
static void transpose8(gen *g, int module, int64_t elems, mp_variant v) {
  compute(g, MP_KERNEL_FP8_CAST, v, module, elems, 0, 0, 1, 0.0, 2.0 * (double)elems,
          MP_DTYPE_FP8_E4M3);
}

/* y[T, out] = x[T, in] W^T (batch > 1: grouped expert GEMMs, m tokens per expert). */
static void linear_fwd(gen *g, int module, double m, int64_t out, int64_t in, int64_t batch) {
  if (skipped(g, SKIP_MOD(module))) return; /* its output kept by the AC policy */
  const int f8 = g->sh.fp8[module];
  if (!f8) {
    gemm(g, MP_VAR_FWD, module, m, out, in, batch, MP_DTYPE_BF16);
    return;
  }
  const int64_t mi = (int64_t)ceil(m) * batch;
  const int64_t w = out * in * batch, x = mi * in;
  if (g->fp8_codes) {
    /* codes: the input's (shared in the block; its amax from RMSNorm's or SwiGLU's kernel,
     * the attention output's read for it), then the weight's when FSDP-sharded (else the
     * resident codes, quantized once per step: rt_optimizer) */
    const int64_t wb = g->fp8_weights_sharded ? mp_act_f8_operand_bytes(w) : 0;
    const int src = mp_sched_f8_source(module);
    if (!(g->fp8_scope & (1u << src))) mp_sched_rt_f8_cast(g, module, x, src == 1, 1, MP_VAR_FWD);
    mp_sched_rt_f8_act(g, module, x);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 1);
    if (wb) mp_sched_rt_f8_cast(g, module, w, 1, 2, MP_VAR_FWD);
    gemm(g, MP_VAR_FWD, module, m, out, in, batch, MP_DTYPE_FP8_E4M3);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 0);
    return;
  }
  if (!g->sh.fp8_all_gather) cast(g, module, w, MP_VAR_FWD);
  if (!f8_input(g, module)) cast(g, module, x, MP_VAR_FWD);
  /* meshplan-cpu emulates float8 in fp32: one buffer of the quantized input (aligned) and
   * weight; the runtimes never all-gather float8 */
  const int64_t fb = g->ms->runtime ? mp_act_f8_emul_fwd_floats(x, w) * 4 : (g->sh.fp8_all_gather ? 0 : w) + x;
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 1);
  gemm(g, MP_VAR_FWD, module, m, out, in, batch, MP_DTYPE_FP8_E4M3);
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 0);
}

static void linear_bwd(gen *g, int module, double m, int64_t out, int64_t in, int64_t batch) {
  const int f8 = g->sh.fp8[module];
  if (!f8) {
    gemm(g, MP_VAR_DGRAD, module, m, in, out, batch, MP_DTYPE_BF16);
    gemm(g, MP_VAR_WGRAD, module, out, in, (int64_t)ceil(m), batch, MP_DTYPE_BF16);
    return;
  }
  const int64_t mi = (int64_t)ceil(m) * batch;
  const int64_t w = out * in * batch, x = mi * in, dy = mi * out;
  if (g->fp8_codes) {
    /* codes: dy's (E5M2, both orientations; gate's and up's amax from SwiGLU's backward
     * kernel), the weight's when sharded, DGRAD adding into the input gradient, then the
     * input's transposed codes (shared in the block; the amax its forward kept) */
    const int64_t db = mp_act_f8_operand_bytes(dy);
    const int64_t wb = g->fp8_weights_sharded ? mp_act_f8_operand_bytes(w) : 0;
    const int dy_known = (module == MP_MOD_GATE || module == MP_MOD_UP) && !g->sh.gpt &&
                         g->sh.fp8[MP_MOD_GATE] && g->sh.fp8[MP_MOD_UP];
    const int src = mp_sched_f8_source(module);
    pair(g, MP_MEM_FP8, BUF_F8_DY, db, 1);
    mp_sched_rt_f8_cast(g, module, dy, !dy_known, 2, MP_VAR_BWD);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 1);
    if (wb) mp_sched_rt_f8_cast(g, module, w, 1, 2, MP_VAR_BWD);
    gemm(g, MP_VAR_DGRAD, module, m, in, out, batch, MP_DTYPE_FP8_E5M2);
    if (!(g->fp8_scope & (1u << src))) mp_sched_rt_f8_cast(g, module, x, 0, 1, MP_VAR_BWD);
    mp_sched_rt_f8_act(g, module, x);
    gemm(g, MP_VAR_WGRAD, module, out, in, (int64_t)ceil(m), batch, MP_DTYPE_FP8_E5M2);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 0);
    pair(g, MP_MEM_FP8, BUF_F8_DY, db, 0);
    return;
  }
  if (!f8_grad_out(g, module)) cast(g, module, dy, MP_VAR_BWD);
  if (!g->sh.fp8_all_gather) cast(g, module, w, MP_VAR_BWD);
  if (f8_input(g, module))
    transpose8(g, module, x, MP_VAR_BWD);
  else
    cast(g, module, x, MP_VAR_BWD);
  const int64_t fb =
      g->ms->runtime ? mp_act_f8_emul_bwd_floats(dy, x, w) * 4 : dy + (g->sh.fp8_all_gather ? 0 : w) + x;
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 1);
  gemm(g, MP_VAR_DGRAD, module, m, in, out, batch, MP_DTYPE_FP8_E5M2);
  /* WGRAD's FLOPs with the exact token count: dW[out, in] = dy^T x, k = m x batch tokens
   * spread over the batch of experts. */
  gemm(g, MP_VAR_WGRAD, module, out, in, (int64_t)ceil(m), batch, MP_DTYPE_FP8_E5M2);
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 0);
}

/* WGRAD with k = m tokens: 2 x out x in x m x batch, the same as the forward. The gemm()
 * above takes m as the first size; for WGRAD m=out, k=tokens, so the FLOPs are exact
 * only when m is integral: fix them up for fractional expert token counts. */
static void fix_wgrad_flops(gen *g, int32_t first, double m_tokens) {
  for (int32_t i = first; i < g->n_ops; i++) {
    mp_op *op = &g->ops[i];
    if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_GEMM && op->variant == MP_VAR_WGRAD)
      op->flops = 2.0 * (double)op->m * (double)op->n * m_tokens * (double)op->batch;
  }
}

/* ---- tensor- and expert-parallel collectives ------------------------------------------ */

/* Activations travel as X elements: bf16 under torchtitan, the runtimes' X (fp32 on the CPU). */
static double act_comm_bytes(const gen *g) { return (double)g->ms->x_bytes; }

static mp_dtype act_comm_dtype(const gen *g) { return g->ms->x_bytes == 4 ? MP_DTYPE_FP32 : MP_DTYPE_BF16; }

/* A TP region's boundary collectives on [T, H] X elements (payload: the full tensor, as
 * schedule.h counts all-gather, reduce-scatter and all-reduce alike). A region is the
 * colwise Linears after a norm, up to the rowwise Linear that closes it (Megatron's f and
 * g operators, Shoeybi et al. 2019; with sequence parallelism Korthikanti et al. 2022's
 * g and g-bar):
 *   entering, forward   SP: all-gather of the sequence shards; else nothing
 *   leaving, forward    SP: reduce-scatter of the partial sums; else all-reduce
 *   leaving, backward   SP: all-gather of the output gradient; else nothing
 *   entering, backward  SP: reduce-scatter of the input gradient; else all-reduce
 * `on`: the region's Linears are tensor-parallel (tp > 1). Under RECOMPUTE a collective
 * whose output the AC policy keeps is skipped (SKIP_RS). */
static void tp_coll(gen *g, mp_coll c, int module) {
  const shapes *sh = &g->sh;
  comm(g, c, MP_GROUP_TP, MP_STREAM_COMPUTE, act_comm_bytes(g) * (double)(sh->tokens * sh->d_model),
       act_comm_dtype(g), module);
}

/* Entering a region forward; with `f8` (f8_input) its input cast to float8 first and, under
 * SP, gathered in float8. */
static void tp_region_in_fwd(gen *g, int on, int module, int f8) {
  const shapes *sh = &g->sh;
  if (!on) return;
  if (f8) cast(g, module, sh->tokens_sp * sh->d_model, MP_VAR_FWD);
  if (!sh->sp) return;
  if (f8)
    comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, MP_STREAM_COMPUTE, (double)(sh->tokens * sh->d_model),
         MP_DTYPE_FP8_E4M3, module);
  else
    tp_coll(g, MP_COLL_ALL_GATHER, module);
}

static void tp_region_out_fwd(gen *g, int on, int module) {
  if (!on || (g->sh.sp && skipped(g, SKIP_RS))) return;
  tp_coll(g, g->sh.sp ? MP_COLL_REDUCE_SCATTER : MP_COLL_ALL_REDUCE, module);
}

static void tp_region_out_bwd(gen *g, int on, int module) {
  const shapes *sh = &g->sh;
  if (!on || !sh->sp) return;
  if (f8_grad_out(g, module)) { /* cast on the rank's shard, gathered in float8 */
    cast(g, module, sh->tokens_sp * sh->d_model, MP_VAR_BWD);
    comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, MP_STREAM_COMPUTE, (double)(sh->tokens * sh->d_model),
         MP_DTYPE_FP8_E5M2, module);
    return;
  }
  tp_coll(g, MP_COLL_ALL_GATHER, module);
}

static void tp_region_in_bwd(gen *g, int on, int module) {
  if (on) tp_coll(g, g->sh.sp ? MP_COLL_REDUCE_SCATTER : MP_COLL_ALL_REDUCE, module);
}

/* AsyncTP (mp_fuse, schedule.h): the plan asks for it and the block's TP regions run SP's
 * all-gathers and reduce-scatters. torchtitan's is torch.compile's micro-pipeline pass;
 * Megatron-Core's --tp-comm-overlap pipelines the same pairs in Transformer Engine
 * (userbuffers: ring-exchange all-gather into the qkv and fc1 GEMMs, pipelined
 * reduce-scatter out of proj and fc2, the output-gradient all-gather into proj's and fc2's
 * input-gradient GEMMs; transformer_engine/pytorch/module/base.py, initialize_ub). TE's
 * "bulk" overlaps in backward (the input-gradient reduce-scatter beside the weight-gradient
 * GEMM, the input's re-gather beside the input-gradient GEMM, which mg_regather runs on the
 * gather stream) are not priced as fused. The meshplan runtimes have no such fusion; the
 * plan refuses tp_comm_fused under their memory models. */
static int async_tp(const gen *g) {
  return g->p->opts.tp_comm_fused && g->sh.sp && g->sh.tp > 1 && !g->ms->runtime;
}

/* Marks the TP collective of `kind` (all-gather or reduce-scatter) emitted since op `from`
 * and the GEMMs of variant v emitted since then as one fused pair. The patterns torch's
 * micro-pipeline pass fuses in a torchtitan block: the sequence all-gather into q, k, v
 * and into gate, up; o's and down's output into their reduce-scatter (forward, and the
 * recompute under AC); in backward the all-gather of o's and down's output gradient into
 * their input-gradient GEMMs. The reduce-scatters of the regions' input gradients are not
 * fused: each sums several GEMMs' outputs (q, k and v; gate and up) before it, and the
 * weight-gradient GEMMs take the gathered tensor transposed, which the pass does not
 * match. */
static void fuse_tp(gen *g, int32_t from, mp_fuse kind, mp_variant v) {
  if (!async_tp(g)) return;
  const mp_coll c = kind == MP_FUSE_GATHER ? MP_COLL_ALL_GATHER : MP_COLL_REDUCE_SCATTER;
  int32_t coll = -1;
  for (int32_t i = from; i < g->n_ops && coll < 0; i++)
    if (g->ops[i].type == MP_OP_COMM && g->ops[i].group == MP_GROUP_TP && g->ops[i].coll == c &&
        g->ops[i].stream == MP_STREAM_COMPUTE)
      coll = i;
  if (coll < 0) return; /* none (a recompute that keeps the region's output) */
  g->ops[coll].fused = (uint8_t)kind;
  for (int32_t i = from; i < g->n_ops; i++) {
    mp_op *op = &g->ops[i];
    if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_GEMM && op->variant == v &&
        (kind == MP_FUSE_GATHER ? i > coll : i < coll))
      op->fused = (uint8_t)kind;
  }
}

static void ep_alltoall(gen *g, int module) {
  const shapes *sh = &g->sh;
  if (sh->ep <= 1) return;
  comm(g, MP_COLL_ALL_TO_ALL, MP_GROUP_EP, MP_STREAM_COMPUTE,
       act_comm_bytes(g) * (double)(sh->tokens * sh->top_k * sh->d_model), act_comm_dtype(g), module);
}

/* Megatron-LM's sequence parallelism saves a column-parallel region's input on the
 * sequence shard and all-gathers it again in backward for the weight gradients, the
 * gather overlapping the input-gradient GEMMs (Korthikanti et al. 2022, section 4.2.2):
 * the gather (on the gather stream, which Megatron's FSDP-free layout leaves free) and its
 * [T, H] buffer before the region's backward GEMMs; mg_regather_wait makes the region's
 * first weight gradient wait for it. Returns the gather, -1 where there is none. */
static int32_t mg_regather(gen *g, int on, int module) {
  const shapes *sh = &g->sh;
  if (!(g->ms->sp_regathers && sh->sp && on)) return -1;
  pair(g, MP_MEM_TEMP, BUF_SP_GATHER, 2 * sh->tokens * sh->d_model, 1);
  const int32_t i = comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, MP_STREAM_GATHER,
                         2.0 * (double)(sh->tokens * sh->d_model), MP_DTYPE_BF16, module);
  add_dep(g, i, g->last_compute, 0);
  return i;
}

static void mg_regather_wait(gen *g, int32_t gather, int32_t first_op) {
  if (gather < 0) return;
  for (int32_t i = first_op; i < g->n_ops; i++)
    if (g->ops[i].type == MP_OP_COMPUTE && g->ops[i].kernel == MP_KERNEL_GEMM &&
        g->ops[i].variant == MP_VAR_WGRAD) {
      add_dep(g, i, gather, 0);
      break;
    }
  pair(g, MP_MEM_TEMP, BUF_SP_GATHER, 2 * g->sh.tokens * g->sh.d_model, 0);
}

/* ---- one block ------------------------------------------------------------------------ */

static void norm_fwd(gen *g, int module, int64_t rows, int64_t width) {
  if (skipped(g, SKIP_MOD(module))) return;
  const int64_t e = rows * width;
  elementwise(g, MP_KERNEL_NORM, MP_VAR_FWD, module, e, FLOPS_NORM_FWD, 4.0 * (double)e);
}

static void norm_bwd(gen *g, int module, int64_t rows, int64_t width) {
  const int64_t e = rows * width;
  elementwise(g, MP_KERNEL_NORM, MP_VAR_BWD, module, e, FLOPS_NORM_BWD, 6.0 * (double)e);
}

static void residual(gen *g, mp_variant v, int64_t elems) {
  if (skipped(g, SKIP_RESIDUAL)) return;
  elementwise(g, MP_KERNEL_RESIDUAL, v, -1, elems, 1.0, 6.0 * (double)elems);
}

/* RoPE on q and k: one op, or (the runtimes call it for q, then for k) two. */
static void rope(gen *g, mp_variant v) {
  const shapes *sh = &g->sh;
  if (sh->gpt) return;
  const int64_t eq = sh->tokens * sh->q_width, ek = sh->tokens * sh->kv_width;
  if (g->ms->runtime) {
    elementwise(g, MP_KERNEL_ROPE, v, -1, eq, FLOPS_ROPE, 4.0 * (double)eq);
    elementwise(g, MP_KERNEL_ROPE, v, -1, ek, FLOPS_ROPE, 4.0 * (double)ek);
  } else {
    elementwise(g, MP_KERNEL_ROPE, v, -1, eq + ek, FLOPS_ROPE, 4.0 * (double)(eq + ek));
  }
}

/* The residual stream's gradient: an add of its own in autograd; the runtimes' backward
 * kernels accumulate into it (ops.h: gradients accumulate), so nothing. */
static void residual_bwd(gen *g, int64_t elems) {
  if (!g->ms->runtime) residual(g, MP_VAR_BWD, elems);
}

/* Megatron-LM's materialized core attention on s x s scores per sequence and head
 * (Shoeybi et al. 2019): QK^T and attention x V as batched GEMMs over micro_batch x heads
 * (the full square, 2 T s q FLOPs each: the fused kernel masks, it does not skip), the
 * fused scale-mask-softmax (2 bytes read, 2 written per score) and for GPT the attention
 * dropout (its 1-byte mask written too). Backward: dV = P^T dO and dP = dO V^T, the dropout
 * and softmax backwards, dQ = dS K and dK = dS^T Q; dP lives as a TEMP. */
static void core_materialized(gen *g, int bwd) {
  const shapes *sh = &g->sh;
  const double s = (double)sh->seq, scores = (double)sh->tokens * s * (double)sh->heads;
  const int64_t batch = sh->tokens / sh->seq * sh->heads;
  if (!bwd) {
    gemm(g, MP_VAR_FWD, -1, s, sh->seq, sh->head_dim, batch, MP_DTYPE_BF16);
    compute(g, MP_KERNEL_ACTIVATION, MP_VAR_FWD, -1, (int64_t)scores, 0, 0, 1, 5.0 * scores,
            4.0 * scores, MP_DTYPE_BF16);
    if (sh->gpt)
      compute(g, MP_KERNEL_ACTIVATION, MP_VAR_FWD, -1, (int64_t)scores, 0, 0, 1, 2.0 * scores,
              5.0 * scores, MP_DTYPE_BF16);
    gemm(g, MP_VAR_FWD, -1, s, sh->v_head_dim, sh->seq, batch, MP_DTYPE_BF16);
    return;
  }
  pair(g, MP_MEM_TEMP, BUF_SCORES_GRAD, (int64_t)(2.0 * scores), 1);
  gemm(g, MP_VAR_DGRAD, -1, s, sh->v_head_dim, sh->seq, batch, MP_DTYPE_BF16);
  gemm(g, MP_VAR_DGRAD, -1, s, sh->seq, sh->v_head_dim, batch, MP_DTYPE_BF16);
  if (sh->gpt)
    compute(g, MP_KERNEL_ACTIVATION, MP_VAR_BWD, -1, (int64_t)scores, 0, 0, 1, 2.0 * scores,
            5.0 * scores, MP_DTYPE_BF16);
  compute(g, MP_KERNEL_ACTIVATION, MP_VAR_BWD, -1, (int64_t)scores, 0, 0, 1, 4.0 * scores,
          6.0 * scores, MP_DTYPE_BF16);
  gemm(g, MP_VAR_DGRAD, -1, s, sh->head_dim, sh->seq, batch, MP_DTYPE_BF16);
  gemm(g, MP_VAR_DGRAD, -1, s, sh->head_dim, sh->seq, batch, MP_DTYPE_BF16);
  pair(g, MP_MEM_TEMP, BUF_SCORES_GRAD, (int64_t)(2.0 * scores), 0);
}

void mp_sched_attention_core_fwd(gen *g) {
  if (skipped(g, SKIP_CORE)) return;
  const shapes *sh = &g->sh;
  if (sh->cp > 1) { /* ring attention (schedule_cp.c) */
    if (g->ms->runtime) mp_sched_rt_cp_attention_fwd(g);
    else mp_sched_cp_attention_fwd(g);
    return;
  }
  if (g->p->opts.attn == MP_ATTN_MATERIALIZED) {
    core_materialized(g, 0);
    return;
  }
  const int64_t T = sh->tokens;
  compute(g, MP_KERNEL_ATTENTION, MP_VAR_FWD, -1, T, sh->seq, sh->head_dim, sh->heads,
          attn_core_fwd_flops(sh),
          2.0 * (double)(T * (sh->q_width + sh->attn_out + sh->kv_width + sh->v_width)) + 4.0 * (double)(T * sh->heads),
          MP_DTYPE_BF16);
}

void mp_sched_attention_core_bwd(gen *g) {
  const shapes *sh = &g->sh;
  if (sh->cp > 1) {
    if (g->ms->runtime) mp_sched_rt_cp_attention_bwd(g);
    else mp_sched_cp_attention_bwd(g);
    return;
  }
  if (g->p->opts.attn == MP_ATTN_MATERIALIZED) {
    core_materialized(g, 1);
    return;
  }
  const int64_t T = sh->tokens;
  compute(g, MP_KERNEL_ATTENTION, MP_VAR_BWD, -1, T, sh->seq, sh->head_dim, sh->heads,
          2.0 * attn_core_fwd_flops(sh),
          2.0 * (double)(T * (2 * (sh->q_width + sh->attn_out) + 2 * (sh->kv_width + sh->v_width))) +
              4.0 * (double)(T * sh->heads),
          MP_DTYPE_BF16);
}

/* attention_norm on the residual stream's [Ts, H], then the attention module: the TP region
 * entered (SP: all-gather to [T, H]), q/k/v, q/k norms, RoPE, the core. */
void mp_sched_attention_fwd(gen *g, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  attach(g, pd, PART_ATTN);
  norm_fwd(g, MP_MOD_ATTN_NORM, sh->tokens_sp, H);
  if (sh->mla) {
    mp_sched_mla_fwd(g);
    mp_sched_attention_core_fwd(g);
    return;
  }
  const int32_t qkv = g->n_ops;
  tp_region_in_fwd(g, sh->tp_opens_qkv, MP_MOD_Q, f8_input(g, MP_MOD_Q));
  linear_fwd(g, MP_MOD_Q, (double)T, sh->q_width, H, 1);
  linear_fwd(g, MP_MOD_K, (double)T, sh->kv_width, H, 1);
  linear_fwd(g, MP_MOD_V, (double)T, sh->kv_width, H, 1);
  if (sh->tp_opens_qkv) fuse_tp(g, qkv, MP_FUSE_GATHER, MP_VAR_FWD);
  if (sh->qk_norm) {
    norm_fwd(g, MP_MOD_Q_NORM, T * sh->heads, sh->head_dim);
    norm_fwd(g, MP_MOD_K_NORM, T * sh->kv_heads, sh->head_dim);
  }
  rope(g, MP_VAR_FWD);
  mp_sched_attention_core_fwd(g);
}

/* o_proj, the region left (SP: reduce-scatter; else all-reduce), the residual add. */
void mp_sched_attention_out_fwd(gen *g) {
  const shapes *sh = &g->sh;
  mp_sched_rt_sp(g, 1);
  const int32_t o = g->n_ops;
  linear_fwd(g, MP_MOD_O, (double)sh->tokens, sh->d_model, sh->attn_out, 1);
  tp_region_out_fwd(g, sh->tp_closes_o, MP_MOD_O);
  if (sh->tp_closes_o) fuse_tp(g, o, MP_FUSE_SCATTER, MP_VAR_FWD);
  mp_sched_rt_sp(g, 0);
  residual(g, MP_VAR_FWD, sh->tokens_sp * sh->d_model);
}

static void swiglu(gen *g, mp_variant v, int module, int64_t elems) {
  if (v == MP_VAR_FWD)
    elementwise(g, MP_KERNEL_ACTIVATION, v, module, elems, FLOPS_SWIGLU_FWD, 6.0 * (double)elems);
  else
    elementwise(g, MP_KERNEL_ACTIVATION, v, module, elems, FLOPS_SWIGLU_BWD, 10.0 * (double)elems);
}

/* The routed experts' GEMMs: one grouped op per Linear (batch = the local experts, m_exp
 * rows each), or, in the runtimes (the runtime's experts_forward / experts_backward), one
 * GEMM per (source EP rank, local expert) block of m_exp / ep rows under balanced routing,
 * each a launch of its own and as efficient as its size: the forward's gate and up block
 * by block, then down; the backward's down, then gate and up block by block. Float8
 * experts keep the grouped op (the runtimes run their experts without float8). */
static int expert_blocks(const gen *g) {
  const shapes *sh = &g->sh;
  return g->ms->runtime && !sh->fp8[MP_MOD_EXPERTS_GATE] && !sh->fp8[MP_MOD_EXPERTS_UP] &&
                 !sh->fp8[MP_MOD_EXPERTS_DOWN]
             ? sh->ep * sh->experts_local
             : 0;
}

static void experts_gate_up_fwd(gen *g, int64_t H) {
  const shapes *sh = &g->sh;
  const int nb = expert_blocks(g);
  if (nb == 0) {
    linear_fwd(g, MP_MOD_EXPERTS_GATE, sh->tokens_per_expert, sh->d_ff_expert, H, sh->experts_local);
    linear_fwd(g, MP_MOD_EXPERTS_UP, sh->tokens_per_expert, sh->d_ff_expert, H, sh->experts_local);
  }
  for (int b = 0; b < nb; b++) {
    linear_fwd(g, MP_MOD_EXPERTS_GATE, sh->tokens_per_expert / sh->ep, sh->d_ff_expert, H, 1);
    linear_fwd(g, MP_MOD_EXPERTS_UP, sh->tokens_per_expert / sh->ep, sh->d_ff_expert, H, 1);
  }
}

static void experts_down_fwd(gen *g, int64_t H) {
  const shapes *sh = &g->sh;
  const int nb = expert_blocks(g);
  if (nb == 0) linear_fwd(g, MP_MOD_EXPERTS_DOWN, sh->tokens_per_expert, H, sh->d_ff_expert, sh->experts_local);
  for (int b = 0; b < nb; b++) linear_fwd(g, MP_MOD_EXPERTS_DOWN, sh->tokens_per_expert / sh->ep, H, sh->d_ff_expert, 1);
}

/* The routed experts' backward, their SwiGLU's between down and gate/up; WGRAD FLOPs with
 * the exact (fractional) rows per GEMM. */
static void experts_bwd(gen *g, int64_t H, int64_t Tk) {
  const shapes *sh = &g->sh;
  const int nb = expert_blocks(g);
  const int32_t first = g->n_ops;
  if (nb == 0) {
    linear_bwd(g, MP_MOD_EXPERTS_DOWN, sh->tokens_per_expert, H, sh->d_ff_expert, sh->experts_local);
    swiglu(g, MP_VAR_BWD, MP_MOD_EXPERTS_GATE, Tk * sh->d_ff_expert);
    linear_bwd(g, MP_MOD_EXPERTS_GATE, sh->tokens_per_expert, sh->d_ff_expert, H, sh->experts_local);
    linear_bwd(g, MP_MOD_EXPERTS_UP, sh->tokens_per_expert, sh->d_ff_expert, H, sh->experts_local);
  } else {
    const double m = sh->tokens_per_expert / sh->ep;
    for (int b = 0; b < nb; b++) linear_bwd(g, MP_MOD_EXPERTS_DOWN, m, H, sh->d_ff_expert, 1);
    swiglu(g, MP_VAR_BWD, MP_MOD_EXPERTS_GATE, Tk * sh->d_ff_expert);
    for (int b = 0; b < nb; b++) {
      linear_bwd(g, MP_MOD_EXPERTS_GATE, m, sh->d_ff_expert, H, 1);
      linear_bwd(g, MP_MOD_EXPERTS_UP, m, sh->d_ff_expert, H, 1);
    }
  }
  if (g->status == MP_OK) fix_wgrad_flops(g, first, nb == 0 ? sh->tokens_per_expert : sh->tokens_per_expert / sh->ep);
}

void mp_sched_mlp_fwd(gen *g, int kind, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  /* the runtimes' full-AC recompute refills the block's saved tensors and stops there: no
   * down projection, unpermute or shared-expert output (the runtime's block_forward without
   * x_out) */
  const int out = !(g->ms->runtime && g->phase == MP_PHASE_RECOMPUTE);
  attach(g, pd, PART_MOE);
  norm_fwd(g, MP_MOD_FFN_NORM, sh->tokens_sp, H);
  /* the MLP's region: the dense MLP's colwise Linears; a MoE block's router and experts
   * read the whole sequence too (the routed experts are replicated over tp) */
  const int32_t in = g->n_ops;
  tp_region_in_fwd(g, kind == KIND_DENSE ? sh->tp_opens_gateup : sh->tp > 1, MP_MOD_UP,
                   kind == KIND_DENSE && f8_input(g, MP_MOD_UP));
  if (kind == KIND_DENSE) {
    if (sh->gpt) {
      linear_fwd(g, MP_MOD_UP, (double)T, sh->d_ff, H, 1);
      if (sh->tp_opens_gateup) fuse_tp(g, in, MP_FUSE_GATHER, MP_VAR_FWD);
      elementwise(g, MP_KERNEL_ACTIVATION, MP_VAR_FWD, MP_MOD_UP, T * sh->d_ff, FLOPS_GELU_FWD,
                  4.0 * (double)(T * sh->d_ff));
    } else {
      linear_fwd(g, MP_MOD_GATE, (double)T, sh->d_ff, H, 1);
      linear_fwd(g, MP_MOD_UP, (double)T, sh->d_ff, H, 1);
      if (sh->tp_opens_gateup) fuse_tp(g, in, MP_FUSE_GATHER, MP_VAR_FWD);
      swiglu(g, MP_VAR_FWD, MP_MOD_GATE, T * sh->d_ff);
    }
    if (!out) return;
    mp_sched_rt_sp(g, 1);
    const int32_t down = g->n_ops;
    linear_fwd(g, MP_MOD_DOWN, (double)T, H, sh->d_ff, 1);
    tp_region_out_fwd(g, sh->tp_closes_down, MP_MOD_DOWN);
    if (sh->tp_closes_down) fuse_tp(g, down, MP_FUSE_SCATTER, MP_VAR_FWD);
    mp_sched_rt_sp(g, 0);
  } else {
    const int64_t Tk = T * sh->top_k;
    linear_fwd(g, MP_MOD_ROUTER, (double)T, sh->experts, H, 1);
    elementwise(g, MP_KERNEL_ROUTER, MP_VAR_FWD, MP_MOD_ROUTER, T * sh->experts, FLOPS_ROUTER,
                6.0 * (double)(T * sh->experts) + 12.0 * (double)Tk);
    elementwise(g, MP_KERNEL_PERMUTE, MP_VAR_FWD, -1, Tk * H, 0.0,
                2.0 * (double)(T * H) + 2.0 * (double)(Tk * H));
    /* the runtimes under EP: the expert side (sized by the rows received) is saved for
     * backward; the expert outputs wait in a COMM buffer for the combine */
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EPA, kind, 1);
    ep_alltoall(g, MP_MOD_EXPERTS_GATE);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EP_OUT, kind, 1);
    attach(g, pd, PART_EXPERTS);
    experts_gate_up_fwd(g, H);
    swiglu(g, MP_VAR_FWD, MP_MOD_EXPERTS_GATE, Tk * sh->d_ff_expert);
    experts_down_fwd(g, H);
    ep_alltoall(g, MP_MOD_EXPERTS_DOWN);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EP_OUT, kind, 0);
    if (out) {
      mp_sched_rt_sp(g, 1); /* the runtimes' SP: the routed output on all T rows */
      elementwise(g, MP_KERNEL_UNPERMUTE, MP_VAR_FWD, -1, Tk * H, 2.0,
                  2.0 * (double)(Tk * H) + 2.0 * (double)(T * H));
    }
    if (sh->has_shared) {
      linear_fwd(g, MP_MOD_SHARED_GATE, (double)T, sh->d_ff_shared, H, 1);
      linear_fwd(g, MP_MOD_SHARED_UP, (double)T, sh->d_ff_shared, H, 1);
      swiglu(g, MP_VAR_FWD, MP_MOD_SHARED_GATE, T * sh->d_ff_shared);
      if (!out) return;
      mp_sched_rt_mem(g, MP_ACT_ALLOC_SHARED_OUT, kind, 1); /* the runtimes' partial sum */
      linear_fwd(g, MP_MOD_SHARED_DOWN, (double)T, H, sh->d_ff_shared, 1);
      tp_region_out_fwd(g, sh->tp_closes_shared_down, MP_MOD_SHARED_DOWN);
      residual(g, MP_VAR_FWD, sh->tokens_sp * H); /* routed + shared */
      mp_sched_rt_mem(g, MP_ACT_ALLOC_SHARED_OUT, kind, 0);
    }
    if (!out) return;
    mp_sched_rt_sp(g, 0); /* its rows on the shard taken */
  }
  residual(g, MP_VAR_FWD, sh->tokens_sp * H);
}

void mp_sched_mlp_bwd(gen *g, int kind, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  attach(g, pd, PART_MOE);
  if (kind == KIND_DENSE) {
    mp_sched_rt_sp(g, 1);
    const int32_t down = g->n_ops;
    tp_region_out_bwd(g, sh->tp_closes_down, MP_MOD_DOWN);
    linear_bwd(g, MP_MOD_DOWN, (double)T, H, sh->d_ff, 1);
    if (sh->tp_closes_down) fuse_tp(g, down, MP_FUSE_GATHER, MP_VAR_DGRAD);
    mp_sched_rt_sp(g, 0);
    const int32_t first = g->n_ops, ag = mg_regather(g, sh->tp_opens_gateup, MP_MOD_UP);
    if (sh->gpt) {
      elementwise(g, MP_KERNEL_ACTIVATION, MP_VAR_BWD, MP_MOD_UP, T * sh->d_ff, FLOPS_GELU_BWD,
                  6.0 * (double)(T * sh->d_ff));
      linear_bwd(g, MP_MOD_UP, (double)T, sh->d_ff, H, 1);
    } else {
      swiglu(g, MP_VAR_BWD, MP_MOD_GATE, T * sh->d_ff);
      linear_bwd(g, MP_MOD_GATE, (double)T, sh->d_ff, H, 1);
      linear_bwd(g, MP_MOD_UP, (double)T, sh->d_ff, H, 1);
    }
    mg_regather_wait(g, ag, first);
    tp_region_in_bwd(g, sh->tp_opens_gateup, MP_MOD_UP);
  } else {
    const int64_t Tk = T * sh->top_k;
    /* the runtimes' SP: the residual gradient all-gathered once for the shared expert and
     * the routed side (exec/runtime/runtime_sp.c); the routed side's input gradient is whole
     * on every tp rank, which keeps its rows on the shard: no reduce-scatter of its own */
    const int rt_sp = g->ms->runtime && sh->sp;
    mp_sched_rt_sp(g, 1);
    if (rt_sp && !sh->tp_closes_shared_down) tp_region_out_bwd(g, 1, MP_MOD_ROUTER);
    if (sh->has_shared) {
      tp_region_out_bwd(g, sh->tp_closes_shared_down, MP_MOD_SHARED_DOWN);
      linear_bwd(g, MP_MOD_SHARED_DOWN, (double)T, H, sh->d_ff_shared, 1);
      swiglu(g, MP_VAR_BWD, MP_MOD_SHARED_GATE, T * sh->d_ff_shared);
      linear_bwd(g, MP_MOD_SHARED_GATE, (double)T, sh->d_ff_shared, H, 1);
      linear_bwd(g, MP_MOD_SHARED_UP, (double)T, sh->d_ff_shared, H, 1);
      tp_region_in_bwd(g, sh->tp_opens_shared_gateup, MP_MOD_SHARED_UP);
    } else if (sh->sp && !rt_sp) {
      tp_region_in_bwd(g, sh->tp > 1, MP_MOD_ROUTER); /* the routed side's to its shard */
    }
    elementwise(g, MP_KERNEL_UNPERMUTE, MP_VAR_BWD, -1, Tk * H, 2.0,
                2.0 * (double)(T * H) + 4.0 * (double)(Tk * H));
    mp_sched_rt_sp(g, 0);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EP_WS, kind, 1); /* the expert side's gradients (EP) */
    ep_alltoall(g, MP_MOD_EXPERTS_DOWN);
    attach(g, pd, PART_EXPERTS);
    experts_bwd(g, H, Tk);
    ep_alltoall(g, MP_MOD_EXPERTS_GATE);
    mp_sched_rt_mem(g, MP_ACT_ALLOC_EP_WS, kind, 0);
    elementwise(g, MP_KERNEL_PERMUTE, MP_VAR_BWD, -1, Tk * H, 1.0,
                2.0 * (double)(Tk * H) + 2.0 * (double)(T * H));
    elementwise(g, MP_KERNEL_ROUTER, MP_VAR_BWD, MP_MOD_ROUTER, T * sh->experts, FLOPS_ROUTER,
                10.0 * (double)(T * sh->experts));
    linear_bwd(g, MP_MOD_ROUTER, (double)T, sh->experts, H, 1);
  }
  norm_bwd(g, MP_MOD_FFN_NORM, sh->tokens_sp, H);
  residual_bwd(g, sh->tokens_sp * H);
}

void mp_sched_attention_bwd(gen *g, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  attach(g, pd, PART_ATTN);
  mp_sched_rt_sp(g, 1);
  const int32_t o = g->n_ops;
  tp_region_out_bwd(g, sh->tp_closes_o, MP_MOD_O);
  linear_bwd(g, MP_MOD_O, (double)T, H, sh->attn_out, 1);
  if (sh->tp_closes_o) fuse_tp(g, o, MP_FUSE_GATHER, MP_VAR_DGRAD);
  mp_sched_rt_sp(g, 0);
  mp_sched_attention_core_bwd(g);
  if (sh->mla) {
    mp_sched_mla_bwd(g);
    norm_bwd(g, MP_MOD_ATTN_NORM, sh->tokens_sp, H);
    residual_bwd(g, sh->tokens_sp * H);
    return;
  }
  rope(g, MP_VAR_BWD);
  if (sh->qk_norm) {
    norm_bwd(g, MP_MOD_K_NORM, T * sh->kv_heads, sh->head_dim);
    norm_bwd(g, MP_MOD_Q_NORM, T * sh->heads, sh->head_dim);
  }
  const int32_t first = g->n_ops, ag = mg_regather(g, sh->tp_opens_qkv, MP_MOD_Q);
  if (g->ms->runtime) { /* the runtime's order (its float8 operand of xn1 comes with q) */
    linear_bwd(g, MP_MOD_Q, (double)T, sh->q_width, H, 1);
    linear_bwd(g, MP_MOD_K, (double)T, sh->kv_width, H, 1);
    linear_bwd(g, MP_MOD_V, (double)T, sh->kv_width, H, 1);
  } else {
    linear_bwd(g, MP_MOD_V, (double)T, sh->kv_width, H, 1);
    linear_bwd(g, MP_MOD_K, (double)T, sh->kv_width, H, 1);
    linear_bwd(g, MP_MOD_Q, (double)T, sh->q_width, H, 1);
  }
  mg_regather_wait(g, ag, first);
  tp_region_in_bwd(g, sh->tp_opens_qkv, MP_MOD_Q);
  norm_bwd(g, MP_MOD_ATTN_NORM, sh->tokens_sp, H);
  residual_bwd(g, sh->tokens_sp * H);
}

/* ---- the building blocks schedule_mla.c shares (schedule_internal.h) ------------------ */

void mp_sched_linear(gen *g, int bwd, int module, double m, int64_t out, int64_t in) {
  if (bwd) linear_bwd(g, module, m, out, in, 1);
  else linear_fwd(g, module, m, out, in, 1);
}

void mp_sched_norm(gen *g, int bwd, int module, int64_t rows, int64_t width) {
  if (bwd) norm_bwd(g, module, rows, width);
  else norm_fwd(g, module, rows, width);
}

void mp_sched_tp_region_in(gen *g, int bwd, int on, int module) {
  if (bwd) tp_region_in_bwd(g, on, module);
  else tp_region_in_fwd(g, on, module, 0);
}

int32_t mp_sched_mg_regather(gen *g, int on, int module) { return mg_regather(g, on, module); }

void mp_sched_mg_regather_wait(gen *g, int32_t gather, int32_t first_op) {
  mg_regather_wait(g, gather, first_op);
}

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
  tp_region_out_fwd(g, sh->tp_emb_vocab, MP_MOD_TOK_EMBEDDINGS);
  mp_sched_rt_sp(g, 0);
  if (sh->gpt) {
    elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_FWD, MP_MOD_POS_EMBEDDINGS, es, 0.0,
                4.0 * (double)es);
    residual(g, MP_VAR_FWD, es);
  }
}

void mp_sched_embedding_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t e = sh->tokens * sh->d_model, es = sh->tokens_sp * sh->d_model;
  if (sh->gpt)
    elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_BWD, MP_MOD_POS_EMBEDDINGS, es, 1.0,
                6.0 * (double)es);
  mp_sched_rt_sp(g, 1);
  tp_region_out_bwd(g, sh->tp_emb_vocab, MP_MOD_TOK_EMBEDDINGS);
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
  return 2 * sh->tokens_sp * sh->d_model + (sh->gpt ? 8 : 4) * sh->tokens_sp + 2 * sh->tokens * sh->d_model;
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
static void loss_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t TV = sh->tokens * sh->vocab_loss;
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
  } else if (li == MP_LOSS_INPLACE) {
    pair(g, MP_MEM_LOGITS, BUF_LOGITS_F32, 4 * TV, 1); /* the softmax, in place, saved */
  }
  elementwise(g, MP_KERNEL_LOSS, MP_VAR_FWD, head_module(sh), TV, FLOPS_LOSS, bytes);
  if (sh->loss_parallel)
    for (int i = 0; i < 3; i++)
      comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_TP, MP_STREAM_COMPUTE, 4.0 * (double)sh->tokens,
           MP_DTYPE_FP32, head_module(sh));
  if (li == MP_LOSS_FUSED) {
    pair(g, MP_MEM_LOGITS, BUF_LSE, 4 * sh->tokens, 1); /* the bf16 logits stay, with the lse */
    return;
  }
  if (li == MP_LOSS_EAGER) pair(g, MP_MEM_LOGITS, BUF_LOGITS_F32, 4 * TV, 0);
  pair(g, MP_MEM_LOGITS, BUF_LOGITS, 2 * TV, 0); /* torchtitan's `del pred` */
}

/* The loss backward down to the bf16 gradient of the rank's V_l logit columns (DLOGITS,
 * allocated on exit), everything loss_fwd held released. */
static void loss_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t TV = sh->tokens * sh->vocab_loss, dl = 2 * sh->tokens * sh->vocab_local;
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
  } else if (li == MP_LOSS_EAGER) {
    pair(g, MP_MEM_LOGITS, BUF_DLOGITS_F32, 4 * TV, 1); /* nll_loss's gradient */
    pair(g, MP_MEM_LOGITS, BUF_DLSM_F32, 4 * TV, 1);    /* log_softmax's input gradient */
  }
  elementwise(g, MP_KERNEL_LOSS, MP_VAR_BWD, head_module(sh), TV, 2.0, bytes);
  if (li == MP_LOSS_EAGER) {
    pair(g, MP_MEM_LOGITS, BUF_DLOGITS_F32, 4 * TV, 0);
    pair(g, MP_MEM_LOGITS, BUF_LOGITS_LSM, 4 * TV, 0);
  }
  pair(g, MP_MEM_LOGITS, BUF_DLOGITS, dl, 1); /* the bf16 cast (a slice when gathered) */
  if (li == MP_LOSS_EAGER) pair(g, MP_MEM_LOGITS, BUF_DLSM_F32, 4 * TV, 0);
  if (li == MP_LOSS_INPLACE) pair(g, MP_MEM_LOGITS, BUF_LOGITS_F32, 4 * TV, 0);
  if (li == MP_LOSS_FUSED) {
    pair(g, MP_MEM_LOGITS, BUF_LSE, 4 * sh->tokens, 0);
    pair(g, MP_MEM_LOGITS, BUF_LOGITS, 2 * TV, 0);
  }
}

/* The head's forward ops up to the logits: the final norm on [Ts, H], the head's region
 * entered (SP: all-gather), the head GEMM, the logits gathered when not kept vocab-sharded;
 * `logits` is called where the logits' memory is allocated (before the GEMM). */
static void head_fwd_ops(gen *g, void (*logits)(gen *g)) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  norm_fwd(g, MP_MOD_FINAL_NORM, sh->tokens_sp, H);
  tp_region_in_fwd(g, sh->tp > 1, head_module(sh), 0);
  logits(g);
  linear_fwd(g, head_module(sh), (double)T, sh->vocab_local, H, 1);
  if (sh->logits_gather)
    comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, MP_STREAM_COMPUTE, 2.0 * (double)(T * sh->vocab_loss),
         MP_DTYPE_BF16, head_module(sh));
}

static void logits_tt(gen *g) { pair(g, MP_MEM_LOGITS, BUF_LOGITS, 2 * g->sh.tokens * g->sh.vocab_loss, 1); }
static void logits_rt(gen *g) { mp_sched_rt_mem(g, MP_ACT_ALLOC_LOGITS, KIND_DENSE, 1); }

/* The head and the loss under PyTorch's autograd (torchtitan, Megatron-LM): the final norm's
 * saved tensors, the logits, the loss as the stack computes it (loss_fwd). */
void mp_sched_head_fwd(gen *g) {
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_HEAD, head_act_bytes(&g->sh), 1);
  head_fwd_ops(g, logits_tt);
  loss_fwd(g);
}

/* The runtimes' head: xf and rstdf in one block; one LOGITS block of the X logits, the
 * per-token losses and log-sum-exp (and the vocab-parallel reductions), kept for the
 * backward; the loss one kernel, its vocab-parallel max, sum and target all-reduced. */
void mp_sched_head_fwd_rt(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens;
  mp_sched_rt_mem(g, MP_ACT_ALLOC_HEAD, KIND_DENSE, 1);
  head_fwd_ops(g, logits_rt);
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
  linear_bwd(g, head_module(sh), (double)T, sh->vocab_local, H, 1);
  tp_region_in_bwd(g, sh->tp_head_split, head_module(sh));
  mp_sched_rt_sp(g, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_DLOGITS, KIND_DENSE, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_LOGITS, KIND_DENSE, 0);
  norm_bwd(g, MP_MOD_FINAL_NORM, sh->tokens_sp, H);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_DXF, KIND_DENSE, 0);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_HEAD, KIND_DENSE, 0);
}

void mp_sched_head_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  loss_bwd(g);
  linear_bwd(g, head_module(sh), (double)T, sh->vocab_local, H, 1);
  pair(g, MP_MEM_LOGITS, BUF_DLOGITS, 2 * T * sh->vocab_local, 0);
  tp_region_in_bwd(g, sh->tp_head_split, head_module(sh));
  norm_bwd(g, MP_MOD_FINAL_NORM, sh->tokens_sp, H);
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_HEAD, head_act_bytes(sh), 0);
}
