#include "os/listeners.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace tensorwire::os {

namespace {

// What a mark matches: a TCP port, or the exact bytes of a socket's local address.
struct Address {
  uint16_t port = 0;
  std::string raw;
};

struct Registry {
  std::mutex mu;
  uint64_t next = 1;
  std::map<uint64_t, Address> marks;
};

Registry& registry() {
  // Never destroyed: marks of static objects may be dropped after it would have been.
  static Registry* r = [] {
    auto* made = new Registry;
    ::pthread_atfork([] { registry().mu.lock(); }, [] { registry().mu.unlock(); },
                     [] { registry().mu.unlock(); });
    return made;
  }();
  return *r;
}

uint64_t add(Address a) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const uint64_t id = r.next++;
  r.marks.emplace(id, std::move(a));
  return id;
}

// The port of a TCP socket's address, or 0.
uint16_t port_of(const sockaddr_storage& s) {
  if (s.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(s).sin_port);
  if (s.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(s).sin6_port);
  return 0;
}

}  // namespace

ListenerMark ListenerMark::tcp(uint16_t port) {
  return ListenerMark(add({.port = port}));
}

ListenerMark ListenerMark::socket(int fd) {
  sockaddr_storage s{};
  socklen_t len = sizeof s;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) return {};
  return ListenerMark(
      add({.port = port_of(s), .raw = std::string(reinterpret_cast<char*>(&s), len)}));
}

ListenerMark& ListenerMark::operator=(ListenerMark&& o) noexcept {
  if (this != &o) {
    ListenerMark dropped(id_);
    id_ = o.id_;
    o.id_ = 0;
  }
  return *this;
}

ListenerMark::~ListenerMark() {
  if (id_ == 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.marks.erase(id_);
}

int release_inherited_listeners() noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.marks.empty()) return 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  int released = 0;
  while (const dirent* e = ::readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == ::dirfd(dir) || fd == devnull) continue;
    int listening = 0;
    socklen_t optlen = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 || !listening)
      continue;  // not a socket, or not listening
    sockaddr_storage s{};
    socklen_t len = sizeof s;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) continue;
    const uint16_t port = port_of(s);
    const std::string raw(reinterpret_cast<const char*>(&s), len);
    for (const auto& [id, a] : r.marks) {
      if (a.raw.empty() ? (port != 0 && port == a.port) : a.raw == raw) {
        if (devnull >= 0 && ::dup3(devnull, fd, O_CLOEXEC) == fd) ++released;
        break;
      }
    }
  }
  ::closedir(dir);
  if (devnull >= 0) ::close(devnull);
  return released;
}

}  // namespace tensorwire::os
