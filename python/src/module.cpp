// tensorwire._C: the nanobind extension. Thin by design: conversion of Python objects,
// the GIL, and exception mapping; the logic lives in the C++ library.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "tensorwire/core/error.h"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "tensorwire C++ core";
  // ProtocolError / ClosedError are RuntimeErrors, as the reference libraries raise.
  static nb::object protocol_error =
      nb::exception<tensorwire::ProtocolError>(m, "ProtocolError", PyExc_RuntimeError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tensorwire::KeyError& e) {
      PyErr_SetString(PyExc_KeyError, e.what());
    } catch (const tensorwire::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const tensorwire::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const tensorwire::TimeoutError& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    } catch (const tensorwire::ProtocolError& e) {
      PyErr_SetString(protocol_error.ptr(), e.what());
    } catch (const tensorwire::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  tensorwire::py::bind_tensordict(m);
  tensorwire::py::bind_pipe(m);
  tensorwire::py::bind_dataflow(m);
  tensorwire::py::bind_inference(m);
}
