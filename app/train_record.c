/* meshplan train: what a run records (train_job.h lists train's files): the --metrics
 * file, the database's steps and run status, --profile's table of measured against
 * predicted time, and, when a run fails before it recorded anything, the removal of the
 * empty files it made.
 *
 * Invariants: only rank 0 writes either record (the ranks agree on its status,
 * mp_runtime_agree); a metrics file or database this process created is removed when the
 * run fails before its first record, so a failed start leaves no empty file beside the
 * user's; one that existed before is never removed. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/file.h"
#include "common/json.h"
#include "app/elastic.h"
#include "app/train_job.h"

/* ---- --profile ------------------------------------------------------------------------------ */

/* One row of --profile's table: measured and predicted per step, the error where both
 * are there. */
static void profile_row(const char *name, double m_s, double m_calls, double p_s, double p_calls, int has_pred) {
  char mc[16] = "", pc[16] = ""; /* calls, left blank on the total rows (< 0) */
  if (m_calls >= 0) snprintf(mc, sizeof mc, "%.1f", m_calls);
  if (p_calls >= 0) snprintf(pc, sizeof pc, "%.1f", p_calls);
  printf("  %-24s %9s %12.3f", name, mc, m_s * 1e3);
  if (has_pred)
    printf(" %9s %12.3f", pc, p_s * 1e3);
  else
    printf(" %9s %12s", "-", "-");
  if (has_pred && m_s > 0 && p_s > 0)
    printf(" %+7.1f%%", 100.0 * (p_s - m_s) / m_s);
  printf("\n");
}

/* --profile's table: rank 0's time per step by kernel class and collective group, beside
 * the simulator's busy time of the same plan's rank 0 (both per step, kernel launch
 * overhead included). Collectives are busy time, overlapped or not. */
void mp_train_print_profile(const mp_kprof *kp, const mp_comm_prof *cp, long long steps, const train_pick *pick,
                            int cuda) {
  const int pred = pick->have_busy;
  const double n = (double)steps;
  printf("profile of rank 0, per step (mean of %lld step%s%s): each kernel timed alone%s; collectives timed on the "
         "host%s; predicted: the simulator's busy time for the same plan%s\n",
         steps, steps == 1 ? "" : "s", steps > 1 ? " after the first" : "",
         cuda ? " with the device synchronized around it (the profiled steps run slower)" : "",
         cuda ? " (NCCL: the time to enqueue them)" : "", pred ? "" : " (none: no prediction for this run)");
  printf("  %-24s %9s %12s %9s %12s %8s\n", "class", "calls", "measured ms", "calls", "predicted ms", "error");
  double mk = 0, pk = 0;
  for (int k = 0; k < MP_KPROF_COUNT; k++) {
    const int costed = k < MP_KERNEL_COUNT;
    const double ms = kp->seconds[k] / n, mc = (double)kp->calls[k] / n;
    const double ps = costed && pred ? pick->busy.kernel_s[k] : 0.0;
    const double pc = costed && pred ? (double)pick->busy.kernel_n[k] : 0.0;
    if (mc == 0 && pc == 0) continue;
    char name[48];
    snprintf(name, sizeof name, "%s%s", mp_kprof_class_name(k), costed ? "" : " (not costed)");
    profile_row(name, ms, mc, ps, pc, pred && costed);
    mk += ms;
    pk += ps;
  }
  profile_row("kernels", mk, -1, pk, -1, pred);
  double mc_all = 0, pc_all = 0;
  for (int g = 0; g < MP_GROUP_COUNT; g++) {
    const double ms = cp->seconds[g] / n, mc = (double)cp->calls[g] / n;
    const double ps = pred ? pick->busy.comm_s[g] : 0.0, pc = pred ? (double)pick->busy.comm_n[g] : 0.0;
    if (mc == 0 && pc == 0) continue;
    char name[48];
    snprintf(name, sizeof name, "collectives %s", mp_group_name((mp_group)g));
    profile_row(name, ms, mc, ps, pc, pred);
    mc_all += ms;
    pc_all += ps;
  }
  if (mc_all > 0 || pc_all > 0) profile_row("collectives", mc_all, -1, pc_all, -1, pred);
  /* the schedule counts an FSDP unit's gather or reduce-scatter as one op; the runtime
   * issues it one parameter tensor at a time: the unit ops are the comparable count */
  for (int g = 0; g < MP_GROUP_COUNT; g++)
    if (cp->unit_ops[g] > 0 && cp->unit_ops[g] != cp->calls[g])
      printf("  (collectives %s: the runtime gathers and reduce-scatters an FSDP unit one parameter tensor at a time: "
             "its %.1f calls are %.1f unit ops, one per unit as the schedule counts them)\n",
             mp_group_name((mp_group)g), (double)cp->calls[g] / n, (double)cp->unit_ops[g] / n);
  if (pred)
    printf("  (predicted step %.3f ms: compute %.3f, optimizer %.3f, exposed communication %.3f)\n",
           pick->busy_res.step_time_s * 1e3, pick->busy_res.compute_s * 1e3, pick->busy_res.optimizer_s * 1e3,
           pick->busy_res.exposed_comm_s * 1e3);
}

/* ---- --metrics ------------------------------------------------------------------------------ */

/* A resumed run's metrics file keeps its lines up to the checkpoint's step (the steps
 * after it run again); a line cut by a kill is dropped with them. */
static mp_status metrics_keep_to_start(train_job *j, const char *path) {
  char *text = NULL;
  size_t len = 0;
  MP_CHECK(mp_read_file(j->ctx, path, &text, &len));
  size_t keep = 0;
  for (char *line = text; line < text + len;) {
    char *nl = memchr(line, '\n', (size_t)(text + len - line));
    if (!nl) break; /* a line without its newline was cut */
    cJSON *o = cJSON_ParseWithLength(line, (size_t)(nl - line));
    const cJSON *st = cJSON_GetObjectItem(o, "step");
    const int ok = cJSON_IsNumber(st) && (long long)st->valuedouble <= j->start_step;
    cJSON_Delete(o);
    if (!ok) break;
    keep = (size_t)(nl + 1 - text);
    line = nl + 1;
  }
  mp_status s = mp_write_file_atomic(j->ctx, path, text, keep);
  free(text);
  return s;
}

mp_status mp_train_metrics_open(train_job *j) {
  const char *path = mp_args_get(j->spec, "--metrics");
  if (!path || j->rank != 0) return MP_OK;
  /* a regular file or none: opening a FIFO for writing would wait for a reader forever */
  MP_CHECK(mp_file_check_regular_or_absent(j->ctx, path));
  const int exists = access(path, F_OK) == 0;
  if (j->resumed && exists && !j->eval_only) MP_CHECK(metrics_keep_to_start(j, path));
  j->metrics = fopen(path, j->resumed || j->eval_only ? "a" : "w");
  if (!j->metrics) return mp_error(j->ctx, MP_ERR_IO, "--metrics %s: cannot write: %s", path, strerror(errno));
  j->metrics_created = !exists;
  return MP_OK;
}

/* One JSON line on the metrics file. */
static mp_status metrics_line(train_job *j, cJSON *o) {
  char *line = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  MP_CHECK_ALLOC(j->ctx, line);
  const int bad = fprintf(j->metrics, "%s\n", line) < 0 || fflush(j->metrics) != 0;
  free(line);
  if (bad) return mp_error_write(j->ctx, errno, mp_args_get(j->spec, "--metrics"));
  return MP_OK;
}

/* The step's routed-expert loads (train_job's copy of mp_runtime_expert_routed) on its
 * metrics line: per MoE layer, the assignments routed to each expert and those dropped over
 * its capacity. */
static void metrics_expert_loads(const train_job *j, cJSON *o) {
  const int64_t *routed = j->expert_routed, *dropped = j->expert_dropped;
  if (!routed) return;
  const int L = (int)j->model.n_layers, E = (int)j->model.n_experts;
  cJSON *arr = cJSON_AddArrayToObject(o, "expert_loads");
  for (int l = 0; l < L && arr; l++) {
    if (!mp_model_layer_is_moe(&j->model, l)) continue;
    cJSON *lo = cJSON_CreateObject(), *r = cJSON_CreateArray(), *d = cJSON_CreateArray();
    for (int e = 0; e < E && r && d; e++) {
      cJSON_AddItemToArray(r, cJSON_CreateNumber((double)routed[(size_t)l * E + e]));
      cJSON_AddItemToArray(d, cJSON_CreateNumber((double)dropped[(size_t)l * E + e]));
    }
    cJSON_AddNumberToObject(lo, "layer", l);
    cJSON_AddItemToObject(lo, "routed", r);
    cJSON_AddItemToObject(lo, "dropped", d);
    cJSON_AddItemToArray(arr, lo);
  }
}

/* The step's routed-expert loads as the database's expert_loads rows. */
static mp_status db_expert_loads(train_job *j, int64_t step) {
  const int64_t *routed = j->expert_routed;
  if (!routed) return MP_OK;
  const int L = (int)j->model.n_layers;
  int *moe = malloc((size_t)L * sizeof *moe);
  MP_CHECK_ALLOC(j->ctx, moe);
  for (int l = 0; l < L; l++) moe[l] = mp_model_layer_is_moe(&j->model, l);
  const mp_expert_loads x = {j->plan_id, step, L, (int)j->model.n_experts, moe, routed, j->expert_dropped};
  mp_status s = mp_store_add_expert_loads(j->ctx, j->store, &x);
  free(moe);
  return s;
}

static mp_status metrics_step(train_job *j, const step_rec *sr) {
  cJSON *o = cJSON_CreateObject();
  MP_CHECK_ALLOC(j->ctx, o);
  cJSON_AddNumberToObject(o, "step", (double)sr->step);
  cJSON_AddNumberToObject(o, "loss", sr->r.loss);
  cJSON_AddNumberToObject(o, "ce_loss", sr->r.ce_loss);
  cJSON_AddNumberToObject(o, "aux_loss", sr->r.aux_loss);
  if (sr->has_eval)
    cJSON_AddNumberToObject(o, "eval_loss", sr->eval);
  else
    cJSON_AddNullToObject(o, "eval_loss");
  cJSON_AddNumberToObject(o, "lr", sr->lr);
  cJSON_AddNumberToObject(o, "grad_norm", sr->r.grad_norm);
  cJSON_AddNumberToObject(o, "step_time_s", sr->dt);
  cJSON_AddNumberToObject(o, "tokens_per_s", sr->tok_s);
  if (j->peak_flops > 0)
    cJSON_AddNumberToObject(o, "mfu", sr->tok_s * j->flops_per_token / j->peak_flops);
  else
    cJSON_AddNullToObject(o, "mfu");
  cJSON_AddNumberToObject(o, "peak_mem_bytes", (double)sr->r.peak_bytes);
  if (j->pick.found)
    cJSON_AddNumberToObject(o, "predicted_step_s", j->pick.step_time_s);
  else
    cJSON_AddNullToObject(o, "predicted_step_s");
  metrics_expert_loads(j, o);
  return metrics_line(j, o);
}

mp_status mp_train_record(train_job *j, const step_rec *sr) {
  if (j->rank != 0) return MP_OK;
  if (j->metrics) MP_CHECK(metrics_step(j, sr));
  if (j->store && j->plan_id) {
    mp_measurement me = {j->plan_id,    sr->step,    sr->dt,  sr->r.peak_bytes, sr->r.loss,       sr->tok_s,
                         j->dev.cuda ? "cuda" : "cpu", sr->has_eval, sr->eval, sr->lr, sr->r.grad_norm, 0};
    MP_CHECK(mp_store_add_measurement(j->ctx, j->store, &me));
    MP_CHECK(db_expert_loads(j, sr->step));
  }
  j->n_recorded++;
  return MP_OK;
}

mp_status mp_train_record_eval(train_job *j, const eval_rec *er) {
  if (j->rank != 0) return MP_OK;
  const double tok_s = er->dt > 0 ? (double)er->tokens / er->dt : 0;
  if (j->metrics) {
    cJSON *o = cJSON_CreateObject();
    MP_CHECK_ALLOC(j->ctx, o);
    cJSON_AddNumberToObject(o, "step", (double)er->step);
    cJSON_AddBoolToObject(o, "eval_only", 1);
    cJSON_AddNumberToObject(o, "eval_loss", er->loss);
    cJSON_AddNumberToObject(o, "eval_batches", (double)j->eval_batches);
    cJSON_AddNumberToObject(o, "eval_tokens", (double)er->tokens);
    cJSON_AddNumberToObject(o, "eval_time_s", er->dt);
    cJSON_AddNumberToObject(o, "peak_mem_bytes", (double)er->peak_bytes);
    MP_CHECK(metrics_line(j, o));
  }
  if (j->store && j->plan_id) {
    mp_measurement me = {j->plan_id, er->step, er->dt, er->peak_bytes, 0, tok_s, j->dev.cuda ? "cuda" : "cpu", 1,
                         er->loss, 0, 0, 1};
    MP_CHECK(mp_store_add_measurement(j->ctx, j->store, &me));
  }
  j->n_recorded++;
  return MP_OK;
}

/* ---- one database run across resumes ------------------------------------------------------ */

/* The manifest of the checkpoint --resume names (latest: the newest that parses; the load
 * later skips one that does not verify, and every checkpoint of a folder names one run). */
static int resume_manifest(train_job *j, mp_ctx *c2, mp_ckpt_manifest *man) {
  const char *res = mp_args_get(j->spec, "--resume"), *ck = mp_args_get(j->spec, "--checkpoint-dir");
  char dir[MP_CKPT_PATH_MAX];
  memset(man, 0, sizeof *man);
  if (!res) return 0;
  if (strcmp(res, "latest") != 0)
    return mp_ckpt_resolve(c2, res, dir, sizeof dir) == MP_OK && mp_ckpt_manifest_read(c2, dir, man) == MP_OK;
  int64_t *steps = NULL;
  int n = 0, ok = 0;
  if (ck && mp_ckpt_list(c2, ck, &steps, &n) == MP_OK)
    for (int i = n - 1; i >= 0 && !ok; i--) {
      snprintf(dir, sizeof dir, "%s/step_%08lld", ck, (long long)steps[i]);
      mp_ckpt_manifest_free(man);
      ok = mp_ckpt_manifest_read(c2, dir, man) == MP_OK;
    }
  free(steps);
  return ok;
}

long long mp_train_resumed_run(train_job *j) {
  mp_ctx c2;
  mp_ctx_init(&c2);
  mp_ckpt_manifest man;
  memset(&man, 0, sizeof man);
  if (!j->db || access(j->db, F_OK) != 0 || !resume_manifest(j, &c2, &man)) {
    mp_ckpt_manifest_free(&man);
    return 0;
  }
  const cJSON *t = man.meta.train, *pid = cJSON_GetObjectItem(t, "db_plan_id"), *rid = cJSON_GetObjectItem(t, "db_run_id");
  const char *created = cJSON_GetStringValue(cJSON_GetObjectItem(t, "db_run_created_at"));
  char sql[96], when[32];
  snprintf(when, sizeof when, "%s", created ? created : "");
  snprintf(sql, sizeof sql, "SELECT coalesce(max(run_id), 0) FROM plans WHERE id=%lld",
           cJSON_IsNumber(pid) ? (long long)pid->valuedouble : 0LL);
  const long long want = cJSON_IsNumber(rid) ? (long long)rid->valuedouble : 0;
  mp_ckpt_manifest_free(&man);
  mp_store *st = NULL;
  int64_t run = 0;
  mp_run_row row;
  /* the same run, not a run of the same id in another database: its creation time (and,
   * for checkpoints older than it, the model) must agree */
  if (mp_store_open(&c2, j->db, &st) != MP_OK || mp_store_query_i64(&c2, st, sql, &run) != MP_OK || run <= 0 ||
      (want && want != run) || mp_store_get_run(&c2, st, run, &row) != MP_OK ||
      (when[0] && strcmp(when, row.created_at) != 0) || strcmp(row.model, j->model.name) != 0)
    run = 0;
  mp_store_close(st);
  return run;
}

mp_status mp_train_db_segment(train_job *j) {
  mp_store *st = NULL;
  MP_CHECK(mp_store_open(j->ctx, j->db, &st));
  mp_plan_settings set = j->pick.settings;
  set.stack = j->pick.stack;
  mp_status s = mp_store_add_plan(j->ctx, st, j->continue_run, &j->pick.cand, &set);
  mp_store_close(st);
  MP_CHECK(s);
  j->plan_id = j->pick.plan_id = j->pick.cand.plan_id;
  j->plan_recorded = 1;
  return MP_OK;
}

mp_status mp_train_db_run_of_plan(train_job *j) {
  char sql[96];
  int64_t run = 0;
  snprintf(sql, sizeof sql, "SELECT coalesce(max(run_id), 0) FROM plans WHERE id=%lld", j->plan_id);
  MP_CHECK(mp_store_query_i64(j->ctx, j->store, sql, &run));
  mp_run_row row;
  MP_CHECK(mp_store_get_run(j->ctx, j->store, run, &row));
  j->run_id = run;
  snprintf(j->run_created, sizeof j->run_created, "%s", row.created_at);
  return MP_OK;
}

/* ---- an elastic restart ------------------------------------------------------------------ */

/* Rank 0: the restart's line and row. The old plan is the one that saved the checkpoint
 * resumed from (its train state's db_plan_id), the plan that was running when it failed
 * unless that attempt failed before its first checkpoint. */
static mp_status restart_rank0(train_job *j, const mp_elastic_restart *r) {
  mp_restart_row row;
  memset(&row, 0, sizeof row);
  row.attempt = r->attempt;
  row.failed_after_step = r->failed_after_step;
  row.step_resumed = j->start_step;
  row.steps_lost = r->failed_after_step > j->start_step ? r->failed_after_step - j->start_step : 0;
  row.recover_s = mp_elastic_epoch_s() - r->failed_at;
  snprintf(row.old_mesh, sizeof row.old_mesh, "%s", r->old_mesh);
  mp_mesh_format(&j->mesh, row.new_mesh, sizeof row.new_mesh);
  snprintf(row.reason, sizeof row.reason, "%s", r->reason);
  printf("elastic: restart %lld recovered in %.2f s: %s after step %lld; resumed at step %lld on %s (was %s), "
         "%lld step%s lost\n", (long long)row.attempt, row.recover_s, row.reason, (long long)row.failed_after_step,
         (long long)row.step_resumed, row.new_mesh, row.old_mesh, (long long)row.steps_lost,
         row.steps_lost == 1 ? "" : "s");
  if (!j->store || !j->plan_id || !j->run_id) return MP_OK;
  const cJSON *pid = j->resumed ? cJSON_GetObjectItem(j->resume_man.meta.train, "db_plan_id") : NULL;
  row.old_plan_id = cJSON_IsNumber(pid) ? (int64_t)pid->valuedouble : 0;
  row.run_id = j->run_id;
  row.new_plan_id = j->plan_id;
  return mp_store_add_restart(j->ctx, j->store, &row);
}

mp_status mp_train_record_restart(train_job *j) {
  const char *v = getenv(MP_ELASTIC_ENV_RESTART);
  mp_elastic_restart r;
  if (!v || !*v) return MP_OK;
  if (!mp_elastic_restart_parse(v, &r))
    return mp_error(j->ctx, MP_ERR_USAGE, "%s='%s' is malformed; it is set by train --elastic, not by hand",
                    MP_ELASTIC_ENV_RESTART, v);
  mp_status st = j->rank == 0 ? restart_rank0(j, &r) : MP_OK;
  return mp_runtime_agree(j->ctx, j->rt, st, "recording the restart (--db)");
}

/* ---- the end ------------------------------------------------------------------------------ */

/* A failure before the database's run was marked running (the data, the restore) still
 * marks the run this process recorded as failed, so it does not read as a planner run. */
static void mark_failed_early(train_job *j) {
  if (j->status_set || !j->plan_recorded || j->rank != 0 || !j->db) return;
  mp_ctx c2;
  mp_ctx_init(&c2);
  mp_store *st = NULL;
  if (mp_store_open(&c2, j->db, &st) == MP_OK) mp_store_set_train_status(&c2, st, j->plan_id, "failed");
  mp_store_close(st);
}

/* Under train --elastic: a divergence is said to the supervisor in its status file, so that
 * it stops instead of restarting (the same data would diverge again). */
static void elastic_status(const train_job *j) {
  const char *path = getenv(MP_ELASTIC_ENV_STATUS);
  if (!path || !*path || !j->diverged || j->rank != 0) return;
  char line[64];
  const int n = snprintf(line, sizeof line, "diverged %lld\n", j->diverged_step);
  mp_ctx c2;
  mp_ctx_init(&c2);
  if (mp_write_file_atomic(&c2, path, line, (size_t)n) != MP_OK)
    fprintf(stderr, "meshplan: warning: %s\n", mp_errmsg(&c2));
}

void mp_train_finish(train_job *j, mp_status st) {
  elastic_status(j);
  if (j->metrics) fclose(j->metrics);
  j->metrics = NULL;
  const char *metrics = mp_args_get(j->spec, "--metrics");
  if (st != MP_OK && j->metrics_created && j->n_recorded == 0) unlink(metrics);
  if (st != MP_OK && !j->status_set && !(j->db_created && j->n_recorded == 0)) mark_failed_early(j);
  if (!j->status_set) return;
  mp_ctx c2;
  mp_ctx_init(&c2);
  const char *status = st == MP_OK ? "complete" : j->diverged ? "diverged" : "failed";
  /* a run that failed for want of room fails this write the same way: its line says it */
  if (mp_store_set_train_status(&c2, j->store, j->plan_id, status) != MP_OK && !(st != MP_OK && c2.last == st))
    fprintf(stderr, "meshplan: warning: the run's status was not recorded: %s\n", mp_errmsg(&c2));
}

void mp_train_remove_unused_db(const train_job *j, mp_status st) {
  if (st == MP_OK || !j->db_created || j->n_recorded > 0 || j->rank != 0) return;
  static const char *const side[] = {"", "-wal", "-shm", "-journal"};
  char p[4096];
  for (size_t i = 0; i < sizeof side / sizeof side[0]; i++) {
    snprintf(p, sizeof p, "%s%s", j->db, side[i]);
    unlink(p);
  }
}
