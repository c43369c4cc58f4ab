#include "wire/remote_frames.h"

#include "tensorwire/core/error.h"
#include "wire/control_frame.h"

namespace tensorwire::wire::remote {

namespace {
// Type names and messages are shown to users; longer ones are cut, never refused.
constexpr size_t kMaxText = 16 * 1024;
// What a server sends at most (6 bytes of JSON a byte at worst, and a frame of 64 KiB).
constexpr size_t kMaxSentType = 256;
constexpr size_t kMaxSentMessage = 8 * 1024;

std::string text_field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || !it->is_string())
    throw ProtocolError(std::string("remote inference failure: \"") + name +
                        "\" must be a string, got " + (it == body.end() ? "nothing" : it->dump()));
  std::string s = it->get<std::string>();
  if (s.size() > kMaxText) s.resize(kMaxText);
  return s;
}

// At most `max` bytes of `s`, cut at a UTF-8 character boundary, saying how much was cut.
std::string clipped(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "... (" + std::to_string(s.size() - n) + " bytes cut)";
}
}  // namespace

void check_request_length(uint64_t length, uint64_t expected) {
  if (length != expected)
    throw ProtocolError("remote inference request of " + std::to_string(length) +
                        " bytes: the server's request spec takes exactly " +
                        std::to_string(expected) +
                        " bytes (a client built for another spec, or a malformed frame)");
}

Json failure_json(const Failure& f) {
  // Cut to fit one control frame (ucx::kMaxControlFrame, 64 KiB) even if every byte is
  // escaped as \u00XX: a policy's exception with a huge message must reach its client as
  // that exception, not as a frame the client refuses (which fails its whole link).
  return {{"type", clipped(f.type, kMaxSentType)},
          {"message", clipped(f.message, kMaxSentMessage)},
          {"closed", f.closed}};
}

Failure parse_failure(const Json& body) {
  if (!body.is_object())
    throw ProtocolError("remote inference failure: expected a JSON object, got " + body.dump());
  Failure f;
  f.type = text_field(body, "type");
  f.message = text_field(body, "message");
  auto it = body.find("closed");
  if (it == body.end() || !it->is_boolean())
    throw ProtocolError("remote inference failure: \"closed\" must be true or false");
  f.closed = it->get<bool>();
  if (f.type.empty()) throw ProtocolError("remote inference failure: empty \"type\"");
  return f;
}

uint32_t parse_num_slots(const Json& body) {
  auto it = body.is_object() ? body.find("num_slots") : body.end();
  if (!body.is_object() || it == body.end() || !it->is_number_unsigned() ||
      it->get<uint64_t>() < 1 || it->get<uint64_t>() > (uint64_t{1} << 24))
    throw ProtocolError(
        "remote inference: expected {\"num_slots\": 1 .. 2^24} from the server, got " +
        excerpt(body));
  return static_cast<uint32_t>(it->get<uint64_t>());
}

}  // namespace tensorwire::wire::remote
