// A value a blocking call got just as a Ctrl-C came. The signal's handler runs when Python
// next checks, and a call made as an expression (`dp = next(it)`, `rd.recv()`, a
// generator's `yield core.next()`) is checked as it returns: the KeyboardInterrupt
// propagates and the value is dropped. deliver() runs the pending handlers before handing
// the value over; when one raises, the value is kept, and the next call returns it first.
#pragma once

#include <nanobind/nanobind.h>
#include <unistd.h>

namespace tensorwire::py {

class HeldValue {
 public:
  // The kept value (then no longer kept), or a null object. Only in the process that kept
  // it: a forked child's copy of its owner does not deliver the parent's value again.
  nanobind::object take() {
    if (!value_.is_valid() || pid_ != ::getpid()) return {};
    return std::move(value_);
  }
  // `v`, unless a signal handler raises first: then `v` is kept and that exception thrown.
  nanobind::object deliver(nanobind::object v) {
    if (PyErr_CheckSignals() != 0) {
      value_ = std::move(v);
      pid_ = ::getpid();
      throw nanobind::python_error();
    }
    return v;
  }
  int traverse(visitproc visit, void* arg) {
    Py_VISIT(value_.ptr());
    return 0;
  }
  void clear() { value_.reset(); }  // under the GIL (a close, a new epoch)

 private:
  nanobind::object value_;
  pid_t pid_ = 0;
};

}  // namespace tensorwire::py
