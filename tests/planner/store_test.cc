// Tests of the SQLite store (planner/store.h) through whole planner runs
// (planner/planner.h) with the fake evaluator: every candidate logged with its reason,
// ranks, transactional runs under an injected fault, two concurrent writers, a corrupt
// file, schema versions, WAL mode and measurements.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "planner/planner.h"
#include "planner/report.h"
#include "planner/store.h"
#include "tests/planner/fake.h"
#include "tests/tmp_path.h"

namespace {

struct PlannerRun {
  mp_model model = fake_dense_model();
  mp_cluster cluster;
  FakeEval fe;
  mp_planner_request req;
  PlannerRun(int nodes, int gpn, int64_t batch) {
    cluster = fake_cluster(nodes, gpn);
    memset(&req, 0, sizeof req);
    mp_search_config_init(&req.search);
    req.search.model = &model;
    req.search.cluster = &cluster;
    req.search.seq = 4096;
    req.search.global_batch = batch;
    req.search.eval = fake_eval;
    req.search.eval_user = &fe;
    req.search.n_threads = 2;
    req.objective = MP_OBJECTIVE_TIME;
    req.info.model = model.name;
    req.info.cluster = cluster.name;
    req.info.gpu = cluster.gpu.name;
    req.info.n_gpus = nodes * gpn;
    req.info.gpus_per_node = gpn;
    req.info.seq = 4096;
    req.info.global_batch = batch;
    req.info.objective = "time";
    req.info.options_json = "{}";
    req.info.command = "test";
    req.info.tool_version = "test";
    // ranked_only 0: every candidate's row, as plan --log-all and train write them; plan's
    // default is DefaultLogsTheRankedPlansAndTheCountsByRule's
  }
};

int64_t q(mp_store *st, const std::string &sql) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  int64_t v = -1;
  EXPECT_EQ(mp_store_query_i64(&ctx, st, sql.c_str(), &v), MP_OK) << mp_errmsg(&ctx) << " in " << sql;
  return v;
}

TEST(Store, RunLogsEveryCandidateWithReasonsAndRanks) {
  std::string path = FreshDbPath("run.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  PlannerRun r(1, 8, 32);
  mp_planner_result res;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK) << mp_errmsg(&ctx);
  mp_search *s = res.search;
  std::string run = std::to_string(res.run_id);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + run), s->n);
  // Every rejected plan has a rule and a sentence; feasible ones have neither.
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + run +
                      " AND feasible=0 AND (reject_reason IS NULL OR reject_reason='' OR reject_rule IS NULL)"),
            0);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + run + " AND feasible=1 AND reject_reason IS NOT NULL"), 0);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + run + " AND feasible=0"), s->n - s->n_feasible);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + run + " AND reject_rule='memory'"),
            s->n_evaluated - s->n_feasible);
  EXPECT_EQ(q(st, "SELECT count(*) FROM predictions"), s->n_evaluated);
  // Ranks 1..n_feasible, exactly the feasible plans, in the search's order.
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE rank IS NOT NULL"), s->n_feasible);
  EXPECT_EQ(q(st, "SELECT max(rank) FROM plans"), s->n_feasible);
  EXPECT_EQ(q(st, "SELECT idx FROM plans WHERE rank=1"), res.order[0]);
  EXPECT_EQ(q(st, "SELECT best_plan_id FROM runs WHERE id=" + run), s->cands[res.order[0]].plan_id);
  // A specific reason, word for word (dp_replicate=8 mb=1 reshard=1: dp_shard=1).
  char sql[256];
  snprintf(sql, sizeof sql,
           "SELECT count(*) FROM plans WHERE dp_replicate=8 AND reshard=1 AND reject_reason="
           "'reshard_after_forward has no effect with dp_shard=1 (same as reshard off)'");
  EXPECT_EQ(q(st, sql), 18);  // see ReasonCountByHand
  mp_planner_result_free(&res);

  // Reading back for the report.
  mp_arena *a = mp_arena_create();
  mp_run_row *runs = nullptr;
  int64_t n_runs = 0;
  ASSERT_EQ(mp_store_list_runs(&ctx, st, a, &runs, &n_runs), MP_OK);
  ASSERT_EQ(n_runs, 1);
  EXPECT_STREQ(runs[0].model, "fake-dense");
  mp_plan_row *plans = nullptr;
  int64_t n_plans = 0;
  ASSERT_EQ(mp_store_top_plans(&ctx, st, runs[0].id, 5, a, &plans, &n_plans), MP_OK);
  ASSERT_EQ(n_plans, 5);
  for (int i = 0; i < 5; i++) EXPECT_EQ(plans[i].rank, i + 1);
  EXPECT_NEAR(plans[0].step_time_s, runs[0].best_step_time_s, 0);
  mp_arena_destroy(a);
  mp_store_close(st);
}

TEST(Store, ReasonCountByHand) {
  // dp_replicate=8 (tp=pp=cp=dp_shard=1) with global batch 32: per-rank 4, micro-batches
  // 1, 2, 4; x 3 AC x 2 fp8 with reshard on: 18 duplicates of reshard off.
  std::string path = FreshDbPath("reason.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  PlannerRun r(1, 8, 32);
  mp_planner_result res;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE dp_replicate=8 AND reject_rule='reshard_noop'"), 18);
  mp_planner_result_free(&res);
  mp_store_close(st);
}

TEST(Store, FailedRunLeavesPreviousRunsAndNoPartialRun) {
  std::string path = FreshDbPath("fault.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK);
  PlannerRun r(1, 8, 32);
  mp_planner_result res;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK);
  int64_t n1 = res.search->n, ev1 = res.search->n_evaluated;
  mp_planner_result_free(&res);
  // Second run fails after 100 rows (well inside the run).
  mp_store_inject_fault_after(st, 100);
  EXPECT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_ERR_DB);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("injected fault"), std::string::npos);
  EXPECT_EQ(res.search, nullptr);
  mp_store_close(st);
  // A fresh connection sees exactly the first run.
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK);
  EXPECT_EQ(q(st, "SELECT count(*) FROM runs"), 1);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans"), n1);
  EXPECT_EQ(q(st, "SELECT count(*) FROM predictions"), ev1);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id<>1"), 0);
  // And the store still works: a third run commits as run 2 (ids are not reused from the
  // rolled-back run's rows).
  mp_store_inject_fault_after(st, -1);
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "SELECT count(*) FROM runs"), 2);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans"), 2 * n1);
  mp_planner_result_free(&res);
  mp_store_close(st);
}

TEST(Store, TwoConcurrentWritersBothSucceed) {
  std::string path = FreshDbPath("concurrent.db");
  // Both threads open their own connection on a file that does not exist yet, so schema
  // creation, WAL switch and the runs all race.
  mp_status sts[2] = {MP_ERR_INTERNAL, MP_ERR_INTERNAL};
  std::string msgs[2];
  int64_t ns[2] = {0, 0};
  auto work = [&](int i) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_store *st = nullptr;
    sts[i] = mp_store_open(&ctx, path.c_str(), &st);
    if (sts[i] == MP_OK) {
      PlannerRun r(2, 8, 64);
      mp_planner_result res;
      for (int k = 0; k < 3 && sts[i] == MP_OK; k++) {
        sts[i] = mp_planner_run(&ctx, &r.req, st, &res);
        if (sts[i] == MP_OK) ns[i] += res.search->n;
        mp_planner_result_free(&res);
      }
    }
    msgs[i] = mp_errmsg(&ctx);
    mp_store_close(st);
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  ASSERT_EQ(sts[0], MP_OK) << msgs[0];
  ASSERT_EQ(sts[1], MP_OK) << msgs[1];
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK);
  EXPECT_EQ(q(st, "SELECT count(*) FROM runs"), 6);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans"), ns[0] + ns[1]);
  // Each run's rows are contiguous in id: one transaction each, never interleaved.
  EXPECT_EQ(q(st, "SELECT count(*) FROM (SELECT run_id, max(id)-min(id)+1 AS span, count(*) AS n"
                  " FROM plans GROUP BY run_id) WHERE span<>n"),
            0);
  mp_store_close(st);
}

TEST(Store, CorruptFileIsAOneLineError) {
  std::string path = FreshDbPath("corrupt.db");
  FILE *f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  for (int i = 0; i < 4096; i++) fputc("not a database "[i % 15], f);
  fclose(f);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  EXPECT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_ERR_DB);
  EXPECT_EQ(st, nullptr);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)),
            path + " is not a meshplan database or is corrupt; move it aside or pass --db");

  // A valid SQLite file with someone else's tables is refused the same way.
  std::string other = FreshDbPath("other.db");
  sqlite3 *db = nullptr;
  ASSERT_EQ(sqlite3_open(other.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE songs(x)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  EXPECT_EQ(mp_store_open(&ctx, other.c_str(), &st), MP_ERR_DB);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)),
            other + " is not a meshplan database or is corrupt; move it aside or pass --db");
}

TEST(Store, SchemaVersionWalAndNewerVersionRefused) {
  std::string path = FreshDbPath("schema.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK);
  EXPECT_EQ(q(st, "SELECT version FROM schema_version"), MP_STORE_SCHEMA_VERSION);
  mp_store_close(st);
  sqlite3 *db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt *stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ((const char *)sqlite3_column_text(stmt, 0), "wal");
  sqlite3_finalize(stmt);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE schema_version SET version=99; PRAGMA user_version=99", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  EXPECT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_ERR_DB);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("schema version 99, newer than this meshplan"), std::string::npos);
}

TEST(Store, MeasurementsBesidePredictions) {
  std::string path = FreshDbPath("measure.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK);
  PlannerRun r(1, 8, 32);
  mp_planner_result res;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK);
  int64_t best = res.search->cands[res.order[0]].plan_id;
  int64_t run_id = res.run_id;
  mp_planner_result_free(&res);
  // Three steps: 2.0, 1.1, 1.3 s -> median 1.3 s; peaks 10, 12, 11 GiB -> 12 GiB.
  const double times[3] = {2.0, 1.1, 1.3};
  const int64_t peaks[3] = {10, 12, 11};
  for (int i = 0; i < 3; i++) {
    mp_measurement m = {best, i + 1, times[i], peaks[i] * kGiB, 3.5 - 0.1 * i, 5000.0, "fake-gpu"};
    ASSERT_EQ(mp_store_add_measurement(&ctx, st, &m), MP_OK) << mp_errmsg(&ctx);
  }
  mp_measurement bad = {999999, 1, 1.0, 1, 1.0, 1.0, "x"};
  EXPECT_EQ(mp_store_add_measurement(&ctx, st, &bad), MP_ERR_NOT_FOUND);
  EXPECT_EQ(q(st, "SELECT count(*) FROM measurements"), 3);
  EXPECT_EQ(q(st, "SELECT run_id FROM measurements LIMIT 1"), run_id);
  mp_arena *a = mp_arena_create();
  mp_plan_row *plans = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_top_plans(&ctx, st, run_id, 2, a, &plans, &n), MP_OK);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(plans[0].id, best);
  EXPECT_EQ(plans[0].n_measured, 3);
  EXPECT_DOUBLE_EQ(plans[0].measured_step_time_s, 1.3);
  EXPECT_EQ(plans[0].measured_peak_mem_bytes, 12 * kGiB);
  EXPECT_EQ(plans[1].n_measured, 0);
  mp_run_row run;
  EXPECT_EQ(mp_store_get_run(&ctx, st, 12345, &run), MP_ERR_NOT_FOUND);
  mp_arena_destroy(a);
  mp_store_close(st);
}

TEST(Store, NoStoreRunStillRanks) {
  PlannerRun r(1, 8, 32);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_planner_result res;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, nullptr, &res), MP_OK);
  EXPECT_GT(res.n_order, 0);
  EXPECT_EQ(res.run_id, 0);
  mp_planner_result_free(&res);
  r.req.objective = MP_OBJECTIVE_TOKENS_PER_DOLLAR;
  r.req.price_per_gpu_hour = 0;
  EXPECT_EQ(mp_planner_run(&ctx, &r.req, nullptr, &res), MP_ERR_USAGE);
}

std::string slurp(const std::string &path) {
  std::string out;
  FILE *f = fopen(path.c_str(), "rb");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  fclose(f);
  return out;
}

void exec_on(const std::string &path, const char *sql) {
  sqlite3 *db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char *err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "") << " in " << sql;
  sqlite3_free(err);
  sqlite3_close(db);
}

// A current meshplan database made by the store, with `runs` planner runs in it, closed:
// its path.
std::string made_db(const std::string &name, int runs = 0) {
  std::string path = FreshDbPath(name);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  EXPECT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  for (int i = 0; i < runs && st; i++) {
    PlannerRun r(1, 8, 32);
    mp_planner_result res;
    EXPECT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK) << mp_errmsg(&ctx);
    mp_planner_result_free(&res);
  }
  mp_store_close(st);
  return path;
}

TEST(StoreIdentity, NewFileIsStampedWithApplicationIdAndVersion) {
  std::string path = made_db("stamp.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK);
  EXPECT_EQ(q(st, "PRAGMA application_id"), MP_STORE_APPLICATION_ID);
  EXPECT_EQ(q(st, "PRAGMA user_version"), MP_STORE_SCHEMA_VERSION);
  mp_store_close(st);
  // an empty file (touch x.db) is a new database too
  std::string empty = FreshDbPath("empty.db");
  fclose(fopen(empty.c_str(), "wb"));
  ASSERT_EQ(mp_store_open(&ctx, empty.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "PRAGMA application_id"), MP_STORE_APPLICATION_ID);
  mp_store_close(st);
}

// Other programs' SQLite files are refused and left byte for byte as they were (the issue:
// a file whose schema_version holds text was "migrated" and written into).
TEST(StoreIdentity, ForeignDatabasesAreRefusedAndNeverWritten) {
  struct { const char *name, *sql; } cases[] = {
      {"text_version.db",
       "CREATE TABLE schema_version(version TEXT); INSERT INTO schema_version VALUES ('abc');"
       " CREATE TABLE songs(x)"},
      {"old_version_only.db", "CREATE TABLE schema_version(version INTEGER); INSERT INTO schema_version VALUES (1)"},
      {"two_versions.db",
       "CREATE TABLE schema_version(version INTEGER); INSERT INTO schema_version VALUES (1), (2)"},
      {"other_app.db", "PRAGMA application_id=1234; CREATE TABLE t(x)"},
      {"stamped_empty_tables.db", "PRAGMA user_version=7"},
  };
  for (auto &c : cases) {
    std::string path = FreshDbPath(c.name);
    exec_on(path, c.sql);
    std::string before = slurp(path);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_store *st = nullptr;
    EXPECT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_ERR_DB) << c.name;
    EXPECT_EQ(std::string(mp_errmsg(&ctx)),
              path + " is not a meshplan database or is corrupt; move it aside or pass --db");
    EXPECT_EQ(slurp(path), before) << c.name << ": the file was written";
    EXPECT_NE(access((path + "-wal").c_str(), F_OK), 0) << c.name << ": switched to WAL";
  }
}

// Our tables with another application_id, a renamed column, or a header that disagrees
// with schema_version: not ours either.
TEST(StoreIdentity, TamperedMeshplanFilesAreRefused) {
  struct { const char *name, *sql; } cases[] = {
      {"app.db", "PRAGMA application_id=42"},
      {"column.db", "ALTER TABLE runs RENAME COLUMN model TO song"},
      {"missing.db", "DROP TABLE measurements"},
      {"header.db", "PRAGMA user_version=1"},
  };
  for (auto &c : cases) {
    std::string path = made_db(c.name);
    exec_on(path, c.sql);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_store *st = nullptr;
    EXPECT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_ERR_DB) << c.name;
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("is not a meshplan database"), std::string::npos) << c.name;
  }
}

// A database of an older version (here: version 1, whose plans(run_id, rank) index is not
// partial and which has none of the columns versions 3, 4 and 5 add) and one from before the
// header was stamped (application_id and user_version 0) are meshplan's: migrated and
// stamped, their runs kept.
TEST(StoreIdentity, OlderAndUnstampedDatabasesMigrate) {
  std::string path = made_db("v1.db", 1);
  exec_on(path,
          "DROP INDEX measurements_plan_step; ALTER TABLE runs DROP COLUMN train_status;"
          " ALTER TABLE measurements DROP COLUMN eval_loss; ALTER TABLE measurements DROP COLUMN lr;"
          " ALTER TABLE measurements DROP COLUMN grad_norm; ALTER TABLE plans DROP COLUMN sp;"
          " ALTER TABLE plans DROP COLUMN pp_virtual; ALTER TABLE plans DROP COLUMN global_batch;"
          " DROP INDEX plans_run_rank; CREATE INDEX plans_run_rank ON plans(run_id, rank);"
          " DROP TABLE rejections; ALTER TABLE runs DROP COLUMN logged; DROP TABLE restarts; ALTER TABLE plans DROP COLUMN pp_split; DROP TABLE expert_loads; ALTER TABLE plans DROP COLUMN etp; ALTER TABLE plans DROP COLUMN dopt; ALTER TABLE plans DROP COLUMN loss_chunks; ALTER TABLE plans DROP COLUMN nccl_version; ALTER TABLE plans DROP COLUMN stack; ALTER TABLE plans DROP COLUMN moe_imbalance; ALTER TABLE plans DROP COLUMN moe_capacity_factor; ALTER TABLE plans DROP COLUMN fp8_recipe; ALTER TABLE plans DROP COLUMN mtp_layers;"
          " UPDATE schema_version SET version=1; PRAGMA user_version=0; PRAGMA application_id=0");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "SELECT version FROM schema_version"), MP_STORE_SCHEMA_VERSION);
  EXPECT_EQ(q(st, "PRAGMA user_version"), MP_STORE_SCHEMA_VERSION);
  EXPECT_EQ(q(st, "PRAGMA application_id"), MP_STORE_APPLICATION_ID);
  EXPECT_EQ(q(st, "SELECT count(*) FROM sqlite_master WHERE name='plans_run_rank' AND sql LIKE '%WHERE%'"), 1);
  EXPECT_EQ(q(st, "SELECT count(*) FROM runs"), 1);
  mp_store_close(st);
}

// Each plan's own global batch (version 5): under the batch rule a target of 50 sequences
// becomes, per mesh, the nearest multiple of its dp = dp_replicate x dp_shard (8 GPUs):
// dp 1 -> 50, dp 2 -> 50, dp 4 -> 52 (48 and 52 are 2 away: halves round up), dp 8 -> 48
// (48 is 2 away, 56 is 6). The row holds the candidate's batch; micro_batch divides its
// share per rank on every feasible row.
TEST(Store, EachPlanStoresItsOwnGlobalBatch) {
  std::string path = FreshDbPath("gb.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  PlannerRun r(1, 8, 0);
  r.req.search.target_batch = 50;
  r.req.info.global_batch = 50;
  mp_planner_result res;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK) << mp_errmsg(&ctx);
  const std::string run = std::to_string(res.run_id);
  const std::string plans = "SELECT count(*) FROM plans WHERE run_id=" + run;
  EXPECT_EQ(q(st, plans + " AND global_batch IS NULL"), 0);
  const int64_t want[9] = {0, 50, 50, 0, 52, 0, 0, 0, 48};
  for (int dp : {1, 2, 4, 8}) {
    SCOPED_TRACE(dp);
    const std::string of_dp = plans + " AND dp_replicate * dp_shard = " + std::to_string(dp);
    EXPECT_GT(q(st, of_dp), 0);
    EXPECT_EQ(q(st, of_dp + " AND global_batch != " + std::to_string(want[dp])), 0);
  }
  EXPECT_EQ(q(st, plans + " AND feasible = 1 AND global_batch % (dp_replicate * dp_shard * micro_batch) != 0"), 0);
  EXPECT_GT(q(st, plans + " AND feasible = 1"), 0);
  EXPECT_EQ(q(st, "SELECT global_batch FROM runs WHERE id=" + run), 50);
  // read back with the ranked plans
  mp_arena *a = mp_arena_create();
  mp_plan_row *rows = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_top_plans(&ctx, st, res.run_id, 0, a, &rows, &n), MP_OK) << mp_errmsg(&ctx);
  ASSERT_GT(n, 0);
  for (int64_t i = 0; i < n; i++)
    EXPECT_EQ(rows[i].global_batch, want[rows[i].dp_replicate * rows[i].dp_shard]) << i;
  mp_arena_destroy(a);
  mp_planner_result_free(&res);
  mp_store_close(st);
}

// A version-4 database (plans without global_batch) with a run in it migrates to the current
// version: its rows keep NULL (not recorded then), a new run records every plan's batch.
TEST(StoreIdentity, Version4MigratesAndKeepsItsRuns) {
  std::string path = made_db("v4.db", 1);
  exec_on(path,
          "ALTER TABLE plans DROP COLUMN global_batch; DROP TABLE rejections; ALTER TABLE runs DROP COLUMN logged; DROP TABLE restarts; ALTER TABLE plans DROP COLUMN pp_split; DROP TABLE expert_loads; ALTER TABLE plans DROP COLUMN etp; ALTER TABLE plans DROP COLUMN dopt; ALTER TABLE plans DROP COLUMN loss_chunks; ALTER TABLE plans DROP COLUMN nccl_version; ALTER TABLE plans DROP COLUMN stack; ALTER TABLE plans DROP COLUMN moe_imbalance; ALTER TABLE plans DROP COLUMN moe_capacity_factor; ALTER TABLE plans DROP COLUMN fp8_recipe; ALTER TABLE plans DROP COLUMN mtp_layers;"
          " UPDATE schema_version SET version=4; PRAGMA user_version=4");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "SELECT version FROM schema_version"), MP_STORE_SCHEMA_VERSION);
  EXPECT_EQ(q(st, "PRAGMA user_version"), MP_STORE_SCHEMA_VERSION);
  const int64_t old_rows = q(st, "SELECT count(*) FROM plans");
  EXPECT_GT(old_rows, 0);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE global_batch IS NULL"), old_rows);
  PlannerRun r(1, 8, 32);
  mp_planner_result res;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE global_batch IS NULL"), old_rows);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + std::to_string(res.run_id) +
                      " AND global_batch = 32"),
            res.search->n);
  mp_planner_result_free(&res);
  mp_store_close(st);
}

TEST(StoreIdentity, PathThatIsNotAFileIsRefused) {
  std::string dir = FreshDbPath("adir");
  mkdir(dir.c_str(), 0700);
  std::string fifo = FreshDbPath("afifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  EXPECT_EQ(mp_store_open(&ctx, dir.c_str(), &st), MP_ERR_INVALID);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), dir + ": is a directory, not a regular file; give the path of a file");
  EXPECT_EQ(mp_store_open(&ctx, fifo.c_str(), &st), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("is a named pipe (FIFO)"), std::string::npos);
}

// The write lock is not held while a run searches: another connection takes it at once
// (busy timeout 0) in the middle of a search that takes about two seconds, and the run
// still commits whole afterwards.
TEST(Store, WriteLockIsFreeDuringTheSearch) {
  std::string path = made_db("search_lock.db");
  mp_status run_st = MP_ERR_INTERNAL;
  std::string run_msg;
  std::atomic<int> started{0}, done{0};
  std::thread planner([&] {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_store *st = nullptr;
    run_st = mp_store_open(&ctx, path.c_str(), &st);
    PlannerRun r(1, 8, 32);
    r.fe.delay_us = 2000;  // x about 1000 candidates evaluated
    r.req.search.n_threads = 1;
    mp_planner_result res;
    started = 1;
    if (run_st == MP_OK) run_st = mp_planner_run(&ctx, &r.req, st, &res);
    if (run_st == MP_OK) mp_planner_result_free(&res);
    run_msg = mp_errmsg(&ctx);
    mp_store_close(st);
    done = 1;
  });
  while (!started) usleep(1000);
  usleep(300000);
  sqlite3 *db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 0);
  EXPECT_EQ(done.load(), 0) << "the search ended too soon to test the lock";
  EXPECT_EQ(sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  planner.join();
  ASSERT_EQ(run_st, MP_OK) << run_msg;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK);
  EXPECT_EQ(q(st, "SELECT count(*) FROM runs WHERE n_candidates IS NOT NULL"), 1);
  mp_store_close(st);
}

// plan's default (ranked_only) logs the ranked plans alone, every one with its prediction and rank, and
// its rejection counts by rule: on 8 GPUs with batch 32 the fake model enumerates the
// candidates of the search (s->n) and ranks s->n_feasible of them; the rows of the table
// rejections add up with the ranked plans to every candidate, rule by rule the search's
// counts. runs.logged says which; a --log-all run says 'all'.
TEST(Store, DefaultLogsTheRankedPlansAndTheCountsByRule) {
  std::string path = FreshDbPath("ranked.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  PlannerRun r(1, 8, 32);
  r.req.ranked_only = 1;
  mp_planner_result res;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK) << mp_errmsg(&ctx);
  const mp_search *s = res.search;
  const std::string run = std::to_string(res.run_id);
  ASSERT_GT(s->n_feasible, 0);
  ASSERT_GT(s->n, s->n_feasible);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + run), s->n_feasible);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + run + " AND rank IS NULL"), 0);
  EXPECT_EQ(q(st, "SELECT count(*) FROM predictions p JOIN plans pl ON pl.id = p.plan_id WHERE pl.run_id=" + run),
            s->n_feasible);
  EXPECT_EQ(q(st, "SELECT idx FROM plans WHERE rank=1 AND run_id=" + run), res.order[0]);
  EXPECT_EQ(q(st, "SELECT count(*) FROM runs WHERE logged='ranked' AND id=" + run), 1);
  int64_t want[MP_REJECT_COUNT], got[MP_REJECT_COUNT];
  mp_search_reject_counts(s, want);
  EXPECT_EQ(q(st, "SELECT sum(count) FROM rejections WHERE run_id=" + run) + s->n_feasible, s->n);
  ASSERT_EQ(mp_store_run_rejections(&ctx, st, res.run_id, got), MP_OK) << mp_errmsg(&ctx);
  for (int k = 0; k < MP_REJECT_COUNT; k++) EXPECT_EQ(got[k], want[k]) << mp_reject_name((mp_reject)k);
  EXPECT_EQ(want[MP_REJECT_RESHARD_NOOP] > 0, true);
  mp_planner_result_free(&res);
  // a --log-all run says so, and counts the same
  r.req.ranked_only = 0;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "SELECT count(*) FROM runs WHERE logged='all' AND id=" + std::to_string(res.run_id)), 1);
  ASSERT_EQ(mp_store_run_rejections(&ctx, st, res.run_id, got), MP_OK) << mp_errmsg(&ctx);
  for (int k = 0; k < MP_REJECT_COUNT; k++) EXPECT_EQ(got[k], want[k]) << mp_reject_name((mp_reject)k);
  mp_planner_result_free(&res);
  mp_store_close(st);
}

// A version-5 database (no rejections table, no runs.logged) whose run logged every
// candidate migrates: the run reads as logged 'all', its counts by rule come from its plans
// rows and equal the search's, and its ranked plans read back unchanged by the migration.
TEST(StoreIdentity, Version5RunsCountFromTheirPlans) {
  std::string path = made_db("v5.db", 1);  // a run of PlannerRun's: every candidate logged
  exec_on(path, "DELETE FROM rejections; DROP TABLE rejections; ALTER TABLE runs DROP COLUMN logged; DROP TABLE restarts; ALTER TABLE plans DROP COLUMN pp_split; DROP TABLE expert_loads; ALTER TABLE plans DROP COLUMN etp; ALTER TABLE plans DROP COLUMN dopt; ALTER TABLE plans DROP COLUMN loss_chunks; ALTER TABLE plans DROP COLUMN nccl_version; ALTER TABLE plans DROP COLUMN stack; ALTER TABLE plans DROP COLUMN moe_imbalance; ALTER TABLE plans DROP COLUMN moe_capacity_factor; ALTER TABLE plans DROP COLUMN fp8_recipe; ALTER TABLE plans DROP COLUMN mtp_layers;"
                " UPDATE schema_version SET version=5; PRAGMA user_version=5");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "PRAGMA user_version"), MP_STORE_SCHEMA_VERSION);
  mp_arena *a = mp_arena_create();
  mp_run_row *runs = nullptr;
  int64_t n_runs = 0;
  ASSERT_EQ(mp_store_list_runs(&ctx, st, a, &runs, &n_runs), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(n_runs, 1);
  EXPECT_STREQ(runs[0].logged, "all");
  PlannerRun r(1, 8, 32);
  mp_search *s = nullptr;
  ASSERT_EQ(mp_search_enumerate(&ctx, &r.req.search, &s), MP_OK);
  ASSERT_EQ(mp_search_run(&ctx, &r.req.search, s, nullptr, nullptr, nullptr, nullptr), MP_OK);
  int64_t want[MP_REJECT_COUNT], got[MP_REJECT_COUNT];
  mp_search_reject_counts(s, want);
  ASSERT_EQ(mp_store_run_rejections(&ctx, st, runs[0].id, got), MP_OK) << mp_errmsg(&ctx);
  for (int k = 0; k < MP_REJECT_COUNT; k++) EXPECT_EQ(got[k], want[k]) << mp_reject_name((mp_reject)k);
  mp_plan_row *plans = nullptr;
  int64_t n_plans = 0;
  ASSERT_EQ(mp_store_top_plans(&ctx, st, runs[0].id, 0, a, &plans, &n_plans), MP_OK);
  EXPECT_EQ(n_plans, s->n_feasible);
  EXPECT_EQ(mp_store_run_rejections(&ctx, st, 99, got), MP_ERR_NOT_FOUND);
  mp_search_destroy(s);
  mp_arena_destroy(a);
  mp_store_close(st);
}

// A training run's marks for its curves: a run killed after measuring steps 1..3 and
// resumed from its step-1 checkpoint measures 2, 3, 4: it resumed at step 2 (the first
// step measured again); a second kill and resume from step 3 adds step 4 once more. The
// prediction is the measured plan's tokens/s per GPU (the fake's 1000 / step time).
TEST(Store, TrainingMarksFindTheResumesAndThePrediction) {
  std::string path = FreshDbPath("marks.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK);
  PlannerRun r(1, 8, 32);
  mp_planner_result res;
  ASSERT_EQ(mp_planner_run(&ctx, &r.req, st, &res), MP_OK);
  const mp_candidate best = res.search->cands[res.order[0]];
  const int64_t run_id = res.run_id;
  mp_planner_result_free(&res);
  for (int64_t step : {1, 2, 3, 2, 3, 4, 4, 5}) {
    mp_measurement m = {best.plan_id, step, 1.0, kGiB, 3.0, 5000.0, "fake-gpu"};
    ASSERT_EQ(mp_store_add_measurement(&ctx, st, &m), MP_OK) << mp_errmsg(&ctx);
  }
  mp_arena *a = mp_arena_create();
  double pred = 0;
  int64_t *resumed = nullptr, n = 0;
  ASSERT_EQ(mp_store_run_marks(&ctx, st, run_id, a, &pred, &resumed, &n), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(resumed[0], 2);
  EXPECT_EQ(resumed[1], 4);
  EXPECT_DOUBLE_EQ(pred, best.res.tokens_per_s_per_gpu);
  EXPECT_DOUBLE_EQ(pred, 1000.0 / best.res.step_time_s);
  mp_arena_destroy(a);
  mp_store_close(st);
}

// One ranked run whose plans have the meshes specs (parsed on world ranks), plan i ranked
// i + 1 with a step time of i + 1 seconds, each with one measured step: the run's id.
int64_t RankedRunOf(mp_store *st, const std::vector<std::string> &specs, int world) {
  mp_ctx c;
  mp_ctx_init(&c);
  mp_run_info info = {"tiny-moe", "1xfake", "fake-gpu", world, 8, 4096, 32, "time", "{}", "test", "test"};
  int64_t run = 0;
  EXPECT_EQ(mp_store_run_begin(&c, st, &info, &run), MP_OK) << mp_errmsg(&c);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < specs.size(); i++) {
    mp_candidate cand;
    memset(&cand, 0, sizeof cand);
    EXPECT_EQ(mp_mesh_parse(&c, specs[i].c_str(), world, &cand.mesh), MP_OK) << mp_errmsg(&c) << specs[i];
    cand.micro_batch = 1;
    cand.evaluated = 1;
    cand.res.step_time_s = (double)(i + 1);
    EXPECT_EQ(mp_store_add_candidate(&c, st, run, (int64_t)i, &cand, ""), MP_OK) << mp_errmsg(&c);
    EXPECT_EQ(mp_store_set_rank(&c, st, cand.plan_id, (int64_t)i + 1), MP_OK) << mp_errmsg(&c);
    ids.push_back(cand.plan_id);
  }
  mp_run_summary sum = {(int64_t)specs.size(), 0, (int64_t)specs.size(), (int64_t)specs.size(), ids[0], 1.0};
  EXPECT_EQ(mp_store_run_commit(&c, st, run, &sum), MP_OK) << mp_errmsg(&c);
  for (size_t i = 0; i < ids.size(); i++) {
    mp_measurement m = {ids[i], (int64_t)i + 1, 1.0, kGiB, 3.0, 5000.0, "fake-gpu"};
    EXPECT_EQ(mp_store_add_measurement(&c, st, &m), MP_OK) << mp_errmsg(&c);
  }
  return run;
}

std::string MeshStr(const mp_mesh &m) {
  char buf[128];
  mp_mesh_format(&m, buf, sizeof buf);
  return buf;
}

// The meshes a run's ranked plans and its segments read back as (mp_plan_row_mesh,
// mp_run_segment_mesh), formatted.
std::vector<std::string> ReadBack(mp_store *st, int64_t run, std::vector<std::string> *segments) {
  mp_ctx c;
  mp_ctx_init(&c);
  mp_arena *a = mp_arena_create();
  mp_plan_row *rows = nullptr;
  mp_run_segment *seg = nullptr;
  int64_t n = 0, ns = 0;
  std::vector<std::string> out;
  EXPECT_EQ(mp_store_top_plans(&c, st, run, 0, a, &rows, &n), MP_OK) << mp_errmsg(&c);
  EXPECT_EQ(mp_store_run_segments(&c, st, run, a, &seg, &ns), MP_OK) << mp_errmsg(&c);
  for (int64_t i = 0; i < n; i++) {
    mp_mesh m;
    mp_plan_row_mesh(&rows[i], &m);
    out.push_back(MeshStr(m));
  }
  for (int64_t i = 0; i < ns; i++) {
    mp_mesh m;
    mp_run_segment_mesh(&seg[i], &m);
    segments->push_back(MeshStr(m));
  }
  mp_arena_destroy(a);
  return out;
}

// Meshes with an experts' grid (etp) and distributed-optimizer instances (dopt), on 16 ranks.
const std::vector<std::string> kGridMeshes = {"dp_shard=8,tp=2,ep=4,etp=2", "dp_shard=4,tp=4,ep=8,etp=1",
                                              "pp=2,dp_replicate=4,tp=2,dopt=2", "dp_shard=16,ep=4"};

// A plan's experts' grid and its distributed-optimizer instances are part of its mesh
// (exec/mesh.h), so the database keeps them (version 10) and a plan read back is the mesh it
// was written from. On 16 ranks:
//   - dp_shard=8,tp=2,ep=4,etp=2: ep x etp = 8 divides dp_shard x tp = 16, the expert grid
//     with each expert split over 2 ranks; without etp the row would read back as ep=4
//     inside dp_shard (4 divides 8), another layout;
//   - dp_shard=4,tp=4,ep=8,etp=1: the grid with experts whole on a rank (etp=1 given);
//   - pp=2,dp_replicate=4,tp=2,dopt=2: dp_replicate's 4 cut into 2 optimizer instances;
//   - dp_shard=16,ep=4: ep inside dp_shard (etp 0, dopt 1: the columns' defaults).
TEST(Store, ExpertGridAndOptimizerInstancesRoundTrip) {
  const std::string path = FreshDbPath("mesh_rt.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  const std::vector<std::string> &specs = kGridMeshes;
  std::vector<std::string> want;
  for (const auto &spec : specs) {
    mp_mesh m;
    ASSERT_EQ(mp_mesh_parse(&ctx, spec.c_str(), 16, &m), MP_OK) << mp_errmsg(&ctx);
    want.push_back(MeshStr(m));
  }
  EXPECT_EQ(want[0], "dp_shard=8,tp=2,ep=4,etp=2");
  EXPECT_EQ(want[1], "dp_shard=4,tp=4,ep=8,etp=1");
  EXPECT_EQ(want[2], "pp=2,dp_replicate=4,tp=2,dopt=2");
  const int64_t run = RankedRunOf(st, specs, 16);
  EXPECT_EQ(q(st, "SELECT etp FROM plans WHERE rank=1 AND run_id=" + std::to_string(run)), 2);
  EXPECT_EQ(q(st, "SELECT etp FROM plans WHERE rank=2 AND run_id=" + std::to_string(run)), 1);
  EXPECT_EQ(q(st, "SELECT dopt FROM plans WHERE rank=3 AND run_id=" + std::to_string(run)), 2);
  EXPECT_EQ(q(st, "SELECT etp * 10 + dopt FROM plans WHERE rank=4 AND run_id=" + std::to_string(run)), 1);
  std::vector<std::string> segments;
  EXPECT_EQ(ReadBack(st, run, &segments), want);
  EXPECT_EQ(segments, want);
  mp_store_close(st);
}

// One plan read by its id (mp_store_get_plan, what train --plan-id reads) is the row the
// ranked list holds for it: its whole mesh (the four meshes above, etp and dopt included),
// micro-batch and prediction; an unranked plan reads rank 0; an id the file does not hold is
// MP_ERR_NOT_FOUND naming the file.
TEST(Store, PlanReadByIdIsItsRankedRow) {
  const std::string path = FreshDbPath("plan_by_id.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  const std::vector<std::string> &specs = kGridMeshes;
  const int64_t run = RankedRunOf(st, specs, 16);
  mp_arena *a = mp_arena_create();
  mp_plan_row *rows = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_top_plans(&ctx, st, run, 0, a, &rows, &n), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(n, 4);
  for (int64_t i = 0; i < n; i++) {
    mp_plan_row r;
    ASSERT_EQ(mp_store_get_plan(&ctx, st, rows[i].id, &r), MP_OK) << mp_errmsg(&ctx);
    mp_mesh m;
    mp_plan_row_mesh(&r, &m);
    EXPECT_EQ(MeshStr(m), specs[i]); /* each spec formats as written (the test above) */
    EXPECT_EQ(r.run_id, run);
    EXPECT_EQ(r.rank, i + 1);
    EXPECT_EQ(r.micro_batch, 1);
    EXPECT_EQ(r.step_time_s, (double)(i + 1)); /* RankedRunOf: plan i predicts i + 1 s */
    EXPECT_EQ(r.pp_virtual, rows[i].pp_virtual);
    EXPECT_EQ(r.global_batch, rows[i].global_batch);
  }
  mp_arena_destroy(a);
  mp_candidate extra;
  memset(&extra, 0, sizeof extra);
  ASSERT_EQ(mp_mesh_parse(&ctx, "tp=4,dp_shard=4", 16, &extra.mesh), MP_OK) << mp_errmsg(&ctx);
  extra.micro_batch = 2;
  const mp_plan_settings none = {nullptr, 0, 0};
  ASSERT_EQ(mp_store_add_plan(&ctx, st, run, &extra, &none), MP_OK) << mp_errmsg(&ctx);
  mp_plan_row r;
  ASSERT_EQ(mp_store_get_plan(&ctx, st, extra.plan_id, &r), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.micro_batch, 2);
  EXPECT_EQ(r.tp * 10 + r.dp_shard, 44);
  EXPECT_EQ(mp_store_get_plan(&ctx, st, 12345, &r), MP_ERR_NOT_FOUND);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find(path + " has no plan 12345"), std::string::npos) << mp_errmsg(&ctx);
  mp_store_close(st);
}

// A version-9 database (plans without etp and dopt) with a run in it migrates in place to
// the current version: its rows read etp 0 and dopt 1, the layouts version 9 could record
// (planner/store.h), so they format to the six stored mesh columns' mesh; a new run on it
// keeps the grid and the instances.
TEST(StoreIdentity, Version9MigratesToMeshesWithGridAndInstances) {
  std::string path = made_db("v9.db", 1);
  exec_on(path, "ALTER TABLE plans DROP COLUMN etp; ALTER TABLE plans DROP COLUMN dopt; ALTER TABLE plans DROP COLUMN loss_chunks; ALTER TABLE plans DROP COLUMN nccl_version; ALTER TABLE plans DROP COLUMN stack; ALTER TABLE plans DROP COLUMN moe_imbalance; ALTER TABLE plans DROP COLUMN moe_capacity_factor; ALTER TABLE plans DROP COLUMN fp8_recipe; ALTER TABLE plans DROP COLUMN mtp_layers;"
                " UPDATE schema_version SET version=9; PRAGMA user_version=9");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "SELECT version FROM schema_version"), MP_STORE_SCHEMA_VERSION);
  EXPECT_EQ(q(st, "PRAGMA user_version"), MP_STORE_SCHEMA_VERSION);
  const int64_t old_rows = q(st, "SELECT count(*) FROM plans");
  EXPECT_GT(old_rows, 0);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE etp = 0 AND dopt = 1"), old_rows);
  mp_arena *a = mp_arena_create();
  mp_plan_row *rows = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_top_plans(&ctx, st, 1, 0, a, &rows, &n), MP_OK) << mp_errmsg(&ctx);
  ASSERT_GT(n, 0);
  for (int64_t i = 0; i < n; i++) {
    mp_mesh m, dims;
    mp_plan_row_mesh(&rows[i], &m);
    mp_mesh_init(&dims);  // the six columns version 9 had
    dims.size[MP_DIM_PP] = rows[i].pp;
    dims.size[MP_DIM_DP_REPLICATE] = rows[i].dp_replicate;
    dims.size[MP_DIM_DP_SHARD] = rows[i].dp_shard;
    dims.size[MP_DIM_CP] = rows[i].cp;
    dims.size[MP_DIM_TP] = rows[i].tp;
    dims.ep = rows[i].ep;
    EXPECT_EQ(MeshStr(m), MeshStr(dims)) << i;
  }
  mp_arena_destroy(a);
  std::vector<std::string> segments;
  const std::vector<std::string> specs = {"dp_shard=8,tp=2,ep=4,etp=2", "pp=2,dp_replicate=4,tp=2,dopt=2"};
  EXPECT_EQ(ReadBack(st, RankedRunOf(st, specs, 16), &segments), specs);
  mp_store_close(st);
}

// A candidate the step bound stopped (reject bounded: the simulator ran a stage and quit,
// sim/sim_plan.c step_bounded, its result zero but bounded and step_lb_s) has no figures to
// predict: its plan row keeps the rule and is not feasible, and no predictions row is written
// for it, or its step would read 0 s. Three candidates: one that fits (step 2 s), one bounded
// (lower bound 5 s), one whose evaluation failed: 3 plans, 1 prediction, of 2 s.
TEST(Store, BoundedCandidateWritesNoPrediction) {
  const std::string path = FreshDbPath("bounded.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  mp_run_info info = {"tiny-moe", "1xfake", "fake-gpu", 16, 8, 4096, 32, "time", "{}", "test", "test"};
  int64_t run = 0;
  ASSERT_EQ(mp_store_run_begin(&ctx, st, &info, &run), MP_OK) << mp_errmsg(&ctx);
  const int reject[3] = {MP_REJECT_NONE, MP_REJECT_BOUNDED, MP_REJECT_EVAL_ERROR};
  for (int i = 0; i < 3; i++) {
    mp_candidate c;
    memset(&c, 0, sizeof c);
    ASSERT_EQ(mp_mesh_parse(&ctx, "pp=2,dp_replicate=8", 16, &c.mesh), MP_OK) << mp_errmsg(&ctx);
    c.micro_batch = 1;
    c.evaluated = 1;
    c.reject = reject[i];
    if (i == 0) c.res.step_time_s = 2.0;
    if (i == 1) {
      c.res.bounded = 1;
      c.res.step_lb_s = 5.0;
    }
    ASSERT_EQ(mp_store_add_candidate(&ctx, st, run, i, &c, i ? "stopped" : ""), MP_OK) << mp_errmsg(&ctx);
  }
  mp_run_summary sum = {3, 0, 3, 1, 0, 1.0};
  ASSERT_EQ(mp_store_run_commit(&ctx, st, run, &sum), MP_OK) << mp_errmsg(&ctx);
  const std::string r = std::to_string(run);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + r), 3);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE run_id=" + r + " AND reject_rule='bounded' AND feasible=0"), 1);
  EXPECT_EQ(q(st, "SELECT count(*) FROM predictions"), 1);
  EXPECT_EQ(q(st, "SELECT count(*) FROM predictions WHERE step_time_s = 2.0"), 1);
  mp_store_close(st);
}

// The settings a plan was predicted under beyond its candidate's fields (version 11,
// mp_plan_settings) read back as written: a run's on each of its plans rows, a plan added to
// the run later (a resumed training segment) with its own. NCCL 2.21.5 is 2 x 10000 + 21 x 100
// + 5 = 22105 and reads back in words as "NCCL 2.21.5"; "off" is one value each, whichever way
// it was given: a loss_chunks of 0 is stored as 1 (the count torchtitan's default runs), an
// imbalance of 0 as 1 (balanced), and neither is named in words, nor a capacity factor of 0
// (dropless); a NULL stack reads as "" and "stack not recorded"; NCCL 0 is the newest the
// build models. The float8 recipe goes on the float8 plans only: the tp=8 plan is float8 and
// reads rowwise, the dp_shard=8 plan is bf16 and reads "".
TEST(Store, PredictionSettingsRoundTrip) {
  const std::string path = FreshDbPath("settings.db");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  mp_run_info info = {"tiny-dense", "1xfake", "fake-gpu", 8, 8, 4096, 32, "time", "{}", "test", "test"};
  info.settings = {"torchtitan-eager", 8, 22105, 1.5, 1.25, "rowwise", 2};
  int64_t run = 0;
  ASSERT_EQ(mp_store_run_begin(&ctx, st, &info, &run), MP_OK) << mp_errmsg(&ctx);
  int64_t ids[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    mp_candidate c;
    memset(&c, 0, sizeof c);
    ASSERT_EQ(mp_mesh_parse(&ctx, i ? "tp=8" : "dp_shard=8", 8, &c.mesh), MP_OK) << mp_errmsg(&ctx);
    c.micro_batch = 1;
    c.evaluated = 1;
    c.fp8 = (uint8_t)i;
    c.res.step_time_s = 1.5 + i;
    ASSERT_EQ(mp_store_add_candidate(&ctx, st, run, i, &c, ""), MP_OK) << mp_errmsg(&ctx);
    ASSERT_EQ(mp_store_set_rank(&ctx, st, c.plan_id, i + 1), MP_OK) << mp_errmsg(&ctx);
    ids[i] = c.plan_id;
  }
  mp_run_summary sum = {2, 0, 2, 2, ids[0], 1.0};
  ASSERT_EQ(mp_store_run_commit(&ctx, st, run, &sum), MP_OK) << mp_errmsg(&ctx);
  mp_candidate seg;
  memset(&seg, 0, sizeof seg);
  mp_mesh_init(&seg.mesh);
  seg.micro_batch = 2;
  const mp_plan_settings none = {nullptr, 0, 0};
  ASSERT_EQ(mp_store_add_plan(&ctx, st, run, &seg, &none), MP_OK) << mp_errmsg(&ctx);
  char words[160];
  for (int i = 0; i < 2; i++) {
    mp_plan_row r;
    ASSERT_EQ(mp_store_get_plan(&ctx, st, ids[i], &r), MP_OK) << mp_errmsg(&ctx);
    EXPECT_STREQ(r.stack, "torchtitan-eager");
    EXPECT_EQ(r.loss_chunks, 8);
    EXPECT_EQ(r.nccl_version, 22105);
    EXPECT_EQ(r.moe_imbalance, 1.5);
    EXPECT_EQ(r.moe_capacity_factor, 1.25);
    EXPECT_STREQ(r.fp8_recipe, i ? "rowwise" : "");
    EXPECT_EQ(r.mtp_layers, 2);
    EXPECT_EQ(r.step_time_s, 1.5 + i);
    mp_plan_row_settings_str(&r, words, sizeof words);
    EXPECT_STREQ(words, "stack torchtitan-eager, NCCL 2.21.5, loss in 8 chunks, expert imbalance 1.5, expert capacity "
                 "factor 1.25");
  }
  mp_arena *a = mp_arena_create();
  mp_plan_row *rows = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_top_plans(&ctx, st, run, 0, a, &rows, &n), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(rows[1].loss_chunks * 100000 + rows[1].nccl_version, 822105);
  EXPECT_STREQ(rows[1].fp8_recipe, "rowwise");
  EXPECT_STREQ(rows[1].stack, "torchtitan-eager");
  mp_arena_destroy(a);
  mp_plan_row r;
  ASSERT_EQ(mp_store_get_plan(&ctx, st, seg.plan_id, &r), MP_OK) << mp_errmsg(&ctx);
  EXPECT_STREQ(r.stack, "");
  EXPECT_EQ(r.loss_chunks, 1);
  EXPECT_EQ(r.nccl_version, 0);
  EXPECT_EQ(r.moe_imbalance, 1.0);
  EXPECT_EQ(r.moe_capacity_factor, 0.0);
  EXPECT_EQ(q(st, "SELECT count(*) FROM plans WHERE stack IS NULL"), 1);
  mp_plan_row_settings_str(&r, words, sizeof words);
  EXPECT_STREQ(words, "stack not recorded, the newest NCCL modelled");
  mp_store_close(st);
}

// A version-10 database (plans without loss_chunks, nccl_version and stack) migrates in place:
// each plan takes its run's options where the run gave them (runs.options, every option as
// given) and otherwise the defaults version 10 ran: 1 chunk, NCCL 0 (the newest modelled),
// imbalance 1, capacity factor 0, stack NULL, float8 recipe NULL. Run 1 gave --loss-chunks 8
// --nccl-version 2.23 --stack torchtitan-eager --moe-imbalance 1.5 --moe-capacity-factor 1.25
// --fp8 current --mtp-num-layers 1 (2.23 is 2 x 10000 + 23 x 100 = 22300; current is
// Transformer Engine's name for tensorwise), run 2 gave --fp8 on (the stack's recipe: not
// recorded) and no --mtp-num-layers (the model's own: not recorded, -1), run 3 is train's
// ({"source": ...}) and run 4's options are not JSON, which the migration reads as none
// instead of failing on them. Every plan is float8, so each could carry a recipe.
TEST(StoreIdentity, Version10PlansTakeTheirRunsOptions) {
  const std::string path = FreshDbPath("v10.db");
  const char *opts[4] = {"{\"loss-chunks\": \"8\", \"nccl-version\": \"2.23\", \"stack\": \"torchtitan-eager\","
                         " \"moe-imbalance\": \"1.5\", \"moe-capacity-factor\": \"1.25\", \"fp8\": \"current\","
                         " \"mtp-num-layers\": \"1\"}",
                         "{\"fp8\": \"on\"}", "{\"source\": \"meshplan train --db\"}", "not json"};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  for (int i = 0; i < 4; i++) {
    mp_run_info info = {"tiny-dense", "1xfake", "fake-gpu", 8, 8, 4096, 32, "time", opts[i], "test", "test"};
    int64_t run = 0;
    ASSERT_EQ(mp_store_run_begin(&ctx, st, &info, &run), MP_OK) << mp_errmsg(&ctx);
    mp_candidate c;
    memset(&c, 0, sizeof c);
    mp_mesh_init(&c.mesh);
    c.micro_batch = 1;
    c.fp8 = 1;
    ASSERT_EQ(mp_store_add_candidate(&ctx, st, run, 0, &c, ""), MP_OK) << mp_errmsg(&ctx);
    mp_run_summary sum = {1, 0, 0, 0, 0, 1.0};
    ASSERT_EQ(mp_store_run_commit(&ctx, st, run, &sum), MP_OK) << mp_errmsg(&ctx);
  }
  mp_store_close(st);
  exec_on(path, "ALTER TABLE plans DROP COLUMN loss_chunks; ALTER TABLE plans DROP COLUMN nccl_version;"
                " ALTER TABLE plans DROP COLUMN stack; ALTER TABLE plans DROP COLUMN moe_imbalance; ALTER TABLE plans DROP COLUMN moe_capacity_factor; ALTER TABLE plans DROP COLUMN fp8_recipe; ALTER TABLE plans DROP COLUMN mtp_layers; UPDATE schema_version SET version=10; PRAGMA user_version=10");
  ASSERT_EQ(mp_store_open(&ctx, path.c_str(), &st), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(q(st, "PRAGMA user_version"), MP_STORE_SCHEMA_VERSION);
  const int want_chunks[4] = {8, 1, 1, 1}, want_nccl[4] = {22300, 0, 0, 0};
  for (int i = 0; i < 4; i++) {
    mp_plan_row r;
    ASSERT_EQ(mp_store_get_plan(&ctx, st, i + 1, &r), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(r.run_id, i + 1);
    EXPECT_EQ(r.loss_chunks, want_chunks[i]) << i;
    EXPECT_EQ(r.nccl_version, want_nccl[i]) << i;
    EXPECT_STREQ(r.stack, i == 0 ? "torchtitan-eager" : "") << i;
    EXPECT_EQ(r.moe_imbalance, i == 0 ? 1.5 : 1.0) << i;
    EXPECT_EQ(r.moe_capacity_factor, i == 0 ? 1.25 : 0.0) << i;
    EXPECT_STREQ(r.fp8_recipe, i == 0 ? "tensorwise" : "") << i;
    EXPECT_EQ(r.mtp_layers, i == 0 ? 1 : -1) << i;
  }
  mp_store_close(st);
}

}  // namespace
