// Options shared by TensorDictPipe, PipeListener and TensorDictServer.
#pragma once

#include <chrono>
#include <string>

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
};

}  // namespace tensorwire
