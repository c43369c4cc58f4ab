// Liveness of a pipe whose peer is on another host (or in another container): heartbeats.
//
// A peer that dies is noticed through UCX (its kernel resets the connection) or, on this
// host, its pidfd. A peer whose host vanishes, or the link to it, sends nothing at all: TCP
// retransmits what was in flight for many minutes, and its keepalive (UCX's TCP_KEEP*)
// stops probing as soon as anything is unacknowledged. So each side announces in the
// handshake how often it wants the peer's heartbeats (a quarter of its liveness timeout),
// sends its own at the interval the peer asked for, and fails the pipe with ClosedError when
// the peer's stay away longer than its liveness timeout.
//
// Heartbeats go on their own tag (kHeartbeatTag), as control frames {"heartbeat": true},
// from the process's liveness thread (runtime/heartbeat.h) under the pipe's mutex: a program
// that does not call the pipe for a while still answers for it. A program waiting on the
// pipe sees the failure at its next check (within kInterruptSlice); an asyncio waiter is
// woken through the worker's fd.
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "os/fork.h"
#include "pipe_impl.h"

namespace tensorwire::detail {

namespace {
using Clock = std::chrono::steady_clock;
// A heartbeat is a frame header and a few bytes of JSON; anything bigger breaks the protocol.
constexpr size_t kMaxHeartbeat = 256;
// Heartbeats taken in per beat: a peer cannot keep the liveness thread busy.
constexpr int kMaxHeartbeatsPerBeat = 64;
}  // namespace

int64_t heartbeat_ms(std::chrono::milliseconds liveness_timeout) {
  return liveness_timeout.count() <= 0 ? 0 : std::max<int64_t>(1, liveness_timeout.count() / 4);
}

void PipeImpl::start_liveness(const wire::PeerIdentity& peer) {
  // Same host and namespaces: the peer's pidfd watches it (and a peer stopped in a debugger
  // is not taken for gone). Heartbeats only where a silent peer may have vanished.
  if (peer.same_namespaces() || peer.heartbeat_ms < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  heartbeat_every_ = std::chrono::milliseconds(std::max<int64_t>(peer.heartbeat_ms, 10));
  if (peer.heartbeat_ms == 0) heartbeat_every_ = {};
  check_peer_ = options_.liveness_timeout.count() > 0;
  if (heartbeat_every_ == Clock::duration{} && !check_peer_) return;
  last_heard_ = now;
  next_heartbeat_ = now;  // the first one at once
  heartbeat_buf_ = control_frame({{"heartbeat", true}});
  // Beat often enough to send on time, and to notice the peer's silence within the timeout
  // of the moment it fell silent: the check runs every twentieth of the timeout and fails
  // the pipe once the silence reaches the timeout less one period.
  auto period = check_peer_
                    ? std::max(options_.liveness_timeout / 20, std::chrono::milliseconds(10))
                    : std::chrono::milliseconds::max();
  if (heartbeat_every_ != Clock::duration{})
    period =
        std::min(period, std::chrono::duration_cast<std::chrono::milliseconds>(heartbeat_every_));
  silence_limit_ = options_.liveness_timeout - period;
  runtime::keep_alive(weak_from_this(), period);
}

// Takes in the heartbeats that arrived. Under mu_.
void PipeImpl::drain_heartbeats() {
  for (int i = 0; i < kMaxHeartbeatsPerBeat; ++i) {
    std::optional<Json> got = take_control(kHeartbeatTag, kMaxHeartbeat, "heartbeat");
    if (!got) return;
    if (!got->is_object() || !got->contains("heartbeat"))
      fail("a heartbeat must be {\"heartbeat\": true}, got " + got->dump(),
           Fault::PeerBrokeProtocol);
    last_heard_ = Clock::now();
  }
}

void PipeImpl::beat() noexcept {
  if (os::fork_generation() != generation_) return;  // the parent's pipe: not ours to beat
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || !failure_.empty()) return;
  try {
    // Whatever this progress takes in may be what a waiter sleeps for: wake it to look.
    if (progress()) worker_->signal();
    drain_heartbeats();
    const auto now = Clock::now();
    if (heartbeat_every_ != Clock::duration{} && now >= next_heartbeat_) {
      // One in flight at a time: over a dead link the previous one may never complete.
      if (heartbeat_req_.done()) heartbeat_req_ = ep_->send(kHeartbeatTag, heartbeat_buf_);
      next_heartbeat_ = now + heartbeat_every_;
    }
    check_alive();
    if (check_peer_ && now - last_heard_ > silence_limit_) {
      char why[160];
      std::snprintf(why, sizeof why, " for %.1f s (liveness_timeout %.1f s)",
                    std::chrono::duration<double>(now - last_heard_).count(),
                    std::chrono::duration<double>(options_.liveness_timeout).count());
      fail("no heartbeat from " + ep_->peer() + why +
               ": its host or the link to it is down, or the peer is stopped",
           Fault::ConnectionLost);
    }
  } catch (const Error&) {
    // The pipe failed (failure_ says why): wake every waiter so that it sees it.
    try {
      worker_->signal();
    } catch (const Error&) {
    }
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(kick_.get(), &one, sizeof one);
  }
}

}  // namespace tensorwire::detail
