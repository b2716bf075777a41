/* Shared plumbing of the subcommands (commands.h): the prologue that parses, prints help
 * and usage errors, the readers of shared options, failure output. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "exec/comm/comm.h"
#include "planner/batch.h"
#include "app/commands.h"
#include "app/from_config.h"
#include "sim/stack.h"

/* The running command's name, for the prefix of its messages (one command per process). */
static const char *g_command = NULL;

int mp_command_main(const mp_command *cmd, int argc, char **argv) {
  g_command = cmd->spec->name;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cmd_call call;
  memset(&call, 0, sizeof call);
  call.argc = argc;
  call.argv = argv;
  int help = 0;
  if (cmd->spec->max_positional > MP_CMD_MAX_POSITIONAL) {
    fprintf(stderr, "meshplan %s: internal error: %d positional arguments, at most %d\n", cmd->spec->name,
            cmd->spec->max_positional, MP_CMD_MAX_POSITIONAL);
    return 1;
  }
  mp_status st = mp_args_parse(&ctx, cmd->spec, argc, argv, call.pos, &call.n_pos, &help);
  if (st != MP_OK) return mp_cmd_fail(&ctx, st);
  if (help) {
    mp_args_print_help(cmd->spec, stdout);
    return 0;
  }
  /* --from, --from-args: the configuration's flags join the command line */
  char **owned = NULL, note[4096];
  st = mp_from_apply(&ctx, cmd->spec, &call.argc, &call.argv, call.pos, &call.n_pos, &owned, note, sizeof note);
  if (st != MP_OK) return mp_cmd_fail(&ctx, st);
  const int rc = cmd->run(&ctx, &call);
  /* after the run, so a failure stays the one line on stderr */
  if (note[0] && rc == 0) fprintf(stderr, "meshplan %s: note: %s\n", cmd->spec->name, note);
  mp_from_free_argv(owned);
  return rc;
}

mp_status mp_cmd_plan_options(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o) {
  const char *ac = mp_args_get(spec, "--ac");
  if (ac) MP_CHECK(mp_ac_parse(ctx, ac, &o->ac, &o->ac_every));
  const char *rcm = mp_args_get(spec, "--recompute-modules");
  if (rcm) MP_CHECK(mp_recompute_modules_parse(ctx, rcm, o));
  const char *rmethod = mp_args_get(spec, "--recompute-method");
  if (rmethod && !mp_recompute_method_parse(rmethod, &o->recompute_method))
    return mp_error(ctx, MP_ERR_USAGE, "meshplan %s: --recompute-method %s: choose block or uniform (Megatron-Core's)",
                    spec->name, rmethod);
  long long rn = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--recompute-num-layers", 1, MP_MAX_LAYERS, &rn));
  o->recompute_num_layers = (int)rn;
  const char *fp8 = mp_args_get(spec, "--fp8");
  if (fp8) o->fp8 = strcmp(fp8, "off") != 0;
  /* a recipe's name turns float8 on with that recipe (the words are checked by the parser) */
  if (fp8) (void)mp_fp8_recipe_parse(fp8, &o->fp8_opts.recipe);
  if (mp_args_has(spec, "--sp") && mp_args_has(spec, "--no-sp"))
    return mp_error(ctx, MP_ERR_USAGE, "meshplan %s: --sp and --no-sp contradict each other; give one",
                    spec->name);
  if (mp_args_has(spec, "--sp")) o->sp = 1;
  if (mp_args_has(spec, "--no-sp")) o->sp = 0;
  if (mp_args_has(spec, "--no-reshard")) o->fsdp.reshard_after_forward = 0;
  long long v = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--seq", 1, MP_LIM_SEQ, &v));
  if (v > 0) o->seq = v;
  v = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--micro-batch", 1, MP_LIM_GLOBAL_BATCH, &v));
  if (v > 0) o->micro_batch = v;
  v = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--global-batch", 1, MP_LIM_GLOBAL_BATCH, &v));
  if (v > 0) o->global_batch = v;
  return MP_OK;
}

/* --pp-layers A,B,...: each stage's layer count into o (the plan checks them against the
 * mesh and the model). */
mp_status mp_cmd_pp_layers(mp_ctx *ctx, const char *s, mp_plan_options *o) {
  o->n_pp_layers = 0;
  if (s == NULL) return MP_OK;
  const char *q = s;
  while (*q) {
    char *end = NULL;
    const long v = strtol(q, &end, 10);
    if (end == q || (*end != ',' && *end != '\0') || v < 0 || v > MP_MAX_LAYERS)
      return mp_error(ctx, MP_ERR_USAGE, "--pp-layers '%s': expected layer counts in 0..%d separated by commas, "
                      "one per pipeline stage (interleaved: per model chunk)", s, MP_MAX_LAYERS);
    if (o->n_pp_layers == MP_PP_MAX_LAYOUT)
      return mp_error(ctx, MP_ERR_USAGE, "--pp-layers '%s': at most %d stages", s, MP_PP_MAX_LAYOUT);
    o->pp_layers[o->n_pp_layers++] = (int16_t)v;
    q = *end ? end + 1 : end;
  }
  if (o->n_pp_layers == 0) return mp_error(ctx, MP_ERR_USAGE, "--pp-layers is empty; give one count per stage");
  return MP_OK;
}

mp_status mp_cmd_pp_schedule(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o) {
  const char *ps = mp_args_get(spec, "--pp-schedule");
  if (ps && !mp_pp_schedule_parse(ps, &o->pp_schedule))
    return mp_error(ctx, MP_ERR_USAGE, "--pp-schedule '%s': choose 1f1b, interleaved, gpipe, dualpipe, zbv or "
                    "interleaved_zb", ps);
  /* a virtual stage holds at least one layer */
  long long pv = 2;
  MP_CHECK(mp_args_int(ctx, spec, "--pp-virtual", 1, MP_MAX_LAYERS, &pv));
  if (o->pp_schedule == MP_PP_ZBV && pv != 2)
    return mp_error(ctx, MP_ERR_USAGE, "--pp-virtual %lld: ZBV runs exactly 2 chunks a stage in a V; drop it", pv);
  const int looped = o->pp_schedule == MP_PP_INTERLEAVED || o->pp_schedule == MP_PP_INTERLEAVED_ZB;
  o->pp_virtual = looped || o->pp_schedule == MP_PP_ZBV ? (int)pv : 1;
  const char *layout = mp_args_get(spec, "--pp-layout");
  if (layout == NULL) return mp_cmd_pp_layers(ctx, mp_args_get(spec, "--pp-layers"), o);
  if (mp_args_get(spec, "--pp-layers"))
    return mp_error(ctx, MP_ERR_USAGE, "--pp-layers and --pp-layout state the same layout; give one");
  return mp_pp_layout_parse(ctx, layout, o);
}

/* Megatron-Bridge's Llama 3.1 405B recipe sets both account-for flags for its pp 16 x vp 8
 * performance layouts, 128 chunks for 126 layers (src/megatron/bridge/recipes/llama/h100/
 * llama3.py llama31_405b_pretrain_256gpu_h100_bf16_config and
 * scripts/performance/configs/llama/llama31_workload_base_configs.py at b7b4e11b0). */
int mp_cmd_megatron_pp_split(const mp_model *m, const mp_mesh *mesh, mp_plan_options *o) {
  const int pp = mesh->size[MP_DIM_PP];
  const int looped = o->pp_schedule == MP_PP_INTERLEAVED || o->pp_schedule == MP_PP_INTERLEAVED_ZB;
  const int v = looped && o->pp_virtual > 1 ? o->pp_virtual : 1;
  if (o->mem_model != MP_MEM_MODEL_MEGATRON || o->n_pp_layers > 0 || pp < 2 || (int64_t)pp * v <= m->n_layers)
    return 0;
  return mp_pp_layout_embedding_loss(m->n_layers, pp, v, o);
}

/* --cp-comm-type: Megatron-Core's form of context parallelism, on its stacks only. */
static mp_status cp_comm_type(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                              mp_plan_options *o) {
  const char *s = mp_args_get(spec, "--cp-comm-type");
  if (s == NULL) return MP_OK;
  if (!mp_cp_comm_parse(s, &o->cp_comm))
    return mp_error(ctx, MP_ERR_USAGE, "--cp-comm-type '%s': choose p2p, all_gather, a2a or a2a+p2p", s);
  if (prof && prof->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--cp-comm-type names Megatron-Core's context parallelism (Transformer Engine's); "
                    "stack %s runs %s: drop --cp-comm-type%s", prof->name,
                    mp_mem_model_is_runtime(prof->mem_model) ? "meshplan's own ring" : "PyTorch's ring",
                    mp_mem_model_is_runtime(prof->mem_model) ? "" : " (its rotate method is --cp-rotate)");
  return MP_OK;
}

mp_status mp_cmd_cp_rotate(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                           mp_plan_options *o) {
  MP_CHECK(cp_comm_type(ctx, spec, prof, o));
  const char *s = mp_args_get(spec, "--cp-rotate");
  if (s == NULL) return MP_OK;
  if (prof && prof->mem_model == MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--cp-rotate names PyTorch's context-parallel ring; stack %s runs Transformer "
                    "Engine's context parallelism: choose its form with --cp-comm-type p2p, all_gather or a2a",
                    prof->name);
  if (!mp_cp_rotate_parse(s, &o->cp_rotate))
    return mp_error(ctx, MP_ERR_USAGE, "--cp-rotate '%s': choose allgather or alltoall", s);
  if (prof && mp_mem_model_is_runtime(prof->mem_model))
    return mp_error(ctx, MP_ERR_USAGE,
                    "--cp-rotate names PyTorch's context-parallel ring; stack %s runs meshplan's "
                    "own, which passes K and V to the next rank every step: drop --cp-rotate or "
                    "name a torchtitan stack", prof->name);
  return MP_OK;
}

mp_status mp_cmd_async_tp(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                          mp_plan_options *o) {
  if (mp_args_has(spec, "--async-tp") && mp_args_has(spec, "--no-async-tp"))
    return mp_error(ctx, MP_ERR_USAGE, "meshplan %s: --async-tp and --no-async-tp contradict each other; give one",
                    spec->name);
  /* off on every stack: Megatron-LM's --tp-comm-overlap is a store_true switch, off unless
   * given (megatron/training/arguments.py, core_v0.14.0) */
  if (mp_args_has(spec, "--no-async-tp")) o->tp_comm_fused = 0;
  if (!mp_args_has(spec, "--async-tp")) return MP_OK;
  if (!prof->async_tp)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--async-tp: stack %s does not run AsyncTP (torchtitan's "
                    "experimental.enable_async_tensor_parallel needs torch.compile); use "
                    "torchtitan-compile (or megatron-core, whose TP comm overlap is on) or drop "
                    "--async-tp", prof->name);
  if (o->sp == 0 || mp_args_has(spec, "--no-sp"))
    return mp_error(ctx, MP_ERR_USAGE, "--async-tp fuses sequence parallelism's all-gathers and "
                    "reduce-scatters with their GEMMs; it needs SP: drop --no-sp");
  o->tp_comm_fused = 1;
  return MP_OK;
}

mp_status mp_cmd_moe_dispatcher(mp_ctx *ctx, const mp_cmd_spec *spec, mp_moe_dispatcher *out) {
  const char *d = mp_args_get(spec, "--moe-dispatcher");
  if (d && !mp_moe_dispatcher_parse(d, out))
    return mp_error(ctx, MP_ERR_USAGE, "--moe-dispatcher '%s': choose alltoall, deepep or hybridep", d);
  return MP_OK;
}

mp_status mp_cmd_moe_comm(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                             mp_plan_options *o) {
  const char *d = mp_args_get(spec, "--moe-dispatcher");
  MP_CHECK(mp_cmd_moe_dispatcher(ctx, spec, &o->moe_dispatcher));
  if (mp_moe_dispatch_by_node(o->moe_dispatcher) && prof->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--moe-dispatcher %s is Megatron-Core's flex dispatcher; stack %s does not run it: use "
                    "megatron-core or drop it", d, prof->name);
  if (mp_args_has(spec, "--moe-fp8-dispatch")) o->moe_fp8_dispatch = 1; /* the plan checks ep and fp8 */
  if (!mp_args_has(spec, "--overlap-moe-comm")) return MP_OK;
  if (prof->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--overlap-moe-comm is Megatron-Core's --overlap-moe-expert-parallel-comm; stack "
                    "%s does not run it: use megatron-core or drop --overlap-moe-comm", prof->name);
  o->moe_a2a_overlap = 1;
  return MP_OK;
}

/* Whether the command line turns float8 on (--fp8 given, and not off). */
static int fp8_on(const mp_cmd_spec *spec) {
  const char *fp8 = mp_args_get(spec, "--fp8");
  return fp8 != NULL && strcmp(fp8, "off") != 0;
}

/* --fp8-param-gather: on a megatron stack with --fp8 (its distributed optimizer or Megatron
 * FSDP and the recipe are the Float8 pass's to check: exec/pass_float8.c). */
static mp_status fp8_param_gather(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                                  mp_plan_options *o) {
  if (!mp_args_has(spec, "--fp8-param-gather")) return MP_OK;
  if (prof && prof->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--fp8-param-gather keeps Megatron-Core's weights as Transformer Engine float8 tensors; "
                    "stack %s does not run it: use megatron-core or drop it", prof->name);
  if (!fp8_on(spec))
    return mp_error(ctx, MP_ERR_USAGE,
                    "--fp8-param-gather keeps the float8 Linears' weights in float8 and needs them: "
                    "add --fp8 (Megatron-Core: fp8_param must be used together with fp8 mode)");
  o->fp8_opts.param_gather = 1;
  return MP_OK;
}

/* --fp8-scope: with --fp8; the stack and the recipe are the Float8 pass's to check. */
static mp_status fp8_scope(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o) {
  const char *s = mp_args_get(spec, "--fp8-scope");
  if (s == NULL) return MP_OK;
  if (!mp_fp8_scope_parse(s, &o->fp8_opts.scope))
    return mp_error(ctx, MP_ERR_USAGE, "--fp8-scope '%s': choose linears, experts or all", s);
  if (!fp8_on(spec) && o->fp8_opts.scope != MP_FP8_SCOPE_LINEARS)
    return mp_error(ctx, MP_ERR_USAGE, "--fp8-scope %s names the GEMMs that run in float8 and needs a recipe: "
                    "add --fp8 rowwise or --fp8 mxfp8", s);
  return MP_OK;
}

mp_status mp_cmd_fp8_all_gather(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                                mp_plan_options *o) {
  MP_CHECK(fp8_scope(ctx, spec, o));
  if (!mp_args_has(spec, "--fp8-all-gather")) return MP_OK;
  if (prof && prof->mem_model != MP_MEM_MODEL_TORCHTITAN)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--fp8-all-gather is torchtitan's enable_fsdp_float8_all_gather (FSDP2 with torchao's "
                    "float8); stack %s does not run it: use a torchtitan stack or drop it (Megatron-Core's "
                    "is --fp8-param-gather)", prof->name);
  if (!fp8_on(spec))
    return mp_error(ctx, MP_ERR_USAGE,
                    "--fp8-all-gather gathers the float8 Linears' weights as float8 casts and needs them: add --fp8");
  o->fp8_opts.all_gather = 1;
  return MP_OK;
}

/* --nvfp4-no-rht: with --fp8 nvfp4 alone. */
static mp_status nvfp4_no_rht(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o) {
  if (!mp_args_has(spec, "--nvfp4-no-rht")) return MP_OK;
  const char *fp8 = mp_args_get(spec, "--fp8");
  if (fp8 == NULL || strcmp(fp8, "nvfp4") != 0)
    return mp_error(ctx, MP_ERR_USAGE, "--nvfp4-no-rht turns off NVFP4's random Hadamard transform and needs "
                    "--fp8 nvfp4");
  o->fp8_opts.nvfp4_no_rht = 1;
  return MP_OK;
}

/* --fp8-dpa: with --fp8; the stack, the GPU and CP are the Float8 pass's to check
 * (exec/pass_float8.c). */
static mp_status fp8_dpa(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o) {
  if (!mp_args_has(spec, "--fp8-dpa")) return MP_OK;
  if (!fp8_on(spec))
    return mp_error(ctx, MP_ERR_USAGE, "--fp8-dpa runs attention under the float8 recipe and needs one: add --fp8 "
                    "(Megatron-Core's --fp8-dot-product-attention needs --fp8-format or --fp4-format)");
  o->fp8_opts.dpa = 1;
  return MP_OK;
}

/* --fp8-amax-tp-only: with --fp8; the recipe and the stack are the Float8 pass's to check. */
static mp_status fp8_amax_tp(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o) {
  if (!mp_args_has(spec, "--fp8-amax-tp-only")) return MP_OK;
  if (!fp8_on(spec))
    return mp_error(ctx, MP_ERR_USAGE, "--fp8-amax-tp-only says where delayed scaling reduces its amaxes "
                    "and needs it: add --fp8 delayed");
  o->fp8_opts.amax_tp = 1;
  return MP_OK;
}

mp_status mp_cmd_megatron_weights(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                                  mp_plan_options *o) {
  MP_CHECK(fp8_param_gather(ctx, spec, prof, o));
  MP_CHECK(nvfp4_no_rht(ctx, spec, o));
  MP_CHECK(fp8_dpa(ctx, spec, o));
  MP_CHECK(fp8_amax_tp(ctx, spec, o));
  const char *s = mp_args_get(spec, "--data-parallel-sharding-strategy");
  const int dbuf = mp_args_has(spec, "--fsdp-double-buffer");
  if (s == NULL && !dbuf) return MP_OK;
  if (prof && prof->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--data-parallel-sharding-strategy and --fsdp-double-buffer are Megatron FSDP's; "
                    "stack %s shards dp_shard with PyTorch's FSDP: drop them or use megatron-core", prof->name);
  if (s && !mp_mfsdp_strategy_parse(s, &o->mfsdp_strategy))
    return mp_error(ctx, MP_ERR_USAGE,
                    "--data-parallel-sharding-strategy '%s': choose optim_grads_params, optim_grads, optim "
                    "or no_shard", s);
  o->fsdp_double_buffer = dbuf;
  return MP_OK;
}

int mp_cmd_fp32_bf16_parse(const char *name, mp_dtype *out) {
  if (strcmp(name, "fp32") != 0 && strcmp(name, "bf16") != 0) return 0;
  *out = strcmp(name, "bf16") == 0 ? MP_DTYPE_BF16 : MP_DTYPE_FP32;
  return 1;
}

mp_status mp_cmd_storage(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o) {
  if (mp_args_has(spec, "--fp8-act-cache")) o->fp8_act_cache = 1;
  const char *d = mp_args_get(spec, "--optimizer-moments");
  if (d && !mp_cmd_fp32_bf16_parse(d, &o->moment_dtype))
    return mp_error(ctx, MP_ERR_USAGE, "--optimizer-moments '%s': choose fp32 or bf16", d);
  const char *r = mp_args_get(spec, "--fsdp-reduce-dtype");
  if (r && !mp_cmd_fp32_bf16_parse(r, &o->fsdp.reduce_dtype))
    return mp_error(ctx, MP_ERR_USAGE, "--fsdp-reduce-dtype '%s': choose fp32 or bf16", r);
  if (mp_args_has(spec, "--fsdp-flat-params")) {
    if (o->mem_model != MP_MEM_MODEL_TORCHTITAN)
      return mp_error(ctx, MP_ERR_USAGE, "--fsdp-flat-params is PyTorch FSDP1's; the stack's memory model is not "
                      "PyTorch FSDP's: use torchtitan-compile or torchtitan-eager, or drop it");
    o->fsdp.flat_params = 1;
  }
  return mp_cmd_loss_chunks(ctx, spec, &o->loss_chunks); /* the plan checks the stack and the sequence */
}

mp_status mp_cmd_loss_chunks(mp_ctx *ctx, const mp_cmd_spec *spec, int *out) {
  long long n = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--loss-chunks", 1, MP_LIM_SEQ, &n));
  if (n > 0) *out = (int)n;
  return MP_OK;
}

mp_status mp_cmd_fuse_loss(mp_ctx *ctx, const struct mp_stack_profile *prof, mp_plan_options *o) {
  if (o->loss != MP_LOSS_INPLACE)
    return mp_error(ctx, MP_ERR_USAGE,
                    "--cross-entropy-loss-fusion fuses Megatron-LM's vocab-parallel cross-entropy; "
                    "stack %s does not run it: use megatron-core or megatron-lm, or drop it", prof->name);
  o->loss = MP_LOSS_INPLACE_FUSED;
  return MP_OK;
}

mp_status mp_cmd_ddp_bucket_prep(mp_ctx *ctx, const struct mp_stack_profile *prof, int average_in_collective,
                                 int no_check, int align, int64_t bucket_size, mp_plan_options *o) {
  if ((average_in_collective || no_check || align) && prof->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE, "--ddp-average-in-collective, --no-check-for-nan-in-loss-and-grad and "
                    "--align-param-gather are Megatron-LM's DDP options; stack %s does not run it: use "
                    "megatron-core or megatron-lm, or drop them", prof->name);
  if (average_in_collective) o->ddp.scale_grads = 0;
  if (no_check) o->ddp.check_grads = 0;
  if (align) o->ddp.align_param_gather = 1;
  return mp_cmd_ddp_bucket_size(ctx, prof, bucket_size, o);
}

mp_status mp_cmd_wgrad_unfused(mp_ctx *ctx, const struct mp_stack_profile *prof, mp_plan_options *o) {
  if (prof->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE, "--no-gradient-accumulation-fusion turns off Megatron-LM's gradient "
                    "accumulation fusion; stack %s does not run it: use megatron-core or megatron-lm, or drop it",
                    prof->name);
  o->ddp.wgrad_unfused = 1;
  return MP_OK;
}

mp_status mp_cmd_ddp_bucket_size(mp_ctx *ctx, const struct mp_stack_profile *prof, int64_t size,
                                 mp_plan_options *o) {
  if (size <= 0) return MP_OK;
  if (prof->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE, "--ddp-bucket-size is Megatron-LM's DDP option; stack %s does not run it: "
                    "use megatron-core or megatron-lm, or drop it", prof->name);
  o->ddp.bucket_size = size;
  return MP_OK;
}

mp_status mp_cmd_ce_fusion(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                           mp_plan_options *o) {
  long long bucket = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--ddp-bucket-size", 1, MP_LIM_PARAMS, &bucket));
  MP_CHECK(mp_cmd_ddp_bucket_prep(ctx, prof, mp_args_has(spec, "--ddp-average-in-collective"),
                                  mp_args_has(spec, "--no-check-for-nan-in-loss-and-grad"),
                                  mp_args_has(spec, "--align-param-gather"), bucket, o));
  if (mp_args_has(spec, "--no-gradient-accumulation-fusion")) MP_CHECK(mp_cmd_wgrad_unfused(ctx, prof, o));
  const char *impl = mp_args_get(spec, "--cross-entropy-fusion-impl");
  if (!mp_args_has(spec, "--cross-entropy-loss-fusion")) {
    if (impl)
      return mp_error(ctx, MP_ERR_USAGE, "--cross-entropy-fusion-impl picks the kernels of "
                      "--cross-entropy-loss-fusion (Megatron-Core's language_module.py); add it");
    return MP_OK;
  }
  MP_CHECK(mp_cmd_fuse_loss(ctx, prof, o));
  return impl ? mp_cmd_ce_impl(ctx, impl, o) : MP_OK;
}

mp_status mp_cmd_ce_impl(mp_ctx *ctx, const char *impl, mp_plan_options *o) {
  if (strcmp(impl, "native") == 0) return MP_OK;
  if (strcmp(impl, "te") != 0)
    return mp_error(ctx, MP_ERR_USAGE, "--cross-entropy-fusion-impl %s: choose native or te", impl);
  o->loss = MP_LOSS_TE;
  return MP_OK;
}

mp_status mp_cmd_cuda_graphs(mp_ctx *ctx, const struct mp_stack_profile *prof, const char *scope, mp_plan_options *o) {
  if (!mp_cuda_graphs_parse(scope, &o->cuda_graphs))
    return mp_error(ctx, MP_ERR_USAGE, "cuda graphs '%s': choose none, attn, layers, iteration, attn+moe_router or "
                    "attn+moe_router+moe_preprocess", scope);
  if (o->cuda_graphs != MP_CUDA_GRAPHS_NONE && !(prof->graph_kernel_overhead_s >= 0))
    return mp_error(ctx, MP_ERR_USAGE, "cuda graphs %s: stack %s states no in-graph kernel cost "
                    "(graph_kernel_overhead_us); CUDA graphs are Megatron-Core's: use megatron-core or none",
                    scope, prof->name);
  return MP_OK;
}

mp_status mp_cmd_nccl(mp_ctx *ctx, const mp_cmd_spec *spec, struct mp_stack_profile *prof) {
  const char *v = mp_args_get(spec, "--nccl-version");
  if (v) MP_CHECK(mp_sim_nccl_version_parse(ctx, v, &prof->nccl_version));
  const char *s = mp_args_get(spec, "--nccl-ctas");
  return s ? mp_sim_nccl_ctas_parse(ctx, s, prof->nccl_group_ctas) : MP_OK;
}

mp_status mp_cmd_ub_cfg_text(mp_ctx *ctx, struct mp_stack_profile *prof, const char *text) {
  if (!prof->tp_comm_overlap)
    return mp_error(ctx, MP_ERR_USAGE, "userbuffers config '%s': stack %s runs no Transformer Engine "
                    "userbuffers (tp_comm_overlap); use megatron-core", text, prof->name);
  return mp_sim_ub_cfg_parse(ctx, text, prof->ub_cfg);
}

mp_status mp_cmd_ub_cfg(mp_ctx *ctx, const mp_cmd_spec *spec, struct mp_stack_profile *prof) {
  const char *s = mp_args_get(spec, "--ub-cfg");
  return s ? mp_cmd_ub_cfg_text(ctx, prof, s) : MP_OK;
}

mp_status mp_cmd_cuda_graphs_opt(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                                 mp_plan_options *o) {
  const char *s = mp_args_get(spec, "--cuda-graphs");
  return s ? mp_cmd_cuda_graphs(ctx, prof, s, o) : MP_OK;
}

mp_status mp_cmd_cpu_offload(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                             mp_plan_options *o) {
  long long n = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--cpu-offload-layers", 0, MP_MAX_LAYERS, &n));
  if (n > 0 && prof->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE, "--cpu-offload-layers is Megatron-Core's CPU offloading; stack %s has "
                    "none meshplan models: drop it or use megatron-core", prof->name);
  o->cpu_offload_layers = (int)n;
  return MP_OK;
}

mp_status mp_cmd_moe_routing(mp_ctx *ctx, const mp_cmd_spec *spec, mp_moe_routing *r) {
  MP_CHECK(mp_args_double(ctx, spec, "--moe-imbalance", 1.0, MP_LIM_MOE_LOAD, MP_RANGE_CLOSED, &r->imbalance));
  MP_CHECK(mp_args_double(ctx, spec, "--moe-capacity-factor", 0.0, MP_LIM_MOE_LOAD, MP_RANGE_OPEN_LO,
                          &r->capacity_factor));
  MP_CHECK(mp_args_double(ctx, spec, "--moe-expert-rank-capacity-factor", 0.0, MP_LIM_MOE_LOAD, MP_RANGE_OPEN_LO,
                          &r->rank_capacity));
  if (!mp_args_has(spec, "--moe-pad-expert-input-to-capacity")) return MP_OK;
  if (!(r->capacity_factor > 0.0))
    return mp_error(ctx, MP_ERR_USAGE, "--moe-pad-expert-input-to-capacity pads each expert's input to its "
                    "capacity: give --moe-capacity-factor C too");
  r->pad_to_capacity = 1;
  return MP_OK;
}

mp_status mp_cmd_load_model(mp_ctx *ctx, const mp_cmd_spec *spec, const char *dflt, mp_model *m) {
  const char *hf = mp_args_get(spec, "--hf-config");
  const char *model = mp_args_get(spec, "--model");
  if (hf && model) return mp_error(ctx, MP_ERR_USAGE, "give --model or --hf-config, not both");
  MP_CHECK(mp_model_load(ctx, hf ? hf : (model ? model : dflt), m));
  long long mtp = m->mtp_layers;
  MP_CHECK(mp_args_int(ctx, spec, "--mtp-num-layers", 0, MP_MAX_LAYERS - m->n_layers, &mtp));
  m->mtp_layers = mtp;
  return MP_OK;
}

/* --nvlink-domain D over the cluster's (a whole number of its nodes) */
static mp_status nvlink_domain_opt(mp_ctx *ctx, const mp_cmd_spec *spec, mp_cluster *c) {
  if (!mp_args_has(spec, "--nvlink-domain")) return MP_OK;
  long long d = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--nvlink-domain", 1, MP_LIM_GPUS, &d));
  if (d % c->gpus_per_node)
    return mp_error(ctx, MP_ERR_USAGE, "--nvlink-domain=%lld is not a whole number of nodes of %d GPUs; give a "
                    "multiple of the node", d, c->gpus_per_node);
  c->nvlink_domain = (int)d;
  return MP_OK;
}

mp_status mp_cmd_load_cluster(mp_ctx *ctx, const mp_cmd_spec *spec, mp_cluster *c) {
  const char *cl = mp_args_get(spec, "--cluster");
  const int gpus = mp_args_has(spec, "--gpus");
  const char *extra = mp_args_has(spec, "--gpu") ? "--gpu"
                      : mp_args_has(spec, "--gpus-per-node") ? "--gpus-per-node"
                      : mp_args_has(spec, "--inter-gbps") ? "--inter-gbps" : NULL;
  if (cl && (gpus || extra))
    return mp_error(ctx, MP_ERR_USAGE, "give --cluster or --gpus (with --gpu, --gpus-per-node, --inter-gbps), not both");
  if (!gpus && extra)
    return mp_error(ctx, MP_ERR_USAGE, "%s describes the GPUs of --gpus N: add --gpus N, or use --cluster", extra);
  if (gpus) {
    long long n = 0;
    MP_CHECK(mp_args_int(ctx, spec, "--gpus", 1, MP_LIM_GPUS, &n));
    return mp_cmd_load_cluster_n(ctx, spec, n, c);
  }
  MP_CHECK(mp_cluster_load(ctx, cl ? cl : "h100-8", c));
  return nvlink_domain_opt(ctx, spec, c);
}

mp_status mp_cmd_load_cluster_n(mp_ctx *ctx, const mp_cmd_spec *spec, int64_t n, mp_cluster *c) {
  double inter = 400.0;
  long long per = n < 8 ? n : 8;
  MP_CHECK(mp_args_int(ctx, spec, "--gpus-per-node", 1, MP_LIM_GPUS_PER_NODE, &per));
  MP_CHECK(mp_args_double(ctx, spec, "--inter-gbps", 0, MP_LIM_LINK_GBPS, MP_RANGE_OPEN_LO, &inter));
  const char *gpu = mp_args_get(spec, "--gpu");
  MP_CHECK(mp_cluster_make(ctx, gpu ? gpu : "h100-sxm", (int)n, (int)per, c));
  c->inter_node_Gbitps_per_gpu = inter;
  return nvlink_domain_opt(ctx, spec, c);
}

mp_status mp_cmd_count(mp_ctx *ctx, const mp_cmd_spec *spec, const char *flag, double max, double *out) {
  const char *v = mp_args_get(spec, flag);
  if (!v) return MP_OK;
  char *end = NULL;
  double x = strtod(v, &end);
  static const struct {
    char suffix;
    double scale;
  } k[] = {{'K', 1e3}, {'M', 1e6}, {'B', 1e9}, {'G', 1e9}, {'T', 1e12}};
  for (size_t i = 0; end != v && *end && i < sizeof k / sizeof k[0]; i++)
    if ((*end == k[i].suffix || *end == k[i].suffix + ('a' - 'A')) && end[1] == '\0') {
      x *= k[i].scale;
      end++;
    }
  if (end == v || *end || !isfinite(x) || !(x > 0) || x > max)
    return mp_error(ctx, MP_ERR_USAGE, "%s '%s': expected a count in (0, %g], a number with an optional suffix K, M, "
                    "B or T (15T, 300B, 1.5e12)", flag, v, max);
  *out = x;
  return MP_OK;
}

mp_status mp_cmd_check_seq(mp_ctx *ctx, const mp_cmd_spec *spec, const mp_model *m, int64_t seq) {
  if (seq <= m->max_seq || mp_args_has(spec, "--allow-long-seq")) return MP_OK;
  return mp_error(ctx, MP_ERR_USAGE,
                  "--seq %lld is longer than %s's max_seq %lld (positions it was not trained on); use "
                  "--seq %lld or less, or pass --allow-long-seq", (long long)seq, m->name, (long long)m->max_seq,
                  (long long)m->max_seq);
}

mp_status mp_cmd_batch_tokens(mp_ctx *ctx, const mp_cmd_spec *spec, int64_t seq, int64_t *global_batch) {
  if (!mp_args_has(spec, "--global-batch-tokens")) return MP_OK;
  if (mp_args_has(spec, "--global-batch"))
    return mp_error(ctx, MP_ERR_USAGE, "give --global-batch or --global-batch-tokens, not both");
  long long tokens = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--global-batch-tokens", 1, MP_LIM_STEP_TOKENS, &tokens));
  if (seq < 1 || tokens % seq)
    return mp_error(ctx, MP_ERR_USAGE, "--global-batch-tokens %lld is not a multiple of seq %lld; use %lld or %lld",
                    tokens, (long long)seq, tokens / seq * seq, (tokens / seq + 1) * seq);
  *global_batch = tokens / seq;
  return MP_OK;
}

void mp_cmd_default_batch(const mp_model *m, const mp_mesh *mesh, int64_t seq, int64_t micro_batch,
                          int64_t *global_batch, char *rule, size_t cap) {
  const double n_params = (double)mp_model_param_count(m);
  const int64_t world = mp_mesh_world(mesh);
  const int64_t step = mp_mesh_group_size(mesh, MP_GROUP_DP) * (micro_batch > 0 ? micro_batch : 1);
  const int64_t target = mp_batch_rule_seqs(mp_batch_rule_tokens(n_params, world), seq);
  int64_t gb = mp_batch_for_dp(target, step);
  char words[320];
  mp_batch_rule_str(n_params, world, words, sizeof words);
  if (gb == 0) {
    gb = step;
    snprintf(rule, cap, "%lld sequences: one micro-batch per data-parallel rank, over the default rule's %lld (%s)",
             (long long)gb, (long long)target, words);
  } else {
    snprintf(rule, cap, "%lld sequences by the default rule: %lld sequences of %lld tokens, %s", (long long)gb,
             (long long)target, (long long)seq, words);
  }
  *global_batch = gb;
}

void mp_cmd_fmt_runs(const double *v, int n, const char *fmt, char *buf, size_t cap) {
  size_t used = 0;
  if (cap == 0) return;
  buf[0] = '\0';
  for (int i = 0; i < n && used < cap;) {
    int e = i;
    while (e < n && v[e] == v[i]) e++;
    char one[64];
    snprintf(one, sizeof one, fmt, v[i]);
    int w = e - i > 1 ? snprintf(buf + used, cap - used, "%s%s x %d", i ? ", " : "", one, e - i)
                      : snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", one);
    if (w < 0) return;
    used += (size_t)w;
    i = e;
  }
}

void mp_cmd_stack_micro_batch(const mp_cmd_spec *spec, const mp_stack_profile *prof,
                              const mp_mesh *mesh, mp_plan_options *o, char *note, size_t cap) {
  note[0] = '\0';
  const int64_t pp = mesh->size[MP_DIM_PP], dp = mp_mesh_group_size(mesh, MP_GROUP_DP);
  if (mp_args_has(spec, "--micro-batch") || !prof->pp_mb_stages || pp <= 1 || dp < 1 ||
      o->global_batch <= 0 || o->global_batch % dp != 0)
    return;
  const int64_t local = o->global_batch / dp;
  if (local % pp != 0) return;
  o->micro_batch = local / pp;
  snprintf(note, cap, "%lld sequences per data-parallel rank as %lld micro-batches of %lld: stack %s "
           "splits the local batch into pp micro-batches unless --micro-batch says otherwise",
           (long long)local, (long long)pp, (long long)o->micro_batch, prof->name);
}

int mp_cmd_print_json(cJSON *root) {
  char *text = root ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (text == NULL) return 1;
  printf("%s\n", text);
  free(text);
  return 0;
}

cJSON *mp_cmd_kernel_scale_json(const mp_stack_profile *p, const mp_gpu *g) {
  mp_stack_kernel_scale k;
  mp_stack_kernel_scale_of(p, g, &k);
  char line[512];
  mp_stack_kernel_scale_format(p, g, line, sizeof line);
  cJSON *o = cJSON_CreateObject();
  if (o == NULL) return NULL;
  cJSON_AddStringToObject(o, "stack", p->name);
  if (p->fit_gpu[0]) cJSON_AddStringToObject(o, "fit_gpu", p->fit_gpu);
  else cJSON_AddNullToObject(o, "fit_gpu");
  cJSON_AddStringToObject(o, "gpu", g->name);
  cJSON_AddBoolToObject(o, "scaled", k.scaled);
  cJSON_AddNumberToObject(o, "gemm", k.gemm);
  cJSON_AddNumberToObject(o, "fp8_gemm", k.fp8_gemm);
  cJSON_AddNumberToObject(o, "flash_attention", k.flash);
  /* an attention exponential's exposed time in FLOPs, where the GPU states attention_exp */
  const double exp_flops = mp_gpu_attn_exp_flops(g);
  if (exp_flops > 0) cJSON_AddNumberToObject(o, "attention_exp_flops", exp_flops);
  cJSON_AddStringToObject(o, "line", line);
  return o;
}

/* n in billions ("70.55B") or millions below one billion ("124.44M"). */
static void fmt_count(int64_t n, char *buf, size_t cap) {
  if (n >= 1000000000) snprintf(buf, cap, "%.2fB", (double)n / 1e9);
  else snprintf(buf, cap, "%.2fM", (double)n / 1e6);
}

void mp_cmd_params_str(const mp_model *m, char *buf, size_t cap) {
  char total[32], active[32];
  fmt_count(mp_model_param_count(m), total, sizeof total);
  if (!mp_model_is_moe(m)) {
    snprintf(buf, cap, "%s parameters", total);
    return;
  }
  fmt_count(mp_model_matmul_param_count(m), active, sizeof active);
  snprintf(buf, cap, "%s parameters, %s active per token (matmul weights)", total, active);
}

void mp_cmd_params_json(const mp_model *m, cJSON *o) {
  cJSON_AddNumberToObject(o, "params", (double)mp_model_param_count(m));
  if (mp_model_is_moe(m)) cJSON_AddNumberToObject(o, "active_params", (double)mp_model_matmul_param_count(m));
}

/* "16 x gb200, 4 per node, NVLink domain 16": the domain is named where it spans nodes (GB200
 * NVL72's trays of 4), since TP and the collectives' NVLink hops follow the domain, not the
 * node (mp_cluster_nvlink_domain). */
void mp_cmd_cluster_shape_str(const mp_cluster *c, char *buf, size_t cap) {
  int nvl = mp_cluster_nvlink_domain(c);
  int n = snprintf(buf, cap, "%d x %s, %d per node", mp_cluster_n_gpus(c), c->gpu.name, c->gpus_per_node);
  if (nvl > c->gpus_per_node && n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ", NVLink domain %d", nvl);
}

void mp_cmd_cluster_shape_json(const mp_cluster *c, cJSON *o) {
  cJSON_AddNumberToObject(o, "gpus_per_node", c->gpus_per_node);
  cJSON_AddNumberToObject(o, "nvlink_domain", mp_cluster_nvlink_domain(c));
}

/* Dollars in the unit that keeps them short: "$69.46M", "$85.4K", "$950". */
void mp_cmd_fmt_usd(double d, char *buf, size_t cap) {
  if (d >= 1e9) snprintf(buf, cap, "$%.2fB", d / 1e9);
  else if (d >= 1e6) snprintf(buf, cap, "$%.2fM", d / 1e6);
  else if (d >= 1e3) snprintf(buf, cap, "$%.1fK", d / 1e3);
  else snprintf(buf, cap, "$%.4g", d);
}

void mp_cmd_gpu_note(const mp_gpu *g, char *buf, size_t cap) {
  if (mp_gpu_runtime_drives(g)) {
    snprintf(buf, cap, "%s", "");
    return;
  }
  snprintf(buf, cap, "%s has no CUDA (%s): planned and simulated only; meshplan train cannot run on it", g->name,
           mp_gpu_api_name(mp_gpu_api_of(g)));
}

const char *mp_cmd_escape(const char *s, char *buf, size_t cap) {
  if (cap == 0) return buf;
  size_t n = 0;
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    char e[8];
    int len;
    if (*c == '\n' || *c == '\r' || *c == '\t' || *c == '\\')
      len = snprintf(e, sizeof e, "\\%c", *c == '\n' ? 'n' : *c == '\r' ? 'r' : *c == '\t' ? 't' : '\\');
    else if (*c < 0x20 || *c == 0x7f)
      len = snprintf(e, sizeof e, "\\x%02x", *c);
    else if (*c == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f) /* U+0080..U+009F, the C1 controls */
      len = snprintf(e, sizeof e, "\\u%04x", *++c);
    else {
      e[0] = (char)*c;
      len = 1;
    }
    if (n + (size_t)len >= cap) break;
    memcpy(buf + n, e, (size_t)len);
    n += (size_t)len;
  }
  buf[n] = '\0';
  return buf;
}

const char *mp_cmd_db_path(const mp_cmd_spec *spec) {
  const char *db = mp_args_get(spec, "--db");
  return db ? db : "meshplan.db";
}

/* Skips what would repeat the prefix: "meshplan <command>: ", "meshplan: " and
 * "<command>: " at the start of a message (the commands add the prefix, never the library;
 * this keeps a stray one from doubling it). */
static const char *unprefixed(const char *msg, const char *cmd) {
  for (int again = 1; again;) {
    again = 0;
    size_t cl = strlen(cmd);
    if (strncmp(msg, "meshplan: ", 10) == 0) {
      msg += 10;
      again = 1;
    } else if (strncmp(msg, "meshplan ", 9) == 0 && strncmp(msg + 9, cmd, cl) == 0 &&
               strncmp(msg + 9 + cl, ": ", 2) == 0) {
      msg += 9 + cl + 2;
      again = 1;
    } else if (cl > 0 && strncmp(msg, cmd, cl) == 0 && strncmp(msg + cl, ": ", 2) == 0) {
      msg += cl + 2;
      again = 1;
    }
  }
  return msg;
}

int mp_cmd_fail(const mp_ctx *ctx, mp_status st) {
  const char *cmd = g_command ? g_command : "";
  const char *msg = unprefixed(mp_errmsg(ctx), cmd);
  if (msg[0] == '\0') msg = mp_status_name(st);
  /* One line, whatever the message holds, written by one write: ranks of an MPI job share
   * mpirun's stderr, and a line written in pieces interleaves with theirs. */
  char line[MP_ERRMSG_MAX + 64];
  int n = snprintf(line, sizeof line, "meshplan%s%s: %s", cmd[0] ? " " : "", cmd, msg);
  if (n < 0) n = 0;
  if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
  for (int i = 0; i < n; i++)
    if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
  line[n++] = '\n';
  fwrite(line, 1, (size_t)n, stderr);
  fflush(stderr);
  return mp_status_exit_code(st);
}

int mp_cmd_fail_job(const mp_ctx *ctx, mp_status st, int under_mpi) {
  const int code = mp_cmd_fail(ctx, st);
  if (under_mpi && (st == MP_ERR_TIMEOUT || st == MP_ERR_MPI || st == MP_ERR_NCCL)) {
    fflush(stdout);
    mp_comm_mpi_abort(code, MP_CMD_ABORT_GRACE_S);
  }
  return code;
}

static const char *launch_env(const char *ompi, const char *pmi) {
  const char *v = getenv(ompi);
  return v && *v ? v : getenv(pmi);
}

void mp_cmd_launch(mp_launch *out) {
  const char *size = launch_env("OMPI_COMM_WORLD_SIZE", "PMI_SIZE");
  const char *rank = launch_env("OMPI_COMM_WORLD_RANK", "PMI_RANK");
  out->under_mpi = size != NULL;
  out->world = size && *size ? atoi(size) : 1;
  out->rank = rank && *rank ? atoi(rank) : 0;
}

mp_status mp_cmd_mesh_ep(mp_ctx *ctx, const mp_cmd_spec *spec, mp_mesh *mesh) {
  long long ep = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--ep", 1, MP_MESH_MAX_WORLD, &ep));
  if (ep == 0) return MP_OK;
  if (mesh->ep > 1 && mesh->ep != ep)
    return mp_error(ctx, MP_ERR_USAGE, "--ep %lld contradicts ep=%d in --mesh; give it once", ep, mesh->ep);
  mesh->ep = (int)ep;
  return mp_mesh_validate(ctx, mesh);
}

void mp_cmd_stack_runs_str(const mp_plan_options *b, char *buf, size_t cap) {
  const int mg = b->mem_model == MP_MEM_MODEL_MEGATRON;
  buf[0] = '\0';
  if (mg || b->cp_rotate != MP_CP_ROTATE_ALLGATHER) /* Megatron-Core's form, or the ring's rotation */
    snprintf(buf, cap, mg ? " with cp comm type %s" : " with cp rotating K, V by %s",
             mg ? mp_cp_comm_name(b->cp_comm) : mp_cp_rotate_name(b->cp_rotate));
  if (b->tp_comm_fused)
    snprintf(buf + strlen(buf), cap - strlen(buf), "%s %s on its TP plans", buf[0] ? " and" : " with",
             mg ? "TP comm overlap" : "AsyncTP");
  if (b->ddp.shard_optimizer)
    snprintf(buf + strlen(buf), cap - strlen(buf), "%s the distributed optimizer", buf[0] ? " and" : " with");
  if (mp_moe_dispatch_by_node(b->moe_dispatcher)) /* the flex dispatcher, every candidate's (ep > 1) */
    snprintf(buf + strlen(buf), cap - strlen(buf), "%s the %s dispatcher (ep > 1)", buf[0] ? " and" : " with",
             b->moe_dispatcher == MP_MOE_DISPATCH_DEEPEP ? "DeepEP" : "HybridEP");
}

void mp_cmd_plan_table_notes(int grid, int split, int dopt) {
  if (grid) printf("ep g: the expert grid (EP over tp, cp and data-parallel ranks; gN: each expert split over etp=N "
                   "ranks, else whole on a rank)\n");
  if (split) printf("pp E: the embedding and the loss count as a layer each in the stages' split (Megatron-LM's "
                    "--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split)\n");
  if (dopt) printf("dp_rep N/D: dp_replicate N cut into D distributed-optimizer instances (dopt=D, Megatron-Core's "
                   "--num-distributed-optimizer-instances)\n");
}
