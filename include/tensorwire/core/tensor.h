// Tensor: a typed, strided view into a Storage.
//
// Copying a Tensor copies the view, not the bytes (like torch.Tensor). clone() and
// contiguous() make new storage. All sizes are checked for overflow on construction so
// that a Tensor never describes bytes outside its storage.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "tensorwire/core/device.h"
#include "tensorwire/core/dtype.h"
#include "tensorwire/core/error.h"
#include "tensorwire/core/storage.h"

struct DLManagedTensor;

namespace tensorwire {

using Shape = std::vector<int64_t>;

std::string shape_str(std::span<const int64_t> shape);  // "[3, 4]"

// Product of dims; throws ValueError on a negative dim or overflow past 2^63.
int64_t checked_numel(std::span<const int64_t> shape);

class Tensor {
 public:
  Tensor() = default;

  // New contiguous tensor on fresh (uninitialised) storage; zeros() zero-fills.
  static Tensor empty(Shape shape, DType dtype);
  static Tensor zeros(Shape shape, DType dtype);

  // A view into existing storage. `offset` is in bytes; `strides` in elements
  // (empty = contiguous). Throws ValueError when the view would leave the storage.
  static Tensor view(Storage storage, size_t offset, Shape shape, DType dtype, Shape strides = {},
                     Device device = Device::cpu());

  // Copies `values` into a new tensor of the given shape (numel must match).
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape);

  // Zero-copy import of a DLPack tensor; takes ownership (calls its deleter when done).
  static Tensor from_dlpack(DLManagedTensor* managed);
  // Zero-copy export; the returned tensor keeps this one's storage alive.
  DLManagedTensor* to_dlpack() const;

  // False for a default-constructed or moved-from Tensor: no storage and no shape. Anything
  // made by empty(), view() or from_dlpack() has storage, or dims (a zero-size tensor needs
  // no storage; a 0-dim one holds an element).
  bool defined() const noexcept { return storage_.defined() || !shape_.empty(); }
  const Storage& storage() const noexcept { return storage_; }
  size_t offset() const noexcept { return offset_; }
  const Shape& shape() const noexcept { return shape_; }
  const Shape& strides() const noexcept { return strides_; }
  DType dtype() const noexcept { return dtype_; }
  const Device& device() const noexcept { return device_; }
  int64_t dim() const noexcept { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const noexcept { return numel_; }
  size_t itemsize() const noexcept { return tensorwire::itemsize(dtype_); }
  size_t nbytes() const noexcept { return static_cast<size_t>(numel_) * itemsize(); }
  bool is_contiguous() const noexcept;

  void* data() const noexcept { return storage_.data() + offset_; }
  template <class T>
  T* data() const {
    check_dtype(dtype_of<T>::value);
    return reinterpret_cast<T*>(data());
  }
  // Element at a full index (bounds-checked).
  template <class T>
  T& at(std::initializer_list<int64_t> index) const {
    check_dtype(dtype_of<T>::value);
    return *reinterpret_cast<T*>(element_ptr(index));
  }

  Tensor contiguous() const;  // this, when already contiguous
  Tensor clone() const;       // always new contiguous storage
  // Copies `src` into this tensor's memory; shapes and dtypes must match.
  void copy_(const Tensor& src);
  // Copies this tensor's elements, in row-major order, into a contiguous destination.
  void copy_to(std::byte* dst) const;

  Tensor select(int64_t i) const;  // index along dim 0 (negative counts from the end)
  // Elements start, start + step, ... (`length` of them) along dim 0, as a view; start and
  // length already within range (Python's slice.indices()), step > 0.
  Tensor slice(int64_t start, int64_t length, int64_t step) const;
  // Same bytes, byte-for-byte equal contents (shape, dtype and values).
  bool equal(const Tensor& other) const;

 private:
  void check_dtype(DType expected) const;
  std::byte* element_ptr(std::initializer_list<int64_t> index) const;

  Storage storage_;
  size_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  int64_t numel_ = 0;
  DType dtype_ = DType::Float32;
  Device device_;
};

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  Tensor t = empty(std::move(shape), dtype_of<T>::value);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw ValueError("from_vector: " + std::to_string(values.size()) +
                     " values do not fill shape " + shape_str(t.shape()));
  T* out = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return t;
}

}  // namespace tensorwire
