#include "wire/message_bytes.h"

#include <sys/mman.h>

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
  // Zero pages the kernel maps on a read or write: nothing is allocated for values nobody
  // reads, whatever the spec's size.
  Storage zeros;
  if (n > 0) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw SystemError("spec structure: mmap of " + std::to_string(n), errno);
    zeros = Storage::external(
        p, n, [p, n] { ::munmap(p, n); }, Storage::Kind::External);
  } else {
    zeros = Storage::allocate(0);
  }
  TensorDict spec = view_consolidated(std::move(zeros), std::move(j["metadata"]), limits);
  spec.unlock_();
  return spec;
}

}  // namespace tensorwire::wire
