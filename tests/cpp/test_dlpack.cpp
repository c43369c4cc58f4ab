// DLPack interchange: zero-copy in both directions, each deleter called exactly once.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <numeric>

#include "core/dlpack_dtype.h"
#include "tensorwire/core/tensor.h"

namespace tensorwire {
namespace {

// Wraps a producer's DLManagedTensor so that the test can count deleter calls: the
// wrapper's deleter counts, then hands the original back to its own deleter.
struct CountingWrapper {
  static inline int deletes = 0;

  static DLManagedTensor* wrap(DLManagedTensor* inner) {
    auto* outer = new DLManagedTensor{};
    outer->dl_tensor = inner->dl_tensor;
    outer->manager_ctx = inner;
    outer->deleter = [](DLManagedTensor* self) {
      ++deletes;
      auto* original = static_cast<DLManagedTensor*>(self->manager_ctx);
      original->deleter(original);
      delete self;
    };
    return outer;
  }
};

// A DLPack tensor over memory the test owns (a producer such as numpy).
struct VectorProducer {
  std::vector<float> data;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  static inline int deletes = 0;

  static DLManagedTensor* make(std::vector<float> values, std::vector<int64_t> shape,
                               std::vector<int64_t> strides) {
    auto* p = new VectorProducer{std::move(values), std::move(shape), std::move(strides)};
    auto* m = new DLManagedTensor{};
    m->dl_tensor.data = p->data.data();
    m->dl_tensor.device = {kDLCPU, 0};
    m->dl_tensor.ndim = static_cast<int32_t>(p->shape.size());
    m->dl_tensor.dtype = {kDLFloat, 32, 1};
    m->dl_tensor.shape = p->shape.data();
    m->dl_tensor.strides = p->strides.empty() ? nullptr : p->strides.data();
    m->dl_tensor.byte_offset = 0;
    m->manager_ctx = p;
    m->deleter = [](DLManagedTensor* self) {
      ++deletes;
      delete static_cast<VectorProducer*>(self->manager_ctx);
      delete self;
    };
    return m;
  }
};

Tensor iota_f32(Shape shape) {
  std::vector<float> v(static_cast<size_t>(checked_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_vector(v, std::move(shape));
}

TEST(DLPack, ToDlpackDescribesTheTensorWithoutCopying) {
  Tensor t = iota_f32({3, 4});
  DLManagedTensor* m = t.to_dlpack();
  EXPECT_EQ(m->dl_tensor.data, t.data());
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 32);
  EXPECT_EQ(m->dl_tensor.dtype.lanes, 1);
  EXPECT_EQ(m->dl_tensor.shape[0], 3);
  EXPECT_EQ(m->dl_tensor.shape[1], 4);
  EXPECT_EQ(m->dl_tensor.strides[0], 4);
  EXPECT_EQ(m->dl_tensor.strides[1], 1);
  m->deleter(m);
}

TEST(DLPack, ExportKeepsTheStorageAliveUntilTheDeleterRuns) {
  DLManagedTensor* m;
  long alone;
  {
    Tensor t = iota_f32({4});
    alone = t.storage().use_count();
    m = t.to_dlpack();
    EXPECT_EQ(t.storage().use_count(), alone + 1);
  }
  // The tensor is gone; the exported memory is still valid (ASan would flag it otherwise).
  EXPECT_EQ(static_cast<float*>(m->dl_tensor.data)[3], 3.0f);
  m->deleter(m);
}

TEST(DLPack, RoundTripSharesMemoryAndCallsTheDeleterExactlyOnce) {
  CountingWrapper::deletes = 0;
  Tensor original = iota_f32({3, 4});
  {
    Tensor back = Tensor::from_dlpack(CountingWrapper::wrap(original.to_dlpack()));
    EXPECT_EQ(back.data(), original.data());
    EXPECT_EQ(back.shape(), original.shape());
    EXPECT_EQ(back.dtype(), DType::Float32);
    EXPECT_TRUE(back.equal(original));
    back.at<float>({1, 2}) = -5.0f;  // the same memory
    EXPECT_EQ((original.at<float>({1, 2})), -5.0f);
    Tensor copy = back;  // views share the import; still one deleter call
    EXPECT_EQ(CountingWrapper::deletes, 0);
  }
  EXPECT_EQ(CountingWrapper::deletes, 1);
}

TEST(DLPack, RoundTripOfAStridedViewKeepsItsStrides) {
  CountingWrapper::deletes = 0;
  Tensor base = iota_f32({2, 3});
  Tensor tr = Tensor::view(base.storage(), 0, {3, 2}, DType::Float32, {1, 3});
  {
    Tensor back = Tensor::from_dlpack(CountingWrapper::wrap(tr.to_dlpack()));
    EXPECT_EQ(back.strides(), (Shape{1, 3}));
    EXPECT_TRUE(back.equal(tr));
    EXPECT_EQ((back.at<float>({2, 1})), 5.0f);
  }
  EXPECT_EQ(CountingWrapper::deletes, 1);
}

TEST(DLPack, FromDlpackOfForeignMemoryIsZeroCopyAndReleasesOnce) {
  VectorProducer::deletes = 0;
  DLManagedTensor* m = VectorProducer::make({1, 2, 3, 4, 5, 6}, {2, 3}, {});
  void* memory = m->dl_tensor.data;
  {
    Tensor t = Tensor::from_dlpack(m);
    EXPECT_EQ(t.data(), memory);
    EXPECT_EQ((t.at<float>({1, 2})), 6.0f);
    EXPECT_EQ(t.storage().kind(), Storage::Kind::External);
    EXPECT_EQ(VectorProducer::deletes, 0);
  }
  EXPECT_EQ(VectorProducer::deletes, 1);
}

TEST(DLPack, FromDlpackRejectsNonCpuTensorsAndStillReleasesThem) {
  VectorProducer::deletes = 0;
  DLManagedTensor* m = VectorProducer::make({1, 2}, {2}, {});
  m->dl_tensor.device = {kDLCUDA, 0};
  EXPECT_THROW(Tensor::from_dlpack(m), ValueError);
  EXPECT_EQ(VectorProducer::deletes, 1);
}

TEST(DLPack, FromDlpackRejectsUnsupportedDtypesAndStillReleasesThem) {
  VectorProducer::deletes = 0;
  DLManagedTensor* m = VectorProducer::make({1, 2}, {2}, {});
  m->dl_tensor.dtype = {kDLFloat, 32, 4};  // vector lanes
  EXPECT_THROW(Tensor::from_dlpack(m), TypeError);
  EXPECT_EQ(VectorProducer::deletes, 1);
}

TEST(DLPack, FromDlpackRejectsNegativeDimsAndStillReleasesThem) {
  VectorProducer::deletes = 0;
  DLManagedTensor* m = VectorProducer::make({1, 2}, {2, -1}, {});
  EXPECT_THROW(Tensor::from_dlpack(m), ValueError);
  EXPECT_EQ(VectorProducer::deletes, 1);
}

TEST(DLPack, FromDlpackRejectsNull) {
  EXPECT_THROW(Tensor::from_dlpack(nullptr), ValueError);
}

TEST(DLPack, FromDlpackTakesFloat8ByDlpack11Codes) {
  VectorProducer::deletes = 0;
  DLManagedTensor* m = VectorProducer::make({1, 2}, {8}, {});
  m->dl_tensor.dtype = {10, 8, 1};  // DLPack 1.1's float8_e4m3fn, as torch exports it
  EXPECT_EQ(Tensor::from_dlpack(m).dtype(), DType::Float8E4M3FN);
  EXPECT_EQ(VectorProducer::deletes, 1);
}

TEST(DLPack, ToDlpackRejectsDtypesDlpackCannotName) {
  Tensor t = Tensor::zeros({2}, DType::Float8E4M3FN);
  EXPECT_THROW(t.to_dlpack(), TypeError);
}

// An array of a dtype no leaf holds: the message names the value, the dtype, the supported
// ones and what to store instead, by the array interface's kind and byte order.
TEST(DLPack, AnUnsupportedDtypeSaysWhatToStoreInstead) {
  auto says = [](char kind, char order, const std::string& expected) {
    const std::string m = detail::unsupported_dtype("key 'x'", "dtype('X')", kind, order).what();
    EXPECT_EQ(m.rfind("key 'x': arrays of dtype dtype('X') cannot be stored (supported: bool", 0),
              0u)
        << m;
    EXPECT_NE(m.find("in native byte order); " + expected), std::string::npos) << m;
  };
  says('O', '|', "store text or objects as a non-tensor value");
  says('U', '<', "store text or objects as a non-tensor value");
  says('M', '<', "store datetimes as int64");
  says('V', '|', "store each field of a structured array under its own key");
  says('f', '>', "convert to native byte order");
  says('c', '=', "convert to float64 / complex128");
  says('f', '=', "convert to float64 / complex128");
  says('\0', '\0', "convert to one of the supported dtypes");
}

}  // namespace
}  // namespace tensorwire
