// common/arena.h: alignment, zeroing, chunk growth, large allocations, reset.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/arena.h"

namespace {

struct ArenaTest : ::testing::Test {
  mp_arena *a = nullptr;
  void SetUp() override { a = mp_arena_create(); ASSERT_NE(a, nullptr); }
  void TearDown() override { mp_arena_destroy(a); }
};

TEST_F(ArenaTest, AllocationsAre16ByteAlignedAndZeroed) {
  // Odd sizes on purpose: each must still start on a 16-byte boundary.
  for (size_t bytes : {1u, 3u, 15u, 16u, 17u, 31u, 100u, 4095u}) {
    unsigned char *p = static_cast<unsigned char *>(mp_arena_alloc(a, bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u) << bytes;
    for (size_t i = 0; i < bytes; i++) ASSERT_EQ(p[i], 0) << bytes << " " << i;
    memset(p, 0xAB, bytes);
  }
}

TEST_F(ArenaTest, UsedBytesCountsRoundedSizes) {
  EXPECT_EQ(mp_arena_used_bytes(a), 0u);
  mp_arena_alloc(a, 1);   // 16
  mp_arena_alloc(a, 17);  // 32
  mp_arena_alloc(a, 0);   // 16: a zero-byte request still gets a distinct pointer
  EXPECT_EQ(mp_arena_used_bytes(a), 64u);
}

TEST_F(ArenaTest, ZeroByteAllocationsAreDistinct) {
  void *p = mp_arena_alloc(a, 0), *q = mp_arena_alloc(a, 0);
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_NE(p, q);
}

// Many allocations across several 64 KiB chunks must never overlap: fill each with its own
// byte and check every one afterwards.
TEST_F(ArenaTest, AllocationsAcrossChunksDoNotOverlap) {
  std::vector<std::pair<unsigned char *, size_t>> blocks;
  for (int i = 0; i < 2000; i++) {
    size_t n = 1 + (size_t)(i * 37) % 300;
    unsigned char *p = static_cast<unsigned char *>(mp_arena_alloc(a, n));
    ASSERT_NE(p, nullptr);
    memset(p, i & 0xff, n);
    blocks.push_back({p, n});
  }
  for (size_t i = 0; i < blocks.size(); i++)
    for (size_t k = 0; k < blocks[i].second; k++)
      ASSERT_EQ(blocks[i].first[k], (unsigned char)(i & 0xff)) << i;
}

TEST_F(ArenaTest, LargeAllocationGetsItsOwnChunkAndIsZeroed) {
  unsigned char *small = static_cast<unsigned char *>(mp_arena_alloc(a, 64));
  memset(small, 7, 64);
  const size_t big = 5u << 20;  // 5 MiB, far above the 64 KiB chunk
  unsigned char *p = static_cast<unsigned char *>(mp_arena_alloc(a, big));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
  for (size_t i = 0; i < big; i += 4096) ASSERT_EQ(p[i], 0);
  EXPECT_EQ(p[big - 1], 0);
  memset(p, 0xff, big);
  for (int i = 0; i < 64; i++) ASSERT_EQ(small[i], 7);  // the earlier block is intact
  EXPECT_EQ(mp_arena_used_bytes(a), 64u + big);
}

TEST_F(ArenaTest, ImpossibleSizesAreOutOfMemoryNotTiny) {
  // Rounding SIZE_MAX up to 16 wraps to 0; the arena must say no rather than hand back
  // 16 bytes for a request of 2^64-1.
  EXPECT_EQ(mp_arena_alloc(a, SIZE_MAX), nullptr);
  EXPECT_EQ(mp_arena_alloc(a, SIZE_MAX - 8), nullptr);
  EXPECT_EQ(mp_arena_used_bytes(a), 0u);
  EXPECT_NE(mp_arena_alloc(a, 8), nullptr);  // still usable
}

TEST_F(ArenaTest, ResetFreesAndReusedMemoryIsZeroedAgain) {
  for (int i = 0; i < 100; i++) memset(mp_arena_alloc(a, 1000), 0x5a, 1000);  // > one chunk
  mp_arena_alloc(a, 1u << 20);
  EXPECT_GT(mp_arena_used_bytes(a), 0u);
  mp_arena_reset(a);
  EXPECT_EQ(mp_arena_used_bytes(a), 0u);
  for (int i = 0; i < 100; i++) {
    unsigned char *p = static_cast<unsigned char *>(mp_arena_alloc(a, 1000));
    ASSERT_NE(p, nullptr);
    for (int k = 0; k < 1000; k++) ASSERT_EQ(p[k], 0) << i;
  }
  EXPECT_EQ(mp_arena_used_bytes(a), 100u * 1008u);
  mp_arena_reset(a);
  mp_arena_reset(a);  // twice is fine
  EXPECT_EQ(mp_arena_used_bytes(a), 0u);
}

TEST(Arena, ResetOfAFreshArenaAndDestroyNull) {
  mp_arena *a = mp_arena_create();
  mp_arena_reset(a);
  EXPECT_NE(mp_arena_alloc(a, 10), nullptr);
  mp_arena_destroy(a);
  mp_arena_destroy(nullptr);
}

TEST_F(ArenaTest, StrdupAndPrintfCopyIntoTheArena) {
  char src[] = "llama3.1-8b";
  char *d = mp_arena_strdup(a, src);
  src[0] = 'X';
  EXPECT_STREQ(d, "llama3.1-8b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d) % 16, 0u);
  char *p = mp_arena_printf(a, "%s=%d,%s=%d", "dp_shard", 4, "tp", 2);
  EXPECT_STREQ(p, "dp_shard=4,tp=2");
  std::string long_s(200000, 'q');  // longer than a chunk
  char *l = mp_arena_printf(a, "<%s>", long_s.c_str());
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(std::string(l), "<" + long_s + ">");
  EXPECT_STREQ(mp_arena_strdup(a, ""), "");
}

}  // namespace
