// train --elastic's deciding parts (app/elastic.h): the launcher's command line under
// mpirun and under Slurm's srun (which cannot run here, so its command line is what is
// checked), Young/Daly's interval against figures worked by hand, the ranks' lines the
// supervisor follows, and the restart handed to a resumed process.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <string>
#include <vector>

#include "app/elastic.h"

namespace {

std::vector<std::string> argv_of(const mp_elastic_launch &l) {
  const char *out[64];
  char num[32];
  const int n = mp_elastic_launch_argv(&l, out, 64, num, sizeof num);
  std::vector<std::string> v;
  for (int i = 0; i < n; i++) v.push_back(out[i]);
  EXPECT_EQ(out[n], nullptr);
  return v;
}

char a0[] = "--model", a1[] = "tiny-dense", a2[] = "--resume", a3[] = "latest";
char *const kArgs[] = {a0, a1, a2, a3};

TEST(ElasticLaunch, MpirunAsRoot) {
  mp_elastic_launch l = {MP_ELASTIC_MPIRUN, 3, 1, "/bin/meshplan", kArgs, 4};
  const std::vector<std::string> want = {"mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                                         "-np", "3", "/bin/meshplan", "train", "--model", "tiny-dense",
                                         "--resume", "latest"};
  EXPECT_EQ(argv_of(l), want);
  l.as_root = 0;
  EXPECT_EQ(argv_of(l)[1], "--oversubscribe");
}

TEST(ElasticLaunch, SrunUnderSlurm) {
  mp_elastic_launch l = {MP_ELASTIC_SRUN, 7, 1, "/bin/meshplan", kArgs, 2};
  const std::vector<std::string> want = {"srun", "--ntasks=7", "--kill-on-bad-exit=1", "/bin/meshplan", "train",
                                         "--model", "tiny-dense"};
  EXPECT_EQ(argv_of(l), want);
}

TEST(ElasticLaunch, TooSmallIsRefused) {
  mp_elastic_launch l = {MP_ELASTIC_MPIRUN, 3, 1, "/bin/meshplan", kArgs, 4};
  const char *out[8];
  char num[32];
  EXPECT_EQ(mp_elastic_launch_argv(&l, out, 8, num, sizeof num), -1);
}

TEST(ElasticLaunch, LauncherFromEnvironment) {
  unsetenv("SLURM_JOB_ID");
  EXPECT_EQ(mp_elastic_launcher_from_env(), MP_ELASTIC_MPIRUN);
  setenv("SLURM_JOB_ID", "4242", 1);
  EXPECT_EQ(mp_elastic_launcher_from_env(), MP_ELASTIC_SRUN);
  unsetenv("SLURM_JOB_ID");
}

// Young 1974: T = sqrt(2 C M). C = 30 s, M = 4 h = 14400 s: sqrt(864000) = 929.5 s; at a
// 10 s step that is 93 steps (929.5 / 10 rounded).
TEST(ElasticInterval, YoungDaly) {
  EXPECT_NEAR(mp_elastic_young_daly_s(30, 14400), std::sqrt(864000.0), 1e-9);
  EXPECT_EQ(mp_elastic_interval_steps(30, 14400, 10, 1000), 93);
  EXPECT_EQ(mp_elastic_interval_steps(30, 14400, 10, 50), 50);     // capped at the run's steps
  EXPECT_EQ(mp_elastic_interval_steps(1e-6, 1, 10, 50), 1);        // at least every step
  EXPECT_EQ(mp_elastic_interval_steps(0, 14400, 10, 50), 50);      // unmeasured: the last step only
  EXPECT_EQ(mp_elastic_young_daly_s(-1, 14400), 0.0);
}

// Llama 3's figure: 54 days x 24 h x 16384 GPUs / 419 interruptions.
TEST(ElasticInterval, DefaultMtbf) { EXPECT_NEAR(MP_ELASTIC_DEFAULT_MTBF_H, 50677.0, 1.0); }

// plan's line for Llama 3.1 8B (8,030,261,248 parameters) on 8 GPUs at a 10 s step: C =
// 8,030,261,248 x 12 / 8 / 122e6 = 98.7 s, MTBF = 50,677 h x 3600 / 8 = 22,804,650 s,
// sqrt(2 x 98.73 x 22,804,650) = 67,105 s = 6,711 steps of 10 s.
TEST(ElasticInterval, PlanLine) {
  char buf[400];
  mp_elastic_plan_interval_str(8030261248LL, 8, 10.0, buf, sizeof buf);
  EXPECT_NE(std::string(buf).find("checkpoint every 6711 steps (67105 s)"), std::string::npos) << buf;
  EXPECT_NE(std::string(buf).find("C = 98.7 s"), std::string::npos) << buf;
  EXPECT_NE(std::string(buf).find("MTBF = 6334.62 h"), std::string::npos) << buf;
}

TEST(ElasticLines, StepAndResume) {
  int64_t s = -1;
  EXPECT_EQ(mp_elastic_parse_line("step   12  loss 5.1  (ce 5.1 aux 0)  grad_norm 1\n", &s), 1);
  EXPECT_EQ(s, 12);
  EXPECT_EQ(mp_elastic_parse_line("resumed from d: step 3/step_00000010: step 10 (saved by mesh x)\n", &s), 2);
  EXPECT_EQ(s, 10);
  EXPECT_EQ(mp_elastic_parse_line("step 12: the loss is nan and the gradient norm nan\n", &s), 0);
  EXPECT_EQ(mp_elastic_parse_line("checkpoint: d/step_00000010 (1 ms)\n", &s), 0);
}

TEST(ElasticRestart, RoundTrip) {
  mp_elastic_restart r = {2, 11, 1700000000.25, "dp_shard=4", "a rank was killed"};
  char buf[256];
  mp_elastic_restart_format(&r, buf, sizeof buf);
  mp_elastic_restart back;
  ASSERT_TRUE(mp_elastic_restart_parse(buf, &back));
  EXPECT_EQ(back.attempt, 2);
  EXPECT_EQ(back.failed_after_step, 11);
  EXPECT_NEAR(back.failed_at, 1700000000.25, 1e-3);
  EXPECT_STREQ(back.old_mesh, "dp_shard=4");
  EXPECT_STREQ(back.reason, "a rank was killed");
  EXPECT_FALSE(mp_elastic_restart_parse("0|11|1|m|r", &back));  // attempts count from 1
  EXPECT_FALSE(mp_elastic_restart_parse("1|11|1|no-reason", &back));
  EXPECT_FALSE(mp_elastic_restart_parse("junk", &back));
}

}  // namespace
