/* meshplan plan: the main job. Enumerates every device mesh and option for a model on a
 * cluster, prunes what cannot run (with reasons), simulates the rest on all cores, logs
 * every candidate to SQLite, ranks the feasible plans and prints them (table, --json or
 * --csv), optionally drawing gnuplot plots (--plot DIR).
 *
 * --executable-only keeps the plans exec/runtime executes, by its own rules
 * (mp_runtime_plan_check, exec/runtime/check.h: no float8 inside a pipeline yet, among others). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "sim/cluster.h"
#include "exec/model.h"
#include "planner/batch.h"
#include "app/commands.h"
#include "app/elastic.h"
#include "app/emit.h"
#include "planner/evaluate.h"
#include "planner/planner.h"
#include "planner/plot.h"
#include "planner/probe.h"
#include "planner/report.h"
#include "planner/advise.h"
#include "planner/search.h"
#include "planner/store.h"
#include "planner/why.h"

/* The rows' order is the order of the options in the runs table's options column. */
static mp_opt k_opts[] = {
    MP_OPT_MODEL("llama3.1-8b"),
    MP_OPT_HF_CONFIG,
    MP_OPT_CLUSTER("h100-8"),
    MP_OPT_GPUS_OR_SWEEP,
    MP_OPT_GPU_OF_GPUS("default h100-sxm"),
    MP_OPT_GPUS_PER_NODE("8, or N when N < 8"),
    MP_OPT_NVLINK_DOMAIN,
    MP_OPT_INTER_GBPS,
    MP_OPT_SEQ("min(8192, the model's max_seq)"),
    MP_OPT_ALLOW_LONG_SEQ,
    MP_OPT_GLOBAL_BATCH("the batch rule: the larger of 0.5M/1M/4M tokens by model size (GPT-3, Llama 2/3) and "
                        "1,024 tokens per GPU (Llama 3 405B), the nearest multiple of each plan's dp"),
    MP_OPT_GLOBAL_BATCH_TOKENS,
    MP_OPT_TOP(""),
    {"--objective", "O", "time (default), memory, tokens-per-dollar (needs a price), days or cost (need --tokens; "
                         "cost a price): on one size days rank as time and cost as tokens-per-dollar, across a "
                         "sweep's sizes they pick the size", NULL},
    {"--price", "USD", "price per GPU-hour, for tokens-per-dollar and the cost of --tokens (default: the cluster's)", NULL},
    {"--price-per-gpu-hour", "USD", "the same as --price", NULL},
    {"--tokens", "T", "tokens to train (15T, 300B, 1.5e12): each plan's days to train them and, with a price, "
                      "their cost", NULL},
    {"--fix", "K=V,...",
     "constrain the search, e.g. tp=8,pp=1,ac=full,fp8=0,mb=2,reshard=1,sp=1,pp_virtual=2 (etp=0: EP inside "
     "dp_shard; etp=N: the experts' own grid, each expert split over N ranks)",
     NULL},
    MP_OPT_MESH("in plan: search this mesh alone, the same as fixing every dim in --fix"),
    MP_OPT_EP("; in plan: search it alone"),
    MP_OPT_AC("; in plan: search this policy alone, default every policy the stack runs"),
    MP_OPT_MICRO_BATCH("in plan: searched, powers of two up to the per-rank batch; given: this one alone"),
    MP_OPT_SP,
    MP_OPT_CP_ROTATE,
    MP_OPT_MEGATRON_FSDP,
    MP_OPT_FP8_PARAM_GATHER, MP_OPT_FP8_ALL_GATHER,
    MP_OPT_ASYNC_TP, MP_OPT_MOE_ROUTING, MP_OPT_NCCL_CTAS, MP_OPT_NCCL_VERSION, MP_OPT_MOE_DISPATCHER,
    MP_OPT_LOSS_CHUNKS,
    {"--fp8", "[on|off|auto|tensorwise|current|delayed|rowwise|mxfp8|blockwise|nvfp4]",
     "float8 Linear layers: bare or on, float8 plans only under the stack's recipe; a recipe's name, "
     "float8 plans only under it (see simulate --help); off (default), bf16 only; auto, both where "
     "the GPU has float8", NULL},
    {"--no-sp", NULL, "search tensor parallelism without sequence parallelism (the all-reduce form; "
                      "default: SP with tp > 1 where the stack runs it)", NULL},
    {"--executable-only", NULL, "only plans the runtime executes (exec/runtime/check.h: no float8 with pp, ...)", NULL},
    {"--allow-cross-node-tp", NULL, "allow tensor-parallel groups that span nodes", NULL},
    MP_OPT_HEADROOM("0.05"),
    MP_OPT_STACK("torchtitan-compile on GPUs, meshplan-cpu on the CPU"),
    MP_OPT_THREADS,
    MP_OPT_DB("that logs the run, its ranked plans and its rejection counts by rule (default meshplan.db)"),
    {"--no-db", NULL, "do not write a database", NULL},
    {"--log-all", NULL, "log every candidate to the database with the rule that rejected it, not only the "
                        "ranked plans (tens of megabytes for a search of thousands of GPUs)", NULL},
    {"--plot", "DIR", "write gnuplot plots (PNG, data, scripts) into DIR (needs gnuplot)", NULL},
    {"--why", "K=V,...", "explain one candidate's fate, e.g. 'dp_shard=64,tp=1': every rule it passed or "
                         "failed, its prediction, its rank (keys as --fix) for the best matching candidate (the best "
                         "ranked, else the one the search took furthest), then the other matches' fates, one line each",
     NULL},
    MP_OPT_EMIT("the best plan (with --top K the K best) into DIR/plan-1.toml (or .args), ..."), MP_OPT_EMIT_OUT,
    MP_OPT_FROM, MP_OPT_FROM_ARGS,
    MP_OPT_JSON("the ranked plans"),
    {"--csv", NULL, "print the ranked plans as CSV", NULL},
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {
    "plan",
    "Enumerate device meshes for a model on a cluster, simulate and rank them.\n\n"
    "Ranking (--objective time): by predicted time per sequence. Plans within 1 % of the fastest "
    "plan not yet ranked are ties (the prediction is not that exact) and go to the simpler plan: "
    "no cp, then no float8, then fewer mesh dims above 1, then no interleaving, then less AC "
    "recompute, then less memory. The last lines count the candidates rejected by each rule.",
    "[--model M | --hf-config PATH] [--cluster C | --gpus N --gpu TYPE --gpus-per-node K] "
    "[--seq S] [--global-batch G] [--top K] [--db PATH] [--plot DIR] [--json | --csv]",
    k_opts, 0};

static const double kGiB = 1024.0 * 1024.0 * 1024.0;

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

/* The most sizes a sweep (--gpus A..B) searches. */
#define PLAN_SWEEP_MAX 64

/* What the command line asks for, read and checked before the search. */
typedef struct plan_args {
  mp_model m;
  mp_cluster c;
  mp_plan_setup setup;  /* the search apart from its cluster (planner/probe.h) */
  long long seq, gb, top, threads;
  double tokens;        /* --tokens, 0 without */
  int64_t sweep[PLAN_SWEEP_MAX]; /* --gpus A..B: the sizes; n_sweep 0: one cluster */
  int n_sweep;
  int64_t target_seqs;  /* > 0: the default batch rule's target (gb is then not used) */
  char rule[320];       /* the rule in words, with its figures */
  const char *why;      /* --why's spec, or NULL */
  double headroom, price;
  int as_json, as_csv;
  mp_objective obj;
  const char *plot_dir; /* NULL: no plots */
  const char *db;       /* NULL: --no-db */
  mp_emit_target target; /* --emit's, when emit */
  int emit;
  const char *out;       /* --out, default . */
} plan_args;

/* The setup's fields that the options other than the constraints give (build_fix gives
 * those), and the batch on the user's cluster. */
static void fill_setup(plan_args *a, int64_t explicit_gb) {
  mp_plan_setup *s = &a->setup;
  s->model = &a->m;
  s->seq = a->seq;
  s->global_batch = explicit_gb;
  s->headroom = a->headroom;
  s->stack = mp_args_get(&k_spec, "--stack");
  const char *fp8 = mp_args_get(&k_spec, "--fp8");
  s->fp8_auto = fp8 && strcmp(fp8, "auto") == 0;
  s->fp8_recipe = MP_FP8_DEFAULT;
  if (fp8) (void)mp_fp8_recipe_parse(fp8, &s->fp8_recipe);
  s->allow_cross_node_tp = mp_args_has(&k_spec, "--allow-cross-node-tp");
  s->executable_only = mp_args_has(&k_spec, "--executable-only");
  s->n_threads = (int)a->threads;
  /* a cluster file's nodes, or --gpus-per-node, stay their size on more GPUs */
  s->gpus_per_node = mp_args_has(&k_spec, "--gpus") && !mp_args_has(&k_spec, "--gpus-per-node") ? 0 : a->c.gpus_per_node;
  s->objective = a->obj;
  s->price_per_gpu_hour = a->price;
  mp_search_fix_init(&s->fix);
  int64_t gb = 0, target = 0;
  mp_plan_setup_batch(s, &a->c, &gb, &target, a->rule, sizeof a->rule);
  a->gb = gb;
  a->target_seqs = target;
}

/* --gpus A..B (powers of two from A up to B) or A..B:S (steps of S) into a->sweep; a plain
 * count leaves n_sweep 0. */
static mp_status read_sweep(mp_ctx *ctx, plan_args *a) {
  const char *v = mp_args_get(&k_spec, "--gpus");
  a->n_sweep = 0;
  if (!v || !strstr(v, "..")) return MP_OK;
  long long lo = 0, hi = 0, step = 0;
  int used = 0;
  const int n = sscanf(v, "%lld..%lld%n:%lld%n", &lo, &hi, &used, &step, &used);
  if (n < 2 || v[used] || lo < 1 || hi < lo || hi > MP_LIM_GPUS || (n == 3 && step < 1))
    return mp_error(ctx, MP_ERR_USAGE, "--gpus '%s': expected N, A..B (the powers of two from A to B) or A..B:S "
                    "(steps of S), 1 <= A <= B <= %lld", v, (long long)MP_LIM_GPUS);
  /* powers of two up to 2^20 are at most 21 sizes */
  if (n == 3 && (hi - lo) / step + 1 > PLAN_SWEEP_MAX)
    return mp_error(ctx, MP_ERR_USAGE, "--gpus '%s': %lld sizes, more than %d; a larger step", v,
                    (hi - lo) / step + 1, PLAN_SWEEP_MAX);
  for (long long g = lo; g <= hi; g = n == 3 ? g + step : 2 * g) a->sweep[a->n_sweep++] = g;
  if (mp_args_has(&k_spec, "--cluster"))
    return mp_error(ctx, MP_ERR_USAGE, "--gpus %s sweeps GPUs of --gpu TYPE; give it or --cluster, not both", v);
  static const char *const one_search[] = {"--why", "--plot", "--db", "--log-all", "--mesh", "--emit"};
  for (size_t i = 0; i < sizeof one_search / sizeof one_search[0]; i++)
    if (mp_args_has(&k_spec, one_search[i]))
      return mp_error(ctx, MP_ERR_USAGE, "%s is for one search: give --gpus N, not the sweep %s (a sweep writes no "
                      "database)", one_search[i], v);
  return MP_OK;
}

/* --price or --price-per-gpu-hour (the same), --tokens, and what the objective needs. */
static mp_status read_price_tokens(mp_ctx *ctx, plan_args *a) {
  if (mp_args_has(&k_spec, "--price") && mp_args_has(&k_spec, "--price-per-gpu-hour"))
    return mp_error(ctx, MP_ERR_USAGE, "--price and --price-per-gpu-hour are the same; give one");
  MP_CHECK(mp_args_double(ctx, &k_spec, "--price", 0, MP_LIM_PRICE, MP_RANGE_CLOSED, &a->price));
  MP_CHECK(mp_args_double(ctx, &k_spec, "--price-per-gpu-hour", 0, MP_LIM_PRICE, MP_RANGE_CLOSED, &a->price));
  MP_CHECK(mp_cmd_count(ctx, &k_spec, "--tokens", MP_CMD_MAX_TOKENS, &a->tokens));
  a->obj = MP_OBJECTIVE_TIME;
  const char *objs = mp_args_get(&k_spec, "--objective");
  if (objs) MP_CHECK(mp_objective_parse(ctx, objs, &a->obj));
  if (mp_objective_needs_price(a->obj) && !(a->price > 0))
    return mp_error(ctx, MP_ERR_USAGE, "--objective %s needs a price: cluster %s has no price_per_gpu_hour; pass "
                    "--price-per-gpu-hour USD", mp_objective_name(a->obj), a->c.name);
  if ((a->obj == MP_OBJECTIVE_DAYS || a->obj == MP_OBJECTIVE_COST) && !(a->tokens > 0))
    return mp_error(ctx, MP_ERR_USAGE, "--objective %s needs --tokens T (the tokens to train, e.g. 15T)",
                    mp_objective_name(a->obj));
  return MP_OK;
}

/* Everything but the search's own options, with the checks that need no search: the
 * model, the cluster, the numbers, the output form, the objective and its price, and
 * gnuplot and the plot directory (a search is not wasted on a plot that cannot be made). */
static mp_status read_args(mp_ctx *ctx, plan_args *a) {
  MP_CHECK(mp_cmd_load_model(ctx, &k_spec, "llama3.1-8b", &a->m));
  MP_CHECK(read_sweep(ctx, a));
  if (a->n_sweep) MP_CHECK(mp_cmd_load_cluster_n(ctx, &k_spec, a->sweep[0], &a->c));
  else MP_CHECK(mp_cmd_load_cluster(ctx, &k_spec, &a->c));
  a->seq = a->m.max_seq < 8192 ? a->m.max_seq : 8192;
  a->gb = 0;
  a->top = MP_OPT_TOP_DEFAULT;
  a->threads = 0;
  a->headroom = 0.05;
  a->price = a->c.price_per_gpu_hour;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--seq", 1, MP_LIM_SEQ, &a->seq));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--global-batch", 1, MP_LIM_GLOBAL_BATCH, &a->gb));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--top", 0, INT32_MAX, &a->top));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--threads", 1, MP_LIM_THREADS, &a->threads));
  MP_CHECK(mp_args_double(ctx, &k_spec, "--headroom", 0, 1, MP_RANGE_OPEN_HI, &a->headroom));
  int64_t gb = a->gb;
  MP_CHECK(mp_cmd_batch_tokens(ctx, &k_spec, a->seq, &gb));
  MP_CHECK(mp_cmd_check_seq(ctx, &k_spec, &a->m, a->seq));
  a->why = mp_args_get(&k_spec, "--why");
  a->as_json = mp_args_has(&k_spec, "--json");
  a->as_csv = mp_args_has(&k_spec, "--csv");
  if (a->as_json && a->as_csv) return mp_error(ctx, MP_ERR_USAGE, "give --json or --csv, not both");
  MP_CHECK(read_price_tokens(ctx, a));
  fill_setup(a, gb);
  MP_CHECK(mp_cmd_moe_routing(ctx, &k_spec, &a->setup.moe_routing));
  MP_CHECK(mp_cmd_moe_dispatcher(ctx, &k_spec, &a->setup.moe_dispatcher)); /* the stack's check: probe.c */
  MP_CHECK(mp_cmd_loss_chunks(ctx, &k_spec, &a->setup.loss_chunks)); /* the stack's and each mesh's: probe.c, the plan */
  MP_CHECK(mp_model_check_step(ctx, &a->m, a->seq, 1, a->target_seqs > 0 ? 2 * a->gb : a->gb));
  a->out = mp_args_has(&k_spec, "--out") ? mp_args_get(&k_spec, "--out") : ".";
  MP_CHECK(mp_emit_args(ctx, mp_args_get(&k_spec, "--emit"), mp_args_has(&k_spec, "--out"), &a->target, &a->emit));
  a->plot_dir = mp_args_get(&k_spec, "--plot");
  if (a->plot_dir) {
    MP_CHECK(mp_plot_check_gnuplot(ctx));
    MP_CHECK(mp_plot_make_dir(ctx, a->plot_dir));
  }
  a->db = mp_args_has(&k_spec, "--no-db") ? NULL : mp_cmd_db_path(&k_spec);
  if (!a->db && mp_args_has(&k_spec, "--log-all"))
    return mp_error(ctx, MP_ERR_USAGE, "--log-all logs every candidate to the database; drop --no-db");
  return MP_OK;
}

/* A fix field set from an option, refusing a different value --fix gave. */
static mp_status fix_field(mp_ctx *ctx, const char *opt, int v, int *slot) {
  if (*slot >= 0 && *slot != v)
    return mp_error(ctx, MP_ERR_USAGE, "%s contradicts --fix (%d there, %d here); give one", opt, *slot, v);
  *slot = v;
  return MP_OK;
}

/* The options that name one plan elsewhere (--mesh, --ep, --ac, --micro-batch, --sp) fix the search. */
static mp_status one_plan_options(mp_ctx *ctx, const plan_args *a, mp_search_fix *f) {
  const char *ms = mp_args_get(&k_spec, "--mesh");
  if (ms) {
    mp_mesh mesh;
    MP_CHECK(mp_mesh_parse(ctx, ms, mp_cluster_n_gpus(&a->c), &mesh));
    static const char *const dim_opt = "--mesh";
    if (mp_mesh_dopt(&mesh) > 1) MP_CHECK(fix_field(ctx, dim_opt, mesh.dopt, &f->dopt)); /* exec/mesh.h */
    MP_CHECK(fix_field(ctx, dim_opt, mesh.size[MP_DIM_PP], &f->pp));
    MP_CHECK(fix_field(ctx, dim_opt, mesh.size[MP_DIM_DP_REPLICATE], &f->dp_replicate));
    MP_CHECK(fix_field(ctx, dim_opt, mesh.size[MP_DIM_DP_SHARD], &f->dp_shard));
    MP_CHECK(fix_field(ctx, dim_opt, mesh.size[MP_DIM_CP], &f->cp));
    MP_CHECK(fix_field(ctx, dim_opt, mesh.size[MP_DIM_TP], &f->tp));
    if (mesh.ep > 1) MP_CHECK(fix_field(ctx, dim_opt, mesh.ep, &f->ep));
    if (mesh.ep > 1 || mesh.etp)
      MP_CHECK(fix_field(ctx, dim_opt, mp_mesh_grid_etp(&mesh), &f->etp));
  }
  long long ep = 0, mb = 0;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--ep", 1, MP_MESH_MAX_WORLD, &ep));
  if (ep > 0) MP_CHECK(fix_field(ctx, "--ep", (int)ep, &f->ep));
  const char *ac = mp_args_get(&k_spec, "--ac");
  if (ac) {
    mp_ac_mode mode;
    int every = 1;
    MP_CHECK(mp_ac_parse(ctx, ac, &mode, &every));
    MP_CHECK(fix_field(ctx, "--ac", (int)mode, &f->ac));
    f->ac_every = every;
  }
  MP_CHECK(mp_args_int(ctx, &k_spec, "--micro-batch", 1, MP_LIM_GLOBAL_BATCH, &mb));
  if (mb > 0) {
    if (f->micro_batch >= 0 && f->micro_batch != mb)
      return mp_error(ctx, MP_ERR_USAGE, "--micro-batch contradicts mb=%lld in --fix; give one", (long long)f->micro_batch);
    f->micro_batch = mb;
  }
  if (mp_args_has(&k_spec, "--sp")) MP_CHECK(fix_field(ctx, "--sp", 1, &f->sp));
  return MP_OK;
}

/* The search's constraints (--fix, --fp8, --sp, --no-sp and the options that name one plan)
 * into a->setup.fix, then the usage mistakes among them (planner/advise.h). */
static mp_status build_fix(mp_ctx *ctx, plan_args *a) {
  mp_search_fix *f = &a->setup.fix;
  const char *fix = mp_args_get(&k_spec, "--fix");
  if (fix) MP_CHECK(mp_search_fix_parse(ctx, fix, f));
  const char *fp8 = mp_args_get(&k_spec, "--fp8");
  const int fp8_fixed = !fp8 ? -1 : strcmp(fp8, "off") == 0 ? 0 : strcmp(fp8, "auto") == 0 ? -1 : 1;
  if (fp8_fixed >= 0) {
    if (f->fp8 >= 0 && f->fp8 != fp8_fixed)
      return mp_error(ctx, MP_ERR_USAGE, "--fp8 contradicts fp8=%d in --fix; give one", f->fp8);
    f->fp8 = fp8_fixed;
  }
  if (mp_args_has(&k_spec, "--sp") && mp_args_has(&k_spec, "--no-sp"))
    return mp_error(ctx, MP_ERR_USAGE, "--sp and --no-sp contradict each other; give one");
  MP_CHECK(one_plan_options(ctx, a, f));
  if (mp_args_has(&k_spec, "--no-sp")) {
    if (f->sp == 1) return mp_error(ctx, MP_ERR_USAGE, "meshplan plan: --no-sp contradicts sp=1 in --fix; give one");
    f->sp = 0;
  }
  return mp_plan_setup_check(ctx, &a->setup, &a->c);
}

/* The planner request for a: the search of a->setup with the simulator ev (initialised for
 * a) as its evaluator, and what the runs table records (opts_json and cmdline stay the
 * caller's). */
static void make_request(const plan_args *a, mp_sim_evaluator *ev, const char *opts_json, const char *cmdline,
                         mp_planner_request *req) {
  memset(req, 0, sizeof *req);
  mp_plan_setup_search(&a->setup, &a->c, ev, &req->search);
  req->objective = a->obj;
  req->price_per_gpu_hour = a->price, req->show_progress = 1;
  req->info = (mp_run_info){.model = a->m.name, .cluster = a->c.name, .gpu = a->c.gpu.name,
                            .n_gpus = mp_cluster_n_gpus(&a->c), .gpus_per_node = a->c.gpus_per_node,
                            .seq = a->seq, .global_batch = a->gb, .objective = mp_objective_name(a->obj),
                            .options_json = opts_json, .command = cmdline, .tool_version = MESHPLAN_VERSION};
  mp_sim_evaluator_settings(ev, &req->info.settings); /* the stack, --loss-chunks, --nccl-version */
  req->ranked_only = !mp_args_has(&k_spec, "--log-all");
  /* what is shown of a plan over capacity, unless logged, explained or plotted, is that it
   * is over: its simulation stops at the first stage over capacity, or at the step bound
   * of a time objective's --top K shown (planner/search.h bound_top_k) */
  ev->sim.memory_first = req->ranked_only && !a->why && !a->plot_dir;
  req->search.bound_top_k = ev->sim.memory_first && mp_objective_is_time(a->obj) ? (int)a->top : 0;
}

/* What the output shows: the run, the search's config (for the reasons), the evaluator
 * (for the stack's name), and per shown plan whether the runtime executes it. */
typedef struct plan_view {
  const plan_args *a;
  const mp_planner_result *res;
  const mp_search_config *cfg;
  const mp_sim_evaluator *ev;
  int64_t n_show;
  double price; /* > 0: show tokens per dollar */
  int stored;
  int *runs;           /* per shown rank: 1 the runtime executes it */
  char (*not_runs)[256]; /* per shown rank: the runtime's reason when it does not */
  mp_advice advice[MP_ADVICE_MAX]; /* no plan: the changes that fit, smallest first */
  int n_advice;
} plan_view;

static void print_reject_words(const mp_search *s) {
  int64_t by[MP_REJECT_COUNT];
  int order[MP_REJECT_COUNT];
  mp_search_reject_counts(s, by);
  const int n = mp_reject_order_by_count(by, order);
  printf("rejected by rule:%s\n", n ? "" : " none");
  for (int i = 0; i < n; i++)
    printf("  %8lld  %s (%s)\n", (long long)by[order[i]], mp_reject_words((mp_reject)order[i]),
           mp_reject_name((mp_reject)order[i]));
}

/* "no plan fits": the rules that rejected the most candidates first, then the changes that
 * would fit, each searched (planner/advise.h), the smallest first. */
static void print_no_plan(const plan_view *v) {
  const mp_search *s = v->res->search;
  int64_t by[MP_REJECT_COUNT];
  int order[MP_REJECT_COUNT];
  mp_search_reject_counts(s, by);
  const int n = mp_reject_order_by_count(by, order);
  printf("\nno plan fits:");
  if (n == 0) printf(" no candidate: the constraints given exclude every mesh of %d GPUs", mp_cluster_n_gpus(&v->a->c));
  for (int i = 0, shown = 0; i < n && shown < 3; i++) {
    const mp_reject r = (mp_reject)order[i];
    if (r == MP_REJECT_DOMINATED || r == MP_REJECT_RESHARD_NOOP) continue; /* duplicates, not causes */
    printf("%s %lld of %lld candidates: %s", shown ? ";" : "", (long long)by[r], (long long)s->n, mp_reject_words(r));
    shown++;
  }
  printf("\n");
  if (v->n_advice == 0) {
    printf("none of the changes tried fits: the constraints given relaxed, more GPUs (doubled up to %d), a GPU "
           "with more memory\n", MP_MESH_MAX_WORLD);
    return;
  }
  printf("what would fit, each change searched:\n");
  for (int k = 0; k < v->n_advice; k++) {
    const mp_advice *h = &v->advice[k];
    const mp_candidate *c = &h->probe.best;
    char opts[192];
    mp_candidate_options_str(c, opts, sizeof opts);
    printf("  %s: %s; the best, %s: step %.4f s, %.0f tokens/s/GPU, peak %.2f GiB\n", h->change, h->words, opts,
           c->res.step_time_s, c->res.tokens_per_s_per_gpu, (double)c->res.peak_mem_bytes / kGiB);
  }
  printf("the smallest change: %s\n", v->advice[0].change);
}

/* The same as --json's "no_plan": {"hints": [{change, words, n_gpus, gpu, plan}]}. */
static cJSON *no_plan_json(const plan_view *v) {
  cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
  if (!o || !arr) {
    cJSON_Delete(o);
    cJSON_Delete(arr);
    return NULL;
  }
  for (int k = 0; k < v->n_advice; k++) {
    const mp_advice *h = &v->advice[k];
    cJSON *j = cJSON_CreateObject();
    if (!j) break;
    cJSON_AddStringToObject(j, "change", h->change);
    cJSON_AddStringToObject(j, "words", h->words);
    cJSON_AddNumberToObject(j, "n_gpus", mp_cluster_n_gpus(&h->cluster));
    cJSON_AddStringToObject(j, "gpu", h->cluster.gpu.name);
    cJSON_AddItemToObject(j, "plan", mp_candidate_json(&h->probe.best, 1, 0));
    cJSON_AddItemToArray(arr, j);
  }
  cJSON_AddItemToObject(o, "hints", arr);
  return o;
}

static void print_json(const plan_view *v) {
  const plan_args *a = v->a;
  const mp_planner_result *res = v->res;
  const mp_search *s = res->search;
  cJSON *root = cJSON_CreateObject(), *plans = cJSON_CreateArray();
  if (!root || !plans) {
    cJSON_Delete(root);
    cJSON_Delete(plans);
    return;
  }
  cJSON_AddStringToObject(root, "model", a->m.name);
  mp_cmd_params_json(&a->m, root);
  cJSON_AddStringToObject(root, "cluster", a->c.name);
  cJSON_AddStringToObject(root, "gpu", a->c.gpu.name);
  char note[160];
  mp_cmd_gpu_note(&a->c.gpu, note, sizeof note);
  if (note[0]) cJSON_AddStringToObject(root, "gpu_note", note);
  cJSON_AddNumberToObject(root, "n_gpus", mp_cluster_n_gpus(&a->c));
  mp_cmd_cluster_shape_json(&a->c, root);
  cJSON_AddStringToObject(root, "stack", v->ev->stack.name);
  cJSON_AddItemToObject(root, "kernels", mp_cmd_kernel_scale_json(&v->ev->stack, &a->c.gpu));
  cJSON_AddNumberToObject(root, "seq", (double)a->seq);
  if (a->tokens > 0) cJSON_AddNumberToObject(root, "tokens", a->tokens);
  if (a->tokens > 0 && a->price > 0) cJSON_AddNumberToObject(root, "price_per_gpu_hour", a->price);
  if (a->target_seqs > 0) {
    cJSON_AddNumberToObject(root, "batch_target", (double)a->target_seqs);
    cJSON_AddStringToObject(root, "batch_rule", a->rule);
  } else {
    cJSON_AddNumberToObject(root, "global_batch", (double)a->gb);
  }
  cJSON_AddStringToObject(root, "objective", mp_objective_name(a->obj));
  cJSON_AddNumberToObject(root, "tie_tolerance", MP_RANK_TIE_TOL);
  cJSON_AddNumberToObject(root, "candidates", (double)s->n);
  cJSON_AddNumberToObject(root, "pruned", (double)s->n_pruned);
  cJSON_AddNumberToObject(root, "dominated", (double)s->n_dominated);
  cJSON_AddNumberToObject(root, "implied_over_capacity", (double)s->n_implied);
  cJSON_AddNumberToObject(root, "simulated", (double)s->n_evaluated);
  cJSON_AddNumberToObject(root, "feasible", (double)s->n_feasible);
  cJSON_AddNumberToObject(root, "failed", (double)s->n_failed);
  cJSON_AddItemToObject(root, "rejected", mp_reject_counts_json(s));
  cJSON_AddNumberToObject(root, "wall_s", res->wall_s);
  if (v->stored) {
    cJSON_AddStringToObject(root, "db", a->db);
    cJSON_AddNumberToObject(root, "run_id", (double)res->run_id);
  }
  for (int64_t r = 0; r < v->n_show; r++) {
    const mp_candidate *c = &s->cands[res->order[r]];
    cJSON *pj = mp_candidate_json(c, r + 1, v->price);
    if (!pj) continue;
    cJSON_AddNumberToObject(pj, "global_batch", (double)c->global_batch);
    if (a->tokens > 0) mp_train_json(pj, c, mp_cluster_n_gpus(&a->c), a->tokens, a->price);
    cJSON_AddBoolToObject(pj, "runs", v->runs[r]);
    if (!v->runs[r]) cJSON_AddStringToObject(pj, "runs_not_because", v->not_runs[r]);
    cJSON_AddItemToArray(plans, pj);
  }
  cJSON_AddItemToObject(root, "plans", plans);
  if (res->n_order == 0) cJSON_AddItemToObject(root, "no_plan", no_plan_json(v));
  mp_cmd_print_json(root);
}

static void print_csv(const plan_view *v) {
  const mp_search *s = v->res->search;
  printf("rank,dp_replicate,dp_shard,tp,ep,pp,cp,ac,fp8,micro_batch,reshard_after_forward,"
         "step_time_s,tokens_per_s_per_gpu,mfu,peak_mem_bytes,fits,compute_s,exposed_comm_s,"
         "bubble_s,plan_id,sp,pp_virtual,global_batch,runs%s\n",
         v->a->tokens > 0 ? ",train_days,train_cost_usd" : "");
  for (int64_t r = 0; r < v->n_show; r++) {
    const mp_candidate *x = &s->cands[v->res->order[r]];
    char ac[32];
    mp_candidate_ac_str(x, ac, sizeof ac);
    printf("%lld,%d,%d,%d,%d,%d,%d,%s,%d,%lld,%d,%.9g,%.9g,%.6g,%lld,%d,%.9g,%.9g,%.9g,%lld,%d,%d,%lld,%d",
           (long long)(r + 1), x->mesh.size[MP_DIM_DP_REPLICATE], x->mesh.size[MP_DIM_DP_SHARD],
           x->mesh.size[MP_DIM_TP], x->mesh.ep, x->mesh.size[MP_DIM_PP], x->mesh.size[MP_DIM_CP],
           ac, x->fp8, (long long)x->micro_batch, x->reshard,
           x->res.step_time_s, x->res.tokens_per_s_per_gpu, x->res.mfu,
           (long long)x->res.peak_mem_bytes, x->res.fits, x->res.compute_s, x->res.exposed_comm_s,
           x->res.bubble_s, (long long)x->plan_id, x->sp, x->pp_virtual, (long long)x->global_batch,
           v->runs[r]);
    if (v->a->tokens > 0)
      printf(",%.9g,%.9g", mp_train_days(x, mp_cluster_n_gpus(&v->a->c), v->a->tokens),
             mp_train_cost(x, v->a->tokens, v->a->price));
    printf("\n");
  }
}

/* " days  cost" for --tokens on n_gpus GPUs (the cost with a price), or "". */
static void train_cols(const plan_args *a, const mp_candidate *x, int64_t n_gpus, char *buf, size_t cap) {
  buf[0] = '\0';
  if (!(a->tokens > 0)) return;
  char usd[32];
  mp_cmd_fmt_usd(mp_train_cost(x, a->tokens, a->price), usd, sizeof usd);
  snprintf(buf, cap, " %8.1f %10s", mp_train_days(x, n_gpus, a->tokens), a->price > 0 ? usd : "");
}

/* The ranked plans as a table (with tokens/$ when that is the objective, days and cost with --tokens). */
static void print_ranking(const plan_view *v) {
  const plan_args *a = v->a;
  const mp_search *s = v->res->search;
  char head[64] = "";
  int split = 0, grid = 0, dopt = 0;
  if (a->tokens > 0) snprintf(head, sizeof head, " %8s %10s", "days", a->price > 0 ? "cost" : "");
  printf("\n%4s %6s %8s %3s %2s %4s %5s %3s  %-14s %3s %3s %6s %7s %10s %10s %6s %8s %4s%s%s\n",
         "rank", "dp_rep", "dp_shard", "tp", "sp", "ep", "pp", "cp", "AC", "fp8", "mb", "batch", "reshard",
         "step (s)", "tok/s/GPU", "MFU", "peak GiB", "runs", v->price > 0 ? "   tokens/$" : "", head);
  for (int64_t r = 0; r < v->n_show; r++) {
    const mp_candidate *x = &s->cands[v->res->order[r]];
    char ac[32], pp[16], ep[16], dpr[24];
    dopt |= mp_mesh_dp_rep_str(&x->mesh, dpr, sizeof dpr);
    mp_candidate_ac_str(x, ac, sizeof ac);
    mp_candidate_pp_str(x, pp, sizeof pp);
    mp_candidate_ep_str(x, ep, sizeof ep);
    split |= x->pp_split;
    grid |= mp_mesh_expert_grid(&x->mesh);
    printf("%4lld %6s %8d %3d %2s %4s %5s %3d  %-14s %3s %3lld %6lld %7s %10.4f %10.0f %5.1f%% %8.2f %4s",
           (long long)(r + 1), dpr, x->mesh.size[MP_DIM_DP_SHARD],
           x->mesh.size[MP_DIM_TP], x->sp ? "y" : "-", ep, pp, x->mesh.size[MP_DIM_CP],
           ac, x->fp8 ? "yes" : "no", (long long)x->micro_batch, (long long)x->global_batch,
           x->reshard ? "yes" : "no", x->res.step_time_s, x->res.tokens_per_s_per_gpu,
           100.0 * x->res.mfu, (double)x->res.peak_mem_bytes / kGiB, v->runs[r] ? "yes" : "no");
    if (v->price > 0) printf(" %11.4g", mp_tokens_per_dollar(x, v->price));
    char cols[64];
    train_cols(a, x, mp_cluster_n_gpus(&a->c), cols, sizeof cols);
    printf("%s\n", cols);
  }
  mp_cmd_plan_table_notes(grid, split, dopt);
  const mp_candidate *best = &s->cands[v->res->order[0]];
  if (best->pads_vocab)
    printf("note: the best plan pads the vocabulary (%lld) to a multiple of tp=%d\n",
           (long long)a->m.vocab, best->mesh.size[MP_DIM_TP]);
  if (!v->runs[0]) printf("note: meshplan's runtime does not run the best plan: %s\n", v->not_runs[0]);
}

static void print_text(const plan_view *v) {
  const plan_args *a = v->a;
  const mp_planner_result *res = v->res;
  const mp_search *s = res->search;
  char rot[160];
  mp_cmd_stack_runs_str(&v->ev->base, rot, sizeof rot);
  char params[160], note[400];
  mp_cmd_params_str(&a->m, params, sizeof params);
  char shape[96];
  mp_cmd_cluster_shape_str(&a->c, shape, sizeof shape);
  printf("%s (%s) on %s (%s), seq %lld, stack %s%s, objective %s\n", a->m.name, params, a->c.name, shape, a->seq,
         v->ev->stack.name, rot, mp_objective_name(a->obj));
  mp_cmd_gpu_note(&a->c.gpu, note, sizeof note);
  if (note[0]) printf("note: %s\n", note);
  if (a->target_seqs > 0)
    printf("global batch: %lld sequences (%lld tokens) by the default rule, %s; each plan runs the nearest "
           "multiple of its dp (column batch)\n",
           (long long)a->target_seqs, (long long)(a->target_seqs * a->seq), a->rule);
  else
    printf("global batch: %lld sequences (%lld tokens)\n", a->gb, a->gb * a->seq);
  if (v->n_show > 0) {
    print_ranking(v);
    printf("ties: plans within %.0f %% of the fastest unranked one go to the simpler plan (meshplan plan --help)\n",
           100.0 * MP_RANK_TIE_TOL);
    mp_elastic_plan_interval_str(mp_model_param_count(&a->m), mp_cluster_n_gpus(&a->c),
                                 v->res->search->cands[v->res->order[0]].res.step_time_s, note, sizeof note);
    printf("%s\n", note);
  } else {
    print_no_plan(v);
  }
  printf("\ncandidates: %lld enumerated, %lld pruned, %lld decided by siblings (%lld dominated, "
         "%lld over capacity), %lld simulated (%lld fit, %lld failed) in %.2f s\n",
         (long long)s->n, (long long)s->n_pruned, (long long)(s->n_dominated + s->n_implied),
         (long long)s->n_dominated, (long long)s->n_implied, (long long)s->n_evaluated,
         (long long)s->n_feasible, (long long)s->n_failed, res->wall_s);
  if (v->stored)
    printf("database: %s (run %lld: %s and the rejection counts; meshplan report --db %s --run %lld)\n",
           a->db, (long long)res->run_id, mp_args_has(&k_spec, "--log-all") ? "every candidate" : "the ranked plans",
           a->db, (long long)res->run_id);
  else
    printf("database: none (--no-db)\n");
  print_reject_words(s);
}

/* --why: the fate of the candidates the spec matches (planner/why.h). */
static mp_status print_why(mp_ctx *ctx, const plan_view *v) {
  const mp_planner_result *res = v->res;
  return mp_why_print(ctx, stdout, res->search, v->cfg, res->order, res->n_order, v->a->why);
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
    /* the simulated trace is the two plots' input, not a plot: removed once they are drawn
     * (30 MB for a 70B step; `meshplan simulate --trace PATH` writes it for a trace viewer) */
    snprintf(trace, sizeof trace, "%s/.timeline_trace.json.tmp", a->plot_dir);
    mp_status st = mp_sim_evaluator_trace(ctx, ev, best, trace);
    mp_candidate_mesh_str(best, mesh, sizeof mesh);
    snprintf(ttl, sizeof ttl, "simulated step of the chosen plan, rank 0: %s, ac=%s%s, micro-batch %lld (%s)",
             mesh, mp_search_ac_name(best->ac), best->fp8 ? ", fp8" : "", (long long)best->micro_batch,
             a->m.name);
    if (st == MP_OK) st = mp_plot_timeline(ctx, a->plot_dir, trace, ttl);
    if (st != MP_OK) {
      remove(trace);
      return st;
    }
    snprintf(ttl, sizeof ttl, "memory of the chosen plan over its simulated step, rank 0: %s, ac=%s%s, micro-batch %lld (%s)",
             mesh, mp_search_ac_name(best->ac), best->fp8 ? ", fp8" : "", (long long)best->micro_batch, a->m.name);
    st = mp_plot_memory_time(ctx, a->plot_dir, trace, cap_gib, (double)best->res.overhead_bytes / kGiB, ttl);
    remove(trace);
    MP_CHECK(st);
  }
  if (!a->as_json && !a->as_csv)
    printf("plots: %s/candidates.png, %s/memory.png%s%s%s%s%s (with .dat data and .gp scripts)\n", a->plot_dir,
           a->plot_dir, res->n_order > 0 ? ", " : "", res->n_order > 0 ? a->plot_dir : "",
           res->n_order > 0 ? "/timeline.png, " : "", res->n_order > 0 ? a->plot_dir : "",
           res->n_order > 0 ? "/memory_time.png" : "");
  return MP_OK;
}

/* The search with the simulator as evaluator, logged to the database (unless --no-db),
 * then the output and the plots. */
static mp_status search_and_report(mp_ctx *ctx, const plan_args *a, mp_sim_evaluator *ev, int argc,
                                   char **argv, plan_view *v) {
  mp_planner_request req;
  mp_planner_result res;
  memset(&res, 0, sizeof res);
  mp_store *store = NULL;
  char *opts_json = options_json(), *cmdline = mp_emit_command_line("plan", argc, argv);
  make_request(a, ev, opts_json, cmdline, &req);
  mp_status st = opts_json && cmdline ? MP_OK : mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  if (st == MP_OK && a->db) st = mp_store_open(ctx, a->db, &store);
  if (st == MP_OK) st = mp_planner_run(ctx, &req, store, &res);
  *v = (plan_view){a, &res, &req.search, ev, 0, 0, store != NULL, NULL, NULL, {{0}}, 0};
  if (st == MP_OK) {
    v->n_show = a->top == 0 || a->top > res.n_order ? res.n_order : a->top;
    v->price = a->obj == MP_OBJECTIVE_TOKENS_PER_DOLLAR ? a->price : 0; /* the tokens/$ column */
    v->runs = calloc((size_t)v->n_show + 1, sizeof *v->runs);
    v->not_runs = calloc((size_t)v->n_show + 1, sizeof *v->not_runs);
    if (!v->runs || !v->not_runs) st = mp_error(ctx, MP_ERR_NOMEM, "out of memory");
    for (int64_t r = 0; r < v->n_show && st == MP_OK; r++)
      st = mp_sim_evaluator_runs(ctx, ev, &res.search->cands[res.order[r]], &v->runs[r], v->not_runs[r],
                                 sizeof v->not_runs[r]);
  }
  if (st == MP_OK && res.n_order == 0) st = mp_advise(ctx, &a->setup, &a->c, res.search, v->advice, &v->n_advice);
  if (st == MP_OK) {
    if (a->as_json)
      print_json(v);
    else if (a->as_csv)
      print_csv(v);
    else
      print_text(v);
    if (a->why) st = print_why(ctx, v);
    if (st == MP_OK && a->emit)
      st = mp_emit_ranked(ctx, a->target, ev, &a->c, res.search, res.order, mp_args_has(&k_spec, "--top") ? v->n_show
                          : v->n_show > 0, cmdline, a->out, a->as_json || a->as_csv ? stderr : stdout);
    if (st == MP_OK && a->plot_dir) st = plot(ctx, a, ev, &res, v->n_show);
  }
  free(v->runs);
  free(v->not_runs);
  v->runs = NULL;
  v->not_runs = NULL;
  v->res = NULL;
  v->cfg = NULL;
  mp_planner_result_free(&res);
  mp_store_close(store);
  free(opts_json);
  free(cmdline);
  return st;
}

/* ---- --gpus A..B: a sweep of cluster sizes ------------------------------------------------- */

/* One size of a sweep: its cluster and what the search of a->setup found on it. */
typedef struct sweep_row {
  mp_cluster c;
  mp_probe_result r;
} sweep_row;

/* The sizes with the fewest days and the least cost (-1: none fits, or no price). */
static void sweep_best(const plan_args *a, const sweep_row *rows, int *fastest, int *cheapest) {
  *fastest = *cheapest = -1;
  for (int k = 0; k < a->n_sweep; k++) {
    if (rows[k].r.n_ranked == 0) continue;
    const mp_candidate *c = &rows[k].r.best;
    const double d = mp_train_days(c, a->sweep[k], a->tokens), usd = mp_train_cost(c, a->tokens, a->price);
    if (*fastest < 0 || d < mp_train_days(&rows[*fastest].r.best, a->sweep[*fastest], a->tokens)) *fastest = k;
    if (a->price > 0 && (*cheapest < 0 || usd < mp_train_cost(&rows[*cheapest].r.best, a->tokens, a->price)))
      *cheapest = k;
  }
}

static void print_sweep_text(const plan_args *a, const mp_sim_evaluator *ev, const sweep_row *rows) {
  char params[160], head[64] = "", usd[32] = "";
  mp_cmd_params_str(&a->m, params, sizeof params);
  printf("%s (%s), seq %lld, on %lld to %lld x %s, stack %s, objective %s", a->m.name, params, a->seq,
         (long long)a->sweep[0], (long long)a->sweep[a->n_sweep - 1], a->c.gpu.name, ev->stack.name,
         mp_objective_name(a->obj));
  mp_cmd_fmt_usd(a->price, usd, sizeof usd);
  if (a->tokens > 0)
    printf("; %.4gT tokens%s%s%s", a->tokens / 1e12, a->price > 0 ? " at " : "", a->price > 0 ? usd : "",
           a->price > 0 ? " a GPU-hour" : "");
  if (a->tokens > 0) snprintf(head, sizeof head, " %8s %10s", "days", a->price > 0 ? "cost" : "");
  printf("\n\n%7s %7s %10s %10s %6s %8s%s  %s\n", "GPUs", "batch", "step (s)", "tok/s/GPU", "MFU", "peak GiB", head,
         "best plan");
  for (int k = 0; k < a->n_sweep; k++) {
    const mp_candidate *c = &rows[k].r.best;
    if (rows[k].r.n_ranked == 0) {
      printf("%7lld %7lld  no plan fits (meshplan plan --gpus %lld says what would)\n", (long long)a->sweep[k],
             (long long)rows[k].r.global_batch, (long long)a->sweep[k]);
      continue;
    }
    char opts[192], cols[64];
    mp_candidate_options_str(c, opts, sizeof opts);
    train_cols(a, c, a->sweep[k], cols, sizeof cols);
    printf("%7lld %7lld %10.4f %10.0f %5.1f%% %8.2f%s  %s\n", (long long)a->sweep[k], (long long)c->global_batch,
           c->res.step_time_s, c->res.tokens_per_s_per_gpu, 100.0 * c->res.mfu, (double)c->res.peak_mem_bytes / kGiB,
           cols, opts);
  }
  int fastest, cheapest;
  sweep_best(a, rows, &fastest, &cheapest);
  if (a->tokens > 0 && fastest >= 0)
    printf("\nfastest: %lld GPUs, %.1f days\n", (long long)a->sweep[fastest],
           mp_train_days(&rows[fastest].r.best, a->sweep[fastest], a->tokens));
  if (a->tokens > 0 && cheapest >= 0) {
    mp_cmd_fmt_usd(mp_train_cost(&rows[cheapest].r.best, a->tokens, a->price), usd, sizeof usd);
    printf("cheapest: %lld GPUs, %s (%.1f days)\n", (long long)a->sweep[cheapest], usd,
           mp_train_days(&rows[cheapest].r.best, a->sweep[cheapest], a->tokens));
  }
  printf("(each size's own search, not logged to a database; meshplan plan --gpus N for one size's plans)\n");
}

static void print_sweep_json(const plan_args *a, const sweep_row *rows) {
  cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
  if (!root || !arr) {
    cJSON_Delete(root);
    cJSON_Delete(arr);
    return;
  }
  cJSON_AddStringToObject(root, "model", a->m.name);
  mp_cmd_params_json(&a->m, root);
  cJSON_AddStringToObject(root, "gpu", a->c.gpu.name);
  cJSON_AddNumberToObject(root, "seq", (double)a->seq);
  cJSON_AddStringToObject(root, "objective", mp_objective_name(a->obj));
  if (a->tokens > 0) cJSON_AddNumberToObject(root, "tokens", a->tokens);
  if (a->tokens > 0 && a->price > 0) cJSON_AddNumberToObject(root, "price_per_gpu_hour", a->price);
  for (int k = 0; k < a->n_sweep; k++) {
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddNumberToObject(o, "n_gpus", (double)a->sweep[k]);
    cJSON_AddNumberToObject(o, "candidates", (double)rows[k].r.n_candidates);
    cJSON_AddNumberToObject(o, "feasible", (double)rows[k].r.n_ranked);
    if (rows[k].r.n_ranked == 0) cJSON_AddNullToObject(o, "plan");
    else cJSON_AddItemToObject(o, "plan", mp_candidate_json(&rows[k].r.best, 1, 0));
    if (rows[k].r.n_ranked > 0 && a->tokens > 0) mp_train_json(o, &rows[k].r.best, a->sweep[k], a->tokens, a->price);
    cJSON_AddItemToArray(arr, o);
  }
  cJSON_AddItemToObject(root, "sweep", arr);
  int fastest, cheapest;
  sweep_best(a, rows, &fastest, &cheapest);
  if (a->tokens > 0 && fastest >= 0) cJSON_AddNumberToObject(root, "fastest_n_gpus", (double)a->sweep[fastest]);
  if (a->tokens > 0 && cheapest >= 0) cJSON_AddNumberToObject(root, "cheapest_n_gpus", (double)a->sweep[cheapest]);
  mp_cmd_print_json(root);
}

static void print_sweep_csv(const plan_args *a, const sweep_row *rows) {
  printf("n_gpus,global_batch,feasible,dp_replicate,dp_shard,tp,ep,pp,cp,ac,micro_batch,step_time_s,"
         "tokens_per_s_per_gpu,mfu,peak_mem_bytes,train_days,train_cost_usd\n");
  for (int k = 0; k < a->n_sweep; k++) {
    const mp_candidate *c = &rows[k].r.best;
    char ac[32] = "";
    if (rows[k].r.n_ranked) mp_candidate_ac_str(c, ac, sizeof ac);
    printf("%lld,%lld,%lld,%d,%d,%d,%d,%d,%d,%s,%lld,%.9g,%.9g,%.6g,%lld,%.9g,%.9g\n", (long long)a->sweep[k],
           (long long)rows[k].r.global_batch, (long long)rows[k].r.n_ranked, c->mesh.size[MP_DIM_DP_REPLICATE],
           c->mesh.size[MP_DIM_DP_SHARD], c->mesh.size[MP_DIM_TP], c->mesh.ep, c->mesh.size[MP_DIM_PP],
           c->mesh.size[MP_DIM_CP], ac, (long long)c->micro_batch, c->res.step_time_s, c->res.tokens_per_s_per_gpu,
           c->res.mfu, (long long)c->res.peak_mem_bytes, mp_train_days(c, a->sweep[k], a->tokens),
           mp_train_cost(c, a->tokens, a->price));
  }
}

/* --gpus A..B: the search of a->setup on each size, then per size its best plan (with its
 * days and cost under --tokens). *any_fits 0 when no size has a plan. */
static mp_status run_sweep(mp_ctx *ctx, const plan_args *a, const mp_sim_evaluator *ev, int *any_fits) {
  sweep_row *rows = calloc((size_t)a->n_sweep, sizeof *rows);
  MP_CHECK_ALLOC(ctx, rows);
  mp_status st = MP_OK;
  *any_fits = 0;
  for (int k = 0; k < a->n_sweep && st == MP_OK; k++) {
    st = mp_cmd_load_cluster_n(ctx, &k_spec, a->sweep[k], &rows[k].c);
    if (st == MP_OK) st = mp_plan_setup_check(ctx, &a->setup, &rows[k].c);
    if (st == MP_OK) st = mp_plan_probe(ctx, &a->setup, &rows[k].c, &rows[k].r);
    if (st == MP_OK) *any_fits |= rows[k].r.n_ranked > 0;
  }
  if (st == MP_OK && a->as_json) print_sweep_json(a, rows);
  else if (st == MP_OK && a->as_csv) print_sweep_csv(a, rows);
  else if (st == MP_OK) print_sweep_text(a, ev, rows);
  free(rows);
  return st;
}

static int run_plan(mp_ctx *ctx, const mp_cmd_call *call) {
  plan_args *a = calloc(1, sizeof *a);
  mp_sim_evaluator *ev = calloc(1, sizeof *ev);
  mp_status st = a && ev ? MP_OK : mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  if (st == MP_OK) st = read_args(ctx, a);
  if (st == MP_OK)
    st = mp_sim_evaluator_init(ctx, ev, &a->m, &a->c, a->seq, a->gb, a->headroom, a->setup.stack);
  if (st == MP_OK) st = mp_cmd_cp_rotate(ctx, &k_spec, &ev->stack, &ev->base);
  if (st == MP_OK) st = mp_cmd_async_tp(ctx, &k_spec, &ev->stack, &ev->base);
  if (st == MP_OK) st = mp_cmd_megatron_weights(ctx, &k_spec, &ev->stack, &ev->base);
  if (st == MP_OK) st = mp_cmd_fp8_all_gather(ctx, &k_spec, &ev->stack, &ev->base);
  if (st == MP_OK) st = mp_cmd_nccl(ctx, &k_spec, &ev->stack);
  if (st == MP_OK) st = mp_plan_setup_options(ctx, &a->setup, &a->c, ev);
  if (st == MP_OK) {
    /* as checked against the user's stack; on other clusters where their stacks run them */
    a->setup.cp_rotate_given = mp_args_has(&k_spec, "--cp-rotate");
    a->setup.cp_rotate = ev->base.cp_rotate;
    a->setup.cp_comm = ev->base.cp_comm;
    a->setup.async_tp = mp_args_has(&k_spec, "--no-async-tp") ? -1 : ev->base.tp_comm_fused;
    st = build_fix(ctx, a);
  }
  plan_view *v = st == MP_OK ? calloc(1, sizeof *v) : NULL;
  if (st == MP_OK && !v) st = mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  int64_t n_ranked = -1;
  int any_fits = 1;
  if (st == MP_OK && a->n_sweep) st = run_sweep(ctx, a, ev, &any_fits);
  else if (st == MP_OK) st = search_and_report(ctx, a, ev, call->argc, call->argv, v);
  if (st == MP_OK && !a->n_sweep) n_ranked = v->n_show > 0 ? 1 : 0;
  if (st == MP_OK && a->n_sweep && !any_fits) {
    mp_error(ctx, MP_ERR_NOT_FOUND, "no plan fits %s on any size of the sweep %s; meshplan plan --gpus %lld says "
             "what would", a->m.name, mp_args_get(&k_spec, "--gpus"), (long long)a->sweep[a->n_sweep - 1]);
    mp_cmd_fail(ctx, MP_ERR_NOT_FOUND);
    st = MP_OK;
    n_ranked = -2;
  }
  int rc = st != MP_OK ? mp_cmd_fail(ctx, st) : 0;
  if (n_ranked == 0) {
    /* accepted work that found nothing: the hints on stdout say what would fit */
    mp_error(ctx, MP_ERR_NOT_FOUND, "no plan fits %s on %d x %s; %s%s", a->m.name, mp_cluster_n_gpus(&a->c),
             a->c.gpu.name, v->n_advice ? "the smallest change that fits, searched: " : "none of the changes tried fits",
             v->n_advice ? v->advice[0].change : "");
    mp_cmd_fail(ctx, MP_ERR_NOT_FOUND);
    rc = MP_CMD_EXIT_NO_PLAN;
  }
  if (n_ranked == -2) rc = MP_CMD_EXIT_NO_PLAN;
  free(v);
  mp_sim_evaluator_free(ev);
  free(ev);
  free(a);
  return rc;
}

const mp_command mp_command_plan = {
    &k_spec, "enumerate device meshes, predict each, rank them (default: llama3.1-8b on 8xH100)", run_plan};
