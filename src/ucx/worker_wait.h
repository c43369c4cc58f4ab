// WorkerWait: how threads that share one UCX worker (under their owner's mutex) sleep until
// it may progress, written once for every UCX connection (the pipe, the remote inference
// client).
//
// Two threads may wait on one worker (a send and a receive, two requests): one's progress
// can take the event the other sleeps for (the message lands in UCX's unexpected queue and
// the worker's fd stays quiet). So a waiter counts itself as a sleeper, and progress that
// found something while anyone sleeps writes the kick eventfd the sleepers also poll.
#pragma once

#include <poll.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "os/unix_socket.h"
#include "tensorwire/runtime/timeout.h"
#include "ucx/ucx.h"

namespace tensorwire::ucx {

// Runs `poll` (one attempt; true once it succeeded) until it succeeds or `budget` has
// passed, yielding the CPU after each failed attempt. Spinning only pays while the peer
// runs on another CPU. On a loaded machine the scheduler often puts the two ends of a
// ping-pong on one CPU (a loopback wake-up is "sync": the woken process goes to the
// waker's CPU), and a plain spin then keeps the peer from running until the spin ends:
// each hop cost the whole 50 us spin plus a wake-up (1 KiB round trip 72 us one way over
// TCP, 58-128 us over shared memory, against 1-11 us; docs/benchmarks.md). sched_yield()
// hands the CPU to a peer that is runnable here at once, and is one system call otherwise.
template <class Poll>
bool spin_for(Clock::duration budget, Poll&& poll) {
  const auto until = Clock::now() + budget;
  do {
    if (poll()) return true;
    ::sched_yield();
  } while (Clock::now() < until);
  return false;
}

class WorkerWait {
 public:
  WorkerWait();  // SystemError when no eventfd can be made

  // Progress that wakes the sleepers when it found something. Under the owner's mutex.
  unsigned progress(Worker& worker);
  // Wakes every sleeper (the owner failed: each must see it). Any thread.
  void wake_all(Worker& worker) noexcept;

  // Sleeps until `worker` may progress or `slice` passes; `seen` is worker.events() from
  // before the caller's last poll (returns at once if anything progressed since). First
  // spins for 50 us (spin_for: a reply is often microseconds away), progressing under `mu`.
  // Then `check()` (under `mu`) says whether to sleep (false: the owner failed or closed,
  // look again at once); the worker is armed and the thread
  // polls the worker's fd, the kick eventfd and `extra_fd` (when >= 0).
  template <class Check>
  void wait(Worker& worker, std::mutex& mu, Deadline slice, uint64_t seen, Check&& check,
            int extra_fd = -1);

 private:
  void drain_kick() noexcept;
  os::Fd kick_;
  std::atomic<int> sleepers_{0};
};

template <class Check>
void WorkerWait::wait(Worker& worker, std::mutex& mu, Deadline slice, uint64_t seen, Check&& check,
                      int extra_fd) {
  // progress(), not worker.progress(): what this spin takes in may be what another thread
  // sleeps for, and it is kicked awake like any other progress would kick it.
  if (spin_for(std::chrono::microseconds(50), [&] {
        std::lock_guard<std::mutex> lock(mu);
        return progress(worker) != 0;
      }))
    return;
  if (slice.passed()) return;
  // Counted as a sleeper from here on, and back to polling if anything progressed since
  // the caller's poll began: an event another thread takes from now on kicks us awake.
  sleepers_.fetch_add(1, std::memory_order_acq_rel);
  struct Leave {
    std::atomic<int>& n;
    ~Leave() { n.fetch_sub(1, std::memory_order_acq_rel); }
  } leave{sleepers_};
  if (worker.events() != seen) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!check() || progress(worker) || !worker.arm()) return;
  }
  struct pollfd fds[3] = {
      {worker.efd(), POLLIN, 0}, {kick_.get(), POLLIN, 0}, {extra_fd, POLLIN, 0}};
  ::poll(fds, extra_fd >= 0 ? 3 : 2, slice.poll_ms());
  if (fds[1].revents & POLLIN) drain_kick();
}

}  // namespace tensorwire::ucx
