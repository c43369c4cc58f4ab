#include "wire/message_bytes.h"

namespace tensorwire::wire {

void append_encoded(const OutMessage& m, std::string& out) {
  size_t total = m.header_bytes.size() + m.metadata.size();
  for (const auto& p : m.payload) total += p.size();
  out.reserve(out.size() + total);
  out.append(reinterpret_cast<const char*>(m.header_bytes.data()), m.header_bytes.size());
  out.append(m.metadata);
  for (const auto& p : m.payload) out.append(reinterpret_cast<const char*>(p.data()), p.size());
}

TensorDict decode_owned(Decoder& decoder, std::span<const std::byte> bytes) {
  TensorDict& td = decoder.decode(bytes);
  // Non-consolidated messages land in fresh storage per message; anything else (a
  // consolidated storage the decoder reuses) is copied out.
  if (td.is_consolidated()) return td.clone();
  return td;
}

}  // namespace tensorwire::wire
