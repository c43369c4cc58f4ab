// RemoteTransport specifics on loopback: the listening address, authentication, refusal of
// bad frames and of clients built for another spec, clients that go away, a server that
// goes away. The shared behaviour runs in test_transport_suite.cpp ("remote"); links cut
// between two hosts are tested in tests/python/test_remote_inference.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "common.h"
#include "inference/multi_transport.h"
#include "inference/remote_server.h"
#include "ucx/control.h"
#include "wire/control_frame.h"
#include "wire/handshake.h"
#include "wire/remote_frames.h"

namespace tw_test {
namespace {

namespace remote = wire::remote;

std::shared_ptr<RemoteTransport> make_remote(uint32_t slots, std::string key = "") {
  return RemoteTransport::create(request_spec(), response_spec(),
                                 {.num_slots = slots, .host = "127.0.0.1", .auth_key = key});
}

Client connect_to(const RemoteTransport& t, std::string key = "") {
  return RemoteTransport::connect("127.0.0.1", t.port(), {.auth_key = key});
}

template <class Pred>
bool eventually(Pred&& p, std::chrono::milliseconds limit = 5000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (p()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return p();
}

// double_policy, recording each batch's size; the first call waits `first_call` (requests
// queue up meanwhile).
struct BatchRecorder {
  std::chrono::milliseconds first_call{0};
  std::mutex mu;
  std::vector<int64_t> sizes;
  Policy policy() {
    return [this](const TensorDict& b) {
      std::lock_guard<std::mutex> lock(mu);
      if (sizes.empty()) std::this_thread::sleep_for(first_call);
      sizes.push_back(b.batch_size()[0]);
      return double_policy(b);
    };
  }
  std::vector<int64_t> seen() {
    std::lock_guard<std::mutex> lock(mu);
    return sizes;
  }
};

// A hand-made client: the real handshake, then whatever bytes a test sends.
struct RawClient {
  ucx::Worker worker;
  std::unique_ptr<ucx::Endpoint> ep;
  RawClient(uint16_t port) {
    ep = std::make_unique<ucx::Endpoint>(worker, "127.0.0.1", port);
    const Deadline d = Deadline::after(5s);
    const uint64_t ctl = remote::tag(remote::Kind::Control);
    ucx::wait_wired_up(worker, *ep, d, "test");
    auto send = [&](const Json& j) { ucx::send_control(worker, *ep, ctl, j, d); };
    auto recv = [&] { return ucx::recv_control(worker, *ep, ctl, {}, d, "test"); };
    wire::handshake_as_client(inference::detail::remote_handshake_config("", 0ms), send, recv);
    recv();  // num_slots
  }
  void send(uint64_t tag, std::span<const std::byte> bytes) {
    ucx::Request r = ep->send(tag, bytes);
    const auto until = std::chrono::steady_clock::now() + 2s;
    while (!r.done() && std::chrono::steady_clock::now() < until) worker.progress();
  }
  // The server's {"error": ...} once it closed the connection, or "" after `limit`.
  std::string error(std::chrono::milliseconds limit = 5000ms) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      worker.progress();
      if (auto j = ucx::take_control(worker, *ep, remote::tag(remote::Kind::Control),
                                     ucx::kMaxControlFrame, {}, "test", Deadline::after(2s)))
        return j->dump();
    }
    return "";
  }
};

TEST(RemoteTransport, PortZeroPicksAFreePortAndReportsIt) {
  auto t = make_remote(4);
  EXPECT_GT(t->port(), 0);
  EXPECT_EQ(t->kind(), std::string("remote"));
  EXPECT_EQ(t->request_keys(), (std::vector<Key>{Key("observation")}));
  auto taken = [&] {
    RemoteTransport::create(request_spec(), response_spec(),
                            {.num_slots = 1, .host = "127.0.0.1", .port = t->port()});
  };
  EXPECT_THROW(taken(), SystemError);
}

TEST(RemoteTransport, SpecsAreValidatedAsForSharedMemory) {
  TensorDict spec = request_spec();
  spec.set("name", NonTensor{"cartpole"});
  EXPECT_THROW(RemoteTransport::create(spec, response_spec(), {.num_slots = 2}), TypeError);
  EXPECT_THROW(RemoteTransport::create(request_spec(), TensorDict(), {.num_slots = 2}), ValueError);
  EXPECT_THROW(RemoteTransport::create(request_spec(), response_spec(), {.num_slots = 0}),
               ValueError);
}

// Banks beyond the address space (a spec of 2^58 floats viewed from one, stride 0: 2^61
// bytes, which no overcommit setting maps) are a tensorwire error naming the sizes:
// std::bad_alloc escaped, which no catch of tensorwire::Error sees.
TEST(RemoteTransport, BanksThatDoNotFitInMemoryAreASystemErrorNamingThem) {
  const Tensor one = Tensor::zeros({1}, DType::Float32);
  TensorDict huge;
  huge.set("obs", Tensor::view(one.storage(), 0, {int64_t(1) << 58}, DType::Float32, {0}));
  try {
    RemoteTransport::create(huge, response_spec(), {.num_slots = 2, .host = "127.0.0.1"});
    ADD_FAILURE() << "no error";
  } catch (const SystemError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("banks of 2 slots"), std::string::npos) << what;
    EXPECT_NE(what.find("do not fit in memory"), std::string::npos) << what;
  }
}

TEST(RemoteTransport, ABadAddressIsAValueError) {
  EXPECT_THROW(RemoteTransport::client_for("nohost"), ValueError);
  EXPECT_THROW(RemoteTransport::client_for("host:99999"), ValueError);
  EXPECT_THROW(RemoteTransport::client_for("host:x1"), ValueError);
}

TEST(RemoteTransport, ConnectingWhereNothingListensIsARefusalNamingTheAddress) {
  uint16_t port;
  {
    auto t = make_remote(1);
    port = t->port();
  }
  try {
    RemoteTransport::connect("127.0.0.1", port);
    FAIL() << "connected to a closed port";
  } catch (const ConnectionRefused& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port) +
                                         " (is a RemoteTransport listening there?)"),
              std::string::npos)
        << e.what();
  }
}

// A negative bound turned liveness checks off, and a handshake bound of -1 ms (or 0) refused
// every client with "Endpoint timeout", the ValueError only in last_refusal().
TEST(RemoteTransport, NegativeDurationsInItsOptionsAreValueErrorsNamingThem) {
  auto make = [](RemoteOptions o) {
    o.num_slots = 1;
    o.host = "127.0.0.1";
    return RemoteTransport::create(request_spec(), response_spec(), std::move(o));
  };
  auto names = [](auto&& call, const std::string& name) {
    try {
      call();
      ADD_FAILURE() << name << " accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  names([&] { make({.liveness_timeout = -1ms}); }, "liveness_timeout must be >= 0, got -1 ms");
  names([&] { make({.handshake_timeout = -1ms}); }, "handshake_timeout must be > 0");
  names([&] { make({.handshake_timeout = 0ms}); }, "handshake_timeout must be > 0");
  names([&] { RemoteTransport::client_for("127.0.0.1:1", {.liveness_timeout = -5ms}); },
        "liveness_timeout must be >= 0");
  // connect_timeout is a Timeout, which refuses a negative duration where it is made.
  names([&] { RemoteTransport::client_for("127.0.0.1:1", {.connect_timeout = -1ms}); },
        "timeout must be >= 0");
}

TEST(RemoteTransport, RequestsAreCheckedAgainstTheServersSpecBeforeSending) {
  auto t = make_remote(4);
  InferenceServer server(double_policy, t);
  server.start();
  Client c = connect_to(*t);
  EXPECT_EQ(c.request_keys(), (std::vector<Key>{Key("observation")}));
  auto leaves = c.request_leaves();
  ASSERT_TRUE(leaves.has_value());
  ASSERT_EQ(leaves->size(), 1u);
  EXPECT_EQ((*leaves)[0].dtype, DType::Float32);
  EXPECT_EQ((*leaves)[0].shape, (Shape{4}));
  TensorDict wrong_key;
  wrong_key.set("obs", Tensor::zeros({4}, DType::Float32));
  EXPECT_THROW(c(wrong_key, 5s), KeyError);
  TensorDict wrong_shape;
  wrong_shape.set("observation", Tensor::zeros({5}, DType::Float32));
  try {
    c(wrong_shape, 5s);
    ADD_FAILURE();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("expected float32[4], got float32[5]"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(action0(c(observation(2), 5s)), 4);
}

TEST(RemoteTransport, AWrongKeyIsRefusedOnBothSides) {
  auto t = make_remote(4, "right key");
  InferenceServer server(double_policy, t);
  server.start();
  EXPECT_THROW(connect_to(*t, "wrong key"), wire::HandshakeError);
  EXPECT_THROW(connect_to(*t), wire::HandshakeError);
  EXPECT_TRUE(eventually([&] { return t->refused() == 2; }));
  EXPECT_NE(t->last_refusal().find("refused"), std::string::npos) << t->last_refusal();
  EXPECT_EQ(action0(connect_to(*t, "right key")(observation(1), 5s)), 2);
}

TEST(RemoteTransport, AFrameOfTheWrongSizeIsRefusedAndNoSlotIsWritten) {
  auto t = make_remote(4);
  InferenceServer server(double_policy, t);
  server.start();
  Client good = connect_to(*t);
  EXPECT_EQ(action0(good(observation(1), 5s)), 2);
  RawClient evil(t->port());
  std::vector<std::byte> bytes(17, std::byte{0x7f});  // float32[4] takes 16
  evil.send(remote::tag(remote::Kind::Request, 1), bytes);
  const std::string err = evil.error();
  EXPECT_NE(err.find("request of 17 bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("exactly 16 bytes"), std::string::npos) << err;
  EXPECT_TRUE(eventually([&] { return t->refused() == 1 && t->slots_in_use() == 0; }));
  EXPECT_EQ(action0(good(observation(3), 5s)), 6);
}

TEST(RemoteTransport, AMalformedControlFrameEndsOnlyThatConnection) {
  auto t = make_remote(4);
  InferenceServer server(double_policy, t);
  server.start();
  Client good = connect_to(*t);
  RawClient evil(t->port());
  std::vector<std::byte> junk(100, std::byte{0x42});
  evil.send(remote::tag(remote::Kind::Heartbeat), junk);
  EXPECT_NE(evil.error().find("error"), std::string::npos);
  EXPECT_TRUE(eventually([&] { return t->refused() == 1; }));
  EXPECT_EQ(action0(good(observation(4), 5s)), 8);
}

// Messages of a kind the server never reads (here a spec, which only a server sends, and a
// kind that does not exist) would stay in UCX's queue for ever: the connection ends at the
// first one, the others are served.
TEST(RemoteTransport, MessagesOfAKindTheServerNeverReadsEndOnlyThatConnection) {
  auto t = make_remote(4);
  InferenceServer server(double_policy, t);
  server.start();
  Client good = connect_to(*t);
  for (uint64_t tag : {remote::tag(remote::Kind::Spec), uint64_t{0x63}}) {
    RawClient evil(t->port());
    std::vector<std::byte> junk(100, std::byte{0x42});
    try {
      for (int i = 0; i < 100; ++i) evil.send(tag, junk);
    } catch (const Error&) {  // the server ended the connection under the flood
    }
    const std::string err = evil.error();
    EXPECT_NE(err.find("tag " + std::to_string(tag)), std::string::npos) << err;
  }
  EXPECT_TRUE(eventually([&] { return t->refused() == 2; }));
  EXPECT_EQ(action0(good(observation(4), 5s)), 8);
}

// A client that starts a control frame larger than any before its handshake (1 MiB: a
// rendezvous, whose data comes only as the client progresses) and then stops: a hostile
// client, a SIGSTOP, a link cut. The server refuses it without allocating what the frame
// announces, serves the others, and closes promptly (its connection thread waited for the
// rest for ever, and the transport's destructor for that thread).
TEST(RemoteTransport, AClientThatStopsInTheMiddleOfAnOversizedFrameHoldsNothing) {
  ::setenv("UCX_TLS", "tcp", 1);  // over TCP the rendezvous needs the sender
  auto t = make_remote(4);
  ucx::Worker worker;
  ucx::Endpoint ep(worker, "127.0.0.1", t->port());
  std::atomic<bool> closed{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 300 && !closed.load(); ++i) std::this_thread::sleep_for(100ms);
    if (closed.load()) return;
    std::fprintf(stderr, "the transport still waits for the rest of the frame\n");
    std::_Exit(1);  // nothing can be joined
  });
  {
    InferenceServer server(double_policy, t);
    server.start();
    ucx::wait_wired_up(worker, ep, Deadline::after(5s), "test");
    // The server's hello: its side of the connection is wired up too. A client that stops
    // before that leaves the server waiting for its wire-up, which ends at handshake_timeout
    // as a client gone, not as the refusal this test is about.
    ucx::recv_control(worker, ep, remote::tag(remote::Kind::Control), {}, Deadline::after(5s),
                      "test");
    std::vector<std::byte> frame(1 << 20);
    // Posting it sends the rendezvous' announcement; from here on the client does nothing.
    ucx::Request sent = ep.send(remote::tag(remote::Kind::Control), frame);
    EXPECT_TRUE(eventually([&] { return t->refused() == 1; }));
    EXPECT_NE(t->last_refusal().find("1048576 bytes"), std::string::npos) << t->last_refusal();
    EXPECT_EQ(action0(connect_to(*t)(observation(2), 5s)), 4);
    const auto start = std::chrono::steady_clock::now();
    server.shutdown(Timeout(5s));
    t.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
    sent.cancel(worker.handle());
  }
  closed = true;
  watchdog.join();
}

// A client that connects, takes the server's hello and then says nothing (a SIGSTOP, a
// hostile client): its connection's thread waits in the handshake.
struct StalledClient {
  ucx::Worker worker;
  ucx::Endpoint ep;
  explicit StalledClient(uint16_t port) : ep(worker, "127.0.0.1", port) {
    ucx::wait_wired_up(worker, ep, Deadline::after(5s), "test");
    ucx::recv_control(worker, ep, remote::tag(remote::Kind::Control), {}, Deadline::after(5s),
                      "test");
  }
};

// Counted as a refusal, as the pipe's listener counts a client that stalls in its handshake.
TEST(RemoteTransport, AClientStalledInItsHandshakeIsRefusedAtTheHandshakeTimeout) {
  auto t =
      RemoteTransport::create(request_spec(), response_spec(),
                              {.num_slots = 2, .host = "127.0.0.1", .handshake_timeout = 300ms});
  InferenceServer server(double_policy, t);
  server.start();
  StalledClient stalled(t->port());
  EXPECT_TRUE(eventually([&] { return t->refused() == 1; }));
  EXPECT_NE(t->last_refusal().find("timed out"), std::string::npos) << t->last_refusal();
  EXPECT_EQ(action0(connect_to(*t)(observation(2), 5s)), 4);
}

// Closing the transport ends a handshake in progress at once, not at its timeout.
TEST(RemoteTransport, ClosingDuringAStalledHandshakeIsPrompt) {
  auto t = RemoteTransport::create(request_spec(), response_spec(),
                                   {.num_slots = 2, .host = "127.0.0.1", .handshake_timeout = 60s});
  StalledClient stalled(t->port());
  std::this_thread::sleep_for(100ms);  // its connection's thread waits for the client's hello
  const auto start = std::chrono::steady_clock::now();
  t.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(RemoteTransport, AClientGoneMidRequestGivesItsSlotsBack) {
  auto t = make_remote(2);
  std::atomic<bool> hold{true};
  InferenceServer server(
      [&](const TensorDict& b) {
        while (hold) std::this_thread::sleep_for(1ms);
        return double_policy(b);
      },
      t, {.max_batch_size = 1});
  server.start();
  {
    Client leaving = connect_to(*t);
    Future a = leaving.submit(observation(1));
    Future b = leaving.submit(observation(2));
    ASSERT_TRUE(eventually([&] { return t->slots_in_use() == 2; }));
    leaving.close();
  }
  hold = false;
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0 && t->connected() == 0; }));
  Client other = connect_to(*t);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(action0(other(observation(float(i)), 5s)), 2.0f * i);
}

// More clients than slots: a freed slot goes to the connection that has waited longest for
// one, not to whichever connection's thread runs first. Before, with 12 clients on 2 slots,
// some clients got a handful of answers while others got hundreds.
TEST(RemoteTransport, MoreClientsThanSlotsAreServedInTurn) {
  auto t = make_remote(2);
  InferenceServer server(
      [](const TensorDict& b) {
        std::this_thread::sleep_for(1ms);
        return double_policy(b);
      },
      t, {.max_batch_size = 8});
  server.start();
  constexpr int kClients = 12;
  constexpr int kTotal = 720;
  std::atomic<int> total{0};
  std::vector<int> served(kClients, 0);
  std::vector<std::thread> clients;
  for (int k = 0; k < kClients; ++k)
    clients.emplace_back([&, k] {
      Client c = connect_to(*t);
      while (total.load() < kTotal) {
        EXPECT_EQ(action0(c(observation(float(k)), 10s)), 2.0f * k);
        ++served[k];
        ++total;
      }
    });
  for (auto& c : clients) c.join();
  const auto [least, most] = std::minmax_element(served.begin(), served.end());
  EXPECT_GE(*least * 4, kTotal / kClients) << "least " << *least << ", most " << *most;
}

// A small batch's answers are sent by the serving thread itself, a large one's handed to
// the connections' threads (remote_server.h, kAnswersSentByTheServer): both kinds of
// batches, every answer right, every slot given back exactly once (a slot freed twice
// shows as a count below zero, i.e. huge).
TEST(RemoteTransport, AnswersSentByTheServingThreadOrHandedOverEachGiveTheirSlotBackOnce) {
  auto t = make_remote(16);
  BatchRecorder batches{.first_call = 50ms};
  InferenceServer server(batches.policy(), t, {.max_batch_size = 16});
  server.start();
  std::vector<std::thread> clients;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&, c] {
      Client client = connect_to(*t);
      for (int round = 0; round < 40; ++round) {
        std::vector<Future> fs;
        const int burst = 1 + (round + c) % 4;
        for (int i = 0; i < burst; ++i)
          fs.push_back(client.submit(observation(float(c * 100 + i))));
        for (int i = 0; i < burst; ++i)
          if (action0(fs[i].result(5s)) != 2.0f * float(c * 100 + i)) ++wrong;
      }
    });
  for (auto& th : clients) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0; })) << t->slots_in_use();
  const std::vector<int64_t> sizes = batches.seen();
  EXPECT_TRUE(std::any_of(sizes.begin(), sizes.end(), [](int64_t n) { return n <= 4; }));
  EXPECT_TRUE(std::any_of(sizes.begin(), sizes.end(), [](int64_t n) { return n > 4; }));
}

TEST(RemoteTransport, ClientsRaiseClosedErrorPromptlyWhenTheServerGoes) {
  auto t = make_remote(4);
  auto server = std::make_unique<InferenceServer>(double_policy, t);
  server->start();
  Client c = connect_to(*t);
  EXPECT_EQ(action0(c(observation(1), 5s)), 2);
  server.reset();
  t.reset();  // the transport's process side goes: its connections close
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(c(observation(1), 10s), ClosedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

// close() ends the transport's connections and frees its port at once, not when its last
// reference goes (it kept listening, accepting clients, until then).
TEST(RemoteTransport, CloseFreesThePortAndTellsTheClientsAtOnce) {
  auto t = make_remote(4);
  InferenceServer server(double_policy, t);
  server.start();
  Client c = connect_to(*t);
  EXPECT_EQ(action0(c(observation(1), 5s)), 2);
  t->close();
  EXPECT_EQ(t->connected(), 0u);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(c(observation(1), 10s), ClosedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  auto again = RemoteTransport::create(request_spec(), response_spec(),
                                       {.num_slots = 2, .host = "127.0.0.1", .port = t->port()});
  EXPECT_EQ(again->port(), t->port());
}

TEST(RemoteTransport, NothingListeningIsAClosedError) {
  uint16_t port;
  {
    auto t = make_remote(1);
    port = t->port();
  }
  EXPECT_THROW(RemoteTransport::connect("127.0.0.1", port, {.connect_timeout = 3s}), ClosedError);
}

TEST(RemoteTransport, ANewClientConnectsWhenAServerListensAgainAtTheAddress) {
  uint16_t port;
  {
    auto t = make_remote(2);
    port = t->port();
    InferenceServer s(double_policy, t);
    s.start();
    EXPECT_EQ(action0(connect_to(*t)(observation(1), 5s)), 2);
  }
  auto again = RemoteTransport::create(request_spec(), response_spec(),
                                       {.num_slots = 2, .host = "127.0.0.1", .port = port});
  InferenceServer s(double_policy, again);
  s.start();
  Client c = RemoteTransport::client_for("127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(action0(c(observation(5), 5s)), 10);
}

TEST(SeveralTransports, LocalAndRemoteRequestsShareOnePolicyCall) {
  auto shm = make_shm(8);
  auto remote = make_remote(8);
  BatchRecorder batches;
  InferenceServer server(batches.policy(), std::vector<std::shared_ptr<Transport>>{shm, remote},
                         {.max_batch_size = 8});
  Client local = shm->client(), far = connect_to(*remote);
  std::vector<Future> futures;
  for (int i = 0; i < 4; ++i) {
    futures.push_back(local.submit(observation(float(i))));
    futures.push_back(far.submit(observation(float(100 + i))));
  }
  ASSERT_TRUE(eventually([&] { return remote->slots_in_use() == 4; }));
  server.start();  // all eight are waiting: one batch, one call
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(action0(futures[2 * i].result(5s)), 2.0f * i);
    EXPECT_EQ(action0(futures[2 * i + 1].result(5s)), 2.0f * (100 + i));
  }
  EXPECT_EQ(batches.seen(), (std::vector<int64_t>{8}));
}

TEST(SeveralTransports, NeitherSideStarvesWhenBothAreBusy) {
  auto shm = make_shm(16);
  auto remote = make_remote(16);
  InferenceServer server(double_policy, std::vector<std::shared_ptr<Transport>>{shm, remote},
                         {.max_batch_size = 4});
  server.start();
  std::atomic<int> local_done{0}, remote_done{0};
  std::atomic<bool> stop{false};
  auto actor = [&](Client c, std::atomic<int>& done) {
    while (!stop) {
      c(observation(1), 5s);
      ++done;
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back(actor, shm->client(), std::ref(local_done));
    threads.emplace_back(actor, connect_to(*remote), std::ref(remote_done));
  }
  std::this_thread::sleep_for(1s);
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_GT(local_done, 0);
  EXPECT_GT(remote_done, 0);
}

// min_transport_share: a remote actor that pauses a millisecond between requests (all the
// server sees is a transport whose requests come slower) keeps its share against a local
// actor calling as fast as it can, which is held back to about 0.7 / 0.3 requests for each
// of the remote one's. Counted once both sides have made a few requests (the server learns
// the remote pace from them); the bound leaves room for waits that end at their bound on a
// loaded machine (each lets one local request through). Without a share the local actor
// takes thousands in that time.
TEST(SeveralTransports, AMinimumShareHoldsTheFasterTransportBack) {
  auto shm = make_shm(8);
  auto remote = make_remote(8);
  InferenceServer server(double_policy, std::vector<std::shared_ptr<Transport>>{shm, remote},
                         {.max_batch_size = 8, .min_transport_share = 0.3});
  server.start();
  Client far = connect_to(*remote);
  std::atomic<bool> stop{false};
  std::atomic<int> local{0};
  std::thread fast([&, c = shm->client()]() mutable {
    while (!stop) {
      EXPECT_EQ(action0(c(observation(1), 5s)), 2);
      ++local;
    }
  });
  auto ask_far = [&](int n) {
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(action0(far(observation(float(i)), 5s)), 2.0f * i);
      std::this_thread::sleep_for(1ms);
    }
  };
  ask_far(10);
  local = 0;
  constexpr int kFar = 100;
  ask_far(kFar);
  stop = true;
  fast.join();
  EXPECT_GT(local, 0);
  EXPECT_LT(local, 8 * kFar);
}

// A batch that waits for min_batch_size drains again for what is missing: requests that
// come later, from the other transport, complete it (a second drain took nothing, and the
// batch left short at its timeout, when the total was counted against what was missing).
TEST(SeveralTransports, ABatchWaitingForMinBatchSizeTakesWhatComesLaterFromAnyTransport) {
  auto shm = make_shm(8);
  auto remote = make_remote(8);
  BatchRecorder batches;
  InferenceServer server(batches.policy(), std::vector<std::shared_ptr<Transport>>{shm, remote},
                         {.max_batch_size = 4, .min_batch_size = 4, .timeout = 20s});
  server.start();
  Client local = shm->client(), far = connect_to(*remote);
  std::vector<Future> futures;
  for (int i = 0; i < 2; ++i) futures.push_back(local.submit(observation(float(i))));
  std::this_thread::sleep_for(100ms);  // the server has drained these two and waits
  for (int i = 2; i < 4; ++i) futures.push_back(far.submit(observation(float(i))));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(action0(futures[i].result(10s)), 2.0f * i);
  EXPECT_EQ(batches.seen(), (std::vector<int64_t>{4}));
}

// A batch waiting for a transport below its share (min_transport_share) ends its wait at
// shutdown: the remote actor asks every 0.8 s, so each wait may last up to 3.2 s (4 of its
// intervals), and shutdown() comes in the middle of one.
TEST(SeveralTransports, ShutdownEndsAWaitForATransportBelowItsShare) {
  auto shm = make_shm(8);
  auto remote = make_remote(8);
  InferenceServer server(double_policy, std::vector<std::shared_ptr<Transport>>{shm, remote},
                         {.max_batch_size = 8, .timeout = 30s, .min_transport_share = 0.5});
  server.start();
  Client far = connect_to(*remote);
  std::atomic<bool> stop{false};
  std::thread fast([&, c = shm->client()]() mutable {
    while (!stop) {
      try {
        c(observation(1), 10s);
      } catch (const ClosedError&) {
        return;  // the server shut down
      }
    }
  });
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(action0(far(observation(float(i)), 10s)), 2.0f * i);
    std::this_thread::sleep_for(800ms);
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(server.shutdown(10s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  stop = true;
  fast.join();
}

// One server over shared memory and a remote transport, kept busy by a local actor calling
// in a loop, so that its serving thread drains all the time.
struct BusyMixedServer {
  std::shared_ptr<SharedMemoryTransport> shm = make_shm(8);
  std::shared_ptr<RemoteTransport> remote = make_remote(8);
  InferenceServer server{
      double_policy, std::vector<std::shared_ptr<Transport>>{shm, remote}, {.max_batch_size = 8}};
  std::atomic<bool> stop{false};
  std::thread local;
  BusyMixedServer() {
    server.start();
    local = std::thread([this, c = shm->client()]() mutable {
      while (!stop) c(observation(1), 5s);
    });
  }
  ~BusyMixedServer() {
    stop = true;
    local.join();
  }
  uint64_t taken_in() const { return detail::RemoteAccess::taken_in(*remote); }
};

// A busy server (local actors keep its serving thread draining) takes in a remote request
// itself when that connection's thread has not run for a while (remote_server.h,
// kTurnOverdue): each such request is answered once and right, its slot given back, and the
// connection's thread goes on with the client. The remote clients pause between requests,
// so their threads sleep and are overdue when a request comes.
TEST(SeveralTransports, RequestsTheServingThreadTakesInAreAnsweredOnceAndRight) {
  BusyMixedServer busy;
  RemoteTransport& remote = *busy.remote;
  std::atomic<int> wrong{0}, answered{0};
  std::vector<std::thread> clients;
  for (int k = 0; k < 2; ++k)
    clients.emplace_back([&, k] {
      Client c = connect_to(remote);
      const auto until = std::chrono::steady_clock::now() + 20s;
      for (int i = 0; i < 3000 && std::chrono::steady_clock::now() < until; ++i) {
        const float x = float(k * 10000 + i);
        if (action0(c(observation(x), 5s)) != 2 * x) ++wrong;
        ++answered;
        if (i >= 200 && busy.taken_in() > 0) break;
        std::this_thread::sleep_for(200us);
      }
    });
  for (auto& th : clients) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GE(answered.load(), 400);
  EXPECT_GT(busy.taken_in(), 0u);
  EXPECT_TRUE(eventually([&] { return remote.slots_in_use() == 0; })) << remote.slots_in_use();
}

// A malformed frame is refused with the same error whichever thread takes it in: here the
// busy serving thread (retried with new connections until it is the one), and no slot is
// written or kept.
TEST(SeveralTransports, AFrameOfTheWrongSizeTakenInByTheServingThreadEndsItsConnection) {
  BusyMixedServer busy;
  RemoteTransport& remote = *busy.remote;
  bool by_server = false;
  for (int attempt = 0; attempt < 50 && !by_server; ++attempt) {
    RawClient evil(remote.port());
    std::this_thread::sleep_for(2ms);  // its connection's thread goes to sleep
    const uint64_t before = busy.taken_in();
    std::vector<std::byte> bytes(17, std::byte{0x7f});
    evil.send(remote::tag(remote::Kind::Request, 1), bytes);
    const std::string err = evil.error();
    EXPECT_NE(err.find("request of 17 bytes"), std::string::npos) << err;
    by_server = busy.taken_in() > before;
  }
  EXPECT_TRUE(by_server) << "the serving thread never took a frame in";
  EXPECT_TRUE(eventually([&] { return remote.slots_in_use() == 0 && remote.connected() == 0; }));
  Client good = connect_to(remote);
  EXPECT_EQ(action0(good(observation(3), 5s)), 6);
}

// A server of shared memory and remote transports sleeps on the shared-memory one (its clients
// ring its doorbell from other processes); a remote request wakes it. Before, the server
// slept on one transport at a time, in 500 us slices, and a request on the other waited
// out the slice: a lone local actor's round trip took 550 us instead of 35.
TEST(SeveralTransports, ARemoteRequestWakesAServerAsleepOnSharedMemory) {
  auto shm = make_shm(4);
  auto remote = make_remote(16);  // a slot for each request below, none ever waits for one
  detail::MultiTransport multi({shm, remote});
  multi.open_server();
  std::atomic<int> wakes{0};
  std::atomic<bool> done{false};
  std::thread sleeper([&] {  // the server's sleep between batches, 30 s at a time
    while (!done) {
      shm->wait_for_work(Deadline::after(30s));
      ++wakes;
    }
  });
  Client far = connect_to(*remote);
  std::vector<Future> futures;
  bool woken = false;
  // A request made before the sleeper sleeps cannot wake it: the next one does.
  for (int i = 0; i < 10 && !woken; ++i) {
    const int before = wakes;
    futures.push_back(far.submit(observation(float(i))));
    woken = eventually([&] { return wakes > before; }, 1000ms);
  }
  EXPECT_TRUE(woken);
  EXPECT_TRUE(multi.has_work());
  Drained d;
  multi.drain(64, d);
  EXPECT_EQ(d.size(), futures.size());
  std::vector<Group> groups;
  multi.collate(d, groups);
  ASSERT_EQ(groups.size(), 1u);
  multi.resolve(d, groups[0], double_policy(*groups[0].input), version_stamp());
  for (size_t i = 0; i < futures.size(); ++i)
    EXPECT_EQ(action0(futures[i].result(5s)), 2.0f * static_cast<float>(i));
  done = true;
  shm->interrupt();
  sleeper.join();
  multi.close_server("the test is over", true);
}

TEST(SeveralTransports, NoTransportOrOneGivenTwiceIsAValueError) {
  auto shm = make_shm(2);
  EXPECT_THROW(InferenceServer(double_policy, std::vector<std::shared_ptr<Transport>>{}),
               ValueError);
  EXPECT_THROW(InferenceServer(double_policy, std::vector<std::shared_ptr<Transport>>{shm, shm}),
               ValueError);
}

}  // namespace
}  // namespace tw_test

namespace tensorwire::inference {
namespace {

// A failure frame fits one control frame whatever the message (every byte a control
// character JSON escapes 6-fold, a multi-byte character at the cut) and parses back cut at a
// character boundary, saying how much was cut; a short one goes as it is.
TEST(RemoteFrames, AFailureOfAnySizeFitsOneControlFrameCutAtACharacter) {
  namespace remote = wire::remote;
  const std::string worst(100'000, '\x01');
  const auto frame =
      wire::control_frame(remote::failure_json({std::string(5'000, '\x02'), worst, false}));
  EXPECT_LE(frame.size(), ucx::kMaxControlFrame);
  const std::string accents = std::string(8 * 1024 - 1, 'x') + "\xc3\xa9\xc3\xa9";  // é at the cut
  const remote::Failure back = remote::parse_failure(wire::parse_control_frame(
      wire::control_frame(remote::failure_json({"ValueError", accents, false})), wire::Limits{},
      "failure"));
  EXPECT_EQ(back.message, std::string(8 * 1024 - 1, 'x') + "... (4 bytes cut)");
  const remote::Failure small =
      remote::parse_failure(remote::failure_json({"KeyError", "'obs'", true}));
  EXPECT_EQ(small.type, "KeyError");
  EXPECT_EQ(small.message, "'obs'");
  EXPECT_TRUE(small.closed);
}

}  // namespace
}  // namespace tensorwire::inference
