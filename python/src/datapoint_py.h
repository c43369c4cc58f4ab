// Python datapoints (lists, tuples, dicts of arrays, numbers, strings...) <-> TensorDicts
// in the wire layer's datapoint format (tensorwire/wire/datapoint.h, docs/protocol.md).
// Called with the GIL held.
#pragma once

#include <nanobind/nanobind.h>

#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::py {

namespace nb = nanobind;

// A Python datapoint as a TensorDict; a tensorwire.TensorDict goes as it is.
TensorDict datapoint_from_py(nb::handle obj);
// Back to the Python objects that were encoded; a TensorDict that is not a datapoint comes
// back as a tensorwire.TensorDict. ProtocolError for a malformed datapoint, or a pickled
// element unless `allow_pickle`.
nb::object datapoint_to_py(const TensorDict& td, bool allow_pickle);
nb::object raw_to_py(const dataflow::RawDatapoint& raw, bool allow_pickle);

}  // namespace tensorwire::py
