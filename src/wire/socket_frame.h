// The frames of the inference socket transport (src/inference/socket_transport.cpp), one
// Unix-socket message each:
//   [u8 kind][u64 request id, little-endian][body]
//   kind 0, client -> owner: a request, body = one wire-codec message
//   kind 1, owner -> client: its response, body = one wire-codec message
//   kind 2, owner -> client: its failure, body = JSON {"type", "message", "closed"}
//   kind 3, owner -> client: welcome (id 0, empty body), the first frame of a connection
// Building them and reading them back from untrusted bytes live here, with the rest of
// the validation of what a peer sends; the transport only moves them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tensorwire::wire {

enum class SocketFrameKind : uint8_t { Request = 0, Response = 1, Failure = 2, Welcome = 3 };

constexpr size_t kSocketFramePrefix = 9;

// A received frame: its kind byte as sent (any value: the receiver decides what it
// accepts), its id, and a view of its body inside the received bytes.
struct SocketFrame {
  SocketFrameKind kind;
  uint64_t id;
  std::span<const std::byte> body;
};

// The 9-byte prefix of a frame (the caller appends the body).
std::string socket_frame(SocketFrameKind kind, uint64_t id);
// The prefix and body of a frame, or nullopt when `bytes` is shorter than a prefix.
std::optional<SocketFrame> parse_socket_frame(std::string_view bytes);

// A failure frame's body: what failed, and whether the connection is closed with it.
struct SocketFailure {
  std::string type = "RuntimeError";
  std::string message;
  bool closed = false;
};
// A whole failure frame for request `id`.
std::string socket_failure_frame(uint64_t id, const SocketFailure& failure);
// The body of a received failure frame: a JSON object whose "type" and "message" are
// strings and "closed" a bool, each optional (defaults above). Anything else is a
// ProtocolError naming `what` and the field.
SocketFailure parse_socket_failure(std::span<const std::byte> body, const char* what);

}  // namespace tensorwire::wire
