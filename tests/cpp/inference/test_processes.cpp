// Clients and servers in separate processes: forked children using a client made before
// the fork, unrelated processes attaching by name, and peers killed with SIGKILL. Every
// test ends with no child left and nothing tensorwire-made in /dev/shm.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "common.h"

namespace tw_test {
namespace {

int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

bool tensorwire_in_dev_shm() {
  for (const std::string& n : dev_shm())
    if (n.find("tensorwire") != std::string::npos) return true;
  return false;
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { fds_before_ = open_fds(); }
  void TearDown() override {
    EXPECT_FALSE(tensorwire_in_dev_shm());
    int status = 0;
    EXPECT_EQ(::waitpid(-1, &status, WNOHANG), -1) << "a child process was left behind";
  }
  int fds_before_ = 0;
};

// Tests that run code in a forked child of this multithreaded process (fork_child). CMake
// labels them `forked-child` and `make test-tsan` leaves them out: ThreadSanitizer's
// allocator is not fork-safe, and such a child can deadlock in it. Peers started with
// fork+exec (Peer::spawn) are fine under TSan and stay in ProcessTest.
class ForkedChildTest : public ProcessTest {};

TEST_F(ForkedChildTest, ForkedChildrenUseAClientMadeBeforeTheFork) {
  auto t = make_shm(8);
  InferenceServer server(double_policy, t, {.max_batch_size = 8});
  server.start();
  Client c = t->client();
  EXPECT_EQ(action0(c(observation(1), 5s)), 2);  // connected as the parent's client
  std::vector<pid_t> kids;
  for (int k = 0; k < 4; ++k) {
    kids.push_back(fork_child([&, k] {
      for (int i = 0; i < 200; ++i) {
        float base = static_cast<float>(k * 1000 + i);
        if (action0(c(observation(base), 5s)) != 2 * base) return 1;
      }
      return 0;
    }));
  }
  for (pid_t p : kids) EXPECT_EQ(wait_child(p), 0);
  EXPECT_EQ(action0(c(observation(3), 5s)), 6);  // the parent's client is unaffected
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0; }));
  EXPECT_EQ(server.stats().requests, 802u);
}

TEST_F(ProcessTest, AnUnrelatedProcessAttachesByName) {
  auto t = make_shm(4);
  InferenceServer server(double_policy, t);
  server.start();
  std::vector<Peer> peers;
  for (int i = 0; i < 3; ++i) peers.push_back(Peer::spawn({"client", "shm", t->name(), "300"}));
  for (Peer& p : peers) {
    EXPECT_EQ(p.line(), "done 300");
    EXPECT_EQ(p.wait(), 0);
  }
  EXPECT_EQ(server.stats().requests, 900u);
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0; }));
}

TEST_F(ProcessTest, AClientKilledMidRequestDoesNotKeepItsSlot) {
  auto t = make_shm(1);
  InferenceServer server(
      [](const TensorDict& b) {
        std::this_thread::sleep_for(200ms);
        return double_policy(b);
      },
      t);
  server.start();
  Peer holder = Peer::spawn({"hold", t->name()});
  ASSERT_EQ(holder.line(), "submitted");
  EXPECT_EQ(t->slots_in_use(), 1u);
  holder.kill();
  EXPECT_EQ(holder.wait(), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0; }))
      << "the dead client's only slot was not reclaimed";
  EXPECT_EQ(action0(t->client()(observation(4), 5s)), 8);
}

TEST_F(ProcessTest, AClientKilledBeforeTheServerStartsDoesNotKeepItsSlot) {
  auto t = make_shm(1);
  Peer holder = Peer::spawn({"hold", t->name()});
  ASSERT_EQ(holder.line(), "submitted");
  holder.kill();
  holder.wait();
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0; }));
  InferenceServer server(double_policy, t);
  server.start();
  EXPECT_EQ(action0(t->client()(observation(4), 5s)), 8);
}

TEST_F(ForkedChildTest, AForkedClientKilledWithSigkillIsReclaimed) {
  auto t = make_shm(2);
  InferenceServer server(
      [](const TensorDict& b) {
        std::this_thread::sleep_for(100ms);
        return double_policy(b);
      },
      t);
  server.start();
  Client c = t->client();
  pid_t kid = fork_child([&] {
    Future a = c.submit(observation(1));
    Future b = c.submit(observation(2));
    ::pause();
    return 0;
  });
  ASSERT_TRUE(eventually([&] { return t->slots_in_use() == 2; }));
  ::kill(kid, SIGKILL);
  EXPECT_EQ(wait_child(kid), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0; }));
}

TEST_F(ProcessTest, AKilledServerIsDetectedWithinFiveSeconds) {
  const std::string name = os::unique_name("killed-server");
  Peer server = Peer::spawn({"serve", "shm", name, "1", "60000"});
  ASSERT_EQ(server.line(), "ready");
  Client c = SharedMemoryTransport::client_for(name);
  Future in_policy = c.submit(observation(1));  // the policy sleeps for a minute
  std::atomic<bool> raised{false};
  std::thread waiting_for_a_slot([&] {  // the only slot is taken: this one waits for it
    try {
      c.submit(observation(2));
    } catch (const ClosedError&) {
      raised = true;
    }
  });
  std::this_thread::sleep_for(100ms);
  server.kill();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    in_policy.result();
    ADD_FAILURE() << "a result from a dead server";
  } catch (const ClosedError& e) {
    EXPECT_NE(std::string(e.what()).find("exited"), std::string::npos) << e.what();
  }
  waiting_for_a_slot.join();
  EXPECT_TRUE(raised);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(server.wait(), 128 + SIGKILL);
  EXPECT_THROW(c(observation(3)), Error);  // reconnecting finds nobody
}

TEST_F(ProcessTest, SocketTransportServesOtherProcessesAndNoticesAKilledServer) {
  const std::string name = os::unique_name("socket-peer");
  Peer server = Peer::spawn({"serve", "socket", name, "0", "0"});
  ASSERT_EQ(server.line(), "ready");
  Peer client = Peer::spawn({"client", "socket", name, "200"});
  EXPECT_EQ(client.line(), "done 200");
  EXPECT_EQ(client.wait(), 0);
  server.kill();
  server.wait();
  // After the kill nothing listens: a fresh client fails to connect, quickly.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(SocketTransport::client_for(name)(observation(1)), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 6s);
}

TEST_F(ProcessTest, ASocketClientWaitingOnAKilledServerRaises) {
  const std::string name = os::unique_name("socket-killed");
  Peer server = Peer::spawn({"serve", "socket", name, "0", "60000"});
  ASSERT_EQ(server.line(), "ready");
  Client c = SocketTransport::client_for(name);
  Future f = c.submit(observation(1));
  std::this_thread::sleep_for(100ms);
  server.kill();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(f.result(), ClosedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  server.wait();
}

TEST_F(ForkedChildTest, SocketClientsInForkedChildren) {
  auto t = SocketTransport::create();
  InferenceServer server(double_policy, t);
  server.start();
  Client c = t->client();
  EXPECT_EQ(action0(c(observation(1), 5s)), 2);
  std::vector<pid_t> kids;
  for (int k = 0; k < 3; ++k)
    kids.push_back(fork_child([&, k] {
      for (int i = 0; i < 100; ++i) {
        float base = static_cast<float>(k * 100 + i);
        if (action0(c(observation(base), 5s)) != 2 * base) return 1;
      }
      return 0;
    }));
  for (pid_t p : kids) EXPECT_EQ(wait_child(p), 0);
}

// A client made by name before its server exists, forked while another thread of the
// parent waits for that server in the client's first call: the child's own call ends by its
// timeout (it hung for ever: the child inherited the client's lock, held by a thread it does
// not have), for both transports that attach by name.
TEST_F(ForkedChildTest, AForkWhileAnotherThreadAttachesLeavesTheChildsClientUsable) {
  for (const std::string kind : {"shm", "socket"}) {
    const std::string name = "tw-test-fork-attach-" + kind + "-" + std::to_string(::getpid());
    Client c =
        kind == "shm" ? SharedMemoryTransport::client_for(name) : SocketTransport::client_for(name);
    std::thread attaching([&] { EXPECT_THROW(c(observation(1), 2s), Error); });
    std::this_thread::sleep_for(200ms);  // that thread waits for the name to be served
    pid_t kid = fork_child([&] {
      ::alarm(20);  // a hang ends as SIGALRM
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c(observation(1), 1s);
        return 2;  // nothing serves the name
      } catch (const Error&) {
      }
      return std::chrono::steady_clock::now() - t0 < 5s ? 0 : 3;
    });
    EXPECT_EQ(wait_child(kid), 0) << kind;
    attaching.join();
  }
}

// Remote requests of the parent, in a forked child, while another thread of the parent
// keeps using the same client (it holds the connection's lock often): the child's result(),
// done() and the future's destruction end at once with ClosedError ("connected before a
// fork"), never on the lock the parent's thread held at the fork (the child hung for ever
// in some forks).
TEST_F(ForkedChildTest, RemoteFuturesInheritedByAForkedChildEndAtOnce) {
  auto t = RemoteTransport::create(request_spec(), response_spec(),
                                   {.num_slots = 8, .host = "127.0.0.1"});
  InferenceServer server(double_policy, t);
  server.start();
  Client c = RemoteTransport::connect("127.0.0.1", t->port());
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int b = 0; b < 2; ++b)
    busy.emplace_back([&] {
      while (!stop.load()) c(observation(1), 5s);
    });
  for (int k = 0; k < 200; ++k) {
    Future f = c.submit(observation(2));
    Future dropped = c.submit(observation(3));
    pid_t kid = fork_child([&] {
      ::alarm(10);  // a hang ends as SIGALRM
      { Future gone = std::move(dropped); }
      (void)f.done();
      try {
        f.result(1s);
        return 2;
      } catch (const ClosedError& e) {
        return std::string(e.what()).find("before a fork") != std::string::npos ? 0 : 3;
      }
    });
    ASSERT_EQ(wait_child(kid), 0) << "fork " << k;
    EXPECT_EQ(action0(f.result(5s)), 4);
    EXPECT_EQ(action0(dropped.result(5s)), 6);
  }
  stop = true;
  for (auto& b : busy) b.join();
}

// A Future of each transport, pending in the parent and inherited by a forked child: no
// thread of the child answers it. The thread transport's result() waited for ever there
// (with a timeout: a TimeoutError saying to call again); every transport's is a ClosedError
// naming the fork, at once, and the parent's request goes on.
TEST_F(ForkedChildTest, PendingFuturesOfEveryTransportInheritedByAForkedChildAreClosedErrors) {
  std::vector<std::shared_ptr<Transport>> transports = {
      ThreadTransport::create(), SocketTransport::create(), make_shm(4),
      RemoteTransport::create(request_spec(), response_spec(),
                              {.num_slots = 4, .host = "127.0.0.1"})};
  for (auto& t : transports) {
    Client c = t->client();
    Future f = c.submit(observation(2));  // no server yet: it stays pending
    // One a thread of the parent waits for at the fork: it holds the Future's lock, which
    // no thread of the child lets go of (its result() waited for it for ever).
    Future g = c.submit(observation(3));
    float waited = 0;
    std::thread waiter([&] { waited = action0(g.result(20s)); });
    std::this_thread::sleep_for(100ms);
    pid_t kid = fork_child([&] {
      ::alarm(10);  // a hang ends as SIGALRM
      for (Future* x : {&f, &g}) {
        (void)x->done();
        try {
          x->result();
          return 2;
        } catch (const ClosedError& e) {
          if (std::string(e.what()).find("before a fork") == std::string::npos) return 3;
        }
      }
      return 0;
    });
    EXPECT_EQ(wait_child(kid), 0) << t->kind();
    InferenceServer server(double_policy, t);
    server.start();
    EXPECT_EQ(action0(f.result(5s)), 4) << t->kind();
    waiter.join();
    EXPECT_EQ(waited, 6) << t->kind();
  }
}

// A forked child that drops its copy of a transport its parent serves: the parent's
// serving thread waited on the transport's condition variable at the fork, and the child
// hung for ever destroying it (thread, socket, remote). The child's copy is left alone
// (leaked); serving an inherited RemoteTransport or SharedMemoryTransport in the child is a
// ClosedError naming the fork, and the parent goes on serving.
TEST_F(ForkedChildTest, AForkedChildDropsTheTransportsItsParentServes) {
  std::vector<std::shared_ptr<Transport>> transports = {
      ThreadTransport::create(), SocketTransport::create(), make_shm(4),
      RemoteTransport::create(request_spec(), response_spec(),
                              {.num_slots = 4, .host = "127.0.0.1"})};
  std::vector<std::unique_ptr<InferenceServer>> servers;
  for (auto& t : transports) {
    servers.push_back(std::make_unique<InferenceServer>(double_policy, t));
    servers.back()->start();
    EXPECT_EQ(action0(t->client()(observation(1), 5s)), 2);  // its serving thread now waits
  }
  Client held = transports.back()->client();  // a connection the parent counts
  EXPECT_EQ(action0(held(observation(1), 5s)), 2);
  EXPECT_GE(static_cast<RemoteTransport*>(transports.back().get())->connected(), 1u);
  pid_t kid = fork_child([&] {
    ::alarm(10);  // a hang ends as SIGALRM
    auto remote = transports.back();
    // The parent's counters sit under a lock a thread of the parent may have held at the
    // fork: the child reads none (its own connections are none).
    auto* r = static_cast<RemoteTransport*>(remote.get());
    if (r->connected() != 0 || r->slots_in_use() != 0 || r->refused() != 0 ||
        !r->last_refusal().empty())
      return 4;
    for (const auto& inherited : {transports[2], remote}) {  // shared memory, remote
      InferenceServer again(double_policy, inherited);
      try {
        again.start();
        return 2;
      } catch (const ClosedError& e) {
        if (std::string(e.what()).find("made before a fork") == std::string::npos) return 3;
      }
    }
    servers.clear();
    remote.reset();
    transports.clear();
    return 0;
  });
  EXPECT_EQ(wait_child(kid), 0);
  for (auto& t : transports) EXPECT_EQ(action0(t->client()(observation(2), 5s)), 4) << t->kind();
}

TEST_F(ProcessTest, FileDescriptorsAreNotLeaked) {
  const int before = open_fds();
  {
    auto t = make_shm(2);
    InferenceServer server(double_policy, t);
    server.start();
    auto attached = SharedMemoryTransport::attach(t->name());
    attached->client()(observation(1), 5s);
    t->client()(observation(1), 5s);
  }
  EXPECT_EQ(open_fds(), before);
}

}  // namespace
}  // namespace tw_test
