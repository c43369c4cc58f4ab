// Bindings of the dataflow runners (tensorwire/dataflow/*.h) for Python dataflows.
//
// What is here is conversion and the GIL, nothing a C++ user lacks:
//  - a Python datapoint (a list, tuple or dict of numpy arrays, torch tensors, numbers,
//    strings, nested containers; anything else pickled) <-> a TensorDict whose node tags
//    record the Python structure (docs/dataflow.md, "Python datapoints");
//  - PyDataFlow: the C++ DataFlow interface over a Python dataflow object;
//  - fork hooks (PyOS_BeforeFork / AfterFork) and the worker's Python exception report.
//
// The GIL: waits and shared-memory copies run without it. A worker process releases it
// right after the fork and takes it only to run Python code (the dataflow, the map
// function, conversions), so its C++ side packs and sends with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstring>
#include <unordered_map>

#include "bindings.h"
#include "convert.h"
#include "tensordict_py.h"
#include "tensorwire/dataflow/map.h"
#include "tensorwire/dataflow/remote.h"
#include "tensorwire/dataflow/runner.h"

namespace tensorwire::py {

namespace {

namespace df = tensorwire::dataflow;
using Millis = std::chrono::milliseconds;

// How long a wait runs without the GIL before Python signals (Ctrl-C) are checked.
constexpr Millis kSignalCheck{100};

// ---- Python datapoints <-> TensorDicts ------------------------------------------------------
//
// Each container becomes a TensorDict node whose entry kTag is a string: the container
// kind ('l' list, 't' tuple, 'd' dict, 'o' a bare object), then one character per element
// in order (below). List and tuple elements are keyed "0", "1", ...
constexpr const char* kTag = "_tensorwire_py";

enum : char {
  kNumpy = 'n',    // numpy array (a leaf of its dtype and shape)
  kTorch = 'T',    // torch tensor
  kBool = 'b',     // bool (0-dim bool)
  kInt = 'i',      // int (0-dim int64)
  kFloat = 'f',    // float (0-dim float64)
  kGeneric = 'g',  // numpy scalar (0-dim of its dtype)
  kStr = 's',      // str (uint8, UTF-8)
  kBytes = 'y',    // bytes (uint8)
  kNone = 'N',     // None (a non-tensor null)
  kNode = 'c',     // a nested container (a sub-TensorDict with its own tag)
  kPickle = 'p',   // anything else, pickled (uint8)
};

struct PyModules {
  PyTypeObject* np_ndarray = nullptr;
  PyTypeObject* np_generic = nullptr;
  PyTypeObject* torch_tensor = nullptr;
  nb::object np_asarray, pickle_dumps, pickle_loads;
  // torch is never imported here: its tensors can only be in a datapoint once the user
  // imported it, and a dict lookup in sys.modules tells.
  void refresh_torch() {
    if (torch_tensor) return;
    PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
    if (!torch) return;
    nb::object t = nb::borrow(torch).attr("Tensor");
    torch_tensor = reinterpret_cast<PyTypeObject*>(t.release().ptr());
  }
};

PyModules& mods() {
  static PyModules* m = [] {
    auto* p = new PyModules();  // leaked on purpose: lives as long as the interpreter
    nb::module_ np = nb::module_::import_("numpy");
    p->np_ndarray = reinterpret_cast<PyTypeObject*>(nb::object(np.attr("ndarray")).release().ptr());
    p->np_generic = reinterpret_cast<PyTypeObject*>(nb::object(np.attr("generic")).release().ptr());
    p->np_asarray = np.attr("asarray");
    nb::module_ pickle = nb::module_::import_("pickle");
    p->pickle_dumps = pickle.attr("dumps");
    p->pickle_loads = pickle.attr("loads");
    return p;
  }();
  m->refresh_torch();
  return *m;
}

Tensor bytes_tensor(const char* data, size_t n) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)}, DType::UInt8);
  if (n) std::memcpy(t.data(), data, n);
  return t;
}

template <class T>
Tensor scalar_tensor(T v) {
  Tensor t = Tensor::empty({}, dtype_of<T>::value);
  *t.data<T>() = v;
  return t;
}

bool is_container(nb::handle v) {
  return nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v) || nb::isinstance<nb::dict>(v);
}

// A dict whose keys can be TensorDict keys of a node.
bool dict_representable(nb::handle d) {
  for (auto [k, v] : nb::borrow<nb::dict>(d)) {
    if (!nb::isinstance<nb::str>(k)) return false;
    std::string key = nb::cast<std::string>(k);
    if (key.empty() || key == kTag) return false;
    // Sub-dicts may not use the consolidated metadata's own field names.
    if (is_container(v))
      for (const char* reserved : {"cls", "leaves", "non_tensors", "cls_metadata", "size"})
        if (key == reserved) return false;
  }
  return true;
}

TensorDict node_from_py(nb::handle obj, int depth);

// Converts one element; returns its kind and puts it under `key` in `td`.
char element_from_py(TensorDict& td, const std::string& key, nb::handle v, int depth,
                     PyModules& m) {
  if (v.is_none()) {
    td.set(key, NonTensor{nullptr});
    return kNone;
  }
  if (nb::isinstance<nb::bool_>(v)) {
    td.set(key, scalar_tensor<bool>(v.ptr() == Py_True));
    return kBool;
  }
  if (PyLong_CheckExact(v.ptr())) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (!overflow) {
      td.set(key, scalar_tensor<int64_t>(x));
      return kInt;
    }
  } else if (PyFloat_CheckExact(v.ptr())) {
    td.set(key, scalar_tensor<double>(PyFloat_AS_DOUBLE(v.ptr())));
    return kFloat;
  } else if (PyUnicode_CheckExact(v.ptr())) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(v.ptr(), &n);
    if (!s) throw nb::python_error();
    td.set(key, bytes_tensor(s, static_cast<size_t>(n)));
    return kStr;
  } else if (PyBytes_CheckExact(v.ptr())) {
    td.set(key, bytes_tensor(PyBytes_AS_STRING(v.ptr()),
                             static_cast<size_t>(PyBytes_GET_SIZE(v.ptr()))));
    return kBytes;
  } else if (PyObject_TypeCheck(v.ptr(), m.np_ndarray)) {
    if (auto t = to_tensor(v)) {
      td.set(key, std::move(*t));
      return kNumpy;
    }
  } else if (m.torch_tensor && PyObject_TypeCheck(v.ptr(), m.torch_tensor)) {
    nb::object t = nb::borrow(v);
    if (nb::cast<std::string>(t.attr("device").attr("type")) == "cpu" &&
        !nb::cast<bool>(t.attr("is_sparse"))) {
      if (nb::cast<bool>(t.attr("requires_grad"))) t = t.attr("detach")();
      if (auto x = to_tensor(t)) {
        td.set(key, std::move(*x));
        return kTorch;
      }
    }
  } else if (PyObject_TypeCheck(v.ptr(), m.np_generic)) {
    nb::object arr = m.np_asarray(v);
    if (auto t = to_tensor(arr)) {
      td.set(key, t->clone());
      return kGeneric;
    }
  } else if (depth < 32 && is_container(v) &&
             (!nb::isinstance<nb::dict>(v) || dict_representable(v))) {
    td.set(key, node_from_py(v, depth + 1));
    return kNode;
  }
  // The slow path: anything else (and arrays of dtypes a tensor cannot hold), pickled.
  nb::bytes b = nb::cast<nb::bytes>(m.pickle_dumps(v, -1));
  td.set(key, bytes_tensor(b.c_str(), b.size()));
  return kPickle;
}

TensorDict node_from_py(nb::handle obj, int depth) {
  PyModules& m = mods();
  TensorDict td;
  std::string kinds;
  if (nb::isinstance<nb::list>(obj) || nb::isinstance<nb::tuple>(obj)) {
    kinds = nb::isinstance<nb::list>(obj) ? "l" : "t";
    size_t i = 0;
    for (nb::handle v : obj) kinds += element_from_py(td, std::to_string(i++), v, depth, m);
  } else if (nb::isinstance<nb::dict>(obj) && dict_representable(obj)) {
    kinds = "d";
    Json keys = Json::array();
    for (auto [k, v] : nb::borrow<nb::dict>(obj)) {
      std::string key = nb::cast<std::string>(k);
      kinds += element_from_py(td, key, v, depth, m);
      keys.push_back(std::move(key));
    }
    // The consolidated layout groups leaves, values and sub-dicts: the keys keep the order.
    td.set(kTag, NonTensor{Json::array({std::move(kinds), std::move(keys)})});
    return td;
  } else {
    kinds = "o";
    kinds += element_from_py(td, "0", obj, depth, m);
  }
  td.set(kTag, NonTensor{std::move(kinds)});
  return td;
}

// A Python datapoint as a TensorDict; a tensorwire.TensorDict goes as it is.
TensorDict datapoint_from_py(nb::handle obj) {
  if (nb::isinstance<PyTensorDict>(obj)) return nb::cast<PyTensorDict&>(obj).td();
  return node_from_py(obj, 0);
}

[[noreturn]] void bad_tag(const std::string& why) {
  throw ProtocolError("datapoint with an invalid Python structure tag: " + why);
}

const Tensor& leaf(const Entry& e, const std::string& key) {
  if (!e.is_tensor()) bad_tag("entry '" + key + "' should be a tensor");
  return e.tensor();
}

const Tensor& byte_leaf(const Entry& e, const std::string& key) {
  const Tensor& t = leaf(e, key);
  if (t.dtype() != DType::UInt8 || t.dim() != 1)
    bad_tag("entry '" + key + "' should be a uint8 vector");
  return t;
}

template <class T>
T scalar_of(const Entry& e, const std::string& key) {
  const Tensor& t = leaf(e, key);
  if (t.dtype() != dtype_of<T>::value || t.dim() != 0)
    bad_tag("entry '" + key + "' has the wrong dtype or shape");
  return *t.data<T>();
}

nb::object node_to_py(const TensorDict& td, bool allow_pickle, int depth);

nb::object element_to_py(char kind, const std::string& key, const Entry& e, bool allow_pickle,
                         int depth) {
  switch (kind) {
    case kNumpy:
      return to_numpy(leaf(e, key));
    case kTorch:
      return to_torch(leaf(e, key));
    case kBool:
      return nb::bool_(scalar_of<bool>(e, key));
    case kInt:
      return nb::int_(scalar_of<int64_t>(e, key));
    case kFloat:
      return nb::float_(scalar_of<double>(e, key));
    case kGeneric: {
      const Tensor& t = leaf(e, key);
      if (t.dim() != 0) bad_tag("entry '" + key + "' should be a scalar");
      return to_numpy(t.clone())[nb::tuple()];
    }
    case kStr: {
      const Tensor& t = byte_leaf(e, key);
      nb::object s =
          nb::steal(PyUnicode_DecodeUTF8(static_cast<const char*>(t.data()), t.numel(), "strict"));
      if (!s.is_valid()) throw nb::python_error();
      return s;
    }
    case kBytes: {
      const Tensor& t = byte_leaf(e, key);
      return nb::bytes(static_cast<const char*>(t.data()), static_cast<size_t>(t.numel()));
    }
    case kNone:
      if (!e.is_non_tensor() || !e.non_tensor().value.is_null())
        bad_tag("entry '" + key + "' should be None");
      return nb::none();
    case kNode:
      if (!e.is_tensordict()) bad_tag("entry '" + key + "' should be a container");
      if (depth >= 32) bad_tag("containers nested too deep");
      return node_to_py(e.tensordict(), allow_pickle, depth + 1);
    case kPickle: {
      const Tensor& t = byte_leaf(e, key);
      if (!allow_pickle)
        throw ProtocolError("entry '" + key +
                            "' is a pickled Python object, and this receiver does not unpickle " +
                            "(allow_pickle=False)");
      nb::object view =
          nb::steal(PyMemoryView_FromMemory(static_cast<char*>(t.data()), t.numel(), PyBUF_READ));
      return mods().pickle_loads(view);
    }
    default:
      bad_tag(std::string("unknown element kind '") + kind + "'");
  }
}

// A datapoint's structure tag: a string "<container><kinds>", or for a dict
// ["d<kinds>", [keys in order]]. Returns the kinds string and the dict's keys (nullptr
// for a list or tuple); bad_tag() for any other shape.
std::pair<const std::string*, const Json*> parse_tag(const Json& tag_json) {
  const Json* keys = nullptr;
  const Json* kinds_json = &tag_json;
  if (tag_json.is_array()) {
    if (tag_json.size() != 2 || !tag_json[1].is_array()) bad_tag("a malformed dict tag");
    kinds_json = &tag_json[0];
    keys = &tag_json[1];
  }
  if (!kinds_json->is_string()) bad_tag("not a string");
  return {&kinds_json->get_ref<const std::string&>(), keys};
}

const Entry& entry_named(const TensorDict& td, const std::string& name) {
  for (const auto& [n, e] : td.items())
    if (n == name) return e;
  bad_tag("no entry '" + name + "'");
}

nb::object node_to_py(const TensorDict& td, bool allow_pickle, int depth) {
  const Entry* tag_entry = nullptr;
  for (const auto& [name, e] : td.items())
    if (name == kTag) tag_entry = &e;
  if (!tag_entry) return nb::cast(PyTensorDict(td));  // not from Python: a TensorDict
  if (!tag_entry->is_non_tensor()) bad_tag("not a value");
  const auto [tag_kinds, keys] = parse_tag(tag_entry->non_tensor().value);
  const std::string& tag = *tag_kinds;
  if (tag.empty() || td.size() != tag.size() || (keys && keys->size() + 1 != tag.size()))
    bad_tag("'" + tag.substr(0, 64) + "' does not match the entries");
  const char container = tag[0];
  const size_t n = tag.size() - 1;
  if ((container == 'd') != (keys != nullptr))
    bad_tag("a dict without keys, or keys without a dict");
  switch (container) {
    case 'l':
    case 't': {
      nb::list out;
      for (size_t i = 0; i < n; ++i) {
        const std::string name = std::to_string(i);
        out.append(element_to_py(tag[i + 1], name, entry_named(td, name), allow_pickle, depth));
      }
      if (container == 't') return nb::tuple(out);
      return std::move(out);
    }
    case 'd': {
      nb::dict out;
      for (size_t i = 0; i < n; ++i) {
        if (!(*keys)[i].is_string()) bad_tag("a dict key that is not a string");
        const std::string& name = (*keys)[i].get_ref<const std::string&>();
        out[nb::str(name.c_str(), name.size())] =
            element_to_py(tag[i + 1], name, entry_named(td, name), allow_pickle, depth);
      }
      return std::move(out);
    }
    case 'o':
      if (n == 1) return element_to_py(tag[1], "0", entry_named(td, "0"), allow_pickle, depth);
      [[fallthrough]];
    default:
      bad_tag("unknown container '" + tag.substr(0, 1) + "'");
  }
}

nb::object datapoint_to_py(const TensorDict& td, bool allow_pickle) {
  return node_to_py(td, allow_pickle, 0);
}

// ---- Received datapoints, straight from the storage ----------------------------------------
//
// The same conversion as node_to_py, but from a RawDatapoint: a plan made once per schema
// (from the layout's metadata and the tags in it) turns the storage into Python objects
// without building the TensorDict in between. Every array of one datapoint shares one
// owner (a capsule holding the storage), so the chunk is released when the last goes.

struct PlanNode;

struct PlanOp {
  char kind = 0;
  std::string name;  // dict key
  DType dtype = DType::UInt8;
  std::vector<size_t> shape;
  size_t start = 0;
  size_t nbytes = 0;
  std::unique_ptr<PlanNode> child;  // kNode
};

struct PlanNode {
  char container = 0;  // 'l', 't', 'd', 'o'
  std::vector<PlanOp> ops;
};

// Leaves of a consolidated metadata node: name -> [dtype, shape, start, stop, pad].
const Json* member(const Json& node, const char* field) {
  auto it = node.find(field);
  return it == node.end() ? nullptr : &*it;
}

// std::nullopt when the node carries no Python tag (a TensorDict from C++).
std::unique_ptr<PlanNode> make_plan(const Json& node, int depth) {
  const Json* non_tensors = member(node, "non_tensors");
  const Json* leaves = member(node, "leaves");
  if (!non_tensors || !leaves || !non_tensors->is_object() || !leaves->is_object()) return nullptr;
  auto tag_it = non_tensors->find(kTag);
  if (tag_it == non_tensors->end()) return nullptr;
  if (!tag_it->is_array() || tag_it->empty()) bad_tag("not a value");
  const auto [tag_kinds, keys] = parse_tag((*tag_it)[0]);
  const std::string& tag = *tag_kinds;
  if (tag.empty() || (keys && keys->size() + 1 != tag.size()))
    bad_tag("a tag that does not match its keys");
  auto plan = std::make_unique<PlanNode>();
  plan->container = tag[0];
  if ((plan->container == 'd') != (keys != nullptr) ||
      (plan->container != 'l' && plan->container != 't' && plan->container != 'd' &&
       plan->container != 'o') ||
      (plan->container == 'o' && tag.size() != 2))
    bad_tag("unknown container '" + tag.substr(0, 1) + "'");
  for (size_t i = 1; i < tag.size(); ++i) {
    PlanOp op;
    op.kind = tag[i];
    if (keys) {
      if (!(*keys)[i - 1].is_string()) bad_tag("a dict key that is not a string");
      op.name = (*keys)[i - 1].get<std::string>();
    } else {
      op.name = std::to_string(i - 1);
    }
    if (op.kind == kNone) {
      auto v = non_tensors->find(op.name);
      if (v == non_tensors->end() || !v->is_array() || v->empty() || !(*v)[0].is_null())
        bad_tag("entry '" + op.name + "' should be None");
    } else if (op.kind == kNode) {
      auto c = node.find(op.name);
      if (c == node.end() || depth >= 32) bad_tag("entry '" + op.name + "' should be a container");
      op.child = make_plan(*c, depth + 1);
      if (!op.child) bad_tag("entry '" + op.name + "' is a container without a tag");
    } else {
      auto l = leaves->find(op.name);
      if (l == leaves->end() || !l->is_array() || l->size() < 3 || !(*l)[0].is_string() ||
          !(*l)[1].is_array())
        bad_tag("entry '" + op.name + "' should be a tensor");
      auto dtype = parse_dtype((*l)[0].get_ref<const std::string&>());
      if (!dtype) bad_tag("entry '" + op.name + "' has an unknown dtype");
      op.dtype = *dtype;
      size_t numel = 1;
      for (const Json& d : (*l)[1]) {
        op.shape.push_back(d.get<size_t>());
        numel *= op.shape.back();
      }
      op.start = (*l)[2].get<size_t>();  // validated against the storage by the layout
      op.nbytes = numel * itemsize(op.dtype);
      auto expect = [&](DType t, size_t dims) {
        if (op.dtype != t || op.shape.size() != dims)
          bad_tag("entry '" + op.name + "' has the wrong dtype or shape");
      };
      switch (op.kind) {
        case kBool:
          expect(DType::Bool, 0);
          break;
        case kInt:
          expect(DType::Int64, 0);
          break;
        case kFloat:
          expect(DType::Float64, 0);
          break;
        case kStr:
        case kBytes:
        case kPickle:
          expect(DType::UInt8, 1);
          break;
        case kGeneric:
          if (!op.shape.empty()) bad_tag("entry '" + op.name + "' should be a scalar");
          break;
        case kNumpy:
        case kTorch:
          break;
        default:
          bad_tag(std::string("unknown element kind '") + op.kind + "'");
      }
    }
    plan->ops.push_back(std::move(op));
  }
  return plan;
}

struct RawConverter {
  const Storage& storage;
  bool allow_pickle;
  nb::object owner;  // made on the first array

  const std::byte* at(const PlanOp& op) const { return storage.data() + op.start; }

  // DLPack codes of the dtypes numpy has (the others take the general path).
  static std::optional<nb::dlpack::dtype> dl_dtype(DType t) {
    using C = nb::dlpack::dtype_code;
    auto d = [](C c, int bits) {
      return nb::dlpack::dtype{static_cast<uint8_t>(c), static_cast<uint8_t>(bits), 1};
    };
    switch (t) {
      case DType::Bool:
        return d(C::Bool, 8);
      case DType::UInt8:
        return d(C::UInt, 8);
      case DType::UInt16:
        return d(C::UInt, 16);
      case DType::UInt32:
        return d(C::UInt, 32);
      case DType::UInt64:
        return d(C::UInt, 64);
      case DType::Int8:
        return d(C::Int, 8);
      case DType::Int16:
        return d(C::Int, 16);
      case DType::Int32:
        return d(C::Int, 32);
      case DType::Int64:
        return d(C::Int, 64);
      case DType::Float16:
        return d(C::Float, 16);
      case DType::Float32:
        return d(C::Float, 32);
      case DType::Float64:
        return d(C::Float, 64);
      case DType::Complex64:
        return d(C::Complex, 64);
      case DType::Complex128:
        return d(C::Complex, 128);
      default:
        return std::nullopt;
    }
  }

  nb::object array(const PlanOp& op, bool torch) {
    const auto dt = dl_dtype(op.dtype);
    if (!dt) {  // bfloat16, float8: the general path
      Tensor t = Tensor::view(storage, op.start, Shape(op.shape.begin(), op.shape.end()), op.dtype);
      return torch ? to_torch(t) : to_numpy(t);
    }
    if (!owner.is_valid())
      owner = nb::capsule(new Storage(storage),
                          [](void* p) noexcept { delete static_cast<Storage*>(p); });
    void* data = const_cast<std::byte*>(at(op));
    if (torch)
      return nb::ndarray<nb::pytorch, nb::device::cpu>(data, op.shape.size(), op.shape.data(),
                                                       owner, nullptr, *dt)
          .cast(nb::rv_policy::reference);
    return nb::ndarray<nb::numpy, nb::device::cpu>(data, op.shape.size(), op.shape.data(), owner,
                                                   nullptr, *dt)
        .cast(nb::rv_policy::reference);
  }

  nb::object element(const PlanOp& op) {
    switch (op.kind) {
      case kNumpy:
        return array(op, false);
      case kTorch:
        return array(op, true);
      case kBool:
        return nb::bool_(std::to_integer<uint8_t>(*at(op)) != 0);
      case kInt: {
        int64_t v;
        std::memcpy(&v, at(op), sizeof v);
        return nb::int_(v);
      }
      case kFloat: {
        double v;
        std::memcpy(&v, at(op), sizeof v);
        return nb::float_(v);
      }
      case kGeneric:
        return array(op, false)[nb::tuple()];
      case kStr: {
        nb::object str = nb::steal(PyUnicode_DecodeUTF8(
            reinterpret_cast<const char*>(at(op)), static_cast<Py_ssize_t>(op.nbytes), "strict"));
        if (!str.is_valid()) throw nb::python_error();
        return str;
      }
      case kBytes:
        return nb::bytes(reinterpret_cast<const char*>(at(op)), op.nbytes);
      case kNone:
        return nb::none();
      case kNode:
        return node(*op.child);
      case kPickle: {
        if (!allow_pickle)
          throw ProtocolError("entry '" + op.name +
                              "' is a pickled Python object, and this receiver does not unpickle "
                              "(allow_pickle=False)");
        nb::object view = nb::steal(
            PyMemoryView_FromMemory(const_cast<char*>(reinterpret_cast<const char*>(at(op))),
                                    static_cast<Py_ssize_t>(op.nbytes), PyBUF_READ));
        return mods().pickle_loads(view);
      }
      default:
        bad_tag(std::string("unknown element kind '") + op.kind + "'");
    }
  }

  nb::object node(const PlanNode& n) {
    switch (n.container) {
      case 'l':
      case 't': {
        nb::object out =
            nb::steal(n.container == 'l' ? PyList_New(static_cast<Py_ssize_t>(n.ops.size()))
                                         : PyTuple_New(static_cast<Py_ssize_t>(n.ops.size())));
        for (size_t i = 0; i < n.ops.size(); ++i) {
          PyObject* v = element(n.ops[i]).release().ptr();
          if (n.container == 'l')
            PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), v);
          else
            PyTuple_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), v);
        }
        return out;
      }
      case 'd': {
        nb::dict out;
        for (const PlanOp& op : n.ops) out[nb::str(op.name.c_str(), op.name.size())] = element(op);
        return std::move(out);
      }
      default:
        return element(n.ops.at(0));
    }
  }
};

// Plans by layout; a layout is kept alive by its entry, so its address is never reused
// while cached. Few schemas are live at once: the cache is simply emptied when it fills.
class PlanCache {
 public:
  const PlanNode* get(const std::shared_ptr<const wire::ConsolidatedLayout>& layout) {
    auto it = plans_.find(layout.get());
    if (it != plans_.end()) return it->second.plan.get();
    if (plans_.size() >= 64) plans_.clear();
    Entry e{layout, make_plan(layout->metadata(), 0)};
    const PlanNode* p = e.plan.get();
    plans_.emplace(layout.get(), std::move(e));
    return p;
  }

 private:
  struct Entry {
    std::shared_ptr<const wire::ConsolidatedLayout> layout;
    std::unique_ptr<PlanNode> plan;  // null: not a Python datapoint
  };
  std::unordered_map<const wire::ConsolidatedLayout*, Entry> plans_;
};

// One cache for the process (used under the GIL).
PlanCache& plan_cache() {
  static auto* cache = new PlanCache();  // leaked on purpose: outlives every runner
  return *cache;
}

nb::object raw_to_py(const df::RawDatapoint& raw, PlanCache& cache, bool allow_pickle) {
  const PlanNode* plan = cache.get(raw.layout);
  if (!plan) return datapoint_to_py(raw.to_tensordict(), allow_pickle);  // a TensorDict
  RawConverter c{raw.storage, allow_pickle, {}};
  return c.node(*plan);
}

// ---- Python dataflows in C++ ------------------------------------------------------------------

class PyDataFlow : public df::DataFlow {
 public:
  explicit PyDataFlow(nb::object ds) : ds_(std::move(ds)) {
    // len() as tensorpack reads it: unknown when __len__ is missing or raises.
    try {
      size_ = nb::len(ds_);
    } catch (const nb::python_error& e) {
      if (!e.matches(PyExc_NotImplementedError) && !e.matches(PyExc_TypeError)) throw;
    } catch (const nb::cast_error&) {
    }
  }
  ~PyDataFlow() override {
    nb::gil_scoped_acquire gil;
    it_.reset();
    ds_.reset();
  }
  void reset_state() override {
    nb::gil_scoped_acquire gil;
    check();
    ds_.attr("reset_state")();
  }
  void start() override {
    nb::gil_scoped_acquire gil;
    check();
    it_ = nb::steal(PyObject_GetIter(ds_.ptr()));
    if (!it_.is_valid()) throw nb::python_error();
  }
  std::optional<TensorDict> next() override {
    nb::gil_scoped_acquire gil;
    if (!it_.is_valid()) start();
    nb::object item = nb::steal(PyIter_Next(it_.ptr()));
    if (!item.is_valid()) {
      if (PyErr_Occurred()) throw nb::python_error();
      return std::nullopt;
    }
    return datapoint_from_py(item);
  }
  std::optional<size_t> size() const override { return size_; }

  // For the garbage collector (see gc_slots): a runner that holds a dataflow whose class
  // lives in a module that holds the runner is a reference cycle only it can break.
  int traverse(visitproc visit, void* arg) {
    Py_VISIT(ds_.ptr());
    Py_VISIT(it_.ptr());
    return 0;
  }
  void clear() {
    it_.reset();
    ds_.reset();
  }

 private:
  void check() const {
    if (!ds_.is_valid()) throw ClosedError("the dataflow was released by the garbage collector");
  }
  nb::object ds_, it_;
  std::optional<size_t> size_;
};

df::ForkHooks python_fork_hooks() {
  df::ForkHooks h;
  h.before = [] { PyOS_BeforeFork(); };
  h.parent = [] { PyOS_AfterFork_Parent(); };
  h.child = [] {
    PyOS_AfterFork_Child();
    // Seed Python's generators from the worker's seed (numpy, random, torch if loaded).
    if (const df::WorkerInfo* w = df::current_worker()) {
      try {
        nb::module_::import_("tensorwire.dataflow").attr("_seed_worker")(w->seed);
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("tensorwire worker seeding");
      }
    }
    // From here on the worker's C++ code runs without the GIL; Python code takes it.
    (void)PyEval_SaveThread();
  };
  return h;
}

Failure describe_python_failure(std::exception_ptr ep) {
  nb::gil_scoped_acquire gil;
  try {
    std::rethrow_exception(ep);
  } catch (nb::python_error& e) {
    Failure f;
    nb::handle exc = e.value();
    nb::handle type = exc.type();
    std::string module =
        nb::cast<std::string>(nb::getattr(type, "__module__", nb::str("builtins")));
    f.type = module + "." +
             nb::cast<std::string>(nb::getattr(type, "__qualname__", nb::str("Exception")));
    try {
      f.message = nb::cast<std::string>(nb::str(exc));
    } catch (...) {
      f.message = "(unprintable)";
    }
    try {
      nb::object lines = nb::module_::import_("traceback").attr("format_exception")(exc);
      f.traceback = nb::cast<std::string>(nb::str("").attr("join")(lines));
    } catch (...) {
    }
    try {
      nb::bytes b = nb::cast<nb::bytes>(mods().pickle_dumps(exc, -1));
      f.payload.assign(b.c_str(), b.size());
    } catch (nb::python_error& pe) {
      pe.restore();
      PyErr_Clear();  // not picklable: the main process rebuilds it from type and message
    }
    return f;
  } catch (...) {
    return describe_exception(std::current_exception());
  }
}

// Waits in slices without the GIL, checking Python signals in between. `step` returns
// true when it produced a result.
// `look_first`: first a look without waiting, GIL held; when a datapoint is there (the
// steady state of a busy pipeline) that saves releasing and re-taking the GIL for each
// one. Only for steps that copy nothing (the runner's: views into shared memory), since
// the GIL is released around every copy.
template <class Step>
void wait_interruptibly(Step&& step, bool look_first = false) {
  if (look_first && step(Millis(0))) return;
  while (true) {
    bool done;
    {
      nb::gil_scoped_release nogil;
      done = step(kSignalCheck);
    }
    if (done) return;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

// ---- Runner -------------------------------------------------------------------------------------

struct PyRunner {
  std::shared_ptr<PyDataFlow> flow;
  std::unique_ptr<df::MultiProcessRunnerZMQ> runner;
  const char* name = "MultiProcessRunnerZMQ";

  int traverse(visitproc visit, void* arg) { return flow ? flow->traverse(visit, arg) : 0; }
  void clear() {
    if (flow) flow->clear();
  }

  PyRunner(nb::object ds, int num_proc, int hwm, std::optional<uint64_t> seed) {
    df::RunnerOptions o;
    o.num_proc = num_proc;
    o.hwm = hwm;
    o.seed = seed;
    o.fork_hooks = python_fork_hooks();
    o.describe_failure = describe_python_failure;
    flow = std::make_shared<PyDataFlow>(std::move(ds));
    runner = std::make_unique<df::MultiProcessRunnerZMQ>(flow, std::move(o));
  }
};

// An epoch of a runner as a Python iterator; keeps its runner alive.
struct PyEpoch {
  nb::object owner;  // the Python object of the runner
  std::optional<df::Epoch> epoch;
  const char* name;
  bool look_first = false;  // see wait_interruptibly
  bool allow_pickle = true;

  int traverse(visitproc visit, void* arg) {
    Py_VISIT(owner.ptr());
    return 0;
  }
  void clear() {
    epoch.reset();
    owner.reset();
  }

  nb::object next() {
    if (!epoch) throw nb::stop_iteration();
    std::optional<df::RawDatapoint> dp;
    try {
      wait_interruptibly(
          [&](Millis slice) {
            dp = epoch->next_raw(slice);
            return dp.has_value() || epoch->done();
          },
          look_first);
    } catch (...) {
      epoch.reset();  // as a generator that raised: this iteration is over
      throw;
    }
    if (!dp) {
      epoch.reset();  // the guard goes with the epoch: a new one may start
      throw nb::stop_iteration();
    }
    return raw_to_py(*dp, plan_cache(), allow_pickle);
  }
};

struct PyMap {
  std::shared_ptr<PyDataFlow> flow;
  std::unique_ptr<df::MultiProcessMapDataZMQ> map;
  const char* name = "MultiProcessMapDataZMQ";

  int traverse(visitproc visit, void* arg) {
    if (holder_) Py_VISIT(holder_->ptr());
    return flow ? flow->traverse(visit, arg) : 0;
  }
  void clear() {
    if (holder_) holder_->reset();
    if (flow) flow->clear();
  }

  PyMap(nb::object ds, int num_proc, nb::object fn, size_t buffer_size, bool strict,
        std::optional<uint64_t> seed) {
    df::MapOptions o;
    o.num_proc = num_proc;
    o.buffer_size = buffer_size;
    o.strict = strict;
    o.seed = seed;
    o.fork_hooks = python_fork_hooks();
    o.describe_failure = describe_python_failure;
    auto holder = std::make_shared<nb::object>(std::move(fn));
    auto map_fn = [holder](TensorDict in) -> std::optional<TensorDict> {
      nb::gil_scoped_acquire gil;
      nb::object dp = datapoint_to_py(in, true);
      nb::object out = (*holder)(dp);
      if (out.is_none()) return std::nullopt;
      return datapoint_from_py(out);
    };
    flow = std::make_shared<PyDataFlow>(std::move(ds));
    map = std::make_unique<df::MultiProcessMapDataZMQ>(flow, std::move(map_fn), std::move(o));
    holder_ = holder;  // the map function runs in the workers; here it is only held
  }
  std::shared_ptr<nb::object> holder_;
};

struct PyRemote {
  std::unique_ptr<df::RemoteDataZMQ> remote;
  bool allow_pickle;

  nb::object next(std::optional<double> timeout_s) {
    std::optional<TensorDict> dp;
    auto deadline = timeout_s ? std::chrono::steady_clock::now() +
                                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(*timeout_s))
                              : std::chrono::steady_clock::time_point::max();
    wait_interruptibly([&](Millis slice) {
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return true;
      dp = remote->next(
          std::min(slice, std::chrono::duration_cast<Millis>(deadline - now) + Millis(1)));
      return dp.has_value();
    });
    if (!dp) return nb::none();
    return datapoint_to_py(*dp, allow_pickle);
  }
};

// tp_traverse / tp_clear for a bound type T with traverse() and clear() members.
template <class T>
int gc_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  return nb::inst_ptr<T>(self)->traverse(visit, arg);
}
template <class T>
int gc_clear(PyObject* self) {
  if (nb::inst_ready(self)) nb::inst_ptr<T>(self)->clear();
  return 0;
}
template <class T>
PyType_Slot gc_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(gc_traverse<T>)},
                          {Py_tp_clear, reinterpret_cast<void*>(gc_clear<T>)},
                          {0, nullptr}};

}  // namespace

void bind_dataflow(nb::module_& m) {
  static nb::object died =
      nb::exception<df::WorkerDiedError>(m, "WorkerDiedError", PyExc_RuntimeError);

  m.def("_current_worker", []() -> nb::object {
    const df::WorkerInfo* w = df::current_worker();
    if (!w) return nb::none();
    return nb::make_tuple(w->index, w->num_workers, w->seed);
  });
  m.def(
      "_datapoint_roundtrip",
      [](nb::handle obj, bool allow_pickle) {
        // Conversion only, for tests: Python -> TensorDict -> Python.
        return datapoint_to_py(datapoint_from_py(obj), allow_pickle);
      },
      nb::arg("obj").none(), nb::arg("allow_pickle") = true);
  m.def("_datapoint_to_tensordict",
        [](nb::handle obj) { return PyTensorDict(datapoint_from_py(obj)); });

  nb::class_<PyEpoch>(m, "_Epoch", nb::type_slots(gc_slots<PyEpoch>))
      .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__next__", &PyEpoch::next);

  nb::class_<PyRunner>(m, "_Runner", nb::type_slots(gc_slots<PyRunner>))
      .def(nb::init<nb::object, int, int, std::optional<uint64_t>>(), nb::arg("ds"),
           nb::arg("num_proc"), nb::arg("hwm"), nb::arg("seed").none())
      .def("reset_state", [](PyRunner& r) { r.runner->reset_state(); })
      .def("epoch",
           [](nb::handle self) {
             PyRunner& r = nb::cast<PyRunner&>(self);
             PyEpoch e{nb::borrow(self), std::nullopt, r.name, true};
             e.epoch.emplace(r.runner->epoch());
             return e;
           })
      .def("next",
           [](PyRunner& r) {
             std::optional<df::RawDatapoint> dp;
             wait_interruptibly(
                 [&](Millis slice) {
                   dp = r.runner->next_raw(slice);
                   return dp.has_value();
                 },
                 true);
             return raw_to_py(*dp, plan_cache(), true);
           })
      .def("close", [](PyRunner& r) { r.runner->close(); })
      .def_prop_ro("size", [](PyRunner& r) { return r.runner->size(); })
      .def_prop_ro("pids", [](PyRunner& r) { return r.runner->pids(); })
      .def_prop_ro("base_seed", [](PyRunner& r) { return r.runner->base_seed(); })
      .def_prop_ro("endpoint", [](PyRunner& r) { return r.runner->endpoint(); })
      .def_prop_ro("shared_memory_bytes",
                   [](PyRunner& r) { return r.runner->shared_memory_bytes(); });

  nb::class_<PyMap>(m, "_MapData", nb::type_slots(gc_slots<PyMap>))
      .def(nb::init<nb::object, int, nb::object, size_t, bool, std::optional<uint64_t>>(),
           nb::arg("ds"), nb::arg("num_proc"), nb::arg("map_func"), nb::arg("buffer_size"),
           nb::arg("strict"), nb::arg("seed").none())
      .def("reset_state", [](PyMap& p) { p.map->reset_state(); })
      .def("epoch",
           [](nb::handle self) {
             PyMap& p = nb::cast<PyMap&>(self);
             PyEpoch e{nb::borrow(self), std::nullopt, p.name};
             e.epoch.emplace(p.map->epoch());
             return e;
           })
      .def("close", [](PyMap& p) { p.map->close(); })
      .def_prop_ro("size", [](PyMap& p) { return p.map->size(); })
      .def_prop_ro("buffer_size", [](PyMap& p) { return p.map->buffer_size(); })
      .def_prop_ro("pids", [](PyMap& p) { return p.map->pids(); })
      .def_prop_ro("base_seed", [](PyMap& p) { return p.map->base_seed(); });

  nb::class_<PyRemote>(m, "_RemoteData")
      .def(
          "__init__",
          [](PyRemote* self, std::string addr1, std::string addr2, int hwm, bool bind,
             bool allow_pickle) {
            new (self) PyRemote{std::make_unique<df::RemoteDataZMQ>(addr1, addr2, hwm, bind),
                                allow_pickle};
          },
          nb::arg("addr1"), nb::arg("addr2"), nb::arg("hwm"), nb::arg("bind"),
          nb::arg("allow_pickle"))
      .def("reset_state", [](PyRemote& r) { r.remote->reset_state(); })
      .def("next", &PyRemote::next, nb::arg("timeout").none() = nb::none())
      .def("endpoint", [](PyRemote& r, int which) { return r.remote->endpoint(which); })
      .def("count", [](PyRemote& r, int which) { return r.remote->count(which); })
      .def_prop_ro("rejected", [](PyRemote& r) { return r.remote->rejected(); })
      .def("close", [](PyRemote& r) { r.remote->close(); });

  m.def(
      "_send_dataflow_zmq",
      [](nb::object ds, const std::string& addr, int hwm, bool bind,
         std::optional<uint64_t> max_datapoints, nb::object progress) {
        PyDataFlow flow(std::move(ds));
        df::SendOptions o;
        o.hwm = hwm;
        o.bind = bind;
        o.max_datapoints = max_datapoints;
        bool interrupted = false;
        o.progress = [&](uint64_t sent) {
          nb::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) {
            interrupted = true;
            return false;
          }
          if (!progress.is_none()) progress(sent);
          return true;
        };
        uint64_t sent;
        {
          nb::gil_scoped_release nogil;
          sent = df::send_dataflow_zmq(flow, addr, o);
        }
        if (interrupted) throw nb::python_error();
        return sent;
      },
      nb::arg("ds"), nb::arg("addr"), nb::arg("hwm"), nb::arg("bind"),
      nb::arg("max_datapoints").none(), nb::arg("progress").none());
}

}  // namespace tensorwire::py
