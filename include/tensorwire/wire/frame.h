// The frame header that starts every tensorwire message. docs/protocol.md describes it
// byte by byte; this struct is its in-memory form.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "tensorwire/wire/limits.h"

namespace tensorwire::wire {

inline constexpr uint32_t kMagic = 0x52495754;  // "TWIR" as little-endian bytes
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 40;

enum class MessageKind : uint8_t {
  SchemaAndStorage = 1,  // metadata JSON (a new structure), then the storage
  Storage = 2,           // the storage only, for the structure of schema `schema_id`
  NonConsolidated = 3,   // a JSON header, then each leaf's bytes back to back
  Control = 4,           // metadata JSON only, for transport handshakes (no payload)
};

const char* kind_name(MessageKind kind) noexcept;

struct FrameHeader {
  MessageKind kind = MessageKind::SchemaAndStorage;
  uint8_t flags = 0;            // must be 0 in version 1
  uint64_t schema_id = 0;       // 0 only for NonConsolidated / Control
  uint64_t metadata_bytes = 0;  // JSON bytes that follow the header
  uint64_t payload_bytes = 0;   // bytes that follow the JSON

  using Bytes = std::array<std::byte, kHeaderBytes>;
  Bytes encode() const noexcept;
  // Validates magic, version, kind, flags, reserved bytes, sizes against limits and the
  // kind's rules; throws ProtocolError naming the field and the rule.
  static FrameHeader decode(std::span<const std::byte> bytes, const Limits& limits);
};

}  // namespace tensorwire::wire
