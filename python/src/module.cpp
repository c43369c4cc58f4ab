// tensorwire._C: the nanobind extension. Thin by design: conversion of Python objects,
// the GIL, and exception mapping; the logic lives in the C++ library.
#include <nanobind/nanobind.h>

#include "bindings.h"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "tensorwire C++ core";
  // First: the exception mapping and the interrupt check every other part relies on.
  tensorwire::py::bind_errors(m);
  tensorwire::py::bind_tensordict(m);
  tensorwire::py::bind_pipe(m);
  tensorwire::py::bind_dataflow(m);
  tensorwire::py::bind_inference(m);
}
