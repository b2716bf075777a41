/* Plan IR: the driver of the five passes (the meta module tree and its stages: plan_tree.c;
 * tiles, per-rank totals and the batch split: plan_tiles.c).
 *
 * mp_plan_create lays out every parameter of the model with its FQN and global shape,
 * replicated on every axis (tp_shape == shape), on a "meta" footing: nothing is
 * allocated but the descriptors. The passes (pass_*.c, one per file) then rewrite
 * placements, tp_shape and the FSDP units in place.
 *
 * Invariants kept by the passes and relied on by the tile functions:
 *   - tp_shape[d] == shape[d] / size of every axis that shards d before FSDP (TP, EP);
 *     the divisions are exact (checked, or the vocab padded, when the pass runs);
 *   - FSDP shards dim 0 of the tp-local tensor over the parameter's fsdp_group with
 *     chunk = ceil(tp_shape[0] / group), group index i holding rows
 *     [i*chunk, min(tp_shape[0], (i+1)*chunk)) (FSDP2's torch.chunk semantics);
 *   - a parameter lives on exactly one pipeline stage (pp_stage).
 * Parameter order is forward order: embeddings, blocks 0..L-1, final norm, output. */
#include "exec/plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/plan_internal.h"
#include "exec/rules.h"

/* ---- pass bookkeeping -------------------------------------------------------------- */

mp_status mp_plan_check_pass(mp_ctx *ctx, const mp_plan *p, unsigned bit) {
  const char *name = mp_pass_name(bit);
  if (p->applied & bit)
    return mp_error(ctx, MP_ERR_ORDER,
                    "%s pass applied twice: each pass runs once, a second %s would rewrite "
                    "tensors it already transformed (shards of shards); build a fresh plan",
                    name, name);
  const unsigned dp = MP_PASS_FSDP | MP_PASS_DDP;
  if ((bit & dp) && (p->applied & dp))
    return mp_error(ctx, MP_ERR_ORDER,
                    "%s after %s: a plan's data parallelism is FSDP (sharded) or DDP (replicated), "
                    "not both; build the plan with one (opts.dp)",
                    name, mp_pass_name(p->applied & dp));
  /* Bits are numbered in the canonical order, so every higher bit is a later pass (FSDP and
   * DDP are the fifth pass both). */
  for (unsigned later = bit << 1; later <= MP_PASS_DDP; later <<= 1)
    if ((p->applied & later) && !((bit & dp) && (later & dp)))
      return mp_error(ctx, MP_ERR_ORDER,
                      "%s applied after %s: passes run in the order TP -> EP -> Float8 -> AC "
                      "-> FSDP, and %s would see modules %s has already rewritten, so its "
                      "result would be wrong; apply %s first",
                      name, mp_pass_name(later), name, mp_pass_name(later), name);
  return MP_OK;
}

void mp_plan_mark_applied(mp_plan *p, unsigned bit) {
  p->applied |= bit;
  if (p->n_passes < 5) p->pass_order[p->n_passes++] = (int)bit;
}

void mp_plan_note(mp_plan *p, const char *fmt, ...) {
  const int cap = (int)(sizeof p->notes / sizeof p->notes[0]);
  if (p->n_notes >= cap) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (p->n_notes == cap - 1) snprintf(buf, sizeof buf, "(further notes dropped)");
  const char *s = mp_arena_strdup(p->arena, buf);
  if (s) p->notes[p->n_notes++] = s;
}

/* The stated stage layouts of two option sets agree (both the default split, or the same
 * counts). */
static int same_pp_layers(const mp_plan_options *a, const mp_plan_options *b) {
  if (a->n_pp_layers != b->n_pp_layers) return 0;
  for (int s = 0; s < a->n_pp_layers; s++)
    if (a->pp_layers[s] != b->pp_layers[s]) return 0;
  return 1;
}

/* Virtual stages per rank as the options give them (1 unless interleaved with pp > 1; ZBV
 * runs exactly 2, as PyTorch's ScheduleZBVZeroBubble requires). */
static int virtual_stages(const mp_mesh *mesh, const mp_plan_options *o) {
  if (mesh->size[MP_DIM_PP] <= 1) return 1;
  if (o->pp_schedule == MP_PP_ZBV) return 2;
  const int looped = o->pp_schedule == MP_PP_INTERLEAVED || o->pp_schedule == MP_PP_INTERLEAVED_ZB;
  return looped && o->pp_virtual > 1 ? o->pp_virtual : 1;
}

int64_t mp_plan_chunk_index(const mp_plan *p, int stage, int chunk) {
  const int pp = p->mesh.size[MP_DIM_PP];
  if (p->opts.pp_schedule == MP_PP_ZBV && pp > 1) return chunk ? 2 * (int64_t)pp - 1 - stage : stage;
  return (int64_t)chunk * pp + stage;
}

int mp_plan_last_stage(const mp_plan *p) {
  return p->opts.pp_schedule == MP_PP_ZBV ? 0 : p->mesh.size[MP_DIM_PP] - 1;
}

/* The stage holding model chunk k: k mod pp, or ZBV's V (mp_plan_chunk_index). */
static int chunk_stage(const mp_plan *p, int64_t k) {
  const int pp = p->mesh.size[MP_DIM_PP];
  if (p->opts.pp_schedule == MP_PP_ZBV && k >= pp) return (int)(2 * (int64_t)pp - 1 - k);
  return (int)(k % pp);
}

int mp_plan_rank_stage(const mp_plan *p, int rank) {
  int c[MP_MESH_NDIMS];
  mp_mesh_coords(&p->mesh, rank, c);
  return c[MP_DIM_PP];
}

int mp_plan_virtual_stages(const mp_plan *p) { return virtual_stages(&p->mesh, &p->opts); }

/* Model chunks over all stages: pp x pp_virtual. */
static int64_t model_chunks(const mp_plan *p) {
  return (int64_t)p->mesh.size[MP_DIM_PP] * virtual_stages(&p->mesh, &p->opts);
}

/* Layers [*l0, *l1) of model chunk k of K over L layers, split as torchtitan splits a
 * pipeline (generate_split_points in parallelisms/pipelining_utils.py at 9dec370, the commit
 * of its Dec 2024 benchmarks): base = L / K layers a chunk, the L mod K left over go one each
 * to the chunks after the first, and the last chunk takes what remains. The first chunk
 * (with the embedding) and the last (with the head and the loss) therefore hold the fewest
 * layers; when K divides L every chunk holds L / K, Megatron-LM's even split. Llama 3.1 405B
 * (126 layers) on pp=8: 15, 16 x 6, 15. */
static void chunk_range(int64_t L, int64_t K, int64_t k, int64_t *l0, int64_t *l1) {
  const int64_t base = L / K, extra = L % K;
  *l0 = k == 0 ? 0 : k * base + (k - 1 < extra ? k - 1 : extra);
  *l1 = k == K - 1 ? L : (k + 1) * base + (k < extra ? k : extra);
}

int mp_plan_layer_stage(const mp_plan *p, int64_t layer) {
  const int64_t L = p->model.n_layers, K = model_chunks(p);
  if (K <= 1) return 0;
  if (p->opts.n_pp_layers > 0) { /* the stated layout: the chunk whose layers hold it, on
                                    stage k mod pp (one count per stage, or per chunk) */
    int64_t end = 0;
    for (int k = 0; k < p->opts.n_pp_layers; k++)
      if (layer < (end += p->opts.pp_layers[k])) return chunk_stage(p, k);
    return chunk_stage(p, p->opts.n_pp_layers - 1);
  }
  if (L < K) return 0;
  const int64_t base = L / K, extra = L % K;
  int64_t k;
  if (layer < base) k = 0;
  else if (layer - base < extra * (base + 1)) k = 1 + (layer - base) / (base + 1);
  else k = 1 + extra + (layer - base - extra * (base + 1)) / base;
  if (k > K - 1) k = K - 1;
  return chunk_stage(p, k);
}

void mp_plan_chunk_layers(const mp_plan *p, int stage, int chunk, int64_t *l0, int64_t *l1) {
  const int64_t L = p->model.n_layers, K = model_chunks(p);
  const int64_t k = mp_plan_chunk_index(p, stage, chunk);
  if (K <= 1) {
    *l0 = 0, *l1 = L;
    return;
  }
  if (p->opts.n_pp_layers == K) { /* the stated layout, one count per model chunk */
    *l0 = 0;
    for (int64_t j = 0; j < k; j++) *l0 += p->opts.pp_layers[j];
    *l1 = *l0 + p->opts.pp_layers[k];
    return;
  }
  if (L < K || k >= K) {
    *l0 = *l1 = L;
    return;
  }
  chunk_range(L, K, k, l0, l1);
}

/* ---- options (the meta tree: plan_tree.c) ------------------------------------------ */

const mp_param *mp_plan_param_source(const mp_plan *p, int i) {
  const mp_param *q = &p->params[i];
  if (!q->tied_copy) return q;
  for (int k = 0; k < p->n_params; k++)
    if (p->params[k].module == MP_MOD_TOK_EMBEDDINGS && p->params[k].role == MP_ROLE_WEIGHT && !p->params[k].tied_copy)
      return &p->params[k];
  return q;
}

int mp_fp8_gemm_any_layout(int cc) { return (cc >= 100 && cc < 120) || cc >= 130; }

int mp_fp8_te_copies_per_elem(mp_fp8_recipe r, int cc, int param_gather) {
  if (r == MP_FP8_NVFP4) return 1; /* a row-wise and a column-wise copy, half a byte each */
  const int per_tensor = r == MP_FP8_DELAYED || r == MP_FP8_TENSORWISE;
  const int copies = per_tensor && mp_fp8_gemm_any_layout(cc) ? 1 : 2;
  return param_gather ? copies - 1 : copies;
}

int mp_fp8_te_copy_per_step(mp_fp8_recipe r, int param_gather) { return param_gather && r == MP_FP8_BLOCKWISE; }

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

int64_t mp_fp8_te_scale_bytes(mp_fp8_recipe r, int rowwise, int block_2d, int64_t rows, int64_t cols) {
  switch (r) {
    case MP_FP8_MXFP8:
      return rowwise ? round_up(rows, 128) * round_up(cols / 32, 4) : round_up(ceil_div(rows, 32), 4) * round_up(cols, 128);
    case MP_FP8_NVFP4:
      return rowwise ? round_up(rows, 128) * round_up(ceil_div(cols, 16), 4)
                     : round_up(cols, 128) * round_up(ceil_div(rows, 16), 4);
    case MP_FP8_BLOCKWISE:
      if (block_2d)
        return rowwise ? 4 * ceil_div(rows, 128) * round_up(ceil_div(cols, 128), 4)
                       : 4 * ceil_div(cols, 128) * round_up(ceil_div(rows, 128), 4);
      return rowwise ? 4 * ceil_div(cols, 128) * round_up(rows, 4) : 4 * ceil_div(rows, 128) * round_up(cols, 4);
    default: return 0;
  }
}

int64_t mp_fp8_te_weight_copy_bytes(mp_fp8_recipe r, int cc, int param_gather, int64_t rows, int64_t cols) {
  const int64_t data = (int64_t)mp_fp8_te_copies_per_elem(r, cc, param_gather) * rows * cols;
  if (r == MP_FP8_MXFP8)
    return data + mp_fp8_te_scale_bytes(r, 1, 0, rows, cols) + mp_fp8_te_scale_bytes(r, 0, 0, rows, cols);
  if (r == MP_FP8_NVFP4) /* both usages' scales and two fp32 amaxes */
    return data + mp_fp8_te_scale_bytes(r, 1, 0, rows, cols) + mp_fp8_te_scale_bytes(r, 0, 0, rows, cols) + 8;
  if (r == MP_FP8_BLOCKWISE) /* the column-wise copy's scales, and the row-wise workspace's without param_gather */
    return data + mp_fp8_te_scale_bytes(r, 0, 1, rows, cols) + (param_gather ? 0 : mp_fp8_te_scale_bytes(r, 1, 1, rows, cols));
  /* per-tensor: the workspace's scale_inv (an fp32); a float8 weight's transpose shares its own */
  return data + (param_gather ? 0 : 4);
}

void mp_plan_options_init(mp_plan_options *o) {
  memset(o, 0, sizeof *o);
  o->tp.shard_logits = 1; /* loss parallel: logits stay vocab-sharded (torchtitan default) */
  o->tp.pad_vocab = 0;
  o->fp8 = 0;
  o->fp8_opts.all_gather = 0;
  o->ac = MP_AC_NONE;
  o->ac_every = 1;
  o->sp = -1; /* resolved by mp_plan_create: on with tp > 1 where the runtime runs it */
  o->attn = MP_ATTN_FLASH;
  o->loss = MP_LOSS_EAGER;
  o->fsdp.reshard_after_forward = 1;
  o->fsdp.per_block = 0;
  o->fsdp.param_dtype = MP_DTYPE_BF16;
  o->fsdp.reduce_dtype = MP_DTYPE_FP32;
  o->pp_schedule = MP_PP_1F1B;
  o->pp_virtual = 1;
  o->cp_rotate = MP_CP_ROTATE_ALLGATHER;
  o->seq = 0;          /* resolved by mp_plan_create */
  o->micro_batch = 1;
  o->global_batch = 0; /* resolved by mp_plan_create */
  o->master_dtype = MP_DTYPE_FP32;
  o->mem_model = MP_MEM_MODEL_TORCHTITAN;
  o->dp = MP_DP_AUTO; /* resolved by mp_plan_create: DDP under the megatron memory model */
}

/* The data parallelism the options ask for, MP_DP_AUTO resolved: Megatron-LM's memory is
 * its DDP's, or Megatron FSDP's where the mesh shards over dp_shard; every other memory
 * model's runtime shards with FSDP. */
int mp_plan_megatron_fsdp(const mp_plan_options *o, const mp_mesh *mesh) {
  return o->mem_model == MP_MEM_MODEL_MEGATRON && mesh->size[MP_DIM_DP_SHARD] > 1;
}

static mp_dp_kind dp_of(const mp_plan_options *o, const mp_mesh *mesh) {
  if (mp_plan_megatron_fsdp(o, mesh)) return MP_DP_FSDP;
  if (o->dp != MP_DP_AUTO) return o->dp;
  return o->mem_model == MP_MEM_MODEL_MEGATRON ? MP_DP_DDP : MP_DP_FSDP;
}

/* The mesh's dopt: Megatron-LM's DDP with --use-distributed-optimizer (its assert). */
static mp_status dopt_check(mp_ctx *ctx, const mp_mesh *mesh, const mp_plan_options *o, mp_dp_kind dp) {
  if (mp_mesh_dopt(mesh) <= 1 || (dp == MP_DP_DDP && o->ddp.shard_optimizer)) return MP_OK;
  return mp_error(ctx, MP_ERR_INVALID, "dopt=%d: distributed-optimizer instances are Megatron-LM's DDP with "
                  "--use-distributed-optimizer; this plan runs %s: drop dopt", mesh->dopt,
                  dp != MP_DP_DDP ? "FSDP" : "DDP without the distributed optimizer");
}

/* Megatron FSDP's rules (megatron/training/arguments.py and docs/source/api-guide/
 * custom_fsdp.md, core_v0.14.0): the strategies that shard no weights are the DDP and
 * distributed optimizer the megatron memory model runs on dp_replicate; optim_grads (the
 * weights replicated, the gradients reduce-scattered each micro-batch) is not modelled; its
 * hybrid mode (--num-distributed-optimizer-instances) is dp_replicate, the outer group its
 * default outer_dp_sharding_strategy no_shard replicates over; the distributed optimizer is
 * its optimizer. */
static mp_status megatron_fsdp_check(mp_ctx *ctx, const mp_mesh *mesh, const mp_plan_options *o) {
  const int d = mesh->size[MP_DIM_DP_SHARD];
  if ((unsigned)o->mfsdp_strategy >= MP_MFSDP_COUNT)
    return mp_error(ctx, MP_ERR_INVALID, "unknown Megatron FSDP sharding strategy %d; choose optim_grads_params",
                    (int)o->mfsdp_strategy);
  if (o->mfsdp_strategy == MP_MFSDP_NO_SHARD || o->mfsdp_strategy == MP_MFSDP_OPTIM)
    return mp_error(ctx, MP_ERR_INVALID,
                    "Megatron FSDP's %s shards %s, as Megatron's DDP%s does: use dp_replicate=%d "
                    "instead of dp_shard=%d, or optim_grads_params",
                    mp_mfsdp_strategy_name(o->mfsdp_strategy),
                    o->mfsdp_strategy == MP_MFSDP_OPTIM ? "only the fp32 main weights and Adam state" : "nothing",
                    o->mfsdp_strategy == MP_MFSDP_OPTIM ? " with --use-distributed-optimizer" : "",
                    mesh->size[MP_DIM_DP_REPLICATE] * d, d);
  if (o->mfsdp_strategy == MP_MFSDP_OPTIM_GRADS)
    return mp_error(ctx, MP_ERR_INVALID,
                    "Megatron FSDP's optim_grads (16-bit weights replicated, fp32 gradients "
                    "reduce-scattered every micro-batch) is not modelled: choose optim_grads_params, "
                    "or dp_replicate=%d with the distributed optimizer", mesh->size[MP_DIM_DP_REPLICATE] * d);
  if (!mp_rule_mfsdp_experts_ok(mesh))
    return mp_error(ctx, MP_ERR_INVALID,
                    "dp_replicate=%d with dp_shard=%d and ep=%d: Megatron FSDP's hybrid sharding of "
                    "routed experts (their inter-instance groups) is not modelled: use ep=1 or "
                    "dp_replicate=1", mesh->size[MP_DIM_DP_REPLICATE], d, mesh->ep);
  if (!o->fsdp.reshard_after_forward)
    return mp_error(ctx, MP_ERR_INVALID,
                    "Megatron FSDP releases each layer's gathered weights after its forward "
                    "(megatron_fsdp.py, _post_forward): drop reshard off (--no-reshard)");
  if (!o->ddp.shard_optimizer)
    return mp_error(ctx, MP_ERR_INVALID,
                    "Megatron FSDP steps its shards with the distributed optimizer "
                    "(--use-distributed-optimizer, custom_fsdp.md): turn it on, or use "
                    "dp_replicate=%d instead of dp_shard=%d", d, d);
  return MP_OK;
}

static mp_status validate_model(mp_ctx *ctx, const mp_model *m) {
  MP_CHECK(mp_model_validate(ctx, m, m->name));
  if (m->n_layers > MP_MAX_LAYERS)
    return mp_error(ctx, MP_ERR_INVALID, "%s has %lld layers; at most %d are supported", m->name,
                    (long long)m->n_layers, MP_MAX_LAYERS);
  return MP_OK;
}

/* The MoE dispatcher's runtime, and Megatron-Core's conditions on
 * --overlap-moe-expert-parallel-comm (TransformerConfig's
 * __post_init__, core_v0.14): expert parallelism, virtual pipeline stages when pp > 1 (its
 * combined 1F1B exists for no pipelining and for the interleaved schedule only), no full
 * recompute (nor a recompute method or layer count). */
static mp_status moe_overlap_check(mp_ctx *ctx, const mp_mesh *mesh, const mp_plan_options *o) {
  if ((unsigned)o->moe_dispatcher > MP_MOE_DISPATCH_HYBRIDEP)
    return mp_error(ctx, MP_ERR_INVALID, "unknown MoE dispatcher %d; choose alltoall, deepep or hybridep",
                    (int)o->moe_dispatcher);
  if (mp_moe_dispatch_by_node(o->moe_dispatcher) && (o->mem_model != MP_MEM_MODEL_MEGATRON || mesh->ep <= 1))
    return mp_error(ctx, MP_ERR_INVALID,
                    "MoE dispatcher %s is Megatron-Core's flex dispatcher with %s, which needs expert "
                    "parallelism; here the %s memory model with ep=%d: use stack megatron-core with ep > 1 "
                    "or the alltoall dispatcher",
                    o->moe_dispatcher == MP_MOE_DISPATCH_DEEPEP ? "deepep" : "hybridep",
                    o->moe_dispatcher == MP_MOE_DISPATCH_DEEPEP ? "DeepEP (--moe-enable-deepep)"
                                                                : "HybridEP (--moe-flex-dispatcher-backend hybridep)",
                    mp_mem_model_name(o->mem_model), mesh->ep);
  if (o->moe_fp8_dispatch && (mesh->ep <= 1 || !o->fp8))
    return mp_error(ctx, MP_ERR_INVALID,
                    "float8 dispatch sends the experts' float8 inputs over the EP all-to-all "
                    "(DeepSeek-V3 sec. 3.3.3); here ep=%d, fp8 %s: it needs ep > 1 and float8 "
                    "Linears (--fp8), or drop it", mesh->ep, o->fp8 ? "on" : "off");
  if (!o->moe_a2a_overlap) return MP_OK;
  if (o->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID,
                    "MoE all-to-all overlap is Megatron-Core's --overlap-moe-expert-parallel-comm; "
                    "the %s memory model does not run it: use stack megatron-core or drop it",
                    mp_mem_model_name(o->mem_model));
  if (mesh->ep <= 1)
    return mp_error(ctx, MP_ERR_INVALID, "MoE all-to-all overlap needs expert parallelism (ep > 1; "
                    "Megatron-Core asserts expert_model_parallel_size > 1): set ep or drop it");
  if (mesh->size[MP_DIM_PP] > 1 && !(o->pp_schedule == MP_PP_INTERLEAVED && o->pp_virtual > 1))
    return mp_error(ctx, MP_ERR_INVALID,
                    "MoE all-to-all overlap with pp=%d needs the interleaved schedule (Megatron-Core "
                    "requires virtual_pipeline_model_parallel_size when pp > 1): use --pp-schedule "
                    "interleaved or drop it", mesh->size[MP_DIM_PP]);
  if (o->ac == MP_AC_FULL)
    return mp_error(ctx, MP_ERR_INVALID,
                    "MoE all-to-all overlap refuses full recompute (Megatron-Core: disable full "
                    "recomputation when enabling overlap_moe_expert_parallel_comm): choose a "
                    "selective AC policy or none");
  return MP_OK;
}

/* The options' own rules and those of the memory model (the runtime a plan is for). */
static mp_status validate_options(mp_ctx *ctx, const mp_mesh *mesh, const mp_plan_options *o) {
  if ((unsigned)o->ac >= MP_AC_COUNT || o->ac_every < 0 || o->ac_every > MP_MAX_LAYERS)
    return mp_error(ctx, MP_ERR_INVALID,
                    "unknown activation checkpointing policy %d (every %d); choose none, "
                    "selective, selective-op, selective-core, full or full:N",
                    (int)o->ac, o->ac_every);
  if ((unsigned)o->mem_model >= MP_MEM_MODEL_COUNT)
    return mp_error(ctx, MP_ERR_INVALID, "unknown memory model %d; choose torchtitan, "
                    "meshplan-cpu, meshplan-cuda or megatron", (int)o->mem_model);
  if ((unsigned)o->attn > MP_ATTN_MATERIALIZED || (unsigned)o->loss > MP_LOSS_TE || o->sp < -1 || o->sp > 1)
    return mp_error(ctx, MP_ERR_INVALID, "attention kind %d, loss kind %d or sp=%d out of range",
                    (int)o->attn, (int)o->loss, o->sp);
  if (o->tp_comm_fused && mp_mem_model_is_runtime(o->mem_model))
    return mp_error(ctx, MP_ERR_INVALID,
                    "TP comm fused with its GEMMs (torchtitan's AsyncTP with torch.compile, "
                    "Megatron-Core's --tp-comm-overlap): the %s memory model does not run it: "
                    "drop tp_comm_fused",
                    mp_mem_model_name(o->mem_model));
  MP_CHECK(moe_overlap_check(ctx, mesh, o));
  MP_CHECK(mp_plan_storage_check(ctx, o));
  MP_CHECK(mp_plan_loss_check(ctx, mesh, o));
  if (o->cp_wait_at_issue && o->mem_model != MP_MEM_MODEL_TORCHTITAN)
    return mp_error(ctx, MP_ERR_INVALID,
                    "cp_wait_at_issue is torchtitan's compiled ring (collectives waited where "
                    "issued); the %s memory model runs its own: drop cp_wait_at_issue",
                    mp_mem_model_name(o->mem_model));
  const mp_dp_kind dp = dp_of(o, mesh);
  if ((unsigned)dp > MP_DP_DDP)
    return mp_error(ctx, MP_ERR_INVALID, "unknown data parallelism %d; choose FSDP or DDP", (int)o->dp);
  const int mfsdp = o->mem_model == MP_MEM_MODEL_MEGATRON && dp == MP_DP_FSDP;
  if (mfsdp) MP_CHECK(megatron_fsdp_check(ctx, mesh, o));
  MP_CHECK(dopt_check(ctx, mesh, o, dp));
  if (dp != MP_DP_DDP && !mfsdp && (o->ddp.shard_optimizer || o->ddp.overlap))
    return mp_error(ctx, MP_ERR_INVALID,
                    "the sharded optimizer and overlapped buckets are DDP's (Megatron-LM's "
                    "--use-distributed-optimizer, --overlap-grad-reduce); FSDP shards its "
                    "optimizer state with the parameters: drop them or use DDP");
  if (!mfsdp && (o->mem_model == MP_MEM_MODEL_MEGATRON) != (dp == MP_DP_DDP))
    return mp_error(ctx, MP_ERR_INVALID,
                    "the %s memory model's data parallelism is %s (%s); %s is not its own",
                    mp_mem_model_name(o->mem_model), dp == MP_DP_DDP ? "FSDP" : "DDP",
                    o->mem_model == MP_MEM_MODEL_MEGATRON ? "Megatron-LM's DDP, parameters replicated"
                                                          : "sharded parameters",
                    dp == MP_DP_DDP ? "DDP" : "FSDP");
  if (o->mem_model == MP_MEM_MODEL_MEGATRON) {
    if (mesh->size[MP_DIM_CP] > 1 && o->cp_rotate != MP_CP_ROTATE_ALLTOALL)
      return mp_error(ctx, MP_ERR_INVALID,
                      "cp_rotate %s: Megatron-LM's context parallelism (Transformer Engine's "
                      "p2p ring) sends K and V to the next rank before every step; use "
                      "alltoall", mp_cp_rotate_name(o->cp_rotate));
    if (o->ac == MP_AC_SELECTIVE || o->ac == MP_AC_SELECTIVE_OP)
      return mp_error(ctx, MP_ERR_INVALID,
                      "AC %s: Megatron-LM recomputes the core attention (selective-core) or "
                      "whole blocks (full, full:N); choose one of those or none",
                      mp_ac_mode_name(o->ac));
  }
  if (!mp_mem_model_is_runtime(o->mem_model)) return MP_OK;
  /* The meshplan runtime executes what its memory models describe, nothing more. */
  const char *mm = mp_mem_model_name(o->mem_model);
  if (o->ac == MP_AC_SELECTIVE || o->ac == MP_AC_SELECTIVE_OP || (o->ac == MP_AC_FULL && o->ac_every > 1)) {
    char ac[32];
    mp_ac_format(o->ac, o->ac_every, ac, sizeof ac);
    return mp_error(ctx, MP_ERR_INVALID,
                    "AC %s: the meshplan runtime (%s) recomputes the attention core "
                    "(selective-core) or whole blocks (full) only; choose none, selective-core or "
                    "full",
                    ac, mm);
  }
  if (o->attn != MP_ATTN_FLASH)
    return mp_error(ctx, MP_ERR_INVALID,
                    "the meshplan runtime (%s) runs flash-style attention only; materialized "
                    "attention scores are Megatron-LM's",
                    mm);
  return MP_OK;
}

/* An explicit layout (o->pp_layers): one count per stage (one model chunk a stage), or
 * under the interleaved schedule one per model chunk in model order (chunk c of stage s is
 * k = c x pp + s), as Megatron-LM's --pipeline-model-parallel-layout states one (its
 * "Et*3|(tt|)*29,m|L": stages split by '|', listed virtual stage by virtual stage). The
 * counts sum to the model's layers; a chunk may hold none only where it still runs
 * something: the first (the embedding alone, Megatron's "E|") and the last (the head and the
 * loss alone, "|L"), as Llama 3 405B's pipeline ran (Dubey et al. 2024, sec. 3.3.2). */
static mp_status check_pp_layers(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh, const mp_plan_options *o) {
  if (o->n_pp_layers == 0) return MP_OK;
  const int pp = mesh->size[MP_DIM_PP], v = virtual_stages(mesh, o), K = pp * v;
  if ((o->n_pp_layers != pp && o->n_pp_layers != K) || o->n_pp_layers > MP_PP_MAX_LAYOUT)
    return mp_error(ctx, MP_ERR_INVALID,
                    "pp_layers names %d stages but the mesh has pp=%d%s; give one layer count per stage "
                    "or, interleaved, one per model chunk (pp x pp_virtual = %d; at most %d)",
                    o->n_pp_layers, pp, v > 1 ? " with pp_virtual chunks each" : "", K, MP_PP_MAX_LAYOUT);
  if (v > 1 && o->n_pp_layers != K)
    return mp_error(ctx, MP_ERR_INVALID,
                    "pp_layers gives %d counts, one per stage; the interleaved schedule runs %d chunks a "
                    "stage: give %d counts, one per model chunk in model order, or use 1f1b or gpipe",
                    o->n_pp_layers, v, K);
  int64_t sum = 0;
  for (int k = 0; k < o->n_pp_layers; k++) {
    const int ends = k == 0 || k == o->n_pp_layers - 1;
    if (o->pp_layers[k] < (ends ? 0 : 1))
      return mp_error(ctx, MP_ERR_INVALID, "pp_layers: %s %d has %d layers; a %s needs at least one (only "
                      "the first, with the embedding, and the last, with the loss, may hold none)",
                      v > 1 ? "model chunk" : "stage", k, o->pp_layers[k], v > 1 ? "chunk" : "stage");
    sum += o->pp_layers[k];
  }
  if (sum != m->n_layers)
    return mp_error(ctx, MP_ERR_INVALID,
                    "pp_layers sum to %lld layers but %s has %lld; make the counts add up to %lld",
                    (long long)sum, m->name, (long long)m->n_layers, (long long)m->n_layers);
  if (o->pp_mtp_stated && o->pp_mtp != m->mtp_layers) /* Megatron-Core's validate_layer_layout */
    return mp_error(ctx, MP_ERR_INVALID, "the pipeline layout names %d MTP layers (m) but %s has %lld; make "
                    "them match (--mtp-num-layers)", o->pp_mtp, m->name, (long long)m->mtp_layers);
  return MP_OK;
}

/* Megatron-Core's recompute modules against the model and the options (transformer_config.py
 * __post_init__ and transformer_layer.py, core_v0.14): a module the model does not have is
 * refused by name rather than left a no-op (Megatron builds `mlp` only into dense layers,
 * transformer_layer.py recompute_mlp, and `moe` only into MoE layers). */
static mp_status check_recompute_modules(mp_ctx *ctx, const mp_model *m, const mp_plan_options *o) {
  const uint32_t rc = o->recompute_modules;
  if (rc && mp_mem_model_is_runtime(o->mem_model))
    return mp_error(ctx, MP_ERR_INVALID, "recompute modules are Megatron-Core's; the %s memory model (the "
                    "meshplan runtime) does not run them: drop them or use a megatron or torchtitan stack",
                    mp_mem_model_name(o->mem_model));
  if (rc && o->ac != MP_AC_NONE && o->ac != MP_AC_SELECTIVE_CORE)
    return mp_error(ctx, MP_ERR_INVALID,
                    "recompute modules run beside AC none or selective-core (Megatron-Core's selective "
                    "granularity); AC %s recomputes on its own: drop one", mp_ac_mode_name(o->ac));
  if ((rc & (1u << MP_RC_MLA_UP_PROJ)) && !mp_model_is_mla(m))
    return mp_error(ctx, MP_ERR_INVALID, "recompute module mla_up_proj: model %s has no multi-head latent "
                    "attention; drop it", m->name);
  /* Megatron-Core refuses them under delayed scaling (transformer_config.py: "Delayed scaling
   * does not support moe_act and layernorm recompute for fp8"); mlp, moe and shared_experts run
   * under te_checkpoint with any recipe */
  if (o->fp8 && (rc & ((1u << MP_RC_LAYERNORM) | (1u << MP_RC_MOE_ACT))) &&
      mp_fp8_recipe_of(o->fp8_opts.recipe, o->mem_model) == MP_FP8_DELAYED)
    return mp_error(ctx, MP_ERR_INVALID, "recompute modules layernorm and moe_act under float8 need current or "
                    "blockwise scaling: Megatron-Core refuses them with delayed scaling; choose --fp8 current or "
                    "blockwise, or drop them");
  const uint32_t moe_only = (1u << MP_RC_MOE_ACT) | (1u << MP_RC_MOE) | (1u << MP_RC_SHARED_EXPERTS);
  for (int k = MP_RC_MOE_ACT; k < MP_RC_COUNT; k++)
    if ((rc & moe_only & (1u << k)) && !mp_model_is_moe(m)) {
      char name[32];
      mp_recompute_modules_format(1u << k, name, sizeof name);
      return mp_error(ctx, MP_ERR_INVALID, "recompute module %s: model %s has no routed experts; drop it", name,
                      m->name);
    }
  if ((rc & (1u << MP_RC_SHARED_EXPERTS)) && m->n_shared_experts == 0)
    return mp_error(ctx, MP_ERR_INVALID, "recompute module shared_experts: model %s has no shared experts; drop it",
                    m->name);
  if ((rc & (1u << MP_RC_MLP)) && mp_model_n_moe_layers(m) == m->n_layers)
    return mp_error(ctx, MP_ERR_INVALID, "recompute module mlp: every layer of %s is a MoE layer, whose MLP "
                    "Megatron-Core checkpoints as `moe` (transformer_layer.py); drop it or name moe", m->name);
  /* the EP overlap runs the MoE layer's parts itself (models/gpt/fine_grained_callables.py calls
   * router_and_preprocess and experts_compute), never MoELayer.forward's checkpoint */
  if ((rc & (1u << MP_RC_MOE)) && o->moe_a2a_overlap)
    return mp_error(ctx, MP_ERR_INVALID, "recompute module moe: Megatron-Core's EP all-to-all overlap "
                    "(--overlap-moe-expert-parallel-comm) runs the MoE layer's parts outside its checkpoint; "
                    "drop one");
  return MP_OK;
}

/* The pipeline schedule's own rules: chunks a stage, DualPipe's even pp, what ZBV cannot
 * place. */
static mp_status check_pp_schedule(mp_ctx *ctx, const mp_model *m, int pp, const mp_plan_options *o) {
  if (o->pp_virtual > 1 && o->pp_schedule != MP_PP_INTERLEAVED && o->pp_schedule != MP_PP_INTERLEAVED_ZB &&
      !(o->pp_schedule == MP_PP_ZBV && o->pp_virtual == 2))
    return mp_error(ctx, MP_ERR_INVALID,
                    "pp_virtual=%d: several model chunks per stage need an interleaved schedule (ZBV runs "
                    "exactly 2); choose --pp-schedule interleaved or interleaved_zb, or pp_virtual 1",
                    o->pp_virtual);
  if (o->pp_schedule == MP_PP_ZBV && pp > 1 && (m->tied_embeddings || m->mtp_layers > 0))
    return mp_error(ctx, MP_ERR_INVALID,
                    "ZBV with pp=%d: %s's %s would sit on rank 0 beside the embedding (the V holds the "
                    "first and the last model stage there); meshplan does not place it: choose another "
                    "schedule", pp, m->name, m->tied_embeddings ? "tied output head" : "multi-token-prediction modules");
  if (o->pp_schedule == MP_PP_DUALPIPE && pp > 1 && pp % 2)
    return mp_error(ctx, MP_ERR_INVALID,
                    "DualPipe with pp=%d: its two directions meet in the middle, which needs an even "
                    "number of stages (deepseek-ai/DualPipe asserts num_ranks %% 2 == 0); choose an "
                    "even pp or another schedule", pp);
  return MP_OK;
}

/* The model x mesh x options rules (the model itself already validated). */
static mp_status validate_mesh(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                               const mp_plan_options *o) {
  MP_CHECK(mp_mesh_validate(ctx, mesh));
  int pp = mesh->size[MP_DIM_PP], cp = mesh->size[MP_DIM_CP];
  MP_CHECK(mp_rule_experts_check(ctx, m, mesh));
  MP_CHECK(mp_rule_etp_check(ctx, mesh, o));
  MP_CHECK(mp_rule_moe_routing_check(ctx, m, mesh, o));
  MP_CHECK(mp_rule_cp_comm_check(ctx, m, mesh, o));
  MP_CHECK(mp_rule_cuda_graphs_check(ctx, m, o));
  MP_CHECK(mp_rule_cpu_offload_check(ctx, m, mesh, o));
  if (pp > m->n_layers)
    return mp_error(ctx, MP_ERR_INVALID,
                    "pp=%d exceeds the %lld layers of %s; a stage needs at least one layer", pp,
                    (long long)m->n_layers, m->name);
  MP_CHECK(check_pp_schedule(ctx, m, mesh->size[MP_DIM_PP], o));
  if (m->mtp_layers > 0 && mp_mem_model_is_runtime(o->mem_model))
    return mp_error(ctx, MP_ERR_INVALID, "%s's %lld multi-token-prediction module(s) are not built in the meshplan "
                    "runtime (the %s memory model): plan with --mtp-num-layers 0, or a torchtitan or megatron stack",
                    m->name, (long long)m->mtp_layers, mp_mem_model_name(o->mem_model));
  MP_CHECK(check_recompute_modules(ctx, m, o));
  if (o->pp_virtual > MP_PP_MAX_VIRTUAL)
    return mp_error(ctx, MP_ERR_INVALID, "pp_virtual=%d: at most %d model chunks per stage",
                    o->pp_virtual, MP_PP_MAX_VIRTUAL);
  MP_CHECK(check_pp_layers(ctx, m, mesh, o));
  if (pp > 1) {
    const int v = virtual_stages(mesh, o);
    const int64_t K = (int64_t)pp * v;
    if (o->n_pp_layers == 0 && !mp_rule_pp_chunks_ok(m->n_layers, pp, v))
      return mp_error(ctx, MP_ERR_INVALID,
                      "pp=%d x pp_virtual=%d makes %lld model chunks for the %lld layers of %s; "
                      "a chunk needs at least one layer: choose pp x pp_virtual <= %lld, or state the "
                      "chunks with the embedding and the loss as chunks of their own (--pp-layout, "
                      "validate's pp_layout: Megatron-LM's --pipeline-model-parallel-layout, e.g. "
                      "\"E|(t|)*%lldL\" for %lld chunks)",
                      pp, v, (long long)K, (long long)m->n_layers, m->name,
                      (long long)m->n_layers, (long long)m->n_layers, (long long)m->n_layers + 2);
  }
  if (o->seq > 0 && o->seq % cp != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "cp=%d does not divide seq=%lld; context parallelism splits each sequence "
                    "evenly over cp ranks: choose seq a multiple of %d",
                    cp, (long long)o->seq, cp);
  if (o->seq > 0 && m->family == MP_FAMILY_GPT && o->seq > m->max_seq)
    return mp_error(ctx, MP_ERR_INVALID,
                    "seq=%lld exceeds the %lld learned positions of %s; choose seq <= %lld",
                    (long long)o->seq, (long long)m->max_seq, m->name, (long long)m->max_seq);
  if (o->micro_batch < 1)
    return mp_error(ctx, MP_ERR_INVALID, "micro_batch=%lld must be at least 1",
                    (long long)o->micro_batch);
  if (o->global_batch < 0 || o->seq < 0)
    return mp_error(ctx, MP_ERR_INVALID, "seq and global_batch must not be negative");
  if (o->pp_virtual < 1)
    return mp_error(ctx, MP_ERR_INVALID, "pp_virtual=%d must be at least 1", o->pp_virtual);
  return validate_options(ctx, mesh, o);
}

/* The plan header: copies, resolved defaults, checks that need the resolved seq. The plan
 * is allocated in `arena`; params are left to the caller. */
static mp_status plan_init(mp_ctx *ctx, mp_arena *arena, const mp_model *m, const mp_mesh *mesh,
                           const mp_plan_options *opts, mp_plan **out) {
  mp_plan *p = mp_arena_alloc(arena, sizeof *p);
  if (p == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating the plan");
  p->arena = arena;
  p->model = *m;
  p->mesh = *mesh;
  p->opts = *opts;
  if (p->opts.seq == 0) p->opts.seq = m->max_seq < 8192 ? m->max_seq : 8192;
  if (p->opts.seq % mesh->size[MP_DIM_CP] != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "cp=%d does not divide the default seq=%lld of %s; give seq a "
                    "multiple of %d",
                    mesh->size[MP_DIM_CP], (long long)p->opts.seq, m->name,
                    mesh->size[MP_DIM_CP]);
  /* the step's sizes within common/limits.h, so every size formed from them fits */
  MP_CHECK(mp_model_check_step(ctx, m, p->opts.seq, p->opts.micro_batch, p->opts.global_batch));
  if (p->opts.global_batch == 0) {
    p->opts.global_batch = p->opts.micro_batch * mesh->size[MP_DIM_DP_REPLICATE] *
                           mesh->size[MP_DIM_DP_SHARD];
    MP_CHECK(mp_model_check_step(ctx, m, p->opts.seq, p->opts.micro_batch, p->opts.global_batch));
  }
  /* SP is the TP form torchtitan, Megatron-LM and the meshplan runtime run by default; the
   * runtime runs its float8 Linears without it (exec/runtime/check.c) */
  if (p->opts.sp < 0) p->opts.sp = !(mp_mem_model_is_runtime(p->opts.mem_model) && p->opts.fp8);
  if (mesh->size[MP_DIM_TP] == 1) p->opts.sp = 0;
  if (p->opts.ac_every < 1 || p->opts.ac != MP_AC_FULL) p->opts.ac_every = 1;
  p->opts.dp = dp_of(&p->opts, mesh);
  p->opts.pp_mtp = (int)m->mtp_layers; /* what a written layout states */
  p->vocab_padded = m->vocab;
  p->ac = MP_AC_NONE;
  const int64_t K = model_chunks(p);
  p->layers_per_chunk = (int)((m->n_layers + K - 1) / K);
  for (int st = 0; st < p->opts.n_pp_layers; st++)
    if (st == 0 || p->opts.pp_layers[st] > p->layers_per_chunk) p->layers_per_chunk = p->opts.pp_layers[st];
  p->layers_per_stage = 0;
  for (int st = 0; st < mesh->size[MP_DIM_PP]; st++) {
    int64_t n = 0;
    for (int c = 0; c < virtual_stages(mesh, &p->opts); c++) {
      int64_t l0, l1;
      mp_plan_chunk_layers(p, st, c, &l0, &l1);
      n += l1 - l0;
    }
    if (n > p->layers_per_stage) p->layers_per_stage = (int)n;
  }
  *out = p;
  return MP_OK;
}

mp_status mp_plan_create(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                         const mp_plan_options *opts, mp_plan **out) {
  *out = NULL;
  mp_plan_options defaults;
  if (opts == NULL) {
    mp_plan_options_init(&defaults);
    opts = &defaults;
  }
  MP_CHECK(validate_model(ctx, m));
  MP_CHECK(validate_mesh(ctx, m, mesh, opts));

  mp_arena *arena = mp_arena_create();
  MP_CHECK_ALLOC(ctx, arena);
  mp_plan *p = NULL;
  mp_status st = plan_init(ctx, arena, m, mesh, opts, &p);
  if (st != MP_OK) {
    mp_arena_destroy(arena);
    return st;
  }
  if (mp_plan_tree_build(arena, m, &p->params, &p->n_params) != 0) {
    mp_arena_destroy(arena);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory building the module tree of %s", m->name);
  }
  mp_plan_tree_add_tied_copy(p);
  mp_plan_tree_set_stages(p);
  *out = p;
  return MP_OK;
}

void mp_plan_destroy(mp_plan *p) {
  if (p == NULL || p->arena_borrowed) return;
  mp_arena_destroy(p->arena); /* the plan itself lives in its arena */
}

/* The five passes in order, from options (shared by both builders). */
static mp_status run_passes(mp_ctx *ctx, mp_plan *p, const mp_plan_options *opts) {
  const mp_mesh *mesh = &p->mesh;
  if (mesh->size[MP_DIM_TP] > 1) MP_CHECK(mp_apply_tensor_parallel(ctx, p, &opts->tp));
  if (mesh->ep > 1 || mesh->etp > 1) MP_CHECK(mp_apply_expert_parallel(ctx, p));
  if (opts->fp8) MP_CHECK(mp_apply_float8(ctx, p, &opts->fp8_opts));
  MP_CHECK(mp_apply_ac(ctx, p, opts->ac));
  if (p->opts.dp == MP_DP_DDP) MP_CHECK(mp_apply_ddp(ctx, p, &opts->ddp));
  else MP_CHECK(mp_apply_fsdp(ctx, p, &opts->fsdp));
  return MP_OK;
}

mp_status mp_build_plan(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                        const mp_plan_options *opts, mp_plan **out) {
  mp_plan_options defaults;
  if (opts == NULL) {
    mp_plan_options_init(&defaults);
    opts = &defaults;
  }
  mp_plan *p = NULL;
  *out = NULL;
  MP_CHECK(mp_plan_create(ctx, m, mesh, opts, &p));
  mp_status st = run_passes(ctx, p, opts);
  if (st != MP_OK) {
    mp_plan_destroy(p);
    return st;
  }
  *out = p;
  return MP_OK;
}

/* ---- templates: the module tree once per model ------------------------------------ */

mp_status mp_plan_template_create(mp_ctx *ctx, const mp_model *m, mp_plan_template **out) {
  *out = NULL;
  MP_CHECK(validate_model(ctx, m));
  mp_arena *arena = mp_arena_create();
  MP_CHECK_ALLOC(ctx, arena);
  mp_plan_template *t = mp_arena_alloc(arena, sizeof *t);
  const int L = (int)mp_model_n_blocks(m);
  if (t == NULL) goto nomem;
  t->arena = arena;
  t->model = *m;
  if (mp_plan_tree_build(arena, m, &t->params, &t->n_params) != 0) goto nomem;
  const size_t names = sizeof(const char *) * (size_t)(L > 0 ? L : 1);
  t->unit_block = mp_arena_alloc(arena, names);
  t->unit_attn = mp_arena_alloc(arena, names);
  t->unit_moe = mp_arena_alloc(arena, names);
  t->unit_experts = mp_arena_alloc(arena, names);
  if (!t->unit_block || !t->unit_attn || !t->unit_moe || !t->unit_experts) goto nomem;
  for (int l = 0; l < L; l++) {
    t->unit_block[l] = mp_arena_printf(arena, "layers.%d", l);
    t->unit_attn[l] = mp_arena_printf(arena, "layers.%d.attention", l);
    t->unit_moe[l] = mp_arena_printf(arena, "layers.%d.moe", l);
    t->unit_experts[l] = mp_arena_printf(arena, "layers.%d.moe.experts", l);
    if (!t->unit_block[l] || !t->unit_attn[l] || !t->unit_moe[l] || !t->unit_experts[l])
      goto nomem;
  }
  *out = t;
  return MP_OK;
nomem:
  mp_arena_destroy(arena);
  return mp_error(ctx, MP_ERR_NOMEM, "out of memory building the module tree of %s", m->name);
}

void mp_plan_template_destroy(mp_plan_template *t) {
  if (t != NULL) mp_arena_destroy(t->arena); /* the template lives in its arena */
}

mp_status mp_build_plan_from(mp_ctx *ctx, const mp_plan_template *t, const mp_mesh *mesh,
                             const mp_plan_options *opts, mp_arena *arena, mp_plan **out) {
  *out = NULL;
  mp_plan_options defaults;
  if (opts == NULL) {
    mp_plan_options_init(&defaults);
    opts = &defaults;
  }
  const mp_model *m = &t->model;
  MP_CHECK(validate_mesh(ctx, m, mesh, opts));
  const int own = arena == NULL;
  if (own) {
    arena = mp_arena_create();
    MP_CHECK_ALLOC(ctx, arena);
  }
  mp_plan *p = NULL;
  mp_status st = plan_init(ctx, arena, m, mesh, opts, &p);
  if (st != MP_OK) goto fail;
  p->tmpl = t;
  p->arena_borrowed = !own;
  /* Copy the tree, descriptors only: the FQN pointers stay the template's. */
  p->params = mp_arena_alloc(arena, sizeof(mp_param) * (size_t)(t->n_params + 1));
  if (p->params == NULL) {
    st = mp_error(ctx, MP_ERR_NOMEM, "out of memory building the module tree of %s", m->name);
    goto fail;
  }
  memcpy(p->params, t->params, sizeof(mp_param) * (size_t)t->n_params);
  p->n_params = t->n_params;
  /* The template's stages are all 0, which is right without pipeline parallelism. */
  if (mesh->size[MP_DIM_PP] > 1) {
    mp_plan_tree_add_tied_copy(p);
    mp_plan_tree_set_stages(p);
  }
  st = run_passes(ctx, p, opts);
  if (st != MP_OK) goto fail;
  *out = p;
  return MP_OK;
fail:
  if (own) mp_arena_destroy(arena);
  return st;
}

/* ---- derived plans ------------------------------------------------------------------ */

static int starts_with(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Whether options o's float8 settings differ from base options b's (recipe: o's resolved);
 * they matter only when float8 is on. */
static int fp8_differs(const mp_plan_options *o, const mp_plan_options *b, mp_fp8_recipe recipe) {
  if (o->fp8 != b->fp8) return 1;
  const mp_float8_options *x = &o->fp8_opts, *y = &b->fp8_opts;
  return o->fp8 && (recipe != y->recipe || x->all_gather != y->all_gather || x->param_gather != y->param_gather ||
                    x->nvfp4_no_rht != y->nvfp4_no_rht || x->dpa != y->dpa);
}

mp_status mp_plan_derive(mp_ctx *ctx, const mp_plan *base, const mp_plan_options *opts,
                         mp_arena *arena, mp_plan **out) {
  *out = NULL;
  if (base == NULL || opts == NULL || arena == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "mp_plan_derive needs a base plan, options and an arena");
  if (!(base->applied & (MP_PASS_FSDP | MP_PASS_DDP)) || !(base->applied & MP_PASS_AC))
    return mp_error(ctx, MP_ERR_INVALID,
                    "mp_plan_derive needs a base built with every pass (mp_build_plan)");
  /* Everything else must match the base's options (seq once resolved): those fields
   * shape the parameters and units. global_batch shapes nothing but the batch split, so
   * it may differ too; the float8 options matter only when float8 is on. */
  const mp_plan_options *b = &base->opts;
  const int64_t seq = opts->seq ? opts->seq : b->seq;
  const mp_fp8_recipe recipe = mp_fp8_recipe_of(opts->fp8_opts.recipe, opts->mem_model);
  if (fp8_differs(opts, b, recipe) || opts->tp.shard_logits != b->tp.shard_logits || opts->tp.pad_vocab != b->tp.pad_vocab ||
      opts->fsdp.per_block != b->fsdp.per_block || opts->fsdp.param_dtype != b->fsdp.param_dtype ||
      opts->fsdp.reduce_dtype != b->fsdp.reduce_dtype || opts->pp_schedule != b->pp_schedule ||
      opts->pp_virtual != b->pp_virtual || !same_pp_layers(opts, b) || seq != b->seq || opts->master_dtype != b->master_dtype ||
      opts->mem_model != b->mem_model || opts->attn != b->attn || opts->loss != b->loss ||
      dp_of(opts, &base->mesh) != b->dp || memcmp(&opts->ddp, &b->ddp, sizeof opts->ddp) != 0 ||
      opts->cp_rotate != b->cp_rotate || opts->cp_comm != b->cp_comm || opts->cp_wait_at_issue != b->cp_wait_at_issue ||
      opts->tp_comm_fused != b->tp_comm_fused || opts->te_spec != b->te_spec || opts->moe_a2a_overlap != b->moe_a2a_overlap ||
      opts->moe_fp8_dispatch != b->moe_fp8_dispatch || opts->recompute_modules != b->recompute_modules ||
      opts->moe_dispatcher != b->moe_dispatcher || opts->fp8_act_cache != b->fp8_act_cache ||
      opts->moment_dtype != b->moment_dtype || opts->mfsdp_strategy != b->mfsdp_strategy ||
      opts->fsdp_double_buffer != b->fsdp_double_buffer || opts->cuda_graphs != b->cuda_graphs ||
      opts->cpu_offload_layers != b->cpu_offload_layers || opts->recompute_method != b->recompute_method || opts->recompute_num_layers != b->recompute_num_layers ||
      memcmp(&opts->moe_routing, &b->moe_routing, sizeof opts->moe_routing) != 0 ||
      (opts->sp >= 0 && base->mesh.size[MP_DIM_TP] > 1 && opts->sp != b->sp))
    return mp_error(ctx, MP_ERR_INVALID,
                    "mp_plan_derive: options differ from the base plan's in more than "
                    "micro_batch, ac, reshard_after_forward and global_batch; build the plan "
                    "instead");
  MP_CHECK(validate_mesh(ctx, &base->model, &base->mesh, opts));
  mp_plan *p = mp_arena_alloc_raw(arena, sizeof *p);
  if (p == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory deriving a plan");
  *p = *base;
  p->arena = arena;
  p->arena_borrowed = 1;
  /* the options as plan_init and the passes leave them */
  p->opts = *opts;
  p->opts.seq = seq;
  p->opts.sp = b->sp;
  p->opts.dp = b->dp;
  p->opts.ddp = b->ddp;
  if (p->opts.fp8) p->opts.fp8_opts = b->fp8_opts; /* the recipe as the float8 pass resolved it */
  if (mp_plan_pp_fsdp(p)) p->opts.fsdp.reshard_after_forward = 0; /* as mp_apply_fsdp */
  if (p->opts.ac_every < 1 || p->opts.ac != MP_AC_FULL) p->opts.ac_every = 1;
  if (p->opts.global_batch == 0)
    p->opts.global_batch = p->opts.micro_batch * base->mesh.size[MP_DIM_DP_REPLICATE] *
                           base->mesh.size[MP_DIM_DP_SHARD];
  p->ac = opts->ac;
  /* Notes in pass order: the base's up to Float8, then AC's and FSDP's for the new
   * options (the base's own when unchanged, which also keeps a dropped-notes marker). */
  if (opts->ac != base->opts.ac || p->opts.ac_every != b->ac_every ||
      p->opts.fsdp.reshard_after_forward != base->opts.fsdp.reshard_after_forward) {
    if (base->n_notes >= (int)(sizeof base->notes / sizeof base->notes[0]) - 1)
      return mp_error(ctx, MP_ERR_INVALID,
                      "mp_plan_derive: the base plan's notes are full; build the plan instead");
    p->n_notes = 0;
    const char *fsdp_note = NULL;
    for (int i = 0; i < base->n_notes; i++) {
      if (starts_with(base->notes[i], "AC: ")) continue;
      if (starts_with(base->notes[i], "FSDP: ") || starts_with(base->notes[i], "DDP: ")) {
        fsdp_note = base->notes[i];
        continue;
      }
      p->notes[p->n_notes++] = base->notes[i];
    }
    mp_plan_note_ac(p, &p->opts);
    if ((p->opts.fsdp.reshard_after_forward == base->opts.fsdp.reshard_after_forward || p->opts.dp == MP_DP_DDP) &&
        fsdp_note)
      p->notes[p->n_notes++] = fsdp_note;
    else
      mp_plan_note_fsdp(p, &p->opts.fsdp);
  }
  *out = p;
  return MP_OK;
}
