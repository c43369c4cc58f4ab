// Control frames: a frame header of kind Control followed by its JSON, as one contiguous
// message. What the UCX connections send besides data (the handshake, errors, heartbeats,
// the remote inference transport's failures). Parsing one is validating untrusted bytes,
// so it lives here, with the decoder it uses.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "tensorwire/core/json.h"
#include "tensorwire/wire/limits.h"

namespace tensorwire::wire {

// The header and JSON of `body` as one buffer (what one tag send takes).
std::vector<std::byte> control_frame(const Json& body);

// Checks that a message of `length` bytes can be a control frame of at most `max_bytes`
// before it is received: ProtocolError "<what> of N bytes (at most M)" otherwise.
void check_control_length(size_t length, size_t max_bytes, const char* what);

// The JSON of one received control frame: ProtocolError naming `what` and the rule broken
// unless `bytes` is exactly one frame of kind Control whose JSON fills it.
Json parse_control_frame(std::span<const std::byte> bytes, const Limits& limits, const char* what);

// A received control message quoted in an error: its first 200 characters (a message may
// be 64 KiB, and the error goes back to the peer too).
inline std::string excerpt(const Json& body) {
  std::string s = body.dump();
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return s;
}

}  // namespace tensorwire::wire
