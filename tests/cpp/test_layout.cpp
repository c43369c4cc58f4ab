// ConsolidatedLayout::parse: validation of tensordict metadata from files and the wire.
// Every rejection is a ProtocolError naming the key path and the rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tensorwire/wire/layout.h"

namespace tensorwire::wire {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The metadata consolidate() writes for
// {"a": f32[3,4], "b": {"c": bool[3]}, "s": "hi"}, batch [3]: 56 bytes of storage.
Json valid_metadata() {
  return Json::parse(R"({
    "cls": "TensorDict",
    "non_tensors": {"s": ["hi", [3], null]},
    "leaves": {"a": ["torch.float32", [3, 4], 0, 48, 0]},
    "cls_metadata": {"device": null, "names": [null], "batch_size": [3], "is_locked": false},
    "b": {
      "cls": "TensorDict",
      "non_tensors": {},
      "leaves": {"c": ["torch.bool", [3], 48, 56, 5]},
      "cls_metadata": {"device": null, "names": [null], "batch_size": [3], "is_locked": false}
    }
  })");
}

// A root with no batch dims holding just `leaves`.
Json root_with_leaves(Json leaves) {
  Json m = Json::parse(R"({"cls": "TensorDict", "non_tensors": {}, "leaves": {},
                           "cls_metadata": {"batch_size": []}})");
  m["leaves"] = std::move(leaves);
  return m;
}

// parse() must throw a ProtocolError naming `path` and containing `rule`.
void expect_rejected(Json meta, const std::string& path, const std::string& rule,
                     const Limits& limits = {},
                     std::optional<uint64_t> storage_bytes = std::nullopt) {
  try {
    ConsolidatedLayout::parse(std::move(meta), limits, storage_bytes);
    ADD_FAILURE() << "expected ProtocolError at '" << path << "': " << rule;
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'" + path + "'"), HasSubstr(rule)));
  }
}

TEST(Layout, ParsesValidMetadataAndInstantiatesViews) {
  ConsolidatedLayout layout = ConsolidatedLayout::parse(valid_metadata(), Limits{}, 56);
  EXPECT_EQ(layout.total_bytes(), 56u);
  EXPECT_EQ(layout.num_leaves(), 2u);
  Storage storage = Storage::allocate(56);
  TensorDict td = layout.instantiate(storage);
  EXPECT_EQ(td.batch_size(), (Shape{3}));
  EXPECT_EQ(td.get("a").shape(), (Shape{3, 4}));
  EXPECT_EQ(td.get("a").data(), storage.data());
  EXPECT_EQ(td.get({"b", "c"}).dtype(), DType::Bool);
  EXPECT_EQ(td.get({"b", "c"}).offset(), 48u);
  EXPECT_EQ(td.get_non_tensor("s"), "hi");
  EXPECT_TRUE(td.is_consolidated());
  EXPECT_FALSE(td.is_locked());
  EXPECT_EQ(td.consolidated()->metadata, layout.metadata_ptr());
}

TEST(Layout, InstantiatedKeysFollowStorageOrderNotJsonOrder) {
  // Leaves listed out of storage order come back in storage (= insertion) order.
  Json m = root_with_leaves(Json::parse(R"({"late": ["torch.int64", [1], 8, 16, 0],
                                            "early": ["torch.int64", [1], 0, 8, 0]})"));
  TensorDict td = ConsolidatedLayout::parse(m, Limits{}).instantiate(Storage::allocate(16));
  EXPECT_EQ(td.items()[0].first, "early");
  EXPECT_EQ(td.items()[1].first, "late");
}

TEST(Layout, InstantiateRejectsAStorageSmallerThanTheLayout) {
  ConsolidatedLayout layout = ConsolidatedLayout::parse(valid_metadata(), Limits{});
  EXPECT_THROW(layout.instantiate(Storage::allocate(55)), ValueError);
}

TEST(Layout, RejectsANonObjectRoot) {
  expect_rejected(Json::array(), "<root>", "must be a JSON object");
}

TEST(Layout, RejectsAMissingField) {
  Json m = valid_metadata();
  m.erase("leaves");
  expect_rejected(m, "<root>", "missing \"leaves\"");
  m = valid_metadata();
  m["b"].erase("cls_metadata");
  expect_rejected(m, "b", "missing \"cls_metadata\"");
}

TEST(Layout, RejectsAnUnknownDtype) {
  Json m = valid_metadata();
  m["b"]["leaves"]["c"][0] = "torch.float128";
  expect_rejected(m, "b.c", "unknown dtype 'torch.float128'");
  m["b"]["leaves"]["c"][0] = 5;
  expect_rejected(m, "b.c", "dtype must be a string");
}

TEST(Layout, RejectsNegativeDims) {
  Json m = valid_metadata();
  m["leaves"]["a"][1] = Json::parse("[3, -4]");
  expect_rejected(m, "a", "non-negative integer");
}

TEST(Layout, RejectsNonIntegerDims) {
  Json m = valid_metadata();
  m["leaves"]["a"][1] = Json::parse("[3, 4.0]");
  expect_rejected(m, "a", "non-negative integer");
  m["leaves"]["a"][1] = Json::parse(R"([3, "4"])");
  expect_rejected(m, "a", "non-negative integer");
  m["leaves"]["a"][1] = 12;
  expect_rejected(m, "a", "must be a list");
}

TEST(Layout, RejectsAShapeWhoseElementCountOverflows) {
  Json m = root_with_leaves(Json::parse(
      R"({"big": ["torch.float32", [4611686018427387904, 4611686018427387904], 0, 0, 0]})"));
  expect_rejected(m, "big", "2^63");
}

TEST(Layout, RejectsAShapeWhoseByteSizeOverflows) {
  // 2^62 elements fit in int64, but not 2^62 x 8 bytes in uint64.
  Json m = root_with_leaves(
      Json::parse(R"({"big": ["torch.float64", [4611686018427387904], 0, 0, 0]})"));
  expect_rejected(m, "big", "overflows");
}

TEST(Layout, RejectsTooManyDims) {
  Limits limits;
  limits.max_dims = 2;
  Json m = valid_metadata();
  m["leaves"]["a"][1] = Json::parse("[3, 1, 4]");
  expect_rejected(m, "a", "dims", limits);
}

TEST(Layout, RejectsALeafWhoseShapeDoesNotStartWithTheBatchSize) {
  Json m = valid_metadata();
  m["leaves"]["a"][1] = Json::parse("[4, 3]");
  expect_rejected(m, "a", "does not start with batch_size");
}

TEST(Layout, RejectsStopMinusStartMinusPadDifferentFromTheLeafSize) {
  Json m = valid_metadata();
  m["leaves"]["a"][3] = 52;  // 52 - 0 - 0 != 48
  expect_rejected(m, "a", "must equal the leaf's size 48");
  m = valid_metadata();
  m["b"]["leaves"]["c"][4] = 4;  // 56 - 48 - 4 != 3
  expect_rejected(m, "b.c", "must equal the leaf's size 3");
  m = valid_metadata();
  m["b"]["leaves"]["c"][4] = 9;  // pad larger than the span
  expect_rejected(m, "b.c", "must equal the leaf's size 3");
}

TEST(Layout, RejectsStopBeforeStart) {
  Json m = valid_metadata();
  m["leaves"]["a"][2] = 48;
  m["leaves"]["a"][3] = 0;
  expect_rejected(m, "a", "before start");
}

TEST(Layout, RejectsNegativeOrNonIntegerOffsets) {
  Json m = valid_metadata();
  m["leaves"]["a"][2] = -8;
  expect_rejected(m, "a", "start must be a non-negative integer");
  m = valid_metadata();
  m["leaves"]["a"][3] = 48.5;
  expect_rejected(m, "a", "stop must be a non-negative integer");
}

TEST(Layout, RejectsAMisalignedStart) {
  Json m = root_with_leaves(Json::parse(R"({"x": ["torch.float32", [2], 2, 10, 0]})"));
  expect_rejected(m, "x", "not aligned");
  m = root_with_leaves(Json::parse(R"({"x": ["torch.float64", [1], 4, 12, 0]})"));
  expect_rejected(m, "x", "not aligned");
  // One-byte elements may start anywhere.
  m = root_with_leaves(Json::parse(R"({"x": ["torch.uint8", [3], 5, 8, 0]})"));
  EXPECT_NO_THROW(ConsolidatedLayout::parse(m, Limits{}));
}

TEST(Layout, RejectsALeafPastTheStorage) {
  expect_rejected(valid_metadata(), "b.c", "past the storage's 55 bytes", Limits{}, 55);
  EXPECT_NO_THROW(ConsolidatedLayout::parse(valid_metadata(), Limits{}, 56));
}

TEST(Layout, RejectsOverlappingLeavesNamingThem) {
  Json m = valid_metadata();
  m["b"]["leaves"]["c"] = Json::parse(R"(["torch.bool", [3], 40, 48, 5])");
  expect_rejected(m, "b.c", "overlap");
}

TEST(Layout, RejectsOverlapHiddenBehindAnEmptyLeaf) {
  // "mid" has no bytes and sorts between the two overlapping leaves.
  Json m = root_with_leaves(Json::parse(R"({
    "wide": ["torch.float32", [25], 0, 100, 0],
    "mid": ["torch.float32", [0], 52, 52, 0],
    "inner": ["torch.float32", [2], 56, 64, 0]})"));
  expect_rejected(m, "inner", "overlap");
}

TEST(Layout, AcceptsEmptyLeavesAnywhere) {
  Json m = root_with_leaves(Json::parse(R"({
    "x": ["torch.float32", [2], 0, 8, 0],
    "e": ["torch.float32", [0], 0, 0, 0],
    "y": ["torch.float32", [2], 8, 16, 0]})"));
  EXPECT_NO_THROW(ConsolidatedLayout::parse(m, Limits{}));
}

TEST(Layout, RejectsAKeyInBothLeavesAndNonTensors) {
  Json m = valid_metadata();
  m["non_tensors"]["a"] = Json::parse(R"(["dup", [3], null])");
  expect_rejected(m, "a", "key appears twice");
}

TEST(Layout, RejectsAKeyInBothNonTensorsAndSubDicts) {
  Json m = valid_metadata();
  m["non_tensors"]["b"] = Json::parse(R"(["dup", [3], null])");
  expect_rejected(m, "b", "key appears twice");
}

TEST(Layout, RejectsAChildBatchSizeThatDoesNotStartWithTheParents) {
  Json m = valid_metadata();
  m["b"]["cls_metadata"]["batch_size"] = Json::parse("[4]");
  expect_rejected(m, "b", "does not start with the parent's [3]");
  m["b"]["cls_metadata"]["batch_size"] = Json::parse("[]");
  expect_rejected(m, "b", "does not start with the parent's [3]");
}

TEST(Layout, AcceptsAChildWithMoreBatchDims) {
  Json m = valid_metadata();
  m["b"]["cls_metadata"]["batch_size"] = Json::parse("[3, 1]");
  m["b"]["cls_metadata"]["names"] = Json::parse("[null, null]");
  m["b"]["leaves"]["c"][1] = Json::parse("[3, 1]");
  EXPECT_NO_THROW(ConsolidatedLayout::parse(m, Limits{}, 56));
}

TEST(Layout, RejectsNestingDeeperThanMaxDepth) {
  Limits limits;
  limits.max_depth = 1;
  Json m = valid_metadata();
  EXPECT_NO_THROW(ConsolidatedLayout::parse(m, limits));  // b is at depth 1
  Json deeper = valid_metadata()["b"];
  deeper["leaves"] = Json::object();
  m["b"]["d"] = deeper;
  expect_rejected(m, "b.d", "max_depth", limits);
}

TEST(Layout, RejectsNonTensorValuesNestedDeeperThanMaxDepth) {
  Limits limits;
  limits.max_depth = 2;
  Json m = valid_metadata();
  m["non_tensors"]["s"][0] = Json::parse("[[1]]");  // 2 levels: at the limit
  EXPECT_NO_THROW(ConsolidatedLayout::parse(m, limits));
  m["non_tensors"]["s"][0] = Json::parse(R"([{"a": [1]}])");  // 3 levels
  expect_rejected(m, "s", "more than 2 levels deep (Limits::max_depth", limits);
  // The same for an element of a non-tensor stack.
  Json st = Json::parse(R"({"cls": "NonTensorStack", "leaves": {},
      "non_tensors": {"0": [1, [], null], "1": [[[[1]]], [], null]},
      "cls_metadata": {"stack_dim": 0}})");
  m = valid_metadata();
  m["st"] = st;
  expect_rejected(m, "st.1", "more than 2 levels deep", limits);
}

TEST(Layout, RejectsMoreEntriesThanMaxLeaves) {
  Limits limits;
  limits.max_leaves = 3;  // a, s, b: fine; b.c is the fourth
  expect_rejected(valid_metadata(), "b.c", "max_leaves", limits);
  limits.max_leaves = 4;
  EXPECT_NO_THROW(ConsolidatedLayout::parse(valid_metadata(), limits));
}

TEST(Layout, RejectsARaggedLeaf) {
  Json m = valid_metadata();
  m["leaves"]["a"].push_back(Json::parse(R"({"offsets": [0, 2]})"));
  expect_rejected(m, "a", "ragged");
  m = valid_metadata();
  m["leaves"]["a"] = Json::parse(R"(["torch.float32", [3, 4], 0, 48])");
  expect_rejected(m, "a", "[dtype, shape, start, stop, pad]");
}

TEST(Layout, RejectsAnUnknownCls) {
  Json m = valid_metadata();
  m["b"]["cls"] = "LazyStackedTensorDict";
  expect_rejected(m, "b", "LazyStackedTensorDict");
  m = valid_metadata();
  m["cls"] = "TensorDictBase";
  expect_rejected(m, "<root>", "not supported");
}

TEST(Layout, RejectsAnUnknownDevice) {
  Json m = valid_metadata();
  m["cls_metadata"]["device"] = "tpu";
  expect_rejected(m, "<root>", "unknown device 'tpu'");
}

TEST(Layout, RejectsMalformedNonTensorEntries) {
  Json m = valid_metadata();
  m["non_tensors"]["s"] = "hi";
  expect_rejected(m, "s", "[value, batch_size, device]");
}

TEST(Layout, ParsesANonTensorStackChild) {
  Json m = valid_metadata();
  m["names"] = Json::parse(R"({
    "cls": "NonTensorStack", "leaves": {},
    "non_tensors": {"0": ["x", [], null], "1": ["y", [], null], "2": ["z", [], null]},
    "cls_metadata": {"stack_dim": 0}})");
  TensorDict td = ConsolidatedLayout::parse(m, Limits{}).instantiate(Storage::allocate(56));
  const NonTensorStack& st = td.entry("names").non_tensor_stack();
  EXPECT_EQ(st.batch_size, (Shape{3}));
  EXPECT_EQ(st.values, (std::vector<Json>{"x", "y", "z"}));
}

TEST(Layout, RejectsANonTensorStackWithAMissingElement) {
  Json m = valid_metadata();
  m["names"] = Json::parse(R"({
    "cls": "NonTensorStack", "leaves": {},
    "non_tensors": {"0": ["x", [], null], "2": ["z", [], null]}, "cls_metadata": {}})");
  expect_rejected(m, "names", "element 1 missing");
}

TEST(Layout, RejectsANonTensorStackHoldingTensors) {
  Json m = valid_metadata();
  m["names"] = Json::parse(R"({
    "cls": "NonTensorStack", "leaves": {"t": ["torch.uint8", [1], 0, 1, 0]},
    "non_tensors": {}, "cls_metadata": {}})");
  expect_rejected(m, "names", "cannot hold tensor leaves");
}

}  // namespace
}  // namespace tensorwire::wire
