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

// Whether `value` nests lists/objects deeper than max_depth. Bounded recursion (it stops one
// level past the limit), so it is safe on untrusted values; the wire layer uses it where it
// validates received values, with its own ProtocolError.
bool value_deeper_than(const Json& value, uint32_t max_depth) noexcept;

// Throws ValueError naming `where` when `value` nests lists/objects deeper than max_depth.
void check_value_depth(const Json& value, uint32_t max_depth, const std::string& where);

}  // namespace tensorwire
