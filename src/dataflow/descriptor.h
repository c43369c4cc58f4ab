// The descriptor: what goes through ZeroMQ between a runner's processes in place of a
// datapoint whose bytes are in shared memory (docs/dataflow.md has the byte layout).
//
//   [32-byte descriptor header][body]
//   body of a Datapoint: a tensorwire frame header (SchemaAndStorage or Storage, with
//                        payload_bytes = the bytes in the chunk) + the schema's metadata
//   body of an Error:    u32 JSON length, JSON {"type","message","traceback"}, payload
//   body of a Filtered:  empty (a map function returned nothing)
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::dataflow::detail {

inline constexpr uint32_t kDescriptorMagic = 0x46445754;  // "TWDF"
inline constexpr uint8_t kDescriptorVersion = 1;
inline constexpr size_t kDescriptorHeaderBytes = 32;
inline constexpr uint16_t kMainSender = 0xFFFF;
inline constexpr uint32_t kNoSegment = 0xFFFFFFFF;

enum class DescriptorKind : uint8_t { Datapoint = 1, Error = 2, Filtered = 3 };

struct DescriptorHeader {
  DescriptorKind kind = DescriptorKind::Datapoint;
  uint16_t sender = 0;  // worker index, or kMainSender
  uint64_t seq = 0;     // per-sender counter (map: the task id, echoed in the result)
  uint32_t segment = kNoSegment;
  uint32_t pass = 0;    // map: the pass of the dataflow a task belongs to
  uint64_t offset = 0;  // payload offset of the chunk in the segment

  void encode(std::string& out) const;  // appends 32 bytes
  // ProtocolError naming the field for bytes that are not a descriptor.
  static DescriptorHeader decode(std::span<const std::byte> bytes);
};

std::string encode_failure(const Failure& f);
Failure decode_failure(std::span<const std::byte> body);

}  // namespace tensorwire::dataflow::detail
