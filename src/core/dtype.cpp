#include "tensorwire/core/dtype.h"

#include <array>

namespace tensorwire {
namespace {

struct Info {
  std::string_view name;
  size_t size;
};

// Indexed by DType; order must match the enum.
constexpr std::array<Info, kNumDTypes> kInfo = {{
    {"torch.bool", 1},
    {"torch.uint8", 1},
    {"torch.uint16", 2},
    {"torch.uint32", 4},
    {"torch.uint64", 8},
    {"torch.int8", 1},
    {"torch.int16", 2},
    {"torch.int32", 4},
    {"torch.int64", 8},
    {"torch.float16", 2},
    {"torch.bfloat16", 2},
    {"torch.float32", 4},
    {"torch.float64", 8},
    {"torch.complex64", 8},
    {"torch.complex128", 16},
    {"torch.float8_e4m3fn", 1},
    {"torch.float8_e5m2", 1},
}};

}  // namespace

size_t itemsize(DType dtype) noexcept {
  return kInfo[static_cast<size_t>(dtype)].size;
}

std::string_view dtype_name(DType dtype) noexcept {
  return kInfo[static_cast<size_t>(dtype)].name;
}

std::optional<DType> parse_dtype(std::string_view name) noexcept {
  for (size_t i = 0; i < kInfo.size(); ++i)
    if (kInfo[i].name == name) return static_cast<DType>(i);
  // torch also prints these aliases in some versions.
  if (name == "torch.float") return DType::Float32;
  if (name == "torch.double") return DType::Float64;
  if (name == "torch.half") return DType::Float16;
  if (name == "torch.long") return DType::Int64;
  if (name == "torch.int") return DType::Int32;
  return std::nullopt;
}

}  // namespace tensorwire
