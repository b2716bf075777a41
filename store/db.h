/* A meshplan database file (default meshplan.db): opening it, knowing it is meshplan's,
 * bringing its schema to this build's version, and writing to it beside other processes.
 * The tables' rows are read and written by their owners on the connection this gives:
 * planner/store.h (runs, plans, predictions, measurements) and calib/store.h
 * (calibrations, calibration_notes).
 *
 * Schema: version MP_STORE_SCHEMA_VERSION; the migrations (db.c, k_migrations) create and
 * alter the planner's tables, migration i taking the file from version i to i + 1, and
 * opening a file of a lower version runs the missing ones in order inside one transaction.
 * The version is kept in the table schema_version (one row) and in the header's
 * user_version. What each table and column means, and what each version added, is in
 * planner/store.h. The calibration tables are not part of the schema version: calib
 * creates them IF NOT EXISTS when it first saves, and the identity check accepts them (and
 * any other table) beside the migrations' tables.
 *
 * Identity: the file's header carries MP_STORE_APPLICATION_ID and the schema version
 * (PRAGMA application_id, user_version), and its tables must be exactly those of its
 * version (the migrations, replayed in memory, are the reference); a meshplan file from
 * before the header was stamped is recognised by its tables and stamped on its next
 * migration. A file that is not SQLite, is corrupt, or is any other program's database
 * (another application_id, another schema, a schema_version table that does not hold one
 * integer) is MP_ERR_DB with "<path> is not a meshplan database or is corrupt; move it
 * aside or pass --db", and nothing is written into it. A newer version is MP_ERR_DB saying
 * "upgrade meshplan". A path that is a directory, FIFO or device is MP_ERR_INVALID.
 *
 * Concurrency: WAL mode (readers run beside a writer), synchronous=NORMAL, a busy timeout
 * of MP_STORE_BUSY_TIMEOUT_MS on every connection; mp_db_begin_write starts a write
 * transaction with BEGIN IMMEDIATE, repeated while other writers hold the lock for up to
 * MP_STORE_WRITE_WAIT_S, so a second writer waits for the first instead of failing.
 *
 * Errors: SQLITE_NOTADB and SQLITE_CORRUPT from any statement are the identity refusal
 * above; every other SQLite failure is MP_ERR_DB "<path>: <what>: <SQLite's message>". */
#ifndef MP_STORE_DB_H
#define MP_STORE_DB_H

#include <sqlite3.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_STORE_SCHEMA_VERSION 11
/* PRAGMA application_id of a meshplan database: "MPLN" in ASCII. */
#define MP_STORE_APPLICATION_ID 0x4D504C4E
#define MP_STORE_BUSY_TIMEOUT_MS 60000
/* How long a writer keeps asking for the write lock before giving up, seconds. */
#define MP_STORE_WRITE_WAIT_S 600

typedef struct mp_db mp_db;

/* Opens path (creating it when absent), checks that it is a meshplan database (refusals
 * above; a refused file is left as it was), migrates it to MP_STORE_SCHEMA_VERSION and
 * stamps its header, then switches it to WAL with synchronous=NORMAL. A new file gets
 * 64 KiB pages. On failure *out is NULL and nothing stays open. */
mp_status mp_db_open(mp_ctx *ctx, const char *path, mp_db **out);
/* Closes the connection; the caller has finalized its statements. NULL is a no-op. An
 * open transaction is rolled back by SQLite. */
void mp_db_close(mp_db *db);

/* The path as opened (for messages). */
const char *mp_db_path(const mp_db *db);
/* The connection, for the tables' owners to prepare their statements on; valid until
 * mp_db_close. */
sqlite3 *mp_db_sqlite(mp_db *db);

/* The status and message of SQLite result code rc from an operation described by what
 * ("writing a plan"): the identity refusal for SQLITE_NOTADB / SQLITE_CORRUPT, otherwise
 * MP_ERR_DB "<path>: <what>: <sqlite3_errmsg>". */
mp_status mp_db_err(mp_ctx *ctx, mp_db *db, int rc, const char *what);
/* Runs sql (one or more statements, no results); a failure is mp_db_err(what). */
mp_status mp_db_exec(mp_ctx *ctx, mp_db *db, const char *sql, const char *what);
/* The first column of the first row of sql as an integer ("SELECT count(*) FROM runs"),
 * 0 when it returns no row; a failure is mp_db_err(what). */
mp_status mp_db_query_i64(mp_ctx *ctx, mp_db *db, const char *sql, const char *what, int64_t *out);

/* BEGIN IMMEDIATE: the write lock now, waiting for other writers up to
 * MP_STORE_WRITE_WAIT_S; then MP_ERR_DB naming what and the wait. The caller ends the
 * transaction with mp_db_exec("COMMIT") or mp_db_rollback. */
mp_status mp_db_begin_write(mp_ctx *ctx, mp_db *db, const char *what);
/* Rolls back the open transaction; none open is a no-op. */
void mp_db_rollback(mp_db *db);

#ifdef __cplusplus
}
#endif
#endif
