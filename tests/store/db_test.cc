// Tests of the database file layer (store/db.h): a new file is stamped as meshplan's at
// the current schema version with WAL and 64 KiB pages; a failing statement's message
// names the path and the operation; another program's SQLite file and a directory are
// refused through calibration's entry points (calib/store.h) exactly as through the
// planner's, and the refused file is left byte for byte as it was.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "calib/store.h"
#include "store/db.h"
#include "tests/tmp_path.h"

namespace {

int64_t Q(mp_db *db, const char *sql) {
  mp_ctx c;
  mp_ctx_init(&c);
  int64_t v = -1;
  EXPECT_EQ(mp_db_query_i64(&c, db, sql, "test query", &v), MP_OK) << mp_errmsg(&c);
  return v;
}

std::string Slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST(Db, NewFileIsStampedInWalWithLargePages) {
  const std::string path = FreshDbPath("new.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_db *db = nullptr;
  ASSERT_EQ(mp_db_open(&ctx, path.c_str(), &db), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(std::string(mp_db_path(db)), path);
  EXPECT_EQ(Q(db, "PRAGMA application_id"), MP_STORE_APPLICATION_ID);
  EXPECT_EQ(Q(db, "PRAGMA user_version"), MP_STORE_SCHEMA_VERSION);
  EXPECT_EQ(Q(db, "SELECT version FROM schema_version"), MP_STORE_SCHEMA_VERSION);
  EXPECT_EQ(Q(db, "PRAGMA page_size"), 65536);
  EXPECT_EQ(Q(db, "SELECT count(*) FROM pragma_journal_mode WHERE journal_mode='wal'"), 1);
  EXPECT_EQ(Q(db, "PRAGMA synchronous"), 1);  // NORMAL
  mp_db_close(db);
  mp_db_close(nullptr);
}

// A failing statement says where and what: "<path>: <what>: <SQLite's message>"; a
// rolled-back write leaves nothing.
TEST(Db, ErrorsNameThePathAndTheOperation) {
  const std::string path = FreshDbPath("err.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_db *db = nullptr;
  ASSERT_EQ(mp_db_open(&ctx, path.c_str(), &db), MP_OK) << mp_errmsg(&ctx);
  int64_t v = 0;
  EXPECT_EQ(mp_db_query_i64(&ctx, db, "SELECT nope FROM runs", "counting songs", &v), MP_ERR_DB);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), path + ": counting songs: no such column: nope");
  EXPECT_EQ(mp_db_exec(&ctx, db, "INSERT INTO nowhere VALUES (1)", "filing a song"), MP_ERR_DB);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), path + ": filing a song: no such table: nowhere");
  ASSERT_EQ(mp_db_begin_write(&ctx, db, "test"), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_db_exec(&ctx, db, "CREATE TABLE scratch (x)", "test"), MP_OK) << mp_errmsg(&ctx);
  mp_db_rollback(db);
  EXPECT_EQ(Q(db, "SELECT count(*) FROM sqlite_master WHERE name='scratch'"), 0);
  mp_db_close(db);
}

// Calibration opens the file through the same identity check as the planner: another
// program's database is refused by check, save and load with the planner's message, and
// none of them writes into it or switches it to WAL.
TEST(Db, ForeignFileRefusedThroughCalibAndNeverWritten) {
  const std::string path = FreshDbPath("photos.db");
  sqlite3 *h = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "CREATE TABLE photos (id INTEGER, path TEXT)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(h);
  const std::string before = Slurp(path);
  const std::string refusal = path + " is not a meshplan database or is corrupt; move it aside or pass --db";
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_calib_store_check(&ctx, path.c_str()), MP_ERR_DB);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), refusal);
  mp_calib c;
  memset(&c, 0, sizeof c);
  snprintf(c.device, sizeof c.device, "cpu");
  EXPECT_EQ(mp_calib_store_save(&ctx, path.c_str(), &c), MP_ERR_DB);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), refusal);
  EXPECT_EQ(c.id, 0);
  mp_calib got;
  EXPECT_EQ(mp_calib_store_load(&ctx, path.c_str(), "cpu", &got), MP_ERR_DB);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), refusal);
  mp_db *db = nullptr;
  EXPECT_EQ(mp_db_open(&ctx, path.c_str(), &db), MP_ERR_DB);
  EXPECT_EQ(db, nullptr);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), refusal);
  EXPECT_EQ(Slurp(path), before) << "the foreign file was written";
  EXPECT_NE(access((path + "-wal").c_str(), F_OK), 0) << "the foreign file was switched to WAL";
}

TEST(Db, DirectoryRefusedThroughCalib) {
  const std::string dir = FreshDbPath("calib_dir");
  mkdir(dir.c_str(), 0700);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_calib_store_check(&ctx, dir.c_str()), MP_ERR_INVALID);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), dir + ": is a directory, not a regular file; give the path of a file");
}

// The calibration tables, created beside the migrations' tables, leave the file meshplan's.
TEST(Db, CalibrationTablesAreAcceptedBesideTheSchema) {
  const std::string path = FreshDbPath("with_calib.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_calib c;
  memset(&c, 0, sizeof c);
  snprintf(c.created_at, sizeof c.created_at, "2026-11-02T10:00:00Z");
  snprintf(c.device, sizeof c.device, "cpu");
  snprintf(c.host, sizeof c.host, "testhost");
  c.copy_GBps = 10.0;
  ASSERT_EQ(mp_calib_store_save(&ctx, path.c_str(), &c), MP_OK) << mp_errmsg(&ctx);
  mp_db *db = nullptr;
  ASSERT_EQ(mp_db_open(&ctx, path.c_str(), &db), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(Q(db, "SELECT count(*) FROM calibrations WHERE key='copy'"), 1);
  mp_db_close(db);
}

}  // namespace
