#include "tensorwire/runtime/log.h"

#include <atomic>
#include <cstdio>

namespace tensorwire {

namespace {
std::atomic<LogHandler> g_handler{nullptr};
}  // namespace

void set_log_handler(LogHandler handler) noexcept {
  g_handler.store(handler, std::memory_order_release);
}

void log_message(LogLevel level, const std::string& message) noexcept {
  try {
    if (LogHandler handler = g_handler.load(std::memory_order_acquire)) {
      handler(level, message);
      return;
    }
    std::fprintf(stderr, "tensorwire: %s: %s\n", level == LogLevel::Error ? "error" : "warning",
                 message.c_str());
  } catch (...) {
  }
}

}  // namespace tensorwire
