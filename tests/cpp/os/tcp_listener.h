// A plain TCP listening socket for the os tests (what a user's own server would hold).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

#include "os/unix_socket.h"

namespace tensorwire::os {

// A TCP socket listening on `ip` (`port` 0: any); its port through `port`. Fd() on failure.
inline Fd tcp_listener(uint16_t& port, const char* ip = "127.0.0.1") {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, ip, &a.sin_addr);
  a.sin_port = htons(port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(fd.get(), 4) != 0)
    return Fd();
  socklen_t len = sizeof a;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

}  // namespace tensorwire::os
