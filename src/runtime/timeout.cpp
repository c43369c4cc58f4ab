#include "tensorwire/runtime/timeout.h"

#include <cmath>
#include <cstdio>

#include "tensorwire/core/error.h"

namespace tensorwire {

Timeout::Checked Timeout::checked_seconds(double s) {
  if (std::isnan(s) || s < 0)
    throw ValueError("timeout must be >= 0 (use Timeout::forever() to wait without a limit), got " +
                     (std::isnan(s) ? std::string("nan") : std::to_string(s)) + " s");
  if (s >= kForeverSeconds) return Checked{Clock::duration::zero(), true};
  return Checked{std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s))};
}

Timeout Timeout::seconds(std::optional<double> s, const char* what) {
  if (!s || (std::isinf(*s) && *s > 0)) return forever();
  if (std::isnan(*s) || *s < 0)
    throw ValueError(std::string(what) +
                     " must be None (no limit) or a number of seconds >= 0, got " +
                     (std::isnan(*s) ? std::string("nan") : std::to_string(*s)));
  return Timeout(checked_seconds(*s));
}

std::string Timeout::str() const {
  if (forever_) return "for ever";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", std::chrono::duration<double>(d_).count());
  return buf;
}

Deadline Deadline::after(Timeout timeout) noexcept {
  if (timeout.is_forever()) return never();
  const auto now = Clock::now();
  if (timeout.duration() >= Clock::time_point::max() - now) return never();
  return Deadline(now + timeout.duration());
}

Clock::duration Deadline::left() const noexcept {
  if (is_never()) return Clock::duration::max();
  const auto now = Clock::now();
  return when_ > now ? when_ - now : Clock::duration::zero();
}

Timeout Deadline::remaining() const {
  return is_never() ? Timeout::forever() : Timeout(left());
}

int Deadline::poll_ms() const noexcept {
  if (is_never()) return -1;
  const auto left_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left()).count();
  const int64_t ms = (left_ns + 999'999) / 1'000'000;
  return ms > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(ms);
}

}  // namespace tensorwire
