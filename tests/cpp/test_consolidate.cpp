// consolidate(): one storage, tensordict's metadata, 8-byte-aligned leaves, zeroed padding.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "tensorwire/core/consolidate.h"
#include "tensorwire/wire/layout.h"

namespace tensorwire {
namespace {

using ::testing::ElementsAre;

Tensor fill_f32(Shape shape, float value) {
  std::vector<float> v(static_cast<size_t>(checked_numel(shape)), value);
  return Tensor::from_vector(v, std::move(shape));
}

// {"a": f32[3,4], "b": {"c": bool[3]}, "s": "hi"}, batch [3]: the example of the format.
TensorDict example() {
  TensorDict td({3});
  td.set("a", fill_f32({3, 4}, 1.5f));
  Tensor c = Tensor::zeros({3}, DType::Bool);
  c.at<bool>({1}) = true;
  td.set({"b", "c"}, c);
  td.set("s", NonTensor{"hi"});
  return td;
}

TEST(Consolidate, MetadataHasTensordictsExactStructure) {
  TensorDict c = consolidate(example());
  const Json& meta = *c.consolidated()->metadata;

  EXPECT_EQ(meta["cls"], "TensorDict");
  EXPECT_EQ(meta["leaves"]["a"], Json::parse(R"(["torch.float32", [3, 4], 0, 48, 0])"));
  EXPECT_EQ(meta["b"]["cls"], "TensorDict");
  EXPECT_EQ(meta["b"]["leaves"]["c"], Json::parse(R"(["torch.bool", [3], 48, 56, 5])"));
  EXPECT_EQ(meta["non_tensors"]["s"], Json::parse(R"(["hi", [3], null])"));
  EXPECT_EQ(meta["cls_metadata"]["names"], Json::parse("[null]"));
  EXPECT_EQ(meta["cls_metadata"]["batch_size"], Json::parse("[3]"));
  EXPECT_EQ(meta["cls_metadata"]["device"], nullptr);
  EXPECT_EQ(meta["b"]["cls_metadata"]["batch_size"], Json::parse("[3]"));
  EXPECT_TRUE(meta["b"]["leaves"].is_object());
  EXPECT_TRUE(meta["b"]["non_tensors"].empty());
  EXPECT_EQ(c.consolidated()->storage.nbytes(), 56u);
}

TEST(Consolidate, PaddingBytesAreZero) {
  TensorDict c = consolidate(example());
  const std::byte* base = c.consolidated()->storage.data();
  for (size_t i = 51; i < 56; ++i) EXPECT_EQ(base[i], std::byte{0}) << "byte " << i;
}

TEST(Consolidate, LeavesAreViewsIntoOneStorage) {
  TensorDict c = consolidate(example());
  const Storage& storage = c.consolidated()->storage;
  const Tensor& a = c.get("a");
  const Tensor& b_c = c.get({"b", "c"});
  EXPECT_TRUE(a.storage().same(storage));
  EXPECT_TRUE(b_c.storage().same(storage));
  EXPECT_EQ(a.offset(), 0u);
  EXPECT_EQ(b_c.offset(), 48u);
  EXPECT_EQ(a.data(), storage.data());
  float x;
  std::memcpy(&x, storage.data() + 44, sizeof x);
  EXPECT_EQ(x, 1.5f);
  EXPECT_EQ(static_cast<uint8_t>(storage.data()[49]), 1u);
}

TEST(Consolidate, ValuesAndNonTensorsAreKept) {
  TensorDict td = example();
  TensorDict c = consolidate(td);
  std::string why;
  EXPECT_TRUE(equal(td, c, &why)) << why;
  EXPECT_EQ(c.get_non_tensor("s"), "hi");
}

TEST(Consolidate, ResultIsLockedAndConsolidatedRoot) {
  TensorDict td = example();
  EXPECT_FALSE(is_consolidated_root(td));
  TensorDict c = consolidate(td);
  EXPECT_TRUE(c.is_locked());
  EXPECT_TRUE(c.is_consolidated());
  EXPECT_TRUE(is_consolidated_root(c));
  // A sub-dict shares the consolidation but is not its root.
  EXPECT_TRUE(c.get_tensordict("b").is_consolidated());
  EXPECT_FALSE(is_consolidated_root(c.get_tensordict("b")));
  // The original is untouched.
  EXPECT_FALSE(td.is_consolidated());
  EXPECT_FALSE(td.is_locked());
}

TEST(Consolidate, CopiesOfAConsolidatedRootAreStillRoots) {
  TensorDict c = consolidate(example());
  TensorDict copy = c;
  EXPECT_TRUE(is_consolidated_root(copy));
  EXPECT_EQ(copy.consolidated(), c.consolidated());
}

TEST(Consolidate, UnlockingASubDictMeansTheRootIsNoLongerConsolidated) {
  TensorDict c = consolidate(example());
  c.get_tensordict("b").unlock_();
  EXPECT_FALSE(is_consolidated_root(c));
}

TEST(Consolidate, ConsolidateOfAConsolidatedRootReturnsItUnchanged) {
  TensorDict c = consolidate(example());
  TensorDict again = consolidate(c);
  EXPECT_EQ(again.consolidated(), c.consolidated());
  EXPECT_EQ(again.get("a").data(), c.get("a").data());
}

TEST(Consolidate, ConsolidateOfANonRootMakesNewStorage) {
  TensorDict c = consolidate(example());
  TensorDict sub = consolidate(c.get_tensordict("b"));
  EXPECT_NE(sub.consolidated(), c.consolidated());
  EXPECT_TRUE(is_consolidated_root(sub));
  EXPECT_EQ(sub.consolidated()->storage.nbytes(), 8u);
  EXPECT_EQ(sub.get("c").offset(), 0u);
}

TEST(Consolidate, AlignmentOptionPlacesLeavesAtItsMultiples) {
  TensorDict c = consolidate(example(), {.alignment = 64});
  const Json& meta = *c.consolidated()->metadata;
  EXPECT_EQ(meta["leaves"]["a"], Json::parse(R"(["torch.float32", [3, 4], 0, 64, 16])"));
  EXPECT_EQ(meta["b"]["leaves"]["c"], Json::parse(R"(["torch.bool", [3], 64, 128, 61])"));
  EXPECT_EQ(c.get({"b", "c"}).offset(), 64u);
  EXPECT_EQ(c.consolidated()->storage.nbytes(), 128u);
  const std::byte* base = c.consolidated()->storage.data();
  for (size_t i = 48; i < 64; ++i) EXPECT_EQ(base[i], std::byte{0}) << "byte " << i;
  for (size_t i = 67; i < 128; ++i) EXPECT_EQ(base[i], std::byte{0}) << "byte " << i;
}

TEST(Consolidate, AlignmentMustBeAPowerOfTwoOfAtLeastEight) {
  EXPECT_THROW(consolidate(example(), {.alignment = 0}), ValueError);
  EXPECT_THROW(consolidate(example(), {.alignment = 12}), ValueError);
  // Below 8, a float64 after a bool would start at an odd offset: unreadable (load and
  // tensordict refuse it).
  for (size_t a : {1u, 2u, 4u}) EXPECT_THROW(consolidate(example(), {.alignment = a}), ValueError);
  EXPECT_NO_THROW(consolidate(example(), {.alignment = 8}));
}

// tensordict lists a stack's elements along its stack_dim: element j of a stack of batch
// [2, 3] stacked along dim 1 is its column j. Written so, and read back in place.
TEST(Consolidate, AStackAlongALaterDimListsItsElementsAlongThatDim) {
  NonTensorStack st;
  st.batch_size = {2, 3};
  st.stack_dim = 1;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      st.values.push_back("r" + std::to_string(i) + "c" + std::to_string(j));
  TensorDict td({2, 3});
  td.set("s", st);
  TensorDict c = consolidate(td);
  const Json& meta = *c.consolidated()->metadata;
  EXPECT_EQ(meta["s"]["0"]["non_tensors"]["1"][0], "r1c0");  // column 0, row 1
  EXPECT_EQ(meta["s"]["2"]["non_tensors"]["0"][0], "r0c2");
  TensorDict back = wire::view_consolidated(c.consolidated()->storage, meta);
  EXPECT_EQ(back.entry(Key("s")).non_tensor_stack(), st);

  NonTensorStack deep;  // three dims, stacked along the last
  deep.batch_size = {2, 3, 4};
  deep.stack_dim = 2;
  for (int v = 0; v < 24; ++v) deep.values.push_back(v);
  TensorDict d({2, 3, 4});
  d.set("s", deep);
  TensorDict cd = consolidate(d);
  EXPECT_EQ(wire::view_consolidated(cd.consolidated()->storage, *cd.consolidated()->metadata)
                .entry(Key("s"))
                .non_tensor_stack(),
            deep);
}

TEST(Consolidate, StridedLeavesArePackedRowMajor) {
  TensorDict td({3});
  Tensor base = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  td.set("t", Tensor::view(base.storage(), 0, {3, 2}, DType::Float32, {1, 3}));
  TensorDict c = consolidate(td);
  EXPECT_TRUE(c.get("t").is_contiguous());
  const float* p = c.get("t").data<float>();
  EXPECT_EQ(std::vector<float>(p, p + 6), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(Consolidate, LeavesAreLaidOutDepthFirstInInsertionOrder) {
  TensorDict td(Shape{});
  td.set("z", Tensor::zeros({2}, DType::Int64));
  td.set({"m", "x"}, Tensor::zeros({1}, DType::Int8));
  td.set({"m", "y"}, Tensor::zeros({1}, DType::Int32));
  td.set("a", Tensor::zeros({3}, DType::Float64));
  ConsolidatedPlan plan = plan_consolidation(td);
  EXPECT_THAT(plan.offsets, ElementsAre(0u, 16u, 24u, 32u));
  EXPECT_EQ(plan.total_bytes, 56u);
  std::vector<size_t> visited;
  TensorDict c = consolidate(td);
  for_each_leaf(c, [&](const Tensor& t) { visited.push_back(t.offset()); });
  EXPECT_THAT(visited, ElementsAre(0u, 16u, 24u, 32u));
}

TEST(Consolidate, EmptyTensorDictConsolidatesToAnEmptyStorage) {
  TensorDict c = consolidate(TensorDict({4}));
  EXPECT_EQ(c.consolidated()->storage.nbytes(), 0u);
  EXPECT_TRUE(is_consolidated_root(c));
}

TEST(Consolidate, NonTensorStackIsWrittenAsTensordictsNonTensorStackChild) {
  TensorDict td({2});
  td.set("names", NonTensorStack{{2}, 0, {"x", "y"}});
  TensorDict c = consolidate(td);
  const Json& node = (*c.consolidated()->metadata)["names"];
  EXPECT_EQ(node["cls"], "NonTensorStack");
  EXPECT_EQ(node["non_tensors"]["0"][0], "x");
  EXPECT_EQ(node["non_tensors"]["1"][0], "y");
  EXPECT_EQ(node["cls_metadata"]["stack_dim"], 0);
  EXPECT_EQ(c.entry("names").non_tensor_stack().values, (std::vector<Json>{"x", "y"}));
}

TEST(Consolidate, SubDictsNamedLikeMetadataFieldsAreRejected) {
  TensorDict td(Shape{});
  td.set({"leaves", "x"}, Tensor::zeros({1}, DType::Float32));
  EXPECT_THROW(consolidate(td), ValueError);
}

TEST(Consolidate, NonCpuLeavesAreRejected) {
  TensorDict td(Shape{});
  Storage s = Storage::allocate(8);
  td.set("x", Tensor::view(s, 0, {2}, DType::Float32, {}, Device::cuda(0)));
  EXPECT_THROW(consolidate(td), ValueError);
}

TEST(Consolidate, PlanAndPackProduceWhatConsolidateProduces) {
  TensorDict td = example();
  ConsolidatedPlan plan = plan_consolidation(td);
  TensorDict c = consolidate(td);
  EXPECT_EQ(plan.metadata, *c.consolidated()->metadata);
  EXPECT_EQ(plan.total_bytes, c.consolidated()->storage.nbytes());
  EXPECT_THAT(plan.offsets, ElementsAre(0u, 48u));
  // Garbage in the destination must not survive packing, padding included.
  std::vector<std::byte> buffer(plan.total_bytes, std::byte{0xAB});
  pack(td, plan, buffer.data());
  EXPECT_EQ(std::memcmp(buffer.data(), c.consolidated()->storage.data(), plan.total_bytes), 0);
}

TEST(Consolidate, PackRefusesADictOfAnotherStructureThanItsPlanBeforeWritingPastIt) {
  TensorDict td = example();
  ConsolidatedPlan plan = plan_consolidation(td);
  std::vector<std::byte> buffer(plan.total_bytes);
  TensorDict more = td;
  more.set("z", Tensor::zeros({3, 4096}, DType::Float32));
  EXPECT_THROW(pack(more, plan, buffer.data()), ValueError);
  TensorDict fewer;
  EXPECT_THROW(pack(fewer, plan, buffer.data()), ValueError);
  ConsolidatedPlan one = plan_consolidation(fewer.set("x", Tensor::zeros({2}, DType::Float32)));
  std::vector<std::byte> small(one.total_bytes);
  TensorDict bigger;
  bigger.set("x", Tensor::zeros({4096}, DType::Float32));
  EXPECT_THROW(pack(bigger, one, small.data()), ValueError);
  TensorDict smaller;  // fits its place, but is not what the plan was made for
  smaller.set("x", Tensor::zeros({1}, DType::Float32));
  EXPECT_THROW(pack(smaller, one, small.data()), ValueError);
}

TEST(Consolidate, ConsolidatedMetadataNodesPointIntoTheSharedMetadata) {
  TensorDict c = consolidate(example());
  const Json& meta = *c.consolidated()->metadata;
  EXPECT_EQ(c.consolidated_metadata(), &meta);
  EXPECT_EQ(c.get_tensordict("b").consolidated_metadata(), &meta["b"]);
}

}  // namespace
}  // namespace tensorwire
