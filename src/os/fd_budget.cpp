#include "os/fd_budget.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "tensorwire/core/error.h"

namespace tensorwire::os {

namespace {

// The soft limit, or 0 when there is none to speak of.
size_t soft_limit() {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<size_t>(l.rlim_cur);
}

// Above this many, counting the open ones is the cheaper check (a listing of
// /proc/self/fd takes tens of microseconds in a process with few descriptors).
constexpr size_t kMostProbed = 128;

}  // namespace

std::optional<size_t> free_fds() {
  const size_t limit = soft_limit();
  if (limit == 0) return std::nullopt;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr)
    return errno == EMFILE || errno == ENFILE ? std::optional<size_t>(0) : std::nullopt;
  size_t open = 0;  // below the limit: a number above it (the limit lowered since) is no room
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const long fd = std::strtol(e->d_name, nullptr, 10);
    if (fd != ::dirfd(dir) && fd >= 0 && static_cast<size_t>(fd) < limit) ++open;
  }
  ::closedir(dir);
  return open >= limit ? 0 : limit - open;
}

void require_free_fds(size_t needed, const std::string& what) {
  const size_t limit = soft_limit();
  if (limit == 0) return;
  if (needed < limit && needed <= kMostProbed) {
    // The `needed` numbers just below the limit all free is room enough, and costs one
    // system call each (about half a microsecond), not a listing of /proc/self/fd. One free
    // number alone says nothing: a process that closed descriptors (a worker's, at its
    // death) has holes below open ones.
    size_t fd = limit - needed;
    while (fd < limit && ::fcntl(static_cast<int>(fd), F_GETFD) < 0 && errno == EBADF) ++fd;
    if (fd == limit) return;
  }
  const std::optional<size_t> free = free_fds();
  if (!free || *free >= needed) return;
  throw SystemError(what + " needs about " + std::to_string(needed) +
                        " free file descriptors, and this process has " + std::to_string(*free) +
                        " of its limit (RLIMIT_NOFILE) of " + std::to_string(limit) +
                        " free: raise it (ulimit -n, or resource.setrlimit in Python)",
                    EMFILE);
}

}  // namespace tensorwire::os
