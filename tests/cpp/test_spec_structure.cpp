// wire::encode_structure / decode_structure: a fixed-layout transport's spec as its
// structure alone. The client side reads what a server (a remote one: untrusted) sent, so
// every malformed form is refused with a ProtocolError naming its rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tensorwire/core/error.h"
#include "wire/message_bytes.h"

namespace tensorwire::wire {
namespace {

using ::testing::HasSubstr;

TensorDict spec() {
  TensorDict td;
  td.set("obs", Tensor::from_vector<float>({1, 2, 3, 4}, {4}));
  td.set(Key({"info", "mask"}), Tensor::zeros({2, 3}, DType::Bool));
  return td;
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s));
}

std::string refusal(const std::string& text, const Limits& limits = {}) {
  try {
    (void)decode_structure(bytes_of(text), limits);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

TEST(SpecStructure, CarriesKeysDtypesShapesAndNestingButNoValues) {
  const std::string text = encode_structure(spec());
  EXPECT_EQ(text.find("\x01"), std::string::npos);  // JSON alone: no payload bytes
  TensorDict back = decode_structure(bytes_of(text), Limits{});
  EXPECT_FALSE(back.is_locked());
  const Tensor& obs = back.get(Key("obs"));
  EXPECT_EQ(obs.dtype(), DType::Float32);
  EXPECT_EQ(obs.shape(), (Shape{4}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(obs.data<float>()[i], 0.0f);  // zero, not 1..4
  EXPECT_EQ(back.get(Key({"info", "mask"})).shape(), (Shape{2, 3}));
}

TEST(SpecStructure, ALargeSpecCostsItsJsonOnly) {
  TensorDict big;
  big.set("x", Tensor::empty({1 << 26}, DType::UInt8));  // 64 MiB of values never sent
  const std::string text = encode_structure(big);
  EXPECT_LT(text.size(), 1024u);
  EXPECT_EQ(decode_structure(bytes_of(text), Limits{}).get(Key("x")).nbytes(), 1u << 26);
}

TEST(SpecStructure, RefusesMalformedForms) {
  EXPECT_THAT(refusal("[1, 2]"), HasSubstr("expected {\"metadata\": ..., \"bytes\": n}"));
  EXPECT_THAT(refusal("{\"metadata\": {}}"), HasSubstr("expected {\"metadata\""));
  EXPECT_THAT(refusal("{\"metadata\": {}, \"bytes\": -1}"), HasSubstr("expected {\"metadata\""));
  EXPECT_THAT(refusal("{\"metadata\": {}, \"bytes\": 1"), HasSubstr("spec structure"));
  Limits small;
  small.max_message_bytes = 1024;
  EXPECT_THAT(refusal("{\"metadata\": {}, \"bytes\": 2048}", small),
              HasSubstr("a storage of 2048 bytes (at most max_message_bytes, 1024)"));
  // Metadata that does not fit the storage it announces: the layout's own rules.
  Json j = Json::parse(encode_structure(spec()));
  j["bytes"] = 4;
  EXPECT_THAT(refusal(j.dump()), HasSubstr("invalid consolidated metadata"));
}

}  // namespace
}  // namespace tensorwire::wire
