// MultiProcessMapDataZMQ with real worker processes: strict and non-strict passes,
// filtering, map errors and dead workers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <map>

#include "flows.h"
#include "tensorwire/dataflow/map.h"

namespace tensorwire::dataflow {
namespace {

using namespace std::chrono_literals;
using testing::counting;
using ::testing::HasSubstr;
using testing::index_of;

// i -> {"i": i, "x": x, "square": i*i, "worker": the worker that mapped it}.
std::optional<TensorDict> square(TensorDict td) {
  TensorDict out = td.clone();
  Tensor sq = Tensor::empty({}, DType::Int64);
  *sq.data<int64_t>() = index_of(td) * index_of(td);
  out.set("square", sq);
  Tensor w = Tensor::empty({}, DType::Int64);
  *w.data<int64_t>() = current_worker() ? current_worker()->index : -1;
  out.set("worker", w);
  return out;
}

class Map : public ::testing::Test {
 protected:
  void SetUp() override { children_before_ = testing::child_pids(); }
  void TearDown() override { EXPECT_EQ(testing::child_pids(), children_before_); }
  std::set<int> children_before_;
};

TEST_F(Map, StrictYieldsEachMappingExactlyOncePerPass) {
  MultiProcessMapDataZMQ m(counting(50), square, {.num_proc = 2, .buffer_size = 8, .strict = true});
  m.reset_state();
  std::set<int64_t> workers;
  for (int pass = 0; pass < 3; ++pass) {
    std::map<int64_t, int> seen;
    for (TensorDict& dp : m.epoch()) {
      ASSERT_TRUE(testing::datapoint_ok(dp));
      EXPECT_EQ(*dp.get("square").data<int64_t>(), index_of(dp) * index_of(dp));
      workers.insert(*dp.get("worker").data<int64_t>());
      ++seen[index_of(dp)];
    }
    ASSERT_EQ(seen.size(), 50u) << "pass " << pass;
    for (auto [i, n] : seen) EXPECT_EQ(n, 1) << "datapoint " << i << " in pass " << pass;
  }
  EXPECT_EQ(workers, (std::set<int64_t>{0, 1}));  // both workers mapped
}

TEST_F(Map, StrictClampsTheBufferToTheDataflow) {
  MultiProcessMapDataZMQ m(counting(5), square,
                           {.num_proc = 2, .buffer_size = 200, .strict = true});
  EXPECT_EQ(m.buffer_size(), 5u);
  m.reset_state();
  size_t n = 0;
  for (TensorDict& dp : m.epoch()) n += dp.contains("square");
  EXPECT_EQ(n, 5u);
}

TEST_F(Map, ABufferBeyondTheLimitIsRefusedUnlessStrictModeClampsIt) {
  // SIZE_MAX ("no limit"): the first fill would read a repeating dataflow for ever.
  for (size_t size : {std::numeric_limits<size_t>::max(), kMaxBufferSize + 1}) {
    try {
      MultiProcessMapDataZMQ m(counting(5), square, {.num_proc = 1, .buffer_size = size});
      ADD_FAILURE() << "buffer_size " << size << " was taken";
    } catch (const ValueError& e) {
      EXPECT_THAT(e.what(), HasSubstr("buffer_size must be at most 65536 (datapoints in flight)"));
    }
  }
  MultiProcessMapDataZMQ largest(counting(5), square,
                                 {.num_proc = 1, .buffer_size = kMaxBufferSize});
  EXPECT_EQ(largest.buffer_size(), kMaxBufferSize);
  MultiProcessMapDataZMQ strict(counting(5), square,
                                {.num_proc = 1, .buffer_size = SIZE_MAX, .strict = true});
  EXPECT_EQ(strict.buffer_size(), 5u);  // clamped to the dataflow first: taken
}

TEST_F(Map, NonStrictIsAnEndlessStreamThatDropsFilteredDatapoints) {
  auto odd_only = [](TensorDict td) -> std::optional<TensorDict> {
    if (index_of(td) % 2 == 0) return std::nullopt;
    return td;
  };
  MultiProcessMapDataZMQ m(counting(10), odd_only, {.num_proc = 2, .buffer_size = 4});
  m.reset_state();
  auto e = m.epoch();
  std::map<int64_t, int> seen;
  for (int i = 0; i < 100; ++i) {
    auto dp = e.next();
    ASSERT_TRUE(dp);
    EXPECT_EQ(index_of(*dp) % 2, 1);
    ++seen[index_of(*dp)];
  }
  EXPECT_FALSE(e.done());
  EXPECT_EQ(seen.size(), 5u);  // the dataflow repeats: every odd one, many times
}

TEST_F(Map, AMapErrorIsRaisedHereAndTheStreamGoesOn) {
  auto picky = [](TensorDict td) -> std::optional<TensorDict> {
    if (index_of(td) == 7) throw ValueError("cannot map 7");
    return td;
  };
  MultiProcessMapDataZMQ m(counting(20), picky, {.num_proc = 2, .buffer_size = 4, .strict = true});
  m.reset_state();
  size_t got = 0;
  bool raised = false;
  {
    auto e = m.epoch();
    try {
      while (e.next()) ++got;
    } catch (const WorkerError& err) {
      raised = true;
      EXPECT_EQ(err.failure().type, "ValueError");
      EXPECT_EQ(err.failure().message, "cannot map 7");
    }
  }
  EXPECT_TRUE(raised);
  // The rest of the pass is still there: 19 good datapoints in all.
  {
    auto e = m.epoch();
    while (e.next()) ++got;
  }
  EXPECT_EQ(got, 19u);
}

TEST_F(Map, AStrictMapFunctionThatReturnsNothingIsAnError) {
  auto none = [](TensorDict) -> std::optional<TensorDict> { return std::nullopt; };
  MultiProcessMapDataZMQ m(counting(4), none, {.num_proc = 1, .strict = true});
  m.reset_state();
  auto e = m.epoch();
  EXPECT_THROW(e.next(), ValueError);
}

TEST_F(Map, AKilledWorkerIsReportedInsteadOfAHang) {
  auto slow = [](TensorDict td) -> std::optional<TensorDict> {
    std::this_thread::sleep_for(5ms);
    return td;
  };
  MultiProcessMapDataZMQ m(counting(1000), slow, {.num_proc = 2, .buffer_size = 8});
  m.reset_state();
  auto e = m.epoch();
  ASSERT_TRUE(e.next());
  ::kill(m.pids().at(0), SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    while (true) e.next();
  } catch (const WorkerDiedError& err) {
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    EXPECT_THAT(err.what(), HasSubstr("worker 0"));
    EXPECT_THAT(err.what(), HasSubstr("SIGKILL"));
  }
}

// 0..3 per pass; the third pass raises at its first datapoint and then ends, as a Python
// generator does. A strict map pulls a pass ahead of the one it yields (its buffer, 8,
// not clamped to a size: none is given), so the third pass is pulled exactly as the first
// epoch ends.
class ThirdPassRaises : public DataFlow {
 public:
  void start() override {
    ++passes_;
    i_ = 0;
  }
  std::optional<TensorDict> next() override {
    if (passes_ == 3 && !raised_) {
      raised_ = true;
      throw ValueError("the third pass raised");
    }
    if (i_ == 4 || passes_ == 3) return std::nullopt;
    return testing::make_datapoint(i_++);
  }

 private:
  int passes_ = 0;
  bool raised_ = false;
  uint64_t i_ = 0;
};

TEST_F(Map, AnErrorPullingTheNextPassAsAnEpochEndsKeepsThatEnd) {
  // The end of the epoch was recorded after the pull that raised (b32d4e3): the epoch's
  // next call then went on into the second pass's datapoints, which belong to the next
  // epoch (Python's iterator ends at any exception, so only C++ could see it).
  MultiProcessMapDataZMQ m(std::make_shared<ThirdPassRaises>(), square,
                           {.num_proc = 2, .buffer_size = 8, .strict = true});
  m.reset_state();
  std::set<int64_t> first;
  {
    Epoch e = m.epoch();
    try {
      while (std::optional<TensorDict> dp = e.next()) first.insert(index_of(*dp));
      FAIL() << "the pull of the third pass raised nothing";
    } catch (const ValueError& err) {
      EXPECT_THAT(err.what(), HasSubstr("the third pass raised"));
    }
    EXPECT_EQ(first, (std::set<int64_t>{0, 1, 2, 3}));
    EXPECT_FALSE(e.next().has_value());  // the end stays
    EXPECT_TRUE(e.done());
  }
  std::set<int64_t> second;
  for (TensorDict& dp : m.epoch()) second.insert(index_of(dp));
  EXPECT_EQ(second, (std::set<int64_t>{0, 1, 2, 3}));  // whole: it was pulled before
}

TEST_F(Map, InputsTravelThroughSharedMemoryBothWays) {
  // Large inputs: the map function checks the bytes it got and sends them back.
  auto check = [](TensorDict td) -> std::optional<TensorDict> {
    if (!testing::datapoint_ok(td)) throw ValueError("corrupt input");
    return td;
  };
  MultiProcessMapDataZMQ m(counting(64, 256 << 10), check,
                           {.num_proc = 2, .buffer_size = 16, .strict = true});
  m.reset_state();
  for (int pass = 0; pass < 2; ++pass) {
    size_t n = 0;
    for (TensorDict& dp : m.epoch()) {
      ASSERT_TRUE(testing::datapoint_ok(dp));
      ++n;
    }
    EXPECT_EQ(n, 64u);
  }
}

}  // namespace
}  // namespace tensorwire::dataflow

namespace tensorwire::dataflow {
namespace {

TEST(MapNothing, APassMappedToNothingIsAnErrorNotAnEndlessWait) {
  MultiProcessMapDataZMQ m(testing::counting(5),
                           [](TensorDict) -> std::optional<TensorDict> { return std::nullopt; },
                           {.num_proc = 2, .buffer_size = 4});
  m.reset_state();
  Epoch e = m.epoch();
  EXPECT_THAT([&] { e.next(std::chrono::seconds(20)); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr(
                  "returned None for all 1000 datapoints of the last 200 passes")));
}

TEST(MapNothing, SomeDatapointsDroppedIsFine) {
  MultiProcessMapDataZMQ m(testing::counting(6),
                           [](TensorDict td) -> std::optional<TensorDict> {
                             if (testing::index_of(td) % 2) return std::nullopt;
                             return td;
                           },
                           {.num_proc = 1, .buffer_size = 4});
  m.reset_state();
  Epoch e = m.epoch();
  for (int i = 0; i < 9; ++i)
    ASSERT_EQ(testing::index_of(*e.next(std::chrono::seconds(20))) % 2, 0);
}

TEST(MapClosed, ResetAfterCloseIsRefused) {
  MultiProcessMapDataZMQ m(testing::counting(5), [](TensorDict td) { return std::optional(td); },
                           {.num_proc = 1});
  m.close();
  EXPECT_THROW(m.reset_state(), ClosedError);
  EXPECT_TRUE(m.pids().empty());
}

}  // namespace
}  // namespace tensorwire::dataflow
