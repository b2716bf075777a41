/* The planner's search (see search.h): enumeration, cheap pruning with reasons, ranking;
 * the parallel evaluation is search_run.c's.
 *
 * Invariant: candidates are stored in enumeration order and never move; the pruning rules
 * set a candidate's reject code at enumeration, once. */
#define _GNU_SOURCE
#include "planner/search.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "common/timeutil.h"
#include "exec/rules.h"
#include "exec/runtime/check.h"
#include "planner/batch.h"

const char *mp_search_ac_name(int ac) { return mp_ac_mode_name((mp_ac_mode)ac); }

void mp_candidate_ac_str(const mp_candidate *c, char *buf, size_t cap) {
  if (c->ac == MP_AC_FULL && c->ac_every > 1) snprintf(buf, cap, "full:%d", c->ac_every);
  else snprintf(buf, cap, "%s", mp_search_ac_name(c->ac));
}

/* executable_only: whether exec/runtime executes the candidate on the profile's backend (CPU or CUDA), by
 * its own rules (mp_runtime_check) on the options and passes its plan would have; no plan is built. */
static int executable(const mp_search_config *cfg, const mp_candidate *c) {
  if (!mp_gpu_runtime_drives(&cfg->cluster->gpu)) return 0; /* a GPU without CUDA */
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = cfg->seq;
  o.sp = c->sp;
  o.fp8 = c->fp8;
  o.fp8_opts.recipe = cfg->fp8_recipe;
  o.micro_batch = c->micro_batch;
  o.ac = (mp_ac_mode)c->ac;
  o.pp_virtual = c->pp_virtual;
  if (c->pp_virtual > 1) o.pp_schedule = MP_PP_INTERLEAVED;
  o.mem_model = mp_gpu_api_of(&cfg->cluster->gpu) == MP_GPU_API_CPU ? MP_MEM_MODEL_MESHPLAN_CPU : MP_MEM_MODEL_MESHPLAN_CUDA;
  const unsigned applied = (c->mesh.size[MP_DIM_DP_SHARD] > 1 ? MP_PASS_FSDP : 0) | (c->fp8 ? MP_PASS_FLOAT8 : 0);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  return mp_runtime_check(&ctx, cfg->model, &c->mesh, &o, applied) == MP_OK;
}

/* The shortest load-balanced chunk of a sequence the search lets context parallelism cut
 * (tokens): one tile of FlashAttention's kernels. */
#define MP_CP_MIN_CHUNK 128

/* The AC policies a search enumerates by default: those every stack's runtime runs. */
static unsigned ac_mask_of(const mp_search_config *cfg) {
  return cfg->ac_mask ? cfg->ac_mask
                      : (1u << MP_AC_NONE) | (1u << MP_AC_SELECTIVE_CORE) | (1u << MP_AC_FULL);
}

#define MP_REJECT_NAME_(e, name, words) name,
#define MP_REJECT_WORDS_(e, name, words) words,
static const char *const k_reject_name[MP_REJECT_COUNT] = {MP_REJECTS(MP_REJECT_NAME_)};
static const char *const k_reject_words[MP_REJECT_COUNT] = {MP_REJECTS(MP_REJECT_WORDS_)};
#undef MP_REJECT_NAME_
#undef MP_REJECT_WORDS_

const char *mp_reject_name(mp_reject r) { return (unsigned)r < MP_REJECT_COUNT ? k_reject_name[r] : "?"; }
const char *mp_reject_words(mp_reject r) { return (unsigned)r < MP_REJECT_COUNT ? k_reject_words[r] : "?"; }

const mp_reject mp_search_rule_order[] = {
    MP_REJECT_PP_LAYERS, MP_REJECT_TP_HEADS, MP_REJECT_TP_KV_HEADS,
    MP_REJECT_TP_D_FF, MP_REJECT_TP_D_MODEL, MP_REJECT_TP_CROSS_NODE, MP_REJECT_EP_EXPERTS,
    MP_REJECT_CP_SEQ, MP_REJECT_BATCH, MP_REJECT_PP_VIRTUAL, MP_REJECT_SP_SEQ, MP_REJECT_FP8_GPU,
    MP_REJECT_FP8_DIMS, MP_REJECT_RESHARD_NOOP, MP_REJECT_MEMORY_BOUND, MP_REJECT_MEMORY_MB,
    MP_REJECT_MEMORY_AC, MP_REJECT_DOMINATED, MP_REJECT_EVAL_ERROR, MP_REJECT_MEMORY};
const int mp_search_n_rule_order = (int)(sizeof mp_search_rule_order / sizeof mp_search_rule_order[0]);

void mp_search_config_init(mp_search_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  mp_search_fix_init(&cfg->fix);
  cfg->search_fp8 = 1;
  cfg->full_ac_ahead = 1;
}

/* ---- pruning -------------------------------------------------------------------------- */

/* The reject code of the first model size tp does not divide (exec/rules.h; the search
 * pads the vocabulary, as the plans it builds do). */
static mp_reject tp_reject(const mp_model *m, int tp) {
  switch (mp_rule_tp_dim(m, tp, 1)) {
    case MP_TP_DIM_HEADS: return MP_REJECT_TP_HEADS;
    case MP_TP_DIM_KV_HEADS: return MP_REJECT_TP_KV_HEADS;
    case MP_TP_DIM_D_FF:
    case MP_TP_DIM_D_FF_SHARED: return MP_REJECT_TP_D_FF;
    case MP_TP_DIM_D_MODEL:
    case MP_TP_DIM_MAMBA_HEADS: /* the Mamba heads and groups: the mixer's widths */
    case MP_TP_DIM_MAMBA_GROUPS: return MP_REJECT_TP_D_MODEL;
    default: return MP_REJECT_NONE;
  }
}

/* Megatron FSDP: a megatron stack (DDP) over dp_shard, which the search leaves out unless
 * --fix names dp_shard (it would add a data-parallel form to every megatron search). */
static int mfsdp_mesh(const mp_search_config *cfg, const mp_mesh *mesh) {
  return cfg->dp == MP_DP_DDP && mesh->size[MP_DIM_DP_SHARD] > 1 && cfg->fix.dp_shard > 1;
}

/* Rules that depend only on the mesh (shared by every option of it). */
static mp_reject prune_mesh(const mp_search_config *cfg, const mp_mesh *mesh) {
  const mp_model *m = cfg->model;
  int pp = mesh->size[MP_DIM_PP], tp = mesh->size[MP_DIM_TP], cp = mesh->size[MP_DIM_CP];
  if (!mp_rule_pp_chunks_ok(m->n_layers, pp, 1)) return MP_REJECT_PP_LAYERS;
  const mp_reject tpr = tp_reject(m, tp);
  if (tpr != MP_REJECT_NONE) return tpr;
  if (!cfg->allow_cross_node_tp && mp_cluster_nvlink_domain(cfg->cluster) % tp) return MP_REJECT_TP_CROSS_NODE;
  if (!mp_rule_ep_ok(m, mesh->ep)) return MP_REJECT_EP_EXPERTS;
  if (cfg->dp == MP_DP_DDP && mesh->size[MP_DIM_DP_SHARD] > 1 && !mfsdp_mesh(cfg, mesh)) return MP_REJECT_NO_FSDP;
  if (mfsdp_mesh(cfg, mesh) && !mp_rule_mfsdp_experts_ok(mesh)) return MP_REJECT_MFSDP_EXPERTS;
  /* a chunk under one 128-token tile of the flash kernel leaves the ring's steps mostly
   * idle (and the schedule a ring of cp steps per layer for nothing): a search leaves such
   * chunks out, a cp the caller pins is evaluated */
  if (cp > 1 && (!mp_rule_cp_ring_ok(cfg->seq, cp) || (cfg->seq / (2 * cp) < MP_CP_MIN_CHUNK && cfg->fix.cp < 0)))
    return MP_REJECT_CP_SEQ;
  return MP_REJECT_NONE;
}

/* The resident bytes per parameter a rank holds (exec's mp_plan_dp_state_bytes at the
 * default dtypes), and over how many ranks the parameters are cut (see search.h): FSDP over
 * dp_shard x cp x tp x pp, DDP over tp x pp. split and ways (may be NULL): the bytes held
 * whole and the bytes cut over `ways` data-parallel ranks, mp_plan_dp_state_bytes's own.
 * A float8 candidate under --fp8-param-gather keeps its float8 Linears' model weights at 1
 * byte, beside Transformer Engine's copies of them (mp_fp8_te_copies_per_elem: the transpose
 * on Hopper, none on Blackwell under the per-tensor recipes); where the two come to less than
 * the model dtype's bytes, every parameter is counted so: the float8 ones are a subset of
 * them, so the bound stays below the plan's state. */
static double bound_bytes_per_param(const mp_search_config *cfg, const mp_mesh *mesh, int fp8, int64_t *shards,
                                    double split[2], int64_t *ways) {
  const int64_t tp_pp = (int64_t)mesh->size[MP_DIM_TP] * mesh->size[MP_DIM_PP];
  mp_plan_options o;
  mp_plan_options_init(&o);
  const int mfsdp = mfsdp_mesh(cfg, mesh);
  o.dp = mfsdp ? MP_DP_FSDP : cfg->dp;
  if (mfsdp) o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.ddp.shard_optimizer = cfg->ddp_shard_optimizer;
  double b[2];
  int64_t w = 1;
  mp_plan_dp_state_bytes(mesh, &o, b, &w);
  if (fp8 && cfg->fp8_param_gather) {
    /* Megatron FSDP drops the per-tensor recipes' transposes after each layer (exec/
     * schedule_prep.c, f8_held_per_layer): none held */
    const mp_fp8_recipe r = cfg->fp8_recipe;
    const int dropped = mfsdp && (r == MP_FP8_DEFAULT || r == MP_FP8_DELAYED || r == MP_FP8_TENSORWISE);
    const int copies = dropped ? 0 : mp_fp8_te_copies_per_elem(r, cfg->cluster->gpu.compute_capability, 1);
    const double less = (double)mp_dtype_bytes(o.fsdp.param_dtype) - (1.0 + copies);
    if (less > 0) b[o.dp == MP_DP_DDP ? 0 : 1] -= less; /* the model weights: DDP's whole, Megatron FSDP's cut */
  }
  if (split) split[0] = b[0], split[1] = b[1];
  if (ways) *ways = w;
  *shards = o.dp == MP_DP_DDP ? tp_pp : (int64_t)mesh->size[MP_DIM_DP_SHARD] * mesh->size[MP_DIM_CP] * tp_pp;
  return b[0] + b[1] / (double)w;
}

/* The routed experts' parameters: 3 Linears [d_ff_expert, d_model] per expert per MoE
 * layer. */
static double routed_expert_params(const mp_model *m) {
  return (double)mp_model_n_moe_layers(m) * (double)m->n_experts * 3.0 * (double)m->d_model *
         (double)m->d_ff_expert;
}

/* Lower bound of a rank's peak memory (see search.h). DDP on the expert grid holds the
 * routed experts over ep x etp x pp, not over tp x pp (whole on a rank at etp 1, each local
 * expert split over etp ranks at etp > 1, exec/mesh.h), and shards their optimizer over
 * expert-DP (stage / (ep x etp) ranks): they are counted apart, their cut optimizer bytes at
 * the larger of the two data-parallel ways (a lower bound either way). */
static double mem_lower_bound_bytes(const mp_search_config *cfg, const mp_mesh *mesh, int fp8,
                                    double n_params) {
  int64_t shards, ways;
  double split[2];
  const double b = bound_bytes_per_param(cfg, mesh, fp8, &shards, split, &ways);
  const double rt = cfg->cluster->gpu.runtime_overhead_gib * 1024.0 * 1024.0 * 1024.0;
  if (!(cfg->dp == MP_DP_DDP && !mfsdp_mesh(cfg, mesh) && mesh->ep > 1 && mp_mesh_expert_grid(mesh)))
    return b * n_params / (double)shards + rt;
  const int64_t pp = mesh->size[MP_DIM_PP], stage = mp_mesh_world(mesh) / pp, etp = mesh->etp > 1 ? mesh->etp : 1;
  const int64_t edp = cfg->ddp_shard_optimizer ? stage / (mesh->ep * etp) : 1;
  const double ne = routed_expert_params(cfg->model) < n_params ? routed_expert_params(cfg->model) : 0.0;
  const double be = split[0] + split[1] / (double)(ways > edp ? ways : edp);
  return b * (n_params - ne) / (double)shards + be * ne / (double)(mesh->ep * etp * pp) + rt;
}

double mp_search_mem_lower_bound(const mp_search_config *cfg, const mp_candidate *c) {
  return mem_lower_bound_bytes(cfg, &c->mesh, c->fp8, (double)mp_model_param_count(cfg->model));
}

/* Interleaving: the pp x v model chunks hold a layer each and the micro-batches come in
 * groups of pp (exec/rules.h). */
static int pp_virtual_ok(const mp_search_config *cfg, const mp_candidate *c, int64_t n_micro) {
  if (c->pp_virtual <= 1) return 1;
  const int pp = c->mesh.size[MP_DIM_PP];
  /* a split counting the embedding and the loss as layers has pp x v chunks of one or more
   * layers by construction (chunk_choices) */
  return (c->pp_split || mp_rule_pp_chunks_ok(cfg->model->n_layers, pp, c->pp_virtual)) &&
         mp_rule_pp_micro_ok(n_micro, pp, c->pp_virtual);
}

static mp_reject prune_options(const mp_search_config *cfg, const mp_candidate *c,
                               double n_params, int fp8_linears) {
  const mp_mesh *mesh = &c->mesh;
  int64_t dp = (int64_t)mesh->size[MP_DIM_DP_REPLICATE] * mesh->size[MP_DIM_DP_SHARD];
  if (c->global_batch < 1 || c->global_batch % (dp * c->micro_batch)) return MP_REJECT_BATCH;
  if (!pp_virtual_ok(cfg, c, c->global_batch / (dp * c->micro_batch))) return MP_REJECT_PP_VIRTUAL;
  if (c->sp && !mp_rule_sp_ok(cfg->seq, mesh->size[MP_DIM_CP], mesh->size[MP_DIM_TP])) return MP_REJECT_SP_SEQ;
  if (c->fp8 && !mp_gpu_has_float8(&cfg->cluster->gpu)) return MP_REJECT_FP8_GPU;
  if (c->fp8 && fp8_linears == 0) return MP_REJECT_FP8_DIMS;
  /* the FSDP group is dp_shard x cp (MP_GROUP_FSDP) */
  /* Megatron FSDP reshards whatever the flag: its reshard-on candidate is kept */
  if (mfsdp_mesh(cfg, mesh) ? !c->reshard
                            : c->reshard && (cfg->dp == MP_DP_DDP || mesh->size[MP_DIM_DP_SHARD] * mesh->size[MP_DIM_CP] == 1 ||
                                             (cfg->pp_keeps_params && mesh->size[MP_DIM_PP] > 1)))
    return MP_REJECT_RESHARD_NOOP;
  if (cfg->mem_capacity_bytes > 0 && mem_lower_bound_bytes(cfg, mesh, c->fp8, n_params) > (double)cfg->mem_capacity_bytes)
    return MP_REJECT_MEMORY_BOUND;
  return MP_REJECT_NONE;
}

static double gib(int64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

/* The reason of a rule of the model and mesh (exec/rules.h) in words with the numbers; 0 when
 * c's reason is another kind. */
static int mesh_reason(const mp_search_config *cfg, const mp_candidate *c, char *buf, size_t cap) {
  const mp_model *m = cfg->model;
  const mp_mesh *mesh = &c->mesh;
  const int pp = mesh->size[MP_DIM_PP], tp = mesh->size[MP_DIM_TP], cp = mesh->size[MP_DIM_CP];
  switch ((mp_reject)c->reject) {
    case MP_REJECT_PP_LAYERS:
      snprintf(buf, cap, "pp=%d exceeds n_layers=%lld: a stage needs at least one layer", pp,
               (long long)m->n_layers);
      break;
    case MP_REJECT_TP_HEADS:
      snprintf(buf, cap, "tp=%d does not divide n_heads=%lld", tp, (long long)m->n_heads);
      break;
    case MP_REJECT_TP_KV_HEADS:
      snprintf(buf, cap, "tp=%d does not divide n_kv_heads=%lld", tp, (long long)m->n_kv_heads);
      break;
    case MP_REJECT_TP_D_FF:
      snprintf(buf, cap, "tp=%d does not divide d_ff=%lld", tp, (long long)m->d_ff);
      break;
    case MP_REJECT_TP_D_MODEL:
      snprintf(buf, cap, "tp=%d does not divide d_model=%lld", tp, (long long)m->d_model);
      break;
    case MP_REJECT_TP_CROSS_NODE:
      if (mp_cluster_nvlink_domain(cfg->cluster) > cfg->cluster->gpus_per_node)
        snprintf(buf, cap, "tp=%d does not fit in an NVLink domain of %d GPUs (pass --allow-cross-node-tp to allow)",
                 tp, mp_cluster_nvlink_domain(cfg->cluster));
      else
        snprintf(buf, cap, "tp=%d does not fit in a node of %d GPUs (pass --allow-cross-node-tp to allow)", tp,
                 cfg->cluster->gpus_per_node);
      break;
    case MP_REJECT_EP_EXPERTS:
      snprintf(buf, cap, "ep=%d does not divide n_experts=%lld", mesh->ep, (long long)m->n_experts);
      break;
    case MP_REJECT_CP_SEQ:
      if (cfg->seq % cp)
        snprintf(buf, cap, "cp=%d does not divide seq=%lld", cp, (long long)cfg->seq);
      else
        snprintf(buf, cap,
                 "cp=%d: ring attention cuts seq=%lld into %d load-balanced chunks, which must "
                 "divide it and hold at least %d tokens (one flash-attention tile)",
                 cp, (long long)cfg->seq, 2 * cp, MP_CP_MIN_CHUNK);
      break;
    case MP_REJECT_NO_FSDP:
      snprintf(buf, cap,
               "dp_shard=%d: the stack replicates parameters over data parallelism (no FSDP); "
               "the same mesh with dp_replicate=%d is searched",
               mesh->size[MP_DIM_DP_SHARD],
               mesh->size[MP_DIM_DP_REPLICATE] * mesh->size[MP_DIM_DP_SHARD]);
      break;
    case MP_REJECT_MFSDP_EXPERTS:
      snprintf(buf, cap,
               "dp_replicate=%d with dp_shard=%d and ep=%d: Megatron FSDP's hybrid sharding of routed "
               "experts (their inter-instance groups) is not modelled",
               mesh->size[MP_DIM_DP_REPLICATE], mesh->size[MP_DIM_DP_SHARD], mesh->ep);
      break;
    default: return 0;
  }
  return 1;
}

/* The same for the rules of the options (batch, float8, resharding, interleaving, SP). */
static int options_reason(const mp_search_config *cfg, const mp_candidate *c, char *buf, size_t cap) {
  const mp_model *m = cfg->model;
  const mp_mesh *mesh = &c->mesh;
  const int pp = mesh->size[MP_DIM_PP], tp = mesh->size[MP_DIM_TP], cp = mesh->size[MP_DIM_CP];
  const int64_t dp = (int64_t)mesh->size[MP_DIM_DP_REPLICATE] * mesh->size[MP_DIM_DP_SHARD];
  switch ((mp_reject)c->reject) {
    case MP_REJECT_NONE: snprintf(buf, cap, "%s", ""); break;
    case MP_REJECT_BATCH:
      if (c->global_batch < 1)
        snprintf(buf, cap,
                 "dp=%lld is over the default batch rule's %lld sequences: each data-parallel rank "
                 "needs a whole sequence; pass --global-batch to plan a larger step",
                 (long long)dp, (long long)cfg->target_batch);
      else
        snprintf(buf, cap, "global batch %lld not divisible by dp=%lld x micro-batch=%lld",
                 (long long)c->global_batch, (long long)dp, (long long)c->micro_batch);
      break;
    case MP_REJECT_FP8_GPU:
      snprintf(buf, cap, "float8 needs an fp8 peak and compute capability >= 89; %s has %d",
               cfg->cluster->gpu.name, cfg->cluster->gpu.compute_capability);
      break;
    case MP_REJECT_FP8_DIMS:
      snprintf(buf, cap,
               "float8 changes nothing at tp=%d: no Linear layer's GEMM dims are multiples of 16 "
               "(d_model=%lld, d_ff/tp=%lld, heads x head_dim/tp=%lld), so none runs in float8",
               tp, (long long)m->d_model, (long long)(m->d_ff / tp),
               (long long)(m->n_heads * m->head_dim / tp));
      break;
    case MP_REJECT_RESHARD_NOOP:
      if (mfsdp_mesh(cfg, mesh))
        snprintf(buf, cap, "reshard_after_forward off: Megatron FSDP releases each layer's gathered weights "
                           "after its forward (the candidate with reshard on)");
      else if (cfg->dp == MP_DP_DDP)
        snprintf(buf, cap, "reshard_after_forward has no effect: the stack replicates parameters "
                           "(no FSDP; same as reshard off)");
      else if (mesh->size[MP_DIM_DP_SHARD] * mesh->size[MP_DIM_CP] == 1)
        snprintf(buf, cap, "reshard_after_forward has no effect with dp_shard=1 (same as reshard off)");
      else
        snprintf(buf, cap,
                 "reshard_after_forward has no effect with pp=%d: the stack keeps a pipeline "
                 "stage's parameters gathered through the step (same as reshard off)", pp);
      break;
    case MP_REJECT_PP_VIRTUAL:
      snprintf(buf, cap,
               "pp=%d x %d chunks: the interleaved schedule needs every one of the %d model "
               "chunks of %lld layers non-empty and a multiple of pp micro-batches (%lld here)",
               pp, c->pp_virtual, pp * c->pp_virtual, (long long)m->n_layers,
               (long long)(c->global_batch / (dp * c->micro_batch)));
      break;
    case MP_REJECT_SP_SEQ:
      snprintf(buf, cap, "sequence parallelism: tp=%d does not divide seq/cp=%lld", tp,
               (long long)(cfg->seq / cp));
      break;
    default: return 0;
  }
  return 1;
}

/* The same for memory, the siblings' verdicts and the evaluator's. */
static int memory_reason(const mp_search_config *cfg, const mp_candidate *c, char *buf, size_t cap) {
  const mp_model *m = cfg->model;
  const mp_mesh *mesh = &c->mesh;
  switch ((mp_reject)c->reject) {
    case MP_REJECT_MEMORY_BOUND:
    {
      int64_t shards;
      const double b = bound_bytes_per_param(cfg, mesh, c->fp8, &shards, NULL, NULL);
      snprintf(buf, cap,
               "%s alone need %.2f GiB per GPU (%.4g B x %.4g params / "
               "%lld shards + %.2f GiB runtime), over capacity %.2f GiB",
               mfsdp_mesh(cfg, mesh)   ? "bf16 weights, fp32 main weights and Adam state"
               : cfg->dp == MP_DP_DDP ? "parameters, main gradients, fp32 masters and Adam state"
                                      : "fp32 parameters and AdamW state",
               mem_lower_bound_bytes(cfg, mesh, c->fp8, (double)mp_model_param_count(m)) /
                   (1024.0 * 1024.0 * 1024.0),
               b, (double)mp_model_param_count(m), (long long)shards,
               cfg->cluster->gpu.runtime_overhead_gib, gib(cfg->mem_capacity_bytes));
    }
      break;
    case MP_REJECT_MEMORY:
      snprintf(buf, cap, "peak %.2f GiB exceeds capacity %.2f GiB", gib(c->res.peak_mem_bytes),
               gib(c->res.capacity_bytes));
      break;
    case MP_REJECT_EVAL_ERROR:
      snprintf(buf, cap, "%s", c->error ? c->error : "evaluation failed");
      break;
    case MP_REJECT_DOMINATED:
      snprintf(buf, cap,
               "ac=%s recomputes everything a fitting sibling with less recompute does, and more: "
               "never faster",
               mp_search_ac_name(c->ac));
      break;
    case MP_REJECT_MEMORY_MB:
      snprintf(buf, cap,
               "micro-batch %lld needs no less memory than micro-batch %lld, over capacity",
               (long long)c->micro_batch, (long long)(c->micro_batch / 2));
      break;
    case MP_REJECT_MEMORY_AC:
      snprintf(buf, cap, "ac=%s saves less memory than ac=full, over capacity",
               mp_search_ac_name(c->ac));
      break;
    case MP_REJECT_BOUNDED:
      if (c->res.bounded)
        snprintf(buf, cap, "a stage's forward and backward alone take %.4f s a step, past %.4f s "
                 "(the shown plans' bound)", c->res.step_lb_s, c->step_bound_s);
      else if (c->res.step_lb_s > 0.0)
        snprintf(buf, cap, "a smaller micro-batch's stage bound, per sequence, puts its step at %.4f s "
                 "or more, past %.4f s (the shown plans' bound)", c->res.step_lb_s, c->step_bound_s);
      else
        snprintf(buf, cap, "ac=%s recomputes more than a sibling past the shown plans' bound: never faster",
                 mp_search_ac_name(c->ac));
      break;
    default: return 0;
  }
  return 1;
}

void mp_candidate_reason(const mp_search_config *cfg, const mp_candidate *c, char *buf,
                         size_t cap) {
  if (!mesh_reason(cfg, c, buf, cap) && !options_reason(cfg, c, buf, cap) && !memory_reason(cfg, c, buf, cap))
    snprintf(buf, cap, "unknown reason");
}

void mp_candidate_mesh_str(const mp_candidate *c, char *buf, size_t cap) {
  mp_mesh_format(&c->mesh, buf, cap);
}

void mp_candidate_pp_str(const mp_candidate *c, char *buf, size_t cap) {
  if (c->pp_virtual > 1) snprintf(buf, cap, "%dx%d%s", c->mesh.size[MP_DIM_PP], c->pp_virtual, c->pp_split ? "E" : "");
  else snprintf(buf, cap, "%d%s", c->mesh.size[MP_DIM_PP], c->pp_split ? "E" : "");
}

void mp_candidate_ep_str(const mp_candidate *c, char *buf, size_t cap) { mp_mesh_ep_str(&c->mesh, buf, cap); }

void mp_mesh_ep_str(const mp_mesh *m, char *buf, size_t cap) {
  if (m->etp > 1) snprintf(buf, cap, "%dg%d", m->ep, m->etp);
  else snprintf(buf, cap, "%d%s", m->ep, mp_mesh_expert_grid(m) ? "g" : "");
}

int mp_mesh_dp_rep_str(const mp_mesh *m, char *buf, size_t cap) {
  const int dopt = mp_mesh_dopt(m);
  if (dopt > 1) snprintf(buf, cap, "%d/%d", m->size[MP_DIM_DP_REPLICATE], dopt);
  else snprintf(buf, cap, "%d", m->size[MP_DIM_DP_REPLICATE]);
  return dopt > 1;
}

/* ---- enumeration ---------------------------------------------------------------------- */

static int fixed_ok(int fix, int v) { return fix < 0 || fix == v; }

typedef struct enum_state {
  const mp_search_config *cfg;
  mp_search *s;
  int64_t cap;
  mp_ctx *ctx;
  double n_params; /* mp_model_param_count, once */
  int fp8_tp[64], fp8_n[64], n_fp8; /* float8 Linears per tp asked so far */
} enum_state;

/* The Linear layers that run float8 on a rank of tp (mp_plan_fp8_linears), asked once per tp;
 * -1 when the plan cannot be built (its TP rule fails: pruned before this matters). */
static int fp8_linears_at(enum_state *e, int tp) {
  for (int i = 0; i < e->n_fp8; i++)
    if (e->fp8_tp[i] == tp) return e->fp8_n[i];
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  int n = 0;
  if (mp_plan_fp8_linears(&ctx, e->cfg->model, tp, e->cfg->fp8_recipe, &n) != MP_OK) n = -1;
  if (e->n_fp8 < 64) {
    e->fp8_tp[e->n_fp8] = tp;
    e->fp8_n[e->n_fp8++] = n;
  }
  return n;
}

static mp_status push(enum_state *e, const mp_candidate *c) {
  mp_search *s = e->s;
  if (s->n == e->cap) {
    int64_t ncap = e->cap ? 2 * e->cap : 1024;
    mp_candidate *nc = realloc(s->cands, (size_t)ncap * sizeof *nc);
    if (!nc) return mp_error(e->ctx, MP_ERR_NOMEM, "out of memory enumerating %lld candidates", (long long)ncap);
    s->cands = nc;
    e->cap = ncap;
  }
  s->cands[s->n++] = *c;
  return MP_OK;
}

/* The model chunks per stage a mesh searches: the fixed one, or 1 (and 2, 4 up to
 * pp_virtual_max with pp > 1 on a mesh the mesh rules keep: they reject every chunking
 * alike), each with the default split; where the stack counts the embedding and the loss
 * as layers (pp_split) also every v whose pp x v chunks divide the layers + 2 that way
 * (Llama 3 405B on pp 16: v = 8, one layer a chunk). *n of them into vs and split. */
#define MP_CHUNK_CHOICES 24
static void chunk_choices(const mp_search_config *cfg, const mp_mesh *mesh, mp_reject mesh_rej,
                          int vs[MP_CHUNK_CHOICES], int split[MP_CHUNK_CHOICES], int *n) {
  *n = 0;
  const int pp = mesh->size[MP_DIM_PP];
  /* the default split goes to 4 chunks a stage, the other to (layers + 2) / pp at most */
  const int64_t most_split = cfg->pp_split && pp > 1 ? (cfg->model->n_layers + 2) / pp : 0;
  const int lo = cfg->fix.pp_virtual > 0 ? cfg->fix.pp_virtual : 1;
  const int hi = cfg->fix.pp_virtual > 0 ? cfg->fix.pp_virtual
                                         : (int)(most_split > 4 ? (most_split < MP_PP_MAX_VIRTUAL ? most_split
                                                                                                   : MP_PP_MAX_VIRTUAL)
                                                                : 4);
  for (int v = lo; v <= hi && *n < MP_CHUNK_CHOICES; v++) {
    const int plain = cfg->fix.pp_virtual > 0 || v == 1 ||
                      (pp > 1 && mesh_rej == MP_REJECT_NONE && v <= cfg->pp_virtual_max && v <= 4 &&
                       (v & (v - 1)) == 0);
    if (plain) vs[*n] = v, split[(*n)++] = 0;
    if (cfg->pp_split && mesh_rej == MP_REJECT_NONE && *n < MP_CHUNK_CHOICES &&
        (v == 1 || cfg->pp_virtual_max > 1) && mp_rule_pp_split_ok(cfg->model->n_layers, pp, v))
      vs[*n] = v, split[(*n)++] = 1;
  }
}

/* The AC policies in enumeration order: none, full, those between (search.h). */
static const int k_ac_order[MP_AC_COUNT] = {MP_AC_NONE, MP_AC_FULL, MP_AC_SELECTIVE_CORE,
                                            MP_AC_SELECTIVE, MP_AC_SELECTIVE_OP};

static mp_status enum_options(enum_state *e, const mp_mesh *mesh) {
  const mp_search_config *cfg = e->cfg;
  const mp_search_fix *fx = &cfg->fix;
  mp_reject mesh_rej = prune_mesh(cfg, mesh);
  int64_t dp = (int64_t)mesh->size[MP_DIM_DP_REPLICATE] * mesh->size[MP_DIM_DP_SHARD];
  const int64_t gb = cfg->target_batch > 0 ? mp_batch_for_dp(cfg->target_batch, dp) : cfg->global_batch;
  int64_t per_rank = gb / dp; /* floor; < 1 when dp > batch */
  if (per_rank < 1) per_rank = 1;
  int pads_vocab = cfg->model->vocab % mesh->size[MP_DIM_TP] != 0;
  const int sp = mesh->size[MP_DIM_TP] > 1 && (fx->sp >= 0 ? fx->sp : cfg->sp);
  const unsigned mask = fx->ac >= 0 ? 1u << fx->ac : ac_mask_of(cfg);
  int vs[MP_CHUNK_CHOICES], split[MP_CHUNK_CHOICES], nv = 0;
  chunk_choices(cfg, mesh, mesh_rej, vs, split, &nv);
  for (int iv = 0; iv < nv; iv++) {
    /* powers of two up to per_rank; the loop stops before the doubling that would pass it
     * (per_rank near 2^62 must not wrap mb around and loop forever) */
    for (int64_t mb = 1; mb <= per_rank; mb = mb > per_rank / 2 ? per_rank + 1 : 2 * mb) {
      if (fx->micro_batch > 0 && fx->micro_batch != mb) continue;
      for (int ia = 0; ia < MP_AC_COUNT; ia++) {
        const int ac = k_ac_order[ia];
        if (!(mask & (1u << ac))) continue;
        for (int fp8 = 0; fp8 < 2; fp8++) {
          if (!fixed_ok(fx->fp8, fp8) || (fp8 && fx->fp8 < 0 && !cfg->search_fp8)) continue;
          for (int rs = 0; rs < 2; rs++) {
            if (!fixed_ok(fx->reshard, rs)) continue;
            mp_candidate c;
            memset(&c, 0, sizeof c);
            c.mesh = *mesh;
            c.micro_batch = mb;
            c.global_batch = gb;
            c.ac = (uint8_t)ac;
            c.ac_every = (uint16_t)(ac == MP_AC_FULL && fx->ac_every > 1 ? fx->ac_every : 1);
            c.fp8 = (uint8_t)fp8;
            c.reshard = (uint8_t)rs;
            c.pads_vocab = (uint8_t)pads_vocab;
            c.sp = (uint8_t)sp;
            c.pp_virtual = (uint16_t)vs[iv];
            c.pp_split = (uint8_t)split[iv];
            if (cfg->executable_only && !executable(cfg, &c)) continue;
            c.reject = (uint8_t)(mesh_rej != MP_REJECT_NONE
                                     ? mesh_rej
                                     : prune_options(cfg, &c, e->n_params,
                                                     fp8 ? fp8_linears_at(e, mesh->size[MP_DIM_TP]) : -1));
            if (c.reject != MP_REJECT_NONE) e->s->n_pruned++;
            MP_CHECK(push(e, &c));
            /* a mesh the mesh rules reject: its first candidate stands for every option
             * (prune_mesh reads the mesh alone, so no option could rank one of them) */
            if (mesh_rej != MP_REJECT_NONE) return MP_OK;
          }
        }
      }
    }
  }
  return MP_OK;
}

/* The expert grid's EP sizes (exec/mesh.h) at expert-TP size etp: ep dividing the routed
 * experts, on a layout the mesh accepts (ep x etp consecutive ranks). Under DDP
 * (Megatron-Core) EP comes from the stage's data-parallel, context and tensor ranks; an ep
 * dividing dp_shard at etp 1 is the layout inside dp_shard unless the fix names etp=1.
 * Under FSDP EP comes from dp_shard x cp x tp alone (mp_rule_ep_grid_fsdp_ok; the meshplan
 * runtimes' plans may reach into dp_replicate too), searched where a fix names the etp:
 * beside the layout inside dp_shard even torchtitan's grids alone (ep a multiple of
 * tp x cp > 1) multiply the fitting plans to simulate for the same best plan (docs/design.md
 * gives DeepSeek-V3's counts and times), so the default search keeps torchtitan's default
 * layout. etp is 1 or tp,
 * the two torchtitan runs (parallel_dims.py, v0.2.0) and Megatron-Core's two common
 * settings (its default is tp; 1 in DeepSeek-V3's and Qwen3's recipes), or the size a fix
 * names (etp_sizes). */
static int grid_ep_ok(const mp_search_config *cfg, const mp_mesh *mesh, int ep, int etp) {
  const int dps = mesh->size[MP_DIM_DP_SHARD], tpcp = mesh->size[MP_DIM_CP] * mesh->size[MP_DIM_TP];
  const int stage = mp_mesh_world(mesh) / mesh->size[MP_DIM_PP], inner = dps * tpcp, named = cfg->fix.etp == etp;
  const int blk = ep * etp;
  if (!fixed_ok(cfg->fix.etp, etp) || ep <= 1 || cfg->model->n_experts % ep || !fixed_ok(cfg->fix.ep, ep) ||
      cfg->model->d_ff_expert % etp)
    return 0;
  /* the distributed optimizer's instances cut the expert-DP group too (mp_mesh_validate) */
  if (mp_mesh_dopt(mesh) > 1 && (stage % blk || (stage / blk) % mesh->dopt)) return 0;
  if (cfg->dp == MP_DP_DDP)
    return (dps % ep || named || etp > 1) && (inner % blk == 0 || (blk % inner == 0 && stage % blk == 0));
  /* the meshplan runtimes (executable_only) also run EP reaching into dp_replicate, the
   * experts' gradients summed over the expert-DP group (mp_mesh_expert_replica_group) */
  return named && (inner % blk == 0 || (cfg->executable_only && blk % inner == 0 && stage % blk == 0));
}

/* The expert-TP sizes searched at tensor-parallel size tp: 1 and tp (grid_ep_ok), and an
 * etp a fix names besides them, which Megatron-Core takes apart from tp
 * (--expert-tensor-parallel-size: any size whose ep x etp grid the stage's ranks hold,
 * parallel_state.py initialize_model_parallel, core_v0.14.0). */
static int etp_sizes(const mp_search_config *cfg, int tp, int out[3]) {
  int n = 0;
  out[n++] = 1;
  if (tp > 1) out[n++] = tp;
  if (cfg->fix.etp > 1 && cfg->fix.etp != tp) out[n++] = cfg->fix.etp;
  return n;
}

/* The expert-grid candidates of a dense mesh: each ep among the divisors of the stage's
 * ranks (divs[0 .. nd), up to r1) at each expert-TP size that grid_ep_ok takes. */
static mp_status enum_grid(enum_state *e, mp_mesh *mesh, const int *divs, int nd, int r1) {
  int etps[3];
  const int n_etp = etp_sizes(e->cfg, mesh->size[MP_DIM_TP], etps);
  mp_status st = MP_OK;
  for (int k = 0; k < nd && divs[k] <= r1 && st == MP_OK; k++)
    for (int j = 0; j < n_etp && st == MP_OK; j++)
      if (grid_ep_ok(e->cfg, mesh, divs[k], etps[j])) {
        mesh->ep = divs[k];
        mesh->etp = etps[j];
        st = enum_options(e, mesh);
      }
  return st;
}

/* The instances are Megatron-LM's DDP with its distributed optimizer (exec/mesh.h). */
static mp_status dopt_fix_check(mp_ctx *ctx, const mp_search_config *cfg) {
  if (cfg->fix.dopt <= 1 || cfg->ddp_shard_optimizer) return MP_OK;
  return mp_error(ctx, MP_ERR_USAGE, "dopt=%d: distributed-optimizer instances need a stack running Megatron-LM's "
                  "DDP with the distributed optimizer", cfg->fix.dopt);
}

mp_status mp_search_enumerate(mp_ctx *ctx, const mp_search_config *cfg, mp_search **out) {
  *out = NULL;
  if (!cfg->model || !cfg->cluster)
    return mp_error(ctx, MP_ERR_INVALID, "search needs a model and a cluster");
  const int64_t gb = cfg->target_batch > 0 ? cfg->target_batch : cfg->global_batch;
  if (cfg->seq < 1 || gb < 1)
    return mp_error(ctx, MP_ERR_USAGE, "seq (%lld) and global batch (%lld) must be >= 1",
                    (long long)cfg->seq, (long long)gb);
  /* the step's sizes bounded so that the plans' sizes fit (exec/model.h); the rule's batches
   * are under 1.5 times its target */
  MP_CHECK(mp_model_check_step(ctx, cfg->model, cfg->seq, 1, cfg->target_batch > 0 ? 2 * gb : gb));
  MP_CHECK(dopt_fix_check(ctx, cfg));
  int n = mp_cluster_n_gpus(cfg->cluster);
  if (n < 1 || n > MP_MESH_MAX_WORLD)
    return mp_error(ctx, MP_ERR_INVALID, "cluster %s has %d GPUs; need 1 .. %d", cfg->cluster->name,
                    n, MP_MESH_MAX_WORLD);
  double t0 = mp_now_s();
  mp_search *s = calloc(1, sizeof *s);
  MP_CHECK_ALLOC(ctx, s);
  s->arena = mp_arena_create();
  if (!s->arena) {
    free(s);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating the search arena");
  }
  /* Divisors of n, ascending: every factor of an ordered factorization is one. */
  int divs[1024], nd = 0;
  for (int d = 1; d <= n && nd < 1024; d++)
    if (n % d == 0) divs[nd++] = d;
  enum_state e = {cfg, s, 0, ctx, (double)mp_model_param_count(cfg->model), {0}, {0}, 0};
  const mp_search_fix *fx = &cfg->fix;
  int moe = mp_model_is_moe(cfg->model);
  mp_status st = MP_OK;
  for (int a = 0; a < nd && st == MP_OK; a++) {
    int pp = divs[a];
    if (!fixed_ok(fx->pp, pp)) continue;
    int r1 = n / pp;
    for (int b = 0; b < nd && divs[b] <= r1 && st == MP_OK; b++) {
      int dpr = divs[b];
      if (r1 % dpr || !fixed_ok(fx->dp_replicate, dpr)) continue;
      int r2 = r1 / dpr;
      for (int c = 0; c < nd && divs[c] <= r2 && st == MP_OK; c++) {
        int dps = divs[c];
        if (r2 % dps || !fixed_ok(fx->dp_shard, dps)) continue;
        int r3 = r2 / dps;
        for (int d = 0; d < nd && divs[d] <= r3 && st == MP_OK; d++) {
          int cp = divs[d];
          if (r3 % cp || !fixed_ok(fx->cp, cp)) continue;
          int tp = r3 / cp;
          if (!fixed_ok(fx->tp, tp)) continue;
          /* the distributed optimizer's instances where fixed: over dp_replicate alone */
          const int dopt = fx->dopt > 1 ? fx->dopt : 1;
          if (dopt > 1 && (dpr % dopt || dps > 1)) continue;
          mp_mesh mesh;
          mp_mesh_init(&mesh);
          mesh.dopt = dopt;
          mesh.size[MP_DIM_PP] = pp;
          mesh.size[MP_DIM_DP_REPLICATE] = dpr;
          mesh.size[MP_DIM_DP_SHARD] = dps;
          mesh.size[MP_DIM_CP] = cp;
          mesh.size[MP_DIM_TP] = tp;
          for (int ep = cfg->ep_only ? 2 : 1; ep <= dps && st == MP_OK; ep++) { /* ep_only: the flex dispatcher */
            if (dps % ep || (!moe && ep > 1) || (dopt > 1 && ep > 1) || !fixed_ok(fx->ep, ep) || !fixed_ok(fx->etp, 0))
              continue;
            mesh.ep = ep;
            mesh.etp = 0;
            st = enum_options(&e, &mesh);
          }
          if (moe && st == MP_OK) st = enum_grid(&e, &mesh, divs, nd, r1);
        }
      }
    }
  }
  if (st != MP_OK) {
    mp_search_destroy(s);
    return st;
  }
  s->enumerate_s = mp_now_s() - t0;
  *out = s;
  return MP_OK;
}

void mp_search_destroy(mp_search *s) {
  if (!s) return;
  free(s->cands);
  mp_arena_destroy(s->arena);
  free(s);
}

void mp_search_reject_counts(const mp_search *s, int64_t by[MP_REJECT_COUNT]) {
  memset(by, 0, sizeof(int64_t) * MP_REJECT_COUNT);
  for (int64_t i = 0; i < s->n; i++)
    if (s->cands[i].reject < MP_REJECT_COUNT) by[s->cands[i].reject]++;
}

int mp_search_reject_is_mesh_rule(mp_reject r) {
  switch (r) {
    case MP_REJECT_PP_LAYERS: case MP_REJECT_TP_HEADS: case MP_REJECT_TP_KV_HEADS: case MP_REJECT_TP_D_FF:
    case MP_REJECT_TP_D_MODEL: case MP_REJECT_TP_CROSS_NODE: case MP_REJECT_EP_EXPERTS: case MP_REJECT_CP_SEQ:
    case MP_REJECT_NO_FSDP: case MP_REJECT_MFSDP_EXPERTS: return 1;
    default: return 0;
  }
}

int mp_search_fix_matches(const mp_search_fix *f, const mp_candidate *c) {
  const mp_mesh *m = &c->mesh;
  const int mesh_ok = (f->pp < 0 || f->pp == m->size[MP_DIM_PP]) &&
                      (f->dp_replicate < 0 || f->dp_replicate == m->size[MP_DIM_DP_REPLICATE]) &&
                      (f->dp_shard < 0 || f->dp_shard == m->size[MP_DIM_DP_SHARD]) &&
                      (f->cp < 0 || f->cp == m->size[MP_DIM_CP]) && (f->tp < 0 || f->tp == m->size[MP_DIM_TP]) &&
                      (f->ep < 0 || f->ep == m->ep) && (f->dopt < 0 || f->dopt == mp_mesh_dopt(m));
  /* a candidate of a mesh the mesh rules reject stands for every option of its mesh */
  if (!mesh_ok || mp_search_reject_is_mesh_rule((mp_reject)c->reject)) return mesh_ok;
  return (f->ac < 0 || f->ac == c->ac) &&
         (f->ac < 0 || (f->ac_every < 0 ? 1 : f->ac_every) == (c->ac_every ? c->ac_every : 1)) &&
         (f->sp < 0 || f->sp == c->sp) && (f->pp_virtual < 0 || f->pp_virtual == c->pp_virtual) &&
         (f->fp8 < 0 || f->fp8 == c->fp8) && (f->reshard < 0 || f->reshard == c->reshard) &&
         (f->micro_batch < 0 || f->micro_batch == c->micro_batch);
}

int64_t mp_search_find(const mp_search *s, const mp_search_fix *fix) {
  for (int64_t i = 0; i < s->n; i++)
    if (mp_search_fix_matches(fix, &s->cands[i])) return i;
  return -1;
}
