#include "runtime/peer_liveness.h"

#include <algorithm>
#include <cstdio>

namespace tensorwire::runtime {

int64_t heartbeat_ms(std::chrono::milliseconds liveness_timeout) {
  // At most an hour: the most a handshake accepts (wire/handshake.cpp), and often enough for
  // any longer timeout. Asking for a quarter of a timeout past 4 h refused every peer.
  constexpr int64_t kMaxMs = 3600 * 1000;
  return liveness_timeout.count() <= 0
             ? 0
             : std::clamp<int64_t>(liveness_timeout.count() / 4, 1, kMaxMs);
}

std::optional<std::chrono::milliseconds> PeerLiveness::start(
    int64_t peer_heartbeat_ms, std::chrono::milliseconds liveness_timeout, Clock::time_point now) {
  if (peer_heartbeat_ms < 0) return std::nullopt;
  every_ = peer_heartbeat_ms == 0
               ? Clock::duration{}
               : std::chrono::milliseconds(std::max<int64_t>(peer_heartbeat_ms, 10));
  check_ = liveness_timeout.count() > 0;
  timeout_ = liveness_timeout;
  if (!active()) return std::nullopt;
  last_heard_ = now;
  next_ = now;  // the first one at once
  // Often enough to send on time, and to notice the peer's silence within the timeout of
  // the moment it fell silent: the check runs every twentieth of the timeout and gives the
  // peer up once the silence reaches the timeout less one period.
  auto period = check_ ? std::max(liveness_timeout / 20, std::chrono::milliseconds(10))
                       : std::chrono::milliseconds::max();
  if (every_ != Clock::duration{})
    period = std::min(period, std::chrono::duration_cast<std::chrono::milliseconds>(every_));
  silence_limit_ = liveness_timeout - period;
  return period;
}

bool PeerLiveness::due(Clock::time_point now) {
  if (every_ == Clock::duration{} || now < next_) return false;
  next_ = now + every_;
  return true;
}

std::optional<std::string> PeerLiveness::silence(Clock::time_point now,
                                                 const std::string& peer) const {
  if (!check_ || now - last_heard_ <= silence_limit_) return std::nullopt;
  char why[160];
  std::snprintf(why, sizeof why, " for %.1f s (liveness_timeout %.1f s)",
                std::chrono::duration<double>(now - last_heard_).count(),
                std::chrono::duration<double>(timeout_).count());
  return "no heartbeat from " + peer + why +
         ": its host or the link to it is down, or the peer is stopped";
}

}  // namespace tensorwire::runtime
