// The behaviour every transport shares, run against each of them: shared memory, socket,
// thread and remote (UCX on loopback). Clients here are threads of the test process;
// test_processes.cpp has the cross-process cases.
#include <pthread.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <stdexcept>

#include "common.h"
#include "tensorwire/runtime/interrupt.h"

namespace tw_test {
namespace {

// A gate the policy can wait at, opened by the test.
class Gate {
 public:
  void open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void pass() {
    std::unique_lock<std::mutex> l(mu_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(l, [&] { return open_; });
  }
  bool arrived(int n, std::chrono::milliseconds limit = 5000ms) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, limit, [&] { return arrived_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int arrived_ = 0;
};

// double_policy, each batch first passing `gate`.
Policy gated(Gate& gate) {
  return [&gate](const TensorDict& b) {
    gate.pass();
    return double_policy(b);
  };
}

std::shared_ptr<Transport> make_transport(const std::string& kind, uint32_t slots = 64) {
  if (kind == "shared_memory") return make_shm(slots);
  if (kind == "socket") return SocketTransport::create();
  if (kind == "remote")
    return RemoteTransport::create(request_spec(), response_spec(),
                                   {.num_slots = slots, .host = "127.0.0.1"});
  return ThreadTransport::create();
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<Transport> transport = make_transport(GetParam());
};

TEST_P(TransportTest, RoundTripReturnsThePolicyResult) {
  InferenceServer server(double_policy, transport);
  server.start();
  Client c = transport->client();
  TensorDict r = c(observation(3));
  EXPECT_EQ(r.get("action").shape(), (Shape{2}));
  EXPECT_FLOAT_EQ(r.get("action").data<float>()[0], 6);
  EXPECT_FLOAT_EQ(r.get("action").data<float>()[1], 8);
  EXPECT_EQ(r.get("policy_version").data<int64_t>()[0], 0);
}

TEST_P(TransportTest, ConcurrentClientsEachGetTheAnswerToTheirOwnRequest) {
  InferenceServer server(double_policy, transport, {.max_batch_size = 8});
  server.start();
  constexpr int kThreads = 6, kRequests = 150;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Client c = transport->client();
      for (int i = 0; i < kRequests; ++i) {
        float base = static_cast<float>(t * 1000 + i);
        if (action0(c(observation(base))) != 2 * base) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(server.stats().requests, uint64_t{kThreads * kRequests});
}

TEST_P(TransportTest, QueuedRequestsAreServedInBatchesOfAtMostMaxBatchSize) {
  std::atomic<int64_t> largest{0};
  InferenceServer server(
      [&](const TensorDict& b) {
        largest = std::max<int64_t>(largest, b.batch_size()[0]);
        return double_policy(b);
      },
      transport, {.max_batch_size = 4});
  Client c = transport->client();
  std::vector<Future> futures;
  for (int i = 0; i < 10; ++i) futures.push_back(c.submit(observation(static_cast<float>(i))));
  server.start();  // everything is already queued
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(action0(futures[i].result(5s)), 2.0f * static_cast<float>(i));
  ServerStats st = server.stats();
  EXPECT_EQ(st.requests, 10u);
  if (GetParam() == "socket" || GetParam() == "remote") {
    // Requests reach the owner's queue asynchronously: the first drain may see fewer.
    EXPECT_LE(largest, 4);
    EXPECT_GE(st.batches, 3u);
  } else {
    EXPECT_EQ(largest, 4);
    EXPECT_EQ(st.batches, 3u);
    EXPECT_NEAR(st.avg_batch_size, 10.0 / 3, 1e-9);
  }
}

TEST_P(TransportTest, MinBatchSizeWaitsForMoreRequestsUpToTheTimeout) {
  std::vector<int64_t> sizes;
  std::mutex mu;
  InferenceServer server(
      [&](const TensorDict& b) {
        std::lock_guard<std::mutex> l(mu);
        sizes.push_back(b.batch_size()[0]);
        return double_policy(b);
      },
      transport, {.max_batch_size = 8, .min_batch_size = 3, .timeout = 5s});
  server.start();
  Client c = transport->client();
  Future a = c.submit(observation(1));
  std::this_thread::sleep_for(50ms);
  Future b = c.submit(observation(2));
  Future d = c.submit(observation(3));
  a.result(10s), b.result(10s), d.result(10s);
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(sizes, (std::vector<int64_t>{3}));
}

TEST_P(TransportTest, AnUnderfullBatchIsServedOnceTheTimeoutPasses) {
  InferenceServer server(double_policy, transport,
                         {.max_batch_size = 8, .min_batch_size = 4, .timeout = 20ms});
  server.start();
  EXPECT_EQ(action0(transport->client()(observation(5), 5s)), 10);
}

TEST_P(TransportTest, APolicyExceptionFailsEveryRequestOfItsBatchAndServingGoesOn) {
  std::atomic<bool> fail{true};
  InferenceServer server(
      [&](const TensorDict& b) -> TensorDict {
        if (fail) throw std::invalid_argument("observation out of range");
        return double_policy(b);
      },
      transport, {.max_batch_size = 8});
  Client c = transport->client();
  std::vector<Future> futures;
  for (int i = 0; i < 5; ++i) futures.push_back(c.submit(observation(static_cast<float>(i))));
  server.start();
  for (Future& f : futures) {
    try {
      f.result(5s);
      ADD_FAILURE() << "expected a RemoteError";
    } catch (const RemoteError& e) {
      EXPECT_EQ(e.type_name(), "std::invalid_argument");
      EXPECT_EQ(e.message(), "observation out of range");
    }
  }
  // Reading a failed future again raises the same error.
  EXPECT_THROW(futures[0].result(), RemoteError);
  fail = false;
  EXPECT_EQ(action0(c(observation(2), 5s)), 4);
}

TEST_P(TransportTest, ATensorwireErrorFromThePolicyKeepsItsPythonName) {
  InferenceServer server([](const TensorDict&) -> TensorDict { throw KeyError("no 'obs'"); },
                         transport);
  server.start();
  try {
    transport->client()(observation(0), 5s);
    ADD_FAILURE();
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.type_name(), "KeyError");
    EXPECT_EQ(e.message(), "no 'obs'");
  }
}

TEST_P(TransportTest, AnOutputWithTheWrongBatchSizeFailsTheBatch) {
  InferenceServer server(
      [](const TensorDict& b) {
        TensorDict out(Shape{b.batch_size()[0] + 1});
        out.set("action", Tensor::zeros({b.batch_size()[0] + 1, 2}, DType::Float32));
        return out;
      },
      transport);
  server.start();
  try {
    transport->client()(observation(0), 5s);
    ADD_FAILURE();
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.type_name(), "ValueError");  // as a wrong leaf shape or dtype
    EXPECT_NE(e.message().find("batch of 1"), std::string::npos) << e.message();
  }
}

TEST_P(TransportTest, UpdateModelRunsBetweenBatchesAndBumpsTheVersion) {
  std::atomic<float> scale{2};
  InferenceServer server(
      [&](const TensorDict& b) {
        TensorDict out = double_policy(b);
        Tensor a = out.get("action");
        for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] *= scale / 2;
        return out;
      },
      transport);
  server.start();
  Client c = transport->client();
  EXPECT_EQ(c(observation(1), 5s).get("policy_version").data<int64_t>()[0], 0);
  server.update_model([&] { scale = 3; });
  TensorDict r = c(observation(1), 5s);
  EXPECT_EQ(r.get("policy_version").data<int64_t>()[0], 1);
  EXPECT_FLOAT_EQ(action0(r), 3);
  EXPECT_EQ(server.policy_version(), 1);
  EXPECT_EQ(server.stats().weight_updates, 1u);
}

TEST_P(TransportTest, UpdateModelGivesUpAtItsTimeoutWhileAPolicyCallRuns) {
  Gate gate;
  InferenceServer server(gated(gate), transport, {.max_batch_size = 1});
  server.start();
  Client c = transport->client();
  Future running = c.submit(observation(1));
  ASSERT_TRUE(gate.arrived(1));
  bool ran = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    server.update_model([&] { ran = true; }, true, 120ms);
    ADD_FAILURE() << "update_model() returned while the policy call ran";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("a policy call still runs"), std::string::npos);
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 120ms);
  EXPECT_FALSE(ran);
  EXPECT_EQ(server.policy_version(), 0);
  gate.open();
  EXPECT_EQ(running.result(5s).get("policy_version").data<int64_t>()[0], 0);
  server.update_model([&] { ran = true; }, true, 5s);  // between batches now: it runs
  EXPECT_TRUE(ran);
  EXPECT_EQ(server.policy_version(), 1);
  EXPECT_EQ(c(observation(1), 5s).get("policy_version").data<int64_t>()[0], 1);
}

// What CPython does to the serving thread when the interpreter finalizes during a policy
// call: the thread ends (pthread_exit). The server must let it end, not catch it (that would
// be std::terminate), and still stop, fail what was pending and destroy without a hang.
TEST_P(TransportTest, APolicyThatEndsItsThreadLeavesAServerThatStops) {
  Gate gate;
  InferenceServer server(
      [&gate](const TensorDict&) -> TensorDict {
        gate.pass();
        pthread_exit(nullptr);
      },
      transport);
  server.start();
  Client c = transport->client();
  Future f = c.submit(observation(1));
  ASSERT_TRUE(gate.arrived(1));
  // The shutdown leaves the drained request to the serving thread, which ends instead.
  std::thread stopper([&] { EXPECT_TRUE(server.shutdown(5s)); });
  std::this_thread::sleep_for(20ms);
  gate.open();
  stopper.join();
  EXPECT_FALSE(server.running());
  try {
    f.result(5s);
    ADD_FAILURE() << "answered";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.type_name(), "ClosedError") << e.what();
    EXPECT_NE(e.message().find("serving thread ended"), std::string::npos) << e.message();
  }
  // The transport's claim was given up: another server serves it.
  InferenceServer next(double_policy, transport);
  next.start();
  EXPECT_FLOAT_EQ(action0(c(observation(1), 5s)), 2);
}

TEST_P(TransportTest, ShutdownAnswersTheRunningBatchAndFailsThePendingRequests) {
  Gate gate;
  InferenceServer server(gated(gate), transport, {.max_batch_size = 1});
  server.start();
  Client c = transport->client();
  Future running = c.submit(observation(1));
  ASSERT_TRUE(gate.arrived(1));
  Future queued1 = c.submit(observation(2));
  Future queued2 = c.submit(observation(3));
  std::thread stopper([&] { server.shutdown(); });
  std::this_thread::sleep_for(20ms);
  gate.open();
  stopper.join();
  EXPECT_EQ(action0(running.result(5s)), 2);
  for (Future* f : {&queued1, &queued2}) {
    try {
      f->result(5s);
      ADD_FAILURE() << "a queued request survived the shutdown";
    } catch (const ClosedError& e) {
      EXPECT_NE(std::string(e.what()).find("shutting down"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(server.running());
}

TEST_P(TransportTest, ASubmitAfterShutdownFailsInsteadOfWaitingForEver) {
  InferenceServer server(double_policy, transport);
  server.start();
  Client c = transport->client();
  c(observation(1), 5s);
  server.shutdown();
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(c(observation(1)), ClosedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST_P(TransportTest, ResultTimesOutAndCanBeCalledAgain) {
  Gate gate;
  InferenceServer server(gated(gate), transport);
  server.start();
  Future f = transport->client().submit(observation(4));
  EXPECT_THROW(f.result(20ms), TimeoutError);
  EXPECT_FALSE(f.done());
  gate.open();
  EXPECT_EQ(action0(f.result(5s)), 8);
  EXPECT_TRUE(f.done());
  EXPECT_EQ(action0(f.result()), 8);  // the same response again
}

TEST_P(TransportTest, AFutureSharedByThreadsGivesEachTheResponse) {
  Gate gate;
  InferenceServer server(gated(gate), transport);
  server.start();
  Future f = transport->client().submit(observation(5));
  ASSERT_TRUE(gate.arrived(1));
  float got[2] = {0, 0};
  std::thread first([&] { got[0] = action0(f.result(5s)); });
  std::this_thread::sleep_for(20ms);  // the first thread now waits for the response
  // The second caller waits for the first: within its own timeout, then with the answer.
  EXPECT_THROW(f.result(20ms), TimeoutError);
  std::thread second([&] { got[1] = action0(f.result(5s)); });
  gate.open();
  first.join();
  second.join();
  EXPECT_EQ(got[0], 10);
  EXPECT_EQ(got[1], 10);
}

// Polling done() (a progress bar, an event loop) while another thread waits in result():
// done() used to read the request the waiting thread frees as it takes the response.
TEST_P(TransportTest, DoneCanBePolledWhileAnotherThreadWaitsForTheResult) {
  InferenceServer server(double_policy, transport);
  server.start();
  Client c = transport->client();
  for (int i = 0; i < 200; ++i) {
    Future f = c.submit(observation(static_cast<float>(i)));
    float got = -1;
    std::thread waiter([&] { got = action0(f.result(5s)); });
    while (std::string_view(f.state()) == "pending") {
    }
    EXPECT_TRUE(f.done());  // never back to false
    waiter.join();
    EXPECT_EQ(got, 2.0f * static_cast<float>(i));
    EXPECT_STREQ(f.state(), "done");
  }
  EXPECT_FALSE(Future().done());
  EXPECT_STREQ(Future().state(), "empty");
}

// An interrupt check that fires once armed: what Ctrl-C does through the Python binding.
std::atomic<bool> g_interrupt{false};
void interrupt_when_armed() {
  if (g_interrupt.exchange(false)) throw Interrupted("interrupted by the test");
}

TEST_P(TransportTest, AnInterruptedResultLeavesTheRequestInFlightAndTheClientUsable) {
  Gate gate;
  InferenceServer server(gated(gate), transport);
  server.start();
  set_interrupt_check(interrupt_when_armed);
  Client c = transport->client();
  Future f = c.submit(observation(4));
  ASSERT_TRUE(gate.arrived(1));
  g_interrupt = true;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(f.result(), Interrupted);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);  // within a slice or two
  g_interrupt = true;
  EXPECT_THROW(c(observation(5)), Interrupted);  // a blocking call too
  set_interrupt_check(nullptr);
  gate.open();
  EXPECT_EQ(action0(f.result(5s)), 8);
  EXPECT_EQ(action0(c(observation(6), 5s)), 12);
}

TEST_P(TransportTest, AZeroTimeoutPollsOnce) {
  Future f = transport->client().submit(observation(1));  // no server: never answered
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(f.result(Timeout::poll()), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
}

TEST_P(TransportTest, EveryUseOfAClosedTransportOrClientIsAClosedError) {
  Client c = transport->client(), other = transport->client();
  Future queued = other.submit(observation(1));
  c.close();
  EXPECT_THROW(c.submit(observation(1)), ClosedError);
  EXPECT_THROW(c(observation(1)), ClosedError);
  transport->close();
  EXPECT_TRUE(transport->closed());
  EXPECT_THROW(queued.result(5s), ClosedError);
  EXPECT_THROW(other(observation(1), 5s), ClosedError);
  EXPECT_THROW(transport->client(), ClosedError);
  InferenceServer server(double_policy, transport);
  EXPECT_THROW(server.start(), ClosedError);
}

// A socket client's transport gone (destroyed, or its process exited) left nothing
// listening under its name: its connect was refused until its timeout, a SystemError that a
// caller catching ClosedError missed.
TEST_P(TransportTest, AClientWhoseTransportWasDestroyedGetsAClosedError) {
  Client c = transport->client();
  transport.reset();
  EXPECT_THROW(c(observation(1), 5s), ClosedError);
  EXPECT_THROW(c.submit(observation(1)).result(5s), ClosedError);
}

TEST_P(TransportTest, DroppedFuturesDoNotDisturbLaterRequests) {
  Gate gate;
  InferenceServer server(gated(gate), transport, {.max_batch_size = 2});
  Client c = transport->client();
  for (int i = 0; i < 6; ++i) c.submit(observation(static_cast<float>(i)));  // dropped at once
  server.start();
  { Future in_policy = c.submit(observation(9)); }
  gate.open();
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(action0(c(observation(static_cast<float>(i)), 5s)), 2.0f * i);
}

TEST_P(TransportTest, StartTwiceIsAnErrorAndASecondServerIsRefused) {
  InferenceServer server(double_policy, transport);
  server.start();
  EXPECT_THROW(server.start(), Error);
  InferenceServer other(double_policy, transport);
  EXPECT_THROW(other.start(), Error);
  server.shutdown();
  other.start();  // free again
  EXPECT_EQ(action0(transport->client()(observation(1), 5s)), 2);
}

// A shutdown that timed out (the policy is still in its call) leaves the transport claimed
// until its serving thread ends: a second server is refused meanwhile (it started, and the
// old thread's end then failed all its requests with "shutting down"), and starts after.
TEST_P(TransportTest, AServerAfterAShutdownThatTimedOutStartsOnceTheOldOneEnded) {
  Gate gate;
  InferenceServer old(gated(gate), transport);
  old.start();
  Future held = transport->client().submit(observation(1));
  ASSERT_TRUE(gate.arrived(1));
  EXPECT_FALSE(old.shutdown(Timeout(100ms)));
  InferenceServer next(double_policy, transport);
  EXPECT_THROW(next.start(), Error);
  gate.open();
  EXPECT_TRUE(old.shutdown(Timeout(5s)));
  EXPECT_EQ(action0(held.result(5s)), 2);
  next.start();
  EXPECT_EQ(action0(transport->client()(observation(3), 5s)), 6);
}

// A server of several transports that fails to start (one of them is served already)
// gives up its claim on the others: each can be served again.
// A request made before, and one made after, a start that failed are served by the next
// server (the failed start failed them: "InferenceServer failed to start", and every
// later submit raised ClosedError although no server had run).
TEST_P(TransportTest, AFailedStartOfSeveralTransportsLeavesEachAsItWas) {
  auto taken = ThreadTransport::create();
  InferenceServer other(double_policy, taken);
  other.start();
  Client c = transport->client();
  Future before = c.submit(observation(1));
  InferenceServer both(double_policy, std::vector<std::shared_ptr<Transport>>{transport, taken});
  EXPECT_THROW(both.start(), Error);
  Future after = c.submit(observation(2));
  InferenceServer alone(double_policy, transport);
  alone.start();
  EXPECT_EQ(action0(before.result(5s)), 2);
  EXPECT_EQ(action0(after.result(5s)), 4);
  EXPECT_EQ(action0(c(observation(3), 5s)), 6);
}

// The server side by hand, as a server of several transports uses it: has_work() says
// whether a drain would find a request, and notify_work() calls its hook for each one
// (shared memory cannot: other processes make its requests ready).
TEST_P(TransportTest, HasWorkAndNotifyWorkTellOfEachRequest) {
  std::atomic<int> notified{0};
  const bool notifies = transport->notify_work([&] { ++notified; });
  EXPECT_EQ(notifies, GetParam() != "shared_memory");
  transport->open_server();
  EXPECT_FALSE(transport->has_work());
  Client c = GetParam() == "remote"
                 ? RemoteTransport::client_for(
                       "127.0.0.1:" +
                       std::to_string(std::static_pointer_cast<RemoteTransport>(transport)->port()))
                 : transport->client();
  Future f = c.submit(observation(3));
  EXPECT_TRUE(eventually([&] { return transport->has_work(); }));
  if (notifies) {
    EXPECT_TRUE(eventually([&] { return notified == 1; }));
  }
  Drained d;
  transport->drain(8, d);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_FALSE(transport->has_work());
  std::vector<Group> groups;
  transport->collate(d, groups);
  ASSERT_EQ(groups.size(), 1u);
  transport->resolve(d, groups[0], double_policy(*groups[0].input), version_stamp());
  EXPECT_EQ(action0(f.result(5s)), 6.0f);
  EXPECT_TRUE(transport->notify_work(nullptr) == notifies);
  transport->close_server("the test is over", true);
}

TEST_P(TransportTest, StatsReportQueueAndForwardPercentiles) {
  InferenceServer server(
      [](const TensorDict& b) {
        std::this_thread::sleep_for(2ms);
        return double_policy(b);
      },
      transport);
  server.start();
  Client c = transport->client();
  for (int i = 0; i < 10; ++i) c(observation(1), 5s);
  ServerStats st = server.stats(/*reset=*/true);
  EXPECT_EQ(st.requests, 10u);
  EXPECT_GE(st.p50_forward_ms, 1.5);
  EXPECT_GE(st.p95_forward_ms, st.p50_forward_ms);
  EXPECT_GE(st.p95_queue_ms, st.p50_queue_ms);
  EXPECT_GT(st.requests_per_s, 0);
  EXPECT_EQ(server.stats().requests, 0u);
}

TEST(InferenceServerOptions, InvalidBatchSizesAreRejected) {
  auto t = ThreadTransport::create();
  EXPECT_THROW(InferenceServer(double_policy, t, {.max_batch_size = 0}), ValueError);
  EXPECT_THROW(InferenceServer(double_policy, t, {.max_batch_size = 4, .min_batch_size = 5}),
               ValueError);
  EXPECT_THROW(InferenceServer(double_policy, t, {.min_batch_size = 0}), ValueError);
  EXPECT_THROW(InferenceServer(double_policy, t, {.min_transport_share = -0.1}), ValueError);
  EXPECT_THROW(InferenceServer(double_policy, t, {.min_transport_share = 1.5}), ValueError);
  EXPECT_THROW(InferenceServer(double_policy, t,
                               {.min_transport_share = std::numeric_limits<double>::quiet_NaN()}),
               ValueError);
  EXPECT_THROW(InferenceServer(double_policy, std::vector<std::shared_ptr<Transport>>{t},
                               {.min_transport_share = 2}),
               ValueError);
  EXPECT_THROW(InferenceServer(double_policy, t, {.max_batch_size = -3}), ValueError);
  // "No limit" said as the largest int: refused, not an allocation failure on the serving
  // thread (which ended the process).
  EXPECT_THROW(
      InferenceServer(double_policy, t, {.max_batch_size = std::numeric_limits<int64_t>::max()}),
      ValueError);
  EXPECT_THROW(InferenceServer(double_policy, t, {.max_batch_size = kMaxSlots + 1}), ValueError);
  InferenceServer largest(double_policy, t, {.max_batch_size = kMaxSlots});
  largest.start();
  EXPECT_FLOAT_EQ(t->client()(observation(3)).get("action").data<float>()[0], 6);
  EXPECT_THROW(InferenceServer(double_policy, t, {.stats_window_size = 0}), ValueError);
  EXPECT_THROW(InferenceServer(double_policy, t, {.stats_window_size = -1}), ValueError);
}

TEST(TransportClients, MakesThatManyAndRejectsFewerThanOne) {
  auto t = ThreadTransport::create();
  EXPECT_EQ(t->clients(3).size(), 3u);
  EXPECT_THROW(t->clients(0), ValueError);
  EXPECT_THROW(t->clients(-2), ValueError);
}

TEST(TransportOptions, AllowedUidsOutsideTheUidRangeAreRejected) {
  for (int64_t uid : {int64_t{-1}, int64_t{UINT32_MAX}, int64_t{1} << 40}) {
    EXPECT_THROW(SocketTransport::create({.allowed_uids = {uid}}), ValueError);
    EXPECT_THROW(SharedMemoryTransport::create(request_spec(), response_spec(),
                                               {.num_slots = 2, .allowed_uids = {uid}}),
                 ValueError);
  }
}

// The transports with a bank of slots: a submit waits for room while every slot holds a
// request in flight. Closing its client from another thread ends that wait with
// ClosedError at once (it went on to its timeout; with none, for ever).
TEST(TransportClients, ClosingAClientEndsASubmitWaitingForASlot) {
  for (const std::string kind : {"shared_memory", "remote"}) {
    SCOPED_TRACE(kind);
    auto transport = make_transport(kind, 2);
    Client c = transport->client();
    Future a = c.submit(observation(1)), b = c.submit(observation(2));  // no server
    std::thread closer([&] {
      std::this_thread::sleep_for(200ms);
      c.close();
    });
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_THROW(c.submit(observation(3)), ClosedError);  // Timeout::forever()
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
    closer.join();
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportTest,
                         ::testing::Values("shared_memory", "socket", "thread", "remote"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace tw_test
