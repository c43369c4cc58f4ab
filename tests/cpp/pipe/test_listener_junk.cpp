// Bytes that are not a UCX connection request, sent to a listening port (a port scanner, a
// stray HTTP request, a client of another protocol). UCX 1.13's TCP connection manager
// aborts the listening process on most of them (an assertion in tcp_sockcm_ep.c); the
// socket filter of ucx/sockcm_guard.h drops them before UCX reads them. The listener must
// survive each, never acknowledge the junk, go on accepting real clients, and close
// promptly with the junk connections still open, leaving no fd behind.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "os/own_sockets.h"
#include "os/unix_socket.h"
#include "tensorwire/pipe/pipe.h"
#include "tensorwire/tensorwire.h"
#include "ucx/ucx.h"

using namespace tensorwire;
using namespace std::chrono_literals;

namespace {

// UCX's header: the length of what follows, then a status byte (16 bytes with padding).
std::string header(uint64_t length) {
  std::string h(16, '\0');
  std::memcpy(h.data(), &length, sizeof length);
  return h;
}

// The junk: each sent on a connection of its own.
std::vector<std::string> junk() {
  std::string noise(4096, '\0');
  std::mt19937 rng(20261206);
  for (char& c : noise) c = static_cast<char>(rng());
  return {
      std::string(24, '\0'),                            // aborted UCX 1.13
      "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",      // a stray web client
      header(8) + std::string(24, 'x'),                 // more than announced
      header(100) + std::string(30, 'x'),               // less than announced
      header(uint64_t{1} << 40) + std::string(8, 'x'),  // a length beyond reason
      "SSH-2.0-OpenSSH_9.2\r\n",                        // another protocol's hello
      "GET / HT",                                       // shorter than a header
      noise,                                            // random bytes
  };
}

os::Fd connect_to(uint16_t port) {
  os::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// Bytes this socket sent that its peer's kernel acknowledged (the SYN not counted).
uint64_t acknowledged(int fd) {
  tcp_info info{};
  socklen_t len = sizeof info;
  EXPECT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len), 0);
  return info.tcpi_bytes_acked - 1;
}

size_t open_fds() {
  size_t n = 0;
  os::for_each_fd([&](int) { ++n; });
  return n;
}

TensorDict message(float x) {
  TensorDict td({2});
  td.set("v", Tensor::from_vector<float>({x, x}, {2}));
  return td;
}

TEST(ListenerJunk, BytesThatAreNotAUcxRequestNeverReachUcx) {
  const size_t fds_before = open_fds();
  std::optional<PipeListener> listener(std::in_place, 0);
  const uint16_t port = listener->port();
  std::vector<os::Fd> peers;
  for (const std::string& bytes : junk()) {
    peers.push_back(connect_to(port));
    ASSERT_EQ(::send(peers.back().get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // Unguarded, the kernel acknowledges each at once (and UCX reads it, or aborts).
  std::this_thread::sleep_for(300ms);
  for (size_t i = 0; i < peers.size(); ++i)
    EXPECT_EQ(acknowledged(peers[i].get()), 0u) << "junk " << i << " reached the listener";

  {  // A real client beside them: accepted, both ways.
    std::optional<TensorDictPipe> accepted;
    std::thread t([&] { accepted = listener->accept(20s); });
    TensorDictPipe client = TensorDictPipe::connect("127.0.0.1", port);
    t.join();
    ASSERT_TRUE(accepted);
    client.send(message(1.f), 10s);
    EXPECT_EQ(accepted->recv(nullptr, 10s).get("v").data<float>()[0], 1.f);
    accepted->send(message(2.f), 10s);
    EXPECT_EQ(client.recv(nullptr, 10s).get("v").data<float>()[1], 2.f);
  }

  // The close shuts the junk connections down (nothing answered them) without waiting
  // for their peers, which are all still connected.
  const auto start = std::chrono::steady_clock::now();
  listener->close();
  listener.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  peers.clear();
  // UCX closes its side of a connection in its own thread, soon after.
  for (int i = 0; i < 200 && open_fds() != fds_before; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(open_fds(), fds_before);
}

TEST(ListenerJunk, AJunkPeerThatLeavesLeavesNothingBehind) {
  // Junk, then the peer closes: its end of the connection is never read (the junk was
  // dropped), and the listener's close must still release the socket.
  const size_t fds_before = open_fds();
  {
    PipeListener listener(0);
    for (const std::string& bytes : junk()) {
      os::Fd fd = connect_to(listener.port());
      (void)::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    }
    std::optional<TensorDictPipe> accepted;
    std::thread t([&] { accepted = listener.accept(20s); });
    TensorDictPipe client = TensorDictPipe::connect("127.0.0.1", listener.port());
    t.join();
    ASSERT_TRUE(accepted);
  }
  for (int i = 0; i < 200 && open_fds() != fds_before; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(open_fds(), fds_before);
}

TEST(ListenerJunk, ConnectionsThatSendNothingUcxCanReadAreShutDownWhileItListens) {
  // The junk is dropped unread, and a peer may send nothing at all: left alone, each such
  // connection would hold a socket of the listening process until the listener closes.
  const size_t fds_before = open_fds();
  {
    ucx::Listener listener(0, "127.0.0.1", 300ms);
    const size_t fds_listening = open_fds();
    std::vector<os::Fd> peers;
    for (const std::string& bytes : junk()) {
      peers.push_back(connect_to(listener.port()));
      (void)::send(peers.back().get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    }
    peers.push_back(connect_to(listener.port()));  // says nothing
    const auto until = std::chrono::steady_clock::now() + 5s;
    size_t ended = 0;
    std::vector<bool> done(peers.size(), false);
    while (ended < peers.size() && std::chrono::steady_clock::now() < until) {
      EXPECT_FALSE(listener.poll());  // none of them is a connection request
      listener.worker().wait(10ms);
      for (size_t i = 0; i < peers.size(); ++i) {
        pollfd p{peers[i].get(), POLLIN, 0};
        char buf[64];
        if (!done[i] && ::poll(&p, 1, 0) == 1 && ::recv(peers[i].get(), buf, sizeof buf, 0) <= 0) {
          done[i] = true;
          ++ended;
        }
      }
    }
    EXPECT_EQ(ended, peers.size()) << "connections still open after 5 s";
    // The listener's side is gone too, while it listens: UCX closed each socket once it
    // was shut down.
    peers.clear();
    for (int i = 0; i < 200 && open_fds() != fds_listening; ++i) listener.worker().wait(10ms);
    EXPECT_EQ(open_fds(), fds_listening);
  }
  for (int i = 0; i < 200 && open_fds() != fds_before; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(open_fds(), fds_before);
}

}  // namespace
