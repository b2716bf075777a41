/* A plan as torchtitan v0.2.0's job-config TOML (app/emit.h).
 *
 * Keys and their meaning from pytorch/torchtitan tag v0.2.0 (29624e37):
 * torchtitan/config/job_config.py (Model, Training, Parallelism, ActivationCheckpoint, Compile,
 * Quantize), torchtitan/distributed/pipeline_parallel.py (stages per rank from
 * pipeline_parallel_layers_per_stage), torchtitan/models/llama3/infra/parallelize.py
 * (fsdp_reshard_after_forward "default": reshard unless pipelined). Every key that changes
 * what meshplan predicts is written out, defaults included, so the file says the plan whole
 * and the reader (app/from_config.c) needs no default of torchtitan's to read it back. */
#include <stdio.h>
#include <string.h>

#include "app/emit_internal.h"
#include "exec/rules.h"

/* torchtitan's names of the schedules (torch.distributed.pipelining's classes, which
 * pipeline_parallel_schedule names). */
static const char *schedule_name(mp_pp_schedule s) {
  static const char *const names[] = {"1F1B", "Interleaved1F1B", "GPipe", "", "ZBVZeroBubble", "InterleavedZeroBubble"};
  return (unsigned)s <= MP_PP_INTERLEAVED_ZB && names[s][0] ? names[s] : "1F1B";
}

/* [activation_checkpoint]: torchtitan's mode "none", "full", "selective" with "op" (its op
 * policy) or "N" (every N-th block fully recomputed, counted from 1: meshplan's full:N). */
static mp_status write_ac(mp_ctx *ctx, const mp_emit_plan *p, mp_emit_buf *b) {
  const mp_plan_options *o = p->o;
  const char *mode = NULL, *option = NULL;
  char every[24];
  if (o->recompute_method != MP_RECOMPUTE_NONE)
    return mp_error(ctx, MP_ERR_USAGE, "--emit torchtitan: recompute method %s is Megatron-Core's; torchtitan "
                    "v0.2.0 checkpoints every block or every N-th (plan with --ac full or full:N)",
                    mp_recompute_method_name(o->recompute_method));
  if (o->ac == MP_AC_NONE) mode = "none";
  else if (o->ac == MP_AC_SELECTIVE_OP) mode = "selective", option = "op";
  else if (o->ac == MP_AC_FULL && o->ac_every <= 1) mode = "full";
  else if (o->ac == MP_AC_FULL) {
    snprintf(every, sizeof every, "%d", o->ac_every);
    mode = "selective", option = every;
  }
  if (mode == NULL)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--emit torchtitan: ac %s has no torchtitan v0.2.0 policy (activation_checkpoint.mode "
                    "none, selective with selective_ac_option \"op\" or N, or full); plan with --ac "
                    "none, selective-op, full or full:N",
                    o->ac == MP_AC_SELECTIVE ? "selective (the attention module)" : "selective-core (Megatron's)");
  mp_emit_printf(b, "\n[activation_checkpoint]\nmode = \"%s\"\n", mode);
  if (option) mp_emit_printf(b, "selective_ac_option = \"%s\"\n", option);
  return MP_OK;
}

/* [quantize.linear.float8] (torchao's Float8Linear: tensorwise or rowwise scales) or
 * [quantize.linear.mx] (MXFP8), named by [model] converters; the output Linear stays bf16 as
 * meshplan's float8 pass keeps it. */
static mp_status write_fp8(mp_ctx *ctx, const mp_emit_plan *p, mp_emit_buf *b) {
  const mp_fp8_recipe r = p->o->fp8_opts.recipe;
  const mp_fp8_scope sc = p->o->fp8_opts.scope;
  /* the routed experts' grouped GEMMs (torchtitan v0.2.0 config/job_config.py, Float8GroupedMM
   * and MXGroupedMM; the pass allows rowwise and mxfp8 alone) */
  if (sc != MP_FP8_SCOPE_LINEARS)
    mp_emit_printf(b, r == MP_FP8_MXFP8 ? "\n[quantize.grouped_mm.mx]\nrecipe_name = \"mxfp8\"\nfqns = [\"experts\"]\n"
                                        : "\n[quantize.grouped_mm.float8]\nfqns = [\"experts\"]\n");
  if (sc == MP_FP8_SCOPE_EXPERTS) return MP_OK;
  if (r == MP_FP8_TENSORWISE || r == MP_FP8_ROWWISE) {
    mp_emit_printf(b, "\n[quantize.linear.float8]\nrecipe_name = \"%s\"\nenable_fsdp_float8_all_gather = %s\n"
                   "precompute_float8_dynamic_scale_for_fsdp = %s\nfilter_fqns = [\"output\"]\n",
                   r == MP_FP8_TENSORWISE ? "tensorwise" : "rowwise", p->o->fp8_opts.all_gather ? "true" : "false",
                   p->o->fp8_opts.all_gather ? "true" : "false");
    return MP_OK;
  }
  if (r == MP_FP8_MXFP8) {
    mp_emit_printf(b, "\n[quantize.linear.mx]\nrecipe_name = \"mxfp8_cublas\"\nfilter_fqns = [\"output\"]\n");
    return MP_OK;
  }
  return mp_error(ctx, MP_ERR_USAGE,
                  "--emit torchtitan: float8 recipe %s is not torchtitan v0.2.0's (quantize.linear.float8 "
                  "recipe_name tensorwise or rowwise, quantize.linear.mx mxfp8); plan with --fp8 tensorwise, "
                  "rowwise or mxfp8, or emit megatron", mp_fp8_recipe_name(r));
}

/* [model] converters: the Linears' ("float8" or "mx"), or under a grouped-GEMM scope
 * torchtitan v0.2.0's registered names (components/quantization/float8.py and mx.py). */
static void write_converters(mp_emit_buf *b, const mp_plan_options *o) {
  const int mx = o->fp8_opts.recipe == MP_FP8_MXFP8;
  const char *lin = mx ? "quantize.linear.mx" : "quantize.linear.float8";
  const char *grp = mx ? "quantize.grouped_mm.mx" : "quantize.grouped_mm.float8";
  if (o->fp8_opts.scope == MP_FP8_SCOPE_LINEARS)
    mp_emit_printf(b, "converters = [\"%s\"]\n", mx ? "mx" : "float8");
  else if (o->fp8_opts.scope == MP_FP8_SCOPE_EXPERTS)
    mp_emit_printf(b, "converters = [\"%s\"]\n", grp);
  else
    mp_emit_printf(b, "converters = [\"%s\", \"%s\"]\n", lin, grp);
}

/* The stages per rank as pipeline_parallel_layers_per_stage states them: torchtitan makes
 * ceil((layers + 1 + 1) / layers_per_stage) virtual stages (the embedding and the output each
 * weigh one layer: pipeline_parallel_first/last_stage_less_layers, default 1). */
static mp_status layers_per_stage(mp_ctx *ctx, const mp_emit_plan *p, int64_t *out) {
  if (p->o->n_pp_layers > 0)
    return mp_error(ctx, MP_ERR_USAGE, "--emit torchtitan: a stated stage layout (--pp-layers) is not one "
                    "pipeline_parallel_layers_per_stage gives; drop --pp-layers or emit megatron");
  const int64_t stages = (int64_t)p->mesh->size[MP_DIM_PP] * (p->o->pp_virtual > 1 ? p->o->pp_virtual : 1);
  const int64_t weighted = p->model->n_layers + 2;
  const int64_t lps = (weighted + stages - 1) / stages;
  if ((weighted + lps - 1) / lps != stages)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--emit torchtitan: %lld pipeline stages of %s's %lld layers: no "
                    "pipeline_parallel_layers_per_stage gives that many (torchtitan counts the "
                    "embedding and output as a layer each); plan with fewer virtual stages",
                    (long long)stages, p->model->name, (long long)p->model->n_layers);
  *out = lps;
  return MP_OK;
}

/* What torchtitan cannot run as meshplan plans it, refused before anything is written. */
static mp_status check_plan(mp_ctx *ctx, const mp_emit_plan *p, const char **name, const char **flavor) {
  if (p->mesh->size[MP_DIM_PP] > 1 && p->o->pp_schedule == MP_PP_DUALPIPE)
    return mp_error(ctx, MP_ERR_USAGE, "--emit torchtitan: torchtitan v0.2.0 runs no DualPipe schedule; plan "
                    "with --pp-schedule 1f1b, interleaved or gpipe");
  if (p->model->mtp_layers > 0)
    return mp_error(ctx, MP_ERR_USAGE, "--emit torchtitan: torchtitan v0.2.0 builds no multi-token-prediction "
                    "module (%s has %lld); plan with --mtp-num-layers 0, or emit megatron", p->model->name,
                    (long long)p->model->mtp_layers);
  if (p->o->fp8_act_cache || p->o->moment_dtype != MP_DTYPE_FP32)
    return mp_error(ctx, MP_ERR_USAGE, "--emit torchtitan: torchtitan v0.2.0 has no option for %s; drop it",
                    p->o->fp8_act_cache ? "DeepSeek-V3's float8 activation cache (--fp8-act-cache)"
                                        : "bf16 AdamW moments (--optimizer-moments bf16)");
  if (p->o->fsdp.reduce_dtype != MP_DTYPE_FP32)
    return mp_error(ctx, MP_ERR_USAGE, "--emit torchtitan: the job config is written with "
                    "training.mixed_precision_reduce = \"float32\" (torchtitan's FSDP2 default); the plan "
                    "reduces in %s (FSDP1's MixedPrecision, --fsdp-reduce-dtype): drop it",
                    mp_dtype_name(p->o->fsdp.reduce_dtype));
  if (p->o->fsdp.flat_params)
    return mp_error(ctx, MP_ERR_USAGE, "--emit torchtitan: torchtitan runs FSDP2 (fully_shard); the plan runs "
                    "FSDP1's flat parameters (--fsdp-flat-params): drop it");
  /* ChunkedCELoss came with 786e26f8e (April 2026), after v0.2.x's TOML job config, as a
   * config_registry loss (Trainer.Config.loss): no TOML key writes it */
  if (p->o->loss_chunks > 1)
    return mp_error(ctx, MP_ERR_USAGE, "--emit torchtitan: torchtitan v0.2.0's job config has no chunked loss; "
                    "the plan runs the head and loss in %d chunks (--loss-chunks, ChunkedLossWrapper of later "
                    "torchtitan's config registry): drop it", p->o->loss_chunks);
  /* the reader maps compile.enable back to these two profiles, so only they round-trip */
  if (strcmp(p->stack->name, "torchtitan-compile") != 0 && strcmp(p->stack->name, "torchtitan-eager") != 0)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--emit torchtitan: the plan was predicted under stack %s, not torchtitan's; plan with "
                    "--stack torchtitan-compile or torchtitan-eager", p->stack->name);
  if (!mp_emit_torchtitan_model(p->model->name, name, flavor))
    return mp_error(ctx, MP_ERR_USAGE,
                    "--emit torchtitan: torchtitan v0.2.0 ships no flavor of %s (its models: llama3 8B, 70B, "
                    "405B as llama3.1-8b, -70b, -405b; deepseek_v3 671B; qwen3 8B, 30B-A3B)", p->model->name);
  const mp_mesh *m = p->mesh;
  if (m->size[MP_DIM_TP] > 1 && p->o->sp == 0)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--emit torchtitan: tp=%d without sequence parallelism: torchtitan v0.2.0's TP always "
                    "shards the norms on the sequence (SequenceParallel); plan without --no-sp",
                    m->size[MP_DIM_TP]);
  /* torchtitan/distributed/parallel_dims.py (v0.2.0): with expert_tensor_parallel_degree 1
   * the EP mesh is dp_shard_in_ep x cp x tp, whole tp x cp groups and a part of dp_shard:
   * meshplan's expert grid (etp=1) under mp_rule_ep_grid_torchtitan_ok; with etp = tp it is
   * dp_shard_in_ep x cp, which the plan's own rule (mp_rule_etp_check) has taken */
  const int tpcp = m->size[MP_DIM_TP] * m->size[MP_DIM_CP];
  if (m->ep > 1 && tpcp > 1 && m->etp <= 1 && (!mp_mesh_expert_grid(m) || !mp_rule_ep_grid_torchtitan_ok(m)))
    return mp_error(ctx, MP_ERR_USAGE,
                    "--emit torchtitan: ep=%d with tp x cp = %d: torchtitan v0.2.0's expert_parallel_degree "
                    "(expert_tensor_parallel_degree 1) spans whole tp x cp groups and borrows the rest from "
                    "dp_shard; plan the expert grid (etp=1 in --mesh) with ep a multiple of tp x cp dividing "
                    "dp_shard x cp x tp", m->ep, tpcp);
  return MP_OK;
}

/* [parallelism]: every degree written, -1 never (the file holds the plan's world). */
static mp_status write_parallelism(mp_ctx *ctx, const mp_emit_plan *p, mp_emit_buf *b) {
  const mp_mesh *m = p->mesh;
  const mp_plan_options *o = p->o;
  mp_emit_printf(b, "\n[parallelism]\ndata_parallel_replicate_degree = %d\ndata_parallel_shard_degree = %d\n"
                 "fsdp_reshard_after_forward = \"%s\"\ntensor_parallel_degree = %d\n"
                 "enable_async_tensor_parallel = %s\npipeline_parallel_degree = %d\n",
                 m->size[MP_DIM_DP_REPLICATE], m->size[MP_DIM_DP_SHARD],
                 o->fsdp.reshard_after_forward ? "always" : "never", m->size[MP_DIM_TP],
                 o->tp_comm_fused && o->sp > 0 && m->size[MP_DIM_TP] > 1 ? "true" : "false", m->size[MP_DIM_PP]);
  if (m->size[MP_DIM_PP] > 1) {
    int64_t lps = 0;
    MP_CHECK(layers_per_stage(ctx, p, &lps));
    mp_emit_printf(b, "pipeline_parallel_schedule = \"%s\"\npipeline_parallel_layers_per_stage = %lld\n"
                   "pipeline_parallel_microbatch_size = %lld\n", schedule_name(o->pp_schedule), (long long)lps,
                   (long long)o->micro_batch);
  }
  mp_emit_printf(b, "context_parallel_degree = %d\n", m->size[MP_DIM_CP]);
  if (m->size[MP_DIM_CP] > 1)
    mp_emit_printf(b, "context_parallel_rotate_method = \"%s\"\n", mp_cp_rotate_name(o->cp_rotate));
  mp_emit_printf(b, "expert_parallel_degree = %d\nexpert_tensor_parallel_degree = %d\n", m->ep, m->etp > 1 ? m->etp : 1);
  return MP_OK;
}

mp_status mp_emit_torchtitan(mp_ctx *ctx, const mp_emit_plan *p, const char *file_name, mp_emit_buf *b) {
  const char *name = NULL, *flavor = NULL;
  MP_CHECK(check_plan(ctx, p, &name, &flavor));
  const mp_plan_options *o = p->o;
  char launch[1200];
  snprintf(launch, sizeof launch, "-m torchtitan.train --job.config_file %s", file_name);
  mp_emit_header(b, MP_EMIT_TORCHTITAN, p, launch);
  mp_emit_printf(b, "\n[job]\ndescription = \"meshplan plan: %s\"\ndump_folder = \"./outputs\"\n", p->model->name);
  mp_emit_printf(b, "\n[model]\nname = \"%s\"\nflavor = \"%s\"\n", name, flavor);
  if (o->fp8) write_converters(b, o);
  /* Without a pipeline a data-parallel rank runs micro-batches of local_batch_size and
   * accumulates gradients up to global_batch_size; with one, the local batch is the rank's
   * share of the step, split into micro-batches of pipeline_parallel_microbatch_size. */
  const int64_t local = p->mesh->size[MP_DIM_PP] > 1 ? o->global_batch / mp_emit_dp(p->mesh) : o->micro_batch;
  mp_emit_printf(b, "\n[training]\nlocal_batch_size = %lld\nglobal_batch_size = %lld\nseq_len = %lld\n"
                 "steps = 1000  # a placeholder: your run's length\nmixed_precision_param = \"bfloat16\"\n"
                 "mixed_precision_reduce = \"float32\"\n", (long long)local, (long long)o->global_batch,
                 (long long)o->seq);
  MP_CHECK(write_parallelism(ctx, p, b));
  MP_CHECK(write_ac(ctx, p, b));
  mp_emit_printf(b, "\n[compile]\nenable = %s\ncomponents = [\"model\", \"loss\"]\n",
                 strcmp(p->stack->name, "torchtitan-eager") == 0 ? "false" : "true");
  if (o->fp8) MP_CHECK(write_fp8(ctx, p, b));
  return MP_OK;
}
