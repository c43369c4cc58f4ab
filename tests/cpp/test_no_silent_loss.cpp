// What one side builds the other reads back exactly, or it is refused where it is built:
// keys holding any byte (NUL included), nesting up to the shared kMaxDepth, and metadata
// that is exactly its JSON text (no NUL-terminated prefix, valid UTF-8 only).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"
#include "tensorwire/wire/file.h"

namespace tensorwire::wire {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Bytes = std::vector<std::byte>;

const std::string kNulKey("a\0b", 3);

Tensor fill(float value) {
  return Tensor::from_vector(std::vector<float>{value, value, value}, {3});
}

TensorDict nul_keys() {
  TensorDict td;
  td.set(kNulKey, fill(1));
  td.set("a", fill(0));
  td.set({std::string("d\0", 2), std::string("x\0", 2)}, NonTensor{std::string("v\0w", 3)});
  return td;
}

// `levels` sub-dicts, each the only entry of its parent, around one leaf.
TensorDict nested(uint32_t levels) {
  TensorDict td;
  td.set("x", fill(2));
  for (uint32_t i = 0; i < levels; ++i) {
    TensorDict parent;
    parent.set("n", std::move(td));
    td = std::move(parent);
  }
  return td;
}

Bytes flatten(const OutMessage& m) {
  Bytes out(m.header_bytes.begin(), m.header_bytes.end());
  const auto* md = reinterpret_cast<const std::byte*>(m.metadata.data());
  out.insert(out.end(), md, md + m.metadata.size());
  for (std::span<const std::byte> piece : m.payload)
    out.insert(out.end(), piece.begin(), piece.end());
  return out;
}

Bytes craft(FrameHeader h, const std::string& metadata, size_t payload_bytes) {
  h.metadata_bytes = metadata.size();
  h.payload_bytes = payload_bytes;
  FrameHeader::Bytes hb = h.encode();
  Bytes out(hb.begin(), hb.end());
  const auto* md = reinterpret_cast<const std::byte*>(metadata.data());
  out.insert(out.end(), md, md + metadata.size());
  out.resize(out.size() + payload_bytes);
  return out;
}

void expect_equal(const TensorDict& a, const TensorDict& b) {
  std::string why;
  EXPECT_TRUE(equal(a, b, &why)) << why;
}

class NoSilentLoss : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tensorwire_test_loss_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// --- keys ---------------------------------------------------------------------------

TEST_F(NoSilentLoss, KeysWithANulByteStayDistinctInATensorDict) {
  TensorDict td = nul_keys();
  ASSERT_EQ(td.size(), 3u);
  EXPECT_EQ(td.get(kNulKey).at<float>({0}), 1.0f);
  EXPECT_EQ(td.get("a").at<float>({0}), 0.0f);
}

TEST_F(NoSilentLoss, KeysWithANulByteRoundTripThroughConsolidateAndFiles) {
  TensorDict td = nul_keys();
  TensorDict c = consolidate(td);
  expect_equal(td, c);
  EXPECT_EQ(c.consolidated()->metadata->at("leaves").size(), 2u);
  save(td, path("nul.bin"));
  TensorDict back = load(path("nul.bin"));
  expect_equal(td, back);
  EXPECT_EQ(back.get_non_tensor(Key({std::string("d\0", 2), std::string("x\0", 2)})),
            std::string("v\0w", 3));
}

TEST_F(NoSilentLoss, KeysWithANulByteRoundTripInBothWireModes) {
  for (Mode mode : {Mode::Consolidated, Mode::NonConsolidated}) {
    Encoder enc(mode);
    Decoder dec;
    TensorDict td = nul_keys();
    expect_equal(td, dec.decode(flatten(enc.encode(td))));
  }
}

// --- nesting: built == readable -------------------------------------------------------

TEST_F(NoSilentLoss, ReceiversAcceptByDefaultWhatConsolidateAccepts) {
  EXPECT_EQ(Limits{}.max_depth, kMaxDepth);
  EXPECT_EQ(ConsolidateOptions{}.max_depth, kMaxDepth);
}

TEST_F(NoSilentLoss, NestingAtTheLimitRoundTripsThroughFilesAndTheWire) {
  TensorDict td = nested(kMaxDepth);
  save(td, path("deep.bin"));
  expect_equal(td, load(path("deep.bin")));
  for (Mode mode : {Mode::Consolidated, Mode::NonConsolidated}) {
    Encoder enc(mode);
    Decoder dec;
    expect_equal(td, dec.decode(flatten(enc.encode(td))));
  }
}

TEST_F(NoSilentLoss, NestingPastTheLimitIsRefusedWhereItIsBuiltNamingTheLimit) {
  TensorDict td = nested(kMaxDepth + 1);
  auto names_limit =
      AllOf(HasSubstr(std::to_string(kMaxDepth + 1) + " levels deep"),
            HasSubstr("limit of " + std::to_string(kMaxDepth)), HasSubstr("max_depth"));
  try {
    consolidate(td);
    ADD_FAILURE() << "consolidate accepted " << kMaxDepth + 1 << " levels";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), names_limit);
  }
  EXPECT_THROW(save(td, path("deep.bin")), ValueError);
  EXPECT_FALSE(fs::exists(path("deep.bin")));
  for (Mode mode : {Mode::Consolidated, Mode::NonConsolidated}) {
    Encoder enc(mode);
    try {
      enc.encode(td);
      ADD_FAILURE() << "encoder accepted " << kMaxDepth + 1 << " levels";
    } catch (const ValueError& e) {
      EXPECT_THAT(e.what(), names_limit);
    }
  }
}

TEST_F(NoSilentLoss, ThousandsOfLevelsAreRefusedWithAShortMessage) {
  try {
    consolidate(nested(5000));
    ADD_FAILURE() << "accepted";
  } catch (const ValueError& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u);
  }
}

TEST_F(NoSilentLoss, RaisingTheLimitOnBothSidesAcceptsMore) {
  TensorDict td = nested(kMaxDepth + 10);
  Encoder enc(Mode::Consolidated, ConsolidateOptions{.max_depth = kMaxDepth + 10});
  Limits limits;
  limits.max_depth = kMaxDepth + 10;
  Decoder dec(limits);
  expect_equal(td, dec.decode(flatten(enc.encode(td))));
}

TEST_F(NoSilentLoss, DeeplyNestedNonTensorValuesAreRefusedWhereBuilt) {
  Json deep = 1;
  for (uint32_t i = 0; i <= kMaxDepth; ++i) deep = Json::array({deep});
  TensorDict td = nested(kMaxDepth);  // the deepest dict plus a deep value: the worst case
  TensorDict* inner = &td;
  for (uint32_t i = 0; i < kMaxDepth; ++i) inner = &inner->get_tensordict("n");
  inner->set("v", NonTensor{deep});
  try {
    consolidate(td);
    ADD_FAILURE() << "accepted";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'v'"), HasSubstr(std::to_string(kMaxDepth))));
  }
  EXPECT_THROW(Encoder(Mode::NonConsolidated).encode(td), ValueError);
  // One level less is accepted and read back.
  inner->set("v", NonTensor{deep[0]});
  td.set("st", NonTensorStack{{1}, 0, {deep[0]}});  // a stack is one level deeper itself
  save(td, path("value.bin"));
  expect_equal(td, load(path("value.bin")));
  Encoder enc(Mode::NonConsolidated);
  Decoder dec;
  expect_equal(td, dec.decode(flatten(enc.encode(td))));
}

TEST_F(NoSilentLoss, ReceivedValuesNestedDeeperThanTheLimitAreRefusedWhereBytesAreValidated) {
  // A sender that raised its own limit builds what a default receiver must refuse: what is
  // received can always be sent on, so the receiver applies the limit a sender applies.
  Json deep = 1;
  for (uint32_t i = 0; i <= kMaxDepth; ++i) deep = Json::array({deep});  // kMaxDepth + 1
  const ConsolidateOptions raised{.max_depth = kMaxDepth + 1};
  auto names_limit = AllOf(HasSubstr("more than " + std::to_string(kMaxDepth) + " levels deep"),
                           HasSubstr("max_depth"));
  TensorDict value;
  value.set("x", fill(1));
  value.set({"d", "v"}, NonTensor{deep});
  TensorDict stack;
  stack.set("x", fill(1));
  stack.set("st", NonTensorStack{{2}, 0, {Json(1), deep}});
  for (const TensorDict* td : {&value, &stack}) {
    for (Mode mode : {Mode::Consolidated, Mode::NonConsolidated}) {
      Encoder enc(mode, raised);
      Bytes msg = flatten(enc.encode(*td));
      Decoder dec;
      try {
        dec.decode(msg);
        ADD_FAILURE() << "decoder accepted a value " << kMaxDepth + 1 << " levels deep";
      } catch (const ProtocolError& e) {
        EXPECT_THAT(e.what(), names_limit);
        EXPECT_THAT(e.what(), HasSubstr(td == &value ? "v" : "st"));
      }
      // Raising the receiver's limit too accepts it.
      Limits limits;
      limits.max_depth = kMaxDepth + 1;
      Decoder wide(limits);
      expect_equal(*td, wide.decode(msg));
    }
    // A file is received bytes too.
    save(*td, path("deep_value.bin"), raised);
    try {
      load(path("deep_value.bin"));
      ADD_FAILURE() << "load accepted a value " << kMaxDepth + 1 << " levels deep";
    } catch (const ProtocolError& e) {
      EXPECT_THAT(e.what(), names_limit);
    }
    Limits limits;
    limits.max_depth = kMaxDepth + 1;
    expect_equal(*td, load(path("deep_value.bin"), limits));
  }
}

// --- metadata is exactly its JSON text ------------------------------------------------

TEST_F(NoSilentLoss, JsonFollowedByANulAndMoreBytesIsRejected) {
  const std::string text = std::string(R"({"a": 1})") + '\0' + "garbage";
  try {
    parse_untrusted_json(std::as_bytes(std::span(text)), Limits{}, "schema");
    FAIL() << "accepted";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("invalid schema"), HasSubstr("NUL byte at offset 8")));
  }
}

TEST_F(NoSilentLoss, EveryMessageKindRejectsMetadataWithATrailingNul) {
  // Valid metadata of each kind, then a NUL and garbage.
  Encoder cons(Mode::Consolidated), non(Mode::NonConsolidated);
  TensorDict td = nul_keys();
  const OutMessage& schema = cons.encode(td);
  const std::string schema_meta = schema.metadata;
  const uint64_t schema_payload = schema.header.payload_bytes;
  const OutMessage& nc = non.encode(td);
  const std::string nc_meta = nc.metadata;
  const uint64_t nc_payload = nc.header.payload_bytes;
  struct Case {
    MessageKind kind;
    std::string metadata;
    uint64_t payload;
  };
  for (const Case& c : {Case{MessageKind::SchemaAndStorage, schema_meta, schema_payload},
                        Case{MessageKind::NonConsolidated, nc_meta, nc_payload},
                        Case{MessageKind::Control, R"({"hello": 1})", 0}}) {
    FrameHeader h;
    h.kind = c.kind;
    h.schema_id = c.kind == MessageKind::SchemaAndStorage ? 1 : 0;
    auto prepare = [&](const std::string& metadata) {
      FrameHeader hh = h;
      hh.metadata_bytes = metadata.size();
      hh.payload_bytes = c.payload;
      Decoder dec;
      dec.prepare(hh, std::as_bytes(std::span(metadata)));
    };
    EXPECT_NO_THROW(prepare(c.metadata)) << kind_name(c.kind);
    try {
      prepare(c.metadata + '\0' + "garbage");
      ADD_FAILURE() << kind_name(c.kind) << " accepted a NUL after the JSON";
    } catch (const ProtocolError& e) {
      EXPECT_THAT(e.what(), HasSubstr("NUL byte")) << kind_name(c.kind);
    }
  }
}

TEST_F(NoSilentLoss, SavedFileWithATrailingNulInItsMetadataIsRejected) {
  TensorDict td = nul_keys();
  TensorDict c = consolidate(td);
  std::string json = c.consolidated()->metadata->dump() + '\0' + "garbage";
  std::vector<char> bytes(c.consolidated()->storage.nbytes(), 0);
  bytes.insert(bytes.end(), json.begin(), json.end());
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((json.size() >> (8 * i)) & 0xff));
  {
    std::ofstream out(path("nul.bin"), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    load(path("nul.bin"));
    FAIL() << "accepted";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("NUL byte"));
  }
}

TEST_F(NoSilentLoss, InvalidUtf8InMetadataIsAProtocolErrorWithAPrintableMessage) {
  for (std::string text :
       {std::string("{\"a\xff\": 1}"), std::string("{\"a\": \"\xc3\x28\"}"), std::string("\xff")}) {
    try {
      parse_untrusted_json(std::as_bytes(std::span(text)), Limits{}, "schema");
      ADD_FAILURE() << "accepted invalid UTF-8";
    } catch (const ProtocolError& e) {
      const std::string what = e.what();
      EXPECT_EQ(valid_utf8(what), what) << "message is not valid UTF-8";
      EXPECT_THAT(what, HasSubstr("invalid schema"));
    }
  }
}

TEST_F(NoSilentLoss, ErrorMessagesEscapeInvalidUtf8AndNul) {
  EXPECT_STREQ(ValueError("key 'a\xff'").what(), "key 'a\\xff'");
  EXPECT_STREQ(ValueError(std::string("a\0b", 3)).what(), "a\\x00b");
  EXPECT_STREQ(ValueError("caf\xc3\xa9 \xf0\x9f\x98\x80").what(), "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_STREQ(ValueError("\xed\xa0\x80").what(), "\\xed\\xa0\\x80");  // a UTF-8 surrogate
  EXPECT_THAT(SystemError("open 'x\xfe'", 2).what(), Not(HasSubstr("\xfe")));
}

TEST_F(NoSilentLoss, ALeadingByteOrderMarkIsSkippedAndLoneSurrogatesAreRejected) {
  const std::string bom = "\xef\xbb\xbf{\"a\": 1}";
  EXPECT_EQ(parse_untrusted_json(std::as_bytes(std::span(bom)), Limits{}, "x"), Json({{"a", 1}}));
  for (std::string text : {R"(["\ud800"])", R"(["\udc00"])", R"(["\ud800\u0041"])"}) {
    try {
      parse_untrusted_json(std::as_bytes(std::span(text)), Limits{}, "schema");
      ADD_FAILURE() << "accepted " << text;
    } catch (const ProtocolError& e) {
      EXPECT_THAT(e.what(), HasSubstr("surrogate")) << text;
    }
  }
  const std::string pair = R"(["\ud83d\ude00"])";  // a valid pair: U+1F600
  EXPECT_EQ(parse_untrusted_json(std::as_bytes(std::span(pair)), Limits{}, "x")[0],
            "\xf0\x9f\x98\x80");
}

TEST_F(NoSilentLoss, ShapeDimsHaveOneBoundInBothMetadataForms) {
  // [0, 2^63 - 1] has 0 elements: valid in consolidated metadata and in a header alike.
  const std::string big = "9223372036854775807";
  const std::string header = R"({"batch_size": [], "entries": [{"key": ["x"], "type": "tensor",)"
                             R"( "dtype": "torch.uint8", "shape": [0, )" +
                             big + "]}]}";
  FrameHeader h;
  h.kind = MessageKind::NonConsolidated;
  Decoder dec;
  EXPECT_EQ(dec.decode(craft(h, header, 0)).get("x").shape(),
            (Shape{0, std::numeric_limits<int64_t>::max()}));
  const std::string past = R"({"batch_size": [], "entries": [{"key": ["x"], "type": "tensor",)"
                           R"( "dtype": "torch.uint8", "shape": [0, 9223372036854775808]}]}")";
  Decoder dec2;
  EXPECT_THROW(dec2.decode(craft(h, past, 0)), ProtocolError);
}

}  // namespace
}  // namespace tensorwire::wire
