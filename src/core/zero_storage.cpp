#include "core/zero_storage.h"

#include <sys/mman.h>

#include <cerrno>
#include <string>

#include "tensorwire/core/error.h"

namespace tensorwire::detail {

Storage zero_storage(size_t nbytes) {
  if (nbytes == 0) return Storage::allocate(0);
  void* p = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw SystemError("mmap of " + std::to_string(nbytes) + " zero bytes", errno);
  return Storage::external(
      p, nbytes, [p, nbytes] { ::munmap(p, nbytes); }, Storage::Kind::External);
}

}  // namespace tensorwire::detail
