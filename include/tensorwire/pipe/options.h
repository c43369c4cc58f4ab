// Options shared by TensorDictPipe, PipeListener and TensorDictServer.
#pragma once

#include <chrono>
#include <string>

#include "tensorwire/runtime/liveness.h"
#include "tensorwire/runtime/timeout.h"
#include "tensorwire/wire/limits.h"

namespace tensorwire {

struct PipeOptions {
  // true: a schema once, then raw storage received in place; false: a JSON header and
  // each leaf, a new TensorDict per message. Both ends must agree (checked at connect).
  bool consolidated = true;
  // Shared secret checked at connect (mutual HMAC-SHA256). Empty: unauthenticated, for
  // trusted networks only.
  std::string auth_key;
  // Limits on what a peer may send (max_message_bytes, metadata size, nesting, ...).
  wire::Limits limits;
  // How long connect() (and, on the accepting side, each client's handshake) may take.
  Timeout connect_timeout = std::chrono::seconds(10);
  // A peer on another host (or in another container) that stays silent this long (its
  // host or the link to it gone, no FIN, no RST) fails the pipe with ClosedError. Both sides
  // send heartbeats (a tiny message every quarter of the peer's timeout) from a helper
  // thread, so an idle program is never taken for gone. Default: 10 s, or
  // TENSORWIRE_LIVENESS_TIMEOUT; 0 turns the check off (heartbeats the peer asks for are
  // still sent). Peers on this host are watched through their pidfd instead.
  std::chrono::milliseconds liveness_timeout = default_liveness_timeout();
};

}  // namespace tensorwire
