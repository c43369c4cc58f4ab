// ConsumerGate (private): the consumer's blocking call of a runner or a remote, and close()
// from another thread (an exit hook, a finalizer, a watchdog). The call is counted while it
// runs; close() raises the flag, which the call's waits check at each look (it leaves with
// ClosedError), and waits for it to leave before taking sockets down.
//
// Calls take turns: one runs at a time, and a call from another thread waits for its turn
// (interruptibly, up to its deadline). Two threads reading one ZeroMQ socket, or one
// runner's bookkeeping, at once corrupted the heap and lost or doubled datapoints.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "tensorwire/runtime/timeout.h"

namespace tensorwire::dataflow::detail {

class ConsumerGate {
 public:
  // Around the call: waits for its turn until `deadline` (entered() false when it passed
  // first: the caller's timeout); ClosedError("<name> is closed") when close() began;
  // StateError for a call from within the running call on its own thread (a callback).
  class Call {
   public:
    Call(ConsumerGate& gate, const char* name, Deadline deadline = Deadline::never());
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    bool entered() const noexcept { return entered_; }

   private:
    void leave() noexcept;
    ConsumerGate& gate_;
    bool entered_ = false;
  };

  // Whether close() began: every wait of the call checks it.
  bool closing() const noexcept { return closing_.load(std::memory_order_seq_cst); }
  // Start of close(): raises the flag and waits up to `wait` for a call running on another
  // thread to leave. False when it did not (it is in the user's code, or close() comes
  // from a callback of that very call): what it uses must stay until the destructor.
  bool stop(std::chrono::milliseconds wait, const char* name) noexcept;

 private:
  // seq_cst: each side writes its flag, then reads the other's (a Dekker pair); with
  // release/acquire alone, both reads may miss the other's write.
  std::atomic<bool> closing_{false};
  std::atomic<int> calls_{0};
  std::atomic<std::thread::id> thread_{};  // of the running call; {} when none
  std::atomic<bool> turn_{false};          // a call runs (its turn is taken)
};

}  // namespace tensorwire::dataflow::detail
