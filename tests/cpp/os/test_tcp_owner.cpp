// os::tcp_socket_owner: the owner of a TCP socket of this host by the kernel's record, which
// the pipe trusts to tell whether a peer is a process of this user (src/pipe/pipe_impl.cpp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "os/peer.h"

namespace {

using namespace tensorwire;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

uint16_t port_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A listener on 127.0.0.1, a client connected to it and the server's end of it.
struct Connection {
  Fd listener, client, server;
  Connection() {
    listener.fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(listener.fd, 4), 0);
    a.sin_port = htons(port_of(listener.fd));
    client.fd = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(::connect(client.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    server.fd = ::accept(listener.fd, nullptr, nullptr);
    EXPECT_GE(server.fd, 0);
  }
};

TEST(TcpSocketOwner, ALiveConnectionAndAListenerAreThisUsers) {
  Connection c;
  const uint16_t listening = port_of(c.listener.fd), client = port_of(c.client.fd);
  EXPECT_EQ(os::tcp_socket_owner("127.0.0.1", listening, true), ::geteuid());
  EXPECT_EQ(os::tcp_socket_owner("127.0.0.1", client, false, listening), ::geteuid());
  // Not connected to that port, not listening, another address: none.
  EXPECT_EQ(os::tcp_socket_owner("127.0.0.1", client, false, uint16_t(listening ^ 1)),
            std::nullopt);
  EXPECT_EQ(os::tcp_socket_owner("127.0.0.1", client, true), std::nullopt);
  EXPECT_EQ(os::tcp_socket_owner("127.0.0.2", client, false), std::nullopt);
  EXPECT_EQ(os::tcp_socket_owner("not an address", client, false), std::nullopt);
}

// The side that closes first keeps its port in TIME_WAIT, which /proc/net/tcp shows as
// uid 0 whoever owned the socket: never an owner (a later connection from the same port,
// by a process of another user, looked like root's).
TEST(TcpSocketOwner, ASocketInTimeWaitHasNoOwner) {
  Connection c;
  const uint16_t client = port_of(c.client.fd);
  ::close(c.client.fd);
  c.client.fd = -1;
  char byte;
  EXPECT_EQ(::read(c.server.fd, &byte, 1), 0);  // the FIN arrived
  ::close(c.server.fd);
  c.server.fd = -1;
  // The client's end goes FIN_WAIT2 -> TIME_WAIT once the server's FIN is in.
  for (int i = 0; i < 100 && os::tcp_socket_owner("127.0.0.1", client, false); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(os::tcp_socket_owner("127.0.0.1", client, false), std::nullopt);
}

}  // namespace
