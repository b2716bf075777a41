// plan --why's order of the matching candidates (planner/why.h) on the fake evaluator
// (fake.h), whose peaks and steps are stated there so that the order is derived by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "planner/why.h"
#include "tests/planner/fake.h"

namespace {

struct Ranked : FakeRankedSearch {
  explicit Ranked(int full_ac_ahead = 1) : FakeRankedSearch(full_ac_ahead) {}
  std::vector<int64_t> matches(const char *spec) {
    mp_search_fix f;
    mp_search_fix_init(&f);
    EXPECT_EQ(mp_search_fix_parse(&ctx, spec, &f), MP_OK) << mp_errmsg(&ctx);
    int64_t *idx = nullptr, n = 0;
    EXPECT_EQ(mp_search_matches(&ctx, s, &f, order, n_order, &idx, &n), MP_OK) << mp_errmsg(&ctx);
    return std::vector<int64_t>(idx, idx + n);
  }
  std::string opts(int64_t i) const {
    char b[192];
    mp_candidate_options_str(&s->cands[i], b, sizeof b);
    return b;
  }
};

// dp_shard=8 on 8 GPUs, batch 32: micro-batches 1, 2, 4 x AC none, full, selective-core x
// float8 off, on x reshard off, on = 36 candidates, every one fits (peak 8 + mb x act <= 40 GiB).
// The first enumerated (ac none, mb 1, fp8 off, reshard off: step 1.25 + 0.01) is not the
// best: with float8 the steps of mb 4, 2, 1 are 1.25 x 0.8 + 0.0025, + 0.005, + 0.01 =
// 1.0025, 1.005, 1.01 s, within 1 % of each other, and the tie goes to the lowest peak
// (8 + 8 - 1 = 15 GiB at mb 1). It comes first, every match after it ranked lower.
TEST(Why, TheBestRankedMatchComesFirst) {
  Ranked r;
  std::vector<int64_t> m = r.matches("dp_shard=8");
  ASSERT_EQ(m.size(), 36u);
  mp_search_fix f;
  mp_search_fix_init(&f);
  f.dp_shard = 8;
  const int64_t first = mp_search_find(r.s, &f);
  EXPECT_NE(m[0], first);
  EXPECT_EQ(r.opts(first), "dp_shard=8 ac=none mb=1");
  EXPECT_EQ(r.opts(m[0]), "dp_shard=8 ac=none mb=1 fp8=1");
  EXPECT_EQ(r.s->cands[m[0]].res.peak_mem_bytes, 15 * kGiB);
  int64_t prev = 0;
  for (int64_t i : m) {
    const int64_t rank = mp_search_rank_of(r.order, r.n_order, i);
    ASSERT_GT(rank, prev) << r.opts(i);
    prev = rank;
  }
}

// dp_replicate=8, ac none: peak 64 + 8 x mb - (fp8 ? 1 : 0) GiB, over 40 for every one.
// Simulated: mb 1 with float8 off (72 GiB) and on (71); mb 2 and 4 follow from their halves
// (memory_mb); reshard on is a duplicate with dp_shard = 1 (reshard_noop, a rule before the
// memory ones). None ranked: the nearest to fitting first (71), then 72, then the four
// memory_mb in enumeration order, then the six duplicates. The search decides in
// enumeration order (full_ac_ahead 0), so that both mb 1 candidates are simulated: with
// full_ac_ahead their full-AC siblings (64 and 65 GiB) decide them over capacity unsimulated.
TEST(Why, WithoutARankedMatchTheFurthestAndNearestComesFirst) {
  Ranked r(0);
  std::vector<int64_t> m = r.matches("dp_replicate=8,ac=none");
  ASSERT_EQ(m.size(), 12u);
  const char *want_rule[12] = {"memory", "memory", "memory_mb", "memory_mb", "memory_mb", "memory_mb",
                               "reshard_noop", "reshard_noop", "reshard_noop", "reshard_noop", "reshard_noop",
                               "reshard_noop"};
  for (int k = 0; k < 12; k++) {
    EXPECT_STREQ(mp_reject_name((mp_reject)r.s->cands[m[k]].reject), want_rule[k]) << k;
    EXPECT_EQ(mp_search_rank_of(r.order, r.n_order, m[k]), 0) << k;
  }
  EXPECT_EQ(r.opts(m[0]), "dp_replicate=8 ac=none mb=1 fp8=1");
  EXPECT_EQ(r.s->cands[m[0]].res.peak_mem_bytes, 71 * kGiB);
  EXPECT_EQ(r.opts(m[1]), "dp_replicate=8 ac=none mb=1");
  EXPECT_EQ(r.s->cands[m[1]].res.peak_mem_bytes, 72 * kGiB);
  for (int k = 3; k < 6; k++) EXPECT_LT(m[k - 1], m[k]);  // enumeration order among equals
  EXPECT_TRUE(r.matches("tp=3").empty());
}

}  // namespace
