// stack / unbind / index: between a batch of TensorDicts and one with a leading batch dim.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

// One step of an environment: batch [2] (two agents), tagged with a task name.
TensorDict step(float value, const std::string& task) {
  TensorDict td({2});
  td.set("obs", fill_f32({2, 3}, value));
  td.set({"info", "reward"}, fill_f32({2}, value * 10));
  td.set("task", NonTensor{task});
  return td;
}

TEST(Stack, StackAddsALeadingBatchDimAndCopiesTheValues) {
  TensorDict s = TensorDict::stack({step(1, "walk"), step(2, "walk"), step(3, "walk")});
  EXPECT_EQ(s.batch_size(), (Shape{3, 2}));
  EXPECT_EQ(s.get("obs").shape(), (Shape{3, 2, 3}));
  EXPECT_EQ(s.get({"info", "reward"}).shape(), (Shape{3, 2}));
  EXPECT_EQ(s.get_tensordict("info").batch_size(), (Shape{3, 2}));
  EXPECT_EQ((s.get("obs").at<float>({0, 1, 2})), 1.0f);
  EXPECT_EQ((s.get("obs").at<float>({2, 0, 0})), 3.0f);
  EXPECT_EQ((s.get({"info", "reward"}).at<float>({1, 1})), 20.0f);
  EXPECT_EQ(s.names().size(), 2u);
}

TEST(Stack, EqualNonTensorValuesStayOneNonTensor) {
  TensorDict s = TensorDict::stack({step(1, "walk"), step(2, "walk")});
  ASSERT_TRUE(s.entry("task").is_non_tensor());
  EXPECT_EQ(s.get_non_tensor("task"), "walk");
}

TEST(Stack, DifferingNonTensorValuesBecomeANonTensorStack) {
  TensorDict s = TensorDict::stack({step(1, "walk"), step(2, "run")});
  ASSERT_TRUE(s.entry("task").is_non_tensor_stack());
  const NonTensorStack& st = s.entry("task").non_tensor_stack();
  EXPECT_EQ(st.batch_size, (Shape{2, 2}));
  EXPECT_EQ(st.stack_dim, 0);
  // One value per batch element, row-major: each step's value repeated over its batch.
  EXPECT_THAT(st.values, ElementsAre("walk", "walk", "run", "run"));
}

TEST(Stack, StackOfAlreadyStackedNonTensorsKeepsEveryValue) {
  TensorDict a = TensorDict::stack({step(1, "a"), step(1, "b")});
  TensorDict b = TensorDict::stack({step(1, "c"), step(1, "d")});
  TensorDict s = TensorDict::stack({a, b});
  const NonTensorStack& st = s.entry("task").non_tensor_stack();
  EXPECT_EQ(st.batch_size, (Shape{2, 2, 2}));
  EXPECT_THAT(st.values, ElementsAre("a", "a", "b", "b", "c", "c", "d", "d"));
}

TEST(Stack, StackRejectsAnEmptyList) {
  EXPECT_THROW(TensorDict::stack({}), ValueError);
}

TEST(Stack, StackRejectsDifferentBatchSizes) {
  TensorDict other({3});
  try {
    TensorDict::stack({step(1, "a"), other});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("[3]"), HasSubstr("[2]")));
  }
}

TEST(Stack, StackRejectsDifferentKeys) {
  TensorDict other = step(1, "a");
  other.erase("task");
  other.set("name", NonTensor{"a"});
  try {
    TensorDict::stack({step(1, "a"), other});
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'task'"));
  }
  TensorDict fewer = step(1, "a");
  fewer.erase("task");
  EXPECT_THROW(TensorDict::stack({step(1, "a"), fewer}), ValueError);
}

TEST(Stack, StackRejectsDifferentLeafShapesOrDtypesNamingTheKey) {
  TensorDict other = step(1, "a");
  other.set("obs", fill_f32({2, 4}, 0.0f));
  try {
    TensorDict::stack({step(1, "a"), other});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'obs'"), HasSubstr("[2, 4]"), HasSubstr("[2, 3]")));
  }
  TensorDict dtype = step(1, "a");
  dtype.set("obs", Tensor::zeros({2, 3}, DType::Float64));
  EXPECT_THROW(TensorDict::stack({step(1, "a"), dtype}), ValueError);
}

TEST(Stack, StackRejectsATensorWhereOthersHaveASubDict) {
  TensorDict other = step(1, "a");
  other.set("info", fill_f32({2}, 0.0f));
  EXPECT_THROW(TensorDict::stack({step(1, "a"), other}), ValueError);
}

TEST(Stack, IndexReturnsViewsAlongDimZero) {
  TensorDict s = TensorDict::stack({step(1, "walk"), step(2, "walk")});
  TensorDict second = s.index(1);
  EXPECT_EQ(second.batch_size(), (Shape{2}));
  EXPECT_EQ(second.get("obs").shape(), (Shape{2, 3}));
  EXPECT_TRUE(second.get("obs").storage().same(s.get("obs").storage()));
  EXPECT_TRUE(equal(second, step(2, "walk")));
  second.get("obs").at<float>({0, 0}) = -1.0f;
  EXPECT_EQ((s.get("obs").at<float>({1, 0, 0})), -1.0f);
}

TEST(Stack, IndexCountsNegativeIndicesFromTheEndAndChecksRange) {
  TensorDict s = TensorDict::stack({step(1, "walk"), step(2, "walk")});
  EXPECT_TRUE(equal(s.index(-1), step(2, "walk")));
  EXPECT_THROW(s.index(2), ValueError);
  EXPECT_THROW(s.index(-3), ValueError);
  EXPECT_THROW(TensorDict(Shape{}).index(0), ValueError);
}

TEST(Stack, IndexOfANonTensorStackCollapsesOneRepeatedValueBackToANonTensor) {
  TensorDict s = TensorDict::stack({step(1, "walk"), step(2, "run")});
  // Each step's value was repeated over its inner batch: one value again.
  TensorDict first = s.index(0);
  ASSERT_TRUE(first.entry("task").is_non_tensor());
  EXPECT_EQ(first.get_non_tensor("task"), "walk");
  EXPECT_EQ(s.index(1).get_non_tensor("task"), "run");
}

TEST(Stack, IndexOfANonTensorStackKeepsDifferingValuesAsAStack) {
  TensorDict td({2, 2});
  td.set("label", NonTensorStack{{2, 2}, 0, {"a", "b", "c", "d"}});
  TensorDict second = td.index(1);
  ASSERT_TRUE(second.entry("label").is_non_tensor_stack());
  const NonTensorStack& st = second.entry("label").non_tensor_stack();
  EXPECT_EQ(st.batch_size, (Shape{2}));
  EXPECT_THAT(st.values, ElementsAre("c", "d"));
  TensorDict element = second.index(0);
  ASSERT_TRUE(element.entry("label").is_non_tensor());
  EXPECT_EQ(element.get_non_tensor("label"), "c");
}

TEST(Stack, UnbindUndoesStackOfDifferingNonTensors) {
  std::vector<TensorDict> parts{step(1, "walk"), step(2, "run"), step(3, "jump")};
  std::vector<TensorDict> back = TensorDict::stack(parts).unbind(0);
  ASSERT_EQ(back.size(), 3u);
  std::string why;
  for (size_t i = 0; i < parts.size(); ++i) EXPECT_TRUE(equal(back[i], parts[i], &why)) << why;
}

TEST(Stack, UnbindOfEqualNonTensorsRoundTripsExactly) {
  std::vector<TensorDict> parts{step(1, "walk"), step(2, "walk")};
  std::vector<TensorDict> back = TensorDict::stack(parts).unbind();
  ASSERT_EQ(back.size(), 2u);
  std::string why;
  for (size_t i = 0; i < parts.size(); ++i) EXPECT_TRUE(equal(back[i], parts[i], &why)) << why;
}

TEST(Stack, UnbindSupportsOnlyDimZero) {
  TensorDict s = TensorDict::stack({step(1, "walk"), step(2, "walk")});
  EXPECT_THROW(s.unbind(1), ValueError);
  EXPECT_THROW(TensorDict(Shape{}).unbind(0), ValueError);
}

}  // namespace
}  // namespace tensorwire
