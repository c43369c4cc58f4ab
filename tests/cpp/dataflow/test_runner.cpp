// MultiProcessRunnerZMQ with real worker processes: ordering, epochs, failures, cleanup.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <map>

#include "flows.h"
#include "tensorwire/dataflow/map.h"
#include "tensorwire/dataflow/runner.h"
#include "tensorwire/runtime/interrupt.h"

namespace tensorwire::dataflow {
namespace {

using namespace std::chrono_literals;
using testing::counting;
using ::testing::HasSubstr;
using testing::index_of;

class Runner : public testing::NoLeftovers {};

TEST_F(Runner, NothingForksBeforeResetState) {
  MultiProcessRunnerZMQ r(counting(10), {.num_proc = 2});
  EXPECT_TRUE(r.pids().empty());
  EXPECT_EQ(testing::child_pids(), children_before_);
  EXPECT_EQ(r.size(), 10u);
  EXPECT_THROW(r.epoch(), StateError);
}

TEST_F(Runner, OneWorkerYieldsTheDataflowInOrderEpochAfterEpoch) {
  MultiProcessRunnerZMQ r(counting(25), {.num_proc = 1, .hwm = 4});
  r.reset_state();
  for (int epoch = 0; epoch < 3; ++epoch) {
    int64_t expected = 0;
    for (TensorDict& dp : r.epoch()) {
      EXPECT_EQ(index_of(dp), expected++);
      EXPECT_TRUE(testing::datapoint_ok(dp));
    }
    EXPECT_EQ(expected, 25);
  }
}

TEST_F(Runner, TwoWorkersGiveExactEpochsOfTheSameDistribution) {
  MultiProcessRunnerZMQ r(counting(40, 1000), {.num_proc = 2, .hwm = 8});
  r.reset_state();
  ASSERT_EQ(r.pids().size(), 2u);
  std::map<int64_t, int> seen;
  for (int epoch = 0; epoch < 4; ++epoch) {
    size_t n = 0;
    for (TensorDict& dp : r.epoch()) {
      ASSERT_TRUE(testing::datapoint_ok(dp));
      ++seen[index_of(dp)];
      ++n;
    }
    EXPECT_EQ(n, 40u);
  }
  // Every datapoint comes from the dataflow; each worker runs all of it, so there are
  // duplicates, and over 160 datapoints from 2 x 40 each index shows up.
  for (auto [i, count] : seen) EXPECT_TRUE(i >= 0 && i < 40) << i;
  EXPECT_EQ(seen.size(), 40u);
}

TEST_F(Runner, AnEndlessDataflowGivesAnEndlessEpoch) {
  MultiProcessRunnerZMQ r(counting(std::nullopt), {.num_proc = 1});
  r.reset_state();
  EXPECT_FALSE(r.size());
  auto e = r.epoch();
  for (int64_t i = 0; i < 500; ++i) {
    auto dp = e.next();
    ASSERT_TRUE(dp);
    EXPECT_EQ(index_of(*dp), i);
  }
  EXPECT_FALSE(e.done());
}

TEST_F(Runner, DatapointsMadeBeforeTheDataflowBlocksArriveWithoutWaitingForIt) {
  // A burst of fast datapoints, then a dataflow that blocks (waiting for data, say):
  // datapoints the worker batched must not wait for the next one.
  class Stalls : public DataFlow {
    std::optional<TensorDict> next() override {
      if (i_ == 5) std::this_thread::sleep_for(std::chrono::seconds(60));
      return testing::make_datapoint(i_++);
    }
    uint64_t i_ = 0;
  };
  MultiProcessRunnerZMQ r(std::make_shared<Stalls>(), {.num_proc = 1});
  r.reset_state();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < 5; ++i) {
    auto dp = r.next(5s);
    ASSERT_TRUE(dp) << "datapoint " << i << " held back";
    EXPECT_EQ(index_of(*dp), i);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

TEST_F(Runner, ResetStateTwiceThrows) {
  MultiProcessRunnerZMQ r(counting(3));
  r.reset_state();
  EXPECT_THROW(r.reset_state(), StateError);
  EXPECT_EQ(r.pids().size(), 1u);
}

TEST_F(Runner, ASecondConcurrentEpochThrows) {
  MultiProcessRunnerZMQ r(counting(10));
  r.reset_state();
  {
    auto first = r.epoch();
    ASSERT_TRUE(first.next());
    try {
      auto second = r.epoch();
      FAIL() << "a second epoch while the first is alive must throw";
    } catch (const StateError& e) {
      EXPECT_THAT(e.what(), HasSubstr("not reentrant"));
    }
  }
  auto again = r.epoch();  // the first one is gone: fine
  EXPECT_TRUE(again.next());
}

TEST_F(Runner, AWorkerExceptionIsRethrownWithItsTypeAndMessage) {
  MultiProcessRunnerZMQ r(std::make_shared<testing::RaisingFlow>(3), {.num_proc = 1});
  r.reset_state();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(index_of(r.next()), i);
  try {
    r.next();
    FAIL() << "the worker's exception must come through";
  } catch (const WorkerError& e) {
    EXPECT_EQ(e.worker(), 0);
    EXPECT_EQ(e.pid(), r.pids().at(0));
    EXPECT_EQ(e.failure().type, "ValueError");
    EXPECT_EQ(e.failure().message, "bad datapoint 3");
    EXPECT_THAT(e.what(), HasSubstr("worker 0"));
    EXPECT_EQ(e.context(), "MultiProcessRunnerZMQ: worker 0 (pid " + std::to_string(e.pid()) + ")");
  }
  EXPECT_THROW(r.next(), WorkerError);  // the runner stays failed
}

TEST_F(Runner, AKilledWorkerIsReportedWithinSecondsNamingItsSignal) {
  MultiProcessRunnerZMQ r(counting(std::nullopt), {.num_proc = 2, .hwm = 4});
  r.reset_state();
  r.next();
  const int victim = r.pids().at(1);
  ::kill(victim, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    while (true) r.next();  // the other worker keeps sending: the death must still surface
  } catch (const WorkerDiedError& e) {
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    EXPECT_EQ(e.worker(), 1);
    EXPECT_EQ(e.pid(), victim);
    EXPECT_THAT(e.what(), HasSubstr("worker 1"));
    EXPECT_THAT(e.what(), HasSubstr("SIGKILL"));
  }
}

TEST_F(Runner, AKilledWorkerEndsABlockedWait) {
  // The worker has nothing to send (its dataflow blocks): the main process waits.
  class Idle : public DataFlow {
    std::optional<TensorDict> next() override {
      std::this_thread::sleep_for(std::chrono::hours(1));
      return std::nullopt;
    }
  };
  MultiProcessRunnerZMQ r(std::make_shared<Idle>(), {.num_proc = 1});
  r.reset_state();
  EXPECT_FALSE(r.next(200ms));
  ::kill(r.pids().at(0), SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(r.next(), WorkerDiedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// close() from another thread (an exit hook, a finalizer) while the consumer waits: the
// consumer's call ends with ClosedError, and only then are the sockets and workers taken
// down (before, the consumer polled a freed socket).
TEST_F(Runner, CloseFromAnotherThreadEndsTheConsumersWaitFirst) {
  class Slow : public DataFlow {
    std::optional<TensorDict> next() override {
      std::this_thread::sleep_for(20ms);
      return testing::make_datapoint(i_++);
    }
    uint64_t i_ = 0;
  };
  MultiProcessRunnerZMQ r(std::make_shared<Slow>(), {.num_proc = 1});
  r.reset_state();
  ASSERT_TRUE(r.next(10s));
  std::atomic<bool> closed_error{false};
  std::thread consumer([&] {
    try {
      while (r.next(10s)) {
      }
    } catch (const ClosedError&) {
      closed_error = true;
    }
  });
  std::this_thread::sleep_for(200ms);
  const auto t0 = std::chrono::steady_clock::now();
  r.close();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  consumer.join();
  EXPECT_TRUE(closed_error);
  EXPECT_TRUE(r.closed());
  EXPECT_TRUE(r.pids().empty());
  EXPECT_THROW(r.next(0ms), ClosedError);
}

TEST_F(Runner, WorkersDieWithTheirParent) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    ::close(fds[0]);
    MultiProcessRunnerZMQ r(counting(std::nullopt), {.num_proc = 2});
    r.reset_state();
    r.next();
    const auto pids = r.pids();
    (void)!::write(fds[1], pids.data(), pids.size() * sizeof(int));
    ::pause();
    ::_exit(0);
  }
  ::close(fds[1]);
  int workers[2] = {0, 0};
  size_t got = 0;
  while (got < sizeof workers) {
    const ssize_t n = ::read(fds[0], reinterpret_cast<char*>(workers) + got, sizeof workers - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fds[0]);
  ::kill(parent, SIGKILL);
  ASSERT_EQ(::waitpid(parent, nullptr, 0), parent);
  ASSERT_EQ(got, sizeof workers);
  for (int w : workers)
    EXPECT_TRUE(testing::ends_within(w, 5s)) << "worker " << w << " outlived its parent";
}

TEST_F(Runner, CloseKillsAndReapsTheWorkersAndKeepsReceivedData) {
  MultiProcessRunnerZMQ r(counting(std::nullopt, 4096), {.num_proc = 2});
  r.reset_state();
  TensorDict kept = r.next();
  const auto pids = r.pids();
  r.close();
  r.close();  // idempotent
  for (int pid : pids) EXPECT_TRUE(testing::ends_within(pid, 1s));
  EXPECT_TRUE(testing::datapoint_ok(kept));  // its memory outlives the worker
  EXPECT_THROW(r.next(), ClosedError);
}

TEST_F(Runner, EachWorkerGetsADistinctReproducibleSeed) {
  MultiProcessRunnerZMQ r(std::make_shared<testing::SeedFlow>(), {.num_proc = 3, .seed = 1000});
  r.reset_state();
  EXPECT_EQ(r.base_seed(), 1000u);
  std::map<int64_t, uint64_t> seeds;
  while (seeds.size() < 3) {
    TensorDict dp = r.next();
    seeds[*dp.get("worker").data<int64_t>()] = *dp.get("seed").data<uint64_t>();
  }
  EXPECT_EQ(seeds, (std::map<int64_t, uint64_t>{{0, 1000}, {1, 1001}, {2, 1002}}));
  EXPECT_EQ(current_worker(), nullptr);  // this process is not a worker
}

TEST_F(Runner, SharedMemoryStaysBoundedWhenTheConsumerDropsDatapoints) {
  const int hwm = 8;
  const int64_t bytes = 64 << 10;
  MultiProcessRunnerZMQ r(counting(std::nullopt, bytes), {.num_proc = 1, .hwm = hwm});
  r.reset_state();
  for (int i = 0; i < 3000; ++i) ASSERT_TRUE(testing::datapoint_ok(r.next()));
  // The first arena holds hwm + 4 chunks and is never outgrown.
  EXPECT_LE(r.shared_memory_bytes(),
            static_cast<size_t>(std::max<int64_t>(1 << 20, (hwm + 5) * (bytes + 256))));
}

TEST_F(Runner, AConsumerThatKeepsDatapointsKeepsTheirMemory) {
  MultiProcessRunnerZMQ r(counting(std::nullopt, 64 << 10), {.num_proc = 1, .hwm = 2});
  r.reset_state();
  std::vector<TensorDict> kept;
  for (int i = 0; i < 100; ++i) kept.push_back(r.next());  // more than the first arena holds
  for (size_t i = 0; i < kept.size(); ++i) {
    ASSERT_TRUE(testing::datapoint_ok(kept[i]));
    EXPECT_EQ(index_of(kept[i]), static_cast<int64_t>(i));
  }
  EXPECT_GE(r.shared_memory_bytes(), 100u * (64 << 10));
}

// shared_memory_bytes() is read from other threads (a monitor, Python with the GIL released
// while another thread iterates) while the consumer maps segments: TSan checks it.
TEST_F(Runner, SharedMemoryBytesCanBeReadWhileAnotherThreadIterates) {
  MultiProcessRunnerZMQ r(counting(std::nullopt, 64 << 10), {.num_proc = 2, .hwm = 2});
  r.reset_state();
  std::atomic<bool> done{false};
  size_t most = 0;
  std::thread monitor([&] {
    while (!done.load()) most = std::max(most, r.shared_memory_bytes());
  });
  std::vector<TensorDict> kept;  // kept: the runner must map more segments as it goes
  for (int i = 0; i < 100; ++i) kept.push_back(r.next());
  done = true;
  monitor.join();
  EXPECT_GE(r.shared_memory_bytes(), 100u * (64 << 10));
  EXPECT_LE(most, r.shared_memory_bytes());
}

}  // namespace
}  // namespace tensorwire::dataflow

namespace tensorwire::dataflow {
namespace {

using namespace std::chrono_literals;

TEST(RunnerEmpty, APassWithNoDatapointIsAnErrorNotAnEndlessWait) {
  class Empty : public DataFlow {
    std::optional<TensorDict> next() override { return std::nullopt; }
  };
  MultiProcessRunnerZMQ r(std::make_shared<Empty>(), {.num_proc = 1});
  r.reset_state();
  try {
    r.next(10s);
    ADD_FAILURE() << "no error";
  } catch (const WorkerError& e) {
    EXPECT_EQ(e.failure().type, "ValueError");
    EXPECT_THAT(e.what(), ::testing::HasSubstr("no datapoint in a whole pass"));
  }
}

TEST(RunnerClosed, EveryUseAfterCloseIsAClosedError) {
  MultiProcessRunnerZMQ before(testing::counting(4), {.num_proc = 1});
  before.close();
  EXPECT_TRUE(before.closed());
  EXPECT_THROW(before.reset_state(), ClosedError);  // no workers forked after close()
  EXPECT_THROW(before.epoch(), ClosedError);
  EXPECT_TRUE(before.pids().empty());
  MultiProcessRunnerZMQ after(testing::counting(4), {.num_proc = 1});
  after.reset_state();
  after.close();
  EXPECT_THROW(after.next(1s), ClosedError);
  EXPECT_THROW(after.reset_state(), ClosedError);
}

// An Epoch that outlives its runner (a function returning runner.epoch() of a local
// runner; members declared in the wrong order) says so: it read freed memory.
template <class Runner, class... Args>
Epoch epoch_of_a_runner_gone(Args&&... args) {
  Runner r(std::forward<Args>(args)...);
  r.reset_state();
  Epoch e = r.epoch();
  EXPECT_TRUE(e.next(10s).has_value());
  return e;  // moved out; the runner goes here
}

TEST(RunnerClosed, AnEpochThatOutlivesItsRunnerIsAClosedError) {
  Epoch runner_epoch = epoch_of_a_runner_gone<MultiProcessRunnerZMQ>(testing::counting(4),
                                                                     RunnerOptions{.num_proc = 1});
  EXPECT_THAT([&] { (void)runner_epoch.next(1s); },
              ::testing::ThrowsMessage<ClosedError>(::testing::HasSubstr("runner was destroyed")));
  Epoch map_epoch = epoch_of_a_runner_gone<MultiProcessMapDataZMQ>(
      testing::counting(4), [](TensorDict td) -> std::optional<TensorDict> { return td; },
      MapOptions{.num_proc = 1});
  EXPECT_THROW((void)map_epoch.next(1s), ClosedError);
  EXPECT_EQ(map_epoch.count(), 1u);
}

// An interrupt check that throws once asked to: what the Python binding installs.
std::atomic<bool> g_interrupt{false};
void interrupt_when_asked() {
  if (g_interrupt.exchange(false)) throw Interrupted("test interrupt");
}

TEST(RunnerInterrupt, AnInterruptEndsAWaitAndLeavesTheRunnerUsable) {
  class Slow : public DataFlow {
    std::optional<TensorDict> next() override {
      std::this_thread::sleep_for(700ms);
      return testing::make_datapoint(0);
    }
  };
  MultiProcessRunnerZMQ r(std::make_shared<Slow>(), {.num_proc = 1});
  r.reset_state();
  set_interrupt_check(interrupt_when_asked);
  g_interrupt = true;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(r.next(), Interrupted);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 300ms);
  set_interrupt_check(nullptr);
  EXPECT_TRUE(r.next(10s));  // the runner goes on
}

}  // namespace
}  // namespace tensorwire::dataflow
