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

namespace {
// How often a lingering close is progressed (the liveness thread's shortest period).
constexpr std::chrono::milliseconds kLingerTurn{10};
// How long a close lingers where liveness checks are off (the liveness timeout's default).
constexpr std::chrono::milliseconds kLingerOff{10'000};
}  // namespace

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
  // Let go of outside mu_, in this order: the storages (which may take the GIL), then the
  // pipe's own reference (the last one destroys the pipe and its mutex).
  std::shared_ptr<PipeImpl> self;
  std::optional<TensorDict> storages;
  std::lock_guard<std::mutex> lock(mu_);
  if (lingering_) return linger_turn(self, storages);
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

// A close with a send in flight. Over shared memory everything a pipe sends goes through the
// peer's FIFO in order, and a message bigger than the FIFO waits at the sender until the
// peer's receive makes room: the close message queues behind it. Dropping the endpoint
// then (as over TCP, where the peer sees the connection go) left a peer that lives on and
// receives later waiting for the rest of the message for ever: nothing else tells it of the
// close (no heartbeats on one host, the process lives). So the close lingers, as a socket's
// does: the liveness thread progresses the pipe until the message and the close message
// have left (the peer's next receive gets that message whole, the one after it
// ClosedError), the peer is gone, or the liveness timeout (its default when off) passed,
// holding the message's storages meanwhile. Not during the destructor (nothing owns the
// pipe then) or before the endpoint's wire-up is over. Also when the close message left
// but a send is still in flight: a message sent synchronously (kUnmatchedBytes) that the
// peer has not matched yet, or a rendezvous it has not pulled. Its bytes may have left, but
// closing at once is by force (close_endpoint), which over TCP can reset the connection
// under them.
bool PipeImpl::linger(ucx::Request& close_msg) {
  // A receive of ours in flight writes into the caller's dict, which nothing holds once
  // close() returns: only the forced close ends it.
  if (!sends_in_flight() || state_ != RecvState::Idle || !wired_up_ || peer_lost_ || peer_gone())
    return false;
  auto self = std::static_pointer_cast<PipeImpl>(weak_from_this().lock());
  if (!self) return false;
  // A send started with start_send() reads the caller's dict, which the caller may let go
  // of once close() returns: hold its storages from here.
  if (!in_flight_ && sending_td_) in_flight_ = *sending_td_;
  close_msg_ = std::move(close_msg);
  const auto bound = options_.liveness_timeout;
  linger_until_ = Clock::now() + (bound > std::chrono::milliseconds::zero() ? bound : kLingerOff);
  lingering_ = std::move(self);
  runtime::keep_alive(weak_from_this(), kLingerTurn);
  return true;
}

void PipeImpl::linger_turn(std::shared_ptr<PipeImpl>& self, std::optional<TensorDict>& storages) {
  bool failed = false;
  bool left = false;
  bool sent = true;
  try {
    // Up to a millisecond while the close message waits: each turn moves what the peer's
    // FIFO has room for. Once it has left, one look a turn.
    const auto until = Clock::now() + std::chrono::milliseconds(1);
    while (!(left = close_msg_.done()) && Clock::now() < until) progress();
    if (left) progress();
    for (auto& r : send_reqs_) sent = r.done() && sent;
  } catch (const Error&) {
    failed = true;  // a request failed: the endpoint is broken
  }
  const bool gone = peer_gone();
  // The storages go only once UCX is done reading them (a peer that pulls a rendezvous
  // itself may still read them after the close message overtook the data), the peer is
  // gone, or the bound passed.
  if (!(failed || (left && sent) || gone || Clock::now() >= linger_until_)) return;
  close_msg_ = ucx::Request();
  // By force: a graceful close waits up to a second for the peer, on the thread every
  // cross-host pipe's heartbeats share.
  close_endpoint(/*force=*/true, std::chrono::milliseconds(100));
  storages = std::move(in_flight_);
  in_flight_.reset();
  self = std::move(lingering_);
}

}  // namespace tensorwire::detail
