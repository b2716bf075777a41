// common/assert.h: MP_ASSERT. With MP_DEBUG (bazel --config=debug, --config=asan) a false
// invariant prints one line and aborts, from a test's own code and from the library's
// (built with the same flag); without it neither the condition nor the message is
// evaluated and nothing happens.
#include <gtest/gtest.h>

#include <cstring>

#include "common/assert.h"
#include "exec/act_layout.h"

namespace {

#if MP_ASSERT_ON

TEST(AssertDeathTest, AFalseInvariantPrintsOneLineAndAborts) {
  volatile int one = 1;
  EXPECT_DEATH(MP_ASSERT(one + one == 3, "one and one make two"),
               "meshplan: internal invariant failed at tests/common/assert_test\\.cc:[0-9]+: one \\+ one == 3 "
               "\\(one and one make two\\)\n");
  EXPECT_DEATH(MP_ASSERT(one > 2, "one=%d, want %s", (int)one, "more"),
               "meshplan: internal invariant failed at tests/common/assert_test\\.cc:[0-9]+: one > 2 "
               "\\(one=1, want more\\)\n");
}

// The library is built with MP_DEBUG too: a negative tensor size is caught where the
// activation layout places it, in exec/act_layout.c.
TEST(AssertDeathTest, LibraryInvariantsAreChecked) {
  mp_act_dims d;
  memset(&d, 0, sizeof d);
  d.B = d.S = 1;
  d.N = d.NS = -4;  // no plan gives this: the layout's sizes are never negative
  d.C = 8;
  d.xs = 4;
  mp_act_layout l;
  EXPECT_DEATH(mp_act_layout_fill(&l, &d, 0),
               "meshplan: internal invariant failed at exec/act_layout\\.c:[0-9]+: bytes >= 0 \\(allocation [0-9]+, "
               "-[0-9]+ bytes: a tensor's size is never negative\\)\n");
}

TEST(Assert, ATrueInvariantIsEvaluatedOnceAndPasses) {
  int calls = 0;
  MP_ASSERT(++calls == 1, "first");
  MP_ASSERT(++calls == 2, "calls=%d", calls);
  EXPECT_EQ(calls, 2);
}

#else

TEST(Assert, ReleaseBuildsDoNotEvaluateTheConditionOrTheMessage) {
  int calls = 0;
  MP_ASSERT(++calls == 7, "never");
  MP_ASSERT(++calls == 7, "%d", ++calls);
  EXPECT_EQ(calls, 0);
  // a false one stops nothing either
  MP_ASSERT(calls == 1, "calls=%d", calls);
  SUCCEED();
}

#endif

}  // namespace
