/* meshplan plan: the main job. Enumerates every device mesh and option for a model on a
 * cluster, prunes what cannot run (with reasons), simulates the rest on all cores, logs
 * every candidate to SQLite, ranks the feasible plans and prints them (table, --json or
 * --csv), optionally drawing gnuplot plots (--plot DIR).
 *
 * --executable-only keeps the plans exec/runtime executes, by its own rules
 * (mp_runtime_plan_check, exec/runtime/check.h: no context parallelism yet, among others). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "exec/cluster.h"
#include "exec/model.h"
#include "planner/cli/commands.h"
#include "planner/evaluate.h"
#include "planner/planner.h"
#include "planner/plot.h"
#include "planner/search.h"
#include "planner/store.h"

/* The rows' order is the order of the options in the runs table's options column. */
static mp_opt k_opts[] = {
    MP_OPT_MODEL("llama3.1-8b"),
    MP_OPT_HF_CONFIG,
    MP_OPT_CLUSTER("h100-8"),
    MP_OPT_GPUS,
    MP_OPT_GPU_OF_GPUS("required with --gpus, e.g. h100-sxm"),
    MP_OPT_GPUS_PER_NODE("8, or N when N < 8"),
    MP_OPT_SEQ("min(8192, the model's max_seq)"),
    MP_OPT_GLOBAL_BATCH("32"),
    {"--global-batch-tokens", "T", "tokens per step instead of --global-batch (a multiple of --seq)", NULL},
    MP_OPT_TOP(""),
    {"--objective", "O", "time (default), memory, or tokens-per-dollar (needs a price)", NULL},
    {"--price", "USD", "price per GPU-hour for tokens-per-dollar (default: the cluster's)", NULL},
    {"--fix", "K=V,...", "constrain the search, e.g. tp=8,pp=1,ac=full,fp8=0,mb=2,reshard=1,sp=1,pp_virtual=2",
     NULL},
    {"--no-sp", NULL, "search tensor parallelism without sequence parallelism (the all-reduce form; "
                      "default: SP with tp > 1 where the stack runs it)", NULL},
    {"--executable-only", NULL, "only plans the runtime executes (exec/runtime/check.h: cp=1, no float8 with pp, ...)", NULL},
    {"--allow-cross-node-tp", NULL, "allow tensor-parallel groups that span nodes", NULL},
    MP_OPT_HEADROOM("0.05"),
    MP_OPT_STACK("torchtitan-compile on GPUs, meshplan-cpu on the CPU"),
    MP_OPT_THREADS,
    MP_OPT_DB("that logs every candidate (default meshplan.db)"),
    {"--no-db", NULL, "do not write a database", NULL},
    {"--plot", "DIR", "write gnuplot plots (PNG, data, scripts) into DIR (needs gnuplot)", NULL},
    MP_OPT_JSON("the ranked plans"),
    {"--csv", NULL, "print the ranked plans as CSV", NULL},
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {
    "plan", "Enumerate device meshes for a model on a cluster, simulate and rank them.",
    "[--model M | --hf-config PATH] [--cluster C | --gpus N --gpu TYPE --gpus-per-node K] "
    "[--seq S] [--global-batch G] [--top K] [--db PATH] [--plot DIR] [--json | --csv]",
    k_opts, 0};

static const double kGiB = 1024.0 * 1024.0 * 1024.0;

static const char *const k_mem_keys[MP_MEM_COUNT] = {
    "params_bytes", "optimizer_bytes", "grads_bytes", "gathered_bytes", "activations_bytes",
    "temp_bytes", "comm_bytes", "fp8_bytes", "logits_bytes"};

/* Every option given, as JSON, for the runs table. */
static char *options_json(void) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  for (const mp_opt *p = k_spec.opts; p->name; p++)
    if (p->value) cJSON_AddStringToObject(o, p->name + 2, p->value);
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

static char *command_line(int argc, char **argv) {
  size_t len = strlen("meshplan plan") + 1;
  for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
  char *s = malloc(len);
  if (!s) return NULL;
  strcpy(s, "meshplan plan");
  for (int i = 0; i < argc; i++) {
    strcat(s, " ");
    strcat(s, argv[i]);
  }
  return s;
}

static cJSON *plan_json(const mp_candidate *c, int64_t rank, double price) {
  cJSON *j = cJSON_CreateObject(), *mesh = cJSON_CreateObject(), *mem = cJSON_CreateObject();
  if (!j || !mesh || !mem) {
    cJSON_Delete(j);
    cJSON_Delete(mesh);
    cJSON_Delete(mem);
    return NULL;
  }
  cJSON_AddNumberToObject(j, "rank", (double)rank);
  if (c->plan_id) cJSON_AddNumberToObject(j, "plan_id", (double)c->plan_id);
  cJSON_AddNumberToObject(mesh, "dp_replicate", c->mesh.size[MP_DIM_DP_REPLICATE]);
  cJSON_AddNumberToObject(mesh, "dp_shard", c->mesh.size[MP_DIM_DP_SHARD]);
  cJSON_AddNumberToObject(mesh, "tp", c->mesh.size[MP_DIM_TP]);
  cJSON_AddNumberToObject(mesh, "ep", c->mesh.ep);
  cJSON_AddNumberToObject(mesh, "pp", c->mesh.size[MP_DIM_PP]);
  cJSON_AddNumberToObject(mesh, "cp", c->mesh.size[MP_DIM_CP]);
  cJSON_AddItemToObject(j, "mesh", mesh);
  char ac[32];
  mp_candidate_ac_str(c, ac, sizeof ac);
  cJSON_AddNumberToObject(mesh, "pp_virtual", c->pp_virtual);
  cJSON_AddStringToObject(j, "ac", ac);
  cJSON_AddBoolToObject(j, "sp", c->sp);
  cJSON_AddBoolToObject(j, "fp8", c->fp8);
  cJSON_AddNumberToObject(j, "micro_batch", (double)c->micro_batch);
  cJSON_AddBoolToObject(j, "reshard_after_forward", c->reshard);
  cJSON_AddBoolToObject(j, "vocab_padded", c->pads_vocab);
  cJSON_AddNumberToObject(j, "step_time_s", c->res.step_time_s);
  cJSON_AddNumberToObject(j, "tokens_per_s_per_gpu", c->res.tokens_per_s_per_gpu);
  cJSON_AddNumberToObject(j, "mfu", c->res.mfu);
  if (price > 0) cJSON_AddNumberToObject(j, "tokens_per_dollar", mp_tokens_per_dollar(c, price));
  cJSON_AddNumberToObject(j, "peak_mem_bytes", (double)c->res.peak_mem_bytes);
  cJSON_AddNumberToObject(j, "capacity_bytes", (double)c->res.capacity_bytes);
  cJSON_AddBoolToObject(j, "fits", c->res.fits);
  for (int k = 0; k < MP_MEM_COUNT; k++)
    cJSON_AddNumberToObject(mem, k_mem_keys[k], (double)c->res.mem_at_peak[k]);
  cJSON_AddNumberToObject(mem, "overhead_bytes", (double)c->res.overhead_bytes);
  cJSON_AddItemToObject(j, "mem_at_peak", mem);
  cJSON_AddNumberToObject(j, "compute_s", c->res.compute_s);
  cJSON_AddNumberToObject(j, "exposed_comm_s", c->res.exposed_comm_s);
  cJSON_AddNumberToObject(j, "bubble_s", c->res.bubble_s);
  return j;
}

static void print_reject_summary(FILE *f, const mp_search *s) {
  int64_t by[MP_REJECT_COUNT] = {0};
  for (int64_t i = 0; i < s->n; i++) by[s->cands[i].reject]++;
  fprintf(f, "rejected by rule:");
  int any = 0;
  for (int r = 1; r < MP_REJECT_COUNT; r++)
    if (by[r]) {
      fprintf(f, "%s %s %lld", any ? "," : "", mp_reject_name((mp_reject)r), (long long)by[r]);
      any = 1;
    }
  fprintf(f, "%s\n", any ? "" : " none");
}

/* What the command line asks for, read and checked before the search. */
typedef struct plan_args {
  mp_model m;
  mp_cluster c;
  long long seq, gb, top, threads;
  double headroom, price;
  int as_json, as_csv;
  mp_objective obj;
  const char *plot_dir; /* NULL: no plots */
  const char *db;       /* NULL: --no-db */
} plan_args;

/* --model or --hf-config (default llama3.1-8b). */
static mp_status load_model(mp_ctx *ctx, mp_model *m) {
  const char *hf = mp_args_get(&k_spec, "--hf-config");
  const char *model = mp_args_get(&k_spec, "--model");
  if (hf && model) return mp_error(ctx, MP_ERR_USAGE, "give --model or --hf-config, not both");
  return mp_model_load(ctx, hf ? hf : (model ? model : "llama3.1-8b"), m);
}

/* --cluster (default h100-8), or --gpus N of --gpu TYPE with --gpus-per-node (default
 * min(8, N)); any of the three selects the second. */
static mp_status load_cluster(mp_ctx *ctx, mp_cluster *c) {
  const char *cl = mp_args_get(&k_spec, "--cluster");
  int by_gpus = mp_args_has(&k_spec, "--gpus") || mp_args_has(&k_spec, "--gpu") ||
                mp_args_has(&k_spec, "--gpus-per-node");
  if (cl && by_gpus)
    return mp_error(ctx, MP_ERR_USAGE, "give --cluster or --gpus/--gpu/--gpus-per-node, not both");
  if (!by_gpus) return mp_cluster_load(ctx, cl ? cl : "h100-8", c);
  long long n = 0, per = 0;
  const char *gpu = mp_args_get(&k_spec, "--gpu");
  if (!mp_args_has(&k_spec, "--gpus") || !gpu)
    return mp_error(ctx, MP_ERR_USAGE, "--gpus N needs --gpu TYPE (e.g. --gpus 64 --gpu h100-sxm)");
  MP_CHECK(mp_args_int(ctx, &k_spec, "--gpus", 1, MP_LIM_GPUS, &n));
  per = n < 8 ? n : 8;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--gpus-per-node", 1, MP_LIM_GPUS_PER_NODE, &per));
  return mp_cluster_make(ctx, gpu, n, per, c);
}

/* The step's size: --seq, and --global-batch or --global-batch-tokens (a whole number
 * of sequences). */
static mp_status read_batch(mp_ctx *ctx, plan_args *a) {
  if (!mp_args_has(&k_spec, "--global-batch-tokens")) return MP_OK;
  long long tokens = 0;
  if (mp_args_has(&k_spec, "--global-batch"))
    return mp_error(ctx, MP_ERR_USAGE, "give --global-batch or --global-batch-tokens, not both");
  MP_CHECK(mp_args_int(ctx, &k_spec, "--global-batch-tokens", 1, MP_LIM_STEP_TOKENS, &tokens));
  if (tokens % a->seq)
    return mp_error(ctx, MP_ERR_USAGE, "--global-batch-tokens %lld is not a multiple of seq %lld; use %lld or %lld",
                    tokens, a->seq, tokens / a->seq * a->seq, (tokens / a->seq + 1) * a->seq);
  a->gb = tokens / a->seq;
  return MP_OK;
}

/* Everything but the search's own options, with the checks that need no search: the
 * model, the cluster, the numbers, the output form, the objective and its price, and
 * gnuplot and the plot directory (a search is not wasted on a plot that cannot be made). */
static mp_status read_args(mp_ctx *ctx, plan_args *a) {
  MP_CHECK(load_model(ctx, &a->m));
  MP_CHECK(load_cluster(ctx, &a->c));
  a->seq = a->m.max_seq < 8192 ? a->m.max_seq : 8192;
  a->gb = 32;
  a->top = 10;
  a->threads = 0;
  a->headroom = 0.05;
  a->price = a->c.price_per_gpu_hour;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--seq", 1, MP_LIM_SEQ, &a->seq));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--global-batch", 1, MP_LIM_GLOBAL_BATCH, &a->gb));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--top", 0, INT32_MAX, &a->top));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--threads", 1, MP_LIM_THREADS, &a->threads));
  MP_CHECK(mp_args_double(ctx, &k_spec, "--headroom", 0, 1, MP_RANGE_OPEN_HI, &a->headroom));
  MP_CHECK(mp_args_double(ctx, &k_spec, "--price", 0, MP_LIM_PRICE, MP_RANGE_CLOSED, &a->price));
  MP_CHECK(read_batch(ctx, a));
  MP_CHECK(mp_model_check_step(ctx, &a->m, a->seq, 1, a->gb));
  if (a->seq > a->m.max_seq)
    fprintf(stderr, "meshplan plan: note: seq %lld is longer than %s's max_seq %lld\n", a->seq, a->m.name,
            (long long)a->m.max_seq);
  a->as_json = mp_args_has(&k_spec, "--json");
  a->as_csv = mp_args_has(&k_spec, "--csv");
  if (a->as_json && a->as_csv) return mp_error(ctx, MP_ERR_USAGE, "give --json or --csv, not both");
  a->obj = MP_OBJECTIVE_TIME;
  const char *objs = mp_args_get(&k_spec, "--objective");
  if (objs) MP_CHECK(mp_objective_parse(ctx, objs, &a->obj));
  if (a->obj == MP_OBJECTIVE_TOKENS_PER_DOLLAR && !(a->price > 0))
    return mp_error(ctx, MP_ERR_USAGE, "--objective tokens-per-dollar needs a price: cluster %s has no "
                    "price_per_gpu_hour; pass --price USD_PER_GPU_HOUR", a->c.name);
  a->plot_dir = mp_args_get(&k_spec, "--plot");
  if (a->plot_dir) {
    MP_CHECK(mp_plot_check_gnuplot(ctx));
    MP_CHECK(mp_plot_make_dir(ctx, a->plot_dir));
  }
  a->db = mp_args_has(&k_spec, "--no-db") ? NULL : mp_cmd_db_path(&k_spec);
  return MP_OK;
}

/* The planner request for a: the search with the simulator ev (initialised for a) as its
 * evaluator, and what the runs table records (opts_json and cmdline stay the caller's). */
static mp_status make_request(mp_ctx *ctx, const plan_args *a, mp_sim_evaluator *ev, const char *opts_json,
                              const char *cmdline, mp_planner_request *req) {
  memset(req, 0, sizeof *req);
  mp_sim_search_config(&req->search, ev, &a->c, a->headroom);
  req->search.allow_cross_node_tp = mp_args_has(&k_spec, "--allow-cross-node-tp");
  req->search.executable_only = mp_args_has(&k_spec, "--executable-only");
  req->search.n_threads = (int)a->threads;
  const char *fix = mp_args_get(&k_spec, "--fix");
  if (fix) MP_CHECK(mp_search_fix_parse(ctx, fix, &req->search.fix));
  if (mp_args_has(&k_spec, "--no-sp")) {
    if (req->search.fix.sp == 1)
      return mp_error(ctx, MP_ERR_USAGE, "meshplan plan: --no-sp contradicts sp=1 in --fix; give one");
    req->search.fix.sp = 0;
  }
  /* a policy recomputing more is never faster: pruned when ranking by time */
  req->search.prune_dominated = a->obj != MP_OBJECTIVE_MEMORY;
  req->objective = a->obj;
  req->price_per_gpu_hour = a->price;
  req->show_progress = 1;
  req->info.model = a->m.name;
  req->info.cluster = a->c.name;
  req->info.gpu = a->c.gpu.name;
  req->info.n_gpus = mp_cluster_n_gpus(&a->c);
  req->info.gpus_per_node = a->c.gpus_per_node;
  req->info.seq = a->seq;
  req->info.global_batch = a->gb;
  req->info.objective = mp_objective_name(a->obj);
  req->info.options_json = opts_json;
  req->info.command = cmdline;
  req->info.tool_version = MESHPLAN_VERSION;
  return MP_OK;
}

static void print_json(const plan_args *a, const mp_planner_result *res, int64_t n_show, double show_price,
                       int stored) {
  const mp_search *s = res->search;
  cJSON *root = cJSON_CreateObject(), *plans = cJSON_CreateArray();
  if (!root || !plans) {
    cJSON_Delete(root);
    cJSON_Delete(plans);
    return;
  }
  cJSON_AddStringToObject(root, "model", a->m.name);
  cJSON_AddStringToObject(root, "cluster", a->c.name);
  cJSON_AddStringToObject(root, "gpu", a->c.gpu.name);
  cJSON_AddNumberToObject(root, "n_gpus", mp_cluster_n_gpus(&a->c));
  cJSON_AddNumberToObject(root, "seq", (double)a->seq);
  cJSON_AddNumberToObject(root, "global_batch", (double)a->gb);
  cJSON_AddStringToObject(root, "objective", mp_objective_name(a->obj));
  cJSON_AddNumberToObject(root, "candidates", (double)s->n);
  cJSON_AddNumberToObject(root, "pruned", (double)s->n_pruned);
  cJSON_AddNumberToObject(root, "dominated", (double)s->n_dominated);
  cJSON_AddNumberToObject(root, "implied_over_capacity", (double)s->n_implied);
  cJSON_AddNumberToObject(root, "simulated", (double)s->n_evaluated);
  cJSON_AddNumberToObject(root, "feasible", (double)s->n_feasible);
  cJSON_AddNumberToObject(root, "failed", (double)s->n_failed);
  cJSON_AddNumberToObject(root, "wall_s", res->wall_s);
  if (stored) {
    cJSON_AddStringToObject(root, "db", a->db);
    cJSON_AddNumberToObject(root, "run_id", (double)res->run_id);
  }
  for (int64_t r = 0; r < n_show; r++) {
    cJSON *pj = plan_json(&s->cands[res->order[r]], r + 1, show_price);
    if (pj) cJSON_AddItemToArray(plans, pj);
  }
  cJSON_AddItemToObject(root, "plans", plans);
  mp_cmd_print_json(root);
}

static void print_csv(const mp_planner_result *res, int64_t n_show) {
  const mp_search *s = res->search;
  printf("rank,dp_replicate,dp_shard,tp,ep,pp,cp,ac,fp8,micro_batch,reshard_after_forward,"
         "step_time_s,tokens_per_s_per_gpu,mfu,peak_mem_bytes,fits,compute_s,exposed_comm_s,"
         "bubble_s,plan_id,sp,pp_virtual\n");
  for (int64_t r = 0; r < n_show; r++) {
    const mp_candidate *x = &s->cands[res->order[r]];
    char ac[32];
    mp_candidate_ac_str(x, ac, sizeof ac);
    printf("%lld,%d,%d,%d,%d,%d,%d,%s,%d,%lld,%d,%.9g,%.9g,%.6g,%lld,%d,%.9g,%.9g,%.9g,%lld,%d,%d\n",
           (long long)(r + 1), x->mesh.size[MP_DIM_DP_REPLICATE], x->mesh.size[MP_DIM_DP_SHARD],
           x->mesh.size[MP_DIM_TP], x->mesh.ep, x->mesh.size[MP_DIM_PP], x->mesh.size[MP_DIM_CP],
           ac, x->fp8, (long long)x->micro_batch, x->reshard,
           x->res.step_time_s, x->res.tokens_per_s_per_gpu, x->res.mfu,
           (long long)x->res.peak_mem_bytes, x->res.fits, x->res.compute_s, x->res.exposed_comm_s,
           x->res.bubble_s, (long long)x->plan_id, x->sp, x->pp_virtual);
  }
}

/* The ranked plans as a table (with tokens/$ when that is the objective). */
static void print_ranking(const plan_args *a, const mp_planner_result *res, int64_t n_show, double show_price) {
  const mp_search *s = res->search;
  printf("\n%4s %6s %8s %3s %2s %3s %4s %3s  %-14s %3s %3s %7s %10s %10s %6s %8s %4s%s\n",
         "rank", "dp_rep", "dp_shard", "tp", "sp", "ep", "pp", "cp", "AC", "fp8", "mb", "reshard",
         "step (s)", "tok/s/GPU", "MFU", "peak GiB", "fits", show_price > 0 ? "   tokens/$" : "");
  for (int64_t r = 0; r < n_show; r++) {
    const mp_candidate *x = &s->cands[res->order[r]];
    char ac[32], pp[16];
    mp_candidate_ac_str(x, ac, sizeof ac);
    /* pp x chunks per stage under the interleaved schedule */
    if (x->pp_virtual > 1) snprintf(pp, sizeof pp, "%dx%d", x->mesh.size[MP_DIM_PP], x->pp_virtual);
    else snprintf(pp, sizeof pp, "%d", x->mesh.size[MP_DIM_PP]);
    printf("%4lld %6d %8d %3d %2s %3d %4s %3d  %-14s %3s %3lld %7s %10.4f %10.0f %5.1f%% %8.2f %4s",
           (long long)(r + 1), x->mesh.size[MP_DIM_DP_REPLICATE], x->mesh.size[MP_DIM_DP_SHARD],
           x->mesh.size[MP_DIM_TP], x->sp ? "y" : "-", x->mesh.ep, pp, x->mesh.size[MP_DIM_CP],
           ac, x->fp8 ? "yes" : "no", (long long)x->micro_batch,
           x->reshard ? "yes" : "no", x->res.step_time_s, x->res.tokens_per_s_per_gpu,
           100.0 * x->res.mfu, (double)x->res.peak_mem_bytes / kGiB, x->res.fits ? "yes" : "no");
    if (show_price > 0) printf(" %11.4g", mp_tokens_per_dollar(x, show_price));
    printf("\n");
  }
  const mp_candidate *best = &s->cands[res->order[0]];
  if (best->pads_vocab)
    printf("note: the best plan pads the vocabulary (%lld) to a multiple of tp=%d\n",
           (long long)a->m.vocab, best->mesh.size[MP_DIM_TP]);
}

static void print_text(const plan_args *a, const mp_planner_result *res, int64_t n_show, double show_price,
                       int stored) {
  const mp_search *s = res->search;
  printf("%s on %s (%d x %s, %d per node), seq %lld, global batch %lld sequences (%lld tokens), "
         "objective %s\n",
         a->m.name, a->c.name, mp_cluster_n_gpus(&a->c), a->c.gpu.name, a->c.gpus_per_node, a->seq, a->gb,
         a->gb * a->seq, mp_objective_name(a->obj));
  if (n_show > 0)
    print_ranking(a, res, n_show, show_price);
  else
    printf("\nno plan fits: every candidate was pruned or runs out of memory; try more GPUs, "
           "--headroom 0, a smaller --seq or --global-batch\n");
  printf("\ncandidates: %lld enumerated, %lld pruned, %lld decided by siblings (%lld dominated, "
         "%lld over capacity), %lld simulated (%lld fit, %lld failed) in %.2f s\n",
         (long long)s->n, (long long)s->n_pruned, (long long)(s->n_dominated + s->n_implied),
         (long long)s->n_dominated, (long long)s->n_implied, (long long)s->n_evaluated,
         (long long)s->n_feasible, (long long)s->n_failed, res->wall_s);
  print_reject_summary(stdout, s);
  if (stored)
    printf("database: %s (run %lld; meshplan report --db %s --run %lld)\n", a->db,
           (long long)res->run_id, a->db, (long long)res->run_id);
  else
    printf("database: none (--no-db)\n");
}

/* --plot: the candidates, the memory of the top plans and the simulated timeline of the
 * best plan (rank 0), against the usable memory of the GPU. */
static mp_status plot(mp_ctx *ctx, const plan_args *a, mp_sim_evaluator *ev, const mp_planner_result *res,
                      int64_t n_show) {
  const mp_search *s = res->search;
  char title[512];
  snprintf(title, sizeof title, "%s on %s (%d x %s), seq %lld, global batch %lld", a->m.name, a->c.name,
           mp_cluster_n_gpus(&a->c), a->c.gpu.name, a->seq, a->gb);
  double cap_gib = a->c.gpu.mem_gib * (1.0 - a->headroom);
  for (int64_t i = 0; i < s->n; i++)
    if (s->cands[i].evaluated && s->cands[i].res.capacity_bytes > 0) {
      cap_gib = (double)s->cands[i].res.capacity_bytes / kGiB;
      break;
    }
  MP_CHECK(mp_plot_candidates(ctx, a->plot_dir, s, res->order, res->n_order, cap_gib, title));
  MP_CHECK(mp_plot_memory(ctx, a->plot_dir, s, res->order, res->n_order,
                          (int)(n_show > 0 && n_show < 10 ? n_show : 10), cap_gib, title));
  if (res->n_order > 0) {
    const mp_candidate *best = &s->cands[res->order[0]];
    char trace[1024], mesh[128], ttl[800];
    snprintf(trace, sizeof trace, "%s/timeline_trace.json", a->plot_dir);
    mp_status st = mp_sim_evaluator_trace(ctx, ev, best, trace);
    mp_candidate_mesh_str(best, mesh, sizeof mesh);
    snprintf(ttl, sizeof ttl, "simulated step of the chosen plan, rank 0: %s, ac=%s%s, micro-batch %lld (%s)",
             mesh, mp_search_ac_name(best->ac), best->fp8 ? ", fp8" : "", (long long)best->micro_batch,
             a->m.name);
    MP_CHECK(st);
    MP_CHECK(mp_plot_timeline(ctx, a->plot_dir, trace, ttl));
  }
  if (!a->as_json && !a->as_csv)
    printf("plots: %s/candidates.png, %s/memory.png%s%s%s (with .dat data and .gp scripts)\n", a->plot_dir,
           a->plot_dir, res->n_order > 0 ? ", " : "", res->n_order > 0 ? a->plot_dir : "",
           res->n_order > 0 ? "/timeline.png" : "");
  return MP_OK;
}

/* The search with the simulator as evaluator, logged to the database (unless --no-db),
 * then the output and the plots. */
static mp_status search_and_report(mp_ctx *ctx, const plan_args *a, mp_sim_evaluator *ev, int argc,
                                   char **argv) {
  mp_planner_request req;
  mp_planner_result res;
  memset(&res, 0, sizeof res);
  mp_store *store = NULL;
  char *opts_json = options_json(), *cmdline = command_line(argc, argv);
  mp_status st = make_request(ctx, a, ev, opts_json, cmdline, &req);
  if (st == MP_OK && a->db) st = mp_store_open(ctx, a->db, &store);
  if (st == MP_OK) st = mp_planner_run(ctx, &req, store, &res);
  if (st == MP_OK) {
    int64_t n_show = a->top == 0 || a->top > res.n_order ? res.n_order : a->top;
    double show_price = a->obj == MP_OBJECTIVE_TOKENS_PER_DOLLAR ? a->price : 0;
    if (a->as_json)
      print_json(a, &res, n_show, show_price, store != NULL);
    else if (a->as_csv)
      print_csv(&res, n_show);
    else
      print_text(a, &res, n_show, show_price, store != NULL);
    if (a->plot_dir) st = plot(ctx, a, ev, &res, n_show);
  }
  mp_planner_result_free(&res);
  mp_store_close(store);
  free(opts_json);
  free(cmdline);
  return st;
}

static int run_plan(mp_ctx *ctx, const mp_cmd_call *call) {
  plan_args *a = calloc(1, sizeof *a);
  mp_sim_evaluator *ev = calloc(1, sizeof *ev);
  mp_status st = a && ev ? MP_OK : mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  if (st == MP_OK) st = read_args(ctx, a);
  if (st == MP_OK)
    st = mp_sim_evaluator_init(ctx, ev, &a->m, &a->c, a->seq, a->gb, a->headroom, mp_args_get(&k_spec, "--stack"));
  if (st == MP_OK) st = search_and_report(ctx, a, ev, call->argc, call->argv);
  mp_sim_evaluator_free(ev);
  free(ev);
  free(a);
  return st != MP_OK ? mp_cmd_fail(ctx, st) : 0;
}

const mp_command mp_command_plan = {
    &k_spec, "enumerate device meshes, predict each, rank them (default: llama3.1-8b on 8xH100)", run_plan};
