#include "dataflow/consumer_gate.h"

#include "runtime/wait.h"
#include "tensorwire/core/error.h"
#include "tensorwire/dataflow/dataflow.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::dataflow::detail {

ConsumerGate::Call::Call(ConsumerGate& gate, const char* name, Deadline deadline) : gate_(gate) {
  if (gate_.thread_.load(std::memory_order_acquire) == std::this_thread::get_id())
    throw StateError(std::string(name) +
                     ": called again from within its own running call (a callback of it)");
  // Uncontended (one consumer thread, the usual case): one atomic exchange. Contended (a
  // shared iterator): a look every 100 us, which costs the running call nothing.
  entered_ = !gate_.turn_.exchange(true, std::memory_order_acquire) ||
             runtime::wait_until(deadline, [&](Deadline slice) {
               while (true) {
                 if (gate_.closing()) throw ClosedError(std::string(name) + " is closed");
                 if (!gate_.turn_.exchange(true, std::memory_order_acquire)) return true;
                 if (slice.passed()) return false;
                 std::this_thread::sleep_for(std::chrono::microseconds(100));
               }
             });
  if (!entered_) return;
  gate_.calls_.fetch_add(1, std::memory_order_seq_cst);
  gate_.thread_.store(std::this_thread::get_id(), std::memory_order_release);
  if (gate_.closing()) {
    leave();
    throw ClosedError(std::string(name) + " is closed");
  }
}

ConsumerGate::Call::~Call() {
  if (entered_) leave();
}

void ConsumerGate::Call::leave() noexcept {
  entered_ = false;
  gate_.thread_.store(std::thread::id(), std::memory_order_release);
  gate_.calls_.fetch_sub(1, std::memory_order_seq_cst);
  gate_.turn_.store(false, std::memory_order_release);
}

bool ConsumerGate::stop(std::chrono::milliseconds wait, const char* name) noexcept {
  closing_.store(true, std::memory_order_seq_cst);
  if (calls_.load(std::memory_order_seq_cst) == 0) return true;
  if (thread_.load(std::memory_order_acquire) == std::this_thread::get_id()) return false;
  const auto until = std::chrono::steady_clock::now() + wait;
  while (calls_.load(std::memory_order_seq_cst) > 0) {
    if (std::chrono::steady_clock::now() >= until) {
      log_message(LogLevel::Warning,
                  std::string(name) + ": close(): the call of another thread did not end within " +
                      std::to_string(wait.count()) +
                      " ms; its sockets (and workers) stay until the object is destroyed");
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace tensorwire::dataflow::detail
