// common/stats.h against hand-derived values and one published example.
#include <gtest/gtest.h>

#include <cmath>

#include "common/stats.h"

namespace {

TEST(Stats, MedianOfOddAndEvenCounts) {
  double a[] = {5, 1, 3};
  EXPECT_DOUBLE_EQ(mp_median(a, 3), 3);
  double b[] = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(mp_median(b, 4), 2.5);
}

// |110 - 100| / 100 = 0.10, |90 - 100| / 100 = 0.10, |50 - 40| / 40 = 0.25: mean 0.15. The
// mean is over the three pairs given, whatever else the caller holds.
TEST(Stats, MapeIsTheMeanOfAbsoluteRelativeErrors) {
  const double p[] = {110, 90, 50}, m[] = {100, 100, 40};
  EXPECT_NEAR(mp_mape(p, m, 3), 0.15, 1e-15);
  EXPECT_NEAR(mp_mape(p, m, 2), 0.10, 1e-15);
}

// No ties: x = 1..5, y = 3 1 2 5 4. Of the 10 pairs, (1,2), (1,3) and (4,5) are discordant
// (y falls while x rises), the other 7 concordant: (7 - 3) / sqrt(10 x 10) = 0.4.
TEST(Stats, KendallTauWithoutTies) {
  const double x[] = {1, 2, 3, 4, 5}, y[] = {3, 1, 2, 5, 4};
  EXPECT_NEAR(mp_kendall_tau_b(x, y, 5), 0.4, 1e-15);
  EXPECT_NEAR(mp_kendall_tau_b(x, x, 5), 1.0, 1e-15);
}

// Ties: x = 1 1 2 2, y = 30 40 40 50. Pairs: (A,B) tied in x alone, (C,D) tied in x alone,
// (B,C) tied in y alone, (A,C), (A,D), (B,D) concordant: C = 3, D = 0, Tx = 2, Ty = 1, so
// tau-b = 3 / sqrt((3 + 2) (3 + 1)) = 3 / sqrt(20) = 0.670820393. Goodman and Kruskal's
// gamma, (C - D) / (C + D), would say 1, and tau-a, (C - D) / 6, 0.5.
TEST(Stats, KendallTauBCountsTiesInEachSample) {
  const double x[] = {1, 1, 2, 2}, y[] = {30, 40, 40, 50};
  EXPECT_NEAR(mp_kendall_tau_b(x, y, 4), 3.0 / std::sqrt(20.0), 1e-15);
  // a pair tied in both counts in neither: x = 1 1 2, y = 5 5 6 leaves two concordant pairs
  const double u[] = {1, 1, 2}, v[] = {5, 5, 6};
  EXPECT_NEAR(mp_kendall_tau_b(u, v, 3), 1.0, 1e-15);
}

// scipy.stats.kendalltau's documented example (SciPy reference guide): x = 12 2 1 12 2,
// y = 1 4 7 1 0 gives tau-b -0.47140452079103173. By hand: C = 2, D = 6, Tx = 1 (the two
// 2s), Ty = 0, and the pair of (12, 1)s is tied in both: (2 - 6) / sqrt(9 x 8) = -4 / sqrt(72).
TEST(Stats, KendallTauBMatchesScipysExample) {
  const double x[] = {12, 2, 1, 12, 2}, y[] = {1, 4, 7, 1, 0};
  EXPECT_NEAR(mp_kendall_tau_b(x, y, 5), -0.47140452079103173, 1e-15);
}

TEST(Stats, KendallTauIsUndefinedForAConstantSample) {
  const double x[] = {1, 1, 1}, y[] = {1, 2, 3};
  EXPECT_TRUE(std::isnan(mp_kendall_tau_b(x, y, 3)));
  EXPECT_TRUE(std::isnan(mp_kendall_tau_b(y, x, 3)));
  EXPECT_TRUE(std::isnan(mp_kendall_tau_b(x, y, 1)));
}

}  // namespace
