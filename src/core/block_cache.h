// BlockCache: keeps large storage blocks that were released, for the next allocation of a
// similar size (private to the library; the public knobs are in tensorwire/core/storage.h).
//
// Why: the first write to a fresh page costs a kernel fault and the zeroing of the page
// (~1.5 us per 4 KiB here), so writing a newly allocated 64 MiB buffer runs at a sixth of
// memcpy speed. Code that consolidates, receives or stacks the same sizes over and over
// (every training step) drops one buffer and allocates the next of the same size; reusing
// the dropped one keeps its pages mapped, and the copy runs at memcpy speed. The same idea
// as PyTorch's caching allocators, for host memory and only above kMinBlock.
//
// Blocks come from mmap (page aligned, MADV_HUGEPAGE so a cold block faults 2 MiB at a
// time where transparent huge pages are on) and are unmapped once the cache would grow past
// its limit. Thread-safe; a fork() in another thread cannot leave the lock held in the child.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "tensorwire/core/storage.h"

namespace tensorwire::detail {

class BlockCache {
 public:
  static constexpr size_t kMinBlock = size_t{1} << 20;

  // The process-wide cache; never destroyed, so storages released during static
  // destruction still find it.
  static BlockCache& instance();

  struct Block {
    std::byte* data = nullptr;
    size_t capacity = 0;  // the mapped length (a multiple of the page size)
  };
  // A block of at least `nbytes` (>= kMinBlock): a cached one when one fits without
  // wasting more than a quarter of it, otherwise a new mapping. Throws std::bad_alloc.
  Block acquire(size_t nbytes);
  // Takes a block back; keeps it if the cache stays within its limit (evicting the
  // oldest cached blocks if that makes room), unmaps it otherwise.
  void release(Block block) noexcept;

  void set_limit(size_t bytes);
  size_t limit() const;
  void clear() noexcept;
  StorageCacheStats stats() const;

 private:
  BlockCache();
  void evict_until(size_t room) noexcept;  // under mu_

  mutable std::mutex mu_;
  std::vector<Block> free_;  // oldest first
  size_t cached_bytes_ = 0;
  size_t limit_;
  StorageCacheStats stats_{};
};

}  // namespace tensorwire::detail
