// Decoder: the receiving side of the codec. Every byte is untrusted: the header, the
// metadata and the payload sizes are validated before anything is allocated or written,
// and a rejected message leaves the previously received TensorDict untouched.
//
// Receiving happens in three steps so a transport can land the payload directly in its
// final place (no staging copy):
//   1. read_header(40 bytes)            -> sizes of what follows
//   2. prepare(header, metadata bytes)  -> the buffers the payload must be written to
//   3. finish(incoming)                 -> the TensorDict
// decode() does all three for a message held in one buffer; fill() is step 2's copy for a
// payload that arrived in one buffer.
//
// Not thread-safe: one decoder per receiving stream.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "tensorwire/core/consolidate.h"
#include "tensorwire/wire/frame.h"
#include "tensorwire/wire/layout.h"

namespace tensorwire::wire {

struct Incoming {
  FrameHeader header;
  std::vector<std::span<std::byte>> buffers;  // payload destinations, in order
  // internal state carried from prepare() to finish()
  std::optional<ConsolidatedLayout> new_layout;
  std::optional<TensorDict> result;
  TensorDict* target = nullptr;
  Json control;

  // Forgets the previous message but keeps the buffers' capacity, so a receiver that
  // reuses one Incoming allocates nothing per message in the steady state.
  void reset() noexcept {
    buffers.clear();
    new_layout.reset();
    result.reset();
    target = nullptr;
    control = nullptr;
  }
};

class Decoder {
 public:
  explicit Decoder(Limits limits = {});

  FrameHeader read_header(std::span<const std::byte> bytes) const;

  // `into`: a consolidated TensorDict the caller wants a Storage message written into;
  // used when its storage has the cached schema's layout, ignored otherwise.
  Incoming prepare(const FrameHeader& header, std::span<const std::byte> metadata,
                   TensorDict* into = nullptr);
  // Same, into an Incoming the caller reuses (no allocation for storage messages).
  void prepare(const FrameHeader& header, std::span<const std::byte> metadata, TensorDict* into,
               Incoming& out);

  // Copies a payload held in one contiguous buffer (its size checked against the header
  // by the caller) into the buffers prepare() returned, in order.
  static void fill(const Incoming& incoming, std::span<const std::byte> payload);

  // For Storage messages into the cached TensorDict, returns that same object.
  TensorDict& finish(Incoming& incoming);

  TensorDict& decode(std::span<const std::byte> message, TensorDict* into = nullptr);

  bool has_schema() const noexcept { return layout_.has_value(); }
  uint64_t schema_id() const noexcept { return schema_id_; }
  const Limits& limits() const noexcept { return limits_; }

 private:
  void prepare_schema(const FrameHeader& h, std::span<const std::byte> metadata, Incoming& in);
  void prepare_storage(const FrameHeader& h, TensorDict* into, Incoming& in);
  void prepare_non_consolidated(const FrameHeader& h, std::span<const std::byte> metadata,
                                Incoming& in);

  bool same_layout(const std::shared_ptr<const Json>& meta);

  Limits limits_;
  uint64_t schema_id_ = 0;
  std::optional<ConsolidatedLayout> layout_;
  TensorDict current_;       // the last consolidated receive (target of Storage messages)
  Storage current_storage_;  // its storage, kept even if the caller unlocks current_
  std::shared_ptr<const Json> matched_into_meta_;  // a caller's layout found equal to the schema
  TensorDict nc_current_;                          // the last non-consolidated receive
};

// Parses a JSON document from untrusted bytes; ProtocolError (naming `what`) on bad JSON
// or when it nests deeper than the limits allow.
Json parse_untrusted_json(std::span<const std::byte> bytes, const Limits& limits, const char* what);

}  // namespace tensorwire::wire
