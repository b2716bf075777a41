// common/timeutil.h: the monotonic clock never runs backwards, and the UTC stamp has the
// form the planner database and calibrations store ("2026-11-02T10:00:00Z").
#include <gtest/gtest.h>

#include <cstring>

#include "common/timeutil.h"

namespace {

TEST(TimeUtil, MonotonicClockDoesNotGoBack) {
  const double a = mp_now_s(), b = mp_now_s();
  EXPECT_GE(b, a);
}

TEST(TimeUtil, IsoStampIsUtcToTheSecond) {
  char buf[32];
  mp_now_iso(buf, sizeof buf);
  ASSERT_EQ(std::strlen(buf), 20u) << buf;
  for (int i = 0; i < 20; i++) {
    const char c = buf[i];
    if (i == 4 || i == 7) EXPECT_EQ(c, '-') << buf;
    else if (i == 10) EXPECT_EQ(c, 'T') << buf;
    else if (i == 13 || i == 16) EXPECT_EQ(c, ':') << buf;
    else if (i == 19) EXPECT_EQ(c, 'Z') << buf;
    else EXPECT_TRUE(c >= '0' && c <= '9') << buf;
  }
}

TEST(TimeUtil, TooSmallBufferGetsEmptyString) {
  char buf[8] = "xxxxxxx";
  mp_now_iso(buf, sizeof buf);
  EXPECT_STREQ(buf, "");
}

}  // namespace
