// Garbage-collector support for a bound type that holds Python objects: nb::type_slots(
// gc_slots<T>) gives the type tp_traverse and tp_clear, which call T's traverse(visit, arg)
// and clear(). Without them a reference cycle through such an object (a runner holding a
// dataflow whose module holds the runner) is never collected.
#pragma once

#include <nanobind/nanobind.h>

namespace tensorwire::py {

template <class T>
int gc_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nanobind::inst_ready(self)) return 0;
  return nanobind::inst_ptr<T>(self)->traverse(visit, arg);
}
template <class T>
int gc_clear(PyObject* self) {
  if (nanobind::inst_ready(self)) nanobind::inst_ptr<T>(self)->clear();
  return 0;
}
template <class T>
PyType_Slot gc_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(gc_traverse<T>)},
                          {Py_tp_clear, reinterpret_cast<void*>(gc_clear<T>)},
                          {0, nullptr}};

}  // namespace tensorwire::py
