/* plan_bench: the planner's speed on the full search (docs/design.md, "Numbers that matter"):
 * every mesh x ep x micro-batch x AC x float8 x reshard of a model on a cluster, each
 * unpruned candidate simulated by the schedule simulator and every candidate logged to
 * SQLite in one transaction, exactly as `meshplan plan` does (mp_planner_run).
 *
 * Prints per run and the median of --runs runs (default 5): wall time, CPU time, and
 * candidates per second enumerated, simulated and logged. Default: llama3.1-405b on
 * h100-16k (16,384 H100s), seq 8192, and meshplan plan's default batch rule (planner/batch.h:
 * 16M tokens at 16,384 GPUs, 2048 sequences, the Llama 3 pre-training batch), each mesh at
 * the nearest multiple of its dp; --global-batch G fixes the batch instead. Float8 is not
 * searched, as meshplan plan's default; --fp8 auto searches it beside bf16 (plan's --fp8
 * auto: twice the candidates). The database is a fresh file per run in $TMPDIR (or --db
 * DIR). */
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
    MP_OPT_MODEL("llama3.1-405b"),
    MP_OPT_CLUSTER("h100-16k"),
    MP_OPT_SEQ("8192"),
    MP_OPT_GLOBAL_BATCH("meshplan plan's rule: 2048 at 16,384 GPUs"),
    {"--runs", "N", "runs; the median is reported (default 5)", NULL},
    {"--fp8", "off|auto", "off: bf16 plans only, meshplan plan's default; auto: float8 searched beside bf16", NULL},
    MP_OPT_THREADS,
    {"--db", "DIR", "directory for the benchmark databases (default $TMPDIR or /tmp)", NULL},
    MP_OPT_END,
};
static mp_cmd_spec k_spec = {"plan_bench", "Time the full planner search (enumerate, simulate, log).",
                             "[--model M] [--cluster C] [--seq S] [--global-batch G] [--runs N]",
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
  mp_model model;
  mp_cluster cluster;
  const char *dir; /* where each run's database is made */
} bench_opts;

/* One run's figures, for the medians. */
typedef struct run_figures {
  double wall_s;
  double cand_per_s; /* candidates enumerated (and logged) per second */
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

/* The numbers, the model and the cluster, the database directory; gb the default rule's
 * unless --global-batch fixes it. */
static mp_status read_options(mp_ctx *ctx, bench_opts *o) {
  memset(o, 0, sizeof *o);
  o->seq = 8192;
  o->runs = 5;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--seq", 1, MP_LIM_SEQ, &o->seq));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--global-batch", 1, MP_LIM_GLOBAL_BATCH, &o->gb));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--runs", 1, 1000, &o->runs));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--threads", 1, MP_LIM_THREADS, &o->threads));
  if (o->runs > 99) o->runs = 99;
  const char *mname = mp_args_get(&k_spec, "--model"), *cname = mp_args_get(&k_spec, "--cluster");
  MP_CHECK(mp_model_load(ctx, mname ? mname : "llama3.1-405b", &o->model));
  MP_CHECK(mp_cluster_load(ctx, cname ? cname : "h100-16k", &o->cluster));
  if (o->gb == 0) o->gb = default_batch(o);
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
  if (!mp_args_has(&k_spec, "--global-batch")) req->search.target_batch = default_batch(o);
  req->search.n_threads = (int)o->threads;
  req->search.search_fp8 = search_fp8;
  req->objective = MP_OBJECTIVE_TIME;
  req->info = (mp_run_info){m->name, c->name, c->gpu.name, mp_cluster_n_gpus(c), c->gpus_per_node,
                            o->seq, o->gb, "time", "{}", "plan_bench", "bench"};
}

static void print_header(const bench_opts *o, const mp_planner_request *req, long ncpu) {
  printf("plan_bench: %s on %s (%d GPUs), seq %lld, global batch %lld%s, float8 %s; %ld CPUs, %s threads\n",
         o->model.name, o->cluster.name, mp_cluster_n_gpus(&o->cluster), o->seq, o->gb,
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
  const int64_t n_cand = res.search->n, n_sim = res.search->n_evaluated;
  out->wall_s = t;
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
  if (mp_sim_evaluator_init(&ctx, &ev, &o.model, &o.cluster, o.seq, o.gb, k_headroom, NULL) != MP_OK)
    return fail(&ctx, 1);
  const char *fp8 = mp_args_get(&k_spec, "--fp8");
  if (fp8 && strcmp(fp8, "off") != 0 && strcmp(fp8, "auto") != 0) {
    fprintf(stderr, "plan_bench: --fp8 '%s': choose off or auto\n", fp8);
    return 2;
  }
  mp_planner_request req;
  make_request(&o, &ev, fp8 && strcmp(fp8, "auto") == 0, &req);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  print_header(&o, &req, ncpu);
  double wall[100], cps[100], sps[100];
  for (int r = 0; r < o.runs; r++) {
    run_figures f;
    if (run_once(&ctx, &req, o.dir, r, &f) != MP_OK) return fail(&ctx, 1);
    wall[r] = f.wall_s;
    cps[r] = f.cand_per_s;
    sps[r] = f.sim_per_s;
  }
  const size_t n = (size_t)o.runs;
  printf("median of %lld: wall %.3f s; %.0f candidates/s enumerated+logged, %.0f simulated/s "
         "(%.0f per core); reference: Calculon ~80-100 configurations/s/core\n",
         o.runs, mp_median(wall, n), mp_median(cps, n), mp_median(sps, n),
         mp_median(sps, n) / (double)(ncpu > 0 ? ncpu : 1));
  mp_sim_evaluator_free(&ev);
  return 0;
}
