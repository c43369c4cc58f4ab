#include "tensorwire/core/tensor.h"

#include "copy_bytes.h"

#include <cstring>
#include <limits>

namespace tensorwire {

std::string shape_str(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t checked_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw ValueError("negative dimension in shape " + shape_str(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw ValueError("shape " + shape_str(shape) + " has more than 2^63 elements");
    n *= d;
  }
  return n;
}

namespace {

__extension__ typedef __int128 i128;  // wide enough that no shape x stride overflows

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    // Only an empty tensor (a 0 dim, counted as 1 here) can push the product past int64;
    // its strides address no element, so saturating is harmless and avoids overflow.
    if (__builtin_mul_overflow(s, shape[i] == 0 ? 1 : shape[i], &s))
      s = std::numeric_limits<int64_t>::max();
  }
  return strides;
}

}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype) {
  int64_t n = checked_numel(shape);
  size_t item = tensorwire::itemsize(dtype);
  if (static_cast<uint64_t>(n) > std::numeric_limits<size_t>::max() / item)
    throw ValueError("shape " + shape_str(shape) + " is too large");
  return view(Storage::allocate(static_cast<size_t>(n) * item), 0, std::move(shape), dtype);
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  if (t.nbytes()) std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::view(Storage storage, size_t offset, Shape shape, DType dtype, Shape strides,
                    Device device) {
  Tensor t;
  t.numel_ = checked_numel(shape);
  if (strides.empty()) {
    strides = contiguous_strides(shape);
  } else if (strides.size() != shape.size()) {
    throw ValueError("view: " + std::to_string(strides.size()) + " strides for shape " +
                     shape_str(shape));
  }
  // The furthest byte the view touches must lie inside the storage (checked in 128-bit
  // arithmetic, so no shape/stride combination can overflow past the check).
  if (t.numel_ > 0 && device.is_cpu()) {
    i128 lo = 0, hi = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      i128 span = static_cast<i128>(shape[i] - 1) * strides[i];
      (span < 0 ? lo : hi) += span;
    }
    i128 item = static_cast<i128>(tensorwire::itemsize(dtype));
    i128 first = static_cast<i128>(offset) + lo * item;
    i128 last = static_cast<i128>(offset) + (hi + 1) * item;
    if (first < 0 || last > static_cast<i128>(storage.nbytes()))
      throw ValueError("view of shape " + shape_str(shape) + " at byte offset " +
                       std::to_string(offset) + " does not fit in a storage of " +
                       std::to_string(storage.nbytes()) + " bytes");
  }
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

bool Tensor::is_contiguous() const noexcept {
  if (numel_ == 0) return true;  // also keeps `expected` below from overflowing
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expected) return numel_ == 0;
    expected *= shape_[i];
  }
  return true;
}

void Tensor::check_dtype(DType expected) const {
  if (dtype_ != expected)
    throw TypeError("tensor has dtype " + std::string(dtype_name(dtype_)) + ", accessed as " +
                    std::string(dtype_name(expected)));
}

std::byte* Tensor::element_ptr(std::initializer_list<int64_t> index) const {
  if (static_cast<int64_t>(index.size()) != dim())
    throw ValueError("index of " + std::to_string(index.size()) + " dims for a tensor of shape " +
                     shape_str(shape_));
  int64_t off = 0;
  size_t d = 0;
  for (int64_t i : index) {
    if (i < 0 || i >= shape_[d])
      throw ValueError("index " + std::to_string(i) + " out of range for dim " + std::to_string(d) +
                       " of shape " + shape_str(shape_));
    off += i * strides_[d++];
  }
  return static_cast<std::byte*>(data()) + off * static_cast<int64_t>(itemsize());
}

void Tensor::copy_to(std::byte* dst) const {
  const size_t item = itemsize();
  if (numel_ == 0) return;
  if (is_contiguous()) {
    detail::copy_bytes(dst, data(), nbytes());
    return;
  }
  // Odometer walk over all but the last dim, copying the last dim row by row.
  const int64_t nd = dim();
  std::vector<int64_t> idx(nd, 0);
  const int64_t inner = shape_[nd - 1];
  const int64_t inner_stride = strides_[nd - 1];
  const std::byte* base = static_cast<const std::byte*>(data());
  while (true) {
    int64_t off = 0;
    for (int64_t d = 0; d < nd - 1; ++d) off += idx[d] * strides_[d];
    const std::byte* src = base + off * static_cast<int64_t>(item);
    if (inner_stride == 1) {
      std::memcpy(dst, src, inner * item);
      dst += inner * item;
    } else {
      for (int64_t j = 0; j < inner; ++j, dst += item)
        std::memcpy(dst, src + j * inner_stride * static_cast<int64_t>(item), item);
    }
    int64_t d = nd - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < shape_[d]) break;
      idx[d] = 0;
    }
    if (d < 0) break;
  }
}

Tensor Tensor::contiguous() const {
  if (is_contiguous() && offset_ % 8 == 0) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  if (!device_.is_cpu()) throw ValueError("clone: only CPU tensors can be copied");
  Tensor out = empty(shape_, dtype_);
  copy_to(static_cast<std::byte*>(out.data()));
  return out;
}

namespace {

// Whether the bytes two tensors' elements span intersect (strides may be negative).
bool spans_overlap(const Tensor& a, const Tensor& b) {
  auto span = [](const Tensor& t) {
    const auto* base = static_cast<const std::byte*>(t.data());
    const auto item = static_cast<int64_t>(t.itemsize());
    int64_t lo = 0, hi = 0;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t reach = (t.shape()[d] - 1) * t.strides()[d];
      (reach < 0 ? lo : hi) += reach;
    }
    return std::pair(base + lo * item, base + (hi + 1) * item);
  };
  const auto [a_lo, a_hi] = span(a);
  const auto [b_lo, b_hi] = span(b);
  return a_lo < b_hi && b_lo < a_hi;
}

}  // namespace

void Tensor::copy_(const Tensor& src) {
  if (src.shape_ != shape_ || src.dtype_ != dtype_)
    throw ValueError("copy_: source " + std::string(dtype_name(src.dtype_)) +
                     shape_str(src.shape_) + " does not match destination " +
                     std::string(dtype_name(dtype_)) + shape_str(shape_));
  if (numel_ == 0) return;
  if (src.data() == data() && src.strides_ == strides_) return;  // the very same elements
  // A source that shares bytes with this tensor (a flipped or transposed view of it) is
  // read whole before anything is written, as torch's copy_ does.
  if (spans_overlap(src, *this)) return copy_(src.clone());
  if (is_contiguous()) {
    src.copy_to(static_cast<std::byte*>(data()));
  } else {
    // Rare (a strided destination): go through a contiguous temporary.
    Tensor tmp = src.contiguous();
    const size_t item = itemsize();
    const std::byte* in = static_cast<const std::byte*>(tmp.data());
    for (int64_t flat = 0; flat < numel_; ++flat, in += item) {
      int64_t rem = flat, off = 0;
      for (int64_t d = dim() - 1; d >= 0; --d) {
        off += (rem % shape_[d]) * strides_[d];
        rem /= shape_[d];
      }
      std::memcpy(static_cast<std::byte*>(data()) + off * static_cast<int64_t>(item), in, item);
    }
  }
}

Tensor Tensor::select(int64_t i) const {
  if (dim() == 0) throw ValueError("select: cannot index a 0-dim tensor");
  if (i < 0) i += shape_[0];
  if (i < 0 || i >= shape_[0])
    throw ValueError("index " + std::to_string(i) + " out of range for shape " + shape_str(shape_));
  Shape shape(shape_.begin() + 1, shape_.end());
  Shape strides(strides_.begin() + 1, strides_.end());
  return view(storage_, offset_ + static_cast<size_t>(i * strides_[0]) * itemsize(),
              std::move(shape), dtype_, std::move(strides), device_);
}

Tensor Tensor::slice(int64_t start, int64_t length, int64_t step) const {
  if (dim() == 0) throw ValueError("slice: cannot slice a 0-dim tensor");
  if (step <= 0) throw ValueError("slice: step must be positive, got " + std::to_string(step));
  if (start < 0 || length < 0 || (length > 0 && start + (length - 1) * step >= shape_[0]))
    throw ValueError("slice: out of range for shape " + shape_str(shape_));
  Shape shape = shape_, strides = strides_;
  shape[0] = length;
  strides[0] *= step;
  const size_t offset =
      offset_ + (length ? static_cast<size_t>(start * strides_[0]) * itemsize() : 0);
  return view(storage_, offset, std::move(shape), dtype_, std::move(strides), device_);
}

bool Tensor::equal(const Tensor& other) const {
  if (shape_ != other.shape_ || dtype_ != other.dtype_) return false;
  if (numel_ == 0) return true;
  Tensor a = contiguous(), b = other.contiguous();
  return std::memcmp(a.data(), b.data(), nbytes()) == 0;
}

}  // namespace tensorwire
