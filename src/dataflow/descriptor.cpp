#include "dataflow/descriptor.h"

#include <cstring>

#include "tensorwire/core/json.h"

namespace tensorwire::dataflow::detail {

namespace {

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i)
    b[i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF);
  out.append(b, sizeof(T));
}

template <class T>
T get(std::span<const std::byte> b, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<uint64_t>(std::to_integer<uint8_t>(b[at + i])) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

void DescriptorHeader::encode(std::string& out) const {
  put<uint32_t>(out, kDescriptorMagic);
  put<uint8_t>(out, kDescriptorVersion);
  put<uint8_t>(out, static_cast<uint8_t>(kind));
  put<uint16_t>(out, sender);
  put<uint64_t>(out, seq);
  put<uint32_t>(out, segment);
  put<uint32_t>(out, pass);
  put<uint64_t>(out, offset);
}

DescriptorHeader DescriptorHeader::decode(std::span<const std::byte> b) {
  if (b.size() < kDescriptorHeaderBytes)
    throw ProtocolError("descriptor of " + std::to_string(b.size()) + " bytes, shorter than its " +
                        std::to_string(kDescriptorHeaderBytes) + "-byte header");
  if (get<uint32_t>(b, 0) != kDescriptorMagic) throw ProtocolError("descriptor: bad magic");
  if (get<uint8_t>(b, 4) != kDescriptorVersion)
    throw ProtocolError("descriptor: version " + std::to_string(get<uint8_t>(b, 4)) +
                        ", expected " + std::to_string(kDescriptorVersion));
  DescriptorHeader h;
  const uint8_t kind = get<uint8_t>(b, 5);
  if (kind < 1 || kind > 3) throw ProtocolError("descriptor: unknown kind " + std::to_string(kind));
  h.kind = static_cast<DescriptorKind>(kind);
  h.sender = get<uint16_t>(b, 6);
  h.seq = get<uint64_t>(b, 8);
  h.segment = get<uint32_t>(b, 16);
  h.pass = get<uint32_t>(b, 20);
  h.offset = get<uint64_t>(b, 24);
  return h;
}

std::string encode_failure(const Failure& f) {
  Json j = {{"type", f.type}, {"message", f.message}, {"traceback", f.traceback}};
  std::string text = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string out;
  put<uint32_t>(out, static_cast<uint32_t>(text.size()));
  out += text;
  out += f.payload;
  return out;
}

Failure decode_failure(std::span<const std::byte> body) {
  if (body.size() < 4) throw ProtocolError("error descriptor without a body");
  const uint32_t n = get<uint32_t>(body, 0);
  if (n > body.size() - 4) throw ProtocolError("error descriptor: JSON length beyond the message");
  const char* text = reinterpret_cast<const char*>(body.data()) + 4;
  Failure f;
  try {
    Json j = Json::parse(text, text + n);
    f.type = j.value("type", "");
    f.message = j.value("message", "");
    f.traceback = j.value("traceback", "");
  } catch (const Json::exception& e) {
    throw ProtocolError(std::string("error descriptor: bad JSON (") + e.what() + ")");
  }
  f.payload.assign(text + n, body.size() - 4 - n);
  return f;
}

}  // namespace tensorwire::dataflow::detail
