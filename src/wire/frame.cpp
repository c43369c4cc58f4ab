#include "tensorwire/wire/frame.h"

#include <array>
#include <string>

#include "bytes.h"
#include "tensorwire/core/error.h"

namespace tensorwire::wire {

namespace detail {
// Slicing-by-8 (eight table lookups per 8 bytes): the header CRC is computed on every
// message sent and received, and a byte-at-a-time loop cost ~50 ns of a ~450 ns one-way
// pipe latency. The tables are made at compile time: a function-local static initialized
// at first use would leave a child forked during that first use waiting on its guard.
uint32_t crc32(std::span<const std::byte> bytes) noexcept {
  static constexpr auto tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (size_t k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
    return t;
  }();
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t n = bytes.size();
  uint32_t c = 0xFFFFFFFFu;
  for (; n >= 8; p += 8, n -= 8) {
    const uint32_t lo =
        c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    c = tables[7][lo & 0xff] ^ tables[6][(lo >> 8) & 0xff] ^ tables[5][(lo >> 16) & 0xff] ^
        tables[4][lo >> 24] ^ tables[3][p[4]] ^ tables[2][p[5]] ^ tables[1][p[6]] ^ tables[0][p[7]];
  }
  for (; n > 0; ++p, --n) c = tables[0][(c ^ *p) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}
}  // namespace detail

using detail::load_le;
using detail::store_le;

// Byte offsets of the header fields (docs/protocol.md, "Frame header").
namespace off {
constexpr size_t magic = 0, version = 4, kind = 6, flags = 7, schema_id = 8, metadata = 16,
                 payload = 24, reserved = 32, crc = 36;
}

const char* kind_name(MessageKind kind) noexcept {
  switch (kind) {
    case MessageKind::SchemaAndStorage:
      return "schema+storage";
    case MessageKind::Storage:
      return "storage";
    case MessageKind::NonConsolidated:
      return "non-consolidated";
    case MessageKind::Control:
      return "control";
  }
  return "unknown";
}

FrameHeader::Bytes FrameHeader::encode() const noexcept {
  Bytes b{};
  store_le<uint32_t>(b.data() + off::magic, kMagic);
  store_le<uint16_t>(b.data() + off::version, kVersion);
  b[off::kind] = static_cast<std::byte>(kind);
  b[off::flags] = static_cast<std::byte>(flags);
  store_le<uint64_t>(b.data() + off::schema_id, schema_id);
  store_le<uint64_t>(b.data() + off::metadata, metadata_bytes);
  store_le<uint64_t>(b.data() + off::payload, payload_bytes);
  store_le<uint32_t>(b.data() + off::reserved, 0);
  store_le<uint32_t>(b.data() + off::crc, detail::crc32({b.data(), off::crc}));
  return b;
}

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& rule) {
  throw ProtocolError("invalid frame header: " + field + ": " + rule);
}
}  // namespace

FrameHeader FrameHeader::decode(std::span<const std::byte> b, const Limits& limits) {
  if (b.size() != kHeaderBytes)
    bad("length", std::to_string(b.size()) + " bytes, a header is " + std::to_string(kHeaderBytes));
  if (uint32_t m = load_le<uint32_t>(b.data() + off::magic); m != kMagic)
    bad(
        "magic", "expected 0x52495754 (\"TWIR\"), got 0x" + [m] {
          char buf[9];
          std::snprintf(buf, sizeof buf, "%08x", m);
          return std::string(buf);
        }());
  if (uint16_t v = load_le<uint16_t>(b.data() + off::version); v != kVersion)
    bad("version", "this side speaks version " + std::to_string(kVersion) + ", peer sent " +
                       std::to_string(v));
  uint32_t crc = load_le<uint32_t>(b.data() + off::crc);
  if (crc != detail::crc32(b.first(off::crc))) bad("checksum", "header CRC-32 does not match");
  FrameHeader h;
  uint8_t kind = static_cast<uint8_t>(b[off::kind]);
  if (kind < 1 || kind > 4) bad("kind", "unknown message kind " + std::to_string(kind));
  h.kind = static_cast<MessageKind>(kind);
  h.flags = static_cast<uint8_t>(b[off::flags]);
  if (h.flags != 0) bad("flags", "must be 0 in version 1, got " + std::to_string(h.flags));
  if (load_le<uint32_t>(b.data() + off::reserved) != 0) bad("reserved", "must be 0");
  h.schema_id = load_le<uint64_t>(b.data() + off::schema_id);
  h.metadata_bytes = load_le<uint64_t>(b.data() + off::metadata);
  h.payload_bytes = load_le<uint64_t>(b.data() + off::payload);

  const bool has_schema = h.kind == MessageKind::SchemaAndStorage || h.kind == MessageKind::Storage;
  if (has_schema && h.schema_id == 0)
    bad("schema_id", std::string("must be non-zero for a ") + kind_name(h.kind) + " message");
  if (!has_schema && h.schema_id != 0)
    bad("schema_id", std::string("must be 0 for a ") + kind_name(h.kind) + " message");
  if (h.kind == MessageKind::Storage) {
    if (h.metadata_bytes != 0) bad("metadata_bytes", "must be 0 for a storage message");
  } else {
    if (h.metadata_bytes < 2) bad("metadata_bytes", "a JSON document needs at least 2 bytes");
    if (h.metadata_bytes > limits.max_metadata_bytes)
      bad("metadata_bytes", std::to_string(h.metadata_bytes) + " exceeds the limit of " +
                                std::to_string(limits.max_metadata_bytes));
  }
  if (h.kind == MessageKind::Control && h.payload_bytes != 0)
    bad("payload_bytes", "must be 0 for a control message");
  if (h.payload_bytes > limits.max_message_bytes)
    bad("payload_bytes", std::to_string(h.payload_bytes) + " exceeds max_message_bytes " +
                             std::to_string(limits.max_message_bytes));
  return h;
}

}  // namespace tensorwire::wire
