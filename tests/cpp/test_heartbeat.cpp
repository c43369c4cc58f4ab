// The liveness thread (src/runtime/heartbeat.h): registered objects are beaten at their
// period until they expire; a forked child gets a thread of its own.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "runtime/heartbeat.h"

using namespace std::chrono_literals;
namespace rt = tensorwire::runtime;

namespace {

struct Counter : rt::Beating {
  explicit Counter(std::shared_ptr<std::atomic<int>> n) : beats(std::move(n)) {}
  void beat() noexcept override { beats->fetch_add(1); }
  std::shared_ptr<std::atomic<int>> beats;
};

// Waits (at most 10 s) until `n` reaches `at_least`.
bool reaches(const std::atomic<int>& n, int at_least) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (n.load() < at_least && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  return n.load() >= at_least;
}

}  // namespace

TEST(LivenessThread, BeatsEachRegisteredObjectUntilItExpires) {
  auto fast = std::make_shared<std::atomic<int>>(0);
  auto slow = std::make_shared<std::atomic<int>>(0);
  auto a = std::make_shared<Counter>(fast);
  auto b = std::make_shared<Counter>(slow);
  rt::keep_alive(a->weak_from_this(), 10ms);
  rt::keep_alive(b->weak_from_this(), 50ms);
  EXPECT_TRUE(reaches(*fast, 5));
  EXPECT_TRUE(reaches(*slow, 2));
  a.reset();  // expired: never beaten again, once a round that held it already is over
  EXPECT_TRUE(reaches(*slow, slow->load() + 2));
  const int frozen = fast->load();
  EXPECT_TRUE(reaches(*slow, slow->load() + 3)) << "the other object is still beaten";
  EXPECT_EQ(fast->load(), frozen);
  b.reset();
}

TEST(LivenessThread, StartsAgainAfterEveryObjectExpired) {
  for (int round = 0; round < 3; ++round) {
    auto n = std::make_shared<std::atomic<int>>(0);
    auto c = std::make_shared<Counter>(n);
    rt::keep_alive(c->weak_from_this(), 10ms);
    EXPECT_TRUE(reaches(*n, 2)) << "round " << round;
    c.reset();
    std::this_thread::sleep_for(30ms);  // the thread sees nothing left and ends
  }
}

TEST(LivenessThread, AForkedChildBeatsItsOwnObjects) {
  auto parent_beats = std::make_shared<std::atomic<int>>(0);
  auto parent = std::make_shared<Counter>(parent_beats);
  rt::keep_alive(parent->weak_from_this(), 10ms);
  ASSERT_TRUE(reaches(*parent_beats, 1));
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The parent's thread does not exist here; the child's object gets a new one.
    auto n = std::make_shared<std::atomic<int>>(0);
    auto c = std::make_shared<Counter>(n);
    rt::keep_alive(c->weak_from_this(), 10ms);
    ::_exit(reaches(*n, 3) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  const int before = parent_beats->load();
  EXPECT_TRUE(reaches(*parent_beats, before + 2)) << "the parent's object is still beaten";
}
