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

namespace tensorwire {
class PlanCache;  // core/plan_cache.h (private)
}  // namespace tensorwire

namespace tensorwire::wire {

enum class Mode : uint8_t { Consolidated, NonConsolidated };

// One encoded message. The header and metadata are owned; the payload pieces point into
// the TensorDict that was encoded (its leaves, its consolidated storage) or into the
// encoder's staging buffer, and stay valid until the next encode() call as long as that
// TensorDict is alive and unchanged: a sender whose send may outlive its caller's hold on
// the dict keeps the dict itself (the pipe keeps a copy of a dict whose send timed out).
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
  ~Encoder();
  Encoder(Encoder&&) noexcept;
  Encoder& operator=(Encoder&&) noexcept;

  const OutMessage& encode(const TensorDict& td);
  // A Control message (handshakes): JSON only.
  static OutMessage control(const Json& body);

  // A consolidated message of at most `bytes` whose leaves are contiguous is given as
  // pieces (each leaf, then its zero padding) instead of being packed into the staging
  // buffer: for a sender whose transport copies the pieces into a buffer of its own anyway
  // (UCX's eager protocol gathers them into its FIFO), where packing first is a second
  // copy of every byte. 0 (the default): always packed, one piece.
  void gather_up_to(size_t bytes) noexcept { gather_max_ = bytes; }
  Mode mode() const noexcept { return mode_; }
  uint64_t schema_id() const noexcept { return schema_id_; }
  // Forget the last schema, so the next message carries one again.
  void reset() noexcept;

 private:
  void encode_consolidated(const TensorDict& td);
  void encode_non_consolidated(const TensorDict& td);
  void finish_header(MessageKind kind, uint64_t payload_bytes);
  // The payload as pieces of `td`'s leaves and padding (gather_up_to); false, with nothing
  // added, when a leaf is not contiguous.
  bool gather(const TensorDict& td, const ConsolidatedPlan& plan);

  Mode mode_;
  ConsolidateOptions options_;
  OutMessage msg_;
  uint64_t schema_id_ = 0;
  uint64_t next_schema_id_ = 1;
  std::string last_metadata_;  // metadata of schema_id_
  // Metadata of the consolidated TD last sent as-is. Held (not a raw pointer) so that its
  // address cannot be reused by another TD's metadata while it identifies schema_id_.
  std::shared_ptr<const Json> last_source_;
  std::unique_ptr<PlanCache> plans_;  // for staging: the plan, reused while the structure holds
  uint64_t schema_plan_ = 0;          // plans_'s generation whose metadata schema_id_ is (0: none)
  Storage staging_;
  size_t gather_max_ = 0;
};

// JSON header of a NonConsolidated message for `td` (exposed for tests and tools).
Json non_consolidated_header(const TensorDict& td, uint32_t max_depth = kMaxDepth);

}  // namespace tensorwire::wire
