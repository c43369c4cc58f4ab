// RemoteError: the policy (or the server's handling of its output) failed a request.
//
// It carries the original exception's type name and message, so a client can re-raise
// something meaningful: Python clients raise the same builtin exception type when the
// name is a builtin ("KeyError", "ValueError", ...), a RuntimeError naming it otherwise.
#pragma once

#include <exception>
#include <string>

#include "tensorwire/core/error.h"

namespace tensorwire::inference {

class RemoteError : public Error {
 public:
  RemoteError(std::string type_name, std::string message);
  const std::string& type_name() const noexcept { return type_name_; }
  const std::string& message() const noexcept { return message_; }

 private:
  std::string type_name_;
  std::string message_;
};

// Describes a caught exception for delivery to clients: RemoteError as it is; tensorwire's
// KeyError / ValueError / TypeError / TimeoutError under their Python names (so a missing
// response key reaches a Python client as a KeyError); other tensorwire errors as
// "RuntimeError"; any other std::exception by its demangled C++ type name.
RemoteError describe_exception(const std::exception_ptr& error);

}  // namespace tensorwire::inference
