// Encoder: turns TensorDicts into tensorwire messages (see docs/protocol.md).
//
// The encoder remembers the last schema it sent: a TensorDict with the same structure
// goes out as a Storage message (header + raw storage), anything new as
// SchemaAndStorage. A consolidated TensorDict is sent from its own storage (no copy);
// any other is packed into a staging buffer that is reused while the structure holds.
//
// Not thread-safe: one encoder per sending stream.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensorwire/core/consolidate.h"
#include "tensorwire/wire/frame.h"

namespace tensorwire::wire {

enum class Mode : uint8_t { Consolidated, NonConsolidated };

// One encoded message. The header and metadata are owned; the payload pieces point into
// the TensorDict that was encoded, or the encoder's staging buffer, and stay valid until
// the next encode() call as long as that TensorDict is alive and unchanged.
struct OutMessage {
  FrameHeader header;
  FrameHeader::Bytes header_bytes{};
  std::string metadata;
  std::vector<std::span<const std::byte>> payload;  // consolidated: 1 piece; else one per leaf
  std::vector<Tensor> keepalive;  // contiguous copies of strided leaves (non-consolidated)
};

class Encoder {
 public:
  explicit Encoder(Mode mode, ConsolidateOptions options = {});

  const OutMessage& encode(const TensorDict& td);
  // A Control message (handshakes): JSON only.
  static OutMessage control(const Json& body);

  Mode mode() const noexcept { return mode_; }
  uint64_t schema_id() const noexcept { return schema_id_; }
  // Forget the last schema, so the next message carries one again.
  void reset() noexcept;

 private:
  void encode_consolidated(const TensorDict& td);
  void encode_non_consolidated(const TensorDict& td);
  void finish_header(MessageKind kind, uint64_t payload_bytes);

  Mode mode_;
  ConsolidateOptions options_;
  OutMessage msg_;
  uint64_t schema_id_ = 0;
  uint64_t next_schema_id_ = 1;
  std::string last_metadata_;  // metadata of schema_id_
  // Metadata of the consolidated TD last sent as-is. Held (not a raw pointer) so that its
  // address cannot be reused by another TD's metadata while it identifies schema_id_.
  std::shared_ptr<const Json> last_source_;
  ConsolidatedPlan plan_;  // for staging
  Storage staging_;
};

// JSON header of a NonConsolidated message for `td` (exposed for tests and tools).
Json non_consolidated_header(const TensorDict& td, uint32_t max_depth = kMaxDepth);

}  // namespace tensorwire::wire
