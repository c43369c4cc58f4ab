// Non-tensor entries of a TensorDict: small JSON-representable values.
#pragma once

#include <optional>
#include <vector>

#include "tensorwire/core/json.h"
#include "tensorwire/core/tensor.h"

namespace tensorwire {

// One value shared by the whole batch (tensordict's NonTensorData).
struct NonTensor {
  Json value;
  friend bool operator==(const NonTensor&, const NonTensor&) = default;
};

// One value per batch element (tensordict's NonTensorStack). `values` holds
// prod(batch_size) values in row-major order; `stack_dim` is the dimension the stack
// was built along (kept for round trips; the values are always stored row-major).
struct NonTensorStack {
  Shape batch_size;
  int64_t stack_dim = 0;
  std::vector<Json> values;

  // Checks that values.size() == prod(batch_size) and 0 <= stack_dim < batch dims.
  void validate() const;

  // From nested arrays, one level per batch dim (as tensordict.NonTensorStack(...).tolist()
  // gives them). Without `batch_size` only the outer array is the batch: deeper arrays are
  // values. ValueError when the nesting does not match the batch size.
  static NonTensorStack from_nested(const Json& nested, std::optional<Shape> batch_size = {},
                                    int64_t stack_dim = 0);
  // The values nested one array per batch dim (the inverse of from_nested).
  Json to_nested() const;
  friend bool operator==(const NonTensorStack&, const NonTensorStack&) = default;
};

// True for JSON values tensorwire can send: null, bool, numbers, strings, arrays and
// objects of them. (Any nlohmann value qualifies except a binary one.)
bool is_json_representable(const Json& value) noexcept;

}  // namespace tensorwire
