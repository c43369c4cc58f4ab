#include "os/port.h"

namespace tensorwire::os {

std::optional<uint16_t> parse_port(std::string_view text) noexcept {
  if (text.empty()) return std::nullopt;
  uint32_t port = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    port = port * 10 + static_cast<uint32_t>(c - '0');
    if (port > 65535) return std::nullopt;  // checked per digit: never overflows
  }
  return static_cast<uint16_t>(port);
}

}  // namespace tensorwire::os
