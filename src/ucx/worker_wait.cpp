#include "worker_wait.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace tensorwire::ucx {

WorkerWait::WorkerWait() : kick_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!kick_) throw SystemError("eventfd", errno);
}

unsigned WorkerWait::progress(Worker& worker) {
  const unsigned n = worker.progress();
  if (n && stalled_ns_.load(std::memory_order_relaxed) != 0)
    stalled_ns_.store(0, std::memory_order_relaxed);
  if (n && sleepers_.load(std::memory_order_acquire) > 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(kick_.get(), &one, sizeof one);
  }
  return n;
}

WorkerWait::Arm WorkerWait::arm(Worker& worker) {
  if (progress(worker)) return Arm::Progressed;
  if (!worker.arm()) {
    if (progress(worker)) return Arm::Progressed;
    if (stalled_.load(std::memory_order_relaxed) || !worker.arm()) return Arm::Refused;
  }
  stalled_.store(false, std::memory_order_relaxed);
  return Arm::Armed;
}

void WorkerWait::sleep_stalled(Deadline slice, int extra_fd) noexcept {
  const int64_t last = stalled_ns_.load(std::memory_order_relaxed);
  const int64_t ns =
      std::clamp<int64_t>(2 * last, kStalledSleepMin.count(), kStalledSleepMax.count());
  stalled_ns_.store(ns, std::memory_order_relaxed);
  stalled_.store(true, std::memory_order_relaxed);
  const int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::min(slice.left(), Clock::duration(std::chrono::nanoseconds(ns))))
                           .count();
  const struct timespec ts { left / 1'000'000'000, left % 1'000'000'000 };
  struct pollfd fds[2] = {{kick_.get(), POLLIN, 0}, {extra_fd, POLLIN, 0}};
  ::ppoll(fds, extra_fd >= 0 ? 2 : 1, &ts, nullptr);
  if (fds[0].revents & POLLIN) drain_kick();
}

void WorkerWait::wake_all(Worker& worker) noexcept {
  try {
    worker.signal();
  } catch (const Error&) {
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(kick_.get(), &one, sizeof one);
}

void WorkerWait::drain_kick() noexcept {
  uint64_t drained;
  [[maybe_unused]] ssize_t r = ::read(kick_.get(), &drained, sizeof drained);
}

}  // namespace tensorwire::ucx
