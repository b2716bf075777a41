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

#include "exec/cluster.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "exec/schedule.h"
#include "calib/store.h"
#include "calib/calibrate.h"
#include "planner/cli/commands.h"
#include "sim/sim.h"
#include "sim/stack.h"

static mp_opt k_opts[] = {
    {"--model", "M", "model name (data/models stem) or path to a JSON file (default llama3.1-8b)", NULL},
    {"--cluster", "C", "cluster name (data/clusters stem) or path (default h100-8 unless --gpus)", NULL},
    {"--gpus", "N", "instead of --cluster: N GPUs of type --gpu", NULL},
    {"--gpu", "G", "GPU profile for --gpus (data/gpus stem, default h100-sxm)", NULL},
    {"--gpus-per-node", "N", "GPUs per node for --gpus (default 8)", NULL},
    {"--inter-gbps", "X", "inter-node Gbit/s per GPU for --gpus (default 400)", NULL},
    {"--mesh", "SPEC", "mesh, e.g. dp_shard=8,tp=1 (-1 for one dim: the rest of the GPUs)", NULL},
    {"--ep", "N", "expert parallel degree (carved out of dp_shard)", NULL},
    {"--pp", "N", "pipeline stages", NULL},
    {"--pp-schedule", "S", "1f1b | interleaved | gpipe (default 1f1b)", NULL},
    {"--pp-virtual", "N", "virtual stages per rank for interleaved (default 2)", NULL},
    {"--cp", "N", "context parallel degree", NULL},
    {"--ac", "MODE", "activation checkpointing: none | selective | full (default none)", NULL},
    {"--fp8", NULL, "float8 Linear layers", NULL},
    {"--seq", "S", "tokens per sequence (default min(max_seq, 8192))", NULL},
    {"--micro-batch", "B", "sequences per micro-batch per data-parallel rank (default 1)", NULL},
    {"--global-batch", "G", "sequences per step over all data-parallel ranks (default one micro-batch each)", NULL},
    {"--stack", "PROFILE", "stack profile (data/stacks stem or path; default torchtitan-compile on GPUs, meshplan-cpu on the CPU)", NULL},
    {"--calibration", "DB", "apply the newest calibration in DB (meshplan calibrate): a cpu one to the CPU profile "
                            "and the meshplan-cpu stack, a cuda one to the meshplan-cuda stack (then the default) "
                            "on its GPU profile", NULL},
    {"--headroom", "F", "fraction of GPU memory kept free (default 0)", NULL},
    {"--trace", "PATH", "write the simulated timeline as Chrome trace JSON", NULL},
    {"--json", NULL, "print one JSON object", NULL},
    {NULL, NULL, NULL, NULL},
};

static mp_cmd_spec k_spec = {
    "simulate", "Predict step time and memory of one plan.",
    "--model M (--cluster C | --gpus N [--gpu G] [--gpus-per-node N]) --mesh SPEC [--ep N] "
    "[--pp N --pp-schedule 1f1b|interleaved] [--cp N] [--ac none|selective|full] [--fp8] [--seq S] "
    "[--micro-batch B] [--global-batch G] [--stack PROFILE] [--calibration DB] [--trace out.json] [--json]",
    k_opts, 0};

/* Sets one mesh dim from an option, refusing a conflict with --mesh. */
static mp_status set_dim(mp_ctx *ctx, const char *opt, long long v, int *dim) {
  if (v < 1) return MP_OK;
  if (*dim != 1 && *dim != (int)v)
    return mp_error(ctx, MP_ERR_USAGE, "meshplan simulate: %s %lld conflicts with --mesh (%d)", opt,
                    v, *dim);
  *dim = (int)v;
  return MP_OK;
}

static void print_text(const mp_sim_result *r, const mp_model *m, const mp_cluster *c,
                       const mp_mesh *mesh, const mp_plan_options *o,
                       const mp_stack_profile *prof) {
  char ms[128];
  mp_mesh_format(mesh, ms, sizeof ms);
  const double gib = 1073741824.0;
  printf("plan    %s on %s: mesh %s, ac %s%s, seq %lld, micro-batch %lld, global batch %lld\n",
         m->name, c->name, ms, mp_ac_mode_name(o->ac), o->fp8 ? ", fp8" : "", (long long)o->seq,
         (long long)o->micro_batch, (long long)o->global_batch);
  printf("stack   %s\n", prof->name);
  printf("step    %.4f s   %.0f tokens/s per GPU   MFU %.1f %%\n", r->step_time_s,
         r->tokens_per_s_per_gpu, 100.0 * r->mfu);
  printf("time    compute %.4f s   exposed comm %.4f s   bubble %.4f s   optimizer %.4f s\n",
         r->compute_s, r->exposed_comm_s, r->bubble_s, r->optimizer_s);
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
}

static int print_json(const mp_sim_result *r, const mp_model *m, const mp_cluster *c,
                      const mp_mesh *mesh, const mp_plan_options *o,
                      const mp_stack_profile *prof) {
  char ms[128];
  mp_mesh_format(mesh, ms, sizeof ms);
  cJSON *j = cJSON_CreateObject();
  if (j == NULL) return 1;
  cJSON_AddStringToObject(j, "model", m->name);
  cJSON_AddStringToObject(j, "cluster", c->name);
  cJSON_AddStringToObject(j, "mesh", ms);
  cJSON_AddStringToObject(j, "ac", mp_ac_mode_name(o->ac));
  cJSON_AddBoolToObject(j, "fp8", o->fp8);
  cJSON_AddNumberToObject(j, "seq", (double)o->seq);
  cJSON_AddNumberToObject(j, "micro_batch", (double)o->micro_batch);
  cJSON_AddNumberToObject(j, "global_batch", (double)o->global_batch);
  cJSON_AddStringToObject(j, "stack", prof->name);
  cJSON_AddNumberToObject(j, "step_time_s", r->step_time_s);
  cJSON_AddNumberToObject(j, "tokens_per_s_per_gpu", r->tokens_per_s_per_gpu);
  cJSON_AddNumberToObject(j, "mfu", r->mfu);
  cJSON_AddNumberToObject(j, "compute_s", r->compute_s);
  cJSON_AddNumberToObject(j, "exposed_comm_s", r->exposed_comm_s);
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
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (text == NULL) return 1;
  printf("%s\n", text);
  free(text);
  return 0;
}

int mp_cmd_simulate(int argc, char **argv) {
  const char *pos[1];
  int n_pos, done;
  int rc = mp_cmd_parse(&k_spec, argc, argv, pos, &n_pos, &done);
  if (done) return rc;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_status st;
  mp_model m;
  mp_cluster c;
  mp_mesh mesh;
  mp_plan_options o;
  mp_stack_profile prof;
  mp_plan *plan = NULL;
  mp_arena *arena = NULL;
  mp_sim_trace *trace = NULL;
  mp_calib *cal = NULL; /* --calibration's, applied to the cluster and the stack */

  const char *model = mp_args_get(&k_spec, "--model");
  MP_CHECK_GOTO(mp_model_load(&ctx, model ? model : "llama3.1-8b", &m), st, fail);

  /* cluster */
  const char *cl = mp_args_get(&k_spec, "--cluster");
  if (cl && mp_args_has(&k_spec, "--gpus")) {
    st = mp_error(&ctx, MP_ERR_USAGE, "meshplan simulate: give --cluster or --gpus, not both");
    goto fail;
  }
  if (mp_args_has(&k_spec, "--gpus")) {
    long long n = 0, per = 8;
    double inter = 400.0;
    MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--gpus", 1, &n), st, fail);
    MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--gpus-per-node", 1, &per), st, fail);
    MP_CHECK_GOTO(mp_args_double(&ctx, &k_spec, "--inter-gbps", 0.001, &inter), st, fail);
    const char *gpu = mp_args_get(&k_spec, "--gpu");
    MP_CHECK_GOTO(mp_cluster_make(&ctx, gpu ? gpu : "h100-sxm", (int)n, (int)per, &c), st, fail);
    c.inter_node_Gbitps_per_gpu = inter;
  } else {
    MP_CHECK_GOTO(mp_cluster_load(&ctx, cl ? cl : "h100-8", &c), st, fail);
  }
  int world = mp_cluster_n_gpus(&c);
  /* --calibration: measured rates replace the CPU profile's before anything is simulated;
   * on a GPU profile, the newest cuda calibration (the stack takes it below) */
  char calib_line[768] = "";
  const char *cal_db = mp_args_get(&k_spec, "--calibration");
  mp_calib_tables gemm_tables; /* the calibrated stack points here (bf16, float8): lives to the end */
  if (cal_db) {
    cal = malloc(sizeof *cal);
    if (cal == NULL) {
      st = mp_error(&ctx, MP_ERR_NOMEM, "out of memory loading a calibration");
      goto fail;
    }
    MP_CHECK_GOTO(mp_calib_store_load(&ctx, cal_db, mp_gpu_is_cpu(&c.gpu) ? "cpu" : "cuda", cal), st, fail);
    MP_CHECK_GOTO(mp_calib_apply_checked(&ctx, cal, NULL, &c), st, fail);
    mp_calib_summary(cal, calib_line, sizeof calib_line);
  }

  /* mesh */
  const char *spec = mp_args_get(&k_spec, "--mesh");
  if (spec) {
    MP_CHECK_GOTO(mp_mesh_parse(&ctx, spec, world, &mesh), st, fail);
  } else {
    mp_mesh_init(&mesh);
  }
  long long ep = 0, pp = 0, cp = 0, pv = 2;
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--ep", 1, &ep), st, fail);
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--pp", 1, &pp), st, fail);
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--cp", 1, &cp), st, fail);
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--pp-virtual", 1, &pv), st, fail);
  MP_CHECK_GOTO(set_dim(&ctx, "--pp", pp, &mesh.size[MP_DIM_PP]), st, fail);
  MP_CHECK_GOTO(set_dim(&ctx, "--cp", cp, &mesh.size[MP_DIM_CP]), st, fail);
  MP_CHECK_GOTO(set_dim(&ctx, "--ep", ep, &mesh.ep), st, fail);
  if (!spec) {
    /* no --mesh: the GPUs left over by pp, cp go to dp_shard */
    int rest = world / (mesh.size[MP_DIM_PP] * mesh.size[MP_DIM_CP]);
    mesh.size[MP_DIM_DP_SHARD] = rest > 0 ? rest : 1;
  }
  MP_CHECK_GOTO(mp_mesh_validate(&ctx, &mesh), st, fail);
  if (mp_mesh_world(&mesh) > world) {
    char ms[128];
    mp_mesh_format(&mesh, ms, sizeof ms);
    st = mp_error(&ctx, MP_ERR_USAGE, "meshplan simulate: mesh %s needs %d GPUs, cluster %s has %d",
                  ms, mp_mesh_world(&mesh), c.name, world);
    goto fail;
  }

  /* options */
  mp_plan_options_init(&o);
  MP_CHECK_GOTO(mp_cmd_plan_options(&ctx, &k_spec, &o), st, fail);
  const char *ps = mp_args_get(&k_spec, "--pp-schedule");
  if (ps) {
    if (strcmp(ps, "1f1b") == 0) o.pp_schedule = MP_PP_1F1B;
    else if (strcmp(ps, "interleaved") == 0) o.pp_schedule = MP_PP_INTERLEAVED;
    else if (strcmp(ps, "gpipe") == 0) o.pp_schedule = MP_PP_GPIPE;
    else {
      st = mp_error(&ctx, MP_ERR_USAGE,
                    "meshplan simulate: --pp-schedule '%s': choose 1f1b, interleaved or gpipe", ps);
      goto fail;
    }
  }
  o.pp_virtual = o.pp_schedule == MP_PP_INTERLEAVED ? (int)pv : 1;

  /* stack */
  const char *stack = mp_args_get(&k_spec, "--stack");
  const int cuda_cal = cal && strcmp(cal->device, "cuda") == 0;
  if (stack)
    MP_CHECK_GOTO(mp_stack_load(&ctx, stack, &prof), st, fail);
  else if (cuda_cal) /* what the calibration measured: meshplan's own CUDA kernels */
    MP_CHECK_GOTO(mp_stack_load(&ctx, "meshplan-cuda", &prof), st, fail);
  else
    MP_CHECK_GOTO(mp_stack_default(&ctx, &c.gpu, &prof), st, fail);
  if (cal) { /* a cpu calibration's kernel figures are refitted at this run's sizes */
    mp_calib_run run;
    mp_calib_run_init(&run, &m, o.micro_batch, o.seq > 0 ? o.seq : m.max_seq, mesh.size[MP_DIM_TP]);
    MP_CHECK_GOTO(mp_calib_apply_stack_run(&ctx, cal, &run, &prof, &gemm_tables), st, fail);
  }
  mp_stack_plan_options(&prof, &o); /* the memory model (and dtypes) of the stack's runtime */
  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = &c;
  cfg.stack = &prof;
  MP_CHECK_GOTO(mp_args_double(&ctx, &k_spec, "--headroom", 0.0, &cfg.mem_headroom), st, fail);

  mp_sim_result r;
  MP_CHECK_GOTO(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, &r), st, fail);

  /* the plan resolves defaults (seq, global batch): show the resolved ones */
  MP_CHECK_GOTO(mp_build_plan(&ctx, &m, &mesh, &o, &plan), st, fail);
  o = plan->opts;

  const char *tpath = mp_args_get(&k_spec, "--trace");
  if (tpath) {
    arena = mp_arena_create();
    if (arena == NULL) {
      st = mp_error(&ctx, MP_ERR_NOMEM, "out of memory creating an arena");
      goto fail;
    }
    mp_schedule *s = NULL;
    mp_sim_result tr;
    cfg.record_trace = 1;
    MP_CHECK_GOTO(mp_schedule_build(&ctx, plan, 0, MP_SCHEDULE_COMPACT, arena, &s), st, fail);
    MP_CHECK_GOTO(mp_simulate(&ctx, s, &cfg, &tr, &trace), st, fail);
    MP_CHECK_GOTO(mp_sim_trace_write(&ctx, trace, tpath), st, fail);
  }

  if (mp_args_has(&k_spec, "--json"))
    rc = print_json(&r, &m, &c, &mesh, &o, &prof);
  else
    print_text(&r, &m, &c, &mesh, &o, &prof);
  if (cal_db && !mp_args_has(&k_spec, "--json")) printf("calibration applied: %s from %s\n", calib_line, cal_db);
  if (tpath && !mp_args_has(&k_spec, "--json")) printf("trace   %s\n", tpath);
  mp_sim_trace_destroy(trace);
  mp_arena_destroy(arena);
  mp_plan_destroy(plan);
  free(cal);
  return rc;

fail:
  mp_sim_trace_destroy(trace);
  mp_arena_destroy(arena);
  mp_plan_destroy(plan);
  free(cal);
  return mp_cmd_fail(&ctx, st);
}
