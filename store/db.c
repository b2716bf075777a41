/* A meshplan database file (see db.h): open, identity, migrations, settings, the write lock
 * and the mapping of SQLite's errors to meshplan's.
 *
 * Invariants: the identity checks only read; every write to the file (the creation, a
 * migration, the header stamp, the WAL switch) comes after a file has been found to be
 * meshplan's or empty, so a refused file is left byte for byte as it was. A migration and
 * its header stamp are one transaction, taken with the write lock, and the file is
 * identified again once the lock is held (another process may have migrated it in
 * between). */
#define _GNU_SOURCE
#include "store/db.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/file.h"
#include "common/timeutil.h"

struct mp_db {
  sqlite3 *db;
  char path[1024];
};

/* Migrations: migration[i] brings the schema from version i to i + 1. The tables are
 * described in planner/store.h. */
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
    /* 1 -> 2: the rank index holds ranked plans only (see planner/store.h) */
    "DROP INDEX plans_run_rank;"
    "CREATE INDEX plans_run_rank ON plans(run_id, rank) WHERE rank IS NOT NULL;",
    /* 2 -> 3: training runs' state and per-step training figures (see planner/store.h) */
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
    /* 5 -> 6: a run's rejection counts by rule, and which of its candidates it logged
     * (NULL on the runs written before: every candidate) */
    "CREATE TABLE rejections ("
    "  run_id INTEGER NOT NULL REFERENCES runs(id),"
    "  rule TEXT NOT NULL, count INTEGER NOT NULL,"
    "  PRIMARY KEY (run_id, rule));"
    "ALTER TABLE runs ADD COLUMN logged TEXT;",
    /* 6 -> 7: the restarts of an elastic training run (see planner/store.h) */
    "CREATE TABLE restarts ("
    "  id INTEGER PRIMARY KEY,"
    "  run_id INTEGER NOT NULL REFERENCES runs(id),"
    "  attempt INTEGER NOT NULL,"
    "  old_plan_id INTEGER REFERENCES plans(id), new_plan_id INTEGER NOT NULL REFERENCES plans(id),"
    "  old_mesh TEXT NOT NULL, new_mesh TEXT NOT NULL, reason TEXT NOT NULL,"
    "  failed_after_step INTEGER NOT NULL, step_resumed INTEGER NOT NULL, steps_lost INTEGER NOT NULL,"
    "  recover_s REAL NOT NULL, recorded_at TEXT NOT NULL);"
    "CREATE INDEX restarts_run ON restarts(run_id);",
    /* 7 -> 8: plans.pp_split (see planner/store.h) */
    "ALTER TABLE plans ADD COLUMN pp_split INTEGER NOT NULL DEFAULT 0;",
    /* 8 -> 9: a training run's routed-expert loads per step, MoE layer and expert (see
     * planner/store.h) */
    "CREATE TABLE expert_loads ("
    "  run_id INTEGER NOT NULL REFERENCES runs(id),"
    "  plan_id INTEGER NOT NULL REFERENCES plans(id),"
    "  step INTEGER NOT NULL, layer INTEGER NOT NULL, expert INTEGER NOT NULL,"
    "  routed INTEGER NOT NULL, dropped INTEGER NOT NULL,"
    "  PRIMARY KEY (plan_id, step, layer, expert));"
    "CREATE INDEX expert_loads_run ON expert_loads(run_id, step);",
    /* 9 -> 10: plans.etp and plans.dopt, the experts' grid and the distributed optimizer's
     * instances (exec/mesh.h's encoding; see planner/store.h) */
    "ALTER TABLE plans ADD COLUMN etp INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE plans ADD COLUMN dopt INTEGER NOT NULL DEFAULT 1;",
    /* 10 -> 11: plans.loss_chunks, plans.nccl_version, plans.stack, plans.moe_imbalance,
     * plans.moe_capacity_factor, plans.fp8_recipe and plans.mtp_layers, the settings a plan
     * was predicted under
     * (see planner/store.h). The rows written before take them from their run's options
     * (runs.options holds every option given, as JSON, since version 1) where the run gave
     * them; otherwise the defaults those versions applied: 1 chunk, NCCL 0 (the newest the
     * build modelled), imbalance 1, capacity factor 0 (dropless), stack NULL (not recorded:
     * the default depended on the GPU), on a float8 plan the recipe --fp8 named, its other
     * names mapped as mp_fp8_recipe_parse maps them (on, auto or bare: the stack's default,
     * not recorded), and the --mtp-num-layers given (without: the model's own, not
     * recorded, NULL). Options that are not JSON read as none (CASE
     * evaluates json_extract only on valid JSON). --nccl-version X.Y[.Z] becomes X x 10000 +
     * Y x 100 + Z as mp_sim_nccl_version_parse reads it (CAST keeps a text's leading integer:
     * "21.5" is 21). */
    "ALTER TABLE plans ADD COLUMN loss_chunks INTEGER NOT NULL DEFAULT 1;"
    "ALTER TABLE plans ADD COLUMN nccl_version INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE plans ADD COLUMN stack TEXT;"
    "ALTER TABLE plans ADD COLUMN moe_imbalance REAL NOT NULL DEFAULT 1;"
    "ALTER TABLE plans ADD COLUMN moe_capacity_factor REAL NOT NULL DEFAULT 0;"
    "ALTER TABLE plans ADD COLUMN fp8_recipe TEXT;"
    "ALTER TABLE plans ADD COLUMN mtp_layers INTEGER;"
    "UPDATE plans SET"
    "  mtp_layers = (SELECT CAST(CASE WHEN json_valid(r.options) THEN json_extract(r.options, '$.\"mtp-num-layers\"')"
    "    END AS INTEGER) FROM runs r WHERE r.id = plans.run_id),"
    "  fp8_recipe = (SELECT CASE WHEN v IN ('current', 'fp8_cs') THEN 'tensorwise' WHEN v = 'fp8_mx' THEN 'mxfp8'"
    "    WHEN v IN ('fp8_sc', 'subchannel') THEN 'blockwise' WHEN v IN ('tensorwise', 'delayed', 'rowwise',"
    "    'mxfp8', 'blockwise', 'nvfp4') THEN v END FROM (SELECT CASE WHEN json_valid(r.options)"
    "    THEN json_extract(r.options, '$.fp8') END AS v FROM runs r WHERE r.id = plans.run_id) WHERE plans.fp8 = 1),"
    "  moe_imbalance = coalesce((SELECT CAST(CASE WHEN json_valid(r.options)"
    "    THEN json_extract(r.options, '$.\"moe-imbalance\"') END AS REAL) FROM runs r WHERE r.id = plans.run_id), 1),"
    "  moe_capacity_factor = coalesce((SELECT CAST(CASE WHEN json_valid(r.options)"
    "    THEN json_extract(r.options, '$.\"moe-capacity-factor\"') END AS REAL) FROM runs r"
    "    WHERE r.id = plans.run_id), 0),"
    "  loss_chunks = coalesce((SELECT CAST(CASE WHEN json_valid(r.options)"
    "    THEN json_extract(r.options, '$.\"loss-chunks\"') END AS INTEGER) FROM runs r WHERE r.id = plans.run_id), 1),"
    "  stack = (SELECT CASE WHEN json_valid(r.options) THEN json_extract(r.options, '$.stack') END"
    "    FROM runs r WHERE r.id = plans.run_id),"
    "  nccl_version = coalesce((SELECT CAST(v AS INTEGER) * 10000"
    "    + CAST(substr(v, instr(v, '.') + 1) AS INTEGER) * 100"
    "    + CASE WHEN instr(substr(v, instr(v, '.') + 1), '.') > 0"
    "      THEN CAST(substr(substr(v, instr(v, '.') + 1), instr(substr(v, instr(v, '.') + 1), '.') + 1) AS INTEGER)"
    "      ELSE 0 END"
    "    FROM (SELECT CASE WHEN json_valid(r.options) THEN json_extract(r.options, '$.\"nccl-version\"') END AS v"
    "      FROM runs r WHERE r.id = plans.run_id) WHERE v IS NOT NULL), 0);",
};

static mp_status corrupt(mp_ctx *ctx, const mp_db *db) {
  return mp_error(ctx, MP_ERR_DB, "%s is not a meshplan database or is corrupt; move it aside or pass --db",
                  db->path);
}

mp_status mp_db_err(mp_ctx *ctx, mp_db *db, int rc, const char *what) {
  if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT) return corrupt(ctx, db);
  /* Out of room: the run failed, the database is fine. SQLITE_FULL is SQLite's ENOSPC;
   * EFBIG (the file size limit) comes as a write's I/O error. sqlite3_system_errno is not
   * set on every path (a failed COMMIT's write to the WAL leaves it stale), so the errno of
   * the failed call, which nothing has touched since, stands in for it. */
  const int err = errno, xrc = db->db ? sqlite3_extended_errcode(db->db) : rc;
  int sys = db->db ? sqlite3_system_errno(db->db) : 0;
  if (sys != ENOSPC && sys != EDQUOT && sys != EFBIG) sys = err;
  const int wrote = xrc == SQLITE_IOERR_WRITE || xrc == SQLITE_IOERR_FSYNC || xrc == SQLITE_IOERR_TRUNCATE ||
                    xrc == SQLITE_IOERR_SHMSIZE || (rc & 0xff) == SQLITE_FULL;
  if (wrote && (sys == ENOSPC || sys == EDQUOT || sys == EFBIG)) return mp_error_write(ctx, sys, db->path);
  if ((rc & 0xff) == SQLITE_FULL) return mp_error_write(ctx, ENOSPC, db->path);
  return mp_error(ctx, MP_ERR_DB, "%s: %s: %s", db->path, what,
                  db->db ? sqlite3_errmsg(db->db) : sqlite3_errstr(rc));
}

mp_status mp_db_exec(mp_ctx *ctx, mp_db *db, const char *sql, const char *what) {
  int rc = sqlite3_exec(db->db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? MP_OK : mp_db_err(ctx, db, rc, what);
}

mp_status mp_db_query_i64(mp_ctx *ctx, mp_db *db, const char *sql, const char *what, int64_t *out) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db->db, sql, -1, &q, NULL);
  if (rc != SQLITE_OK) return mp_db_err(ctx, db, rc, what);
  rc = sqlite3_step(q);
  if (rc == SQLITE_ROW) {
    *out = sqlite3_column_int64(q, 0);
    rc = SQLITE_OK;
  } else if (rc == SQLITE_DONE) {
    *out = 0;
    rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  return rc == SQLITE_OK ? MP_OK : mp_db_err(ctx, db, rc, what);
}

/* Takes the write lock now, so a transaction never fails half-way for want of it. The
 * busy handler waits MP_STORE_BUSY_TIMEOUT_MS for another writer; when that runs out (or
 * SQLite answers busy without waiting, as during another connection's WAL recovery) the
 * attempt is repeated, for MP_STORE_WRITE_WAIT_S in all. Writers hold the lock for one
 * short transaction (a planner run is computed before it is written), so a queue of them
 * drains in seconds. */
mp_status mp_db_begin_write(mp_ctx *ctx, mp_db *db, const char *what) {
  /* BEGIN inside a transaction would fail as SQLITE_ERROR, which the loop below would
   * report as a database error instead of the caller's bug */
  MP_ASSERT(sqlite3_get_autocommit(db->db), "%s: %s: write transactions do not nest", db->path, what);
  const double t0 = mp_now_s();
  for (;;) {
    int rc = sqlite3_exec(db->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK) return MP_OK;
    if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) return mp_db_err(ctx, db, rc, what);
    if (mp_now_s() - t0 > MP_STORE_WRITE_WAIT_S)
      return mp_error(ctx, MP_ERR_DB,
                      "%s: %s: the database stayed locked by other writers for %d s; try again or "
                      "pass another --db",
                      db->path, what, MP_STORE_WRITE_WAIT_S);
    usleep(50000);
  }
}

void mp_db_rollback(mp_db *db) { sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL); }

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
static mp_status schema_matches(mp_ctx *ctx, mp_db *db, int64_t v, int *match) {
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
    if (rc == SQLITE_OK) rc = table_columns(db->db, t, got, sizeof got);
    if (rc == SQLITE_OK) ok = strcmp(want, got) == 0;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE && rc != SQLITE_OK) {
    mp_status s = rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT
                      ? corrupt(ctx, db)
                      : mp_error(ctx, MP_ERR_DB, "%s: checking the schema: %s", db->path, sqlite3_errstr(rc));
    sqlite3_close(ref);
    return s;
  }
  sqlite3_close(ref);
  *match = ok;
  return MP_OK;
}

/* The identity check's one-integer reads; a failure says "query" as it always has. */
static mp_status query(mp_ctx *ctx, mp_db *db, const char *sql, int64_t *out) {
  return mp_db_query_i64(ctx, db, sql, "query", out);
}

/* What the file is (see above); *version its schema version when DB_OURS or DB_NEWER. */
static mp_status identify(mp_ctx *ctx, mp_db *db, db_kind *kind, int64_t *version, int *stamped) {
  int64_t app = 0, user = 0, n_tables = 0, has_version = 0, n_versions = 0, n_int = 0;
  *version = 0;
  *stamped = 0;
  /* the first reads of the file: SQLITE_NOTADB / SQLITE_CORRUPT surface here */
  MP_CHECK(query(ctx, db, "PRAGMA application_id", &app));
  MP_CHECK(query(ctx, db, "PRAGMA user_version", &user));
  *stamped = app == MP_STORE_APPLICATION_ID;
  MP_CHECK(query(ctx, db, "SELECT count(*) FROM sqlite_master", &n_tables));
  if (app == 0 && user == 0 && n_tables == 0) {
    *kind = DB_EMPTY;
    return MP_OK;
  }
  *kind = DB_FOREIGN;
  if (app != 0 && app != MP_STORE_APPLICATION_ID) return MP_OK;
  MP_CHECK(query(ctx, db, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='schema_version'",
                 &has_version));
  if (!has_version) return MP_OK;
  /* one row holding an integer: a text, real or blob version is someone else's table */
  MP_CHECK(query(ctx, db, "SELECT count(*) FROM schema_version", &n_versions));
  MP_CHECK(query(ctx, db, "SELECT count(*) FROM schema_version WHERE typeof(version)='integer'", &n_int));
  if (n_versions != 1 || n_int != 1) return MP_OK;
  MP_CHECK(query(ctx, db, "SELECT version FROM schema_version", version));
  if (*version < 1) return MP_OK;
  if (app == MP_STORE_APPLICATION_ID && user != *version) return MP_OK;
  if (*version > MP_STORE_SCHEMA_VERSION) {
    *kind = DB_NEWER;
    return MP_OK;
  }
  int match = 0;
  MP_CHECK(schema_matches(ctx, db, *version, &match));
  if (match) *kind = DB_OURS;
  return MP_OK;
}

static mp_status refuse(mp_ctx *ctx, mp_db *db, db_kind kind, int64_t version) {
  if (kind == DB_NEWER)
    return mp_error(ctx, MP_ERR_DB,
                    "%s has schema version %lld, newer than this meshplan (%d); upgrade meshplan "
                    "or pass --db", db->path, (long long)version, MP_STORE_SCHEMA_VERSION);
  return corrupt(ctx, db);
}

/* Brings the file to MP_STORE_SCHEMA_VERSION: nothing for a current meshplan database; for
 * an empty file or an older version, the migrations in one transaction, the header stamped
 * (application_id, user_version) in the same one. Another process may be doing the same at
 * the same moment: the file is identified again once the write lock is held. */
static mp_status migrate(mp_ctx *ctx, mp_db *db) {
  db_kind kind;
  int64_t version = 0;
  int stamped = 0;
  MP_CHECK(identify(ctx, db, &kind, &version, &stamped));
  if (kind == DB_FOREIGN || kind == DB_NEWER) return refuse(ctx, db, kind, version);
  if (kind == DB_OURS && version == MP_STORE_SCHEMA_VERSION && stamped) return MP_OK;
  MP_CHECK(mp_db_begin_write(ctx, db, "locking for migration"));
  mp_status s = identify(ctx, db, &kind, &version, &stamped);
  if (s == MP_OK && (kind == DB_FOREIGN || kind == DB_NEWER)) s = refuse(ctx, db, kind, version);
  if (s == MP_OK && kind == DB_EMPTY)
    s = mp_db_exec(ctx, db, "CREATE TABLE schema_version (version INTEGER NOT NULL)", "creating schema");
  for (int64_t v = version; s == MP_OK && v < MP_STORE_SCHEMA_VERSION; v++) {
    s = mp_db_exec(ctx, db, k_migrations[v], "migrating schema");
    if (s == MP_OK) {
      char sql[160];
      snprintf(sql, sizeof sql, "DELETE FROM schema_version; INSERT INTO schema_version VALUES (%lld)",
               (long long)(v + 1));
      s = mp_db_exec(ctx, db, sql, "recording schema version");
    }
  }
  if (s == MP_OK) {
    char sql[96];
    snprintf(sql, sizeof sql, "PRAGMA application_id=%d; PRAGMA user_version=%d", MP_STORE_APPLICATION_ID,
             MP_STORE_SCHEMA_VERSION);
    s = mp_db_exec(ctx, db, sql, "stamping the file as meshplan's");
  }
  if (s == MP_OK) s = mp_db_exec(ctx, db, "COMMIT", "committing migration");
  if (s != MP_OK) mp_db_rollback(db);
  return s;
}

/* ---- open and close --------------------------------------------------------------------- */

/* WAL lets readers (report) run beside a writer; NORMAL sync is durable in WAL mode except
 * for the last transactions on power loss, which a planner can redo. Switching to WAL needs
 * a moment of exclusive access: retry while another connection holds it. */
static mp_status set_wal(mp_ctx *ctx, mp_db *db) {
  int rc;
  for (int tries = 0;; tries++) {
    rc = sqlite3_exec(db->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
    if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) break;
    if (tries > 600) break;
    usleep(100000);
  }
  if (rc != SQLITE_OK) return mp_db_err(ctx, db, rc, "setting WAL mode");
  return mp_db_exec(ctx, db, "PRAGMA synchronous=NORMAL", "setting synchronous");
}

/* A database file this open created and could not make (the disk full, the file size
 * limit): removed with SQLite's side files when nothing was committed into it, so a failed
 * command leaves no empty .db behind. A file with content is left alone (another process
 * may have created its tables meanwhile). */
static void remove_empty_db(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size != 0) return;
  static const char *const side[] = {"-journal", "-wal", "-shm"};
  char p[1100];
  for (size_t i = 0; i < sizeof side / sizeof side[0]; i++) {
    snprintf(p, sizeof p, "%s%s", path, side[i]);
    unlink(p);
  }
  unlink(path);
}

mp_status mp_db_open(mp_ctx *ctx, const char *path, mp_db **out) {
  *out = NULL;
  mp_db *db = calloc(1, sizeof *db);
  MP_CHECK_ALLOC(ctx, db);
  snprintf(db->path, sizeof db->path, "%s", path);
  const int existed = access(path, F_OK) == 0;
  mp_status s = MP_OK;
  /* a directory, FIFO or device is not a database file (SQLite would report "disk I/O
   * error" for some of them) */
  MP_CHECK_GOTO(mp_file_check_regular_or_absent(ctx, path), s, fail);
  int rc = sqlite3_open_v2(path, &db->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           NULL);
  if (rc != SQLITE_OK) {
    s = mp_error(ctx, MP_ERR_IO, "cannot open database %s: %s; check the directory exists or pass --db",
                 path, db->db ? sqlite3_errmsg(db->db) : sqlite3_errstr(rc));
    goto fail;
  }
  sqlite3_busy_timeout(db->db, MP_STORE_BUSY_TIMEOUT_MS);
  sqlite3_extended_result_codes(db->db, 0);
  /* A new database gets 64 KiB pages: a planner run writes tens of megabytes in one
   * transaction and SQLite moves them a page per system call (WAL append, then the
   * checkpoint's read and write), so large pages cut those calls 16-fold. Has no effect on
   * an existing file (its page size is fixed), nor once the first table exists. */
  MP_CHECK_GOTO(mp_db_exec(ctx, db, "PRAGMA page_size=65536", "setting the page size"), s, fail);
  MP_CHECK_GOTO(migrate(ctx, db), s, fail);
  MP_CHECK_GOTO(set_wal(ctx, db), s, fail);
  *out = db;
  return MP_OK;
fail:
  mp_db_close(db);
  if (s != MP_OK && !existed) remove_empty_db(path);
  return s;
}

void mp_db_close(mp_db *db) {
  if (!db) return;
  sqlite3_close(db->db);
  free(db);
}

const char *mp_db_path(const mp_db *db) { return db->path; }

sqlite3 *mp_db_sqlite(mp_db *db) { return db->db; }
