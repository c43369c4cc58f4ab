// ChunkArena / ChunkPool: variable-size chunks in a shared segment, allocated by the
// owner and released by anyone with one atomic store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "shm/chunk_arena.h"
#include "tensorwire/core/error.h"

namespace tensorwire::shm {
namespace {

using ::testing::HasSubstr;

TEST(ChunkArena, AllocatesAlignedDisjointChunks) {
  ChunkArena a = ChunkArena::create("test", 1 << 16);
  auto x = a.allocate(100);
  auto y = a.allocate(1);
  ASSERT_TRUE(x && y);
  EXPECT_EQ(*x % kChunkAlignment, 0u);
  EXPECT_EQ(*y % kChunkAlignment, 0u);
  EXPECT_GE(*y, *x + 100);
  EXPECT_EQ(chunk_capacity(a.segment(), *x), 128u);
}

TEST(ChunkArena, ReturnsNothingWhenFull) {
  ChunkArena a = ChunkArena::create("test", 4096);
  EXPECT_FALSE(a.allocate(a.capacity() + 1));
  auto all = a.allocate(a.capacity());
  ASSERT_TRUE(all);
  EXPECT_FALSE(a.allocate(1));
}

constexpr size_t kLarge = 100 << 10;  // above kNextFitBytes: first-fit
static_assert(kLarge > kNextFitBytes);

TEST(ChunkArena, ReusesLargeReleasedChunksFirstFit) {
  ChunkArena a = ChunkArena::create("test", 1 << 20);
  auto x = *a.allocate(kLarge);
  auto y = *a.allocate(kLarge);
  release_chunk(a.segment(), x);
  EXPECT_EQ(*a.allocate(kLarge), x);  // the same memory, still warm in the cache
  release_chunk(a.segment(), y);
  EXPECT_EQ(*a.allocate(kLarge / 2), y);
}

TEST(ChunkArena, MergesNeighbouringReleasedChunks) {
  ChunkArena a = ChunkArena::create("test", kArenaHeaderBytes + 3 * (kChunkHeaderBytes + kLarge));
  auto x = *a.allocate(kLarge);
  auto y = *a.allocate(kLarge);
  auto z = *a.allocate(kLarge);
  (void)z;
  release_chunk(a.segment(), x);
  release_chunk(a.segment(), y);
  auto big = a.allocate(kLarge + kLarge / 2);  // fits only in x and y merged
  ASSERT_TRUE(big);
  EXPECT_EQ(*big, x);
}

TEST(ChunkArena, SkipsALargeChunkTheConsumerKeeps) {
  ChunkArena a = ChunkArena::create("test", 1 << 20);
  auto kept = *a.allocate(kLarge);
  auto x = *a.allocate(kLarge);
  release_chunk(a.segment(), x);
  auto y = *a.allocate(kLarge);
  EXPECT_NE(y, kept);
  EXPECT_EQ(y, x);
  EXPECT_EQ(a.bytes_in_use(), 2 * (kChunkHeaderBytes + kLarge));
}

TEST(ChunkArena, ReusesSmallChunksInTheOrderTheyComeBack) {
  ChunkArena a = ChunkArena::create("test", 4096);
  std::vector<size_t> all;
  while (auto c = a.allocate(64)) all.push_back(*c);
  ASSERT_GE(all.size(), 20u);
  // Released oldest first (as a consumer does), then allocated again: next-fit finds
  // each one where the last allocation ended, in the same cyclic order.
  for (size_t round = 0; round < 3; ++round)
    for (size_t i = 0; i < all.size(); ++i) {
      release_chunk(a.segment(), all[i]);
      EXPECT_EQ(*a.allocate(64), all[i]) << "round " << round << " chunk " << i;
    }
  // A kept chunk is skipped; the others keep coming back.
  release_chunk(a.segment(), all[1]);
  release_chunk(a.segment(), all[2]);
  EXPECT_EQ(*a.allocate(64), all[1]);
  EXPECT_EQ(*a.allocate(64), all[2]);
  EXPECT_FALSE(a.allocate(64));  // all[0] was never released: full
}

TEST(ChunkArena, RejectsABadOrDoubleRelease) {
  ChunkArena a = ChunkArena::create("test", 1 << 16);
  auto x = *a.allocate(64);
  EXPECT_THROW(release_chunk(a.segment(), x + 64), ProtocolError);
  EXPECT_THROW(release_chunk(a.segment(), 3), ProtocolError);
  EXPECT_THROW(release_chunk(a.segment(), 1 << 20), ProtocolError);
  release_chunk(a.segment(), x);
  try {
    release_chunk(a.segment(), x);
    FAIL() << "a second release must throw";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("released twice"));
  }
}

// Every process that maps the segment can write its headers. A size of 0 made the owner's
// merge loop spin for ever, a huge one walked it out of the segment; both are refused.
TEST(ChunkArena, AChunkSizeWrittenByAnotherProcessIsCheckedBeforeItIsFollowed) {
  for (const uint64_t bad : {uint64_t{0}, uint64_t{1} << 40, uint64_t{kChunkHeaderBytes + 1}}) {
    ChunkArena a = ChunkArena::create("test", kArenaHeaderBytes + 4 * (kChunkHeaderBytes + kLarge));
    const size_t x = *a.allocate(kLarge);
    const size_t y = *a.allocate(kLarge);
    auto size_of = [&](size_t payload) {  // the header's size field (after state and magic)
      return reinterpret_cast<uint64_t*>(a.segment().data() + payload - kChunkHeaderBytes + 8);
    };
    release_chunk(a.segment(), x);
    release_chunk(a.segment(), y);
    *size_of(y) = bad;  // y is merged into x's run by the next large allocation
    try {
      (void)a.allocate(2 * kLarge);
      FAIL() << "a corrupted size must throw: " << bad;
    } catch (const ProtocolError& e) {
      EXPECT_THAT(e.what(), HasSubstr("chunk arena corrupted"));
    }
    EXPECT_THROW((void)a.bytes_in_use(), ProtocolError);
  }
  ChunkArena a = ChunkArena::create("test", 1 << 20);
  const size_t x = *a.allocate(kLarge);
  *reinterpret_cast<uint64_t*>(a.segment().data() + x - kChunkHeaderBytes + 8) = 8;
  EXPECT_THROW((void)chunk_storage(a.segment(), x, kLarge), ProtocolError);  // no underflow
  EXPECT_THROW((void)chunk_capacity(a.segment(), x), ProtocolError);
}
// The owner gives back what a dead reader never released: only chunks still Used under the
// serial they were sent with, and only at offsets that are headers of the arena's chain.
TEST(ChunkArena, ReclaimFreesOnlyWhatTheDeadReaderStillHeld) {
  ChunkArena a = ChunkArena::create("test", kArenaHeaderBytes + 4 * (kChunkHeaderBytes + kLarge));
  const size_t x = *a.allocate(kLarge), y = *a.allocate(kLarge), z = *a.allocate(kLarge);
  const uint64_t sx = a.serial_of(x), sy = a.serial_of(y), sz = a.serial_of(z);
  EXPECT_TRUE(a.in_use(x, sx));
  release_chunk(a.segment(), y);  // the reader released y before it died
  EXPECT_FALSE(a.in_use(y, sy));
  EXPECT_EQ(a.reclaim({{x, sx}, {y, sy}, {z, sz}}), 2u);
  EXPECT_FALSE(a.in_use(x, sx));
  EXPECT_EQ(a.bytes_in_use(), 0u);

  // x and y merged, allocated again as one chunk: the stale y (inside its payload, where
  // the bytes now say "a Used header with y's serial") and x's old serial are left alone.
  const size_t big = *a.allocate(kLarge + kLarge / 2);
  ASSERT_EQ(big, x);
  std::memcpy(a.segment().data() + y - kChunkHeaderBytes,
              a.segment().data() + x - kChunkHeaderBytes, kChunkHeaderBytes);
  std::memcpy(a.segment().data() + y - kChunkHeaderBytes + 16, &sy, sizeof sy);
  EXPECT_EQ(a.reclaim({{x, sx}, {y, sy}}), 0u);
  EXPECT_TRUE(a.in_use(big, a.serial_of(big)));
  EXPECT_EQ(a.reclaim({{big, a.serial_of(big)}}), 1u);
}

TEST(ChunkArena, StorageReleasesTheChunkWhenTheLastViewGoes) {
  ChunkArena a = ChunkArena::create("test", 1 << 16);
  auto x = *a.allocate(256);
  {
    Storage s = chunk_storage(a.segment(), x, 256);
    Storage copy = s;
    s = Storage();
    EXPECT_GT(a.bytes_in_use(), 0u);
  }
  EXPECT_EQ(a.bytes_in_use(), 0u);
  EXPECT_THROW(chunk_storage(a.segment(), *a.allocate(64), 1000), ProtocolError);
}

TEST(ChunkArena, AnotherProcessReleasesThroughItsOwnMapping) {
  ChunkArena a = ChunkArena::create("test", 1 << 20);
  auto x = *a.allocate(kLarge);
  std::memset(a.segment().data() + x, 7, kLarge);
  const int pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child maps the segment anew (as a receiver of its fd would) and releases.
    Segment mine = Segment::map(a.segment().fd());
    const bool ok = std::to_integer<int>(mine.data()[x + kLarge - 1]) == 7;
    release_chunk(mine, x);
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(a.bytes_in_use(), 0u);
  EXPECT_EQ(*a.allocate(kLarge), x);
}

TEST(ChunkPool, GrowsAndAnnouncesEachNewSegmentBeforeUsingIt) {
  std::vector<uint32_t> announced;
  ChunkPool pool("test", 4, 0, [&](uint32_t i, const Segment& s) {
    EXPECT_TRUE(s.valid());
    announced.push_back(i);
  });
  auto a = pool.allocate(1000);
  EXPECT_EQ(a.segment, 0u);
  EXPECT_EQ(announced, std::vector<uint32_t>{0});
  std::vector<ChunkPool::Chunk> held{a};
  while (pool.num_segments() == 1) held.push_back(pool.allocate(1000));
  EXPECT_EQ(held.back().segment, 1u);
  EXPECT_EQ(announced, (std::vector<uint32_t>{0, 1}));
  // The pool at least doubles: a second segment as large as the first.
  EXPECT_GE(pool.segment(1).size(), pool.segment(0).size());
  for (auto& c : held) pool.free(c);
  EXPECT_EQ(pool.bytes_in_use(), 0u);
}

TEST(ChunkPool, AFailedAnnouncementDropsTheSegment) {
  ChunkPool pool("test", 2, 0, [](uint32_t, const Segment&) { throw ClosedError("peer gone"); });
  EXPECT_THROW(pool.allocate(10), ClosedError);
  EXPECT_EQ(pool.num_segments(), 0u);
}

}  // namespace
}  // namespace tensorwire::shm
