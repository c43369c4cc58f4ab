#include "block_cache.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <limits>
#include <optional>
#include <string_view>

#include <cstdlib>
#include <new>
#include <string>

#include "tensorwire/core/error.h"

namespace tensorwire::detail {

namespace {

size_t page_size() {
  // Asked each time (glibc answers from memory): a function-local static would be a guard
  // that a fork() during its first initialization leaves held in the child.
  const size_t p = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

// What is wrong with TENSORWIRE_STORAGE_CACHE_MB ("" when fine or unset), and its value.
std::pair<std::string, std::optional<size_t>> env_limit() {
  const char* env = std::getenv("TENSORWIRE_STORAGE_CACHE_MB");
  if (!env) return {"", std::nullopt};
  // Digits only: strtoull would take "-5" as 2^64 - 5, and "abc" as nothing at all.
  const std::string_view v(env);
  const bool digits =
      !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  uint64_t mb = 0;
  if (digits) {
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), mb);
    if (ec == std::errc() && mb <= (std::numeric_limits<size_t>::max() >> 20))
      return {"", static_cast<size_t>(mb) << 20};
  }
  return {"TENSORWIRE_STORAGE_CACHE_MB='" + std::string(v) +
              "' is not a whole number of MiB (e.g. 256, or 0 to turn the cache off); "
              "the default limit is used",
          std::nullopt};
}

// Default limit: 256 MiB, or TENSORWIRE_STORAGE_CACHE_MB. Under AddressSanitizer the cache
// is off by default, so a use after free of a large storage is still caught (tests that
// exercise the cache set a limit themselves).
size_t default_limit() {
  if (auto limit = env_limit().second) return *limit;
#if defined(__SANITIZE_ADDRESS__)
  return 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return 0;
#endif
#endif
  return size_t{256} << 20;
}

}  // namespace

namespace {
// Published by an atomic exchange, not a function-local static: a fork() while another
// thread ran such a static's first initialization would leave the child waiting for ever
// on its copied guard (docs/design.md, "Fork awareness"). Never destroyed.
std::atomic<BlockCache*> g_cache{nullptr};
}  // namespace

BlockCache& BlockCache::instance() {
  if (BlockCache* c = g_cache.load(std::memory_order_acquire)) return *c;
  auto* fresh = new BlockCache();
  BlockCache* first = nullptr;
  if (!g_cache.compare_exchange_strong(first, fresh, std::memory_order_acq_rel)) {
    delete fresh;  // another thread published one first
    return *first;
  }
  // fork() from another thread while this lock is held would leave it locked forever in
  // the child: take it around fork.
  ::pthread_atfork([] { BlockCache::instance().mu_.lock(); },
                   [] { BlockCache::instance().mu_.unlock(); },
                   [] { BlockCache::instance().mu_.unlock(); });
  return *fresh;
}

namespace {
// Made when the library is loaded (one thread), so that no fork races its making.
const bool g_cache_made_at_load = (BlockCache::instance(), true);
}  // namespace

BlockCache::BlockCache() : limit_(default_limit()) {}

BlockCache::Block BlockCache::acquire(size_t nbytes) {
  const size_t page = page_size();
  const size_t capacity = (nbytes + page - 1) / page * page;
  if (capacity < nbytes) throw std::bad_alloc();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Best fit among the cached blocks, wasting at most a quarter of the block.
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      const size_t c = free_[i].capacity;
      if (c >= capacity && c - capacity <= c / 4 &&
          (best == free_.size() || c < free_[best].capacity))
        best = i;
    }
    if (best != free_.size()) {
      Block b = free_[best];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
      cached_bytes_ -= b.capacity;
      ++stats_.hits;
      return b;
    }
    ++stats_.misses;
  }
  void* p = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  // Fewer, larger faults on first touch where transparent huge pages are available; a
  // failure only means small pages.
  (void)::madvise(p, capacity, MADV_HUGEPAGE);
  return {static_cast<std::byte*>(p), capacity};
}

void BlockCache::release(Block block) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (block.capacity <= limit_) {
      evict_until(limit_ - block.capacity);
      try {
        free_.push_back(block);
        cached_bytes_ += block.capacity;
        return;
      } catch (const std::bad_alloc&) {
        // No room to remember it: give it back to the system below.
      }
    }
  }
  ::munmap(block.data, block.capacity);
}

void BlockCache::evict_until(size_t room) noexcept {
  while (cached_bytes_ > room && !free_.empty()) {
    Block b = free_.front();
    free_.erase(free_.begin());
    cached_bytes_ -= b.capacity;
    ::munmap(b.data, b.capacity);  // under the lock: rare (only past the limit)
  }
}

void BlockCache::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
  evict_until(limit_);
}

size_t BlockCache::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_;
}

void BlockCache::clear() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  evict_until(0);
}

StorageCacheStats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StorageCacheStats s = stats_;
  s.cached_bytes = cached_bytes_;
  s.cached_blocks = free_.size();
  s.limit_bytes = limit_;
  return s;
}

}  // namespace tensorwire::detail

namespace tensorwire {

std::string storage_cache_env_problem() {
  return detail::env_limit().first;
}

}  // namespace tensorwire
