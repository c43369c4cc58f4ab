// How deep a TensorDict may nest. One number for the side that builds a dict and the side
// that reads it back (wire::Limits::max_depth defaults to it), so whatever consolidate(),
// save() or a sender accepts, load() and a receiver accept too.
#pragma once

#include <cstdint>
#include <string>

#include "tensorwire/core/json.h"

namespace tensorwire {

// Sub-dict levels below the root (a leaf's key path has at most kMaxDepth + 1 parts), and
// list/dict levels inside one non-tensor value.
inline constexpr uint32_t kMaxDepth = 256;

// Throws ValueError naming `where` when `value` nests lists/objects deeper than max_depth.
void check_value_depth(const Json& value, uint32_t max_depth, const std::string& where);

}  // namespace tensorwire
