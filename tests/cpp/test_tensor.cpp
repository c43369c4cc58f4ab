// Tensor: a typed, strided, bounds-checked view into a refcounted Storage.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "tensorwire/core/tensor.h"

namespace tensorwire {
namespace {

using ::testing::HasSubstr;

Tensor iota_f32(Shape shape) {
  std::vector<float> v(static_cast<size_t>(checked_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_vector(v, std::move(shape));
}

TEST(Shape, ShapeStrPrintsLikeAList) {
  EXPECT_EQ(shape_str(Shape{}), "[]");
  EXPECT_EQ(shape_str(Shape{3, 4}), "[3, 4]");
}

TEST(Shape, CheckedNumelMultipliesDims) {
  EXPECT_EQ(checked_numel(Shape{}), 1);
  EXPECT_EQ(checked_numel(Shape{3, 4}), 12);
  EXPECT_EQ(checked_numel(Shape{3, 0, 5}), 0);
}

TEST(Shape, CheckedNumelRejectsNegativeDimsAndOverflow) {
  EXPECT_THROW(checked_numel(Shape{3, -1}), ValueError);
  EXPECT_THROW(checked_numel(Shape{int64_t{1} << 62, int64_t{1} << 62}), ValueError);
  EXPECT_THROW(checked_numel(Shape{int64_t{1} << 32, int64_t{1} << 31}), ValueError);
}

TEST(Tensor, EmptyHasShapeDtypeAndContiguousStrides) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::Float32);
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.dtype(), DType::Float32);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.itemsize(), 4u);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_GE(t.storage().nbytes(), 96u);
}

TEST(Tensor, ZerosIsZeroFilled) {
  Tensor t = Tensor::zeros({5, 3}, DType::Int64);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ((t.at<int64_t>({i, j})), 0);
}

TEST(Tensor, ZeroDimTensorHoldsOneElement) {
  Tensor t = Tensor::from_vector(std::vector<double>{2.5}, {});
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.at<double>({}), 2.5);
}

TEST(Tensor, FromVectorCopiesValuesRowMajor) {
  std::vector<int32_t> v{1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::from_vector(v, {2, 3});
  v[0] = 100;  // the tensor owns a copy
  EXPECT_EQ(t.dtype(), DType::Int32);
  EXPECT_EQ((t.at<int32_t>({0, 0})), 1);
  EXPECT_EQ((t.at<int32_t>({0, 2})), 3);
  EXPECT_EQ((t.at<int32_t>({1, 0})), 4);
  EXPECT_EQ((t.at<int32_t>({1, 2})), 6);
}

TEST(Tensor, FromVectorRejectsAValueCountThatDoesNotFillTheShape) {
  try {
    Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("[2, 2]"));
  }
}

TEST(Tensor, ViewSharesTheStorageAtAByteOffset) {
  Storage s = Storage::allocate(64);
  Tensor t = Tensor::view(s, 16, {4}, DType::Float32);
  EXPECT_TRUE(t.storage().same(s));
  EXPECT_EQ(t.offset(), 16u);
  EXPECT_EQ(t.data(), s.data() + 16);
  t.at<float>({2}) = 7.0f;
  float x;
  std::memcpy(&x, s.data() + 16 + 8, 4);
  EXPECT_EQ(x, 7.0f);
}

TEST(Tensor, ViewThatEndsExactlyAtTheStorageEndIsAllowed) {
  Storage s = Storage::allocate(48);
  EXPECT_NO_THROW(Tensor::view(s, 0, {3, 4}, DType::Float32));
  EXPECT_NO_THROW(Tensor::view(s, 44, {1}, DType::Float32));
}

TEST(Tensor, ViewPastTheStorageThrowsValueError) {
  Storage s = Storage::allocate(48);
  EXPECT_THROW(Tensor::view(s, 0, {13}, DType::Float32), ValueError);
  EXPECT_THROW(Tensor::view(s, 4, {3, 4}, DType::Float32), ValueError);
  EXPECT_THROW(Tensor::view(s, 48, {1}, DType::UInt8), ValueError);
  EXPECT_THROW(Tensor::view(s, 0, {7}, DType::Float64), ValueError);
  try {
    Tensor::view(s, 8, {12}, DType::Float32);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("48 bytes"));
  }
}

TEST(Tensor, ViewWithStridesIsBoundsCheckedAgainstTheFurthestElement) {
  Storage s = Storage::allocate(40);                              // 10 floats
  EXPECT_NO_THROW(Tensor::view(s, 0, {5}, DType::Float32, {2}));  // last element at float 8
  EXPECT_THROW(Tensor::view(s, 0, {6}, DType::Float32, {2}), ValueError);
  EXPECT_THROW(Tensor::view(s, 0, {2, 2}, DType::Float32, {int64_t{1} << 62, 1}), ValueError);
}

TEST(Tensor, ViewWithNegativeStrideMustNotReachBeforeTheStorage) {
  Storage s = Storage::allocate(16);  // 4 floats
  EXPECT_NO_THROW(Tensor::view(s, 12, {4}, DType::Float32, {-1}));
  EXPECT_THROW(Tensor::view(s, 8, {4}, DType::Float32, {-1}), ValueError);
}

TEST(Tensor, ViewRejectsStridesOfTheWrongLength) {
  Storage s = Storage::allocate(64);
  EXPECT_THROW(Tensor::view(s, 0, {2, 2}, DType::Float32, {1}), ValueError);
}

TEST(Tensor, ViewRejectsNegativeDims) {
  Storage s = Storage::allocate(64);
  EXPECT_THROW(Tensor::view(s, 0, {-2}, DType::Float32), ValueError);
}

TEST(Tensor, EmptyViewNeedsNoBytes) {
  Storage s = Storage::allocate(0);
  Tensor t = Tensor::view(s, 0, {0, 5}, DType::Float32);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
}

TEST(Tensor, StridedViewIsNotContiguous) {
  Tensor base = iota_f32({2, 3});
  // The transpose of a [2, 3] matrix: shape [3, 2], strides [1, 3].
  Tensor tr = Tensor::view(base.storage(), 0, {3, 2}, DType::Float32, {1, 3});
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ((tr.at<float>({0, 1})), 3.0f);
  EXPECT_EQ((tr.at<float>({2, 0})), 2.0f);
}

TEST(Tensor, DimsOfSizeOneDoNotBreakContiguity) {
  Storage s = Storage::allocate(64);
  Tensor t = Tensor::view(s, 0, {1, 4}, DType::Float32, {99, 1});
  EXPECT_TRUE(t.is_contiguous());
}

TEST(Tensor, ContiguousOfAContiguousTensorIsTheSameView) {
  Tensor t = iota_f32({3, 4});
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.storage().same(t.storage()));
  EXPECT_EQ(c.data(), t.data());
}

TEST(Tensor, ContiguousOfAStridedTensorCopiesInRowMajorOrder) {
  Tensor base = iota_f32({2, 3});
  Tensor tr = Tensor::view(base.storage(), 0, {3, 2}, DType::Float32, {1, 3});
  Tensor c = tr.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.storage().same(base.storage()));
  const float* p = c.data<float>();
  EXPECT_EQ(std::vector<float>(p, p + 6), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, CloneAlwaysCopiesIntoNewStorage) {
  Tensor t = iota_f32({4});
  Tensor c = t.clone();
  EXPECT_FALSE(c.storage().same(t.storage()));
  EXPECT_TRUE(c.equal(t));
  c.at<float>({0}) = 42.0f;
  EXPECT_EQ(t.at<float>({0}), 0.0f);
}

TEST(Tensor, CopyWritesSourceValuesIntoTheDestinationMemory) {
  Tensor dst = Tensor::zeros({2, 3}, DType::Float32);
  void* before = dst.data();
  dst.copy_(iota_f32({2, 3}));
  EXPECT_EQ(dst.data(), before);
  EXPECT_TRUE(dst.equal(iota_f32({2, 3})));
}

TEST(Tensor, CopyFromAStridedSource) {
  Tensor base = iota_f32({2, 3});
  Tensor tr = Tensor::view(base.storage(), 0, {3, 2}, DType::Float32, {1, 3});
  Tensor dst = Tensor::zeros({3, 2}, DType::Float32);
  dst.copy_(tr);
  EXPECT_TRUE(dst.equal(tr));
  EXPECT_EQ((dst.at<float>({1, 1})), 4.0f);
}

TEST(Tensor, CopyIntoAStridedDestination) {
  Tensor base = Tensor::zeros({2, 3}, DType::Float32);
  Tensor tr = Tensor::view(base.storage(), 0, {3, 2}, DType::Float32, {1, 3});
  tr.copy_(Tensor::from_vector(std::vector<float>{0, 3, 1, 4, 2, 5}, {3, 2}));
  EXPECT_TRUE(base.equal(iota_f32({2, 3})));
}

// A source sharing bytes with the destination (a flipped, transposed or shifted view of
// it) is read whole before anything is written, as torch's copy_ does (before: a flip gave
// [7 6 5 4 4 5 6 7], a transpose of a square matrix was skipped, a shift was an
// overlapping memcpy).
TEST(Tensor, CopyFromAViewOfTheDestinationItselfReadsItWholeFirst) {
  Tensor a = iota_f32({8});
  a.copy_(Tensor::view(a.storage(), 7 * sizeof(float), {8}, DType::Float32, {-1}));
  EXPECT_TRUE(a.equal(Tensor::from_vector(std::vector<float>{7, 6, 5, 4, 3, 2, 1, 0}, {8})));

  Tensor m = iota_f32({3, 3});
  m.copy_(Tensor::view(m.storage(), 0, {3, 3}, DType::Float32, {1, 3}));
  EXPECT_TRUE(m.equal(Tensor::from_vector(std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8}, {3, 3})));

  Tensor base = iota_f32({10});
  Tensor head = Tensor::view(base.storage(), 0, {8}, DType::Float32);
  Tensor tail = Tensor::view(base.storage(), sizeof(float), {8}, DType::Float32);
  tail.copy_(head);
  EXPECT_TRUE(
      base.equal(Tensor::from_vector(std::vector<float>{0, 0, 1, 2, 3, 4, 5, 6, 7, 9}, {10})));

  Tensor same = iota_f32({4});
  same.copy_(same);  // the very same elements: nothing to do
  EXPECT_TRUE(same.equal(iota_f32({4})));
}

TEST(Tensor, CopyRejectsAShapeOrDtypeMismatch) {
  Tensor dst = Tensor::zeros({2, 3}, DType::Float32);
  EXPECT_THROW(dst.copy_(iota_f32({3, 2})), ValueError);
  EXPECT_THROW(dst.copy_(Tensor::zeros({2, 3}, DType::Float64)), ValueError);
}

TEST(Tensor, CopyToWritesRowMajorBytes) {
  Tensor base = iota_f32({2, 3});
  Tensor tr = Tensor::view(base.storage(), 0, {3, 2}, DType::Float32, {1, 3});
  std::vector<float> out(6);
  tr.copy_to(reinterpret_cast<std::byte*>(out.data()));
  EXPECT_EQ(out, (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, SelectIndexesDimZeroAsAView) {
  Tensor t = iota_f32({3, 4});
  Tensor row = t.select(1);
  EXPECT_EQ(row.shape(), (Shape{4}));
  EXPECT_TRUE(row.storage().same(t.storage()));
  EXPECT_EQ(row.at<float>({0}), 4.0f);
  row.at<float>({0}) = -1.0f;
  EXPECT_EQ((t.at<float>({1, 0})), -1.0f);
}

TEST(Tensor, SelectCountsNegativeIndicesFromTheEnd) {
  Tensor t = iota_f32({3, 4});
  EXPECT_EQ(t.select(-1).at<float>({0}), 8.0f);
}

TEST(Tensor, SelectRejectsOutOfRangeIndicesAndZeroDimTensors) {
  Tensor t = iota_f32({3, 4});
  EXPECT_THROW(t.select(3), ValueError);
  EXPECT_THROW(t.select(-4), ValueError);
  EXPECT_THROW(Tensor::zeros({}, DType::Float32).select(0), ValueError);
}

TEST(Tensor, AtChecksDtypeIndexCountAndBounds) {
  Tensor t = iota_f32({3, 4});
  EXPECT_EQ((t.at<float>({2, 3})), 11.0f);
  EXPECT_THROW((t.at<double>({0, 0})), TypeError);
  EXPECT_THROW((t.at<float>({0})), ValueError);
  EXPECT_THROW((t.at<float>({3, 0})), ValueError);
  EXPECT_THROW((t.at<float>({0, -1})), ValueError);
}

TEST(Tensor, TypedDataChecksDtype) {
  Tensor t = iota_f32({2});
  EXPECT_NO_THROW(t.data<float>());
  EXPECT_THROW(t.data<int32_t>(), TypeError);
}

TEST(Tensor, EqualComparesShapeDtypeAndValues) {
  EXPECT_TRUE(iota_f32({3, 4}).equal(iota_f32({3, 4})));
  EXPECT_FALSE(iota_f32({3, 4}).equal(iota_f32({4, 3})));
  EXPECT_FALSE(iota_f32({4}).equal(Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3}, {4})));
  Tensor other = iota_f32({3, 4});
  other.at<float>({2, 2}) = 0.5f;
  EXPECT_FALSE(iota_f32({3, 4}).equal(other));
}

TEST(Tensor, EqualComparesStridedTensorsByValue) {
  Tensor base = iota_f32({2, 3});
  Tensor tr = Tensor::view(base.storage(), 0, {3, 2}, DType::Float32, {1, 3});
  EXPECT_TRUE(tr.equal(Tensor::from_vector(std::vector<float>{0, 3, 1, 4, 2, 5}, {3, 2})));
}

TEST(Tensor, CopiesShareStorage) {
  Tensor t = iota_f32({4});
  long before = t.storage().use_count();
  {
    Tensor u = t;
    EXPECT_EQ(t.storage().use_count(), before + 1);
    u.at<float>({1}) = 9.0f;
  }
  EXPECT_EQ(t.at<float>({1}), 9.0f);
  EXPECT_EQ(t.storage().use_count(), before);
}

TEST(Storage, ExternalDeleterRunsOnceWhenTheLastReferenceGoes) {
  int calls = 0;
  std::vector<float> memory(4);
  {
    Storage s = Storage::external(memory.data(), 16, [&] { ++calls; });
    Tensor t = Tensor::view(s, 0, {4}, DType::Float32);
    EXPECT_EQ(s.kind(), Storage::Kind::External);
    s = Storage();
    EXPECT_EQ(calls, 0);
  }
  EXPECT_EQ(calls, 1);
}

TEST(Storage, AllocateRejectsBadAlignment) {
  EXPECT_THROW(Storage::allocate(16, 3), ValueError);
  EXPECT_THROW(Storage::allocate(16, 4), ValueError);
  Storage s = Storage::allocate(100, 256);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 256, 0u);
  EXPECT_EQ(s.nbytes(), 100u);
}

}  // namespace
}  // namespace tensorwire
