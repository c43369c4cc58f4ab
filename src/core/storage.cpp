#include "tensorwire/core/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <new>

#include "block_cache.h"
#include "tensorwire/core/error.h"

namespace tensorwire {

Storage::Impl::~Impl() {
  if (release) release();
}

Storage Storage::allocate(size_t nbytes, size_t alignment) {
  if (alignment < 8 || (alignment & (alignment - 1)) != 0)
    throw ValueError("Storage::allocate: alignment " + std::to_string(alignment) +
                     " is not a power of two >= 8");
  if (nbytes >= detail::BlockCache::kMinBlock &&
      alignment <= static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
    detail::BlockCache::Block block = detail::BlockCache::instance().acquire(nbytes);
    Storage s;
    try {
      s.impl_ = std::make_shared<Impl>();
    } catch (...) {
      detail::BlockCache::instance().release(block);
      throw;
    }
    s.impl_->data = block.data;
    s.impl_->nbytes = nbytes;
    s.impl_->kind = Kind::Owned;
    s.impl_->release = [block] { detail::BlockCache::instance().release(block); };
    return s;
  }
  // aligned_alloc wants a size that is a multiple of the alignment, and a non-zero one.
  size_t rounded = (nbytes + alignment - 1) / alignment * alignment;
  if (rounded < nbytes) throw std::bad_alloc();
  void* p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (!p) throw std::bad_alloc();
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = static_cast<std::byte*>(p);
  s.impl_->nbytes = nbytes;
  s.impl_->kind = Kind::Owned;
  s.impl_->release = [p] { std::free(p); };
  return s;
}

Storage Storage::external(void* data, size_t nbytes, std::function<void()> deleter, Kind kind) {
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = static_cast<std::byte*>(data);
  s.impl_->nbytes = nbytes;
  s.impl_->kind = kind;
  s.impl_->release = std::move(deleter);
  return s;
}

Storage Storage::map_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer for ever; it is refused
  // below with everything else that is not a regular file.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw SystemError("cannot open '" + path + "'", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw SystemError("cannot stat '" + path + "'", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    if (S_ISDIR(st.st_mode)) throw SystemError("cannot map '" + path + "'", EISDIR);
    throw ValueError("cannot map '" + path + "': not a regular file");
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return external(nullptr, 0, nullptr, Kind::Mapped);
  }
  // MAP_PRIVATE: writes through a loaded tensor stay in this process, the file is never
  // modified behind the user's back.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw SystemError("cannot map '" + path + "'", err);
  return external(
      p, size, [p, size] { ::munmap(p, size); }, Kind::Mapped);
}

void set_storage_cache_limit(size_t bytes) {
  detail::BlockCache::instance().set_limit(bytes);
}
size_t storage_cache_limit() {
  return detail::BlockCache::instance().limit();
}
void release_storage_cache() {
  detail::BlockCache::instance().clear();
}
StorageCacheStats storage_cache_stats() {
  return detail::BlockCache::instance().stats();
}

}  // namespace tensorwire
