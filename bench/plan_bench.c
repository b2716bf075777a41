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

int main(int argc, char **argv) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  const char *pos[1];
  int n_pos = 0, help = 0;
  mp_status st = mp_args_parse(&ctx, &k_spec, argc - 1, argv + 1, pos, &n_pos, &help);
  if (st != MP_OK) {
    fprintf(stderr, "plan_bench: %s\n", mp_errmsg(&ctx));
    return 2;
  }
  if (help) {
    mp_args_print_help(&k_spec, stdout);
    return 0;
  }
  long long seq = 8192, gb = 0, runs = 5, threads = 0;
  if ((st = mp_args_int(&ctx, &k_spec, "--seq", 1, MP_LIM_SEQ, &seq)) != MP_OK ||
      (st = mp_args_int(&ctx, &k_spec, "--global-batch", 1, MP_LIM_GLOBAL_BATCH, &gb)) != MP_OK ||
      (st = mp_args_int(&ctx, &k_spec, "--runs", 1, 1000, &runs)) != MP_OK ||
      (st = mp_args_int(&ctx, &k_spec, "--threads", 1, MP_LIM_THREADS, &threads)) != MP_OK) {
    fprintf(stderr, "plan_bench: %s\n", mp_errmsg(&ctx));
    return 2;
  }
  if (runs > 99) runs = 99;
  const char *mname = mp_args_get(&k_spec, "--model"), *cname = mp_args_get(&k_spec, "--cluster");
  mp_model m;
  mp_cluster c;
  if ((st = mp_model_load(&ctx, mname ? mname : "llama3.1-405b", &m)) != MP_OK ||
      (st = mp_cluster_load(&ctx, cname ? cname : "h100-16k", &c)) != MP_OK) {
    fprintf(stderr, "plan_bench: %s\n", mp_errmsg(&ctx));
    return 2;
  }
  const double headroom = 0.05; /* meshplan plan's default */
  if (gb == 0) gb = mp_batch_rule_seqs(mp_batch_rule_tokens((double)mp_model_param_count(&m), mp_cluster_n_gpus(&c)), seq);
  static mp_sim_evaluator ev;
  if ((st = mp_sim_evaluator_init(&ctx, &ev, &m, &c, seq, gb, headroom, NULL)) != MP_OK) {
    fprintf(stderr, "plan_bench: %s\n", mp_errmsg(&ctx));
    return 1;
  }
  mp_planner_request req;
  memset(&req, 0, sizeof req);
  mp_sim_search_config(&req.search, &ev, &c, headroom);
  if (!mp_args_has(&k_spec, "--global-batch"))
    req.search.target_batch = mp_batch_rule_seqs(
        mp_batch_rule_tokens((double)mp_model_param_count(&m), mp_cluster_n_gpus(&c)), seq);
  req.search.n_threads = (int)threads;
  const char *fp8 = mp_args_get(&k_spec, "--fp8");
  if (fp8 && strcmp(fp8, "off") != 0 && strcmp(fp8, "auto") != 0) {
    fprintf(stderr, "plan_bench: --fp8 '%s': choose off or auto\n", fp8);
    return 2;
  }
  req.search.search_fp8 = fp8 && strcmp(fp8, "auto") == 0;
  req.objective = MP_OBJECTIVE_TIME;
  req.info = (mp_run_info){m.name, c.name, c.gpu.name, mp_cluster_n_gpus(&c), c.gpus_per_node, seq, gb,
                           "time", "{}", "plan_bench", "bench"};
  const char *dir = mp_args_get(&k_spec, "--db");
  if (!dir) dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  printf("plan_bench: %s on %s (%d GPUs), seq %lld, global batch %lld%s, float8 %s; %ld CPUs, %s threads\n",
         m.name, c.name, mp_cluster_n_gpus(&c), seq, gb,
         req.search.target_batch ? " (the default rule, per mesh the nearest multiple of dp)" : "",
         req.search.search_fp8 ? "searched" : "off", ncpu,
         threads ? "given" : "one per CPU");
  printf("%4s %10s %8s %10s %10s %8s %8s %12s %12s %12s %7s %7s %7s\n", "run", "candidates",
         "pruned", "simulated", "logged", "wall s", "cpu s", "cand/s", "sim/s", "logged/s",
         "enum s", "eval s", "write s");
  double wall[100], cps[100], sps[100], lps[100];
  int64_t n_cand = 0, n_sim = 0;
  for (int r = 0; r < runs; r++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/plan_bench.%d.%d.db", dir, (int)getpid(), r);
    mp_store *store = NULL;
    if ((st = mp_store_open(&ctx, path, &store)) != MP_OK) {
      fprintf(stderr, "plan_bench: %s\n", mp_errmsg(&ctx));
      return 1;
    }
    mp_planner_result res;
    double c0 = cpu_s(), t0 = mp_now_s();
    st = mp_planner_run(&ctx, &req, store, &res);
    double t = mp_now_s() - t0, cpu = cpu_s() - c0;
    int64_t logged = 0;
    if (st == MP_OK) st = mp_store_query_i64(&ctx, store, "SELECT count(*) FROM plans", &logged);
    mp_store_close(store);
    char side[1100];
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
    unlink(path);
    if (st != MP_OK) {
      fprintf(stderr, "plan_bench: %s\n", mp_errmsg(&ctx));
      return 1;
    }
    n_cand = res.search->n;
    n_sim = res.search->n_evaluated;
    wall[r] = t;
    cps[r] = (double)n_cand / t;
    sps[r] = (double)n_sim / t;
    lps[r] = (double)logged / t;
    /* phases: enumeration (one thread), evaluation (the workers), then ranking and the
     * store's one transaction (one thread; "write s" is about how long the write lock is
     * held) */
    const double t_enum = res.search->enumerate_s, t_eval = res.search->run_s;
    printf("%4d %10lld %8lld %10lld %10lld %8.3f %8.3f %12.0f %12.0f %12.0f %7.3f %7.3f %7.3f\n",
           r + 1, (long long)n_cand, (long long)res.search->n_pruned, (long long)n_sim,
           (long long)logged, t, cpu, cps[r], sps[r], lps[r], t_enum, t_eval,
           t - t_enum - t_eval);
    mp_planner_result_free(&res);
  }
  double w = mp_median(wall, (size_t)runs);
  printf("median of %lld: wall %.3f s; %.0f candidates/s enumerated+logged, %.0f simulated/s "
         "(%.0f per core); reference: Calculon ~80-100 configurations/s/core\n",
         runs, w, mp_median(cps, (size_t)runs), mp_median(sps, (size_t)runs),
         mp_median(sps, (size_t)runs) / (double)(ncpu > 0 ? ncpu : 1));
  (void)lps;
  mp_sim_evaluator_free(&ev);
  return 0;
}
