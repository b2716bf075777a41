/* Calibrations in the meshplan database (see store.h); the file, its checks and settings
 * are store/db.h's.
 *
 * Invariants: a save is one BEGIN IMMEDIATE transaction (table creation, id allocation
 * and every row), rolled back on any failure; a load reads one calibration id's rows in
 * rowid order, which is the order they were saved in, so gemm[] and coll[] come back in
 * measurement order. */
#define _GNU_SOURCE
#include "calib/store.h"

#include <sqlite3.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/db.h"

static const char k_schema[] =
    "CREATE TABLE IF NOT EXISTS calibrations ("
    "  id INTEGER NOT NULL,"
    "  created_at TEXT NOT NULL, device TEXT NOT NULL, host TEXT NOT NULL,"
    "  threads INTEGER NOT NULL, world INTEGER NOT NULL,"
    "  key TEXT NOT NULL, group_size INTEGER NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS calibrations_device_id ON calibrations(device, id);"
    /* a cuda calibration's text (device name, profile, why a figure is missing); a table
     * of its own so that `calibrations` keeps one number per row */
    "CREATE TABLE IF NOT EXISTS calibration_notes ("
    "  id INTEGER NOT NULL, key TEXT NOT NULL, text TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS calibration_notes_id ON calibration_notes(id);";

mp_status mp_calib_store_check(mp_ctx *ctx, const char *db_path) {
  mp_db *db = NULL;
  MP_CHECK(mp_db_open(ctx, db_path, &db));
  mp_db_close(db);
  return MP_OK;
}

typedef struct writer {
  mp_db *db;
  sqlite3_stmt *ins, *note;
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
  return rc == SQLITE_DONE ? MP_OK : mp_db_err(ctx, w->db, rc, "inserting a calibration row");
}

static mp_status put_note(mp_ctx *ctx, writer *w, const char *key, const char *text) {
  if (text == NULL || text[0] == '\0') return MP_OK;
  sqlite3_stmt *q = w->note;
  sqlite3_reset(q);
  sqlite3_bind_int64(q, 1, w->c->id);
  sqlite3_bind_text(q, 2, key, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 3, text, -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(q);
  return rc == SQLITE_DONE ? MP_OK : mp_db_err(ctx, w->db, rc, "inserting a calibration note");
}

/* The kernel rows (see store.h for the keys): every one for cuda; for cpu those it holds
 * (a calibration of GEMM and copy only writes none of them, and loads back the same). */
static mp_status write_kernel_rows(mp_ctx *ctx, writer *w) {
  const mp_calib *c = w->c;
  const int cuda = strcmp(c->device, "cuda") == 0;
  char key[96];
  if (cuda) {
    MP_CHECK(put_note(ctx, w, "gpu.name", c->gpu_name));
    MP_CHECK(put_note(ctx, w, "gpu.profile", c->gpu_profile));
    MP_CHECK(put_note(ctx, w, "attn.unavailable", c->attn_unavailable));
    MP_CHECK(put_note(ctx, w, "f8.unavailable", c->f8_unavailable));
    MP_CHECK(put(ctx, w, "gpu.cc", 1, c->compute_capability, "sm"));
  }
  if (cuda || c->ref_bf16_tflops > 0) {
    MP_CHECK(put(ctx, w, "ref.bf16_tflops", 1, c->ref_bf16_tflops, "TFLOP/s"));
    MP_CHECK(put(ctx, w, "ref.fp8_tflops", 1, c->ref_fp8_tflops, "TFLOP/s"));
    MP_CHECK(put(ctx, w, "ref.hbm_GBps", 1, c->ref_hbm_GBps, "GB/s"));
  }
  if (cuda || c->launch_s > 0) MP_CHECK(put(ctx, w, "launch", 1, c->launch_s, "s"));
  for (int i = 0; i < c->n_attn; i++) {
    const mp_calib_attn *a = &c->attn[i];
    snprintf(key, sizeof key, "attn.%s.%dx%dx%dx%dx%d", a->backward ? "bwd" : "fwd", a->B, a->T, a->nh, a->nkv,
             a->hd);
    MP_CHECK(put(ctx, w, key, 1, a->flops_per_s, "FLOP/s"));
  }
  for (int i = 0; i < c->n_bw; i++) {
    snprintf(key, sizeof key, "bw.%s.%.0f", mp_calib_bw_name(c->bw[i].kernel), c->bw[i].elems);
    MP_CHECK(put(ctx, w, key, 1, c->bw[i].GBps, "GB/s"));
  }
  for (int i = 0; i < c->n_f8; i++) {
    const mp_calib_gemm *g = &c->f8[i];
    snprintf(key, sizeof key, "f8gemm.%s.%dx%dx%d", mp_calib_gemm_pass_name(g->pass), g->N, g->K, g->M);
    MP_CHECK(put(ctx, w, key, 1, g->flops_per_s, "FLOP/s"));
  }
  const mp_calib_stack_fit *f = &c->fit;
  if (!cuda && !(f->gemm_eff_max > 0)) return MP_OK;
  MP_CHECK(put(ctx, w, "fit.gemm_eff_max", 1, f->gemm_eff_max, "1"));
  MP_CHECK(put(ctx, w, "fit.gemm_eff_half_mnk", 1, f->gemm_eff_half_mnk, "mnk"));
  MP_CHECK(put(ctx, w, "fit.gemm_curve_rms", 1, f->gemm_curve_rms, "1"));
  MP_CHECK(put(ctx, w, "fit.gemm_table_rms", 1, f->gemm_table_rms, "1"));
  MP_CHECK(put(ctx, w, "fit.gemm_table", 1, f->gemm_table, "bool"));
  MP_CHECK(put(ctx, w, "fit.fp8_gemm_eff_max", 1, f->fp8_gemm_eff_max, "1"));
  MP_CHECK(put(ctx, w, "fit.attention_eff", 1, f->attention_eff, "1"));
  MP_CHECK(put(ctx, w, "fit.hbm_eff", 1, f->hbm_eff, "1"));
  MP_CHECK(put(ctx, w, "fit.kernel_overhead_us", 1, f->kernel_overhead_us, "us"));
  if (!cuda) return MP_OK; /* cpu: no float8 points, so no float8 table */
  MP_CHECK(put(ctx, w, "fit.fp8_gemm_curve_rms", 1, f->fp8_gemm_curve_rms, "1"));
  MP_CHECK(put(ctx, w, "fit.fp8_gemm_table_rms", 1, f->fp8_gemm_table_rms, "1"));
  MP_CHECK(put(ctx, w, "fit.fp8_gemm_table", 1, f->fp8_gemm_table, "bool"));
  return MP_OK;
}

static mp_status write_rows(mp_ctx *ctx, writer *w) {
  const mp_calib *c = w->c;
  char key[96];
  for (int i = 0; i < c->n_gemm; i++) {
    const mp_calib_gemm *g = &c->gemm[i];
    snprintf(key, sizeof key, "gemm.%s.%dx%dx%d", mp_calib_gemm_pass_name(g->pass), g->N, g->K, g->M);
    MP_CHECK(put(ctx, w, key, 1, g->flops_per_s, "FLOP/s"));
  }
  if (c->copy_GBps > 0) MP_CHECK(put(ctx, w, "copy", 1, c->copy_GBps, "GB/s"));
  MP_CHECK(write_kernel_rows(ctx, w));
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

/* The two inserts of a save, on w->db. */
static mp_status prepare_writer(mp_ctx *ctx, writer *w) {
  sqlite3 *h = mp_db_sqlite(w->db);
  int rc = sqlite3_prepare_v2(h,
                              "INSERT INTO calibrations (id, created_at, device, host, threads, world, key,"
                              " group_size, value, unit) VALUES (?,?,?,?,?,?,?,?,?,?)",
                              -1, &w->ins, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(h, "INSERT INTO calibration_notes (id, key, text) VALUES (?,?,?)", -1, &w->note, NULL);
  return rc == SQLITE_OK ? MP_OK : mp_db_err(ctx, w->db, rc, "preparing the calibration insert");
}

mp_status mp_calib_store_save(mp_ctx *ctx, const char *db_path, mp_calib *c) {
  mp_db *db = NULL;
  MP_CHECK(mp_db_open(ctx, db_path, &db));
  writer w = {db, NULL, NULL, c};
  int64_t id = 0;
  /* One attempt at the lock: a save waits the busy timeout (MP_STORE_BUSY_TIMEOUT_MS) for
   * another writer, then fails (mp_db_begin_write would keep asking for
   * MP_STORE_WRITE_WAIT_S). */
  mp_status s = mp_db_exec(ctx, db, "BEGIN IMMEDIATE", "locking for a calibration");
  if (s == MP_OK) s = mp_db_exec(ctx, db, k_schema, "creating the calibrations table");
  if (s == MP_OK)
    s = mp_db_query_i64(ctx, db, "SELECT coalesce(max(id), 0) + 1 FROM calibrations", "allocating a calibration id",
                        &id);
  if (s == MP_OK) s = prepare_writer(ctx, &w);
  if (s == MP_OK) {
    int64_t old_id = c->id;
    c->id = id;
    s = write_rows(ctx, &w);
    if (s == MP_OK) s = mp_db_exec(ctx, db, "COMMIT", "committing the calibration");
    if (s != MP_OK) c->id = old_id;
  }
  sqlite3_finalize(w.ins);
  sqlite3_finalize(w.note);
  if (s != MP_OK) mp_db_rollback(db);
  mp_db_close(db);
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

/* One row into *c; a key this build does not know is an error (another meshplan wrote it
 * or the row is damaged), never silently dropped. */
static int pass_from_name(const char *s) {
  for (int p = 0; p < MP_CALIB_GEMM_PASS_COUNT; p++)
    if (strcmp(s, mp_calib_gemm_pass_name(p)) == 0) return p;
  return -1;
}

/* The scalar rows of the kernels and their fit; 1 when key is one of them. */
static int read_scalar(mp_calib *c, const char *key, double v) {
  static const struct {
    const char *key;
    size_t off;
  } k[] = {
      {"ref.bf16_tflops", offsetof(mp_calib, ref_bf16_tflops)},
      {"ref.fp8_tflops", offsetof(mp_calib, ref_fp8_tflops)},
      {"ref.hbm_GBps", offsetof(mp_calib, ref_hbm_GBps)},
      {"launch", offsetof(mp_calib, launch_s)},
      {"fit.gemm_eff_max", offsetof(mp_calib, fit.gemm_eff_max)},
      {"fit.gemm_eff_half_mnk", offsetof(mp_calib, fit.gemm_eff_half_mnk)},
      {"fit.gemm_curve_rms", offsetof(mp_calib, fit.gemm_curve_rms)},
      {"fit.gemm_table_rms", offsetof(mp_calib, fit.gemm_table_rms)},
      {"fit.fp8_gemm_eff_max", offsetof(mp_calib, fit.fp8_gemm_eff_max)},
      {"fit.fp8_gemm_curve_rms", offsetof(mp_calib, fit.fp8_gemm_curve_rms)},
      {"fit.fp8_gemm_table_rms", offsetof(mp_calib, fit.fp8_gemm_table_rms)},
      {"fit.attention_eff", offsetof(mp_calib, fit.attention_eff)},
      {"fit.hbm_eff", offsetof(mp_calib, fit.hbm_eff)},
      {"fit.kernel_overhead_us", offsetof(mp_calib, fit.kernel_overhead_us)},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (strcmp(key, k[i].key) == 0) {
      *(double *)((char *)c + k[i].off) = v;
      return 1;
    }
  if (strcmp(key, "gpu.cc") == 0) {
    c->compute_capability = (int)v;
    return 1;
  }
  if (strcmp(key, "fit.gemm_table") == 0) {
    c->fit.gemm_table = v != 0;
    return 1;
  }
  if (strcmp(key, "fit.fp8_gemm_table") == 0) {
    c->fit.fp8_gemm_table = v != 0;
    return 1;
  }
  return 0;
}

/* The kernel point rows (attention, bandwidth, float8); 1 when key is one of them, -1
 * when it is one but does not fit in c. */
static int read_point(mp_calib *c, const char *key, double v) {
  int B, T, nh, nkv, hd, N, K, M, used = 0;
  char name[24];
  if (sscanf(key, "attn.%3[a-z].%dx%dx%dx%dx%d%n", name, &B, &T, &nh, &nkv, &hd, &used) == 6 && key[used] == '\0' &&
      (strcmp(name, "fwd") == 0 || strcmp(name, "bwd") == 0)) {
    if (c->n_attn >= MP_CALIB_MAX_ATTN) return -1;
    mp_calib_attn *a = &c->attn[c->n_attn++];
    a->backward = strcmp(name, "bwd") == 0;
    a->B = B, a->T = T, a->nh = nh, a->nkv = nkv, a->hd = hd;
    a->flops_per_s = v;
    return 1;
  }
  double elems;
  if (sscanf(key, "bw.%23[a-z_].%lf%n", name, &elems, &used) == 2 && key[used] == '\0') {
    int k = 0;
    while (k < MP_CALIB_BW_COUNT && strcmp(name, mp_calib_bw_name(k)) != 0) k++;
    if (k == MP_CALIB_BW_COUNT || c->n_bw >= MP_CALIB_MAX_BW) return -1;
    mp_calib_bw *b = &c->bw[c->n_bw++];
    b->kernel = k;
    b->elems = elems;
    b->GBps = v;
    return 1;
  }
  /* f8gemm.<pass>: fwd (every calibration with float8), dgrad and wgrad (where float8
   * was measured by pass); never bwd */
  if (sscanf(key, "f8gemm.%7[a-z].%dx%dx%d%n", name, &N, &K, &M, &used) == 4 && key[used] == '\0') {
    const int pass = pass_from_name(name);
    if (pass != MP_CALIB_GEMM_FWD && pass != MP_CALIB_GEMM_DGRAD && pass != MP_CALIB_GEMM_WGRAD) return -1;
    if (c->n_f8 >= MP_CALIB_MAX_F8) return -1;
    mp_calib_gemm *g = &c->f8[c->n_f8++];
    g->pass = pass;
    g->N = N, g->K = K, g->M = M;
    g->flops_per_s = v;
    return 1;
  }
  return 0;
}

static mp_status read_row(mp_ctx *ctx, const char *path, mp_calib *c, const char *key, int g,
                          double v) {
  int N, K, M, used = 0;
  char pass[8];
  if (sscanf(key, "gemm.%7[a-z].%dx%dx%d%n", pass, &N, &K, &M, &used) == 4 && key[used] == '\0' &&
      pass_from_name(pass) >= 0) {
    if (c->n_gemm >= MP_CALIB_MAX_GEMM) goto bad;
    mp_calib_gemm *e = &c->gemm[c->n_gemm++];
    e->pass = pass_from_name(pass);
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
  if (read_scalar(c, key, v)) return MP_OK;
  int pt = read_point(c, key, v);
  if (pt > 0) return MP_OK;
  if (pt < 0) goto bad;
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

/* The notes of calibration out->id (none when the table is absent: a file whose
 * calibrations all predate it). Its rows were committed with the figures' rows, so
 * reading them after those needs no shared snapshot. */
static mp_status read_notes(mp_ctx *ctx, mp_db *db, mp_calib *out) {
  int64_t has = 0;
  MP_CHECK(mp_db_query_i64(ctx, db, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='calibration_notes'",
                           "looking for calibration notes", &has));
  if (!has) return MP_OK;
  sqlite3_stmt *q = NULL;
  mp_status s = MP_OK;
  int rc = sqlite3_prepare_v2(mp_db_sqlite(db), "SELECT key, text FROM calibration_notes WHERE id = ?1 ORDER BY rowid",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) {
    s = mp_db_err(ctx, db, rc, "reading calibration notes");
    goto done;
  }
  sqlite3_bind_int64(q, 1, out->id);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const char *key = (const char *)sqlite3_column_text(q, 0), *text = (const char *)sqlite3_column_text(q, 1);
    char *dst = NULL;
    size_t cap = 0;
    if (key && strcmp(key, "gpu.name") == 0) dst = out->gpu_name, cap = sizeof out->gpu_name;
    else if (key && strcmp(key, "gpu.profile") == 0) dst = out->gpu_profile, cap = sizeof out->gpu_profile;
    else if (key && strcmp(key, "attn.unavailable") == 0) dst = out->attn_unavailable, cap = sizeof out->attn_unavailable;
    else if (key && strcmp(key, "f8.unavailable") == 0) dst = out->f8_unavailable, cap = sizeof out->f8_unavailable;
    if (dst == NULL) {
      s = mp_error(ctx, MP_ERR_DB, "%s: calibration %lld has a note this meshplan cannot read (key '%s'); "
                   "recalibrate with meshplan calibrate", mp_db_path(db), (long long)out->id, key ? key : "(null)");
      goto done;
    }
    snprintf(dst, cap, "%s", text ? text : "");
  }
  if (rc != SQLITE_DONE) s = mp_db_err(ctx, db, rc, "reading calibration notes");
done:
  sqlite3_finalize(q);
  return s;
}

/* The rows of device's newest calibration into *out (out->id stays 0 when there is none). */
static mp_status read_newest(mp_ctx *ctx, mp_db *db, const char *device, mp_calib *out) {
  /* One statement: the newest id and its rows in one read, so a calibration saved in
   * between cannot mix with it. */
  sqlite3_stmt *q = NULL;
  mp_status s = MP_OK;
  int rc = sqlite3_prepare_v2(mp_db_sqlite(db),
                              "SELECT id, created_at, host, threads, world, key, group_size, value FROM calibrations"
                              " WHERE device = ?1 AND id = (SELECT max(id) FROM calibrations WHERE device = ?1)"
                              " ORDER BY rowid",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) {
    s = mp_db_err(ctx, db, rc, "reading calibrations");
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
    s = read_row(ctx, mp_db_path(db), out, (const char *)sqlite3_column_text(q, 5), sqlite3_column_int(q, 6),
                 sqlite3_column_double(q, 7));
    if (s != MP_OK) goto done;
  }
  if (rc != SQLITE_DONE) s = mp_db_err(ctx, db, rc, "reading calibrations");
done:
  sqlite3_finalize(q);
  return s;
}

mp_status mp_calib_store_load(mp_ctx *ctx, const char *db_path, const char *device, mp_calib *out) {
  memset(out, 0, sizeof *out);
  if (access(db_path, F_OK) != 0)
    return mp_error(ctx, MP_ERR_NOT_FOUND, "no database at %s; run `meshplan calibrate --device %s --db %s` first",
                    db_path, device, db_path);
  mp_db *db = NULL;
  MP_CHECK(mp_db_open(ctx, db_path, &db));
  int64_t has_table = 0;
  mp_status s = mp_db_query_i64(ctx, db, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='calibrations'",
                                "looking for calibrations", &has_table);
  if (s == MP_OK && has_table) s = read_newest(ctx, db, device, out);
  if (s == MP_OK && out->id == 0)
    s = mp_error(ctx, MP_ERR_NOT_FOUND, "%s holds no %s calibration; run `meshplan calibrate --device %s --db %s`",
                 db_path, device, device, db_path);
  if (s == MP_OK) s = read_notes(ctx, db, out);
  mp_db_close(db);
  return s;
}
