// TensorDictPipe between two real processes over loopback, once with UCX_TLS forcing
// shared memory (sm,tcp: tcp is needed only for the connection manager) and once TCP.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "peer_process.h"
#include "tensorwire/pipe/pipe.h"
#include "tensorwire/pipe/server.h"
#include "tensorwire/tensorwire.h"
#include "ucx/ucx.h"
#include "wire/handshake.h"

using namespace tensorwire;
using test_support::PeerProcess;
using namespace std::chrono_literals;

namespace {

struct Transport {
  const char* name;
  const char* tls;
};

class PipeTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override { ::setenv("UCX_TLS", GetParam().tls, 1); }
  std::vector<std::string> env() const { return {std::string("UCX_TLS=") + GetParam().tls}; }
  static std::string peer() { return PIPE_PEER; }
  static std::string evil() { return EVIL_PEER; }
};

TensorDict sample(int i) {
  TensorDict td({4});
  td.set("x", Tensor::from_vector<float>({1.f * i, 1.f * i, 1.f * i, 1.f * i}, {4}));
  td.set({"nested", "y"}, Tensor::from_vector<int64_t>({i, i + 1, i + 2, i + 3}, {4}));
  td.set("label", NonTensor{"step"});
  return td;
}

}  // namespace

TEST_P(PipeTest, ConsolidatedStreamReturnsSameObjectWithNewValuesUntilSchemaChanges) {
  PipeListener listener(0);
  PeerProcess p(
      {peer(), "send", "127.0.0.1", std::to_string(listener.port()), "6", "--change-at", "4"},
      env());
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe);
  TensorDict* first = nullptr;
  const Storage* storage = nullptr;
  for (int i = 0; i < 6; ++i) {
    TensorDict& td = pipe->recv(nullptr, 20s);
    EXPECT_EQ(td.get("x").data<float>()[0], static_cast<float>(i));
    EXPECT_EQ(td.get({"nested", "y"}).data<int64_t>()[3], i + 3);
    EXPECT_EQ(td.get_non_tensor("label"), "step");
    if (i == 0 || i == 4) {
      EXPECT_TRUE(pipe->last_recv_was_new_schema()) << i;
      first = &td;
      storage = &td.consolidated()->storage;
    } else {
      EXPECT_FALSE(pipe->last_recv_was_new_schema()) << i;
      EXPECT_EQ(&td, first);
      EXPECT_EQ(td.consolidated()->storage.data(), storage->data());  // written in place
    }
    EXPECT_EQ(td.contains("extra"), i >= 4);
  }
  EXPECT_EQ(p.exit_code(), 0) << p.stderr_text();
}

TEST_P(PipeTest, NonConsolidatedStreamBuildsANewDictEachTime) {
  PipeOptions opt;
  opt.consolidated = false;
  PipeListener listener(0, opt);
  PeerProcess p({peer(), "send", "127.0.0.1", std::to_string(listener.port()), "3", "--nc", "--big",
                 "200000"},
                env());
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe);
  for (int i = 0; i < 3; ++i) {
    TensorDict& td = pipe->recv(nullptr, 20s);
    EXPECT_EQ(td.get("x").data<float>()[0], static_cast<float>(i));
    EXPECT_EQ(td.get({"nested", "y"}).data<int64_t>()[0], i);
    EXPECT_EQ(td.get("big").shape(), (Shape{4, 50000}));
    EXPECT_EQ(td.get("big").data<uint8_t>()[4 * 50000 - 1], i);
    EXPECT_EQ(td.get_tensordict("nested").batch_size(), (Shape{4}));
    EXPECT_EQ(td.get_non_tensor("label"), "step");
  }
  EXPECT_EQ(p.exit_code(), 0) << p.stderr_text();
}

TEST_P(PipeTest, LargeStorageTravelsOutOfLineIntoTheReceiveBuffer) {
  PipeListener listener(0);
  PeerProcess p(
      {peer(), "send", "127.0.0.1", std::to_string(listener.port()), "3", "--big", "4000000"},
      env());
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe);
  for (int i = 0; i < 3; ++i) {
    TensorDict& td = pipe->recv(nullptr, 20s);
    const Tensor& b = td.get("big");
    EXPECT_EQ(b.data<uint8_t>()[0], i);
    EXPECT_EQ(b.data<uint8_t>()[b.numel() - 1], i);
  }
  EXPECT_EQ(p.exit_code(), 0) << p.stderr_text();
}

TEST_P(PipeTest, ReceivesIntoACallersTensorDictWithTheSameLayout) {
  PipeListener listener(0);
  PeerProcess p({peer(), "send", "127.0.0.1", std::to_string(listener.port()), "3"}, env());
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe);
  pipe->recv(nullptr, 20s);  // the schema
  TensorDict mine = consolidate(sample(99));
  mine.unlock_();
  mine = consolidate(sample(99));
  TensorDict& got = pipe->recv(&mine, 20s);
  EXPECT_EQ(&got, &mine);
  EXPECT_EQ(mine.get("x").data<float>()[0], 1.f);
  EXPECT_EQ(p.exit_code(), 0) << p.stderr_text();
}

TEST_P(PipeTest, CppSenderAndCppReceiverInSeparateProcesses) {
  PeerProcess r({peer(), "recv", "0", "4"}, env());
  std::string line = r.read_line("PORT ");
  ASSERT_FALSE(line.empty()) << r.stderr_text();
  auto pipe =
      TensorDictPipe::connect("127.0.0.1", static_cast<uint16_t>(std::stoi(line.substr(5))));
  for (int i = 0; i < 4; ++i) pipe.send(sample(i));
  EXPECT_EQ(r.read_line("OK"), "OK 4");
  EXPECT_EQ(r.exit_code(), 0) << r.stderr_text();
}

TEST_P(PipeTest, ModeMismatchIsAnErrorOnBothSides) {
  PipeListener listener(0);  // consolidated
  PeerProcess p({peer(), "send", "127.0.0.1", std::to_string(listener.port()), "1", "--nc"}, env());
  try {
    listener.accept(20s, /*throw_on_refusal=*/true);
    FAIL() << "a consolidated listener accepted a non-consolidated client";
  } catch (const wire::HandshakeError& e) {
    EXPECT_NE(std::string(e.what()).find("mode mismatch"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p.exit_code(), 3);
  EXPECT_NE(p.stderr_text().find("mode mismatch"), std::string::npos);
}

TEST_P(PipeTest, WrongOrMissingAuthKeyIsRefusedOnBothSides) {
  PipeOptions opt;
  opt.auth_key = "secret";
  for (std::vector<std::string> extra :
       {std::vector<std::string>{"--key", "wrong"}, std::vector<std::string>{}}) {
    PipeListener listener(0, opt);
    std::vector<std::string> args = {peer(), "send", "127.0.0.1", std::to_string(listener.port()),
                                     "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    PeerProcess p(args, env());
    EXPECT_THROW(listener.accept(20s, true), wire::HandshakeError);
    EXPECT_EQ(p.exit_code(), 3);
    std::string err = p.stderr_text();
    EXPECT_NE(err.find(extra.empty() ? "authentication required" : "authentication failed"),
              std::string::npos)
        << err;
  }
  // The right key connects.
  PipeListener listener(0, opt);
  PeerProcess p(
      {peer(), "send", "127.0.0.1", std::to_string(listener.port()), "1", "--key", "secret"},
      env());
  auto pipe = listener.accept(20s, true);
  ASSERT_TRUE(pipe);
  EXPECT_EQ(pipe->recv(nullptr, 20s).get("x").data<float>()[0], 0.f);
  EXPECT_EQ(p.exit_code(), 0);
}

TEST_P(PipeTest, PeerKilledMidStreamMakesRecvFailWithinFiveSeconds) {
  PipeListener listener(0);
  PeerProcess p({peer(), "send", "127.0.0.1", std::to_string(listener.port()), "2", "--hang"},
                env());
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe);
  pipe->recv(nullptr, 20s);
  pipe->recv(nullptr, 20s);
  p.kill(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(pipe->recv(nullptr, 30s), ClosedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // and a later send fails at once too
  EXPECT_THROW(pipe->send(sample(0), 30s), ClosedError);
}

TEST_P(PipeTest, PeerClosingEndsRecvWithAClearError) {
  PipeListener listener(0);
  PeerProcess p({peer(), "send", "127.0.0.1", std::to_string(listener.port()), "1"}, env());
  auto pipe = listener.accept(20s);
  pipe->recv(nullptr, 20s);
  try {
    pipe->recv(nullptr, 20s);
    FAIL();
  } catch (const ClosedError& e) {
    EXPECT_NE(std::string(e.what()).find("peer closed the pipe"), std::string::npos) << e.what();
  }
}

TEST_P(PipeTest, SendAndRecvOnAClosedPipeThrow) {
  PipeListener listener(0);
  PeerProcess p({peer(), "send", "127.0.0.1", std::to_string(listener.port()), "1"}, env());
  auto pipe = listener.accept(20s);
  pipe->close();
  pipe->close();  // idempotent
  EXPECT_TRUE(pipe->closed());
  EXPECT_THROW(pipe->send(sample(0)), ClosedError);
  EXPECT_THROW(pipe->recv(), ClosedError);
}

TEST_P(PipeTest, MalformedMessagesAreRejectedAndThePeerIsTold) {
  for (std::string kind : {"storage-without-schema", "bad-magic", "oversize", "short-payload",
                           "wrong-schema-id", "unknown-control"}) {
    PipeOptions opt;
    opt.limits.max_message_bytes = 1 << 20;
    PipeListener listener(0, opt);
    PeerProcess p({evil(), "127.0.0.1", std::to_string(listener.port()), kind}, env());
    auto pipe = listener.accept(20s);
    ASSERT_TRUE(pipe) << kind;
    std::string what;
    try {
      if (kind == "wrong-schema-id") pipe->recv(nullptr, 20s);
      pipe->recv(nullptr, 20s);
    } catch (const ProtocolError& e) {
      what = e.what();
    }
    EXPECT_FALSE(what.empty()) << kind << " was accepted";
    std::string reply = p.read_line("REJECTED");
    EXPECT_FALSE(reply.empty()) << kind << ": the peer was not told (" << p.stderr_text() << ")";
    EXPECT_THROW(pipe->recv(nullptr, 1s), Error) << "the pipe stays closed after " << kind;
  }
}

// Messages on a tag the pipe never reads would stay in UCX's queue for ever (a flood of
// them: memory without bound): the first one seen ends the pipe, and the peer is told.
// The same for a heartbeat where none is read: between two processes of one host (the
// kernel tells when a peer dies) neither side sends any.
TEST_P(PipeTest, MessagesOnATagThePipeNeverReadsEndIt) {
  for (auto [kind, tag] : {std::pair{"foreign-tag", "tag 99"}, {"stray-heartbeat", "tag 4"}}) {
    PipeListener listener(0);
    PeerProcess p({evil(), "127.0.0.1", std::to_string(listener.port()), kind}, env());
    auto pipe = listener.accept(20s);
    ASSERT_TRUE(pipe) << p.stderr_text();
    std::string what;
    try {
      pipe->recv(nullptr, 20s);
    } catch (const ProtocolError& e) {
      what = e.what();
    }
    EXPECT_NE(what.find(tag), std::string::npos) << what;
    EXPECT_NE(p.read_line("REJECTED").find(tag), std::string::npos)
        << kind << ": the peer was not told (" << p.stderr_text() << ")";
  }
}

// The two ends can judge "same host" differently (behind a port proxy or NAT, one finds
// the other's address local and the other does not). Each says what it found, and only a
// verdict both share counts: here the peer finds this side remote, so the pipe stays on its
// first endpoint and exchanges heartbeats, where before one side waited for a worker
// address until its handshake timed out and the other refused the heartbeats.
TEST_P(PipeTest, EndsThatDisagreeAboutSharingAHostAgreeOnHeartbeats) {
  PipeListener listener(0);
  PeerProcess p({evil(), "127.0.0.1", std::to_string(listener.port()), "not-same-host"}, env());
  auto pipe = listener.accept(20s, /*throw_on_refusal=*/true);
  ASSERT_TRUE(pipe) << p.stderr_text();
  EXPECT_FALSE(p.read_line("HEARTBEAT").empty()) << p.stderr_text();
  EXPECT_EQ(pipe->recv(nullptr, 20s).get("x").numel(), 4);
  EXPECT_FALSE(pipe->failed());
}

// A peer from before the verdicts (no "host_verdict" in its hello) offers its address
// alone, as it always did: the pipe takes that and goes on.
TEST_P(PipeTest, APeerThatSendsNoVerdictIsStillServed) {
  PipeListener listener(0);
  PeerProcess p({evil(), "127.0.0.1", std::to_string(listener.port()), "no-verdict"}, env());
  auto pipe = listener.accept(20s, /*throw_on_refusal=*/true);
  ASSERT_TRUE(pipe) << p.stderr_text();
  EXPECT_EQ(pipe->recv(nullptr, 20s).get("x").numel(), 4);
  EXPECT_FALSE(pipe->failed());
}

// A payload travels in its frame or on a message of its own (split payloads, over shared
// memory between peers that announce them): a receiver takes either from any peer, one
// that announces none among them.
TEST_P(PipeTest, APayloadComesInItsFrameOrOnItsOwnMessage) {
  PipeListener listener(0);
  PeerProcess p({evil(), "127.0.0.1", std::to_string(listener.port()), "inline-and-split"}, env());
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe) << p.stderr_text();
  for (const uint8_t value : {uint8_t{1}, uint8_t{2}}) {
    const Tensor x = pipe->recv(nullptr, 20s).get("x");
    ASSERT_EQ(x.numel(), 48 * 1024);
    const auto* b = x.data<uint8_t>();
    EXPECT_TRUE(std::all_of(b, b + x.numel(), [&](uint8_t v) { return v == value; })) << +value;
  }
}

namespace {
void echo_every_size(TensorDictPipe& pipe, const std::vector<size_t>& sizes) {
  int i = 0;
  for (size_t n : sizes)
    for (const bool loose : {true, false}) {
      ++i;
      TensorDict td;
      std::vector<uint8_t> a(n / 2), b(n / 2);
      for (size_t k = 0; k < a.size(); ++k) {
        a[k] = static_cast<uint8_t>(k * 7 + i);
        b[k] = static_cast<uint8_t>(k * 13 + i);
      }
      td.set("a", Tensor::from_vector<uint8_t>(a, {static_cast<int64_t>(a.size())}));
      td.set("b", Tensor::from_vector<uint8_t>(b, {static_cast<int64_t>(b.size())}));
      pipe.send(loose ? td : consolidate(td), 20s);
      const TensorDict& back = pipe.recv(nullptr, 20s);
      ASSERT_TRUE(equal(back, td)) << n << " bytes, loose " << loose;
    }
}
}  // namespace

// Every size around the thresholds (8 KiB split, 64 KiB inline at most, 80 KiB eager),
// from a consolidated dict (one piece) and from loose leaves (gathered pieces), on a
// consolidated and a non-consolidated pipe, comes back whole from an echoing peer.
TEST_P(PipeTest, PayloadsAroundEveryThresholdArriveWhole) {
  const std::vector<size_t> sizes = {4096, 8192, 8256, 16384, 65536, 65600, 81920, 262144};
  for (const bool consolidated : {true, false}) {
    PipeListener listener(0, {.consolidated = consolidated});
    std::vector<std::string> args = {peer(), "echo", "127.0.0.1", std::to_string(listener.port()),
                                     std::to_string(2 * sizes.size())};
    if (!consolidated) args.push_back("--nc");
    PeerProcess p(args, env());
    auto pipe = listener.accept(20s);
    ASSERT_TRUE(pipe) << p.stderr_text();
    // Split payloads: consolidated ones over shared memory only (a second TCP message costs
    // more than the copy it saves, and one message per leaf more than the copies).
    const bool split = consolidated && std::string(GetParam().name) == "shm";
    EXPECT_EQ(pipe->inline_payload_max(), split ? 8192u : 65536u) << consolidated;
    echo_every_size(*pipe, sizes);
    EXPECT_EQ(p.exit_code(), 0) << p.stderr_text();
  }
}

// With shared memory allowed, two processes of one host move their data over it (and no
// TCP lane, which would cost an epoll_wait per progress call); with tcp forced, over TCP.
TEST_P(PipeTest, APipeBetweenProcessesOfOneHostUsesSharedMemoryUnlessTcpIsForced) {
  PipeListener listener(0);
  PeerProcess p({peer(), "send", "127.0.0.1", std::to_string(listener.port()), "1"}, env());
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe);
  const std::string t = pipe->transports();
  if (std::string(GetParam().name) == "shm") {
    EXPECT_TRUE(t.find("sysv/") != std::string::npos || t.find("posix/") != std::string::npos) << t;
    EXPECT_EQ(t.find("tcp/"), std::string::npos) << t;
  } else {
    EXPECT_NE(t.find("tcp/"), std::string::npos) << t;
    EXPECT_EQ(t.find("/memory"), std::string::npos) << t;
  }
  EXPECT_EQ(pipe->recv(nullptr, 20s).get("x").data<float>()[0], 0.f);
  pipe->close();
  EXPECT_EQ(pipe->transports(), "");
}

// Two processes on one host switch to an endpoint made from the peer's worker address
// (pipe_impl.cpp): a malformed address ends the connection with an error on both sides.
TEST_P(PipeTest, AMalformedWorkerAddressIsRefusedAndThePeerIsTold) {
  PipeListener listener(0);
  PeerProcess p({evil(), "127.0.0.1", std::to_string(listener.port()), "bad-worker-address"},
                env());
  std::string what;
  try {
    auto pipe = listener.accept(20s, /*throw_on_refusal=*/true);
    EXPECT_FALSE(pipe) << "a malformed worker address was accepted";
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("worker address"), std::string::npos) << what;
  std::string reply = p.read_line("REJECTED");
  EXPECT_NE(reply.find("worker address"), std::string::npos)
      << "the peer was not told (" << p.stderr_text() << ")";
}

TEST_P(PipeTest, ServerServesThreeConcurrentClients) {
  TensorDictServer server(0);
  std::vector<std::unique_ptr<PeerProcess>> peers;
  for (int c = 0; c < 3; ++c)
    peers.push_back(std::make_unique<PeerProcess>(
        std::vector<std::string>{peer(), "echo", "127.0.0.1", std::to_string(server.port()), "5"},
        env()));
  std::vector<TensorDictPipe> pipes;
  for (int c = 0; c < 3; ++c) {
    auto p = server.accept(20s);
    ASSERT_TRUE(p);
    pipes.push_back(std::move(*p));
  }
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (auto& pipe : pipes)
    threads.emplace_back([&pipe, &ok] {
      for (int i = 0; i < 5; ++i) {
        pipe.send(sample(i), 20s);
        if (pipe.recv(nullptr, 20s).get("x").data<float>()[0] == static_cast<float>(i)) ++ok;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 15);
  for (auto& p : peers) EXPECT_EQ(p->exit_code(), 0) << p->stderr_text();
  server.close();
  EXPECT_TRUE(pipes[0].closed());
  EXPECT_THROW(server.accept(100ms), ClosedError);
}

TEST_P(PipeTest, RecvTimesOutWhenNothingArrivesAndThePipeStaysUsable) {
  PipeListener listener(0);
  PeerProcess r({peer(), "echo", "127.0.0.1", std::to_string(listener.port()), "1"}, env());
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe);
  EXPECT_THROW(pipe->recv(nullptr, 200ms), TimeoutError);
  pipe->send(sample(3), 20s);  // the echo peer answers now
  EXPECT_EQ(pipe->recv(nullptr, 20s).get("x").data<float>()[0], 3.f);
  EXPECT_EQ(r.exit_code(), 0) << r.stderr_text();
}

TEST_P(PipeTest, ConnectingToAPortWithNoListenerFails) {
  uint16_t port;
  {
    PipeListener listener(0);
    port = listener.port();
  }  // closed again: nothing listens there now
  PipeOptions opt;
  opt.connect_timeout = 3s;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(TensorDictPipe::connect("127.0.0.1", port, opt), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_THROW(TensorDictPipe::connect("no-such-host.invalid", port, opt), ValueError);
}

// Only a process of this host may hand the pipe a UCX worker address (UCX trusts it): the
// connection's address must be loopback or one of this host's interfaces.
TEST(PipeLocalAddress, LoopbackAndOwnInterfacesAreLocalOthersAreNot) {
  EXPECT_TRUE(ucx::is_local_address("127.0.0.1"));
  EXPECT_TRUE(ucx::is_local_address("127.3.4.5"));
  EXPECT_TRUE(ucx::is_local_address("::1"));
  EXPECT_FALSE(ucx::is_local_address("192.0.2.1"));  // TEST-NET-1: never assigned
  EXPECT_FALSE(ucx::is_local_address("2001:db8::1"));
  EXPECT_FALSE(ucx::is_local_address("not an address"));
  EXPECT_FALSE(ucx::is_local_address(""));
}

// Worker addresses (pipe_impl.cpp, use_direct_endpoint): this process offers shared memory.
class WorkerAddress : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("UCX_TLS", "sm,tcp", 1); }
  // evil_peer KIND run as nobody (another user), over TCP.
  static std::vector<std::string> evil_of_another_user(const PipeListener& listener,
                                                       const std::string& kind) {
    return {"/usr/bin/setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/env",
            "UCX_TLS=tcp",
            EVIL_PEER,
            "127.0.0.1",
            std::to_string(listener.port()),
            kind};
  }
};

// UCX trusts a worker address (a corrupted one fails an assertion: SIGABRT of the whole
// process, with every pipe of a server in it). A local peer of another user (over TCP, which
// it may choose) is never sent ours nor has its own parsed: the pipe stays on its first
// endpoint and goes on, here to reject the peer's next, malformed, frame.
TEST_F(WorkerAddress, OneFromAnotherUserIsNeverParsed) {
  PipeListener listener(0);
  PeerProcess p(evil_of_another_user(listener, "mutated-worker-address"));
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe) << p.stderr_text();
  EXPECT_THROW(pipe->recv(nullptr, 20s), ProtocolError);  // the bad-magic frame
  EXPECT_FALSE(p.read_line("REJECTED").empty())
      << "the receiver did not go on (" << p.stderr_text() << ")";
}

// A hello's pid is the peer's word: a process of another user that claims to be some
// process of this host is not taken at its word (the pipe would end when that process
// exits, or go on after the real peer died). Only the kernel's record of a peer's socket
// as this user's makes its pid one to watch.
TEST_F(WorkerAddress, APidClaimedByAnotherUsersProcessIsNotWatched) {
  std::fflush(nullptr);  // the child must not print what this process had buffered
  pid_t bystander = ::fork();
  if (bystander == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::pause();
    ::_exit(0);
  }
  struct Reap {
    pid_t pid;
    void now() {
      if (pid <= 0) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = 0;
    }
    ~Reap() { now(); }
  } reap{bystander};
  PipeListener listener(0);
  PeerProcess p(evil_of_another_user(listener, "claim-pid=" + std::to_string(bystander)));
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe) << p.stderr_text();
  EXPECT_FALSE(p.read_line("CONNECTED").empty()) << p.stderr_text();
  reap.now();
  // A watched pid is checked every few milliseconds: its exit would end the pipe here.
  EXPECT_THROW(pipe->recv(nullptr, 1500ms), TimeoutError);
  EXPECT_FALSE(pipe->failed());
}

// Such a peer gets neither a pidfd watch nor heartbeats (it is on this host): its death is
// seen through its connection, which its kernel closes.
TEST_F(WorkerAddress, APeerOfAnotherUserThatIsKilledEndsThePipe) {
  PipeListener listener(0);
  PeerProcess p(evil_of_another_user(listener, "claim-pid=-1"));
  auto pipe = listener.accept(20s);
  ASSERT_TRUE(pipe) << p.stderr_text();
  ASSERT_FALSE(p.read_line("CONNECTED").empty()) << p.stderr_text();
  p.kill(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(pipe->recv(nullptr, 20s), ClosedError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// Our own address handed back would connect the pipe to itself.
TEST_F(WorkerAddress, OurOwnHandedBackIsRefused) {
  PipeListener listener(0);
  PeerProcess p({EVIL_PEER, "127.0.0.1", std::to_string(listener.port()), "own-worker-address"});
  std::string what;
  try {
    auto pipe = listener.accept(20s, /*throw_on_refusal=*/true);
    EXPECT_FALSE(pipe) << "our own worker address was accepted";
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("own worker address"), std::string::npos) << what;
  EXPECT_NE(p.read_line("REJECTED").find("own worker address"), std::string::npos)
      << "the peer was not told (" << p.stderr_text() << ")";
}

INSTANTIATE_TEST_SUITE_P(Transports, PipeTest,
                         ::testing::Values(Transport{"shm", "sm,tcp"}, Transport{"tcp", "tcp"}),
                         [](const auto& p) { return std::string(p.param.name); });
