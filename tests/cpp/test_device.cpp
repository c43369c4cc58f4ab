// Device: string form and parsing.
#include <gtest/gtest.h>

#include "tensorwire/core/device.h"

namespace tensorwire {
namespace {

TEST(Device, DefaultIsCpu) {
  Device d;
  EXPECT_TRUE(d.is_cpu());
  EXPECT_EQ(d, Device::cpu());
}

TEST(Device, StrSpellsCpuAndCudaWithIndex) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(0).str(), "cuda:0");
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
}

TEST(Device, ParseDeviceAcceptsCpuAndCudaSpellings) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cpu:0"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:0"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:7"), Device::cuda(7));
}

TEST(Device, ParseDeviceRoundTripsStr) {
  for (Device d : {Device::cpu(), Device::cuda(0), Device::cuda(12)})
    EXPECT_EQ(parse_device(d.str()), d);
}

TEST(Device, ParseDeviceReturnsNulloptForAnythingElse) {
  EXPECT_EQ(parse_device(""), std::nullopt);
  EXPECT_EQ(parse_device("gpu"), std::nullopt);
  EXPECT_EQ(parse_device("cpu:1"), std::nullopt);
  EXPECT_EQ(parse_device("cuda:"), std::nullopt);
  EXPECT_EQ(parse_device("cuda:-1"), std::nullopt);
  EXPECT_EQ(parse_device("cuda:1x"), std::nullopt);
  EXPECT_EQ(parse_device("cuda:99999999999999999999"), std::nullopt);
  EXPECT_EQ(parse_device("mps"), std::nullopt);
}

TEST(Device, CudaIndexIsDecimalDigitsWithoutSignOrLeadingZero) {
  EXPECT_EQ(parse_device("cuda:10"), Device::cuda(10));
  EXPECT_EQ(parse_device("cuda:2147483647"), Device::cuda(2147483647));
  for (const char* s : {"cuda:", "cuda:-0", "cuda:+1", "cuda:01", "cuda:00", "cuda: 1", "cuda:1 ",
                        "cuda:2147483648", "cuda:0x1", "cpu:1", "CUDA:0"})
    EXPECT_EQ(parse_device(s), std::nullopt) << s;
}

}  // namespace
}  // namespace tensorwire
