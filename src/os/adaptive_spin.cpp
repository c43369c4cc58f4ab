#include "os/adaptive_spin.h"

#include <algorithm>

namespace tensorwire::os {

double AdaptiveSpin::pause_ns() noexcept {
  static const double ns = [] {
    using clock = std::chrono::steady_clock;
    double best = 1e9;
    for (int trial = 0; trial < 5; ++trial) {
      const auto t0 = clock::now();
      for (int i = 0; i < 2000; ++i) cpu_relax();
      best = std::min(best,
                      std::chrono::duration<double, std::nano>(clock::now() - t0).count() / 2000);
    }
    return std::max(best, 0.5);
  }();
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
