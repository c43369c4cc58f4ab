// Building a TensorDict from Python values, tensordict's rule (docs/design.md): what
// TensorDict(...), td[key] = value, update_, inference requests and tensordict.TensorDicts
// become, and what reading an entry gives back.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "convert.h"

namespace tensorwire::py {

namespace {

using namespace nb::literals;

bool is_number_tree(nb::handle v) {
  if (nb::isinstance<nb::bool_>(v) || nb::isinstance<nb::int_>(v) || nb::isinstance<nb::float_>(v))
    return true;
  if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) {
    if (nb::len(v) == 0) return false;
    for (nb::handle x : v)
      if (!is_number_tree(x)) return false;
    return true;
  }
  return false;
}

// ValueError naming the first int of a number tree that int64 cannot hold (torch.tensor()
// refuses it too; numpy would make it uint64 or an object, and a cast would wrap it).
void check_ints_fit(nb::handle v, const Key& key) {
  if (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) {
    int overflow = 0;
    (void)PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0)
      throw ValueError("key " + key.str() + ": the int " + nb::cast<std::string>(nb::repr(v)) +
                       " does not fit int64, the dtype Python ints are stored as");
  } else if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) {
    for (nb::handle x : v) check_ints_fit(x, key);
  }
}

// Python numbers become tensors the way torch.tensor() types them: bool -> bool, int ->
// int64, float -> float32 (lists of numbers likewise). A numpy float64 scalar (a float to
// Python) keeps its dtype, as in torch.as_tensor and tensordict.
Tensor number_tensor(nb::handle v, const Key& key) {
  check_ints_fit(v, key);
  nb::module_ np = nb::module_::import_("numpy");
  nb::object arr = np.attr("asarray")(v);
  if (!nb::isinstance(v, np.attr("generic"))) {
    std::string kind = nb::cast<std::string>(arr.attr("dtype").attr("kind"));
    if (kind == "f")
      arr = arr.attr("astype")(np.attr("float32"));
    else if (kind == "i" || kind == "u")
      arr = arr.attr("astype")(np.attr("int64"));
  }
  std::optional<Tensor> t = to_tensor(arr);
  if (!t)
    throw TypeError("key " + key.str() + ": cannot store " + nb::cast<std::string>(nb::repr(v)) +
                    " as a tensor");
  return *t;
}

TensorDict dict_to_td(nb::handle d, const Shape& batch, const std::optional<Device>& device,
                      const Key& prefix) {
  TensorDict td(batch, device);
  for (auto [k, v] : nb::borrow<nb::dict>(d)) {
    if (!nb::isinstance<nb::str>(k)) throw TypeError("dict keys must be str");
    std::string name = utf8_of(k, "key");
    td.set(name, to_entry(v, batch, device, prefix.size() ? prefix.child(name) : Key(name)));
  }
  return td;
}

// The tensordict module when the program imported it (a tensordict object exists only then).
nb::object tensordict_lib() {
  return imported_module("tensordict");
}

bool is_instance(nb::handle value, const nb::object& lib, const char* cls) {
  return PyObject_IsInstance(value.ptr(), lib.attr(cls).ptr()) == 1;
}

// A tensordict.TensorDict with its own batch size, device and names; its NonTensorData
// and NonTensorStack entries become non-tensor entries (JSON values, as anywhere).
TensorDict from_tensordict_lib(nb::handle td, const nb::object& lib) {
  std::optional<Device> device;
  if (!td.attr("device").is_none()) device = parse_device(str_of_obj(td.attr("device")));
  TensorDict out(nb::cast<Shape>(nb::list(td.attr("batch_size"))), device);
  if (nb::cast<bool>(td.attr("_has_names")()))
    out.set_names(nb::cast<std::vector<std::optional<std::string>>>(nb::list(td.attr("names"))));
  for (nb::handle key : td.attr("keys")()) {
    const Key k = to_key(key);
    nb::object v = td.attr("_get_str")(key, nb::none());
    if (is_instance(v, lib, "NonTensorStack"))
      out.set(k, NonTensorStack::from_nested(
                     to_json(v.attr("tolist")(), "key " + k.str()),
                     nb::cast<Shape>(nb::list(v.attr("batch_size"))),
                     nb::cast<int64_t>(nb::getattr(v, "stack_dim", nb::int_(0)))));
    else if (is_instance(v, lib, "NonTensorData"))
      out.set(k, NonTensor{to_json(v.attr("data"), "key " + k.str())});
    else if (is_instance(v, lib, "TensorDictBase"))
      out.set(k, from_tensordict_lib(v, lib));
    else
      out.set(k, to_entry(v, out.batch_size(), device, k));
  }
  // Its lock too: the consolidated metadata records it, and a pipe's receiver locks what
  // was locked, as tensordict's does.
  if (nb::cast<bool>(td.attr("is_locked"))) out.lock_();
  return out;
}

// The leaf at `key` of a policy's tensordict.TensorDict output (None when absent), without
// its autograd graph: torch exports no tensor that requires grad, and a response needs
// only the values.
nb::object output_leaf(nb::handle out, const Key& key) {
  nb::object v = out.attr("get")(from_key(key), nb::none());
  if (!v.is_none() && nb::hasattr(v, "requires_grad") && nb::cast<bool>(v.attr("requires_grad")))
    return v.attr("detach")();
  return v;
}

// The first batch dimension of `shape` (none when it has none).
Shape first_dim(Shape shape) {
  shape.resize(std::min<size_t>(shape.size(), 1));
  return shape;
}

nb::object stack_to_lib(const Json& values, size_t dims, const nb::object& lib) {
  nb::list items;
  for (const Json& v : values)
    items.append(dims == 1 ? lib.attr("NonTensorData")(from_json(v))
                           : stack_to_lib(v, dims - 1, lib));
  return lib.attr("NonTensorStack")(*items);
}

}  // namespace

Entry to_entry(nb::handle value, const Shape& batch, const std::optional<Device>& device,
               const Key& key) {
  if (nb::isinstance<PyTensorDict>(value)) return Entry(nb::cast<PyTensorDict&>(value).td());
  if (nb::isinstance<PyNonTensorStack>(value))
    return Entry(nb::cast<PyNonTensorStack&>(value).stack);
  if (nb::isinstance<nb::dict>(value)) return Entry(dict_to_td(value, batch, device, key));
  if (value.is_none() || nb::isinstance<nb::str>(value))
    return Entry(NonTensor{to_json(value, "key " + key.str())});
  if (is_number_tree(value)) return Entry(number_tensor(value, key));
  if (is_tensordict_lib(value)) return Entry(tensordict_from(value, batch, device, ""));
  if (std::optional<Tensor> t = leaf_tensor(value, "key " + key.str())) return Entry(std::move(*t));
  if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value))
    return Entry(NonTensor{to_json(value, "key " + key.str())});
  throw TypeError("key " + key.str() + ": cannot store a value of type " + py_type(value) +
                  " (expected an array, a tensor, a dict, a TensorDict, a number or a JSON value)");
}

nb::object from_entry(const Entry& e, const PyTensorDict& owner, const Key& key) {
  if (e.is_tensor()) return to_numpy(e.tensor());
  if (e.is_non_tensor()) return from_json(e.non_tensor().value);
  if (e.is_non_tensor_stack()) return nb::cast(PyNonTensorStack{e.non_tensor_stack()});
  std::vector<std::string> path = owner.prefix;
  path.insert(path.end(), key.parts().begin(), key.parts().end());
  return nb::cast(PyTensorDict(owner.root, std::move(path)));
}

TensorDict tensordict_from(nb::handle source, const Shape& batch,
                           const std::optional<Device>& device, const char* what) {
  if (nb::isinstance<PyTensorDict>(source)) return nb::cast<PyTensorDict&>(source).td();
  if (nb::isinstance<nb::dict>(source))
    return dict_to_td(source, batch, device, Key(std::vector<std::string>{}));
  if (nb::object lib = tensordict_lib();
      lib.is_valid() && is_instance(source, lib, "TensorDictBase"))
    return from_tensordict_lib(source, lib);
  throw TypeError(std::string(what) + ": expected a dict or a TensorDict, got a " +
                  py_type(source));
}

bool is_tensordict_lib(nb::handle value) {
  nb::object lib = tensordict_lib();
  return lib.is_valid() && is_instance(value, lib, "TensorDictBase");
}

nb::object to_tensordict_lib(const TensorDict& td) {
  nb::object lib = nb::module_::import_("tensordict");
  const auto& names = td.names();
  const bool named = std::any_of(names.begin(), names.end(), [](auto& n) { return n.has_value(); });
  nb::tuple batch = nb::tuple(nb::cast(td.batch_size()));
  nb::object out = lib.attr("TensorDict")(
      nb::dict(), "batch_size"_a = batch,
      "device"_a = td.device() ? nb::object(nb::str(td.device()->str().c_str())) : nb::none(),
      "names"_a = named ? nb::cast(names) : nb::none());
  for (const auto& [name, e] : td.items()) {
    nb::str k = str_of(name);
    if (e.is_tensor())
      out[k] = to_torch(e.tensor());
    else if (e.is_tensordict())
      out[k] = to_tensordict_lib(e.tensordict());
    else if (e.is_non_tensor_stack())
      out[k] = stack_to_lib(e.non_tensor_stack().to_nested(),
                            e.non_tensor_stack().batch_size.size(), lib);
    else
      out[k] = lib.attr("NonTensorData")(from_json(e.non_tensor().value), "batch_size"_a = batch);
  }
  if (td.is_locked()) out.attr("lock_")();  // as from_tensordict keeps tensordict's lock
  return out;
}

nb::object to_torch_tree(const TensorDict& td) {
  nb::dict out;
  for (const auto& [name, e] : td.items()) {
    nb::str k = str_of(name);
    if (e.is_tensor())
      out[k] = to_torch(e.tensor());
    else if (e.is_tensordict())
      out[k] = to_torch_tree(e.tensordict());
    else if (e.is_non_tensor())
      out[k] = from_json(e.non_tensor().value);
    else
      out[k] = nb::cast(PyNonTensorStack{e.non_tensor_stack()});
  }
  return out;
}

TensorDict leaves_at(nb::handle mapping, const std::vector<Key>& keys) {
  TensorDict out;
  for (const Key& key : keys) {
    nb::object v = nb::borrow(mapping);
    try {
      for (const std::string& part : key.parts()) v = v[str_of(part)];
    } catch (nb::python_error& e) {
      if (!e.matches(PyExc_KeyError) && !e.matches(PyExc_TypeError) && !e.matches(PyExc_IndexError))
        throw;
      throw KeyError("request has no key " + key.str() + " (declared in the request spec)");
    }
    std::optional<Tensor> t = leaf_tensor(v, "request key " + key.str());
    if (!t)
      throw ValueError("request key " + key.str() + ": expected a tensor, got a " + py_type(v));
    out.set(key, std::move(*t));
  }
  return out;
}

TensorDict policy_output(nb::handle out, const std::optional<std::vector<Key>>& keys,
                         const Shape& batch) {
  if (nb::isinstance<PyTensorDict>(out)) return nb::cast<PyTensorDict&>(out).td();
  if (!is_tensordict_lib(out))
    throw TypeError("the policy returned a " + py_type(out) +
                    "; it must return a TensorDict (tensorwire or tensordict)");
  if (!keys) return tensordict_from(out, {}, {}, "the policy's output");
  Shape dims = first_dim(nb::cast<Shape>(nb::list(out.attr("batch_size"))));
  TensorDict response(dims.empty() ? first_dim(batch) : dims);
  for (const Key& k : *keys) {
    nb::object v = output_leaf(out, k);
    if (!v.is_none()) response.set(k, to_entry(v, response.batch_size(), {}, k));
  }
  return response;
}

TensorDict torchrl_result(nb::handle result, const std::vector<Key>& keys) {
  TensorDict response;
  for (const Key& k : keys) {
    nb::object v = output_leaf(result, k);
    if (v.is_none())
      throw KeyError("the policy output has no key " +
                     nb::cast<std::string>(nb::repr(from_key(k))) +
                     " (declared in the response spec)");
    if (str_of_obj(v.attr("device").attr("type")) != "cpu") v = v.attr("cpu")();
    response.set(k, to_entry(v, {}, {}, k));
  }
  return response;
}

}  // namespace tensorwire::py
