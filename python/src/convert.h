// Conversions between Python objects and tensorwire's C++ types. Tensor data is never
// copied: numpy arrays and torch tensors are wrapped (the Python object is kept alive by
// the storage), and leaves go back out as numpy arrays / torch tensors over the same bytes.
#pragma once

#include <nanobind/nanobind.h>
// Every file that casts to std::string must see this caster: without it nanobind falls back
// to a generic cast that throws std::bad_cast, and the linker may pick that instantiation
// for the whole module (one definition rule).
#include <nanobind/stl/string.h>

#include "tensorwire/core/tensordict.h"

namespace tensorwire::py {

namespace nb = nanobind;

// A Python str of exactly these bytes (NUL included: nb::str(const char*) would stop there).
inline nb::str str_of(std::string_view s) {
  return nb::str(s.data(), s.size());
}

// str -> Key("a"); tuple of str -> Key({"a", "b"}). TypeError otherwise.
Key to_key(nb::handle key);
nb::object from_key(const Key& key);

// Python value -> JSON (None, bool, int, float, str, list/tuple, dict with str keys).
// ValueError naming `where` for anything else.
Json to_json(nb::handle value, const std::string& where);
nb::object from_json(const Json& value);

// Any object exposing DLPack or the buffer protocol on the CPU -> a Tensor viewing it.
// std::nullopt when `value` is not array-like.
std::optional<Tensor> to_tensor(nb::handle value);

// Tensor -> numpy array viewing the same bytes (torch tensor for dtypes numpy lacks).
nb::object to_numpy(const Tensor& t);
// Tensor -> torch tensor viewing the same bytes.
nb::object to_torch(const Tensor& t);

}  // namespace tensorwire::py
