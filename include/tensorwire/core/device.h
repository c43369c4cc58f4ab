// Where a tensor's bytes live. Only the CPU is implemented; cuda:N is representable so
// that metadata written by a GPU peer round-trips and can be rejected with a clear error.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tensorwire {

struct Device {
  enum class Type : uint8_t { CPU, CUDA };
  Type type = Type::CPU;
  int32_t index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int32_t index) { return {Type::CUDA, index}; }

  bool is_cpu() const { return type == Type::CPU; }
  std::string str() const;  // "cpu", "cuda:0"
  friend bool operator==(const Device&, const Device&) = default;
};

// Parses "cpu", "cpu:0", "cuda", "cuda:N"; std::nullopt for anything else (never throws).
std::optional<Device> parse_device(std::string_view s) noexcept;

}  // namespace tensorwire
