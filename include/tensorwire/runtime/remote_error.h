// A failure that happened in another process and is reported here: a policy that raised in
// an InferenceServer, a dataflow or map function that raised in a runner's worker. One type
// for every system, so a caller (and the Python binding, in one place) handles them alike.
#pragma once

#include <exception>
#include <string>

#include "tensorwire/core/error.h"

namespace tensorwire {

// What is known of the original exception.
struct Failure {
  // "KeyError", "ValueError", "TypeError", "TimeoutError", "RuntimeError" for Python builtins
  // and tensorwire's own kinds; "module.QualName" for other Python exceptions; the
  // demangled type name for other C++ exceptions.
  std::string type;
  std::string message;
  std::string traceback;  // may be empty (C++ code)
  // Opaque bytes beside the description (a Python worker's pickled exception). Only a
  // process's own forked workers may fill it; nothing received from a network carries one.
  std::string payload;
};

// Describes a caught exception for delivery to another process: a RemoteError's own
// failure as it is; tensorwire's KeyError / ValueError / TypeError / TimeoutError under
// their Python names; other tensorwire errors as "RuntimeError"; any other std::exception
// by its demangled C++ type name.
Failure describe_exception(const std::exception_ptr& error);

class RemoteError : public Error {
 public:
  // `context` (who failed, e.g. "MultiProcessRunnerZMQ: worker 1 (pid 123)") prefixes the
  // message: "<context> raised <type>: <message>", or "<type>: <message>" without one.
  explicit RemoteError(Failure failure, const std::string& context = {});
  // A failure known only by its type and message.
  RemoteError(std::string type_name, std::string message);
  const Failure& failure() const noexcept { return failure_; }
  const std::string& type_name() const noexcept { return failure_.type; }
  const std::string& message() const noexcept { return failure_.message; }
  // Who failed, as given (empty when not said).
  const std::string& context() const noexcept { return context_; }

 private:
  Failure failure_;
  std::string context_;
};

}  // namespace tensorwire
