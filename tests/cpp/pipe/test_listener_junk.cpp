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

#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "os/own_sockets.h"
#include "os/unix_socket.h"
#include "tensorwire/pipe/pipe.h"
#include "tensorwire/tensorwire.h"
#include "ucx/sockcm_guard.h"
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
      header(3000) + std::string(3000, 'x'),            // more than UCX reads: it would spin on it
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
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);  // its bound is 2 s
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

std::vector<std::string>& warnings() {
  static std::vector<std::string> w;
  return w;
}

TEST(ListenerJunk, ConnectionsThatSendNothingUcxCanReadAreShutDownWhileItListens) {
  set_log_handler([](LogLevel, const std::string& m) { warnings().push_back(m); });
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
    // Said, naming the port (the junk above, or a UCX peer whose request never arrived).
    ASSERT_FALSE(warnings().empty());
    EXPECT_NE(
        warnings()[0].find("listener on port " + std::to_string(listener.port()) + " shut down"),
        std::string::npos)
        << warnings()[0];
    // The listener's side is gone too, while it listens: UCX closed each socket once it
    // was shut down.
    peers.clear();
    for (int i = 0; i < 200 && open_fds() != fds_listening; ++i) listener.worker().wait(10ms);
    EXPECT_EQ(open_fds(), fds_listening);
  }
  for (int i = 0; i < 200 && open_fds() != fds_before; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(open_fds(), fds_before);
  set_log_handler(nullptr);
}

// Progresses both workers until `r` is done (or 10 s passed).
bool finish(ucx::Request& r, ucx::Worker& a, ucx::Worker& b) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!r.done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    a.progress();
    b.progress();
  }
  return true;
}

// One message from `from` to `to` (whose worker is `to_worker`).
void exchange(ucx::Endpoint& from, ucx::Worker& from_worker, ucx::Endpoint& to,
              ucx::Worker& to_worker, uint64_t tag) {
  std::array<std::byte, 8> out{}, in{};
  out[0] = std::byte{42};
  size_t length = 0;
  ucx::Request recv = to.recv(tag, in, &length);
  ucx::Request send = from.send(tag, out);
  ASSERT_TRUE(finish(send, from_worker, to_worker));
  ASSERT_TRUE(finish(recv, from_worker, to_worker));
  EXPECT_EQ(length, out.size());
  EXPECT_EQ(in[0], std::byte{42});
}

TEST(ListenerJunk, RequestsAndConnectionsUcxTookInAreNeverShutDown) {
  // The silent-connection look runs many times over: a request held unanswered, then the
  // connection made of it, idle, must both go on.
  ucx::Listener listener(0, "127.0.0.1", 100ms);
  ucx::Worker client_worker;
  ucx::Endpoint client(client_worker, "127.0.0.1", listener.port());
  std::optional<ucx::ConnRequest> request;
  for (auto until = std::chrono::steady_clock::now() + 10s;
       !request && std::chrono::steady_clock::now() < until;) {
    client_worker.progress();
    request = listener.poll();
  }
  ASSERT_TRUE(request);
  for (auto until = std::chrono::steady_clock::now() + 1s;
       std::chrono::steady_clock::now() < until;) {
    EXPECT_FALSE(listener.poll());
    client_worker.progress();
    std::this_thread::sleep_for(5ms);
  }
  ucx::Worker server_worker;
  ucx::Endpoint server(server_worker, *request);
  exchange(client, client_worker, server, server_worker, 7);
  for (auto until = std::chrono::steady_clock::now() + 1s;
       std::chrono::steady_clock::now() < until;) {
    EXPECT_FALSE(listener.poll());
    client_worker.progress();
    server_worker.progress();
    std::this_thread::sleep_for(5ms);
  }
  exchange(server, server_worker, client, client_worker, 8);
  exchange(client, client_worker, server, server_worker, 9);
  EXPECT_EQ(client.error(), UCS_OK);
  EXPECT_EQ(server.error(), UCS_OK);
}

// The number of instructions of the socket filter on `fd` (0: none).
int filter_length(int fd) {
  socklen_t len = 0;  // asks for the length only
  if (::getsockopt(fd, SOL_SOCKET, SO_GET_FILTER, nullptr, &len) != 0) return -1;
  return static_cast<int>(len);
}

TEST(ListenerJunk, TheGuardFollowsUcxsLimitAndCanBeTakenOff) {
  ::unsetenv("UCX_TCP_CM_PRIV_DATA_LEN");
  EXPECT_EQ(ucx::sockcm_max_private_data(), 2048u + 16);
  for (auto [setting, bytes] : {std::pair{"2K", 2048u + 16},
                                {"4096", 4096u + 16},
                                {"1kb", 1024u + 16},
                                {"inf", 0xffffu},
                                {"1g", 0xffffu}}) {
    ::setenv("UCX_TCP_CM_PRIV_DATA_LEN", setting, 1);
    EXPECT_EQ(ucx::sockcm_max_private_data(), bytes) << setting;
  }
  ::unsetenv("UCX_TCP_CM_PRIV_DATA_LEN");
  {
    ucx::Listener guarded(0, "127.0.0.1");
    const std::vector<int> fds = os::listening_sockets("127.0.0.1", guarded.port());
    ASSERT_EQ(fds.size(), 1u);
    EXPECT_EQ(filter_length(fds[0]), 25);
  }
  ::setenv("TENSORWIRE_UCX_LISTENER_GUARD", "0", 1);
  {
    ucx::Listener bare(0, "127.0.0.1");
    const std::vector<int> fds = os::listening_sockets("127.0.0.1", bare.port());
    ASSERT_EQ(fds.size(), 1u);
    EXPECT_EQ(filter_length(fds[0]), 0);
  }
  ::unsetenv("TENSORWIRE_UCX_LISTENER_GUARD");
}

}  // namespace
