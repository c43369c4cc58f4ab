// Segment: an anonymous shared-memory block (memfd), mapped into this process.
//
// Anonymous on purpose: a memfd has no name in /dev/shm, so nothing can be left behind
// when a process dies, however it dies. Other processes get the segment either by
// inheriting it across fork() or by receiving its fd over a Unix socket (UnixSocket::
// send_fds), then Segment::map(fd).
//
// Thread-safety: a Segment is an immutable handle; copies share the mapping, which is
// unmapped when the last copy goes.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tensorwire/core/storage.h"

namespace tensorwire::shm {

class Segment {
 public:
  Segment() = default;

  // A new zero-filled segment of `size` bytes, sealed against resizing; `name` only labels
  // it in /proc/PID/fd.
  static Segment create(const std::string& name, size_t size);
  // Maps a segment received from another process. It must be sealed against resizing, and
  // its size (read from the fd) must equal `expected_size` when given: ProtocolError
  // otherwise. Takes a dup of fd.
  static Segment map(int fd, size_t expected_size = 0);

  std::byte* data() const noexcept { return impl_ ? impl_->data : nullptr; }
  size_t size() const noexcept { return impl_ ? impl_->size : 0; }
  int fd() const noexcept { return impl_ ? impl_->fd : -1; }
  bool valid() const noexcept { return impl_ != nullptr; }

  // A Storage over [offset, offset + nbytes) that keeps the mapping alive.
  Storage storage(size_t offset, size_t nbytes) const;

 private:
  struct Impl {
    std::byte* data = nullptr;
    size_t size = 0;
    int fd = -1;
    ~Impl();
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace tensorwire::shm
