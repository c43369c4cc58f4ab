#include "core/stack_layout.h"

#include <vector>

namespace tensorwire::detail {

NonTensorStack move_stack_dim(const NonTensorStack& st, size_t from, size_t to) {
  const size_t k = st.batch_size.size();
  std::vector<size_t> axis;  // new dim i is old dim axis[i]
  for (size_t i = 0; i < k; ++i)
    if (i != from) axis.push_back(i);
  axis.insert(axis.begin() + static_cast<std::ptrdiff_t>(to), from);
  std::vector<size_t> old_stride(k, 1);
  for (size_t i = k; i-- > 1;)
    old_stride[i - 1] = old_stride[i] * static_cast<size_t>(st.batch_size[i]);
  NonTensorStack out;
  out.stack_dim = st.stack_dim;
  for (size_t i = 0; i < k; ++i) out.batch_size.push_back(st.batch_size[axis[i]]);
  out.values.reserve(st.values.size());
  std::vector<int64_t> at(k, 0);  // the new multi-index, row-major
  for (size_t n = 0; n < st.values.size(); ++n) {
    size_t old = 0;
    for (size_t i = 0; i < k; ++i) old += static_cast<size_t>(at[i]) * old_stride[axis[i]];
    out.values.push_back(st.values[old]);
    for (size_t i = k; i-- > 0;) {
      if (++at[i] < out.batch_size[i]) break;
      at[i] = 0;
    }
  }
  return out;
}

}  // namespace tensorwire::detail
