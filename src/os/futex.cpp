#include "os/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace tensorwire::os {

bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  struct timespec ts {};
  struct timespec* tsp = nullptr;
  if (timeout.count() >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
    tsp = &ts;
  }
  // FUTEX_WAIT (shared): the kernel re-checks *word == expected atomically before sleeping.
  long r = ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, tsp,
                     nullptr, 0);
  return !(r == -1 && errno == ETIMEDOUT);
}

bool futex_wait_bits(std::atomic<uint32_t>* word, uint32_t expected,
                     std::chrono::steady_clock::time_point until, uint32_t bits) {
  // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC time, steady_clock's clock.
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count();
  struct timespec ts {};
  ts.tv_sec = static_cast<time_t>(ns / 1000000000);
  ts.tv_nsec = static_cast<long>(ns % 1000000000);
  long r = ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_BITSET, expected, &ts,
                     nullptr, bits);
  return !(r == -1 && errno == ETIMEDOUT);
}

void futex_wake_bits(std::atomic<uint32_t>* word, uint32_t bits) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_BITSET, 1 << 30, nullptr,
            nullptr, bits);
}

void WaitBits::notify(uint32_t bits) noexcept {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (const uint32_t asleep = sleepers.load(std::memory_order_seq_cst) & bits; asleep != 0)
    futex_wake_bits(&seq, asleep);
}

void futex_wake(std::atomic<uint32_t>* word, int count) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

void WaitWord::notify_all() noexcept {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) > 0) futex_wake(&seq);
}

void WaitWord::notify_one() noexcept {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) > 0) futex_wake(&seq, 1);
}

}  // namespace tensorwire::os
