// The remote inference transport's messages (docs/protocol.md, "Remote inference"), and the
// validation of what a peer sends. Every message is one UCX tagged message; its tag carries
// the kind (low 8 bits) and, for a request, its response and its failure, the client's
// sequence number of the request (the other 56 bits):
//
//   kind 3 control   control frame: handshake (wire/handshake.h), then the server's
//                    {"num_slots": N}; later {"error": why} or {"closed": why}, either way
//   kind 4 heartbeat control frame {"heartbeat": true} (runtime/peer_liveness.h)
//   kind 5 spec      server -> client, twice: the request spec, then the response spec, each
//                    one wire-codec message (validated by the decoder)
//   kind 6 request   client -> server: the request's leaves, raw bytes, in the spec's leaf
//                    order, back to back: exactly request_bytes long. Received straight
//                    into a slot of the server's bank.
//   kind 7 response  server -> client: the response's leaves the same way, from its slot
//   kind 8 failure   server -> client: control frame {"type", "message", "closed"}: the
//                    policy failed on the request's batch, or the server stopped first
#pragma once

#include <cstdint>
#include <string>

#include "tensorwire/core/json.h"

namespace tensorwire::wire::remote {

enum class Kind : uint8_t {
  Control = 3,
  Heartbeat = 4,
  Spec = 5,
  Request = 6,
  Response = 7,
  Failure = 8
};
inline constexpr uint64_t kKindMask = 0xff;
inline constexpr uint64_t kMaxSeq = (uint64_t{1} << 56) - 1;

constexpr uint64_t tag(Kind kind, uint64_t seq = 0) noexcept {
  return (seq << 8) | static_cast<uint64_t>(kind);
}
constexpr uint64_t seq_of(uint64_t tag) noexcept {
  return tag >> 8;
}

// A request of `length` bytes for a bank whose request rows take `expected` bytes: a
// ProtocolError naming both unless they are equal (checked before anything is received).
void check_request_length(uint64_t length, uint64_t expected);

// A failure message's body, validated: ProtocolError naming the field otherwise.
struct Failure {
  std::string type;  // the exception's type name ("ValueError")
  std::string message;
  bool closed = false;  // the server stopped before serving it (ClosedError)
};
Json failure_json(const Failure& f);
Failure parse_failure(const Json& body);

// The server's {"num_slots": N} after the handshake, validated (1 .. 2^24).
uint32_t parse_num_slots(const Json& body);

}  // namespace tensorwire::wire::remote
