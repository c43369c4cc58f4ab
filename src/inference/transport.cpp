#include "tensorwire/inference/transport.h"

namespace tensorwire::inference {

void Transport::close() {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  close_server(std::string("the ") + kind() + " transport was closed", true);
}

void Transport::check_open() const {
  if (closed()) throw ClosedError(std::string("the ") + kind() + " transport was closed");
}

}  // namespace tensorwire::inference
