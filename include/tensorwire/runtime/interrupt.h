// Interrupting blocking calls: every wait of the library on another process or host runs in
// slices of at most kInterruptSlice and calls check_interrupt() between them. A program
// installs one check for the whole process; the Python binding installs one that looks for
// pending signals (Ctrl-C) and throws Interrupted, so a blocking call made with the GIL
// released still ends within about 100 ms of a SIGINT. A call that was interrupted leaves its
// object usable (see each call's documentation for what stays in flight).
//
// Thread-safety: set_interrupt_check() may race with waits in other threads (the hook is
// read atomically); the hook itself is called from whichever thread waits.
#pragma once

#include <chrono>

#include "tensorwire/core/error.h"

namespace tensorwire {

// How long a wait may run before it checks for an interrupt.
inline constexpr std::chrono::milliseconds kInterruptSlice{50};

// Thrown by an interrupt check to abandon a wait (Python: the pending exception, usually
// KeyboardInterrupt).
class Interrupted : public Error {
 public:
  using Error::Error;
};

// The process-wide check; nullptr removes it. It returns normally to let the wait go on, or
// throws (Interrupted, or any exception) to end it.
using InterruptCheck = void (*)();
void set_interrupt_check(InterruptCheck check) noexcept;
// Runs the installed check, if any.
void check_interrupt();

}  // namespace tensorwire
