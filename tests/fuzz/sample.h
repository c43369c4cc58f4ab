// The TensorDicts the fuzz seeds are made of, shared by the fuzzer (which primes a
// decoder with the sample's schema) and fuzz_make_corpus (which writes the seeds), so a
// seeded Storage message matches the schema the fuzzer's decoder holds.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "tensorwire/tensorwire.h"
#include "wire/message_bytes.h"

namespace tensorwire::fuzz {

// Every piece of a message in one buffer, as a transport would deliver it (the
// transports' own wire::append_encoded, as bytes).
inline std::vector<std::byte> flatten(const wire::OutMessage& m) {
  std::string s;
  wire::append_encoded(m, s);
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// A batch of 2 with a bit of everything: several dtypes, a zero-size leaf, nested dicts,
// non-tensor values, a 1-d and a 2-d NonTensorStack, and dim names. `salt` changes the
// tensor bytes only (same schema).
inline TensorDict sample(int salt = 0) {
  const float s = static_cast<float>(salt);
  TensorDict td({2});
  td.set_names({"env"});
  td.set("obs", Tensor::from_vector<float>({0.5f + s, 1, 2, 3, 4, 5}, {2, 3}));
  td.set("action", Tensor::from_vector<int64_t>({7 + salt, -1}, {2}));
  td.set("mask", Tensor::from_vector<bool>({true, false}, {2, 1}));
  td.set("empty", Tensor::zeros({2, 0}, DType::Float32));
  TensorDict info({2});
  info.set("reward", Tensor::from_vector<double>({1.5 + salt, -0.25}, {2}));
  info.set("done", Tensor::from_vector<uint8_t>({0, 1}, {2, 1}));
  TensorDict deep({2, 2});
  deep.set("h", Tensor::from_vector<int16_t>({1, 2, 3, 4}, {2, 2}));
  deep.set("tag", NonTensor{"inner"});
  info.set("deep", std::move(deep));
  td.set("info", std::move(info));
  td.set("name", NonTensor{"pendulum"});
  td.set("config", NonTensor{Json{{"lr", 0.001}, {"layers", {64, 64}}, {"ok", true}}});
  td.set("labels", NonTensorStack{{2}, 0, {"left", "right"}});
  td.set("grid", NonTensorStack{{2, 2}, 0, {1, "two", nullptr, 4.5}});
  return td;
}

// A non-contiguous leaf (a transpose), sent from a staging copy by the encoder.
inline TensorDict strided_sample() {
  TensorDict td({3});
  Tensor base = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  td.set("t", Tensor::view(base.storage(), 0, {3, 2}, DType::Int32, {1, 3}));
  td.set("x", Tensor::from_vector<float>({1, 2, 3}, {3}));
  return td;
}

}  // namespace tensorwire::fuzz
