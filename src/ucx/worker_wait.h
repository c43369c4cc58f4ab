// WorkerWait: how threads that share one UCX worker (under their owner's mutex) sleep until
// it may progress, written once for every UCX connection (the pipe, the remote inference
// client).
//
// Two threads may wait on one worker (a send and a receive, two requests): one's progress
// can take the event the other sleeps for (the message lands in UCX's unexpected queue and
// the worker's fd stays quiet). So a waiter counts itself as a sleeper, and progress that
// found something while anyone sleeps writes the kick eventfd the sleepers also poll.
//
// A worker that cannot be armed. UCX's shared-memory transport (mm: sysv, posix) refuses to
// arm while a send waits for room in the peer's receive FIFO (ucp_worker_arm is BUSY
// "if we have outstanding send operations"), and the peer frees that room by moving a
// counter in shared memory, with no signal. A sender faster than its receiver (64 KiB
// messages: a message is ~9 FIFO elements of 64, the receiver frees 32 at a time) is
// stalled like that most of the time, and a wait that returns to polling whenever arming
// fails never sleeps: four clients of one server each burnt a CPU share as large as the
// server's (0 voluntary context switches a message, docs/benchmarks.md). So a waiter
// whose worker still cannot be armed after a progress that found nothing sleeps on the
// kick eventfd and the extra fd for a bounded time that doubles while nothing progresses
// (kStalledSleepMin..kStalledSleepMax), and waits do not spin first until one can arm
// again (a sender stalled once is stalled again after its next few FIFO elements). The
// worker's own fd is left out of that sleep: unarmed, it may stay readable and end every sleep.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "os/adaptive_spin.h"
#include "os/unix_socket.h"
#include "tensorwire/runtime/timeout.h"
#include "ucx/ucx.h"

namespace tensorwire::ucx {

class WorkerWait {
 public:
  WorkerWait();  // SystemError when no eventfd can be made

  // Progress that wakes the sleepers when it found something. Under the owner's mutex.
  unsigned progress(Worker& worker);
  // Wakes every sleeper (the owner failed: each must see it). Any thread.
  void wake_all(Worker& worker) noexcept;

  // Sleeps until `worker` may progress or `slice` passes; `seen` is worker.events() from
  // before the caller's last poll (returns at once if anything progressed since). First
  // spins for 50 us (os::spin_phases: a reply is often microseconds away), progressing under
  // `mu`.
  // Then `check()` (under `mu`) says whether to sleep (false: the owner failed or closed,
  // look again at once); the worker is armed (arm()) and the thread
  // polls the worker's fd, the kick eventfd and `extra_fd` (when >= 0).
  template <class Check>
  void wait(Worker& worker, std::mutex& mu, Deadline slice, uint64_t seen, Check&& check,
            int extra_fd = -1);

  // Arms `worker` for a sleep on its fd, under the owner's mutex: Progressed (events came
  // in: look at them instead), Armed, or Refused (stalled on the peer, above). The mm
  // transport's first arm after a wake-up fails on a stale signal that the failed arm
  // drains, so after a progress that finds nothing it arms once more; not while stalled,
  // where a refusal is the stall again (two system calls saved). The pipe's arm() for
  // asyncio (pipe.py) is this one too.
  enum class Arm { Progressed, Armed, Refused };
  Arm arm(Worker& worker);

  // The sleep of a waiter whose worker cannot be armed (above): the shortest and the
  // longest. A receiver that frees FIFO room still has about as much queued (32
  // elements: 3.5 messages of 64 KiB, ~100 us of its work here); with four clients on a
  // loaded machine a stall lasts ms. Growing from the shortest again after any progress,
  // a sleep overshoots the peer's freeing room by at most its own length.
  static constexpr std::chrono::nanoseconds kStalledSleepMin{20'000};
  static constexpr std::chrono::nanoseconds kStalledSleepMax{1'000'000};

 private:
  void drain_kick() noexcept;
  // Sleeps on the kick eventfd and `extra_fd` for the next stalled sleep (or until `slice`).
  void sleep_stalled(Deadline slice, int extra_fd) noexcept;
  os::Fd kick_;
  std::atomic<int> sleepers_{0};
  // The last stalled sleep (ns); 0 once progress found something.
  std::atomic<int64_t> stalled_ns_{0};
  // The last wait ended stalled: the next one does not spin (until one can arm again).
  std::atomic<bool> stalled_{false};
  // The spin's busy phase (os::spin_phases) pays while what it waits for comes within it
  // (a peer on another CPU). Once kBusyMisses waits in a row saw it come only after the
  // spin yielded (the peer waited for this CPU), waits skip it but every kBusyRetry-th,
  // which looks again. One slow reply on a quiet machine does not turn it off.
  static constexpr std::chrono::microseconds kBusySpin{3};
  static constexpr uint32_t kBusyMisses = 4;
  static constexpr uint32_t kBusyRetry = 32;
  std::atomic<uint32_t> busy_misses_{0};
  std::atomic<uint32_t> waits_{0};
};

template <class Check>
void WorkerWait::wait(Worker& worker, std::mutex& mu, Deadline slice, uint64_t seen, Check&& check,
                      int extra_fd) {
  // progress(), not worker.progress(): what this spin takes in may be what another thread
  // sleeps for, and it is kicked awake like any other progress would kick it. No spin while
  // stalled: the peer's room comes after its work on several messages, not microseconds.
  if (!stalled_.load(std::memory_order_relaxed)) {
    const bool try_busy = busy_misses_.load(std::memory_order_relaxed) < kBusyMisses ||
                          waits_.fetch_add(1, std::memory_order_relaxed) % kBusyRetry == 0;
    const os::Spun spun = os::spin_phases(try_busy ? kBusySpin : std::chrono::microseconds(0),
                                          std::chrono::microseconds(50), [&] {
                                            std::lock_guard<std::mutex> lock(mu);
                                            return progress(worker) != 0;
                                          });
    if (try_busy && spun == os::Spun::Busy)
      busy_misses_.store(0, std::memory_order_relaxed);
    else if (try_busy && spun == os::Spun::Yielding)
      busy_misses_.fetch_add(1, std::memory_order_relaxed);
    if (spun != os::Spun::Missed) return;
  }
  if (slice.passed()) return;
  // Counted as a sleeper from here on, and back to polling if anything progressed since
  // the caller's poll began: an event another thread takes from now on kicks us awake.
  sleepers_.fetch_add(1, std::memory_order_acq_rel);
  struct Leave {
    std::atomic<int>& n;
    ~Leave() { n.fetch_sub(1, std::memory_order_acq_rel); }
  } leave{sleepers_};
  if (worker.events() != seen) return;
  Arm armed;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!check()) return;
    armed = arm(worker);
  }
  if (armed == Arm::Progressed) return;
  if (armed == Arm::Refused) {  // stalled on the peer. Sleeps without the owner's mutex.
    sleep_stalled(slice, extra_fd);
    return;
  }
  struct pollfd fds[3] = {
      {worker.efd(), POLLIN, 0}, {kick_.get(), POLLIN, 0}, {extra_fd, POLLIN, 0}};
  ::poll(fds, extra_fd >= 0 ? 3 : 2, slice.poll_ms());
  if (fds[1].revents & POLLIN) drain_kick();
}

}  // namespace tensorwire::ucx
