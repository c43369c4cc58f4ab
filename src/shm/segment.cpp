#include "shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "tensorwire/core/error.h"

namespace tensorwire::shm {

namespace {
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
}  // namespace

Segment::Impl::~Impl() {
  if (data) ::munmap(data, size);
  if (fd >= 0) ::close(fd);
}

Segment Segment::create(const std::string& name, size_t size) {
  if (size == 0) throw ValueError("shared-memory segment '" + name + "' of size 0");
  int fd = ::memfd_create(("tensorwire:" + name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw SystemError("memfd_create", errno);
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    ::close(fd);
    throw SystemError("ftruncate of a " + std::to_string(size) + "-byte segment", err);
  }
  // Its size is fixed for good: every process it is handed to (a client of another trust
  // domain among them) maps it whole, and one that shrank it would make the others'
  // accesses past the new end SIGBUS.
  if (::fcntl(fd, F_ADD_SEALS, kSeals) != 0) {
    int err = errno;
    ::close(fd);
    throw SystemError("sealing a shared-memory segment", err);
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    throw SystemError("mmap of a " + std::to_string(size) + "-byte segment", err);
  }
  Segment s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = static_cast<std::byte*>(p);
  s.impl_->size = size;
  s.impl_->fd = fd;
  return s;
}

Segment Segment::map(int fd, size_t expected_size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw SystemError("fstat of a received segment", errno);
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals)
    throw ProtocolError(
        "received segment is not sealed against resizing (not a tensorwire segment, or its "
        "sender could shrink it under this process)");
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0 || (expected_size && size != expected_size))
    throw ProtocolError("received segment has " + std::to_string(size) + " bytes, expected " +
                        std::to_string(expected_size));
  int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) throw SystemError("dup of a received segment fd", errno);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, own, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(own);
    throw SystemError("mmap of a received segment of " + std::to_string(size) + " bytes", err);
  }
  Segment s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = static_cast<std::byte*>(p);
  s.impl_->size = size;
  s.impl_->fd = own;
  return s;
}

Storage Segment::storage(size_t offset, size_t nbytes) const {
  if (!impl_ || offset > size() || nbytes > size() - offset)
    throw ValueError("segment storage [" + std::to_string(offset) + ", +" + std::to_string(nbytes) +
                     ") outside a segment of " + std::to_string(size()) + " bytes");
  auto keep = impl_;
  return Storage::external(
      impl_->data + offset, nbytes, [keep] {}, Storage::Kind::Shared);
}

}  // namespace tensorwire::shm
