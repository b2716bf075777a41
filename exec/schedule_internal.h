/* The schedule builder's internals, shared by its files (schedule.c lists them); not an
 * interface for other modules.
 *
 * Invariants: gen is the only state of one build; ops are emitted into the open segment
 * (seg_open / seg_close) in issue order; a dependency never points forward; once gen.status is
 * a failure every emission is a no-op (new_op hands out the dummy op, index -1). The
 * emission primitives are inline here: they run for every op of every schedule the planner
 * builds. */
#ifndef MP_EXEC_SCHEDULE_INTERNAL_H
#define MP_EXEC_SCHEDULE_INTERNAL_H

#include <math.h>
#include <string.h>

#include "exec/act_layout.h"
#include "exec/schedule.h"

/* Nominal FLOPs per element of the element-wise kernels (schedule_ops.c). */
#define FLOPS_NORM_FWD 4.0 /* RMSNorm: square, sum, scale, weight; LayerNorm adds the mean */
#define FLOPS_NORM_BWD 8.0
#define FLOPS_ROPE 3.0     /* x cos + rotate(x) sin */
#define FLOPS_SWIGLU_FWD 5.0
#define FLOPS_SWIGLU_BWD 8.0
#define FLOPS_GELU_FWD 8.0 /* tanh approximation */
#define FLOPS_GELU_BWD 12.0
#define FLOPS_RELU2_FWD 2.0 /* relu(x)^2: a max and a multiply */
#define FLOPS_RELU2_BWD 3.0 /* dy x 2 relu(x): a max and two multiplies */
#define FLOPS_ROUTER 5.0   /* softmax + top-k per logit */
#define FLOPS_LOSS 5.0     /* max, subtract, exp, sum, log per logit */
#define FLOPS_CAST 3.0     /* abs, max, scale (+ saturate) */
#define FLOPS_ADAMW 16.0   /* m, v updates, bias correction, sqrt, divide, weight decay */
#define BYTES_ADAMW 28.0   /* read param, grad, m, v; write param, m, v: 7 fp32 tensors */

/* Buffer identities (mp_op.buf); an ALLOC pairs with the next FREE of the same buf,
 * layer and unit. */
enum {
  BUF_PARAMS = 1,
  BUF_OPTIMIZER,
  BUF_GRADS,
  BUF_GATHERED,   /* + unit: per unit */
  BUF_ACT_X,
  BUF_ACT_ATTN,
  BUF_ACT_MLP,
  BUF_RC_ATTN,    /* recomputed in backward */
  BUF_RC_MLP,
  BUF_BWD_WS,     /* activation-gradient workspace */
  BUF_GRAD_UNSHARDED,
  BUF_GRAD_RS_IN,
  BUF_FP8,
  BUF_ACT_HEAD,
  BUF_PP_OUT,     /* a pipeline stage's output, kept until its backward (torchtitan) */
  BUF_LOGITS,
  BUF_LOGITS_F32,
  BUF_DLOGITS_F32,
  BUF_DLOGITS,
  /* the runtime memory models' own buffers (the runtime's names) */
  BUF_RT_RESIDENT, /* RoPE tables and the reduction scalars (TEMP, resident) */
  BUF_RT_TOKENS,   /* token ids and targets of the micro-batch (TEMP) */
  BUF_RT_X,        /* residual stream: x[0] at layer -1, x[l + 1] at layer l */
  BUF_RT_BLOCK,    /* a block's saved tensors, one carved allocation */
  BUF_RT_CORE,     /* attention core: att, lse */
  BUF_RT_EPA,      /* EP: expert-side rows and gate/up/hidden */
  BUF_RT_EP_OUT,   /* EP: expert outputs before the combine (COMM) */
  BUF_RT_EP_WS,    /* EP: expert-side backward workspace (TEMP) */
  BUF_RT_SHARED,   /* shared expert's partial output before its all-reduce (TEMP) */
  BUF_RT_HEAD,     /* xf, rstdf */
  BUF_RT_DRES,     /* residual-stream gradient (TEMP) */
  BUF_RT_DXF,      /* final norm's input gradient (TEMP) */
  /* meshplan-cuda's own */
  BUF_RT_F8W,      /* float8 codes of the weights that are not FSDP-sharded (FP8, resident) */
  BUF_RT_RS,       /* NCCL: a unit's reduce-scatter output, in flight (TEMP) */
  BUF_F8_DY,       /* float8 on codes: the output gradient's operand (E5M2) */
  BUF_F8_W,        /* an FSDP-sharded weight's operand (E4M3) */
  BUF_F8_ACT,      /* + source (f8_source): a block's activation operand (E4M3) */
  BUF_F8_ACT_END = BUF_F8_ACT + 4,
  BUF_LOGITS_LSM,  /* eager cross-entropy: log_softmax's fp32 output, saved */
  BUF_DLSM_F32,    /* eager cross-entropy: log_softmax's fp32 input gradient */
  BUF_LSE,         /* fused cross-entropy: the per-token log-sum-exp, saved */
  BUF_ACT_ATTN_TMP, /* a block part's tensors the AC policy drops after its forward */
  BUF_ACT_MLP_TMP,
  BUF_RC_X,        /* recomputed: the block input's norm statistics */
  BUF_CP_ACC,      /* ring attention: the fp32 accumulators of the output (or the gradients) */
  BUF_CP_KV,       /* ring attention: the K, V (and dK, dV) buffers in flight */
  BUF_SCORES_GRAD, /* materialized attention: the scores' gradient in backward */
  BUF_SP_GATHER,   /* Megatron's SP: a region's input gathered again in backward */
  BUF_SP_CAT,      /* torchtitan's SP: the collective's side of a chunk + cat copy (TEMP) */
  BUF_GRAD_ACC,    /* FSDP under a pipeline: a unit's unsharded gradients accumulated in the
                      reduce dtype until the stage's last backward */
  BUF_RT_SP_FULL,  /* the runtimes' SP: a region's [N, C] side around its boundary collective */
  BUF_RT_CP,       /* the runtimes' CP: ring attention's state and K, V (and dK, dV) buffers */
  BUF_LP_SHIFTED,  /* DTensor loss parallel: log_softmax's x - max, fp32 */
  BUF_LP_EXP,      /* DTensor loss parallel: exp() of it (forward) or of the saved output
                      (backward), fp32 */
  BUF_LP_SUM,      /* DTensor loss parallel backward: one-hot plus exp, fp32 */
  BUF_LOSS_CHUNKS, /* chunked loss: the hidden states' chunk copies and their fp32 gradient sum */
  BUF_HEAD_DW,     /* chunked loss: the head's unsharded gradient summed over the chunks (FSDP) */
  BUF_ACT_MTP_IN,  /* an MTP module's input side, saved (schedule_mtp.c) */
  BUF_RC_MTP_IN,   /* ... recomputed under full AC */
  BUF_F8_HELD,     /* Transformer Engine's float8 weight copies (mp_fp8_te_weight_copy_bytes) */
  BUF_ACT_OFF_ATTN, /* CPU offloading: an offloaded layer's marked tensors of its input and
                       attention part (schedule_act.c) */
  BUF_ACT_OFF_MLP,  /* ... of its MLP part */
  BUF_ACT_OFF_AHEAD, /* ... one layer's, reloaded ahead of its backward (schedule.c) */
};

enum { PART_ATTN = 0, PART_MOE = 1, PART_EXPERTS = 2, N_PARTS = 3 };
enum { KIND_DENSE = 0, KIND_MOE = 1, KIND_NONE = 2 };

/* One FSDP unit as this rank's stage sees it. */
enum { UNIT_MAX_PRM = 32 };

typedef struct unit_info {
  int64_t numel_tp;    /* this stage's tp-local elements: what the all-gather produces */
  int64_t numel_shard; /* what the rank keeps at rest */
  int64_t numel_expert;/* DDP on the expert grid: its routed experts' part of numel_tp,
                          reduced over MP_GROUP_EDP (mp_plan_ddp_experts_apart) */
  double gather_bytes; /* numel_tp in the gather dtype (float8 all-gather: 1 byte) */
  int64_t numel_f8;    /* --fp8-param-gather: its float8 weights' part of numel_tp (1 byte
                          each at rest and gathered), of numel_expert, and of the rank's;
                          under fp8_param_gather_bf16 numel_f8_local alone (at rest);
                          prm_f8 marks the float8 weights' own buffer either way */
  int64_t numel_f8_expert, numel_f8_local; /* elements at rest */
  int32_t n_f8;        /* its float8 weight tensors */
  int64_t f8_held_bytes; /* Transformer Engine's float8 copies of its float8 weights
                            (mp_fp8_te_weight_copy_bytes): held through every step, or under
                            f8_held_per_step from its first forward to the optimizer step */
  int64_t f8_fused_rows, f8_fused_cols; /* the fused weight being summed (te_fused_follows) */
  int gsize;           /* FSDP group size */
  uint8_t group;
  uint8_t gather_dtype;
  /* runtime models: the runtime's gathered buffer in bytes, per parameter a gsize x
   * padded-shard slot of X elements, 64-byte aligned, for X of 4 bytes (meshplan-cpu) and
   * of 2 (meshplan-cuda; the unsharded gradients have the slots' element count in fp32);
   * the sum of the padded shards, each 16-float aligned (NCCL's reduce-scatter output);
   * the largest padded shard (the blocking reduce-scatter's staging). 0 for a one-rank
   * group. */
  int64_t rt_gather_x4, rt_gather_x2, rt_rs_numel, rt_max_pad;
  /* DDP: its parameters' tp-local elements in model order, whether each is gathered in
   * float8, and their count (the parameters past UNIT_MAX_PRM added to the last), from which
   * mp_sched_ddp_buckets forms Megatron-Core's buckets under a bucket size */
  int64_t prm_numel[UNIT_MAX_PRM];
  uint8_t prm_f8[UNIT_MAX_PRM];
  int32_t n_prm;
} unit_info;

/* One rank's local sizes for a micro-batch, read from the plan's parameters (what TP, EP
 * and CP left of the model's dims on this rank) and its batch. */
typedef struct shapes {
  /* tokens */
  int64_t tokens;           /* of the micro-batch on the rank: micro_batch x seq / cp */
  int64_t tokens_sp;        /* of the residual stream, norms and dropout on the rank:
                               tokens / tp under sequence parallelism, else tokens */
  int64_t seq;              /* tokens per sequence (the whole sequence, before cp) */
  double attended;          /* keys a query attends to on average (mp_model_attended_keys) */
  /* widths, tp-local where TP splits them */
  int64_t d_model, head_dim;
  int64_t q_width, kv_width;  /* q's and k's output width (heads x head_dim) */
  int64_t heads, kv_heads;
  int64_t v_head_dim, v_width; /* v's head and output width: head_dim and kv_width without MLA */
  int64_t attn_out;         /* the attention output's width (o's input): q_width without MLA */
  int64_t d_ff;             /* the dense MLP's width */
  /* MoE */
  int64_t experts, experts_local, top_k;
  int64_t d_ff_expert;      /* an expert's width on the rank: d_ff_expert / etp (its gate and
                               up column-parallel, its down row-parallel over MP_GROUP_ETP) */
  int etp_rows;             /* the rows an expert-TP group gathers: etp where each of its ranks
                               routes its own tokens and Megatron-Core's all-to-all dispatcher
                               all-gathers them over the group before the experts and
                               reduce-scatters the outputs after (token_dispatcher.py,
                               MoEAlltoAllTokenDispatcher, core_v0.14.0, tp_size = etp); 1
                               where the group's ranks route the same tokens (torchtitan's
                               ExpertTensorParallel, etp = tp, the MoE input replicated over
                               tp) or etp = 1 */
  int64_t d_ff_shared;      /* the shared experts' width */
  double tokens_per_expert; /* rows per local expert of the slowest EP rank: balanced
                               (tokens x top_k x ep / E) unless the plan's routing says
                               otherwise (mp_sched_moe_rows) */
  double moe_load;          /* those rows over the balanced ones (1: balanced, dropless):
                               the rank's all-to-all bytes and received rows scale by it */
  int64_t moe_tokens;       /* tokens the rank routes: tokens, or under the expert grid with
                               tp > 1 (etp = 1) its tokens / tp sequence shard, as
                               Megatron-Core's token dispatcher routes each TP rank's own */
  int64_t router_tokens;    /* tokens the router scores and the permute reads: tokens after
                               the MLP region's TP all-gather, or moe_tokens where the MoE
                               layer takes the rank's sequence shard itself (moe_on_shard) */
  int moe_on_shard;         /* Megatron-Core's MoE layer under SP with the experts on their
                               own grid (etp 1): the router, permute and dispatcher read the
                               rank's [T/tp, H] shard, no TP collective around the routed side
                               (megatron/core/transformer/moe/moe_layer.py, token_dispatcher.py
                               of core_v0.14: the dispatcher's tp group is the expert TP one) */
  /* multi-head latent attention */
  int mla;
  int64_t q_lora, kv_lora, rope_dim; /* q_lora_rank (0: q_proj), kv_lora_rank, qk_rope_head_dim */
  int64_t kv_b_rows;        /* kv_b_proj's output rows */
  /* a hybrid model's Mamba-2 mixer (schedule_mamba.c), tp-local: in_proj's rows, the conv's
   * channels, d_inner, heads and groups; the state, head, chunk and conv widths */
  int hybrid;
  int64_t mb_in, mb_conv, mb_inner, mb_heads, mb_groups;
  int64_t mb_state, mb_head_dim, mb_chunk, mb_kernel;
  int tp_opens_mamba, tp_closes_mamba; /* in_proj colwise, out_proj rowwise */
  /* the vocabulary */
  int64_t vocab_local, vocab_loss; /* the head's rows on the rank; the loss's width */
  int gpt, qk_norm, has_shared, tied;
  int gated;     /* the dense MLP is SwiGLU (gate, up, down); else up, an activation, down */
  mp_mlp mlp;    /* the dense MLP's activation (mp_model_mlp) */
  int layernorm; /* the norms are LayerNorms: mean and rstd saved, 8 bytes a token */
  int te_spec;   /* the megatron model's layers are Megatron-Core's TE spec (plan te_spec) */
  /* parallelism */
  int tp, ep, cp;
  int sp;                   /* sequence parallelism (tp > 1) */
  /* TP regions: where a region is entered (its all-gather under SP) and closed (its
   * all-reduce or reduce-scatter), per the Linears TP split */
  int tp_opens_qkv, tp_closes_o, tp_opens_gateup, tp_closes_down;
  int tp_opens_shared_gateup, tp_closes_shared_down;
  int tp_opens_mla;         /* MLA: its up projections colwise */
  int tp_head_split;        /* the head's rows split: its input gradient a partial sum */
  int tp_emb_vocab;         /* the embedding vocab-parallel */
  int loss_parallel, logits_gather;
  /* float8 */
  int fp8[MP_MOD_COUNT];    /* per module: its Linear runs float8 */
  uint8_t tp_style[MP_MOD_COUNT]; /* per module: its weight's TP split (mp_tp_style) */
  int fp8_all_gather;       /* FSDP all-gathers float8 weights */
  int fp8_param_gather;     /* Megatron-Core's --fp8-param-gather: the float8 Linears' model
                               weights are Transformer Engine float8 tensors (exec/plan.h) */
  int fp8_param_gather_bf16; /* --fp8-param-gather under MXFP8: the weights gathered in bf16
                               through the gradient buffer and quantized after the gather,
                               once a step, as a bf16 weight's workspace is (schedule_prep.c) */
  int fp8_tp_codes;         /* float8 with tp > 1: a TP region's input cast before its
                               all-gather and its output gradient before the backward's
                               (torchao's float8 TP under the tensorwise recipe, Transformer
                               Engine's float8 under any: mem_strategy) */
  mp_fp8_recipe fp8_recipe; /* the plan's float8 recipe (resolved by the Float8 pass) */
  int fp8_te;               /* Transformer Engine's float8 (mem_strategy.fp8_te) */
  int fp8_te_copies;        /* float8 copies a Transformer Engine cast writes of a tensor used
                               both ways: 2 (the row-major one and the transposed or MXFP8's
                               and blockwise's column-scaled one), 1 where the GPU takes any
                               layout under a per-tensor recipe (schedule_prep.c) */
  int f8_held_per_step;     /* the float8 weight copies live within a step (mp_fp8_te_copy_per_step) */
  int f8_held_per_layer;    /* the float8 model weights' transposes live within each forward and
                               backward of their layer (Megatron FSDP, schedule_prep.c) */
  int fp8_block_gemm;       /* the float8 GEMMs run Hopper's block-scaled kernels (schedule_prep.c) */
  int mxfp8_gemm;           /* the float8 GEMMs run Blackwell's MXFP8 kernels (schedule_prep.c) */
  int fp4_gemm;             /* the float8 Linears' GEMMs run in NVFP4 (the nvfp4 recipe) */
  int nvfp4_rht;            /* NVFP4's random Hadamard transform on the wgrad operands is on */
  int fp8_dpa;              /* the attention core in cuDNN's FP8 kernels (mp_float8_options.dpa) */
  int fp8_amax_tp;          /* delayed scaling's amaxes reduced over TP only (mp_float8_options.amax_tp) */
} shapes;

typedef struct gen {
  mp_ctx *ctx;
  mp_arena *arena;
  const mp_plan *p;
  mp_schedule *s;
  shapes sh;
  mp_op *ops;
  int32_t n_ops, cap_ops;
  int32_t ops_hint;        /* the op array's first capacity (schedule.c, ops_estimate) */
  mp_segment *segs;
  int32_t n_segs, cap_segs;
  mp_status status;        /* sticky: the first failure (its message on ctx); from then on
                              every emission is a no-op writing into `dummy` */
  mp_op dummy;
  /* current emission state */
  uint8_t phase, when;
  uint8_t chunk;           /* the model chunk being written (segments record it) */
  int32_t layer;           /* layer of the block being written (first repetition) */
  int32_t seg_first;       /* first op of the open segment */
  int32_t last_compute;    /* last op on the compute stream */
  int32_t last_reduce;     /* last op on the reduce stream */
  /* deps for the next compute op */
  int32_t pend[MP_OP_MAX_DEPS];
  uint8_t pend_flags[MP_OP_MAX_DEPS];
  int n_pend;
  /* units */
  int has_fsdp;
  unit_info *ui;           /* per plan unit (or per pseudo unit without FSDP) */
  int n_ui;
  int32_t *first_unit;     /* per layer: its first unit; units of a block are consecutive */
  int8_t *n_units;         /* per layer */
  int32_t root_unit;       /* -1 when this stage holds no root parameter */
  int reshard;
  int pp_fsdp;             /* FSDP under a pipeline (mp_plan_pp_fsdp): gathers in the first
                              micro-batch, parameters freed and gradients reduced in the last */
  int fsdp2_copies;        /* FSDP2's per-parameter copy-out of each gather and copy-in of
                              each reduce-scatter on the compute stream (schedule_fsdp.c) */
  int fsdp1_flat_grad;     /* FSDP1's flat parameters (opts.fsdp.flat_params): autograd's
                              cat of each unit's gradients into the flat one on the compute
                              stream (schedule_fsdp.c, rs_copy_in) */
  mp_dtype param_dtype, reduce_dtype; /* FSDP's (or DDP's) gather and reduce dtypes */
  const struct mem_strategy *ms; /* the plan's memory model's strategy (schedule_mem.c) */
  int ddp;                 /* data parallelism by DDP (opts.dp): replicated parameters,
                              gradient buckets all-reduced over the DDP group
                              (mp_sched_ddp_group) in the last micro-batch */
  int shard_optimizer;     /* DDP with its optimizer sharded (ddp.shard_optimizer, ZeRO-1):
                              the gradients reduce-scattered over the DDP group instead of
                              all-reduced, the optimizer on the rank's 1/d of them, the
                              updated parameters all-gathered back */
  int64_t stage_grad_bytes; /* DDP: the stage's gradients in the reduce dtype (the dense ones
                               where the experts' are reduced apart) */
  int64_t stage_expert_grad_bytes; /* DDP: its routed experts' over MP_GROUP_EDP, else 0 */
  int fp8_codes;           /* float8 Linears on codes (the strategy's, or meshplan-cpu with
                              the plan's f8_codes), else the CPU's fp32 emulation */
  int fp8_weights_sharded; /* float8 on codes: block weights FSDP-sharded (per-GEMM codes) */
  unsigned fp8_scope;      /* float8 on codes: the open block's quantized activations */
  int64_t fp8_scope_bytes[4];
  struct {                 /* overlap: the reduce-scatter in flight (one unit at most) */
    int on;
    int32_t layer, unit;
    int64_t rs, gbuf;
  } rs_in_flight;
  uint64_t recompute_skips; /* under MP_PHASE_RECOMPUTE: what the block's AC policy keeps
                              and the recompute therefore does not run (SKIP_*) */
  mp_act_layout layout[2]; /* runtimes: the activation layout (exec/act_layout.h) of a dense and of
                              an MoE block; under EP with balanced routing, N x top_k rows on
                              the expert side */
} gen;

typedef struct part_deps {
  int32_t dep[N_PARTS][2];
  uint8_t flags[N_PARTS][2];
} part_deps;

typedef struct stage_info {
  int32_t l0, l1; /* layers [l0, l1) */
  int first, last;
} stage_info;

/* Gather ops of the block the next block segment consumes (in earlier segments). */
typedef struct carry {
  int32_t gather[N_PARTS];
} carry;

/* What the runtime models hold at rest besides the torchtitan model's sums. */
typedef struct rt_rest {
  int64_t numel_pad; /* FSDP shards padded to the group's chunk: fp32 master, grad, m, v */
  int64_t numel_rep; /* parameters not FSDP-sharded: meshplan-cuda's bf16 compute copies */
  int64_t f8w_bytes; /* meshplan-cuda: codes of the float8 weights not FSDP-sharded */
  /* per parameter tensor of the stage (the runtime's optimizer works tensor by tensor):
   * its padded shard's elements, and whether it is not sharded (a resident compute copy) */
  int32_t n_t;
  int64_t *t_pad;
  uint8_t *t_rep;
  uint8_t *t_f8;     /* not sharded and float8: resident codes, re-quantized once per step */
  uint8_t *t_spn;    /* a norm's weight: under SP its gradient is a partial sum over the
                        sequence shards, all-reduced over tp once per step */
} rt_rest;

/* What the builder reads from the plan's parameters for one rank (see schedule.h). */
struct mp_schedule_prep {
  /* identity: the plan family it serves */
  const mp_param *params;
  const mp_fsdp_unit *units;
  int n_params, n_plan_units;
  unsigned applied;
  mp_mesh mesh;
  int64_t seq;
  int fp8_all_gather, fp8_param_gather, gpu_cc;
  mp_dtype param_dtype, reduce_dtype; /* FSDP's (or DDP's) gather and reduce dtypes */
  /* what it holds */
  int rank, stage;
  mp_schedule_mode mode;
  stage_info st;            /* the stage's first chunk's first layer to its last chunk's end */
  int v;                    /* model chunks of the stage */
  stage_info chunk[MP_PP_MAX_VIRTUAL]; /* per chunk: its layers; first: the model's first
                                          chunk (the embedding), last: its last (the head) */
  int64_t tied_grad_bytes;  /* a tied embedding copy's gradient at rest on this stage under
                               pp > 1 (reduce dtype), all-reduced with the other copy's; 0 */
  shapes sh; /* all but the micro-batch's part */
  int has_fsdp;
  unit_info *ui;
  int n_ui;
  int32_t *first_unit;
  int8_t *n_units;
  int32_t root_unit;
  int64_t params_numel;
  rt_rest rest;             /* the runtime models' resident sums */
  int32_t *run_len;
  int32_t mtp_l0, mtp_l1;   /* the MTP modules' blocks [mtp_l0, mtp_l1) the stage runs after
                               its last chunk's trunk (the last stage's; else empty) */
  double flops_per_token;
};

/* ---- the memory model's strategy --------------------------------------------------------- */

/* How the runtime a plan is for (its memory model, exec/plan.h) holds its state and runs a
 * step: one table per memory model (schedule_mem.c), chosen once per build. The builder
 * calls its steps and reads its properties; nothing else in the builder asks which memory
 * model it is. A new memory model is a table there, the steps it does not share, and its
 * name in exec/plan.h. */
typedef enum saved_model {
  SAVED_AUTOGRAD = 0, /* what PyTorch's autograd saves per op (schedule_act.c) */
  SAVED_KORTHIKANTI,  /* Megatron-LM's, as Korthikanti et al. 2022 count them */
  SAVED_LAYOUT,       /* the meshplan runtime's activation layout (exec/act_layout.h) */
} saved_model;

typedef struct mem_strategy {
  /* properties */
  uint8_t runtime;      /* meshplan's runtime: memory events replay its allocations, sized
                           by the activation layout (schedule_rt.c) */
  uint8_t x_bytes;      /* an activation element: 2 (bf16), or 4 (the CPU runtime's fp32) */
  uint8_t f8_codes;     /* float8 Linears on real codes, whatever the plan asks */
  uint8_t host_mem;     /* the backend's memory is host memory (no staging buffer) */
  uint8_t overlap;      /* collectives overlapped as NCCL runs them: a unit's reduce-scatter
                           finished one unit later (schedule_fsdp.c) */
  uint8_t prefetch;     /* FSDP gathers issued one block ahead (else as a block starts) */
  uint8_t top_gathers_own; /* backward: the stage's top block gathers its own units once the
                              head is done, not prefetched before it (the runtime's order) */
  uint8_t keeps_stage_output; /* a pipeline stage holds each micro-batch's output until its
                                 backward (torch.distributed.pipelining's fwd_cache) */
  uint8_t dtensor_tp;   /* TP as torchtitan runs it: DTensor's Shard(1) redistributions of
                           [batch, seq, H] through torch's functional collectives, each with a
                           chunk + cat copy, and AsyncTP as torch's symmetric-memory fused ops
                           (schedule_ops.c: sp_cat, fused_shard_copy) */
  uint8_t sp_regathers; /* SP saves a column-parallel region's input on the sequence shard and
                           all-gathers it again in backward (Megatron-LM) */
  uint8_t cp_kv_grouped; /* the ring moves grouped K, V (no repeat_kv) and keeps every step's
                            buffer to the pass's end (Transformer Engine's p2p ring) */
  uint8_t saved;        /* saved_model: what a block keeps for its backward */
  uint8_t fp8_tp_codes; /* float8 with tp > 1: a colwise region's input cast to float8 before
                           its all-gather and the output gradient before the reduce-scatter's
                           backward (torchao's float8 tensor parallel, as torchtitan applies
                           it: schedule_ops.c) */
  uint8_t rc_early_stop; /* a whole-block recompute stops once the last tensor the block saved
                            for its backward is refilled: a dense MLP's down projection (autograd
                            saves its inputs before its GEMM runs: tools/autograd/
                            gen_variable_type.py, save_variables in setup_derivative before
                            emit_call) and the residual add after it are not re-run. torch's
                            non-reentrant checkpoint does so by default (torch/utils/checkpoint.py:
                            _recomputation_hook's pack_hook raises _StopRecomputationError once
                            recomp_counter reaches the frame's saved count; the module flag
                            _enable_checkpoint_early_stop True in the 2024 releases, the
                            checkpoint(early_stop=True) argument at main 0008d771; torchtitan
                            turns it off only from 25413d224, Aug 2025); torch.compile's
                            partitioner leaves ops whose outputs the backward does not read out
                            of the backward graph; meshplan's runtime refills the saved tensors
                            and stops (schedule_block.c). torchao's float8 Linear, a custom
                            autograd Function, saves after its GEMM, so an eager float8 down
                            would be re-run; torchtitan's float8 runs are compiled */
  uint8_t fp8_te;       /* float8 Linears are Transformer Engine's (Megatron-LM): weights cast
                           once a step, casts writing the transposed copy beside the row-major
                           one, the norm before a fused LayerNormLinear emitting float8 under
                           delayed scaling, amaxes reduced once per model chunk's pass
                           (schedule_ops.c) */
  /* steps */
  void (*resident)(gen *g, const mp_schedule_prep *pr); /* the prologue's allocations */
  void (*block_fwd)(gen *g, int kind, const part_deps *pd);
  void (*block_bwd)(gen *g, int32_t l, int kind, const part_deps *pd);
  void (*head_fwd)(gen *g);
  void (*head_bwd)(gen *g);
  /* the end of a chunk's backward: the root's gradients (last_chunk) and what the
   * micro-batch held */
  void (*chunk_bwd_end)(gen *g, int last_chunk);
  void (*optimizer)(gen *g, const mp_schedule_prep *pr, int world_reduce);
} mem_strategy;

/* The strategy of memory model m (schedule_mem.c); NULL when m is not one. */
const mem_strategy *mp_sched_strategy(mp_mem_model m);

/* What a recompute skips (gen.recompute_skips): a module's ops (its Linear's GEMMs, a norm) by the
 * bit 1 << module, and these. */
#define SKIP_CORE (1ull << 61)     /* the attention core */
#define SKIP_RS (1ull << 62)       /* a TP region's closing reduce-scatter (its output kept) */
#define SKIP_RESIDUAL (1ull << 63) /* the residual adds */
#define SKIP_MOD(m) (1ull << (m)) /* bits below SKIP_CORE's: MP_MOD_COUNT <= 61 (asserted below) */
_Static_assert(MP_MOD_COUNT <= 61, "a module's skip bit must stay below SKIP_CORE");

/* ---- emission primitives (schedule_ops.c holds their slow paths) ------------------------ */

/* Whether the current op is one the recompute under way does not run. */
/* The group replicated gradients are reduced over without FSDP (mp_plan_ddp_group). */
static inline mp_group mp_sched_ddp_group(const gen *g) { return mp_plan_ddp_group(g->p); }

/* The data-parallel ranks the distributed optimizer shards over (the DDP group's size). */
static inline int64_t mp_sched_dopt_ways(const gen *g) {
  return mp_mesh_group_size(&g->p->mesh, mp_sched_ddp_group(g));
}

static inline int skipped(const gen *g, uint64_t bit) {
  return g->phase == MP_PHASE_RECOMPUTE && (g->recompute_skips & bit) != 0;
}

/* Records the builder's first failure (its message on ctx); later ones are dropped. */
void mp_sched_fail(gen *g, mp_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Doubles the op array; 0 (and the failure recorded) when the arena is out of memory. */
int mp_sched_grow_ops(gen *g);

static inline mp_op *no_op(gen *g, int32_t *idx) {
  memset(&g->dummy, 0, sizeof g->dummy);
  if (idx) *idx = -1;
  return &g->dummy;
}

/* A new op of the open segment, initialised from the emission state; the dummy op (index
 * -1) once the builder has failed. */
static inline mp_op *new_op(gen *g, mp_op_type type, mp_stream stream, int32_t *idx) {
  if (g->status != MP_OK || (g->n_ops == g->cap_ops && !mp_sched_grow_ops(g))) return no_op(g, idx);
  int32_t i = g->n_ops++;
  mp_op *op = &g->ops[i];
  /* a copy of an all-zero op, not memset: gcc turns a small memset into `rep stos`, slow
   * to start for 104 bytes, and this runs for every op of every schedule */
  static const mp_op k_zero;
  *op = k_zero;
  op->type = (uint8_t)type;
  op->phase = g->phase;
  op->stream = (uint8_t)stream;
  op->when = g->when;
  op->module = -1;
  op->layer = g->layer;
  op->unit = -1;
  op->batch = 1;
  op->dtype = MP_DTYPE_BF16;
  if (stream == MP_STREAM_COMPUTE) g->last_compute = i;
  if (stream == MP_STREAM_REDUCE) g->last_reduce = i;
  if (idx) *idx = i;
  return op;
}

static inline void add_dep(gen *g, int32_t op, int32_t dep, uint8_t flags) {
  if (op < 0 || dep < 0 || g->status != MP_OK) return;
  mp_op *o = &g->ops[op];
  for (int i = 0; i < o->n_dep; i++)
    if (o->dep[i] == dep && o->dep_flags[i] == flags) return;
  if (o->n_dep >= MP_OP_MAX_DEPS) { /* a builder bug */
    mp_sched_fail(g, MP_ERR_INTERNAL, "schedule builder gave an op more than %d dependencies",
                  MP_OP_MAX_DEPS);
    return;
  }
  o->dep[o->n_dep] = dep;
  o->dep_flags[o->n_dep] = flags;
  o->n_dep++;
}

static inline void pend_dep(gen *g, int32_t dep, uint8_t flags) {
  if (dep < 0 || g->n_pend >= MP_OP_MAX_DEPS) return;
  g->pend[g->n_pend] = dep;
  g->pend_flags[g->n_pend] = flags;
  g->n_pend++;
}

static inline int32_t compute(gen *g, mp_kernel k, mp_variant v, int module, int64_t m, int64_t n,
                              int64_t kk, int64_t batch, double flops, double bytes, mp_dtype dt) {
  int32_t i;
  mp_op *op = new_op(g, MP_OP_COMPUTE, MP_STREAM_COMPUTE, &i);
  op->kernel = (uint8_t)k;
  op->variant = (uint8_t)v;
  op->module = (int16_t)module;
  op->m = m;
  op->n = n;
  op->k = kk;
  op->batch = batch;
  op->flops = flops;
  op->bytes = bytes;
  op->dtype = (uint8_t)dt;
  for (int d = 0; d < g->n_pend; d++) add_dep(g, i, g->pend[d], g->pend_flags[d]);
  g->n_pend = 0;
  return i;
}

static inline int32_t elementwise(gen *g, mp_kernel k, mp_variant v, int module, int64_t elems,
                                  double flops_per, double bytes) {
  return compute(g, k, v, module, elems, 0, 0, 1, flops_per * (double)elems, bytes,
                 MP_DTYPE_BF16);
}

static inline int32_t comm(gen *g, mp_coll c, mp_group grp, mp_stream stream, double bytes,
                           mp_dtype dt, int module) {
  int32_t i;
  mp_op *op = new_op(g, MP_OP_COMM, stream, &i);
  op->coll = (uint8_t)c;
  op->group = (uint8_t)grp;
  op->bytes = bytes;
  op->dtype = (uint8_t)dt;
  op->module = (int16_t)module;
  return i;
}

/* Whether a gradient reduce-scatter averages in the collective (mp_op.avg): Megatron-LM's
 * --ddp-average-in-collective, ReduceOp.AVG in its DDP and Megatron FSDP buffers
 * (megatron/core/distributed/param_and_grad_buffer.py and fsdp/src/megatron_fsdp/
 * param_and_grad_buffer.py, core_v0.14.0; unset, gradient_scaling_factor and SUM); FSDP2
 * (torchtitan), whose _get_gradient_divide_factors (torch/distributed/fsdp/_fully_shard/
 * _fsdp_collectives.py at pytorch 010ae4a; ReduceOp.AVG for fp32 and bf16 from torch 2.4)
 * gives ReduceOp.AVG for the fp32 and bf16 reduce dtypes the plan allows, or a PreMulSum
 * under a set divide factor, unless set_force_sum_reduction_for_comms (SUM with a pre- and
 * post-division, as for fp16). FSDP1's flat parameters sum between a pre- and a
 * post-division (torch/distributed/fsdp/_runtime_utils.py), and the meshplan runtime sums
 * (ncclSum, exec/comm/comm_nccl_coll.c). */
static inline int grad_avg(const gen *g) {
  const mp_plan_options *o = &g->p->opts;
  if (o->mem_model == MP_MEM_MODEL_MEGATRON) return !o->ddp.scale_grads;
  return o->mem_model == MP_MEM_MODEL_TORCHTITAN && !o->fsdp.flat_params;
}

/* A gradient collective of FSDP unit u on the reduce stream (the unit's reduce-scatter,
 * or the all-reduce over dp_replicate), tagged with its layer and unit, after `after`. */
static inline int32_t grad_comm(gen *g, mp_coll c, mp_group grp, int64_t bytes, int32_t layer,
                                int32_t u, int32_t after) {
  int32_t i = comm(g, c, grp, MP_STREAM_REDUCE, (double)bytes, g->reduce_dtype, -1);
  if (i >= 0) {
    g->ops[i].layer = layer;
    g->ops[i].unit = u;
    g->ops[i].avg = (uint8_t)(c == MP_COLL_REDUCE_SCATTER && grad_avg(g));
  }
  add_dep(g, i, after, 0);
  return i;
}

static inline int32_t mem(gen *g, mp_op_type type, mp_mem_cat cat, int buf, int64_t bytes,
                          int32_t layer, int32_t unit, mp_stream stream) {
  int32_t i;
  mp_op *op = new_op(g, type, stream, &i);
  op->mem_cat = (uint8_t)cat;
  op->buf = buf;
  op->mem_bytes = bytes;
  op->layer = layer;
  op->unit = unit;
  return i;
}

/* The attention core's forward FLOPs on the rank's T queries: QK^T over the query/key head hd
 * and attention x V over the value head vd (equal but under MLA), 2 T x keys attended x
 * heads x (hd + vd); the keys attended are the causal half, seq / 2 per query, or under a
 * sliding window the band flash attention computes (FlashAttention-2's window_size skips the
 * tiles outside it). */
static inline double attn_core_fwd_flops(const shapes *sh) {
  return 2.0 * (double)sh->tokens * sh->attended * (double)sh->heads * (double)(sh->head_dim + sh->v_head_dim);
}

static inline void pair(gen *g, mp_mem_cat cat, int buf, int64_t bytes, int alloc) {
  if (bytes <= 0) return;
  mem(g, alloc ? MP_OP_ALLOC : MP_OP_FREE, cat, buf, bytes, g->layer, -1, MP_STREAM_COMPUTE);
}

/* ---- GEMMs -------------------------------------------------------------------------- */

/* An NVFP4 operand's bytes an element: half a byte of E2M1 code and an E4M3 scale per 16
 * elements (Transformer Engine's NVFP4Quantizer, pytorch/csrc/quantizer.cpp v2.9). */
#define MP_NVFP4_BYTES (0.5 + 1.0 / 16.0)

/* A GEMM; a float8 one under the nvfp4 recipe reads its operands at MP_NVFP4_BYTES and runs
 * on the FP4 tensor cores (mp_op.fp4): Transformer Engine's NVFP4BlockScaling quantizes the
 * input, the weight and the output gradient, so fprop, dgrad and wgrad all run in NVFP4. */
static inline int32_t gemm(gen *g, mp_variant v, int module, double m, int64_t n, int64_t k,
                           int64_t batch, mp_dtype dt) {
  const int in_b = mp_dtype_bytes(dt);
  const int f8 = dt == MP_DTYPE_FP8_E4M3 || dt == MP_DTYPE_FP8_E5M2, fp4 = f8 && g->sh.fp4_gemm;
  const double bytes = fp4 ? (double)batch * ((m + (double)n) * (double)k * MP_NVFP4_BYTES + m * (double)n * 2.0)
                           : mp_gemm_bytes(m, (double)n, (double)k, (double)batch, in_b);
  const int32_t i = compute(g, MP_KERNEL_GEMM, v, module, (int64_t)ceil(m), n, k, batch,
                            2.0 * m * (double)n * (double)k * (double)batch, bytes, dt);
  if (i >= 0 && g->sh.fp8_block_gemm && f8) g->ops[i].fp8_block = MP_FP8_BLOCK_HOPPER;
  if (i >= 0 && g->sh.mxfp8_gemm && f8 && !fp4) g->ops[i].fp8_block = MP_FP8_BLOCK_MX;
  if (i >= 0 && fp4) g->ops[i].fp4 = 1;
  return i;
}

/* schedule_fsdp.c: the first op to use unit `unit`'s parameters, gathered by ops `dep` (two,
 * -1 for none: the gather of the first repetition and the one the previous repetition
 * prefetched), waits for them (pending dependencies); under FSDP2 that op is the gathers'
 * copy-out. */
void mp_sched_gather_wait(gen *g, const int32_t dep[2], const uint8_t flags[2], int32_t unit);

/* The pending dependencies of a block part's first op (the gathers it waits for); the part's
 * unit as the segments lay them out (a single-unit block has everything in its unit 0). */
static inline void attach(gen *g, const part_deps *pd, int part) {
  if (pd == NULL) return;
  const int32_t unit =
      g->layer >= 0 && g->has_fsdp ? g->first_unit[g->layer] + (g->n_units[g->layer] == 1 ? 0 : part) : -1;
  mp_sched_gather_wait(g, pd->dep[part], pd->flags[part], unit);
}

/* schedule.c: a resident allocation of the prologue (its bytes in the schedule's
 * resident_bytes) */
void mp_sched_resident(gen *g, mp_mem_cat cat, int buf, int64_t bytes);
/* schedule_mem.c: Transformer Engine's float8 weight copies made in the layer's first forward
 * of a step, where they live within it */
void mp_sched_f8_held_fwd(gen *g);
/* Under f8_held_per_layer: layer l's float8 transposes made (alloc 1) or dropped (0) in its
 * forward (bwd 0) or backward (1). */
void mp_sched_f8_held_layer(gen *g, int bwd, int alloc);

/* schedule_act.c */
void mp_sched_block_bwd_tt(gen *g, int32_t l, int kind, const part_deps *pd);
void mp_sched_block_fwd_tt(gen *g, int kind, const part_deps *pd);

/* schedule_ops.c: what a block's, the embedding's and the head's ops are made of */
/* A Linear's forward or backward GEMMs (float8 casts included) on m tokens (batch > 1:
 * grouped expert GEMMs); a weight gradient's FLOPs from m_tokens rows (ops from `first` on). */
void mp_sched_linear_fwd(gen *g, int module, double m, int64_t out, int64_t in, int64_t batch);
void mp_sched_linear_bwd(gen *g, int module, double m, int64_t out, int64_t in, int64_t batch);
void mp_sched_fix_wgrad_flops(gen *g, int32_t first, double m_tokens);
/* Whether Linear `module` reads torchao's float8-gathered input (f8 TP). */
int mp_sched_f8_input(const gen *g, int module);
/* A TP region entered (SP: all-gather; f8: in float8) and closed (SP: reduce-scatter; else
 * all-reduce), forward and backward; nothing where `on` is 0. */
void mp_sched_tp_region_in_fwd(gen *g, int on, int module, int f8);
void mp_sched_tp_region_out_fwd(gen *g, int on, int module);
void mp_sched_tp_region_out_bwd(gen *g, int on, int module);
void mp_sched_tp_region_in_bwd(gen *g, int on, int module);
/* AsyncTP / TP comm overlap: the collective and GEMMs from op `from` fused as `kind`. */
void mp_sched_fuse_tp(gen *g, int32_t from, mp_fuse kind, mp_variant v);
/* The MoE's dispatch or combine all-to-all over ep; `to_experts`: it carries tokens (or
 * output gradients) to the experts, in float8 under o.moe_fp8_dispatch. */
void mp_sched_ep_alltoall(gen *g, int module, int to_experts);
/* The expert-TP group's all-gather of the dispatched rows (gather) or reduce-scatter of the
 * experts' partial outputs, where shapes.etp_rows > 1 and the dispatcher is the all-to-all
 * (schedule_ops.c). */
void mp_sched_etp_coll(gen *g, int module, int gather);
/* 1 where the flex dispatcher (DeepEP, HybridEP) meets etp_rows > 1: the dispatch sends a
 * token's copy to each expert-TP rank and no ETP collective runs (schedule_ops.c). */
int mp_sched_flex_etp(const gen *g);
/* Megatron-LM's SP re-gather of a region's input in backward (-1: none), and its wait. */
int32_t mp_sched_mg_regather(gen *g, int on, int module);
void mp_sched_mg_regather_wait(gen *g, int32_t gather, int32_t first_op);
void mp_sched_bulk_tp(gen *g, int32_t from, int module);
void mp_sched_norm_fwd(gen *g, int module, int64_t rows, int64_t width);
void mp_sched_norm_bwd(gen *g, int module, int64_t rows, int64_t width);
void mp_sched_residual(gen *g, mp_variant v, int64_t elems);
void mp_sched_seg_close(gen *g, mp_phase phase, int32_t repeat, int32_t layer_step,
                        int32_t unit_step);
void mp_sched_seg_open(gen *g, mp_phase phase, int32_t layer, int32_t layer_step);

/* schedule_mamba.c: a hybrid model's Mamba-2 layer, forward and backward, and what it saves
 * (stats: its norm's statistics, in: in_proj's saved input, as the attention's, out_in:
 * out_proj's saved input) */
void mp_sched_mamba_fwd(gen *g, const part_deps *pd);
void mp_sched_mamba_bwd(gen *g, const part_deps *pd);
int64_t mp_sched_mamba_saved(const shapes *sh, int64_t stats, int64_t in, int64_t out_in);

/* schedule_block.c: a block's attention and MLP (or MoE), forward and backward */
void mp_sched_attention_bwd(gen *g, const part_deps *pd);
void mp_sched_attention_core_bwd(gen *g);
void mp_sched_attention_core_fwd(gen *g);
void mp_sched_attention_fwd(gen *g, const part_deps *pd);
void mp_sched_attention_out_fwd(gen *g);
void mp_sched_mlp_bwd(gen *g, int kind, const part_deps *pd);
void mp_sched_mlp_fwd(gen *g, int kind, const part_deps *pd);
/* Megatron-Core's shared_experts recompute: a MoE block's shared experts' forward again */
void mp_sched_shared_fwd(gen *g);

/* schedule_mla.c: multi-head latent attention's projections, forward from the normed input
 * to q, k and v ready for the core; backward from their gradients to the input's */
void mp_sched_mla_fwd(gen *g);
void mp_sched_mla_bwd(gen *g);
/* Megatron-Core's mla_up_proj recompute: the latent norms, the up projections, RoPE and the
 * assembly of q and k run again (the recompute phase), and the bytes they save without AC
 * (the normed latents and their rstd, kv_b's output, the assembled q and k). */
void mp_sched_mla_up_fwd(gen *g);
int64_t mp_sched_mla_up_saved(const shapes *sh);
/* Bytes an MLA block's attention part saves without AC (schedule_mla.c), the attention
 * input counted as `in` bytes (2TH, or 2TsH where Megatron-LM keeps it sharded). */
int64_t mp_sched_mla_attn_saved(const shapes *sh, int64_t in);
/* What selective-op AC keeps of an MLA attention's matmul outputs (bytes), *in_saved the part
 * of it the attention saves without AC too, the recompute's skips added to *skip. */
int64_t mp_sched_mla_op_sac(const shapes *sh, int64_t *in_saved, uint64_t *skip);

/* schedule_head.c: the embedding, the head and the loss */
void mp_sched_embedding_bwd(gen *g);
void mp_sched_embedding_fwd(gen *g);
void mp_sched_head_bwd(gen *g);
void mp_sched_head_bwd_rt(gen *g);
void mp_sched_head_fwd(gen *g);
void mp_sched_head_fwd_rt(gen *g);
void mp_sched_head_norm_bwd(gen *g, int norm);
void mp_sched_head_norm_fwd(gen *g, int norm);
void mp_sched_mtp_head_bwd(gen *g, int32_t layer);
void mp_sched_mtp_head_fwd(gen *g, int32_t layer);
void mp_sched_mtp_in_bwd(gen *g);
void mp_sched_mtp_in_fwd(gen *g);

/* schedule_rt.c */
int mp_sched_f8_source(int module);
void mp_sched_rt_add_param(rt_rest *rest, unit_info *ui, const mp_param *prm, int gs,
                           int64_t local, int64_t n);
void mp_sched_rt_block_bwd(gen *g, int32_t l, int kind, const part_deps *pd);
void mp_sched_rt_block_fwd(gen *g, int kind, const part_deps *pd);
void mp_sched_rt_f8_act(gen *g, int module, int64_t elems);
/* Transformer Engine's delayed-scaling amax reduction at the end of a chunk's pass over
 * `blocks` blocks (schedule_ops.c). */
void mp_sched_f8_amax_reduce(gen *g, int32_t blocks, int backward);
void mp_sched_f8_weight_refresh(gen *g, int64_t elems, int64_t whole, int64_t tensors, mp_group grp);
void mp_sched_rt_f8_cast(gen *g, int module, int64_t elems, int amax, int orient, mp_variant v);
void mp_sched_rt_f8_scope_close(gen *g);
void mp_sched_rt_layout_fill(gen *g, int64_t micro_batch);
void mp_sched_rt_mem(gen *g, mp_act_alloc a, int kind, int alloc);
void mp_sched_rt_sp(gen *g, int alloc);
void mp_sched_rt_cp_attention_fwd(gen *g);
void mp_sched_rt_cp_attention_bwd(gen *g);
void mp_sched_rt_optimizer(gen *g, const mp_schedule_prep *pr, int world_reduce);
void mp_sched_rt_resident(gen *g, const mp_schedule_prep *pr);
void mp_sched_rt_chunk_bwd_end(gen *g, int last_chunk);

/* schedule_cp.c */
void mp_sched_cp_attention_bwd(gen *g);
void mp_sched_cp_attention_fwd(gen *g);
/* schedule_cp_te.c: Megatron-Core's all_gather and a2a context parallelism */
void mp_sched_cp_te_bwd(gen *g);
void mp_sched_cp_te_fwd(gen *g);

/* schedule_fsdp.c */
void mp_sched_free_units(gen *g, int32_t layer, int32_t unit0, int n, int part_lo, int part_hi);
void mp_sched_gather_units(gen *g, int32_t layer, int32_t unit0, int n, int32_t gidx[N_PARTS],
                           int32_t dep_prev, int32_t *patch, int *n_patch);
int32_t mp_sched_dopt_gather(gen *g, int32_t layer, int32_t unit0, int n, int32_t after, int32_t *patch,
                             int *n_patch);
int mp_sched_dopt_gather_at_use(const gen *g);
/* Megatron-LM's DDP before a bucket of n gradient elements is reduced, in the last
 * micro-batch on the compute stream after `after` (megatron/core/distributed/
 * param_and_grad_buffer.py start_grad_sync, core_v0.14.0): its norm checked for NaN and Inf
 * (check_grads: grad_data.norm(p=2), ddp.check_grads) and its elements scaled by 1/d
 * (grad_data *= gradient_scaling_factor, ddp.scale_grads). Returns the last op, the
 * reduction's dependency (`after` where there is none). */
int32_t mp_sched_ddp_bucket_prep(gen *g, int64_t n, int32_t after);
/* Whether gradients reduced over grp cross the distributed optimizer's instances: grp is an
 * instance's group, the dense one (MP_GROUP_DOPT) or the routed experts' (MP_GROUP_EDOPT),
 * and there is more than one instance. */
int mp_sched_dopt_across(const gen *g, mp_group grp);
/* The distributed optimizer's instances (the mesh's dopt): after rs, the reduce-scatter of
 * n elements' gradients over grp (or, where the instance's part of grp is one rank, the op
 * the reduction would have followed), the rank's shard (ceil(n / d) elements, d grp's
 * ranks) all-reduced across the instances (MP_GROUP_DOPT_INTER) on the reduce stream behind
 * it, in the last micro-batch (param_and_grad_buffer.py start_grad_sync, core_v0.14.0: both
 * issued in order on one communication stream; the dense and the expert buffers each make
 * a stream of their own, distributed_data_parallel.py, where here both queue on the reduce
 * stream). -1 (nothing) unless mp_sched_dopt_across. */
int32_t mp_sched_dopt_inter(gen *g, mp_group grp, int64_t n, int32_t layer, int32_t u, int32_t rs);

/* Megatron-Core's buckets over DDP unit ui's parameters under mp_ddp_options.bucket_size
 * (see schedule_fsdp.c): their elements and float8 elements into numel and f8, returning
 * their count; 0 where the unit stays one bucket (no bucket size, or routed experts). */
int mp_sched_ddp_buckets(const gen *g, const unit_info *ui, int64_t numel[UNIT_MAX_PRM], int64_t f8[UNIT_MAX_PRM]);
void mp_sched_gather_block(gen *g, int32_t l, int32_t gidx[N_PARTS], int32_t dep_prev,
                           int32_t *patch, int *n_patch);
void mp_sched_grads_alloc(gen *g, int32_t layer, int32_t unit0, int n);
void mp_sched_reduce_units(gen *g, int32_t layer, int32_t unit0, int n, int lo, int hi);
void mp_sched_pp_fsdp_reduce(gen *g, int32_t l0, int32_t l1, int root);
/* Megatron FSDP: the gathered bytes of the blocks its all-gather prefetch holds beyond the
 * one block ahead the builder gathers (resident from the prologue; schedule_mem.c), 0 for
 * every other data parallelism and with --fsdp-double-buffer. */
int64_t mp_sched_mfsdp_prefetch_extra_bytes(const gen *g);
void mp_sched_rt_rs_finish(gen *g);

/* schedule_prep.c */
mp_status mp_sched_check_plan_rank(mp_ctx *ctx, const mp_plan *p, int rank);
int mp_sched_kind_of(const gen *g, int32_t l, const stage_info *st);
mp_status mp_sched_prep_fill(mp_ctx *ctx, const mp_plan *p, int rank, mp_schedule_mode mode,
                             mp_arena *arena, mp_schedule_prep **out);
int mp_sched_prep_serves(const mp_schedule_prep *pr, const mp_plan *p);
void mp_sched_shapes_for_batch(shapes *sh, const mp_plan *p, int64_t micro_batch);

#endif
