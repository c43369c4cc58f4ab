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
#include "pipe_impl.h"

namespace tensorwire::detail {

void PipeImpl::start_liveness(int64_t peer_heartbeat_ms, bool same_host) {
  // Same host and namespaces: the kernel tells when the peer dies (its pidfd, or the reset
  // of its connection), and a peer stopped in a debugger is not taken for gone. Heartbeats
  // only where a silent peer may have vanished. Both sides decide alike: `same_host` is
  // the verdict both sent in the handshake (use_direct_endpoint), not each side's own.
  if (same_host) return;
  auto period = heartbeats_.start(peer_heartbeat_ms, options_.liveness_timeout);
  if (!period) return;
  heartbeats_on_ = true;  // tag 4 is read from now on (check_alive)
  runtime::keep_alive(weak_from_this(), *period);
}

void PipeImpl::beat() noexcept {
  if (ucx::inherited(generation_)) return;  // the parent's pipe: not ours to beat
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || !failure_.empty()) return;
  try {
    // Whatever this progress takes in may be what a waiter sleeps for: wake it to look.
    if (progress()) worker_->signal();
    std::optional<std::string> silent;
    try {
      silent = heartbeats_.beat(*worker_, *ep_, kHeartbeatTag, options_.limits, ep_->peer());
    } catch (const ProtocolError& e) {
      fail(e.what(), Fault::PeerBrokeProtocol);
    }
    check_alive();
    if (silent) fail(*silent, Fault::ConnectionLost);
  } catch (const Error&) {
    // The pipe failed (failure_ says why): wake every waiter so that it sees it.
    waiting_.wake_all(*worker_);
  }
}

}  // namespace tensorwire::detail
