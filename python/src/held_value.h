// A value a blocking call got just as a Ctrl-C came. The signal's handler runs when Python
// next checks, and a call made as an expression (`dp = next(it)`, `rd.recv()`, a
// generator's `yield core.next()`) is checked as it returns: the KeyboardInterrupt
// propagates and the value is dropped. deliver() runs the pending handlers before handing
// the value over; when one raises, the value is kept, and the next call returns it first.
#pragma once

#include <nanobind/nanobind.h>

namespace tensorwire::py {

class HeldValue {
 public:
  // The kept value (then no longer kept), or a null object.
  nanobind::object take() { return std::move(value_); }
  // `v`, unless a signal handler raises first: then `v` is kept and that exception thrown.
  nanobind::object deliver(nanobind::object v) {
    if (PyErr_CheckSignals() != 0) {
      value_ = std::move(v);
      throw nanobind::python_error();
    }
    return v;
  }
  int traverse(visitproc visit, void* arg) {
    Py_VISIT(value_.ptr());
    return 0;
  }
  void clear() { value_.reset(); }

 private:
  nanobind::object value_;
};

}  // namespace tensorwire::py
