#include "tensorwire/core/non_tensor.h"

namespace tensorwire {

void NonTensorStack::validate() const {
  int64_t n = checked_numel(batch_size);
  if (batch_size.empty()) throw ValueError("NonTensorStack: batch_size must have at least one dim");
  if (static_cast<int64_t>(values.size()) != n)
    throw ValueError("NonTensorStack: " + std::to_string(values.size()) +
                     " values for batch_size " + shape_str(batch_size) + " (expected " +
                     std::to_string(n) + ")");
  if (stack_dim < 0 || stack_dim >= static_cast<int64_t>(batch_size.size()))
    throw ValueError("NonTensorStack: stack_dim " + std::to_string(stack_dim) +
                     " out of range for batch_size " + shape_str(batch_size));
}

bool is_json_representable(const Json& value) noexcept {
  switch (value.type()) {
    case Json::value_t::binary:
    case Json::value_t::discarded:
      return false;
    case Json::value_t::array:
    case Json::value_t::object:
      for (const auto& v : value)
        if (!is_json_representable(v)) return false;
      return true;
    default:
      return true;
  }
}

}  // namespace tensorwire
