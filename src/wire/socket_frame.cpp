#include "wire/socket_frame.h"

#include "tensorwire/core/error.h"
#include "tensorwire/core/json.h"
#include "tensorwire/wire/decoder.h"

namespace tensorwire::wire {

std::string socket_frame(SocketFrameKind kind, uint64_t id) {
  std::string s(kSocketFramePrefix, '\0');
  s[0] = static_cast<char>(kind);
  for (int i = 0; i < 8; ++i) s[1 + i] = static_cast<char>((id >> (8 * i)) & 0xff);
  return s;
}

std::optional<SocketFrame> parse_socket_frame(std::string_view bytes) {
  if (bytes.size() < kSocketFramePrefix) return std::nullopt;
  SocketFrame f;
  // SocketFrameKind has a fixed underlying type: every byte value is a valid value of it.
  f.kind = static_cast<SocketFrameKind>(static_cast<uint8_t>(bytes[0]));
  f.id = 0;
  for (int i = 0; i < 8; ++i)
    f.id |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[1 + i])) << (8 * i);
  f.body = std::as_bytes(
      std::span<const char>(bytes.data() + kSocketFramePrefix, bytes.size() - kSocketFramePrefix));
  return f;
}

std::string socket_failure_frame(uint64_t id, const SocketFailure& failure) {
  std::string s = socket_frame(SocketFrameKind::Failure, id);
  s +=
      Json{{"type", failure.type}, {"message", failure.message}, {"closed", failure.closed}}.dump();
  return s;
}

SocketFailure parse_socket_failure(std::span<const std::byte> body, const char* what) {
  const Limits limits;
  const Json j = parse_untrusted_json(body, limits, what);
  if (!j.is_object())
    throw ProtocolError(std::string("invalid ") + what + ": not a JSON object but " +
                        j.type_name());
  SocketFailure f;
  auto string_field = [&](const char* name, std::string& out) {
    auto it = j.find(name);
    if (it == j.end()) return;
    if (!it->is_string())
      throw ProtocolError(std::string("invalid ") + what + ": \"" + name +
                          "\" must be a string, got " + it->type_name());
    out = it->get<std::string>();
  };
  string_field("type", f.type);
  string_field("message", f.message);
  if (auto it = j.find("closed"); it != j.end()) {
    if (!it->is_boolean())
      throw ProtocolError(std::string("invalid ") + what + ": \"closed\" must be a bool, got " +
                          it->type_name());
    f.closed = it->get<bool>();
  }
  return f;
}

}  // namespace tensorwire::wire
