// TensorDict: nested keys, batch-size checks, access errors, update_, select, locking, equal.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tensorwire/core/consolidate.h"
#include "tensorwire/core/tensordict.h"

namespace tensorwire {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Tensor fill_f32(Shape shape, float value) {
  std::vector<float> v(static_cast<size_t>(checked_numel(shape)), value);
  return Tensor::from_vector(v, std::move(shape));
}

// {"obs": f32[3,4], "info": {"reward": f32[3], "done": bool[3]}, "task": "walk"}, batch [3].
TensorDict sample() {
  TensorDict td({3});
  td.set("obs", fill_f32({3, 4}, 1.0f));
  td.set({"info", "reward"}, fill_f32({3}, 2.0f));
  td.set({"info", "done"}, Tensor::zeros({3}, DType::Bool));
  td.set("task", NonTensor{"walk"});
  return td;
}

std::vector<std::string> key_strs(const std::vector<Key>& keys) {
  std::vector<std::string> out;
  for (const Key& k : keys) out.push_back(k.str());
  return out;
}

TEST(Key, StrQuotesASingleNameAndParenthesisesAPath) {
  EXPECT_EQ(Key("a").str(), "'a'");
  EXPECT_EQ((Key{"info", "reward"}).str(), "('info', 'reward')");
  EXPECT_EQ((Key{"info", "reward"}).parent(), Key("info"));
  EXPECT_EQ(Key("info").child("reward"), (Key{"info", "reward"}));
}

TEST(TensorDict, NewTensorDictIsEmptyWithTheGivenBatchSize) {
  TensorDict td({3, 2});
  EXPECT_TRUE(td.empty());
  EXPECT_EQ(td.batch_size(), (Shape{3, 2}));
  EXPECT_EQ(td.batch_dims(), 2);
  EXPECT_FALSE(td.device().has_value());
  EXPECT_THAT(td.names(), ElementsAre(std::nullopt, std::nullopt));
  EXPECT_FALSE(td.is_locked());
  EXPECT_FALSE(td.is_consolidated());
}

TEST(TensorDict, ConstructorRejectsANegativeBatchSize) {
  EXPECT_THROW(TensorDict({-1}), ValueError);
}

TEST(TensorDict, SetNamesNeedsOneNamePerBatchDim) {
  TensorDict td({3, 2});
  td.set_names({"time", std::nullopt});
  EXPECT_EQ(td.names()[0], "time");
  EXPECT_THROW(td.set_names({"time"}), ValueError);
}

TEST(TensorDict, SetAndGetATensor) {
  TensorDict td({3});
  Tensor obs = fill_f32({3, 4}, 1.5f);
  td.set("obs", obs);
  EXPECT_TRUE(td.contains("obs"));
  EXPECT_EQ(td.size(), 1u);
  EXPECT_EQ(td.get("obs").data(), obs.data());  // stored by reference, not copied
}

// A default-constructed Tensor holds nothing: stored, it broke consolidate(), save() and a
// pipe on both ends (the peer refused the metadata sent for it).
TEST(TensorDict, AnUndefinedTensorIsRefusedWhereItIsSet) {
  EXPECT_FALSE(Tensor().defined());
  Tensor moved = Tensor::zeros({4}, DType::Float32);
  Tensor taken = std::move(moved);
  EXPECT_FALSE(moved.defined());  // NOLINT(bugprone-use-after-move): the point
  EXPECT_THROW(TensorDict().set("m", moved), ValueError);
  EXPECT_TRUE(Tensor::zeros({0, 3}, DType::Float32).defined());  // zero-size: defined
  EXPECT_TRUE(Tensor::zeros({}, DType::Float32).defined());
  TensorDict td;
  try {
    td.set("x", Tensor());
    FAIL() << "an undefined tensor was stored";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'x': the tensor is undefined"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(td.contains("x"));
}

// A moved-from Entry that held a TensorDict said "TensorDict" with nothing behind it:
// copying the dict that held it crashed.
TEST(TensorDict, AMovedFromEntryHoldsAnUndefinedTensor) {
  TensorDict td;
  td.set({"sub", "x"}, Tensor::zeros({2}, DType::Float32));
  Entry taken = std::move(td.entry("sub"));
  EXPECT_TRUE(taken.is_tensordict());
  EXPECT_TRUE(td.entry("sub").is_tensor());
  EXPECT_FALSE(td.entry("sub").tensor().defined());
  TensorDict copy = td;  // no crash
  EXPECT_TRUE(copy.contains("sub"));
}

TEST(TensorDict, SetReplacesAnExistingEntryInPlace) {
  TensorDict td = sample();
  td.set("obs", fill_f32({3, 1}, 9.0f));
  EXPECT_EQ(td.get("obs").shape(), (Shape{3, 1}));
  EXPECT_THAT(key_strs(td.keys()), ElementsAre("'obs'", "'info'", "'task'"));
}

TEST(TensorDict, SetWithAKeyPathCreatesIntermediateDicts) {
  TensorDict td({3});
  td.set({"info", "reward"}, fill_f32({3}, 1.0f));
  ASSERT_TRUE(td.contains("info"));
  const TensorDict& info = td.get_tensordict("info");
  EXPECT_EQ(info.batch_size(), (Shape{3}));  // the parent's batch size
  EXPECT_TRUE(info.contains("reward"));
  EXPECT_TRUE(td.contains({"info", "reward"}));
  EXPECT_EQ(td.get({"info", "reward"}).shape(), (Shape{3}));
}

TEST(TensorDict, SetWithADeepKeyPathCreatesEveryLevel) {
  TensorDict td({2});
  td.set({"a", "b", "c"}, fill_f32({2}, 1.0f));
  EXPECT_TRUE(td.get_tensordict({"a", "b"}).contains("c"));
}

TEST(TensorDict, SetRejectsTensorWhoseLeadingDimsDifferFromBatchSize) {
  TensorDict td({3});
  try {
    td.set("obs", fill_f32({4, 2}, 0.0f));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'obs'"), HasSubstr("[4, 2]"), HasSubstr("[3]")));
  }
  EXPECT_FALSE(td.contains("obs"));
}

TEST(TensorDict, SetRejectsTensorWithFewerDimsThanTheBatch) {
  TensorDict td({3, 2});
  EXPECT_THROW(td.set("x", fill_f32({3}, 0.0f)), ValueError);
}

TEST(TensorDict, SetChecksNestedTensorsAgainstTheSubDictsBatchSize) {
  TensorDict td({3});
  td.set("info", TensorDict({3, 2}));
  EXPECT_NO_THROW(td.set({"info", "r"}, fill_f32({3, 2}, 0.0f)));
  try {
    td.set({"info", "q"}, fill_f32({3}, 0.0f));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("('info', 'q')"), HasSubstr("[3, 2]")));
  }
}

TEST(TensorDict, SetRejectsASubDictWhoseBatchSizeDoesNotStartWithTheParents) {
  TensorDict td({3});
  EXPECT_THROW(td.set("info", TensorDict({4})), ValueError);
  EXPECT_NO_THROW(td.set("info", TensorDict({3, 5})));
}

TEST(TensorDict, SetRejectsANonTensorStackOfTheWrongShape) {
  TensorDict td({3});
  EXPECT_THROW(td.set("s", NonTensorStack{{3}, 0, {"a", "b"}}), ValueError);  // 2 values for 3
  EXPECT_THROW(td.set("s", NonTensorStack{{2}, 0, {"a", "b"}}), ValueError);  // batch mismatch
  EXPECT_NO_THROW(td.set("s", NonTensorStack{{3}, 0, {"a", "b", "c"}}));
}

TEST(NonTensorStack, FromNestedTakesOneArrayPerBatchDimAndGivesThemBack) {
  Json nested = Json::parse(R"([["a", "b"], ["c", "d"], ["e", "f"]])");
  NonTensorStack two = NonTensorStack::from_nested(nested, Shape{3, 2});
  EXPECT_EQ(two.values, (std::vector<Json>{"a", "b", "c", "d", "e", "f"}));
  EXPECT_EQ(two.to_nested(), nested);
  // Without a batch size only the outer array is the batch: inner arrays are values.
  NonTensorStack one = NonTensorStack::from_nested(nested);
  EXPECT_EQ(one.batch_size, Shape{3});
  EXPECT_EQ(one.values[0], Json::parse(R"(["a", "b"])"));
  EXPECT_EQ(one.to_nested(), nested);
}

TEST(NonTensorStack, FromNestedRejectsNestingThatDoesNotMatchTheBatchSize) {
  Json ragged = Json::parse(R"([["a", "b"], ["c"]])");
  EXPECT_THAT(
      [&] {
        NonTensorStack::from_nested(ragged, Shape{2, 2});
      },
      ::testing::ThrowsMessage<ValueError>(HasSubstr("do not match batch_size [2, 2]")));
  EXPECT_THROW(NonTensorStack::from_nested(Json("a")), ValueError);  // no batch dim
  EXPECT_THROW(NonTensorStack::from_nested(Json::array({"a"}), Shape{1}, 1), ValueError);
}

TEST(TensorDict, AllTrueLooksAtEveryElementOfEveryTensorLeaf) {
  TensorDict td({2});
  td.set("a", Tensor::from_vector<bool>({true, true}, {2}));
  td.set({"n", "b"}, Tensor::from_vector<int32_t>({1, -1}, {2}));
  td.set("s", NonTensor{false});  // ignored
  EXPECT_TRUE(all_true(td));
  td.set({"n", "b"}, Tensor::from_vector<int32_t>({1, 0}, {2}));
  EXPECT_FALSE(all_true(td));
}

// -0.0 is zero (false), as torch's all() says; the sign bit alone made it true.
TEST(TensorDict, AllTrueTakesMinusZeroForZero) {
  for (double minus_zero : {-0.0}) {
    TensorDict td({1});
    td.set("d", Tensor::from_vector<double>({minus_zero}, {1}));
    EXPECT_FALSE(all_true(td));
    td.set("d", Tensor::from_vector<float>({-0.0f}, {1}));
    EXPECT_FALSE(all_true(td));
    td.set("d", Tensor::from_vector<float>({-1.5f}, {1}));
    EXPECT_TRUE(all_true(td));
  }
  TensorDict c({1});  // complex: zero when both parts are (+-0)
  Tensor z = Tensor::zeros({1}, DType::Complex64);
  float* parts = static_cast<float*>(z.data());
  parts[0] = -0.0f, parts[1] = -0.0f;
  c.set("z", z);
  EXPECT_FALSE(all_true(c));
  parts[1] = 2.0f;
  EXPECT_TRUE(all_true(c));
}

TEST(TensorDict, SetRejectsAnEmptyKeyName) {
  TensorDict td({3});
  EXPECT_THROW(td.set("", fill_f32({3}, 0.0f)), KeyError);
}

TEST(TensorDict, SetThroughATensorIsATypeError) {
  TensorDict td = sample();
  EXPECT_THROW(td.set({"obs", "x"}, fill_f32({3}, 0.0f)), TypeError);
}

TEST(TensorDict, SetRejectsATensorOnAnotherDeviceThanTheDict) {
  TensorDict td({2}, Device::cpu());
  Storage s = Storage::allocate(8);
  Tensor gpu = Tensor::view(s, 0, {2}, DType::Float32, {}, Device::cuda(0));
  EXPECT_THROW(td.set("x", gpu), ValueError);
}

TEST(TensorDict, GetOfAMissingKeyIsAKeyErrorNamingIt) {
  TensorDict td = sample();
  try {
    td.get("action");
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'action'"));
  }
  EXPECT_THROW(td.get({"info", "missing"}), KeyError);
  EXPECT_THROW(td.get({"nope", "reward"}), KeyError);
  EXPECT_THROW(td.entry("nope"), KeyError);
}

TEST(TensorDict, GetOfTheWrongKindIsATypeError) {
  TensorDict td = sample();
  EXPECT_THROW(td.get("info"), TypeError);            // a sub-dict, not a tensor
  EXPECT_THROW(td.get("task"), TypeError);            // a non-tensor value
  EXPECT_THROW(td.get_tensordict("obs"), TypeError);  // a tensor, not a sub-dict
  EXPECT_THROW(td.get_non_tensor("obs"), TypeError);  // a tensor, not a value
  EXPECT_THROW(td.entry("obs").non_tensor(), TypeError);
  EXPECT_EQ(td.get_non_tensor("task"), "walk");
  try {
    td.get("info");
  } catch (const TypeError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'info'"), HasSubstr("TensorDict")));
  }
}

TEST(TensorDict, ErrorKindsAllDeriveFromError) {
  TensorDict td = sample();
  EXPECT_THROW(td.get("missing"), Error);
  EXPECT_THROW(td.get("info"), Error);
}

TEST(TensorDict, ContainsFollowsKeyPaths) {
  TensorDict td = sample();
  EXPECT_TRUE(td.contains("info"));
  EXPECT_TRUE(td.contains({"info", "done"}));
  EXPECT_FALSE(td.contains({"info", "obs"}));
  EXPECT_FALSE(td.contains({"obs", "x"}));  // through a tensor: simply not there
  EXPECT_FALSE(td.contains("reward"));
}

TEST(TensorDict, EraseRemovesAnEntryAndKeepsTheOthersInOrder) {
  TensorDict td = sample();
  td.erase("obs");
  EXPECT_FALSE(td.contains("obs"));
  td.erase({"info", "reward"});
  EXPECT_FALSE(td.contains({"info", "reward"}));
  EXPECT_TRUE(td.contains({"info", "done"}));
  EXPECT_THAT(key_strs(td.keys()), ElementsAre("'info'", "'task'"));
}

TEST(TensorDict, EraseOfAMissingKeyIsAKeyError) {
  TensorDict td = sample();
  EXPECT_THROW(td.erase("action"), KeyError);
  EXPECT_THROW(td.erase({"info", "action"}), KeyError);
  EXPECT_THROW(td.erase({"nope", "action"}), KeyError);
}

TEST(TensorDict, KeysAreInInsertionOrder) {
  TensorDict td(Shape{});
  td.set("z", fill_f32({}, 0.0f));
  td.set("a", fill_f32({}, 0.0f));
  td.set("m", fill_f32({}, 0.0f));
  EXPECT_THAT(key_strs(td.keys()), ElementsAre("'z'", "'a'", "'m'"));
}

TEST(TensorDict, KeysIncludeNestedPathsAfterTheirParent) {
  TensorDict td(Shape{});
  td.set("a", fill_f32({}, 0.0f));
  td.set({"b", "c"}, fill_f32({}, 0.0f));
  td.set({"b", "d", "e"}, fill_f32({}, 0.0f));
  td.set("f", NonTensor{1});

  EXPECT_THAT(key_strs(td.keys()), ElementsAre("'a'", "'b'", "'f'"));
  EXPECT_THAT(key_strs(td.keys(/*include_nested=*/true)),
              ElementsAre("'a'", "'b'", "('b', 'c')", "('b', 'd')", "('b', 'd', 'e')", "'f'"));
  EXPECT_THAT(key_strs(td.keys(/*include_nested=*/true, /*leaves_only=*/true)),
              ElementsAre("'a'", "('b', 'c')", "('b', 'd', 'e')", "'f'"));
  EXPECT_THAT(key_strs(td.keys(/*include_nested=*/false, /*leaves_only=*/true)),
              ElementsAre("'a'", "'f'"));
}

TEST(TensorDict, CopiesShareTensorDataButNotStructure) {
  TensorDict td = sample();
  TensorDict copy = td;
  copy.set("extra", fill_f32({3}, 0.0f));
  EXPECT_FALSE(td.contains("extra"));
  copy.get("obs").at<float>({0, 0}) = 7.0f;
  EXPECT_EQ((td.get("obs").at<float>({0, 0})), 7.0f);
}

TEST(TensorDict, CloneIsIndependentOfTheOriginal) {
  TensorDict td = sample();
  TensorDict c = td.clone();
  EXPECT_TRUE(equal(td, c));
  EXPECT_FALSE(c.get("obs").storage().same(td.get("obs").storage()));
  c.get("obs").at<float>({0, 0}) = 7.0f;
  c.get({"info", "reward"}).at<float>({1}) = 8.0f;
  c.set({"info", "new"}, fill_f32({3}, 0.0f));
  EXPECT_EQ((td.get("obs").at<float>({0, 0})), 1.0f);
  EXPECT_EQ(td.get({"info", "reward"}).at<float>({1}), 2.0f);
  EXPECT_FALSE(td.contains({"info", "new"}));
}

TEST(TensorDict, CloneOfAConsolidatedDictIsNeitherConsolidatedNorLocked) {
  TensorDict c = consolidate(sample()).clone();
  EXPECT_FALSE(c.is_consolidated());
  EXPECT_FALSE(c.is_locked());
  EXPECT_NO_THROW(c.set("x", fill_f32({3}, 0.0f)));
}

TEST(TensorDict, UpdateWritesIntoTheExistingTensorsInPlace) {
  TensorDict td = sample();
  const void* obs_memory = td.get("obs").data();
  TensorDict src({3});
  src.set("obs", fill_f32({3, 4}, 5.0f));
  src.set({"info", "reward"}, fill_f32({3}, 6.0f));
  src.set("task", NonTensor{"run"});
  td.update_(src);
  EXPECT_EQ(td.get("obs").data(), obs_memory);
  EXPECT_EQ((td.get("obs").at<float>({2, 3})), 5.0f);
  EXPECT_EQ(td.get({"info", "reward"}).at<float>({0}), 6.0f);
  EXPECT_EQ(td.get_non_tensor("task"), "run");
}

TEST(TensorDict, UpdateWritesThroughViewsIntoAConsolidatedStorage) {
  TensorDict c = consolidate(sample());
  TensorDict src({3});
  src.set({"info", "reward"}, fill_f32({3}, 6.0f));
  c.update_(src);
  const std::byte* base = c.consolidated()->storage.data();
  float x;
  std::memcpy(&x, base + c.get({"info", "reward"}).offset(), sizeof x);
  EXPECT_EQ(x, 6.0f);
}

TEST(TensorDict, UpdateRejectsUnknownKeysWithoutWritingAnything) {
  TensorDict td = sample();
  TensorDict src({3});
  src.set("obs", fill_f32({3, 4}, 5.0f));  // valid, and comes first
  src.set("action", fill_f32({3}, 1.0f));  // unknown to td
  try {
    td.update_(src);
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'action'"));
  }
  EXPECT_EQ((td.get("obs").at<float>({0, 0})), 1.0f);  // the earlier valid key was not written
  EXPECT_FALSE(td.contains("action"));
}

TEST(TensorDict, UpdateRejectsUnknownNestedKeysWithoutWritingAnything) {
  TensorDict td = sample();
  TensorDict src({3});
  src.set("obs", fill_f32({3, 4}, 5.0f));
  src.set({"info", "reward"}, fill_f32({3}, 6.0f));
  src.set({"info", "unknown"}, fill_f32({3}, 6.0f));
  try {
    td.update_(src);
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("('info', 'unknown')"));
  }
  EXPECT_EQ((td.get("obs").at<float>({0, 0})), 1.0f);
  EXPECT_EQ(td.get({"info", "reward"}).at<float>({0}), 2.0f);
}

TEST(TensorDict, UpdateRejectsShapeAndDtypeMismatchesWithoutWritingAnything) {
  TensorDict td = sample();
  TensorDict src({3});
  src.set("obs", fill_f32({3, 4}, 5.0f));
  src.set({"info", "reward"}, fill_f32({3, 2}, 6.0f));
  EXPECT_THROW(td.update_(src), ValueError);
  EXPECT_EQ((td.get("obs").at<float>({0, 0})), 1.0f);

  TensorDict src2({3});
  src2.set("obs", fill_f32({3, 4}, 5.0f));
  src2.set({"info", "reward"}, Tensor::zeros({3}, DType::Complex64));  // no complex casts
  EXPECT_THROW(td.update_(src2), ValueError);
  EXPECT_EQ((td.get("obs").at<float>({0, 0})), 1.0f);

  td.set({"info", "count"}, Tensor::zeros({3}, DType::Int32));
  TensorDict src4({3});
  src4.set("obs", fill_f32({3, 4}, 5.0f));
  src4.set({"info", "count"}, fill_f32({3}, std::nanf("")));  // NaN into an integer
  try {
    td.update_(src4);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("('info', 'count')"), HasSubstr("torch.int32")));
  }
  EXPECT_EQ((td.get("obs").at<float>({0, 0})), 1.0f);
}

TEST(TensorDict, UpdateBroadcastsAndCastsAsTorchCopy) {
  TensorDict td = sample();
  td.set("count", Tensor::zeros({3, 2}, DType::Int64));
  td.set("half", Tensor::zeros({3}, DType::Float16));
  td.set("bf", Tensor::zeros({3}, DType::BFloat16));
  td.set("small", Tensor::zeros({3}, DType::UInt8));
  const void* obs_memory = td.get("obs").data();
  TensorDict src;  // no batch dims: every leaf broadcasts
  src.set("obs", Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {4}));  // one row
  src.set({"info", "reward"}, Tensor::from_vector(std::vector<int64_t>{7}, {}));
  src.set({"info", "done"}, Tensor::from_vector(std::vector<float>{0.5f}, {}));
  src.set("count", Tensor::from_vector(std::vector<double>{-2.9, 2.9}, {2}));
  src.set("half", Tensor::from_vector(std::vector<double>{1.0 / 3}, {}));
  src.set("bf", Tensor::from_vector(std::vector<double>{-1.5e38}, {}));
  src.set("small", Tensor::from_vector(std::vector<int64_t>{300}, {}));
  td.update_(src);
  EXPECT_EQ(td.get("obs").data(), obs_memory);  // written in place
  EXPECT_EQ((td.get("obs").at<float>({2, 3})), 4.0f);
  EXPECT_EQ((td.get("obs").at<float>({1, 0})), 1.0f);
  EXPECT_EQ((td.get({"info", "reward"}).at<float>({2})), 7.0f);
  EXPECT_TRUE((td.get({"info", "done"}).at<bool>({0})));
  EXPECT_EQ((td.get("count").at<int64_t>({1, 0})), -2);  // toward zero
  EXPECT_EQ((td.get("count").at<int64_t>({1, 1})), 2);
  uint16_t h, b;
  std::memcpy(&h, td.get("half").data(), 2);
  std::memcpy(&b, td.get("bf").data(), 2);
  EXPECT_EQ(h, 0x3555);  // torch.tensor(1/3, dtype=torch.float16).view(torch.int16)
  EXPECT_EQ(b, 0xfee2);  // torch.tensor(-1.5e38, dtype=torch.bfloat16).view(torch.int16)
  EXPECT_EQ((td.get("small").at<uint8_t>({0})), 44);  // 300 wraps, as in torch
}

TEST(TensorDict, UpdateRefusesAShapeThatDoesNotBroadcastNamingIt) {
  TensorDict td = sample();
  TensorDict src;
  src.set("obs", fill_f32({3}, 5.0f));  // [3] against [3, 4]: the trailing dims differ
  try {
    td.update_(src);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'obs'"), HasSubstr("[3]"), HasSubstr("[3, 4]")));
  }
  EXPECT_EQ((td.get("obs").at<float>({0, 0})), 1.0f);
}

TEST(TensorDict, UpdateRejectsAKindMismatch) {
  TensorDict td = sample();
  TensorDict src({3});
  src.set("info", fill_f32({3}, 0.0f));
  EXPECT_THROW(td.update_(src), TypeError);
}

TEST(TensorDict, UpdateRefusesToChangeANonTensorValueOfAConsolidatedDict) {
  TensorDict c = consolidate(sample());
  TensorDict same({3});
  same.set("task", NonTensor{"walk"});
  EXPECT_NO_THROW(c.update_(same));
  TensorDict changed({3});
  changed.set("task", NonTensor{"run"});
  EXPECT_THROW(c.update_(changed), ValueError);
  EXPECT_EQ(c.get_non_tensor("task"), "walk");
}

TEST(TensorDict, SelectKeepsOnlyTheGivenKeysSharingData) {
  TensorDict td = sample();
  TensorDict s = td.select({"obs", {"info", "done"}});
  EXPECT_THAT(key_strs(s.keys(true)), ElementsAre("'obs'", "'info'", "('info', 'done')"));
  EXPECT_EQ(s.batch_size(), td.batch_size());
  EXPECT_EQ(s.get_tensordict("info").batch_size(), (Shape{3}));
  EXPECT_EQ(s.get("obs").data(), td.get("obs").data());
}

TEST(TensorDict, SelectStrictRejectsAMissingKey) {
  TensorDict td = sample();
  try {
    td.select({"obs", "action"});
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'action'"));
  }
  EXPECT_THROW(td.select({{"info", "action"}}, /*strict=*/true), KeyError);
}

TEST(TensorDict, SelectNonStrictSkipsMissingKeys) {
  TensorDict td = sample();
  TensorDict s = td.select({"obs", "action", {"info", "nope"}}, /*strict=*/false);
  EXPECT_THAT(key_strs(s.keys(true)), ElementsAre("'obs'"));
}

TEST(TensorDict, LockedDictsRefuseSetAndErase) {
  TensorDict td = sample();
  td.lock_();
  EXPECT_TRUE(td.is_locked());
  EXPECT_TRUE(td.get_tensordict("info").is_locked());
  try {
    td.set("x", fill_f32({3}, 0.0f));
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'x'"), HasSubstr("locked")));
  }
  EXPECT_THROW(td.set({"info", "x"}, fill_f32({3}, 0.0f)), Error);
  EXPECT_THROW(td.set({"new", "x"}, fill_f32({3}, 0.0f)), Error);
  EXPECT_THROW(td.erase("obs"), Error);
  EXPECT_FALSE(td.contains("x"));
  EXPECT_FALSE(td.contains("new"));
  td.unlock_();
  EXPECT_NO_THROW(td.set("x", fill_f32({3}, 0.0f)));
}

TEST(TensorDict, ConsolidatedDictsAreLockedAndUnlockForgetsTheConsolidation) {
  TensorDict c = consolidate(sample());
  EXPECT_TRUE(c.is_locked());
  EXPECT_THROW(c.set("x", fill_f32({3}, 0.0f)), Error);
  c.unlock_();
  EXPECT_FALSE(c.is_consolidated());
  EXPECT_FALSE(c.get_tensordict("info").is_consolidated());
  EXPECT_NO_THROW(c.set("x", fill_f32({3}, 0.0f)));
}

TEST(TensorDict, EqualIgnoresKeyOrder) {
  TensorDict a({2}), b({2});
  a.set("x", fill_f32({2}, 1.0f));
  a.set("y", fill_f32({2}, 2.0f));
  b.set("y", fill_f32({2}, 2.0f));
  b.set("x", fill_f32({2}, 1.0f));
  EXPECT_TRUE(equal(a, b));
}

TEST(TensorDict, EqualExplainsTheFirstDifference) {
  TensorDict a = sample();
  std::string why;

  TensorDict values = sample();
  values.get({"info", "reward"}).at<float>({2}) = 0.0f;
  EXPECT_FALSE(equal(a, values, &why));
  EXPECT_THAT(why, AllOf(HasSubstr("info.reward"), HasSubstr("values differ")));

  TensorDict dtype = sample();
  dtype.set("obs", Tensor::zeros({3, 4}, DType::Float64));
  EXPECT_FALSE(equal(a, dtype, &why));
  EXPECT_THAT(why,
              AllOf(HasSubstr("'obs'"), HasSubstr("torch.float32"), HasSubstr("torch.float64")));

  TensorDict shape = sample();
  shape.set("obs", fill_f32({3, 5}, 1.0f));
  EXPECT_FALSE(equal(a, shape, &why));
  EXPECT_THAT(why, AllOf(HasSubstr("'obs'"), HasSubstr("[3, 4]"), HasSubstr("[3, 5]")));

  TensorDict value = sample();
  value.set("task", NonTensor{"run"});
  EXPECT_FALSE(equal(a, value, &why));
  EXPECT_THAT(why, AllOf(HasSubstr("'task'"), HasSubstr("walk"), HasSubstr("run")));

  TensorDict missing = sample();
  missing.erase("task");
  missing.set("other", NonTensor{"walk"});
  EXPECT_FALSE(equal(a, missing, &why));
  EXPECT_THAT(why, HasSubstr("'task' missing"));

  TensorDict kind = sample();
  kind.set("task", fill_f32({3}, 0.0f));
  EXPECT_FALSE(equal(a, kind, &why));
  EXPECT_THAT(why, HasSubstr("'task'"));

  TensorDict batch({4});
  EXPECT_FALSE(equal(a, batch, &why));
  EXPECT_THAT(why, AllOf(HasSubstr("batch_size"), HasSubstr("[3]"), HasSubstr("[4]")));

  EXPECT_TRUE(equal(a, sample(), &why));
}

TEST(TensorDict, DescribeListsKeysDtypesAndShapes) {
  std::string d = describe(sample());
  EXPECT_THAT(d, AllOf(HasSubstr("batch_size=[3]"), HasSubstr("obs: float32[3, 4]"),
                       HasSubstr("reward: float32[3]"), HasSubstr("task: non-tensor \"walk\"")));
}

}  // namespace
}  // namespace tensorwire
