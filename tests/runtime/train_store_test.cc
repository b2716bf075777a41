// The store's training-run additions (planner/store.h, schema version 3): a version-2
// database migrates with its rows kept, a training run's status reads complete /
// incomplete / diverged, and per-step figures (eval loss, lr, grad norm) come back with a
// step measured twice (a resumed run) read as its last record; the routed-expert loads of
// version 9 likewise.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>

#include "planner/store.h"
#include "tests/tmp_path.h"

namespace {

int64_t Q(mp_store *st, const char *sql) {
  mp_ctx c;
  mp_ctx_init(&c);
  int64_t v = -1;
  EXPECT_EQ(mp_store_query_i64(&c, st, sql, &v), MP_OK) << mp_errmsg(&c);
  return v;
}

// A one-plan run, as `meshplan train --db` records one; returns the plan's id. evaluated:
// with its prediction row, ranked first (the ranked plans are the predicted ones).
int64_t OnePlanRun(mp_store *st, int evaluated = 0) {
  mp_ctx c;
  mp_ctx_init(&c);
  mp_run_info info = {"tiny-dense", "1xcpu", "cpu", 1, 1, 16, 4, "time", "{}", "test", "test"};
  int64_t run = 0;
  EXPECT_EQ(mp_store_run_begin(&c, st, &info, &run), MP_OK) << mp_errmsg(&c);
  mp_candidate cand;
  memset(&cand, 0, sizeof cand);
  mp_mesh_init(&cand.mesh);
  cand.micro_batch = 2;
  cand.evaluated = (uint8_t)evaluated;
  EXPECT_EQ(mp_store_add_candidate(&c, st, run, 0, &cand, ""), MP_OK) << mp_errmsg(&c);
  if (evaluated) {
    EXPECT_EQ(mp_store_set_rank(&c, st, cand.plan_id, 1), MP_OK);
  }
  mp_run_summary sum = {1, 0, 0, 0, 0, 0.0};
  EXPECT_EQ(mp_store_run_commit(&c, st, run, &sum), MP_OK) << mp_errmsg(&c);
  return cand.plan_id;
}

TEST(TrainStore, Version2MigratesWithItsRows) {
  const std::string path = FreshDbPath("v2.db");
  mp_ctx c;
  mp_ctx_init(&c);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&c, path.c_str(), &st), MP_OK) << mp_errmsg(&c);
  const int64_t plan = OnePlanRun(st);
  mp_measurement m = {plan, 1, 0.5, 1000, 5.5, 100.0, "cpu", 0, 0, 0, 0};
  ASSERT_EQ(mp_store_add_measurement(&c, st, &m), MP_OK) << mp_errmsg(&c);
  mp_store_close(st);
  // back to version 2: the columns, index and tables versions 3 to 10 added, gone
  sqlite3 *db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "DROP INDEX measurements_plan_step; ALTER TABLE runs DROP COLUMN train_status;"
                         "ALTER TABLE measurements DROP COLUMN eval_loss; ALTER TABLE measurements DROP COLUMN lr;"
                         "ALTER TABLE measurements DROP COLUMN grad_norm; ALTER TABLE plans DROP COLUMN sp;"
                         "ALTER TABLE plans DROP COLUMN pp_virtual; ALTER TABLE plans DROP COLUMN global_batch;"
                         "DROP TABLE rejections; ALTER TABLE runs DROP COLUMN logged; DROP TABLE restarts; ALTER TABLE plans DROP COLUMN pp_split; DROP TABLE expert_loads; ALTER TABLE plans DROP COLUMN etp; ALTER TABLE plans DROP COLUMN dopt; ALTER TABLE plans DROP COLUMN loss_chunks; ALTER TABLE plans DROP COLUMN nccl_version; ALTER TABLE plans DROP COLUMN stack; ALTER TABLE plans DROP COLUMN moe_imbalance; ALTER TABLE plans DROP COLUMN moe_capacity_factor; ALTER TABLE plans DROP COLUMN fp8_recipe; ALTER TABLE plans DROP COLUMN mtp_layers;"
                         "UPDATE schema_version SET version=2;"
                         "PRAGMA user_version=2",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  ASSERT_EQ(mp_store_open(&c, path.c_str(), &st), MP_OK) << mp_errmsg(&c);
  EXPECT_EQ(Q(st, "SELECT version FROM schema_version"), MP_STORE_SCHEMA_VERSION);
  EXPECT_EQ(Q(st, "SELECT count(*) FROM measurements"), 1);
  EXPECT_EQ(Q(st, "SELECT count(*) FROM measurements WHERE eval_loss IS NULL AND lr IS NULL"), 1);
  mp_run_row run;
  ASSERT_EQ(mp_store_get_run(&c, st, 1, &run), MP_OK);
  EXPECT_STREQ(run.status, "complete");  // a planner run: committed whole
  mp_store_close(st);
}

TEST(TrainStore, StatusAndStepsOfATrainingRun) {
  const std::string path = FreshDbPath("train.db");
  mp_ctx c;
  mp_ctx_init(&c);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&c, path.c_str(), &st), MP_OK) << mp_errmsg(&c);
  const int64_t plan = OnePlanRun(st);
  mp_run_row run;
  ASSERT_EQ(mp_store_set_train_status(&c, st, plan, "running"), MP_OK) << mp_errmsg(&c);
  ASSERT_EQ(mp_store_get_run(&c, st, 1, &run), MP_OK);
  EXPECT_STREQ(run.status, "incomplete");  // running, or killed: nothing tells them apart
  // steps 1..3, then a resumed process runs steps 2..3 again (other losses)
  const struct {
    int64_t step;
    double loss;
    int has_eval;
  } rec[] = {{1, 5.0, 0}, {2, 4.0, 1}, {3, 3.0, 0}, {2, 4.5, 1}, {3, 3.5, 0}};
  for (const auto &r : rec) {
    mp_measurement m = {plan, r.step, 0.1 * (double)r.step, 1000, r.loss, 100.0, "cpu", r.has_eval,
                        r.loss + 0.25, 1e-3 * (double)r.step, 2.0};
    ASSERT_EQ(mp_store_add_measurement(&c, st, &m), MP_OK) << mp_errmsg(&c);
  }
  ASSERT_EQ(mp_store_set_train_status(&c, st, plan, "diverged"), MP_OK);
  ASSERT_EQ(mp_store_get_run(&c, st, 1, &run), MP_OK);
  EXPECT_STREQ(run.status, "diverged");
  EXPECT_EQ(mp_store_set_train_status(&c, st, 999, "complete"), MP_ERR_NOT_FOUND);
  mp_arena *a = mp_arena_create();
  mp_step_row *rows = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_run_steps(&c, st, 1, a, &rows, &n), MP_OK) << mp_errmsg(&c);
  ASSERT_EQ(n, 3);
  EXPECT_EQ(rows[0].step, 1);
  EXPECT_EQ(rows[0].loss, 5.0);
  EXPECT_FALSE(rows[0].has_eval);
  EXPECT_EQ(rows[1].step, 2);
  EXPECT_EQ(rows[1].loss, 4.5);  // the resumed process's record
  EXPECT_TRUE(rows[1].has_eval);
  EXPECT_EQ(rows[1].eval_loss, 4.75);
  EXPECT_DOUBLE_EQ(rows[1].lr, 2e-3);
  EXPECT_EQ(rows[1].grad_norm, 2.0);
  EXPECT_EQ(rows[2].loss, 3.5);
  mp_arena_destroy(a);
  mp_store_close(st);
}

// A training run resumed on another mesh: the second process adds its plan to the run
// (unranked, so the run's ranked plans are still the planner's), and the run's steps are
// one curve by step whichever plan recorded them, a step run twice read as its last
// record; its segments are the plans in the order they recorded, with their steps.
TEST(TrainStore, AResumedRunKeepsOneHistoryAcrossPlans) {
  const std::string path = FreshDbPath("segments.db");
  mp_ctx c;
  mp_ctx_init(&c);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&c, path.c_str(), &st), MP_OK) << mp_errmsg(&c);
  const int64_t first = OnePlanRun(st);
  mp_candidate cand;
  memset(&cand, 0, sizeof cand);
  mp_mesh_init(&cand.mesh);
  cand.mesh.size[MP_DIM_TP] = 2;
  cand.micro_batch = 4;
  const mp_plan_settings cpu = {"meshplan-cpu", 1, 0}; /* what train predicts a segment under */
  EXPECT_EQ(mp_store_add_plan(&c, st, 99, &cand, &cpu), MP_ERR_NOT_FOUND);
  ASSERT_EQ(mp_store_add_plan(&c, st, 1, &cand, &cpu), MP_OK) << mp_errmsg(&c);
  EXPECT_EQ(Q(st, "SELECT count(*) FROM plans WHERE run_id=1 AND rank IS NULL"), 2);
  EXPECT_EQ(Q(st, "SELECT idx FROM plans WHERE id=2"), 1);
  // the first process ran steps 1..4 and was killed; the second resumed from step 2
  const struct {
    int64_t plan, step;
    double loss;
  } rec[] = {{first, 1, 5.0}, {first, 2, 4.0}, {first, 3, 3.0}, {first, 4, 2.5},
             {cand.plan_id, 3, 3.25}, {cand.plan_id, 4, 2.75}, {cand.plan_id, 5, 2.0}};
  for (const auto &r : rec) {
    mp_measurement m = {r.plan, r.step, 0.1, 1000, r.loss, 100.0, "cpu", 0, 0, 1e-3, 1.0};
    ASSERT_EQ(mp_store_add_measurement(&c, st, &m), MP_OK) << mp_errmsg(&c);
  }
  mp_arena *a = mp_arena_create();
  mp_step_row *rows = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_run_steps(&c, st, 1, a, &rows, &n), MP_OK) << mp_errmsg(&c);
  ASSERT_EQ(n, 5);
  const double want[5] = {5.0, 4.0, 3.25, 2.75, 2.0};
  for (int i = 0; i < 5; i++) {
    EXPECT_EQ(rows[i].step, i + 1);
    EXPECT_EQ(rows[i].loss, want[i]) << "step " << i + 1;
  }
  mp_run_segment *seg = nullptr;
  ASSERT_EQ(mp_store_run_segments(&c, st, 1, a, &seg, &n), MP_OK) << mp_errmsg(&c);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(seg[0].plan_id, first);
  EXPECT_EQ(seg[0].first_step, 1);
  EXPECT_EQ(seg[0].last_step, 4);
  EXPECT_EQ(seg[1].plan_id, cand.plan_id);
  EXPECT_EQ(seg[1].tp, 2);
  EXPECT_EQ(seg[1].micro_batch, 4);
  EXPECT_EQ(seg[1].first_step, 3);
  EXPECT_EQ(seg[1].last_step, 5);
  EXPECT_EQ(seg[1].n_steps, 3);
  mp_arena_destroy(a);
  mp_store_close(st);
}

// An evaluation (train --eval-only) is a row without a training loss, learning rate or
// gradient norm: its step reads has_loss 0 with its eval loss, and it is not a step time
// among a plan's measured figures.
TEST(TrainStore, AnEvaluationIsARowWithoutALoss) {
  const std::string path = FreshDbPath("eval.db");
  mp_ctx c;
  mp_ctx_init(&c);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&c, path.c_str(), &st), MP_OK) << mp_errmsg(&c);
  const int64_t plan = OnePlanRun(st, 1);
  mp_measurement m = {plan, 20, 0.25, 1000, 9.0, 512.0, "cpu", 1, 3.5, 9.0, 9.0, 1};
  ASSERT_EQ(mp_store_add_measurement(&c, st, &m), MP_OK) << mp_errmsg(&c);
  EXPECT_EQ(Q(st, "SELECT count(*) FROM measurements WHERE loss IS NULL AND lr IS NULL AND grad_norm IS NULL"), 1);
  mp_arena *a = mp_arena_create();
  mp_step_row *rows = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_run_steps(&c, st, 1, a, &rows, &n), MP_OK) << mp_errmsg(&c);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(rows[0].step, 20);
  EXPECT_FALSE(rows[0].has_loss);
  EXPECT_TRUE(rows[0].has_eval);
  EXPECT_EQ(rows[0].eval_loss, 3.5);
  mp_plan_row *plans = nullptr;
  ASSERT_EQ(mp_store_top_plans(&c, st, 1, 0, a, &plans, &n), MP_OK) << mp_errmsg(&c);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(plans[0].n_measured, 0);
  mp_arena_destroy(a);
  mp_store_close(st);
}

// An elastic run's restarts (schema version 7): written in order, read back with the old
// plan unknown as 0 (stored NULL), and only for their own run.
TEST(TrainStore, RestartsOfAnElasticRun) {
  const std::string path = FreshDbPath("restarts.db");
  mp_ctx c;
  mp_ctx_init(&c);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&c, path.c_str(), &st), MP_OK) << mp_errmsg(&c);
  const int64_t first = OnePlanRun(st);
  mp_candidate cand;
  memset(&cand, 0, sizeof cand);
  mp_mesh_init(&cand.mesh);
  cand.mesh.size[MP_DIM_DP_SHARD] = 3;
  cand.micro_batch = 1;
  const mp_plan_settings cpu = {"meshplan-cpu", 1, 0};
  ASSERT_EQ(mp_store_add_plan(&c, st, 1, &cand, &cpu), MP_OK) << mp_errmsg(&c);
  mp_restart_row r = {1, 1, first, cand.plan_id, "dp_shard=4", "dp_shard=3", "a rank was killed", 11, 10, 1, 2.5};
  ASSERT_EQ(mp_store_add_restart(&c, st, &r), MP_OK) << mp_errmsg(&c);
  mp_restart_row r2 = {1, 2, 0, cand.plan_id, "dp_shard=3", "dp_shard=2", "a rank stopped", 14, 10, 4, 7.0};
  ASSERT_EQ(mp_store_add_restart(&c, st, &r2), MP_OK) << mp_errmsg(&c);
  EXPECT_EQ(Q(st, "SELECT count(*) FROM restarts WHERE old_plan_id IS NULL"), 1);
  mp_arena *a = mp_arena_create();
  mp_restart_row *rows = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_run_restarts(&c, st, 1, a, &rows, &n), MP_OK) << mp_errmsg(&c);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(rows[0].old_plan_id, first);
  EXPECT_EQ(rows[0].new_plan_id, cand.plan_id);
  EXPECT_STREQ(rows[0].old_mesh, "dp_shard=4");
  EXPECT_STREQ(rows[0].new_mesh, "dp_shard=3");
  EXPECT_EQ(rows[0].failed_after_step, 11);
  EXPECT_EQ(rows[0].step_resumed, 10);
  EXPECT_EQ(rows[0].steps_lost, 1);
  EXPECT_DOUBLE_EQ(rows[0].recover_s, 2.5);
  EXPECT_EQ(rows[1].attempt, 2);
  EXPECT_EQ(rows[1].old_plan_id, 0);
  EXPECT_STREQ(rows[1].reason, "a rank stopped");
  ASSERT_EQ(mp_store_run_restarts(&c, st, 2, a, &rows, &n), MP_OK) << mp_errmsg(&c);
  EXPECT_EQ(n, 0);
  mp_arena_destroy(a);
  mp_store_close(st);
}

// The routed-expert loads of a training run (version 9): a version-8 database migrates with
// an empty expert_loads table; a step's rows are written for its MoE layers only (layer 0
// dense here) and read back by layer, step and expert; a step recorded again by a resumed
// process's plan reads as that plan's; a plan that does not exist is refused.
TEST(TrainStore, ExpertLoadsPerStepLayerAndExpert) {
  const std::string path = FreshDbPath("loads.db");
  mp_ctx c;
  mp_ctx_init(&c);
  mp_store *st = nullptr;
  ASSERT_EQ(mp_store_open(&c, path.c_str(), &st), MP_OK) << mp_errmsg(&c);
  const int64_t first = OnePlanRun(st);
  mp_store_close(st);
  sqlite3 *db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DROP TABLE expert_loads; ALTER TABLE plans DROP COLUMN etp; ALTER TABLE plans DROP COLUMN dopt; ALTER TABLE plans DROP COLUMN loss_chunks; ALTER TABLE plans DROP COLUMN nccl_version; ALTER TABLE plans DROP COLUMN stack; ALTER TABLE plans DROP COLUMN moe_imbalance; ALTER TABLE plans DROP COLUMN moe_capacity_factor; ALTER TABLE plans DROP COLUMN fp8_recipe; ALTER TABLE plans DROP COLUMN mtp_layers; UPDATE schema_version SET version=8; PRAGMA user_version=8",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  ASSERT_EQ(mp_store_open(&c, path.c_str(), &st), MP_OK) << mp_errmsg(&c);
  EXPECT_EQ(Q(st, "PRAGMA user_version"), MP_STORE_SCHEMA_VERSION);
  EXPECT_EQ(Q(st, "SELECT count(*) FROM expert_loads"), 0);
  mp_candidate cand;
  memset(&cand, 0, sizeof cand);
  mp_mesh_init(&cand.mesh);
  cand.micro_batch = 2;
  const mp_plan_settings cpu = {"meshplan-cpu", 1, 0};
  ASSERT_EQ(mp_store_add_plan(&c, st, 1, &cand, &cpu), MP_OK) << mp_errmsg(&c);
  // 2 layers (the first dense) x 3 experts; steps 1 and 2, then step 2 again by the resumed plan
  const int moe[2] = {0, 1};
  const int64_t routed1[6] = {0, 0, 0, 5, 2, 1}, dropped1[6] = {0, 0, 0, 1, 0, 0};
  const int64_t routed2[6] = {0, 0, 0, 4, 4, 0}, routed2b[6] = {0, 0, 0, 2, 3, 3}, none[6] = {0};
  const mp_expert_loads recs[3] = {{first, 1, 2, 3, moe, routed1, dropped1}, {first, 2, 2, 3, moe, routed2, none},
                                   {cand.plan_id, 2, 2, 3, moe, routed2b, none}};
  for (const auto &x : recs) ASSERT_EQ(mp_store_add_expert_loads(&c, st, &x), MP_OK) << mp_errmsg(&c);
  const mp_expert_loads bad = {999, 1, 2, 3, moe, routed1, dropped1};
  EXPECT_EQ(mp_store_add_expert_loads(&c, st, &bad), MP_ERR_NOT_FOUND);
  EXPECT_EQ(Q(st, "SELECT count(*) FROM expert_loads WHERE layer = 0"), 0);
  EXPECT_EQ(Q(st, "SELECT count(*) FROM expert_loads"), 9);
  mp_arena *a = mp_arena_create();
  mp_expert_load_row *rows = nullptr;
  int64_t n = 0;
  ASSERT_EQ(mp_store_run_expert_loads(&c, st, 1, a, &rows, &n), MP_OK) << mp_errmsg(&c);
  ASSERT_EQ(n, 6);
  const int64_t want_routed[6] = {5, 2, 1, 2, 3, 3};  // step 1, then step 2 as the resumed plan recorded it
  for (int i = 0; i < 6; i++) {
    EXPECT_EQ(rows[i].layer, 1) << i;
    EXPECT_EQ(rows[i].step, i < 3 ? 1 : 2) << i;
    EXPECT_EQ(rows[i].expert, i % 3) << i;
    EXPECT_EQ(rows[i].routed, want_routed[i]) << i;
    EXPECT_EQ(rows[i].dropped, i == 0 ? 1 : 0) << i;
  }
  ASSERT_EQ(mp_store_run_expert_loads(&c, st, 2, a, &rows, &n), MP_OK) << mp_errmsg(&c);
  EXPECT_EQ(n, 0);
  mp_arena_destroy(a);
  mp_store_close(st);
}

}  // namespace
