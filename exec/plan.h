/* Plan IR: what every rank stores and runs, produced by the ordered sharding passes.
 *
 *   mp_plan_create        module tree on a "meta" footing: every parameter's FQN and
 *                         global shape, nothing allocated (shapes first, shards later)
 *   mp_apply_tensor_parallel   (1) colwise / rowwise / vocab-parallel over the tp group
 *   mp_apply_expert_parallel   (2) routed experts split over the ep group
 *   mp_apply_float8            (3) Linear layers marked float8
 *   mp_apply_ac                (4) activation checkpointing per block
 *   mp_apply_fsdp              (5) FSDP units, parameters sharded dim 0 over their group,
 *   or mp_apply_ddp                gradient buckets, parameters replicated (opts.dp)
 *   mp_build_plan         all five in order, from options
 *
 * Each pass checks the plan's state and refuses a wrong order or combination with
 * MP_ERR_ORDER and a message that names the rule and its consequence (tests/plan/
 * passes_test.cc holds one case per refusal). A pass applied twice is refused too.
 *
 * Shapes: a Linear weight is stored [out, in] as in PyTorch; routed experts are one 3-D
 * parameter per projection, [n_experts, out, in]; embeddings are [vocab, d_model].
 * Sharding composes in pass order: TP (and EP) split the global tensor into the rank's
 * "tp-local" tensor, then FSDP splits dim 0 of that tensor over the FSDP group, the way
 * FSDP2 shards a DTensor's local tensor: chunk = ceil(len / group), the last ranks get
 * what is left (possibly nothing). Worked example (tested): d_model=8, d_ff=24,
 * dp_shard=4 x tp=2: up weight [24, 8] -> [12, 8] after TP -> [3, 8] at rest; down
 * weight [8, 24] -> [8, 12] after TP -> [2, 12] at rest.
 *
 * All plan memory lives in one arena owned by the plan (mp_plan_destroy frees it). */
#ifndef MP_EXEC_PLAN_H
#define MP_EXEC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/limits.h"
#include "common/status.h"
#include "exec/dtype.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan_fp8.h"
#include "exec/plan_pp.h"
#include "exec/plan_recompute.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_MAX_NDIM 3
#define MP_PP_MAX_VIRTUAL MP_LIM_PP_VIRTUAL /* model chunks per pipeline stage, at most */
#define MP_PP_MAX_LAYOUT 128 /* stages an explicit layout (pp_layers) may name, at most */

/* What a parameter is; the runtime picks kernels by this and the module. */
typedef enum mp_module {
  MP_MOD_TOK_EMBEDDINGS = 0, /* tok_embeddings            [vocab, H] */
  MP_MOD_POS_EMBEDDINGS,     /* pos_embeddings (gpt)      [max_seq, H] */
  MP_MOD_ATTN_NORM,          /* layers.N.attention_norm   [H] (+ bias for gpt) */
  MP_MOD_Q,                  /* layers.N.attention.q_proj [n_heads*hd, H] */
  MP_MOD_K,                  /* layers.N.attention.k_proj [n_kv*hd, H] */
  MP_MOD_V,                  /* layers.N.attention.v_proj [n_kv*hd, H] */
  MP_MOD_Q_NORM,             /* layers.N.attention.q_norm [hd] (Qwen3) */
  MP_MOD_K_NORM,             /* layers.N.attention.k_norm [hd] (Qwen3) */
  MP_MOD_O,                  /* layers.N.attention.o_proj [H, n_heads*hd] (MLA: n_heads*v) */
  MP_MOD_FFN_NORM,           /* layers.N.ffn_norm         [H] */
  MP_MOD_GATE,               /* layers.N.mlp.gate_proj    [d_ff, H] (llama) */
  MP_MOD_UP,                 /* layers.N.mlp.up_proj      [d_ff, H] */
  MP_MOD_DOWN,               /* layers.N.mlp.down_proj    [H, d_ff] */
  MP_MOD_ROUTER,             /* layers.N.moe.router       [n_experts, H] */
  MP_MOD_EXPERTS_GATE,       /* layers.N.moe.experts.gate_proj [E, d_ff_expert, H] */
  MP_MOD_EXPERTS_UP,         /* layers.N.moe.experts.up_proj   [E, d_ff_expert, H] */
  MP_MOD_EXPERTS_DOWN,       /* layers.N.moe.experts.down_proj [E, H, d_ff_expert] */
  MP_MOD_SHARED_GATE,        /* layers.N.moe.shared_expert.gate_proj [d_ff_shared, H] */
  MP_MOD_SHARED_UP,          /* layers.N.moe.shared_expert.up_proj   [d_ff_shared, H] */
  MP_MOD_SHARED_DOWN,        /* layers.N.moe.shared_expert.down_proj [H, d_ff_shared] */
  MP_MOD_FINAL_NORM,         /* norm                      [H] */
  MP_MOD_OUTPUT,             /* output                    [vocab, H] (absent when tied) */
  /* multi-head latent attention (exec/model.h; ql = q_lora_rank, kvl = kv_lora_rank, qk =
   * qk_nope + qk_rope, the q path is q_proj when ql == 0) */
  MP_MOD_Q_A,                /* layers.N.attention.q_a_proj           [ql, H] */
  MP_MOD_Q_A_NORM,           /* layers.N.attention.q_a_layernorm      [ql] */
  MP_MOD_Q_B,                /* layers.N.attention.q_b_proj           [n_heads*qk, ql] */
  MP_MOD_KV_A,               /* layers.N.attention.kv_a_proj_with_mqa [kvl + qk_rope, H] */
  MP_MOD_KV_A_NORM,          /* layers.N.attention.kv_a_layernorm     [kvl] */
  MP_MOD_KV_B,               /* layers.N.attention.kv_b_proj          [n_heads*(qk_nope + v), kvl] */
  /* a multi-token-prediction module (exec/model.h mtp_layers; N = n_layers + depth - 1, its
   * block's modules beside these under the same N; DeepSeek-V3's checkpoint names) */
  MP_MOD_MTP_ENORM,          /* layers.N.enorm            [H] the next token's embedding's norm */
  MP_MOD_MTP_HNORM,          /* layers.N.hnorm            [H] the previous depth's hidden norm */
  MP_MOD_MTP_EH_PROJ,        /* layers.N.eh_proj          [H, 2H] */
  MP_MOD_MTP_NORM,           /* layers.N.shared_head.norm [H] before the shared output head */
  /* a hybrid model's Mamba-2 mixer (shapes: data/models/README.md "mamba"; pre-norm attention_norm) */
  MP_MOD_MAMBA_IN, MP_MOD_MAMBA_CONV, MP_MOD_MAMBA_DT_BIAS, MP_MOD_MAMBA_A_LOG, MP_MOD_MAMBA_D,
  MP_MOD_MAMBA_NORM, MP_MOD_MAMBA_OUT, /* mixer.in_proj, conv1d, dt_bias, A_log, D, norm, out_proj */
  MP_MOD_COUNT
} mp_module;

/* Weight or bias of a module (norm weight, Linear bias, LayerNorm bias). */
typedef enum mp_param_role { MP_ROLE_WEIGHT = 0, MP_ROLE_BIAS } mp_param_role;

/* Placement of a tensor on one axis of the mesh, as DTensor names them. */
typedef enum mp_placement_kind {
  MP_PLACEMENT_REPLICATE = 0,
  MP_PLACEMENT_SHARD, /* split along `dim` */
} mp_placement_kind;

typedef struct mp_placement {
  uint8_t kind; /* mp_placement_kind */
  int8_t dim;   /* tensor dim split when kind == SHARD */
} mp_placement;

/* The axes a parameter can be placed on. FSDP is the parameter's FSDP group: dp_shard x cp
 * for dense parameters (MP_GROUP_FSDP), dp_shard / ep for routed experts under EP
 * (MP_GROUP_EFSDP). */
typedef enum mp_axis { MP_AXIS_DP_REPLICATE = 0, MP_AXIS_FSDP, MP_AXIS_EP, MP_AXIS_TP, MP_AXIS_COUNT } mp_axis;

typedef enum mp_tp_style {
  MP_TP_NONE = 0,  /* replicated over tp (norms, router, or tp == 1) */
  MP_TP_COLWISE,   /* Shard(0) of [out, in]: output features split */
  MP_TP_ROWWISE,   /* Shard(1) of [out, in]: input features split, output partial-summed */
  MP_TP_VOCAB,     /* embedding rows split over tp (vocab-parallel) */
} mp_tp_style;

/* Activation checkpointing policies, by the names the stacks that run them use (the saved
 * tensors of each, derived per op, are in exec/schedule_act.c):
 *   NONE            every tensor autograd saves is kept
 *   SELECTIVE       the Attention module recomputed in backward, its input saved (KempnerForge
 *                   wraps `attention` in a checkpoint)
 *   SELECTIVE_OP    torchtitan's op-level SAC (selective_ac_option "op"): the outputs of the ops
 *                   in its save list (matmuls, attention, reduce-scatters) kept except every
 *                   second matmul of a block; everything else recomputed
 *   SELECTIVE_CORE  Megatron-LM's selective recompute (Korthikanti et al. 2022): the core
 *                   attention (QK^T, softmax, attention x V) recomputed from the saved q, k, v
 *   FULL            each block recomputed from its saved input; with ac_every = N > 1 only
 *                   every N-th block (torchtitan's integer selective_ac_option); under the
 *                   megatron model, Megatron-Core's method instead (exec/plan_recompute.h) */
typedef enum mp_ac_mode {
  MP_AC_NONE = 0,
  MP_AC_SELECTIVE,
  MP_AC_SELECTIVE_OP,
  MP_AC_SELECTIVE_CORE,
  MP_AC_FULL,
  MP_AC_COUNT
} mp_ac_mode;

/* How the attention core runs: FLASH (FlashAttention: causal blocks skipped, the per-head
 * log-sum-exp saved instead of the score matrix) or MATERIALIZED (Megatron-LM's fused
 * scale-mask-softmax between two batched GEMMs: the full s x s scores computed and, with
 * attention dropout, their softmax, mask and dropout output saved). Set from the stack
 * profile (sim/stack.h, key "attention"). */
typedef enum mp_attn_impl { MP_ATTN_FLASH = 0, MP_ATTN_MATERIALIZED } mp_attn_impl;

/* How the cross-entropy runs on the [T, V] logits, which decides the head's memory (the
 * largest tensors of a step). Set from the stack profile (key "loss"):
 *   EAGER    PyTorch eager as torchtitan calls it, cross_entropy(pred.float(), labels): the
 *            bf16 logits, their fp32 copy and log_softmax's fp32 output (saved) live at once;
 *            backward: nll's fp32 gradient, log_softmax's fp32 input gradient, the bf16 cast
 *   FUSED    one kernel (torch.compile's Inductor, llm.c's fused classifier): the bf16 logits
 *            and an fp32 log-sum-exp per token kept, the bf16 gradient written directly
 *   INPLACE  Megatron-LM's vocab-parallel cross-entropy: one fp32 copy of the logits turned
 *            into the softmax in place (saved) and into the gradient in place in backward,
 *            one eager kernel a step (Megatron's default)
 *   INPLACE_FUSED  the same tensors under Megatron-Core's --cross-entropy-loss-fusion, its
 *            steps compiled into one kernel a function (megatron/core/fusions/
 *            fused_cross_entropy.py); TE with --cross-entropy-fusion-impl te: Transformer Engine's
 *            kernels (triton/cross_entropy.py v2.6) write the gradient over the saved bf16 logits */
typedef enum mp_loss_impl { MP_LOSS_EAGER = 0, MP_LOSS_FUSED, MP_LOSS_INPLACE, MP_LOSS_INPLACE_FUSED, MP_LOSS_TE } mp_loss_impl;

typedef struct mp_param {
  const char *fqn;    /* "layers.3.attention.q_proj.weight" */
  const char *module_fqn; /* "layers.3.attention.q_proj" */
  mp_module module;
  mp_param_role role;
  int32_t layer;      /* block index, -1 outside blocks */
  int ndim;
  int64_t shape[MP_MAX_NDIM];    /* global */
  int64_t tp_shape[MP_MAX_NDIM]; /* after TP and EP: the rank's tensor before FSDP */
  mp_placement place[MP_AXIS_COUNT];
  mp_tp_style tp_style;
  int is_linear;      /* a Linear weight (2-D) or experts weight (3-D) */
  int is_expert;      /* routed experts: split over ep */
  int float8;         /* runs its GEMMs in float8 (set by mp_apply_float8) */
  int fsdp_unit;      /* index into plan->units, -1 before FSDP */
  mp_group fsdp_group;/* MP_GROUP_FSDP or MP_GROUP_EFSDP */
  int pp_stage;       /* pipeline stage holding it */
  int tied_copy;      /* the last pipeline stage's copy of tok_embeddings.weight serving as the
                         output head (tied embeddings with pp > 1, Megatron-LM's shared
                         embedding): its gradient is all-reduced with the first stage's */
} mp_param;

/* An FSDP unit: parameters all-gathered together before use and reduce-scattered after
 * backward. */
typedef struct mp_fsdp_unit {
  const char *name; /* "layers.3", "layers.3.attention", "layers.3.moe", "layers.3.moe.experts", "root" */
  int32_t layer;    /* -1 for root */
  mp_group group;   /* MP_GROUP_FSDP or MP_GROUP_EFSDP */
  int *params;      /* indices into plan->params */
  int n_params;
  int64_t numel_tp;     /* elements of the unit's tp-local tensors (what an all-gather produces) */
  int64_t numel_shard;  /* elements this unit keeps per rank at rest, padded to the group: ceil */
} mp_fsdp_unit;

typedef struct mp_tp_options {
  int shard_logits; /* 1: output head colwise, logits stay vocab-sharded (loss parallel);
                       0: logits all-gathered (replicated) before the loss */
  int pad_vocab;    /* 1: pad vocab up to a multiple of tp (saying so) instead of refusing */
} mp_tp_options;

typedef struct mp_fsdp_options {
  int reshard_after_forward; /* free gathered params after forward, gather again in backward */
  int per_block;             /* force exactly one unit per block (refused with EP) */
  mp_dtype param_dtype;      /* dtype of gathered parameters (bf16) */
  mp_dtype reduce_dtype;     /* dtype of gradient reduction (fp32) */
  int flat_params;           /* 1: FSDP1's flat parameters, gathered into and reduced from one
                                flat tensor a unit in place; 0 (default): FSDP2's
                                per-parameter tensors, copied out of each gather and into
                                each reduce-scatter (exec/schedule_fsdp.c) */
} mp_fsdp_options;

/* Whose implementation of a schedule runs (they differ only in the interleaved warm-up with
 * as many micro-batches as stages; exec/schedule_pp.c): Megatron-LM's (and the meshplan
 * runtime's) or torch.distributed.pipelining's (torchtitan's). */
typedef enum mp_pp_flavor {
  MP_PP_FLAVOR_MEGATRON = 0,
  MP_PP_FLAVOR_TORCH,
  MP_PP_FLAVOR_MEGATRON_A2A /* Megatron-LM's with --overlap-moe-expert-parallel-comm: one more
                               interleaved warm-up forward, so that every steady-state forward
                               pairs with a backward of another micro-batch (schedule_pp.c) */
} mp_pp_flavor;
/* How PyTorch's context-parallel ring (torchtitan's experimental.context_parallel_rotate_method)
 * moves K and V between the cp ranks (exec/schedule_cp.c): one all-gather of every rank's
 * K and V per attention pass (torchtitan's default), or a shift to the next rank before
 * every step but the last. The meshplan runtimes run their own ring, which shifts. */
typedef enum mp_cp_rotate { MP_CP_ROTATE_ALLGATHER = 0, MP_CP_ROTATE_ALLTOALL } mp_cp_rotate;
/* How Megatron-Core's context parallelism moves attention's tensors between the cp ranks
 * (--cp-comm-type, megatron/training/arguments.py of core_v0.14.0, default p2p, passed to
 * Transformer Engine's DotProductAttention as cp_comm_type): P2P, the ring that sends K and
 * V to the next rank before each step (AttnFuncWithCPAndKVP2P, exec/schedule_cp.c); ALL_GATHER,
 * K and V all-gathered before attention and dK, dV reduce-scattered after it, exposed
 * (AttnFuncWithCPAndKVAllGather, as Llama 3 runs it, arXiv 2407.21783 sec. 3.3.2); A2A,
 * DeepSpeed-Ulysses' all-to-alls of Q, K, V and the output over the heads
 * (AttnFuncWithCPAndQKVOA2A); A2A_P2P, the hierarchical pair of the two, which needs a
 * second cp level (--hierarchical-context-parallel-sizes) that the mesh does not have and
 * is refused (exec/rules.c, mp_rule_cp_comm_check); exec/schedule_cp_te.c builds the two
 * collective forms. The megatron memory model only. */
typedef enum mp_cp_comm {
  MP_CP_COMM_P2P = 0,
  MP_CP_COMM_ALL_GATHER,
  MP_CP_COMM_A2A,
  MP_CP_COMM_A2A_P2P,
  MP_CP_COMM_COUNT
} mp_cp_comm;
/* How the EP dispatch and combine move a rank's tokens (sim/network.c, mp_sim_ep_shares):
 * NCCL's all-to-all, one copy per (token, expert) to the expert's rank (Megatron-Core's
 * alltoall dispatcher, its default); or DeepEP's kernels (Megatron-Core's --moe-token-
 * dispatcher-type flex --moe-enable-deepep), which send a token over the network once per
 * destination node and forward it to that node's experts over NVLink (DeepSeek-V3, arXiv
 * 2412.19437 sec. 3.2.2; deepseek-ai/DeepEP's normal kernels); or HybridEP, the flex
 * dispatcher's other backend (--moe-flex-dispatcher-backend hybridep, core_v0.19.0; DeepEP's
 * hybrid-ep branch), the same hierarchical movement (docs/README_Hybrid-EP.md: RDMA between
 * nodes, NVLink inside one) by TMA kernels on an SM count of their own (the stack's
 * hybridep_sms), its received counts read by the host as DeepEP's are unless a capacity bounds
 * them (core_v0.19.0 _HybridEPManager: "sizes buffers dynamically (CPU sync)"; mp_moe_host_sync). */
typedef enum mp_moe_dispatcher {
  MP_MOE_DISPATCH_ALLTOALL = 0,
  MP_MOE_DISPATCH_DEEPEP,
  MP_MOE_DISPATCH_HYBRIDEP
} mp_moe_dispatcher;
/* Whether d sends a token once per destination node (DeepEP, HybridEP). */
static inline int mp_moe_dispatch_by_node(mp_moe_dispatcher d) {
  return d == MP_MOE_DISPATCH_DEEPEP || d == MP_MOE_DISPATCH_HYBRIDEP;
}

/* What Megatron-Core captures in CUDA graphs (transformer_config.py, transformer_layer.py,
 * cuda_graphs.py, core_v0.14.0; the scope lists core_v0.16.0). A captured kernel is replayed
 * from its graph: the host's launch work is paid once a graph, the GPU runs the kernels back
 * to back (sim/cost.c prices one at the stack's in-graph overhead, graph_kernel_overhead_us).
 *   NONE       eager launches (default).
 *   ATTN       --external-cuda-graph --cuda-graph-scope attn: Transformer Engine's
 *              make_graphed_callables captures TransformerLayer._forward_attention (the input
 *              norm, the attention, its projections, the residual), forward and backward, one
 *              graph a layer and micro-batch; the MLP or MoE runs eagerly.
 *   LAYERS     --enable-cuda-graph (scope full): every TransformerLayer, forward and backward,
 *              one graph a layer and micro-batch (CudaGraphManager records the whole layer in
 *              torch.cuda.graph, no eager fallback while training); the embedding, output
 *              layer, loss, optimizer and data-parallel hooks (setup_manual_hooks) eager.
 *   ITERATION  --enable-cuda-graph --cuda-graph-scope full_iteration: every micro-batch's
 *              forward and backward, the optimizer outside; Megatron asserts
 *              --no-check-for-nan-in-loss-and-grad (arguments.py).
 *   ROUTER     --cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router: ATTN's
 *              graph on through the pre-MLP norm, the router and, without shared-expert
 *              overlap, the shared experts (moe_layer.py route, shared_experts_compute).
 *   PREPROCESS ... attn moe_router moe_preprocess: and the dispatcher's preprocess (the routed
 *              counts); their copy to the host and its synchronisation stay eager after the
 *              graph (token_dispatcher.py cuda_dtoh_point "before_ep_alltoall").
 * A graph replays fixed kernels and sizes: a MoE layer whose dispatcher synchronises the host
 * (mp_moe_host_sync) cannot be captured whole; Megatron refuses recomputation under graphs
 * but a selective one under ATTN, ROUTER and PREPROCESS (transformer_config.py). */
typedef enum mp_cuda_graphs {
  MP_CUDA_GRAPHS_NONE = 0,
  MP_CUDA_GRAPHS_ATTN,
  MP_CUDA_GRAPHS_LAYERS,
  MP_CUDA_GRAPHS_ITERATION,
  MP_CUDA_GRAPHS_ROUTER,
  MP_CUDA_GRAPHS_PREPROCESS,
  MP_CUDA_GRAPHS_COUNT
} mp_cuda_graphs;

/* How routed tokens load the experts (the simulator prices the slowest EP rank, which every
 * all-to-all waits for: exec/schedule_prep.c, mp_sched_moe_rows):
 *   imbalance        f >= 1: the tokens on the busiest EP rank's experts over the mean. 1
 *                    (the default; 0 reads as 1): balanced, as benchmark recipes force it (Megatron-Core's
 *                    --moe-router-force-load-balancing). That rank's expert GEMMs and its
 *                    all-to-all bytes scale by f (capped by the capacity below). Moot at
 *                    ep = 1 (one rank holds every expert, and waits for no other).
 *   capacity_factor  C > 0: Megatron-Core's --moe-expert-capacity-factor: each expert takes at
 *                    most ceil(C x tokens x top_k / experts) of a rank's routed tokens
 *                    (megatron/core/transformer/moe/moe_utils.py, get_capacity and the
 *                    router's token dropping, core_v0.14), the excess dropped before the
 *                    dispatch (--moe-token-drop-policy probs or position: which tokens, not
 *                    how many). 0 (the default): dropless.
 *   pad_to_capacity  with C: --moe-pad-expert-input-to-capacity: every expert takes exactly
 *                    its capacity from every rank (the routing map padded), so its GEMMs and
 *                    the all-to-alls move C x the balanced rows whatever the imbalance.
 * Not under the meshplan runtimes' memory models, which route the real tokens (their
 * schedule sizes its buffers by them: exec/schedule_rt.c). */
typedef struct mp_moe_routing {
  double imbalance;
  double capacity_factor;
  int pad_to_capacity;
  double rank_capacity; /* --moe-expert-rank-capacity-factor (HybridEP, schedule_prep.c); 0: none */
} mp_moe_routing;

/* Whose memory the schedule's ALLOC/FREE events describe: a property of the runtime that
 * executes the plan, named by its stack profile (sim/stack.h, key "memory_model"). It
 * changes no parameter, unit or collective, only the memory events (and, where the
 * runtime runs fewer ops, what it recomputes); exec/schedule.c and exec/schedule_rt.c
 * document them.
 *   TORCHTITAN    PyTorch FSDP2 as torchtitan runs it: bf16 activations, the tensors
 *                 autograd saves, one block of all-gather prefetch, a one-rank FSDP group
 *                 still cast into a gathered buffer (the GPU stacks; the default)
 *   MESHPLAN_CPU  the runtime (exec/runtime/) on the CPU backend: fp32 tensors carved
 *                 from one allocation per block (exec/act_layout.h, 64-byte aligned),
 *                 blocking MPI collectives (no prefetch), parameters of a one-rank FSDP
 *                 group used in place
 *   MESHPLAN_CUDA the same runtime on the CUDA backend: the same layout with bf16 X
 *                 tensors, a resident bf16 compute copy of every parameter that is not
 *                 FSDP-sharded, units gathered in bf16, float8 GEMMs on real codes, and
 *                 NCCL's overlap (the next unit's gather prefetched, reduce-scatters
 *                 finished one unit later)
 *   MEGATRON      Megatron-LM (Shoeybi et al. 2019, Narayanan et al. 2021, Korthikanti et
 *                 al. 2022): fp16/bf16 model parameters beside fp32 main gradients and
 *                 fp32 master weights and Adam state, data parallelism by all-reduce of
 *                 gradient buckets (no FSDP), the saved activations Korthikanti et al.
 *                 count (dropout masks for GPT models, the attention scores unless the
 *                 stack runs flash attention) */
typedef enum mp_mem_model {
  MP_MEM_MODEL_TORCHTITAN = 0,
  MP_MEM_MODEL_MESHPLAN_CPU,
  MP_MEM_MODEL_MESHPLAN_CUDA,
  MP_MEM_MODEL_MEGATRON,
  MP_MEM_MODEL_COUNT
} mp_mem_model;

/* The meshplan runtime's own memory models (exec/runtime/ executes the plan). */
static inline int mp_mem_model_is_runtime(mp_mem_model m) {
  return m == MP_MEM_MODEL_MESHPLAN_CPU || m == MP_MEM_MODEL_MESHPLAN_CUDA;
}

/* How data parallelism holds the parameters, the plan's data-parallel pass (the fifth):
 *   FSDP  sharded (mp_apply_fsdp): every parameter's tp-local tensor on dim 0 over its FSDP
 *         group (dp_shard x cp), all-gathered before use, gradients reduce-scattered; FSDP2
 *         as torchtitan and the meshplan runtime run it (ZeRO stage 3)
 *   DDP   replicated (mp_apply_ddp) over the data-parallel group (dp_replicate, x cp with
 *         context parallelism: a cp rank holds every parameter), gradients all-reduced in
 *         one bucket per block; Megatron-LM's DDP, optionally with the optimizer state
 *         sharded (mp_ddp_options) */
typedef enum mp_dp_kind { MP_DP_AUTO = -1, MP_DP_FSDP = 0, MP_DP_DDP } mp_dp_kind;

/* DDP's options (dp DDP). */
typedef struct mp_ddp_options {
  int shard_optimizer; /* the fp32 master weights and Adam state sharded over the data-
                          parallel group (ZeRO stage 1, Rajbhandari et al. 2020; Megatron-LM's
                          --use-distributed-optimizer, megatron/core/optimizer/
                          distrib_optimizer.py): the fp32 gradients reduce-scattered over it
                          and the updated model-dtype parameters all-gathered back. 0:
                          replicated (default). Set from the stack (key
                          "distributed_optimizer") */
  int overlap;         /* the buckets reduced as each block's backward ends, overlapping the
                          rest (Megatron-LM's --overlap-grad-reduce), and with
                          shard_optimizer the parameters gathered block by block in the next
                          forward (--overlap-param-gather); 0: once after the step's last
                          backward. Set from the stack (key "dp_overlap") */
  int scale_grads;     /* each bucket's gradients multiplied by 1/d on the compute stream
                          before its reduction, summed in the collective (Megatron-LM's
                          gradient_scaling_factor); 0: Megatron-LM's
                          --ddp-average-in-collective, the buckets reduced unscaled with
                          ReduceOp.AVG (megatron/core/distributed/param_and_grad_buffer.py
                          core_v0.12.0 to core_v0.14.0, start_grad_sync). Set from the stack
                          (key "ddp_scale_grads"); simulate's and validate's
                          ddp_average_in_collective turn it off */
  int check_grads;     /* each bucket's gradient norm taken and checked for NaN and Inf before
                          its reduction (Megatron-Core's check_for_nan_in_grad, on unless
                          --no-check-for-nan-in-loss-and-grad). Set from the stack (key
                          "ddp_check_grads") */
  int align_param_gather; /* with shard_optimizer and overlap: Megatron-Core's
                          --align-param-gather, each bucket's all-gather left to the pipeline
                          schedule's param_sync_func, which forward_backward_no_pipelining and
                          the 1F1B schedule without interleaving never call
                          (core_v0.13.1 pipeline_parallel/schedules.py), so the forward
                          pre-hook dispatches the block's own gather and waits for it
                          (distributed_data_parallel.py, finish_param_sync with
                          skip_next_bucket_dispatch): the gather starts once the compute
                          before it is done (PyTorch's ProcessGroupNCCL runs a collective
                          after the work queued on the current stream) and the block waits
                          for it. Under interleaving the schedule dispatches them ahead.
                          Off by default; simulate's --align-param-gather, validate's
                          "ddp_align_param_gather" */
  int64_t bucket_size; /* with overlap: Megatron-Core's --ddp-bucket-size in elements, its
                          buckets formed over each block's parameters (mp_sched_ddp_buckets),
                          each gathered and reduced by its own collective; 0: one bucket a
                          block, meshplan's reading of Megatron's default of max(4e7,
                          1e6 x dp) elements (distributed_data_parallel.py). Simulate's
                          --ddp-bucket-size, validate's "ddp_bucket_size" */
  int wgrad_unfused;   /* Megatron-LM's --no-gradient-accumulation-fusion: each weight-gradient
                          GEMM writes the bf16 param.grad and the parameter's hook moves it into
                          the main_grad in its own kernel (exec/schedule_ops.c,
                          unfused_grad_accum), where the stack's fusion (wgrad_accum_fp32)
                          accumulates in the GEMM. Megatron-LM asserts it under Megatron FSDP's
                          optim_grads_params before core_v0.14 (megatron/training/arguments.py
                          core_v0.13.0). Off by default; simulate's
                          --no-gradient-accumulation-fusion, validate's "grad_accum_fusion" 0 */
} mp_ddp_options;

/* Megatron-Core's FSDP (Megatron FSDP, --use-megatron-fsdp; --use-custom-fsdp before
 * core_v0.14) and its --data-parallel-sharding-strategy, which the megatron memory model runs
 * where dp_shard > 1. What each shards over the dp x cp group (megatron/core/distributed/
 * fsdp/src/megatron_fsdp/param_and_grad_buffer.py, _init_each_parameter_group_buffers,
 * core_v0.14.0): optim the fp32 main weights (and with them Adam's state), optim_grads also
 * the fp32 main gradients, optim_grads_params also the 16-bit model weights, gathered
 * TransformerLayer by TransformerLayer (mcore_fsdp_adapter.py's default fsdp_unit_modules);
 * no_shard nothing. OPTIM_GRADS_PARAMS is the default (NeMo's and the docs' setting). */
typedef enum mp_mfsdp_strategy {
  MP_MFSDP_OPTIM_GRADS_PARAMS = 0,
  MP_MFSDP_OPTIM_GRADS,
  MP_MFSDP_OPTIM,
  MP_MFSDP_NO_SHARD,
  MP_MFSDP_COUNT
} mp_mfsdp_strategy;

/* What mp_build_plan needs besides the model and mesh. Defaults: mp_plan_options_init. */
typedef struct mp_plan_options {
  mp_tp_options tp;
  int fp8;
  mp_float8_options fp8_opts;
  mp_ac_mode ac;
  int ac_every;          /* FULL: recompute every ac_every-th block only (blocks l with
                            (l + 1) % ac_every == 0, torchtitan's count); 0 or 1: every block */
  mp_recompute_method recompute_method; /* FULL, megatron model: Megatron-Core's; NONE: every block */
  int recompute_num_layers; /* with recompute_method: --recompute-num-layers, >= 1 */
  int sp;                /* sequence parallelism with tp (Korthikanti et al. 2022): norms, residuals and
                            dropout on [T/tp, H], all-gather before and reduce-scatter after each TP
                            region. 1 on, 0 off (the all-reduce form), -1 (default): on when tp > 1 under
                            a memory model whose runtime runs it (torchtitan, megatron), by mp_plan_create */
  mp_attn_impl attn;     /* the attention kernel (default FLASH) */
  mp_loss_impl loss;     /* the cross-entropy's implementation (default EAGER) */
  int loss_chunks;       /* torchtitan's ChunkedLossWrapper: head and loss in N sequence chunks (schedule_head.c); 0, 1: off */
  mp_dp_kind dp;         /* how data parallelism holds the parameters: FSDP (sharded) or
                            DDP (replicated); MP_DP_AUTO (default): DDP under the megatron
                            memory model, FSDP otherwise, resolved by mp_plan_create */
  mp_ddp_options ddp;    /* DDP's gradient reduction and optimizer (dp DDP) */
  mp_fsdp_options fsdp;
  mp_mfsdp_strategy mfsdp_strategy; /* Megatron FSDP's sharding strategy (the megatron memory
                                       model with dp_shard > 1; default OPTIM_GRADS_PARAMS) */
  int fsdp_double_buffer; /* Megatron FSDP's --fsdp-double-buffer: the gathered weights and the unsharded
                             gradients in two fixed buffers of units, so at most the next TransformerLayer
                             is prefetched; 0 (default): gathers are prefetched until 500M elements are in
                             flight (param_and_grad_buffer.py, AllGatherPipeline.all_gather_params) */
  mp_pp_schedule pp_schedule;
  int pp_virtual;        /* virtual stages per rank for interleaved (>= 1) */
  int n_pp_layers;       /* 0: the default split (mp_plan_chunk_layers); pp: stage s holds
                            pp_layers[s] layers, one model chunk a stage (Megatron-LM's
                            --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers, torchtitan's
                            pipeline_parallel_layers_per_stage / module names per stage);
                            pp x pp_virtual (interleaved): model chunk k = c x pp + s holds
                            pp_layers[k] (Megatron-LM's --pipeline-model-parallel-layout,
                            mp_pp_layout_parse), the first and last possibly none */
  int16_t pp_layers[MP_PP_MAX_LAYOUT];
  int pp_mtp;            /* MTP layers ('m') on the last virtual stage of a layout: the count a
                            parsed layout states (pp_mtp_stated), which the plan checks against
                            the model's mtp_layers as Megatron-Core's validate_layer_layout
                            does; the plan sets it to the model's, and mp_pp_layout_format
                            writes it */
  int pp_mtp_stated;
  mp_cp_rotate cp_rotate; /* PyTorch's ring with cp > 1: how K and V travel (default
                             ALLGATHER). Set from the stack (key "cp_rotate") */
  mp_cp_comm cp_comm;     /* Megatron-Core's --cp-comm-type with cp > 1 (default P2P, its
                             own); the megatron memory model only */
  int cp_wait_at_issue;   /* with cp > 1: the ring's collectives are waited for where they
                             are issued, beside no attention step, so the transfers run on the
                             compute stream between the steps. torchtitan compiles each block
                             whole (torch.compile, fullgraph), so the ring is traced into the
                             block's graph, where a functional collective is followed by its
                             wait at once (torch/distributed/_functional_collectives.py,
                             _maybe_wrap_tensor) and Inductor moves no wait
                             (reorder_for_compute_comm_overlap is off by default). 0 (default):
                             each transfer runs beside the compute before its first use (eager
                             PyTorch's AsyncCollectiveTensor, Transformer Engine's streams).
                             Set from the stack (key "cp_overlap" false); the torchtitan memory
                             model only */
  int te_spec;           /* megatron model: Megatron-Core's TE layer spec (stack "te_layer_spec"; schedule_act.c) */
  int tp_comm_fused;     /* with tp > 1 and SP: the all-gathers into the column-parallel Linears and the reduce-scatters out
                            of the row-parallel ones run in tp chunks beside those GEMMs (exec/schedule_ops.c): torchtitan's
                            AsyncTP (experimental.enable_async_tensor_parallel, torch.compile's micro-pipelined TP) and
                            Megatron-Core's --tp-comm-overlap (Transformer Engine's userbuffers, which pipeline the same
                            pairs). 0: off (default); not under the runtimes' memory models */
  mp_moe_dispatcher moe_dispatcher; /* default ALLTOALL; DEEPEP, HYBRIDEP: the megatron
                                       memory model with ep > 1 */
  int moe_a2a_overlap;   /* Megatron-Core's --overlap-moe-expert-parallel-comm: in the
                            steady state the forward of one micro-batch and the backward of
                            another run as one step, each one's EP all-to-alls beside the
                            other's compute (sim/overlap.c). Megatron-Core's conditions
                            (megatron/core/transformer/transformer_config.py, core_v0.14):
                            ep > 1, interleaved stages when pp > 1, no full recompute; the
                            megatron memory model only. 0: off (default) */
  mp_moe_routing moe_routing; /* the experts' load (imbalance 1, dropless by default) */
  mp_cuda_graphs cuda_graphs; /* what CUDA graphs capture (default NONE); the megatron
                                memory model only (mp_rule_cuda_graphs_check) */
  uint32_t recompute_modules; /* bits 1 << mp_rc_module; 0: none (default) */
  int cpu_offload_layers; /* Megatron-Core's CPU offloading of the first N layers (rules.h); 0: off */
  int moe_fp8_dispatch;  /* DeepSeek-V3's float8 dispatch (arXiv 2412.19437, sec. 3.3.3): the
                            tokens sent to the experts (the forward's dispatch, and the
                            backward's gradients into the experts' down projections) travel
                            as E4M3 with one fp32 scale per 128 elements (1 + 4/128 bytes an
                            element); the combines stay bf16. Needs ep > 1 and float8 Linears.
                            0: off (default: bf16 both ways) */
  int fp8_act_cache;     /* DeepSeek-V3's low-precision storage of activations (arXiv
                            2412.19437, sec. 3.3.3) under the blockwise float8 recipe and the
                            megatron memory model: what a block saves for the backward of a
                            float8 Linear, and the MoE's SwiGLU inputs, kept as E4M3 with an
                            fp32 scale per 128 elements (1 + 4/128 bytes an element), the
                            attention output (o's input) in their E5M6 (12 bits: 1.5 + 4/128
                            bytes) (exec/schedule_act.c). 0: off (default: bf16) */
  mp_dtype moment_dtype; /* AdamW's first and second moments: FP32 (default) or BF16
                            (DeepSeek-V3 sec. 3.3.3, beside fp32 master weights and gradients;
                            Megatron-Core's --exp-avg-dtype / --exp-avg-sq-dtype bf16 under
                            --use-precision-aware-optimizer). The autograd memory models only */
  int64_t seq;           /* tokens per sequence (0: min(max_seq, 8192), set by mp_plan_create) */
  int64_t micro_batch;   /* sequences per micro-batch per data-parallel rank */
  int64_t global_batch;  /* sequences per step over all data-parallel ranks (0: one
                            micro-batch per data-parallel rank, set by mp_plan_create) */
  mp_dtype master_dtype; /* fp32 master weights and optimizer state */
  mp_mem_model mem_model; /* whose memory layout the schedule describes (default TORCHTITAN) */
  int f8_codes;           /* MESHPLAN_CPU: the runtime runs float8 Linears on codes
                             (mp_runtime_options.f8_codes); MESHPLAN_CUDA always does */
} mp_plan_options;

/* Pass bits, in the canonical order. */
enum {
  MP_PASS_TP = 1 << 0,
  MP_PASS_EP = 1 << 1,
  MP_PASS_FLOAT8 = 1 << 2,
  MP_PASS_AC = 1 << 3,
  MP_PASS_FSDP = 1 << 4,
  MP_PASS_DDP = 1 << 5, /* the fifth pass instead of FSDP (opts.dp) */
};

typedef struct mp_plan {
  mp_arena *arena;
  mp_model model;
  mp_mesh mesh;
  mp_plan_options opts;
  mp_param *params;
  int n_params;
  mp_fsdp_unit *units;
  int n_units;
  unsigned applied;      /* MP_PASS_* bits */
  int pass_order[5];     /* bits in the order applied */
  int n_passes;
  const char *notes[16]; /* what the passes said (vocab padded, layers skipped, ...);
                            each starts with its pass's mp_pass_name and ": " */
  int n_notes;
  int64_t vocab_padded;  /* vocab after padding for tp (== model.vocab when none) */
  mp_ac_mode ac;
  int layers_per_stage;  /* the most layers a stage holds (its chunks together) */
  int layers_per_chunk;  /* the most layers a model chunk holds: ceil(n_layers / (pp x
                            pp_virtual)); model chunk k = c x pp + s is stage s's virtual chunk c
                            (Megatron's interleaved layout); mp_plan_chunk_layers gives the
                            split, even where pp x pp_virtual divides n_layers */
  /* For the planner's speed (mp_build_plan_from): */
  const struct mp_plan_template *tmpl; /* the template it was built from, or NULL; when set,
                                          params[i].fqn / module_fqn and unit names point
                                          into the template, which must outlive the plan */
  int arena_borrowed;    /* 1: arena belongs to the caller; mp_plan_destroy frees nothing */
} mp_plan;

/* A model's module tree computed once (every FQN formatted once, every global shape):
 * the mesh-independent part of mp_plan_create. Many plans of one model (a search) are
 * then built from it by mp_build_plan_from without formatting a single string. Read-only
 * after creation, so threads may share one; it must outlive every plan built from it (the
 * plans' FQNs and unit names point into it). Fields are for plan.c and the passes. */
typedef struct mp_plan_template {
  mp_arena *arena;
  mp_model model;
  mp_param *params;   /* pp_stage 0, replicated on every axis, as mp_plan_create leaves them */
  int n_params;
  /* FSDP unit names per layer: "layers.N", "layers.N.attention", "layers.N.moe",
   * "layers.N.moe.experts" */
  const char **unit_block, **unit_attn, **unit_moe, **unit_experts;
} mp_plan_template;

void mp_plan_options_init(mp_plan_options *o);
/* Validates model x mesh (MoE with pp > 1 refused; ep divides n_experts) and builds the
 * meta module tree: every parameter with its global shape, replicated everywhere. */
mp_status mp_plan_create(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                         const mp_plan_options *opts, mp_plan **out);
void mp_plan_destroy(mp_plan *p);

mp_status mp_apply_tensor_parallel(mp_ctx *ctx, mp_plan *p, const mp_tp_options *o);
mp_status mp_apply_expert_parallel(mp_ctx *ctx, mp_plan *p);
mp_status mp_apply_float8(mp_ctx *ctx, mp_plan *p, const mp_float8_options *o);
mp_status mp_apply_ac(mp_ctx *ctx, mp_plan *p, mp_ac_mode mode);
mp_status mp_apply_fsdp(mp_ctx *ctx, mp_plan *p, const mp_fsdp_options *o);
/* The data-parallel passes' last step: each unit's list of parameter indices (units[u].params,
 * in the plan's order), from every parameter's fsdp_unit and each unit's n_params count. */
mp_status mp_plan_list_unit_params(mp_ctx *ctx, mp_plan *p);
/* DDP (exec/pass_ddp.c): parameters replicated over the data-parallel group, one gradient
 * bucket per block and one for the root's parameters (the units, group mp_plan_ddp_group,
 * nothing sharded); refused after FSDP or twice, before TP or EP, with dp_shard > 1. */
mp_status mp_apply_ddp(mp_ctx *ctx, mp_plan *p, const mp_ddp_options *o);
/* mp_plan_create then the five passes in order (TP only when tp > 1, EP only when
 * ep > 1, float8 only when opts->fp8). */
mp_status mp_build_plan(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                        const mp_plan_options *opts, mp_plan **out);

/* Validates the model and lays out its module tree once (see mp_plan_template). */
mp_status mp_plan_template_create(mp_ctx *ctx, const mp_model *m, mp_plan_template **out);
void mp_plan_template_destroy(mp_plan_template *t); /* NULL is a no-op */
/* Same plan as mp_build_plan(ctx, &t->model, mesh, opts) (same checks, passes, notes,
 * parameters and units), built from the template: FQNs and unit names are the template's
 * strings. arena: NULL gives the plan its own arena (mp_plan_destroy frees it); otherwise
 * the plan lives in the caller's arena (arena_borrowed), mp_plan_destroy frees nothing
 * and the plan is valid until the caller resets or destroys that arena. */
mp_status mp_build_plan_from(mp_ctx *ctx, const mp_plan_template *t, const mp_mesh *mesh,
                             const mp_plan_options *opts, mp_arena *arena, mp_plan **out);

/* For the planner's speed: the plan mp_build_plan_from / mp_build_plan would give for
 * base's model and mesh and `opts`, where opts differs from base->opts at most in
 * micro_batch, ac and fsdp.reshard_after_forward, without running the passes again: none
 * of the three changes a parameter or a unit, so the new plan's header (options, AC
 * fields, notes) is written into `arena` and its params and units are base's, shared
 * read-only (base must outlive it; mp_plan_destroy on it frees nothing). Any other
 * difference, or a base without FSDP applied, is MP_ERR_INVALID. */
mp_status mp_plan_derive(mp_ctx *ctx, const mp_plan *base, const mp_plan_options *opts,
                         mp_arena *arena, mp_plan **out);

/* The block of the global tensor that `rank` stores at rest (after FSDP, or after TP/EP
 * when FSDP is not applied): per dim, offset and length in global indices. Returns 0
 * when the rank stores nothing of it (FSDP tail or another pipeline stage). */
int mp_param_tile(const mp_plan *p, const mp_param *prm, int rank, int64_t off[MP_MAX_NDIM],
                  int64_t len[MP_MAX_NDIM]);
/* The rank's tp-local block (after TP/EP, before FSDP): what an FSDP all-gather yields. */
void mp_param_tp_tile(const mp_plan *p, const mp_param *prm, int rank, int64_t off[MP_MAX_NDIM],
                      int64_t len[MP_MAX_NDIM]);
int64_t mp_param_numel(const mp_param *prm);    /* global */
int64_t mp_param_tp_numel(const mp_param *prm); /* tp-local */
/* FSDP2's sharding of dim 0 (torch.chunk): a group of gsize ranks splits the tp-local
 * tensor's rows into chunks of ceil(rows / gsize), group index i holding rows
 * [i chunk, min(rows, (i + 1) chunk)), so the last ranks' chunks may be short or empty. */
int64_t mp_fsdp_chunk_rows(int64_t rows, int gsize);
/* A parameter's padded FSDP shard over a group of gsize ranks: chunk rows x the tp-local
 * row length, what every rank of the group stores and contributes to the all-gather
 * (FSDP2 pads each rank's shard to the chunk). gsize 1: the whole tp-local tensor. */
int64_t mp_param_padded_shard_numel(const mp_param *prm, int gsize);
/* Elements stored at rest on rank (0 when another stage or an FSDP tail). */
int64_t mp_param_local_numel(const mp_plan *p, const mp_param *prm, int rank);
/* Looks a parameter up by FQN; -1 when absent. */
int mp_plan_find_param(const mp_plan *p, const char *fqn);

/* How many Linear layers run float8 under `recipe` on a rank of a tp-way plan of model m:
 * the Float8 pass's filter (torchtitan's names, GEMM dims multiples of the recipe's tile:
 * exec/rules.h) on the TP pass's local shapes, from a plan built for it. A float8 plan differs from bf16 exactly
 * when *n_fp8 > 0. The TP rules must hold (mp_rule_tp_dim). */
/* fp8_act_cache, moment_dtype and fsdp.reduce_dtype against the recipe, the memory model and the dtypes they
 * take (exec/pass_float8.c); loss_chunks against the memory model and the rank's sequence (schedule_head.c):
 * MP_ERR_INVALID naming the rule otherwise. */
mp_status mp_plan_storage_check(mp_ctx *ctx, const mp_plan_options *o);
mp_status mp_plan_loss_check(mp_ctx *ctx, const mp_mesh *mesh, const mp_plan_options *o);
mp_status mp_plan_fp8_linears(mp_ctx *ctx, const mp_model *m, int tp, mp_fp8_recipe recipe, int *n_fp8);
/* The recipe a plan of memory model mm runs: r itself, or for MP_FP8_DEFAULT the model's own,
 * DELAYED under megatron (Megatron-LM's --fp8-recipe default), TENSORWISE otherwise. */
mp_fp8_recipe mp_fp8_recipe_of(mp_fp8_recipe r, mp_mem_model mm);

/* Per-rank totals at rest. */
typedef struct mp_plan_totals {
  int64_t params_numel;      /* elements stored at rest on the rank */
  int64_t param_bytes;       /* in master dtype */
  int64_t grad_bytes;        /* gradients at rest (sharded, master dtype) */
  int64_t optimizer_bytes;   /* AdamW m and v */
  int64_t max_unit_gathered_bytes; /* largest unit all-gathered, in param dtype */
} mp_plan_totals;
void mp_plan_rank_totals(const mp_plan *p, int rank, mp_plan_totals *out);

/* Sequences each data-parallel rank processes per step and the number of micro-batches
 * (global_batch / (dp_replicate * dp_shard) / micro_batch). Refuses batches that do not
 * divide, naming the numbers. */
mp_status mp_plan_batch(mp_ctx *ctx, const mp_plan *p, int64_t *local_batch, int64_t *n_micro);

/* Shared by the pass files (usable by callers too). */
/* "TP", "EP", "Float8", "AC", "FSDP" for an MP_PASS_* bit. */
const char *mp_pass_name(unsigned bit);
/* Generic order check for pass `bit`: refuses (MP_ERR_ORDER) a pass applied twice and a
 * pass applied after a later-ordered one. Passes check their specific rules first. */
mp_status mp_plan_check_pass(mp_ctx *ctx, const mp_plan *p, unsigned bit);
/* Records that pass `bit` ran (applied bits and pass_order). */
void mp_plan_mark_applied(mp_plan *p, unsigned bit);
/* Appends a note (copied into the arena); notes beyond the 16th are dropped, the last
 * slot then saying so. */
void mp_plan_note(mp_plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The notes mp_apply_ac, mp_apply_fsdp and mp_apply_ddp record (mp_plan_derive writes
 * them too). */
void mp_plan_note_ac(mp_plan *p, const mp_plan_options *o);
void mp_plan_note_fsdp(mp_plan *p, const mp_fsdp_options *o);
void mp_plan_note_ddp(mp_plan *p, const mp_ddp_options *o);
/* FSDP under a pipeline as torchtitan runs it (the TORCHTITAN memory model with pp > 1):
 * a stage's parameters stay gathered from their first use to the end of the step
 * (parallelize_llama's reshard_after_forward = not pp_enabled) and its gradients
 * accumulate unsharded until the stage's last backward (torch.distributed.pipelining
 * turns FSDP's gradient sync off until then). */
int mp_plan_pp_fsdp(const mp_plan *p);
/* The group DDP reduces replicated gradients over (and its optimizer shards over):
 * dp_replicate, or with context parallelism dp_replicate x cp (Megatron-Core's data-parallel
 * group with context parallelism: a cp rank holds every parameter and computes its gradient
 * from its part of the sequence); with the mesh's dopt > 1 one instance's ranks
 * (MP_GROUP_DOPT), the reduce-scattered shard then all-reduced over MP_GROUP_DOPT_INTER. */
mp_group mp_plan_ddp_group(const mp_plan *p);
/* The data-parallel state a rank keeps at rest per parameter it holds, split into what is
 * replicated and what is cut over `ways` ranks, at the plan options' dtypes:
 *   FSDP  nothing replicated; the fp32 master and AdamW's m and v cut with the parameter
 *         (12 bytes at the defaults; the gradient shard is left out: a lower bound), and
 *         under the megatron memory model (Megatron FSDP) the model-dtype weights' shard too
 *         (14);
 *   DDP   the model-dtype parameter and the reduce-dtype main gradient replicated (2 + 4),
 *         the fp32 master and m, v (12) replicated too or, with shard_optimizer, cut over
 *         the DDP group: 18, or 6 + 12/d bytes a parameter (Megatron-LM's docs, distributed
 *         optimizer, "bf16 param, fp32 grads").
 * bytes[0] the replicated bytes, bytes[1] the bytes cut over *ways ranks (the DDP group with
 * shard_optimizer; 1 otherwise: FSDP's cut is the caller's sharding). o->dp must be resolved
 * (not MP_DP_AUTO). */
void mp_plan_dp_state_bytes(const mp_mesh *mesh, const mp_plan_options *o, double bytes[2], int64_t *ways);
/* Whether options o on mesh run Megatron FSDP: the megatron memory model over dp_shard > 1
 * (Megatron-Core's --use-megatron-fsdp; its DDP and distributed optimizer run on
 * dp_replicate), before a plan is built; mp_plan_is_megatron_fsdp answers it of a plan. */
int mp_plan_megatron_fsdp(const mp_plan_options *o, const mp_mesh *mesh);
/* AdamW's exp_avg and exp_avg_sq for n parameters, in bytes: two tensors at the moments'
 * dtype (o->moment_dtype: fp32 by default, bf16 where DeepSeek-V3's sec. 3.3.3 stores them
 * so). Every count of the optimizer's state goes through it. */
int64_t mp_plan_adamw_moment_bytes(const mp_plan_options *o, int64_t n);
/* DDP's resident state for a rank holding n parameters, in bytes (mp_plan_dp_state_bytes
 * per tensor): the model-dtype parameters beside the fp32 masters, the main gradients,
 * Adam's m and v; with shard_optimizer the masters and Adam state on the rank's
 * ceil(n / d) (the buffers' padding to a multiple of d left out). *shard: the parameters
 * the optimizer steps (n without sharding). */
void mp_plan_ddp_state(const mp_plan *p, int64_t n, int64_t *param_bytes, int64_t *grad_bytes,
                       int64_t *optimizer_bytes, int64_t *shard);
/* Whether DDP reduces the routed experts' gradients over their own expert-DP group (MP_GROUP_EDP)
 * apart from the dense weights': EP applied on the expert grid (exec/mesh.h), as Megatron-Core's
 * DDP buckets expert parameters over expert_data_parallel_group (distributed_data_parallel.py,
 * core_r0.12). Their group (mp_plan_ddp_expert_group): expert-DP, or with dopt > 1 the instance's
 * slice of it (MP_GROUP_EDOPT, intra_expt_dp_group at core_v0.14.0), over which
 * mp_plan_ddp_expert_state (mp_plan_ddp_state's) cuts their optimizer with shard_optimizer. */
int mp_plan_ddp_experts_apart(const mp_plan *p);
mp_group mp_plan_ddp_expert_group(const mp_plan *p);
void mp_plan_ddp_expert_state(const mp_plan *p, int64_t n, int64_t *param_bytes, int64_t *grad_bytes,
                              int64_t *optimizer_bytes, int64_t *shard);
/* Pipeline stage of a rank (its pp coordinate). */
int mp_plan_rank_stage(const mp_plan *p, int rank);
/* Model chunks a pipeline stage holds: pp_virtual under the interleaved schedules with
 * pp > 1, 2 under ZBV, else 1. */
int mp_plan_virtual_stages(const mp_plan *p);
/* The stage holding block `layer`. */
int mp_plan_layer_stage(const mp_plan *p, int64_t layer);
/* The model chunk (virtual stage) stage's chunk c holds: c x pp + stage, or under ZBV's V
 * (torchtitan's pipeline_parallel.py, style "v"; PyTorch's generate_stage_to_rank_mapping)
 * stage for c 0 and 2 pp - 1 - stage for c 1. */
int64_t mp_plan_chunk_index(const mp_plan *p, int stage, int chunk);
/* The stage holding the last model chunk (the head and the loss): pp - 1, 0 under ZBV. */
int mp_plan_last_stage(const mp_plan *p);
/* Layers [*l0, *l1) of stage's virtual chunk: n_layers / (pp x pp_virtual) each, the
 * remainder one each to the chunks after the first (torchtitan's split; exec/plan.c). */
void mp_plan_chunk_layers(const mp_plan *p, int stage, int chunk, int64_t *l0, int64_t *l1);
/* The parameter whose name and values parameter i stores: a tied model's head copy under
 * a pipeline (the last stage's output.weight) stores the embedding weight it copies
 * (checkpoints and Hugging Face files hold that tensor once, and the copy loads from it);
 * any other stores its own. */
const mp_param *mp_plan_param_source(const mp_plan *p, int i);

/* "none", "selective", "selective-op", "selective-core", "full" ("?" out of range). Inline,
 * so that libraries which link no plan code (the planner's search) name policies alike. */
static inline const char *mp_ac_mode_name(mp_ac_mode m) {
  /* in mp_ac_mode's order (C++ includes this header: no designated initializers) */
  static const char *const names[MP_AC_COUNT] = {"none", "selective", "selective-op",
                                                 "selective-core", "full"};
  return (unsigned)m < MP_AC_COUNT ? names[m] : "?";
}
/* A pipeline layout in Megatron-LM's --pipeline-model-parallel-layout notation
 * ("E|(t|)*126L": virtual stages split by '|', E the embedding, t a layer, m an MTP layer
 * after the last stage's layers, L the loss; the m's into o->pp_mtp)
 * into o->pp_layers / n_pp_layers, one count per virtual stage in model order; MP_ERR_USAGE
 * naming what is wrong (exec/plan_layout.c). The plan checks the counts against the mesh. */
mp_status mp_pp_layout_parse(mp_ctx *ctx, const char *s, mp_plan_options *o);
/* o's stated layout in that notation into buf; its length, -1 when it does not fit. */
int mp_pp_layout_format(const mp_plan_options *o, char *buf, size_t cap);
/* Megatron-LM's --account-for-embedding-in-pipeline-split and
 * --account-for-loss-in-pipeline-split: the embedding and the loss count as a layer each and
 * the n_layers + 2 split evenly over the pp x v model chunks (Megatron requires that they
 * divide): the first chunk holds one layer fewer, the last one fewer too (Llama 3 405B on pp
 * 16 x 8: E|(t|)*126L). Writes that layout into o and returns 1; 0 (o untouched) where pp < 2,
 * the chunks do not divide n_layers + 2 or exceed MP_PP_MAX_LAYOUT. */
int mp_pp_layout_embedding_loss(int64_t n_layers, int pp, int v, mp_plan_options *o);
/* "default", "tensorwise", "delayed", "rowwise", "mxfp8", "blockwise" ("?" out of range). */
const char *mp_fp8_recipe_name(mp_fp8_recipe r);
/* The recipe named s into *out: 1, or 0 for any other string (*out untouched); "current"
 * (Transformer Engine's name of per-tensor current scaling) and "fp8_cs" are TENSORWISE,
 * "fp8_mx" MXFP8, "fp8_sc" and "subchannel" BLOCKWISE (Megatron-Bridge's names). */
int mp_fp8_recipe_parse(const char *s, mp_fp8_recipe *out);
/* The recipe in words for notes: "tensorwise scales, each from its tensor's own amax". */
const char *mp_fp8_recipe_words(mp_fp8_recipe r);
/* "allgather", "alltoall" ("?" out of range): torchtitan's names of the rotate methods. */
static inline const char *mp_cp_rotate_name(mp_cp_rotate r) {
  static const char *const names[] = {"allgather", "alltoall"};
  return (unsigned)r <= MP_CP_ROTATE_ALLTOALL ? names[r] : "?";
}
/* The rotate method named s into *out: 1, or 0 for any other string (*out untouched). */
int mp_cp_rotate_parse(const char *s, mp_cp_rotate *out);
/* The dispatcher named s ("alltoall", "deepep", "hybridep") into *out: 1, or 0 for any other
 * string (*out untouched). */
int mp_moe_dispatcher_parse(const char *s, mp_moe_dispatcher *out);
/* "p2p", "all_gather", "a2a", "a2a+p2p" ("?" out of range): Megatron-Core's --cp-comm-type
 * values as Transformer Engine spells them. */
const char *mp_cp_comm_name(mp_cp_comm c);
/* The comm type named s into *out: 1, or 0 for any other string (*out untouched). */
int mp_cp_comm_parse(const char *s, mp_cp_comm *out);
/* "none", "attn", "layers", "iteration", "attn+moe_router", "attn+moe_router+moe_preprocess"
 * ("?" out of range); _parse: the scope named s into *out, 1, or 0 (*out untouched). */
const char *mp_cuda_graphs_name(mp_cuda_graphs g);
int mp_cuda_graphs_parse(const char *s, mp_cuda_graphs *out);
/* 1 where Megatron-Core's MoE token dispatcher synchronises the host in each MoE layer's
 * forward (exec/schedule_block.c marks the op after it): alltoall copies the routed counts to
 * the host (token_dispatcher.py cuda_sync_point, core_v0.14.0) unless every expert is padded to
 * its capacity ("no_sync"); DeepEP's dispatch waits for the received counts (deep_ep.cpp,
 * Buffer::intranode_dispatch, internode_dispatch: moe_recv_counter). 0 for a dense model. */
int mp_moe_host_sync(const mp_model *m, const mp_plan_options *o);
/* "optim_grads_params", "optim_grads", "optim", "no_shard" ("?" out of range): Megatron-Core's
 * --data-parallel-sharding-strategy values. */
const char *mp_mfsdp_strategy_name(mp_mfsdp_strategy s);
/* The strategy named s into *out: 1, or 0 for any other string (*out untouched). */
int mp_mfsdp_strategy_parse(const char *s, mp_mfsdp_strategy *out);
/* 1 where the plan's data parallelism is Megatron FSDP: the megatron memory model sharding
 * over dp_shard (mp_apply_fsdp under it). */
int mp_plan_is_megatron_fsdp(const mp_plan *p);
/* The policy with its block frequency: "full:4" for FULL every 4th block, else the mode's
 * name. */
void mp_ac_format(mp_ac_mode m, int every, char *buf, size_t cap);
/* Parses a policy name, or "full:N" (N >= 1; full:1 is full) into *out and *every (1 for
 * every block). MP_ERR_INVALID naming the choices otherwise. */
mp_status mp_ac_parse(mp_ctx *ctx, const char *s, mp_ac_mode *out, int *every);
/* Megatron-Core's --recompute-modules list (names split by commas, spaces or '/') into o:
 * core_attn sets o->ac to selective-core, layernorm, mla_up_proj, moe_act, mlp, moe and
 * shared_experts set o->recompute_modules; anything else is refused as unknown
 * (MP_ERR_INVALID). */
mp_status mp_recompute_modules_parse(mp_ctx *ctx, const char *list, mp_plan_options *o);
/* mp_ac_parse without the block frequency: "full:N" with N > 1 is refused. */
mp_status mp_ac_mode_parse(mp_ctx *ctx, const char *s, mp_ac_mode *out);
/* The policy block `layer` runs: FULL with ac_every N > 1 on blocks l with (l + 1) % N == 0
 * (torchtitan counts from 1), under the block method on each model chunk's first
 * recompute_num_layers blocks (an MTP module: the plan's), the others NONE. */
mp_ac_mode mp_plan_layer_ac(const mp_plan *p, int64_t layer);
/* Under the uniform method, the group holding `layer` (its first layer, its size): 1; else 0. */
int mp_plan_layer_rc_group(const mp_plan *p, int64_t layer, int64_t *first, int64_t *n);
/* "torchtitan", "meshplan-cpu", "meshplan-cuda", "megatron". */
const char *mp_mem_model_name(mp_mem_model m);
const char *mp_tp_style_name(mp_tp_style s);
const char *mp_module_name(mp_module m); /* "attention.q_proj" */
/* The block activation a dense block's Linear reads, as the float8 runtimes share and keep
 * its operand: 0 xn1 (q, k, v), 1 the attention output (o), 2 xn2 (gate, up), 3 the SwiGLU
 * output (down); -1 for every other module. */
int mp_module_f8_source(mp_module m);

#ifdef __cplusplus
}
#endif
#endif
