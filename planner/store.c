/* The planner's SQLite store (see store.h): the rows of runs, plans, predictions and
 * measurements, on a connection of store/db.h (which owns the file, its schema and its
 * write lock). The runs and plans rows are read by store_rows.c (store_internal.h).
 *
 * Invariants: at most one run transaction is open per connection (st->in_run); every
 * write transaction begins IMMEDIATE (mp_db_begin_write) so that the busy timeout, not a
 * deadlock error, arbitrates between concurrent planners; prepared statements are created
 * once per connection and reset after each use. */
#define _GNU_SOURCE
#include "planner/store.h"
#include "planner/store_internal.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timeutil.h"

struct mp_store {
  mp_db *db;
  int in_run;
  int64_t fault_after; /* < 0: off */
  sqlite3_stmt *ins_plan, *ins_pred, *set_rank;
  mp_plan_settings set; /* the open run's, bound on its plans rows; .stack and .fp8_recipe
                           point at the copies below */
  char stack[64], fp8_recipe[16];
};

static sqlite3 *conn(mp_store *st) { return mp_db_sqlite(st->db); }

mp_status mp_store_query_i64(mp_ctx *ctx, mp_store *st, const char *sql, int64_t *out) {
  return mp_db_query_i64(ctx, st->db, sql, "query", out);
}

static mp_status prepare(mp_ctx *ctx, mp_store *st, const char *sql, sqlite3_stmt **out) {
  int rc = sqlite3_prepare_v3(conn(st), sql, -1, SQLITE_PREPARE_PERSISTENT, out, NULL);
  return rc == SQLITE_OK ? MP_OK : mp_db_err(ctx, st->db, rc, "preparing a statement");
}

mp_status mp_store_open(mp_ctx *ctx, const char *path, mp_store **out) {
  *out = NULL;
  mp_store *st = calloc(1, sizeof *st);
  MP_CHECK_ALLOC(ctx, st);
  st->fault_after = -1;
  mp_status s = MP_OK;
  MP_CHECK_GOTO(mp_db_open(ctx, path, &st->db), s, fail);
  /* A run writes a few hundred thousand rows in one transaction: a page cache that holds
   * them (64 MiB) keeps SQLite from spilling dirty pages to the WAL mid-transaction. */
  MP_CHECK_GOTO(mp_db_exec(ctx, st->db, "PRAGMA cache_size=-65536", "setting the page cache"), s, fail);
  MP_CHECK_GOTO(prepare(ctx, st,
                        "INSERT INTO plans (run_id, idx, pp, dp_replicate, dp_shard, cp, tp, ep, ac, fp8,"
                        " micro_batch, reshard, evaluated, feasible, rank, reject_rule, reject_reason,"
                        " sp, pp_virtual, global_batch, pp_split, etp, dopt, loss_chunks, nccl_version, stack,"
                        " moe_imbalance, moe_capacity_factor, fp8_recipe, mtp_layers)"
                        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,NULL,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        &st->ins_plan), s, fail);
  MP_CHECK_GOTO(prepare(ctx, st,
                        "INSERT INTO predictions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        &st->ins_pred), s, fail);
  MP_CHECK_GOTO(prepare(ctx, st, "UPDATE plans SET rank=? WHERE id=?", &st->set_rank), s, fail);
  *out = st;
  return MP_OK;
fail:
  mp_store_close(st);
  return s;
}

void mp_store_close(mp_store *st) {
  if (!st) return;
  if (st->in_run) mp_store_run_abort(st);
  sqlite3_finalize(st->ins_plan);
  sqlite3_finalize(st->ins_pred);
  sqlite3_finalize(st->set_rank);
  mp_db_close(st->db);
  free(st);
}

const char *mp_store_path(const mp_store *st) { return mp_db_path(st->db); }

void mp_store_inject_fault_after(mp_store *st, int64_t n) { st->fault_after = n; }

static void bind_text(sqlite3_stmt *q, int i, const char *s) {
  sqlite3_bind_text(q, i, s ? s : "", -1, SQLITE_TRANSIENT);
}

/* The next plans rows' settings, "off" as 1 chunk (torchtitan's default), imbalance 1, factor 0. */
static void use_settings(mp_store *st, const mp_plan_settings *s) {
  snprintf(st->stack, sizeof st->stack, "%s", s->stack ? s->stack : "");
  snprintf(st->fp8_recipe, sizeof st->fp8_recipe, "%s", s->fp8_recipe ? s->fp8_recipe : "");
  st->set = (mp_plan_settings){st->stack, s->loss_chunks > 1 ? s->loss_chunks : 1, s->nccl_version,
                               s->moe_imbalance > 1 ? s->moe_imbalance : 1,
                               s->moe_capacity_factor > 0 ? s->moe_capacity_factor : 0, st->fp8_recipe,
                               s->mtp_layers};
}

mp_status mp_store_run_begin(mp_ctx *ctx, mp_store *st, const mp_run_info *info,
                             int64_t *run_id) {
  if (st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "a run is already open on %s", mp_store_path(st));
  MP_CHECK(mp_db_begin_write(ctx, st->db, "starting the run"));
  st->in_run = 1;
  use_settings(st, &info->settings);
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st),
                              "INSERT INTO runs (created_at, tool_version, model, cluster, gpu, n_gpus,"
                              " gpus_per_node, seq, global_batch, objective, options, command)"
                              " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) {
    char when[32];
    mp_now_iso(when, sizeof when);
    bind_text(q, 1, when);
    bind_text(q, 2, info->tool_version);
    bind_text(q, 3, info->model);
    bind_text(q, 4, info->cluster);
    bind_text(q, 5, info->gpu);
    sqlite3_bind_int(q, 6, info->n_gpus);
    sqlite3_bind_int(q, 7, info->gpus_per_node);
    sqlite3_bind_int64(q, 8, info->seq);
    sqlite3_bind_int64(q, 9, info->global_batch);
    bind_text(q, 10, info->objective);
    bind_text(q, 11, info->options_json);
    bind_text(q, 12, info->command);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) {
    mp_status s = mp_db_err(ctx, st->db, rc, "recording the run");
    mp_store_run_abort(st);
    return s;
  }
  *run_id = sqlite3_last_insert_rowid(conn(st));
  return MP_OK;
}

/* For statements whose every parameter is bound before each step. */
static mp_status step_reset(mp_ctx *ctx, mp_store *st, sqlite3_stmt *q, const char *what) {
  int rc = sqlite3_step(q);
  sqlite3_reset(q);
  return rc == SQLITE_DONE ? MP_OK : mp_db_err(ctx, st->db, rc, what);
}

mp_status mp_store_add_candidate(mp_ctx *ctx, mp_store *st, int64_t run_id, int64_t index,
                                 mp_candidate *c, const char *reason) {
  if (!st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "no run is open on %s", mp_store_path(st));
  if (st->fault_after >= 0 && st->fault_after-- == 0)
    return mp_error(ctx, MP_ERR_DB, "%s: injected fault while writing candidate %lld", mp_store_path(st),
                    (long long)index);
  sqlite3_stmt *q = st->ins_plan;
  const mp_mesh *m = &c->mesh;
  sqlite3_bind_int64(q, 1, run_id);
  sqlite3_bind_int64(q, 2, index);
  sqlite3_bind_int(q, 3, m->size[MP_DIM_PP]);
  sqlite3_bind_int(q, 4, m->size[MP_DIM_DP_REPLICATE]);
  sqlite3_bind_int(q, 5, m->size[MP_DIM_DP_SHARD]);
  sqlite3_bind_int(q, 6, m->size[MP_DIM_CP]);
  sqlite3_bind_int(q, 7, m->size[MP_DIM_TP]);
  sqlite3_bind_int(q, 8, m->ep);
  char ac[32];
  mp_candidate_ac_str(c, ac, sizeof ac);
  sqlite3_bind_text(q, 9, ac, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, 10, c->fp8);
  sqlite3_bind_int64(q, 11, c->micro_batch);
  sqlite3_bind_int(q, 12, c->reshard);
  sqlite3_bind_int(q, 13, c->evaluated);
  sqlite3_bind_int(q, 14, c->evaluated && c->reject == MP_REJECT_NONE);
  /* Every parameter is bound on every row (NULLs explicitly), so the statement needs no
   * clear_bindings; the reason is bound without a copy (it outlives the step). */
  if (c->reject != MP_REJECT_NONE) {
    sqlite3_bind_text(q, 15, mp_reject_name((mp_reject)c->reject), -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 16, reason ? reason : "", -1, SQLITE_STATIC);
  } else {
    sqlite3_bind_null(q, 15);
    sqlite3_bind_null(q, 16);
  }
  sqlite3_bind_int(q, 17, c->sp);
  sqlite3_bind_int(q, 18, c->pp_virtual > 0 ? c->pp_virtual : 1);
  sqlite3_bind_int64(q, 19, c->global_batch);
  sqlite3_bind_int(q, 20, c->pp_split);
  sqlite3_bind_int(q, 21, m->etp);
  sqlite3_bind_int(q, 22, mp_mesh_dopt(m));
  sqlite3_bind_int(q, 23, st->set.loss_chunks);
  sqlite3_bind_int(q, 24, st->set.nccl_version);
  sqlite3_bind_text(q, 25, st->stack[0] ? st->stack : NULL, -1, SQLITE_STATIC); /* NULL: not recorded */
  sqlite3_bind_double(q, 26, st->set.moe_imbalance);
  sqlite3_bind_double(q, 27, st->set.moe_capacity_factor);
  sqlite3_bind_text(q, 28, c->fp8 && st->fp8_recipe[0] ? st->fp8_recipe : NULL, -1, SQLITE_STATIC);
  sqlite3_bind_int(q, 29, st->set.mtp_layers);
  MP_CHECK(step_reset(ctx, st, q, "writing a plan"));
  c->plan_id = sqlite3_last_insert_rowid(conn(st));
  if (!c->evaluated || c->reject == MP_REJECT_EVAL_ERROR || c->reject == MP_REJECT_BOUNDED) return MP_OK;
  const mp_sim_result *r = &c->res;
  q = st->ins_pred;
  int i = 1;
  sqlite3_bind_int64(q, i++, c->plan_id);
  sqlite3_bind_double(q, i++, r->step_time_s);
  sqlite3_bind_double(q, i++, r->tokens_per_s_per_gpu);
  sqlite3_bind_double(q, i++, r->mfu);
  sqlite3_bind_int64(q, i++, r->peak_mem_bytes);
  sqlite3_bind_int64(q, i++, r->capacity_bytes);
  for (int k = 0; k < MP_MEM_COUNT; k++) sqlite3_bind_int64(q, i++, r->mem_at_peak[k]);
  sqlite3_bind_int64(q, i++, r->overhead_bytes);
  sqlite3_bind_double(q, i++, r->compute_s);
  sqlite3_bind_double(q, i++, r->exposed_comm_s);
  sqlite3_bind_double(q, i++, r->bubble_s);
  sqlite3_bind_double(q, i++, r->optimizer_s);
  return step_reset(ctx, st, q, "writing a prediction");
}

mp_status mp_store_set_rank(mp_ctx *ctx, mp_store *st, int64_t plan_id, int64_t rank) {
  sqlite3_bind_int64(st->set_rank, 1, rank);
  sqlite3_bind_int64(st->set_rank, 2, plan_id);
  return step_reset(ctx, st, st->set_rank, "writing a rank");
}

mp_status mp_store_set_logged(mp_ctx *ctx, mp_store *st, int64_t run_id, int ranked_only) {
  if (!st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "no run is open on %s", mp_store_path(st));
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st), "UPDATE runs SET logged=? WHERE id=?", -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(q, 1, ranked_only ? "ranked" : "all", -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 2, run_id);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  return rc == SQLITE_OK ? MP_OK : mp_db_err(ctx, st->db, rc, "recording what the run logged");
}

mp_status mp_store_add_rejections(mp_ctx *ctx, mp_store *st, int64_t run_id, const int64_t by[MP_REJECT_COUNT]) {
  if (!st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "no run is open on %s", mp_store_path(st));
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st), "INSERT INTO rejections (run_id, rule, count) VALUES (?,?,?)", -1, &q,
                              NULL);
  for (int r = 1; rc == SQLITE_OK && r < MP_REJECT_COUNT; r++) {
    if (by[r] == 0) continue;
    sqlite3_bind_int64(q, 1, run_id);
    sqlite3_bind_text(q, 2, mp_reject_name((mp_reject)r), -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, by[r]);
    rc = sqlite3_step(q);
    sqlite3_reset(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  return rc == SQLITE_OK ? MP_OK : mp_db_err(ctx, st->db, rc, "writing the rejection counts");
}

mp_status mp_store_run_commit(mp_ctx *ctx, mp_store *st, int64_t run_id,
                              const mp_run_summary *sum) {
  if (!st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "no run is open on %s", mp_store_path(st));
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st),
                              "UPDATE runs SET n_candidates=?, n_pruned=?, n_evaluated=?, n_feasible=?,"
                              " best_plan_id=?, wall_s=? WHERE id=?",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, sum->n_candidates);
    sqlite3_bind_int64(q, 2, sum->n_pruned);
    sqlite3_bind_int64(q, 3, sum->n_evaluated);
    sqlite3_bind_int64(q, 4, sum->n_feasible);
    if (sum->best_plan_id > 0) sqlite3_bind_int64(q, 5, sum->best_plan_id);
    sqlite3_bind_double(q, 6, sum->wall_s);
    sqlite3_bind_int64(q, 7, run_id);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc == SQLITE_OK) rc = sqlite3_exec(conn(st), "COMMIT", NULL, NULL, NULL);
  if (rc != SQLITE_OK) {
    mp_status s = mp_db_err(ctx, st->db, rc, "committing the run");
    mp_store_run_abort(st);
    return s;
  }
  st->in_run = 0;
  return MP_OK;
}

mp_status mp_store_add_plan(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_candidate *c,
                            const mp_plan_settings *settings) {
  if (st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "a run is open on %s", mp_store_path(st));
  MP_CHECK(mp_db_begin_write(ctx, st->db, "adding a plan to a run"));
  char sql[128];
  int64_t n = 0, idx = 0;
  snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE id=%lld", (long long)run_id);
  mp_status s = mp_store_query_i64(ctx, st, sql, &n);
  if (s == MP_OK && n != 1)
    s = mp_error(ctx, MP_ERR_NOT_FOUND, "%s has no run %lld; `meshplan report` lists the runs", mp_store_path(st),
                 (long long)run_id);
  snprintf(sql, sizeof sql, "SELECT coalesce(max(idx) + 1, 0) FROM plans WHERE run_id=%lld", (long long)run_id);
  if (s == MP_OK) s = mp_store_query_i64(ctx, st, sql, &idx);
  st->in_run = 1; /* the candidate's rows, as a run's (unranked) */
  use_settings(st, settings);
  if (s == MP_OK) s = mp_store_add_candidate(ctx, st, run_id, idx, c, "");
  st->in_run = 0;
  if (s == MP_OK) s = mp_db_exec(ctx, st->db, "COMMIT", "committing the plan");
  if (s != MP_OK) mp_db_rollback(st->db);
  return s;
}

void mp_store_run_abort(mp_store *st) {
  if (!st || !st->in_run) return;
  mp_db_rollback(st->db);
  st->in_run = 0;
}

mp_status mp_store_add_measurement(mp_ctx *ctx, mp_store *st, const mp_measurement *m) {
  if (st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "a run is open on %s", mp_store_path(st));
  MP_CHECK(mp_db_begin_write(ctx, st->db, "starting a measurement"));
  sqlite3_stmt *q = NULL;
  mp_status s = MP_OK;
  int rc = sqlite3_prepare_v2(conn(st),
                              "INSERT INTO measurements (run_id, plan_id, step, step_time_s,"
                              " peak_mem_bytes, loss, tokens_per_s, device, measured_at, eval_loss, lr,"
                              " grad_norm) SELECT run_id, id, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM plans WHERE id=?",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) {
    char when[32];
    mp_now_iso(when, sizeof when);
    sqlite3_bind_int64(q, 1, m->step);
    sqlite3_bind_double(q, 2, m->step_time_s);
    sqlite3_bind_int64(q, 3, m->peak_mem_bytes);
    if (m->eval_only) /* no step ran: no training loss, learning rate or gradient */
      sqlite3_bind_null(q, 4);
    else
      sqlite3_bind_double(q, 4, m->loss);
    sqlite3_bind_double(q, 5, m->tokens_per_s);
    bind_text(q, 6, m->device);
    bind_text(q, 7, when);
    if (m->has_eval)
      sqlite3_bind_double(q, 8, m->eval_loss);
    else
      sqlite3_bind_null(q, 8);
    if (!m->eval_only) sqlite3_bind_double(q, 9, m->lr);
    if (!m->eval_only) sqlite3_bind_double(q, 10, m->grad_norm);
    sqlite3_bind_int64(q, 11, m->plan_id);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) s = mp_db_err(ctx, st->db, rc, "writing a measurement");
  else if (sqlite3_changes(conn(st)) != 1)
    s = mp_error(ctx, MP_ERR_NOT_FOUND, "%s: no plan with id %lld; see meshplan report", mp_store_path(st),
                 (long long)m->plan_id);
  if (s == MP_OK) s = mp_db_exec(ctx, st->db, "COMMIT", "committing a measurement");
  if (s != MP_OK) mp_db_rollback(st->db);
  return s;
}

mp_status mp_store_set_train_status(mp_ctx *ctx, mp_store *st, int64_t plan_id, const char *status) {
  if (st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "a run is open on %s", mp_store_path(st));
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st),
                              "UPDATE runs SET train_status=? WHERE id=(SELECT run_id FROM plans WHERE id=?)", -1,
                              &q, NULL);
  if (rc == SQLITE_OK) {
    bind_text(q, 1, status);
    sqlite3_bind_int64(q, 2, plan_id);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) return mp_db_err(ctx, st->db, rc, "recording the training run's status");
  if (sqlite3_changes(conn(st)) != 1)
    return mp_error(ctx, MP_ERR_NOT_FOUND, "%s: no plan with id %lld; see meshplan report", mp_store_path(st),
                    (long long)plan_id);
  return MP_OK;
}

/* ---- reading ---------------------------------------------------------------------------- */

mp_status mp_store_list_runs(mp_ctx *ctx, mp_store *st, mp_arena *a, mp_run_row **rows,
                             int64_t *n) {
  int64_t count = 0;
  MP_CHECK(mp_store_query_i64(ctx, st, "SELECT count(*) FROM runs", &count));
  *rows = mp_arena_alloc(a, (size_t)(count > 0 ? count : 1) * sizeof **rows);
  MP_CHECK_ALLOC(ctx, *rows);
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st), "SELECT " MP_STORE_RUN_COLS " ORDER BY r.id DESC", -1, &q, NULL);
  int64_t i = 0;
  while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (i < count) mp_store_read_run(q, &(*rows)[i++]);
    rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE && rc != SQLITE_OK) return mp_db_err(ctx, st->db, rc, "listing runs");
  *n = i;
  return MP_OK;
}

mp_status mp_store_get_run(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_run_row *out) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st), "SELECT " MP_STORE_RUN_COLS " WHERE r.id=?", -1, &q, NULL);
  int found = 0;
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, run_id);
    rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
      mp_store_read_run(q, out);
      found = 1;
      rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
      rc = SQLITE_OK;
    }
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) return mp_db_err(ctx, st->db, rc, "reading a run");
  if (!found)
    return mp_error(ctx, MP_ERR_NOT_FOUND, "%s has no run %lld; `meshplan report` lists the runs",
                    mp_store_path(st), (long long)run_id);
  return MP_OK;
}

/* Plan r->id's measurements into r, mq being the measurements query of mp_store_top_plans
 * (each step's last record, ordered by step time): their count, the median step time
 * (robust to a slow first step; over the fastest 4096 when there are more), the largest
 * peak, the mean tokens/s. SQLITE_DONE when read whole, else SQLite's error (r's measured
 * figures then incomplete). */
static int read_measured(sqlite3_stmt *mq, mp_plan_row *r) {
  sqlite3_reset(mq);
  sqlite3_bind_int64(mq, 1, r->id);
  double times[4096];
  double tps_sum = 0;
  int64_t nm = 0;
  int mrc;
  while ((mrc = sqlite3_step(mq)) == SQLITE_ROW) {
    if (nm < 4096) times[nm] = sqlite3_column_double(mq, 0);
    int64_t pk = sqlite3_column_int64(mq, 1);
    if (pk > r->measured_peak_mem_bytes) r->measured_peak_mem_bytes = pk;
    tps_sum += sqlite3_column_double(mq, 2);
    nm++;
  }
  if (mrc != SQLITE_DONE) return mrc;
  r->n_measured = nm;
  if (nm > 0) {
    int64_t m = nm < 4096 ? nm : 4096;
    r->measured_step_time_s = m % 2 ? times[m / 2] : 0.5 * (times[m / 2 - 1] + times[m / 2]);
    r->measured_tokens_per_s = tps_sum / (double)nm;
  }
  return SQLITE_DONE;
}

mp_status mp_store_get_plan(mp_ctx *ctx, mp_store *st, int64_t plan_id, mp_plan_row *out) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st),
                              "SELECT " MP_STORE_PLAN_COLS " FROM plans pl LEFT JOIN predictions pr ON pr.plan_id = pl.id"
                              " WHERE pl.id=?",
                              -1, &q, NULL);
  int found = 0;
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, plan_id);
    rc = sqlite3_step(q);
    found = rc == SQLITE_ROW;
    if (found) mp_store_read_plan(q, out);
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) return mp_db_err(ctx, st->db, rc, "reading a plan");
  if (!found)
    return mp_error(ctx, MP_ERR_NOT_FOUND, "%s has no plan %lld; `meshplan report --db %s` lists the runs and "
                    "their plans", mp_store_path(st), (long long)plan_id, mp_store_path(st));
  return MP_OK;
}

mp_status mp_store_top_plans(mp_ctx *ctx, mp_store *st, int64_t run_id, int64_t k, mp_arena *a,
                             mp_plan_row **rows, int64_t *n) {
  int64_t count = 0;
  char sql[160];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM plans WHERE run_id=%lld AND rank IS NOT NULL",
           (long long)run_id);
  MP_CHECK(mp_store_query_i64(ctx, st, sql, &count));
  if (k > 0 && count > k) count = k;
  *rows = mp_arena_alloc(a, (size_t)(count > 0 ? count : 1) * sizeof **rows);
  MP_CHECK_ALLOC(ctx, *rows);
  sqlite3_stmt *q = NULL, *mq = NULL;
  int rc = sqlite3_prepare_v2(conn(st),
                              "SELECT " MP_STORE_PLAN_COLS " FROM plans pl JOIN predictions pr ON pr.plan_id = pl.id"
                              " WHERE pl.run_id=? AND pl.rank IS NOT NULL ORDER BY pl.rank LIMIT ?",
                              -1, &q, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(conn(st),
                            "SELECT step_time_s, peak_mem_bytes, tokens_per_s FROM measurements m"
                            " WHERE plan_id=? AND loss IS NOT NULL AND id = (SELECT max(id) FROM measurements"
                            " WHERE plan_id = m.plan_id AND step = m.step) ORDER BY step_time_s",
                            -1, &mq, NULL);
  int64_t i = 0;
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, run_id);
    sqlite3_bind_int64(q, 2, count);
  }
  while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    rc = SQLITE_OK;
    if (i >= count) continue;
    mp_plan_row *r = &(*rows)[i++];
    mp_store_read_plan(q, r);
    int mrc = read_measured(mq, r);
    if (mrc != SQLITE_DONE) {
      rc = mrc;
      break;
    }
  }
  sqlite3_finalize(q);
  sqlite3_finalize(mq);
  if (rc != SQLITE_DONE && rc != SQLITE_OK) return mp_db_err(ctx, st->db, rc, "reading plans");
  *n = i;
  return MP_OK;
}

/* The rows of a run-keyed query (sql, its one parameter the run) into an arena array of
 * elem-byte rows, each filled by read; count_sql counts at most as many rows. */
typedef void (*row_reader)(sqlite3_stmt *q, void *row);

static mp_status run_rows(mp_ctx *ctx, mp_store *st, int64_t run_id, const char *count_sql, const char *sql,
                          row_reader read, size_t elem, mp_arena *a, void **rows, int64_t *n, const char *what) {
  char csql[160];
  int64_t count = 0;
  snprintf(csql, sizeof csql, count_sql, (long long)run_id);
  MP_CHECK(mp_store_query_i64(ctx, st, csql, &count));
  char *out = mp_arena_alloc(a, (size_t)(count > 0 ? count : 1) * elem);
  MP_CHECK_ALLOC(ctx, out);
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st), sql, -1, &q, NULL);
  if (rc == SQLITE_OK) sqlite3_bind_int64(q, 1, run_id);
  int64_t i = 0;
  while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    rc = SQLITE_OK;
    if (i < count) read(q, out + (size_t)i++ * elem);
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE && rc != SQLITE_OK) return mp_db_err(ctx, st->db, rc, what);
  *rows = out;
  *n = i;
  return MP_OK;
}

/* The rule of a stored name (mp_reject_name), or -1 for one this build does not know. */
static int reject_code(const char *name) {
  for (int r = 1; r < MP_REJECT_COUNT; r++)
    if (strcmp(name, mp_reject_name((mp_reject)r)) == 0) return r;
  return -1;
}

/* Adds sql's (rule, count) rows, run_id bound to its one parameter, into by. */
static int add_counts(mp_store *st, const char *sql, int64_t run_id, int64_t by[MP_REJECT_COUNT], int64_t *rows) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st), sql, -1, &q, NULL);
  if (rc == SQLITE_OK) sqlite3_bind_int64(q, 1, run_id);
  while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    const unsigned char *t = sqlite3_column_text(q, 0);
    const int r = t ? reject_code((const char *)t) : -1;
    if (r > 0) by[r] += sqlite3_column_int64(q, 1);
    (*rows)++;
    rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

mp_status mp_store_run_rejections(mp_ctx *ctx, mp_store *st, int64_t run_id, int64_t by[MP_REJECT_COUNT]) {
  mp_run_row run;
  MP_CHECK(mp_store_get_run(ctx, st, run_id, &run));
  memset(by, 0, sizeof(int64_t) * MP_REJECT_COUNT);
  int64_t rows = 0;
  int rc = add_counts(st, "SELECT rule, count FROM rejections WHERE run_id=?", run_id, by, &rows);
  /* a run written before version 6 counted in its plans rows */
  if (rc == SQLITE_OK && rows == 0)
    rc = add_counts(st, "SELECT reject_rule, count(*) FROM plans WHERE run_id=? AND reject_rule IS NOT NULL"
                    " GROUP BY reject_rule", run_id, by, &rows);
  if (rc != SQLITE_OK) return mp_db_err(ctx, st->db, rc, "reading the rejection counts");
  by[MP_REJECT_NONE] = run.n_feasible;
  return MP_OK;
}

/* The run's predicted tokens/s per GPU (its measured plan's prediction; 0 when none). */
static int run_prediction(mp_store *st, int64_t run_id, double *pred) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st),
                              "SELECT pr.tokens_per_s_per_gpu FROM predictions pr WHERE pr.plan_id ="
                              " (SELECT plan_id FROM measurements WHERE run_id=? ORDER BY id LIMIT 1)",
                              -1, &q, NULL);
  *pred = 0;
  if (rc == SQLITE_OK) sqlite3_bind_int64(q, 1, run_id);
  if (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) *pred = sqlite3_column_double(q, 0);
  sqlite3_finalize(q);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

mp_status mp_store_run_marks(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a, double *pred,
                             int64_t **resumed, int64_t *n_resumed) {
  char sql[128];
  int64_t count = 0;
  snprintf(sql, sizeof sql, "SELECT count(*) FROM measurements WHERE run_id=%lld", (long long)run_id);
  MP_CHECK(mp_store_query_i64(ctx, st, sql, &count));
  *resumed = mp_arena_alloc(a, (size_t)(count > 0 ? count : 1) * sizeof **resumed);
  MP_CHECK_ALLOC(ctx, *resumed);
  *n_resumed = 0;
  int rc = run_prediction(st, run_id, pred);
  sqlite3_stmt *q = NULL;
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(conn(st), "SELECT plan_id, step FROM measurements WHERE run_id=? ORDER BY id", -1, &q,
                            NULL);
  if (rc == SQLITE_OK) sqlite3_bind_int64(q, 1, run_id);
  int64_t prev_plan = -1, prev_step = 0;
  while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    rc = SQLITE_OK;
    const int64_t plan = sqlite3_column_int64(q, 0), step = sqlite3_column_int64(q, 1);
    /* a resume starts a new process: on another mesh a new plan (the run's next segment), on
     * the same one a step at or before the last recorded */
    const int resumed_here = prev_plan >= 0 && (plan != prev_plan || step <= prev_step);
    if (resumed_here && *n_resumed < count) (*resumed)[(*n_resumed)++] = step;
    prev_plan = plan;
    prev_step = step;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE && rc != SQLITE_OK) return mp_db_err(ctx, st->db, rc, "reading measurements");
  return MP_OK;
}

static void read_step(sqlite3_stmt *q, void *row) {
  mp_step_row *r = row;
  r->plan_id = sqlite3_column_int64(q, 0);
  r->step = sqlite3_column_int64(q, 1);
  r->loss = sqlite3_column_double(q, 2);
  r->tokens_per_s = sqlite3_column_double(q, 3);
  r->step_time_s = sqlite3_column_double(q, 4);
  r->lr = sqlite3_column_double(q, 5);
  r->grad_norm = sqlite3_column_double(q, 6);
  r->has_eval = sqlite3_column_type(q, 7) != SQLITE_NULL;
  r->eval_loss = r->has_eval ? sqlite3_column_double(q, 7) : 0;
  r->has_loss = sqlite3_column_int(q, 8);
}

mp_status mp_store_run_steps(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a, mp_step_row **rows,
                             int64_t *n) {
  /* each step's last record over the run's plans: one scan of the run's rows and a sort */
  return run_rows(ctx, st, run_id, "SELECT count(*) FROM measurements WHERE run_id=%lld",
                  "SELECT plan_id, step, coalesce(loss, 0), coalesce(tokens_per_s, 0),"
                  " coalesce(step_time_s, 0), coalesce(lr, 0), coalesce(grad_norm, 0), eval_loss, loss IS NOT NULL"
                  " FROM (SELECT *, row_number() OVER (PARTITION BY step ORDER BY id DESC) AS newest"
                  " FROM measurements WHERE run_id=?) WHERE newest = 1 ORDER BY step",
                  read_step, sizeof **rows, a, (void **)rows, n, "reading measurements");
}

static void read_segment(sqlite3_stmt *q, void *row) {
  mp_run_segment *r = row;
  r->plan_id = sqlite3_column_int64(q, 0);
  int *dims[6] = {&r->pp, &r->dp_replicate, &r->dp_shard, &r->cp, &r->tp, &r->ep};
  for (int d = 0; d < 6; d++) *dims[d] = sqlite3_column_int(q, 1 + d);
  r->micro_batch = sqlite3_column_int64(q, 7);
  r->first_step = sqlite3_column_int64(q, 8);
  r->last_step = sqlite3_column_int64(q, 9);
  r->n_steps = sqlite3_column_int64(q, 10);
  r->etp = sqlite3_column_int(q, 11);
  r->dopt = sqlite3_column_int(q, 12);
}

mp_status mp_store_run_segments(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a, mp_run_segment **rows,
                                int64_t *n) {
  return run_rows(ctx, st, run_id, "SELECT count(DISTINCT plan_id) FROM measurements WHERE run_id=%lld",
                  "SELECT pl.id, pl.pp, pl.dp_replicate, pl.dp_shard, pl.cp, pl.tp, pl.ep, pl.micro_batch,"
                  " min(m.step), max(m.step), count(*), pl.etp, pl.dopt FROM measurements m JOIN plans pl ON pl.id = m.plan_id"
                  " WHERE m.run_id=? GROUP BY pl.id ORDER BY min(m.id)",
                  read_segment, sizeof **rows, a, (void **)rows, n, "reading a run's segments");
}

/* A stored row's mesh: the dims, ep, etp and dopt as mp_store_add_candidate wrote them. */
static void row_mesh(const int dims[6], int etp, int dopt, mp_mesh *m) {
  mp_mesh_init(m);
  const mp_mesh_dim d[5] = {MP_DIM_PP, MP_DIM_DP_REPLICATE, MP_DIM_DP_SHARD, MP_DIM_CP, MP_DIM_TP};
  for (int i = 0; i < 5; i++) m->size[d[i]] = dims[i];
  m->ep = dims[5];
  m->etp = etp;
  m->dopt = dopt > 1 ? dopt : 1;
}

void mp_plan_row_mesh(const mp_plan_row *r, mp_mesh *m) {
  const int dims[6] = {r->pp, r->dp_replicate, r->dp_shard, r->cp, r->tp, r->ep};
  row_mesh(dims, r->etp, r->dopt, m);
}

void mp_run_segment_mesh(const mp_run_segment *r, mp_mesh *m) {
  const int dims[6] = {r->pp, r->dp_replicate, r->dp_shard, r->cp, r->tp, r->ep};
  row_mesh(dims, r->etp, r->dopt, m);
}

/* ---- elastic restarts -------------------------------------------------------------------- */

mp_status mp_store_add_restart(mp_ctx *ctx, mp_store *st, const mp_restart_row *r) {
  if (st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "a run is open on %s", mp_store_path(st));
  MP_CHECK(mp_db_begin_write(ctx, st->db, "starting a restart's record"));
  sqlite3_stmt *q = NULL;
  mp_status s = MP_OK;
  int rc = sqlite3_prepare_v2(conn(st),
                              "INSERT INTO restarts (run_id, attempt, old_plan_id, new_plan_id, old_mesh, new_mesh,"
                              " reason, failed_after_step, step_resumed, steps_lost, recover_s, recorded_at)"
                              " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) {
    char when[32];
    mp_now_iso(when, sizeof when);
    sqlite3_bind_int64(q, 1, r->run_id);
    sqlite3_bind_int64(q, 2, r->attempt);
    if (r->old_plan_id > 0) sqlite3_bind_int64(q, 3, r->old_plan_id);
    else sqlite3_bind_null(q, 3);
    sqlite3_bind_int64(q, 4, r->new_plan_id);
    bind_text(q, 5, r->old_mesh);
    bind_text(q, 6, r->new_mesh);
    bind_text(q, 7, r->reason);
    sqlite3_bind_int64(q, 8, r->failed_after_step);
    sqlite3_bind_int64(q, 9, r->step_resumed);
    sqlite3_bind_int64(q, 10, r->steps_lost);
    sqlite3_bind_double(q, 11, r->recover_s);
    bind_text(q, 12, when);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) s = mp_db_err(ctx, st->db, rc, "recording a restart");
  if (s == MP_OK) s = mp_db_exec(ctx, st->db, "COMMIT", "committing a restart");
  if (s != MP_OK) mp_db_rollback(st->db);
  return s;
}

static void read_restart(sqlite3_stmt *q, void *row) {
  mp_restart_row *r = row;
  r->run_id = sqlite3_column_int64(q, 0);
  r->attempt = sqlite3_column_int64(q, 1);
  r->old_plan_id = sqlite3_column_int64(q, 2); /* NULL reads 0 */
  r->new_plan_id = sqlite3_column_int64(q, 3);
  mp_store_col_text(q, 4, r->old_mesh, sizeof r->old_mesh);
  mp_store_col_text(q, 5, r->new_mesh, sizeof r->new_mesh);
  mp_store_col_text(q, 6, r->reason, sizeof r->reason);
  r->failed_after_step = sqlite3_column_int64(q, 7);
  r->step_resumed = sqlite3_column_int64(q, 8);
  r->steps_lost = sqlite3_column_int64(q, 9);
  r->recover_s = sqlite3_column_double(q, 10);
}

mp_status mp_store_run_restarts(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a, mp_restart_row **rows,
                                int64_t *n) {
  return run_rows(ctx, st, run_id, "SELECT count(*) FROM restarts WHERE run_id=%lld",
                  "SELECT run_id, attempt, old_plan_id, new_plan_id, old_mesh, new_mesh, reason, failed_after_step,"
                  " step_resumed, steps_lost, recover_s FROM restarts WHERE run_id=? ORDER BY id",
                  read_restart, sizeof **rows, a, (void **)rows, n, "reading a run's restarts");
}

/* ---- routed-expert loads ------------------------------------------------------------------ */

mp_status mp_store_add_expert_loads(mp_ctx *ctx, mp_store *st, const mp_expert_loads *x) {
  if (st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "a run is open on %s", mp_store_path(st));
  MP_CHECK(mp_db_begin_write(ctx, st->db, "starting the expert loads' record"));
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(conn(st),
                              "INSERT OR REPLACE INTO expert_loads (run_id, plan_id, step, layer, expert, routed,"
                              " dropped) SELECT run_id, id, ?, ?, ?, ?, ? FROM plans WHERE id=?",
                              -1, &q, NULL);
  int64_t placed = 0;
  for (int l = 0; l < x->n_layers && rc == SQLITE_OK; l++)
    for (int e = 0; e < x->n_experts && rc == SQLITE_OK && x->moe_layer[l]; e++) {
      const size_t i = (size_t)l * x->n_experts + e;
      sqlite3_bind_int64(q, 1, x->step);
      sqlite3_bind_int(q, 2, l);
      sqlite3_bind_int(q, 3, e);
      sqlite3_bind_int64(q, 4, x->routed[i]);
      sqlite3_bind_int64(q, 5, x->dropped[i]);
      sqlite3_bind_int64(q, 6, x->plan_id);
      rc = sqlite3_step(q);
      if (rc == SQLITE_DONE) rc = sqlite3_reset(q);
      placed += sqlite3_changes(conn(st)) > 0;
    }
  sqlite3_finalize(q);
  mp_status s = MP_OK;
  if (rc != SQLITE_OK) s = mp_db_err(ctx, st->db, rc, "recording the expert loads");
  else if (placed == 0 && x->n_layers > 0 && x->n_experts > 0)
    s = mp_error(ctx, MP_ERR_NOT_FOUND, "%s: no plan with id %lld, or no MoE layer; see meshplan report",
                 mp_store_path(st), (long long)x->plan_id);
  if (s == MP_OK) s = mp_db_exec(ctx, st->db, "COMMIT", "committing the expert loads");
  if (s != MP_OK) mp_db_rollback(st->db);
  return s;
}

static void read_expert_load(sqlite3_stmt *q, void *row) {
  mp_expert_load_row *r = row;
  r->step = sqlite3_column_int64(q, 0);
  r->layer = sqlite3_column_int(q, 1);
  r->expert = sqlite3_column_int(q, 2);
  r->routed = sqlite3_column_int64(q, 3);
  r->dropped = sqlite3_column_int64(q, 4);
}

mp_status mp_store_run_expert_loads(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a,
                                    mp_expert_load_row **rows, int64_t *n) {
  return run_rows(ctx, st, run_id, "SELECT count(*) FROM expert_loads WHERE run_id=%lld",
                  "SELECT step, layer, expert, routed, dropped FROM (SELECT *, dense_rank() OVER (PARTITION BY"
                  " step ORDER BY plan_id DESC) AS newest FROM expert_loads WHERE run_id=?) WHERE newest = 1"
                  " ORDER BY layer, step, expert",
                  read_expert_load, sizeof **rows, a, (void **)rows, n, "reading the expert loads");
}
