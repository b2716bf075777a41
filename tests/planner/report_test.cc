// planner/report.h: what a plan costs to train, against hand-derived figures; the rejection
// counts in order.
#include <gtest/gtest.h>

#include <cstring>

#include "planner/report.h"

namespace {

// Llama 3 405B's scale: 15T tokens at 120 tokens/s per GPU on 16,384 GPUs take
// 15e12 / (120 x 16,384) = 7,629,394.5 s = 88.30 days; at $2 per GPU-hour they cost
// 15e12 / 120 / 3,600 x 2 = $69,444,444.44 (88.30 days x 24 h x 16,384 GPUs x $2, the same).
TEST(Report, DaysAndCostToTrain) {
  mp_candidate c;
  memset(&c, 0, sizeof c);
  c.res.tokens_per_s_per_gpu = 120;
  EXPECT_NEAR(mp_train_days(&c, 16384, 15e12), 15e12 / (120.0 * 16384) / 86400, 1e-9);
  EXPECT_NEAR(mp_train_days(&c, 16384, 15e12), 88.30, 0.005);
  EXPECT_NEAR(mp_train_cost(&c, 15e12, 2.0), 69444444.44, 0.01);
  EXPECT_NEAR(mp_train_cost(&c, 15e12, 2.0), mp_train_days(&c, 16384, 15e12) * 24 * 16384 * 2.0, 1e-3);
  EXPECT_EQ(mp_train_cost(&c, 15e12, 0), 0);
  c.res.tokens_per_s_per_gpu = 0;
  EXPECT_EQ(mp_train_days(&c, 16384, 15e12), 0);
}

TEST(Report, RejectionsLargestFirstTiesInRuleOrder) {
  int64_t by[MP_REJECT_COUNT] = {0};
  by[MP_REJECT_NONE] = 99;  // ranked: not a rejection
  by[MP_REJECT_MEMORY] = 5;
  by[MP_REJECT_BATCH] = 7;
  by[MP_REJECT_TP_HEADS] = 5;
  int order[MP_REJECT_COUNT];
  ASSERT_EQ(mp_reject_order_by_count(by, order), 3);
  EXPECT_EQ(order[0], MP_REJECT_BATCH);
  EXPECT_EQ(order[1], MP_REJECT_TP_HEADS);  // before MEMORY in the enum
  EXPECT_EQ(order[2], MP_REJECT_MEMORY);
}

}  // namespace
