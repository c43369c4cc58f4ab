// TimedLock: a lock a waiter can give up on at a deadline (a std::timed_mutex replacement).
//
// Why not std::timed_mutex: libstdc++ implements its try_lock_until on steady_clock with
// pthread_mutex_clocklock, which GCC 12's ThreadSanitizer does not intercept. TSan then
// never sees the lock taken and reports every unlock as "unlock of an unlocked mutex",
// which hid the socket transport's client from `make test-tsan`. A flag under a
// std::mutex, waited for with a condition variable, is seen by TSan like any other lock.
//
// Meets Lockable's try_lock_until/unlock, so std::unique_lock<TimedLock> works.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace tensorwire::runtime {

class TimedLock {
 public:
  // Takes the lock, waiting until `until` at most; false if it was still held then.
  template <class Clock, class Duration>
  bool try_lock_until(std::chrono::time_point<Clock, Duration> until) {
    std::unique_lock<std::mutex> l(mu_);
    if (!free_.wait_until(l, until, [&] { return !held_; })) return false;
    held_ = true;
    return true;
  }
  bool try_lock() {
    std::lock_guard<std::mutex> l(mu_);
    if (held_) return false;
    held_ = true;
    return true;
  }
  void lock() {
    std::unique_lock<std::mutex> l(mu_);
    free_.wait(l, [&] { return !held_; });
    held_ = true;
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> l(mu_);
      held_ = false;
    }
    free_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable free_;
  bool held_ = false;
};

}  // namespace tensorwire::runtime
