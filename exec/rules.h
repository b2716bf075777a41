/* The plan's rules: what a model, a mesh and the plan options must satisfy, each written once
 * here and asked by everyone who needs it. The plan builder and its passes refuse with the
 * rule's message (MP_ERR_INVALID); the planner's search prunes candidates with the same
 * predicate and its own reject code (planner/search.h); `validate` goes through the plan
 * builder; the runtime's check (exec/runtime/check.c) asks the rules it adds on top. A
 * predicate reads plain values (a model, a mesh, sizes), never a plan, so the search can
 * ask it before any plan exists.
 *
 * Invariants: every predicate is pure (no state, no allocation) and cheap enough for the
 * search to call on every candidate; a *_check function returns MP_OK exactly when its
 * predicate holds. */
#ifndef MP_EXEC_RULES_H
#define MP_EXEC_RULES_H

#include <stdint.h>

#include "common/status.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tensor parallelism ------------------------------------------------------------------ */

/* The model sizes tp must divide (pass_tp.c shards them), in the order they are checked. */
typedef enum mp_tp_dim {
  MP_TP_DIM_NONE = 0,
  MP_TP_DIM_HEADS,     /* n_heads: q's heads (under MLA the heads kv_b_proj decompresses) */
  MP_TP_DIM_KV_HEADS,  /* n_kv_heads */
  MP_TP_DIM_D_FF,      /* d_ff, when a dense MLP exists */
  MP_TP_DIM_D_MODEL,   /* d_model */
  MP_TP_DIM_D_FF_SHARED, /* d_ff_shared, when shared experts exist */
  MP_TP_DIM_VOCAB,     /* vocab, unless the plan pads it */
  MP_TP_DIM_MAMBA_HEADS,  /* mamba_num_heads, in a hybrid model with Mamba layers */
  MP_TP_DIM_MAMBA_GROUPS, /* n_groups (MambaMixer asserts both, mamba_mixer.py at core_v0.14.0) */
} mp_tp_dim;

/* The first model size tp does not divide, MP_TP_DIM_NONE when it divides them all. */
mp_tp_dim mp_rule_tp_dim(const mp_model *m, int tp, int pad_vocab);
/* MP_ERR_INVALID naming the size and the tp that would divide every one, e.g. "tp=3 does
 * not divide n_kv_heads=8; choose tp in {1,2,4,8}". */
mp_status mp_rule_tp_check(mp_ctx *ctx, const mp_model *m, int tp, int pad_vocab);

/* ---- expert parallelism ------------------------------------------------------------------ */

/* ep divides the routed experts (a dense model: ep 1 only matters to the mesh). */
int mp_rule_ep_ok(const mp_model *m, int ep);
/* The largest imbalance (the busiest EP rank's routed tokens over the mean, exec/plan.h's
 * mp_moe_routing) ep ranks can have: a token picks top_k distinct experts, at most
 * min(top_k, n_experts / ep) of them on one rank, so that rank gets at most ep x that /
 * top_k times the mean. 1 for a dense model or ep <= 1. */
double mp_rule_moe_imbalance_max(const mp_model *m, int ep);
/* The experts' load (mp_moe_routing): an imbalance of at least 1 and at most what ep ranks
 * can hold (it is moot at ep = 1, where one rank holds every expert), a positive capacity
 * factor, padding only with one, a MoE model, and not under the meshplan runtimes, whose
 * schedule routes the real tokens. */
mp_status mp_rule_moe_routing_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                                    const mp_plan_options *o);
/* The expert grid (etp=1) under FSDP: torchtitan borrows EP from dp_shard x cp x tp
 * (torchtitan/distributed/parallel_dims.py), so ep divides their product and never reaches
 * into dp_replicate. True for a mesh off the grid or without EP. */
int mp_rule_ep_grid_fsdp_ok(const mp_mesh *m);
/* Megatron FSDP's hybrid sharding (dp_replicate x dp_shard, its outer group replicating)
 * with routed experts (ep > 1): their inter-instance expert-data-parallel groups are not
 * modelled. True for a mesh with dp_replicate 1 or ep 1; exec/plan.c refuses the rest by
 * name and the search prunes them (MP_REJECT_MFSDP_EXPERTS). */
int mp_rule_mfsdp_experts_ok(const mp_mesh *m);
/* torchtitan's own EP mesh (ParallelDims._validate, torchtitan/distributed/parallel_dims.py,
 * v0.2.0): with expert_tensor_parallel_degree 1 "EP would borrow all cp and tp and some
 * dp_shard degree": ep a multiple of tp x cp dividing dp_shard x cp x tp; with etp = tp "EP
 * would borrow all cp and some dp_shard degree": ep a multiple of cp dividing dp_shard x cp.
 * True without EP. */
int mp_rule_ep_grid_torchtitan_ok(const mp_mesh *m);
/* Expert tensor parallelism (etp > 1) as meshplan models it: with EP (ep > 1) or etp = tp; under the
 * all-to-all dispatcher (Megatron-Core's flex/DeepEP dispatcher, which sends each token to
 * every expert-TP rank, is not modelled); under the torchtitan model etp = tp with
 * torchtitan's EP rule (mp_rule_ep_grid_torchtitan_ok). Each refused by name. */
mp_status mp_rule_etp_check(mp_ctx *ctx, const mp_mesh *mesh, const mp_plan_options *o);
/* The model x mesh rules of experts: ep dividing the experts. */
mp_status mp_rule_experts_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh);

/* ---- pipeline parallelism ---------------------------------------------------------------- */

/* pp x v model chunks of the model's layers, split as the plan splits them (exec/plan.c,
 * torchtitan's generate_split_points: L / K a chunk, the remainder one each to the chunks
 * after the first), leave none empty: K <= L. */
int mp_rule_pp_chunks_ok(int64_t n_layers, int pp, int v);
/* The embedding and the loss counted as a layer each (Megatron-LM's
 * --account-for-embedding/loss-in-pipeline-split): the n_layers + 2 split evenly over pp x v
 * chunks, at most MP_PP_MAX_LAYOUT of them, with pp > 1 (mp_pp_layout_embedding_loss). */
int mp_rule_pp_split_ok(int64_t n_layers, int pp, int v);
/* Whole groups of pp micro-batches under the interleaved schedule: what
 * torch.distributed.pipelining needs; Megatron-LM also runs a short last group
 * (exec/schedule_pp.c), which the search leaves to simulate. */
int mp_rule_pp_micro_ok(int64_t n_micro, int pp, int v);

/* ---- CUDA graphs ---------------------------------------------------------------------------- */

/* Megatron-Core's CUDA graphs (o->cuda_graphs, exec/plan.h) as its config and arguments
 * allow them (core_v0.14.0): the megatron memory model only; no activation recomputation
 * (transformer_config.py refuses recompute_granularity with --enable-cuda-graph;
 * arguments.py full recompute with --external-cuda-graph, which attn uses) but the selective
 * recompute modules the full-iteration graph takes (core_v0.16.0 on); the full-layer
 * and full-iteration scopes not over a MoE layer whose dispatcher synchronises the host
 * (mp_moe_host_sync: a graph cannot wait for the host), where attn captures only the
 * attention and the moe_router scopes stop before the dispatch (those on a MoE model only,
 * moe_preprocess not where alltoall drops without padding: core_v0.16.0); iteration with the
 * DDP's gradient check off (arguments.py asserts --no-check-for-nan-in-loss-and-grad). Each
 * refused by name. */
mp_status mp_rule_cuda_graphs_check(mp_ctx *ctx, const mp_model *m, const mp_plan_options *o);
/* Whether g is one of Transformer Engine's per-layer partial scopes (make_graphed_callables over
 * part of each layer: attn, attn+moe_router, attn+moe_router+moe_preprocess). */
int mp_cuda_graphs_partial(mp_cuda_graphs g);

/* Megatron-Core's CPU offloading of activations (o->cpu_offload_layers) as its config allows
 * it (transformer_config.py __post_init__, core_v0.14.0 to core_v0.19.0): fewer offloaded
 * layers than the model has, no pipeline parallelism, no activation recomputation, no
 * --enable-cuda-graph (layers, iteration); the megatron memory model. Refused here as not
 * modelled: MoE, hybrid and MTP layers (which of their saved tensors Transformer Engine marks
 * is not counted), context parallelism, materialized attention (not Transformer Engine's
 * fused core) and Transformer Engine's external graphs (the GPU's host link is the
 * simulator's, sim/sim.c). */
mp_status mp_rule_cpu_offload_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                                    const mp_plan_options *o);

/* ---- context and sequence parallelism ---------------------------------------------------- */

/* Ring attention's causal load balancing cuts a sequence into 2 cp chunks (torch's
 * context_parallel, Transformer Engine's p2p ring): 2 cp divides seq. */
int mp_rule_cp_ring_ok(int64_t seq, int cp);
/* Megatron-Core's --cp-comm-type (o->cp_comm) with the mesh and model: a type other than
 * p2p under a memory model other than megatron, a2a+p2p (hierarchical, a second cp level
 * the mesh lacks), and a2a where cp does not divide the rank's query or key heads
 * (Transformer Engine's AttnFuncWithCPAndQKVOA2A asserts it) are refused, each by name. */
mp_status mp_rule_cp_comm_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                                const mp_plan_options *o);
/* Sequence parallelism shards the residual stream's seq / cp tokens over tp. */
int mp_rule_sp_ok(int64_t seq, int cp, int tp);

/* ---- float8 ------------------------------------------------------------------------------- */

/* A Linear's GEMM runs in float8 under recipe r when both dims of its rank's weight are
 * multiples of mp_rule_fp8_multiple(r): 16 for the per-tensor and rowwise recipes
 * (torch._scaled_mm's and cuBLASLt's float8 layouts; torchao's filter skips the others) and
 * NVFP4 (its 1x16 blocks and the weights' 16x16 ones), 32
 * for MXFP8 (a scale per 32 elements along either dim, as the forward and the weight
 * gradient reduce over different dims), 128 for blockwise (its 128 x 128 weight tiles). */
int mp_rule_fp8_multiple(mp_fp8_recipe r);
int mp_rule_fp8_linear_ok(int64_t rows, int64_t cols, mp_fp8_recipe r);
/* Whether the runtime runs the MoE experts' GEMMs (routed and shared) in float8:
 * Megatron-Core's, whose TEGroupedMLP and SharedExpertMLP are Transformer Engine modules
 * under fp8_autocast (megatron/core/transformer/moe/experts.py); torchtitan's filter
 * excludes them (its float8 converter skips "experts" and "shared_expert"), and meshplan's
 * runtimes run their experts in bf16. */
int mp_rule_fp8_experts(mp_mem_model mm);
/* The recipes each runtime implements: torchtitan's float8 is torchao's (tensorwise,
 * rowwise, and MXFP8 through torchao's MX formats), Megatron-LM's is Transformer Engine's
 * (--fp8-recipe delayed, tensorwise (current scaling), mxfp8, blockwise, and --fp4-recipe
 * nvfp4), meshplan's runtimes
 * quantize tensorwise (kernels/cpu/fp8.c). Float8 all-gather (FSDP gathering float8
 * weights) is torchao's, tensorwise only. DEFAULT is resolved before this is asked. */
int mp_rule_fp8_recipe_ok(mp_mem_model mm, mp_fp8_recipe r);
/* MP_ERR_INVALID naming the recipe, the runtime and the recipes it runs. */
mp_status mp_rule_fp8_recipe_check(mp_ctx *ctx, mp_mem_model mm, mp_fp8_recipe r, int all_gather);

#ifdef __cplusplus
}
#endif
#endif
