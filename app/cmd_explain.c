/* meshplan explain: what a plan does to a model on a mesh, pass by pass.
 *
 * Builds the plan the stack runs (--stack, else the GPU's default: its memory model,
 * attention, loss, SP and context-parallel ring, as simulate builds it) with mp_build_plan
 * (TP -> EP -> Float8 -> AC -> FSDP) and prints: the
 * passes applied and what each changed (the plan's notes), a per-parameter table (global
 * shape, after TP/EP, at rest on --rank, bytes at rest in the master dtype), the FSDP
 * units, the per-rank totals; --param FQN adds a tile diagram of one weight (one
 * character grid per rank: '#' rows/columns the rank stores, '+' a cell it stores part
 * of, '.' nothing); --schedule the rank's step schedule (exec/schedule.h); --json all
 * of it as one JSON document (cJSON). With cp > 1 a "context parallel" section says how the
 * ring runs; with pp > 1 a "pipeline" section gives the layer split, the rank's warm-up and
 * in-flight chunks in the stack's schedule implementation, the bubble and the boundary
 * transfers.
 *
 * This file reads the options, builds the plan and, for --schedule and --summary, the
 * rank's schedule simulated on the cluster; explain_notes.c says how the ring and the
 * pipeline run, explain_text.c and explain_json.c print (explain.h). Errors (bad mesh, a
 * pass refusing, an unknown --param) are one line and exit 2 through mp_cmd_fail. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/arena.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "exec/schedule.h"
#include "app/commands.h"
#include "app/explain.h"
#include "sim/sim.h"
#include "sim/stack.h"

static mp_opt k_opts[] = {
    MP_OPT_MODEL("llama3.1-8b"),
    MP_OPT_HF_CONFIG,
    MP_OPT_MESH("default dp_shard=8"),
    MP_OPT_EP(""),
    MP_OPT_AC(""),
    MP_OPT_RECOMPUTE_MODULES,
    MP_OPT_RECOMPUTE_METHOD,
    MP_OPT_FP8(""),
    MP_OPT_SP,
    MP_OPT_NO_SP,
    MP_OPT_PP_SCHEDULE,
    MP_OPT_PP_VIRTUAL,
    MP_OPT_PP_LAYERS,
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
    {"--pad-vocab", NULL, "pad the vocabulary to a multiple of tp instead of refusing", NULL},
    {"--param", "FQN", "tile diagram of one parameter, e.g. layers.0.mlp.up_proj.weight", NULL},
    {"--rank", "R", "rank whose at-rest shapes and totals are shown (default 0)", NULL},
    MP_OPT_SEQ("min(8192, the model's max_seq)"),
    MP_OPT_ALLOW_LONG_SEQ,
    MP_OPT_MICRO_BATCH("1; with pp > 1 under a stack that splits its local batch into pp micro-batches, as torchtitan does, that split"),
    MP_OPT_GLOBAL_BATCH_RULE,
    MP_OPT_GLOBAL_BATCH_TOKENS,
    {"--schedule", NULL, "print the rank's step schedule, each op with its predicted duration", NULL},
    {"--summary", NULL, "where the predicted step goes: time and count per kernel class and per collective "
                        "group (with or instead of --schedule)", NULL},
    MP_OPT_CLUSTER("--gpus of the mesh's world"),
    MP_OPT_GPUS,
    MP_OPT_GPU_OF_GPUS("default h100-sxm"),
    MP_OPT_GPUS_PER_NODE("8, or N when N < 8"),
    MP_OPT_NVLINK_DOMAIN,
    MP_OPT_INTER_GBPS,
    MP_OPT_STACK("the GPU's default"),
    MP_OPT_NO_RESHARD,
    MP_OPT_FROM,
    MP_OPT_FROM_ARGS,
    MP_OPT_JSON("everything"),
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {
    "explain", "Show the sharding passes, parameter shapes, FSDP units and schedule of one plan.",
    "[--model M | --hf-config PATH] [--mesh SPEC] [--ep N] [--pp-schedule 1f1b|interleaved|gpipe|dualpipe|zbv|interleaved_zb [--pp-virtual V] [--pp-layers A,B,... | --pp-layout STR]] "
    "[--cp-rotate M | --cp-comm-type T] [--ac MODE] [--recompute-modules LIST] [--recompute-method block|uniform --recompute-num-layers N] [--fp8] [--sp|--no-sp] [--param FQN] [--rank R] [--json] "
    "[--schedule] [--summary] [--cluster C | --gpus N] [--seq S] [--micro-batch B] [--global-batch G]",
    k_opts, 0};

/* ---- the stack, the options and the schedule -------------------------------------- */

/* The cluster the durations are predicted on: --cluster or --gpus (mp_cmd_load_cluster),
 * else the mesh's world of h100-sxm GPUs, 8 per node. */
static mp_status explain_cluster(mp_ctx *ctx, const explain *e, mp_cluster *c) {
  if (mp_args_has(&k_spec, "--cluster") || mp_args_has(&k_spec, "--gpus") || mp_args_has(&k_spec, "--gpu") ||
      mp_args_has(&k_spec, "--gpus-per-node") || mp_args_has(&k_spec, "--inter-gbps") ||
      mp_args_has(&k_spec, "--nvlink-domain"))
    return mp_cmd_load_cluster(ctx, &k_spec, c);
  return mp_cluster_make(ctx, "h100-sxm", e->world, e->world < 8 ? e->world : 8, c);
}

/* The cluster explain predicts on and the stack: --stack, else the GPU's default. */
static mp_status explain_stack(mp_ctx *ctx, const explain *e, mp_cluster *c, mp_stack_profile *prof) {
  MP_CHECK(explain_cluster(ctx, e, c));
  const char *stack = mp_args_get(&k_spec, "--stack");
  if (stack) return mp_stack_load(ctx, stack, prof);
  return mp_stack_default(ctx, &c->gpu, prof);
}

static mp_status parse_options(mp_ctx *ctx, mp_model *m, mp_mesh *mesh, mp_plan_options *o,
                               explain *e) {
  MP_CHECK(mp_cmd_load_model(ctx, &k_spec, "llama3.1-8b", m));
  const char *ms = mp_args_get(&k_spec, "--mesh");
  MP_CHECK(mp_mesh_parse(ctx, ms ? ms : "dp_shard=8", 0, mesh));
  MP_CHECK(mp_cmd_mesh_ep(ctx, &k_spec, mesh));
  mp_plan_options_init(o);
  MP_CHECK(mp_cmd_plan_options(ctx, &k_spec, o));
  MP_CHECK(mp_cmd_pp_schedule(ctx, &k_spec, o));
  e->world = mp_mesh_world(mesh);
  /* the plan the stack runs, as simulate builds it: its memory model, attention, loss, SP
   * and context-parallel ring */
  MP_CHECK(explain_stack(ctx, e, &e->cluster, &e->prof));
  if (o->sp == 1 && !e->prof.sp)
    return mp_error(ctx, MP_ERR_USAGE, "--sp: stack %s does not run sequence parallelism",
                    e->prof.name);
  mp_stack_plan_options(&e->prof, &e->cluster.gpu, o);
  MP_CHECK(mp_cmd_cp_rotate(ctx, &k_spec, &e->prof, o));
  MP_CHECK(mp_cmd_megatron_weights(ctx, &k_spec, &e->prof, o));
  MP_CHECK(mp_cmd_fp8_all_gather(ctx, &k_spec, &e->prof, o));
  MP_CHECK(mp_cmd_async_tp(ctx, &k_spec, &e->prof, o));
  MP_CHECK(mp_cmd_moe_comm(ctx, &k_spec, &e->prof, o));
  MP_CHECK(mp_cmd_ce_fusion(ctx, &k_spec, &e->prof, o));
  MP_CHECK(mp_cmd_cuda_graphs_opt(ctx, &k_spec, &e->prof, o));
  MP_CHECK(mp_cmd_cpu_offload(ctx, &k_spec, &e->prof, o));
  MP_CHECK(mp_cmd_nccl(ctx, &k_spec, &e->prof));
  MP_CHECK(mp_cmd_ub_cfg(ctx, &k_spec, &e->prof));
  MP_CHECK(mp_cmd_moe_routing(ctx, &k_spec, &o->moe_routing));
  MP_CHECK(mp_cmd_storage(ctx, &k_spec, o));
  const int64_t seq = o->seq > 0 ? o->seq : (m->max_seq < 8192 ? m->max_seq : 8192);
  MP_CHECK(mp_cmd_check_seq(ctx, &k_spec, m, seq));
  MP_CHECK(mp_cmd_batch_tokens(ctx, &k_spec, seq, &o->global_batch));
  if (o->global_batch == 0) {
    char rule[400];
    mp_cmd_default_batch(m, mesh, seq, o->micro_batch, &o->global_batch, rule, sizeof rule);
  }
  o->tp.pad_vocab = mp_args_has(&k_spec, "--pad-vocab");
  long long rank = 0;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--rank", 0, MP_MESH_MAX_WORLD - 1, &rank));
  if (rank >= e->world)
    return mp_error(ctx, MP_ERR_USAGE, "--rank %lld is outside the mesh's %d ranks "
                    "(0..%d)", rank, e->world, e->world - 1);
  e->rank = (int)rank;
  e->param_fqn = mp_args_get(&k_spec, "--param");
  e->schedule = mp_args_has(&k_spec, "--schedule");
  e->summary = mp_args_has(&k_spec, "--summary");
  e->json = mp_args_has(&k_spec, "--json");
  return MP_OK;
}

/* The rank's expanded schedule, simulated with its trace: each op's predicted duration
 * (e->dur) and the step's busy time by class (e->busy); the cost figures are the stack's on
 * the cluster's GPU. */
static mp_status build_schedule(mp_ctx *ctx, explain *e, mp_arena **arena, mp_schedule **s) {
  *arena = mp_arena_create();
  if (*arena == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the schedule");
  MP_CHECK(mp_schedule_build(ctx, e->plan, e->rank, MP_SCHEDULE_EXPANDED, *arena, s));
  const mp_cluster *c = &e->cluster;
  const mp_stack_profile *prof = &e->prof;
  if (mp_mesh_world(&e->plan->mesh) > mp_cluster_n_gpus(c))
    return mp_error(ctx, MP_ERR_USAGE, "the mesh has %d ranks and cluster %s %d GPUs; give --gpus %d or a larger "
                    "--cluster", mp_mesh_world(&e->plan->mesh), c->name, mp_cluster_n_gpus(c),
                    mp_mesh_world(&e->plan->mesh));
  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = c;
  cfg.stack = prof;
  cfg.mem_headroom = 0.05;
  cfg.record_trace = 1;
  mp_sim_trace *t = NULL;
  MP_CHECK(mp_simulate(ctx, *s, &cfg, &e->res, &t));
  e->dur = mp_arena_alloc(*arena, (size_t)((*s)->n_ops > 0 ? (*s)->n_ops : 1) * sizeof *e->dur);
  if (e->dur == NULL) {
    mp_sim_trace_destroy(t);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the schedule's durations");
  }
  mp_sim_trace_op_durations(t, e->dur, (*s)->n_ops);
  mp_sim_trace_busy(t, &e->busy);
  mp_sim_trace_destroy(t);
  snprintf(e->predicted_on, sizeof e->predicted_on, "%d x %s, stack %s", mp_cluster_n_gpus(c), c->gpu.name,
           prof->name);
  mp_stack_kernel_scale_format(prof, &c->gpu, e->kernels, sizeof e->kernels);
  e->kernels_json = mp_cmd_kernel_scale_json(prof, &c->gpu);
  return MP_OK;
}

/* ---- the command ------------------------------------------------------------------ */

/* --param's parameter into *out (NULL without --param). */
static mp_status find_param(mp_ctx *ctx, const explain *e, const mp_model *m, const mp_param **out) {
  *out = NULL;
  if (!e->param_fqn) return MP_OK;
  int i = mp_plan_find_param(e->plan, e->param_fqn);
  if (i < 0)
    return mp_error(ctx, MP_ERR_NOT_FOUND,
                    "no parameter '%s' in %s; names look like layers.0.mlp.up_proj.weight (see "
                    "the table of meshplan explain without --param)",
                    e->param_fqn, m->name);
  *out = &e->plan->params[i];
  return MP_OK;
}

static int run_explain(mp_ctx *ctx, const mp_cmd_call *call) {
  (void)call;
  mp_model m;
  mp_mesh mesh;
  mp_plan_options o;
  explain e;
  memset(&e, 0, sizeof e);
  const mp_param *prm = NULL;
  mp_arena *sarena = NULL;
  mp_schedule *sched = NULL;
  mp_status st = parse_options(ctx, &m, &mesh, &o, &e);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  if (mesh.size[MP_DIM_PP] > 1) /* the stack's pipeline order and micro-batching */
    mp_cmd_stack_micro_batch(&k_spec, &e.prof, &mesh, &o, e.mb_rule, sizeof e.mb_rule);
  st = mp_build_plan(ctx, &m, &mesh, &o, &e.plan);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  MP_CHECK_GOTO(find_param(ctx, &e, &m, &prm), st, out);
  MP_CHECK_GOTO(mp_plan_batch(ctx, e.plan, &e.local_batch, &e.n_micro), st, out);
  if (mesh.size[MP_DIM_PP] > 1) MP_CHECK_GOTO(mp_explain_pipeline_facts(ctx, &e, &e.prof), st, out);
  if (e.schedule || e.summary) MP_CHECK_GOTO(build_schedule(ctx, &e, &sarena, &sched), st, out);
  if (e.json)
    mp_explain_print_json(&e, prm, sched);
  else
    mp_explain_print_text(&e, prm, sched);
out:
  cJSON_Delete(e.kernels_json);
  mp_arena_destroy(sarena);
  mp_plan_destroy(e.plan);
  return st != MP_OK ? mp_cmd_fail(ctx, st) : 0;
}

const mp_command mp_command_explain = {&k_spec, "show the sharding passes, parameter shapes and schedule of one plan",
                                       run_explain};
