#include "tensorwire/core/error.h"

#include <cstring>

namespace tensorwire {

SystemError::SystemError(const std::string& what, int err)
    : Error(what + ": " + std::strerror(err)), code_(err) {}

}  // namespace tensorwire
