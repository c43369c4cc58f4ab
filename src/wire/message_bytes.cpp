#include "wire/message_bytes.h"

#include "core/zero_storage.h"
#include "tensorwire/core/consolidate.h"
#include "tensorwire/core/error.h"
#include "tensorwire/wire/layout.h"

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

std::string encode_structure(const TensorDict& spec) {
  ConsolidatedPlan plan = plan_consolidation(spec);
  return Json{{"metadata", std::move(plan.metadata)}, {"bytes", plan.total_bytes}}.dump();
}

TensorDict decode_structure(std::span<const std::byte> bytes, const Limits& limits) {
  Json j = parse_untrusted_json(bytes, limits, "spec structure");
  if (!j.is_object() || !j.contains("metadata") || !j.contains("bytes") ||
      !j["bytes"].is_number_unsigned())
    throw ProtocolError("spec structure: expected {\"metadata\": ..., \"bytes\": n}");
  const uint64_t n = j["bytes"].get<uint64_t>();
  if (n > limits.max_message_bytes)
    throw ProtocolError("spec structure: a storage of " + std::to_string(n) +
                        " bytes (at most max_message_bytes, " +
                        std::to_string(limits.max_message_bytes) + ")");
  // Nothing is allocated for values nobody reads, whatever the spec's size.
  TensorDict spec = view_consolidated(detail::zero_storage(n), std::move(j["metadata"]), limits);
  spec.unlock_();
  return spec;
}

}  // namespace tensorwire::wire
