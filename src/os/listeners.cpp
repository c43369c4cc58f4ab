#include "os/listeners.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <utility>

#include "os/own_sockets.h"

namespace tensorwire::os {

namespace {

// What a mark matches: a TCP address and port, or the exact bytes of a socket's address.
struct Address {
  std::string ip;  // inet_ntop's form
  uint16_t port = 0;
  std::string raw;
};

struct Registry {
  std::mutex mu;
  uint64_t next = 1;
  std::map<uint64_t, Address> marks;
};

// Made when the library is loaded (no function-local static: a first use while another
// thread forks would leave the child waiting for ever on its unfinished initialization),
// and never destroyed: marks of static objects may be dropped after it would have been.
Registry* make_registry();
Registry* const g_registry = make_registry();

Registry& registry() {
  return *g_registry;
}

Registry* make_registry() {
  auto* made = new Registry;
  ::pthread_atfork([] { g_registry->mu.lock(); }, [] { g_registry->mu.unlock(); },
                   [] { g_registry->mu.unlock(); });
  return made;
}

uint64_t add(Address a) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const uint64_t id = r.next++;
  r.marks.emplace(id, std::move(a));
  return id;
}

}  // namespace

ListenerMark ListenerMark::tcp(const std::string& ip, uint16_t port) {
  sockaddr_storage s{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&s);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&s);
  if (::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1)
    s.ss_family = AF_INET;
  else if (::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1)
    s.ss_family = AF_INET6;
  else
    return {};
  return ListenerMark(add({.ip = ip_port_of(s).first, .port = port}));
}

ListenerMark ListenerMark::socket(int fd) {
  sockaddr_storage s{};
  socklen_t len = sizeof s;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) return {};
  return ListenerMark(add({.raw = std::string(reinterpret_cast<char*>(&s), len)}));
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
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  int released = 0;
  for_each_fd([&](int fd) {
    if (fd == devnull) return;
    if (!is_listening(fd)) return;
    sockaddr_storage s{};
    socklen_t len = sizeof s;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) return;
    const auto [ip, port] = ip_port_of(s);
    const std::string raw(reinterpret_cast<const char*>(&s), len);
    for (const auto& [id, a] : r.marks) {
      if (a.raw.empty() ? (port != 0 && port == a.port && ip == a.ip) : a.raw == raw) {
        if (devnull >= 0 && ::dup3(devnull, fd, O_CLOEXEC) == fd) ++released;
        break;
      }
    }
  });
  if (devnull >= 0) ::close(devnull);
  return released;
}

}  // namespace tensorwire::os
