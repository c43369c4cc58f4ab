// Time for every blocking call of the library: a Timeout says how long a call may wait, a
// Deadline is the moment it must give up. One pair of types instead of a unit per system,
// and one place (timeout.cpp) that turns the first into the second.
//
//   pipe.recv(nullptr, std::chrono::seconds(2));   // any std::chrono duration converts
//   pipe.recv(nullptr, Timeout::forever());         // the default of every blocking call
//   pipe.recv(nullptr, Timeout::poll());            // try once, never block
//
// A negative or NaN timeout is a ValueError wherever it is made, so a mistake never turns
// into "wait for ever" or "give up at once" silently.
#pragma once

#include <chrono>
#include <optional>
#include <ratio>
#include <string>
#include <type_traits>

namespace tensorwire {

using Clock = std::chrono::steady_clock;

class Timeout {
 public:
  // Wait for ever.
  constexpr Timeout() noexcept = default;
  // Wait at most `d` (zero: poll once). ValueError when `d` is negative or NaN; a duration
  // beyond what the clock counts (about 292 years, +inf) is for ever.
  template <class Rep, class Period>
  Timeout(std::chrono::duration<Rep, Period> d)  // NOLINT: implicit on purpose
      : Timeout(converted(d)) {}

  static constexpr Timeout forever() noexcept { return Timeout(); }
  static Timeout poll() noexcept { return Timeout(Clock::duration::zero()); }
  // Seconds as Python writes them: std::nullopt (None) is forever, +inf is forever, a
  // negative or NaN value is a ValueError naming `what` (the argument).
  static Timeout seconds(std::optional<double> s, const char* what = "timeout");

  bool is_forever() const noexcept { return forever_; }
  // The duration; Clock::duration::max() when forever.
  Clock::duration duration() const noexcept { return forever_ ? Clock::duration::max() : d_; }
  // For messages: "2.5 s", "for ever".
  std::string str() const;

 private:
  struct Checked {
    Clock::duration d;
    bool forever = false;
  };
  // Seconds past what the clock counts are for ever, not an overflow into a short or
  // negative wait.
  static constexpr double kForeverSeconds = 9.2e9;
  // Negative or NaN: ValueError; past kForeverSeconds (+inf too): for ever.
  static Checked checked_seconds(double seconds);
  template <class Rep, class Period>
  static Checked converted(std::chrono::duration<Rep, Period> d) {
    const double s = std::chrono::duration<double>(d).count();
    // The exact cast multiplies by the period's numerator and divides by its denominator:
    // below kForeverSeconds it cannot overflow when nothing is divided (a whole number of
    // clock ticks per unit) or the count is floating.
    constexpr bool exact =
        std::ratio_divide<Period, Clock::period>::den == 1 || std::is_floating_point_v<Rep>;
    if (exact && s >= 0 && s < kForeverSeconds)
      return Checked{std::chrono::duration_cast<Clock::duration>(d)};
    return checked_seconds(s);
  }
  explicit Timeout(Checked c) noexcept : d_(c.d), forever_(c.forever) {}

  Clock::duration d_{};
  bool forever_ = true;
};

class Deadline {
 public:
  // Never passes.
  constexpr Deadline() noexcept = default;
  static constexpr Deadline never() noexcept { return Deadline(); }
  // `timeout` from now (never for Timeout::forever()).
  static Deadline after(Timeout timeout) noexcept;
  static Deadline at(Clock::time_point when) noexcept { return Deadline(when); }

  bool is_never() const noexcept { return when_ == Clock::time_point::max(); }
  bool passed() const noexcept { return !is_never() && Clock::now() >= when_; }
  Clock::time_point when() const noexcept { return when_; }
  // Time left, never negative; Clock::duration::max() for never.
  Clock::duration left() const noexcept;
  // The time left as a Timeout (forever for never): for a call that takes a Timeout, made
  // within a deadline others share.
  Timeout remaining() const;
  // Milliseconds for poll()/epoll_wait()/zmq_poll(): rounded up so a wait never ends just
  // before the deadline and spins; -1 for never.
  int poll_ms() const noexcept;
  // The earlier of the two.
  Deadline min(Deadline other) const noexcept { return other.when_ < when_ ? other : *this; }

 private:
  explicit constexpr Deadline(Clock::time_point when) noexcept : when_(when) {}
  Clock::time_point when_ = Clock::time_point::max();
};

}  // namespace tensorwire
