#include "os/tcp_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace tensorwire::os {

TcpProbe probe_tcp(const std::string& ip, uint16_t port, std::chrono::milliseconds timeout) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    len = sizeof(*v4);
  } else if (::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    len = sizeof(*v6);
  } else {
    return TcpProbe::NoAnswer;
  }
  const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return TcpProbe::NoAnswer;
  int err = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const auto until = std::chrono::steady_clock::now() + timeout;
      int n;
      do {  // a signal ends poll() early: wait out what is left, not the whole timeout again
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            until - std::chrono::steady_clock::now());
        n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      } while (n < 0 && errno == EINTR);
      socklen_t l = sizeof(err);
      if (n != 1 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = ETIMEDOUT;
    }
  }
  ::close(fd);
  if (err == 0) return TcpProbe::Accepting;
  return err == ECONNREFUSED ? TcpProbe::Refused : TcpProbe::NoAnswer;
}

}  // namespace tensorwire::os
