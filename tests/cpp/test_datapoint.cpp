// wire/datapoint.h: the datapoint encoder and decoder. The decoder reads untrusted
// metadata (a remote producer's), so every malformed form has a test naming its rule.
#include "tensorwire/wire/datapoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tensorwire/core/consolidate.h"
#include "wire/datapoint_structure_cache.h"

namespace tensorwire::wire {
namespace {

using ::testing::HasSubstr;

ConsolidatedLayout layout_of(const TensorDict& td) {
  TensorDict c = consolidate(td);
  return ConsolidatedLayout::parse(*c.consolidated()->metadata, Limits{},
                                   c.consolidated()->storage.nbytes());
}

// [int 7, float 2.5, "hé", b"\0x", None, {"a": bool true, "b": int32 array [3]}, pickle]
TensorDict sample() {
  DatapointEncoder inner(Container::Dict);
  inner.add_bool("a", true);
  inner.add_array("b", Tensor::from_vector<int32_t>({1, 2, 3}, {3}), false);
  DatapointEncoder e(Container::List);
  e.add_int({}, 7);
  e.add_float({}, 2.5);
  e.add_str({}, "h\xc3\xa9");
  const std::byte raw[] = {std::byte{0}, std::byte{'x'}};
  e.add_bytes({}, raw);
  e.add_none({});
  e.add_node({}, std::move(inner).finish());
  e.add_pickle({}, raw);
  return std::move(e).finish();
}

// The sample's consolidated metadata, for tampering.
Json sample_metadata() {
  return *consolidate(sample()).consolidated()->metadata;
}

std::string decode_error(const Json& meta, bool allow_pickle = true, uint64_t storage = 4096) {
  try {
    ConsolidatedLayout l = ConsolidatedLayout::parse(meta, Limits{}, storage);
    (void)DatapointDecoder::structure(l, allow_pickle);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

Json& tag_of(Json& node) {
  return node["non_tensors"][std::string(kDatapointTag)][0];
}

TEST(DatapointCodec, RoundTripsEveryKind) {
  TensorDict c = consolidate(sample());
  const Storage& s = c.consolidated()->storage;
  ConsolidatedLayout l = layout_of(c);
  auto root = DatapointDecoder::structure(l, true);
  ASSERT_TRUE(root);
  EXPECT_EQ(root->container, Container::List);
  ASSERT_EQ(root->elements.size(), 7u);
  const auto& el = root->elements;
  EXPECT_EQ(el[0].kind, ElementKind::Int);
  EXPECT_EQ(DatapointDecoder::read_int(s, el[0]), 7);
  EXPECT_EQ(DatapointDecoder::read_float(s, el[1]), 2.5);
  EXPECT_EQ(DatapointDecoder::read_str(s, el[2]), "h\xc3\xa9");
  EXPECT_EQ(DatapointDecoder::read_bytes(s, el[3]).size(), 2u);
  EXPECT_EQ(el[4].kind, ElementKind::None);
  ASSERT_EQ(el[5].kind, ElementKind::Node);
  const DatapointNode& d = *el[5].child;
  EXPECT_EQ(d.container, Container::Dict);
  EXPECT_EQ(d.elements[0].key, "a");
  EXPECT_TRUE(DatapointDecoder::read_bool(s, d.elements[0]));
  EXPECT_EQ(d.elements[1].key, "b");
  EXPECT_EQ(d.elements[1].dtype, DType::Int32);
  EXPECT_EQ(d.elements[1].shape, std::vector<size_t>{3});
  EXPECT_EQ(el[6].kind, ElementKind::Pickle);
}

// An empty leaf is empty whatever its other dims: (1000, 0) in a storage of a few bytes
// (a batch of rows with no features) is valid, not "larger than the storage".
TEST(DatapointCodec, EmptyLeavesWithLargeDimsRoundTrip) {
  DatapointEncoder e(Container::List);
  e.add_array({}, Tensor::zeros({1000, 0}, DType::Float64), false);
  e.add_array({}, Tensor::zeros({3, 0, 5}, DType::Int64), false);
  e.add_int({}, 1);
  auto root = DatapointDecoder::structure(layout_of(std::move(e).finish()), true);
  ASSERT_TRUE(root);
  EXPECT_EQ(root->elements[0].shape, (std::vector<size_t>{1000, 0}));
  EXPECT_EQ(root->elements[0].nbytes, 0u);
  EXPECT_EQ(root->elements[1].shape, (std::vector<size_t>{3, 0, 5}));
}

TEST(DatapointCodec, DictKeepsKeyOrderAcrossKinds) {
  DatapointEncoder e(Container::Dict);
  e.add_none("z");
  e.add_int("y", 1);
  e.add_node("x", DatapointEncoder(Container::Tuple).finish());
  auto root = DatapointDecoder::structure(layout_of(std::move(e).finish()), true);
  ASSERT_EQ(root->elements.size(), 3u);
  EXPECT_EQ(root->elements[0].key, "z");
  EXPECT_EQ(root->elements[1].key, "y");
  EXPECT_EQ(root->elements[2].key, "x");
  EXPECT_EQ(root->elements[2].child->container, Container::Tuple);
}

TEST(DatapointCodec, TensorDictWithoutTagIsNotADatapoint) {
  TensorDict td;
  td.set("a", Tensor::zeros({2}, DType::Float32));
  EXPECT_EQ(DatapointDecoder::structure(layout_of(td), true), nullptr);
}

TEST(DatapointEncoder, RefusesWhatTheFormatCannotHold) {
  DatapointEncoder d(Container::Dict);
  EXPECT_THROW(d.add_int("", 1), ValueError);
  EXPECT_THROW(d.add_int(std::string(kDatapointTag), 1), ValueError);
  EXPECT_THROW(d.add_int(std::string("a\0b", 3), 1), ValueError);
  EXPECT_THROW(d.add_node("leaves", DatapointEncoder(Container::List).finish()), ValueError);
  EXPECT_NO_THROW(d.add_int("leaves", 1));  // a leaf may use the name
  EXPECT_THROW(d.add_node("n", TensorDict()), ValueError);
  EXPECT_THROW(d.add_str("s", "\xff"), ValueError);
  EXPECT_THROW(d.add_scalar("g", Tensor::zeros({2}, DType::Float32)), ValueError);
  DatapointEncoder l(Container::List);
  EXPECT_THROW(l.add_int("k", 1), ValueError);
  DatapointEncoder o(Container::Object);
  EXPECT_THROW(DatapointEncoder(Container::Object).finish(), ValueError);
  o.add_int({}, 1);
  EXPECT_THROW(o.add_int({}, 2), ValueError);
  EXPECT_TRUE(DatapointEncoder::valid_key("cls", false));
  EXPECT_FALSE(DatapointEncoder::valid_key("cls", true));
  // A key given twice made a datapoint its own decoder refused.
  DatapointEncoder twice(Container::Dict);
  twice.add_int("k", 1);
  EXPECT_THROW(twice.add_float("k", 2.0), ValueError);
  EXPECT_EQ(
      DatapointDecoder::structure(layout_of(std::move(twice).finish()), true)->elements.size(), 1u);
  // Used after finish(): an Error, not a key "18446744073709551615".
  EXPECT_EQ(twice.size(), 0u);  // NOLINT(bugprone-use-after-move): the point
  EXPECT_THROW(twice.add_int("k2", 1), Error);
  EXPECT_THROW(std::move(twice).finish(), Error);
}

TEST(DatapointDecoder, RejectsATagThatIsNotAValue) {
  Json m = sample_metadata();
  m["leaves"][std::string(kDatapointTag)] = m["leaves"]["0"];
  m["leaves"].erase("0");
  m["non_tensors"].erase(std::string(kDatapointTag));
  EXPECT_THAT(decode_error(m), HasSubstr("must be a non-tensor value"));
}

TEST(DatapointDecoder, RejectsMalformedTags) {
  auto with_tag = [](Json tag) {
    Json m = sample_metadata();
    tag_of(m) = std::move(tag);
    return decode_error(m);
  };
  EXPECT_THAT(with_tag(5), HasSubstr("kinds must be a string"));
  EXPECT_THAT(with_tag(""), HasSubstr("unknown container"));
  EXPECT_THAT(with_tag("xifsyNcp"), HasSubstr("unknown container 'x'"));
  EXPECT_THAT(with_tag(Json::array({"lifsyNcp"})), HasSubstr("[kinds string, [keys]]"));
  EXPECT_THAT(with_tag(Json::array({"lifsyNcp", Json::array()})),
              HasSubstr("a dict tag needs its keys"));
  EXPECT_THAT(with_tag("difsyNcp"), HasSubstr("a dict tag needs its keys"));
  EXPECT_THAT(with_tag("lifsyNc"), HasSubstr("the tag lists 6 elements but the node holds 7"));
  EXPECT_THAT(with_tag("lifsyNcpp"), HasSubstr("the tag lists 8 elements"));
  EXPECT_THAT(with_tag("lifsyNcX"), HasSubstr("unknown element kind 'X'"));
  EXPECT_THAT(with_tag("oifsyNcp"), HasSubstr("exactly one element"));
}

TEST(DatapointDecoder, RejectsKindsThatDoNotMatchTheirEntries) {
  auto with_kinds = [](const char* kinds) {
    Json m = sample_metadata();
    tag_of(m) = kinds;
    return decode_error(m);
  };
  EXPECT_THAT(with_kinds("lffsyNcp"), HasSubstr("'0': kind 'f' needs a 0-d torch.float64 leaf"));
  EXPECT_THAT(with_kinds("libsyNcp"), HasSubstr("'1': kind 'b' needs a 0-d torch.bool leaf"));
  EXPECT_THAT(with_kinds("liisyNcp"), HasSubstr("kind 'i' needs a 0-d torch.int64"));
  EXPECT_THAT(with_kinds("sifsyNcp"), HasSubstr(""));  // 's' is no container
  EXPECT_THAT(with_kinds("lgfsyNcp"), HasSubstr(""));  // a 0-d int64 is a valid scalar
  EXPECT_THAT(with_kinds("lisfyNcp"), HasSubstr("kind 's' needs a 1-d torch.uint8"));
  EXPECT_THAT(with_kinds("lifsNNcp"), HasSubstr("'3': kind 'N' needs a null value"));
  EXPECT_THAT(with_kinds("lifsycNp"), HasSubstr("kind 'c' needs a nested node"));
  EXPECT_THAT(with_kinds("lifsyNnp"), HasSubstr("kind 'n' needs a tensor leaf"));
  EXPECT_THAT(with_kinds("lifsyccp"), HasSubstr("kind 'c' needs a nested node"));
}

TEST(DatapointDecoder, RejectsBadDictKeys) {
  Json m = sample_metadata();
  Json& inner = m["5"];
  Json& tag = tag_of(inner);
  tag[1] = Json::array({"a", 3});
  EXPECT_THAT(decode_error(m), HasSubstr("dict key 1 is not a string"));
  tag[1] = Json::array({"a", "a"});
  EXPECT_THAT(decode_error(m), HasSubstr("'5'/'a': key appears twice"));
  tag[1] = Json::array({"a", "c"});
  EXPECT_THAT(decode_error(m), HasSubstr("'5'/'c': listed by the tag but not in the node"));
  tag[1] = Json::array({"a", std::string(kDatapointTag)});
  EXPECT_THAT(decode_error(m), HasSubstr("may not be the tag's name"));
  tag[1] = Json::array({"a"});
  EXPECT_THAT(decode_error(m), HasSubstr("2 kinds but 1 keys"));
}

TEST(DatapointDecoder, RejectsANestedNodeWithoutTag) {
  Json m = sample_metadata();
  m["5"]["non_tensors"].erase(std::string(kDatapointTag));
  EXPECT_THAT(decode_error(m), HasSubstr("'5': a nested container without a tag"));
}

TEST(DatapointDecoder, RejectsNestingDeeperThanTheLimit) {
  TensorDict td = DatapointEncoder(Container::List).finish();
  for (int i = 0; i < kMaxDatapointDepth + 1; ++i) {
    DatapointEncoder e(Container::List);
    e.add_node({}, std::move(td));
    td = std::move(e).finish();
  }
  EXPECT_THAT(decode_error(*consolidate(td).consolidated()->metadata),
              HasSubstr("nested deeper than 32"));
}

TEST(DatapointDecoder, RefusesPickleUnlessAllowed) {
  EXPECT_THAT(decode_error(sample_metadata(), false),
              HasSubstr("'6': a pickled object, and this receiver does not unpickle"));
  EXPECT_EQ(decode_error(sample_metadata(), true), "");
}

TEST(DatapointStructureCache, MakesAStructureOncePerMetadataAndPickleRule) {
  TensorDict c = consolidate(sample());
  const auto& meta = c.consolidated()->metadata;
  const uint64_t bytes = c.consolidated()->storage.nbytes();
  DatapointStructureCache cache;
  std::shared_ptr<const DatapointNode> n = cache.get(meta, bytes, nullptr, true);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->elements.size(), 7u);
  EXPECT_EQ(cache.get(meta, bytes, nullptr, true), n);  // the same structure, not a new one
  // The pickle rule is part of the key: the same schema is refused without it.
  EXPECT_THROW(cache.get(meta, bytes, nullptr, false), ProtocolError);
  ConsolidatedLayout l = layout_of(c);
  EXPECT_NE(cache.get(l.metadata_ptr(), bytes, &l, true), nullptr);
  TensorDict plain = consolidate(TensorDict());  // no tag: not a datapoint
  EXPECT_EQ(cache.get(plain.consolidated()->metadata, 0, nullptr, true), nullptr);
}

// A structure the caller holds stays valid when the cache empties itself (64 schemas
// later): the Python binding walks one while other threads decode other schemas.
TEST(DatapointStructureCache, AStructureHeldOutlivesTheCacheEmptyingItself) {
  TensorDict c = consolidate(sample());
  DatapointStructureCache cache;
  std::shared_ptr<const DatapointNode> held =
      cache.get(c.consolidated()->metadata, c.consolidated()->storage.nbytes(), nullptr, true);
  std::vector<TensorDict> others;
  for (int i = 0; i < 70; ++i) {
    others.push_back(consolidate(sample()));  // a metadata object of its own: a new entry
    cache.get(others.back().consolidated()->metadata,
              others.back().consolidated()->storage.nbytes(), nullptr, true);
  }
  EXPECT_EQ(held.use_count(), 1);  // the cache let go of it; it is still ours
  EXPECT_EQ(held->elements.size(), 7u);
}

TEST(DatapointDecoder, RejectsStringsThatAreNotUtf8) {
  for (std::string bad : {"\xff", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"}) {
    DatapointEncoder e(Container::List);
    e.add_bytes({}, std::as_bytes(std::span(bad)));
    TensorDict c = consolidate(std::move(e).finish());
    // The same bytes relabelled as a string.
    Json m = *c.consolidated()->metadata;
    tag_of(m) = "ls";
    ConsolidatedLayout l =
        ConsolidatedLayout::parse(m, Limits{}, c.consolidated()->storage.nbytes());
    auto root = DatapointDecoder::structure(l, true);
    EXPECT_THROW(DatapointDecoder::read_str(c.consolidated()->storage, root->elements[0]),
                 ProtocolError)
        << bad;
  }
}

}  // namespace
}  // namespace tensorwire::wire
