// Control frames (wire/control_frame.h) on a UCX endpoint, written once for every UCX
// connection (the pipe, the remote inference transport): the handshake, errors, heartbeats.
//
// The blocking forms are for a connection whose worker one thread alone progresses while
// they run (a handshake); they wait interruptibly (runtime/wait.h) on the worker's fd, and
// end with ClosedError within one wait slice once `abandon` is requested (a server closing
// while a client stalls in its handshake must not wait for the handshake's deadline).
#pragma once

#include <cstdint>
#include <optional>
#include <stop_token>

#include "tensorwire/core/json.h"
#include "tensorwire/runtime/timeout.h"
#include "tensorwire/wire/limits.h"
#include "ucx/ucx.h"

namespace tensorwire::ucx {

// Control frames are small; anything bigger breaks the protocol.
inline constexpr size_t kMaxControlFrame = 64 * 1024 + 40;

// A probed message's rest comes only as its peer goes on. One that stops in the middle (a
// SIGSTOP, a link cut, a hostile client) must not hold whoever receives it: receiving it
// ends at a deadline, for a caller that polls and has none of its own this one: the
// connection's liveness timeout (10 s with liveness checks off).
Deadline frame_deadline(std::chrono::milliseconds liveness_timeout);

// Receives the probed message `m` of `length` bytes (the caller checked it against its
// bound) and returns them. ClosedError naming `what` at `finish` or once the endpoint fails;
// the worker then keeps the buffer (Worker::keep_until_destroyed).
std::vector<std::byte> receive_probed(Worker& worker, Endpoint& ep, ucp_tag_message_h m,
                                      size_t length, Deadline finish, const char* what);

// One control frame that arrived on `tag`, if any, received (by `finish`, as above) and
// validated (at most `max_bytes`, one frame of kind Control: ProtocolError naming `what`
// otherwise; a longer one is dropped without allocating what it announces).
std::optional<Json> take_control(Worker& worker, Endpoint& ep, uint64_t tag, size_t max_bytes,
                                 const wire::Limits& limits, const char* what, Deadline finish);

// A peer's message on a tag its receiver never reads stays in UCX's queue for ever: a flood
// of them grows memory without bound. ProtocolError naming the tag and `what` (the
// connection) when the oldest waiting message has a tag `reads` refuses. Only the oldest is
// looked at (O(1), cheap enough for every poll): the receiver takes its messages in order,
// so a foreign one comes to the front once those before it are read.
[[noreturn]] void throw_foreign_tag(uint64_t tag, const char* what);
template <class Reads>
void refuse_foreign_tags(Worker& worker, Reads&& reads, const char* what) {
  if (auto tag = worker.oldest_unexpected_tag(); tag && !reads(*tag)) throw_foreign_tag(*tag, what);
}

// Waits until `req` (a send of this endpoint's) completed, until `deadline` (TimeoutError
// naming `what`).
void wait_sent(Worker& worker, Endpoint& ep, Request& req, Deadline deadline, const char* what,
               std::stop_token abandon = {});
// Sends `body` on `tag` and waits until the send completed, until `deadline` (TimeoutError).
void send_control(Worker& worker, Endpoint& ep, uint64_t tag, const Json& body, Deadline deadline,
                  std::stop_token abandon = {});
// Waits for a control frame on `tag` until `deadline` (TimeoutError "<what> timed out"),
// ClosedError when the endpoint fails meanwhile.
Json recv_control(Worker& worker, Endpoint& ep, uint64_t tag, const wire::Limits& limits,
                  Deadline deadline, const char* what, std::stop_token abandon = {});
// Waits until UCX's wire-up of `ep` is over (a flush completes only then): UCX 1.13 crashes
// when a send pending across the move from its first lanes is replayed.
void wait_wired_up(Worker& worker, Endpoint& ep, Deadline deadline, const char* what,
                   std::stop_token abandon = {});
// A client that gives up on its connection (its timeout, an interrupt, an error) lets the
// wire-up of `ep` end, for at most `budget` (milliseconds where the server has taken the
// connection up), before it closes. A client that went away mid-wire-up made UCX 1.22 free a
// TCP lane of the server's under it (SIGSEGV; docs/reliability.md). Non-blocking TCP
// connects (Context) close that for good; this wait stays as the defence of a process whose
// UCX_TCP_CONN_NB=n reopens it, and costs only a connect already given up.
// No interrupt check, nothing thrown: this runs while an interrupt or an error is on its
// way out.
void let_wireup_end(Worker& worker, Endpoint& ep, std::chrono::milliseconds budget) noexcept;
// The budget the clients give it (a connect given up returns this much after its timeout,
// and up to 0.2 s more when the endpoint fails meanwhile: Endpoint::close drains it).
constexpr std::chrono::milliseconds kAbandonedWireup{100};

}  // namespace tensorwire::ucx
