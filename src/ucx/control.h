// Control frames (wire/control_frame.h) on a UCX endpoint, written once for every UCX
// connection (the pipe, the remote inference transport): the handshake, errors, heartbeats.
//
// The blocking forms are for a connection whose worker one thread alone progresses while
// they run (a handshake); they wait interruptibly (runtime/wait.h) on the worker's fd.
#pragma once

#include <cstdint>
#include <optional>

#include "tensorwire/core/json.h"
#include "tensorwire/runtime/timeout.h"
#include "tensorwire/wire/limits.h"
#include "ucx/ucx.h"

namespace tensorwire::ucx {

// Control frames are small; anything bigger breaks the protocol.
inline constexpr size_t kMaxControlFrame = 64 * 1024 + 40;

// One control frame that arrived on `tag`, if any, received and validated (at most
// `max_bytes`, one frame of kind Control: ProtocolError naming `what` otherwise).
std::optional<Json> take_control(Worker& worker, Endpoint& ep, uint64_t tag, size_t max_bytes,
                                 const wire::Limits& limits, const char* what);

// Sends `body` on `tag` and waits until the send completed, until `deadline` (TimeoutError).
void send_control(Worker& worker, Endpoint& ep, uint64_t tag, const Json& body, Deadline deadline);
// Waits for a control frame on `tag` until `deadline` (TimeoutError "<what> timed out"),
// ClosedError when the endpoint fails meanwhile.
Json recv_control(Worker& worker, Endpoint& ep, uint64_t tag, const wire::Limits& limits,
                  Deadline deadline, const char* what);
// Waits until UCX's wire-up of `ep` is over (a flush completes only then): UCX 1.13 crashes
// when a send pending across the move from its first lanes is replayed.
void wait_wired_up(Worker& worker, Endpoint& ep, Deadline deadline, const char* what);

}  // namespace tensorwire::ucx
