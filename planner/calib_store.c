/* Calibrations in the planner's database (see calib_store.h).
 *
 * Invariants: a save is one BEGIN IMMEDIATE transaction (table creation, id allocation
 * and every row), rolled back on any failure; a load reads one calibration id's rows in
 * rowid order, which is the order they were saved in, so gemm[] and coll[] come back in
 * measurement order. */
#define _GNU_SOURCE
#include "planner/calib_store.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/store.h"

static const char k_schema[] =
    "CREATE TABLE IF NOT EXISTS calibrations ("
    "  id INTEGER NOT NULL,"
    "  created_at TEXT NOT NULL, device TEXT NOT NULL, host TEXT NOT NULL,"
    "  threads INTEGER NOT NULL, world INTEGER NOT NULL,"
    "  key TEXT NOT NULL, group_size INTEGER NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS calibrations_device_id ON calibrations(device, id);";

static mp_status db_fail(mp_ctx *ctx, sqlite3 *db, const char *path, int rc, const char *what) {
  if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT)
    return mp_error(ctx, MP_ERR_DB, "%s is not a meshplan database or is corrupt; move it aside or pass --db",
                    path);
  return mp_error(ctx, MP_ERR_DB, "%s: %s: %s", path, what, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
}

/* Checks (and, for a new file, creates) the planner schema through the store, then opens
 * this module's own connection with the store's settings. */
static mp_status open_db(mp_ctx *ctx, const char *path, sqlite3 **out) {
  *out = NULL;
  mp_store *st = NULL;
  MP_CHECK(mp_store_open(ctx, path, &st));
  mp_store_close(st);
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    mp_status s = mp_error(ctx, MP_ERR_IO, "cannot open database %s: %s", path,
                           db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, MP_STORE_BUSY_TIMEOUT_MS);
  /* mp_store_open left the file in WAL mode (persistent); saying so again is a no-op
   * that keeps this connection's settings explicit. */
  rc = sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
  if (rc != SQLITE_OK) {
    mp_status s = db_fail(ctx, db, path, rc, "setting WAL mode");
    sqlite3_close(db);
    return s;
  }
  *out = db;
  return MP_OK;
}

mp_status mp_calib_store_check(mp_ctx *ctx, const char *db_path) {
  sqlite3 *db = NULL;
  MP_CHECK(open_db(ctx, db_path, &db));
  sqlite3_close(db);
  return MP_OK;
}

typedef struct writer {
  sqlite3 *db;
  sqlite3_stmt *ins;
  const char *path;
  const mp_calib *c;
} writer;

static mp_status put(mp_ctx *ctx, writer *w, const char *key, int group_size, double value,
                     const char *unit) {
  sqlite3_stmt *q = w->ins;
  sqlite3_reset(q);
  sqlite3_bind_int64(q, 1, w->c->id);
  sqlite3_bind_text(q, 2, w->c->created_at, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 3, w->c->device, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 4, w->c->host, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, 5, w->c->threads);
  sqlite3_bind_int(q, 6, w->c->world);
  sqlite3_bind_text(q, 7, key, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, 8, group_size);
  sqlite3_bind_double(q, 9, value);
  sqlite3_bind_text(q, 10, unit, -1, SQLITE_STATIC);
  int rc = sqlite3_step(q);
  return rc == SQLITE_DONE ? MP_OK : db_fail(ctx, w->db, w->path, rc, "inserting a calibration row");
}

static mp_status write_rows(mp_ctx *ctx, writer *w) {
  const mp_calib *c = w->c;
  char key[96];
  for (int i = 0; i < c->n_gemm; i++) {
    const mp_calib_gemm *g = &c->gemm[i];
    snprintf(key, sizeof key, "gemm.%s.%dx%dx%d", g->backward ? "bwd" : "fwd", g->N, g->K, g->M);
    MP_CHECK(put(ctx, w, key, 1, g->flops_per_s, "FLOP/s"));
  }
  if (c->copy_GBps > 0) MP_CHECK(put(ctx, w, "copy", 1, c->copy_GBps, "GB/s"));
  for (int i = 0; i < c->n_coll; i++) {
    const mp_calib_coll_fit *f = &c->coll[i];
    const char *name = mp_calib_coll_name(f->coll);
    for (int k = 0; k < f->n_sizes; k++) {
      snprintf(key, sizeof key, "%s.time.%.0f", name, f->bytes[k]);
      MP_CHECK(put(ctx, w, key, f->group_size, f->time_s[k], "s"));
      snprintf(key, sizeof key, "%s.busbw.%.0f", name, f->bytes[k]);
      MP_CHECK(put(ctx, w, key, f->group_size, f->busbw_GBps[k], "GB/s"));
    }
    snprintf(key, sizeof key, "%s.alpha", name);
    MP_CHECK(put(ctx, w, key, f->group_size, f->alpha_s, "s"));
    snprintf(key, sizeof key, "%s.beta", name);
    MP_CHECK(put(ctx, w, key, f->group_size, f->beta_GBps, "GB/s"));
  }
  return MP_OK;
}

mp_status mp_calib_store_save(mp_ctx *ctx, const char *db_path, mp_calib *c) {
  sqlite3 *db = NULL;
  MP_CHECK(open_db(ctx, db_path, &db));
  writer w = {db, NULL, db_path, c};
  mp_status s = MP_OK;
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  if (rc != SQLITE_OK) {
    s = db_fail(ctx, db, db_path, rc, "locking for a calibration");
    goto done;
  }
  rc = sqlite3_exec(db, k_schema, NULL, NULL, NULL);
  if (rc != SQLITE_OK) {
    s = db_fail(ctx, db, db_path, rc, "creating the calibrations table");
    goto done;
  }
  rc = sqlite3_prepare_v2(db, "SELECT coalesce(max(id), 0) + 1 FROM calibrations", -1, &q, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_step(q);
  if (rc != SQLITE_ROW) {
    s = db_fail(ctx, db, db_path, rc, "allocating a calibration id");
    goto done;
  }
  int64_t id = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  q = NULL;
  rc = sqlite3_prepare_v2(db,
                          "INSERT INTO calibrations (id, created_at, device, host, threads, world, key,"
                          " group_size, value, unit) VALUES (?,?,?,?,?,?,?,?,?,?)",
                          -1, &w.ins, NULL);
  if (rc != SQLITE_OK) {
    s = db_fail(ctx, db, db_path, rc, "preparing the calibration insert");
    goto done;
  }
  int64_t old_id = c->id;
  c->id = id;
  s = write_rows(ctx, &w);
  if (s == MP_OK) {
    rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) s = db_fail(ctx, db, db_path, rc, "committing the calibration");
  }
  if (s != MP_OK) c->id = old_id;
done:
  sqlite3_finalize(q);
  sqlite3_finalize(w.ins);
  if (s != MP_OK) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(db);
  return s;
}

static int coll_from_name(const char *s, size_t n) {
  for (int k = 0; k < MP_CALIB_COLL_COUNT; k++) {
    const char *name = mp_calib_coll_name((mp_calib_coll)k);
    if (strlen(name) == n && strncmp(s, name, n) == 0) return k;
  }
  return -1;
}

/* The fit for (coll, group_size), appended when new. */
static mp_calib_coll_fit *fit_for(mp_calib *c, int coll, int g) {
  for (int i = 0; i < c->n_coll; i++)
    if ((int)c->coll[i].coll == coll && c->coll[i].group_size == g) return &c->coll[i];
  if (c->n_coll >= MP_CALIB_MAX_GROUPS * MP_CALIB_COLL_COUNT) return NULL;
  mp_calib_coll_fit *f = &c->coll[c->n_coll++];
  memset(f, 0, sizeof *f);
  f->coll = (mp_calib_coll)coll;
  f->group_size = g;
  return f;
}

/* One row into *c; a key this build does not know is an error (a newer meshplan wrote it
 * or the row is damaged), never silently dropped. */
static mp_status read_row(mp_ctx *ctx, const char *path, mp_calib *c, const char *key, int g,
                          double v) {
  int bwd, N, K, M, used = 0;
  char pass[4];
  if (sscanf(key, "gemm.%3[a-z].%dx%dx%d%n", pass, &N, &K, &M, &used) == 4 && key[used] == '\0' &&
      (strcmp(pass, "fwd") == 0 || strcmp(pass, "bwd") == 0)) {
    bwd = strcmp(pass, "bwd") == 0;
    if (c->n_gemm >= MP_CALIB_MAX_GEMM) goto bad;
    mp_calib_gemm *e = &c->gemm[c->n_gemm++];
    e->backward = bwd;
    e->N = N;
    e->K = K;
    e->M = M;
    e->flops_per_s = v;
    return MP_OK;
  }
  if (strcmp(key, "copy") == 0) {
    c->copy_GBps = v;
    return MP_OK;
  }
  const char *dot = strchr(key, '.');
  if (dot == NULL) goto bad;
  int coll = coll_from_name(key, (size_t)(dot - key));
  if (coll < 0) goto bad;
  mp_calib_coll_fit *f = fit_for(c, coll, g);
  if (f == NULL) goto bad;
  const char *what = dot + 1;
  if (strcmp(what, "alpha") == 0) {
    f->alpha_s = v;
    return MP_OK;
  }
  if (strcmp(what, "beta") == 0) {
    f->beta_GBps = v;
    return MP_OK;
  }
  double bytes;
  int is_time = strncmp(what, "time.", 5) == 0, is_bw = strncmp(what, "busbw.", 6) == 0;
  if (!is_time && !is_bw) goto bad;
  if (sscanf(what + (is_time ? 5 : 6), "%lf%n", &bytes, &used) != 1 || what[(is_time ? 5 : 6) + used] != '\0')
    goto bad;
  int k = 0;
  while (k < f->n_sizes && f->bytes[k] != bytes) k++;
  if (k == f->n_sizes) {
    if (f->n_sizes >= MP_CALIB_MAX_SIZES) goto bad;
    f->bytes[f->n_sizes++] = bytes;
  }
  if (is_time)
    f->time_s[k] = v;
  else
    f->busbw_GBps[k] = v;
  return MP_OK;
bad:
  return mp_error(ctx, MP_ERR_DB, "%s: calibration %lld has a row this meshplan cannot read (key '%s', group %d); "
                  "recalibrate with meshplan calibrate", path, (long long)c->id, key, g);
}

mp_status mp_calib_store_load(mp_ctx *ctx, const char *db_path, const char *device, mp_calib *out) {
  memset(out, 0, sizeof *out);
  if (access(db_path, F_OK) != 0)
    return mp_error(ctx, MP_ERR_NOT_FOUND, "no database at %s; run `meshplan calibrate --device %s --db %s` first",
                    db_path, device, db_path);
  sqlite3 *db = NULL;
  MP_CHECK(open_db(ctx, db_path, &db));
  mp_status s = MP_OK;
  sqlite3_stmt *q = NULL;
  int64_t has_table = 0;
  int rc = sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='calibrations'",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_step(q);
  if (rc != SQLITE_ROW) {
    s = db_fail(ctx, db, db_path, rc, "looking for calibrations");
    goto done;
  }
  has_table = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  q = NULL;
  if (has_table) {
    /* One statement: the newest id and its rows in one read, so a calibration saved in
     * between cannot mix with it. */
    rc = sqlite3_prepare_v2(db,
                            "SELECT id, created_at, host, threads, world, key, group_size, value FROM calibrations"
                            " WHERE device = ?1 AND id = (SELECT max(id) FROM calibrations WHERE device = ?1)"
                            " ORDER BY rowid",
                            -1, &q, NULL);
    if (rc != SQLITE_OK) {
      s = db_fail(ctx, db, db_path, rc, "reading calibrations");
      goto done;
    }
    sqlite3_bind_text(q, 1, device, -1, SQLITE_TRANSIENT);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
      if (out->id == 0) {
        out->id = sqlite3_column_int64(q, 0);
        snprintf(out->created_at, sizeof out->created_at, "%s", (const char *)sqlite3_column_text(q, 1));
        snprintf(out->device, sizeof out->device, "%s", device);
        snprintf(out->host, sizeof out->host, "%s", (const char *)sqlite3_column_text(q, 2));
        out->threads = sqlite3_column_int(q, 3);
        out->world = sqlite3_column_int(q, 4);
      }
      s = read_row(ctx, db_path, out, (const char *)sqlite3_column_text(q, 5), sqlite3_column_int(q, 6),
                   sqlite3_column_double(q, 7));
      if (s != MP_OK) goto done;
    }
    if (rc != SQLITE_DONE) {
      s = db_fail(ctx, db, db_path, rc, "reading calibrations");
      goto done;
    }
  }
  if (out->id == 0)
    s = mp_error(ctx, MP_ERR_NOT_FOUND, "%s holds no %s calibration; run `meshplan calibrate --device %s --db %s`",
                 db_path, device, device, db_path);
done:
  sqlite3_finalize(q);
  sqlite3_close(db);
  return s;
}
