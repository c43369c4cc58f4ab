// The pipe's own kinds of failure, beyond those of tensorwire/core/error.h (where
// ConnectionRefused is: the remote inference client raises it too).
#pragma once

#include <cstdint>
#include <string>

#include "tensorwire/core/error.h"

namespace tensorwire {

// A listener's port is taken by another socket (Python: OSError with errno EADDRINUSE).
class PortInUse : public Error {
 public:
  explicit PortInUse(uint16_t port)
      : Error("port " + std::to_string(port) + " is in use (pass port 0 for a free one)"),
        port_(port) {}
  uint16_t port() const noexcept { return port_; }

 private:
  uint16_t port_;
};

}  // namespace tensorwire
