// Little-endian load/store and CRC-32 for the frame header (private to the wire layer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace tensorwire::wire::detail {

template <class T>
inline void store_le(std::byte* p, T v) noexcept {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

template <class T>
inline T load_le(const std::byte* p) noexcept {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// CRC-32 (IEEE 802.3, reflected, as zlib's crc32()).
uint32_t crc32(std::span<const std::byte> bytes) noexcept;

}  // namespace tensorwire::wire::detail
