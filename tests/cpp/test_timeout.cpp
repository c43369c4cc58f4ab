// Timeout from any std::chrono duration: a negative or NaN one is a ValueError, one past
// what the clock counts is for ever. The conversion overflowed before: 5,124,096 hours
// became a wait of 1,526 s, 1,000 years a "negative" timeout, NaN undefined behaviour.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "tensorwire/core/error.h"
#include "tensorwire/runtime/timeout.h"

namespace {

using namespace tensorwire;
using namespace std::chrono_literals;

TEST(Timeout, DurationsWithinTheClocksRangeAreKeptExactly) {
  EXPECT_EQ(Timeout(2s).duration(), std::chrono::nanoseconds(2'000'000'000));
  EXPECT_EQ(Timeout(0ms).duration(), Clock::duration::zero());
  EXPECT_EQ(Timeout(std::chrono::duration<double>(0.25)).duration(), 250ms);
  EXPECT_FALSE(Timeout(1h).is_forever());
}

TEST(Timeout, DurationsPastTheClocksRangeAreForever) {
  EXPECT_TRUE(Timeout(std::chrono::hours(5'124'096)).is_forever());
  EXPECT_TRUE(Timeout(std::chrono::years(1000)).is_forever());
  EXPECT_TRUE(Timeout(std::chrono::hours::max()).is_forever());
  EXPECT_TRUE(
      Timeout(std::chrono::duration<double>(std::numeric_limits<double>::infinity())).is_forever());
  EXPECT_TRUE(Timeout::seconds(1e12).is_forever());
}

TEST(Timeout, AUnitThatIsNotAWholeNumberOfTicksDoesNotOverflowOnTheWay) {
  // 2e10 thirds of a second: 6,666,666,667 s, in range, but 2e10 * 1e9 overflows first.
  using thirds = std::chrono::duration<long long, std::ratio<1, 3>>;
  const double got =
      std::chrono::duration<double>(Timeout(thirds(20'000'000'000)).duration()).count();
  EXPECT_NEAR(got, 6'666'666'666.667, 1.0);
  EXPECT_EQ(Timeout(thirds(3)).duration(), 1s);
}

TEST(Timeout, NegativeAndNanDurationsAreValueErrors) {
  EXPECT_THROW(Timeout(-1ms), ValueError);
  EXPECT_THROW(Timeout(std::chrono::hours::min()), ValueError);
  EXPECT_THROW(Timeout(std::chrono::duration<double>(std::nan(""))), ValueError);
  EXPECT_THROW(Timeout(std::chrono::duration<double>(-std::numeric_limits<double>::infinity())),
               ValueError);
  EXPECT_THROW(Timeout::seconds(std::nan("")), ValueError);
  EXPECT_THROW(Timeout::seconds(-0.5), ValueError);
}

}  // namespace
