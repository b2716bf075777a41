// Tests of the gnuplot plots (planner/plot.h): each plot writes its data, script and a PNG;
// the data holds what the plot claims (every evaluated candidate, the chosen plan, the
// breakdown rows, the trace's events per stream); a missing gnuplot names the package.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "planner/plot.h"
#include "planner/search.h"
#include "tests/planner/fake.h"

namespace {

std::string tmp_dir(const std::string &name) {
  const char *d = getenv("TEST_TMPDIR");
  std::string p = std::string(d ? d : "/tmp") + "/" + name;
  mkdir(p.c_str(), 0777);
  return p;
}

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool is_png(const std::string &path) {
  std::string s = slurp(path);
  return s.size() > 1000 && s.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0;
}

// Data lines (not comments, not blank) per gnuplot index block.
std::vector<int> block_lines(const std::string &text) {
  std::vector<int> n(1, 0);
  std::istringstream in(text);
  std::string line;
  int blanks = 0;
  while (std::getline(in, line)) {
    if (line.empty()) {
      if (++blanks == 2) n.push_back(0);
      continue;
    }
    blanks = 0;
    if (line[0] == '#') continue;
    n.back()++;
  }
  return n;
}

using Fixture = FakeRankedSearch;

TEST(Plot, CandidatesScatter) {
  Fixture fx;
  std::string dir = tmp_dir("plot_candidates");
  ASSERT_EQ(mp_plot_candidates(&fx.ctx, dir.c_str(), fx.s, fx.order, fx.n_order, 40.0, "fake run"),
            MP_OK)
      << mp_errmsg(&fx.ctx);
  EXPECT_TRUE(is_png(dir + "/candidates.png"));
  std::vector<int> blocks = block_lines(slurp(dir + "/candidates.dat"));
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0], fx.s->n_feasible);
  EXPECT_EQ(blocks[1], fx.s->n_evaluated - fx.s->n_feasible);
  EXPECT_EQ(blocks[2], 1);
  std::string gp = slurp(dir + "/candidates.gp");
  EXPECT_NE(gp.find("peak memory per GPU (GiB"), std::string::npos);
  EXPECT_NE(gp.find("predicted step time (s"), std::string::npos);
  EXPECT_NE(gp.find("capacity 40.0 GiB"), std::string::npos);
}

// A search of thousands of simulated candidates over memory draws an even sample of 1,000 of
// them, says how many there were, and every plan that fits (the fake model on 64 nodes of 8:
// 64 GiB of state over few shards with micro-batches up to 64 is over 40 GiB thousands of times).
TEST(Plot, CandidatesOverMemoryAreSampled) {
  mp_model model = fake_dense_model();
  mp_cluster cluster = fake_cluster(64, 8);
  mp_search_config cfg;
  mp_search_config_init(&cfg);
  cfg.model = &model;
  cfg.cluster = &cluster;
  cfg.seq = 4096;
  cfg.global_batch = 512 * 64;
  cfg.eval = fake_eval;
  cfg.n_threads = 2;
  cfg.prune_dominated = 1;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_search *s = nullptr;
  ASSERT_EQ(mp_search_enumerate(&ctx, &cfg, &s), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_search_run(&ctx, &cfg, s, nullptr, nullptr, nullptr, nullptr), MP_OK) << mp_errmsg(&ctx);
  int64_t *order = nullptr, n_order = 0;
  ASSERT_EQ(mp_search_rank(&ctx, s, MP_OBJECTIVE_TIME, 0, &order, &n_order), MP_OK);
  const int64_t over = s->n_evaluated - s->n_feasible;
  ASSERT_GT(over, 1000);
  std::string dir = tmp_dir("plot_sampled");
  ASSERT_EQ(mp_plot_candidates(&ctx, dir.c_str(), s, order, n_order, 40.0, "big"), MP_OK) << mp_errmsg(&ctx);
  std::vector<int> blocks = block_lines(slurp(dir + "/candidates.dat"));
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0], s->n_feasible);
  EXPECT_EQ(blocks[1], 1000);
  EXPECT_NE(slurp(dir + "/candidates.gp").find("over memory (" + std::to_string(over) + ", 1000 drawn)"),
            std::string::npos);
  mp_search_destroy(s);
}

TEST(Plot, MemoryBreakdown) {
  Fixture fx;
  std::string dir = tmp_dir("plot_memory");
  ASSERT_EQ(mp_plot_memory(&fx.ctx, dir.c_str(), fx.s, fx.order, fx.n_order, 5, 40.0, "fake"), MP_OK)
      << mp_errmsg(&fx.ctx);
  EXPECT_TRUE(is_png(dir + "/memory.png"));
  std::string dat = slurp(dir + "/memory.dat");
  // Header line + 5 plans; the best plan's row sums to its peak (fake: params + activations).
  std::istringstream in(dat);
  std::string line;
  int rows = 0;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#' && line.compare(0, 4, "rank") != 0) rows++;
  EXPECT_EQ(rows, 5);
  EXPECT_NE(dat.find("\"activations\""), std::string::npos);
}

TEST(Plot, TimelineFromChromeTrace) {
  Fixture fx;
  std::string dir = tmp_dir("plot_timeline");
  std::string trace = dir + "/trace.json";
  FILE *f = fopen(trace.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("{\"traceEvents\":["
        "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"compute\"}},"
        "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"gather\"}},"
        "{\"name\":\"layers.0.attention.q_proj\",\"cat\":\"compute\",\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":100,"
        "\"dur\":900,\"args\":{\"phase\":\"forward\"}},"
        "{\"name\":\"layers.0 all_gather\",\"cat\":\"comm\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":0,\"dur\":100,"
        "\"args\":{\"phase\":\"forward\"}},"
        "{\"name\":\"layers.0.attention all_reduce tp\",\"cat\":\"comm\",\"ph\":\"X\",\"pid\":0,\"tid\":0,"
        "\"ts\":1000,\"dur\":500,\"args\":{\"phase\":\"forward\"}},"
        "{\"name\":\"layers.0.attention.q_proj\",\"cat\":\"compute\",\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":1500,"
        "\"dur\":1500,\"args\":{\"phase\":\"backward\"}},"
        "{\"name\":\"memory (GiB)\",\"ph\":\"C\",\"pid\":0,\"ts\":0,\"args\":{\"params\":1,\"activations\":0}},"
        "{\"name\":\"memory (GiB)\",\"ph\":\"C\",\"pid\":0,\"ts\":1000,\"args\":{\"params\":1,\"activations\":2}},"
        "{\"name\":\"memory (GiB)\",\"ph\":\"C\",\"pid\":0,\"ts\":3000,\"args\":{\"params\":1,\"activations\":0.5}}"
        "],\"displayTimeUnit\":\"ms\"}",
        f);
  fclose(f);
  ASSERT_EQ(mp_plot_timeline(&fx.ctx, dir.c_str(), trace.c_str(), "fake timeline"), MP_OK)
      << mp_errmsg(&fx.ctx);
  EXPECT_TRUE(is_png(dir + "/timeline.png"));
  // Events in ms. Rows: the compute stream's kernels (0), the collectives it runs between
  // them (1: the TP all-reduce on a row and colour of its own), the gather stream (2).
  std::string dat = slurp(dir + "/timeline.dat");
  EXPECT_NE(dat.find("0.100000 1.000000 0\n"), std::string::npos);
  EXPECT_NE(dat.find("1.000000 1.500000 1\n"), std::string::npos);
  EXPECT_NE(dat.find("0.000000 0.100000 2\n"), std::string::npos);
  EXPECT_NE(dat.find("1.500000 3.000000 0\n"), std::string::npos);
  std::string gp = slurp(dir + "/timeline.gp");
  EXPECT_NE(gp.find("'compute: kernels' 0, 'compute: collectives' 1, 'gather' 2"), std::string::npos) << gp;
  EXPECT_NE(gp.find("time within the step (ms)"), std::string::npos);
  // Three rows, three colours.
  EXPECT_NE(gp.find("$3==0 ? $3 : NaN):(($2-$1)/2):(0.35) with boxxyerror lc rgb '#1f77b4'"), std::string::npos);
  EXPECT_NE(gp.find("$3==1 ? $3 : NaN):(($2-$1)/2):(0.35) with boxxyerror lc rgb '#d62728'"), std::string::npos);
  EXPECT_NE(gp.find("$3==2 ? $3 : NaN):(($2-$1)/2):(0.35) with boxxyerror lc rgb '#2ca02c'"), std::string::npos);

  // The memory counter over time: categories stacked (cumulative columns), each sample
  // twice so that the areas step: at 1 ms params 1 and activations 2 (cumulative 3).
  ASSERT_EQ(mp_plot_memory_time(&fx.ctx, dir.c_str(), trace.c_str(), 4.0, 0.5, "fake memory"), MP_OK)
      << mp_errmsg(&fx.ctx);
  EXPECT_TRUE(is_png(dir + "/memory_time.png"));
  std::string mt = slurp(dir + "/memory_time.dat");
  EXPECT_NE(mt.find("0.000000 1 1\n1.000000 1 1\n1.000000 1 3\n3.000000 1 3\n3.000000 1 1.5\n"), std::string::npos)
      << mt;
  std::string mgp = slurp(dir + "/memory_time.gp");
  EXPECT_NE(mgp.find("title 'params'"), std::string::npos);
  EXPECT_NE(mgp.find("title 'activations'"), std::string::npos);
  // the plotted allocations leave the runtime overhead out: their line is the usable 4 GiB
  // less the 0.5 GiB overhead, at 3.5, and its label gives that number (it gave the line at 4
  // the number 3.5); the data's peak, 3 GiB, is labelled
  EXPECT_NE(mgp.find("first 3.5 to graph 1, first 3.5"), std::string::npos) << mgp;
  EXPECT_NE(mgp.find("'allocations may reach 3.5 GiB: the usable 4.0 GiB less the runtime overhead 0.50 GiB'"),
            std::string::npos)
      << mgp;
  EXPECT_EQ(mgp.find("first 4 to graph 1"), std::string::npos) << mgp;
  EXPECT_NE(mgp.find("'peak 3.0 GiB'"), std::string::npos) << mgp;
  // Not a trace: a clear error.
  std::string bad = dir + "/bad.json";
  f = fopen(bad.c_str(), "w");
  fputs("{\"x\":1}", f);
  fclose(f);
  EXPECT_EQ(mp_plot_timeline(&fx.ctx, dir.c_str(), bad.c_str(), "t"), MP_ERR_INVALID);
}

// Three micro-batches and the optimizer: micro-batch 0 from 0 to 3 ms (a gather 0-0.5 on
// its own stream before its kernel 0.5-3), micro-batch 1 from 3 to 6, micro-batch 2 from 6
// to 9 (a TP all-reduce 7-8 on the compute stream between its kernels 6-7 and 8-9), the
// optimizer 9-10 and a reduce-scatter 8.5-9.5 beside it. The timeline draws micro-batch 1's
// window (0 to 3 ms) and the last one's to the step's end (6 to 10 ms), not micro-batch 1's
// events; the exposed communication is where a collective runs and no compute kernel does:
// 0-0.5 and 7-8 (the reduce-scatter overlaps kernels): 1.5 ms.
TEST(Plot, TimelineShowsTheFirstAndLastMicroBatchAndTheExposedCommunication) {
  std::string dir = tmp_dir("plot_timeline_micro");
  std::string trace = dir + "/trace.json";
  FILE *f = fopen(trace.c_str(), "w");
  ASSERT_NE(f, nullptr);
  auto ev = [&](const char *cat, int tid, int ts, int dur, int micro) {
    fprintf(f, ",{\"name\":\"e\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%d,\"dur\":%d,"
               "\"args\":{\"micro\":%d}}", cat, tid, ts, dur, micro);
  };
  fputs("{\"traceEvents\":[{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":"
        "\"compute\"}},{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"gather\"}}",
        f);
  ev("comm", 1, 0, 500, 0);
  ev("compute", 0, 500, 2500, 0);
  ev("compute", 0, 3000, 3000, 1);
  ev("compute", 0, 6000, 1000, 2);
  ev("comm", 0, 7000, 1000, 2);
  ev("compute", 0, 8000, 1000, 2);
  ev("comm", 1, 8500, 1000, -1);
  ev("compute", 0, 9000, 1000, -1);
  fputs("]}", f);
  fclose(f);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_plot_timeline(&ctx, dir.c_str(), trace.c_str(), "three micro-batches"), MP_OK) << mp_errmsg(&ctx);
  EXPECT_TRUE(is_png(dir + "/timeline.png"));
  std::string dat = slurp(dir + "/timeline.dat");
  // rows: compute kernels 0, compute collectives 1, gather 2; exposed 3
  EXPECT_NE(dat.find("0.500000 3.000000 0\n"), std::string::npos) << dat;
  EXPECT_EQ(dat.find("3.000000 6.000000 0\n"), std::string::npos) << dat;  // micro-batch 2 of 3: not drawn
  EXPECT_NE(dat.find("7.000000 8.000000 1\n"), std::string::npos) << dat;
  EXPECT_NE(dat.find("9.000000 10.000000 0\n"), std::string::npos) << dat;
  EXPECT_NE(dat.find("0.000000 0.500000 3\n"), std::string::npos) << dat;
  EXPECT_NE(dat.find("7.000000 8.000000 3\n"), std::string::npos) << dat;
  EXPECT_EQ(dat.find("9.000000 9.500000 3\n"), std::string::npos) << dat;
  std::string gp = slurp(dir + "/timeline.gp");
  EXPECT_NE(gp.find("set multiplot layout 2,1"), std::string::npos) << gp;
  EXPECT_NE(gp.find("exposed communication 1.5 ms"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set title 'micro-batch 1 of 3, from the start of the step'\nset xrange [0.000000:3."),
            std::string::npos) << gp;
  EXPECT_NE(gp.find("set title 'micro-batch 3 of 3 and the optimizer, to the end of the step'\nset xrange [6.000000:10."),
            std::string::npos) << gp;
  EXPECT_NE(gp.find("'exposed communication' 3)"), std::string::npos) << gp;
  EXPECT_NE(gp.find("title 'exposed comm: compute waits'"), std::string::npos) << gp;  // the key
  EXPECT_NE(gp.find("set key outside right top"), std::string::npos) << gp;
}

// memory.png tics its bars #1, #2, ... with no rotated labels, and lists the plans under
// them in horizontal text.
TEST(Plot, MemoryBarsListTheirPlansUnderThem) {
  Fixture fx;
  std::string dir = tmp_dir("plot_memory_labels");
  ASSERT_EQ(mp_plot_memory(&fx.ctx, dir.c_str(), fx.s, fx.order, fx.n_order, 3, 40.0, "fake"), MP_OK)
      << mp_errmsg(&fx.ctx);
  std::string gp = slurp(dir + "/memory.gp"), dat = slurp(dir + "/memory.dat");
  EXPECT_EQ(gp.find("rotate"), std::string::npos) << gp;
  EXPECT_NE(dat.find("\n1 \"#1\" "), std::string::npos) << dat;
  EXPECT_NE(dat.find("\n3 \"#3\" "), std::string::npos) << dat;
  EXPECT_NE(gp.find("set label 10 '#1 "), std::string::npos) << gp;
  EXPECT_NE(gp.find("set label 12 '#3 "), std::string::npos) << gp;
}

// A training run's plots: a margin around the points (the last validation marker was cut in
// half by the border), the predicted throughput as a line, the resume marked before its step.
TEST(Plot, TrainingCurvesShowThePredictionAndTheResume) {
  std::string dir = tmp_dir("plot_training");
  const mp_plot_step steps[4] = {{1, 5.0, 1000, 0, 0}, {2, 4.8, 1100, 1, 4.9}, {3, 4.7, 1050, 0, 0},
                                 {4, 4.6, 1080, 1, 4.7}};
  const int64_t resumed[1] = {3};
  const mp_plot_training_marks marks = {1234.0, resumed, 1};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_plot_training(&ctx, dir.c_str(), steps, 4, &marks, "a run"), MP_OK) << mp_errmsg(&ctx);
  EXPECT_TRUE(is_png(dir + "/loss.png"));
  EXPECT_TRUE(is_png(dir + "/throughput.png"));
  std::string loss = slurp(dir + "/loss.gp"), tput = slurp(dir + "/throughput.gp");
  EXPECT_NE(loss.find("set offsets graph 0.03, graph 0.03"), std::string::npos) << loss;
  EXPECT_NE(tput.find("1234 with lines dt 2 lw 2 lc rgb '#444444' title 'predicted 1234 tokens/s'"),
            std::string::npos) << tput;
  EXPECT_NE(tput.find("set arrow 1 from 2.5, graph 0 to 2.5, graph 1"), std::string::npos) << tput;
  EXPECT_NE(loss.find("title 'resumed from a checkpoint (step 3)'"), std::string::npos) << loss;
  // without marks: no prediction, no resume
  ASSERT_EQ(mp_plot_training(&ctx, dir.c_str(), steps, 4, nullptr, "a run"), MP_OK) << mp_errmsg(&ctx);
  tput = slurp(dir + "/throughput.gp");
  EXPECT_EQ(tput.find("predicted"), std::string::npos) << tput;
  EXPECT_EQ(tput.find("set arrow"), std::string::npos) << tput;
}

TEST(Plot, MissingGnuplotNamesThePackage) {
  std::string old = getenv("PATH") ? getenv("PATH") : "";
  setenv("PATH", "/nonexistent-dir", 1);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_status st = mp_plot_check_gnuplot(&ctx);
  setenv("PATH", old.c_str(), 1);
  EXPECT_EQ(st, MP_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("gnuplot-nox"), std::string::npos);
}

TEST(Plot, GnuplotErrorIsReported) {
  std::string dir = tmp_dir("plot_error");
  FILE *f = fopen((dir + "/broken.gp").c_str(), "w");
  fputs("plot 'does-not-exist.dat'\n", f);
  fclose(f);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_plot_run_gnuplot(&ctx, dir.c_str(), "broken.gp"), MP_ERR_IO);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("gnuplot failed on"), std::string::npos);
}

}  // namespace
