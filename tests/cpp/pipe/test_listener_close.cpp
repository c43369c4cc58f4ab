// ucx::Listener's close while clients connect. UCX (1.13 to at least 1.19) keeps each
// accepted connection pointing at the listener until the client's request arrives whole,
// and calls into the freed listener when it arrives after the listener went: a crash of the
// whole process, seen as a TensorDictServer closed just as a client connected. Clients here
// send their request at moments spread over the close; the process must survive each round,
// every client must be refused (its connection ends), and no fd may be left behind.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
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

size_t open_fds() {
  size_t n = 0;
  os::for_each_fd([&](int) { ++n; });
  return n;
}

// A client that speaks UCX's TCP connection manager by hand: it connects, waits `delay`,
// then sends a request (the manager's header: the length of what follows and a status; then
// that many bytes), and reports whether its connection ended within `within`: refused,
// closed or reset, as a listener that goes must leave it.
bool request_then_wait_for_the_end(uint16_t port, std::chrono::microseconds delay,
                                   std::chrono::milliseconds within) {
  os::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return true;
  std::this_thread::sleep_for(delay);
  struct {
    size_t length;
    uint8_t status;
  } header{64, 0};
  std::array<char, sizeof header + 64> request{};
  std::memcpy(request.data(), &header, sizeof header);
  (void)::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL);
  const auto until = std::chrono::steady_clock::now() + within;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left <= 0ms) return false;
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
    char buf[256];
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n <= 0) return true;  // the end: closed (0) or reset (-1)
    // A refusal message first: the end follows.
  }
}

TEST(ListenerClose, ClientsWhoseRequestsArriveAsTheListenerClosesAreRefused) {
  const size_t fds_before = open_fds();
  constexpr int kRounds = 40;
  constexpr int kClients = 8;
  std::atomic<int> not_ended{0};
  for (int round = 0; round < kRounds; ++round) {
    auto listener = std::make_unique<ucx::Listener>(0);
    const uint16_t port = listener->port();
    std::vector<std::thread> clients;
    std::atomic<int> connected{0};
    for (int i = 0; i < kClients; ++i) {
      // Requests spread over the 2 ms after the close began, a different spread each round.
      const auto delay = std::chrono::microseconds((i * 250 + round * 37) % 2000);
      clients.emplace_back([&, port, delay] {
        connected.fetch_add(1);
        if (!request_then_wait_for_the_end(port, delay, 10s)) not_ended.fetch_add(1);
      });
    }
    while (connected.load() < kClients) std::this_thread::yield();
    std::this_thread::sleep_for(200us);  // most have connected: accepted by UCX's thread
    listener.reset();
    for (auto& t : clients) t.join();
  }
  EXPECT_EQ(not_ended.load(), 0);
  EXPECT_EQ(open_fds(), fds_before);
}

TEST(ListenerClose, PipesAlreadyAcceptedGoOnAfterTheirListenerCloses) {
  // A pipe accepted from the listener answered its client long before: the listener's close
  // refuses only connections nobody answered. Over TCP the pipe keeps the very connection
  // the listener accepted; with shared memory it moved to a direct endpoint.
  for (const char* tls : {"tcp", "sm,tcp"}) {
    SCOPED_TRACE(tls);
    ::setenv("UCX_TLS", tls, 1);
    PipeListener listener(0);
    std::optional<TensorDictPipe> accepted;
    std::thread t([&] { accepted = listener.accept(20s); });
    TensorDictPipe connected = TensorDictPipe::connect("127.0.0.1", listener.port());
    t.join();
    ASSERT_TRUE(accepted);
    listener.close();
    for (float x : {1.f, 2.f}) {
      TensorDict td({2});
      td.set("v", Tensor::from_vector<float>({x, x}, {2}));
      connected.send(td, 10s);
      EXPECT_EQ(accepted->recv(nullptr, 10s).get("v").data<float>()[0], x);
      accepted->send(td, 10s);
      EXPECT_EQ(connected.recv(nullptr, 10s).get("v").data<float>()[1], x);
    }
  }
  ::unsetenv("UCX_TLS");
}

}  // namespace
