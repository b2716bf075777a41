/* meshplan simulate: predict one plan's step time and memory (sim/sim.h).
 *
 * Builds the plan from the model, the mesh and the options, then simulates the compact
 * schedule of rank 0 (each pipeline stage's first rank under pp) with a stack profile
 * (--stack, default meshplan's own runtime). Prints the figures and the breakdowns, or
 * with --json one object; --trace writes the timeline of rank 0 (stage 0) as Chrome trace
 * JSON. Bad input: one line on stderr, exit 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "calib/calibrate.h"
#include "common/limits.h"
#include "calib/store.h"
#include "sim/cluster.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "exec/schedule.h"
#include "app/commands.h"
#include "app/emit.h"
#include "sim/sim.h"
#include "sim/stack.h"

static mp_opt k_opts[] = {
    MP_OPT_MODEL("llama3.1-8b"),
    MP_OPT_HF_CONFIG,
    MP_OPT_CLUSTER("h100-8"),
    MP_OPT_GPUS,
    MP_OPT_GPU_OF_GPUS("default h100-sxm"),
    MP_OPT_GPUS_PER_NODE("8, or N when N < 8"),
    MP_OPT_NVLINK_DOMAIN,
    MP_OPT_INTER_GBPS,
    MP_OPT_MESH("-1 for one dim: the rest of the GPUs; default dp_shard over the GPUs --pp and --cp leave"),
    MP_OPT_EP(""),
    {"--pp", "N", "pipeline stages", NULL},
    MP_OPT_PP_SCHEDULE,
    MP_OPT_PP_VIRTUAL,
    MP_OPT_PP_LAYERS,
    {"--cp", "N", "context parallel degree", NULL},
    MP_OPT_CP_ROTATE,
    MP_OPT_MEGATRON_FSDP,
    MP_OPT_FP8_PARAM_GATHER,
    MP_OPT_FP8_ALL_GATHER,
    MP_OPT_ASYNC_TP,
    MP_OPT_MOE_DISPATCHER,
    MP_OPT_OVERLAP_MOE_COMM,
    MP_OPT_STORAGE,
    MP_OPT_CE_FUSION,
    MP_OPT_CUDA_GRAPHS,
    MP_OPT_CPU_OFFLOAD,
    MP_OPT_NCCL_CTAS, MP_OPT_NCCL_VERSION,
    MP_OPT_UB_CFG,
    MP_OPT_MOE_ROUTING,
    MP_OPT_AC(""),
    MP_OPT_RECOMPUTE_MODULES,
    MP_OPT_RECOMPUTE_METHOD,
    MP_OPT_FP8(""),
    MP_OPT_SP,
    MP_OPT_NO_SP,
    MP_OPT_SEQ("min(8192, the model's max_seq)"),
    MP_OPT_ALLOW_LONG_SEQ,
    MP_OPT_MICRO_BATCH("1; with pp > 1 under a stack that splits its local batch into pp micro-batches, as torchtitan does, that split"),
    MP_OPT_GLOBAL_BATCH_RULE,
    MP_OPT_GLOBAL_BATCH_TOKENS,
    MP_OPT_STACK("torchtitan-compile on GPUs, meshplan-cpu on the CPU, meshplan-cuda with a cuda --calibration"),
    {"--calibration", "DB", "apply the newest calibration in DB (meshplan calibrate): a cpu one to the CPU profile "
                            "and the meshplan-cpu stack, a cuda one to the meshplan-cuda stack (then the default) "
                            "on its GPU profile", NULL},
    MP_OPT_HEADROOM("0.05"),
    {"--trace", "PATH", "write the simulated timeline as Chrome trace JSON", NULL},
    MP_OPT_NO_RESHARD,
    MP_OPT_EMIT("the plan (DIR/plan.toml or DIR/plan.args)"),
    MP_OPT_EMIT_OUT,
    MP_OPT_FROM,
    MP_OPT_FROM_ARGS,
    MP_OPT_JSON("the prediction"),
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {
    "simulate", "Predict step time and memory of one plan.",
    "[--model M | --hf-config PATH] [--cluster C | --gpus N [--gpu G] [--gpus-per-node K]] [--mesh SPEC] [--ep N] "
    "[--pp N --pp-schedule 1f1b|interleaved|gpipe|dualpipe|zbv|interleaved_zb [--pp-virtual V] [--pp-layers A,B,... | --pp-layout STR]] [--cp N [--cp-rotate M | --cp-comm-type T]] [--ac POLICY] [--recompute-modules LIST] [--recompute-method block|uniform --recompute-num-layers N] [--fp8] [--sp|--no-sp] [--cuda-graphs S] [--cpu-offload-layers N] [--seq S] "
    "[--micro-batch B] [--global-batch G] [--stack PROFILE] [--calibration DB] [--trace out.json] "
    "[--emit torchtitan|megatron [--out DIR]] [--from FILE | --from-args 'ARGS'] [--json]",
    k_opts, 0};

/* Sets one mesh dim from an option, refusing a conflict with --mesh. */
static mp_status set_dim(mp_ctx *ctx, const char *opt, long long v, int *dim) {
  if (v < 1) return MP_OK;
  if (*dim != 1 && *dim != (int)v)
    return mp_error(ctx, MP_ERR_USAGE, "%s %lld conflicts with --mesh (%d)", opt, v, *dim);
  *dim = (int)v;
  return MP_OK;
}

/* With cp > 1 under a stack that is not a meshplan runtime (whose ring is its own): the
 * rotate method of PyTorch's ring, or under the megatron memory model Megatron-Core's cp
 * comm type; else NULL. */
static const char *ring_rotate(const mp_mesh *mesh, const mp_plan_options *o) {
  if (mesh->size[MP_DIM_CP] <= 1 || mp_mem_model_is_runtime(o->mem_model)) return NULL;
  if (o->mem_model == MP_MEM_MODEL_MEGATRON) return mp_cp_comm_name(o->cp_comm);
  return mp_cp_rotate_name(o->cp_rotate);
}

/* Whether the plan runs AsyncTP: asked for, with SP over tp > 1. */
static int async_tp_on(const mp_mesh *mesh, const mp_plan_options *o) {
  return o->sp > 0 && o->tp_comm_fused && mesh->size[MP_DIM_TP] > 1;
}

/* ", sp" under sequence parallelism (", sp, async-tp" with AsyncTP), the pipeline's
 * schedule with pp > 1 (", 1f1b", ", interleaved x2", ", gpipe") and PyTorch's ring's rotate
 * method with cp > 1 (", cp alltoall"; the meshplan runtimes run their own ring), into buf. */
static void fmt_plan_extras(const mp_mesh *mesh, const mp_plan_options *o, char *buf, size_t cap) {
  const char *ps = mp_pp_schedule_name(o->pp_schedule);
  int n = snprintf(buf, cap, "%s%s", o->sp > 0 ? ", sp" : "", async_tp_on(mesh, o) ? ", async-tp" : "");
  if (n >= 0 && (size_t)n < cap && mesh->size[MP_DIM_PP] > 1) {
    int k = o->pp_virtual > 1 ? snprintf(buf + n, cap - (size_t)n, ", %s x%d", ps, o->pp_virtual)
                              : snprintf(buf + n, cap - (size_t)n, ", %s", ps);
    n = k < 0 ? -1 : n + k;
    /* a stated layout: ", layers 7,8,...,7"; per model chunk in Megatron-LM's notation */
    if (o->n_pp_layers > mesh->size[MP_DIM_PP] && n >= 0 && (size_t)n + 10 < cap) {
      k = snprintf(buf + n, cap - (size_t)n, ", layout ");
      const int w = mp_pp_layout_format(o, buf + n + k, cap - (size_t)(n + k));
      n = w < 0 ? -1 : n + k + w;
    }
    for (int s = 0; o->n_pp_layers == mesh->size[MP_DIM_PP] && s < o->n_pp_layers && n >= 0 && (size_t)n < cap; s++) {
      k = snprintf(buf + n, cap - (size_t)n, "%s%d", s ? "," : ", layers ", o->pp_layers[s]);
      n = k < 0 ? -1 : n + k;
    }
  }
  const char *rot = ring_rotate(mesh, o);
  if (n >= 0 && (size_t)n < cap && rot) n += snprintf(buf + n, cap - (size_t)n, ", cp %s", rot);
  char rc[64];
  mp_recompute_modules_format(o->recompute_modules, rc, sizeof rc);
  if (n >= 0 && (size_t)n < cap && rc[0]) n += snprintf(buf + n, cap - (size_t)n, ", recompute %s", rc);
  if (n >= 0 && (size_t)n < cap && o->moe_fp8_dispatch) n += snprintf(buf + n, cap - (size_t)n, ", fp8 dispatch");
  if (n >= 0 && (size_t)n < cap && o->fp8_act_cache) n += snprintf(buf + n, cap - (size_t)n, ", fp8 activation cache");
  if (n >= 0 && (size_t)n < cap && o->fp8 && o->fp8_opts.param_gather)
    n += snprintf(buf + n, cap - (size_t)n, ", fp8 param gather");
  if (n >= 0 && (size_t)n < cap && o->moment_dtype == MP_DTYPE_BF16) n += snprintf(buf + n, cap - (size_t)n, ", bf16 moments");
  if (n >= 0 && (size_t)n < cap && o->fsdp.reduce_dtype == MP_DTYPE_BF16)
    snprintf(buf + n, cap - (size_t)n, ", bf16 FSDP reduction");
}



/* Megatron-Core's recompute modules and method, where the plan states them. */
static void recompute_json(const mp_plan_options *o, cJSON *j) {
  if (o->recompute_modules) {
    char rc[64];
    mp_recompute_modules_format(o->recompute_modules, rc, sizeof rc);
    cJSON_AddStringToObject(j, "recompute_modules", rc);
  }
  if (o->recompute_method != MP_RECOMPUTE_NONE) {
    cJSON_AddStringToObject(j, "recompute_method", mp_recompute_method_name(o->recompute_method));
    cJSON_AddNumberToObject(j, "recompute_num_layers", o->recompute_num_layers);
  }
}

static void print_text(const mp_sim_result *r, const mp_model *m, const mp_cluster *c,
                       const mp_mesh *mesh, const mp_plan_options *o,
                       const mp_stack_profile *prof, const int64_t *stage_peak) {
  char ms[128], ac[64];
  mp_mesh_format(mesh, ms, sizeof ms);
  mp_ac_format(o->ac, o->ac_every, ac, sizeof ac);
  if (o->recompute_method != MP_RECOMPUTE_NONE) /* Megatron-Core's method and count */
    snprintf(ac + strlen(ac), sizeof ac - strlen(ac), " (recompute %s %d)",
             mp_recompute_method_name(o->recompute_method), o->recompute_num_layers);
  const double gib = 1073741824.0;
  char more[640]; /* up to 128 stage counts of 3 digits */
  fmt_plan_extras(mesh, o, more, sizeof more);
  printf("plan    %s on %s: mesh %s, ac %s%s%s%s, seq %lld, micro-batch %lld, global batch %lld\n",
         m->name, c->name, ms, ac, o->fp8 ? ", fp8 " : "", o->fp8 ? mp_fp8_recipe_name(mp_fp8_recipe_of(o->fp8_opts.recipe, o->mem_model)) : "",
         more, (long long)o->seq, (long long)o->micro_batch, (long long)o->global_batch);
  char words[160];
  mp_cmd_params_str(m, words, sizeof words);
  printf("model   %s\n", words);
  mp_cmd_gpu_note(&c->gpu, words, sizeof words);
  if (words[0]) printf("note    %s\n", words);
  char kern[512];
  mp_stack_kernel_scale_format(prof, &c->gpu, kern, sizeof kern);
  printf("stack   %s\n", prof->name);
  printf("kernels %s\n", kern);
  printf("step    %.4f s   %.0f tokens/s per GPU   MFU %.1f %%\n", r->step_time_s,
         r->tokens_per_s_per_gpu, 100.0 * r->mfu);
  printf("time    compute %.4f s   exposed comm %.4f s   bubble %.4f s   optimizer %.4f s\n",
         r->compute_s, r->exposed_comm_s, r->bubble_s, r->optimizer_s);
  if (r->offload_exposed_s > 0) printf("offload host copies exposed %.4f s (in exposed comm)\n", r->offload_exposed_s);
  printf("streams");
  for (int s = 0; s < MP_STREAM_COUNT; s++)
    printf("   %s comm %.4f s", mp_stream_name((mp_stream)s), r->comm_s[s]);
  printf("\nmemory  peak %.2f GiB of %.2f GiB usable: %s\n", r->peak_mem_bytes / gib,
         r->capacity_bytes / gib, r->fits ? "fits" : "DOES NOT FIT");
  for (int k = 0; k < MP_MEM_COUNT; k++)
    if (r->mem_at_peak[k])
      printf("  %-12s %8.2f GiB\n", mp_mem_cat_name((mp_mem_cat)k), r->mem_at_peak[k] / gib);
  printf("  %-12s %8.2f GiB (runtime %.2f GiB + fragmentation x%.2f)\n", "overhead",
         r->overhead_bytes / gib, c->gpu.runtime_overhead_gib, prof->frag_factor);
  if (mesh->size[MP_DIM_PP] > 1 && stage_peak) {
    const int pp = mesh->size[MP_DIM_PP];
    double g[MP_MAX_LAYERS];
    int full = 0;
    for (int k = 0; k < pp; k++) {
      g[k] = stage_peak[k] / gib;
      if (stage_peak[k] > stage_peak[full]) full = k;
    }
    char peaks[2048];
    mp_cmd_fmt_runs(g, pp, "%.2f", peaks, sizeof peaks);
    printf("stages  peak by pipeline stage, GiB: %s (the fullest: stage %d, shown above)\n", peaks, full);
  }
}

/* CPU offloading's layers and the time its copies add (in exposed_comm_s too). */
static void offload_json(cJSON *j, const mp_plan_options *o, const mp_sim_result *r) {
  if (o->cpu_offload_layers <= 0) return;
  cJSON_AddNumberToObject(j, "cpu_offload_layers", o->cpu_offload_layers);
  cJSON_AddNumberToObject(j, "offload_exposed_s", r->offload_exposed_s);
}

/* A float8 plan's weight handling and scope: Megatron-Core's float8 weights, torchtitan's
 * float8 all-gather, the grouped GEMMs in float8 (--fp8-scope). */
static void add_fp8_weights(cJSON *j, const mp_float8_options *f) {
  if (f->param_gather) cJSON_AddBoolToObject(j, "fp8_param_gather", 1);
  if (f->all_gather) cJSON_AddBoolToObject(j, "fp8_all_gather", 1);
  if (f->scope != MP_FP8_SCOPE_LINEARS)
    cJSON_AddStringToObject(j, "fp8_scope", f->scope == MP_FP8_SCOPE_ALL ? "all" : "experts");
}

static int print_json(const mp_sim_result *r, const mp_model *m, const mp_cluster *c,
                      const mp_mesh *mesh, const mp_plan_options *o,
                      const mp_stack_profile *prof, const int64_t *stage_peak) {
  char ms[128], ac[32];
  mp_mesh_format(mesh, ms, sizeof ms);
  mp_ac_format(o->ac, o->ac_every, ac, sizeof ac);
  cJSON *j = cJSON_CreateObject();
  if (j == NULL) return 1;
  cJSON_AddStringToObject(j, "model", m->name);
  mp_cmd_params_json(m, j);
  cJSON_AddStringToObject(j, "cluster", c->name);
  char note[160];
  mp_cmd_gpu_note(&c->gpu, note, sizeof note);
  if (note[0]) cJSON_AddStringToObject(j, "gpu_note", note);
  cJSON_AddStringToObject(j, "mesh", ms);
  cJSON_AddStringToObject(j, "ac", ac);
  cJSON_AddBoolToObject(j, "fp8", o->fp8);
  if (o->fp8) cJSON_AddStringToObject(j, "fp8_recipe", mp_fp8_recipe_name(mp_fp8_recipe_of(o->fp8_opts.recipe, o->mem_model)));
  cJSON_AddBoolToObject(j, "sp", o->sp > 0);
  cJSON_AddBoolToObject(j, "async_tp", async_tp_on(mesh, o));
  recompute_json(o, j);
  if (o->moe_fp8_dispatch) cJSON_AddBoolToObject(j, "moe_fp8_dispatch", 1);
  if (o->fp8_act_cache) cJSON_AddBoolToObject(j, "fp8_act_cache", 1);
  if (o->fp8) add_fp8_weights(j, &o->fp8_opts);
  if (o->moment_dtype != MP_DTYPE_FP32) cJSON_AddStringToObject(j, "optimizer_moments", mp_dtype_name(o->moment_dtype));
  if (mp_plan_megatron_fsdp(o, mesh)) {
    cJSON_AddStringToObject(j, "data_parallel_sharding_strategy", mp_mfsdp_strategy_name(o->mfsdp_strategy));
    cJSON_AddBoolToObject(j, "fsdp_double_buffer", o->fsdp_double_buffer);
  }
  if (o->fsdp.reduce_dtype != MP_DTYPE_FP32 && o->dp == MP_DP_FSDP)
    cJSON_AddStringToObject(j, "fsdp_reduce_dtype", mp_dtype_name(o->fsdp.reduce_dtype));
  if (o->fsdp.flat_params && o->dp == MP_DP_FSDP) cJSON_AddBoolToObject(j, "fsdp_flat_params", 1);
  if (o->loss_chunks > 1) cJSON_AddNumberToObject(j, "loss_chunks", o->loss_chunks);
  if (mesh->size[MP_DIM_PP] > 1) {
    cJSON_AddStringToObject(j, "pp_schedule", mp_pp_schedule_name(o->pp_schedule));
    cJSON_AddNumberToObject(j, "pp_virtual", o->pp_virtual > 1 ? o->pp_virtual : 1);
    if (o->n_pp_layers > 0) {
      cJSON *layers = cJSON_AddArrayToObject(j, "pp_layers");
      for (int s = 0; layers && s < o->n_pp_layers; s++)
        cJSON_AddItemToArray(layers, cJSON_CreateNumber(o->pp_layers[s]));
    }
  }
  if (ring_rotate(mesh, o))
    cJSON_AddStringToObject(j, o->mem_model == MP_MEM_MODEL_MEGATRON ? "cp_comm_type" : "cp_rotate",
                            ring_rotate(mesh, o));
  if (o->cuda_graphs != MP_CUDA_GRAPHS_NONE) cJSON_AddStringToObject(j, "cuda_graphs", mp_cuda_graphs_name(o->cuda_graphs));
  cJSON_AddNumberToObject(j, "seq", (double)o->seq);
  cJSON_AddNumberToObject(j, "micro_batch", (double)o->micro_batch);
  cJSON_AddNumberToObject(j, "global_batch", (double)o->global_batch);
  cJSON_AddStringToObject(j, "stack", prof->name);
  cJSON_AddItemToObject(j, "kernels", mp_cmd_kernel_scale_json(prof, &c->gpu));
  cJSON_AddNumberToObject(j, "step_time_s", r->step_time_s);
  cJSON_AddNumberToObject(j, "tokens_per_s_per_gpu", r->tokens_per_s_per_gpu);
  cJSON_AddNumberToObject(j, "mfu", r->mfu);
  cJSON_AddNumberToObject(j, "compute_s", r->compute_s);
  cJSON_AddNumberToObject(j, "exposed_comm_s", r->exposed_comm_s);
  offload_json(j, o, r);
  cJSON_AddNumberToObject(j, "bubble_s", r->bubble_s);
  cJSON_AddNumberToObject(j, "optimizer_s", r->optimizer_s);
  cJSON *cs = cJSON_AddObjectToObject(j, "comm_s");
  for (int s = 0; cs && s < MP_STREAM_COUNT; s++)
    cJSON_AddNumberToObject(cs, mp_stream_name((mp_stream)s), r->comm_s[s]);
  cJSON_AddNumberToObject(j, "peak_mem_bytes", (double)r->peak_mem_bytes);
  cJSON *mb = cJSON_AddObjectToObject(j, "mem_at_peak_bytes");
  for (int k = 0; mb && k < MP_MEM_COUNT; k++)
    cJSON_AddNumberToObject(mb, mp_mem_cat_name((mp_mem_cat)k), (double)r->mem_at_peak[k]);
  cJSON_AddNumberToObject(j, "overhead_bytes", (double)r->overhead_bytes);
  cJSON_AddNumberToObject(j, "capacity_bytes", (double)r->capacity_bytes);
  cJSON_AddBoolToObject(j, "fits", r->fits);
  if (mesh->size[MP_DIM_PP] > 1 && stage_peak) {
    cJSON *sp = cJSON_AddArrayToObject(j, "stage_peak_mem_bytes");
    for (int k = 0; sp && k < mesh->size[MP_DIM_PP]; k++)
      cJSON_AddItemToArray(sp, cJSON_CreateNumber((double)stage_peak[k]));
  }
  return mp_cmd_print_json(j);
}

/* One simulation: what the command line names, and what it owns until the end. */
typedef struct sim_job {
  mp_model m;
  mp_cluster c;
  mp_mesh mesh;
  mp_plan_options o;
  mp_stack_profile prof;
  mp_sim_config cfg;
  mp_calib *cal;               /* --calibration's, applied to the cluster and the stack */
  char calib_line[768];        /* its summary */
  mp_calib_tables gemm_tables; /* the calibrated stack points here (bf16, float8) */
  mp_plan *plan;               /* the plan simulated, with its defaults resolved */
  mp_arena *arena;             /* --trace: the schedule's */
  mp_sim_trace *trace;
  char batch_rule[400];        /* the default batch rule's line, "" with --global-batch */
  char mb_rule[300];           /* the stack's pipeline micro-batching (mp_cmd_stack_micro_batch) */
  int64_t stage_peak[MP_MAX_LAYERS]; /* pp > 1: each stage's peak memory */
} sim_job;

/* --calibration: measured rates replace the CPU profile's before anything is simulated;
 * on a GPU profile, the newest cuda calibration (load_stack applies its fit). */
static mp_status load_calibration(mp_ctx *ctx, sim_job *j) {
  const char *cal_db = mp_args_get(&k_spec, "--calibration");
  if (!cal_db) return MP_OK;
  j->cal = malloc(sizeof *j->cal);
  if (j->cal == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory loading a calibration");
  MP_CHECK(mp_calib_store_load(ctx, cal_db, mp_gpu_is_cpu(&j->c.gpu) ? "cpu" : "cuda", j->cal));
  MP_CHECK(mp_calib_apply_checked(ctx, j->cal, NULL, &j->c));
  mp_calib_summary(j->cal, j->calib_line, sizeof j->calib_line);
  return MP_OK;
}

/* --mesh with --ep, --pp and --cp on top (without --mesh, dp_shard takes the GPUs the
 * others leave), checked against the cluster's world. */
static mp_status read_mesh(mp_ctx *ctx, const mp_cluster *c, mp_mesh *mesh) {
  const int world = mp_cluster_n_gpus(c);
  const char *spec = mp_args_get(&k_spec, "--mesh");
  if (spec)
    MP_CHECK(mp_mesh_parse(ctx, spec, world, mesh));
  else
    mp_mesh_init(mesh);
  long long ep = 0, pp = 0, cp = 0;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--ep", 1, MP_MESH_MAX_WORLD, &ep));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--pp", 1, MP_MESH_MAX_WORLD, &pp));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--cp", 1, MP_MESH_MAX_WORLD, &cp));
  MP_CHECK(set_dim(ctx, "--pp", pp, &mesh->size[MP_DIM_PP]));
  MP_CHECK(set_dim(ctx, "--cp", cp, &mesh->size[MP_DIM_CP]));
  MP_CHECK(set_dim(ctx, "--ep", ep, &mesh->ep));
  if (!spec) {
    int rest = world / (mesh->size[MP_DIM_PP] * mesh->size[MP_DIM_CP]);
    mesh->size[MP_DIM_DP_SHARD] = rest > 0 ? rest : 1;
  }
  MP_CHECK(mp_mesh_validate(ctx, mesh));
  if (mp_mesh_world(mesh) > world) {
    char ms[128];
    mp_mesh_format(mesh, ms, sizeof ms);
    return mp_error(ctx, MP_ERR_USAGE, "mesh %s needs %d GPUs, cluster %s has %d", ms, mp_mesh_world(mesh),
                    c->name, world);
  }
  return MP_OK;
}

/* The shared plan options, with --pp-schedule and --pp-virtual. */
static mp_status read_options(mp_ctx *ctx, mp_plan_options *o) {
  mp_plan_options_init(o);
  MP_CHECK(mp_cmd_plan_options(ctx, &k_spec, o));
  return mp_cmd_pp_schedule(ctx, &k_spec, o);
}

/* --stack, else meshplan-cuda under a cuda calibration, else the GPU's default; a
 * calibration's fit on top (a cpu one's kernel figures refitted at this run's sizes);
 * then the stack's memory model and dtypes into the options, and the simulator's config. */
static mp_status load_stack(mp_ctx *ctx, sim_job *j) {
  const char *stack = mp_args_get(&k_spec, "--stack");
  if (stack)
    MP_CHECK(mp_stack_load(ctx, stack, &j->prof));
  else if (j->cal && strcmp(j->cal->device, "cuda") == 0) /* what it measured: meshplan's CUDA kernels */
    MP_CHECK(mp_stack_load(ctx, "meshplan-cuda", &j->prof));
  else
    MP_CHECK(mp_stack_default(ctx, &j->c.gpu, &j->prof));
  if (j->cal) {
    mp_calib_run run;
    mp_calib_run_init(&run, &j->m, j->o.micro_batch, j->o.seq > 0 ? j->o.seq : j->m.max_seq,
                      j->mesh.size[MP_DIM_TP]);
    MP_CHECK(mp_calib_apply_stack_run(ctx, j->cal, &run, &j->prof, &j->gemm_tables));
  }
  if (j->prof.mem_model == MP_MEM_MODEL_MESHPLAN_CUDA)
    MP_CHECK(mp_gpu_check_cuda(ctx, &j->c.gpu, "meshplan's CUDA runtime (stack meshplan-cuda)"));
  if (j->o.sp == 1 && !j->prof.sp)
    return mp_error(ctx, MP_ERR_USAGE,
                    "meshplan simulate: --sp: stack %s does not run sequence parallelism", j->prof.name);
  mp_stack_plan_options(&j->prof, &j->c.gpu, &j->o);
  MP_CHECK(mp_cmd_cp_rotate(ctx, &k_spec, &j->prof, &j->o));
  MP_CHECK(mp_cmd_async_tp(ctx, &k_spec, &j->prof, &j->o));
  MP_CHECK(mp_cmd_moe_comm(ctx, &k_spec, &j->prof, &j->o));
  MP_CHECK(mp_cmd_ce_fusion(ctx, &k_spec, &j->prof, &j->o));
  MP_CHECK(mp_cmd_cuda_graphs_opt(ctx, &k_spec, &j->prof, &j->o));
  MP_CHECK(mp_cmd_cpu_offload(ctx, &k_spec, &j->prof, &j->o));
  MP_CHECK(mp_cmd_nccl(ctx, &k_spec, &j->prof));
  MP_CHECK(mp_cmd_ub_cfg(ctx, &k_spec, &j->prof));
  MP_CHECK(mp_cmd_moe_routing(ctx, &k_spec, &j->o.moe_routing));
  MP_CHECK(mp_cmd_storage(ctx, &k_spec, &j->o));
  MP_CHECK(mp_cmd_megatron_weights(ctx, &k_spec, &j->prof, &j->o));
  MP_CHECK(mp_cmd_fp8_all_gather(ctx, &k_spec, &j->prof, &j->o));
  memset(&j->cfg, 0, sizeof j->cfg);
  j->cfg.cluster = &j->c;
  j->cfg.stack = &j->prof;
  j->cfg.mem_headroom = 0.05; /* meshplan plan's */
  return mp_args_double(ctx, &k_spec, "--headroom", 0.0, 1.0, MP_RANGE_OPEN_HI, &j->cfg.mem_headroom);
}

/* --trace: rank 0's compact schedule simulated again with its timeline, written out. */
static mp_status write_trace(mp_ctx *ctx, sim_job *j, const char *path) {
  j->arena = mp_arena_create();
  if (j->arena == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an arena");
  mp_schedule *s = NULL;
  mp_sim_result tr;
  j->cfg.record_trace = 1;
  MP_CHECK(mp_schedule_build(ctx, j->plan, 0, MP_SCHEDULE_COMPACT, j->arena, &s));
  MP_CHECK(mp_simulate(ctx, s, &j->cfg, &tr, &j->trace));
  return mp_sim_trace_write(ctx, j->trace, path);
}

/* Everything up to the figures of *r; the plan's resolved options into j->o. */
static mp_status simulate_job(mp_ctx *ctx, sim_job *j, mp_sim_result *r) {
  MP_CHECK(mp_cmd_load_model(ctx, &k_spec, "llama3.1-8b", &j->m));
  MP_CHECK(mp_cmd_load_cluster(ctx, &k_spec, &j->c));
  MP_CHECK(load_calibration(ctx, j));
  MP_CHECK(read_mesh(ctx, &j->c, &j->mesh));
  MP_CHECK(read_options(ctx, &j->o));
  const int64_t seq = j->o.seq > 0 ? j->o.seq : (j->m.max_seq < 8192 ? j->m.max_seq : 8192);
  MP_CHECK(mp_cmd_check_seq(ctx, &k_spec, &j->m, seq));
  MP_CHECK(mp_cmd_batch_tokens(ctx, &k_spec, seq, &j->o.global_batch));
  if (j->o.global_batch == 0)
    mp_cmd_default_batch(&j->m, &j->mesh, seq, j->o.micro_batch, &j->o.global_batch, j->batch_rule,
                         sizeof j->batch_rule);
  MP_CHECK(load_stack(ctx, j));
  mp_cmd_megatron_pp_split(&j->m, &j->mesh, &j->o);
  mp_cmd_stack_micro_batch(&k_spec, &j->prof, &j->mesh, &j->o, j->mb_rule, sizeof j->mb_rule);
  if (j->mesh.size[MP_DIM_PP] > 1) j->cfg.stage_peak_bytes = j->stage_peak;
  MP_CHECK(mp_simulate_plan(ctx, &j->m, &j->mesh, &j->o, &j->cfg, r));
  j->cfg.stage_peak_bytes = NULL;
  /* the plan resolves defaults (seq, global batch): show the resolved ones */
  MP_CHECK(mp_build_plan(ctx, &j->m, &j->mesh, &j->o, &j->plan));
  j->o = j->plan->opts;
  const char *tpath = mp_args_get(&k_spec, "--trace");
  return tpath ? write_trace(ctx, j, tpath) : MP_OK;
}

/* --emit: the simulated plan as the target's file, DIR/plan.<ext>, headed by r. */
static mp_status emit_plan(mp_ctx *ctx, const sim_job *j, const mp_sim_result *r, const mp_cmd_call *call,
                           char *path, size_t cap) {
  mp_emit_target t;
  int on = 0;
  const char *dir = mp_args_get(&k_spec, "--out");
  MP_CHECK(mp_emit_args(ctx, mp_args_get(&k_spec, "--emit"), dir != NULL, &t, &on));
  char *cmdline = mp_emit_command_line("simulate", call->argc, call->argv);
  if (cmdline == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  const mp_emit_plan p = {&j->m, &j->c, &j->mesh, &j->o, &j->prof, r->step_time_s, r->tokens_per_s_per_gpu,
                          r->peak_mem_bytes, cmdline};
  mp_status st = mp_emit_write(ctx, t, &p, dir ? dir : ".", "plan", path, cap);
  free(cmdline);
  return st;
}

static int run_simulate(mp_ctx *ctx, const mp_cmd_call *call) {
  mp_emit_target target;
  int emit = 0;
  mp_status ast = mp_emit_args(ctx, mp_args_get(&k_spec, "--emit"), mp_args_has(&k_spec, "--out"), &target, &emit);
  if (ast != MP_OK) return mp_cmd_fail(ctx, ast);
  sim_job *j = calloc(1, sizeof *j);
  if (j == NULL) return mp_cmd_fail(ctx, mp_error(ctx, MP_ERR_NOMEM, "out of memory"));
  mp_sim_result r;
  mp_status st = simulate_job(ctx, j, &r);
  char emitted[4096] = "";
  if (st == MP_OK && emit) st = emit_plan(ctx, j, &r, call, emitted, sizeof emitted);
  int rc = 0;
  if (st != MP_OK) {
    rc = mp_cmd_fail(ctx, st);
  } else if (mp_args_has(&k_spec, "--json")) {
    rc = print_json(&r, &j->m, &j->c, &j->mesh, &j->o, &j->prof, j->stage_peak);
  } else {
    print_text(&r, &j->m, &j->c, &j->mesh, &j->o, &j->prof, j->stage_peak);
    if (j->batch_rule[0]) printf("batch   %s\n", j->batch_rule);
    if (j->mb_rule[0]) printf("micro   %s\n", j->mb_rule);
    const char *cal_db = mp_args_get(&k_spec, "--calibration"), *tpath = mp_args_get(&k_spec, "--trace");
    if (cal_db) printf("calibration applied: %s from %s\n", j->calib_line, cal_db);
    if (tpath) printf("trace   %s\n", tpath);
    if (emitted[0]) printf("emit    %s\n", emitted);
  }
  mp_sim_trace_destroy(j->trace);
  mp_arena_destroy(j->arena);
  mp_plan_destroy(j->plan);
  free(j->cal);
  free(j);
  return rc;
}

const mp_command mp_command_simulate = {&k_spec, "predict step time and memory of one plan", run_simulate};
