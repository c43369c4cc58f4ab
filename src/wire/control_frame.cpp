#include "wire/control_frame.h"

#include <cstring>
#include <string>

#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"
#include "tensorwire/wire/frame.h"

namespace tensorwire::wire {

std::vector<std::byte> control_frame(const Json& body) {
  const OutMessage m = Encoder::control(body);
  // Sized once and copied into: GCC 12 warned (-Wstringop-overflow, a false positive of its
  // own) about the two vector::insert calls this was.
  std::vector<std::byte> bytes(m.header_bytes.size() + m.metadata.size());
  std::memcpy(bytes.data(), m.header_bytes.data(), m.header_bytes.size());
  if (!m.metadata.empty())
    std::memcpy(bytes.data() + m.header_bytes.size(), m.metadata.data(), m.metadata.size());
  return bytes;
}

void check_control_length(size_t length, size_t max_bytes, const char* what) {
  if (length < kHeaderBytes || length > max_bytes)
    throw ProtocolError(std::string(what) + " of " + std::to_string(length) + " bytes (at least " +
                        std::to_string(kHeaderBytes) + ", at most " + std::to_string(max_bytes) +
                        ")");
}

Json parse_control_frame(std::span<const std::byte> bytes, const Limits& limits, const char* what) {
  check_control_length(bytes.size(), bytes.size(), what);
  Decoder decoder(limits);
  FrameHeader h = decoder.read_header(bytes.first(kHeaderBytes));
  if (h.kind != MessageKind::Control || kHeaderBytes + h.metadata_bytes != bytes.size())
    throw ProtocolError(std::string("a ") + what + " must be one control frame");
  Incoming in;
  decoder.prepare(h, bytes.subspan(kHeaderBytes), nullptr, in);
  return std::move(in.control);
}

}  // namespace tensorwire::wire
