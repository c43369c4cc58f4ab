// ProducerTable: how RemoteDataZMQ tells a silent producer from one waiting for a slow
// consumer. Times are given, not read from a clock.
#include <gtest/gtest.h>

#include <optional>
#include <utility>

#include "dataflow/producers.h"

namespace tensorwire::dataflow {
namespace {

using namespace std::chrono_literals;
using Clock = ProducerTable::Clock;

constexpr auto kBound = std::chrono::milliseconds(1000);

struct Table {
  ProducerTable t;
  Clock::time_point now = Clock::time_point{} + 1h;
  Table() {
    t.connected(0, 10, "tcp://a");
    t.connected(0, 11, "tcp://b");
  }
  void from(int fd) {
    t.datapoint(0, fd, now, [] { return std::string("?"); });
  }
  // The consumer comes back after `gap` away, reads one datapoint (from `fd`) and checks;
  // a gap over a quarter of the bound is a pause, as RemoteDataZMQ's next() counts them.
  std::optional<ProducerTable::Silent> read_after(Clock::duration gap, int fd) {
    now += gap;
    if (gap > kBound / 4) t.pause(gap);
    from(fd);
    return t.silent(now, kBound);
  }
  // Reads from `fd` only, every `gap`, until a producer is reported (at most `limit` reads).
  std::pair<std::optional<ProducerTable::Silent>, int> read_until_silent(Clock::duration gap,
                                                                         int fd, int limit) {
    std::optional<ProducerTable::Silent> silent;
    int reads = 0;
    while (!silent && reads < limit) {
      silent = read_after(gap, fd);
      ++reads;
    }
    return {silent, reads};
  }
};

TEST(ProducerTable, AProducerWaitingForAConsumerThatPausesBeforeEveryReadIsNotSilent) {
  Table s;
  s.from(10);
  s.from(11);
  // 300 ms away before each read (over a quarter of the bound), the two served in turn.
  for (int i = 0; i < 200; ++i) EXPECT_FALSE(s.read_after(300ms, 10 + i % 2)) << i;
}

// A producer whose host vanished, read by a consumer that pauses before every read: each
// pause excused its silence, so it was never reported.
TEST(ProducerTable, AVanishedProducerIsReportedThoughTheConsumerPausesBeforeEveryRead) {
  Table s;
  s.from(10);
  s.from(11);
  const auto [silent, reads] = s.read_until_silent(300ms, 11, 200);  // only b is heard now
  ASSERT_TRUE(silent);
  EXPECT_EQ(silent->info.address, "tcp://a");
  EXPECT_GT(silent->silence, kBound);
  EXPECT_LE(reads, 4 * 2 + 40 + 1);         // a few rounds of the fair queue
  EXPECT_FALSE(s.t.silent(s.now, kBound));  // reported once
}

TEST(ProducerTable, ByTimeAConsumerReadingPromptlyReportsWithinTheBound) {
  Table s;
  s.from(10);
  s.from(11);
  const auto [silent, reads] = s.read_until_silent(10ms, 11, 1000);
  ASSERT_TRUE(silent);
  EXPECT_EQ(silent->info.address, "tcp://a");
  EXPECT_LE(reads, 101);
}

}  // namespace
}  // namespace tensorwire::dataflow
