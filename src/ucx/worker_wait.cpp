#include "worker_wait.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace tensorwire::ucx {

WorkerWait::WorkerWait() : kick_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!kick_) throw SystemError("eventfd", errno);
}

unsigned WorkerWait::progress(Worker& worker) {
  const unsigned n = worker.progress();
  if (n && sleepers_.load(std::memory_order_acquire) > 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(kick_.get(), &one, sizeof one);
  }
  return n;
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
