/* The plan's rules (rules.h): each predicate and, where the plan builder refuses with it,
 * the one message it refuses with. */
#include "exec/rules.h"

#include <stdio.h>
#include <string.h>

#include "common/intmath.h"
#include "common/limits.h"

/* ---- tensor parallelism ------------------------------------------------------------------ */

typedef struct tp_size {
  const char *name;
  int64_t v;
  int used;
} tp_size;

/* The sizes tp must divide, in the order mp_rule_tp_dim reports them. */
static int tp_sizes(const mp_model *m, int pad_vocab, tp_size out[8]) {
  const int mamba = mp_model_n_layers_of(m, MP_LAYER_MAMBA) > 0;
  const tp_size c[8] = {
      {"n_heads", m->n_heads, 1},
      {"n_kv_heads", m->n_kv_heads, 1},
      {"d_ff", m->d_ff, mp_model_n_moe_layers(m) < m->n_layers},
      {"d_model", m->d_model, 1},
      {"d_ff_shared", m->d_ff_shared, mp_model_is_moe(m) && m->n_shared_experts > 0},
      {"vocab", m->vocab, !pad_vocab},
      {"mamba_num_heads", m->mamba_num_heads, mamba},
      {"n_groups", m->n_groups, mamba},
  };
  memcpy(out, c, sizeof c);
  return 8;
}

mp_tp_dim mp_rule_tp_dim(const mp_model *m, int tp, int pad_vocab) {
  tp_size c[8];
  const int n = tp_sizes(m, pad_vocab, c);
  for (int i = 0; i < n; i++)
    if (c[i].used && c[i].v % tp != 0) return (mp_tp_dim)(MP_TP_DIM_HEADS + i);
  return MP_TP_DIM_NONE;
}

/* "{1,2,4,8}": the tp sizes that satisfy every constraint (divisors of their gcd). */
static void valid_choices(int64_t g, char *buf, size_t cap) {
  size_t used = (size_t)snprintf(buf, cap, "{");
  int n = 0;
  for (int64_t d = 1; d <= g && used < cap; d++) {
    if (g % d != 0) continue;
    if (n == 16) {
      used += (size_t)snprintf(buf + used, cap - used, ",...");
      break;
    }
    used += (size_t)snprintf(buf + used, cap - used, "%s%lld", n ? "," : "", (long long)d);
    n++;
  }
  if (used < cap) snprintf(buf + used, cap - used, "}");
}

mp_status mp_rule_tp_check(mp_ctx *ctx, const mp_model *m, int tp, int pad_vocab) {
  const mp_tp_dim bad = mp_rule_tp_dim(m, tp, pad_vocab);
  if (bad == MP_TP_DIM_NONE) return MP_OK;
  tp_size c[8];
  const int n = tp_sizes(m, pad_vocab, c);
  int64_t g = 0;
  for (int i = 0; i < n; i++)
    if (c[i].used) g = mp_gcd64(g, c[i].v);
  const tp_size *s = &c[bad - MP_TP_DIM_HEADS];
  char choices[160];
  valid_choices(g, choices, sizeof choices);
  return mp_error(ctx, MP_ERR_INVALID, "tp=%d does not divide %s=%lld; choose tp in %s%s", tp, s->name,
                  (long long)s->v, choices,
                  bad == MP_TP_DIM_VOCAB ? " or pad the vocabulary (pad_vocab, meshplan --pad-vocab)" : "");
}

/* ---- expert parallelism ------------------------------------------------------------------ */

int mp_rule_ep_ok(const mp_model *m, int ep) { return !mp_model_is_moe(m) || m->n_experts % ep == 0; }

double mp_rule_moe_imbalance_max(const mp_model *m, int ep) {
  if (!mp_model_is_moe(m) || ep <= 1 || m->top_k < 1) return 1.0;
  const double local = (double)(m->n_experts / ep), k = (double)m->top_k;
  return (double)ep * (local < k ? local : k) / k;
}

int mp_rule_ep_grid_fsdp_ok(const mp_mesh *m) {
  const int etp = m->etp > 1 ? m->etp : 1;
  return !mp_mesh_expert_grid(m) || m->ep <= 1 ||
         (m->size[MP_DIM_DP_SHARD] * m->size[MP_DIM_CP] * m->size[MP_DIM_TP]) % (m->ep * etp) == 0;
}

int mp_rule_mfsdp_experts_ok(const mp_mesh *m) { return m->size[MP_DIM_DP_REPLICATE] <= 1 || m->ep <= 1; }

int mp_rule_ep_grid_torchtitan_ok(const mp_mesh *m) {
  const int tp = m->size[MP_DIM_TP], cp = m->size[MP_DIM_CP], dps = m->size[MP_DIM_DP_SHARD];
  if (m->ep <= 1) return 1;
  if (m->etp > 1) /* etp = tp: EP borrows all of cp and some dp_shard */
    return m->etp == tp && m->ep % cp == 0 && (dps * cp) % m->ep == 0;
  return m->ep % (tp * cp) == 0 && (dps * tp * cp) % m->ep == 0;
}

mp_status mp_rule_etp_check(mp_ctx *ctx, const mp_mesh *mesh, const mp_plan_options *o) {
  const int etp = mesh->etp, tp = mesh->size[MP_DIM_TP];
  if (etp <= 1) return MP_OK;
  /* without EP the experts' gradients reduce with the dense ones over the data-parallel
   * ranks, which are the expert-DP group only where the expert-TP group is the TP group */
  if (mesh->ep <= 1 && etp != tp)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "etp=%d without EP (ep=1) is modelled with etp = tp = %d only; "
                    "set etp=%d, ep > 1 or etp=1", etp, tp, tp);
  /* the flex dispatcher (DeepEP, HybridEP) takes any etp: MoEFlexTokenDispatcher asserts
   * only expert-TP x EP > 1 (token_dispatcher.py, core_v0.14.0 and core_v0.19.0), which
   * ep > 1 (moe_overlap_check) meets; its dispatch sends a token to every expert-TP rank of
   * its expert (mp_sched_flex_etp, exec/schedule_ops.c). HybridEP's rank capacity is refused
   * there: its budget is the rank's own tokens x moe_router_topk x C_r (core_v0.19.0
   * _HybridEPManager.setup_metadata), while each expert-TP rank receives etp x those rows;
   * so is padding to capacity: DeepEP's refuses it (transformer_config.py core_v0.14.0: "Flex
   * token dispatcher does not support moe_pad_expert_input_to_capacity"), HybridEP's
   * drop_and_pad sizes each expert's capacity over its etp x E expanded experts (core_v0.19.0) */
  if (mp_moe_dispatch_by_node(o->moe_dispatcher) && o->moe_routing.pad_to_capacity)
    return mp_error(ctx, MP_ERR_UNSUPPORTED,
                    "etp=%d with the flex dispatcher's input padded to capacity is not modelled (DeepEP refuses "
                    "the padding, core_v0.14.0 transformer_config.py; HybridEP's capacity counts etp x the "
                    "experts, core_v0.19.0 _HybridEPManager); drop the padding or set etp=1", etp);
  if (mp_moe_dispatch_by_node(o->moe_dispatcher) && o->moe_routing.rank_capacity > 0.0)
    return mp_error(ctx, MP_ERR_UNSUPPORTED,
                    "etp=%d with HybridEP's rank capacity %g is not modelled: Megatron-Core budgets a rank's "
                    "rows at its own tokens x top_k x C_r (token_dispatcher.py _HybridEPManager, core_v0.19.0) "
                    "while each expert-TP rank receives etp x those; drop the capacity or set etp=1",
                    etp, o->moe_routing.rank_capacity);
  if (o->mem_model == MP_MEM_MODEL_TORCHTITAN && etp != tp)
    return mp_error(ctx, MP_ERR_INVALID,
                    "etp=%d with tp=%d: torchtitan supports expert_tensor_parallel_degree 1 or tp only "
                    "(torchtitan/distributed/parallel_dims.py, v0.2.0); set etp=1 or etp=%d", etp, tp, tp);
  if (o->mem_model == MP_MEM_MODEL_TORCHTITAN && !mp_rule_ep_grid_torchtitan_ok(mesh))
    return mp_error(ctx, MP_ERR_INVALID,
                    "ep=%d with etp=tp=%d: torchtitan's EP borrows all of cp=%d and part of dp_shard=%d "
                    "(parallel_dims.py, v0.2.0); choose ep a multiple of cp dividing dp_shard x cp = %d",
                    mesh->ep, tp, mesh->size[MP_DIM_CP], mesh->size[MP_DIM_DP_SHARD],
                    mesh->size[MP_DIM_DP_SHARD] * mesh->size[MP_DIM_CP]);
  return MP_OK;
}

mp_status mp_rule_experts_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh) {
  if (mesh->ep > 1 && !mp_rule_ep_ok(m, mesh->ep))
    return mp_error(ctx, MP_ERR_INVALID,
                    "ep=%d does not divide n_experts=%lld of %s; each EP rank must hold the same "
                    "number of experts: choose ep dividing both %lld and dp_shard=%d",
                    mesh->ep, (long long)m->n_experts, m->name, (long long)m->n_experts,
                    mesh->size[MP_DIM_DP_SHARD]);
  return MP_OK;
}

/* ---- pipeline parallelism ---------------------------------------------------------------- */

int mp_rule_pp_chunks_ok(int64_t n_layers, int pp, int v) { return (int64_t)pp * v <= n_layers; }

int mp_rule_pp_split_ok(int64_t n_layers, int pp, int v) {
  const int64_t K = (int64_t)pp * v;
  return pp > 1 && v >= 1 && K <= MP_PP_MAX_LAYOUT && (n_layers + 2) % K == 0;
}

int mp_rule_pp_micro_ok(int64_t n_micro, int pp, int v) { return v <= 1 || n_micro % pp == 0; }

/* ---- context and sequence parallelism ---------------------------------------------------- */

int mp_rule_cp_ring_ok(int64_t seq, int cp) { return cp <= 1 || seq % (2 * (int64_t)cp) == 0; }

mp_status mp_rule_cp_comm_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                                const mp_plan_options *o) {
  const int cp = mesh->size[MP_DIM_CP], tp = mesh->size[MP_DIM_TP];
  if (cp > 1 && mp_model_n_layers_of(m, MP_LAYER_MAMBA) > 0) /* MambaMixer's own cp all-to-alls */
    return mp_error(ctx, MP_ERR_UNSUPPORTED,
                    "cp=%d on model %s: context parallelism of its Mamba-2 layers (Megatron-Core's MambaContextParallel "
                    "all-to-alls over heads) is not modelled; give cp 1", cp, m->name);
  if ((unsigned)o->cp_comm >= MP_CP_COMM_COUNT)
    return mp_error(ctx, MP_ERR_INVALID, "unknown cp comm type %d; choose p2p, all_gather or a2a", (int)o->cp_comm);
  if (o->cp_comm == MP_CP_COMM_P2P) return MP_OK;
  if (o->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID,
                    "cp comm type %s is Megatron-Core's (--cp-comm-type, Transformer Engine's context "
                    "parallelism); the %s memory model runs its own ring: drop it (a torchtitan stack "
                    "chooses PyTorch's ring's rotate method with --cp-rotate)",
                    mp_cp_comm_name(o->cp_comm), mp_mem_model_name(o->mem_model));
  if (o->cp_comm == MP_CP_COMM_A2A_P2P)
    return mp_error(ctx, MP_ERR_INVALID,
                    "cp comm type a2a+p2p is hierarchical: all-to-all within the first level of "
                    "--hierarchical-context-parallel-sizes, the p2p ring across the second; the mesh "
                    "has one cp level: choose p2p, all_gather or a2a");
  /* a2a's all-to-alls trade the sequence for the heads: each rank keeps heads / cp of the
   * rank's query heads and of its key heads (the grouped ones, n_kv_heads / tp, at least one,
   * under MLA the decompressed heads) */
  const int64_t q_heads = m->n_heads / tp;
  const int64_t kv = mp_model_is_mla(m) ? m->n_heads : m->n_kv_heads;
  const int64_t k_heads = kv / tp > 0 ? kv / tp : 1;
  if (o->cp_comm == MP_CP_COMM_A2A && cp > 1 && (q_heads % cp != 0 || k_heads % cp != 0))
    return mp_error(ctx, MP_ERR_INVALID,
                    "cp comm type a2a splits each rank's heads over cp: cp=%d does not divide its %lld "
                    "query heads and %lld key heads (n_heads / tp, n_kv_heads / tp); choose p2p or "
                    "all_gather, or a cp dividing both",
                    cp, (long long)q_heads, (long long)k_heads);
  return MP_OK;
}

int mp_rule_sp_ok(int64_t seq, int cp, int tp) { return (seq / cp) % tp == 0; }

/* ---- float8 ------------------------------------------------------------------------------- */

int mp_rule_fp8_multiple(mp_fp8_recipe r) {
  switch (r) {
    case MP_FP8_MXFP8: return 32;
    case MP_FP8_BLOCKWISE: return 128;
    default: return 16;
  }
}

int mp_rule_fp8_linear_ok(int64_t rows, int64_t cols, mp_fp8_recipe r) {
  const int k = mp_rule_fp8_multiple(r);
  return rows % k == 0 && cols % k == 0;
}

int mp_rule_fp8_experts(mp_mem_model mm) { return mm == MP_MEM_MODEL_MEGATRON; }

/* Bit r set: the runtime runs recipe r. */
static unsigned recipes_of(mp_mem_model mm) {
  const unsigned b = 1u;
  switch (mm) {
    case MP_MEM_MODEL_TORCHTITAN:
      return b << MP_FP8_TENSORWISE | b << MP_FP8_ROWWISE | b << MP_FP8_MXFP8;
    case MP_MEM_MODEL_MEGATRON:
      /* NVFP4: Megatron-Core's --fp4-format e2m1 --fp4-recipe nvfp4 (megatron/training/arguments.py and
       * megatron/core/fp4_utils.py get_fp4_recipe, core_v0.15.0, Transformer Engine's NVFP4BlockScaling) */
      return b << MP_FP8_TENSORWISE | b << MP_FP8_DELAYED | b << MP_FP8_MXFP8 | b << MP_FP8_BLOCKWISE |
             b << MP_FP8_NVFP4;
    default: return b << MP_FP8_TENSORWISE;
  }
}

int mp_rule_fp8_recipe_ok(mp_mem_model mm, mp_fp8_recipe r) {
  return (unsigned)r < MP_FP8_RECIPE_COUNT && (recipes_of(mm) >> r & 1u);
}

mp_status mp_rule_fp8_recipe_check(mp_ctx *ctx, mp_mem_model mm, mp_fp8_recipe r, int all_gather) {
  if (!mp_rule_fp8_recipe_ok(mm, r)) {
    char list[96] = "";
    size_t n = 0;
    for (int k = MP_FP8_TENSORWISE; k < MP_FP8_RECIPE_COUNT; k++)
      if (recipes_of(mm) >> k & 1u)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", mp_fp8_recipe_name((mp_fp8_recipe)k));
    const char *who = mm == MP_MEM_MODEL_TORCHTITAN ? "torchtitan's float8 (torchao)"
                      : mm == MP_MEM_MODEL_MEGATRON ? "Megatron-LM's float8 (Transformer Engine)"
                                                    : "meshplan's runtime";
    return mp_error(ctx, MP_ERR_INVALID,
                    "float8 recipe %s is not one %s runs (it runs %s); choose one of those, or a "
                    "stack that runs %s",
                    mp_fp8_recipe_name(r), who, list, mp_fp8_recipe_name(r));
  }
  if (all_gather && r != MP_FP8_TENSORWISE)
    return mp_error(ctx, MP_ERR_INVALID,
                    "float8 all-gather casts each weight shard with one per-tensor scale before "
                    "FSDP gathers it (torchao); recipe %s scales otherwise: use tensorwise or turn "
                    "float8 all-gather off",
                    mp_fp8_recipe_name(r));
  return MP_OK;
}

/* Megatron-Core's --moe-expert-rank-capacity-factor (transformer_config.py __post_init__,
 * core_v0.18.0): HybridEP's static budget only ("requires moe_flex_dispatcher_backend to be
 * 'hybridep'"), on a model with routed experts, in Megatron's run. */
static mp_status rank_capacity_check(mp_ctx *ctx, const mp_model *m, const mp_plan_options *o) {
  const double c = o->moe_routing.rank_capacity;
  if (!(c > 0.0 && c <= MP_LIM_MOE_LOAD))
    return mp_error(ctx, MP_ERR_INVALID, "MoE rank capacity factor %g: must be in (0, %g] "
                    "(--moe-expert-rank-capacity-factor); leave it unset for HybridEP's dynamic buffers",
                    c, MP_LIM_MOE_LOAD);
  if (!mp_model_is_moe(m) || o->mem_model != MP_MEM_MODEL_MEGATRON || o->moe_dispatcher != MP_MOE_DISPATCH_HYBRIDEP)
    return mp_error(ctx, MP_ERR_INVALID, "--moe-expert-rank-capacity-factor is the budget of Megatron-Core's HybridEP "
                    "dispatcher (core_v0.18.0 transformer_config.py: \"requires moe_flex_dispatcher_backend to be "
                    "'hybridep'\"): choose a MoE model, a megatron stack and the hybridep dispatcher, or drop it");
  return MP_OK;
}

mp_status mp_rule_moe_routing_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                                   const mp_plan_options *o) {
  const mp_moe_routing *r = &o->moe_routing;
  if (r->rank_capacity != 0.0) MP_CHECK(rank_capacity_check(ctx, m, o));
  const int skewed = r->imbalance != 0.0 && r->imbalance != 1.0, capped = r->capacity_factor != 0.0;
  if (!skewed && !capped && !r->pad_to_capacity) return MP_OK;
  if (!(r->imbalance == 0.0 || (r->imbalance >= 1.0 && r->imbalance <= MP_LIM_MOE_LOAD)))
    return mp_error(ctx, MP_ERR_INVALID, "MoE imbalance %g: the busiest EP rank's tokens over the mean "
                    "is at least 1 (1: balanced) and at most %g", r->imbalance, MP_LIM_MOE_LOAD);
  if (capped && !(r->capacity_factor > 0.0 && r->capacity_factor <= MP_LIM_MOE_LOAD))
    return mp_error(ctx, MP_ERR_INVALID, "MoE capacity factor %g: must be in (0, %g] (Megatron-Core's "
                    "--moe-expert-capacity-factor); leave it unset for dropless routing",
                    r->capacity_factor, MP_LIM_MOE_LOAD);
  if (r->pad_to_capacity && !capped)
    return mp_error(ctx, MP_ERR_INVALID, "padding the experts' input to capacity needs a capacity factor "
                    "(Megatron-Core's --moe-pad-expert-input-to-capacity with --moe-expert-capacity-factor)");
  if (!mp_model_is_moe(m))
    return mp_error(ctx, MP_ERR_INVALID, "MoE imbalance or capacity on a dense model: %s has no routed "
                    "experts; drop them", m->name);
  const double f_max = mp_rule_moe_imbalance_max(m, mesh->ep);
  if (skewed && mesh->ep > 1 && r->imbalance > f_max)
    return mp_error(ctx, MP_ERR_INVALID, "MoE imbalance %g exceeds %g, the load of an EP rank that gets every "
                    "token's picks among its %lld experts (ep=%d, top_k=%lld); choose an imbalance in [1, %g]",
                    r->imbalance, f_max, (long long)(m->n_experts / mesh->ep), mesh->ep, (long long)m->top_k, f_max);
  if (mp_mem_model_is_runtime(o->mem_model))
    return mp_error(ctx, MP_ERR_INVALID, "MoE imbalance or capacity under the %s memory model: meshplan's "
                    "runtime routes the real tokens and its schedule sizes the expert buffers by them; "
                    "use a torchtitan or megatron stack", mp_mem_model_name(o->mem_model));
  return MP_OK;
}

/* ---- CUDA graphs ---------------------------------------------------------------------------- */

int mp_moe_host_sync(const mp_model *m, const mp_plan_options *o) {
  if (!mp_model_is_moe(m) || o->mem_model != MP_MEM_MODEL_MEGATRON) return 0;
  /* HybridEP under a rank capacity: setup_metadata fixes num_permuted_tokens from the budget
   * and tokens_per_expert stays on the GPU for Transformer Engine's grouped GEMM
   * (token_dispatcher.py _HybridEPManager, core_v0.18.0; DeepEP's hybrid-ep branch,
   * hybrid_ep_buffer.py: with num_permuted_tokens given "no stream synchronization will be
   * used, the metadata outputs are on the GPU") */
  if (o->moe_dispatcher == MP_MOE_DISPATCH_HYBRIDEP && o->moe_routing.rank_capacity > 0.0) return 0;
  /* drop-and-pad fixes every count from the capacity: preprocess returns before any sync
   * point is chosen (MoEAlltoAllTokenDispatcher.preprocess, core_v0.14.0) */
  return mp_moe_dispatch_by_node(o->moe_dispatcher) || !o->moe_routing.pad_to_capacity;
}

int mp_cuda_graphs_partial(mp_cuda_graphs g) {
  return g == MP_CUDA_GRAPHS_ATTN || g == MP_CUDA_GRAPHS_ROUTER || g == MP_CUDA_GRAPHS_PREPROCESS;
}

/* Transformer Engine's scope lists over a MoE layer (transformer_config.py __post_init__,
 * core_v0.16.0): moe_router only on a model with experts ("moe cuda graph is only supported
 * for MoE"); moe_preprocess not where the alltoall dispatcher drops tokens without padding,
 * whose preprocess copies the output size to the host ("moe_preprocess cuda graph is not
 * supported when there are DtoH copies and synchronizations in the preprocess step"). */
static mp_status router_scope_check(mp_ctx *ctx, const mp_model *m, const mp_plan_options *o, const char *name) {
  if (!mp_model_is_moe(m))
    return mp_error(ctx, MP_ERR_INVALID, "CUDA graphs (%s) on %s, which has no MoE layer: Megatron-Core's "
                    "moe_router scope needs routed experts; choose cuda graphs attn or layers", name, m->name);
  const mp_moe_routing *r = &o->moe_routing;
  if (o->cuda_graphs == MP_CUDA_GRAPHS_PREPROCESS && o->moe_dispatcher == MP_MOE_DISPATCH_ALLTOALL &&
      r->capacity_factor > 0.0 && !r->pad_to_capacity)
    return mp_error(ctx, MP_ERR_INVALID, "CUDA graphs (%s) with a capacity that drops without padding: the "
                    "alltoall dispatcher's preprocess copies the output size to the host, which Megatron-Core "
                    "refuses in the moe_preprocess graph; choose attn+moe_router, or pad to the capacity", name);
  return MP_OK;
}

/* Recomputation under the graphs. core_v0.14.0 transformer_config.py refuses any
 * recompute_granularity with --enable-cuda-graph, arguments.py full recompute with
 * --external-cuda-graph (attn's). The full-iteration graph (cuda_graph_impl full_iteration,
 * core_v0.16.0 to core_v0.18.0 transformer_config.py) takes selective recompute modules; it
 * refuses graphed "mlp" and "moe" recompute where hidden_dropout is not 0, which meshplan's
 * models do not state, so those two stay refused. */
static mp_status graphs_recompute_check(mp_ctx *ctx, const mp_plan_options *o, const char *name) {
  const mp_cuda_graphs g = o->cuda_graphs;
  const uint32_t dropout_bound = (1u << MP_RC_MLP) | (1u << MP_RC_MOE);
  if (g == MP_CUDA_GRAPHS_ITERATION && o->ac == MP_AC_NONE && o->recompute_modules) {
    if (!(o->recompute_modules & dropout_bound)) return MP_OK;
    return mp_error(ctx, MP_ERR_INVALID, "CUDA graphs (iteration) with recompute module mlp or moe: Megatron-Core's "
                    "full-iteration graph refuses graphed MLP/MoE recomputation unless hidden_dropout is 0 "
                    "(transformer_config.py, core_v0.18.0), which meshplan's models do not state; choose "
                    "layernorm, mla_up_proj, moe_act or shared_experts");
  }
  const int recompute = o->ac != MP_AC_NONE || o->recompute_modules != 0, partial = mp_cuda_graphs_partial(g);
  if (recompute && (!partial || o->ac == MP_AC_FULL))
    return mp_error(ctx, MP_ERR_INVALID,
                    "CUDA graphs (%s) with activation recomputation: Megatron-Core refuses %s (transformer_config.py, "
                    "arguments.py); drop the recomputation, or choose cuda graphs attn with a selective one",
                    name, partial ? "full recompute with Transformer Engine's graphs"
                                  : "--recompute-granularity with --enable-cuda-graph");
  return MP_OK;
}

/* A whole-layer capture over a dispatcher that reads the counts on the host: CudaGraphManager
 * records the layer in torch.cuda.graph with no eager fallback while training (cuda_graphs.py,
 * core_v0.12.0 to core_v0.15.0), and the copy of the counts to the host with its stream
 * synchronisation fail inside the capture. Megatron-Core's DeepEP path builds tokens_per_expert
 * from DeepEP's host list num_recv_tokens_per_expert_list and passes no num_worst_tokens
 * (fused_a2a.py, core_v0.18.0 and main), so DeepEP has no graph-safe dispatch there;
 * HybridEP has one, the rank capacity's static budget (mp_moe_host_sync). */
static mp_status moe_host_sync_refusal(mp_ctx *ctx, const mp_model *m, const mp_plan_options *o, const char *name) {
  if (o->moe_dispatcher == MP_MOE_DISPATCH_DEEPEP)
    return mp_error(ctx, MP_ERR_INVALID,
                    "CUDA graphs (%s) over %s's MoE layers with DeepEP: Megatron-Core builds the experts' counts "
                    "from DeepEP's host list num_recv_tokens_per_expert_list and passes no num_worst_tokens "
                    "(fused_a2a.py, core_v0.18.0 and main), a host read torch.cuda.graph cannot capture; choose the "
                    "hybridep dispatcher with --moe-expert-rank-capacity-factor, or cuda graphs attn, attn+moe_router "
                    "or attn+moe_router+moe_preprocess", name, m->name);
  if (o->moe_dispatcher == MP_MOE_DISPATCH_HYBRIDEP)
    return mp_error(ctx, MP_ERR_INVALID,
                    "CUDA graphs (%s) over %s's MoE layers with HybridEP and no rank capacity: HybridEP sizes its "
                    "buffers from the routed counts (CPU sync in dispatch, token_dispatcher.py _HybridEPManager, "
                    "core_v0.18.0), which torch.cuda.graph cannot capture; give --moe-expert-rank-capacity-factor "
                    "(validate's moe_rank_capacity_factor), or choose cuda graphs attn or attn+moe_router",
                    name, m->name);
  return mp_error(ctx, MP_ERR_INVALID,
                  "CUDA graphs (%s) over %s's MoE layers: the token dispatcher synchronises the host to read "
                  "the routed counts each layer (token_dispatcher.py cuda_sync_point, DeepEP's received "
                  "counts), which torch.cuda.graph cannot capture (cuda_graphs.py CudaGraphManager); choose "
                  "cuda graphs attn, attn+moe_router or attn+moe_router+moe_preprocess, or pad the experts to "
                  "a capacity with the alltoall dispatcher (--moe-capacity-factor 1 "
                  "--moe-pad-expert-input-to-capacity, NeMo's MegatronTokenDropCallback)",
                  name, m->name);
}

mp_status mp_rule_cuda_graphs_check(mp_ctx *ctx, const mp_model *m, const mp_plan_options *o) {
  const mp_cuda_graphs g = o->cuda_graphs;
  if ((unsigned)g >= MP_CUDA_GRAPHS_COUNT)
    return mp_error(ctx, MP_ERR_INVALID, "unknown CUDA graph scope %d; choose none, attn, layers, iteration, "
                    "attn+moe_router or attn+moe_router+moe_preprocess", (int)g);
  if (g == MP_CUDA_GRAPHS_NONE) return MP_OK;
  const char *name = mp_cuda_graphs_name(g);
  if (o->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID,
                    "CUDA graphs (%s) are Megatron-Core's (--enable-cuda-graph, --external-cuda-graph); the %s "
                    "memory model's stack launches its kernels eagerly: drop them or choose a megatron stack",
                    name, mp_mem_model_name(o->mem_model));
  MP_CHECK(graphs_recompute_check(ctx, o, name));
  if (g == MP_CUDA_GRAPHS_ROUTER || g == MP_CUDA_GRAPHS_PREPROCESS) MP_CHECK(router_scope_check(ctx, m, o, name));
  if ((g == MP_CUDA_GRAPHS_LAYERS || g == MP_CUDA_GRAPHS_ITERATION) && mp_moe_host_sync(m, o))
    return moe_host_sync_refusal(ctx, m, o, name);
  if (g == MP_CUDA_GRAPHS_ITERATION && o->ddp.check_grads)
    return mp_error(ctx, MP_ERR_INVALID,
                    "CUDA graphs (iteration) with the DDP's gradient NaN check: Megatron-LM asserts "
                    "--no-check-for-nan-in-loss-and-grad with --cuda-graph-scope full_iteration; turn the check off "
                    "(simulate's --no-check-for-nan-in-loss-and-grad, validate's ddp_check_grads 0)");
  return MP_OK;
}

/* The first refusal of Megatron-Core's own rules for CPU offloading (transformer_config.py
 * __post_init__, core_v0.14.0), or NULL. */
static const char *offload_megatron_refusal(const mp_model *m, const mp_mesh *mesh, const mp_plan_options *o) {
  if (o->cpu_offload_layers >= m->n_layers)
    return "Megatron-Core offloads fewer layers than the model has ('CPU offloading can be done only for "
           "layers less than num_layers')";
  if (mesh->size[MP_DIM_PP] > 1)
    return "Megatron-Core has no CPU offloading with pipeline parallelism ('Currently there is no support for "
           "Pipeline parallelism with CPU offloading'): use pp=1";
  if (o->ac != MP_AC_NONE || o->recompute_modules != 0)
    return "Megatron-Core refuses CPU offloading with activation recomputation ('CPU offloading does not work "
           "when activation recomputation is enabled'): use --ac none without recompute modules";
  if (o->cuda_graphs == MP_CUDA_GRAPHS_LAYERS || o->cuda_graphs == MP_CUDA_GRAPHS_ITERATION)
    return "Megatron-Core refuses CPU offloading with --enable-cuda-graph ('CUDA graphs not supported with CPU "
           "offloading.')";
  return NULL;
}

/* What meshplan does not model of CPU offloading (which saved tensors Transformer Engine marks
 * for the host, transformer_engine/pytorch/cpu_offload.py mark_activation_offload, v2.8), or
 * NULL. */
static const char *offload_model_refusal(const mp_model *m, const mp_mesh *mesh, const mp_plan_options *o) {
  if (mp_model_n_moe_layers(m) > 0 || mp_model_is_hybrid(m) || m->mtp_layers > 0 || m->kv_lora_rank > 0)
    return "only dense attention-and-MLP layers are modelled (which of a MoE, Mamba, MLA or MTP layer's saved "
           "tensors Transformer Engine offloads is not counted)";
  if (mesh->size[MP_DIM_CP] > 1) return "context parallelism's attention is not modelled with it: use cp=1";
  if (o->attn == MP_ATTN_MATERIALIZED)
    return "materialized attention's scores are not Transformer Engine's and are not modelled with it";
  if (o->cuda_graphs != MP_CUDA_GRAPHS_NONE)
    return "Transformer Engine's graphed layer parts (--external-cuda-graph) are not modelled with it";
  if (o->fp8_act_cache) return "the float8 activation cache is not modelled with it";
  return NULL;
}

mp_status mp_rule_cpu_offload_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                                    const mp_plan_options *o) {
  const int n = o->cpu_offload_layers;
  if (n == 0) return MP_OK;
  if (n < 0) return mp_error(ctx, MP_ERR_INVALID, "cpu_offload_layers %d: a count of layers, 0 for none", n);
  if (o->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID,
                    "CPU offloading (%d layers) is Megatron-Core's (--cpu-offloading); the %s memory model's stack "
                    "has none meshplan models: drop it or choose a megatron stack",
                    n, mp_mem_model_name(o->mem_model));
  const char *why = offload_megatron_refusal(m, mesh, o);
  if (why == NULL) why = offload_model_refusal(m, mesh, o);
  if (why != NULL)
    return mp_error(ctx, MP_ERR_INVALID, "CPU offloading of %d of %s's %lld layers: %s", n, m->name,
                    (long long)m->n_layers, why);
  return MP_OK;
}
