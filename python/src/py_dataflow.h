// PyDataFlow: the C++ DataFlow interface (tensorwire/dataflow/dataflow.h) over a Python
// dataflow object, as tensorpack iterates one: reset_state(), iter(), __len__. Each call
// takes the GIL (GilForLibrary: parked at interpreter exit).
#pragma once

#include <optional>

#include "convert.h"
#include "gil.h"
#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::py {

class PyDataFlow : public dataflow::DataFlow {
 public:
  explicit PyDataFlow(nb::object ds) : ds_(dataflow_arg(std::move(ds))) {
    // The length as tensorpack reads it: ds.__len__(), unknown when there is none or it
    // raises NotImplementedError (any other exception is the dataflow's and goes out), or
    // when it is not above 0 (tensorpack then streams for ever).
    if (nb::hasattr(ds_, "__len__")) {
      try {
        const int64_t n = nb::cast<int64_t>(ds_.attr("__len__")());
        if (n > 0) size_ = static_cast<size_t>(n);
      } catch (const nb::python_error& e) {
        if (!e.matches(PyExc_NotImplementedError)) throw;
      } catch (const nb::cast_error&) {  // not an int: tensorpack keeps it and never stops
      }
    }
  }
  ~PyDataFlow() override {
    nb::gil_scoped_acquire gil;
    it_.reset();
    ds_.reset();
  }
  void reset_state() override {
    GilForLibrary gil;
    check();
    ds_.attr("reset_state")();
  }
  void start() override {
    GilForLibrary gil;
    check();
    it_ = nb::steal(PyObject_GetIter(ds_.ptr()));
    if (!it_.is_valid()) throw nb::python_error();
  }
  std::optional<TensorDict> next() override {
    GilForLibrary gil;
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

}  // namespace tensorwire::py
