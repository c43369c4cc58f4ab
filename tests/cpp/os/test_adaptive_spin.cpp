// AdaptiveSpin: the budget a poll_for() spin learns, and after fork(): a child forked while
// another thread of its parent measures pause_ns() must not block on that measurement
// (`tensorwire demo` forked its actors while the server thread measured it; the actors
// waited for ever on their first reply).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "os/adaptive_spin.h"

namespace tensorwire::os {
namespace {

// ctest runs each test in a process of its own, so the thread below makes the process's
// first measurement, and the fork lands while it runs (it takes a few hundred microseconds
// to milliseconds). Run in a binary that measured before, the test passes trivially.
TEST(AdaptiveSpin, AChildForkedDuringTheFirstMeasurementMeasuresItself) {
  std::atomic<bool> measuring{false};
  std::thread measurer([&] {
    measuring.store(true);
    EXPECT_GT(AdaptiveSpin::pause_ns(), 0);
  });
  while (!measuring.load()) {
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(10);  // a child blocked on its parent's measurement dies of SIGALRM
    ::_exit(AdaptiveSpin::pause_ns() > 0 ? 0 : 1);
  }
  measurer.join();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child "
      << (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? "blocked on the parent's measurement"
                                                             : "failed");
}

TEST(AdaptiveSpin, APollForSpinEndsWhenThePollSucceeds) {
  AdaptiveSpin spin = AdaptiveSpin::lasting(std::chrono::seconds(1));
  int looks = 0;
  EXPECT_TRUE(spin.poll_for([&] { return ++looks == 3; }));
  EXPECT_EQ(looks, 3);
  // The budget became twice that wait (two sched_yield calls): far below the 1 s maximum.
  EXPECT_LT(spin.budget(), spin.max_spins() / 2);
}

TEST(AdaptiveSpin, AMissHalvesTheBudgetAndASleepReportedTeachesIt) {
  AdaptiveSpin spin = AdaptiveSpin::lasting(std::chrono::microseconds(200));
  const uint32_t max = spin.max_spins();
  int looks = 0;
  EXPECT_FALSE(spin.poll_for([&] { return ++looks, false; }));
  EXPECT_GT(looks, 0);
  EXPECT_EQ(spin.budget(), max / 2);
  spin.learn_wait(std::chrono::seconds(1));  // a long sleep: the budget halves again
  EXPECT_EQ(spin.budget(), max / 4);
  spin.learn_wait(std::chrono::microseconds(20));  // a short one: twice it
  const auto twice = static_cast<uint32_t>(40'000 / AdaptiveSpin::pause_ns());
  EXPECT_NEAR(spin.budget(), std::max<uint32_t>(twice, 8), 1);
}

TEST(AdaptiveSpin, ABudgetOfZeroLooksOnlyOnEverySixtyFourthWait) {
  AdaptiveSpin spin = AdaptiveSpin::lasting(std::chrono::microseconds(50));
  int looks = 0;
  auto never = [&] { return ++looks, false; };
  while (spin.budget() > 0) spin.poll_for(never);  // misses halve it to nothing
  int waits_that_looked = 0;
  for (int i = 0; i < 128; ++i) {
    const int before = looks;
    EXPECT_FALSE(spin.poll_for(never));
    waits_that_looked += looks > before;
  }
  // A probe every 64th wait spins the full maximum, so the budget can come back.
  EXPECT_EQ(waits_that_looked, 2);
}

}  // namespace
}  // namespace tensorwire::os

namespace tensorwire::os {
namespace {

// spin_phases says how a spin ended, which ucx::WorkerWait learns from: what came within the
// busy phase (before any sched_yield), after it, or not at all within the budget.
TEST(SpinPhases, SaysWhetherWhatCameCameBeforeTheSpinYielded) {
  using namespace std::chrono_literals;
  int polls = 0;
  EXPECT_EQ(spin_phases(0us, 50us, [&] { return ++polls == 1; }), Spun::Busy);
  polls = 0;
  EXPECT_EQ(spin_phases(1ms, 2ms, [&] { return ++polls == 50; }), Spun::Busy);
  polls = 0;
  EXPECT_EQ(spin_phases(0us, 1s, [&] { return ++polls == 3; }), Spun::Yielding);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(spin_phases(100us, 2ms, [] { return false; }), Spun::Missed);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 2ms);  // the whole budget, no longer
  EXPECT_FALSE(spin_for(1ms, [] { return false; }));
  EXPECT_TRUE(spin_for(1ms, [] { return true; }));
}

}  // namespace
}  // namespace tensorwire::os
