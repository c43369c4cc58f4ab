// Encoder + Decoder: what goes on the wire for each TensorDict, and what a receiver accepts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <numeric>

#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"

namespace tensorwire::wire {

// Failure messages print "storage" rather than a raw byte.
inline void PrintTo(MessageKind kind, std::ostream* os) {
  *os << kind_name(kind);
}

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using Bytes = std::vector<std::byte>;

Tensor fill_f32(Shape shape, float value) {
  std::vector<float> v(static_cast<size_t>(checked_numel(shape)), value);
  return Tensor::from_vector(v, std::move(shape));
}

// {"obs": f32[3,4], "info": {"reward": f32[3], "done": bool[3]}, "task": <task>}, batch [3].
TensorDict step(float value, const std::string& task = "walk") {
  TensorDict td({3});
  td.set("obs", fill_f32({3, 4}, value));
  td.set({"info", "reward"}, fill_f32({3}, value * 10));
  Tensor done = Tensor::zeros({3}, DType::Bool);
  done.at<bool>({2}) = value > 1;
  td.set({"info", "done"}, done);
  td.set("task", NonTensor{task});
  return td;
}

// The bytes a transport would put on the wire for `m`.
Bytes flatten(const OutMessage& m) {
  Bytes out(m.header_bytes.begin(), m.header_bytes.end());
  const auto* md = reinterpret_cast<const std::byte*>(m.metadata.data());
  out.insert(out.end(), md, md + m.metadata.size());
  for (std::span<const std::byte> piece : m.payload)
    out.insert(out.end(), piece.begin(), piece.end());
  return out;
}

// A hand-made message: `h` with sizes taken from `metadata` and `payload`.
Bytes craft(FrameHeader h, const std::string& metadata, const Bytes& payload) {
  h.metadata_bytes = metadata.size();
  h.payload_bytes = payload.size();
  FrameHeader::Bytes hb = h.encode();
  Bytes out(hb.begin(), hb.end());
  const auto* md = reinterpret_cast<const std::byte*>(metadata.data());
  out.insert(out.end(), md, md + metadata.size());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

size_t payload_size(const OutMessage& m) {
  size_t n = 0;
  for (auto piece : m.payload) n += piece.size();
  return n;
}

// decode() must throw a ProtocolError whose message contains `needle`.
void expect_decode_error(Decoder& dec, const Bytes& msg, const std::string& needle) {
  try {
    dec.decode(msg);
    ADD_FAILURE() << "expected ProtocolError containing '" << needle << "'";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr(needle));
  }
}

// --- consolidated mode: schema, then storage only --------------------------------------

TEST(Codec, FirstMessageIsSchemaAndStorage) {
  Encoder enc(Mode::Consolidated);
  TensorDict td = step(1);
  const OutMessage& m = enc.encode(td);
  EXPECT_EQ(m.header.kind, MessageKind::SchemaAndStorage);
  EXPECT_EQ(m.header.schema_id, 1u);
  EXPECT_EQ(enc.schema_id(), 1u);
  EXPECT_EQ(m.metadata, plan_consolidation(td).metadata.dump());
  EXPECT_EQ(m.header.metadata_bytes, m.metadata.size());
  ASSERT_EQ(m.payload.size(), 1u);
  EXPECT_EQ(m.header.payload_bytes, plan_consolidation(td).total_bytes);
  EXPECT_EQ(m.payload[0].size(), m.header.payload_bytes);
  EXPECT_EQ(m.header_bytes, m.header.encode());
}

TEST(Codec, AMovedFromEncoderIsAnError) {
  Encoder e(Mode::Consolidated);
  Encoder taken = std::move(e);
  TensorDict td;
  td.set("x", Tensor::zeros({2}, DType::Float32));
  EXPECT_THROW(e.encode(td), Error);  // NOLINT(bugprone-use-after-move): the point
  EXPECT_NO_THROW(taken.encode(td));
}

TEST(Codec, FinishingAnIncomingThatWasNotPreparedIsAnError) {
  Decoder dec;
  Incoming in;
  EXPECT_THROW(dec.finish(in), Error);
  in.header.kind = MessageKind::Storage;
  EXPECT_THROW(dec.finish(in), Error);
}

TEST(Codec, SecondMessageWithTheSameStructureIsStorageOnly) {
  Encoder enc(Mode::Consolidated);
  enc.encode(step(1));
  const OutMessage& m = enc.encode(step(2));
  EXPECT_EQ(m.header.kind, MessageKind::Storage);
  EXPECT_EQ(m.header.schema_id, 1u);
  EXPECT_TRUE(m.metadata.empty());
  EXPECT_EQ(m.header.metadata_bytes, 0u);
  EXPECT_EQ(m.header.payload_bytes, plan_consolidation(step(2)).total_bytes);
}

TEST(Codec, RoundTripOfSchemaAndStorageRebuildsTheTensorDict) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  TensorDict td = step(1.5f);
  TensorDict& back = dec.decode(flatten(enc.encode(td)));
  std::string why;
  EXPECT_TRUE(equal(td, back, &why)) << why;
  EXPECT_TRUE(back.is_consolidated());
  EXPECT_TRUE(back.is_locked());
  EXPECT_TRUE(dec.has_schema());
  EXPECT_EQ(dec.schema_id(), 1u);
}

TEST(Codec, StorageMessageIsDecodedIntoTheSameTensorDictObject) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  TensorDict& first = dec.decode(flatten(enc.encode(step(1))));
  const std::byte* storage = first.consolidated()->storage.data();
  const void* obs = first.get("obs").data();

  const OutMessage& m = enc.encode(step(2));
  ASSERT_EQ(m.header.kind, MessageKind::Storage);
  TensorDict& second = dec.decode(flatten(m));
  EXPECT_EQ(&second, &first);
  EXPECT_EQ(second.consolidated()->storage.data(), storage);
  EXPECT_EQ(second.get("obs").data(), obs);
  std::string why;
  EXPECT_TRUE(equal(second, step(2), &why)) << why;
}

TEST(Codec, ChangedStructureSendsANewSchema) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  dec.decode(flatten(enc.encode(step(1))));
  TensorDict bigger = step(2);
  bigger.set("action", fill_f32({3, 2}, 4.0f));
  const OutMessage& m = enc.encode(bigger);
  EXPECT_EQ(m.header.kind, MessageKind::SchemaAndStorage);
  EXPECT_EQ(m.header.schema_id, 2u);
  TensorDict& back = dec.decode(flatten(m));
  EXPECT_EQ(dec.schema_id(), 2u);
  std::string why;
  EXPECT_TRUE(equal(bigger, back, &why)) << why;
}

TEST(Codec, ChangedShapeSendsANewSchema) {
  Encoder enc(Mode::Consolidated);
  enc.encode(step(1));
  TensorDict other = step(1);
  other.set("obs", fill_f32({3, 5}, 1.0f));
  EXPECT_EQ(enc.encode(other).header.kind, MessageKind::SchemaAndStorage);
}

TEST(Codec, ChangedNonTensorValueSendsANewSchema) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  dec.decode(flatten(enc.encode(step(1, "walk"))));
  const OutMessage& m = enc.encode(step(1, "run"));
  EXPECT_EQ(m.header.kind, MessageKind::SchemaAndStorage);
  EXPECT_EQ(dec.decode(flatten(m)).get_non_tensor("task"), "run");
}

// A dict of tensors only: its plan is reused while the structure holds (no metadata JSON
// is built), and any change of what the metadata records sends a new schema.
TensorDict tensors_only(float value) {
  TensorDict td({3});
  td.set("obs", fill_f32({3, 4}, value));
  td.set({"info", "reward"}, fill_f32({3}, value * 10));
  return td;
}

TEST(Codec, EveryChangeOfATensorOnlyStructureSendsANewSchemaAndRoundTrips) {
  using Change = std::function<void(TensorDict&)>;
  const std::vector<std::pair<std::string, Change>> changes = {
      {"dtype",
       [](TensorDict& td) {
         td.set("obs", Tensor::zeros({3, 4}, DType::Float64));
       }},
      {"shape",
       [](TensorDict& td) {
         td.set("obs", fill_f32({3, 5}, 1));
       }},
      {"key",
       [](TensorDict& td) {
         td.erase(Key("obs"));
         td.set("obz", fill_f32({3, 4}, 1));
       }},
      {"order",
       [](TensorDict& td) {
         td.erase(Key("obs"));
         td.set("obs", fill_f32({3, 4}, 1));
       }},
      {"new leaf",
       [](TensorDict& td) {
         td.set({"info", "done"}, Tensor::zeros({3}, DType::Bool));
       }},
      {"nested batch size",
       [](TensorDict& td) {
         TensorDict info({3, 1});
         info.set("reward", fill_f32({3, 1}, 2));
         td.set("info", std::move(info));
       }},
      {"names", [](TensorDict& td) { td.set_names({std::string("time")}); }},
      {"lock", [](TensorDict& td) { td.lock_(); }},
      {"nested names",
       [](TensorDict& td) { td.get_tensordict(Key("info")).set_names({std::string("t")}); }},
      {"nested lock", [](TensorDict& td) { td.get_tensordict(Key("info")).lock_(); }},
      {"device",
       [](TensorDict& td) {
         TensorDict on_cpu({3}, Device::cpu());
         for (const auto& [name, e] : td.items()) on_cpu.set(name, e);
         td = std::move(on_cpu);
       }},
      {"non-tensor", [](TensorDict& td) { td.set("task", NonTensor{"walk"}); }},
  };
  for (const auto& [what, change] : changes) {
    SCOPED_TRACE(what);
    Encoder enc(Mode::Consolidated);
    Decoder dec;
    dec.decode(flatten(enc.encode(tensors_only(1))));
    const OutMessage& again = enc.encode(tensors_only(2));
    EXPECT_EQ(again.header.kind, MessageKind::Storage);
    std::string why;
    EXPECT_TRUE(equal(tensors_only(2), dec.decode(flatten(again)), &why)) << why;
    TensorDict changed = tensors_only(3);
    change(changed);
    const OutMessage& m = enc.encode(changed);
    EXPECT_EQ(m.header.kind, MessageKind::SchemaAndStorage);
    EXPECT_TRUE(equal(changed, dec.decode(flatten(m)), &why)) << why;
    // And back: the first structure again is a new schema too, then storage only.
    const OutMessage& first_again = enc.encode(tensors_only(4));
    EXPECT_EQ(first_again.header.kind, MessageKind::SchemaAndStorage);
    dec.decode(flatten(first_again));
    const OutMessage& last = enc.encode(tensors_only(5));
    EXPECT_EQ(last.header.kind, MessageKind::Storage);
    EXPECT_TRUE(equal(tensors_only(5), dec.decode(flatten(last)), &why)) << why;
  }
}

TEST(Codec, AReusedPlanIsNotTakenForTheSchemaOfAConsolidatedInputSentBetween) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  dec.decode(flatten(enc.encode(tensors_only(1))));
  TensorDict other = consolidate(step(2));  // another structure, sent from its own storage
  const OutMessage& m = enc.encode(other);
  EXPECT_EQ(m.header.kind, MessageKind::SchemaAndStorage);
  dec.decode(flatten(m));
  const OutMessage& back = enc.encode(tensors_only(3));
  EXPECT_EQ(back.header.kind, MessageKind::SchemaAndStorage);
  std::string why;
  EXPECT_TRUE(equal(tensors_only(3), dec.decode(flatten(back)), &why)) << why;
}

TEST(Codec, ARefusedDictLeavesTheReusedPlanIntact) {
  Encoder enc(Mode::Consolidated, ConsolidateOptions{.max_depth = 1});
  Decoder dec;
  dec.decode(flatten(enc.encode(tensors_only(1))));
  TensorDict deep = tensors_only(2);
  deep.set({"a", "b", "c"}, fill_f32({3}, 1));
  EXPECT_THROW(enc.encode(deep), ValueError);
  const OutMessage& m = enc.encode(tensors_only(3));
  EXPECT_EQ(m.header.kind, MessageKind::Storage);
  std::string why;
  EXPECT_TRUE(equal(tensors_only(3), dec.decode(flatten(m)), &why)) << why;
}

// gather_up_to: a small message goes out as pieces of the leaves (and zero padding), no
// copy, with exactly the bytes of the packed one; a strided leaf or a bigger message is
// packed as before.
TEST(Codec, AGatheredMessageCarriesTheBytesOfAPackedOneWithoutCopying) {
  TensorDict td({3});
  td.set("a", Tensor::from_vector<uint8_t>({1, 2, 3}, {3}));  // 5 bytes of padding after it
  td.set({"n", "b"}, fill_f32({3, 2}, 7));
  td.set("c", Tensor::from_vector<int16_t>({-1, -2, -3}, {3}));
  Encoder packed(Mode::Consolidated), gathered(Mode::Consolidated);
  gathered.gather_up_to(1 << 20);
  const OutMessage& p = packed.encode(td);
  const OutMessage& g = gathered.encode(td);
  EXPECT_EQ(p.payload.size(), 1u);
  ASSERT_EQ(g.payload.size(), 5u);  // a, its padding, b, c, its padding
  EXPECT_EQ(g.payload[0].data(), static_cast<const std::byte*>(td.get("a").data()));
  EXPECT_EQ(g.payload[2].data(), static_cast<const std::byte*>(td.get({"n", "b"}).data()));
  EXPECT_EQ(flatten(p), flatten(g));
  Decoder dec;
  std::string why;
  EXPECT_TRUE(equal(td, dec.decode(flatten(g)), &why)) << why;
  // The same structure again: storage only, still gathered.
  const OutMessage& again = gathered.encode(td);
  EXPECT_EQ(again.header.kind, MessageKind::Storage);
  EXPECT_EQ(again.payload.size(), 5u);
  EXPECT_TRUE(equal(td, dec.decode(flatten(again)), &why)) << why;

  Encoder small(Mode::Consolidated);
  small.gather_up_to(16);  // less than the message: packed
  EXPECT_EQ(small.encode(td).payload.size(), 1u);
  Tensor base = Tensor::from_vector<double>({0, 1, 2, 3, 4, 5}, {3, 2});
  td.set("strided", Tensor::view(base.storage(), 0, {3, 2}, DType::Float64, {1, 3}));
  const OutMessage& s = gathered.encode(td);
  EXPECT_EQ(s.payload.size(), 1u);
  EXPECT_EQ(flatten(s), flatten(packed.encode(td)));
}

TEST(Codec, ConsolidatedInputIsSentFromItsOwnStorageWithoutCopying) {
  Encoder enc(Mode::Consolidated);
  TensorDict c = consolidate(step(1));
  const OutMessage& m = enc.encode(c);
  ASSERT_EQ(m.payload.size(), 1u);
  EXPECT_EQ(m.payload[0].data(), c.consolidated()->storage.data());
  EXPECT_EQ(m.payload[0].size(), c.consolidated()->storage.nbytes());
  EXPECT_EQ(m.metadata, c.consolidated()->metadata->dump());

  TensorDict c2 = consolidate(step(2));
  const OutMessage& m2 = enc.encode(c2);
  EXPECT_EQ(m2.header.kind, MessageKind::Storage);
  EXPECT_EQ(m2.payload[0].data(), c2.consolidated()->storage.data());
}

TEST(Codec, ConsolidatedAndPlainInputsOfOneStructureShareASchema) {
  Encoder enc(Mode::Consolidated);
  enc.encode(step(1));
  TensorDict c = consolidate(step(2));
  EXPECT_EQ(enc.encode(c).header.kind, MessageKind::Storage);
  EXPECT_EQ(enc.encode(step(3)).header.kind, MessageKind::Storage);
}

TEST(Codec, EncoderSendsANewSchemaWhenAFreedInputsMetadataAddressIsReused) {
  // A consolidated input is recognised by its metadata object. Once the previous input is
  // freed, the allocator may place a new input's metadata at the same address; the encoder
  // must still see a new structure (with glibc some of these pairs do reuse the address).
  auto make = [](int keys, DType dtype) {
    TensorDict td(Shape{});
    for (int k = 0; k < keys; ++k)
      td.set(std::string(dtype == DType::Int32 ? "i" : "f") + std::to_string(k),
             Tensor::zeros({4}, dtype));
    return td;
  };
  for (int a = 1; a <= 8; ++a) {
    for (int b = 1; b <= 8; ++b) {
      Encoder enc(Mode::Consolidated);
      Bytes schema_a;
      {
        TensorDict first = consolidate(make(a, DType::Float32));
        schema_a = flatten(enc.encode(first));
      }  // freed here
      TensorDict second = consolidate(make(b, DType::Int32));
      const OutMessage& m = enc.encode(second);
      EXPECT_EQ(m.header.kind, MessageKind::SchemaAndStorage) << a << " then " << b << " keys";
      Decoder dec;
      dec.decode(schema_a);
      try {
        std::string why;
        EXPECT_TRUE(equal(dec.decode(flatten(m)), second, &why)) << why;
      } catch (const ProtocolError& e) {
        ADD_FAILURE() << a << " then " << b << " keys: " << e.what();
      }
    }
  }
}

TEST(Codec, ResetMakesTheNextMessageCarryItsSchemaAgain) {
  Encoder enc(Mode::Consolidated);
  enc.encode(step(1));
  enc.reset();
  const OutMessage& m = enc.encode(step(1));
  EXPECT_EQ(m.header.kind, MessageKind::SchemaAndStorage);
  EXPECT_EQ(m.header.schema_id, 2u);  // ids are never reused
}

TEST(Codec, StagingBufferIsReusedWhileTheStructureHolds) {
  Encoder enc(Mode::Consolidated);
  const std::byte* first = enc.encode(step(1)).payload[0].data();
  EXPECT_EQ(enc.encode(step(2)).payload[0].data(), first);
}

TEST(Codec, NestedDictsAndNonTensorStacksRoundTripConsolidated) {
  TensorDict td = TensorDict::stack({step(1, "walk"), step(2, "run")});
  td.set({"deep", "er", "x"}, fill_f32({2, 3, 1}, 9.0f));
  td.set("meta", NonTensor{Json::parse(R"({"seed": 3, "tags": ["a", "b"]})")});
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  TensorDict& back = dec.decode(flatten(enc.encode(td)));
  std::string why;
  EXPECT_TRUE(equal(td, back, &why)) << why;
  EXPECT_TRUE(back.entry("task").is_non_tensor_stack());
}

TEST(Codec, DecodeWritesIntoACallerProvidedTensorDictWithTheSameLayout) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  TensorDict& cached = dec.decode(flatten(enc.encode(step(1))));
  TensorDict mine = consolidate(step(0));
  const std::byte* my_storage = mine.consolidated()->storage.data();

  const OutMessage& m = enc.encode(step(5));
  ASSERT_EQ(m.header.kind, MessageKind::Storage);
  TensorDict& out = dec.decode(flatten(m), &mine);
  EXPECT_EQ(&out, &mine);
  EXPECT_EQ(mine.consolidated()->storage.data(), my_storage);
  std::string why;
  EXPECT_TRUE(equal(mine, step(5), &why)) << why;
  EXPECT_TRUE(equal(cached, step(1), &why)) << why;  // the decoder's own copy is not written
}

TEST(Codec, DecodeIgnoresACallerProvidedTensorDictWithAnotherLayout) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  TensorDict& cached = dec.decode(flatten(enc.encode(step(1))));
  TensorDict other = step(0);
  other.set("extra", fill_f32({3}, 0.0f));
  TensorDict mine = consolidate(other);
  TensorDict plain = step(0);  // not consolidated at all

  EXPECT_EQ(&dec.decode(flatten(enc.encode(step(5))), &mine), &cached);
  EXPECT_EQ(&dec.decode(flatten(enc.encode(step(6))), &plain), &cached);
  EXPECT_TRUE(equal(cached, step(6)));
  EXPECT_TRUE(equal(plain, step(0)));
  EXPECT_TRUE(equal(mine, other));
}

TEST(Codec, ThreeStepReceiveLandsThePayloadInTheReturnedBuffers) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  TensorDict td = step(3);
  const OutMessage& m = enc.encode(td);
  FrameHeader h = dec.read_header(m.header_bytes);
  EXPECT_EQ(h.kind, MessageKind::SchemaAndStorage);
  Incoming in = dec.prepare(h, std::as_bytes(std::span(m.metadata)));
  ASSERT_EQ(in.buffers.size(), 1u);
  ASSERT_EQ(in.buffers[0].size(), m.payload[0].size());
  std::memcpy(in.buffers[0].data(), m.payload[0].data(), m.payload[0].size());
  EXPECT_FALSE(dec.has_schema());  // nothing is committed before finish()
  TensorDict& back = dec.finish(in);
  EXPECT_EQ(back.consolidated()->storage.data(), in.buffers[0].data());
  EXPECT_TRUE(equal(back, td));
  EXPECT_TRUE(dec.has_schema());
}

TEST(Codec, PrepareRejectsMetadataOfTheWrongLength) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  const OutMessage& m = enc.encode(step(1));
  FrameHeader h = dec.read_header(m.header_bytes);
  std::span<const std::byte> md = std::as_bytes(std::span(m.metadata));
  EXPECT_THROW(dec.prepare(h, md.first(md.size() - 1)), ProtocolError);
}

// --- rejected storage messages leave the received TensorDict untouched --------------------

TEST(Codec, DecoderRejectsStorageMessageBeforeAnySchema) {
  Encoder enc(Mode::Consolidated);
  enc.encode(step(1));
  Bytes storage_only = flatten(enc.encode(step(2)));
  Decoder dec;
  expect_decode_error(dec, storage_only, "no schema");
  EXPECT_FALSE(dec.has_schema());
}

TEST(Codec, DecoderRejectsStorageMessageForAnotherSchemaIdAndKeepsPreviousValues) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  TensorDict& received = dec.decode(flatten(enc.encode(step(1))));
  const size_t n = received.consolidated()->storage.nbytes();
  FrameHeader h;
  h.kind = MessageKind::Storage;
  h.schema_id = 2;
  Bytes msg = craft(h, "", Bytes(n, std::byte{0xFF}));
  expect_decode_error(dec, msg, "schema id 2");
  std::string why;
  EXPECT_TRUE(equal(received, step(1), &why)) << why;
  EXPECT_EQ(dec.schema_id(), 1u);
}

TEST(Codec, DecoderRejectsStorageMessageOfTheWrongSizeAndKeepsPreviousValues) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  TensorDict& received = dec.decode(flatten(enc.encode(step(1))));
  const size_t n = received.consolidated()->storage.nbytes();
  FrameHeader h;
  h.kind = MessageKind::Storage;
  h.schema_id = 1;
  for (size_t size : {n - 8, n + 8, size_t{0}}) {
    expect_decode_error(dec, craft(h, "", Bytes(size, std::byte{0xFF})),
                        "storage message of " + std::to_string(size) + " bytes");
    std::string why;
    EXPECT_TRUE(equal(received, step(1), &why)) << why;
  }
  // The stream carries on: a good storage message is still accepted.
  EXPECT_TRUE(equal(dec.decode(flatten(enc.encode(step(2)))), step(2)));
}

TEST(Codec, DecoderRejectsACorruptSchemaAndKeepsPreviousSchemaAndValues) {
  Encoder enc(Mode::Consolidated);
  Decoder dec;
  TensorDict& received = dec.decode(flatten(enc.encode(step(1))));
  FrameHeader h;
  h.kind = MessageKind::SchemaAndStorage;
  h.schema_id = 2;
  expect_decode_error(dec, craft(h, "{\"cls\": ", Bytes(8)), "malformed JSON");
  Json bad = plan_consolidation(step(1)).metadata;
  bad["leaves"]["obs"][0] = "torch.float128";
  expect_decode_error(dec, craft(h, bad.dump(), Bytes(plan_consolidation(step(1)).total_bytes)),
                      "unknown dtype");
  EXPECT_EQ(dec.schema_id(), 1u);
  EXPECT_TRUE(equal(received, step(1)));
  // Storage messages for the schema before still work.
  EXPECT_EQ(&dec.decode(flatten(enc.encode(step(2)))), &received);
  EXPECT_TRUE(equal(received, step(2)));
}

TEST(Codec, DecoderRejectsASchemaWhoseLeavesDoNotFitThePayload) {
  TensorDict td = step(1);
  ConsolidatedPlan plan = plan_consolidation(td);
  FrameHeader h;
  h.kind = MessageKind::SchemaAndStorage;
  h.schema_id = 1;
  Decoder dec;
  expect_decode_error(dec, craft(h, plan.metadata.dump(), Bytes(plan.total_bytes - 8)),
                      "past the storage");
}

TEST(Codec, DecoderRejectsTruncatedMessages) {
  Encoder enc(Mode::Consolidated);
  Bytes msg = flatten(enc.encode(step(1)));
  Decoder dec;
  Bytes cut(msg.begin(), msg.end() - 1);
  expect_decode_error(dec, cut, "does not match its header");
  Bytes longer = msg;
  longer.push_back(std::byte{0});
  expect_decode_error(dec, longer, "does not match its header");
  Bytes header_only(msg.begin(), msg.begin() + kHeaderBytes);
  expect_decode_error(dec, header_only, "does not match its header");
  Bytes partial_header(msg.begin(), msg.begin() + 20);
  expect_decode_error(dec, partial_header, "shorter than a frame header");
  EXPECT_FALSE(dec.has_schema());
}

TEST(Codec, DecoderRejectsACorruptHeader) {
  Encoder enc(Mode::Consolidated);
  Bytes msg = flatten(enc.encode(step(1)));
  msg[12] ^= std::byte{0x40};
  Decoder dec;
  expect_decode_error(dec, msg, "checksum");
}

TEST(Codec, DecoderEnforcesItsLimits) {
  Encoder enc(Mode::Consolidated);
  Bytes msg = flatten(enc.encode(step(1)));
  Limits limits;
  limits.max_message_bytes = 16;
  Decoder dec(limits);
  expect_decode_error(dec, msg, "max_message_bytes");
  Limits depth;
  depth.max_depth = 0;
  Decoder shallow(depth);
  expect_decode_error(shallow, msg, "max_depth");
}

// --- non-consolidated mode ---------------------------------------------------------------

TEST(Codec, NonConsolidatedMessageHasOnePayloadPiecePerLeaf) {
  Encoder enc(Mode::NonConsolidated);
  TensorDict td = step(1);
  const OutMessage& m = enc.encode(td);
  EXPECT_EQ(m.header.kind, MessageKind::NonConsolidated);
  EXPECT_EQ(m.header.schema_id, 0u);
  ASSERT_EQ(m.payload.size(), 3u);
  EXPECT_EQ(m.payload[0].data(), td.get("obs").data());  // contiguous leaves: no copy
  EXPECT_EQ(m.payload[1].data(), td.get({"info", "reward"}).data());
  EXPECT_EQ(m.header.payload_bytes, 48u + 12u + 3u);
  EXPECT_EQ(payload_size(m), m.header.payload_bytes);
  EXPECT_EQ(Json::parse(m.metadata), non_consolidated_header(td));
  // Every message carries its header: there is no schema to cache.
  EXPECT_EQ(enc.encode(td).header.kind, MessageKind::NonConsolidated);
}

TEST(Codec, NonConsolidatedHeaderListsEntriesDepthFirst) {
  Json h = non_consolidated_header(step(1));
  EXPECT_EQ(h["batch_size"], Json::parse("[3]"));
  const Json& e = h["entries"];
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(
      e[0],
      Json::parse(
          R"({"key": ["obs"], "type": "tensor", "dtype": "torch.float32", "shape": [3, 4]})"));
  EXPECT_EQ(e[1], Json::parse(R"({"key": ["info"], "type": "dict", "batch_size": [3]})"));
  EXPECT_EQ(e[2]["key"], Json::parse(R"(["info", "reward"])"));
  EXPECT_EQ(e[3]["dtype"], "torch.bool");
  EXPECT_EQ(e[4], Json::parse(R"({"key": ["task"], "type": "non_tensor", "value": "walk"})"));
}

TEST(Codec, NonConsolidatedRoundTripWithNestingNonTensorsStacksAndStridedLeaves) {
  TensorDict td = TensorDict::stack({step(1, "walk"), step(2, "run")});  // batch [2, 3]
  Tensor base = Tensor::from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor transposed = Tensor::view(base.storage(), 0, {2, 3}, DType::Float64, {1, 2});
  ASSERT_FALSE(transposed.is_contiguous());
  td.set({"info", "strided"}, transposed);
  td.set({"deep", "er", "x"}, fill_f32({2, 3, 1}, 9.0f));
  td.set({"deep", "label"}, NonTensor{Json::parse(R"({"seed": 3})")});
  td.set("empty", Tensor::zeros({2, 3, 0}, DType::Int16));
  td.set_names({"time", std::nullopt});

  Encoder enc(Mode::NonConsolidated);
  const OutMessage& m = enc.encode(td);
  EXPECT_EQ(m.keepalive.size(), 1u);  // the strided leaf went through a contiguous copy
  Decoder dec;
  TensorDict& back = dec.decode(flatten(m));
  std::string why;
  EXPECT_TRUE(equal(td, back, &why)) << why;
  EXPECT_TRUE(back.entry("task").is_non_tensor_stack());
  EXPECT_EQ(back.get_non_tensor({"deep", "label"}), Json::parse(R"({"seed": 3})"));
  EXPECT_EQ(back.names()[0], "time");
  EXPECT_FALSE(back.is_consolidated());
  EXPECT_EQ((back.get({"info", "strided"}).at<double>({1, 2})), 5.0);
}

TEST(Codec, NonConsolidatedDecodeIsIndependentOfTheEncodedTensorDict) {
  Encoder enc(Mode::NonConsolidated);
  Decoder dec;
  TensorDict td = step(1);
  Bytes msg = flatten(enc.encode(td));
  TensorDict& back = dec.decode(msg);
  td.get("obs").at<float>({0, 0}) = 100.0f;
  EXPECT_EQ((back.get("obs").at<float>({0, 0})), 1.0f);
  EXPECT_FALSE(dec.has_schema());
}

TEST(Codec, NonConsolidatedLeafSizesMustAddUpToPayloadBytes) {
  TensorDict td = step(1);
  std::string header = non_consolidated_header(td).dump();
  FrameHeader h;
  h.kind = MessageKind::NonConsolidated;
  Decoder dec;
  expect_decode_error(dec, craft(h, header, Bytes(63 + 4)), "leaf sizes add up to 63 bytes");
  expect_decode_error(dec, craft(h, header, Bytes(63 - 4)), "exceed payload_bytes");
  EXPECT_NO_THROW(dec.decode(craft(h, header, Bytes(63))));
}

TEST(Codec, NonConsolidatedHeaderIsValidatedBeforeAnythingIsBuilt) {
  FrameHeader h;
  h.kind = MessageKind::NonConsolidated;
  Decoder dec;
  auto header_with = [](const std::string& entry) {
    return R"({"batch_size": [3], "entries": [)" + entry + "]}";
  };
  expect_decode_error(dec, craft(h, "[]", {}), "must be a JSON object");
  expect_decode_error(dec, craft(h, R"({"entries": []})", {}), "missing \"batch_size\"");
  expect_decode_error(
      dec,
      craft(h,
            header_with(
                R"({"key": ["x"], "type": "tensor", "dtype": "torch.float99", "shape": [3]})"),
            Bytes(12)),
      "unknown dtype");
  expect_decode_error(
      dec,
      craft(h,
            header_with(
                R"({"key": ["x"], "type": "tensor", "dtype": "torch.float32", "shape": [3, -1]})"),
            Bytes(12)),
      "non-negative");
  expect_decode_error(
      dec,
      craft(h,
            header_with(R"({"key": [], "type": "tensor", "dtype": "torch.float32", "shape": [3]})"),
            Bytes(12)),
      "\"key\"");
  expect_decode_error(dec, craft(h, header_with(R"({"key": ["x"], "type": "blob"})"), {}),
                      "unknown type");
  // A tensor that does not start with the batch size is a protocol error, not a ValueError.
  expect_decode_error(
      dec,
      craft(h,
            header_with(
                R"({"key": ["x"], "type": "tensor", "dtype": "torch.float32", "shape": [4]})"),
            Bytes(16)),
      "batch dimension mismatch");
  Limits limits;
  limits.max_message_bytes = 1024;
  Decoder small(limits);
  expect_decode_error(
      small,
      craft(
          h,
          header_with(
              R"({"key": ["x"], "type": "tensor", "dtype": "torch.float32", "shape": [3, 1099511627776]})"),
          Bytes(12)),
      "exceeds max_message_bytes");
}

TEST(Codec, RejectedNonConsolidatedMessageKeepsThePreviousOne) {
  Encoder enc(Mode::NonConsolidated);
  Decoder dec;
  TensorDict& first = dec.decode(flatten(enc.encode(step(1))));
  FrameHeader h;
  h.kind = MessageKind::NonConsolidated;
  EXPECT_THROW(dec.decode(craft(h, non_consolidated_header(step(2)).dump(), Bytes(7))),
               ProtocolError);
  EXPECT_TRUE(equal(first, step(1)));
}

// --- control messages ---------------------------------------------------------------------

TEST(Codec, ControlMessageCarriesJsonOnly) {
  Json body = {{"hello", "tensorwire"}, {"version", 1}};
  OutMessage m = Encoder::control(body);
  EXPECT_EQ(m.header.kind, MessageKind::Control);
  EXPECT_EQ(m.header.schema_id, 0u);
  EXPECT_EQ(m.header.payload_bytes, 0u);
  EXPECT_TRUE(m.payload.empty());

  Decoder dec;
  Bytes bytes = flatten(m);
  FrameHeader h = dec.read_header(std::span(bytes).first(kHeaderBytes));
  EXPECT_EQ(h.kind, MessageKind::Control);
  Incoming in = dec.prepare(h, std::span(bytes).subspan(kHeaderBytes));
  EXPECT_EQ(in.control, body);
  EXPECT_TRUE(in.buffers.empty());
}

TEST(Codec, DecodeOfAControlMessageSaysItCarriesNoTensorDict) {
  Decoder dec;
  expect_decode_error(dec, flatten(Encoder::control({{"ping", true}})), "control message");
}

TEST(Codec, ControlMessageWithBadJsonIsRejected) {
  FrameHeader h;
  h.kind = MessageKind::Control;
  Decoder dec;
  expect_decode_error(dec, craft(h, "{nope}", {}), "invalid control message");
}

TEST(Codec, ParseUntrustedJsonBoundsNesting) {
  Limits limits;
  limits.max_depth = 2;  // 2 * 2 + 16 = 20 JSON levels
  std::string deep(30, '[');
  deep += std::string(30, ']');
  try {
    parse_untrusted_json(std::as_bytes(std::span(deep)), limits, "schema");
    FAIL() << "expected ProtocolError";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("invalid schema"), HasSubstr("nested deeper")));
  }
  std::string shallow = "[[[1]]]";
  EXPECT_EQ(parse_untrusted_json(std::as_bytes(std::span(shallow)), limits, "schema"),
            Json::parse(shallow));
}

TEST(Codec, ParseUntrustedJsonKeepsKeyOrderAndValues) {
  std::string text =
      R"({"zeta": 1, "alpha": [true, null, -2, 3.5, "s"], "mid": {"b": 18446744073709551615, "a": {}}})";
  Json j = parse_untrusted_json(std::as_bytes(std::span(text)), Limits{}, "header");
  EXPECT_EQ(j, Json::parse(text));  // ordered_json compares members in order
  std::vector<std::string> keys;
  for (auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"zeta", "alpha", "mid"}));
  EXPECT_EQ(j["mid"]["b"].get<uint64_t>(), 18446744073709551615ull);
  std::string scalar = "42";
  EXPECT_EQ(parse_untrusted_json(std::as_bytes(std::span(scalar)), Limits{}, "x"), Json(42));
}

TEST(Codec, ParseUntrustedJsonRejectsDuplicateKeysInSmallAndLargeObjects) {
  std::string small = R"({"a": 1, "b": 2, "a": 3})";
  std::string large = "{";
  for (int i = 0; i < 40; ++i)
    large += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ", ";
  large += R"("k17": 0})";
  std::string nested = R"({"leaves": {"x": [1], "y": {"p": 1, "p": 2}}})";
  for (const auto& [text, key] : {std::pair{small, "'a'"}, {large, "'k17'"}, {nested, "'p'"}}) {
    try {
      parse_untrusted_json(std::as_bytes(std::span(text)), Limits{}, "schema");
      FAIL() << "accepted " << text;
    } catch (const ProtocolError& e) {
      EXPECT_THAT(e.what(),
                  AllOf(HasSubstr("invalid schema"), HasSubstr("duplicate key"), HasSubstr(key)));
    }
  }
}

TEST(Codec, ParseUntrustedJsonRejectsTrailingGarbageAndTruncation) {
  for (std::string text : {"{\"a\": 1} x", "[1, 2", "", "{\"a\" 1}", "\"unterminated"}) {
    try {
      parse_untrusted_json(std::as_bytes(std::span(text)), Limits{}, "schema");
      FAIL() << "accepted " << text;
    } catch (const ProtocolError& e) {
      EXPECT_THAT(e.what(), HasSubstr("malformed JSON")) << text;
    }
  }
}

}  // namespace
}  // namespace tensorwire::wire
