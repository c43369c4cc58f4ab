// os::probe_tcp: whether anything accepts connections at an address, which tells a refused
// connection from one a server ended when UCX reports both alike (src/ucx/ucx.cpp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "os/tcp_probe.h"

namespace {

using namespace tensorwire;
using namespace std::chrono_literals;

// A socket bound to a free port of 127.0.0.1, listening or not; closed at the end.
struct Bound {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  uint16_t port = 0;
  explicit Bound(bool listening) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    if (listening) {
      EXPECT_EQ(::listen(fd, 4), 0);
    }
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Bound() { ::close(fd); }
};

TEST(TcpProbe, AListenerAcceptsAndABoundPortThatDoesNotListenRefuses) {
  Bound listening(true), quiet(false);
  EXPECT_EQ(os::probe_tcp("127.0.0.1", listening.port, 1s), os::TcpProbe::Accepting);
  EXPECT_EQ(os::probe_tcp("::ffff:127.0.0.1", listening.port, 1s), os::TcpProbe::Accepting);
  EXPECT_EQ(os::probe_tcp("127.0.0.1", quiet.port, 1s), os::TcpProbe::Refused);
}

TEST(TcpProbe, WhatIsNotANumericAddressGetsNoAnswer) {
  EXPECT_EQ(os::probe_tcp("localhost", 1, 1s), os::TcpProbe::NoAnswer);
  EXPECT_EQ(os::probe_tcp("", 1, 1s), os::TcpProbe::NoAnswer);
}

}  // namespace
