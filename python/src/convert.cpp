#include "convert.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

namespace tensorwire::py {

namespace {

namespace dl = nb::dlpack;

// DType <-> DLPack (type code, bits). Codes 10 and 12 are DLPack 1.1's float8_e4m3fn and
// float8_e5m2 (torch exports float8 with them; nanobind's enum predates them).
struct Code {
  DType dtype;
  uint8_t code;
  uint8_t bits;
};

constexpr uint8_t code_of(dl::dtype_code c) {
  return static_cast<uint8_t>(c);
}

constexpr Code kCodes[] = {
    {DType::Bool, code_of(dl::dtype_code::Bool), 8},
    {DType::UInt8, code_of(dl::dtype_code::UInt), 8},
    {DType::UInt16, code_of(dl::dtype_code::UInt), 16},
    {DType::UInt32, code_of(dl::dtype_code::UInt), 32},
    {DType::UInt64, code_of(dl::dtype_code::UInt), 64},
    {DType::Int8, code_of(dl::dtype_code::Int), 8},
    {DType::Int16, code_of(dl::dtype_code::Int), 16},
    {DType::Int32, code_of(dl::dtype_code::Int), 32},
    {DType::Int64, code_of(dl::dtype_code::Int), 64},
    {DType::Float16, code_of(dl::dtype_code::Float), 16},
    {DType::BFloat16, code_of(dl::dtype_code::Bfloat), 16},
    {DType::Float32, code_of(dl::dtype_code::Float), 32},
    {DType::Float64, code_of(dl::dtype_code::Float), 64},
    {DType::Complex64, code_of(dl::dtype_code::Complex), 64},
    {DType::Complex128, code_of(dl::dtype_code::Complex), 128},
    {DType::Float8E4M3FN, 10, 8},
    {DType::Float8E5M2, 12, 8},
};

std::optional<DType> from_dl(dl::dtype d) {
  if (d.lanes != 1) return std::nullopt;
  for (const auto& c : kCodes)
    if (c.code == d.code && c.bits == d.bits) return c.dtype;
  return std::nullopt;
}

dl::dtype to_dl(DType t) {
  // float8 goes out as raw bytes and is re-viewed by the caller: numpy has no float8, and
  // not every DLPack importer knows its codes.
  if (t == DType::Float8E4M3FN || t == DType::Float8E5M2)
    return {code_of(dl::dtype_code::UInt), 8, 1};
  for (const auto& c : kCodes)
    if (c.dtype == t) return {c.code, c.bits, 1};
  return {code_of(dl::dtype_code::UInt), 8, 1};
}

// The owner of an exported array: a heap copy of the Tensor keeps its storage alive.
nb::capsule owner_of(const Tensor& t) {
  return nb::capsule(new Tensor(t), [](void* p) noexcept { delete static_cast<Tensor*>(p); });
}

template <class Framework>
nb::object export_as(const Tensor& t) {
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  using Array = nb::ndarray<Framework, nb::device::cpu>;
  Array a(t.data(), shape.size(), shape.data(), owner_of(t), t.strides().data(), to_dl(t.dtype()),
          nb::device::cpu::value, 0);
  return a.cast(nb::rv_policy::reference);
}

nb::object torch_dtype(DType t) {
  nb::module_ torch = nb::module_::import_("torch");
  std::string name(dtype_name(t));
  return torch.attr(name.substr(6).c_str());
}

// Wraps an imported array as a Tensor. The storage spans exactly the bytes the view can
// reach and owns a reference to the array, released (under the GIL) when the last tensor
// viewing it goes away, whichever thread that happens on.
Tensor to_tensor_view(const nb::ndarray<nb::device::cpu>& a) {
  auto dtype = from_dl(a.dtype());
  if (!dtype)
    throw TypeError("unsupported array dtype (DLPack code " + std::to_string(a.dtype().code) +
                    ", " + std::to_string(a.dtype().bits) + " bits)");
  const size_t nd = a.ndim();
  Shape shape(nd), strides(nd);
  int64_t lo = 0, hi = 0;
  bool empty = false;
  for (size_t i = 0; i < nd; ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
    if (shape[i] == 0) empty = true;
  }
  if (!empty)
    for (size_t i = 0; i < nd; ++i) {
      int64_t span = (shape[i] - 1) * strides[i];
      (span < 0 ? lo : hi) += span;
    }
  const int64_t item = static_cast<int64_t>(itemsize(*dtype));
  auto* base = static_cast<std::byte*>(const_cast<void*>(a.data())) + lo * item;
  size_t nbytes = empty ? 0 : static_cast<size_t>((hi - lo + 1) * item);
  auto* keep = new nb::ndarray<nb::device::cpu>(a);
  Storage storage = Storage::external(base, nbytes, [keep] {
    if (!Py_IsInitialized()) return;  // interpreter gone: nothing left to release into
    nb::gil_scoped_acquire gil;
    delete keep;
  });
  return Tensor::view(std::move(storage), static_cast<size_t>(-lo * item), std::move(shape), *dtype,
                      std::move(strides));
}

}  // namespace

Key to_key(nb::handle key) {
  if (nb::isinstance<nb::str>(key)) return Key(nb::cast<std::string>(key));
  if (nb::isinstance<nb::tuple>(key)) {
    std::vector<std::string> parts;
    for (nb::handle h : key) {
      if (!nb::isinstance<nb::str>(h))
        throw TypeError("keys must be str or tuples of str, got a tuple holding " +
                        nb::cast<std::string>(nb::str(h.type())));
      parts.push_back(nb::cast<std::string>(h));
    }
    if (parts.empty()) throw KeyError("empty key tuple");
    return Key(std::move(parts));
  }
  throw TypeError("keys must be str or tuples of str, got " +
                  nb::cast<std::string>(nb::str(key.type())));
}

nb::object from_key(const Key& key) {
  if (key.size() == 1) return str_of(key.back());
  nb::list parts;
  for (const auto& p : key.parts()) parts.append(str_of(p));
  return nb::tuple(parts);
}

Json to_json(nb::handle v, const std::string& where) {
  if (v.is_none()) return nullptr;
  if (nb::isinstance<nb::bool_>(v)) return nb::cast<bool>(v);
  if (nb::isinstance<nb::int_>(v)) {
    try {
      return nb::cast<int64_t>(v);
    } catch (const nb::cast_error&) {
      throw ValueError(where + ": integer out of the 64-bit range");
    }
  }
  if (nb::isinstance<nb::float_>(v)) return nb::cast<double>(v);
  if (nb::isinstance<nb::str>(v)) return nb::cast<std::string>(v);
  if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) {
    Json a = Json::array();
    for (nb::handle x : v) a.push_back(to_json(x, where));
    return a;
  }
  if (nb::isinstance<nb::dict>(v)) {
    Json o = Json::object();
    for (auto [k, x] : nb::borrow<nb::dict>(v)) {
      if (!nb::isinstance<nb::str>(k))
        throw ValueError(where + ": dict keys of a non-tensor value must be str");
      o[nb::cast<std::string>(k)] = to_json(x, where);
    }
    return o;
  }
  throw ValueError(where + ": a " + nb::cast<std::string>(nb::str(v.type().attr("__name__"))) +
                   " is not JSON-representable (use str, int, float, bool, None, or lists / "
                   "dicts of them)");
}

nb::object from_json(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return nb::none();
    case Json::value_t::boolean:
      return nb::bool_(v.get<bool>());
    case Json::value_t::number_integer:
      return nb::int_(v.get<int64_t>());
    case Json::value_t::number_unsigned:
      return nb::int_(v.get<uint64_t>());
    case Json::value_t::number_float:
      return nb::float_(v.get<double>());
    case Json::value_t::string:
      return str_of(v.get_ref<const std::string&>());
    case Json::value_t::array: {
      nb::list l;
      for (const auto& x : v) l.append(from_json(x));
      return l;
    }
    case Json::value_t::object: {
      nb::dict d;
      for (auto it = v.begin(); it != v.end(); ++it) d[str_of(it.key())] = from_json(it.value());
      return d;
    }
    default:
      return nb::none();
  }
}

std::optional<Tensor> to_tensor(nb::handle value) {
  using Array = nb::ndarray<nb::device::cpu>;
  Array a;
  if (!nb::try_cast(value, a, /*convert=*/false)) {
    // Read-only arrays (np.frombuffer on bytes, ...) are copied: tensorwire writes into
    // tensors in place (update_, receives) and must not write read-only memory.
    nb::ndarray<nb::ro, nb::device::cpu> ro;
    if (!nb::try_cast(value, ro, false)) return std::nullopt;
    return to_tensor_view(Array(ro)).clone();
  }
  return to_tensor_view(a);
}

nb::object to_numpy(const Tensor& t) {
  switch (t.dtype()) {
    case DType::BFloat16:
    case DType::Float8E4M3FN:
    case DType::Float8E5M2:
      return to_torch(t);  // numpy has no such dtype
    default:
      return export_as<nb::numpy>(t);
  }
}

nb::object to_torch(const Tensor& t) {
  nb::object out = export_as<nb::pytorch>(t);
  if (t.dtype() == DType::Float8E4M3FN || t.dtype() == DType::Float8E5M2)
    out = out.attr("view")(torch_dtype(t.dtype()));
  return out;
}

}  // namespace tensorwire::py
