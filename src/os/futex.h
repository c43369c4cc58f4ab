// Cross-process waiting on a 32-bit word in shared memory: spin briefly, then futex.
//
// Why both: on the virtual machines this runs on, a futex wake-up costs tens of
// microseconds while a spin round trip between two cores costs ~0.2 us, so a waiter that
// expects an answer soon spins first (bounded, with a pause instruction) and only then
// sleeps in the kernel. A waker always calls futex_wake only when a sleeper announced
// itself (the `waiters` count), so the common no-sleeper case costs no syscall.
//
// Shared (not private) futexes: the words live in MAP_SHARED memory used by several
// processes.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <utility>

namespace tensorwire::os {

// Blocks while *word == expected, at most `timeout` (negative = no limit). Returns false
// on timeout. Spurious returns are possible: callers re-check their condition.
bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
// Wakes up to `count` waiters on word.
void futex_wake(std::atomic<uint32_t>* word, int count = 1 << 30);
// The same with a bit set (FUTEX_WAIT_BITSET / FUTEX_WAKE_BITSET): a wake-up reaches only
// the waiters whose `bits` it shares. futex_wait_bits waits until the absolute
// steady_clock time `until` at most.
bool futex_wait_bits(std::atomic<uint32_t>* word, uint32_t expected,
                     std::chrono::steady_clock::time_point until, uint32_t bits);
void futex_wake_bits(std::atomic<uint32_t>* word, uint32_t bits);

struct SpinPolicy {
  uint32_t spins = 2000;  // pause-loop iterations before sleeping (~ a few microseconds)
};

// A word with a waiter count, for "something changed" notifications across processes.
// Layout is fixed (8 bytes) so it can live in a shared segment.
struct alignas(8) WaitWord {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> waiters{0};

  // Bumps seq and wakes sleepers, if any.
  void notify_all() noexcept;
  // Bumps seq and wakes one sleeper, if any: for a word many wait on where one change
  // serves one waiter (a freed slot), so that each change costs one wake-up instead of
  // waking every sleeper to find that another one got there first. Waiters that spin see
  // the new seq as with notify_all. A woken waiter that does not use the change must pass
  // it on (notify_one again) or the next sleeper waits for its poll.
  void notify_one() noexcept;
  // Waits until seq != `seen` (returns the new seq) or the deadline passes (returns
  // `seen`). `alive` is polled between sleeps (every `poll` at most) so a dead peer ends
  // the wait: when it returns false, wait() returns `seen` early. It is asked only after a
  // sleep that ended with no change, not before the first: the caller checked its own
  // conditions just before it called wait(), and asking again cost a system call per wait
  // (a pidfd poll in each shared-memory client: 6% of the CPU with 256 actors).
  template <class Alive>
  uint32_t wait(uint32_t seen, std::chrono::steady_clock::time_point deadline, Alive&& alive,
                SpinPolicy spin = {},
                std::chrono::milliseconds poll = std::chrono::milliseconds(100));
};
static_assert(sizeof(WaitWord) == 8);

// One word for up to 32 waiters, each with its own bit, for answers that come in batches:
// a notifier names any subset of the 32 in one system call, where a WaitWord per waiter
// costs a futex_wake per answer. With 256 actors that was 64 wake-up calls per batch, and
// each call let a woken actor preempt the notifier before it woke the next.
// Layout is fixed (8 bytes) so it can live in a shared segment.
struct alignas(8) WaitBits {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};  // bit k: waiter k sleeps (or is about to)

  // Bumps seq and wakes the sleepers among `bits`.
  void notify(uint32_t bits) noexcept;
  // As WaitWord::wait, for the waiter that owns `bit`. seq moves for any of the 32
  // waiters, so a return only says "look again". One thread per bit: two threads sharing
  // a bit could clear each other's sleeper mark, and the later one would then wait for
  // its poll instead of the notification.
  template <class Alive>
  uint32_t wait(uint32_t bit, uint32_t seen, std::chrono::steady_clock::time_point deadline,
                Alive&& alive, SpinPolicy spin = {},
                std::chrono::milliseconds poll = std::chrono::milliseconds(100));

  // One waiter's view with WaitWord's wait() signature, for AdaptiveSpin.
  struct Bit {
    WaitBits& word;
    uint32_t bit;
    template <class Alive>
    uint32_t wait(uint32_t seen, std::chrono::steady_clock::time_point deadline, Alive&& alive,
                  SpinPolicy spin = {},
                  std::chrono::milliseconds poll = std::chrono::milliseconds(100)) const {
      return word.wait(bit, seen, deadline, std::forward<Alive>(alive), spin, poll);
    }
  };
};
static_assert(sizeof(WaitBits) == 8);

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

namespace detail {

// The loop WaitWord and WaitBits share: spin, then sleep in slices of at most `poll` until
// seq moves, the deadline passes, or `alive` (asked after a sleep that brought nothing)
// says no. `sleep(until, slice)` announces the waiter, re-checks seq and sleeps in the
// kernel until `until` (`slice` from now) at most.
template <class Alive, class Sleep>
uint32_t spin_then_sleep(const std::atomic<uint32_t>& seq, uint32_t seen,
                         std::chrono::steady_clock::time_point deadline, Alive&& alive,
                         SpinPolicy spin, std::chrono::milliseconds poll, Sleep&& sleep) {
  for (uint32_t i = 0; i < spin.spins; ++i) {
    uint32_t now = seq.load(std::memory_order_acquire);
    if (now != seen) return now;
    cpu_relax();
  }
  for (bool slept = false;; slept = true) {
    uint32_t now = seq.load(std::memory_order_acquire);
    if (now != seen) return now;
    const auto t = std::chrono::steady_clock::now();
    if (t >= deadline) return seen;
    if (slept && !alive()) return seen;
    const auto until = std::min<std::chrono::steady_clock::time_point>(deadline, t + poll);
    sleep(until, std::chrono::nanoseconds(until - t));
  }
}

}  // namespace detail

template <class Alive>
uint32_t WaitWord::wait(uint32_t seen, std::chrono::steady_clock::time_point deadline,
                        Alive&& alive, SpinPolicy spin, std::chrono::milliseconds poll) {
  return detail::spin_then_sleep(
      seq, seen, deadline, std::forward<Alive>(alive), spin, poll,
      [&](std::chrono::steady_clock::time_point, std::chrono::nanoseconds slice) {
        waiters.fetch_add(1, std::memory_order_seq_cst);
        // Re-check after announcing ourselves: a notify between the caller's load and the
        // fetch_add would otherwise be missed (notify reads `waiters` after bumping seq).
        if (seq.load(std::memory_order_seq_cst) == seen) futex_wait(&seq, seen, slice);
        waiters.fetch_sub(1, std::memory_order_relaxed);
      });
}

template <class Alive>
uint32_t WaitBits::wait(uint32_t bit, uint32_t seen, std::chrono::steady_clock::time_point deadline,
                        Alive&& alive, SpinPolicy spin, std::chrono::milliseconds poll) {
  return detail::spin_then_sleep(
      seq, seen, deadline, std::forward<Alive>(alive), spin, poll,
      [&](std::chrono::steady_clock::time_point until, std::chrono::nanoseconds) {
        // Announce, then re-check (notify bumps seq, then reads the sleepers): either we
        // see the new seq here or the notifier sees our bit.
        sleepers.fetch_or(bit, std::memory_order_seq_cst);
        if (seq.load(std::memory_order_seq_cst) == seen) futex_wait_bits(&seq, seen, until, bit);
        sleepers.fetch_and(~bit, std::memory_order_relaxed);
      });
}

}  // namespace tensorwire::os
