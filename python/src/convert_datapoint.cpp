// Dataflow datapoints, the round-trip rule (docs/design.md): Python datapoints <-> the wire
// layer's datapoint tree (tensorwire/wire/datapoint.h).
//
// Python objects go through wire::DatapointEncoder; received datapoints are read with the
// structure wire::DatapointDecoder made for their schema (cached per schema: the only
// validation is the decoder's). Exact types only, so that what comes back
// is what was yielded: subclasses (a namedtuple, an IntEnum, an ndarray subclass) are
// pickled, as tensorpack would, and numpy scalars stay numpy scalars.
#include "convert.h"
#include "tensorwire/core/consolidate.h"
#include "tensorwire/wire/datapoint.h"
#include "wire/datapoint_structure_cache.h"

namespace tensorwire::py {

namespace {

using wire::DatapointDecoder;
using wire::DatapointElement;
using wire::DatapointEncoder;
using wire::DatapointNode;
using wire::ElementKind;

// torch's tensor type is torch_tensor_type(): torch is never imported here, and its tensors
// can only be in a datapoint once the user imported it.
struct PyTypes {
  PyTypeObject *ndarray = nullptr, *generic = nullptr;
  nb::object asarray, dumps, loads;
};

PyTypes& types() {
  static PyTypes* t = [] {
    auto* p = new PyTypes();  // leaked on purpose: lives as long as the interpreter
    nb::module_ np = nb::module_::import_("numpy");
    p->ndarray = reinterpret_cast<PyTypeObject*>(nb::object(np.attr("ndarray")).release().ptr());
    p->generic = reinterpret_cast<PyTypeObject*>(nb::object(np.attr("generic")).release().ptr());
    p->asarray = np.attr("asarray");
    nb::module_ pickle = nb::module_::import_("pickle");
    p->dumps = pickle.attr("dumps");
    p->loads = pickle.attr("loads");
    return p;
  }();
  return *t;
}

std::optional<Tensor> as_tensor(nb::handle v) {
  try {
    return to_tensor(v);
  } catch (const TypeError&) {
    return std::nullopt;  // a dtype tensors cannot hold: pickled
  }
}

std::span<const std::byte> bytes_of(const nb::bytes& b) {
  return {reinterpret_cast<const std::byte*>(b.c_str()), b.size()};
}

// ---- Python -> datapoint ------------------------------------------------------------------
//
TensorDict encode_container(nb::handle obj, int depth);

bool dict_encodable(nb::handle d) {
  for (auto [k, v] : nb::borrow<nb::dict>(d)) {
    if (!PyUnicode_CheckExact(k.ptr())) return false;
    Py_ssize_t n = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(k.ptr(), &n);  // the str's own cached copy
    if (utf8 == nullptr) {                                    // a lone surrogate: pickled
      PyErr_Clear();
      return false;
    }
    const bool container =
        PyList_CheckExact(v.ptr()) || PyTuple_CheckExact(v.ptr()) || PyDict_CheckExact(v.ptr());
    if (!DatapointEncoder::valid_key(std::string_view(utf8, static_cast<size_t>(n)), container))
      return false;
  }
  return true;
}

void encode(DatapointEncoder& e, std::string key, nb::handle v, int depth) {
  PyTypes& t = types();
  PyObject* p = v.ptr();
  if (v.is_none()) return e.add_none(std::move(key));
  if (PyBool_Check(p)) return e.add_bool(std::move(key), p == Py_True);
  if (PyLong_CheckExact(p)) {
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(p, &overflow);
    if (!overflow) return e.add_int(std::move(key), x);
  } else if (PyFloat_CheckExact(p)) {
    return e.add_float(std::move(key), PyFloat_AS_DOUBLE(p));
  } else if (PyUnicode_CheckExact(p)) {
    Py_ssize_t n = 0;
    if (const char* s = PyUnicode_AsUTF8AndSize(p, &n))
      return e.add_str(std::move(key), std::string_view(s, static_cast<size_t>(n)));
    PyErr_Clear();  // lone surrogates: pickled
  } else if (PyBytes_CheckExact(p)) {
    return e.add_bytes(std::move(key), bytes_of(nb::borrow<nb::bytes>(v)));
  } else if (Py_TYPE(p) == t.ndarray) {
    if (auto x = as_tensor(v)) return e.add_array(std::move(key), std::move(*x), false);
  } else if (PyTypeObject* tensor = torch_tensor_type(); tensor && Py_TYPE(p) == tensor) {
    nb::object x = nb::borrow(v);
    if (nb::cast<std::string>(x.attr("device").attr("type")) == "cpu" &&
        !nb::cast<bool>(x.attr("is_sparse"))) {
      if (nb::cast<bool>(x.attr("requires_grad"))) x = x.attr("detach")();
      if (auto y = as_tensor(x)) return e.add_array(std::move(key), std::move(*y), true);
    }
  } else if (PyObject_TypeCheck(p, t.generic)) {
    if (auto x = as_tensor(t.asarray(v))) return e.add_scalar(std::move(key), x->clone());
  } else if (depth < wire::kMaxDatapointDepth && (PyList_CheckExact(p) || PyTuple_CheckExact(p) ||
                                                  (PyDict_CheckExact(p) && dict_encodable(v)))) {
    return e.add_node(std::move(key), encode_container(v, depth + 1));
  }
  // Anything else (and arrays of dtypes a tensor cannot hold): pickled, the slow path.
  e.add_pickle(std::move(key), bytes_of(nb::cast<nb::bytes>(t.dumps(v, -1))));
}

TensorDict encode_container(nb::handle obj, int depth) {
  PyObject* p = obj.ptr();
  if (PyList_CheckExact(p) || PyTuple_CheckExact(p)) {
    DatapointEncoder e(PyList_CheckExact(p) ? wire::Container::List : wire::Container::Tuple);
    for (nb::handle v : obj) encode(e, {}, v, depth);
    return std::move(e).finish();
  }
  if (PyDict_CheckExact(p) && dict_encodable(obj)) {
    DatapointEncoder e(wire::Container::Dict);
    for (auto [k, v] : nb::borrow<nb::dict>(obj)) encode(e, nb::cast<std::string>(k), v, depth);
    return std::move(e).finish();
  }
  DatapointEncoder e(wire::Container::Object);
  encode(e, {}, obj, depth);
  return std::move(e).finish();
}

}  // namespace

TensorDict datapoint_from_py(nb::handle obj) {
  if (nb::isinstance<PyTensorDict>(obj)) return nb::cast<PyTensorDict&>(obj).td();
  return encode_container(obj, 0);
}

namespace {

// ---- datapoint -> Python --------------------------------------------------------------------

nb::object node_to_py(const Storage& s, const DatapointNode& n);

nb::object element_to_py(const Storage& s, const DatapointElement& e) {
  auto view = [&] {
    return Tensor::view(s, e.offset, Shape(e.shape.begin(), e.shape.end()), e.dtype);
  };
  switch (e.kind) {
    case ElementKind::Array:
      return to_numpy(view());
    case ElementKind::Torch:
      return to_torch(view());
    case ElementKind::Scalar:
      return to_numpy(view())[nb::tuple()];
    case ElementKind::Bool:
      return nb::bool_(DatapointDecoder::read_bool(s, e));
    case ElementKind::Int:
      return nb::int_(DatapointDecoder::read_int(s, e));
    case ElementKind::Float:
      return nb::float_(DatapointDecoder::read_float(s, e));
    case ElementKind::Str: {
      std::string_view v = DatapointDecoder::read_str(s, e);
      return nb::str(v.data(), v.size());
    }
    case ElementKind::Bytes: {
      auto b = DatapointDecoder::read_bytes(s, e);
      return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
    }
    case ElementKind::None:
      return nb::none();
    case ElementKind::Node:
      return node_to_py(s, *e.child);
    case ElementKind::Pickle: {
      auto b = DatapointDecoder::read_bytes(s, e);
      nb::object mv = nb::steal(
          PyMemoryView_FromMemory(const_cast<char*>(reinterpret_cast<const char*>(b.data())),
                                  static_cast<Py_ssize_t>(b.size()), PyBUF_READ));
      return types().loads(mv);
    }
  }
  throw ProtocolError("datapoint: unknown element kind");  // the decoder let none through
}

nb::object node_to_py(const Storage& s, const DatapointNode& n) {
  const auto size = static_cast<Py_ssize_t>(n.elements.size());
  switch (n.container) {
    case wire::Container::List: {
      nb::object out = nb::steal(PyList_New(size));
      for (Py_ssize_t i = 0; i < size; ++i)
        PyList_SET_ITEM(out.ptr(), i, element_to_py(s, n.elements[i]).release().ptr());
      return out;
    }
    case wire::Container::Tuple: {
      nb::object out = nb::steal(PyTuple_New(size));
      for (Py_ssize_t i = 0; i < size; ++i)
        PyTuple_SET_ITEM(out.ptr(), i, element_to_py(s, n.elements[i]).release().ptr());
      return out;
    }
    case wire::Container::Dict: {
      nb::dict out;
      for (const auto& e : n.elements)
        out[nb::str(e.key.c_str(), e.key.size())] = element_to_py(s, e);
      return std::move(out);
    }
    case wire::Container::Object:
      break;
  }
  return element_to_py(s, n.elements.at(0));
}

wire::DatapointStructureCache& structures() {                // used under the GIL
  static auto* cache = new wire::DatapointStructureCache();  // leaked: outlives every runner
  return *cache;
}

}  // namespace

nb::object raw_to_py(const dataflow::RawDatapoint& raw, bool allow_pickle) {
  // Held while it is walked: the walk runs Python code, which may let another thread decode
  // other schemas and empty the cache.
  const std::shared_ptr<const DatapointNode> n = structures().get(
      raw.layout->metadata_ptr(), raw.layout->total_bytes(), raw.layout.get(), allow_pickle);
  if (!n) return nb::cast(PyTensorDict(raw.to_tensordict()));
  return node_to_py(raw.storage, *n);
}

nb::object datapoint_to_py(const TensorDict& td, bool allow_pickle) {
  if (!td.contains(std::string(wire::kDatapointTag))) return nb::cast(PyTensorDict(td));
  const TensorDict c = is_consolidated_root(td) ? td : consolidate(td);
  const Consolidated& k = *c.consolidated();
  const std::shared_ptr<const DatapointNode> n =
      structures().get(k.metadata, k.storage.nbytes(), nullptr, allow_pickle);
  return node_to_py(k.storage, *n);
}

}  // namespace tensorwire::py
