// Element types, spelled the way torch spells them in tensordict metadata.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tensorwire {

enum class DType : uint8_t {
  Bool,
  UInt8,
  UInt16,
  UInt32,
  UInt64,
  Int8,
  Int16,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Complex64,
  Complex128,
  Float8E4M3FN,
  Float8E5M2,
};

inline constexpr int kNumDTypes = 17;

// Size of one element in bytes.
size_t itemsize(DType dtype) noexcept;

// "torch.float32" etc.
std::string_view dtype_name(DType dtype) noexcept;

// Inverse of dtype_name(); std::nullopt for a name tensorwire does not know.
// Untrusted input goes through here, so it never throws.
std::optional<DType> parse_dtype(std::string_view name) noexcept;

// C++ type -> DType, for typed element access.
template <class T>
struct dtype_of;
#define TENSORWIRE_DTYPE_OF(T, D)            \
  template <>                                \
  struct dtype_of<T> {                       \
    static constexpr DType value = DType::D; \
  }
TENSORWIRE_DTYPE_OF(bool, Bool);
TENSORWIRE_DTYPE_OF(uint8_t, UInt8);
TENSORWIRE_DTYPE_OF(uint16_t, UInt16);
TENSORWIRE_DTYPE_OF(uint32_t, UInt32);
TENSORWIRE_DTYPE_OF(uint64_t, UInt64);
TENSORWIRE_DTYPE_OF(int8_t, Int8);
TENSORWIRE_DTYPE_OF(int16_t, Int16);
TENSORWIRE_DTYPE_OF(int32_t, Int32);
TENSORWIRE_DTYPE_OF(int64_t, Int64);
TENSORWIRE_DTYPE_OF(float, Float32);
TENSORWIRE_DTYPE_OF(double, Float64);
#undef TENSORWIRE_DTYPE_OF

}  // namespace tensorwire
