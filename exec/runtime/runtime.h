/* The training runtime: materializes one rank's shards of a plan and runs training steps
 * (forward, backward, gradient clipping, AdamW) with a kernel backend (kernels/ops.h) and
 * collectives (exec/comm/comm.h).
 *
 * Materialization: each rank allocates only the tile of each parameter it stores at rest
 * (mp_param_tile), fills it with the plan-independent initializer (init.h), and keeps its
 * gradient and AdamW state beside it: all from one tracked allocator (alloc.h), whose
 * peak is the rank's measured memory.
 *
 * Step semantics (what parity tests compare, and what tests/reference/model_ref.py
 * implements):
 *   loss = mean over the step's tokens of cross-entropy
 *          + aux_loss_coef * (mean over micro-batches of the sum over MoE layers of the
 *            layer's load-balancing loss on that micro-batch)
 *   gradients accumulate over micro-batches; the global gradient norm over every
 *   parameter is clipped to max_grad_norm (PyTorch clip_grad_norm_); AdamW (decoupled
 *   decay, bias-corrected) with weight decay on the parameters of 2 or more dims (Linear,
 *   experts, router, embeddings, head); norms and biases (1-D) do not decay. That is
 *   nanoGPT's and llm.c's rule (configure_optimizers: "all weight tensors in matmuls +
 *   embeddings decay, all biases and layernorms don't") and Megatron-LM's (no decay on
 *   biases and norms). Options change it where practice differs: decay_embeddings = 0
 *   leaves the embedding and head out too (OLMo 2), decay_all decays every parameter
 *   (torchtitan's AdamW on model.parameters()).
 *
 * Dtypes: master parameters, their gradients, AdamW state and statistics are fp32 on
 * every backend; activations, their gradients and the compute copies of parameters are
 * the backend's X dtype (kernels/ops.h: fp32 on the CPU, bf16 on CUDA). On a bf16 backend
 * an FSDP unit casts each fp32 shard to bf16 and all-gathers bf16 (FSDP2's mixed
 * precision, param_dtype bf16, reduce_dtype fp32); a parameter that is not sharded keeps
 * a resident bf16 copy, refreshed after each optimizer step. Float8 Linears run as real
 * float8 GEMMs on codes (matmul_f8) there, and as the exact emulation on the CPU.
 *
 * Memory categories (exec/schedule.h's mp_mem_cat), as this runtime allocates them:
 *   PARAMS      master shards (fp32), resident; bf16 compute copies (CUDA, not sharded)
 *   OPTIMIZER   AdamW m and v, resident
 *   GRADS       gradient shards (fp32), resident from creation
 *   ACTIVATIONS the residual stream x[0..L] and, per block, one block carved into the
 *               tensors saved for backward (per AC mode); freed by that block's backward
 *   TEMP        RoPE tables (resident), token ids, per-block backward workspace, the
 *               residual-stream gradient, forward temporaries
 *   LOGITS      logits, per-token losses and log-sum-exp, their gradient
 *
 * Parallelism executed (every plan of the parity matrix matches the single-rank run):
 *   dp_replicate  whole (or FSDP-sharded) parameters per replica; gradient shards
 *                 all-reduced over MP_GROUP_DP_REPLICATE after the micro-batches (HSDP)
 *   dp_shard      FSDP2: every parameter's tp-local tensor sharded on dim 0 over its FSDP
 *                 group, shards padded to the group's chunk; a unit is all-gathered before
 *                 its forward (and again before its backward with reshard_after_forward),
 *                 its gradients accumulate unsharded and are reduce-scattered after its
 *                 backward (GATHERED and TEMP categories); the root unit (embeddings,
 *                 final norm, head) stays gathered for the whole micro-batch
 *   tp            Megatron: q/k/v, gate/up, shared-expert gate/up colwise; o, down,
 *                 shared down rowwise with an all-reduce of the partial sums; the input
 *                 gradient of colwise layers all-reduced before the norm's backward;
 *                 vocab-parallel embedding (all-reduce) and loss-parallel cross-entropy
 *                 (max, sum-exp and target logit all-reduced); no sequence parallelism
 *   ep            routed experts split over the EP group: counts, then rows exchanged
 *                 with all-to-all (dispatch), local experts run per (source, expert)
 *                 block, outputs returned by the reverse all-to-all (combine); the same in
 *                 backward. Expert-side tensors are sized by the rows actually received.
 *   float8        the plan's float8 Linears (dense q/k/v/o/gate/up/down) emulated as
 *                 torchao's tensorwise dynamic recipe: E4M3 inputs and weights, E5M2
 *                 output gradients, amax over the whole logical tensor (all-reduce MAX
 *                 over tp) so a sharded plan quantizes as the single-rank run does; on
 *                 codes (CUDA, or opts.f8_codes) each activation is quantized once per
 *                 block, amaxes come from the producing kernel (RMSNorm, SwiGLU) or are
 *                 kept from the forward for the weight gradients, and dgrad GEMMs add
 *                 into the input gradient (docs/gpu.md, "Float8")
 * Global gradient norm: each parameter counted once (its owner: tp rank 0 for tensors
 * replicated over tp, dp_replicate index 0), one all-reduce over the world.
 * Not executed (MP_ERR_UNSUPPORTED with the reason): pp, cp, gpt-family models, q/k/v
 * biases and q/k norms, logits gathered over tp (shard_logits=0), tied embeddings with tp.
 *
 * The step is walked from the schedule: at creation the runtime builds this rank's
 * mp_schedule (exec/schedule.h) under the memory model of its backend's layout
 * (MP_MEM_MODEL_MESHPLAN_CPU for fp32 X, MP_MEM_MODEL_MESHPLAN_CUDA for bf16) and reads it
 * as a step program (mp_schedule_step_program): tokens, unit gathers, block forwards, AC's
 * drops and recomputes, releases, the head, block backwards, gradient reductions. Each
 * micro-batch runs that program; the schedule decides the order (where a gather is issued
 * and waited for, what is recomputed, when gathered parameters go, when a reduce-scatter
 * completes), the runtime does each action with its kernels and collectives. Inside an
 * action (a block's forward, say) the kernels run in the runtime's order, which the
 * schedule's ops for that block mirror. The same schedule's memory events repeat this
 * runtime's allocations event for event (sizes, order, categories): both read the
 * activation layout (exec/act_layout.h) for the tensors outside the parameters, and the
 * order is kept in step by tests (tests/runtime:schedule_memory_test, its MPI variant for sharded plans, and
 * parity_matrix.py compare the predicted peak with the tracked allocator's, per plan;
 * tests/schedule:step_program_test holds the programs to the runtime's order by hand). */
#ifndef MP_EXEC_RUNTIME_RUNTIME_H
#define MP_EXEC_RUNTIME_RUNTIME_H

#include <stdint.h>

#include "common/status.h"
#include "exec/comm/comm.h"
#include "exec/plan.h"
#include "exec/runtime/alloc.h"
#include "exec/runtime/weights.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_runtime mp_runtime;

typedef struct mp_runtime_options {
  uint64_t seed;       /* parameter initialization (init.h) */
  float lr;            /* AdamW learning rate of the next step (mp_runtime_set_lr changes it: schedules) */
  float beta1, beta2, eps, weight_decay;
  float max_grad_norm; /* <= 0: no clipping */
  int decay_embeddings; /* 1: weight decay on the embedding and output head too (nanoGPT, llm.c,
                           Megatron-LM); 0: on the other >= 2-D weights only (OLMo 2) */
  int decay_all;       /* 1: weight decay on every parameter, norms included (torchtitan) */
  int f8_codes;        /* 1: float8 Linears as GEMMs on codes (matmul_f8) even where X is fp32,
                          the CUDA path's algorithm checked on the CPU; 0: the backend's way
                          (codes where X is not fp32, the exact fp32 emulation where it is) */
  double moe_capacity_factor; /* > 0: each routed expert takes at most ceil(tokens x top_k /
                                 experts x factor) of a micro-batch's assignments on the rank
                                 and drops the rest, lowest routing weight first (Megatron-Core's
                                 --moe-expert-capacity-factor, drop policy probs;
                                 runtime_moe.c); 0: no capacity (dropless) */
} mp_runtime_options;

/* lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, clip 1.0, seed 1234. */
void mp_runtime_options_init(mp_runtime_options *o);

typedef struct mp_step_result {
  double loss;      /* cross-entropy + aux term (what is differentiated) */
  double ce_loss;   /* mean cross-entropy over the step's tokens */
  double aux_loss;  /* aux_loss_coef * mean over micro-batches of sum over MoE layers */
  double grad_norm; /* global norm before clipping */
  int skipped;      /* the norm was not finite: no parameter, moment or step count changed */
  int64_t peak_bytes;   /* tracked allocator peak over the step */
  int64_t tokens;       /* tokens this rank processed */
} mp_step_result;

/* The routed experts' loads of the last forward and backward: [n_layers * n_experts], the
 * (token, expert) assignments the router made to each expert of each MoE layer (before the
 * capacity's drops) and those dropped, summed over the step's micro-batches and over the
 * ranks that route distinct tokens (data-parallel, context-parallel and expert-grid ranks;
 * not the tp replicas that route the same rows), the same on every rank; 0 on dense layers.
 * NULL for a model without MoE layers. */
const int64_t *mp_runtime_expert_routed(const mp_runtime *rt);
const int64_t *mp_runtime_expert_dropped(const mp_runtime *rt);

/* plan: built for comm's mesh; rank = mp_comm_world_rank(comm). The backend must be
 * initialised on kc. */
mp_status mp_runtime_create(mp_ctx *ctx, const mp_plan *plan, mp_comm *comm, const mp_backend *be,
                            mp_kctx *kc, const mp_runtime_options *opts, mp_runtime **out);
void mp_runtime_destroy(mp_runtime *rt);

/* Forward and backward over the rank's local batch: local_batch sequences of seq + 1
 * int32 tokens (mp_corpus_batch); gradients are left in place (zeroed at the start). */
mp_status mp_runtime_forward_backward(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens,
                                      mp_step_result *res);
/* The logits of the following forward_backward calls, copied into dst (host, fp32): per
 * micro-batch (B, T, vocab) one after another (local_batch * T * vocab floats for one
 * step); NULL stops. For checking the forward against a reference (the Hugging Face round
 * trip); an fp32 backend with tp 1 only (MP_ERR_UNSUPPORTED otherwise). */
mp_status mp_runtime_capture_logits(mp_ctx *ctx, mp_runtime *rt, float *dst);
/* Clipping and AdamW with the gradients of the last forward_backward (res holds its loss);
 * fills grad_norm. A gradient norm that is NaN or infinite, or a loss that is (on any
 * rank: the loss poisons the norm before its all-reduce), leaves the parameters, the
 * moments and the step count as they were and sets res->skipped, on every rank alike (the
 * caller stops a diverged run with the state of the last good step intact). */
mp_status mp_runtime_optimizer_step(mp_ctx *ctx, mp_runtime *rt, mp_step_result *res);
/* Both, and the step's peak memory; returns when the step's device work is complete
 * (mp_runtime_synchronize), so a host clock around it times the step. */
mp_status mp_runtime_step(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens, mp_step_result *res);
/* Waits for every queued kernel and collective of the rank (no-op on the CPU). */
mp_status mp_runtime_synchronize(mp_ctx *ctx, mp_runtime *rt);
/* An all-reduce of a few host values (count * element size <= 8 KiB) over group g,
 * staged through device memory when the comm takes device buffers only (NCCL). */
mp_status mp_runtime_host_all_reduce(mp_ctx *ctx, mp_runtime *rt, mp_group g, void *buf, size_t count,
                                     mp_comm_dtype t, mp_comm_op op);

/* The learning rate of the following optimizer steps (LR schedules, exec/runtime/lr.h). */
void mp_runtime_set_lr(mp_runtime *rt, float lr);
/* Optimizer steps taken (AdamW's t for its bias correction); set by a checkpoint's load. */
int64_t mp_runtime_steps_done(const mp_runtime *rt);
void mp_runtime_set_steps_done(mp_runtime *rt, int64_t steps);

/* The tensors a rank keeps per parameter, as a checkpoint saves them. */
typedef enum mp_state_kind {
  MP_STATE_PARAM = 0, /* fp32 master */
  MP_STATE_EXP_AVG,   /* AdamW first moment m */
  MP_STATE_EXP_AVG_SQ,/* AdamW second moment v */
  MP_STATE_COUNT
} mp_state_kind;
/* Host copies of the real elements of parameter i's tile (numel of mp_runtime_param_tile,
 * row-major over the tile): read, or written (a parameter's compute copy and float8 codes
 * follow). Pad rows of an FSDP shard are neither read nor written. */
mp_status mp_runtime_read_state(mp_ctx *ctx, const mp_runtime *rt, int i, mp_state_kind k, float *dst);
mp_status mp_runtime_write_state(mp_ctx *ctx, mp_runtime *rt, int i, mp_state_kind k, const float *src);
/* This rank writes parameter i's tile in a checkpoint: it holds elements of it and is the
 * one copy of them (not a replica over tp, dp_replicate or an FSDP group that does not
 * shard it). */
int mp_runtime_param_owner(const mp_runtime *rt, int i);
const mp_plan *mp_runtime_plan(const mp_runtime *rt);
mp_comm *mp_runtime_comm(const mp_runtime *rt);

/* Every rank's local status agreed over the world (an all-reduce of the worst): a step
 * only some ranks fail (a file only rank 0 writes) fails on every rank, so none waits in a
 * collective the failed one never joins. A rank whose own step passed gets a message
 * saying `what` failed on another rank. Collective. */
mp_status mp_runtime_agree(mp_ctx *ctx, mp_runtime *rt, mp_status local, const char *what);

const mp_talloc *mp_runtime_allocator(const mp_runtime *rt);
int64_t mp_runtime_local_batch(const mp_runtime *rt);
int64_t mp_runtime_n_micro(const mp_runtime *rt);
/* Under EP, the most expert-side rows this rank has received in one MoE layer of one
 * micro-batch since creation (0 without EP): routing decides it, and the expert-side
 * buffers are sized by it, so it explains the measured peak beside a prediction. */
int64_t mp_runtime_ep_rows_max(const mp_runtime *rt);

/* The rank's tile of parameter i (mp_param_tile) and its fp32 master values / gradient
 * (host copies written into dst, capacity numel of the tile). Returns the tile's numel. */
int64_t mp_runtime_param_tile(const mp_runtime *rt, int i, int64_t off[MP_MAX_NDIM], int64_t len[MP_MAX_NDIM]);
mp_status mp_runtime_read_param(mp_ctx *ctx, const mp_runtime *rt, int i, float *dst);
mp_status mp_runtime_read_grad(mp_ctx *ctx, const mp_runtime *rt, int i, float *dst);

/* Adds every parameter's full tensor to w: the values (grads = 0) or the gradients
 * (grads = 1), assembled from every rank's shards (a world all-reduce per parameter):
 * collective, every rank calls it and every rank's w gets the full tensors. */
mp_status mp_runtime_dump(mp_ctx *ctx, const mp_runtime *rt, int grads, mp_wfile *w);

/* Full initial weights straight from the initializer (no runtime, no communication): what
 * any plan starts from. */
mp_status mp_runtime_dump_init(mp_ctx *ctx, const mp_plan *plan, uint64_t seed, mp_wfile *w);

#ifdef __cplusplus
}
#endif
#endif
