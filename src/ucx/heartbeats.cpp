#include "ucx/heartbeats.h"

#include "ucx/control.h"
#include "wire/control_frame.h"

namespace tensorwire::ucx {

namespace {
using Clock = std::chrono::steady_clock;
// A heartbeat is a frame header and a few bytes of JSON; anything bigger breaks the protocol.
constexpr size_t kMaxHeartbeat = 256;
// Heartbeats taken in per beat: a peer cannot keep the caller busy.
constexpr int kMaxHeartbeatsPerBeat = 64;
}  // namespace

std::optional<std::chrono::milliseconds> Heartbeats::start(
    int64_t peer_heartbeat_ms, std::chrono::milliseconds liveness_timeout) {
  frame_ = wire::control_frame({{"heartbeat", true}});
  timeout_ = liveness_timeout;
  return liveness_.start(peer_heartbeat_ms, liveness_timeout, Clock::now());
}

std::optional<std::string> Heartbeats::beat(Worker& worker, Endpoint& ep, uint64_t tag,
                                            const wire::Limits& limits, const std::string& peer) {
  for (int i = 0; i < kMaxHeartbeatsPerBeat; ++i) {
    std::optional<Json> got =
        take_control(worker, ep, tag, kMaxHeartbeat, limits, "heartbeat", frame_deadline(timeout_));
    if (!got) break;
    if (!got->is_object() || !got->contains("heartbeat"))
      throw ProtocolError("a heartbeat must be {\"heartbeat\": true}, got " + got->dump());
    liveness_.heard(Clock::now());
  }
  const auto now = Clock::now();
  // One in flight at a time: over a dead link the previous one may never complete.
  if (liveness_.due(now) && in_flight_.done()) in_flight_ = ep.send(tag, frame_);
  return liveness_.silence(now, peer);
}

}  // namespace tensorwire::ucx
