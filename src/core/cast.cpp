#include "cast.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "tensorwire/core/error.h"

namespace tensorwire::detail {
namespace {

// One element on its way from one dtype to another: integers keep all 64 bits (a double
// would round those above 2^53), floats go through a double (exact for every float type).
struct Num {
  enum Kind { Signed, Unsigned, Real } kind;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
};

bool castable(DType t) {
  return t != DType::Complex64 && t != DType::Complex128 && t != DType::Float8E4M3FN &&
         t != DType::Float8E5M2;
}

// IEEE binary16 and bfloat16 from and to float32, rounding to nearest even as torch does.
float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  const uint32_t bits = exp == 0x1f ? sign | 0x7f800000u | (mant << 13)
                                    : sign | ((exp - 15 + 127) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xffu);
  if (exp == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0));
  const int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // too large: infinity
  auto round = [](uint32_t kept, uint32_t rest, uint32_t halfway) {
    return kept + (rest > halfway || (rest == halfway && (kept & 1u)) ? 1u : 0u);
  };
  if (e <= 0) {  // a subnormal half (or zero): the implicit bit shifted in
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    return static_cast<uint16_t>(
        sign | round(mant >> shift, mant & ((1u << shift) - 1), 1u << (shift - 1)));
  }
  // A carry out of the mantissa moves into the exponent, up to infinity: still right.
  return static_cast<uint16_t>(
      round(sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13), mant & 0x1fffu, 0x1000u));
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40u);  // stays a (quiet) NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

Num read(const std::byte* p, DType t) {
  switch (t) {
    case DType::Bool:
      return {Num::Unsigned, 0, load<uint8_t>(p) != 0 ? 1u : 0u};
    case DType::UInt8:
      return {Num::Unsigned, 0, load<uint8_t>(p)};
    case DType::UInt16:
      return {Num::Unsigned, 0, load<uint16_t>(p)};
    case DType::UInt32:
      return {Num::Unsigned, 0, load<uint32_t>(p)};
    case DType::UInt64:
      return {Num::Unsigned, 0, load<uint64_t>(p)};
    case DType::Int8:
      return {Num::Signed, load<int8_t>(p)};
    case DType::Int16:
      return {Num::Signed, load<int16_t>(p)};
    case DType::Int32:
      return {Num::Signed, load<int32_t>(p)};
    case DType::Int64:
      return {Num::Signed, load<int64_t>(p)};
    case DType::Float16:
      return {Num::Real, 0, 0, half_to_float(load<uint16_t>(p))};
    case DType::BFloat16:
      return {Num::Real, 0, 0, bf16_to_float(load<uint16_t>(p))};
    case DType::Float32:
      return {Num::Real, 0, 0, load<float>(p)};
    case DType::Float64:
      return {Num::Real, 0, 0, load<double>(p)};
    default:
      return {Num::Real};  // not castable: refused before any element is read
  }
}

double as_double(const Num& v) {
  return v.kind == Num::Real     ? v.f
         : v.kind == Num::Signed ? static_cast<double>(v.i)
                                 : static_cast<double>(v.u);
}

float as_float(const Num& v) {
  const double d = as_double(v);
  if (std::isfinite(d) && std::fabs(d) > FLT_MAX)  // out of float's range: an infinity
    return d > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  return static_cast<float>(d);
}

// Integers wrap (modular, as C++20 and torch convert them); a float truncates toward zero
// and must land in T's range.
template <class T>
T as_integer(const Num& v, DType t, const std::string& what) {
  if (v.kind == Num::Signed) return static_cast<T>(v.i);
  if (v.kind == Num::Unsigned) return static_cast<T>(v.u);
  const double x = std::trunc(v.f);
  const double lo =
      std::numeric_limits<T>::is_signed ? -std::ldexp(1.0, std::numeric_limits<T>::digits) : 0.0;
  const double hi = std::ldexp(1.0, std::numeric_limits<T>::digits);  // exclusive
  if (!(x >= lo && x < hi))
    throw ValueError(what + ": the value " + std::to_string(v.f) + " does not fit " +
                     std::string(dtype_name(t)));
  return static_cast<T>(x);
}

void write(std::byte* p, DType t, const Num& v, const std::string& what) {
  switch (t) {
    case DType::Bool:
      store<uint8_t>(p, (v.kind == Num::Real     ? v.f != 0
                         : v.kind == Num::Signed ? v.i != 0
                                                 : v.u != 0));
      return;
    case DType::UInt8:
      return store(p, as_integer<uint8_t>(v, t, what));
    case DType::UInt16:
      return store(p, as_integer<uint16_t>(v, t, what));
    case DType::UInt32:
      return store(p, as_integer<uint32_t>(v, t, what));
    case DType::UInt64:
      return store(p, as_integer<uint64_t>(v, t, what));
    case DType::Int8:
      return store(p, as_integer<int8_t>(v, t, what));
    case DType::Int16:
      return store(p, as_integer<int16_t>(v, t, what));
    case DType::Int32:
      return store(p, as_integer<int32_t>(v, t, what));
    case DType::Int64:
      return store(p, as_integer<int64_t>(v, t, what));
    case DType::Float16:
      return store(p, float_to_half(as_float(v)));
    case DType::BFloat16:
      return store(p, float_to_bf16(as_float(v)));
    case DType::Float32:
      return store(p, as_float(v));
    case DType::Float64:
      return store(p, as_double(v));
    default:
      return;  // not castable: refused before any element is written
  }
}

// `src` viewed as `shape` by numpy's rule: dims aligned from the right, a dim of 1 (or a
// missing leading one) repeated with stride 0.
Tensor broadcast(const Tensor& src, const Shape& shape, const std::string& what) {
  if (src.shape() == shape) return src;
  const size_t lead = shape.size() - std::min(shape.size(), src.shape().size());
  bool fits = src.shape().size() <= shape.size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; fits && i < src.shape().size(); ++i) {
    if (src.shape()[i] == shape[lead + i])
      strides[lead + i] = src.strides()[i];
    else
      fits = src.shape()[i] == 1;
  }
  if (!fits)
    throw ValueError(what + ": a source of shape " + shape_str(src.shape()) +
                     " does not broadcast to the destination's " + shape_str(shape));
  return Tensor::view(src.storage(), src.offset(), shape, src.dtype(), strides, src.device());
}

}  // namespace

Tensor cast_to(const Tensor& src, const Shape& shape, DType dtype, const std::string& what) {
  Tensor b = broadcast(src, shape, what);
  if (src.dtype() == dtype) return b;
  if (!castable(src.dtype()) || !castable(dtype) || !src.device().is_cpu())
    throw ValueError(
        what + ": cannot cast " + std::string(dtype_name(src.dtype())) + " to " +
        std::string(dtype_name(dtype)) +
        (src.device().is_cpu() ? " (complex and float8 casts are not supported)" : " off the CPU"));
  const Tensor in = b.contiguous();
  Tensor out = Tensor::empty(shape, dtype);
  const auto* from = static_cast<const std::byte*>(in.data());
  auto* to = static_cast<std::byte*>(out.data());
  const size_t isz = in.itemsize(), osz = out.itemsize();
  for (int64_t i = 0; i < out.numel(); ++i, from += isz, to += osz)
    write(to, dtype, read(from, in.dtype()), what);
  return out;
}

}  // namespace tensorwire::detail
