#include "copy_bytes.h"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>

namespace tensorwire::detail {

namespace {

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
            nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
            0);
}

// One helper thread and one job slot. `state` moves Idle -> Posted (by the caller that
// claimed the helper) -> Running (by the helper, when it takes the job) -> Done (by the
// helper) -> Idle (by that caller). A caller that finds its job still Posted after its own
// half takes it back (Posted -> Idle) and copies it too: on a busy machine the helper may
// not get a CPU soon, and waiting for it would be slower than one thread. `claimed` makes
// sure only one caller at a time uses the slot.
// Read when the library is loaded, not in a function-local static: a fork() while another
// thread ran that static's first initialization would leave the child's first large copy
// waiting for ever on its copied guard (docs/design.md, "Fork awareness"). The atomics of
// get() below are constant-initialized: no guard.
const bool g_multi_cpu = std::thread::hardware_concurrency() > 1;

class CopyHelper {
 public:
  enum : uint32_t { kIdle = 0, kPosted = 1, kRunning = 2, kDone = 3 };

  // The helper of this process; nullptr on a one-CPU machine or if the thread could not
  // be started. A forked child gets a new one (the parent's thread does not exist there).
  static CopyHelper* get() noexcept {
    static std::atomic<CopyHelper*> current{nullptr};
    static std::atomic<pid_t> owner{0};
    if (!g_multi_cpu) return nullptr;
    const pid_t pid = ::getpid();
    CopyHelper* h = current.load(std::memory_order_acquire);
    if (h && owner.load(std::memory_order_acquire) == pid) return h;
    static std::atomic<bool> starting{false};
    if (starting.exchange(true, std::memory_order_acq_rel)) return nullptr;  // being started
    h = current.load(std::memory_order_acquire);
    if (!h || owner.load(std::memory_order_acquire) != pid) {
      // Leaked on purpose: a parent's helper copied into a child by fork is left alone,
      // and the live one must outlive every static destructor that might copy.
      auto* fresh = new (std::nothrow) CopyHelper();
      if (fresh && fresh->start()) {
        current.store(fresh, std::memory_order_release);
        owner.store(pid, std::memory_order_release);
        h = fresh;
      } else {
        h = nullptr;
      }
    }
    starting.store(false, std::memory_order_release);
    return h;
  }

  // Claims the helper for one copy; false when another thread is using it.
  bool try_claim() noexcept { return !claimed_.exchange(true, std::memory_order_acquire); }

  void post(void* dst, const void* src, size_t n) noexcept {
    dst_ = dst;
    src_ = src;
    n_ = n;
    state_.store(kPosted, std::memory_order_release);
    futex_wake(state_);
  }

  // After the caller's own half: true when the helper copied the posted part, false when
  // the caller took it back (and must copy it itself).
  bool finish() noexcept {
    uint32_t expected = kPosted;
    if (state_.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel)) {
      claimed_.store(false, std::memory_order_release);
      return false;
    }
    // Running: the helper has a CPU and is about as far as we are; spin briefly first.
    for (int i = 0; i < 4000; ++i) {
      if (state_.load(std::memory_order_acquire) == kDone) break;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    uint32_t s;
    while ((s = state_.load(std::memory_order_acquire)) != kDone) futex_wait(state_, s);
    state_.store(kIdle, std::memory_order_relaxed);
    claimed_.store(false, std::memory_order_release);
    return true;
  }

 private:
  // The helper blocks every signal (it inherits the mask it is created with), so signals
  // meant for the process go to the application's own threads.
  bool start() noexcept {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    bool ok = true;
    try {
      std::thread([this] { run(); }).detach();
    } catch (...) {
      ok = false;
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return ok;
  }

  void run() noexcept {
    while (true) {
      uint32_t s;
      while ((s = state_.load(std::memory_order_acquire)) != kPosted) futex_wait(state_, s);
      uint32_t expected = kPosted;
      if (!state_.compare_exchange_strong(expected, kRunning, std::memory_order_acq_rel))
        continue;  // the caller took it back
      std::memcpy(dst_, src_, n_);
      state_.store(kDone, std::memory_order_release);
      futex_wake(state_);
    }
  }

  std::atomic<bool> claimed_{false};
  std::atomic<uint32_t> state_{kIdle};
  void* dst_ = nullptr;
  const void* src_ = nullptr;
  size_t n_ = 0;
};

}  // namespace

void copy_bytes(void* dst, const void* src, size_t n) noexcept {
  if (n < kParallelCopyMin) {
    std::memcpy(dst, src, n);
    return;
  }
  CopyHelper* helper = CopyHelper::get();
  if (!helper || !helper->try_claim()) {
    std::memcpy(dst, src, n);
    return;
  }
  // The helper copies the second half (cut at a cache line), this thread the first.
  const size_t half = (n / 2) & ~size_t{63};
  auto* dst_rest = static_cast<std::byte*>(dst) + half;
  const auto* src_rest = static_cast<const std::byte*>(src) + half;
  helper->post(dst_rest, src_rest, n - half);
  std::memcpy(dst, src, half);
  if (!helper->finish()) std::memcpy(dst_rest, src_rest, n - half);
}

}  // namespace tensorwire::detail
