// A tensor brought to another shape and dtype the way torch's copy_ brings its source to
// the destination (numpy broadcasting, then a cast), for TensorDict::update_: code written
// for tensordict updates a float32 leaf with a Python int or a batch of rows with one row.
#pragma once

#include <string>

#include "tensorwire/core/tensor.h"

namespace tensorwire::detail {

// `src` broadcast to `shape` and cast to `dtype`: a view of `src` when only the shape
// changes, new storage when the dtype does. Casts as torch: integers wrap, a float into an
// integer truncates toward zero, anything into bool is "not zero", a float64 too large for
// float32 becomes an infinity. ValueError, starting with `what`, when `src` does not
// broadcast to `shape`, when a NaN, an infinity or a float out of range would go into an
// integer (C++ leaves that undefined, torch gives garbage), and for a cast from or to a
// complex or float8 dtype (not supported).
Tensor cast_to(const Tensor& src, const Shape& shape, DType dtype, const std::string& what);

}  // namespace tensorwire::detail
