/* Step schedule: what one training step does on one rank, as data.
 *
 * Built from a plan (exec/plan.h) by mp_schedule_build. The simulator (sim/) costs it and
 * the runtime (exec/runtime/) executes it; neither re-derives it. Three kinds of op:
 *   COMPUTE  a kernel: GEMM (m, n, k, batch), attention, norm, ..., with FLOPs and bytes
 *   COMM     a collective on a mesh group with its payload bytes
 *   ALLOC / FREE  memory events: the schedule says every byte that lives, so the
 *            memory timeline (and its peak) is the replay of these events.
 *
 * Order and overlap. Ops are listed in issue order. Each op runs on a stream; ops of one
 * stream run in list order, ops of different streams overlap unless a dependency says
 * otherwise (dep[] lists ops that must finish before this one starts). TP and EP
 * collectives run on the compute stream: they sit on the critical path. FSDP
 * all-gathers run on MP_STREAM_GATHER (the next unit's gather is issued before the
 * current unit's compute: prefetch), reduce-scatters and dp all-reduces on
 * MP_STREAM_REDUCE, pipeline sends/receives on MP_STREAM_P2P.
 *
 * Periodicity. Blocks of the same kind cost the same, so the schedule is built as
 * segments: a segment's ops describe one repetition and `repeat` says how many
 * consecutive repetitions follow (layer = op.layer + rep * seg.layer_step). In
 * MP_SCHEDULE_EXPANDED mode every repeat is 1 (the runtime and the tests use it); in
 * MP_SCHEDULE_COMPACT mode identical blocks collapse into one segment so the planner can
 * simulate tens of thousands of plans per second. A dependency flagged MP_DEP_PREV_REP
 * refers to the instance of dep[i] in the previous repetition of the same segment (none
 * for the first repetition). Both modes describe exactly the same step.
 *
 * Micro-batches. The segments describe one micro-batch (forward then backward) plus the
 * step's prologue and optimizer; `when` says how often an op runs among the n_micro
 * micro-batches of a step: every micro-batch, only the first, only the last, or once per
 * step (prologue / optimizer).
 *
 * Pipeline parallelism. A rank's schedule holds one micro-batch of its stage: the forward
 * of each of its model chunks in order (one without interleaving), each opened by the
 * receive of its input from the previous virtual stage and closed by the send to the next
 * (MP_STREAM_P2P on the pp group, peers PREV and NEXT; the embedding on stage 0's first
 * chunk, the head and loss on the last stage's last), then their backwards in reverse
 * (the gradient received from the next virtual stage, sent to the previous); a segment
 * names its chunk. In what order a stage runs the chunk steps of all micro-batches is
 * mp_pp_order's: the simulator's pipeline timeline, a stage's in-flight activations and
 * the runtime follow it. A tied model's two embedding copies (stage 0's and the last
 * stage's) all-reduce their gradients before the optimizer (peer ENDS).
 *
 * Memory categories and what the builder allocates (for the default memory model; the plan's
 * mem_model, exec/plan.h, can name another runtime's layout, described in schedule_rt.c):
 *   PARAMS       sharded master parameters at rest (fp32), resident (prologue)
 *   OPTIMIZER    AdamW m and v (fp32), resident
 *   GRADS        sharded gradients (fp32), resident: the builder allocates them in the
 *                prologue (the first reduce-scatter would, and they are kept to the end)
 *   GATHERED     FSDP all-gather outputs of a unit (param dtype) until resharded
 *   ACTIVATIONS  tensors saved for backward (per AC mode), freed as backward consumes them
 *   TEMP         unsharded gradients of a unit before its reduce-scatter, workspace
 *   COMM         TP/EP/PP communication buffers
 *   FP8          float8 casts of weights and activations and their scales
 *   LOGITS       logits and loss buffers */
#ifndef MP_EXEC_SCHEDULE_H
#define MP_EXEC_SCHEDULE_H

#include <stdint.h>

#include "common/arena.h"
#include "common/status.h"
#include "exec/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mp_op_type { MP_OP_COMPUTE = 0, MP_OP_COMM, MP_OP_ALLOC, MP_OP_FREE } mp_op_type;

typedef enum mp_phase {
  MP_PHASE_PROLOGUE = 0, /* resident allocations at the start of the step */
  MP_PHASE_FORWARD,
  MP_PHASE_RECOMPUTE,    /* forward recomputed in backward under AC */
  MP_PHASE_BACKWARD,
  MP_PHASE_OPTIMIZER,
  MP_PHASE_COUNT
} mp_phase;

typedef enum mp_stream {
  MP_STREAM_COMPUTE = 0,
  MP_STREAM_GATHER, /* FSDP all-gathers */
  MP_STREAM_REDUCE, /* FSDP reduce-scatters, dp_replicate all-reduces */
  MP_STREAM_P2P,    /* pipeline sends and receives */
  MP_STREAM_COUNT
} mp_stream;

typedef enum mp_kernel {
  MP_KERNEL_EMBEDDING = 0, /* gather rows; backward scatter-add */
  MP_KERNEL_NORM,          /* RMSNorm / LayerNorm */
  MP_KERNEL_ROPE,
  MP_KERNEL_ATTENTION,     /* causal softmax(QK^T)V, grouped-query (flash-style) */
  MP_KERNEL_GEMM,
  MP_KERNEL_ACTIVATION,    /* GELU or SwiGLU */
  MP_KERNEL_RESIDUAL,      /* residual add */
  MP_KERNEL_ROUTER,        /* softmax top-k and auxiliary loss */
  MP_KERNEL_PERMUTE,       /* tokens to expert order */
  MP_KERNEL_UNPERMUTE,     /* back to token order, weighted by router probabilities */
  MP_KERNEL_LOSS,          /* cross-entropy (vocab-parallel when logits are sharded) */
  MP_KERNEL_FP8_CAST,      /* amax, scale, saturating cast */
  MP_KERNEL_GRAD_NORM,     /* global gradient norm (sum of squares of the shard) */
  MP_KERNEL_OPTIMIZER,     /* AdamW on the rank's shard */
  MP_KERNEL_COPY,          /* the runtimes' device copies, conversions and zero-fills: the
                              gradients zeroed each step, compute copies refreshed from their
                              fp32 masters (bandwidth only) */
  MP_KERNEL_COUNT
} mp_kernel;

/* Which product a GEMM op computes: forward y = x W^T, input gradient dx = dy W,
 * weight gradient dW = dy^T x. Non-GEMM kernels use FWD and BWD. */
typedef enum mp_variant { MP_VAR_FWD = 0, MP_VAR_DGRAD, MP_VAR_WGRAD, MP_VAR_BWD = MP_VAR_DGRAD } mp_variant;

typedef enum mp_coll {
  MP_COLL_ALL_GATHER = 0,
  MP_COLL_REDUCE_SCATTER,
  MP_COLL_ALL_REDUCE,
  MP_COLL_ALL_TO_ALL,
  MP_COLL_SEND,
  MP_COLL_RECV,
  MP_COLL_BROADCAST,
  MP_COLL_SENDRECV, /* a ring shift: send to the next member, receive from the previous one
                       at once (torch's permute_tensor; context parallelism's KV rotation) */
  MP_COLL_COUNT
} mp_coll;

/* Whom a COMM op is with, beyond its group (mp_op.peer):
 *   NONE  the whole group (every collective)
 *   NEXT  the next member: the next pipeline stage (the next virtual stage under the
 *         interleaved schedule, stage 0 after the last), the next ring member
 *   PREV  the previous one
 *   ENDS  the group's first and last member only, a two-rank collective (Megatron-LM's
 *         embedding group: the first and last pipeline stages of a tied model) */
typedef enum mp_peer { MP_PEER_NONE = 0, MP_PEER_NEXT, MP_PEER_PREV, MP_PEER_ENDS } mp_peer;

typedef enum mp_mem_cat {
  MP_MEM_PARAMS = 0,
  MP_MEM_OPTIMIZER,
  MP_MEM_GRADS,
  MP_MEM_GATHERED,
  MP_MEM_ACTIVATIONS,
  MP_MEM_TEMP,
  MP_MEM_COMM,
  MP_MEM_FP8,
  MP_MEM_LOGITS,
  MP_MEM_COUNT
} mp_mem_cat;

/* Memory events (ALLOC/FREE) carry in `variant` MP_MEM_KEPT for a tensor every stack keeps
 * as saved whatever it fuses (a checkpoint's input, an AC policy's forced save): the
 * simulator does not scale it by the stack's saved_act_factor. */
#define MP_MEM_KEPT 1

typedef enum mp_when {
  MP_WHEN_EVERY_MICRO = 0,
  MP_WHEN_FIRST_MICRO,
  MP_WHEN_LAST_MICRO,
  MP_WHEN_ONCE /* prologue and optimizer: once per step */
} mp_when;

/* mp_op.fp8_block: the block-scaled float8 GEMM kernels an op runs (sim/cost.c prices each
 * kind at its stack's stated speed over bf16) */
#define MP_FP8_BLOCK_HOPPER 1 /* Hopper's 1x128 / 128x128-scaled kernels (the blockwise recipe) */
#define MP_FP8_BLOCK_MX 2     /* Blackwell's MXFP8 kernels (1x32 E8M0 scales) */

#define MP_OP_MAX_DEPS 4
#define MP_DEP_PREV_REP 0x1

/* Dependencies, precisely. dep[i] is an index into ops[]:
 *   - same segment, no flag: the instance of that op in the same repetition (it is
 *     listed earlier in the segment);
 *   - same segment, MP_DEP_PREV_REP: its instance in the previous repetition (none for
 *     the first repetition);
 *   - an op of an earlier segment (never flagged): its last instance, i.e. the one in that
 *     segment's last repetition.
 * A dependency never points forward. The builder gives an op of a repeated segment both
 * forms where the op it waits on lies in the previous segment for the first repetition
 * and in the previous repetition otherwise (for example a block's first GEMM waiting on
 * its FSDP all-gather, which the previous block issued); for later repetitions the
 * earlier-segment form is then redundant (same stream, earlier). mp_schedule_iter_dep
 * resolves a dependency to an instance index. */

typedef struct mp_op {
  uint8_t type;    /* mp_op_type */
  uint8_t phase;   /* mp_phase */
  uint8_t stream;  /* mp_stream */
  uint8_t when;    /* mp_when */
  uint8_t kernel;  /* mp_kernel (COMPUTE) */
  uint8_t variant; /* mp_variant (COMPUTE) */
  uint8_t coll;    /* mp_coll (COMM) */
  uint8_t group;   /* mp_group (COMM) */
  uint8_t dtype;   /* mp_dtype of the compute or of the communicated elements */
  uint8_t mem_cat; /* mp_mem_cat (ALLOC/FREE) */
  int16_t module;  /* mp_module the op belongs to, -1 for none (e.g. attention core: MP_MOD_O's block) */
  int32_t layer;   /* block index of the first repetition; -1 outside blocks */
  int32_t unit;    /* FSDP unit for gathers, reduce-scatters and their buffers; -1 otherwise */
  int32_t buf;     /* pairs an ALLOC with its FREE (unique within one repetition) */
  int64_t m, n, k; /* GEMM: [m, k] x [k, n]; elementwise kernels: m = elements */
  int64_t batch;   /* GEMM batch (grouped expert GEMMs: local experts); 1 otherwise */
  double flops;    /* COMPUTE: floating-point operations */
  double bytes;    /* COMPUTE: bytes read and written in device memory;
                      COMM: payload = the full tensor each rank ends up with for
                      all-gather, the tensor each rank contributes for reduce-scatter and
                      all-reduce, the bytes each rank sends for all-to-all and send */
  int64_t mem_bytes; /* ALLOC/FREE */
  int32_t dep[MP_OP_MAX_DEPS]; /* op indices that must finish first */
  uint8_t dep_flags[MP_OP_MAX_DEPS];
  uint8_t n_dep;
  uint8_t peer;    /* mp_peer (COMM): whom a point-to-point op or a two-member collective is
                      with */
  uint16_t count;  /* COMPUTE, COMM: 0 or 1 one op; n > 1 n identical ops back to back on
                      its stream, flops and bytes (and time) those of one (a compact
                      schedule's fold of ring attention's identical middle steps,
                      schedule_cp.c) */
  uint8_t fused;   /* mp_fuse: AsyncTP's micro-pipelined TP collectives (plan async_tp) */
  uint8_t grouped; /* GEMM: one grouped-GEMM launch over `batch` routed experts of m rows
                      each (WGRAD: k tokens each), the tokens of each expert padded to the
                      kernel's tile (sim/cost.c); 0 for every other GEMM and for the
                      runtimes' per-block expert GEMMs. FP8_CAST: a cast of Transformer
                      Engine's grouped expert Linear, one kernel for each of `batch` experts
                      (schedule_ops.c te_expert_casts); bytes and FLOPs the whole cast's */
  uint8_t host_sync; /* 1: the first op the host issues after it waited for the GPU (a MoE
                        token dispatcher's copy of the routed counts, exec/plan.h
                        mp_moe_host_sync): the GPU stream idles until the host issues the
                        ops from here (sim/cost.c, price_host_issue) */
  uint8_t fp8_block; /* GEMM: MP_FP8_BLOCK_HOPPER a float8 GEMM on Hopper's block-scaled
                        kernels (the blockwise recipe's 1x128 and 128x128 scales,
                        shapes.fp8_block_gemm), MP_FP8_BLOCK_MX one on Blackwell's MXFP8
                        kernels (1x32 E8M0 scales, shapes.mxfp8_gemm), each priced at the
                        stack's rate for its kind (sim/cost.c); 0 otherwise */
  uint8_t fp4;       /* GEMM: 1 an NVFP4 GEMM (the nvfp4 recipe's fprop, dgrad and wgrad: E2M1
                        operands, half a byte an element plus an E4M3 scale per 16), priced
                        on the GPU's FP4 tensor cores (sim/cost.c); 0 otherwise */
  uint8_t avg;       /* COMM reduce-scatter: 1 its op averages (ReduceOp.AVG or a PreMulSum,
                        NCCL's PreMulSum, which NCCL never runs as PAT: sim/network.c,
                        pat_bw_share; grad_comm sets it); 0 a sum */
} mp_op;

/* The rows a local expert of the slowest EP rank computes under routing rt (exec/plan.h,
 * mp_moe_routing), from the rank's routed tokens (balanced: tokens x top_k x ep / experts),
 * each padded up to a multiple of align under a rank capacity (1: none), and *load, the rows
 * kept over the balanced ones (exec/schedule_prep.c). */
double mp_sched_moe_rows(const mp_moe_routing *rt, double tokens, int64_t top_k, int64_t experts, int ep,
                         int align, double *load);
/* HybridEP's per-expert padding under float8 with Transformer Engine's op fuser: Megatron-Core's
 * get_align_size_for_quantization ("CUTLASS kernel for grouped GEMM assumes 256 alignment",
 * moe_utils.py, core_v0.18.0; main: 256 for the op fuser and the grouped tensor alike). */
#define MP_MOE_HYBRIDEP_ALIGN 256
/* The align p's experts take (mp_sched_moe_rows): MP_MOE_HYBRIDEP_ALIGN under a rank capacity
 * with float8 Linears (the dispatch pads only when config.fp8 or fp4), else 1. */
int mp_sched_moe_align(const mp_plan *p);
/* Of `tokens` on the rank (micro_batch x seq / cp), the ones it routes: T / tp on the expert
 * grid, where each TP rank dispatches its own sequence shard, except under torchtitan's
 * ExpertTensorParallel (etp = tp, the MoE input replicated over tp:
 * torchtitan/models/llama4/infra/parallelize.py, apply_moe_ep_tp, v0.2.0), else T; and in
 * *etp_rows how many ranks' rows an expert-TP group gathers before its experts: etp under
 * Megatron-Core's dispatchers (token_dispatcher.py, core_v0.14.0, tp_size = etp) and the
 * meshplan runtimes, which run them so (exec/runtime/runtime_etp.c), else 1. */
int64_t mp_sched_moe_routed(const mp_plan *p, int64_t tokens, int *etp_rows);

/* A GEMM op's device-memory bytes (mp_op.bytes): [m, k] and [k, n] read at in_b bytes an
 * element, [m, n] written in bf16, batch times. */
static inline double mp_gemm_bytes(double m, double n, double k, double batch, int in_b) {
  return batch * ((m * k + k * n) * in_b + m * n * 2.0);
}

/* AsyncTP (torch's micro-pipeline TP, torch/_inductor/fx_passes/micro_pipeline_tp.py, as
 * torchtitan enables it): a TP all-gather whose output feeds GEMMs runs as tp - 1
 * point-to-point copies beside those GEMMs split into tp chunks along the tokens
 * (fused_all_gather_matmul), and a GEMM whose output is reduce-scattered runs chunk by
 * chunk, each chunk's partial sum sent while the next is computed
 * (fused_matmul_reduce_scatter). The TP collective and the GEMMs of one fused pair carry the
 * same mark: an all-gather and the GEMMs after it up to the next collective (a float8
 * cast's amax all-reduce aside), a reduce-scatter and the GEMMs before it. The simulator
 * prices the pair (sim/cost.c). */
typedef enum mp_fuse {
  MP_FUSE_NONE = 0,
  MP_FUSE_GATHER,  /* all-gather -> matmul */
  MP_FUSE_SCATTER, /* matmul -> reduce-scatter */
  MP_FUSE_BULK     /* Transformer Engine's "bulk" overlap (Megatron-Core's --tp-comm-overlap):
                      in a column-parallel region's backward under SP, the all-gather of
                      the saved input beside the region's input-gradient GEMMs after it, the
                      reduce-scatter of the input gradient beside its weight-gradient GEMMs
                      before it, each collective a userbuffers kernel on its own stream that
                      the compute stream waits for when those GEMMs end */
} mp_fuse;

typedef struct mp_segment {
  int32_t first_op, n_ops; /* ops[first_op .. first_op + n_ops) */
  int32_t repeat;          /* >= 1 */
  int32_t layer_step;      /* +1 forward, -1 backward, 0 outside blocks */
  uint8_t phase;
  int32_t unit_step;       /* op.unit advances by this per repetition (units per block) */
  int64_t first_index;     /* instance index (mp_schedule_iter.index) of its first op */
  uint8_t chunk;           /* the stage's model chunk it belongs to (interleaved pipeline) */
} mp_segment;

typedef enum mp_schedule_mode { MP_SCHEDULE_EXPANDED = 0, MP_SCHEDULE_COMPACT } mp_schedule_mode;

typedef struct mp_schedule {
  const mp_plan *plan;
  int rank;
  int pp_stage;
  mp_schedule_mode mode;
  mp_op *ops;
  int32_t n_ops;
  mp_segment *segs;
  int32_t n_segs;
  int64_t n_micro;        /* micro-batches per step */
  int64_t micro_batch;    /* sequences per micro-batch */
  int64_t seq;
  int64_t tokens_per_step_per_rank; /* tokens this rank's data-parallel replica processes */
  double model_flops_per_step;      /* 6N + attention per token x tokens, for MFU: this
                                       rank's share, i.e. mp_model_flops_per_token x
                                       tokens_per_step_per_rank / (tp x pp x cp) */
  int64_t resident_bytes[MP_MEM_COUNT]; /* what the prologue allocates, by category */
  int64_t offload_bytes;  /* with cpu_offload_layers: the bytes one offloaded layer copies to
                             the host each micro-batch (and back); 0 without */
  int64_t n_instances;    /* op instances per micro-batch incl. prologue and optimizer (the
                             expanded op count) */
} mp_schedule;

/* Builds rank's schedule in the arena (which owns it). The plan must have had FSDP
 * applied or a mesh with dp_shard == 1 (the schedule then has no FSDP collectives). */
mp_status mp_schedule_build(mp_ctx *ctx, const mp_plan *p, int rank, mp_schedule_mode mode,
                            mp_arena *arena, mp_schedule **out);

/* The K and V widths (features per token on one tp rank) a context-parallel ring carries
 * (exec/schedule_cp.c): under torchtitan every query head's, repeat_kv expanding grouped K
 * and V before SDPA, (n_heads / tp) x head_dim each; under Megatron-LM (megatron != 0)
 * Transformer Engine's ring passes the grouped K and V, (n_kv_heads / tp, at least one) x
 * head_dim; MLA's decompressed K (n_heads / tp) x (qk_nope + qk_rope) and V (n_heads / tp) x
 * v_head_dim either way. The schedule prices them; explain describes them. */
void mp_cp_ring_widths(const mp_model *m, int tp, int megatron, int64_t *kw, int64_t *vw);
/* The K, V buffers a rank of the ring holds while its attention runs, in units of its own K
 * and V (2 T (kw + vw) bytes). PyTorch's: cp gathered and the send buffer under allgather;
 * under alltoall the K, V in use, the copy being sent and the one arriving, min(cp, 3) (at
 * cp = 2 the last step sends nothing). Transformer Engine's (megatron != 0) keeps every
 * step's buffer in its p2p_comm_buffers list until the pass ends (AttnFuncWithCPAndKVP2P:
 * p2p_comm_buffers[i + 1] = torch.empty_like(p2p_comm_buffers[i]), none released in the
 * loop): cp. */
int mp_cp_ring_kv_units(int cp, mp_cp_rotate rotate, int megatron);

/* For the planner's speed: what mp_schedule_build reads from a plan's parameters for
 * one rank (the FSDP units as the rank's stage sees them, the tp-local shapes, the runs of
 * identical blocks), computed once: the planner builds one plan per mesh and derives the
 * plans of the other micro-batch sizes, AC modes and reshard settings from it
 * (mp_plan_derive), which share its parameters and units, so one prep serves them all.
 * mp_schedule_build_prepped gives exactly the schedule mp_schedule_build(p, prep's rank,
 * prep's mode) gives; it refuses (MP_ERR_INVALID) a plan with other parameter or unit
 * tables, another mesh, seq, float8 all-gather or FSDP dtypes than the prep's plan. The
 * prep lives in the arena; it is read-only once made. */
typedef struct mp_schedule_prep mp_schedule_prep;
mp_status mp_schedule_prep_create(mp_ctx *ctx, const mp_plan *p, int rank,
                                  mp_schedule_mode mode, mp_arena *arena,
                                  mp_schedule_prep **out);
mp_status mp_schedule_build_prepped(mp_ctx *ctx, const mp_plan *p, const mp_schedule_prep *prep,
                                    mp_arena *arena, mp_schedule **out);

/* Walking the expanded step (for the runtime and for tests) whatever the mode:
 *   mp_schedule_iter it; mp_schedule_iter_begin(s, &it);
 *   while (mp_schedule_iter_next(&it)) { it.op, it.layer, it.rep, it.index ... }
 * `index` numbers op instances in issue order over one micro-batch plus prologue and
 * optimizer. */
typedef struct mp_schedule_iter {
  const mp_schedule *s;
  int32_t seg, rep, pos;
  const mp_op *op;
  int32_t layer; /* op->layer + rep * layer_step */
  int64_t index;
  int32_t unit;  /* op->unit + rep * unit_step (-1 when op->unit is -1) */
} mp_schedule_iter;
void mp_schedule_iter_begin(const mp_schedule *s, mp_schedule_iter *it);
int mp_schedule_iter_next(mp_schedule_iter *it);
/* Instance index (it->index numbering) of the current op's dependency i, or -1 when it
 * has none (MP_DEP_PREV_REP in a first repetition). */
int64_t mp_schedule_iter_dep(const mp_schedule_iter *it, int i);

/* The step program: one micro-batch of a schedule built
 * with a runtime memory model (MP_MEM_MODEL_MESHPLAN_CPU or _CUDA), read as the actions
 * the runtime (exec/runtime/) executes, in the schedule's order. The schedule decides what
 * happens and when: where each unit's all-gather is issued (prefetched a block ahead with
 * overlap, before the block without), which blocks drop saved tensors after their
 * forward and what their backward recomputes (AC), where gathered parameters are
 * released (reshard_after_forward), where each unit's gradients are reduced; the runtime
 * does each action with its kernels and collectives. Read from the ops' memory events and
 * collectives (their buffers, phases, layers and units), so the runtime and the memory
 * model cannot drift apart in order. */
typedef enum mp_step_act {
  MP_ACT_TOKENS = 0, /* the micro-batch's token ids and targets are staged */
  MP_ACT_GATHER,     /* a: layer (-1: the root units): its sharded units' all-gathers go out */
  MP_ACT_EMBED_FWD,  /* x[0] and the embedding lookup */
  MP_ACT_BLOCK_FWD,  /* a: layer: its gathers complete, its tensors, its forward */
  MP_ACT_FREE_CORE,  /* a: layer: the attention core goes after the forward (AC) */
  MP_ACT_FREE_BLOCK, /* a: layer: every saved tensor of the block goes (full AC) */
  MP_ACT_RELEASE,    /* a: unit: its gathered parameters go */
  MP_ACT_HEAD_FWD,   /* final norm, logits, loss */
  MP_ACT_GRAD_BEGIN, /* a: unit: its unsharded gradient buffer */
  MP_ACT_HEAD_BWD,   /* loss and head backward; the residual-stream gradient */
  MP_ACT_RECOMPUTE,  /* a: layer; b: 1 the whole block (full AC), 0 the attention core */
  MP_ACT_BLOCK_BWD,  /* a: layer: its backward (its gathers complete first) */
  MP_ACT_GRAD_END,   /* a: unit: its gradients reduce-scattered into the shards */
  MP_ACT_FREE_X,     /* the highest residual-stream tensor still held goes */
  MP_ACT_EMBED_BWD,  /* embedding backward; the residual-stream gradient goes */
  MP_ACT_FREE_TOKENS,
  MP_ACT_RS_FINISH,  /* the reduce-scatters in flight complete (overlap) */
  /* pipeline stages (pp > 1): the activations and their gradients crossing a stage
   * boundary, point to point with the neighbouring virtual stage (schedule.h, "Pipeline
   * parallelism"); a: the residual-stream index the tensor belongs to */
  MP_ACT_RECV_X,     /* a: l0: x[l0] allocated and received from the previous virtual stage */
  MP_ACT_SEND_X,     /* a: l1: x[l1] sent to the next virtual stage (kept for backward) */
  MP_ACT_RECV_DX,    /* a: l1: the residual-stream gradient dL/dx[l1] allocated and received
                        from the next virtual stage */
  MP_ACT_SEND_DX,    /* a: l0: dL/dx[l0] sent to the previous virtual stage; it goes */
  MP_ACT_COUNT
} mp_step_act;

/* One action, and the chunk step it belongs to: the forward (bwd 0) or backward of the
 * stage's model chunk `chunk`. A pipeline stage runs the actions of one chunk step at a
 * time, in the order mp_pp_order gives; without a pipeline there is one chunk. */
typedef struct mp_step_action {
  uint8_t kind; /* mp_step_act */
  uint8_t chunk, bwd;
  int32_t a, b;
} mp_step_action;

/* The program of s (its micro-batch phases; prologue and optimizer are the runtime's
 * own), in arena. MP_ERR_INVALID for a schedule without a runtime memory model or with an
 * op that runs only in some micro-batches. */
mp_status mp_schedule_step_program(mp_ctx *ctx, const mp_schedule *s, mp_arena *arena,
                                   mp_step_action **out, int32_t *n_out);
const char *mp_step_act_name(int kind); /* "gather", "block_fwd", ... */

/* The pipeline order of a stage (exec/schedule_pp.c): step i of out runs the forward
 * (bwd 0) or backward of the stage's model chunk `chunk` for micro-batch `micro`. Under
 * DualPipe `chunk` is the direction (0: micro-batches entering at stage 0, run through model
 * stage s on rank s; 1: entering at stage pp - 1, model stage pp - 1 - s on rank s) and
 * `micro` counts that direction's micro-batches, and `paired` marks a forward that runs with
 * the backward after it as one overlapped step (its F&B). 1F1B and interleaved mark their
 * steady-state forwards, each followed by a backward, and the simulator pairs those where
 * the stage's times save (sim/pipeline.c): a warm-up forward runs alone even where the
 * cool-down's first backward follows it, as Megatron-LM's schedule runs every step alone
 * when all micro-batches are in the warm-up (m == pp interleaved). */
enum { MP_PP_STEP_F = 0, MP_PP_STEP_B = 1, MP_PP_STEP_W = 2 }; /* mp_pp_step.bwd */
typedef struct mp_pp_step {
  uint8_t bwd; /* MP_PP_STEP_F (forward), _B (backward; its input-gradient part where the
                  schedule splits it), _W (the weight-gradient part of an earlier B) */
  uint8_t chunk;
  int32_t micro;
  uint8_t paired;
} mp_pp_step;

/* The order of `stage` of a pp-stage pipeline running n_micro micro-batches through v model
 * chunks per stage under schedule `kind` (1F1B, interleaved with v > 1, GPipe; DualPipe with
 * v 1, whose two directions are its chunks) as `flavor` implements it: 2 x n_micro x v steps
 * (DualPipe: 2 x n_micro; the zero-bubble schedules, ZBV with v 2: 3 x n_micro x v, a B and a
 * W for each backward) into out (room for that many), *n_out their count. MP_ERR_INVALID
 * for v > 1 outside the interleaved schedules and ZBV, n_micro not a multiple of pp under
 * interleaved (of max(1, n_micro / pp) under interleaved_zb), ZBV with v other than 2, and
 * under DualPipe an odd pp, an odd n_micro or fewer than 2 pp. */
mp_status mp_pp_order(mp_ctx *ctx, mp_pp_schedule kind, mp_pp_flavor flavor, int pp, int v,
                      int64_t n_micro, int stage, mp_pp_step *out, int64_t *n_out);
/* The most chunk activations a stage holds at once walking its order (a forward holds its
 * chunk's until the matching backward releases it, both counted while they run): pp - s
 * micro-batches for 1F1B's stage s (m at most), m for GPipe, (pp - s - 1) x 2 + (v - 1) x pp
 * + 1 chunks for the interleaved schedule's (m x v, every chunk step, under Megatron-LM's
 * when m == pp). */
int64_t mp_pp_inflight(const mp_pp_step *order, int64_t n);
/* Whether an order splits its backwards (has W steps): its chunks are then held until W. */
int mp_pp_order_splits_w(const mp_pp_step *order, int64_t n);

/* Self-check: dependencies point backwards, every FREE matches an earlier ALLOC
 * of the same buf, layer, unit, category and size, no category goes negative, and one
 * micro-batch's memory events return to the resident bytes. MP_ERR_INTERNAL with the
 * first violation otherwise. */
mp_status mp_schedule_check(mp_ctx *ctx, const mp_schedule *s);

/* Totals over one step (all micro-batches, `when` respected): FLOPs, and per collective
 * kind and group the payload bytes. For tests and explain. */
typedef struct mp_schedule_totals {
  double flops;
  double comm_bytes[MP_COLL_COUNT][MP_GROUP_COUNT];
  int64_t n_comm[MP_COLL_COUNT][MP_GROUP_COUNT];
} mp_schedule_totals;
void mp_schedule_totals_compute(const mp_schedule *s, mp_schedule_totals *out);

/* Writes the fully qualified name of an op's module ("layers.3.attention.q_proj") or a
 * description ("layers.3 attention core") into buf. */
void mp_op_name(const mp_schedule *s, const mp_op *op, int32_t layer, char *buf, size_t cap);
const char *mp_kernel_name(mp_kernel k);
const char *mp_coll_name(mp_coll c);
const char *mp_mem_cat_name(mp_mem_cat c);
const char *mp_phase_name(mp_phase p);
const char *mp_stream_name(mp_stream s);

#ifdef __cplusplus
}
#endif
#endif
