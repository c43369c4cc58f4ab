#include "tensorwire/core/device.h"

#include <charconv>

namespace tensorwire {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::optional<Device> parse_device(std::string_view s) noexcept {
  auto parse_index = [](std::string_view digits) -> std::optional<int32_t> {
    // Decimal digits only, no sign and no leading zero: one spelling per device.
    if (digits.empty() || digits[0] < '0' || digits[0] > '9' ||
        (digits.size() > 1 && digits[0] == '0'))
      return std::nullopt;
    int32_t v = 0;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc() || p != digits.data() + digits.size() || v < 0) return std::nullopt;
    return v;
  };
  if (s == "cpu" || s == "cpu:0") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.substr(0, 5) == "cuda:") {
    if (auto i = parse_index(s.substr(5))) return Device::cuda(*i);
  }
  return std::nullopt;
}

}  // namespace tensorwire
