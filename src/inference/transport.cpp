#include "tensorwire/inference/transport.h"

namespace tensorwire::inference {

void Transport::close() {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  close_server(std::string("the ") + kind() + " transport was closed", true);
}

std::vector<Client> Transport::clients(int64_t num_clients) {
  if (num_clients < 1)
    throw ValueError("num_clients must be at least 1, got " + std::to_string(num_clients));
  std::vector<Client> out;
  out.reserve(static_cast<size_t>(num_clients));
  for (int64_t i = 0; i < num_clients; ++i) out.push_back(client());
  return out;
}

void Transport::check_open() const {
  if (closed()) throw ClosedError(std::string("the ") + kind() + " transport was closed");
}

}  // namespace tensorwire::inference
