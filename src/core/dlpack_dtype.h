// The one DType <-> DLPack (type code, bits) table, and the view over memory someone else
// owns, shared by Tensor::from_dlpack / to_dlpack and the Python binding's array import.
// Private: a C++ user goes through Tensor::from_dlpack / to_dlpack.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "tensorwire/core/error.h"
#include "tensorwire/core/tensor.h"

namespace tensorwire::detail {

struct DLPackType {
  uint8_t code;
  uint8_t bits;
};

// Codes 10 and 12 are DLPack 1.1's float8_e4m3fn and float8_e5m2 (torch exports float8
// with them); DLPack 0.6 has no code for them.
std::optional<DType> dtype_from_dlpack(uint8_t code, uint8_t bits, uint16_t lanes) noexcept;
DLPackType dlpack_type(DType dtype) noexcept;

// A view of `data` (element `strides`, empty: contiguous) whose storage spans exactly the
// bytes the view can reach and runs `release` when the last tensor viewing it goes.
// `release` also runs when the shape is refused (ValueError), so ownership always passes.
Tensor external_view(void* data, Shape shape, Shape strides, DType dtype,
                     std::function<void()> release);

// Why an imported array's dtype cannot be a leaf, and what to store instead: the one
// message for every entry point, the dtype described as the array interface does (numpy's
// dtype.kind: 'O' object, 'U'/'S' text, 'M'/'m' datetimes, 'V' structured, 'f'/'c'
// floating; byte order '>' big-endian; '\0' when unknown). `where` names the value.
TypeError unsupported_dtype(std::string_view where, std::string_view dtype, char kind,
                            char byteorder);

}  // namespace tensorwire::detail
