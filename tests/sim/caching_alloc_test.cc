// The model of PyTorch's caching allocator with expandable segments (sim/caching_alloc.h)
// on short sequences of requests, each against the rules of CUDACachingAllocator.cpp
// (pytorch/pytorch 001074d25084: round_size, get_free_block's best fit, should_split,
// "Note [Expandable Segments]") worked by hand.
#include <gtest/gtest.h>

#include "sim/caching_alloc.h"

namespace {

const int64_t kMiB = 1 << 20;

struct Alloc {
  mp_ctx ctx;
  mp_calloc a;
  Alloc() {
    mp_ctx_init(&ctx);
    mp_calloc_init(&a);
  }
  ~Alloc() { mp_calloc_release(&a); }
  mp_calloc_ptr Get(int64_t bytes, int stream = MP_STREAM_COMPUTE) {
    mp_calloc_ptr p;
    EXPECT_EQ(mp_calloc_alloc(&ctx, &a, stream, bytes, &p), MP_OK) << mp_errmsg(&ctx);
    return p;
  }
};

}  // namespace

TEST(CachingAlloc, RoundsToFiveHundredTwelveBytes) {
  EXPECT_EQ(mp_calloc_round(1), 512);
  EXPECT_EQ(mp_calloc_round(512), 512);
  EXPECT_EQ(mp_calloc_round(513), 1024);
  EXPECT_EQ(mp_calloc_round(3 * kMiB + 1), 3 * kMiB + 512);
}

TEST(CachingAlloc, SmallRequestsShareTwoMiBPages) {
  Alloc t;
  // 1000 B rounds to 1024 and maps one 2 MiB small page; 1 MiB (kSmallSize, still small)
  // fits in the 2 MiB - 1024 B left of it; a third of 1 MiB does not (1 MiB - 1024 B
  // left) and maps a second page.
  t.Get(1000);
  EXPECT_EQ(t.a.reserved, 2 * kMiB);
  t.Get(kMiB);
  EXPECT_EQ(t.a.reserved, 2 * kMiB);
  t.Get(kMiB);
  EXPECT_EQ(t.a.reserved, 4 * kMiB);
}

TEST(CachingAlloc, LargeRequestsGrowTheSegmentInTwentyMiBPages) {
  Alloc t;
  // 30 MiB maps two 20 MiB pages; freed, the segment stays mapped (reserved 40 MiB). A
  // 10 MiB request splits the free 40 MiB block, leaving 30 MiB free behind it, which a
  // 30 MiB request then fills: nothing new is mapped.
  mp_calloc_ptr p = t.Get(30 * kMiB);
  EXPECT_EQ(t.a.reserved, 40 * kMiB);
  mp_calloc_free(&t.a, p);
  EXPECT_EQ(t.a.reserved, 40 * kMiB);
  t.Get(10 * kMiB);
  mp_calloc_ptr q = t.Get(30 * kMiB);
  EXPECT_EQ(q.addr, 10 * kMiB);
  EXPECT_EQ(t.a.reserved, 40 * kMiB);
  EXPECT_EQ(t.a.peak_reserved, 40 * kMiB);
}

TEST(CachingAlloc, ABlockFreedOnOneStreamServesOnlyThatStream) {
  Alloc t;
  // 40 MiB on the all-gather stream, freed: a 40 MiB request on the compute stream maps
  // its own 40 MiB (80 MiB reserved); one on the all-gather stream reuses the free block.
  mp_calloc_ptr g = t.Get(40 * kMiB, MP_STREAM_GATHER);
  mp_calloc_free(&t.a, g);
  t.Get(40 * kMiB, MP_STREAM_COMPUTE);
  EXPECT_EQ(t.a.reserved, 80 * kMiB);
  t.Get(40 * kMiB, MP_STREAM_GATHER);
  EXPECT_EQ(t.a.reserved, 80 * kMiB);
}

TEST(CachingAlloc, BestFitAndGrowthFromAFreeTail) {
  Alloc t;
  // A, B, C of 20 MiB at 0, 20, 40 (60 MiB mapped). Free A and C: C's block is the free
  // tail. D of 30 MiB fits no free block (20 and 20): the tail grows by one 20 MiB page
  // to 40 MiB, D at 40, 10 MiB left behind it (80 MiB reserved). E of 10 MiB takes the
  // smallest free block holding it, the 10 MiB at 70, not A's 20 MiB hole at 0.
  mp_calloc_ptr a = t.Get(20 * kMiB), b = t.Get(20 * kMiB), c = t.Get(20 * kMiB);
  EXPECT_EQ(b.addr, 20 * kMiB);
  mp_calloc_free(&t.a, a);
  mp_calloc_free(&t.a, c);
  mp_calloc_ptr d = t.Get(30 * kMiB);
  EXPECT_EQ(d.addr, 40 * kMiB);
  EXPECT_EQ(t.a.reserved, 80 * kMiB);
  mp_calloc_ptr e = t.Get(10 * kMiB);
  EXPECT_EQ(e.addr, 70 * kMiB);
  // Freeing B merges it with A's hole: 40 MiB at 0 takes a 40 MiB request unmapped.
  mp_calloc_free(&t.a, b);
  mp_calloc_ptr f = t.Get(40 * kMiB);
  EXPECT_EQ(f.addr, 0);
  EXPECT_EQ(t.a.reserved, 80 * kMiB);
}
