#include "convert.h"
#include "gil.h"

#include <nanobind/ndarray.h>

#include "core/dlpack_dtype.h"
#include "tensorwire/runtime/liveness.h"

namespace tensorwire::py {

namespace {

namespace dl = nb::dlpack;

bool is_float8(DType t) {
  return t == DType::Float8E4M3FN || t == DType::Float8E5M2;
}

// The owner of an exported array: a heap copy of the Tensor keeps its storage alive.
nb::capsule owner_of(const Tensor& t) {
  return nb::capsule(new Tensor(t), [](void* p) noexcept { delete static_cast<Tensor*>(p); });
}

template <class Framework>
nb::object export_as(const Tensor& t) {
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  using Array = nb::ndarray<Framework, nb::device::cpu>;
  // float8 goes out as raw bytes and is re-viewed by the caller: numpy has no float8, and
  // not every DLPack importer knows its codes.
  const auto code = detail::dlpack_type(is_float8(t.dtype()) ? DType::UInt8 : t.dtype());
  Array a(t.data(), shape.size(), shape.data(), owner_of(t), t.strides().data(),
          dl::dtype{code.code, code.bits, 1}, nb::device::cpu::value, 0);
  return a.cast(nb::rv_policy::reference);
}

nb::object torch_dtype(DType t) {
  nb::module_ torch = nb::module_::import_("torch");
  std::string name(dtype_name(t));
  return torch.attr(name.substr(6).c_str());
}

// Wraps an imported array as a Tensor over the same bytes; the storage owns a reference to
// the array, released (under the GIL) when the last tensor viewing it goes away, whichever
// thread that happens on.
Tensor to_tensor_view(const nb::ndarray<nb::device::cpu>& a) {
  const auto dtype = detail::dtype_from_dlpack(a.dtype().code, a.dtype().bits, a.dtype().lanes);
  if (!dtype)
    throw TypeError("unsupported array dtype (DLPack code " + std::to_string(a.dtype().code) +
                    ", " + std::to_string(a.dtype().bits) + " bits)");
  Shape shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  auto* keep = new nb::ndarray<nb::device::cpu>(a);
  return detail::external_view(const_cast<void*>(a.data()), std::move(shape), std::move(strides),
                               *dtype, [keep] { release_unless_exiting([keep] { delete keep; }); });
}

// The dtype of an array-like, described for the message on an unsupported one.
TypeError unsupported_dtype(nb::handle value, const std::string& where) {
  nb::object dt = value.attr("dtype");
  auto letter = [&](const char* attr) {
    std::string s = nb::hasattr(dt, attr) ? str_of_obj(dt.attr(attr)) : "";
    return s.empty() ? '\0' : s[0];
  };
  return detail::unsupported_dtype(where, str_of_obj(dt), letter("kind"), letter("byteorder"));
}

// Why an array of a supported dtype could not be viewed: numpy strides (in bytes) that are
// not multiples of the item size, which no element-strided view (DLPack's, a Tensor's) can
// express. Empty when that is not the reason.
std::string unviewable_strides(nb::handle value) {
  if (!nb::hasattr(value, "strides") || !nb::hasattr(value, "itemsize")) return {};
  nb::object strides = value.attr("strides");
  const int64_t itemsize = nb::cast<int64_t>(value.attr("itemsize"));
  if (!nb::isinstance<nb::tuple>(strides) || itemsize <= 0) return {};
  for (nb::handle s : strides)
    if (nb::cast<int64_t>(s) % itemsize != 0)
      return ": an array whose strides " + nb::cast<std::string>(nb::repr(strides)) +
             " are not multiples of its item size (" + std::to_string(itemsize) +
             " bytes) cannot be viewed; pass a copy (numpy.ascontiguousarray)";
  return {};
}

}  // namespace

std::string py_type(nb::handle value) {
  return str_of_obj(value.type().attr("__name__"));
}

std::string str_of_obj(nb::handle value) {
  return nb::cast<std::string>(nb::str(value));
}

std::string utf8_of(nb::handle str, const std::string& what) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(str.ptr(), &n);
  if (p == nullptr) {
    PyErr_Clear();
    throw ValueError(what + " is not valid UTF-8 text: " + nb::cast<std::string>(nb::repr(str)) +
                     " holds a lone surrogate (what os.fsdecode makes of bytes that are not "
                     "UTF-8)");
  }
  return std::string(p, static_cast<size_t>(n));
}

int64_t int_arg(nb::handle value, const char* name) {
  if (!nb::isinstance<nb::int_>(value) || nb::isinstance<nb::bool_>(value))
    throw TypeError(std::string(name) + " must be an integer, got " + py_type(value));
  int64_t v = 0;
  if (!nb::try_cast<int64_t>(value, v))
    throw ValueError(std::string(name) + " does not fit in 64 bits, got " +
                     nb::cast<std::string>(nb::str(value)));
  return v;
}

std::optional<double> number_arg(nb::handle value, const char* name, bool none_ok,
                                 const char* what) {
  if (value.is_none() && none_ok) return std::nullopt;
  // A float or an int, or what converts itself to a float (numpy's scalars); not a bool, and
  // not a str (float("1.5") is a parse, not a number).
  const bool number = (PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr()) ||
                       (PyNumber_Check(value.ptr()) && nb::hasattr(value, "__float__"))) &&
                      !PyBool_Check(value.ptr()) && !PyUnicode_Check(value.ptr());
  if (!number)
    throw TypeError(std::string(name) + (none_ok ? " must be None or " : " must be ") + what +
                    ", got " + py_type(value));
  const double s = PyFloat_AsDouble(value.ptr());
  if (s == -1.0 && PyErr_Occurred()) {  // an int too big for a double
    PyErr_Clear();
    throw ValueError(std::string(name) + " must be " + what +
                     " within a float's range, got an int beyond it");
  }
  return s;
}

std::optional<double> seconds_arg(nb::handle value, const char* name, bool none_ok) {
  return number_arg(value, name, none_ok, "a number of seconds");
}

Timeout timeout_arg(nb::handle value, const char* name, bool none_ok) {
  return Timeout::seconds(seconds_arg(value, name, none_ok), name);
}

std::chrono::milliseconds liveness_arg(nb::handle value) {
  return liveness_timeout_seconds(seconds_arg(value, "liveness_timeout"), "liveness_timeout");
}

std::string auth_key_arg(nb::handle value) {
  std::string key;
  if (nb::isinstance<nb::bytes>(value)) {
    nb::bytes b = nb::borrow<nb::bytes>(value);
    key.assign(b.c_str(), b.size());
  } else if (nb::isinstance<nb::str>(value)) {
    key = utf8_of(value, "auth_key");
  } else if (!value.is_none()) {
    throw TypeError("auth_key must be str, bytes or None, got " + py_type(value));
  }
  if (!value.is_none() && key.empty())
    throw ValueError("auth_key must not be empty (pass None for no authentication)");
  return key;
}

std::optional<uint64_t> count_arg(nb::handle value, const char* name) {
  if (value.is_none()) return std::nullopt;
  if (!nb::isinstance<nb::int_>(value) || nb::isinstance<nb::bool_>(value))
    throw TypeError(std::string(name) + " must be None or an integer, got " + py_type(value));
  uint64_t v = 0;
  if (PyObject_RichCompareBool(value.ptr(), nb::int_(0).ptr(), Py_LT) == 1 ||
      !nb::try_cast<uint64_t>(value, v))
    throw ValueError(std::string(name) + " must be None or an integer in [0, 2**64), got " +
                     nb::cast<std::string>(nb::str(value)));
  return v;
}

nb::object dataflow_arg(nb::object ds) {
  // Both, checked here: a list (iterable, no reset_state()) would fail only in the worker.
  if (!nb::hasattr(ds, "__iter__") || !nb::hasattr(ds, "reset_state"))
    throw TypeError("ds must be a DataFlow (iterable, with reset_state()), got " + py_type(ds) +
                    (nb::hasattr(ds, "__iter__") ? " (it has no reset_state(): wrap it, e.g. "
                                                   "in tensorpack's DataFromList)"
                                                 : ""));
  return ds;
}

bool bool_arg(nb::handle value, const char* name) {
  if (!nb::isinstance<nb::bool_>(value))
    throw TypeError(std::string(name) + " must be a bool, got " + py_type(value));
  return nb::cast<bool>(value);
}

std::optional<std::string> str_arg(nb::handle value, const char* name, bool none_ok) {
  if (none_ok && value.is_none()) return std::nullopt;
  if (!nb::isinstance<nb::str>(value))
    throw TypeError(std::string(name) + " must be a str" + (none_ok ? " or None" : "") + ", got " +
                    py_type(value));
  return utf8_of(value, name);
}

std::vector<int64_t> int_list_arg(nb::handle value, const char* name) {
  if (!nb::hasattr(value, "__iter__") || nb::isinstance<nb::str>(value))
    throw TypeError(std::string(name) + " must be an iterable of integers, got " + py_type(value));
  std::vector<int64_t> out;
  const std::string entry = std::string(name) + " entry";
  for (nb::handle v : value) out.push_back(int_arg(v, entry.c_str()));
  return out;
}

Key to_key(nb::handle key) {
  if (nb::isinstance<nb::str>(key)) return Key(utf8_of(key, "key"));
  if (nb::isinstance<nb::tuple>(key)) {
    std::vector<std::string> parts;
    for (nb::handle h : key) {
      if (!nb::isinstance<nb::str>(h))
        throw TypeError("keys must be str or tuples of str, got a tuple holding " +
                        nb::cast<std::string>(nb::str(h.type())));
      parts.push_back(utf8_of(h, "key"));
    }
    if (parts.empty()) throw KeyError("empty key tuple");
    return Key(std::move(parts));
  }
  throw TypeError("keys must be str or tuples of str, got " +
                  nb::cast<std::string>(nb::str(key.type())));
}

nb::list key_list(const std::vector<Key>& keys) {
  nb::list out;
  for (const Key& k : keys) out.append(from_key(k));
  return out;
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
  if (nb::isinstance<nb::str>(v)) return utf8_of(v, where);
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
      o[utf8_of(k, where + ": a dict key")] = to_json(x, where);
    }
    return o;
  }
  throw ValueError(where + ": a " + py_type(v) +
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

nb::object imported_module(const char* name) {
  PyObject* m = PyDict_GetItemString(PyImport_GetModuleDict(), name);  // borrowed
  return m ? nb::borrow(m) : nb::object();
}

PyTypeObject* torch_tensor_type() {
  static PyTypeObject* type = nullptr;  // leaked on purpose: lives as long as the interpreter
  if (!type)
    if (nb::object torch = imported_module("torch"); torch.is_valid())
      type = reinterpret_cast<PyTypeObject*>(nb::object(torch.attr("Tensor")).release().ptr());
  return type;
}

namespace {

// A torch tensor whose conjugate or negative bit is set (x.conj(), x.conj().imag) views
// the values before that operation: resolved (a copy), as torch does when it reads one.
// A null object for anything else.
nb::object resolved_torch_bits(nb::handle value) {
  PyTypeObject* tensor = torch_tensor_type();
  if (!tensor || !PyObject_TypeCheck(value.ptr(), tensor)) return {};
  if (!nb::cast<bool>(value.attr("is_conj")()) && !nb::cast<bool>(value.attr("is_neg")()))
    return {};
  return value.attr("resolve_conj")().attr("resolve_neg")();
}

}  // namespace

std::optional<Tensor> to_tensor(nb::handle value) {
  using Array = nb::ndarray<nb::device::cpu>;
  nb::object resolved = resolved_torch_bits(value);
  if (resolved.is_valid()) value = resolved;
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

std::optional<Tensor> leaf_tensor(nb::handle value, const std::string& where) {
  if (nb::hasattr(value, "device") && nb::hasattr(value, "dtype") &&
      nb::hasattr(value, "is_cuda")) {
    // A torch tensor's device; a tensordict.TensorDict has these attributes too, with a
    // device that may be None.
    nb::object device = value.attr("device");
    std::string dev = device.is_none() ? "cpu" : str_of_obj(device.attr("type"));
    if (dev != "cpu")
      throw ValueError(where + ": tensor on device '" + dev +
                       "'; tensorwire only accepts CPU tensors (call .cpu() first)");
  }
  try {
    if (std::optional<Tensor> t = to_tensor(value)) return t;
  } catch (const TypeError&) {  // an array-like of a dtype with no DType: said below
  }
  if (is_tensordict_lib(value)) return std::nullopt;  // a sub-dict, not a leaf
  if (nb::hasattr(value, "dtype") && nb::hasattr(value, "shape")) {
    if (std::string why = unviewable_strides(value); !why.empty()) throw ValueError(where + why);
    throw unsupported_dtype(value, where);
  }
  return std::nullopt;
}

namespace {

// numpy's own int64 / uint64 dtype. nanobind exports 64-bit ints with the buffer format
// 'q' / 'Q', which numpy reads as longlong; arrays numpy makes (and tensorpack's pickles
// bring back) are long ('l' on Linux): np.int64 is that type, and isinstance(x[0],
// np.int64) holds only for it. Kept for the interpreter's life (leaked on purpose).
nb::handle numpy_dtype(DType t) {
  static PyObject* i64 = nullptr;
  static PyObject* u64 = nullptr;
  PyObject*& d = t == DType::Int64 ? i64 : u64;
  if (!d)
    d = nb::module_::import_("numpy")
            .attr("dtype")(t == DType::Int64 ? "int64" : "uint64")
            .release()
            .ptr();
  return d;
}

}  // namespace

nb::object to_numpy(const Tensor& t) {
  switch (t.dtype()) {
    case DType::BFloat16:
    case DType::Float8E4M3FN:
    case DType::Float8E5M2:
      return to_torch(t);  // numpy has no such dtype
    case DType::Int64:
    case DType::UInt64:
      return export_as<nb::numpy>(t).attr("view")(numpy_dtype(t.dtype()));
    default:
      return export_as<nb::numpy>(t);
  }
}

nb::object to_torch(const Tensor& t) {
  nb::object out = export_as<nb::pytorch>(t);
  if (is_float8(t.dtype())) out = out.attr("view")(torch_dtype(t.dtype()));
  return out;
}

}  // namespace tensorwire::py
