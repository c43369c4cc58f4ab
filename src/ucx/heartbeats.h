// Heartbeats: a UCX connection's heartbeats to and from a peer on another host, written
// once for every such connection (the pipe, both sides of the remote inference transport).
// runtime::PeerLiveness decides when one is due and when the peer's silence means it is
// gone; this sends and takes them in, as control frames {"heartbeat": true} on the
// connection's heartbeat tag.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/peer_liveness.h"
#include "tensorwire/wire/limits.h"
#include "ucx/ucx.h"

namespace tensorwire::ucx {

class Heartbeats {
 public:
  // After the handshake: PeerLiveness::start (how often beat() must run, or std::nullopt).
  std::optional<std::chrono::milliseconds> start(int64_t peer_heartbeat_ms,
                                                 std::chrono::milliseconds liveness_timeout);
  // Takes in the heartbeats that arrived on `tag` (ProtocolError for one that breaks the
  // protocol) and sends one when due. Returns why the peer is taken for gone (named `peer`)
  // when it stayed silent too long, std::nullopt otherwise. Under the connection's mutex.
  std::optional<std::string> beat(Worker& worker, Endpoint& ep, uint64_t tag,
                                  const wire::Limits& limits, const std::string& peer);
  // Forgets the heartbeat in flight (the connection is going).
  void drop() noexcept { in_flight_ = Request(); }
  // Something else came from the peer just now: it counts as a heartbeat (a long message
  // whose bytes keep coming holds the peer's heartbeats behind it on the same connection).
  void heard() noexcept { liveness_.heard(runtime::PeerLiveness::Clock::now()); }

 private:
  runtime::PeerLiveness liveness_;
  std::chrono::milliseconds timeout_{0};  // the liveness timeout start() was given
  std::vector<std::byte> frame_;
  Request in_flight_;
};

}  // namespace tensorwire::ucx
