// PeerLiveness: the heartbeat schedule and silence check of one connection to a peer on
// another host, shared by every UCX connection that crosses hosts (the pipe, the remote
// inference transport). The connection sends and receives the heartbeats itself; this
// decides when one is due and when the peer's silence means it is gone.
//
// Each side announces in its handshake how often it wants the peer's heartbeats (a quarter
// of its liveness timeout, so three lost in a row are survived), sends its own at the
// interval the peer asked for, and gives the peer up when nothing came for longer than its
// liveness timeout. Why heartbeats at all: a host that vanishes, or the link to it, sends no
// FIN and no RST; TCP retransmits for many minutes and UCX's endpoint timeout takes ~28 s.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace tensorwire::runtime {

// The heartbeat interval (ms) a connection with this liveness timeout asks of its peer in
// the handshake; 0: none (liveness checks off).
int64_t heartbeat_ms(std::chrono::milliseconds liveness_timeout);

class PeerLiveness {
 public:
  using Clock = std::chrono::steady_clock;
  // After the handshake. `peer_heartbeat_ms`: the interval the peer asked for (0: none, -1:
  // it speaks no heartbeats, which turns everything off). Returns how often the connection
  // must call due()/silence() (send on time, and notice silence within the timeout), or
  // std::nullopt when there is nothing to do.
  std::optional<std::chrono::milliseconds> start(int64_t peer_heartbeat_ms,
                                                 std::chrono::milliseconds liveness_timeout,
                                                 Clock::time_point now);
  bool active() const noexcept { return every_ != Clock::duration{} || check_; }
  // True when a heartbeat is due now (and schedules the next one).
  bool due(Clock::time_point now);
  // A heartbeat (or anything else from the peer) arrived.
  void heard(Clock::time_point now) noexcept { last_heard_ = now; }
  // Why the peer is taken for gone ("no heartbeat from <peer> for ..."), or std::nullopt.
  std::optional<std::string> silence(Clock::time_point now, const std::string& peer) const;

 private:
  Clock::duration every_{};  // send this often (0: never)
  bool check_ = false;       // the peer sends heartbeats and we check them
  std::chrono::milliseconds timeout_{};
  Clock::duration silence_limit_{};
  Clock::time_point next_{};
  Clock::time_point last_heard_{};
};

}  // namespace tensorwire::runtime
