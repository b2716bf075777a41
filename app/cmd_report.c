/* meshplan report: reads the planner's database. Without --run it lists the runs (newest
 * first) with each run's status (complete; for training runs also diverged or incomplete:
 * killed or still running; failed); with --run ID it prints that run's top plans with
 * their predictions and, for plans the executor has measured, the measured figures beside
 * the predicted ones with the error (predicted - measured) / measured, and the training
 * curve's ends (one curve across the processes of a resumed run, each process's segment
 * listed with its mesh and the step it resumed from); --plot DIR draws the run's measured
 * loss (training and validation) and throughput against the step with gnuplot, with the
 * plan's predicted throughput and the steps where the run resumed from a checkpoint. The
 * database is opened, never created: a
 * missing file is an error naming it. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/commands.h"
#include "common/stats.h"
#include "app/import_log.h"
#include "exec/mesh.h"
#include "planner/plot.h"
#include "planner/report.h"
#include "planner/search.h"
#include "planner/store.h"

static mp_opt k_opts[] = {
    MP_OPT_DB("to read, as meshplan plan wrote it (default meshplan.db)"),
    {"--run", "ID", "show this run's top plans (default: list the runs)", NULL},
    MP_OPT_TOP(" for --run"),
    {"--plot", "DIR", "with --run: draw the measured loss (training, validation) and tokens/s against the step "
     "into DIR/loss.png and DIR/throughput.png (gnuplot)", NULL},
    {"--import-log", "FILE", "with --run: store the step lines of a torchtitan or Megatron-LM training log (loss, "
     "step time, tokens/s, memory) as measurements of the run's plan of --plan-rank, shown beside its "
     "prediction by report --run", NULL},
    {"--plan-rank", "K", "with --import-log: the plan's rank in the run (default 1)", NULL},
    MP_OPT_JSON("the runs, or the run's plans,"),
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {"report",
                             "List planner runs, or one run's top plans with predicted vs measured figures.",
                             "[--db PATH] [--run ID [--plot DIR | --import-log FILE [--plan-rank K]]] [--top K] [--json]", k_opts, 0};

/* The word for a run's devices: the CPU profile's ranks are processes, not GPUs. */
static const char *device_word(const char *gpu, int n) {
  if (strcmp(gpu, "cpu") == 0) return n == 1 ? "CPU rank" : "CPU ranks";
  return n == 1 ? "GPU" : "GPUs";
}

/* Bytes in the unit that keeps three figures ("12.3 MiB", "71.66 GiB"): a CPU run's few
 * megabytes are not "0.00 GiB". */
static void fmt_mem(double b, char *buf, size_t cap) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024.0 && i < 4) {
    b /= 1024.0;
    i++;
  }
  if (i == 0) snprintf(buf, cap, "%.0f B", b);
  else snprintf(buf, cap, "%.*f %s", b < 10 ? 2 : b < 100 ? 1 : 0, b, u[i]);
}

/* Seconds in the unit that keeps four figures ("1.234 ms", "64.47 s"). */
static void fmt_s(double t, char *buf, size_t cap) {
  if (t < 1e-3) snprintf(buf, cap, "%.1f us", t * 1e6);
  else if (t < 1.0) snprintf(buf, cap, "%.3f ms", t * 1e3);
  else snprintf(buf, cap, "%.4g s", t);
}

static int fail(const mp_ctx *ctx, mp_status st) { return mp_cmd_fail(ctx, st); }

/* ---- routed-expert loads ----------------------------------------------------------------- */

/* One MoE layer's loads over a training run: per step the imbalance factor, the most
 * assignments routed to one expert over their mean over the layer's experts (1: balanced;
 * E: every assignment to one expert), its min, median and max over the steps; the expert
 * routed the most assignments over the run and its share of them; the share of the run's
 * assignments dropped over an expert's capacity. */
typedef struct layer_loads {
  int layer, hottest, n_steps;
  double imb_min, imb_median, imb_max, hottest_share, dropped_frac;
} layer_loads;

/* The layer whose rows start at r[0] (rows sorted by layer, step, expert, as
 * mp_store_run_expert_loads gives them) into *out; returns the rows it spans. */
static int64_t summarize_layer(const mp_expert_load_row *r, int64_t n, mp_arena *a, layer_loads *out) {
  int64_t end = 0, routed_all = 0, dropped_all = 0;
  int n_experts = 0;
  while (end < n && r[end].layer == r[0].layer) {
    if (r[end].expert + 1 > n_experts) n_experts = r[end].expert + 1;
    end++;
  }
  int64_t *per_expert = mp_arena_alloc(a, (size_t)n_experts * sizeof *per_expert);
  double *imb = mp_arena_alloc(a, (size_t)end * sizeof *imb);
  memset(out, 0, sizeof *out);
  out->layer = r[0].layer;
  if (!per_expert || !imb) return end;
  memset(per_expert, 0, (size_t)n_experts * sizeof *per_expert);
  size_t k = 0;
  for (int64_t i = 0; i < end;) {
    int64_t j = i, sum = 0, max = 0;
    for (; j < end && r[j].step == r[i].step; j++) {
      sum += r[j].routed;
      max = r[j].routed > max ? r[j].routed : max;
      per_expert[r[j].expert] += r[j].routed;
      dropped_all += r[j].dropped;
    }
    routed_all += sum;
    if (sum > 0) imb[k++] = (double)max * n_experts / (double)sum;
    i = j;
  }
  for (int e = 1; e < n_experts; e++)
    if (per_expert[e] > per_expert[out->hottest]) out->hottest = e;
  out->n_steps = (int)k;
  for (size_t i = 0; i < k; i++) {
    out->imb_min = i == 0 || imb[i] < out->imb_min ? imb[i] : out->imb_min;
    out->imb_max = imb[i] > out->imb_max ? imb[i] : out->imb_max;
  }
  out->imb_median = k ? mp_median(imb, k) : 0;
  out->hottest_share = routed_all ? (double)per_expert[out->hottest] / (double)routed_all : 0;
  out->dropped_frac = routed_all ? (double)dropped_all / (double)routed_all : 0;
  return end;
}

/* The run's layers' summaries (arena array *out, *n_out layers; 0 when it has no loads). */
static mp_status run_layer_loads(mp_ctx *ctx, mp_store *st, mp_arena *a, int64_t run_id, layer_loads **out,
                                 int *n_out) {
  mp_expert_load_row *rows = NULL;
  int64_t n = 0;
  *n_out = 0;
  MP_CHECK(mp_store_run_expert_loads(ctx, st, run_id, a, &rows, &n));
  *out = mp_arena_alloc(a, (size_t)(n ? n : 1) * sizeof **out);
  MP_CHECK_ALLOC(ctx, *out);
  for (int64_t i = 0; i < n;) i += summarize_layer(rows + i, n - i, a, &(*out)[(*n_out)++]);
  return MP_OK;
}

static void print_layer_loads(const layer_loads *s, int n) {
  printf("\nrouted experts (tokens routed per expert, each step summed over the ranks):\n");
  printf("  %5s %5s  %-27s  %-16s %8s\n", "layer", "steps", "imbalance min median max", "hottest expert",
         "dropped");
  for (int i = 0; i < n; i++) {
    char imb[64], hot[32];
    snprintf(imb, sizeof imb, "%.2f %.2f %.2f", s[i].imb_min, s[i].imb_median, s[i].imb_max);
    snprintf(hot, sizeof hot, "%d (%.1f %%)", s[i].hottest, 100.0 * s[i].hottest_share);
    printf("  %5d %5d  %-27s  %-16s %7.2f%%\n", s[i].layer, s[i].n_steps, imb, hot, 100.0 * s[i].dropped_frac);
  }
  printf("imbalance: per step the most tokens one expert was routed over the mean per expert (1.00: balanced), "
         "min, median and max over the steps; hottest: the expert routed the most over the run, its share; "
         "dropped: the share of the routed tokens over an expert's capacity (train --moe-capacity-factor)\n");
}

static cJSON *layer_loads_json(const layer_loads *s, int n) {
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; i < n && arr; i++) {
    cJSON *j = cJSON_CreateObject();
    if (!j) break;
    cJSON_AddNumberToObject(j, "layer", s[i].layer);
    cJSON_AddNumberToObject(j, "steps", s[i].n_steps);
    cJSON_AddNumberToObject(j, "imbalance_min", s[i].imb_min);
    cJSON_AddNumberToObject(j, "imbalance_median", s[i].imb_median);
    cJSON_AddNumberToObject(j, "imbalance_max", s[i].imb_max);
    cJSON_AddNumberToObject(j, "hottest_expert", s[i].hottest);
    cJSON_AddNumberToObject(j, "hottest_share", s[i].hottest_share);
    cJSON_AddNumberToObject(j, "dropped_fraction", s[i].dropped_frac);
    cJSON_AddItemToArray(arr, j);
  }
  return arr;
}


static double pct_err(double predicted, double measured) {
  return measured != 0 ? 100.0 * (predicted - measured) / measured : 0;
}

static int list_runs(mp_store *st, mp_arena *a, int as_json) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_run_row *runs = NULL;
  int64_t n = 0;
  mp_status s = mp_store_list_runs(&ctx, st, a, &runs, &n);
  if (s != MP_OK) return fail(&ctx, s);
  if (as_json) {
    cJSON *arr = cJSON_CreateArray();
    for (int64_t i = 0; arr && i < n; i++) {
      const mp_run_row *r = &runs[i];
      cJSON *j = cJSON_CreateObject();
      if (!j) break;
      cJSON_AddNumberToObject(j, "id", (double)r->id);
      cJSON_AddStringToObject(j, "created_at", r->created_at);
      cJSON_AddStringToObject(j, "model", r->model);
      cJSON_AddStringToObject(j, "cluster", r->cluster);
      cJSON_AddNumberToObject(j, "n_gpus", r->n_gpus);
      cJSON_AddNumberToObject(j, "seq", (double)r->seq);
      cJSON_AddNumberToObject(j, "global_batch", (double)r->global_batch);
      cJSON_AddStringToObject(j, "objective", r->objective);
      cJSON_AddStringToObject(j, "status", r->status);
      cJSON_AddNumberToObject(j, "candidates", (double)r->n_candidates);
      cJSON_AddNumberToObject(j, "simulated", (double)r->n_evaluated);
      cJSON_AddNumberToObject(j, "feasible", (double)r->n_feasible);
      if (r->best_plan_id) cJSON_AddNumberToObject(j, "best_step_time_s", r->best_step_time_s);
      cJSON_AddItemToArray(arr, j);
    }
    mp_cmd_print_json(arr);
    return 0;
  }
  if (n == 0) {
    printf("%s holds no runs yet; run meshplan plan --db %s\n", mp_store_path(st), mp_store_path(st));
    return 0;
  }
  printf("%4s  %-20s  %-18s  %-12s %-16s %6s %6s %10s %9s %8s %10s  %s\n", "run", "when (UTC)", "model",
         "cluster", "devices", "seq", "batch", "candidates", "simulated", "feasible", "best step", "status");
  for (int64_t i = 0; i < n; i++) {
    const mp_run_row *r = &runs[i];
    char best[32] = "-", dev[48], when[sizeof r->created_at * 4], model[sizeof r->model * 4],
                                  cluster[sizeof r->cluster * 4];
    if (r->best_plan_id) fmt_s(r->best_step_time_s, best, sizeof best);
    snprintf(dev, sizeof dev, "%d %s", r->n_gpus, device_word(r->gpu, r->n_gpus));
    printf("%4lld  %-20s  %-18s  %-12s %-16s %6lld %6lld %10lld %9lld %8lld %10s  %s\n", (long long)r->id,
           MP_CMD_CELL(r->created_at, when), MP_CMD_CELL(r->model, model), MP_CMD_CELL(r->cluster, cluster), dev,
           (long long)r->seq, (long long)r->global_batch, (long long)r->n_candidates, (long long)r->n_evaluated,
           (long long)r->n_feasible, best, r->status);
  }
  printf("\nmeshplan report --db %s --run ID shows a run's top plans\n", mp_store_path(st));
  return 0;
}

/* One run's plans (p[0..n)) as JSON, with the measured figures where there are some, and
 * a training run's routed-expert loads (ll[0..nll)). */
static void print_run_json(const mp_run_row *run, const mp_plan_row *p, int64_t n, const layer_loads *ll,
                           int nll) {
  cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
  if (!root || !arr) {
    cJSON_Delete(root);
    cJSON_Delete(arr);
    return;
  }
  cJSON_AddNumberToObject(root, "run", (double)run->id);
  cJSON_AddStringToObject(root, "model", run->model);
  cJSON_AddStringToObject(root, "cluster", run->cluster);
  cJSON_AddStringToObject(root, "status", run->status);
  for (int64_t i = 0; i < n; i++) {
    cJSON *j = cJSON_CreateObject();
    if (!j) break;
    cJSON_AddNumberToObject(j, "rank", (double)p[i].rank);
    cJSON_AddNumberToObject(j, "plan_id", (double)p[i].id);
    cJSON_AddNumberToObject(j, "dp_replicate", p[i].dp_replicate);
    cJSON_AddNumberToObject(j, "dp_shard", p[i].dp_shard);
    cJSON_AddNumberToObject(j, "tp", p[i].tp);
    cJSON_AddNumberToObject(j, "ep", p[i].ep);
    cJSON_AddNumberToObject(j, "pp", p[i].pp);
    cJSON_AddNumberToObject(j, "cp", p[i].cp);
    mp_mesh m;
    mp_plan_row_mesh(&p[i], &m);
    cJSON_AddNumberToObject(j, "etp", mp_mesh_grid_etp(&m)); /* as plan --json's mesh.etp */
    cJSON_AddNumberToObject(j, "dopt", mp_mesh_dopt(&m));
    char mesh[128];
    mp_mesh_format(&m, mesh, sizeof mesh);
    cJSON_AddStringToObject(j, "mesh", mesh);
    cJSON_AddStringToObject(j, "ac", mp_search_ac_name(p[i].ac));
    cJSON_AddBoolToObject(j, "fp8", p[i].fp8);
    cJSON_AddNumberToObject(j, "micro_batch", (double)p[i].micro_batch);
    /* the settings it was predicted under (planner/store.h, version 11) */
    if (p[i].stack[0]) cJSON_AddStringToObject(j, "stack", p[i].stack);
    else cJSON_AddNullToObject(j, "stack");
    cJSON_AddNumberToObject(j, "loss_chunks", p[i].loss_chunks);
    cJSON_AddNumberToObject(j, "nccl_version", p[i].nccl_version);
    cJSON_AddNumberToObject(j, "moe_imbalance", p[i].moe_imbalance);
    cJSON_AddNumberToObject(j, "moe_capacity_factor", p[i].moe_capacity_factor);
    if (p[i].fp8_recipe[0]) cJSON_AddStringToObject(j, "fp8_recipe", p[i].fp8_recipe);
    else cJSON_AddNullToObject(j, "fp8_recipe");
    if (p[i].mtp_layers >= 0) cJSON_AddNumberToObject(j, "mtp_layers", p[i].mtp_layers);
    else cJSON_AddNullToObject(j, "mtp_layers");
    cJSON_AddNumberToObject(j, "step_time_s", p[i].step_time_s);
    cJSON_AddNumberToObject(j, "peak_mem_bytes", (double)p[i].peak_mem_bytes);
    if (p[i].n_measured) {
      cJSON_AddNumberToObject(j, "measured_steps", (double)p[i].n_measured);
      cJSON_AddNumberToObject(j, "measured_step_time_s", p[i].measured_step_time_s);
      cJSON_AddNumberToObject(j, "step_time_error_pct", pct_err(p[i].step_time_s, p[i].measured_step_time_s));
      cJSON_AddNumberToObject(j, "predicted_alloc_peak_bytes", (double)p[i].alloc_peak_bytes);
      cJSON_AddNumberToObject(j, "measured_peak_mem_bytes", (double)p[i].measured_peak_mem_bytes);
      cJSON_AddNumberToObject(j, "peak_mem_error_pct",
                              pct_err((double)p[i].alloc_peak_bytes, (double)p[i].measured_peak_mem_bytes));
    }
    cJSON_AddItemToArray(arr, j);
  }
  cJSON_AddItemToObject(root, "plans", arr);
  if (nll > 0) cJSON_AddItemToObject(root, "expert_loads", layer_loads_json(ll, nll));
  mp_cmd_print_json(root);
}

static int show_run(mp_store *st, mp_arena *a, int64_t run_id, int64_t top, int as_json) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_run_row run;
  mp_status s = mp_store_get_run(&ctx, st, run_id, &run);
  if (s != MP_OK) return fail(&ctx, s);
  mp_plan_row *p = NULL;
  int64_t n = 0;
  if ((s = mp_store_top_plans(&ctx, st, run_id, top, a, &p, &n)) != MP_OK) return fail(&ctx, s);
  if (as_json) {
    layer_loads *ll = NULL;
    int nll = 0;
    if ((s = run_layer_loads(&ctx, st, a, run_id, &ll, &nll)) != MP_OK) return fail(&ctx, s);
    print_run_json(&run, p, n, ll, nll);
    return 0;
  }
  char when[sizeof run.created_at * 4], model[sizeof run.model * 4], cluster[sizeof run.cluster * 4],
      objective[sizeof run.objective * 4];
  printf("run %lld (%s): %s on %s (%d %s), seq %lld, global batch %lld, objective %s, %s\n", (long long)run.id,
         MP_CMD_CELL(run.created_at, when), MP_CMD_CELL(run.model, model), MP_CMD_CELL(run.cluster, cluster),
         run.n_gpus,
         device_word(run.gpu, run.n_gpus), (long long)run.seq, (long long)run.global_batch,
         MP_CMD_CELL(run.objective, objective), run.status);
  printf("%lld candidates, %lld pruned, %lld simulated, %lld feasible\n", (long long)run.n_candidates,
         (long long)run.n_pruned, (long long)run.n_evaluated, (long long)run.n_feasible);
  if (n == 0) {
    printf("\nno feasible plan in this run\n");
    return 0;
  }
  char settings[160]; /* one search's: its ranked plans share them */
  mp_plan_row_settings_str(&p[0], settings, sizeof settings);
  printf("predicted under %s\n\n", settings);
  int any_measured = 0;
  for (int64_t i = 0; i < n; i++) any_measured |= p[i].n_measured > 0;
  const char *per = strcmp(run.gpu, "cpu") == 0 ? "peak/rank" : "peak/GPU";
  printf("%4s %7s %6s %8s %3s %3s %3s %3s  %-14s %3s %3s %10s %10s %5s", "rank", "plan", "dp_rep",
         "dp_shard", "tp", "ep", "pp", "cp", "AC", "fp8", "mb", "step", per, "MFU");
  if (any_measured)
    printf(" | %5s %12s %7s %13s %7s", "steps", "measured", "err %", "measured peak", "err %");
  printf("\n");
  int grid = 0, dopt = 0;
  for (int64_t i = 0; i < n; i++) {
    const mp_plan_row *r = &p[i];
    char step[32], peak[32], mstep[32], mpeak[32], dpr[24], ep[16];
    mp_mesh m;
    mp_plan_row_mesh(r, &m);
    dopt |= mp_mesh_dp_rep_str(&m, dpr, sizeof dpr);
    mp_mesh_ep_str(&m, ep, sizeof ep);
    grid |= mp_mesh_expert_grid(&m);
    fmt_s(r->step_time_s, step, sizeof step);
    fmt_mem((double)r->peak_mem_bytes, peak, sizeof peak);
    printf("%4lld %7lld %6s %8d %3d %3s %3d %3d  %-14s %3s %3lld %10s %10s %4.1f%%", (long long)r->rank,
           (long long)r->id, dpr, r->dp_shard, r->tp, ep, r->pp, r->cp,
           mp_search_ac_name(r->ac), r->fp8 ? "yes" : "no", (long long)r->micro_batch, step, peak, 100.0 * r->mfu);
    fmt_s(r->measured_step_time_s, mstep, sizeof mstep);
    fmt_mem((double)r->measured_peak_mem_bytes, mpeak, sizeof mpeak);
    if (r->n_measured)
      printf(" | %5lld %12s %+7.1f %13s %+7.1f", (long long)r->n_measured, mstep,
             pct_err(r->step_time_s, r->measured_step_time_s), mpeak,
             pct_err((double)r->alloc_peak_bytes, (double)r->measured_peak_mem_bytes));
    else if (any_measured)
      printf(" | %5s", "-");
    printf("\n");
  }
  mp_cmd_plan_table_notes(grid, 0, dopt);
  if (any_measured)
    printf("\nmeasured: median step time over the measured steps, largest peak; err = (predicted - "
           "measured) / measured, for memory the predicted allocation peak (the peak less the "
           "stack's runtime overhead and fragmentation) against the tracked allocator's\n");
  return 0;
}

/* A training run that went on across processes (resumed after a kill, on the same mesh or
 * another): one row per process's plan, the resume marked where a segment starts. */
static void print_segments(const mp_run_segment *seg, int64_t n) {
  printf("segments: one run across %lld processes (a step run twice shows its last record)\n", (long long)n);
  printf("  %7s %6s  %-28s %11s  %s\n", "segment", "plan", "mesh", "micro-batch", "steps");
  for (int64_t i = 0; i < n; i++) {
    const mp_run_segment *r = &seg[i];
    mp_mesh m;
    mp_run_segment_mesh(r, &m);
    char mesh[128], resumed[64] = "";
    mp_mesh_format(&m, mesh, sizeof mesh);
    if (i > 0) snprintf(resumed, sizeof resumed, ", resumed from step %lld", (long long)(r->first_step - 1));
    printf("  %7lld %6lld  %-28s %11lld  %lld..%lld%s\n", (long long)(i + 1), (long long)r->plan_id, mesh,
           (long long)r->micro_batch, (long long)r->first_step, (long long)r->last_step, resumed);
  }
}

/* The restarts of an elastic run (train --elastic): what failed, what it resumed on, what
 * it cost. */
static void print_restarts(const mp_restart_row *r, int64_t n) {
  printf("restarts: %lld (train --elastic)\n", (long long)n);
  printf("  %7s  %-20s %-20s %8s %7s %5s %10s  %s\n", "attempt", "failed mesh", "resumed mesh", "failed@", "resumed",
         "lost", "recover_s", "reason");
  for (int64_t i = 0; i < n; i++)
    printf("  %7lld  %-20s %-20s %8lld %7lld %5lld %10.2f  %s\n", (long long)r[i].attempt, r[i].old_mesh,
           r[i].new_mesh, (long long)r[i].failed_after_step, (long long)r[i].step_resumed,
           (long long)r[i].steps_lost, r[i].recover_s, r[i].reason);
}

/* The curve's line: its ends over the steps with a training loss and the last validation
 * loss; a run of train --eval-only has no training step, and its line says what it
 * measured. Returns the number of training steps. */
static int64_t print_curve(const mp_step_row *rows, int64_t n, const char *status) {
  const mp_step_row *first = NULL, *last = NULL, *last_eval = NULL;
  int64_t steps = 0;
  for (int64_t i = 0; i < n; i++) {
    if (rows[i].has_loss) {
      if (!first) first = &rows[i];
      last = &rows[i];
      steps++;
    }
    if (rows[i].has_eval) last_eval = &rows[i];
  }
  if (steps == 0 && last_eval) {
    printf("\nevaluation (train --eval-only): validation loss %.4f of the weights at step %lld (%s)\n",
           last_eval->eval_loss, (long long)last_eval->step, status);
    return 0;
  }
  if (steps == 0) return 0;
  printf("\ntraining: %lld measured step%s, loss %.4f at step %lld -> %.4f at step %lld", (long long)steps,
         steps == 1 ? "" : "s", first->loss, (long long)first->step, last->loss, (long long)last->step);
  if (last_eval) printf(", validation loss %.4f at step %lld", last_eval->eval_loss, (long long)last_eval->step);
  printf(" (%s)\n", status);
  return steps;
}

/* The run's measured steps: the curve's ends on stdout, and with dir its plots. */
static int show_training(mp_store *st, mp_arena *a, const mp_run_row *run, const char *dir) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_step_row *rows = NULL;
  int64_t n = 0;
  mp_status s = mp_store_run_steps(&ctx, st, run->id, a, &rows, &n);
  if (s != MP_OK) return fail(&ctx, s);
  if (n == 0) {
    if (!dir) return 0;
    return fail(&ctx, mp_error(&ctx, MP_ERR_NOT_FOUND, "run %lld has no measured steps to plot; train with "
                               "meshplan train --db %s", (long long)run->id, mp_store_path(st)));
  }
  const int64_t steps = print_curve(rows, n, run->status);
  mp_run_segment *seg = NULL;
  int64_t ns = 0;
  if ((s = mp_store_run_segments(&ctx, st, run->id, a, &seg, &ns)) != MP_OK) return fail(&ctx, s);
  if (ns > 1) print_segments(seg, ns);
  mp_restart_row *rs = NULL;
  int64_t nr = 0;
  if ((s = mp_store_run_restarts(&ctx, st, run->id, a, &rs, &nr)) != MP_OK) return fail(&ctx, s);
  if (nr > 0) print_restarts(rs, nr);
  layer_loads *ll = NULL;
  int nll = 0;
  if ((s = run_layer_loads(&ctx, st, a, run->id, &ll, &nll)) != MP_OK) return fail(&ctx, s);
  if (nll > 0) print_layer_loads(ll, nll);
  if (!dir) return 0;
  if (steps == 0)
    return fail(&ctx, mp_error(&ctx, MP_ERR_INVALID, "run %lld is an evaluation (train --eval-only), not a training "
                               "curve: there is nothing to plot", (long long)run->id));
  mp_plot_step *ps = mp_arena_alloc(a, (size_t)n * sizeof *ps);
  if (!ps) return fail(&ctx, mp_error(&ctx, MP_ERR_NOMEM, "out of memory"));
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++)
    if (rows[i].has_loss)
      ps[k++] = (mp_plot_step){rows[i].step, rows[i].loss, rows[i].tokens_per_s, rows[i].has_eval, rows[i].eval_loss};
  char title[256], model[sizeof run->model * 4];
  snprintf(title, sizeof title, "run %lld: %s, %s", (long long)run->id, MP_CMD_CELL(run->model, model),
           run->status);
  /* the prediction is per GPU (or CPU rank), the measured tokens/s over all of them */
  mp_plot_training_marks marks = {0, NULL, 0};
  int64_t *resumed = NULL;
  double pred = 0;
  if ((s = mp_store_run_marks(&ctx, st, run->id, a, &pred, &resumed, &marks.n_resumed)) != MP_OK)
    return fail(&ctx, s);
  marks.predicted_tokens_per_s = pred * run->n_gpus;
  marks.resumed_at = resumed;
  if ((s = mp_plot_make_dir(&ctx, dir)) != MP_OK || (s = mp_plot_training(&ctx, dir, ps, k, &marks, title)) != MP_OK)
    return fail(&ctx, s);
  printf("plots: %s/loss.png, %s/throughput.png\n", dir, dir);
  return 0;
}

static int run_report(mp_ctx *ctx, const mp_cmd_call *call) {
  (void)call;
  mp_status s;
  long long run_id = 0, top = MP_OPT_TOP_DEFAULT;
  if ((s = mp_args_int(ctx, &k_spec, "--run", 1, INT64_MAX, &run_id)) != MP_OK ||
      (s = mp_args_int(ctx, &k_spec, "--top", 0, INT32_MAX, &top)) != MP_OK)
    return fail(ctx, s);
  const char *db = mp_cmd_db_path(&k_spec);
  if (access(db, F_OK) != 0)
    return fail(ctx, mp_error(ctx, MP_ERR_NOT_FOUND, "no database at %s; run meshplan plan first or pass --db PATH",
                              db));
  mp_store *st = NULL;
  if ((s = mp_store_open(ctx, db, &st)) != MP_OK) return fail(ctx, s);
  mp_arena *a = mp_arena_create();
  if (!a) {
    mp_store_close(st);
    return fail(ctx, mp_error(ctx, MP_ERR_NOMEM, "out of memory"));
  }
  int as_json = mp_args_has(&k_spec, "--json");
  const char *plot = mp_args_get(&k_spec, "--plot");
  int rc;
  if (plot && !mp_args_has(&k_spec, "--run")) {
    fprintf(stderr, "meshplan report: --plot draws one run's curves; add --run ID (meshplan report lists them)\n");
    rc = 2;
  } else if (mp_args_has(&k_spec, "--import-log") || mp_args_has(&k_spec, "--plan-rank")) {
    long long rank = 1;
    char line[2048];
    if ((s = mp_args_int(ctx, &k_spec, "--plan-rank", 1, INT32_MAX, &rank)) == MP_OK && !mp_args_has(&k_spec, "--run"))
      s = mp_error(ctx, MP_ERR_USAGE, "--import-log stores the log as measurements of a run's plan; add --run ID");
    if (s == MP_OK && !mp_args_has(&k_spec, "--import-log"))
      s = mp_error(ctx, MP_ERR_USAGE, "--plan-rank names the plan --import-log measures; add --import-log FILE");
    if (s == MP_OK)
      s = mp_import_log_store(ctx, st, a, run_id, rank, mp_args_get(&k_spec, "--import-log"), line, sizeof line);
    rc = s == MP_OK ? 0 : fail(ctx, s);
    if (s == MP_OK) printf("%s\n", line);
  } else if (mp_args_has(&k_spec, "--run")) {
    rc = show_run(st, a, run_id, top, as_json);
    if (rc == 0 && !as_json) {
      mp_run_row run;
      mp_ctx c2;
      mp_ctx_init(&c2);
      rc = mp_store_get_run(&c2, st, run_id, &run) == MP_OK ? show_training(st, a, &run, plot) : fail(&c2, c2.last);
    }
  } else {
    rc = list_runs(st, a, as_json);
  }
  mp_arena_destroy(a);
  mp_store_close(st);
  return rc;
}

const mp_command mp_command_report = {&k_spec, "list planner runs and predicted vs measured figures from the database",
                                      run_report};
