/* meshplan plan: the main job. Enumerates every device mesh and option for a model on a
 * cluster, prunes what cannot run (with reasons), simulates the rest on all cores, logs
 * every candidate to SQLite, ranks the feasible plans and prints them (table, --json or
 * --csv), optionally drawing gnuplot plots (--plot DIR).
 *
 * --executable-only keeps the plans exec/runtime can run today: no pipeline (pp == 1) and
 * no context parallelism (cp == 1); the simulator models both, the runtime does not yet. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/cluster.h"
#include "exec/model.h"
#include "planner/cli/commands.h"
#include "planner/evaluate.h"
#include "planner/planner.h"
#include "planner/plot.h"
#include "planner/search.h"
#include "planner/store.h"

static mp_opt k_opts[] = {
    {"--model", "M", "model name (data/models stem) or path to a JSON file (default llama3.1-8b)", NULL},
    {"--hf-config", "PATH", "a Hugging Face config.json instead of --model", NULL},
    {"--cluster", "C", "cluster name (data/clusters stem) or path (default h100-8)", NULL},
    {"--gpus", "N", "instead of --cluster: N GPUs of --gpu TYPE, --gpus-per-node K per node", NULL},
    {"--gpu", "TYPE", "GPU profile for --gpus (data/gpus stem, e.g. h100-sxm)", NULL},
    {"--gpus-per-node", "K", "GPUs per node for --gpus (default 8, or N when N < 8)", NULL},
    {"--seq", "S", "tokens per sequence (default min(8192, the model's max_seq))", NULL},
    {"--global-batch", "G", "sequences per step over all data-parallel ranks (default 32)", NULL},
    {"--global-batch-tokens", "T", "tokens per step instead of --global-batch (a multiple of --seq)", NULL},
    {"--top", "K", "plans to print (default 10; 0 prints all)", NULL},
    {"--objective", "O", "time (default), memory, or tokens-per-dollar (needs a price)", NULL},
    {"--price", "USD", "price per GPU-hour for tokens-per-dollar (default: the cluster's)", NULL},
    {"--fix", "K=V,...", "constrain the search, e.g. tp=8,pp=1,ac=full,fp8=0,mb=2,reshard=1", NULL},
    {"--executable-only", NULL, "only plans the runtime runs today (pp=1 and cp=1)", NULL},
    {"--allow-cross-node-tp", NULL, "allow tensor-parallel groups that span nodes", NULL},
    {"--headroom", "F", "fraction of GPU memory kept free (default 0.05)", NULL},
    {"--stack", "PROFILE", "software stack profile (data/stacks stem or JSON path; default meshplan's)", NULL},
    {"--threads", "N", "worker threads (default: every CPU)", NULL},
    {"--db", "PATH", "SQLite database that logs every candidate (default meshplan.db)", NULL},
    {"--no-db", NULL, "do not write a database", NULL},
    {"--plot", "DIR", "write gnuplot plots (PNG, data, scripts) into DIR (needs gnuplot)", NULL},
    {"--json", NULL, "print the ranked plans as JSON", NULL},
    {"--csv", NULL, "print the ranked plans as CSV", NULL},
    {NULL, NULL, NULL, NULL},
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

static int exit_for(const mp_ctx *ctx, mp_status st) {
  fprintf(stderr, "meshplan plan: %s\n", mp_errmsg(ctx));
  /* A database that cannot be opened is an input problem the user fixes (--db). */
  if (st == MP_ERR_DB || st == MP_ERR_UNSUPPORTED) return 2;
  return mp_status_exit_code(st);
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
  cJSON_AddStringToObject(j, "ac", mp_search_ac_name(c->ac));
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

int mp_cmd_plan(int argc, char **argv) {
  const char *pos[1];
  int n_pos, done;
  int rc = mp_cmd_parse(&k_spec, argc, argv, pos, &n_pos, &done);
  if (done) return rc;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_status st;
  mp_model m;
  mp_cluster c;

  /* ---- what to plan for ---- */
  const char *hf = mp_args_get(&k_spec, "--hf-config");
  const char *model = mp_args_get(&k_spec, "--model");
  if (hf && model) {
    fprintf(stderr, "meshplan plan: give --model or --hf-config, not both\n");
    return 2;
  }
  st = mp_model_load(&ctx, hf ? hf : (model ? model : "llama3.1-8b"), &m);
  if (st != MP_OK) return exit_for(&ctx, st);
  const char *cl = mp_args_get(&k_spec, "--cluster");
  int by_gpus = mp_args_has(&k_spec, "--gpus") || mp_args_has(&k_spec, "--gpu") ||
                mp_args_has(&k_spec, "--gpus-per-node");
  if (cl && by_gpus) {
    fprintf(stderr, "meshplan plan: give --cluster or --gpus/--gpu/--gpus-per-node, not both\n");
    return 2;
  }
  if (by_gpus) {
    long long n = 0, per = 0;
    const char *gpu = mp_args_get(&k_spec, "--gpu");
    if (!mp_args_has(&k_spec, "--gpus") || !gpu) {
      fprintf(stderr, "meshplan plan: --gpus N needs --gpu TYPE (e.g. --gpus 64 --gpu h100-sxm)\n");
      return 2;
    }
    if ((st = mp_args_int(&ctx, &k_spec, "--gpus", 1, &n)) != MP_OK) return exit_for(&ctx, st);
    per = n < 8 ? n : 8;
    if ((st = mp_args_int(&ctx, &k_spec, "--gpus-per-node", 1, &per)) != MP_OK) return exit_for(&ctx, st);
    if (n > MP_MESH_MAX_WORLD) {
      fprintf(stderr, "meshplan plan: --gpus %lld is more than %d\n", n, MP_MESH_MAX_WORLD);
      return 2;
    }
    st = mp_cluster_make(&ctx, gpu, (int)n, (int)per, &c);
  } else {
    st = mp_cluster_load(&ctx, cl ? cl : "h100-8", &c);
  }
  if (st != MP_OK) return exit_for(&ctx, st);

  long long seq = m.max_seq < 8192 ? m.max_seq : 8192, gb = 32, top = 10, threads = 0;
  double headroom = 0.05, price = c.price_per_gpu_hour;
  if ((st = mp_args_int(&ctx, &k_spec, "--seq", 1, &seq)) != MP_OK ||
      (st = mp_args_int(&ctx, &k_spec, "--global-batch", 1, &gb)) != MP_OK ||
      (st = mp_args_int(&ctx, &k_spec, "--top", 0, &top)) != MP_OK ||
      (st = mp_args_int(&ctx, &k_spec, "--threads", 1, &threads)) != MP_OK ||
      (st = mp_args_double(&ctx, &k_spec, "--headroom", 0, &headroom)) != MP_OK ||
      (st = mp_args_double(&ctx, &k_spec, "--price", 0, &price)) != MP_OK)
    return exit_for(&ctx, st);
  if (mp_args_has(&k_spec, "--global-batch-tokens")) {
    long long tokens = 0;
    if (mp_args_has(&k_spec, "--global-batch")) {
      fprintf(stderr, "meshplan plan: give --global-batch or --global-batch-tokens, not both\n");
      return 2;
    }
    if ((st = mp_args_int(&ctx, &k_spec, "--global-batch-tokens", 1, &tokens)) != MP_OK)
      return exit_for(&ctx, st);
    if (tokens % seq) {
      fprintf(stderr, "meshplan plan: --global-batch-tokens %lld is not a multiple of seq %lld; "
                      "use %lld or %lld\n", tokens, seq, tokens / seq * seq, (tokens / seq + 1) * seq);
      return 2;
    }
    gb = tokens / seq;
  }
  if (seq > m.max_seq)
    fprintf(stderr, "meshplan plan: note: seq %lld is longer than %s's max_seq %lld\n", seq, m.name,
            (long long)m.max_seq);
  int as_json = mp_args_has(&k_spec, "--json"), as_csv = mp_args_has(&k_spec, "--csv");
  if (as_json && as_csv) {
    fprintf(stderr, "meshplan plan: give --json or --csv, not both\n");
    return 2;
  }
  mp_objective obj = MP_OBJECTIVE_TIME;
  const char *objs = mp_args_get(&k_spec, "--objective");
  if (objs && (st = mp_objective_parse(&ctx, objs, &obj)) != MP_OK) return exit_for(&ctx, st);
  if (obj == MP_OBJECTIVE_TOKENS_PER_DOLLAR && !(price > 0)) {
    fprintf(stderr, "meshplan plan: --objective tokens-per-dollar needs a price: cluster %s has no "
                    "price_per_gpu_hour; pass --price USD_PER_GPU_HOUR\n", c.name);
    return 2;
  }
  const char *plot_dir = mp_args_get(&k_spec, "--plot");
  if (plot_dir) {
    /* Fail before the search, not after it. */
    if ((st = mp_plot_check_gnuplot(&ctx)) != MP_OK) return exit_for(&ctx, st);
    if ((st = mp_plot_make_dir(&ctx, plot_dir)) != MP_OK) return exit_for(&ctx, st);
  }

  /* ---- the evaluator and the request ---- */
  mp_sim_evaluator *ev = calloc(1, sizeof *ev);
  if (!ev) return exit_for(&ctx, mp_error(&ctx, MP_ERR_NOMEM, "out of memory"));
  st = mp_sim_evaluator_init(&ctx, ev, &m, &c, seq, gb, headroom, mp_args_get(&k_spec, "--stack"));
  if (st != MP_OK) {
    mp_sim_evaluator_free(ev);
    free(ev);
    return exit_for(&ctx, st);
  }
  mp_planner_request req;
  memset(&req, 0, sizeof req);
  mp_search_config_init(&req.search);
  req.search.model = &m;
  req.search.cluster = &c;
  req.search.seq = seq;
  req.search.global_batch = gb;
  req.search.allow_cross_node_tp = mp_args_has(&k_spec, "--allow-cross-node-tp");
  req.search.executable_only = mp_args_has(&k_spec, "--executable-only");
  req.search.n_threads = (int)threads;
  req.search.mem_capacity_bytes = (int64_t)(c.gpu.mem_gib * (1.0 - headroom) * kGiB);
  req.search.eval = mp_sim_evaluate;
  req.search.eval_user = ev;
  req.search.eval_thread_done = mp_sim_evaluator_thread_done;
  const char *fix = mp_args_get(&k_spec, "--fix");
  if (fix && (st = mp_search_fix_parse(&ctx, fix, &req.search.fix)) != MP_OK) {
    mp_sim_evaluator_free(ev);
    free(ev);
    return exit_for(&ctx, st);
  }
  req.objective = obj;
  req.price_per_gpu_hour = price;
  req.show_progress = 1;
  char *opts_json = options_json(), *cmdline = command_line(argc, argv);
  req.info.model = m.name;
  req.info.cluster = c.name;
  req.info.gpu = c.gpu.name;
  req.info.n_gpus = mp_cluster_n_gpus(&c);
  req.info.gpus_per_node = c.gpus_per_node;
  req.info.seq = seq;
  req.info.global_batch = gb;
  req.info.objective = mp_objective_name(obj);
  req.info.options_json = opts_json;
  req.info.command = cmdline;
  req.info.tool_version = MESHPLAN_VERSION;

  mp_store *store = NULL;
  const char *db = mp_args_get(&k_spec, "--db");
  if (!db) db = "meshplan.db";
  int no_db = mp_args_has(&k_spec, "--no-db");
  rc = 0;
  mp_planner_result res;
  memset(&res, 0, sizeof res);
  if (!no_db && (st = mp_store_open(&ctx, db, &store)) != MP_OK) {
    rc = exit_for(&ctx, st);
    goto out;
  }
  if ((st = mp_planner_run(&ctx, &req, store, &res)) != MP_OK) {
    rc = exit_for(&ctx, st);
    goto out;
  }

  /* ---- output ---- */
  const mp_search *s = res.search;
  int64_t n_show = top == 0 || top > res.n_order ? res.n_order : top;
  double show_price = obj == MP_OBJECTIVE_TOKENS_PER_DOLLAR ? price : 0;
  if (as_json) {
    cJSON *root = cJSON_CreateObject(), *plans = cJSON_CreateArray();
    if (root && plans) {
      cJSON_AddStringToObject(root, "model", m.name);
      cJSON_AddStringToObject(root, "cluster", c.name);
      cJSON_AddStringToObject(root, "gpu", c.gpu.name);
      cJSON_AddNumberToObject(root, "n_gpus", mp_cluster_n_gpus(&c));
      cJSON_AddNumberToObject(root, "seq", (double)seq);
      cJSON_AddNumberToObject(root, "global_batch", (double)gb);
      cJSON_AddStringToObject(root, "objective", mp_objective_name(obj));
      cJSON_AddNumberToObject(root, "candidates", (double)s->n);
      cJSON_AddNumberToObject(root, "pruned", (double)s->n_pruned);
      cJSON_AddNumberToObject(root, "simulated", (double)s->n_evaluated);
      cJSON_AddNumberToObject(root, "feasible", (double)s->n_feasible);
      cJSON_AddNumberToObject(root, "failed", (double)s->n_failed);
      cJSON_AddNumberToObject(root, "wall_s", res.wall_s);
      if (store) {
        cJSON_AddStringToObject(root, "db", db);
        cJSON_AddNumberToObject(root, "run_id", (double)res.run_id);
      }
      for (int64_t r = 0; r < n_show; r++) {
        cJSON *pj = plan_json(&s->cands[res.order[r]], r + 1, show_price);
        if (pj) cJSON_AddItemToArray(plans, pj);
      }
      cJSON_AddItemToObject(root, "plans", plans);
      plans = NULL;
      char *text = cJSON_Print(root);
      if (text) printf("%s\n", text);
      free(text);
    }
    cJSON_Delete(root);
    cJSON_Delete(plans);
  } else if (as_csv) {
    printf("rank,dp_replicate,dp_shard,tp,ep,pp,cp,ac,fp8,micro_batch,reshard_after_forward,"
           "step_time_s,tokens_per_s_per_gpu,mfu,peak_mem_bytes,fits,compute_s,exposed_comm_s,"
           "bubble_s,plan_id\n");
    for (int64_t r = 0; r < n_show; r++) {
      const mp_candidate *x = &s->cands[res.order[r]];
      printf("%lld,%d,%d,%d,%d,%d,%d,%s,%d,%lld,%d,%.9g,%.9g,%.6g,%lld,%d,%.9g,%.9g,%.9g,%lld\n",
             (long long)(r + 1), x->mesh.size[MP_DIM_DP_REPLICATE], x->mesh.size[MP_DIM_DP_SHARD],
             x->mesh.size[MP_DIM_TP], x->mesh.ep, x->mesh.size[MP_DIM_PP], x->mesh.size[MP_DIM_CP],
             mp_search_ac_name(x->ac), x->fp8, (long long)x->micro_batch, x->reshard,
             x->res.step_time_s, x->res.tokens_per_s_per_gpu, x->res.mfu,
             (long long)x->res.peak_mem_bytes, x->res.fits, x->res.compute_s, x->res.exposed_comm_s,
             x->res.bubble_s, (long long)x->plan_id);
    }
  } else {
    printf("%s on %s (%d x %s, %d per node), seq %lld, global batch %lld sequences (%lld tokens), "
           "objective %s\n",
           m.name, c.name, mp_cluster_n_gpus(&c), c.gpu.name, c.gpus_per_node, seq, gb, gb * seq,
           mp_objective_name(obj));
    if (n_show > 0) {
      printf("\n%4s %6s %8s %3s %3s %3s %3s  %-9s %3s %3s %7s %10s %10s %6s %8s %4s%s\n", "rank",
             "dp_rep", "dp_shard", "tp", "ep", "pp", "cp", "AC", "fp8", "mb", "reshard",
             "step (s)", "tok/s/GPU", "MFU", "peak GiB", "fits",
             show_price > 0 ? "   tokens/$" : "");
      for (int64_t r = 0; r < n_show; r++) {
        const mp_candidate *x = &s->cands[res.order[r]];
        printf("%4lld %6d %8d %3d %3d %3d %3d  %-9s %3s %3lld %7s %10.4f %10.0f %5.1f%% %8.2f %4s",
               (long long)(r + 1), x->mesh.size[MP_DIM_DP_REPLICATE], x->mesh.size[MP_DIM_DP_SHARD],
               x->mesh.size[MP_DIM_TP], x->mesh.ep, x->mesh.size[MP_DIM_PP], x->mesh.size[MP_DIM_CP],
               mp_search_ac_name(x->ac), x->fp8 ? "yes" : "no", (long long)x->micro_batch,
               x->reshard ? "yes" : "no", x->res.step_time_s, x->res.tokens_per_s_per_gpu,
               100.0 * x->res.mfu, (double)x->res.peak_mem_bytes / kGiB, x->res.fits ? "yes" : "no");
        if (show_price > 0) printf(" %11.4g", mp_tokens_per_dollar(x, show_price));
        printf("\n");
      }
      const mp_candidate *best = &s->cands[res.order[0]];
      if (best->pads_vocab)
        printf("note: the best plan pads the vocabulary (%lld) to a multiple of tp=%d\n",
               (long long)m.vocab, best->mesh.size[MP_DIM_TP]);
    } else {
      printf("\nno plan fits: every candidate was pruned or runs out of memory; try more GPUs, "
             "--headroom 0, a smaller --seq or --global-batch\n");
    }
    printf("\ncandidates: %lld enumerated, %lld pruned, %lld simulated (%lld fit, %lld failed) in "
           "%.2f s\n",
           (long long)s->n, (long long)s->n_pruned, (long long)s->n_evaluated,
           (long long)s->n_feasible, (long long)s->n_failed, res.wall_s);
    print_reject_summary(stdout, s);
    if (store)
      printf("database: %s (run %lld; meshplan report --db %s --run %lld)\n", db,
             (long long)res.run_id, db, (long long)res.run_id);
    else
      printf("database: none (--no-db)\n");
  }

  /* ---- plots ---- */
  if (plot_dir) {
    char title[512];
    snprintf(title, sizeof title, "%s on %s (%d x %s), seq %lld, global batch %lld", m.name, c.name,
             mp_cluster_n_gpus(&c), c.gpu.name, seq, gb);
    double cap_gib = c.gpu.mem_gib * (1.0 - headroom);
    for (int64_t i = 0; i < s->n; i++)
      if (s->cands[i].evaluated && s->cands[i].res.capacity_bytes > 0) {
        cap_gib = (double)s->cands[i].res.capacity_bytes / kGiB;
        break;
      }
    st = mp_plot_candidates(&ctx, plot_dir, s, res.order, res.n_order, cap_gib, title);
    if (st == MP_OK)
      st = mp_plot_memory(&ctx, plot_dir, s, res.order, res.n_order,
                          (int)(n_show > 0 && n_show < 10 ? n_show : 10), cap_gib, title);
    if (st == MP_OK && res.n_order > 0) {
      const mp_candidate *best = &s->cands[res.order[0]];
      char trace[1024], mesh[128], ttl[800];
      snprintf(trace, sizeof trace, "%s/timeline_trace.json", plot_dir);
      st = mp_sim_evaluator_trace(&ctx, ev, best, trace);
      mp_candidate_mesh_str(best, mesh, sizeof mesh);
      snprintf(ttl, sizeof ttl, "simulated step of the chosen plan, rank 0: %s, ac=%s%s, micro-batch %lld (%s)",
               mesh, mp_search_ac_name(best->ac), best->fp8 ? ", fp8" : "",
               (long long)best->micro_batch, m.name);
      if (st == MP_OK) st = mp_plot_timeline(&ctx, plot_dir, trace, ttl);
    }
    if (st != MP_OK) {
      rc = exit_for(&ctx, st);
      goto out;
    }
    if (!as_json && !as_csv)
      printf("plots: %s/candidates.png, %s/memory.png%s%s%s (with .dat data and .gp scripts)\n",
             plot_dir, plot_dir, res.n_order > 0 ? ", " : "", res.n_order > 0 ? plot_dir : "",
             res.n_order > 0 ? "/timeline.png" : "");
  }
out:
  mp_planner_result_free(&res);
  mp_store_close(store);
  mp_sim_evaluator_free(ev);
  free(ev);
  free(opts_json);
  free(cmdline);
  return rc;
}
