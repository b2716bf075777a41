/* --from: torchtitan v0.2.0's job TOML into a plan (app/from_config.h).
 *
 * Keys, defaults and meanings from pytorch/torchtitan tag v0.2.0 (29624e37):
 * torchtitan/config/job_config.py (a key the file leaves out takes its default there:
 * data_parallel_shard_degree -1, the rest of the GPUs; activation_checkpoint mode
 * "selective" with option "2"; local_batch_size 8; seq_len 2048; compile off),
 * torchtitan/distributed/pipeline_parallel.py (the stages per rank) and
 * torchtitan/models/llama3/infra/parallelize.py (fsdp_reshard_after_forward "default": reshard
 * unless pipelined). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/emit.h"
#include "app/from_internal.h"
#include "app/toml.h"

/* Keys meshplan maps (read by the code below). */
static const char *const k_mapped[] = {
    "model.name", "model.flavor", "model.converters", "training.local_batch_size", "training.global_batch_size",
    "training.seq_len", "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
    "parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
    "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
    "parallelism.expert_tensor_parallel_degree", "parallelism.fsdp_reshard_after_forward", "parallelism.enable_async_tensor_parallel",
    "parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_layers_per_stage",
    "parallelism.pipeline_parallel_microbatch_size", "parallelism.context_parallel_rotate_method",
    "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option", "compile.enable",
    "compile.components", "quantize.linear.float8.recipe_name", "quantize.linear.mx.recipe_name",
    "quantize.linear.float8.enable_fsdp_float8_all_gather", "quantize.grouped_mm.float8.fqns",
    "quantize.grouped_mm.mx.fqns", "quantize.grouped_mm.mx.recipe_name",
};

/* Keys that change cost, read only at the one value meshplan prices (torchtitan's default,
 * as written in job_config.py; arrays as their items joined by ","). */
static const struct {
  const char *key, *value, *why;
} k_fixed[] = {
    {"training.mixed_precision_param", "bfloat16", "meshplan prices bf16 compute copies"},
    {"training.mixed_precision_reduce", "float32", "meshplan prices fp32 gradient reduction"},
    {"training.dtype", "float32", "meshplan prices fp32 parameters and optimizer state"},
    {"training.enable_cpu_offload", "false", "meshplan does not price CPU offload"},
    {"parallelism.disable_loss_parallel", "false", "meshplan prices the vocab-parallel loss"},
    {"parallelism.enable_compiled_autograd", "false", "meshplan does not price compiled autograd"},
    {"parallelism.pipeline_parallel_first_stage_less_layers", "1", "meshplan splits the layers its own way"},
    {"parallelism.pipeline_parallel_last_stage_less_layers", "1", "meshplan splits the layers its own way"},
    {"parallelism.pipeline_parallel_schedule_csv", "", "meshplan prices the named schedules only"},
    {"quantize.linear.float8.emulate", "false", "emulated float8 runs at another speed"},
    {"quantize.linear.float8.filter_fqns", "output", "meshplan keeps exactly the output Linear in bf16"},
    {"quantize.linear.mx.filter_fqns", "output", "meshplan keeps exactly the output Linear in bf16"},
    {"compile.backend", "inductor", "the torchtitan-compile stack is Inductor's"},
    {"optimizer.name", "AdamW", "meshplan prices AdamW's state"},
    {"optimizer.early_step_in_backward", "false", "meshplan prices the step after the backward"},
    {"fault_tolerance.enable", "false", "meshplan does not price torchft"},
};

/* Keys and tables that change no cost: logging, paths, schedules of the learning rate,
 * checkpoints (between steps), timeouts, the optimizer's hyper-parameters. */
static const char *const k_ignored[] = {
    "job.", "profiling.", "metrics.", "lr_scheduler.", "checkpoint.", "comm.", "memory_estimation.", "validation.",
    "experimental.", "fault_tolerance.", "optimizer.", "model.hf_assets_path", "model.tokenizer_path",
    "model.print_after_conversion", "training.dataset", "training.dataset_path", "training.max_norm",
    "training.steps", "training.seed", "training.deterministic", "training.gc_freq", "training.gc_debug",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", "activation_checkpoint.early_stop",
    "activation_checkpoint.visualize_memory_budget_pareto",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
    "quantize.linear.mx.mxfp8_dim1_cast_kernel_choice",
};

/* The value as k_fixed compares it. */
static void value_str(const mp_toml_kv *kv, char *buf, size_t cap) {
  if (kv->type != MP_TOML_ARRAY) {
    snprintf(buf, cap, "%s", kv->str);
    return;
  }
  buf[0] = '\0';
  for (int i = 0; i < kv->n_items; i++)
    snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", i ? "," : "", kv->items[i]);
}

/* Every key mapped, fixed at the priced value, or ignored; any other refused. */
static mp_status account(mp_ctx *ctx, const mp_toml *t, const char *origin, mp_from_plan *p) {
  for (int i = 0; i < t->n; i++) {
    const mp_toml_kv *kv = &t->kv[i];
    int known = 0;
    for (size_t k = 0; !known && k < sizeof k_mapped / sizeof k_mapped[0]; k++) known = !strcmp(kv->key, k_mapped[k]);
    for (size_t k = 0; !known && k < sizeof k_fixed / sizeof k_fixed[0]; k++) {
      if (strcmp(kv->key, k_fixed[k].key) != 0) continue;
      char v[512];
      value_str(kv, v, sizeof v);
      if (strcmp(v, k_fixed[k].value) != 0)
        return mp_error(ctx, MP_ERR_USAGE, "%s:%d: %s = %s changes cost in a way meshplan does not model "
                        "(%s); only \"%s\" is read", origin, kv->line, kv->key, kv->str, k_fixed[k].why,
                        k_fixed[k].value);
      known = 1;
    }
    for (size_t k = 0; !known && k < sizeof k_ignored / sizeof k_ignored[0]; k++) {
      const size_t n = strlen(k_ignored[k]);
      const int prefix = k_ignored[k][n - 1] == '.';
      if (prefix ? strncmp(kv->key, k_ignored[k], n) == 0 : strcmp(kv->key, k_ignored[k]) == 0) {
        mp_from_ignore(p, kv->key);
        known = 1;
      }
    }
    if (!known)
      return mp_error(ctx, MP_ERR_USAGE, "%s:%d: %s is not a torchtitan v0.2.0 key meshplan reads; it may "
                      "change cost, so it is refused: remove it", origin, kv->line, kv->key);
  }
  return MP_OK;
}

/* An integer key (absent: dflt) in lo..hi. */
static mp_status get_int(mp_ctx *ctx, const mp_toml *t, const char *origin, const char *key, int64_t dflt,
                         int64_t lo, int64_t hi, int64_t *out) {
  const mp_toml_kv *kv = mp_toml_get(t, key);
  *out = dflt;
  if (kv == NULL) return MP_OK;
  if (kv->type != MP_TOML_INT || kv->i < lo || kv->i > hi)
    return mp_error(ctx, MP_ERR_USAGE, "%s:%d: %s = %s: expected an integer in %lld..%lld", origin, kv->line,
                    key, kv->str, (long long)lo, (long long)hi);
  *out = kv->i;
  return MP_OK;
}

/* A string key (absent: dflt). */
static mp_status get_str(mp_ctx *ctx, const mp_toml *t, const char *origin, const char *key, const char *dflt,
                         const char **out) {
  const mp_toml_kv *kv = mp_toml_get(t, key);
  *out = dflt;
  if (kv == NULL) return MP_OK;
  if (kv->type != MP_TOML_STRING)
    return mp_error(ctx, MP_ERR_USAGE, "%s:%d: %s: expected a string", origin, kv->line, key);
  *out = kv->str;
  return MP_OK;
}

/* A boolean key (absent: dflt). */
static mp_status get_bool(mp_ctx *ctx, const mp_toml *t, const char *origin, const char *key, int dflt, int *out) {
  const mp_toml_kv *kv = mp_toml_get(t, key);
  *out = dflt;
  if (kv == NULL) return MP_OK;
  if (kv->type != MP_TOML_BOOL)
    return mp_error(ctx, MP_ERR_USAGE, "%s:%d: %s: expected true or false", origin, kv->line, key);
  *out = (int)kv->i;
  return MP_OK;
}

/* A converter's kind: 1 the Linears' float8, 2 their MX, 3 the grouped GEMMs' float8, 4
 * their MX; 0 another. torchtitan v0.2.0 registers "quantize.linear.float8",
 * "quantize.grouped_mm.float8" (components/quantization/float8.py), "quantize.linear.mx" and
 * "quantize.grouped_mm.mx" (mx.py); "float8" and "mx" are the Linears' older names. */
static int converter_kind(const char *c) {
  static const char *const names[] = {"float8", "mx", "quantize.linear.float8", "quantize.linear.mx",
                                      "quantize.grouped_mm.float8", "quantize.grouped_mm.mx"};
  static const int kinds[] = {1, 2, 1, 2, 3, 4};
  for (int k = 0; k < 6; k++)
    if (strcmp(c, names[k]) == 0) return kinds[k];
  return 0;
}

/* The Linears' recipe under converter kind 1 or 2 into *recipe. */
static mp_status linear_recipe(mp_ctx *ctx, const mp_toml *t, const char *origin, int kind, const char **recipe) {
  if (kind == 1) {
    /* torchao's Float8LinearConfig without a recipe name is tensorwise */
    MP_CHECK(get_str(ctx, t, origin, "quantize.linear.float8.recipe_name", "tensorwise", recipe));
    if (strcmp(*recipe, "tensorwise") != 0 && strcmp(*recipe, "rowwise") != 0)
      return mp_error(ctx, MP_ERR_USAGE, "%s: quantize.linear.float8.recipe_name = \"%s\": meshplan prices "
                      "tensorwise and rowwise", origin, *recipe);
    return MP_OK;
  }
  MP_CHECK(get_str(ctx, t, origin, "quantize.linear.mx.recipe_name", "mxfp8_cublas", recipe));
  if (strcmp(*recipe, "mxfp8_cublas") != 0 && strcmp(*recipe, "mxfp8") != 0)
    return mp_error(ctx, MP_ERR_USAGE, "%s: quantize.linear.mx.recipe_name = \"%s\": meshplan prices "
                    "MXFP8 (mxfp8_cublas)", origin, *recipe);
  *recipe = "mxfp8";
  return MP_OK;
}

/* The grouped GEMMs' recipe under converter kind 3 or 4 into *recipe, NULL where its fqns
 * convert no module: torchao's MoETrainingConfig() scales rowwise (float8.py's
 * Float8GroupedMMConverter), MXGroupedMM's recipe_name is "mxfp8" (config/job_config.py);
 * meshplan prices fqns ["experts"], the routed experts (GroupedExperts). */
static mp_status grouped_recipe(mp_ctx *ctx, const mp_toml *t, const char *origin, int kind, const char **recipe) {
  const char *key = kind == 3 ? "quantize.grouped_mm.float8.fqns" : "quantize.grouped_mm.mx.fqns";
  const mp_toml_kv *f = mp_toml_get(t, key);
  const char *one = f == NULL ? NULL : f->type == MP_TOML_STRING ? f->str : f->n_items == 1 ? f->items[0] : NULL;
  *recipe = NULL;
  if (f == NULL || (f->type == MP_TOML_ARRAY && f->n_items == 0) || (one && one[0] == 0)) return MP_OK;
  if (one == NULL || strcmp(one, "experts") != 0)
    return mp_error(ctx, MP_ERR_USAGE, "%s:%d: %s = %s: meshplan prices the routed experts' grouped GEMMs, "
                    "fqns = [\"experts\"]", origin, f->line, key, f->str);
  if (kind == 3) {
    *recipe = "rowwise";
    return MP_OK;
  }
  MP_CHECK(get_str(ctx, t, origin, "quantize.grouped_mm.mx.recipe_name", "mxfp8", recipe));
  if (strcmp(*recipe, "mxfp8") != 0)
    return mp_error(ctx, MP_ERR_USAGE, "%s: quantize.grouped_mm.mx.recipe_name = \"%s\": meshplan prices "
                    "mxfp8", origin, *recipe);
  return MP_OK;
}

/* model.converters: at most one of the Linears' and one of the grouped GEMMs', under one
 * recipe (meshplan prices one a plan), into p->fp8 and p->fp8_scope. */
static mp_status read_converters(mp_ctx *ctx, const mp_toml *t, const char *origin, mp_from_plan *p) {
  const mp_toml_kv *conv = mp_toml_get(t, "model.converters");
  if (conv == NULL) return MP_OK;
  int lin = 0, grp = 0, bad = conv->type != MP_TOML_ARRAY;
  for (int i = 0; !bad && i < conv->n_items; i++) {
    const int k = converter_kind(conv->items[i]);
    if (k == 0 || (k <= 2 && lin) || (k >= 3 && grp)) bad = 1;
    if (k <= 2) lin = k;
    else grp = k;
  }
  if (bad)
    return mp_error(ctx, MP_ERR_USAGE, "%s:%d: model.converters = %s: meshplan reads at most one of "
                    "\"quantize.linear.float8\" (\"float8\"), \"quantize.linear.mx\" (\"mx\") and one of "
                    "\"quantize.grouped_mm.float8\", \"quantize.grouped_mm.mx\"", origin, conv->line,
                    conv->str[0] ? conv->str : "that list");
  const char *lr = NULL, *gr = NULL;
  if (lin) MP_CHECK(linear_recipe(ctx, t, origin, lin, &lr));
  if (lin == 1) MP_CHECK(get_bool(ctx, t, origin, "quantize.linear.float8.enable_fsdp_float8_all_gather", 0, &p->fp8_all_gather));
  if (grp) MP_CHECK(grouped_recipe(ctx, t, origin, grp, &gr));
  if (lr && gr && strcmp(lr, gr) != 0)
    return mp_error(ctx, MP_ERR_USAGE, "%s: the Linears in %s and the grouped GEMMs in %s: meshplan prices one "
                    "float8 recipe a plan", origin, lr, gr);
  snprintf(p->fp8, sizeof p->fp8, "%s", lr ? lr : gr ? gr : "");
  snprintf(p->fp8_scope, sizeof p->fp8_scope, "%s", lr && gr ? "all" : gr ? "experts" : "");
  return MP_OK;
}

/* [model] name and flavor, converters and the float8 recipe. */
static mp_status read_model(mp_ctx *ctx, const mp_toml *t, const char *origin, mp_from_plan *p) {
  const char *name = NULL, *flavor = NULL;
  MP_CHECK(get_str(ctx, t, origin, "model.name", "llama3", &name));
  MP_CHECK(get_str(ctx, t, origin, "model.flavor", "debugmodel", &flavor));
  const char *m = mp_emit_torchtitan_model_of(name, flavor);
  if (m == NULL)
    return mp_error(ctx, MP_ERR_USAGE, "%s: model %s flavor %s has no meshplan model (meshplan reads llama3 "
                    "8B, 70B, 405B; deepseek_v3 671B; qwen3 8B, 30B-A3B)", origin, name, flavor);
  snprintf(p->model, sizeof p->model, "%s", m);
  return read_converters(ctx, t, origin, p);
}

/* expert_tensor_parallel_degree > 1 (parallel_dims.py, v0.2.0): torchtitan takes it equal to
 * tp ("Currently we only support ETP=TP or ETP=1"), its EP then borrowing all of cp and part
 * of dp_shard (ep a multiple of cp dividing dp_shard x cp); the experts split over tp
 * (ExpertTensorParallel, torchtitan/distributed/expert_parallel.py): meshplan's etp = tp. */
static mp_status read_etp(mp_ctx *ctx, const char *origin, int etp, mp_from_plan *p) {
  if (etp != p->tp)
    return mp_error(ctx, MP_ERR_USAGE, "%s: parallelism.expert_tensor_parallel_degree = %d with "
                    "tensor_parallel_degree %d: torchtitan supports 1 or the tp degree only", origin, etp, p->tp);
  if (p->ep > 1 && (p->ep % p->cp || (p->dp_shard * p->cp) % p->ep))
    return mp_error(ctx, MP_ERR_USAGE, "%s: parallelism.expert_parallel_degree = %d with expert_tensor_parallel_degree "
                    "= tp: torchtitan borrows all of cp (%d) and part of dp_shard (%d): a multiple of %d dividing %d",
                    origin, p->ep, p->cp, p->dp_shard, p->cp, p->dp_shard * p->cp);
  p->etp = etp;
  return MP_OK;
}

/* The degrees, -1 (one of them at most) as the rest of world. */
static mp_status read_degrees(mp_ctx *ctx, const mp_toml *t, const char *origin, int world, mp_from_plan *p) {
  static const char *const keys[] = {"parallelism.pipeline_parallel_degree", "parallelism.data_parallel_replicate_degree",
                                     "parallelism.data_parallel_shard_degree", "parallelism.context_parallel_degree",
                                     "parallelism.tensor_parallel_degree", "parallelism.expert_parallel_degree"};
  int *dims[] = {&p->pp, &p->dp_replicate, &p->dp_shard, &p->cp, &p->tp, &p->ep};
  int64_t v[6], product = 1;
  int rest = -1;
  for (int k = 0; k < 6; k++) {
    MP_CHECK(get_int(ctx, t, origin, keys[k], k == 2 ? -1 : 1, k == 5 ? 1 : -1, 1 << 20, &v[k]));
    if (v[k] == 0 || (v[k] == -1 && rest >= 0))
      return mp_error(ctx, MP_ERR_USAGE, "%s: %s = %lld: a degree is positive, or -1 for one of them", origin,
                      keys[k], (long long)v[k]);
    if (v[k] == -1) rest = k;
    else if (k < 5) product *= v[k];
  }
  if (rest >= 0) {
    if (world <= 0)
      return mp_error(ctx, MP_ERR_USAGE, "%s: %s = -1 takes the rest of the GPUs: give --gpus N or --cluster C",
                      origin, keys[rest]);
    if (world % product)
      return mp_error(ctx, MP_ERR_USAGE, "%s: %s = -1: the other degrees (%lld) do not divide the %d GPUs",
                      origin, keys[rest], (long long)product, world);
    v[rest] = world / product;
  }
  for (int k = 0; k < 6; k++) *dims[k] = (int)v[k];
  int64_t etp;
  MP_CHECK(get_int(ctx, t, origin, "parallelism.expert_tensor_parallel_degree", 1, 1, 1 << 20, &etp));
  if (etp > 1) return read_etp(ctx, origin, (int)etp, p);
  /* parallel_dims.py (v0.2.0), expert_tensor_parallel_degree 1: the EP mesh spans whole
   * tp x cp groups and a part of dp_shard, meshplan's expert grid (etp=1) */
  const int tpcp = p->tp * p->cp;
  if (p->ep > 1 && tpcp > 1 && (p->ep % tpcp || (p->dp_shard * tpcp) % p->ep))
    return mp_error(ctx, MP_ERR_USAGE, "%s: parallelism.expert_parallel_degree = %d: with tensor and context "
                    "parallel degrees %d x %d torchtitan takes whole tp x cp groups and the rest from dp_shard "
                    "(%d): a multiple of %d dividing %d", origin, p->ep, p->tp, p->cp, p->dp_shard, tpcp,
                    p->dp_shard * tpcp);
  p->etp = p->ep > 1 && tpcp > 1;
  return MP_OK;
}

/* The schedule, the stages per rank and the pipeline's micro-batch. */
static mp_status read_pipeline(mp_ctx *ctx, const mp_toml *t, const char *origin, const mp_model *m, mp_from_plan *p) {
  const char *s = NULL;
  MP_CHECK(get_str(ctx, t, origin, "parallelism.pipeline_parallel_schedule", "1F1B", &s));
  /* torch's get_schedule_class names, matched as it matches them (mp_pp_schedule_parse);
   * DualPipeV, LoopedBFS and the CSV schedules are not priced */
  if (!mp_pp_schedule_parse(s, &p->pp_schedule) || p->pp_schedule == MP_PP_DUALPIPE || strcmp(s, "zbv") == 0 ||
      strcmp(s, "interleaved_zb") == 0 || strcmp(s, "interleaved") == 0)
    return mp_error(ctx, MP_ERR_USAGE, "%s: parallelism.pipeline_parallel_schedule = \"%s\": meshplan prices "
                    "1F1B, Interleaved1F1B, GPipe, InterleavedZeroBubble and ZBVZeroBubble", origin, s);
  /* PipelineScheduleMulti's subclasses take a stage list: 2 a rank unless layers_per_stage
   * says otherwise; the V schedules exactly 2 (pipeline_parallel.py's style "v" asserts it) */
  const int looped = p->pp_schedule == MP_PP_INTERLEAVED || p->pp_schedule == MP_PP_INTERLEAVED_ZB ||
                     p->pp_schedule == MP_PP_ZBV;
  int64_t lps = 0;
  MP_CHECK(get_int(ctx, t, origin, "parallelism.pipeline_parallel_layers_per_stage", 0, 1, MP_MAX_LAYERS, &lps));
  /* pipeline_parallel.py: ceil((layers + 1 + 1) / layers_per_stage) stages, else 1 or 2 per rank */
  const int64_t stages = lps ? (m->n_layers + 2 + lps - 1) / lps : (int64_t)p->pp * (looped ? 2 : 1);
  if (stages % p->pp || (looped ? stages / p->pp < 2 : stages / p->pp != 1) ||
      (p->pp_schedule == MP_PP_ZBV && stages / p->pp != 2))
    return mp_error(ctx, MP_ERR_USAGE, "%s: pipeline_parallel_layers_per_stage = %lld makes %lld stages over "
                    "pp=%d, which torchtitan refuses for %s", origin, (long long)lps, (long long)stages, p->pp, s);
  p->pp_virtual = (int)(stages / p->pp);
  return get_int(ctx, t, origin, "parallelism.pipeline_parallel_microbatch_size", 1, 1, 1 << 24, &p->micro_batch);
}

/* [activation_checkpoint] as meshplan's policy. */
static mp_status read_ac(mp_ctx *ctx, const mp_toml *t, const char *origin, mp_from_plan *p) {
  const char *mode = NULL, *opt = NULL;
  MP_CHECK(get_str(ctx, t, origin, "activation_checkpoint.mode", "selective", &mode));
  MP_CHECK(get_str(ctx, t, origin, "activation_checkpoint.selective_ac_option", "2", &opt));
  if (strcmp(mode, "none") == 0 || strcmp(mode, "full") == 0) {
    snprintf(p->ac, sizeof p->ac, "%s", mode);
    return MP_OK;
  }
  if (strcmp(mode, "selective") != 0)
    return mp_error(ctx, MP_ERR_USAGE, "%s: activation_checkpoint.mode = \"%s\": meshplan prices none, "
                    "selective and full (not the compiler's memory_budget)", origin, mode);
  if (strcmp(opt, "op") == 0) {
    snprintf(p->ac, sizeof p->ac, "selective-op");
    return MP_OK;
  }
  char *end = NULL;
  const long n = strtol(opt, &end, 10);
  if (end == opt || *end || n < 1 || n > MP_MAX_LAYERS)
    return mp_error(ctx, MP_ERR_USAGE, "%s: activation_checkpoint.selective_ac_option = \"%s\": \"op\" or a "
                    "positive integer", origin, opt);
  /* selective with N: every N-th block recomputed whole, meshplan's full:N */
  if (n == 1) snprintf(p->ac, sizeof p->ac, "full");
  else snprintf(p->ac, sizeof p->ac, "full:%ld", n);
  return MP_OK;
}

/* [training]'s batch: with a pipeline the local batch is the rank's share of the step, run
 * as micro-batches of pipeline_parallel_microbatch_size; without, it is the micro-batch and
 * global_batch_size (-1: local x dp) accumulates. */
static mp_status read_batch(mp_ctx *ctx, const mp_toml *t, const char *origin, mp_from_plan *p) {
  int64_t local = 0, global = 0;
  MP_CHECK(get_int(ctx, t, origin, "training.local_batch_size", 8, 1, 1 << 24, &local));
  MP_CHECK(get_int(ctx, t, origin, "training.global_batch_size", -1, -1, 1 << 24, &global));
  MP_CHECK(get_int(ctx, t, origin, "training.seq_len", 2048, 1, 1 << 24, &p->seq));
  const int64_t dp = (int64_t)p->dp_replicate * p->dp_shard;
  if (global == 0 || (global > 0 && global % (local * dp)))
    return mp_error(ctx, MP_ERR_USAGE, "%s: training.global_batch_size = %lld is not a multiple of "
                    "local_batch_size x dp = %lld", origin, (long long)global, (long long)(local * dp));
  p->global_batch = global > 0 ? global : local * dp;
  if (p->pp > 1) {
    if (p->global_batch != local * dp)
      return mp_error(ctx, MP_ERR_USAGE, "%s: gradient accumulation over a pipeline (global_batch_size %lld, "
                      "local_batch_size x dp %lld): meshplan prices a step as one pipeline flush", origin,
                      (long long)p->global_batch, (long long)(local * dp));
    if (local % p->micro_batch)
      return mp_error(ctx, MP_ERR_USAGE, "%s: pipeline_parallel_microbatch_size %lld does not divide "
                      "local_batch_size %lld", origin, (long long)p->micro_batch, (long long)local);
  } else {
    p->micro_batch = local;
  }
  return MP_OK;
}

/* What the plan's options say besides the model, the degrees, the pipeline, AC and batch. */
static mp_status read_switches(mp_ctx *ctx, const mp_toml *t, const char *origin, mp_from_plan *p) {
  int compile = 0, async_tp = 0;
  MP_CHECK(get_bool(ctx, t, origin, "compile.enable", 0, &compile));
  const mp_toml_kv *comp = mp_toml_get(t, "compile.components");
  int model = comp == NULL;
  for (int i = 0; comp && i < comp->n_items; i++) model |= strcmp(comp->items[i], "model") == 0;
  if (compile && !model)
    return mp_error(ctx, MP_ERR_USAGE, "%s: compile.components without \"model\": meshplan's "
                    "torchtitan-compile stack compiles the model", origin);
  snprintf(p->stack, sizeof p->stack, "%s", compile ? "torchtitan-compile" : "torchtitan-eager");
  MP_CHECK(get_bool(ctx, t, origin, "parallelism.enable_async_tensor_parallel", 0, &async_tp));
  /* false (torchtitan's default) is both torchtitan stacks' own: neither runs AsyncTP unless
   * asked (data/stacks/torchtitan-compile.json, async_tp_source) */
  p->async_tp = async_tp && p->tp > 1;
  const char *rs = NULL, *rot = NULL;
  MP_CHECK(get_str(ctx, t, origin, "parallelism.fsdp_reshard_after_forward", "default", &rs));
  if (strcmp(rs, "default") && strcmp(rs, "always") && strcmp(rs, "never"))
    return mp_error(ctx, MP_ERR_USAGE, "%s: parallelism.fsdp_reshard_after_forward = \"%s\": default, "
                    "always or never", origin, rs);
  p->reshard = strcmp(rs, "always") == 0 || (strcmp(rs, "default") == 0 && p->pp == 1);
  MP_CHECK(get_str(ctx, t, origin, "parallelism.context_parallel_rotate_method", "allgather", &rot));
  if (strcmp(rot, "allgather") && strcmp(rot, "alltoall"))
    return mp_error(ctx, MP_ERR_USAGE, "%s: parallelism.context_parallel_rotate_method = \"%s\": allgather "
                    "or alltoall", origin, rot);
  if (p->cp > 1) snprintf(p->cp_rotate, sizeof p->cp_rotate, "%s", rot);
  p->sp = -1; /* torchtitan's TP is always sequence-parallel: the stack's default */
  return MP_OK;
}

mp_status mp_from_torchtitan(mp_ctx *ctx, const char *text, const char *origin, int world, mp_from_plan *p) {
  p->framework = "torchtitan v0.2.0";
  mp_toml t;
  mp_status st = mp_toml_parse(ctx, text, origin, &t);
  if (st == MP_OK) st = account(ctx, &t, origin, p);
  if (st == MP_OK) st = read_model(ctx, &t, origin, p);
  mp_model m;
  if (st == MP_OK) st = mp_model_load(ctx, p->model, &m);
  if (st == MP_OK) st = read_degrees(ctx, &t, origin, world, p);
  p->pp_schedule = MP_PP_1F1B;
  p->pp_virtual = 1;
  p->micro_batch = 1;
  if (st == MP_OK && p->pp > 1) st = read_pipeline(ctx, &t, origin, &m, p);
  if (st == MP_OK) st = read_ac(ctx, &t, origin, p);
  if (st == MP_OK) st = read_batch(ctx, &t, origin, p);
  if (st == MP_OK) st = read_switches(ctx, &t, origin, p);
  mp_toml_free(&t);
  return st;
}
