#include "os/fork.h"

#include <pthread.h>

#include <atomic>

namespace tensorwire::os {

namespace {

std::atomic<uint64_t> g_generation{0};

void on_fork_child() noexcept {
  g_generation.fetch_add(1, std::memory_order_relaxed);
}

// Registered when the library is loaded, so that a fork made before anyone asked for the
// generation is still counted. (fork_generation() lives in this file, so any program
// that can ask links this initializer in.)
const bool g_registered = [] {
  ::pthread_atfork(nullptr, nullptr, on_fork_child);
  return true;
}();

}  // namespace

uint64_t fork_generation() noexcept {
  (void)g_registered;
  return g_generation.load(std::memory_order_relaxed);
}

}  // namespace tensorwire::os
