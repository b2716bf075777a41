/* plan_bench: the planner's speed on the full search: every mesh x ep x micro-batch x AC x
 * float8 x reshard of a model on a cluster, each unpruned candidate simulated by the
 * schedule simulator and the run logged to SQLite in one transaction, exactly as
 * `meshplan plan` does (mp_planner_run).
 *
 * Prints per run and the median of --runs runs (default 5): wall time, CPU time, and
 * candidates per second enumerated, simulated and logged. Two cases (--case):
 *  - llama3.1-405b (the default): llama3.1-405b on h100-16k (16,384 H100s), seq 8192, and
 *    meshplan plan's default batch rule (planner/batch.h: 16M tokens at 16,384 GPUs, 2048
 *    sequences, the Llama 3 pre-training batch), each mesh at the nearest multiple of its
 *    dp; --global-batch G fixes the batch instead.
 *  - deepseek-v3: deepseek-v3 on 2,048 H800 (8 per node), seq 4096 and global batch 15,360
 *    sequences, DeepSeek-V3's pre-training batch and sequence (its technical report,
 *    section 4.2): `meshplan plan --model deepseek-v3 --gpus 2048 --gpu h800 --seq 4096
 *    --global-batch 15360`, the search over ep x pp: under FSDP (the default stack) EP inside
 *    dp_shard, under DDP (--stack megatron-core) the expert grid (exec/mesh.h).
 * --model, --cluster or --gpus/--gpu, --seq, --global-batch and --stack override a case's
 * settings; --fix constrains the search as plan's --fix does (`--fix etp=1`: the expert grid
 * under FSDP, which the default search leaves to that fix). Float8 is not searched, as meshplan plan's default; --fp8 auto searches it
 * beside bf16 (plan's --fp8 auto: twice the candidates). Each run logs its ranked plans, as
 * meshplan plan does, or with --log all every candidate (plan --log-all). The database is
 * a fresh file per run in $TMPDIR (or --db DIR). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/stats.h"
#include "common/timeutil.h"
#include "sim/cluster.h"
#include "exec/model.h"
#include "planner/batch.h"
#include "app/args.h"
#include "app/options.h"
#include "planner/evaluate.h"
#include "planner/planner.h"

static mp_opt k_opts[] = {
    {"--case", "NAME", "llama3.1-405b (default) or deepseek-v3: the settings below as that case has them", NULL},
    MP_OPT_MODEL("the case's: llama3.1-405b, deepseek-v3"),
    MP_OPT_CLUSTER("the case's: h100-16k; deepseek-v3: --gpus 2048 --gpu h800"),
    {"--gpus", "N", "instead of --cluster: N GPUs of --gpu TYPE, 8 per node", NULL},
    MP_OPT_GPU_OF_GPUS("default the case's: h800 for deepseek-v3, else h100-sxm"),
    MP_OPT_STACK("meshplan plan's"),
    MP_OPT_SEQ("the case's: 8192, deepseek-v3 4096"),
    MP_OPT_GLOBAL_BATCH("the case's: meshplan plan's rule, 2048 at 16,384 GPUs; deepseek-v3 15360"),
    {"--runs", "N", "runs; the median is reported (default 5)", NULL},
    {"--fix", "K=V,...", "constrain the search as meshplan plan --fix does, e.g. etp=1", NULL},
    {"--fp8", "off|auto", "off: bf16 plans only, meshplan plan's default; auto: float8 searched beside bf16", NULL},
    MP_OPT_THREADS,
    {"--db", "DIR", "directory for the benchmark databases (default $TMPDIR or /tmp)", NULL},
    {"--log", "ranked|all", "what each run logs to its database: the ranked plans (meshplan plan's default) or "
     "every candidate with its rule (plan --log-all)", NULL},
    MP_OPT_END,
};
static mp_cmd_spec k_spec = {"plan_bench", "Time the full planner search (enumerate, simulate, log).",
                             "[--case llama3.1-405b|deepseek-v3] [--model M] [--cluster C | --gpus N --gpu T] [--stack S] "
                             "[--seq S] [--global-batch G] [--fix K=V,...] [--runs N] [--log ranked|all]",
                             k_opts, 0};

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
         (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* The benchmark's inputs, from the command line. */
typedef struct bench_opts {
  long long seq, gb, runs, threads; /* gb: the global batch, fixed or the default rule's */
  int batch_fixed;                  /* gb is fixed (--global-batch or the case's), not the rule's */
  int log_all;                      /* every candidate logged, not only the ranked plans */
  mp_model model;
  mp_cluster cluster;
  const char *stack; /* the stack profile; NULL: meshplan plan's default */
  const char *dir;   /* where each run's database is made */
  mp_search_fix fix; /* --fix's constraints (none by default) */
} bench_opts;

/* A case's settings: what the benchmark runs unless an option overrides them. */
typedef struct bench_case {
  const char *name, *model, *cluster, *gpu; /* cluster NULL: gpus of gpu, 8 per node */
  long long gpus, seq, gb;                   /* gb 0: meshplan plan's batch rule */
} bench_case;

static const bench_case k_cases[] = {
    {"llama3.1-405b", "llama3.1-405b", "h100-16k", NULL, 0, 8192, 0},
    /* DeepSeek-V3 technical report, sections 3.1 and 4.2: 2,048 H800, 4K sequences, a batch
     * of 15,360 sequences */
    {"deepseek-v3", "deepseek-v3", NULL, "h800", 2048, 4096, 15360},
};
/* One run's figures, for the medians. */
typedef struct run_figures {
  double wall_s;
  double cpu_s;      /* CPU time of every thread: what a busy machine's wall time hides */
  double cand_per_s; /* candidates enumerated per second */
  double sim_per_s;  /* candidates simulated per second */
} run_figures;

static const double k_headroom = 0.05; /* meshplan plan's default */

static int fail(const mp_ctx *ctx, int code) {
  fprintf(stderr, "plan_bench: %s\n", mp_errmsg(ctx));
  return code;
}

/* meshplan plan's default batch rule for the model on the cluster: sequences of seq. */
static long long default_batch(const bench_opts *o) {
  return mp_batch_rule_seqs(
      mp_batch_rule_tokens((double)mp_model_param_count(&o->model), mp_cluster_n_gpus(&o->cluster)),
      o->seq);
}

/* The case --case names (the first by default); NULL with the error on ctx. */
static const bench_case *find_case(mp_ctx *ctx) {
  const char *name = mp_args_get(&k_spec, "--case");
  for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
    if (!name || strcmp(name, k_cases[i].name) == 0) return &k_cases[i];
  mp_error(ctx, MP_ERR_USAGE, "--case '%s': choose llama3.1-405b or deepseek-v3", name);
  return NULL;
}

/* The cluster: --cluster, --gpus N of --gpu (8 per node), or the case's. */
static mp_status load_cluster(mp_ctx *ctx, const bench_case *bc, mp_cluster *c) {
  const char *cname = mp_args_get(&k_spec, "--cluster"), *gpu = mp_args_get(&k_spec, "--gpu");
  long long n = bc->gpus;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--gpus", 1, MP_LIM_GPUS, &n));
  if (cname && (mp_args_has(&k_spec, "--gpus") || gpu))
    return mp_error(ctx, MP_ERR_USAGE, "give --cluster or --gpus (with --gpu), not both");
  if (cname || (!mp_args_has(&k_spec, "--gpus") && !gpu && bc->cluster))
    return mp_cluster_load(ctx, cname ? cname : bc->cluster, c);
  if (n < 1) return mp_error(ctx, MP_ERR_USAGE, "--gpu describes the GPUs of --gpus N: add --gpus N");
  gpu = gpu ? gpu : bc->gpu ? bc->gpu : "h100-sxm";
  return mp_cluster_make(ctx, gpu, n, n < 8 ? n : 8, c);
}

/* The numbers, the model and the cluster, the stack, the database directory; each the
 * case's unless an option gives it; gb the default rule's unless fixed. */
static mp_status read_options(mp_ctx *ctx, bench_opts *o) {
  memset(o, 0, sizeof *o);
  const bench_case *bc = find_case(ctx);
  if (!bc) return ctx->last;
  o->seq = bc->seq;
  o->gb = bc->gb;
  o->runs = 5;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--seq", 1, MP_LIM_SEQ, &o->seq));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--global-batch", 1, MP_LIM_GLOBAL_BATCH, &o->gb));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--runs", 1, 1000, &o->runs));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--threads", 1, MP_LIM_THREADS, &o->threads));
  if (o->runs > 99) o->runs = 99;
  const char *mname = mp_args_get(&k_spec, "--model");
  MP_CHECK(mp_model_load(ctx, mname ? mname : bc->model, &o->model));
  MP_CHECK(load_cluster(ctx, bc, &o->cluster));
  o->batch_fixed = o->gb > 0;
  if (o->gb == 0) o->gb = default_batch(o);
  o->stack = mp_args_get(&k_spec, "--stack");
  const char *log = mp_args_get(&k_spec, "--log");
  if (log && strcmp(log, "ranked") != 0 && strcmp(log, "all") != 0)
    return mp_error(ctx, MP_ERR_USAGE, "--log '%s': choose ranked or all", log);
  o->log_all = log && strcmp(log, "all") == 0;
  mp_search_fix_init(&o->fix);
  const char *fix = mp_args_get(&k_spec, "--fix");
  if (fix) MP_CHECK(mp_search_fix_parse(ctx, fix, &o->fix));
  o->dir = mp_args_get(&k_spec, "--db");
  if (!o->dir) o->dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  return MP_OK;
}

/* The request meshplan plan makes for the model on the cluster: the time objective, each
 * mesh at the default rule's batch unless --global-batch fixes it. */
static void make_request(const bench_opts *o, mp_sim_evaluator *ev, int search_fp8,
                         mp_planner_request *req) {
  const mp_model *m = &o->model;
  const mp_cluster *c = &o->cluster;
  memset(req, 0, sizeof *req);
  mp_sim_search_config(&req->search, ev, c, k_headroom);
  req->search.fix = o->fix;
  if (!o->batch_fixed) req->search.target_batch = default_batch(o);
  req->search.n_threads = (int)o->threads;
  req->search.search_fp8 = search_fp8;
  req->objective = MP_OBJECTIVE_TIME;
  req->ranked_only = !o->log_all;
  /* as meshplan plan does: a plan over capacity that is not logged needs no time figures */
  ev->sim.memory_first = !o->log_all;
  /* and plan's bound at its default --top 10 (planner/search.h, bound_top_k) */
  if (!o->log_all) req->search.bound_top_k = MP_OPT_TOP_DEFAULT;
  req->info = (mp_run_info){.model = m->name, .cluster = c->name, .gpu = c->gpu.name,
                            .n_gpus = mp_cluster_n_gpus(c), .gpus_per_node = c->gpus_per_node,
                            .seq = o->seq, .global_batch = o->gb, .objective = "time",
                            .options_json = "{}", .command = "plan_bench", .tool_version = "bench"};
  mp_sim_evaluator_settings(ev, &req->info.settings); /* as meshplan plan stores them */
}

static void print_header(const bench_opts *o, const mp_planner_request *req, const char *stack, long ncpu) {
  printf("plan_bench: %s on %s (%d GPUs), stack %s, seq %lld, global batch %lld%s, float8 %s; %ld CPUs, "
         "%s threads\n",
         o->model.name, o->cluster.name, mp_cluster_n_gpus(&o->cluster), stack, o->seq, o->gb,
         req->search.target_batch ? " (the default rule, per mesh the nearest multiple of dp)" : "",
         req->search.search_fp8 ? "searched" : "off", ncpu,
         o->threads ? "given" : "one per CPU");
  printf("%4s %10s %8s %10s %10s %8s %8s %12s %12s %12s %7s %7s %7s\n", "run", "candidates",
         "pruned", "simulated", "logged", "wall s", "cpu s", "cand/s", "sim/s", "logged/s",
         "enum s", "eval s", "write s");
}

/* The database file at path and its WAL and shared-memory files, gone. */
static void remove_db(const char *path) {
  char side[1100];
  snprintf(side, sizeof side, "%s-wal", path);
  unlink(side);
  snprintf(side, sizeof side, "%s-shm", path);
  unlink(side);
  unlink(path);
}

/* Run r: the full search into a fresh database in dir, timed, and its row printed. */
static mp_status run_once(mp_ctx *ctx, const mp_planner_request *req, const char *dir, int r,
                          run_figures *out) {
  char path[1024];
  snprintf(path, sizeof path, "%s/plan_bench.%d.%d.db", dir, (int)getpid(), r);
  mp_store *store = NULL;
  MP_CHECK(mp_store_open(ctx, path, &store));
  mp_planner_result res;
  double c0 = cpu_s(), t0 = mp_now_s();
  mp_status st = mp_planner_run(ctx, req, store, &res);
  double t = mp_now_s() - t0, cpu = cpu_s() - c0;
  int64_t logged = 0;
  if (st == MP_OK) st = mp_store_query_i64(ctx, store, "SELECT count(*) FROM plans", &logged);
  mp_store_close(store);
  remove_db(path);
  if (st != MP_OK) return st;
  /* every simulation, those whose result the search set aside included */
  const int64_t n_cand = res.search->n, n_sim = res.search->n_evaluated + res.search->n_set_aside;
  out->wall_s = t;
  out->cpu_s = cpu;
  out->cand_per_s = (double)n_cand / t;
  out->sim_per_s = (double)n_sim / t;
  /* phases: enumeration (one thread), evaluation (the workers), then ranking and the
   * store's one transaction (one thread; "write s" is about how long the write lock is
   * held) */
  const double t_enum = res.search->enumerate_s, t_eval = res.search->run_s;
  printf("%4d %10lld %8lld %10lld %10lld %8.3f %8.3f %12.0f %12.0f %12.0f %7.3f %7.3f %7.3f\n",
         r + 1, (long long)n_cand, (long long)res.search->n_pruned, (long long)n_sim,
         (long long)logged, t, cpu, out->cand_per_s, out->sim_per_s, (double)logged / t, t_enum,
         t_eval, t - t_enum - t_eval);
  mp_planner_result_free(&res);
  return MP_OK;
}

int main(int argc, char **argv) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  const char *pos[1];
  int n_pos = 0, help = 0;
  if (mp_args_parse(&ctx, &k_spec, argc - 1, argv + 1, pos, &n_pos, &help) != MP_OK) return fail(&ctx, 2);
  if (help) {
    mp_args_print_help(&k_spec, stdout);
    return 0;
  }
  bench_opts o;
  if (read_options(&ctx, &o) != MP_OK) return fail(&ctx, 2);
  static mp_sim_evaluator ev;
  if (mp_sim_evaluator_init(&ctx, &ev, &o.model, &o.cluster, o.seq, o.gb, k_headroom, o.stack) != MP_OK)
    return fail(&ctx, 1);
  const char *fp8 = mp_args_get(&k_spec, "--fp8");
  if (fp8 && strcmp(fp8, "off") != 0 && strcmp(fp8, "auto") != 0) {
    fprintf(stderr, "plan_bench: --fp8 '%s': choose off or auto\n", fp8);
    return 2;
  }
  mp_planner_request req;
  make_request(&o, &ev, fp8 && strcmp(fp8, "auto") == 0, &req);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  print_header(&o, &req, ev.stack.name, ncpu);
  double wall[100], cpu[100], cps[100], sps[100];
  for (int r = 0; r < o.runs; r++) {
    run_figures f;
    if (run_once(&ctx, &req, o.dir, r, &f) != MP_OK) return fail(&ctx, 1);
    wall[r] = f.wall_s;
    cpu[r] = f.cpu_s;
    cps[r] = f.cand_per_s;
    sps[r] = f.sim_per_s;
  }
  const size_t n = (size_t)o.runs;
  printf("median of %lld: wall %.3f s, cpu %.3f s; %.0f candidates/s enumerated, %.0f simulated/s "
         "(%.0f per core); reference: Calculon ~80-100 configurations/s/core\n",
         o.runs, mp_median(wall, n), mp_median(cpu, n), mp_median(cps, n), mp_median(sps, n),
         mp_median(sps, n) / (double)(ncpu > 0 ? ncpu : 1));
  mp_sim_evaluator_free(&ev);
  return 0;
}
