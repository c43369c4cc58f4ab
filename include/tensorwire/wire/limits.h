// Limits a decoder enforces on untrusted input before allocating anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensorwire/core/nesting.h"

namespace tensorwire::wire {

struct Limits {
  uint64_t max_metadata_bytes = 64ull << 20;  // schema / header JSON
  uint64_t max_message_bytes = 16ull << 30;   // payload (storage or leaf bytes)
  uint32_t max_leaves = 1u << 20;             // tensor + non-tensor entries, all levels
  // Nesting of sub-dicts (and of lists/dicts in a non-tensor value): what a sender may
  // build (ConsolidateOptions::max_depth) and a receiver accepts share kMaxDepth.
  uint32_t max_depth = kMaxDepth;
  uint32_t max_dims = 64;  // dims of one shape (batch or leaf)
};

// Deepest JSON nesting a metadata text may have: two levels per sub-dict, plus room for the
// entries' own lists and a non-tensor value, so nothing consolidate() accepts is refused.
constexpr int max_json_depth(const Limits& limits) {
  return static_cast<int>(limits.max_depth) * 2 + 16;
}

// The rule a received non-tensor value breaks when value_deeper_than(value, max_depth): the
// same limit consolidate() and a sender apply, so what is received can be sent on.
inline std::string value_depth_rule(const Limits& limits) {
  return "non-tensor value nests lists/dicts more than " + std::to_string(limits.max_depth) +
         " levels deep (Limits::max_depth, default kMaxDepth = " + std::to_string(kMaxDepth) +
         "; a sender refuses the same)";
}

}  // namespace tensorwire::wire
