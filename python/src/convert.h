// The one conversion module between Python values and tensorwire's C++ types, used by every
// binding. Tensor data is never copied: numpy arrays and torch tensors are wrapped (the
// Python object is kept alive by the storage), and leaves go back out as numpy arrays /
// torch tensors over the same bytes. Two purposes, two rules (docs/design.md, "From Python
// values to leaves"):
//  - building a TensorDict follows tensordict (convert_entry.cpp): a float becomes a
//    float32 tensor, an int an int64 one, a bool a bool one;
//  - a dataflow datapoint round-trips exactly what was yielded (convert_datapoint.cpp): a
//    float comes back as the same float, an int as the same int.
// Called with the GIL held.
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <type_traits>

#include <nanobind/nanobind.h>
// Every file that casts to std::string must see this caster: without it nanobind falls back
// to a generic cast that throws std::bad_cast, and the linker may pick that instantiation
// for the whole module (one definition rule).
#include <nanobind/stl/string.h>

#include <memory>

#include "dataflow/raw_datapoint.h"
#include "tensorwire/core/tensordict.h"
#include "tensorwire/dataflow/dataflow.h"
#include "tensorwire/runtime/timeout.h"

namespace tensorwire::py {

namespace nb = nanobind;

// The Python-facing TensorDict: a handle on a root C++ TensorDict plus a key path, so
// td["info"] is a live view of the nested dict (writes through it are seen by the parent,
// as in tensordict) and never dangles: a path that no longer exists raises KeyError.
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

// ---- Arguments (convert.cpp) ---------------------------------------------------------------
// Converted with a one-line error naming the argument (nanobind's own lists every overload);
// their rules (ranges, combinations) are checked by the C++ API, once.

// The name of the value's type, for messages.
std::string py_type(nb::handle value);
// The UTF-8 bytes of a str. ValueError naming `what` for one that has none: a lone
// surrogate, which os.fsdecode (os.listdir, sys.argv, os.environ) makes of bytes that are
// not UTF-8 (nanobind's own cast says only "std::bad_cast").
std::string utf8_of(nb::handle str, const std::string& what);
// str(value). Takes a handle on purpose: nb::str(obj.attr("x")) wraps the attribute as a
// str without converting it (a torch.device stays one, and casting it fails).
std::string str_of_obj(nb::handle value);
// An int (not a bool): TypeError "`name` must be an integer, got <type>" otherwise.
int64_t int_arg(nb::handle value, const char* name);
// An int that fits T (nanobind's error otherwise is a dump of the signature): ValueError
// naming the argument and the bound of T it is beyond for one that does not, except that a
// negative one for an unsigned T is 0, which the C++ option's own check refuses by name
// ("at least 1").
template <class T>
T int_arg_as(nb::handle value, const char* name) {
  if (!nb::isinstance<nb::int_>(value) || nb::isinstance<nb::bool_>(value))
    int_arg(value, name);  // its TypeError
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  if (std::is_unsigned_v<T> && PyObject_RichCompareBool(value.ptr(), nb::int_(0).ptr(), Py_LT) == 1)
    return 0;
  T v{};
  if (!nb::try_cast<T>(value, v)) {
    // Only the side it is beyond: the C++ option names its own lower bound (hwm "at least
    // 1"), which T's minimum would contradict.
    const bool above = PyObject_RichCompareBool(value.ptr(), nb::int_(0).ptr(), Py_GT) == 1;
    throw ValueError(std::string(name) + " must be at " +
                     (above ? "most " + std::to_string(hi) : "least " + std::to_string(lo)) +
                     ", got " + nb::cast<std::string>(nb::str(value)));
  }
  return v;
}
// A number (an int, a float, a numpy scalar; not a bool), or None where `none_ok`:
// TypeError "`name` must be [None or ]`what`, got <type>" otherwise.
std::optional<double> number_arg(nb::handle value, const char* name, bool none_ok,
                                 const char* what = "a number");
// A number of seconds, as number_arg reads it.
std::optional<double> seconds_arg(nb::handle value, const char* name, bool none_ok = true);
// A timeout in seconds (None: for ever, where `none_ok`): Timeout::seconds's rules,
// seconds_arg's types.
Timeout timeout_arg(nb::handle value, const char* name = "timeout", bool none_ok = true);
// A liveness timeout in seconds (None: the default; 0: off), as runtime/liveness.h reads it.
std::chrono::milliseconds liveness_arg(nb::handle value);
// A shared key as str (its UTF-8 bytes) or bytes, as people keep secrets; "" for None (no
// authentication). TypeError for another type, ValueError for an empty key (it would
// silently mean no authentication).
std::string auth_key_arg(nb::handle value);
// None, or an int >= 0 (a seed, a count): TypeError or ValueError naming `name` otherwise.
std::optional<uint64_t> count_arg(nb::handle value, const char* name);
// A dataflow (an iterable; tensorpack's DataFlow): TypeError naming `ds` otherwise.
nb::object dataflow_arg(nb::object ds);
// A bool: TypeError naming `name` otherwise (no truthiness: strict="no" is a mistake).
bool bool_arg(nb::handle value, const char* name);
// A str (or None when `none_ok`; then std::nullopt): TypeError naming `name` otherwise.
std::optional<std::string> str_arg(nb::handle value, const char* name, bool none_ok);
// An iterable of ints: TypeError naming `name` (or "`name` entry") otherwise.
std::vector<int64_t> int_list_arg(nb::handle value, const char* name);

// ---- Leaves, for both rules (convert.cpp) --------------------------------------------------

// A Python str of exactly these bytes (NUL included: nb::str(const char*) would stop there).
inline nb::str str_of(std::string_view s) {
  return nb::str(s.data(), s.size());
}

// str -> Key("a"); tuple of str -> Key({"a", "b"}). TypeError otherwise.
Key to_key(nb::handle key);
nb::object from_key(const Key& key);
nb::list key_list(const std::vector<Key>& keys);

// Python value -> JSON (None, bool, int, float, str, list/tuple, dict with str keys).
// ValueError naming `where` for anything else.
Json to_json(nb::handle value, const std::string& where);
nb::object from_json(const Json& value);

// A module the program imported already (sys.modules), or a null object: tensorwire never
// imports torch or tensordict itself, and their objects exist only once the program has.
nb::object imported_module(const char* name);
// torch.Tensor once torch is imported (kept from then on), else nullptr.
PyTypeObject* torch_tensor_type();

// Any object exposing DLPack or the buffer protocol on the CPU -> a Tensor viewing it.
// std::nullopt when `value` is not array-like; TypeError for a dtype with no DType.
std::optional<Tensor> to_tensor(nb::handle value);
// The same for a leaf the user gave at `where` ("key 'obs'"): ValueError for a tensor off
// the CPU, TypeError naming the dtype and what to store instead for an unsupported one.
std::optional<Tensor> leaf_tensor(nb::handle value, const std::string& where);

// Tensor -> numpy array viewing the same bytes (torch tensor for dtypes numpy lacks).
nb::object to_numpy(const Tensor& t);
// Tensor -> torch tensor viewing the same bytes.
nb::object to_torch(const Tensor& t);

// ---- Building a TensorDict: tensordict's rule (convert_entry.cpp) ------------------------

// A Python value as an entry of a dict of the given batch size and device.
Entry to_entry(nb::handle value, const Shape& batch_size, const std::optional<Device>& device,
               const Key& key);
nb::object from_entry(const Entry& e, const PyTensorDict& owner, const Key& key);
// A tensorwire.TensorDict as it is, a dict (with this batch size and device), or a
// tensordict.TensorDict (with its own) as a TensorDict. TypeError naming `what` otherwise.
TensorDict tensordict_from(nb::handle source, const Shape& batch_size,
                           const std::optional<Device>& device, const char* what);
// A nested dict of torch tensors sharing memory with `td`.
nb::object to_torch_tree(const TensorDict& td);
// A tensordict.TensorDict whose torch leaves share memory with `td` (imports tensordict).
nb::object to_tensordict_lib(const TensorDict& td);
// True for a tensordict.TensorDictBase, without importing tensordict.
bool is_tensordict_lib(nb::handle value);
// The leaves of a mapping at `keys` (obj[a][b]...): KeyError naming a missing one.
TensorDict leaves_at(nb::handle mapping, const std::vector<Key>& keys);
// A policy's output as the InferenceServer's response: a tensorwire.TensorDict as it is; a
// tensordict.TensorDict whole, or, given the transports' response `keys`, its leaves at
// them (detached from autograd; a missing one left out) in a dict of its first batch
// dimension (the input's `batch` first dimension when it has none). TypeError otherwise.
TensorDict policy_output(nb::handle out, const std::optional<std::vector<Key>>& keys,
                         const Shape& batch);
// A torchrl policy's result (a tensordict.TensorDict) at the response `keys`, each leaf
// copied to the CPU when it is elsewhere and detached: KeyError naming a missing key.
TensorDict torchrl_result(nb::handle result, const std::vector<Key>& keys);

// ---- Dataflow datapoints: round-trips exactly what was yielded (convert_datapoint.cpp) ---

// A Python datapoint as a TensorDict in the wire layer's datapoint format
// (tensorwire/wire/datapoint.h); a tensorwire.TensorDict goes as it is.
TensorDict datapoint_from_py(nb::handle obj);
// Back to the Python objects that were encoded; a TensorDict that is not a datapoint comes
// back as a tensorwire.TensorDict. ProtocolError for a malformed datapoint, or a pickled
// element unless `allow_pickle`.
nb::object datapoint_to_py(const TensorDict& td, bool allow_pickle);
nb::object raw_to_py(const dataflow::RawDatapoint& raw, bool allow_pickle);

}  // namespace tensorwire::py
