// The storage cache behind Storage::allocate for large blocks (src/core/block_cache.h):
// reuse of a released block, the limit, eviction, and concurrent use.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "tensorwire/core/consolidate.h"
#include "tensorwire/core/storage.h"
#include "tensorwire/core/tensordict.h"

namespace tw = tensorwire;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Each test starts from an empty cache with a known limit and puts the default back.
class StorageCache : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = tw::storage_cache_limit();
    tw::release_storage_cache();
    tw::set_storage_cache_limit(64 * kMiB);
  }
  void TearDown() override {
    tw::release_storage_cache();
    tw::set_storage_cache_limit(saved_);
  }
  size_t saved_ = 0;
};

}  // namespace

TEST_F(StorageCache, AReleasedLargeBlockIsReusedForTheSameSize) {
  std::byte* first = nullptr;
  {
    tw::Storage s = tw::Storage::allocate(3 * kMiB);
    first = s.data();
    std::memset(first, 1, s.nbytes());
    EXPECT_EQ(s.nbytes(), 3 * kMiB);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 4096, 0u);
  }
  auto st = tw::storage_cache_stats();
  EXPECT_EQ(st.cached_blocks, 1u);
  EXPECT_EQ(st.cached_bytes, 3 * kMiB);
  const uint64_t hits = st.hits;
  tw::Storage again = tw::Storage::allocate(3 * kMiB);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(tw::storage_cache_stats().hits, hits + 1);
  EXPECT_EQ(tw::storage_cache_stats().cached_blocks, 0u);
}

TEST_F(StorageCache, ASlightlySmallerRequestReusesABlockButAMuchSmallerOneDoesNot) {
  std::byte* p = nullptr;
  {
    tw::Storage s = tw::Storage::allocate(8 * kMiB);
    p = s.data();
  }
  {
    tw::Storage s = tw::Storage::allocate(7 * kMiB);  // wastes 1/8: reused
    EXPECT_EQ(s.data(), p);
    EXPECT_EQ(s.nbytes(), 7 * kMiB);
  }
  tw::Storage small = tw::Storage::allocate(2 * kMiB);  // would waste 3/4: a new block
  EXPECT_NE(small.data(), p);
  EXPECT_EQ(tw::storage_cache_stats().cached_blocks, 1u);
}

TEST_F(StorageCache, SmallAllocationsDoNotGoThroughTheCache) {
  const auto before = tw::storage_cache_stats();
  { tw::Storage s = tw::Storage::allocate(kMiB - 1); }
  const auto after = tw::storage_cache_stats();
  EXPECT_EQ(after.hits + after.misses, before.hits + before.misses);
  EXPECT_EQ(after.cached_blocks, 0u);
}

TEST_F(StorageCache, TheLimitIsKeptByEvictingTheOldestBlocks) {
  tw::set_storage_cache_limit(10 * kMiB);
  std::byte* a = nullptr;
  std::byte* b = nullptr;
  {
    tw::Storage sa = tw::Storage::allocate(4 * kMiB);
    tw::Storage sb = tw::Storage::allocate(4 * kMiB);
    tw::Storage sc = tw::Storage::allocate(4 * kMiB);
    a = sa.data();
    b = sb.data();
  }  // released c, b, a: only two of them fit in 10 MiB
  auto st = tw::storage_cache_stats();
  EXPECT_EQ(st.cached_blocks, 2u);
  EXPECT_EQ(st.cached_bytes, 8 * kMiB);
  EXPECT_LE(st.cached_bytes, st.limit_bytes);
  // The newest releases (b, then a) stayed.
  tw::Storage x = tw::Storage::allocate(4 * kMiB);
  tw::Storage y = tw::Storage::allocate(4 * kMiB);
  EXPECT_TRUE((x.data() == a && y.data() == b) || (x.data() == b && y.data() == a));
}

TEST_F(StorageCache, ABlockLargerThanTheLimitIsReturnedToTheSystem) {
  tw::set_storage_cache_limit(2 * kMiB);
  { tw::Storage s = tw::Storage::allocate(4 * kMiB); }
  EXPECT_EQ(tw::storage_cache_stats().cached_blocks, 0u);
}

TEST_F(StorageCache, LoweringTheLimitOrReleasingEmptiesTheCache) {
  {
    tw::Storage a = tw::Storage::allocate(2 * kMiB);
    tw::Storage b = tw::Storage::allocate(2 * kMiB);
  }
  EXPECT_EQ(tw::storage_cache_stats().cached_blocks, 2u);
  tw::set_storage_cache_limit(2 * kMiB);
  EXPECT_EQ(tw::storage_cache_stats().cached_blocks, 1u);
  tw::release_storage_cache();
  EXPECT_EQ(tw::storage_cache_stats().cached_bytes, 0u);
  tw::set_storage_cache_limit(0);
  { tw::Storage c = tw::Storage::allocate(2 * kMiB); }
  EXPECT_EQ(tw::storage_cache_stats().cached_blocks, 0u);
}

TEST_F(StorageCache, RepeatedConsolidationReusesOneStorageWithCorrectValues) {
  tw::TensorDict td;
  for (int i = 0; i < 4; ++i) {
    tw::Tensor t = tw::Tensor::empty({kMiB / 4}, tw::DType::Float32);  // 1 MiB each
    for (int64_t j = 0; j < t.numel(); ++j) t.data<float>()[j] = static_cast<float>(i + j);
    td.set("leaf" + std::to_string(i), t);
  }
  const std::byte* previous = nullptr;
  for (int round = 0; round < 3; ++round) {
    td.get("leaf2").data<float>()[5] = static_cast<float>(round * 100);
    tw::TensorDict c = tw::consolidate(td);
    if (previous) {
      EXPECT_EQ(c.consolidated()->storage.data(), previous);
    }
    previous = c.consolidated()->storage.data();
    EXPECT_EQ(c.get("leaf2").data<float>()[5], static_cast<float>(round * 100));
    EXPECT_EQ(c.get("leaf3").data<float>()[7], 10.0f);
  }
}

// Many threads allocating and releasing large storages at once (ThreadSanitizer run).
TEST_F(StorageCache, ConcurrentAllocationAndReleaseKeepsBlocksDistinct) {
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &bad] {
      for (int i = 0; i < 200; ++i) {
        tw::Storage s = tw::Storage::allocate((1 + (i + t) % 3) * kMiB);
        auto* p = reinterpret_cast<volatile int*>(s.data());
        p[0] = t;
        std::this_thread::yield();
        if (p[0] != t) bad.fetch_add(1);  // another thread got the same block
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LE(tw::storage_cache_stats().cached_bytes, 64 * kMiB);
}
