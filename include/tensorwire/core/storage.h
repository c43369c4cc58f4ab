// Storage: a refcounted, untyped block of bytes that tensors view into.
//
// Copies of a Storage share the block; the block is released (freed, unmapped, or
// handed to the external deleter) when the last copy goes. Thread-safety: copies may
// be made and dropped from any thread (std::shared_ptr semantics); the bytes
// themselves are not synchronised.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace tensorwire {

// Large owned storages (1 MiB and up) come from a process-wide cache: a released block is
// kept and handed to the next allocation of a similar size, so code that consolidates,
// receives or stacks the same sizes every step writes into pages that are already mapped
// (a fresh page costs a kernel fault and zeroing). The cache holds at most its limit
// (256 MiB by default, TENSORWIRE_STORAGE_CACHE_MB overrides it, 0 turns it off).
struct StorageCacheStats {
  size_t cached_bytes = 0;   // held now, ready for reuse
  size_t cached_blocks = 0;  // number of blocks held
  size_t limit_bytes = 0;
  uint64_t hits = 0;    // large allocations served from the cache
  uint64_t misses = 0;  // large allocations that mapped new memory
};
void set_storage_cache_limit(size_t bytes);  // shrinks the cache at once if needed
size_t storage_cache_limit();
void release_storage_cache();  // returns every cached block to the system
StorageCacheStats storage_cache_stats();
// The default limit comes from TENSORWIRE_STORAGE_CACHE_MB (a whole number of MiB) when
// set. A value that is not one is ignored, the default kept, and this says why (empty
// when the variable is fine or unset), for the caller to warn the user its own way.
std::string storage_cache_env_problem();

class Storage {
 public:
  enum class Kind : uint8_t {
    Owned,     // allocated by tensorwire (aligned heap memory)
    Mapped,    // a memory-mapped file
    Shared,    // a shared-memory segment
    External,  // someone else's memory, released by a caller-supplied deleter
  };

  Storage() = default;

  // Uninitialised bytes aligned to `alignment` (a power of two, at least 8). From 1 MiB
  // the block comes from the storage cache (page aligned) and returns to it when released.
  static Storage allocate(size_t nbytes, size_t alignment = 64);

  // Wraps memory the caller owns; `deleter` runs once when the last reference goes,
  // possibly on another thread.
  static Storage external(void* data, size_t nbytes, std::function<void()> deleter,
                          Kind kind = Kind::External);

  // Maps a whole file. Read-only maps are MAP_PRIVATE (copy-on-write), so a writer
  // through a returned tensor never changes the file.
  static Storage map_file(const std::string& path);

  std::byte* data() const noexcept { return impl_ ? impl_->data : nullptr; }
  size_t nbytes() const noexcept { return impl_ ? impl_->nbytes : 0; }
  Kind kind() const noexcept { return impl_ ? impl_->kind : Kind::Owned; }
  bool defined() const noexcept { return impl_ != nullptr; }
  long use_count() const noexcept { return impl_.use_count(); }
  bool same(const Storage& o) const noexcept { return impl_ == o.impl_; }

 private:
  struct Impl {
    std::byte* data = nullptr;
    size_t nbytes = 0;
    Kind kind = Kind::Owned;
    std::function<void()> release;
    ~Impl();
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace tensorwire
