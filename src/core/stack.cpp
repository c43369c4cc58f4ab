// stack(), unbind() and index(): moving between a batch of TensorDicts and one
// TensorDict with an extra leading batch dimension.
#include <algorithm>
#include <cstring>

#include "tensorwire/core/tensordict.h"

namespace tensorwire {

namespace {

// Values of a non-tensor entry, row-major over `batch` (a NonTensor repeats its value).
std::vector<Json> expand_values(const Entry& e, const Shape& batch) {
  if (e.is_non_tensor_stack()) return e.non_tensor_stack().values;
  return std::vector<Json>(static_cast<size_t>(checked_numel(batch)), e.non_tensor().value);
}

}  // namespace

TensorDict TensorDict::stack(const std::vector<TensorDict>& tds) {
  if (tds.empty()) throw ValueError("stack: need at least one TensorDict");
  const TensorDict& first = tds.front();
  for (size_t i = 1; i < tds.size(); ++i) {
    if (tds[i].batch_size_ != first.batch_size_)
      throw ValueError("stack: element " + std::to_string(i) + " has batch_size " +
                       shape_str(tds[i].batch_size_) + ", element 0 has " +
                       shape_str(first.batch_size_));
    if (tds[i].size() != first.size())
      throw ValueError("stack: element " + std::to_string(i) + " has " +
                       std::to_string(tds[i].size()) + " keys, element 0 has " +
                       std::to_string(first.size()));
  }
  const int64_t n = static_cast<int64_t>(tds.size());
  Shape batch{n};
  batch.insert(batch.end(), first.batch_size_.begin(), first.batch_size_.end());
  TensorDict out(batch, first.device_);
  std::vector<std::optional<std::string>> names{std::nullopt};
  names.insert(names.end(), first.names_.begin(), first.names_.end());
  out.names_ = std::move(names);

  for (const auto& [name, e0] : first.entries_) {
    std::vector<const Entry*> column;
    for (size_t i = 0; i < tds.size(); ++i) {
      const Entry* e = tds[i].find(name);
      if (!e) throw KeyError("stack: key '" + name + "' missing from element " + std::to_string(i));
      if (e->value().index() != e0.value().index() &&
          !(!e0.is_tensor() && !e0.is_tensordict() && !e->is_tensor() && !e->is_tensordict()))
        throw ValueError("stack: key '" + name + "' is a " + e->kind_name() + " in element " +
                         std::to_string(i) + " and a " + e0.kind_name() + " in element 0");
      column.push_back(e);
    }
    if (e0.is_tensor()) {
      const Tensor& t0 = e0.tensor();
      Shape shape{n};
      shape.insert(shape.end(), t0.shape().begin(), t0.shape().end());
      Tensor result = Tensor::empty(shape, t0.dtype());
      auto* dst = static_cast<std::byte*>(result.data());
      for (size_t i = 0; i < column.size(); ++i) {
        const Tensor& t = column[i]->tensor();
        if (t.shape() != t0.shape() || t.dtype() != t0.dtype())
          throw ValueError("stack: key '" + name + "' is " + std::string(dtype_name(t.dtype())) +
                           shape_str(t.shape()) + " in element " + std::to_string(i) + " and " +
                           std::string(dtype_name(t0.dtype())) + shape_str(t0.shape()) +
                           " in element 0");
        t.copy_to(dst + i * t0.nbytes());
      }
      out.append_(name, Entry(std::move(result)));
    } else if (e0.is_tensordict()) {
      std::vector<TensorDict> sub;
      sub.reserve(column.size());
      for (const Entry* e : column) sub.push_back(e->tensordict());
      out.append_(name, Entry(stack(sub)));
    } else {
      bool all_same = e0.is_non_tensor();
      for (const Entry* e : column)
        all_same = all_same && e->is_non_tensor() && e->non_tensor() == e0.non_tensor();
      if (all_same) {
        out.append_(name, e0);
        continue;
      }
      NonTensorStack st;
      st.batch_size = batch;
      for (const Entry* e : column) {
        Shape inner =
            e->is_non_tensor_stack() ? e->non_tensor_stack().batch_size : first.batch_size_;
        auto vals = expand_values(*e, inner);
        if (e->is_non_tensor_stack() && inner.size() > first.batch_size_.size()) {
          // Stacks deeper than the batch keep their own dims.
          st.batch_size = Shape{n};
          st.batch_size.insert(st.batch_size.end(), inner.begin(), inner.end());
        }
        st.values.insert(st.values.end(), vals.begin(), vals.end());
      }
      st.validate();
      out.append_(name, Entry(std::move(st)));
    }
  }
  return out;
}

TensorDict TensorDict::index(int64_t i) const {
  if (batch_size_.empty()) throw ValueError("index: the TensorDict has no batch dimension");
  const int64_t n = batch_size_[0];
  if (i >= n || i < -n)
    throw IndexError("index " + std::to_string(i) +
                     " is out of range for batch dimension 0 of size " + std::to_string(n));
  if (i < 0) i += n;
  TensorDict out(Shape(batch_size_.begin() + 1, batch_size_.end()), device_);
  out.names_.assign(names_.begin() + 1, names_.end());
  for (const auto& [name, e] : entries_) {
    if (e.is_tensor()) {
      out.append_(name, Entry(e.tensor().select(i)));
    } else if (e.is_tensordict()) {
      out.append_(name, Entry(e.tensordict().index(i)));
    } else if (e.is_non_tensor()) {
      out.append_(name, e);
    } else {
      const NonTensorStack& st = e.non_tensor_stack();
      Shape inner(st.batch_size.begin() + 1, st.batch_size.end());
      const size_t per = static_cast<size_t>(checked_numel(inner));
      auto begin = st.values.begin() + static_cast<std::ptrdiff_t>(per * i);
      const bool all_same = std::all_of(begin, begin + static_cast<std::ptrdiff_t>(per),
                                        [&](const Json& v) { return v == *begin; });
      // One value for the whole remaining batch is a plain non-tensor value again (so
      // unbind(stack(tds)) gives back what was stacked).
      if (inner.empty() || (all_same && inner == out.batch_size_)) {
        out.append_(name, Entry(NonTensor{*begin}));
      } else {
        NonTensorStack sub{inner, std::max<int64_t>(0, st.stack_dim - 1),
                           std::vector<Json>(begin, begin + static_cast<std::ptrdiff_t>(per))};
        out.append_(name, Entry(std::move(sub)));
      }
    }
  }
  return out;
}

TensorDict TensorDict::slice(int64_t start, int64_t length, int64_t step) const {
  if (batch_size_.empty()) throw ValueError("slice: the TensorDict has no batch dimension");
  if (step <= 0) throw ValueError("slice: step must be positive, got " + std::to_string(step));
  if (start < 0 || length < 0 || (length > 0 && start + (length - 1) * step >= batch_size_[0]))
    throw ValueError("slice: out of range for batch_size " + shape_str(batch_size_));
  Shape batch = batch_size_;
  batch[0] = length;
  TensorDict out(std::move(batch), device_);
  out.names_ = names_;
  for (const auto& [name, e] : entries_) {
    if (e.is_tensor()) {
      out.append_(name, Entry(e.tensor().slice(start, length, step)));
    } else if (e.is_tensordict()) {
      out.append_(name, Entry(e.tensordict().slice(start, length, step)));
    } else if (e.is_non_tensor()) {
      out.append_(name, e);
    } else {
      NonTensorStack st = e.non_tensor_stack();
      const size_t per =
          st.values.size() / static_cast<size_t>(std::max<int64_t>(1, st.batch_size[0]));
      std::vector<Json> values;
      for (int64_t k = 0; k < length; ++k) {
        auto first = st.values.begin() + static_cast<std::ptrdiff_t>(per * (start + k * step));
        values.insert(values.end(), first, first + static_cast<std::ptrdiff_t>(per));
      }
      st.batch_size[0] = length;
      st.values = std::move(values);
      out.append_(name, Entry(std::move(st)));
    }
  }
  return out;
}

std::vector<TensorDict> TensorDict::unbind(int64_t dim) const {
  if (dim != 0) throw ValueError("unbind: only dim 0 is supported, got " + std::to_string(dim));
  if (batch_size_.empty()) throw ValueError("unbind: the TensorDict has no batch dimension");
  std::vector<TensorDict> out;
  out.reserve(static_cast<size_t>(batch_size_[0]));
  for (int64_t i = 0; i < batch_size_[0]; ++i) out.push_back(index(i));
  return out;
}

}  // namespace tensorwire
