/* meshplan validate: predictions against published measurements.
 *
 * Reads rows in the format of shared/validation/published_dev.csv (its README documents the
 * columns; validate_csv.h reads and range-checks them). Each row names a model (data/models, or a .json path relative to the CSV's folder),
 * a GPU (data/gpus) with gpus, gpus_per_node, nvlink_domain and inter_node_gbps_per_gpu (Gbit/s), the mesh
 * (dp_replicate, dp_shard, tp, pp, pp_schedule, pp_virtual, cp, ep), seq, local_batch
 * (sequences per data-parallel rank per step), micro_batch, global_batch, ac (a policy
 * name, exec/plan.h), fp8, sp, the software stack (data/stacks) and one measured metric:
 *   tokens_per_s_per_gpu   compared with the simulation's tokens/s per GPU
 *   step_time_s            compared with its step time
 *   peak_mem_gib           compared with the allocator's peak: allocated x the stack's
 *                          fragmentation factor, in GiB. Published figures are PyTorch's
 *                          max reserved memory (torch.cuda.memory_stats), which leaves out
 *                          the CUDA context and NCCL's own buffers; the GPU profile's
 *                          runtime overhead is therefore not part of this comparison.
 * Optional columns: micro_batch (empty or absent: every divisor of local_batch is
 * simulated and the fastest that fits is taken, as a user of the stack would tune it; the
 * table marks it with '*'. A pipelined row of a stack that states its own micro-batching
 * (the profile's pp_microbatches "stages": torchtitan splits the local batch into pp
 * micro-batches unless told otherwise) runs that one, marked 's', since the published run
 * ran it; a split the plan refuses falls back to the pick), pp_virtual (empty: 2 for the interleaved schedule),
 * pp_layout (the layers of each virtual stage in Megatron-LM's --pipeline-model-parallel-layout
 * notation, "E|(t|)*126L"; empty: the default split, or on a megatron row with more model
 * chunks than layers Megatron's split with the embedding and the loss counted as layers,
 * marked 'l'), sp (empty:
 * the plan's default, on with tp > 1 where the stack runs it), async_tp (1: the TP
 * collectives fused with their GEMMs, torchtitan's AsyncTP as the published run enabled it;
 * 0: not; empty or absent: the stack's default, off but under megatron-core, whose
 * --tp-comm-overlap is on), fp8_recipe (with fp8 1: tensorwise, current, delayed,
 * rowwise, mxfp8, blockwise or nvfp4, or Megatron-Bridge's fp8_cs, fp8_mx, fp8_sc and subchannel;
 * empty or absent: the stack's recipe), moe_dispatcher
 * (alltoall, deepep or hybridep: how EP moves tokens, exec/plan.h; empty or absent: alltoall),
 * cp_comm_type (Megatron-Core's --cp-comm-type on a megatron stack: p2p, all_gather or a2a;
 * empty or absent: p2p, its default), cp_rotate (torchtitan's context_parallel_rotate_method on
 * a torchtitan stack: allgather or alltoall; empty or absent: the stack's), moe_fp8_dispatch (1: DeepSeek-V3's float8 dispatch;
 * empty or absent: off), ce_fusion (1: Megatron-Core's --cross-entropy-loss-fusion; empty or
 * absent: off), ce_fusion_impl (with ce_fusion 1, its --cross-entropy-fusion-impl: native or
 * te; empty or absent: native), ddp_average_in_collective (1: Megatron-LM's
 * --ddp-average-in-collective) and
 * ddp_check_grads (0: its --no-check-for-nan-in-loss-and-grad; empty or absent: the stack's,
 * and 0 under cuda_graphs iteration, which Megatron-LM runs only without the check),
 * ddp_align_param_gather (1: its --align-param-gather; empty or absent: off), ddp_bucket_size
 * (its --ddp-bucket-size in elements; empty or absent: one bucket a block), grad_accum_fusion
 * (0: its --no-gradient-accumulation-fusion; empty or absent: the stack's), recompute_modules
 * (Megatron-Core's recompute modules split by spaces, layernorm mla_up_proj moe_act mlp moe
 * shared_experts; empty or absent: none), recompute_method and recompute_num_layers (Megatron-Core's
 * --recompute-method block or uniform and its --recompute-num-layers under ac full; empty or
 * absent: every layer), fp8_act_cache (1: DeepSeek-V3's float8 activation cache;
 * empty or absent: off), optimizer_moments (fp32 or bf16: AdamW's moments; empty or absent:
 * fp32), fp8_param_gather (1: Megatron-Core's --fp8-param-gather, the float8 Linears' weights
 * kept and gathered in float8; empty or absent: off), fp8_all_gather (1: torchtitan's
 * enable_fsdp_float8_all_gather; empty or absent: off), nvfp4_rht (0: NVFP4 without the random
 * Hadamard transform, NVTE_NVFP4_DISABLE_RHT=1; empty or absent: on), mfsdp_strategy and fsdp_double_buffer
 * (a megatron row with dp_shard > 1 runs Megatron
 * FSDP: its --data-parallel-sharding-strategy, empty or absent optim_grads_params, and 1 for its
 * --fsdp-double-buffer, empty or absent off), fsdp_flat_params (1: PyTorch FSDP1's flat
 * parameters, no FSDP2 copy-out or copy-in; empty or absent: FSDP2), loss_chunks (torchtitan's
 * ChunkedLossWrapper's num_chunks: the head and loss in that many sequence chunks; empty or
 * absent: 1, the micro-batch at once), fsdp_reduce_dtype (fp32 or bf16: the dtype FSDP
 * reduces gradients in, bf16 as FSDP1's MixedPrecision runs it in IBM's fms-fsdp; empty or
 * absent: fp32), mtp_layers (the model's multi-token-prediction modules; empty or absent: the
 * model's), cuda_graphs (Megatron-Core's CUDA graphs on a megatron-core row: none, attn, layers
 * or iteration, exec/plan.h; empty or absent: none), nccl_ctas (each NCCL communicator's
 * max_ctas as Megatron-Core's communicator config sets it, name:N split by spaces, sim.h
 * mp_sim_nccl_ctas_parse; empty or absent: NCCL's channel count), ub_cfg (Transformer Engine's
 * userbuffers config, gemm:method:num_sm:set_sm_margin split by spaces, sim.h
 * mp_sim_ub_cfg_parse; empty or absent: TE's default), overlap_moe_comm (1: Megatron-Core's
 * --overlap-moe-expert-parallel-comm, simulate's --overlap-moe-comm; empty or absent: off),
 * cpu_offload_layers (Megatron-Core's --cpu-offloading-num-layers N on a megatron row, simulate's
 * --cpu-offload-layers; empty, absent or 0: off), nccl_version (the NCCL the run used, X.Y or
 * X.Y.Z, simulate's --nccl-version: which algorithms NCCL may pick, sim/network.c; empty or
 * absent: the newest NCCL meshplan models).
 * The stack's options
 * (memory model, attention and loss kernels) apply to the plan.
 *
 * Prints per row predicted vs published with the percentage error, then per metric the
 * mean absolute percentage error and Kendall's tau-b between predicted and measured
 * (common/stats.h); --json prints the same as one object at full precision.
 * A row the file gets wrong (an unknown model, GPU or stack, a mesh that does not match
 * its gpus, a malformed value) is an error naming the row, and nothing is simulated
 * (exit 2). A well-formed row whose plan the simulator refuses (a combination outside
 * what meshplan models, such as MoE with pp) is listed with the rule that refuses it,
 * counted and left out of the summary; the other rows are still reported and the exit
 * status is 0. A row that breaks an invariant of the simulator (MP_ERR_INTERNAL, a bug) is
 * listed the same way, its reason headed "meshplan internal error". --by stack|gpu|feature adds the summary per group. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/stats.h"
#include "sim/cluster.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "app/commands.h"
#include "app/validate_csv.h"
#include "sim/sim.h"
#include "sim/stack.h"

static mp_opt k_opts[] = {
    MP_OPT_JSON("every row and the summary"),
    {"--by", "KEY", "also summarize per stack, gpu or feature (fp8, tp, sp, async_tp, pp, interleaved, cp, ep, fsdp, ddp)", NULL},
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {"validate",
                             "Compare predictions with published measurements (CSV rows).",
                             "FILE.csv [--json] [--by stack|gpu|feature]", k_opts, 1};

/* A row's features, for --by feature: what its plan runs. */
enum { F_FP8, F_TP, F_SP, F_ASYNC_TP, F_PP, F_INTERLEAVED, F_CP, F_EP, F_FSDP, F_DDP, N_FEATURES };
static const char *const k_features[N_FEATURES] = {"fp8", "tp", "sp", "async_tp", "pp",
                                                   "interleaved", "cp", "ep", "fsdp", "ddp"};

typedef struct row {
  char name[96];
  char metric[32];
  double measured, predicted;
  int64_t micro_batch; /* the micro-batch simulated */
  int picked;          /* no micro_batch given: 1 chosen among the divisors of local_batch,
                          2 the stack's own pipeline micro-batching */
  char refused[512];   /* non-empty: the simulator's rule that refuses the row's plan */
  int capacity_from_graphs; /* the experts' capacity read from the row's graphs (graphs_capacity) */
  int layout_from_split;    /* the pipeline layout Megatron's embedding and loss split gives */
  char stack[64], gpu[64]; /* as the row names them, for --by */
  unsigned features;   /* 1 << F_*: what the row's plan runs, for --by feature */
} row;

/* The row's model: a data/models name, or a .json path taken relative to the CSV's folder
 * (dir) unless absolute. */
static mp_status load_model(mp_ctx *ctx, const char *dir, const char *model, mp_model *m) {
  const size_t n = strlen(model);
  if (model[0] == '/' || n < 5 || strcmp(model + n - 5, ".json") != 0 || dir[0] == '\0')
    return mp_model_load(ctx, model, m);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, model);
  return mp_model_load(ctx, path, m);
}

/* What a row asks to simulate: model, cluster, stack, mesh and plan options, and whether
 * its micro-batch is to be picked. */
typedef struct row_job {
  mp_model m;
  mp_cluster c;
  mp_stack_profile prof;
  mp_mesh mesh;
  mp_plan_options o;
  int64_t local_batch, micro_batch; /* micro_batch 0: pick */
  int capacity_from_graphs;         /* 1: the experts' capacity read from the row's graphs */
  int layout_from_split;            /* 1: mp_cmd_megatron_pp_split gave the layout */
} row_job;

static mp_status read_mesh(mp_ctx *ctx, const char *where, const mp_vrow *v, mp_mesh *mesh) {
  mp_mesh_init(mesh);
  mesh->size[MP_DIM_PP] = (int)v->pp;
  mesh->size[MP_DIM_DP_REPLICATE] = (int)v->dp_replicate;
  mesh->size[MP_DIM_DP_SHARD] = (int)v->dp_shard;
  mesh->size[MP_DIM_CP] = (int)v->cp;
  mesh->size[MP_DIM_TP] = (int)v->tp;
  mesh->ep = (int)v->ep;
  mesh->etp = (int)v->etp;
  mesh->dopt = (int)v->dist_opt_instances;
  MP_CHECK(mp_mesh_validate(ctx, mesh));
  if (mp_mesh_world(mesh) != v->gpus)
    return mp_error(ctx, MP_ERR_INVALID, "%s: the mesh has %d ranks but gpus = %lld", where,
                    mp_mesh_world(mesh), (long long)v->gpus);
  return MP_OK;
}

/* Per-layer and full-iteration graphs capture a MoE layer only where the dispatcher reads no
 * routed count on the host (mp_moe_host_sync, the rule that refuses the graphs), so a run that
 * completed under those graphs ran so. With the dropless alltoall dispatcher it ran padded:
 * NeMo's recipes that turn the graphs on for MoE models add MegatronTokenDropCallback, capacity
 * factor 1.0 with --moe-pad-expert-input-to-capacity
 * (nemo/lightning/pytorch/callbacks/moe_token_drop.py). With HybridEP under the full iteration
 * it ran under a rank capacity: Megatron-Bridge's performance recipes that set cuda_graph_impl
 * full_iteration over MoE models set moe_expert_rank_capacity_factor 1.5 with paged stashing
 * (set_full_iter_cg_configs in scripts/performance/configs/qwen/qwen3_llm_pretrain.py and
 * deepseek/deepseek_llm_pretrain.py at c8327cfc2^). A row stating those graphs over MoE layers
 * and no capacity column takes the setting that removes the host's read, marked 'c' in the
 * table; HybridEP under per-layer graphs has no recipe's value and is refused unless stated. */
#define BRIDGE_FULL_ITER_RANK_CAPACITY 1.5
static void graphs_capacity(const mp_vrow *v, row_job *j) {
  mp_plan_options *o = &j->o, fix = *o;
  if (!(o->cuda_graphs == MP_CUDA_GRAPHS_LAYERS || o->cuda_graphs == MP_CUDA_GRAPHS_ITERATION) ||
      v->moe_capacity_factor > 0.0 || v->moe_pad_to_capacity >= 0 || v->moe_rank_capacity_factor > 0.0 ||
      !mp_moe_host_sync(&j->m, o))
    return;
  if (o->moe_dispatcher == MP_MOE_DISPATCH_HYBRIDEP) {
    if (o->cuda_graphs != MP_CUDA_GRAPHS_ITERATION) return; /* Bridge's 1.5 is its full iteration's */
    fix.moe_routing.rank_capacity = BRIDGE_FULL_ITER_RANK_CAPACITY;
  } else {
    fix.moe_routing.capacity_factor = 1.0;
    fix.moe_routing.pad_to_capacity = 1;
  }
  if (mp_moe_host_sync(&j->m, &fix)) return;
  o->moe_routing = fix.moe_routing;
  j->capacity_from_graphs = 1;
}

/* The Megatron-LM and Megatron-Core options a row states beside its mesh: the fused loss,
 * the DDP's (averaging, NaN check, aligned gathers, buckets, gradient accumulation fusion),
 * the recompute modules, CUDA graphs, NCCL communicators' caps, userbuffers, the EP
 * communication overlap and where delayed scaling reduces its amaxes; each refusal
 * prefixed with the row. */
static mp_status megatron_run_options(mp_ctx *ctx, const char *where, const mp_vrow *v, row_job *j) {
  mp_plan_options *o = &j->o;
  /* Under full-iteration CUDA graphs an empty ddp_check_grads is 0: Megatron-LM asserts
   * --no-check-for-nan-in-loss-and-grad with --cuda-graph-scope full_iteration (exec/rules.c),
   * so every run that launched so had the check off, as Megatron-Bridge's performance scripts
   * set it for every run (scripts/performance/utils/overrides.py at c8327cfc2^,
   * _set_common_perf_overrides: ddp.check_for_nan_in_grad = False). */
  const int no_check = v->ddp_check_grads == 0 || (v->ddp_check_grads < 0 && strcmp(v->cuda_graphs, "iteration") == 0);
  if ((v->ce_fusion == 1 && mp_cmd_fuse_loss(ctx, &j->prof, o) != MP_OK) ||
      (v->ce_fusion_impl[0] && mp_cmd_ce_impl(ctx, v->ce_fusion_impl, o) != MP_OK) ||
      mp_cmd_ddp_bucket_prep(ctx, &j->prof, v->ddp_average_in_collective == 1, no_check,
                             v->ddp_align_param_gather == 1, v->ddp_bucket_size, o) != MP_OK ||
      (v->grad_accum_fusion == 0 && mp_cmd_wgrad_unfused(ctx, &j->prof, o) != MP_OK) ||
      (v->recompute_modules[0] && mp_recompute_modules_parse(ctx, v->recompute_modules, o) != MP_OK) ||
      (v->cuda_graphs[0] && mp_cmd_cuda_graphs(ctx, &j->prof, v->cuda_graphs, o) != MP_OK) ||
      (v->nccl_ctas[0] && mp_sim_nccl_ctas_parse(ctx, v->nccl_ctas, j->prof.nccl_group_ctas) != MP_OK) ||
      (v->ub_cfg[0] && mp_cmd_ub_cfg_text(ctx, &j->prof, v->ub_cfg) != MP_OK)) {
    mp_error_prefix(ctx, "%s", where);
    return ctx->last;
  }
  if (v->overlap_moe_comm == 1 && o->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID, "%s: overlap_moe_comm 1 is Megatron-Core's "
                    "--overlap-moe-expert-parallel-comm; stack %s does not run it: empty the column", where,
                    j->prof.name);
  o->moe_a2a_overlap = v->overlap_moe_comm == 1; /* the plan checks ep, the schedule and AC */
  if (v->fp8_amax_tp == 1 && !v->fp8)
    return mp_error(ctx, MP_ERR_INVALID, "%s: fp8_amax_tp 1 says where delayed scaling reduces its amaxes "
                    "(--fp8-amax-tp-only) and needs fp8 1: empty the column", where);
  o->fp8_opts.amax_tp = v->fp8_amax_tp == 1; /* the Float8 pass checks the recipe and the stack */
  graphs_capacity(v, j);
  return MP_OK;
}

/* The FSDP columns into j's options: Megatron FSDP's strategy and double buffer (a megatron
 * stack with dp_shard > 1), FSDP1's flat parameters (a torchtitan stack), the reduce dtype;
 * and fp8_scope (the Float8 pass checks the stack and the recipe). */
static mp_status read_fsdp_options(mp_ctx *ctx, const char *where, const mp_vrow *v, row_job *j) {
  mp_plan_options *o = &j->o;
  if ((v->mfsdp_strategy[0] || v->fsdp_double_buffer == 1) &&
      !mp_plan_megatron_fsdp(o, &j->mesh))
    return mp_error(ctx, MP_ERR_INVALID, "%s: mfsdp_strategy and fsdp_double_buffer are Megatron FSDP's, which a "
                    "megatron stack runs with dp_shard > 1: empty the columns", where);
  if (v->mfsdp_strategy[0] && !mp_mfsdp_strategy_parse(v->mfsdp_strategy, &o->mfsdp_strategy))
    return mp_error(ctx, MP_ERR_INVALID, "%s: mfsdp_strategy '%s': expected optim_grads_params, optim_grads, "
                    "optim or no_shard", where, v->mfsdp_strategy);
  o->fsdp_double_buffer = v->fsdp_double_buffer == 1;
  if (v->fsdp_flat_params == 1 && o->mem_model != MP_MEM_MODEL_TORCHTITAN)
    return mp_error(ctx, MP_ERR_INVALID, "%s: fsdp_flat_params 1 is PyTorch FSDP1's, which runs on a torchtitan "
                    "stack: empty the column", where);
  o->fsdp.flat_params = v->fsdp_flat_params == 1;
  o->loss_chunks = (int)v->loss_chunks; /* the plan checks the stack and the sequence */
  if (v->fp8_scope[0] && !mp_fp8_scope_parse(v->fp8_scope, &o->fp8_opts.scope))
    return mp_error(ctx, MP_ERR_INVALID, "%s: fp8_scope '%s': expected linears, experts or all", where,
                    v->fp8_scope);
  if (o->fp8_opts.scope != MP_FP8_SCOPE_LINEARS && !v->fp8)
    return mp_error(ctx, MP_ERR_INVALID, "%s: fp8_scope %s names the GEMMs in float8 and needs fp8 1: empty "
                    "the column", where, v->fp8_scope);
  if (v->fsdp_reduce_dtype[0] && !mp_cmd_fp32_bf16_parse(v->fsdp_reduce_dtype, &o->fsdp.reduce_dtype))
    return mp_error(ctx, MP_ERR_INVALID, "%s: fsdp_reduce_dtype '%s': expected fp32 or bf16", where,
                    v->fsdp_reduce_dtype);
  return MP_OK;
}

/* The row's recompute_method and recompute_num_layers (Megatron-Core's, under ac full). */
static mp_status read_recompute_method(mp_ctx *ctx, const char *where, const mp_vrow *v, mp_plan_options *o) {
  if (v->recompute_method[0] && !mp_recompute_method_parse(v->recompute_method, &o->recompute_method))
    return mp_error(ctx, MP_ERR_INVALID, "%s: recompute_method '%s': expected block or uniform", where,
                    v->recompute_method);
  o->recompute_num_layers = (int)v->recompute_num_layers;
  return MP_OK;
}

/* The plan options of a row: AC, float8, SP, the pipeline schedule, seq and batch, over
 * the stack's. */
static mp_status read_options(mp_ctx *ctx, const char *where, const mp_vrow *v, row_job *j) {
  mp_plan_options *o = &j->o;
  mp_plan_options_init(o);
  mp_stack_plan_options(&j->prof, &j->c.gpu, o);
  MP_CHECK(mp_ac_parse(ctx, v->ac, &o->ac, &o->ac_every));
  MP_CHECK(read_recompute_method(ctx, where, v, o));
  o->fp8 = v->fp8 != 0;
  if (v->fp8_recipe[0] && !mp_fp8_recipe_parse(v->fp8_recipe, &o->fp8_opts.recipe))
    return mp_error(ctx, MP_ERR_INVALID, "%s: fp8_recipe '%s': expected tensorwise, current, delayed, "
                    "rowwise, mxfp8, blockwise or nvfp4 (or Megatron-Bridge's fp8_cs, fp8_mx, fp8_sc)", where,
                    v->fp8_recipe);
  if (v->moe_dispatcher[0] && !mp_moe_dispatcher_parse(v->moe_dispatcher, &o->moe_dispatcher))
    return mp_error(ctx, MP_ERR_INVALID, "%s: moe_dispatcher '%s': expected alltoall, deepep or hybridep", where,
                    v->moe_dispatcher);
  if (v->cp_comm_type[0] && !mp_cp_comm_parse(v->cp_comm_type, &o->cp_comm))
    return mp_error(ctx, MP_ERR_INVALID, "%s: cp_comm_type '%s': expected p2p, all_gather, a2a or a2a+p2p", where,
                    v->cp_comm_type);
  if (v->cp_comm_type[0] && o->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID, "%s: cp_comm_type '%s' is Megatron-Core's --cp-comm-type; stack %s "
                    "does not run it: empty the column", where, v->cp_comm_type, j->prof.name);
  if (v->cp_rotate[0] && (o->mem_model != MP_MEM_MODEL_TORCHTITAN || !mp_cp_rotate_parse(v->cp_rotate, &o->cp_rotate)))
    return mp_error(ctx, MP_ERR_INVALID, "%s: cp_rotate '%s' is PyTorch's context-parallel ring's rotate method "
                    "(torchtitan's context_parallel_rotate_method, simulate's --cp-rotate): allgather or alltoall "
                    "on a torchtitan stack; stack %s: empty the column", where, v->cp_rotate, j->prof.name);
  if (v->moe_imbalance > 0.0) o->moe_routing.imbalance = v->moe_imbalance;
  o->moe_routing.capacity_factor = v->moe_capacity_factor;
  o->moe_routing.pad_to_capacity = v->moe_pad_to_capacity == 1;
  o->moe_routing.rank_capacity = v->moe_rank_capacity_factor;
  if (v->sp >= 0) o->sp = v->sp;
  o->moe_fp8_dispatch = v->moe_fp8_dispatch == 1;
  o->fp8_act_cache = v->fp8_act_cache == 1;
  if (v->cpu_offload_layers > 0 && o->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID, "%s: cpu_offload_layers %lld is Megatron-Core's CPU offloading, which a "
                    "megatron stack runs: empty the column", where, (long long)v->cpu_offload_layers);
  o->cpu_offload_layers = (int)v->cpu_offload_layers;
  if (v->optimizer_moments[0] && !mp_cmd_fp32_bf16_parse(v->optimizer_moments, &o->moment_dtype))
    return mp_error(ctx, MP_ERR_INVALID, "%s: optimizer_moments '%s': expected fp32 or bf16", where,
                    v->optimizer_moments);
  MP_CHECK(read_fsdp_options(ctx, where, v, j));
  if (v->fp8_param_gather == 1 && (o->mem_model != MP_MEM_MODEL_MEGATRON || !v->fp8))
    return mp_error(ctx, MP_ERR_INVALID, "%s: fp8_param_gather 1 is Megatron-Core's --fp8-param-gather, which "
                    "needs fp8 1 on a megatron stack: empty the column", where);
  o->fp8_opts.param_gather = v->fp8_param_gather == 1;
  if (v->fp8_all_gather == 1 && (o->mem_model != MP_MEM_MODEL_TORCHTITAN || !v->fp8))
    return mp_error(ctx, MP_ERR_INVALID, "%s: fp8_all_gather 1 is torchtitan's enable_fsdp_float8_all_gather, "
                    "which needs fp8 1 on a torchtitan stack: empty the column", where);
  o->fp8_opts.all_gather = v->fp8_all_gather == 1;
  if (v->nvfp4_rht >= 0 && !(v->fp8 && o->fp8_opts.recipe == MP_FP8_NVFP4))
    return mp_error(ctx, MP_ERR_INVALID, "%s: nvfp4_rht is NVFP4's random Hadamard transform and needs fp8 1 "
                    "with fp8_recipe nvfp4: empty the column", where);
  o->fp8_opts.nvfp4_no_rht = v->nvfp4_rht == 0;
  if (v->fp8_dpa == 1 && !v->fp8)
    return mp_error(ctx, MP_ERR_INVALID, "%s: fp8_dpa 1 is Transformer Engine's float8 attention (--fp8-dpa), "
                    "which runs under a float8 recipe and needs fp8 1: empty the column", where);
  o->fp8_opts.dpa = v->fp8_dpa == 1;
  MP_CHECK(megatron_run_options(ctx, where, v, j));
  if (v->async_tp == 1 && !j->prof.async_tp)
    return mp_error(ctx, MP_ERR_INVALID, "%s: async_tp = 1: stack %s does not run AsyncTP "
                    "(torchtitan-compile and megatron-core do)", where, j->prof.name);
  if (v->async_tp >= 0) o->tp_comm_fused = v->async_tp;
  const char *pps = v->pp_schedule;
  o->pp_schedule = MP_PP_1F1B;
  if (pps[0] != '\0' && !mp_pp_schedule_parse(pps, &o->pp_schedule))
    return mp_error(ctx, MP_ERR_INVALID, "%s: pp_schedule '%s': expected 1f1b, interleaved, gpipe, dualpipe, zbv or "
                    "interleaved_zb (or torch's ZBVZeroBubble, InterleavedZeroBubble, Interleaved1F1B)", where, pps);
  if (o->pp_schedule == MP_PP_INTERLEAVED || o->pp_schedule == MP_PP_INTERLEAVED_ZB || o->pp_schedule == MP_PP_ZBV)
    o->pp_virtual = v->pp_virtual ? (int)v->pp_virtual : 2;
  const mp_status lay = v->pp_layout[0] ? mp_pp_layout_parse(ctx, v->pp_layout, o) : MP_OK;
  if (lay != MP_OK) {
    mp_error_prefix(ctx, "%s", where);
    return lay;
  }
  if (!v->pp_layout[0]) j->layout_from_split = mp_cmd_megatron_pp_split(&j->m, &j->mesh, o);
  j->local_batch = v->local_batch;
  j->micro_batch = v->micro_batch;
  o->seq = v->seq;
  o->global_batch = v->global_batch;
  return MP_OK;
}

/* The simulation of one micro-batch size. */
static mp_status simulate_mb(mp_ctx *ctx, row_job *j, int64_t mb, mp_sim_result *res) {
  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = &j->c;
  cfg.stack = &j->prof;
  j->o.micro_batch = mb;
  return mp_simulate_plan(ctx, &j->m, &j->mesh, &j->o, &cfg, res);
}

/* The row's simulation: its micro-batch, or the fastest that fits among the divisors of
 * local_batch (the smallest when none fits); a divisor the plan refuses (the interleaved
 * schedule's micro-batches in groups of pp) is no choice, the error kept for when none is
 * left. */
static mp_status simulate_row(mp_ctx *ctx, row_job *j, row *r, mp_sim_result *res) {
  if (j->micro_batch > 0) {
    r->micro_batch = j->micro_batch;
    return simulate_mb(ctx, j, j->micro_batch, res);
  }
  const int64_t pp = j->mesh.size[MP_DIM_PP];
  if (j->prof.pp_mb_stages && pp > 1 && j->local_batch % pp == 0) {
    const mp_status st = simulate_mb(ctx, j, j->local_batch / pp, res);
    if (st != MP_ERR_INVALID) {
      r->micro_batch = j->local_batch / pp;
      r->picked = 2;
      return st;
    }
  }
  r->picked = 1;
  int have = 0;
  for (int64_t mb = 1; mb <= j->local_batch; mb++) {
    if (j->local_batch % mb) continue;
    mp_sim_result x;
    const mp_status st = simulate_mb(ctx, j, mb, &x);
    if (st == MP_ERR_INVALID) continue;
    if (st != MP_OK) return st;
    const int better = !have || (x.fits && (!res->fits || x.step_time_s < res->step_time_s));
    if (better) {
      *res = x;
      r->micro_batch = mb;
      have = 1;
    }
  }
  return have ? MP_OK : ctx->last;
}

/* What the row's plan runs (F_* bits), from its mesh and options. */
static unsigned row_features(const row_job *j) {
  const mp_mesh *m = &j->mesh;
  const mp_plan_options *o = &j->o;
  const int tp = m->size[MP_DIM_TP] > 1;
  const int mfsdp = mp_plan_megatron_fsdp(o, m); /* a megatron row over dp_shard */
  const int ddp = !mfsdp && (o->dp == MP_DP_DDP || (o->dp == MP_DP_AUTO && o->mem_model == MP_MEM_MODEL_MEGATRON));
  return (unsigned)(o->fp8 << F_FP8 | tp << F_TP | (tp && o->sp != 0) << F_SP |
                    (tp && o->tp_comm_fused) << F_ASYNC_TP | (m->size[MP_DIM_PP] > 1) << F_PP |
                    (o->pp_schedule == MP_PP_INTERLEAVED) << F_INTERLEAVED |
                    (m->size[MP_DIM_CP] > 1) << F_CP | (m->ep > 1) << F_EP |
                    (!ddp && m->size[MP_DIM_DP_SHARD] > 1) << F_FSDP | ddp << F_DDP);
}

/* Simulates one row; r gets the figure of the row's metric beside the published one. dir:
 * the CSV's folder. */
static mp_status run_row(mp_ctx *ctx, const char *where, const char *dir, const mp_vrow *v, row *r) {
  snprintf(r->name, sizeof r->name, "%s", v->name);
  snprintf(r->metric, sizeof r->metric, "%s", v->metric);
  r->measured = v->value;
  row_job *j = calloc(1, sizeof *j);
  if (j == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  mp_status st = load_model(ctx, dir, v->model, &j->m);
  if (st == MP_OK && v->mtp_layers >= 0) j->m.mtp_layers = v->mtp_layers;
  if (st == MP_OK) st = mp_cluster_make(ctx, v->gpu, (int)v->gpus, (int)v->gpus_per_node, &j->c);
  if (st == MP_OK && v->inter_node_gbps > 0) j->c.inter_node_Gbitps_per_gpu = v->inter_node_gbps;
  /* the NVLink domain a row's source states, else its node: GB200 is sold as NVL72 and
   * NVL36x2 but also as the GB200 NVL4 board (4 GPUs and 2 Grace CPUs on NVLink, NVIDIA's
   * SC24 announcement, 2024-11), so the profile's 72 is not assumed */
  if (st == MP_OK) j->c.nvlink_domain = (int)v->nvlink_domain;
  if (st == MP_OK) st = mp_stack_load(ctx, v->stack, &j->prof);
  if (st == MP_OK && v->nccl_version[0] &&
      (st = mp_sim_nccl_version_parse(ctx, v->nccl_version, &j->prof.nccl_version)) != MP_OK)
    mp_error_prefix(ctx, "%s", where);
  if (st == MP_OK) st = read_mesh(ctx, where, v, &j->mesh);
  if (st == MP_OK) st = read_options(ctx, where, v, j);
  snprintf(r->stack, sizeof r->stack, "%s", v->stack);
  snprintf(r->gpu, sizeof r->gpu, "%s", v->gpu);
  if (st == MP_OK) r->features = row_features(j);
  r->capacity_from_graphs = j->capacity_from_graphs;
  r->layout_from_split = j->layout_from_split;
  mp_sim_result res;
  memset(&res, 0, sizeof res);
  if (st == MP_OK) {
    st = simulate_row(ctx, j, r, &res);
    /* a well-formed row whose plan the simulator refuses; or one that breaks an invariant of
     * the simulator (a bug), listed as such so the file's other rows are still reported */
    if (st == MP_ERR_INVALID || st == MP_ERR_INTERNAL) {
      snprintf(r->refused, sizeof r->refused, "%s%s",
               st == MP_ERR_INTERNAL ? "meshplan internal error (a bug to report): " : "", mp_errmsg(ctx));
      free(j);
      return MP_OK;
    }
  }
  if (st == MP_OK) {
    if (strcmp(v->metric, "tokens_per_s_per_gpu") == 0)
      r->predicted = res.tokens_per_s_per_gpu;
    else if (strcmp(v->metric, "step_time_s") == 0)
      r->predicted = res.step_time_s;
    else
      r->predicted = ((double)res.peak_mem_bytes - j->c.gpu.runtime_overhead_gib * 1073741824.0) /
                     1073741824.0;
  }
  free(j);
  return st;
}

/* Reads the CSV text (split in place: validate_csv.h) and simulates every row into
 * rows[0..*n); the first bad row is an error naming it (path, line and case). */
static mp_status read_rows(mp_ctx *ctx, const char *path, char *text, row *rows, int *n_out) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  else dir[0] = '\0';
  mp_vrow *v = NULL;
  int n = 0;
  MP_CHECK(mp_vcsv_read(ctx, text, path, &v, &n));
  mp_status st = MP_OK;
  for (int i = 0; i < n && st == MP_OK; i++) {
    char where[512];
    snprintf(where, sizeof where, "%s line %d (row '%s')", path, v[i].line, v[i].name);
    st = run_row(ctx, where, dir, &v[i], &rows[i]);
    if (st != MP_OK) {
      if (strncmp(mp_errmsg(ctx), where, strlen(where)) != 0) mp_error_prefix(ctx, "%s", where);
      if (st != MP_ERR_NOMEM && st != MP_ERR_INTERNAL) st = MP_ERR_INVALID;
    }
  }
  free(v);
  if (st == MP_OK) *n_out = n;
  return st;
}

/* A figure in four significant digits, whole numbers from 10,000 up (tokens per second are
 * read as counts, not in exponent form). */
static const char *fig(char *buf, size_t cap, double x) {
  if (fabs(x) >= 1e4 && fabs(x) < 1e15)
    snprintf(buf, cap, "%.0f", x);
  else
    snprintf(buf, cap, "%.4g", x);
  return buf;
}

static const char *const k_metrics[] = {"tokens_per_s_per_gpu", "peak_mem_gib", "step_time_s"};
enum { N_METRICS = 3 };

/* The rows a summary covers: all of them, or one stack's, one GPU's, one feature's. */
typedef struct group {
  int kind; /* 0 all, 1 stack, 2 gpu, 3 feature */
  const char *key;
  int feature;
} group;

static int in_group(const row *r, const group *g) {
  switch (g->kind) {
    case 1: return strcmp(r->stack, g->key) == 0;
    case 2: return strcmp(r->gpu, g->key) == 0;
    case 3: return (r->features >> g->feature) & 1u;
    default: return 1;
  }
}

/* One metric's summary over a group's rows the simulator ran: their count, MAPE (a
 * fraction) and Kendall's tau-b (NAN when undefined). x, y: scratch of n doubles each. */
typedef struct metric_sum {
  int rows;
  double mape, tau;
} metric_sum;

static metric_sum summarize(const row *rows, int n, const char *metric, const group *g, double *x,
                            double *y) {
  metric_sum s = {0, 0, NAN};
  for (int i = 0; i < n; i++)
    if (!rows[i].refused[0] && strcmp(rows[i].metric, metric) == 0 && in_group(&rows[i], g)) {
      x[s.rows] = rows[i].predicted;
      y[s.rows] = rows[i].measured;
      s.rows++;
    }
  if (s.rows > 0) {
    s.mape = mp_mape(x, y, (size_t)s.rows);
    s.tau = mp_kendall_tau_b(x, y, (size_t)s.rows);
  }
  return s;
}


static double row_error(const row *r) { return (r->predicted - r->measured) / r->measured; }

/* The groups --by asks for (none without it): each stack or GPU the simulated rows name, in
 * the order they first appear, or each feature some simulated row has. */
static int groups_of(const row *rows, int n, const char *by, group *out) {
  int ng = 0;
  if (by == NULL) return 0;
  if (strcmp(by, "feature") == 0) {
    for (int f = 0; f < N_FEATURES; f++)
      for (int i = 0; i < n; i++)
        if (!rows[i].refused[0] && ((rows[i].features >> f) & 1u)) {
          out[ng++] = (group){3, k_features[f], f};
          break;
        }
    return ng;
  }
  const int kind = strcmp(by, "stack") == 0 ? 1 : 2;
  for (int i = 0; i < n; i++) {
    if (rows[i].refused[0]) continue;
    const char *key = kind == 1 ? rows[i].stack : rows[i].gpu;
    int seen = 0;
    for (int k = 0; k < ng && !seen; k++) seen = strcmp(out[k].key, key) == 0;
    if (!seen) out[ng++] = (group){kind, key, 0};
  }
  return ng;
}

static void print_row(const row *r) {
  char name[sizeof r->name * 4]; /* a case's name from the CSV, escaped (mp_cmd_escape) */
  char pub[32], pred[32], mb[24];
  if (r->refused[0]) {
    printf("%-30s %-22s %5s %12s %12s %8s\n", MP_CMD_CELL(r->name, name), r->metric, "-", "refused",
           fig(pub, sizeof pub, r->measured), "-");
    return;
  }
  snprintf(mb, sizeof mb, "%lld%s%s%s", (long long)r->micro_batch, r->picked == 2 ? "s" : r->picked ? "*" : "",
           r->capacity_from_graphs ? "c" : "", r->layout_from_split ? "l" : "");
  printf("%-30s %-22s %5s %12s %12s %+7.1f%%\n", MP_CMD_CELL(r->name, name), r->metric, mb,
         fig(pred, sizeof pred, r->predicted), fig(pub, sizeof pub, r->measured), 100.0 * row_error(r));
}

/* A group's summary lines, one per metric with rows (label: "" for all rows). */
static void print_summary(const row *rows, int n, const group *g, const char *label, double *x, double *y) {
  for (int k = 0; k < N_METRICS; k++) {
    const metric_sum s = summarize(rows, n, k_metrics[k], g, x, y);
    if (s.rows == 0) continue;
    char tau[16];
    snprintf(tau, sizeof tau, isnan(s.tau) ? "n/a" : "%.3f", s.tau);
    if (label[0]) printf("%-22s %-22s %5d %7.1f%% %12s\n", label, k_metrics[k], s.rows, 100.0 * s.mape, tau);
    else printf("%-22s %5d %7.1f%% %12s\n", k_metrics[k], s.rows, 100.0 * s.mape, tau);
  }
}

/* Every row's predicted vs published figure, the refusals, then per metric the MAPE and
 * Kendall's tau, over all rows and per group. */
static void print_table(const row *rows, int n, const group *gs, int ng, int n_refused, double *x, double *y) {
  printf("%-30s %-22s %5s %12s %12s %8s\n", "case", "metric", "mb", "predicted", "published", "error");
  for (int i = 0; i < n; i++) print_row(&rows[i]);
  printf("(mb: the micro-batch simulated; * the fastest that fits among the divisors of "
         "local_batch, none being published; s the stack's own pipeline micro-batching, "
         "none being published; c the experts padded to capacity 1, the setting the row's CUDA "
         "graphs capture MoE layers with, none being published; l Megatron's pipeline split with the "
         "embedding and the loss as a layer each, pp x pp_virtual exceeding the layers and no "
         "pp_layout being published)\n");
  for (int i = 0; i < n; i++)
    if (rows[i].refused[0]) {
      char name[sizeof rows->name * 4];
      printf("refused: %s: %s\n", MP_CMD_CELL(rows[i].name, name), rows[i].refused);
    }
  if (n_refused > 0)
    printf("%d of %d rows refused by the simulator's rules (listed above), left out of the summary\n",
           n_refused, n);
  printf("\n%-22s %5s %8s %12s\n", "metric", "rows", "MAPE", "Kendall tau");
  const group all = {0, NULL, 0};
  print_summary(rows, n, &all, "", x, y);
  if (ng > 0) printf("\n%-22s %-22s %5s %8s %12s\n", "group", "metric", "rows", "MAPE", "Kendall tau");
  for (int k = 0; k < ng; k++) print_summary(rows, n, &gs[k], gs[k].key, x, y);
}

static cJSON *row_json(const row *r) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "case", r->name);
  cJSON_AddStringToObject(o, "metric", r->metric);
  cJSON_AddNumberToObject(o, "published", r->measured);
  if (r->refused[0]) {
    cJSON_AddStringToObject(o, "refused", r->refused);
    return o;
  }
  cJSON_AddNumberToObject(o, "micro_batch", (double)r->micro_batch);
  cJSON_AddStringToObject(o, "micro_batch_from", r->picked == 2 ? "stack" : r->picked ? "fastest" : "row");
  if (r->capacity_from_graphs) cJSON_AddStringToObject(o, "moe_capacity_from", "cuda_graphs");
  if (r->layout_from_split) cJSON_AddStringToObject(o, "pp_layout_from", "embedding_loss_split");
  cJSON_AddNumberToObject(o, "predicted", r->predicted);
  cJSON_AddNumberToObject(o, "error", row_error(r));
  return o;
}

/* A group's summary as {metric: {rows, mape, kendall_tau_b}}. */
static cJSON *summary_json(const row *rows, int n, const group *g, double *x, double *y) {
  cJSON *sum = cJSON_CreateObject();
  for (int k = 0; k < N_METRICS && sum; k++) {
    const metric_sum s = summarize(rows, n, k_metrics[k], g, x, y);
    if (s.rows == 0) continue;
    cJSON *m = cJSON_AddObjectToObject(sum, k_metrics[k]);
    cJSON_AddNumberToObject(m, "rows", s.rows);
    cJSON_AddNumberToObject(m, "mape", s.mape);
    if (isnan(s.tau)) cJSON_AddNullToObject(m, "kendall_tau_b");
    else cJSON_AddNumberToObject(m, "kendall_tau_b", s.tau);
  }
  return sum;
}

/* The same as one JSON object: "rows" (case, metric, micro_batch and how it was chosen,
 * predicted, published and the error as a fraction, or the refusal), "refused" (their
 * count), "summary" per metric (rows, MAPE as a fraction, Kendall's tau-b or null) and, with
 * --by, "by" per group; figures at full precision. */
static mp_status print_json(mp_ctx *ctx, const row *rows, int n, const group *gs, int ng, int n_refused,
                            double *x, double *y) {
  cJSON *j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(j, "rows");
  for (int i = 0; i < n && arr; i++) cJSON_AddItemToArray(arr, row_json(&rows[i]));
  cJSON_AddNumberToObject(j, "refused", n_refused);
  const group all = {0, NULL, 0};
  cJSON_AddItemToObject(j, "summary", summary_json(rows, n, &all, x, y));
  cJSON *by = ng > 0 ? cJSON_AddObjectToObject(j, "by") : NULL;
  for (int k = 0; k < ng && by; k++) cJSON_AddItemToObject(by, gs[k].key, summary_json(rows, n, &gs[k], x, y));
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (text == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  printf("%s\n", text);
  cJSON_free(text);
  return MP_OK;
}

/* Prints the rows and the summary (a table, or JSON), per group with --by. Refused rows are
 * listed and counted, not an error: every row that could be simulated is reported. */
static mp_status print_results(mp_ctx *ctx, const row *rows, int n, int json, const char *by) {
  double *x = (double *)calloc((size_t)n + 1, sizeof *x), *y = (double *)calloc((size_t)n + 1, sizeof *y);
  group *gs = (group *)calloc((size_t)n + N_FEATURES + 1, sizeof *gs);
  mp_status st = MP_OK;
  if (x == NULL || y == NULL || gs == NULL) st = mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  if (st == MP_OK) {
    const int ng = groups_of(rows, n, by, gs);
    int n_refused = 0;
    for (int i = 0; i < n; i++) n_refused += rows[i].refused[0] != 0;
    if (json) st = print_json(ctx, rows, n, gs, ng, n_refused, x, y);
    else print_table(rows, n, gs, ng, n_refused, x, y);
  }
  free(x);
  free(y);
  free(gs);
  return st;
}

static int run_validate(mp_ctx *ctx, const mp_cmd_call *call) {
  if (call->n_pos != 1)
    return mp_cmd_fail(ctx, mp_error(ctx, MP_ERR_USAGE, "give one CSV file (see meshplan validate --help)"));
  const char *path = call->pos[0];
  const char *by = mp_args_get(&k_spec, "--by");
  if (by && strcmp(by, "stack") != 0 && strcmp(by, "gpu") != 0 && strcmp(by, "feature") != 0)
    return mp_cmd_fail(ctx, mp_error(ctx, MP_ERR_USAGE, "--by %s: choose stack, gpu or feature", by));
  char *text = NULL;
  size_t len = 0;
  mp_status st = mp_read_file_max(ctx, path, MP_FILE_MAX_CONFIG_BYTES, &text, &len);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  row *rows = (row *)calloc(MP_VCSV_MAX_ROWS, sizeof *rows);
  if (rows == NULL) {
    free(text);
    return mp_cmd_fail(ctx, mp_error(ctx, MP_ERR_NOMEM, "out of memory"));
  }
  int n = 0;
  st = read_rows(ctx, path, text, rows, &n);
  if (st == MP_OK) st = print_results(ctx, rows, n, mp_args_has(&k_spec, "--json"), by);
  free(rows);
  free(text);
  return st != MP_OK ? mp_cmd_fail(ctx, st) : 0;
}

const mp_command mp_command_validate = {&k_spec, "compare predictions with published measurements (CSV)",
                                        run_validate};
