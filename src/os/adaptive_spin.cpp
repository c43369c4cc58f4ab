#include "os/adaptive_spin.h"

#include <algorithm>
#include <atomic>

namespace tensorwire::os {

// Measured on first use and kept in an atomic, not in a function-local static: a static's
// initialisation holds a guard that a fork() copies into the child as "in progress", and
// this one runs for milliseconds on a loaded machine. A server thread measuring it while
// the main thread forked actors left each actor blocked for ever on its first wait (the
// `tensorwire demo` hang). Threads that race here each measure; any of their answers does.
double AdaptiveSpin::pause_ns() noexcept {
  static std::atomic<double> measured{0};
  if (const double ns = measured.load(std::memory_order_relaxed); ns > 0) return ns;
  using clock = std::chrono::steady_clock;
  double best = 1e9;
  for (int trial = 0; trial < 5; ++trial) {
    const auto t0 = clock::now();
    for (int i = 0; i < 2000; ++i) cpu_relax();
    best =
        std::min(best, std::chrono::duration<double, std::nano>(clock::now() - t0).count() / 2000);
  }
  const double ns = std::max(best, 0.5);
  measured.store(ns, std::memory_order_relaxed);
  return ns;
}

void AdaptiveSpin::learn(std::chrono::steady_clock::duration waited) noexcept {
  const double iters = std::chrono::duration<double, std::nano>(waited).count() / pause_ns();
  uint32_t b = budget_.load(std::memory_order_relaxed);
  if (2 * iters <= static_cast<double>(max_))
    b = std::max<uint32_t>(static_cast<uint32_t>(2 * iters), 8);
  else
    b /= 2;
  budget_.store(std::min(b, max_), std::memory_order_relaxed);
}

}  // namespace tensorwire::os
