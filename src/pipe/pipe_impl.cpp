#include "pipe_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "os/fork.h"
#include "os/peer.h"
#include "runtime/wait.h"
#include "tensorwire/runtime/liveness.h"
#include "ucx/control.h"
#include "wire/control_frame.h"
#include "wire/hex.h"

namespace tensorwire::detail {

namespace {

// A payload that goes inline in its frame is gathered by UCX's eager protocol from the
// frame's pieces straight into the peer's FIFO: the encoder hands the leaves over as
// pieces rather than packing them into its staging buffer first (a second copy).
wire::Encoder encoder_for(const PipeOptions& o) {
  wire::Encoder e(o.consolidated ? wire::Mode::Consolidated : wire::Mode::NonConsolidated);
  e.gather_up_to(kInlineMax);
  return e;
}

wire::HandshakeConfig handshake_config(const PipeOptions& o) {
  return {"pipe",
          o.consolidated ? "consolidated" : "non-consolidated",
          o.auth_key,
          runtime::heartbeat_ms(o.liveness_timeout),
          /*split_payloads=*/true,
          /*host_verdict=*/true};
}

// Control frames are small; anything bigger is a protocol violation.
constexpr size_t kMaxControl = 64 * 1024;

}  // namespace

ucx::Request PipeImpl::post_control(const Json& body) {
  control_buf_ = wire::control_frame(body);
  return ep_->send(kControlTag, control_buf_);
}

// One control frame that arrived on `tag`, if any, received and validated: at most
// `max_bytes` long, one frame of kind Control whose JSON fills it. A peer that breaks
// that fails the pipe. Under mu_.
std::optional<Json> PipeImpl::take_control(uint64_t tag, size_t max_bytes, const char* what) {
  try {
    return ucx::take_control(*worker_, *ep_, tag, max_bytes, options_.limits, what,
                             ucx::frame_deadline(options_.liveness_timeout));
  } catch (const ProtocolError& e) {
    fail(e.what(), Fault::PeerBrokeProtocol);
  } catch (const ClosedError& e) {
    fail(e.what(), Fault::ConnectionLost);
  }
}

// Best effort: progresses until `req` completes or `budget` passes. Under mu_.
void PipeImpl::flush(ucx::Request& req, std::chrono::milliseconds budget) {
  auto until = Clock::now() + budget;
  try {
    while (!req.done() && Clock::now() < until) progress();
  } catch (const Error&) {
  }
}

const PipeOptions& checked_options(const PipeOptions& options) {
  if (options.limits.max_message_bytes == 0)
    throw ValueError("max_message_bytes must be at least 1 (the payload bytes a peer may send)");
  if (options.limits.max_metadata_bytes == 0)
    throw ValueError("max_metadata_bytes must be at least 1");
  checked_duration(options.liveness_timeout, "liveness_timeout");
  return options;
}

PipeImpl::PipeImpl(const std::string& host, uint16_t port, const PipeOptions& options)
    : options_(checked_options(options)),
      generation_(os::fork_generation()),
      owner_pid_(::getpid()),
      worker_(std::make_unique<ucx::Worker>()),
      encoder_(encoder_for(options)),
      decoder_(options.limits) {
  ep_ = std::make_unique<ucx::Endpoint>(*worker_, host, port);
}

PipeImpl::PipeImpl(ucx::ConnRequest& request, const PipeOptions& options, uint16_t local_port)
    : options_(options),
      generation_(os::fork_generation()),
      owner_pid_(::getpid()),
      local_port_(local_port),
      worker_(std::make_unique<ucx::Worker>()),
      encoder_(encoder_for(options)),
      decoder_(options.limits) {
  ep_ = std::make_unique<ucx::Endpoint>(*worker_, request);
}

PipeImpl::~PipeImpl() {
  close();
}

// ---- handshake & control ---------------------------------------------------

void PipeImpl::check_process() const {
  if (!ucx::inherited(generation_)) return;
  throw ucx::inherited_error("this TensorDictPipe (to " + ep_->peer() + ")", owner_pid_);
}

void PipeImpl::handshake(bool as_server) {
  const Deadline deadline = Deadline::after(options_.connect_timeout);
  auto send = [&](const Json& j) { send_control(j, deadline); };
  auto recv = [&]() { return recv_control(deadline); };
  wire::PeerIdentity peer;
  wait_wireup(deadline);
  try {
    peer = as_server ? wire::handshake_as_server(handshake_config(options_), send, recv)
                     : wire::handshake_as_client(handshake_config(options_), send, recv);
  } catch (...) {
    // Let the refusal reach the peer before the endpoint goes.
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < 50 && progress(); ++i) {
    }
    throw;
  }
  // The hello's word (its namespaces, its pid) is what the peer claims; anyone can claim to
  // be any process of this host. The connection's address tells whether the peer is on
  // this host, and the kernel's record of its socket whether it is one of this user's
  // processes: only then is its pid watched (a claimed pid of someone else's would end the
  // pipe when that process exits, or be watched instead of the peer).
  const bool local = peer.same_namespaces() && peer_is_local();
  const bool ours = local && peer_is_ours(as_server);
  // The peer's pidfd first, so that a peer dying during the switch below ends it at once.
  if (ours && peer.pid > 0) {
    try {
      peer_watch_.emplace(peer.pid);
    } catch (const SystemError&) {
      // Gone already, or not visible here: rely on UCX's own error detection.
    }
  }
  // The hellos' namespaces are alike on both sides, the addresses may not be (a port
  // proxy, NAT): both sides exchange their verdict, and only one they share counts. A peer
  // that sends no verdict (an earlier tensorwire) switches when it finds this side local:
  // then so does this side on its own verdict.
  const bool verdicts = peer.host_verdict;
  Host host = Host::Apart;
  if (verdicts ? peer.same_namespaces() : local) {
    host = use_direct_endpoint(deadline, local, ours, verdicts);
    retire_first_endpoint(deadline);
  }
  std::lock_guard<std::mutex> lock(mu_);
  // A peer that does not announce split payloads expects every payload of at most
  // kInlineMax bytes in its frame. A non-consolidated payload stays inline: one message
  // per leaf would cost more than the copies it saves. So does every payload over TCP.
  if (host == Host::Direct && peer.split_payloads && options_.consolidated)
    inline_max_ = kInlineSplit;
  connected_ = true;
  start_liveness(peer.heartbeat_ms, host != Host::Apart);
}

void PipeImpl::check_open(const char* what) const {
  if (closed_ || abandoned_) throw ClosedError(std::string(what) + ": the pipe is closed");
}

bool PipeImpl::reads_tag(uint64_t tag) const {
  if (tag == kHeartbeatTag) return !connected_ || heartbeats_on_;  // early ones: the peer's
  return tag >= kFrameTag && tag <= kControlTag;
}

void PipeImpl::abandon() noexcept {
  abandoned_ = true;
  waiting_.wake_all(*worker_);
}

// Whether the connection's other end is this machine by its address too (a loopback
// address or one of this host's interfaces), not only by what its hello claims.
bool PipeImpl::peer_is_local() const {
  return ucx::is_local_address(ep_->peer_address().host);
}

// Whether the peer's end is a socket of this user by the kernel's record: the client's
// socket (seen from the server), the server's listener (seen from the client). A worker
// address is parsed by UCX, which trusts it (a malformed one fails an assertion and aborts
// the process), so only a process that could do anything to this one anyway may hand us
// one. Symmetric: each side finds the other of its own user, or neither does.
bool PipeImpl::peer_is_ours(bool as_server) const {
  const ucx::PeerAddress& peer = ep_->peer_address();
  // The client's socket is connected to our listener's port; the server's is listening.
  const auto owner = os::tcp_socket_owner(peer.host, peer.port, /*listening=*/!as_server,
                                          as_server ? std::optional(local_port_) : std::nullopt);
  return owner && *owner == ::geteuid();
}

namespace {
// A UCX worker address is a few hundred bytes; anything near this is not one.
constexpr size_t kMaxWorkerAddress = 16 * 1024;
}  // namespace

// Two processes on one host (and in the same pid and IPC namespaces: not two containers):
// the client-server endpoint (what UCX's listener gives) carries
// TCP lanes for large transfers besides shared memory, and a worker with a TCP lane polls
// its socket on every progress. An endpoint created from the peer's worker address picks
// host-local transports only (UCX picks sysv shared memory here): 1 KiB
// latency 1.2 -> ~0.5 us, 1 MiB throughput x3. Both sides send whether they find the peer
// local and their address (null when their UCX_TLS excludes shared memory: then both stay
// on the first endpoint), switch, confirm over the new endpoint, and only then close the
// first one, so nothing in flight on it is lost. Apart unless both found the other local:
// only then does the pipe go without heartbeats (start_liveness). `verdicts`: the peer
// sends its verdict too (else it sends only its address, and only when local).
PipeImpl::Host PipeImpl::use_direct_endpoint(Deadline deadline, bool local, bool peer_is_ours,
                                             bool verdicts) {
  // A peer of another user is sent null (so both stay), and its address is never parsed.
  Json mine = nullptr;
  if (local && peer_is_ours && ucx::shared_memory_enabled())
    mine = wire::to_hex(worker_->address());
  Json offer = Json::object();
  if (verdicts) offer["same_host"] = local;
  offer["worker_address"] = mine;
  send_control(offer, deadline);
  Json reply = recv_control(deadline);
  // The peer's confirmation travels on the new endpoint and may overtake its address on
  // the first one: keep it for retire_first_endpoint().
  if (reply.is_object() && reply.contains("direct")) {
    early_direct_ = true;
    reply = recv_control(deadline);
  }
  std::lock_guard<std::mutex> lock(mu_);
  check_open("handshake");
  if (!reply.is_object() || !reply.contains("worker_address") ||
      (verdicts && (!reply.contains("same_host") || !reply["same_host"].is_boolean())))
    fail(std::string("expected the peer's ") + (verdicts ? "same_host verdict and " : "") +
             "worker address after the handshake, got " + wire::excerpt(reply),
         Fault::PeerBrokeProtocol);
  if (!local || (verdicts && !reply["same_host"].get<bool>())) return Host::Apart;
  const Json& theirs = reply["worker_address"];
  if (theirs.is_null()) return Host::Shared;
  std::optional<std::vector<std::byte>> address;
  if (theirs.is_string() && theirs.get_ref<const std::string&>().size() <= 2 * kMaxWorkerAddress)
    address = wire::from_hex(theirs.get<std::string>());
  if (!address || address->empty())
    fail("the peer's worker address is not a hex string of at most " +
             std::to_string(kMaxWorkerAddress) + " bytes",
         Fault::PeerBrokeProtocol);
  if (mine.is_null()) return Host::Shared;
  // Our own address handed back would connect the pipe to itself.
  if (*address == worker_->address())
    fail("the peer sent this process's own worker address", Fault::PeerBrokeProtocol);
  // UCX reads an address until its end marker: zeros after it keep a truncated one from
  // running past the buffer.
  address->resize(address->size() + 64, std::byte{0});
  std::unique_ptr<ucx::Endpoint> first = std::move(ep_);
  wired_up_ = false;  // until retire_first_endpoint() has flushed the new endpoint
  try {
    ep_ = std::make_unique<ucx::Endpoint>(*worker_, *address, *first);
  } catch (const Error& e) {
    ep_ = std::move(first);
    wired_up_ = true;
    fail(std::string("cannot connect to the peer's worker address: ") + e.what(),
         Fault::LocalFailure);
  }
  first_ep_ = std::move(first);
  return Host::Direct;
}

// After use_direct_endpoint switched: both sides confirm over the new endpoint, then the
// first one is closed.
void PipeImpl::retire_first_endpoint(Deadline deadline) {
  if (!first_ep_) return;
  wait_wireup(deadline);
  send_control({{"direct", true}}, deadline);
  if (!early_direct_) {
    Json ok = recv_control(deadline);
    if (!ok.is_object() || !ok.contains("direct")) {
      std::lock_guard<std::mutex> lock(mu_);
      fail("expected the peer's confirmation of the direct endpoint, got " + wire::excerpt(ok),
           Fault::PeerBrokeProtocol);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  check_open("handshake");  // close() took first_ep_ meanwhile
  // Nothing is pending on it (both sides confirmed), so no drain before the forced close.
  first_ep_->close(/*force=*/true, std::chrono::milliseconds(200), /*drain_failed=*/false);
  first_ep_.reset();
}

// UCX 1.13 first connects a client-server endpoint over TCP, then moves it to shared memory
// lanes; a send still pending across that move is replayed with the TCP lane's protocol and
// crashes ("Invalid am_short length", or a null call in ucp_wireup_replay_pending_requests).
// A flush completes only once the wire-up is over, so nothing is sent before it.
void PipeImpl::wait_wireup(Deadline deadline) {
  ucx::Request flushed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open("handshake");  // closed before its thread got here: the endpoint is gone
    flushed = ep_->flush();
  }
  wait_until([&] { return flushed.done(); }, deadline, "handshake");
  std::lock_guard<std::mutex> lock(mu_);
  wired_up_ = true;
  reached_peer_ = true;
}

void PipeImpl::close_abandoned() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!wired_up_ && !closed_ && ep_) ucx::let_wireup_end(*worker_, *ep_, ucx::kAbandonedWireup);
  }
  close();
}

void PipeImpl::throw_if_unreached(const std::string& host, uint16_t port) const {
  if (!reached_peer_ && ep_)
    ep_->throw_if_unreached("connect", host, port, "a PipeListener or TensorDictServer");
}

void PipeImpl::send_control(const Json& body, Deadline deadline) {
  ucx::Request req;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_alive();
    req = post_control(body);
  }
  wait_until([&] { return req.done(); }, deadline, "handshake");
}

Json PipeImpl::recv_control(Deadline deadline) {
  Json body;
  wait_until(
      [&] {
        std::optional<Json> got =
            take_control(kControlTag, wire::kHeaderBytes + kMaxControl, "control message");
        if (got) body = std::move(*got);
        return got.has_value();
      },
      deadline, "handshake");
  return body;
}

// Control messages after the handshake: the peer closing, or reporting our error.
void PipeImpl::drain_control() {
  std::optional<Json> got =
      take_control(kControlTag, wire::kHeaderBytes + kMaxControl, "control message");
  if (!got) return;
  const Json& body = *got;
  if (body.is_object() && body.contains("error"))
    fail("the peer closed the pipe after an error: " + wire::excerpt(body["error"]),
         Fault::PeerReportedError);
  // Anything else is not a close: a peer that sees the handshake differently (it waits for
  // an answer) or a broken one, told so instead of being taken for a clean close.
  if (!body.is_object() || !body.contains("close"))
    fail("unexpected control message from the peer: " + wire::excerpt(body),
         Fault::PeerBrokeProtocol);
  if (failure_.empty()) closed_by_peer_ = true;
  fail("the peer closed the pipe", Fault::ConnectionLost);
}

// A message in the middle of its receive whose sender closed the pipe: the sender's close
// message follows every send of its on the same endpoint, and a send that completed has
// been received whole, so once the close is here and one more progress does not finish the
// receive, the rest never comes (the sender closed during the send: a timeout, Ctrl-C,
// another thread). Without this the receive waited for ever on a peer that stays alive.
template <class Done>
void PipeImpl::check_cut(Done done) {
  if (!ep_->has_message(kControlTag)) return;
  progress();
  if (!done()) drain_control();
}

void PipeImpl::check_alive() {
  if (!failure_.empty()) {
    if (failure_is_protocol_) throw ProtocolError(failure_);
    throw ClosedError(failure_);
  }
  if (ep_->error() != UCS_OK)
    fail("connection to " + ep_->peer() + " lost: " + ucs_status_string(ep_->error()),
         Fault::ConnectionLost);
  try {
    ucx::refuse_foreign_tags(
        *worker_, [this](uint64_t tag) { return reads_tag(tag); }, "pipe");
  } catch (const ProtocolError& e) {
    fail(e.what(), Fault::PeerBrokeProtocol);
  }
  // The pidfd check is a system call: at most every few milliseconds, so the spin phase of
  // a wait stays cheap; and this runs on every poll, so the clock is read one call in 64.
  if (peer_watch_ && (++liveness_calls_ & 63) == 0) {
    auto now = Clock::now();
    if (now >= next_liveness_check_) {
      next_liveness_check_ = now + std::chrono::milliseconds(5);
      if (!peer_watch_->alive())
        fail("the peer process (pid " + std::to_string(peer_watch_->pid()) + ") has exited",
             Fault::ConnectionLost);
    }
  }
}

void PipeImpl::fail(const std::string& reason, Fault fault) {
  // Only the side that met the invalid bytes raises ProtocolError. For its peer the pipe is
  // closed, as on every other way a peer ends it: a sender's loop that ends on ClosedError
  // (docs/reliability.md) ends here too, and the message says what the receiver refused.
  const bool protocol = fault == Fault::PeerBrokeProtocol;
  const bool tell_peer = fault == Fault::PeerBrokeProtocol || fault == Fault::LocalFailure;
  if (failure_.empty()) {
    failure_ = reason;
    failure_is_protocol_ = protocol;
    peer_lost_ = fault == Fault::ConnectionLost;
    if (tell_peer && ep_->error() == UCS_OK) {
      try {
        ucx::Request req = post_control({{"error", reason}});
        flush(req, std::chrono::milliseconds(500));
      } catch (const Error&) {
      }
    }
    // Outstanding receives must not land in buffers we may free.
    frame_req_.cancel(worker_->handle());
    for (auto& r : payload_reqs_) r.cancel(worker_->handle());
    progress();
  }
  if (protocol) throw ProtocolError(failure_);
  throw ClosedError(failure_);
}

// ---- waiting ---------------------------------------------------------------

// Progress that wakes the other waiting thread (ucx/worker_wait.h). Under mu_.
unsigned PipeImpl::progress() {
  const unsigned n = waiting_.progress(*worker_);
  // A payload on its way in: what progressed is its bytes coming (the peer's heartbeats
  // wait behind them on the same connection; a message of GiBs over a slow link takes
  // longer than the liveness timeout). A cut link progresses nothing, so it is still seen.
  if (n && heartbeats_on_ && state_ == RecvState::Payload) heartbeats_.heard();
  return n;
}

bool PipeImpl::arm() {
  check_process();
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.arm(*worker_) == ucx::WorkerWait::Arm::Armed;
}

template <class Ready>
void PipeImpl::wait_until(Ready&& ready, Deadline deadline, const char* what) {
  const bool done = runtime::wait_until(deadline, [&](Deadline slice) {
    const uint64_t seen = worker_->events();
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_open(what);
      progress();
      if (ready()) return true;
      check_alive();
    }
    wait_event(slice, seen);
    return false;
  });
  if (!done) throw TimeoutError(std::string(what) + " timed out");
}

// Spins briefly, then sleeps on the worker's fd, the wake-up eventfd and the peer's pidfd
// until `slice` passes (ucx/worker_wait.h).
void PipeImpl::wait_event(Deadline slice, uint64_t seen) {
  waiting_.wait(
      *worker_, mu_, slice, seen, [&] { return !closed_ && !abandoned_; }, peer_fd());
}

// ---- sending ---------------------------------------------------------------

bool PipeImpl::start_send(const TensorDict& td) {
  check_process();
  // A blocking send() of another thread holds the turn from before it waits for the send
  // in flight until its own is over: starting one in between would take its place.
  const std::unique_lock<runtime::TimedLock> turn(send_mu_, std::try_to_lock);
  std::lock_guard<std::mutex> lock(mu_);
  return post_send(td, turn.owns_lock());
}

// Under mu_. `turn`: the caller holds send_mu_.
bool PipeImpl::post_send(const TensorDict& td, bool turn) {
  if (closed_) throw ClosedError("Cannot send on a closed pipe.");
  // The peer's own explanation (a control message) comes before the connection error
  // that follows it.
  drain_control();
  check_alive();
  if (!turn || sending_) return false;
  const wire::OutMessage& m = encoder_.encode(td);  // ValueError here: nothing sent yet
  const bool inline_payload = m.header.payload_bytes <= inline_max_;
  pieces_.clear();
  pieces_.emplace_back(m.header_bytes.data(), m.header_bytes.size());
  pieces_.emplace_back(reinterpret_cast<const std::byte*>(m.metadata.data()), m.metadata.size());
  if (inline_payload) pieces_.insert(pieces_.end(), m.payload.begin(), m.payload.end());
  // The message's last send waits for the receiver's match now and then (kUnmatchedBytes).
  const uint64_t bytes = m.header_bytes.size() + m.metadata.size() + m.header.payload_bytes;
  const bool matched =
      unmatched_bytes_ + bytes >= kUnmatchedBytes || unmatched_messages_ + 1 >= kUnmatchedMessages;
  unmatched_bytes_ = matched ? 0 : unmatched_bytes_ + bytes;
  unmatched_messages_ = matched ? 0 : unmatched_messages_ + 1;
  // Leaves gathered for an inline payload (encoder_for) go as one message, as the receiver
  // takes a consolidated payload into one buffer; otherwise one message a non-empty leaf.
  // The message's last send is the frame when none follows it.
  const bool gathered = !inline_payload && options_.consolidated && m.payload.size() > 1;
  const bool one_a_leaf = !inline_payload && !gathered;
  size_t last_leaf = m.payload.size();  // none
  if (one_a_leaf)
    for (size_t i = 0; i < m.payload.size(); ++i)
      if (!m.payload[i].empty()) last_leaf = i;
  using Done = ucx::Endpoint::Done;
  const auto done = [&](bool last) { return matched && last ? Done::Matched : Done::Local; };
  send_reqs_.clear();
  send_reqs_.push_back(
      ep_->send(kFrameTag, pieces_, frame_iov_, done(!gathered && last_leaf == m.payload.size())));
  if (gathered) send_reqs_.push_back(ep_->send(kPayloadTag, m.payload, payload_iov_, done(true)));
  if (one_a_leaf)
    for (size_t i = 0; i < m.payload.size(); ++i)
      if (!m.payload[i].empty())
        send_reqs_.push_back(ep_->send(kPayloadTag, m.payload[i], done(i == last_leaf)));
  sending_ = true;
  sending_td_ = &td;
  return true;
}

bool PipeImpl::step_send() {
  progress();
  bool all_done = true;
  for (auto& r : send_reqs_) all_done = r.done() && all_done;
  if (!all_done) {
    // Not finished: if the peer is gone, say so (its explanation first).
    drain_control();
    check_alive();
    return false;
  }
  send_reqs_.clear();
  sending_ = false;
  sending_td_ = nullptr;
  return true;
}

bool PipeImpl::poll_send(std::chrono::microseconds spin) {
  check_process();
  std::optional<TensorDict> done;  // destroyed with no lock held (see in_flight_)
  auto once = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw ClosedError("Cannot send on a closed pipe.");
    const bool over = !sending_ || step_send();
    if (over) done = taken_in_flight();
    return over;
  };
  if (once()) return true;
  return spin.count() > 0 && os::spin_for(spin, once);
}

std::optional<TensorDict> PipeImpl::taken_in_flight() {
  if (sending_) return std::nullopt;
  return std::exchange(in_flight_, std::nullopt);
}

bool PipeImpl::receiving_into(const TensorDict& td) {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ != RecvState::Idle && into_ == &td;
}

bool PipeImpl::sending(const TensorDict& td) {
  std::lock_guard<std::mutex> lock(mu_);
  // The address alone could be another dict's that took a dropped one's place. in_flight_
  // is a copy of a dict the encoder accepted, within the nesting limit same_leaves needs.
  return sending_ && sending_td_ == &td && (!in_flight_ || same_leaves(td, *in_flight_));
}

void PipeImpl::send(const TensorDict& td, Timeout timeout) {
  check_process();
  std::optional<TensorDict> done;  // destroyed last, with no lock held (see in_flight_)
  const Deadline deadline = Deadline::after(timeout);
  const auto one_sender = turn(send_mu_, deadline, "send");
  const bool resumed = sending(td);
  // Another TensorDict's send still in flight (an earlier call timed out): it completes
  // first, so messages arrive in the order they were sent, each once.
  try {
    wait_until([&] { return !sending_ || step_send(); }, deadline, "send");
  } catch (const TimeoutError&) {
    if (resumed) throw;
    // Unlike a send that timed out in flight, this one never started: say so, or the
    // caller would take it for sent later.
    throw TimeoutError(
        "send timed out before it started: an earlier send that timed out was still in "
        "flight, and this TensorDict was not sent (send it again)");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = taken_in_flight();
  }
  if (resumed) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Nothing in flight: the wait above saw to it, and only a holder of the turn starts one.
    if (!post_send(td, /*turn=*/true))
      throw Error("internal error: a send started while this one held the pipe's turn");
  }
  try {
    wait_until([&] { return !sending_ || step_send(); }, deadline, "send");
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    if (sending_ && !in_flight_) in_flight_.emplace(td);
    throw;
  }
}

// ---- receiving -------------------------------------------------------------

void PipeImpl::ensure_frame_capacity(size_t n) {
  if (n <= frame_capacity_) return;
  size_t cap = std::max<size_t>(n, 4096);
  frame_ = std::make_unique<std::byte[]>(cap);
  frame_capacity_ = cap;
}

TensorDict* PipeImpl::step_recv(TensorDict* into) {
  progress();
  try {
    if (state_ == RecvState::Idle) {
      auto m = ep_->probe(kFrameTag);
      if (!m) {
        // Data sent before a close is delivered first, and a close message before the
        // connection error that follows it.
        drain_control();
        check_alive();
        return nullptr;
      }
      const size_t len = m->first;
      const uint64_t max = wire::kHeaderBytes + options_.limits.max_metadata_bytes + kInlineMax;
      if (len < wire::kHeaderBytes || len > max)
        fail("received a frame of " + std::to_string(len) + " bytes (a frame holds a " +
                 std::to_string(wire::kHeaderBytes) + "-byte header, at most " +
                 std::to_string(options_.limits.max_metadata_bytes) + " metadata bytes and " +
                 std::to_string(kInlineMax) + " inline payload bytes)",
             Fault::PeerBrokeProtocol);
      ensure_frame_capacity(len);
      frame_len_ = len;
      frame_req_ = ep_->recv(m->second, {frame_.get(), len}, &frame_got_);
      into_ = into;
      state_ = RecvState::Frame;
    }
    if (state_ == RecvState::Frame) {
      if (!frame_req_.done()) {
        check_cut([&] { return frame_req_.done(); });
        check_alive();
        return nullptr;
      }
      if (frame_got_ != frame_len_)
        throw ProtocolError("frame carried " + std::to_string(frame_got_) + " bytes, probed " +
                            std::to_string(frame_len_));
      std::span<const std::byte> frame(frame_.get(), frame_len_);
      wire::FrameHeader h = decoder_.read_header(frame.first(wire::kHeaderBytes));
      const uint64_t meta_end = wire::kHeaderBytes + h.metadata_bytes;
      // The frame's length tells whether the payload is in it or follows on the payload
      // tag (whatever its size: a peer that announced no split payloads inlines every
      // payload of at most kInlineMax bytes).
      const bool inline_payload = frame_len_ == meta_end + h.payload_bytes;
      if (inline_payload && h.payload_bytes > kInlineMax)
        throw ProtocolError("frame carries a payload of " + std::to_string(h.payload_bytes) +
                            " bytes inline (at most " + std::to_string(kInlineMax) + ")");
      if (!inline_payload && frame_len_ != meta_end)
        throw ProtocolError("frame of " + std::to_string(frame_len_) +
                            " bytes, its header announces " + std::to_string(meta_end) +
                            " bytes of header and metadata and " + std::to_string(h.payload_bytes) +
                            " of payload");
      if (h.kind == wire::MessageKind::Control)
        throw ProtocolError("unexpected control message on the data channel");
      decoder_.prepare(h, frame.subspan(wire::kHeaderBytes, h.metadata_bytes), into_, incoming_);
      if (inline_payload) {
        wire::Decoder::fill(incoming_, frame.subspan(meta_end));
      } else {
        payload_reqs_.clear();
        // Sized before posting: each request writes its length into a stable slot.
        payload_got_.assign(incoming_.buffers.size(), 0);
        for (size_t i = 0; i < incoming_.buffers.size(); ++i)
          if (!incoming_.buffers[i].empty())
            payload_reqs_.push_back(ep_->recv(kPayloadTag, incoming_.buffers[i], &payload_got_[i]));
        state_ = RecvState::Payload;
      }
    }
    if (state_ == RecvState::Payload) {
      for (auto& r : payload_reqs_)
        if (!r.done()) {
          check_cut([&] { return r.done(); });
          check_alive();
          return nullptr;
        }
      for (size_t i = 0; i < incoming_.buffers.size(); ++i)
        if (payload_got_[i] != incoming_.buffers[i].size())
          throw ProtocolError("payload buffer " + std::to_string(i) + " carried " +
                              std::to_string(payload_got_[i]) + " bytes, the header announced " +
                              std::to_string(incoming_.buffers[i].size()));
      payload_reqs_.clear();
    }
    last_new_schema_ = incoming_.header.kind != wire::MessageKind::Storage;
    state_ = RecvState::Idle;
    return &decoder_.finish(incoming_);
  } catch (const ProtocolError& e) {
    if (failure_.empty()) fail(e.what(), Fault::PeerBrokeProtocol);
    throw;
  }
}

TensorDict* PipeImpl::poll_recv(TensorDict* into, std::chrono::microseconds spin) {
  return poll_receive(into, spin).target;
}

TensorDictPipe::Received PipeImpl::poll_receive(TensorDict* into, std::chrono::microseconds spin) {
  check_process();
  TensorDictPipe::Received out;
  auto once = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw ClosedError("Cannot recv on a closed pipe.");
    if (TensorDict* got = step_recv(into)) out = taken(got, into, false);
    return out.target != nullptr;
  };
  if (once() || spin.count() <= 0) return out;
  os::spin_for(spin, once);
  return out;
}

TensorDict& PipeImpl::recv(TensorDict* into, Timeout timeout) {
  return *receive(into, timeout, false).target;
}

TensorDictPipe::Received PipeImpl::receive(TensorDict* into, Timeout timeout, bool copy_always) {
  check_process();
  const Deadline deadline = Deadline::after(timeout);
  const auto one_receiver = turn(recv_mu_, deadline, "recv");
  TensorDictPipe::Received out;
  wait_until(
      [&] {
        if (TensorDict* got = step_recv(into)) out = taken(got, into, copy_always);
        return out.target != nullptr;
      },
      deadline, "recv");
  return out;
}

TensorDictPipe::Received PipeImpl::taken(TensorDict* got, TensorDict* into,
                                         bool copy_always) const {
  TensorDictPipe::Received r;
  r.target = got;
  r.new_schema = last_new_schema_;
  // The decoder's object of a consolidated pipe keeps its storage, which the next receive
  // rewrites in place: a copy the caller keeps (copy_always) gets storage of its own.
  if (copy_always && got != into && options_.consolidated)
    r.copy = got->clone();
  else if (copy_always || (got != into && (!options_.consolidated || last_new_schema_)))
    r.copy = TensorDict(*got);
  return r;
}

std::unique_lock<runtime::TimedLock> PipeImpl::turn(runtime::TimedLock& one_at_a_time,
                                                    Deadline deadline, const char* what) {
  std::unique_lock<runtime::TimedLock> lock(one_at_a_time, std::defer_lock);
  if (!runtime::wait_until(deadline,
                           [&](Deadline slice) { return lock.try_lock_until(slice.when()); }))
    throw TimeoutError(std::string(what) + " timed out waiting for another thread's " + what);
  return lock;
}

bool PipeImpl::failed() {
  if (ucx::inherited(generation_)) return true;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || !failure_.empty()) return true;
  const bool broken = ep_->error() != UCS_OK || (peer_watch_ && !peer_watch_->alive());
  // A close or error message already here: read it now (the pipe fails as the next call
  // would make it; data sent before it is still delivered), so closed_by_peer() knows;
  // also when the connection is gone since (a peer that closed the pipe, then exited).
  progress();
  if (!ep_->has_message(kControlTag)) return broken;
  try {
    drain_control();
  } catch (const Error&) {
  }
  return true;
}

std::string PipeImpl::transports() {
  check_process();
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return "";
  return ep_->transports();
}

// ---- closing ---------------------------------------------------------------

void PipeImpl::close() {
  if (ucx::inherited(generation_)) {
    // An inherited pipe in a forked child: its UCX objects are the parent's. Touching them
    // (even to free them) breaks the parent's connection or aborts in UCX, so they are
    // left alone; the ucx:: destructors leak them in this process.
    closed_ = true;
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_.exchange(true)) return;
  frame_req_.cancel(worker_->handle());
  for (auto& r : payload_reqs_) r.cancel(worker_->handle());
  progress();
  ucx::Request close_msg;
  if (failure_.empty() && ep_->error() == UCS_OK && connected_) {
    // Tell the peer, so its receive ends with "the peer closed the pipe" at once.
    try {
      close_msg = post_control({{"close", true}});
      flush(close_msg, std::chrono::milliseconds(500));
    } catch (const Error&) {
    }
  }
  if (failure_.empty()) failure_ = "the pipe is closed";
  frame_req_ = ucx::Request();
  payload_reqs_.clear();
  heartbeats_.drop();
  if (first_ep_) {  // closed during the switch to a direct endpoint
    first_ep_->close(/*force=*/true, std::chrono::milliseconds(200));
    first_ep_.reset();
  }
  if (linger(close_msg)) {
    waiting_.wake_all(*worker_);
    return;
  }
  close_msg = ucx::Request();  // released to UCX before the endpoint goes, as it was sent
  // A receive left in flight (one that timed out or was interrupted) may have matched the
  // peer's rendezvous: cancelling does not end that, a graceful close leaves it attached
  // to the endpoint, and UCX 1.13 aborts destroying the worker ("proto_reqs" not empty).
  // A forced close fails it.
  close_endpoint(/*force=*/state_ != RecvState::Idle);
}

bool PipeImpl::sends_in_flight() {
  bool running = false;
  for (auto& r : send_reqs_) {
    try {
      running = !r.done() || running;
    } catch (const Error&) {
    }
  }
  return running;
}

bool PipeImpl::peer_gone() const {
  return ep_->error() != UCS_OK || (peer_watch_ && !peer_watch_->alive());
}

void PipeImpl::close_endpoint(bool force, std::chrono::milliseconds budget) {
  // A send still in flight (abandoned, or refused by the peer: a rendezvous the peer will
  // never take) is dropped with the endpoint: a graceful close would wait for it, and UCX
  // 1.13 aborts destroying the worker while the endpoint still holds it.
  const bool in_flight = sends_in_flight();
  send_reqs_.clear();
  sending_ = false;
  sending_td_ = nullptr;
  // A peer that is gone (its process exited, silent, closed) takes nothing more: a
  // graceful close would wait for it, then leave a receive that had matched its
  // rendezvous attached to the endpoint (cancelling does not end one), and UCX 1.13
  // aborts destroying the worker ("proto_reqs" not empty). A forced close fails them.
  const bool gone = peer_lost_ || peer_gone();
  // Otherwise graceful once the endpoint's wire-up is over, so a refusal or error just sent
  // reaches the peer before the disconnect (a forced close can reset the connection under
  // it); by force before that: UCX 1.13 aborts when it flushes an endpoint in wire-up.
  ep_->close(/*force=*/force || !wired_up_ || in_flight || gone, budget);
  ep_->discard_unexpected();
  // Whoever sleeps on the pipe's fds looks again and meets ClosedError: an event loop's
  // coroutine on a pipe that its TensorDictServer closed has no other way to hear of it.
  waiting_.wake_all(*worker_);
}

}  // namespace tensorwire::detail
