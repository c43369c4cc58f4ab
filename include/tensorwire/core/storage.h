// Storage: a refcounted, untyped block of bytes that tensors view into.
//
// Copies of a Storage share the block; the block is released (freed, unmapped, or
// handed to the external deleter) when the last copy goes. Thread-safety: copies may
// be made and dropped from any thread (std::shared_ptr semantics); the bytes
// themselves are not synchronised.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace tensorwire {

class Storage {
 public:
  enum class Kind : uint8_t {
    Owned,     // allocated by tensorwire (aligned heap memory)
    Mapped,    // a memory-mapped file
    Shared,    // a shared-memory segment
    External,  // someone else's memory, released by a caller-supplied deleter
  };

  Storage() = default;

  // Uninitialised bytes aligned to `alignment` (a power of two, at least 8).
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
