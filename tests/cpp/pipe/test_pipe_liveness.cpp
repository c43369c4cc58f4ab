// Heartbeats between a pipe and a peer that does not share this process's namespaces: the
// peer runs under `unshare --ipc` (another IPC namespace: to the handshake, another
// container), so both sides exchange heartbeats on their liveness threads. Link cuts between
// real network namespaces are tested in tests/python/test_across_hosts.py; here the same
// machinery runs in the C++ test binary, under ThreadSanitizer in `make test-tsan`.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>

#include "peer_process.h"
#include "tensorwire/pipe/pipe.h"
#include "tensorwire/tensorwire.h"

using namespace tensorwire;
using namespace std::chrono_literals;
using tensorwire::test_support::PeerProcess;

namespace {

TensorDict sample(int i) {
  TensorDict td({4});
  td.set("x", Tensor::from_vector<float>({1.f * i, 1.f * i, 1.f * i, 1.f * i}, {4}));
  return td;
}

PipeOptions with_liveness(std::chrono::milliseconds t) {
  PipeOptions o;
  o.liveness_timeout = t;
  return o;
}

// pipe_peer echo in an IPC namespace of its own, connected to `port`.
std::vector<std::string> echo_elsewhere(uint16_t port, int count) {
  return {"/usr/bin/unshare",   "--ipc", PIPE_PEER, "echo", "127.0.0.1", std::to_string(port),
          std::to_string(count)};
}

}  // namespace

TEST(PipeLiveness, AnIdleConnectionToAPeerInOtherNamespacesStaysUp) {
  PipeListener listener(0, with_liveness(400ms));
  PeerProcess p(echo_elsewhere(listener.port(), 3));
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe);
  // Neither side calls its pipe for several timeouts: only the liveness threads speak.
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(pipe->failed());
  for (int i = 0; i < 3; ++i) {
    pipe->send(sample(i), 20s);
    EXPECT_EQ(pipe->recv(nullptr, 20s).get("x").data<float>()[0], static_cast<float>(i));
  }
  EXPECT_EQ(p.wait(), 0) << p.stderr_text();
}

TEST(PipeLiveness, AStoppedPeerFailsAWaitingReceiveSayingNoHeartbeat) {
  PipeListener listener(0, with_liveness(500ms));
  PeerProcess p(echo_elsewhere(listener.port(), 1));
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe);
  // unshare execs the peer: its pid is the peer's.
  p.kill(SIGSTOP);
  std::string what;
  const auto start = std::chrono::steady_clock::now();
  try {
    pipe->recv(nullptr, 20s);
  } catch (const ClosedError& e) {
    what = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_NE(what.find("no heartbeat from"), std::string::npos) << what;
  EXPECT_NE(what.find("liveness_timeout 0.5 s"), std::string::npos) << what;
  EXPECT_LT(took, 10s) << "20 s is the receive's own timeout";
  EXPECT_TRUE(pipe->failed());
  p.kill(SIGKILL);
  p.kill(SIGCONT);
}
