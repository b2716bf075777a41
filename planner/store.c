/* The planner's SQLite store (see store.h).
 *
 * Invariants: at most one run transaction is open per connection (st->in_run); every
 * write transaction begins IMMEDIATE so that the busy timeout, not a deadlock error,
 * arbitrates between concurrent planners; prepared statements are created once per
 * connection and reset after each use. */
#define _GNU_SOURCE
#include "planner/store.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/file.h"
#include "common/timeutil.h"

struct mp_store {
  sqlite3 *db;
  char path[1024];
  int in_run;
  int64_t fault_after; /* < 0: off */
  sqlite3_stmt *ins_plan, *ins_pred, *set_rank;
};

/* Migrations: migration[i] brings the schema from version i to i + 1. */
static const char *const k_migrations[MP_STORE_SCHEMA_VERSION] = {
    /* 0 -> 1 */
    "CREATE TABLE runs ("
    "  id INTEGER PRIMARY KEY,"
    "  created_at TEXT NOT NULL,"
    "  tool_version TEXT NOT NULL,"
    "  model TEXT NOT NULL, cluster TEXT NOT NULL, gpu TEXT NOT NULL,"
    "  n_gpus INTEGER NOT NULL, gpus_per_node INTEGER NOT NULL,"
    "  seq INTEGER NOT NULL, global_batch INTEGER NOT NULL,"
    "  objective TEXT NOT NULL, options TEXT, command TEXT,"
    "  n_candidates INTEGER, n_pruned INTEGER, n_evaluated INTEGER, n_feasible INTEGER,"
    "  best_plan_id INTEGER, wall_s REAL);"
    "CREATE TABLE plans ("
    "  id INTEGER PRIMARY KEY,"
    "  run_id INTEGER NOT NULL REFERENCES runs(id),"
    "  idx INTEGER NOT NULL,"
    "  pp INTEGER NOT NULL, dp_replicate INTEGER NOT NULL, dp_shard INTEGER NOT NULL,"
    "  cp INTEGER NOT NULL, tp INTEGER NOT NULL, ep INTEGER NOT NULL,"
    "  ac TEXT NOT NULL, fp8 INTEGER NOT NULL, micro_batch INTEGER NOT NULL,"
    "  reshard INTEGER NOT NULL, evaluated INTEGER NOT NULL, feasible INTEGER NOT NULL,"
    "  rank INTEGER, reject_rule TEXT, reject_reason TEXT);"
    "CREATE INDEX plans_run_rank ON plans(run_id, rank);"
    "CREATE TABLE predictions ("
    "  plan_id INTEGER PRIMARY KEY REFERENCES plans(id),"
    "  step_time_s REAL, tokens_per_s_per_gpu REAL, mfu REAL,"
    "  peak_mem_bytes INTEGER, capacity_bytes INTEGER,"
    "  mem_params_bytes INTEGER, mem_optimizer_bytes INTEGER, mem_grads_bytes INTEGER,"
    "  mem_gathered_bytes INTEGER, mem_activations_bytes INTEGER, mem_temp_bytes INTEGER,"
    "  mem_comm_bytes INTEGER, mem_fp8_bytes INTEGER, mem_logits_bytes INTEGER,"
    "  mem_overhead_bytes INTEGER,"
    "  compute_s REAL, exposed_comm_s REAL, bubble_s REAL, optimizer_s REAL);"
    "CREATE TABLE measurements ("
    "  id INTEGER PRIMARY KEY,"
    "  run_id INTEGER NOT NULL REFERENCES runs(id),"
    "  plan_id INTEGER NOT NULL REFERENCES plans(id),"
    "  step INTEGER NOT NULL, step_time_s REAL, peak_mem_bytes INTEGER, loss REAL,"
    "  tokens_per_s REAL, device TEXT, measured_at TEXT NOT NULL);"
    "CREATE INDEX measurements_plan ON measurements(plan_id);",
    /* 1 -> 2: the rank index holds ranked plans only (see store.h) */
    "DROP INDEX plans_run_rank;"
    "CREATE INDEX plans_run_rank ON plans(run_id, rank) WHERE rank IS NOT NULL;",
    /* 2 -> 3: training runs' state and per-step training figures (see store.h) */
    "ALTER TABLE runs ADD COLUMN train_status TEXT;"
    "ALTER TABLE measurements ADD COLUMN eval_loss REAL;"
    "ALTER TABLE measurements ADD COLUMN lr REAL;"
    "ALTER TABLE measurements ADD COLUMN grad_norm REAL;"
    "CREATE INDEX measurements_plan_step ON measurements(plan_id, step);",
    /* 3 -> 4: a plan's sequence parallelism and model chunks per pipeline stage (ac holds
     * the policy as the CLI names it, full:N included) */
    "ALTER TABLE plans ADD COLUMN sp INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE plans ADD COLUMN pp_virtual INTEGER NOT NULL DEFAULT 1;",
    /* 4 -> 5: each plan's own global batch, the batch rule's target rounded to its data-
     * parallel size (NULL on the rows of runs written before: not recorded then) */
    "ALTER TABLE plans ADD COLUMN global_batch INTEGER;",
};

static mp_status corrupt(mp_ctx *ctx, const mp_store *st) {
  return mp_error(ctx, MP_ERR_DB, "%s is not a meshplan database or is corrupt; move it aside or pass --db",
                  st->path);
}

static mp_status db_err(mp_ctx *ctx, mp_store *st, int rc, const char *what) {
  if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT) return corrupt(ctx, st);
  return mp_error(ctx, MP_ERR_DB, "%s: %s: %s", st->path, what,
                  st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
}

static mp_status exec_sql(mp_ctx *ctx, mp_store *st, const char *sql, const char *what) {
  int rc = sqlite3_exec(st->db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? MP_OK : db_err(ctx, st, rc, what);
}

/* BEGIN IMMEDIATE: takes the write lock now, so a transaction never fails half-way for
 * want of it. The busy handler waits MP_STORE_BUSY_TIMEOUT_MS for another writer; when that
 * runs out (or SQLite answers busy without waiting, as during another connection's WAL
 * recovery) the attempt is repeated, for MP_STORE_WRITE_WAIT_S in all. Writers hold the
 * lock for one short transaction (a run is computed before it is written), so a queue of
 * them drains in seconds. */
static mp_status begin_write(mp_ctx *ctx, mp_store *st, const char *what) {
  const double t0 = mp_now_s();
  for (;;) {
    int rc = sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK) return MP_OK;
    if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) return db_err(ctx, st, rc, what);
    if (mp_now_s() - t0 > MP_STORE_WRITE_WAIT_S)
      return mp_error(ctx, MP_ERR_DB,
                      "%s: %s: the database stayed locked by other writers for %d s; try again or "
                      "pass another --db",
                      st->path, what, MP_STORE_WRITE_WAIT_S);
    usleep(50000);
  }
}

mp_status mp_store_query_i64(mp_ctx *ctx, mp_store *st, const char *sql, int64_t *out) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(st->db, sql, -1, &q, NULL);
  if (rc != SQLITE_OK) return db_err(ctx, st, rc, "query");
  rc = sqlite3_step(q);
  if (rc == SQLITE_ROW) {
    *out = sqlite3_column_int64(q, 0);
    rc = SQLITE_OK;
  } else if (rc == SQLITE_DONE) {
    *out = 0;
    rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  return rc == SQLITE_OK ? MP_OK : db_err(ctx, st, rc, "query");
}

/* ---- identity: is this file meshplan's, and of which version? ----------------------------
 *
 * A meshplan database carries MP_STORE_APPLICATION_ID in its header (PRAGMA application_id)
 * and its schema version twice: in the schema_version table (what migrations maintain) and
 * in the header's user_version (readable without trusting any table). Files made before the
 * header was stamped carry application_id 0 and are recognised by their tables. A file is
 * meshplan's at version v when
 *   - application_id is ours (or 0 and the file has tables: a file from before the stamp),
 *   - schema_version holds one integer v in 1..MP_STORE_SCHEMA_VERSION (a newer v is
 *     refused with "upgrade meshplan"), equal to user_version when the stamp is there,
 *   - and every table the migrations create up to version v exists with exactly their
 *     columns, in order (the reference is built by running k_migrations on an in-memory
 *     database, so it follows any migration added later). Other tables (calibrations,
 *     calib/store.c) may exist beside them.
 * Anything else is not meshplan's and is never written: the checks only read, and every
 * write (the creation, a migration, the WAL switch) comes after them. An empty file (no
 * tables, no stamp) is a new database. */

typedef enum db_kind { DB_EMPTY, DB_OURS, DB_FOREIGN, DB_NEWER } db_kind;

/* Column names of table `t` in db, "a,b,c" (empty when there is no such table). */
static int table_columns(sqlite3 *db, const char *t, char *out, size_t cap) {
  char sql[256];
  snprintf(sql, sizeof sql, "SELECT name FROM pragma_table_info('%s') ORDER BY cid", t);
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &q, NULL);
  size_t used = 0;
  out[0] = '\0';
  while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    const unsigned char *n = sqlite3_column_text(q, 0);
    int w = snprintf(out + used, cap - used, "%s%s", used ? "," : "", n ? (const char *)n : "");
    if (w < 0 || (size_t)w >= cap - used) break;
    used += (size_t)w;
    rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE || rc == SQLITE_OK ? SQLITE_OK : rc;
}

/* The tables of schema version v (k_migrations[0..v) on an in-memory database) are in db
 * with the same columns: *match 1. */
static mp_status schema_matches(mp_ctx *ctx, mp_store *st, int64_t v, int *match) {
  *match = 0;
  sqlite3 *ref = NULL;
  int rc = sqlite3_open_v2(":memory:", &ref, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  for (int64_t i = 0; rc == SQLITE_OK && i < v; i++) rc = sqlite3_exec(ref, k_migrations[i], NULL, NULL, NULL);
  sqlite3_stmt *q = NULL;
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(ref, "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name", -1, &q,
                            NULL);
  int ok = 1;
  char want[2048], got[2048];
  while (rc == SQLITE_OK && ok && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    const char *t = (const char *)sqlite3_column_text(q, 0);
    rc = table_columns(ref, t, want, sizeof want);
    if (rc == SQLITE_OK) rc = table_columns(st->db, t, got, sizeof got);
    if (rc == SQLITE_OK) ok = strcmp(want, got) == 0;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE && rc != SQLITE_OK) {
    mp_status s = rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT
                      ? corrupt(ctx, st)
                      : mp_error(ctx, MP_ERR_DB, "%s: checking the schema: %s", st->path, sqlite3_errstr(rc));
    sqlite3_close(ref);
    return s;
  }
  sqlite3_close(ref);
  *match = ok;
  return MP_OK;
}

/* What the file is (see above); *version its schema version when DB_OURS or DB_NEWER. */
static mp_status identify(mp_ctx *ctx, mp_store *st, db_kind *kind, int64_t *version, int *stamped) {
  int64_t app = 0, user = 0, n_tables = 0, has_version = 0, n_versions = 0, n_int = 0;
  *version = 0;
  *stamped = 0;
  /* the first reads of the file: SQLITE_NOTADB / SQLITE_CORRUPT surface here */
  MP_CHECK(mp_store_query_i64(ctx, st, "PRAGMA application_id", &app));
  MP_CHECK(mp_store_query_i64(ctx, st, "PRAGMA user_version", &user));
  *stamped = app == MP_STORE_APPLICATION_ID;
  MP_CHECK(mp_store_query_i64(ctx, st, "SELECT count(*) FROM sqlite_master", &n_tables));
  if (app == 0 && user == 0 && n_tables == 0) {
    *kind = DB_EMPTY;
    return MP_OK;
  }
  *kind = DB_FOREIGN;
  if (app != 0 && app != MP_STORE_APPLICATION_ID) return MP_OK;
  MP_CHECK(mp_store_query_i64(
      ctx, st, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='schema_version'", &has_version));
  if (!has_version) return MP_OK;
  /* one row holding an integer: a text, real or blob version is someone else's table */
  MP_CHECK(mp_store_query_i64(ctx, st, "SELECT count(*) FROM schema_version", &n_versions));
  MP_CHECK(mp_store_query_i64(ctx, st, "SELECT count(*) FROM schema_version WHERE typeof(version)='integer'",
                              &n_int));
  if (n_versions != 1 || n_int != 1) return MP_OK;
  MP_CHECK(mp_store_query_i64(ctx, st, "SELECT version FROM schema_version", version));
  if (*version < 1) return MP_OK;
  if (app == MP_STORE_APPLICATION_ID && user != *version) return MP_OK;
  if (*version > MP_STORE_SCHEMA_VERSION) {
    *kind = DB_NEWER;
    return MP_OK;
  }
  int match = 0;
  MP_CHECK(schema_matches(ctx, st, *version, &match));
  if (match) *kind = DB_OURS;
  return MP_OK;
}

static mp_status refuse(mp_ctx *ctx, mp_store *st, db_kind kind, int64_t version) {
  if (kind == DB_NEWER)
    return mp_error(ctx, MP_ERR_DB,
                    "%s has schema version %lld, newer than this meshplan (%d); upgrade meshplan "
                    "or pass --db", st->path, (long long)version, MP_STORE_SCHEMA_VERSION);
  return corrupt(ctx, st);
}

/* Brings the file to MP_STORE_SCHEMA_VERSION: nothing for a current meshplan database; for
 * an empty file or an older version, the migrations in one transaction, the header stamped
 * (application_id, user_version) in the same one. Another planner may be doing the same at
 * the same moment: the file is identified again once the write lock is held. */
static mp_status migrate(mp_ctx *ctx, mp_store *st) {
  db_kind kind;
  int64_t version = 0;
  int stamped = 0;
  MP_CHECK(identify(ctx, st, &kind, &version, &stamped));
  if (kind == DB_FOREIGN || kind == DB_NEWER) return refuse(ctx, st, kind, version);
  if (kind == DB_OURS && version == MP_STORE_SCHEMA_VERSION && stamped) return MP_OK;
  MP_CHECK(begin_write(ctx, st, "locking for migration"));
  mp_status s = identify(ctx, st, &kind, &version, &stamped);
  if (s == MP_OK && (kind == DB_FOREIGN || kind == DB_NEWER)) s = refuse(ctx, st, kind, version);
  if (s == MP_OK && kind == DB_EMPTY)
    s = exec_sql(ctx, st, "CREATE TABLE schema_version (version INTEGER NOT NULL)", "creating schema");
  for (int64_t v = version; s == MP_OK && v < MP_STORE_SCHEMA_VERSION; v++) {
    s = exec_sql(ctx, st, k_migrations[v], "migrating schema");
    if (s == MP_OK) {
      char sql[160];
      snprintf(sql, sizeof sql, "DELETE FROM schema_version; INSERT INTO schema_version VALUES (%lld)",
               (long long)(v + 1));
      s = exec_sql(ctx, st, sql, "recording schema version");
    }
  }
  if (s == MP_OK) {
    char sql[96];
    snprintf(sql, sizeof sql, "PRAGMA application_id=%d; PRAGMA user_version=%d", MP_STORE_APPLICATION_ID,
             MP_STORE_SCHEMA_VERSION);
    s = exec_sql(ctx, st, sql, "stamping the file as meshplan's");
  }
  if (s == MP_OK) s = exec_sql(ctx, st, "COMMIT", "committing migration");
  if (s != MP_OK) sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
  return s;
}

static mp_status prepare(mp_ctx *ctx, mp_store *st, const char *sql, sqlite3_stmt **out) {
  int rc = sqlite3_prepare_v3(st->db, sql, -1, SQLITE_PREPARE_PERSISTENT, out, NULL);
  return rc == SQLITE_OK ? MP_OK : db_err(ctx, st, rc, "preparing a statement");
}

mp_status mp_store_open(mp_ctx *ctx, const char *path, mp_store **out) {
  *out = NULL;
  mp_store *st = calloc(1, sizeof *st);
  MP_CHECK_ALLOC(ctx, st);
  snprintf(st->path, sizeof st->path, "%s", path);
  st->fault_after = -1;
  mp_status s = MP_OK;
  /* a directory, FIFO or device is not a database file (SQLite would report "disk I/O
   * error" for some of them) */
  MP_CHECK_GOTO(mp_file_check_regular_or_absent(ctx, path), s, fail);
  int rc = sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           NULL);
  if (rc != SQLITE_OK) {
    s = mp_error(ctx, MP_ERR_IO, "cannot open database %s: %s; check the directory exists or pass --db",
                 path, st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
    goto fail;
  }
  sqlite3_busy_timeout(st->db, MP_STORE_BUSY_TIMEOUT_MS);
  sqlite3_extended_result_codes(st->db, 0);
  /* A new database gets 64 KiB pages: a run writes tens of megabytes in one transaction
   * and SQLite moves them a page per system call (WAL append, then the checkpoint's read
   * and write), so large pages cut those calls 16-fold. Has no effect on an existing file
   * (its page size is fixed), nor once the first table exists. */
  MP_CHECK_GOTO(exec_sql(ctx, st, "PRAGMA page_size=65536", "setting the page size"), s, fail);
  MP_CHECK_GOTO(migrate(ctx, st), s, fail);
  /* WAL lets readers (report) run beside a writer; NORMAL sync is durable in WAL mode
   * except for the last transactions on power loss, which a planner can redo. Switching
   * to WAL needs a moment of exclusive access: retry while another connection holds it. */
  for (int tries = 0;; tries++) {
    rc = sqlite3_exec(st->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
    if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) break;
    if (tries > 600) break;
    usleep(100000);
  }
  if (rc != SQLITE_OK) {
    s = db_err(ctx, st, rc, "setting WAL mode");
    goto fail;
  }
  MP_CHECK_GOTO(exec_sql(ctx, st, "PRAGMA synchronous=NORMAL", "setting synchronous"), s, fail);
  /* A run writes a few hundred thousand rows in one transaction: a page cache that holds
   * them (64 MiB) keeps SQLite from spilling dirty pages to the WAL mid-transaction. */
  MP_CHECK_GOTO(exec_sql(ctx, st, "PRAGMA cache_size=-65536", "setting the page cache"), s, fail);
  MP_CHECK_GOTO(prepare(ctx, st,
                        "INSERT INTO plans (run_id, idx, pp, dp_replicate, dp_shard, cp, tp, ep, ac, fp8,"
                        " micro_batch, reshard, evaluated, feasible, rank, reject_rule, reject_reason,"
                        " sp, pp_virtual, global_batch)"
                        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,NULL,?,?,?,?,?)",
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
  sqlite3_close(st->db);
  free(st);
}

const char *mp_store_path(const mp_store *st) { return st->path; }

void mp_store_inject_fault_after(mp_store *st, int64_t n) { st->fault_after = n; }

static void bind_text(sqlite3_stmt *q, int i, const char *s) {
  sqlite3_bind_text(q, i, s ? s : "", -1, SQLITE_TRANSIENT);
}

mp_status mp_store_run_begin(mp_ctx *ctx, mp_store *st, const mp_run_info *info,
                             int64_t *run_id) {
  if (st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "a run is already open on %s", st->path);
  MP_CHECK(begin_write(ctx, st, "starting the run"));
  st->in_run = 1;
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(st->db,
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
    mp_status s = db_err(ctx, st, rc, "recording the run");
    mp_store_run_abort(st);
    return s;
  }
  *run_id = sqlite3_last_insert_rowid(st->db);
  return MP_OK;
}

/* For statements whose every parameter is bound before each step. */
static mp_status step_reset(mp_ctx *ctx, mp_store *st, sqlite3_stmt *q, const char *what) {
  int rc = sqlite3_step(q);
  sqlite3_reset(q);
  return rc == SQLITE_DONE ? MP_OK : db_err(ctx, st, rc, what);
}

mp_status mp_store_add_candidate(mp_ctx *ctx, mp_store *st, int64_t run_id, int64_t index,
                                 mp_candidate *c, const char *reason) {
  if (!st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "no run is open on %s", st->path);
  if (st->fault_after >= 0 && st->fault_after-- == 0)
    return mp_error(ctx, MP_ERR_DB, "%s: injected fault while writing candidate %lld", st->path,
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
  MP_CHECK(step_reset(ctx, st, q, "writing a plan"));
  c->plan_id = sqlite3_last_insert_rowid(st->db);
  if (!c->evaluated || c->reject == MP_REJECT_EVAL_ERROR) return MP_OK;
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

mp_status mp_store_run_commit(mp_ctx *ctx, mp_store *st, int64_t run_id,
                              const mp_run_summary *sum) {
  if (!st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "no run is open on %s", st->path);
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(st->db,
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
  if (rc == SQLITE_OK) rc = sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL);
  if (rc != SQLITE_OK) {
    mp_status s = db_err(ctx, st, rc, "committing the run");
    mp_store_run_abort(st);
    return s;
  }
  st->in_run = 0;
  return MP_OK;
}

void mp_store_run_abort(mp_store *st) {
  if (!st || !st->in_run) return;
  sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
  st->in_run = 0;
}

mp_status mp_store_add_measurement(mp_ctx *ctx, mp_store *st, const mp_measurement *m) {
  if (st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "a run is open on %s", st->path);
  MP_CHECK(begin_write(ctx, st, "starting a measurement"));
  sqlite3_stmt *q = NULL;
  mp_status s = MP_OK;
  int rc = sqlite3_prepare_v2(st->db,
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
    sqlite3_bind_double(q, 4, m->loss);
    sqlite3_bind_double(q, 5, m->tokens_per_s);
    bind_text(q, 6, m->device);
    bind_text(q, 7, when);
    if (m->has_eval)
      sqlite3_bind_double(q, 8, m->eval_loss);
    else
      sqlite3_bind_null(q, 8);
    sqlite3_bind_double(q, 9, m->lr);
    sqlite3_bind_double(q, 10, m->grad_norm);
    sqlite3_bind_int64(q, 11, m->plan_id);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) s = db_err(ctx, st, rc, "writing a measurement");
  else if (sqlite3_changes(st->db) != 1)
    s = mp_error(ctx, MP_ERR_NOT_FOUND, "%s: no plan with id %lld; see meshplan report", st->path,
                 (long long)m->plan_id);
  if (s == MP_OK) s = exec_sql(ctx, st, "COMMIT", "committing a measurement");
  if (s != MP_OK) sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
  return s;
}

mp_status mp_store_set_train_status(mp_ctx *ctx, mp_store *st, int64_t plan_id, const char *status) {
  if (st->in_run) return mp_error(ctx, MP_ERR_INTERNAL, "a run is open on %s", st->path);
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(st->db,
                              "UPDATE runs SET train_status=? WHERE id=(SELECT run_id FROM plans WHERE id=?)", -1,
                              &q, NULL);
  if (rc == SQLITE_OK) {
    bind_text(q, 1, status);
    sqlite3_bind_int64(q, 2, plan_id);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) return db_err(ctx, st, rc, "recording the training run's status");
  if (sqlite3_changes(st->db) != 1)
    return mp_error(ctx, MP_ERR_NOT_FOUND, "%s: no plan with id %lld; see meshplan report", st->path,
                    (long long)plan_id);
  return MP_OK;
}

/* ---- reading ---------------------------------------------------------------------------- */

static void col_text(sqlite3_stmt *q, int i, char *out, size_t cap) {
  const unsigned char *t = sqlite3_column_text(q, i);
  snprintf(out, cap, "%s", t ? (const char *)t : "");
}

#define RUN_COLS                                                                              \
  "r.id, r.created_at, r.model, r.cluster, r.gpu, r.objective, r.tool_version, r.n_gpus,"     \
  " r.seq, r.global_batch, coalesce(r.n_candidates,0), coalesce(r.n_pruned,0),"              \
  " coalesce(r.n_evaluated,0), coalesce(r.n_feasible,0), coalesce(r.best_plan_id,0),"        \
  " coalesce(r.wall_s,0), coalesce(p.step_time_s,0), r.train_status"                         \
  " FROM runs r LEFT JOIN predictions p ON p.plan_id = r.best_plan_id"

static void read_run(sqlite3_stmt *q, mp_run_row *r) {
  memset(r, 0, sizeof *r);
  r->id = sqlite3_column_int64(q, 0);
  col_text(q, 1, r->created_at, sizeof r->created_at);
  col_text(q, 2, r->model, sizeof r->model);
  col_text(q, 3, r->cluster, sizeof r->cluster);
  col_text(q, 4, r->gpu, sizeof r->gpu);
  col_text(q, 5, r->objective, sizeof r->objective);
  col_text(q, 6, r->tool_version, sizeof r->tool_version);
  r->n_gpus = sqlite3_column_int(q, 7);
  r->seq = sqlite3_column_int64(q, 8);
  r->global_batch = sqlite3_column_int64(q, 9);
  r->n_candidates = sqlite3_column_int64(q, 10);
  r->n_pruned = sqlite3_column_int64(q, 11);
  r->n_evaluated = sqlite3_column_int64(q, 12);
  r->n_feasible = sqlite3_column_int64(q, 13);
  r->best_plan_id = sqlite3_column_int64(q, 14);
  r->wall_s = sqlite3_column_double(q, 15);
  r->best_step_time_s = sqlite3_column_double(q, 16);
  /* NULL: a planner run, committed whole; 'running' left behind: the process died */
  const unsigned char *ts = sqlite3_column_text(q, 17);
  const char *s = ts ? (const char *)ts : "complete";
  snprintf(r->status, sizeof r->status, "%s", strcmp(s, "running") == 0 ? "incomplete" : s);
}

mp_status mp_store_list_runs(mp_ctx *ctx, mp_store *st, mp_arena *a, mp_run_row **rows,
                             int64_t *n) {
  int64_t count = 0;
  MP_CHECK(mp_store_query_i64(ctx, st, "SELECT count(*) FROM runs", &count));
  *rows = mp_arena_alloc(a, (size_t)(count > 0 ? count : 1) * sizeof **rows);
  MP_CHECK_ALLOC(ctx, *rows);
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(st->db, "SELECT " RUN_COLS " ORDER BY r.id DESC", -1, &q, NULL);
  int64_t i = 0;
  while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (i < count) read_run(q, &(*rows)[i++]);
    rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE && rc != SQLITE_OK) return db_err(ctx, st, rc, "listing runs");
  *n = i;
  return MP_OK;
}

mp_status mp_store_get_run(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_run_row *out) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(st->db, "SELECT " RUN_COLS " WHERE r.id=?", -1, &q, NULL);
  int found = 0;
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, run_id);
    rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
      read_run(q, out);
      found = 1;
      rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
      rc = SQLITE_OK;
    }
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) return db_err(ctx, st, rc, "reading a run");
  if (!found)
    return mp_error(ctx, MP_ERR_NOT_FOUND, "%s has no run %lld; `meshplan report` lists the runs",
                    st->path, (long long)run_id);
  return MP_OK;
}

/* The policy of a stored ac text ("selective-op", "full:4"), its block frequency into
 * *every; -1 for an unknown one. */
static int ac_code(const char *s, int *every) {
  *every = 1;
  if (strncmp(s, "full:", 5) == 0) {
    *every = atoi(s + 5);
    return MP_AC_FULL;
  }
  for (int i = 0; i < MP_AC_COUNT; i++)
    if (strcmp(s, mp_search_ac_name(i)) == 0) return i;
  return -1;
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
  /* Measured step time: the median over the measured steps (robust to a slow first step),
   * computed below from the ordered list; peak: the largest measured. */
  sqlite3_stmt *q = NULL, *mq = NULL;
  int rc = sqlite3_prepare_v2(
      st->db,
      "SELECT pl.id, pl.run_id, pl.idx, pl.rank, pl.pp, pl.dp_replicate, pl.dp_shard, pl.cp, pl.tp,"
      " pl.ep, pl.ac, pl.fp8, pl.reshard, pl.evaluated, pl.feasible, pl.micro_batch, pl.sp, pl.pp_virtual,"
      " coalesce(pl.global_batch, 0),"
      " coalesce(pl.reject_rule,''), coalesce(pl.reject_reason,''), pr.step_time_s,"
      " pr.tokens_per_s_per_gpu, pr.mfu, pr.compute_s, pr.exposed_comm_s, pr.bubble_s,"
      " pr.peak_mem_bytes, pr.capacity_bytes, pr.peak_mem_bytes - coalesce(pr.mem_overhead_bytes, 0)"
      " FROM plans pl JOIN predictions pr ON pr.plan_id = pl.id"
      " WHERE pl.run_id=? AND pl.rank IS NOT NULL ORDER BY pl.rank LIMIT ?",
      -1, &q, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(st->db,
                            "SELECT step_time_s, peak_mem_bytes, tokens_per_s FROM measurements m"
                            " WHERE plan_id=? AND id = (SELECT max(id) FROM measurements"
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
    memset(r, 0, sizeof *r);
    int c = 0;
    r->id = sqlite3_column_int64(q, c++);
    r->run_id = sqlite3_column_int64(q, c++);
    r->index = sqlite3_column_int64(q, c++);
    r->rank = sqlite3_column_int64(q, c++);
    r->pp = sqlite3_column_int(q, c++);
    r->dp_replicate = sqlite3_column_int(q, c++);
    r->dp_shard = sqlite3_column_int(q, c++);
    r->cp = sqlite3_column_int(q, c++);
    r->tp = sqlite3_column_int(q, c++);
    r->ep = sqlite3_column_int(q, c++);
    const unsigned char *ac = sqlite3_column_text(q, c++);
    r->ac = ac_code(ac ? (const char *)ac : "", &r->ac_every);
    r->fp8 = sqlite3_column_int(q, c++);
    r->reshard = sqlite3_column_int(q, c++);
    r->evaluated = sqlite3_column_int(q, c++);
    r->feasible = sqlite3_column_int(q, c++);
    r->micro_batch = sqlite3_column_int64(q, c++);
    r->sp = sqlite3_column_int(q, c++);
    r->pp_virtual = sqlite3_column_int(q, c++);
    r->global_batch = sqlite3_column_int64(q, c++);
    col_text(q, c++, r->reject_rule, sizeof r->reject_rule);
    col_text(q, c++, r->reject_reason, sizeof r->reject_reason);
    r->step_time_s = sqlite3_column_double(q, c++);
    r->tokens_per_s_per_gpu = sqlite3_column_double(q, c++);
    r->mfu = sqlite3_column_double(q, c++);
    r->compute_s = sqlite3_column_double(q, c++);
    r->exposed_comm_s = sqlite3_column_double(q, c++);
    r->bubble_s = sqlite3_column_double(q, c++);
    r->peak_mem_bytes = sqlite3_column_int64(q, c++);
    r->capacity_bytes = sqlite3_column_int64(q, c++);
    r->alloc_peak_bytes = sqlite3_column_int64(q, c++);
    /* measurements */
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
    if (mrc != SQLITE_DONE) {
      rc = mrc;
      break;
    }
    r->n_measured = nm;
    if (nm > 0) {
      int64_t m = nm < 4096 ? nm : 4096;
      r->measured_step_time_s = m % 2 ? times[m / 2] : 0.5 * (times[m / 2 - 1] + times[m / 2]);
      r->measured_tokens_per_s = tps_sum / (double)nm;
    }
  }
  sqlite3_finalize(q);
  sqlite3_finalize(mq);
  if (rc != SQLITE_DONE && rc != SQLITE_OK) return db_err(ctx, st, rc, "reading plans");
  *n = i;
  return MP_OK;
}

mp_status mp_store_run_steps(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a, mp_step_row **rows,
                             int64_t *n) {
  char sql[128];
  int64_t count = 0;
  snprintf(sql, sizeof sql, "SELECT count(*) FROM measurements WHERE run_id=%lld", (long long)run_id);
  MP_CHECK(mp_store_query_i64(ctx, st, sql, &count));
  *rows = mp_arena_alloc(a, (size_t)(count > 0 ? count : 1) * sizeof **rows);
  MP_CHECK_ALLOC(ctx, *rows);
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(st->db,
                              "SELECT plan_id, step, coalesce(loss, 0), coalesce(tokens_per_s, 0),"
                              " coalesce(step_time_s, 0), coalesce(lr, 0), coalesce(grad_norm, 0), eval_loss"
                              " FROM measurements m WHERE run_id=? AND id = (SELECT max(id) FROM measurements"
                              " WHERE plan_id = m.plan_id AND step = m.step) ORDER BY plan_id, step",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) sqlite3_bind_int64(q, 1, run_id);
  int64_t i = 0;
  while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    rc = SQLITE_OK;
    if (i >= count) continue;
    mp_step_row *r = &(*rows)[i++];
    r->plan_id = sqlite3_column_int64(q, 0);
    r->step = sqlite3_column_int64(q, 1);
    r->loss = sqlite3_column_double(q, 2);
    r->tokens_per_s = sqlite3_column_double(q, 3);
    r->step_time_s = sqlite3_column_double(q, 4);
    r->lr = sqlite3_column_double(q, 5);
    r->grad_norm = sqlite3_column_double(q, 6);
    r->has_eval = sqlite3_column_type(q, 7) != SQLITE_NULL;
    r->eval_loss = r->has_eval ? sqlite3_column_double(q, 7) : 0;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE && rc != SQLITE_OK) return db_err(ctx, st, rc, "reading measurements");
  *n = i;
  return MP_OK;
}
