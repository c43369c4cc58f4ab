// AdaptiveSpin after fork(): a child forked while another thread of its parent measures
// pause_ns() must not block on that measurement (`tensorwire demo` forked its actors while
// the server thread measured it; the actors waited for ever on their first reply).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

}  // namespace
}  // namespace tensorwire::os
