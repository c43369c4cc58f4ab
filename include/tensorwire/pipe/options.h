// Options shared by TensorDictPipe, PipeListener and TensorDictServer.
#pragma once

#include <chrono>
#include <string>

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
  std::chrono::milliseconds connect_timeout{10000};
};

}  // namespace tensorwire
