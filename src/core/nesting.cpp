#include "tensorwire/core/nesting.h"

#include "tensorwire/core/error.h"

namespace tensorwire {

// Recursion stops one level past the limit, so it is bounded whatever the value holds.
bool value_deeper_than(const Json& v, uint32_t levels) noexcept {
  if (!v.is_structured()) return false;
  if (levels == 0) return true;
  for (const Json& x : v)
    if (value_deeper_than(x, levels - 1)) return true;
  return false;
}

void check_value_depth(const Json& value, uint32_t max_depth, const std::string& where) {
  if (value_deeper_than(value, max_depth))
    throw ValueError(where + ": non-tensor value nests lists/dicts more than " +
                     std::to_string(max_depth) + " levels deep (the limit, kMaxDepth)");
}

}  // namespace tensorwire
