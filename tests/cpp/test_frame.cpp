// FrameHeader: the 40-byte header of every message, and each rule decode() enforces.
//
// Layout (little-endian): magic u32 @0, version u16 @4, kind u8 @6, flags u8 @7,
// schema_id u64 @8, metadata_bytes u64 @16, payload_bytes u64 @24, reserved u32 @32,
// CRC-32 of bytes 0..35 u32 @36.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tensorwire/core/error.h"
#include "tensorwire/wire/frame.h"

namespace tensorwire::wire {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// CRC-32 (IEEE 802.3, as zlib's crc32()), written independently of the library's.
uint32_t reference_crc32(const std::byte* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= static_cast<uint8_t>(p[i]);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

template <class T>
void put(FrameHeader::Bytes& b, size_t at, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) b[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

template <class T>
T get(const FrameHeader::Bytes& b, size_t at) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<T>(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return v;
}

// Recomputes the CRC after a test has edited a field, so that the edited rule is what fails.
void reseal(FrameHeader::Bytes& b) {
  put<uint32_t>(b, 36, reference_crc32(b.data(), 36));
}

FrameHeader schema_header() {
  FrameHeader h;
  h.kind = MessageKind::SchemaAndStorage;
  h.schema_id = 7;
  h.metadata_bytes = 123;
  h.payload_bytes = 4096;
  return h;
}

// decode() must throw a ProtocolError naming `field`.
void expect_rejected(const FrameHeader::Bytes& b, const std::string& field,
                     const Limits& limits = {}) {
  try {
    FrameHeader::decode(b, limits);
    ADD_FAILURE() << "expected ProtocolError naming " << field;
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("invalid frame header"), HasSubstr(field + ":")));
  }
}

TEST(FrameHeader, EncodeWritesTheDocumentedLayout) {
  FrameHeader::Bytes b = schema_header().encode();
  EXPECT_EQ(b.size(), kHeaderBytes);
  EXPECT_EQ(static_cast<char>(b[0]), 'T');
  EXPECT_EQ(static_cast<char>(b[1]), 'W');
  EXPECT_EQ(static_cast<char>(b[2]), 'I');
  EXPECT_EQ(static_cast<char>(b[3]), 'R');
  EXPECT_EQ(get<uint16_t>(b, 4), kVersion);
  EXPECT_EQ(static_cast<uint8_t>(b[6]), 1);
  EXPECT_EQ(static_cast<uint8_t>(b[7]), 0);
  EXPECT_EQ(get<uint64_t>(b, 8), 7u);
  EXPECT_EQ(get<uint64_t>(b, 16), 123u);
  EXPECT_EQ(get<uint64_t>(b, 24), 4096u);
  EXPECT_EQ(get<uint32_t>(b, 32), 0u);
  EXPECT_EQ(get<uint32_t>(b, 36), reference_crc32(b.data(), 36));
}

TEST(FrameHeader, EncodeDecodeRoundTripsEveryKind) {
  std::vector<FrameHeader> headers;
  headers.push_back(schema_header());
  FrameHeader storage;
  storage.kind = MessageKind::Storage;
  storage.schema_id = 7;
  storage.payload_bytes = 4096;
  headers.push_back(storage);
  FrameHeader nc;
  nc.kind = MessageKind::NonConsolidated;
  nc.metadata_bytes = 99;
  nc.payload_bytes = 12;
  headers.push_back(nc);
  FrameHeader control;
  control.kind = MessageKind::Control;
  control.metadata_bytes = 2;
  headers.push_back(control);

  for (const FrameHeader& h : headers) {
    FrameHeader d = FrameHeader::decode(h.encode(), Limits{});
    EXPECT_EQ(d.kind, h.kind) << kind_name(h.kind);
    EXPECT_EQ(d.flags, 0);
    EXPECT_EQ(d.schema_id, h.schema_id);
    EXPECT_EQ(d.metadata_bytes, h.metadata_bytes);
    EXPECT_EQ(d.payload_bytes, h.payload_bytes);
  }
}

TEST(FrameHeader, KindNamesAreReadable) {
  EXPECT_STREQ(kind_name(MessageKind::SchemaAndStorage), "schema+storage");
  EXPECT_STREQ(kind_name(MessageKind::Storage), "storage");
  EXPECT_STREQ(kind_name(MessageKind::NonConsolidated), "non-consolidated");
  EXPECT_STREQ(kind_name(MessageKind::Control), "control");
}

TEST(FrameHeader, DecodeRejectsAWrongLength) {
  FrameHeader::Bytes b = schema_header().encode();
  EXPECT_THROW(FrameHeader::decode(std::span(b).first(39), Limits{}), ProtocolError);
}

TEST(FrameHeader, DecodeRejectsBadMagic) {
  FrameHeader::Bytes b = schema_header().encode();
  b[0] = std::byte{'X'};
  reseal(b);
  expect_rejected(b, "magic");
}

TEST(FrameHeader, DecodeRejectsAnotherVersion) {
  FrameHeader::Bytes b = schema_header().encode();
  put<uint16_t>(b, 4, 2);
  reseal(b);
  expect_rejected(b, "version");
}

TEST(FrameHeader, DecodeRejectsUnknownKinds) {
  for (uint8_t kind : {0, 5, 255}) {
    FrameHeader::Bytes b = schema_header().encode();
    b[6] = std::byte{kind};
    reseal(b);
    expect_rejected(b, "kind");
  }
}

TEST(FrameHeader, DecodeRejectsNonZeroFlags) {
  FrameHeader::Bytes b = schema_header().encode();
  b[7] = std::byte{1};
  reseal(b);
  expect_rejected(b, "flags");
}

TEST(FrameHeader, DecodeRejectsNonZeroReservedBytes) {
  FrameHeader::Bytes b = schema_header().encode();
  b[34] = std::byte{1};
  reseal(b);
  expect_rejected(b, "reserved");
}

TEST(FrameHeader, DecodeRejectsACrcMismatch) {
  // Any single flipped bit in bytes 8..39 is caught by the checksum.
  for (size_t at : {8u, 16u, 23u, 24u, 31u, 36u, 39u}) {
    FrameHeader::Bytes b = schema_header().encode();
    b[at] ^= std::byte{0x01};
    expect_rejected(b, "checksum");
  }
}

TEST(FrameHeader, DecodeRejectsSchemaIdZeroForSchemaAndStorageMessages) {
  for (MessageKind kind : {MessageKind::SchemaAndStorage, MessageKind::Storage}) {
    FrameHeader h = schema_header();
    h.kind = kind;
    h.schema_id = 0;
    if (kind == MessageKind::Storage) h.metadata_bytes = 0;
    expect_rejected(h.encode(), "schema_id");
  }
}

TEST(FrameHeader, DecodeRejectsASchemaIdOnNonConsolidatedAndControlMessages) {
  for (MessageKind kind : {MessageKind::NonConsolidated, MessageKind::Control}) {
    FrameHeader h;
    h.kind = kind;
    h.schema_id = 3;
    h.metadata_bytes = 10;
    expect_rejected(h.encode(), "schema_id");
  }
}

TEST(FrameHeader, DecodeRejectsMetadataOnAStorageMessage) {
  FrameHeader h = schema_header();
  h.kind = MessageKind::Storage;
  h.metadata_bytes = 5;
  expect_rejected(h.encode(), "metadata_bytes");
}

TEST(FrameHeader, DecodeRejectsMetadataTooShortForJson) {
  FrameHeader h = schema_header();
  h.metadata_bytes = 1;
  expect_rejected(h.encode(), "metadata_bytes");
}

TEST(FrameHeader, DecodeRejectsMetadataBytesOverTheLimit) {
  Limits limits;
  limits.max_metadata_bytes = 1000;
  FrameHeader h = schema_header();
  h.metadata_bytes = 1000;
  EXPECT_NO_THROW(FrameHeader::decode(h.encode(), limits));
  h.metadata_bytes = 1001;
  expect_rejected(h.encode(), "metadata_bytes", limits);
  h.metadata_bytes = ~uint64_t{0};
  expect_rejected(h.encode(), "metadata_bytes", limits);
}

TEST(FrameHeader, DecodeRejectsPayloadOverMaxMessageBytes) {
  Limits limits;
  limits.max_message_bytes = 1 << 20;
  FrameHeader h = schema_header();
  h.payload_bytes = 1 << 20;
  EXPECT_NO_THROW(FrameHeader::decode(h.encode(), limits));
  h.payload_bytes = (1 << 20) + 1;
  expect_rejected(h.encode(), "payload_bytes", limits);
  h.payload_bytes = ~uint64_t{0};
  expect_rejected(h.encode(), "payload_bytes", limits);
}

TEST(FrameHeader, DecodeRejectsAControlMessageWithPayload) {
  FrameHeader h;
  h.kind = MessageKind::Control;
  h.metadata_bytes = 2;
  h.payload_bytes = 1;
  expect_rejected(h.encode(), "payload_bytes");
}

}  // namespace
}  // namespace tensorwire::wire
