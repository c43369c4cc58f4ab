// AdaptiveSpin: spin-then-futex waiting on a WaitWord, with a spin budget that follows
// the waits this waiter actually sees.
//
// Spinning only pays when the answer comes while we spin, which needs the other side to
// be running on another CPU at that moment. On a quiet machine the partner answers within
// a microsecond and a short spin saves a futex sleep and wake-up (several to tens of
// microseconds on a virtual machine). On an oversubscribed machine the partner may be
// descheduled for milliseconds and every spin burns CPU time the partner needs. So the
// budget tracks recent waits: after a wait of t (spinning or sleeping), the next spin
// lasts about 2t when 2t fits under the maximum, and the budget halves otherwise. Every
// 64th wait spins the full maximum once, so a budget that fell to zero can come back
// when the machine quietens.
//
// The CPU cost is bounded by the maximum: a waiter never spins longer than max_spins
// pause iterations (pause_ns() each) before it sleeps in the kernel.
//
// Thread-safety: wait() may be called concurrently; the shared estimate then only gets
// less accurate (it is a relaxed atomic).
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "os/futex.h"

namespace tensorwire::os {

// Runs `poll` (one attempt; true once it succeeded) until it succeeds or `budget` has
// passed, yielding the CPU after each failed attempt. Spinning only pays while the peer
// runs on another CPU. On a loaded machine the scheduler often puts the two ends of a
// ping-pong on one CPU (a loopback wake-up is "sync": the woken process goes to the
// waker's CPU), and a plain spin then keeps the peer from running until the spin ends:
// each hop cost the whole 50 us spin plus a wake-up (1 KiB round trip 72 us one way over
// TCP, 58-128 us over shared memory, against 1-11 us; docs/benchmarks.md). sched_yield()
// hands the CPU to a peer that is runnable here at once, and is one system call otherwise.
//
// spin_phases() puts a busy phase first: for `busy`, `poll` is called back to back (a pause
// between) without giving the CPU up, then as spin_for() until `budget`. A reply from a
// peer on another CPU is then seen without a system call in the way (1 KiB over the pipe's
// shared memory, one way: 1.4-1.6 -> 0.8-1.1 us here); the busy phase is wasted when the
// peer waits for this very CPU (3.2 -> 6.3 us), so callers choose it from how their last
// waits ended (ucx::WorkerWait). Says how the spin ended.
enum class Spun { Missed, Busy, Yielding };

template <class Poll>
Spun spin_phases(std::chrono::steady_clock::duration busy,
                 std::chrono::steady_clock::duration budget, Poll&& poll) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto busy_until = start + std::min(busy, budget);
  const auto until = start + budget;
  if (poll()) return Spun::Busy;
  while (Clock::now() < busy_until) {
    cpu_relax();
    if (poll()) return Spun::Busy;
  }
  while (Clock::now() < until) {
    ::sched_yield();
    // A yield on a loaded machine can last milliseconds: no poll once the budget is over.
    if (Clock::now() >= until) break;
    if (poll()) return Spun::Yielding;
  }
  return Spun::Missed;
}

template <class Poll>
bool spin_for(std::chrono::steady_clock::duration budget, Poll&& poll) {
  return spin_phases(std::chrono::steady_clock::duration::zero(), budget,
                     std::forward<Poll>(poll)) != Spun::Missed;
}

class AdaptiveSpin {
 public:
  explicit AdaptiveSpin(uint32_t max_spins = 400) noexcept : max_(max_spins), budget_(max_spins) {}
  AdaptiveSpin(const AdaptiveSpin& o) noexcept : max_(o.max_), budget_(o.budget()) {}
  AdaptiveSpin& operator=(const AdaptiveSpin& o) noexcept {
    max_ = o.max_;
    budget_.store(o.budget(), std::memory_order_relaxed);
    return *this;
  }

  // As WaitWord::wait: returns the new seq, or `seen` at the deadline or when alive()
  // turns false (alive is polled only after a sleep that ended with no change). `word` is
  // a WaitWord or a WaitBits::Bit.
  template <class Word, class Alive>
  uint32_t wait(Word&& word, uint32_t seen, std::chrono::steady_clock::time_point deadline,
                Alive&& alive, std::chrono::milliseconds poll = std::chrono::milliseconds(100));

  // Spins for a change of `word` within the budget, never sleeps: the new seq, or `seen` when
  // none came. For a waiter that sleeps elsewhere (on an fd). A miss halves the budget (the
  // time spun says nothing about when the change will come).
  template <class Word>
  uint32_t spin(Word&& word, uint32_t seen);

  // The same learning for a waiter whose event is found by looking rather than on a word
  // (a UCX worker to progress, a queue under a mutex): spin_for() with the budget, calling
  // `poll` (one look: true once the event came). True when it came; a miss halves the
  // budget, and a waiter that then sleeps reports its whole wait with learn_wait() (which
  // poll_or_sleep() does).
  template <class Poll>
  bool poll_for(Poll&& poll);
  void learn_wait(std::chrono::steady_clock::duration waited) noexcept { learn(waited); }
  // poll_for(), then `sleep()` when the spin missed, learning from the whole wait: how a
  // waiter that sleeps elsewhere (an fd, a condition variable) uses it. True when the spin
  // caught the event.
  template <class Poll, class Sleep>
  bool poll_or_sleep(Poll&& poll, Sleep&& sleep);
  // An AdaptiveSpin whose longest spin lasts about `longest`.
  static AdaptiveSpin lasting(std::chrono::nanoseconds longest) noexcept {
    const double spins = static_cast<double>(longest.count()) / pause_ns();
    return AdaptiveSpin(static_cast<uint32_t>(std::min(spins, double{UINT32_MAX})));
  }

  uint32_t budget() const noexcept { return budget_.load(std::memory_order_relaxed); }
  uint32_t max_spins() const noexcept { return max_; }
  // Nanoseconds one pause iteration takes on this machine (measured once, then cached).
  static double pause_ns() noexcept;

 private:
  void learn(std::chrono::steady_clock::duration waited) noexcept;
  // This wait's spins: the budget, or the maximum on every 64th wait (a probe).
  uint32_t spins_now() noexcept {
    if ((waits_.fetch_add(1, std::memory_order_relaxed) & 63) == 63) return max_;
    return budget_.load(std::memory_order_relaxed);
  }
  uint32_t max_;
  std::atomic<uint32_t> budget_;
  std::atomic<uint32_t> waits_{0};
};

template <class Word, class Alive>
uint32_t AdaptiveSpin::wait(Word&& word, uint32_t seen,
                            std::chrono::steady_clock::time_point deadline, Alive&& alive,
                            std::chrono::milliseconds poll) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const uint32_t spins = spins_now();
  if (spins > 0) {
    // A deadline in the past: spin `spins` times, then return without sleeping.
    uint32_t now = word.wait(
        seen, clock::time_point{}, [] { return true; }, SpinPolicy{spins});
    if (now != seen) {
      learn(clock::now() - t0);
      return now;
    }
  }
  uint32_t now = word.wait(seen, deadline, alive, SpinPolicy{0}, poll);
  learn(clock::now() - t0);
  return now;
}

template <class Word>
uint32_t AdaptiveSpin::spin(Word&& word, uint32_t seen) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const uint32_t spins = spins_now();
  if (spins == 0) return seen;
  const uint32_t now = word.wait(
      seen, clock::time_point{}, [] { return true; }, SpinPolicy{spins});
  if (now != seen)
    learn(clock::now() - t0);
  else
    budget_.store(budget_.load(std::memory_order_relaxed) / 2, std::memory_order_relaxed);
  return now;
}

template <class Poll>
bool AdaptiveSpin::poll_for(Poll&& poll) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const uint32_t spins = spins_now();
  if (spins == 0) return false;
  const auto budget = std::chrono::nanoseconds(static_cast<int64_t>(spins * pause_ns()));
  if (spin_for(budget, poll)) {
    learn(clock::now() - t0);
    return true;
  }
  budget_.store(budget_.load(std::memory_order_relaxed) / 2, std::memory_order_relaxed);
  return false;
}

template <class Poll, class Sleep>
bool AdaptiveSpin::poll_or_sleep(Poll&& poll, Sleep&& sleep) {
  const auto t0 = std::chrono::steady_clock::now();
  if (poll_for(poll)) return true;
  sleep();
  learn(std::chrono::steady_clock::now() - t0);
  return false;
}

}  // namespace tensorwire::os
