// The Python-facing TensorDict: a handle on a root C++ TensorDict plus a key path, so
// td["info"] is a live view of the nested dict (writes through it are seen by the parent,
// as in tensordict) and never dangles: a path that no longer exists raises KeyError.
#pragma once

#include <memory>

#include "convert.h"

namespace tensorwire::py {

struct PyTensorDict {
  std::shared_ptr<TensorDict> root;
  std::vector<std::string> prefix;

  explicit PyTensorDict(TensorDict td) : root(std::make_shared<TensorDict>(std::move(td))) {}
  PyTensorDict(std::shared_ptr<TensorDict> r, std::vector<std::string> p)
      : root(std::move(r)), prefix(std::move(p)) {}

  TensorDict& td() const { return prefix.empty() ? *root : root->get_tensordict(Key(prefix)); }
};

struct PyNonTensorStack {
  NonTensorStack stack;
};

// Converts a Python value to an entry for a dict of the given batch size.
Entry to_entry(nb::handle value, const Shape& batch_size, const std::optional<Device>& device,
               const Key& key);
nb::object from_entry(const Entry& e, const PyTensorDict& owner, const Key& key);

}  // namespace tensorwire::py
