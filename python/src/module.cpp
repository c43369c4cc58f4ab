// tensorwire._C: the nanobind extension. Thin by design: conversion of Python objects,
// the GIL, and exception mapping; the logic lives in the C++ library.
#include <nanobind/nanobind.h>

#include <cstdlib>

#include "bindings.h"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "tensorwire C++ core";
  // First: the exception mapping and the interrupt check every other part relies on.
  tensorwire::py::bind_errors(m);
  tensorwire::py::bind_log(m);
  // A tensorwire object still referenced from a daemon thread at interpreter exit is never
  // collected, by design of Python's shutdown; nanobind would report each as a leak on
  // stderr, in a program that did nothing wrong. TENSORWIRE_LEAK_WARNINGS=1 turns the report
  // back on (for finding real reference cycles).
  const char* leaks = std::getenv("TENSORWIRE_LEAK_WARNINGS");
  nb::set_leak_warnings(leaks && *leaks == '1');
  tensorwire::py::bind_tensordict(m);
  tensorwire::py::bind_pipe(m);
  tensorwire::py::bind_dataflow(m);
  tensorwire::py::bind_inference(m);
}
