#include "tensorwire/dataflow/dataflow.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>

namespace tensorwire::dataflow {

namespace {

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                           std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

}  // namespace

Failure describe_exception(std::exception_ptr e) {
  Failure f;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    f.type = demangle(typeid(x).name());
    f.message = x.what();
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    f.type = t ? demangle(t->name()) : "unknown";
    f.message = "(not a std::exception)";
  }
  return f;
}

WorkerError::WorkerError(const std::string& runner, int worker, int pid, Failure failure)
    : Error(runner + ": worker " + std::to_string(worker) + " (pid " + std::to_string(pid) +
            ") raised " + failure.type + ": " + failure.message),
      worker_(worker),
      pid_(pid),
      failure_(std::move(failure)) {}

}  // namespace tensorwire::dataflow
