// The one interruptible wait of the library (private). Every blocking call on another
// process or host is written as a step that waits at most until a slice deadline and says
// whether it is done; wait_until() runs it in slices of kInterruptSlice, checks for an
// interrupt between slices, and stops at the caller's deadline.
#pragma once

#include "tensorwire/runtime/interrupt.h"
#include "tensorwire/runtime/timeout.h"

namespace tensorwire::runtime {

// Calls step(slice) (slice: a Deadline no later than `deadline`) until it returns true
// (then true) or `deadline` passes (then false). check_interrupt() runs between slices, so
// an interrupt ends the wait by its exception within one slice. The step runs at least
// once, so a zero timeout still polls.
template <class Step>
bool wait_until(Deadline deadline, Step&& step) {
  while (true) {
    const Deadline slice = deadline.min(Deadline::after(kInterruptSlice));
    if (step(slice)) return true;
    if (deadline.passed()) return false;
    check_interrupt();
  }
}

}  // namespace tensorwire::runtime
