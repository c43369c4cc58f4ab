// DType: torch spellings, element sizes, and parsing of untrusted names.
#include <gtest/gtest.h>

#include "tensorwire/core/dtype.h"

namespace tensorwire {
namespace {

TEST(DType, NamesAreSpelledTheWayTorchPrintsThem) {
  EXPECT_EQ(dtype_name(DType::Bool), "torch.bool");
  EXPECT_EQ(dtype_name(DType::UInt8), "torch.uint8");
  EXPECT_EQ(dtype_name(DType::Int64), "torch.int64");
  EXPECT_EQ(dtype_name(DType::Float16), "torch.float16");
  EXPECT_EQ(dtype_name(DType::BFloat16), "torch.bfloat16");
  EXPECT_EQ(dtype_name(DType::Float32), "torch.float32");
  EXPECT_EQ(dtype_name(DType::Float64), "torch.float64");
  EXPECT_EQ(dtype_name(DType::Complex64), "torch.complex64");
  EXPECT_EQ(dtype_name(DType::Float8E4M3FN), "torch.float8_e4m3fn");
  EXPECT_EQ(dtype_name(DType::Float8E5M2), "torch.float8_e5m2");
}

TEST(DType, ItemsizeIsTheElementSizeInBytes) {
  EXPECT_EQ(itemsize(DType::Bool), 1u);
  EXPECT_EQ(itemsize(DType::Int8), 1u);
  EXPECT_EQ(itemsize(DType::UInt16), 2u);
  EXPECT_EQ(itemsize(DType::Float16), 2u);
  EXPECT_EQ(itemsize(DType::BFloat16), 2u);
  EXPECT_EQ(itemsize(DType::Int32), 4u);
  EXPECT_EQ(itemsize(DType::Float32), 4u);
  EXPECT_EQ(itemsize(DType::Int64), 8u);
  EXPECT_EQ(itemsize(DType::Float64), 8u);
  EXPECT_EQ(itemsize(DType::Complex64), 8u);
  EXPECT_EQ(itemsize(DType::Complex128), 16u);
  EXPECT_EQ(itemsize(DType::Float8E5M2), 1u);
}

TEST(DType, ParseDtypeIsTheInverseOfDtypeNameForEveryDtype) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto dtype = static_cast<DType>(i);
    auto parsed = parse_dtype(dtype_name(dtype));
    ASSERT_TRUE(parsed.has_value()) << dtype_name(dtype);
    EXPECT_EQ(*parsed, dtype);
  }
}

TEST(DType, ParseDtypeAcceptsTorchAliases) {
  EXPECT_EQ(parse_dtype("torch.float"), DType::Float32);
  EXPECT_EQ(parse_dtype("torch.double"), DType::Float64);
  EXPECT_EQ(parse_dtype("torch.half"), DType::Float16);
  EXPECT_EQ(parse_dtype("torch.long"), DType::Int64);
  EXPECT_EQ(parse_dtype("torch.int"), DType::Int32);
}

TEST(DType, ParseDtypeReturnsNulloptForUnknownNames) {
  EXPECT_EQ(parse_dtype("torch.float128"), std::nullopt);
  EXPECT_EQ(parse_dtype("float32"), std::nullopt);  // numpy spelling, not torch's
  EXPECT_EQ(parse_dtype("TORCH.FLOAT32"), std::nullopt);
  EXPECT_EQ(parse_dtype(""), std::nullopt);
  EXPECT_EQ(parse_dtype(std::string_view("torch.float32\0", 14)), std::nullopt);
}

TEST(DType, DtypeOfMapsCppTypesToDtypes) {
  static_assert(dtype_of<float>::value == DType::Float32);
  static_assert(dtype_of<double>::value == DType::Float64);
  static_assert(dtype_of<bool>::value == DType::Bool);
  static_assert(dtype_of<int64_t>::value == DType::Int64);
  static_assert(dtype_of<uint8_t>::value == DType::UInt8);
  SUCCEED();
}

}  // namespace
}  // namespace tensorwire
