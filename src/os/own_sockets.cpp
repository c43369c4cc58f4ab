#include "os/own_sockets.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/tcp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>

namespace tensorwire::os {

namespace {

// fd's local address, when it is a TCP socket bound to `ip` (any where `any_ip`) and `port`.
bool bound_to(int fd, const std::string& ip, uint16_t port, bool any_ip) {
  sockaddr_storage s{};
  socklen_t len = sizeof s;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) return false;
  const auto [local_ip, local_port] = ip_port_of(s);
  return local_port != 0 && local_port == port && (any_ip || local_ip == ip);
}

// A TCP socket's TCP_INFO, and how much of it this kernel filled (0: not TCP).
struct TcpInfo {
  tcp_info info{};
  socklen_t len = 0;
  // Whether the field at `offset` of `size` bytes is filled.
  bool has(size_t offset, size_t size) const { return len >= offset + size; }
};
TcpInfo tcp_info_of(int fd) {
  TcpInfo t;
  t.len = sizeof t.info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &t.info, &t.len) != 0) t.len = 0;
  return t;
}

// Whether this side of the connection has sent any byte: the kernel counts them
// (tcpi_bytes_sent, Linux 4.19; tcpi_bytes_acked before it).
bool sent_anything(const TcpInfo& t) {
  if (t.has(offsetof(tcp_info, tcpi_bytes_sent), sizeof t.info.tcpi_bytes_sent))
    return t.info.tcpi_bytes_sent != 0;
  if (t.has(offsetof(tcp_info, tcpi_bytes_acked), sizeof t.info.tcpi_bytes_acked))
    return t.info.tcpi_bytes_acked != 0;
  return true;  // not TCP, or cannot tell: counted as answered, left alone
}

// A duplicate of `fd` (close-on-exec), or -1. Another thread (UCX's) may close `fd` meanwhile:
// the callers check the duplicate again. A function of its own, named in the pipe tests'
// TSan suppressions (tests/sanitize/tsan.supp) with the other looks at such fds.
int duplicate(int fd) {
  return ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

}  // namespace

void for_each_fd(const std::function<void(int)>& fn) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    if (fd != ::dirfd(dir)) fn(fd);
  }
  ::closedir(dir);
}

bool is_socket(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

bool is_listening(int fd) {
  int listening = 0;
  socklen_t len = sizeof listening;
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening;
}

std::pair<std::string, uint16_t> ip_port_of(const sockaddr_storage& s) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (s.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(s);
    ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
    return {buf, ntohs(a.sin_port)};
  }
  if (s.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(s);
    ::inet_ntop(AF_INET6, &a.sin6_addr, buf, sizeof buf);
    return {buf, ntohs(a.sin6_port)};
  }
  return {"", 0};
}

std::vector<int> listening_sockets(const std::string& ip, uint16_t port) {
  std::vector<int> found;
  for_each_fd([&](int fd) {
    if (is_listening(fd) && bound_to(fd, ip, port, /*any_ip=*/false)) found.push_back(fd);
  });
  return found;
}

void for_each_accepted(const std::string& ip, uint16_t port, const std::function<void(int)>& fn) {
  const bool any_ip = ip == "0.0.0.0" || ip == "::";
  for_each_fd([&](int fd) {
    // A first look without a duplicate: one system call for each fd of the process (ENOTSOCK
    // for a file), since a listener looks every few seconds.
    if (!bound_to(fd, ip, port, any_ip)) return;
    // Sockets only: closing a duplicate of a file's fd (the number reused meanwhile) would
    // drop the POSIX locks this process holds on that file.
    if (!is_socket(fd)) return;
    const int own = duplicate(fd);
    if (own < 0) return;
    // Not getpeername(): a connection whose client closed after its request has no peer any
    // more, and the request may still be unread.
    if (!is_listening(own) && bound_to(own, ip, port, any_ip)) fn(own);
    ::close(own);
  });
}

namespace {

// Shuts down (both ways) each connection accepted on `ip`:`port` that `pick` chooses;
// returns how many it chose.
template <class Pick>
size_t shut_down_accepted(const std::string& ip, uint16_t port, Pick pick) {
  size_t found = 0;
  for_each_accepted(ip, port, [&](int fd) {
    if (!pick(fd)) return;
    ::shutdown(fd, SHUT_RDWR);  // ENOTCONN once both ends closed: nothing more to do
    ++found;
  });
  return found;
}

}  // namespace

size_t shut_down_unanswered(const std::string& ip, uint16_t port) {
  return shut_down_accepted(ip, port, [](int fd) { return !sent_anything(tcp_info_of(fd)); });
}

std::vector<std::string> shut_down_silent(const std::string& ip, uint16_t port,
                                          std::chrono::milliseconds silent_for) {
  std::vector<std::string> peers;
  shut_down_accepted(ip, port, [&](int fd) {
    const TcpInfo t = tcp_info_of(fd);  // one look serves every test below
    if (!t.has(offsetof(tcp_info, tcpi_bytes_received), sizeof t.info.tcpi_bytes_received))
      return false;  // cannot tell: left alone
    // Bytes taken in order: one dropped by a socket filter is not counted. A connection
    // that never received data reports the time since it was made.
    if (t.info.tcpi_bytes_received != 0 || sent_anything(t) ||
        t.info.tcpi_last_data_recv < static_cast<uint32_t>(silent_for.count()))
      return false;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    const auto [peer_ip, peer_port] =
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0
            ? ip_port_of(peer)
            : std::pair<std::string, uint16_t>{"?", 0};
    peers.push_back(peer_ip + ":" + std::to_string(peer_port));
    return true;
  });
  return peers;
}

bool drop_new_connections(int fd) noexcept {
  sock_filter drop_all[] = {BPF_STMT(BPF_RET | BPF_K, 0)};
  sock_fprog prog{1, drop_all};
  return ::setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) == 0;
}

}  // namespace tensorwire::os
