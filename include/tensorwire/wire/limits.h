// Limits a decoder enforces on untrusted input before allocating anything.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tensorwire::wire {

struct Limits {
  uint64_t max_metadata_bytes = 64ull << 20;  // schema / header JSON
  uint64_t max_message_bytes = 16ull << 30;   // payload (storage or leaf bytes)
  uint32_t max_leaves = 1u << 20;             // tensor + non-tensor entries, all levels
  uint32_t max_depth = 64;                    // nesting of sub-dicts
  uint32_t max_dims = 64;                     // dims of one shape (batch or leaf)
};

}  // namespace tensorwire::wire
