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

namespace {

void flatten(const Json& v, size_t dim, const Shape& shape, std::vector<Json>& out) {
  if (dim == shape.size()) return out.push_back(v);
  if (!v.is_array() || static_cast<int64_t>(v.size()) != shape[dim])
    throw ValueError("NonTensorStack: values do not match batch_size " + shape_str(shape));
  for (const Json& x : v) flatten(x, dim + 1, shape, out);
}

Json nest(const NonTensorStack& st, size_t dim, size_t& pos) {
  Json out = Json::array();
  for (int64_t i = 0; i < st.batch_size[dim]; ++i)
    out.push_back(dim + 1 == st.batch_size.size() ? st.values[pos++] : nest(st, dim + 1, pos));
  return out;
}

}  // namespace

NonTensorStack NonTensorStack::from_nested(const Json& nested, std::optional<Shape> batch_size,
                                           int64_t stack_dim) {
  NonTensorStack st{Shape{}, stack_dim, {}};
  if (batch_size)
    st.batch_size = std::move(*batch_size);
  else if (nested.is_array())
    st.batch_size = {static_cast<int64_t>(nested.size())};
  flatten(nested, 0, st.batch_size, st.values);
  st.validate();
  return st;
}

Json NonTensorStack::to_nested() const {
  size_t pos = 0;
  return nest(*this, 0, pos);
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
