#include "tensorwire/runtime/liveness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "tensorwire/core/error.h"

namespace tensorwire {

namespace {
constexpr double kMaxSeconds = 86400.0 * 365;

std::chrono::milliseconds from_seconds(double s) {
  if (s > kMaxSeconds) s = kMaxSeconds;
  // A positive timeout below a millisecond is one: rounded to 0 it meant "no checks".
  const int64_t ms = std::llround(s * 1000.0);
  return std::chrono::milliseconds(s > 0 ? std::max<int64_t>(ms, 1) : ms);
}
}  // namespace

std::chrono::milliseconds default_liveness_timeout() {
  const char* env = std::getenv("TENSORWIRE_LIVENESS_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::seconds(10);
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  if (end == env || *end != '\0' || std::isnan(s) || s < 0)
    throw ValueError(std::string("TENSORWIRE_LIVENESS_TIMEOUT must be a number of seconds >= 0 "
                                 "(0 turns liveness checks off), got '") +
                     env + "'");
  return from_seconds(s);
}

std::chrono::milliseconds checked_duration(std::chrono::milliseconds d, const char* what,
                                           bool zero_allowed) {
  if (d.count() < 0 || (!zero_allowed && d.count() == 0))
    throw ValueError(std::string(what) + " must be " + (zero_allowed ? ">= 0" : "> 0") + ", got " +
                     std::to_string(d.count()) + " ms");
  return d;
}

std::chrono::milliseconds liveness_timeout_seconds(std::optional<double> s, const char* what) {
  if (!s) return default_liveness_timeout();
  if (std::isnan(*s) || *s < 0)
    throw ValueError(std::string(what) +
                     " must be None (the default), 0 (no liveness checks) or a number of "
                     "seconds > 0, got " +
                     (std::isnan(*s) ? std::string("nan") : std::to_string(*s)));
  return from_seconds(*s);
}

}  // namespace tensorwire
