// Self-healing runners (WorkerPolicy): a dead or stuck worker replaced by a fresh one, the
// restart limit, the datapoint time limit, and the policy's argument checks. Real worker
// processes, killed with SIGKILL.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "flows.h"
#include "tensorwire/dataflow/map.h"
#include "tensorwire/dataflow/runner.h"
#include "tensorwire/runtime/interrupt.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::dataflow {
namespace {

using namespace std::chrono_literals;
using ::testing::Contains;
using testing::counting;
using ::testing::HasSubstr;
using testing::index_of;

constexpr uint64_t kSeed = 1000;

class Healing : public testing::NoLeftovers {};

WorkerPolicy restart(int max_restarts = 3) {
  return {.on_death = OnWorkerDeath::Restart, .max_restarts = max_restarts};
}

// In the first worker generation only (seed below kSeed + num_proc): true.
bool first_generation(int num_proc) {
  const WorkerInfo* w = current_worker();
  return w && w->seed < kSeed + static_cast<uint64_t>(num_proc);
}

TEST_F(Healing, AKilledRunnerWorkerIsReplacedAndTheStreamGoesOn) {
  std::vector<WorkerRestart> seen;
  RunnerOptions o{.num_proc = 2, .hwm = 4, .seed = kSeed, .policy = restart()};
  o.policy.on_restart = [&](const WorkerRestart& r) { seen.push_back(r); };
  MultiProcessRunnerZMQ r(counting(std::nullopt), o);
  r.reset_state();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(testing::datapoint_ok(*r.next(10s)));
  const int victim = r.pids()[0];
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  for (auto end = std::chrono::steady_clock::now() + 20s;
       r.restarts() == 0 && std::chrono::steady_clock::now() < end;)
    ASSERT_TRUE(testing::datapoint_ok(*r.next(10s)));
  ASSERT_EQ(r.restarts(), 1u);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].worker, 0);
  EXPECT_EQ(seen[0].pid, victim);
  EXPECT_TRUE(WIFSIGNALED(seen[0].wait_status) && WTERMSIG(seen[0].wait_status) == SIGKILL);
  EXPECT_EQ(seen[0].new_pid, r.pids()[0]);
  EXPECT_NE(r.pids()[0], victim);
  EXPECT_EQ(seen[0].new_seed, kSeed + 0 + 2 * 1);  // base + index + num_proc x restarts
  EXPECT_THAT(seen[0].message, HasSubstr("worker 0 (pid " + std::to_string(victim) + ")"));
  EXPECT_THAT(seen[0].message, HasSubstr("SIGKILL"));
  for (int i = 0; i < 200; ++i) {
    auto dp = r.next(10s);
    ASSERT_TRUE(dp && testing::datapoint_ok(*dp));
  }
  r.close();
}

// An on_restart that throws (a Python warning turned into an error): the restart completes
// and the exception comes out of the consumer's next call, once; the stream goes on whole.
TEST_F(Healing, WhatOnRestartThrowsComesOutOfTheNextCallAndNothingIsLost) {
  MapOptions o{.num_proc = 2, .buffer_size = 4, .strict = true, .seed = kSeed, .policy = restart()};
  o.policy.on_restart = [](const WorkerRestart& r) { throw ValueError("report: " + r.message); };
  MultiProcessMapDataZMQ m(
      counting(40), [](TensorDict td) -> std::optional<TensorDict> { return td; }, o);
  m.reset_state();
  std::map<int64_t, int> seen;
  int thrown = 0;
  bool killed = false;
  for (int epoch = 0; epoch < 3 && seen.size() < 40; ++epoch) {
    Epoch e = m.epoch();
    try {
      while (auto dp = e.next(10s)) {
        ++seen[testing::index_of(*dp)];
        if (!killed && seen.size() == 5) {
          killed = ::kill(m.pids()[0], SIGKILL) == 0;
        }
      }
    } catch (const ValueError& err) {
      EXPECT_THAT(err.what(), HasSubstr("report: "));
      ++thrown;
    }
  }
  EXPECT_EQ(thrown, 1);
  EXPECT_EQ(m.restarts(), 1u);
  EXPECT_EQ(seen.size(), 40u);
  for (auto [i, c] : seen) EXPECT_EQ(c, 1) << i;
  m.close();
}

TEST_F(Healing, TheReplacementGetsANewSeed) {
  RunnerOptions o{.num_proc = 1, .seed = kSeed, .policy = restart()};
  MultiProcessRunnerZMQ r(std::make_shared<testing::SeedFlow>(), o);
  r.reset_state();
  EXPECT_EQ(*r.next(10s)->get("seed").data<uint64_t>(), kSeed);
  ::kill(r.pids()[0], SIGKILL);
  uint64_t seed = kSeed;
  for (auto end = std::chrono::steady_clock::now() + 20s;
       seed == kSeed && std::chrono::steady_clock::now() < end;)
    seed = *r.next(10s)->get("seed").data<uint64_t>();
  EXPECT_EQ(seed, kSeed + 1);
  EXPECT_EQ(r.restarts(), 1u);
}

TEST_F(Healing, AWorkerThatDiesTooOftenEndsTheRun) {
  RunnerOptions o{.num_proc = 1, .seed = kSeed, .policy = restart(1)};
  MultiProcessRunnerZMQ r(counting(std::nullopt), o);
  r.reset_state();
  r.next(10s);
  ::kill(r.pids()[0], SIGKILL);
  for (auto end = std::chrono::steady_clock::now() + 20s;
       r.restarts() == 0 && std::chrono::steady_clock::now() < end;)
    r.next(10s);
  ::kill(r.pids()[0], SIGKILL);
  try {
    for (auto end = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < end;)
      r.next(10s);
    FAIL() << "no error";
  } catch (const WorkerDiedError& e) {
    EXPECT_THAT(e.what(), HasSubstr("died 2 times within restart_window (60 s)"));
    EXPECT_THAT(e.what(), HasSubstr("max_restarts (1)"));
    EXPECT_THAT(e.what(), HasSubstr("SIGKILL"));
  }
  EXPECT_THROW(r.next(10s), WorkerDiedError);  // the runner stays failed
}

TEST_F(Healing, TheRaisePolicyStillRaises) {
  MultiProcessRunnerZMQ r(counting(std::nullopt), {.num_proc = 1});
  r.reset_state();
  r.next(10s);
  ::kill(r.pids()[0], SIGKILL);
  EXPECT_THROW(
      {
        for (auto end = std::chrono::steady_clock::now() + 20s;
             std::chrono::steady_clock::now() < end;)
          r.next(10s);
      },
      WorkerDiedError);
  EXPECT_EQ(r.restarts(), 0u);
}

uint64_t seed_of(const TensorDict& td) {
  return *td.get("seed").data<uint64_t>();
}

// True once a datapoint of seed `seed` arrives (within 20 s): of the only worker's k-th
// replacement for kSeed + k.
bool delivers_seed(MultiProcessRunnerZMQ& r, uint64_t seed) {
  for (auto end = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < end;)
    if (auto dp = r.next(2s); dp && seed_of(*dp) == seed) return true;
  return false;
}

// A lock of the dataflow's, taken by the main process after the first workers were forked:
// as any thread of a main process may hold some library's lock at the moment a worker dies.
std::mutex g_flow_lock;

class LockingSeedFlow : public testing::SeedFlow {
 public:
  std::optional<TensorDict> next() override {
    std::lock_guard lock(g_flow_lock);
    return SeedFlow::next();
  }
};

// Forked from the main process, the replacement would hold a copy of the lock, locked by a
// thread that does not exist in it, and wait for it for ever; the fork server forked it from
// the state the first worker had.
TEST_F(Healing, AReplacementDoesNotInheritALockTheMainProcessHolds) {
  MultiProcessRunnerZMQ r(std::make_shared<LockingSeedFlow>(),
                          {.num_proc = 1, .seed = kSeed, .policy = restart()});
  r.reset_state();
  EXPECT_EQ(seed_of(*r.next(10s)), kSeed);
  std::mutex mu;
  std::condition_variable cv;
  bool taken = false, release = false;
  std::thread holder([&] {
    std::lock_guard held(g_flow_lock);
    std::unique_lock l(mu);
    taken = true;
    cv.notify_all();
    cv.wait(l, [&] { return release; });
  });
  {
    std::unique_lock l(mu);
    cv.wait(l, [&] { return taken; });
  }
  ASSERT_EQ(::kill(r.pids()[0], SIGKILL), 0);
  EXPECT_TRUE(delivers_seed(r, kSeed + 1));
  EXPECT_EQ(r.restarts(), 1u);
  {
    std::lock_guard l(mu);
    release = true;
  }
  cv.notify_all();
  holder.join();
}

// Its own children that are not the runner's workers: the fork server (restart policy only).
std::vector<int> non_workers(const std::set<int>& before, const std::vector<int>& workers) {
  std::vector<int> out;
  for (int pid : testing::child_pids())
    if (!before.count(pid) && std::find(workers.begin(), workers.end(), pid) == workers.end())
      out.push_back(pid);
  return out;
}

int parent_of(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));  // after "pid (comm) "
  char state;
  int ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

std::vector<std::string> g_warnings;
void keep_warning(LogLevel, const std::string& message) {
  g_warnings.push_back(message);
}

// The fork server forks replacements (it is their parent). Killed from outside, it takes
// them with it (PDEATHSIG); each is then replaced by a fork of the main process, with a
// warning, and the stream goes on. (That fork is made by the threaded test process: not under
// the sanitizers, label forked-child.)
TEST_F(Healing, AReplacementIsForkedByTheMainProcessOnceTheForkServerIsGone) {
  MultiProcessRunnerZMQ raising(counting(std::nullopt), {.num_proc = 1});
  raising.reset_state();
  EXPECT_TRUE(non_workers(children_before_, raising.pids()).empty());  // no server needed
  raising.close();

  RunnerOptions o{.num_proc = 1, .seed = kSeed, .policy = restart()};
  std::vector<std::string> deaths;
  o.policy.on_restart = [&](const WorkerRestart& w) { deaths.push_back(w.message); };
  MultiProcessRunnerZMQ r(std::make_shared<testing::SeedFlow>(), o);
  r.reset_state();
  EXPECT_EQ(seed_of(*r.next(10s)), kSeed);
  const std::vector<int> server = non_workers(children_before_, r.pids());
  ASSERT_EQ(server.size(), 1u);
  ASSERT_EQ(::kill(r.pids()[0], SIGKILL), 0);
  ASSERT_TRUE(delivers_seed(r, kSeed + 1));
  EXPECT_EQ(parent_of(r.pids()[0]), server[0]);

  g_warnings.clear();
  set_log_handler(keep_warning);
  ASSERT_EQ(::kill(server[0], SIGKILL), 0);
  ASSERT_TRUE(testing::ends_within(server[0], 5s));
  EXPECT_TRUE(delivers_seed(r, kSeed + 2));  // its replacement died with it: replaced again
  set_log_handler(nullptr);
  EXPECT_EQ(r.restarts(), 2u);
  EXPECT_EQ(parent_of(r.pids()[0]), ::getpid());
  ASSERT_EQ(deaths.size(), 2u);
  EXPECT_THAT(deaths[1], HasSubstr("exit status unavailable"));  // its reaper was the server
  EXPECT_THAT(g_warnings, Contains(HasSubstr("the fork server is gone")));
}

// Datapoint 3 of the first pass sleeps for ever in the first worker generation.
std::shared_ptr<DataFlow> stuck_at_3(int num_proc) {
  return std::make_shared<FunctionFlow>(
      [num_proc](uint64_t i) {
        if (i == 3 && first_generation(num_proc)) std::this_thread::sleep_for(1h);
        return testing::make_datapoint(i);
      },
      20);
}

TEST_F(Healing, AStuckRunnerWorkerIsKilledAndNamed) {
  RunnerOptions o{.num_proc = 1, .seed = kSeed};
  o.policy.datapoint_timeout = 300ms;
  MultiProcessRunnerZMQ r(stuck_at_3(1), o);
  r.reset_state();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(index_of(*r.next(10s)), i);
  try {
    r.next(10s);
    FAIL() << "no error";
  } catch (const WorkerDiedError& e) {
    EXPECT_THAT(e.what(), HasSubstr("stuck on datapoint 3 of its pass"));
    EXPECT_THAT(e.what(), HasSubstr("datapoint_timeout (0.3 s)"));
    EXPECT_THAT(e.what(), HasSubstr("SIGKILL"));
  }
}

// std::chrono's largest milliseconds: compared with the steady clock in nanoseconds, such a
// window or limit overflowed (every worker "stuck" at once; a crash at the first death).
TEST_F(Healing, AWindowAndATimeLimitBeyondAnyRunAreForEver) {
  RunnerOptions o{.num_proc = 1, .seed = kSeed, .policy = restart(1)};
  o.policy.restart_window = std::chrono::milliseconds::max();
  o.policy.datapoint_timeout = std::chrono::milliseconds::max();
  MultiProcessRunnerZMQ r(counting(std::nullopt), o);
  r.reset_state();
  for (int i = 0; i < 5; ++i) r.next(10s);
  ::kill(r.pids()[0], SIGKILL);
  for (auto end = std::chrono::steady_clock::now() + 20s;
       r.restarts() == 0 && std::chrono::steady_clock::now() < end;)
    r.next(10s);
  EXPECT_EQ(r.restarts(), 1u);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(r.next(10s));
}

TEST_F(Healing, AStuckRunnerWorkerIsReplaced) {
  RunnerOptions o{.num_proc = 1, .seed = kSeed, .policy = restart()};
  o.policy.datapoint_timeout = 300ms;
  std::string message;
  o.policy.on_restart = [&](const WorkerRestart& w) { message = w.message; };
  MultiProcessRunnerZMQ r(stuck_at_3(1), o);
  r.reset_state();
  std::vector<int64_t> got;
  for (int i = 0; i < 10; ++i) got.push_back(index_of(*r.next(10s)));
  // 0 1 2 from the first worker, then the replacement's pass from the start.
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4, 5, 6}));
  EXPECT_THAT(message, HasSubstr("stuck on datapoint 3"));
  EXPECT_EQ(r.restarts(), 1u);
}

// Map: datapoint `bad` kills its worker (first generation only), or sleeps for ever once:
// in the first worker that claims `marker` (a strict epoch sends the next pass early, so
// two workers may see a `bad`).
MapFunction dies_at(int64_t bad, int num_proc, bool sleep, std::string marker = {}) {
  return [=](TensorDict td) -> std::optional<TensorDict> {
    if (index_of(td) != bad) return td;
    if (sleep) {
      const int fd = ::open(marker.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
      if (fd < 0) return td;
      ::close(fd);
      std::this_thread::sleep_for(1h);
    }
    if (first_generation(num_proc)) ::raise(SIGKILL);
    return td;
  };
}

std::string marker_path() {
  std::string p = "/tmp/tw-healing-" + std::to_string(::getpid()) + "-" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  return p;
}

TEST_F(Healing, AStrictMapReissuesWhatADeadWorkerHeldInOrder) {
  MapOptions o{.num_proc = 1, .buffer_size = 8, .strict = true, .seed = kSeed, .policy = restart()};
  MultiProcessMapDataZMQ m(counting(40), dies_at(17, 1, false), o);
  m.reset_state();
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> got;
    for (TensorDict& dp : m.epoch()) {
      EXPECT_TRUE(testing::datapoint_ok(dp));
      got.push_back(index_of(dp));
    }
    std::vector<int64_t> want(40);
    for (int i = 0; i < 40; ++i) want[static_cast<size_t>(i)] = i;
    EXPECT_EQ(got, want) << "epoch " << epoch;  // one worker: exact order and count
  }
  EXPECT_EQ(m.restarts(), 1u);
}

TEST_F(Healing, AStrictMapStaysExactWhenWorkersAreKilledFromOutside) {
  MapOptions o{
      .num_proc = 3, .buffer_size = 16, .strict = true, .seed = kSeed, .policy = restart(10)};
  MultiProcessMapDataZMQ m(
      counting(300),
      [](TensorDict td) -> std::optional<TensorDict> {
        std::this_thread::sleep_for(1ms);
        return td;
      },
      o);
  m.reset_state();
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::map<int64_t, int> seen;
    size_t n = 0;
    for (TensorDict& dp : m.epoch()) {
      ASSERT_TRUE(testing::datapoint_ok(dp));
      ++seen[index_of(dp)];
      if (++n % 100 == 50) ::kill(m.pids()[n % 3], SIGKILL);
    }
    EXPECT_EQ(n, 300u);
    EXPECT_EQ(seen.size(), 300u);
    for (auto [i, c] : seen) EXPECT_EQ(c, 1) << i;
  }
  // A death is noticed at the consumer's next look at its workers: at once while it waits
  // for datapoints, within the liveness period while they keep coming (a consumer slower
  // than its workers, as under ASan: a kill late in the epoch was not noticed by its end).
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (m.restarts() < 6 && std::chrono::steady_clock::now() < until)
    for (TensorDict& dp : m.epoch()) ASSERT_TRUE(testing::datapoint_ok(dp));
  EXPECT_GE(m.restarts(), 5u);
}

// A replacement that hangs before it connects (here in its fork hook; in the wild, on a
// lock its parent held at the fork) would be waited for for ever by the map's dispatch:
// after 10 s of refusals it is killed, named, and replaced, and the epoch stays exact.
TEST_F(Healing, AMapWorkerThatNeverConnectsIsKilledAndReplaced) {
  MapOptions o{.num_proc = 2, .buffer_size = 8, .strict = true, .seed = kSeed, .policy = restart()};
  const std::string marker = marker_path();
  o.fork_hooks.child = [marker] {  // the worker that claims the marker hangs
    if (::unlink(marker.c_str()) == 0) ::pause();
  };
  std::vector<std::string> messages;
  o.policy.on_restart = [&](const WorkerRestart& r) { messages.push_back(r.message); };
  MultiProcessMapDataZMQ m(
      counting(40), [](TensorDict td) -> std::optional<TensorDict> { return td; }, o);
  m.reset_state();
  std::map<int64_t, int> seen;
  for (TensorDict& dp : m.epoch()) {
    if (seen.size() == 5) {
      ::close(::open(marker.c_str(), O_CREAT | O_WRONLY, 0600));  // for the replacement
      ::kill(m.pids()[0], SIGKILL);
    }
    ++seen[index_of(dp)];
  }
  EXPECT_EQ(seen.size(), 40u);
  for (auto [i, c] : seen) EXPECT_EQ(c, 1) << i;
  ASSERT_EQ(m.restarts(), 2u);
  EXPECT_THAT(messages[1], HasSubstr("had not connected 10 s after it was needed"));
  m.close();
  ::unlink(marker.c_str());
}

// Ctrl-C while the map sends a dead worker's tasks to its replacement, which connects late:
// the interrupted call throws, and the epoch goes on exact (no task left unsent, which a
// strict epoch would wait for for ever).
std::atomic<bool> g_interrupt_next{false};
void interrupt_once() {
  if (g_interrupt_next.exchange(false)) throw Interrupted("interrupted by the test");
}

// Reads an epoch of `m` with interrupt_once installed; after 5 datapoints it makes `marker`
// (for the replacement's fork hook) and kills worker 0. `on_interrupt` runs for each
// Interrupted. How many times each datapoint came.
template <class OnInterrupt>
std::map<int64_t, int> epoch_killing_worker_0(MultiProcessMapDataZMQ& m, const std::string& marker,
                                              OnInterrupt&& on_interrupt) {
  set_interrupt_check(interrupt_once);
  std::map<int64_t, int> seen;
  bool killed = false;
  Epoch epoch = m.epoch();
  while (true) {
    std::optional<TensorDict> dp;
    try {
      dp = epoch.next(Timeout(30s));
    } catch (const Interrupted&) {
      on_interrupt();
      continue;
    }
    if (!dp) {
      EXPECT_TRUE(epoch.done()) << "no datapoint for 30 s: a task was lost";
      break;
    }
    ++seen[index_of(*dp)];
    if (seen.size() == 5 && !killed) {
      ::close(::open(marker.c_str(), O_CREAT | O_WRONLY, 0600));  // for the replacement
      killed = ::kill(m.pids()[0], SIGKILL) == 0;  // no ASSERT: the interrupt check stays set
      EXPECT_TRUE(killed);
    }
  }
  set_interrupt_check(nullptr);
  return seen;
}

TEST_F(Healing, AMapInterruptedWhileItSendsADeadWorkersTasksAgainLosesNothing) {
  MapOptions o{.num_proc = 1, .buffer_size = 8, .strict = true, .seed = kSeed, .policy = restart()};
  const std::string marker = marker_path();
  o.fork_hooks.child = [marker] {  // the replacement connects a second late
    if (::unlink(marker.c_str()) == 0) std::this_thread::sleep_for(1s);
  };
  o.policy.on_restart = [](const WorkerRestart&) { g_interrupt_next = true; };
  MultiProcessMapDataZMQ m(
      counting(40), [](TensorDict td) -> std::optional<TensorDict> { return td; }, o);
  m.reset_state();
  int interrupted = 0;
  const std::map<int64_t, int> seen = epoch_killing_worker_0(m, marker, [&] { ++interrupted; });
  EXPECT_EQ(interrupted, 1);
  EXPECT_EQ(seen.size(), 40u);
  for (auto [i, c] : seen) EXPECT_EQ(c, 1) << i;
  EXPECT_EQ(m.restarts(), 1u);
  m.close();
  ::unlink(marker.c_str());
}

// 0 .. n-1 in the first pass, 1000 .. 1000 + n-1 in the second, and so on: a worker that
// maps the next pass's datapoints early (the map prefetches a pass) maps other values.
class PassNumbered : public DataFlow {
 public:
  explicit PassNumbered(size_t n) : n_(n) {}
  void start() override {
    ++pass_;
    i_ = 0;
  }
  std::optional<TensorDict> next() override {
    if (i_ == n_) return std::nullopt;
    return testing::make_datapoint(1000 * pass_ + i_++);
  }
  std::optional<size_t> size() const override { return n_; }

 private:
  size_t n_;
  uint64_t pass_ = ~uint64_t{0};  // the first start() makes it 0
  uint64_t i_ = 0;
};

// As above, and the late replacement dies too before the tasks left unsent by the
// interruption are sent: the next replacement gets each of them once (they were queued a
// second time, sent twice, and their second results dropped).
TEST_F(Healing, AMapWhoseReplacementDiesBeforeItsTasksAreSentAgainSendsEachOnce) {
  MapOptions o{.num_proc = 1, .buffer_size = 8, .strict = true, .seed = kSeed, .policy = restart()};
  const std::string marker = marker_path();
  const std::string log = marker + ".log";
  o.fork_hooks.child = [marker] {  // the first replacement connects a second late
    if (::unlink(marker.c_str()) == 0) std::this_thread::sleep_for(1s);
  };
  o.policy.on_restart = [](const WorkerRestart& r) {
    if (r.restarts == 1) g_interrupt_next = true;
  };
  MultiProcessMapDataZMQ m(
      std::make_shared<PassNumbered>(40),  // pass 1's datapoints are not pass 0's again
      [log](TensorDict td) -> std::optional<TensorDict> {
        const int64_t entry[2] = {::getpid(), index_of(td)};  // which worker mapped what
        const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0600);
        if (fd < 0 || ::write(fd, entry, sizeof entry) != sizeof entry) std::abort();
        ::close(fd);
        return td;
      },
      o);
  m.reset_state();
  const std::map<int64_t, int> seen = epoch_killing_worker_0(m, marker, [&] {
    ::kill(m.pids()[0], SIGKILL);  // the replacement, still asleep before it connects
  });
  m.close();
  EXPECT_EQ(seen.size(), 40u);
  for (auto [i, c] : seen) EXPECT_EQ(c, 1) << i;
  EXPECT_EQ(m.restarts(), 2u);
  std::map<std::pair<int64_t, int64_t>, int> mapped;
  std::ifstream in(log, std::ios::binary);
  for (int64_t e[2]; in.read(reinterpret_cast<char*>(e), sizeof e);) ++mapped[{e[0], e[1]}];
  EXPECT_GE(mapped.size(), 40u);
  for (auto [who, c] : mapped)
    EXPECT_EQ(c, 1) << "worker " << who.first << ", datapoint " << who.second;
  ::unlink(marker.c_str());
  ::unlink(log.c_str());
}

TEST_F(Healing, AStuckMapWorkerIsKilledAndItsDatapointNamed) {
  MapOptions o{.num_proc = 2, .buffer_size = 8, .strict = true, .seed = kSeed};
  o.policy.datapoint_timeout = 300ms;
  const std::string marker = marker_path();
  MultiProcessMapDataZMQ m(counting(20), dies_at(5, 2, true, marker), o);
  m.reset_state();
  try {
    // Two epochs: a worker slow to start may leave pass 0's 5 to be done after pass 1's.
    for (int epoch = 0; epoch < 2; ++epoch)
      for (TensorDict& dp : m.epoch()) (void)dp;
    FAIL() << "no error";
  } catch (const WorkerDiedError& e) {
    // Pass 0's, or pass 1's when that one reached a worker first (prefetched).
    EXPECT_THAT(e.what(), ::testing::ContainsRegex("stuck on datapoint 5 of pass [01] "));
  }
  m.close();  // first: a worker may claim the marker again on a prefetched pass
  ::unlink(marker.c_str());
}

TEST_F(Healing, AStuckMapWorkerIsReplacedAndTheEpochStaysExact) {
  MapOptions o{.num_proc = 2, .buffer_size = 8, .strict = true, .seed = kSeed, .policy = restart()};
  o.policy.datapoint_timeout = 300ms;
  const std::string marker = marker_path();
  MultiProcessMapDataZMQ m(counting(20), dies_at(5, 2, true, marker), o);
  m.reset_state();
  // Two epochs: the stuck datapoint may be pass 1's (prefetched by a worker started first).
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::map<int64_t, int> seen;
    for (TensorDict& dp : m.epoch()) ++seen[index_of(dp)];
    EXPECT_EQ(seen.size(), 20u);
    for (auto [i, c] : seen) EXPECT_EQ(c, 1) << i;
  }
  EXPECT_EQ(m.restarts(), 1u);
  m.close();  // first: a worker may claim the marker again on a prefetched pass
  ::unlink(marker.c_str());
}

// A datapoint every worker gets stuck on: killed after datapoint_timeout, the deaths are
// further apart than restart_window / max_restarts, so the window alone never stopped the
// loop (replaced for ever). The datapoint's own count ends the run.
TEST_F(Healing, ADatapointEveryWorkerIsStuckOnEndsTheRunWhateverTheWindow) {
  MapOptions o{
      .num_proc = 1, .buffer_size = 4, .strict = true, .seed = kSeed, .policy = restart(1)};
  o.policy.restart_window = 100ms;  // shorter than the gap between two kills
  o.policy.datapoint_timeout = 300ms;
  MultiProcessMapDataZMQ m(
      counting(10),
      [](TensorDict td) -> std::optional<TensorDict> {
        if (index_of(td) == 5) std::this_thread::sleep_for(1h);
        return td;
      },
      o);
  m.reset_state();
  try {
    for (TensorDict& dp : m.epoch()) EXPECT_LT(index_of(dp), 5);
    FAIL() << "no error";
  } catch (const WorkerDiedError& e) {
    EXPECT_THAT(e.what(), HasSubstr("stuck on datapoint 5 of pass 0"));
    EXPECT_THAT(e.what(), HasSubstr("2 workers died on datapoint 5 of pass 0, more than "
                                    "max_restarts (1), so the run ends"));
  }
  EXPECT_EQ(m.restarts(), 1u);
}

// Endless: 0, 1, 2, ... in each worker, stuck at `position` while `stuck()` says so.
std::shared_ptr<DataFlow> stuck_at(uint64_t position, bool (*stuck)()) {
  return std::make_shared<FunctionFlow>(
      [position, stuck](uint64_t i) {
        if (i == position && stuck()) std::this_thread::sleep_for(1h);
        return testing::make_datapoint(i);
      },
      std::nullopt);
}

TEST_F(Healing, APositionEveryRunnerWorkerIsStuckAtEndsTheRunWhateverTheWindow) {
  RunnerOptions o{.num_proc = 1, .seed = kSeed, .policy = restart(2)};
  o.policy.restart_window = 100ms;
  o.policy.datapoint_timeout = 300ms;
  MultiProcessRunnerZMQ r(stuck_at(3, [] { return true; }), o);  // each worker's 4th datapoint
  r.reset_state();
  try {
    for (auto end = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < end;)
      r.next(10s);
    FAIL() << "no error";
  } catch (const WorkerDiedError& e) {
    EXPECT_THAT(e.what(), HasSubstr("3 workers died on datapoint 3 of its pass, more than "
                                    "max_restarts (2), so the run ends"));
  }
  EXPECT_EQ(r.restarts(), 2u);
}

// Each worker stuck once at the same position of its own pass: three datapoints, not one.
TEST_F(Healing, WorkersStuckOnceEachAtOnePositionOfTheirPassesGoOn) {
  RunnerOptions o{.num_proc = 3, .seed = kSeed, .policy = restart(2)};
  o.policy.datapoint_timeout = 300ms;
  MultiProcessRunnerZMQ r(stuck_at(1, [] { return first_generation(3); }), o);
  r.reset_state();
  for (auto end = std::chrono::steady_clock::now() + 30s;
       r.restarts() < 3 && std::chrono::steady_clock::now() < end;)
    ASSERT_TRUE(testing::datapoint_ok(*r.next(10s)));
  EXPECT_EQ(r.restarts(), 3u);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(testing::datapoint_ok(*r.next(10s)));
}

// Task arenas mapped by this process (the map's pool grows a segment when none has room).
size_t task_segments() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> names;
  for (std::string line; std::getline(maps, line);)
    if (auto at = line.find("tensorwire:dataflow-map-tasks-"); at != std::string::npos)
      names.insert(line.substr(at));
  return names.size();
}

// Each death left the task chunks the dead worker never released allocated for good: with
// a deep buffer of large datapoints, a few deaths made the pool grow segment after segment.
TEST_F(Healing, TheTaskChunksADeadMapWorkerHeldAreGivenBack) {
  MapOptions o{.num_proc = 1, .buffer_size = 32, .seed = kSeed, .policy = restart(100)};
  MultiProcessMapDataZMQ m(
      counting(std::nullopt, 64 << 10),
      [](TensorDict td) -> std::optional<TensorDict> {
        std::this_thread::sleep_for(2ms);  // so that the queue stays full of tasks
        return td;
      },
      o);
  m.reset_state();
  size_t n = 0;
  uint64_t kills = 0;
  for (TensorDict& dp : m.epoch()) {  // endless: the loop ends it
    ASSERT_TRUE(testing::datapoint_ok(dp));
    if (++n == 100) {
      ASSERT_EQ(task_segments(), 1u);
    }
    if (n % 100 == 0 && m.restarts() == kills) {  // the last kill was healed: kill again
      if (kills == 8) break;
      ::kill(m.pids()[0], SIGKILL);
      ++kills;
    }
  }
  EXPECT_EQ(m.restarts(), 8u);
  EXPECT_EQ(task_segments(), 1u);
}

TEST(HealingArguments, BadPoliciesAreValueErrorsNamingTheArgument) {
  auto msg = [](auto make) -> std::string {
    try {
      make();
    } catch (const ValueError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(msg([] { parse_on_worker_death("retry"); }),
              HasSubstr("on_worker_death must be 'raise' or 'restart', got 'retry'"));
  EXPECT_EQ(parse_on_worker_death("restart"), OnWorkerDeath::Restart);
  EXPECT_THAT(msg([] { MultiProcessRunnerZMQ(counting(4), {.policy = {.max_restarts = -1}}); }),
              HasSubstr("max_restarts must be 0 or more, got -1"));
  EXPECT_THAT(msg([] { MultiProcessRunnerZMQ(counting(4), {.policy = {.restart_window = 0ms}}); }),
              HasSubstr("restart_window must be positive"));
  EXPECT_THAT(msg([] {
                MapOptions o;
                o.policy.datapoint_timeout = 0ms;
                MultiProcessMapDataZMQ(
                    counting(4), [](TensorDict td) { return td; }, o);
              }),
              HasSubstr("datapoint_timeout must be positive"));
  EXPECT_THAT(msg([] { MultiProcessRunnerZMQ(counting(4), {.liveness_interval = 0ms}); }),
              HasSubstr("liveness_interval must be positive, got 0"));
  EXPECT_THAT(msg([] {
                MapOptions o;
                o.liveness_interval = -5ms;
                MultiProcessMapDataZMQ(
                    counting(4), [](TensorDict td) { return td; }, o);
              }),
              HasSubstr("liveness_interval must be positive"));
}

}  // namespace
}  // namespace tensorwire::dataflow
