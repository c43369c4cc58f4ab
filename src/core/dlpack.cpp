// Zero-copy DLPack import/export (DLPack 0.6 ABI, as shipped by Debian's libdlpack-dev and
// spoken by numpy and torch).
#include <dlpack/dlpack.h>

#include "dlpack_dtype.h"

namespace tensorwire {

namespace detail {

namespace {

// DLPack 0.6 predates the bool code; numpy and torch use 6 (kDLBool in later versions).
constexpr uint8_t kDLBoolCode = 6;

struct DTypeCode {
  DType dtype;
  DLPackType type;
};

constexpr DTypeCode kCodes[] = {
    {DType::Bool, {kDLBoolCode, 8}},        {DType::UInt8, {kDLUInt, 8}},
    {DType::UInt16, {kDLUInt, 16}},         {DType::UInt32, {kDLUInt, 32}},
    {DType::UInt64, {kDLUInt, 64}},         {DType::Int8, {kDLInt, 8}},
    {DType::Int16, {kDLInt, 16}},           {DType::Int32, {kDLInt, 32}},
    {DType::Int64, {kDLInt, 64}},           {DType::Float16, {kDLFloat, 16}},
    {DType::BFloat16, {kDLBfloat, 16}},     {DType::Float32, {kDLFloat, 32}},
    {DType::Float64, {kDLFloat, 64}},       {DType::Complex64, {kDLComplex, 64}},
    {DType::Complex128, {kDLComplex, 128}}, {DType::Float8E4M3FN, {10, 8}},
    {DType::Float8E5M2, {12, 8}},
};

}  // namespace

std::optional<DType> dtype_from_dlpack(uint8_t code, uint8_t bits, uint16_t lanes) noexcept {
  if (lanes != 1) return std::nullopt;
  for (const auto& c : kCodes)
    if (c.type.code == code && c.type.bits == bits) return c.dtype;
  return std::nullopt;
}

DLPackType dlpack_type(DType dtype) noexcept {
  for (const auto& c : kCodes)
    if (c.dtype == dtype) return c.type;
  return {kDLUInt, 8};  // unreachable: every DType is in the table
}

Tensor external_view(void* data, Shape shape, Shape strides, DType dtype,
                     std::function<void()> release) {
  int64_t numel;
  try {
    numel = checked_numel(shape);
  } catch (...) {
    release();  // ownership was taken: a rejected tensor is released too
    throw;
  }
  // The storage covers exactly the bytes the view can reach.
  int64_t lo = 0, hi = 0;
  if (numel > 0) {
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t span = (shape[i] - 1) * (strides.empty() ? 0 : strides[i]);
      (span < 0 ? lo : hi) += span;
    }
    if (strides.empty()) hi = numel - 1;
  }
  const auto item = static_cast<int64_t>(itemsize(dtype));
  std::byte* base = static_cast<std::byte*>(data) + lo * item;
  size_t nbytes = numel > 0 ? static_cast<size_t>((hi - lo + 1) * item) : 0;
  Storage storage = Storage::external(base, nbytes, std::move(release), Storage::Kind::External);
  return Tensor::view(std::move(storage), static_cast<size_t>(-lo * item), std::move(shape), dtype,
                      std::move(strides));
}

TypeError unsupported_dtype(std::string_view where, std::string_view dtype, char kind,
                            char byteorder) {
  std::string instead;
  if (kind == 'O' || kind == 'U' || kind == 'S')
    instead = "store text or objects as a non-tensor value: a str, or a list (arr.tolist())";
  else if (kind == 'M' || kind == 'm')
    instead = "store datetimes as int64 (arr.view('int64'))";
  else if (kind == 'V')
    instead = "store each field of a structured array under its own key";
  else if (byteorder == '>')
    instead = "convert to native byte order (arr.astype(arr.dtype.newbyteorder('=')))";
  else if (kind == 'f' || kind == 'c')
    instead = "convert to float64 / complex128";
  else
    instead = "convert to one of the supported dtypes";
  return TypeError(std::string(where) + ": arrays of dtype " + std::string(dtype) +
                   " cannot be stored (supported: bool, int8-int64, uint8-uint64, float16, "
                   "bfloat16, float32, float64, complex64, complex128, float8_e4m3fn, "
                   "float8_e5m2, in native byte order); " +
                   instead);
}

}  // namespace detail

namespace {

// Export keeps the Tensor (and so its storage) alive in the manager context.
struct ExportCtx {
  Tensor tensor;
  Shape shape;
  Shape strides;
};

bool is_float8(DType t) {
  return t == DType::Float8E4M3FN || t == DType::Float8E5M2;
}

}  // namespace

Tensor Tensor::from_dlpack(DLManagedTensor* managed) {
  if (!managed) throw ValueError("from_dlpack: null tensor");
  const DLTensor& t = managed->dl_tensor;
  auto release = [managed] {
    if (managed->deleter) managed->deleter(managed);
  };
  // Error messages are built before release(): the deleter frees `t`.
  if (t.device.device_type != kDLCPU) {
    ValueError error("from_dlpack: only CPU tensors are supported (device type " +
                     std::to_string(t.device.device_type) + ")");
    release();
    throw error;
  }
  std::optional<DType> dtype = detail::dtype_from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes);
  if (!dtype) {
    TypeError error("from_dlpack: unsupported dtype (code " + std::to_string(t.dtype.code) +
                    ", bits " + std::to_string(t.dtype.bits) + ")");
    release();
    throw error;
  }
  return detail::external_view(
      static_cast<std::byte*>(t.data) + t.byte_offset, Shape(t.shape, t.shape + t.ndim),
      t.strides ? Shape(t.strides, t.strides + t.ndim) : Shape{}, *dtype, release);
}

DLManagedTensor* Tensor::to_dlpack() const {
  if (is_float8(dtype_))
    throw TypeError("to_dlpack: DLPack 0.6 has no code for " + std::string(dtype_name(dtype_)));
  const detail::DLPackType code = detail::dlpack_type(dtype_);
  auto* ctx = new ExportCtx{*this, shape_, strides_};
  auto* m = new DLManagedTensor{};
  m->dl_tensor.data = data();
  m->dl_tensor.device = {kDLCPU, 0};
  m->dl_tensor.ndim = static_cast<int32_t>(shape_.size());
  m->dl_tensor.dtype = {code.code, code.bits, 1};
  m->dl_tensor.shape = ctx->shape.data();
  m->dl_tensor.strides = ctx->strides.data();
  m->dl_tensor.byte_offset = 0;
  m->manager_ctx = ctx;
  m->deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportCtx*>(self->manager_ctx);
    delete self;
  };
  return m;
}

}  // namespace tensorwire
