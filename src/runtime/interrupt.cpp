#include "tensorwire/runtime/interrupt.h"

#include <atomic>

namespace tensorwire {

namespace {
std::atomic<InterruptCheck> g_check{nullptr};
}  // namespace

void set_interrupt_check(InterruptCheck check) noexcept {
  g_check.store(check, std::memory_order_release);
}

void check_interrupt() {
  if (InterruptCheck check = g_check.load(std::memory_order_acquire)) check();
}

}  // namespace tensorwire
