// RemoteTransport's server: the listener thread, the connection threads and the slot bank.
#include "remote_server.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <new>
#include <utility>

#include "runtime/peer_liveness.h"
#include "tensorwire/runtime/liveness.h"
#include "tensorwire/runtime/log.h"
#include "ucx/control.h"
#include "wire/control_frame.h"
#include "wire/handshake.h"
#include "wire/message_bytes.h"
#include "wire/remote_frames.h"

namespace tensorwire::inference::detail {

namespace remote = wire::remote;
using Clock = std::chrono::steady_clock;

namespace {
// Requests a connection takes in per loop turn: one client cannot hold its thread forever.
constexpr int kMaxTakePerTurn = 64;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}
}  // namespace

wire::HandshakeConfig remote_handshake_config(const std::string& auth_key,
                                              std::chrono::milliseconds liveness_timeout) {
  // "fixed-2": the specs go as their structure alone (wire::encode_structure).
  return {"inference-remote", "fixed-2", auth_key, runtime::heartbeat_ms(liveness_timeout)};
}

// ---- RemoteServer ------------------------------------------------------------

RemoteServer::RemoteServer(const TensorDict& request_spec, const TensorDict& response_spec,
                           RemoteOptions o)
    : options(std::move(o)) {
  if (options.num_slots < 1 || options.num_slots > kMaxSlots)
    throw ValueError("num_slots must be 1 to " + std::to_string(kMaxSlots) + ", got " +
                     std::to_string(options.num_slots));
  if (options.port < 0 || options.port > 65535)
    throw ValueError("port must be 0 to 65535, got " + std::to_string(options.port));
  checked_duration(options.liveness_timeout, "liveness_timeout");
  checked_duration(options.handshake_timeout, "handshake_timeout", /*zero_allowed=*/false);
  const auto n = static_cast<uint32_t>(options.num_slots);
  request = SlotLayout::from_spec(request_spec, n, "request_spec");
  response = SlotLayout::from_spec(response_spec, n, "response_spec");
  try {  // a tensorwire error naming the sizes, as the shared-memory transport's mmap gives
    request_bank = Storage::allocate(request.bank_bytes(), 64);
    response_bank = Storage::allocate(response.bank_bytes(), 64);
    batch.staging = Storage::allocate(request.bank_bytes(), 64);
  } catch (const std::bad_alloc&) {
    throw SystemError("RemoteTransport: banks of " + std::to_string(n) + " slots (" +
                          std::to_string(request.bank_bytes()) + " bytes of requests, twice, and " +
                          std::to_string(response.bank_bytes()) +
                          " of responses) do not fit in memory",
                      ENOMEM);
  }
  for (const LeafSlot& l : request.leaves()) request_bytes += l.row_bytes;
  slots.resize(n);
  for (uint32_t i = n; i-- > 0;) free_slots.push_back(i);
  listener_.emplace(static_cast<uint16_t>(options.port), options.host);
  port = listener_->port();
  listener_thread_ = std::thread([this] { listen(); });
}

RemoteServer::~RemoteServer() {
  stop("the remote transport was closed");
}

void RemoteServer::stop(const std::string& reason) {
  std::call_once(stopped_once_, [&] {
    stop_.store(true);
    try {
      listener_->worker().signal();
    } catch (const Error&) {
    }
    if (listener_thread_.joinable()) listener_thread_.join();
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& c : threads_) c->stop(reason);
    }
    reap(true);
    listener_.reset();
  });
}

void RemoteServer::listen() noexcept {
  while (!stop_.load()) {
    try {
      if (auto r = listener_->poll()) {
        std::unique_lock<std::mutex> lock(mu);
        auto c = std::make_shared<RemoteConnection>(*this, next_conn_++, *r);
        try {
          c->start();
        } catch (const std::system_error& e) {
          // No thread to be had (a thread or process limit): this client is refused at once,
          // and the server goes on (an exception out of here ended the process).
          lock.unlock();
          listener_->reject(*r);
          refuse("client " + r->address.str() +
                 " refused: no thread for its connection: " + e.what());
          continue;
        }
        threads_.push_back(c);
        continue;
      }
      reap(false);
      listener_->worker().wait(std::chrono::milliseconds(100));
    } catch (const Error& e) {
      log_message(LogLevel::Warning, std::string("RemoteTransport: listener: ") + e.what());
    }
  }
}

// Joins connection threads that ended (all of them when `all`).
void RemoteServer::reap(bool all) {
  std::vector<std::shared_ptr<RemoteConnection>> done;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = std::partition(threads_.begin(), threads_.end(),
                             [&](const auto& c) { return !all && !c->finished(); });
    done.assign(it, threads_.end());
    threads_.erase(it, threads_.end());
  }
  for (auto& c : done) c->join();
}

void RemoteServer::free_slot(uint32_t i) {
  slots[i] = RemoteSlot{};
  while (!starved.empty()) {
    const uint32_t id = starved.front();
    starved.pop_front();
    if (auto it = conns.find(id); it != conns.end()) {  // one gone meanwhile is skipped
      it->second->granted.push_back(i);
      it->second->wake();
      return;
    }
  }
  free_slots.push_back(i);
}

void RemoteServer::answer(uint32_t slot, std::optional<Json> failure, Sender sender) {
  RemoteSlot& s = slots[slot];
  if (s.state == RemoteSlot::Free || s.state == RemoteSlot::Answering) return;  // answered once
  auto it = conns.find(s.conn);
  if (it == conns.end()) return free_slot(slot);  // its client is gone: the request is dropped
  if (s.state == RemoteSlot::Ready || s.state == RemoteSlot::Taken) --it->second->unanswered;
  s.state = RemoteSlot::Answering;
  Outgoing o{slot, s.seq, std::move(failure)};
  if (sender == Sender::Caller && it->second->send_now(o)) return;
  it->second->outbox.push_back(std::move(o));
  it->second->wake();
}

uint64_t RemoteServer::take_arrivals() {
  int64_t now;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (conns.empty() || conns.size() > kConnectionsTheServerReceivesFrom) return 0;
    now = now_ns();
    for (const auto& [id, c] : conns)
      if (c->overdue(now)) arrivals_.push_back(c);
  }
  uint64_t found = 0;
  for (const auto& c : arrivals_) {
    const bool took = c->receive_now();
    c->looked(now, took);
    found += took;
  }
  arrivals_.clear();
  return found;
}

void RemoteServer::refuse(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu);
    ++refused;
    last_refusal = why;
  }
  log_message(LogLevel::Warning, "RemoteTransport: " + why);  // not under mu (it takes the GIL)
}

// ---- RemoteConnection --------------------------------------------------------

struct RemoteConnection::Receive {
  uint32_t slot;
  size_t length = 0;
  std::vector<ucp_dt_iov_t> iov;
  ucx::Request req;
};

struct RemoteConnection::Send {
  uint32_t slot;
  std::vector<std::byte> frame;  // a failure message's bytes
  std::vector<ucp_dt_iov_t> iov;
  ucx::Request req;
};

RemoteConnection::RemoteConnection(RemoteServer& server, uint32_t id, ucx::ConnRequest request)
    : s_(server), id_(id), request_(request), peer_("client " + request.address.str()) {}

RemoteConnection::~RemoteConnection() {
  join();
}

void RemoteConnection::join() {
  if (!thread_.joinable()) return;
  // The last reference may be dropped by the connection's own thread (release_slots()).
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();
  else
    thread_.join();
}

void RemoteConnection::start() {
  thread_ = std::thread([this] { run(); });
}

void RemoteConnection::stop(const std::string& reason) {
  stop_reason_ = reason;
  stop_.request_stop();
  wake();
}

void RemoteConnection::wake() noexcept {
  bell_.seq.fetch_add(1, std::memory_order_seq_cst);
  // Read after the bell (serve() sets asleep_, then reads the bell): a thread not asleep yet
  // sees the bell and does not sleep.
  if (!asleep_.load(std::memory_order_seq_cst)) return;
  std::lock_guard<std::mutex> lock(wake_mu_);
  try {
    if (worker_) worker_->signal();
  } catch (const Error&) {
  }
}

void RemoteConnection::run() noexcept {
  std::unique_lock<std::mutex> io(io_mu_);  // released only while the thread waits (serve())
  std::string refusal;                      // a handshake or protocol failure, counted as a refusal
  std::optional<Json> tell;                 // what the client is told before the connection goes
  bool connected = false;
  try {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      worker_ = std::make_unique<ucx::Worker>();
    }
    ep_ = std::make_unique<ucx::Endpoint>(*worker_, request_);
    handshake();
    connected = true;
    serve(io);
    std::lock_guard<std::mutex> lock(s_.mu);
    tell = Json{{"closed", stop_reason_}};
  } catch (const wire::HandshakeError& e) {
    refusal = peer_ + " refused: " + e.what();
  } catch (const ProtocolError& e) {
    refusal = peer_ + " disconnected: " + e.what();
    tell = Json{{"error", e.what()}};
  } catch (const Error& e) {
    // A client that stalls or vanishes in its handshake is refused, as the pipe's listener
    // counts it; one that goes away later (closed, died, its host or link gone) is not, and
    // there is nobody to tell. Neither is a handshake the server's closing ended.
    if (!connected && !stop_.stop_requested()) refusal = peer_ + " refused: " + e.what();
  }
  if (!io.owns_lock()) io.lock();            // thrown from serve()'s wait, where it lets go of it
  if (request_.handle) s_.reject(request_);  // no endpoint was made from it
  if (!refusal.empty()) {
    s_.refuse(refusal);
  }
  try {
    if (tell && ep_ && ep_->error() == UCS_OK) {
      std::vector<std::byte> frame = wire::control_frame(*tell);
      ucx::Request req = ep_->send(remote::tag(remote::Kind::Control), frame);
      const auto until = Clock::now() + std::chrono::milliseconds(500);
      while (!req.done() && Clock::now() < until) worker_->progress();
    }
  } catch (const Error&) {
  }
  release_slots();
  io.unlock();  // before finished_: a reaper may destroy this connection from then on
  finished_.store(true, std::memory_order_release);
}

void RemoteConnection::handshake() {
  const Deadline deadline = Deadline::after(s_.options.handshake_timeout);
  const uint64_t ctl = remote::tag(remote::Kind::Control);
  const wire::Limits limits;
  const char* what = "remote inference handshake";
  const std::stop_token stop = stop_.get_token();
  ucx::wait_wired_up(*worker_, *ep_, deadline, what, stop);
  auto send = [&](const Json& j) { ucx::send_control(*worker_, *ep_, ctl, j, deadline, stop); };
  auto recv = [&] { return ucx::recv_control(*worker_, *ep_, ctl, limits, deadline, what, stop); };
  wire::PeerIdentity peer;
  try {
    peer = wire::handshake_as_server(
        remote_handshake_config(s_.options.auth_key, s_.options.liveness_timeout), send, recv);
  } catch (...) {
    for (int i = 0; i < 50 && worker_->progress(); ++i) {  // let the refusal reach the client
    }
    throw;
  }
  send({{"num_slots", s_.options.num_slots}});
  for (const TensorDict* spec : {&s_.request.spec(), &s_.response.spec()}) {
    const std::string text = wire::encode_structure(*spec);  // alive until sent (waited below)
    ucx::Request req = ep_->send(remote::tag(remote::Kind::Spec), std::as_bytes(std::span(text)));
    ucx::wait_sent(*worker_, *ep_, req, deadline, "remote inference handshake: sending the specs",
                   stop);
  }
  period_ = heartbeats_.start(peer.heartbeat_ms, s_.options.liveness_timeout)
                .value_or(std::chrono::milliseconds(100));
  period_ = std::min(period_, std::chrono::milliseconds(100));
  std::lock_guard<std::mutex> lock(s_.mu);
  s_.conns[id_] = shared_from_this();
  ++s_.connected;
}

namespace {
// The kinds of message a client sends once connected (wire/remote_frames.h).
bool client_sends(uint64_t tag) {
  const auto kind = static_cast<remote::Kind>(tag & remote::kKindMask);
  if (kind == remote::Kind::Request) return true;
  return remote::seq_of(tag) == 0 &&
         (kind == remote::Kind::Control || kind == remote::Kind::Heartbeat);
}
}  // namespace

void RemoteConnection::serve(std::unique_lock<std::mutex>& io) {
  const uint64_t ctl = remote::tag(remote::Kind::Control);
  const wire::Limits limits;
  while (!stop_.stop_requested()) {
    if (stolen_failure_) std::rethrow_exception(std::exchange(stolen_failure_, nullptr));
    turn_ns_.store(now_ns(), std::memory_order_relaxed);
    const uint32_t rung = bell_.seq.load(std::memory_order_seq_cst);  // before the outbox check
    while (worker_->progress()) {
    }
    if (ep_->error() != UCS_OK)
      throw ClosedError(peer_ + " lost: " + ucs_status_string(ep_->error()));
    if (auto c =
            ucx::take_control(*worker_, *ep_, ctl, ucx::kMaxControlFrame, limits, "control message",
                              ucx::frame_deadline(s_.options.liveness_timeout))) {
      if (c->is_object() && c->contains("error"))
        throw ClosedError(peer_ + " closed after an error: " + (*c)["error"].dump());
      return;  // the client closed
    }
    heartbeats();
    complete_receives();
    take_requests();
    ucx::refuse_foreign_tags(*worker_, client_sends, "remote inference connection");
    send_answers();
    complete_sends();
    // Sleep until UCX has an event (a transfer in flight moved on too: the worker's fd fires
    // for it), an answer is queued (wake()) or a heartbeat is due.
    bool awaiting_answers;
    {
      std::lock_guard<std::mutex> lock(s_.mu);
      if (!outbox.empty()) continue;
      awaiting_answers = unanswered > 0;
    }
    // A receive of a message that had already arrived, or a small send, completes when it is
    // posted, with no event to wake the worker's fd: finish those before sleeping.
    auto done = [](const auto& r) { return r->req.done(); };
    if (std::any_of(receives_.begin(), receives_.end(), done) ||
        std::any_of(sends_.begin(), sends_.end(), done))
      continue;
    // The waits leave the worker to the serving thread (send_now()).
    io.unlock();
    // A look never blocks on the worker's mutex: the serving thread holds it while it sends
    // an answer or takes requests in (microseconds), and a thread that blocked on it slept
    // in the kernel and paid a wake-up, once per request in some runs (a 1.8x slower round
    // trip, docs/benchmarks.md).
    auto look = [&] {
      std::unique_lock<std::mutex> lock(io_mu_, std::try_to_lock);
      if (!lock) return bell_.seq.load(std::memory_order_seq_cst) != rung;
      turn_ns_.store(now_ns(), std::memory_order_relaxed);
      return worker_->progress() != 0 || bell_.seq.load(std::memory_order_seq_cst) != rung;
    };
    auto sleep = [&] {
      asleep_.store(true, std::memory_order_seq_cst);
      bool armed = false;
      {
        // The bell is read under the worker's mutex: receive_now() rings it under that mutex
        // after it ran the worker, so either we see its bell or it ran before our arming.
        std::lock_guard<std::mutex> lock(io_mu_);
        armed = bell_.seq.load(std::memory_order_seq_cst) == rung && worker_->ready_to_sleep();
      }
      if (armed) worker_->sleep(period_);
      asleep_.store(false, std::memory_order_relaxed);
    };
    (awaiting_answers ? answer_spin_ : request_spin_).poll_or_sleep(look, sleep);
    relock(io);
  }
}

// Takes the worker back after a wait, yielding while the serving thread holds it (for
// microseconds: see serve()'s look) before blocking.
void RemoteConnection::relock(std::unique_lock<std::mutex>& io) {
  if (!os::spin_for(kRelockSpin, [&] { return io.try_lock(); })) io.lock();
}

void RemoteConnection::heartbeats() {
  if (auto why = heartbeats_.beat(*worker_, *ep_, remote::tag(remote::Kind::Heartbeat),
                                  wire::Limits{}, peer_))
    throw ClosedError(*why);
}

// Takes in requests that arrived, each straight into a free slot's rows.
void RemoteConnection::take_requests() {
  for (int n = 0; n < kMaxTakePerTurn; ++n) {
    uint32_t slot;
    {
      std::lock_guard<std::mutex> lock(s_.mu);
      if (!granted.empty()) {
        slot = granted.back();
        granted.pop_back();
      } else if (!s_.free_slots.empty()) {  // none free while another waits (free_slot)
        slot = s_.free_slots.back();
        s_.free_slots.pop_back();
      } else {
        // Left in UCX's queue until free_slot() hands this connection a slot; in line only
        // with a request at hand, so a slot is not handed around idle connections.
        if (ep_->has_message(remote::tag(remote::Kind::Request), remote::kKindMask) &&
            std::find(s_.starved.begin(), s_.starved.end(), id_) == s_.starved.end())
          s_.starved.push_back(id_);
        return;
      }
    }
    auto m = ep_->probe(remote::tag(remote::Kind::Request), remote::kKindMask);
    {
      std::lock_guard<std::mutex> lock(s_.mu);
      if (!m) {
        s_.free_slot(slot);
        return;
      }
      try {
        remote::check_request_length(m->length, s_.request_bytes);
      } catch (const ProtocolError&) {
        s_.free_slot(slot);
        throw;  // the connection goes; UCX drops the message with the worker
      }
      RemoteSlot& rs = s_.slots[slot];
      rs.state = RemoteSlot::Receiving;
      rs.conn = id_;
      rs.seq = remote::seq_of(m->tag);
    }
    // Outside server.mu: a receive of a message that has arrived copies its bytes into the
    // slot (21 KiB for uint8[84,84,3]), and the serving thread's spin and drains take that
    // mutex. The slot is this connection's already; nobody else touches a Receiving one.
    auto r = std::make_unique<Receive>();
    r->slot = slot;
    std::vector<std::span<std::byte>> pieces;
    for (const LeafSlot& l : s_.request.leaves())
      pieces.emplace_back(s_.request_bank.data() + l.offset + slot * l.row_bytes, l.row_bytes);
    try {
      r->req = ep_->recv(m->message, pieces, r->iov, &r->length);
    } catch (...) {
      std::lock_guard<std::mutex> lock(s_.mu);
      s_.free_slot(slot);
      throw;
    }
    receives_.push_back(std::move(r));
  }
}

size_t RemoteConnection::complete_receives() {
  size_t completed = 0;
  for (size_t i = 0; i < receives_.size();) {
    Receive& r = *receives_[i];
    if (!r.req.done()) {
      ++i;
      continue;
    }
    bool made_ready = false;
    {
      std::lock_guard<std::mutex> lock(s_.mu);
      RemoteSlot& rs = s_.slots[r.slot];
      rs.submitted_ns = now_ns();
      if (s_.stopped) {
        s_.answer(r.slot, remote::failure_json({"RuntimeError", s_.stop_reason, true}));
      } else {
        rs.state = RemoteSlot::Ready;
        s_.ready.push_back(r.slot);
        ++unanswered;
        ++s_.wakeups;
        s_.work.notify_one();
        made_ready = true;
      }
    }
    if (made_ready) s_.notifier.notify();
    receives_[i] = std::move(receives_.back());
    receives_.pop_back();
    ++completed;
  }
  return completed;
}

void RemoteConnection::send_answers() {
  std::deque<Outgoing> out;
  {
    std::lock_guard<std::mutex> lock(s_.mu);
    out.swap(outbox);
  }
  for (Outgoing& o : out) post(o);
}

bool RemoteConnection::send_now(Outgoing& o) {
  std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
  if (!io || !ep_ || stop_.stop_requested()) return false;
  try {
    if (post(o)) {  // sent at once (small answers over TCP): the slot is free again
      sends_.pop_back();
      s_.free_slot(o.slot);
      io.unlock();  // before the bell: the thread that sees it takes the worker at once
      // The client asks again soon after an answer: a thread spinning for it starts its
      // spin again (one asleep stays asleep: waking it costs the client a CPU here).
      bell_.seq.fetch_add(1, std::memory_order_seq_cst);
      return true;
    }
  } catch (const Error&) {
    return false;  // the thread finds the endpoint's failure on its next turn
  }
  wake();  // the thread completes the send and frees the slot
  return true;
}

bool RemoteConnection::overdue(int64_t now) const noexcept {
  using std::chrono::nanoseconds;
  return unanswered == 0 && outbox.empty() && now >= next_look_ns_ &&
         now - turn_ns_.load(std::memory_order_relaxed) > nanoseconds(kTurnOverdue).count();
}

void RemoteConnection::looked(int64_t now, bool found) noexcept {
  using std::chrono::nanoseconds;
  look_gap_ns_ = found ? nanoseconds(kLookGapMin).count()
                       : std::clamp(2 * look_gap_ns_, nanoseconds(kLookGapMin).count(),
                                    nanoseconds(kLookGapMax).count());
  next_look_ns_ = now + look_gap_ns_;
}

bool RemoteConnection::receive_now() {
  std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
  if (!io || !ep_ || stolen_failure_ || stop_.stop_requested()) return false;
  const size_t before = receives_.size();
  uint64_t made_ready = 0;
  bool moved = false;
  try {
    while (worker_->progress()) moved = true;
    take_requests();
    made_ready = complete_receives();
  } catch (...) {
    stolen_failure_ = std::current_exception();
    wake();  // the thread ends the connection with it now, not after its sleep
    return true;
  }
  // Progress may have used up events only the thread acts on (a send that completed, the
  // client's close, requests beyond one turn's): the bell, rung under the worker's mutex,
  // makes it take a turn before it sleeps (its spin and its arming read the bell). One
  // already asleep was woken by those events' arrival on its fd: no signal is needed.
  const bool took = made_ready > 0 || receives_.size() != before;
  if (moved || took) bell_.seq.fetch_add(1, std::memory_order_seq_cst);
  return took;
}

bool RemoteConnection::post(Outgoing& o) {
  auto snd = std::make_unique<Send>();
  snd->slot = o.slot;
  if (o.failure) {
    snd->frame = wire::control_frame(*o.failure);
    snd->req = ep_->send(remote::tag(remote::Kind::Failure, o.seq), snd->frame);
  } else {
    std::vector<std::span<const std::byte>> pieces;
    for (const LeafSlot& l : s_.response.leaves())
      pieces.emplace_back(s_.response_bank.data() + l.offset + o.slot * l.row_bytes, l.row_bytes);
    snd->req = ep_->send(remote::tag(remote::Kind::Response, o.seq), pieces, snd->iov);
  }
  sends_.push_back(std::move(snd));
  try {
    return o.slot != UINT32_MAX && sends_.back()->req.done();
  } catch (...) {
    sends_.pop_back();  // failed at once: the caller fails too, the slot is freed once
    throw;
  }
}

void RemoteConnection::complete_sends() {
  for (size_t i = 0; i < sends_.size();) {
    if (!sends_[i]->req.done()) {
      ++i;
      continue;
    }
    if (sends_[i]->slot != UINT32_MAX) {
      std::lock_guard<std::mutex> lock(s_.mu);
      s_.free_slot(sends_[i]->slot);
    }
    sends_[i] = std::move(sends_.back());
    sends_.pop_back();
  }
}

// The connection is over: UCX state goes first (nothing can land in a slot after that),
// then every slot of this client is given back, except those the policy works on (answer()
// frees them once the batch is done).
void RemoteConnection::release_slots() noexcept {
  for (auto& r : receives_) r->req.cancel(worker_ ? worker_->handle() : nullptr);
  receives_.clear();
  sends_.clear();
  heartbeats_.drop();
  try {
    if (ep_) {
      ep_->close(/*force=*/true, std::chrono::milliseconds(200));
      ep_->discard_unexpected();
    }
  } catch (const Error&) {
  }
  ep_.reset();
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    worker_.reset();
  }
  std::lock_guard<std::mutex> lock(s_.mu);
  if (s_.conns.erase(id_)) --s_.connected;
  std::erase(s_.starved, id_);  // first: each slot freed below goes to a connection that is left
  outbox.clear();
  for (uint32_t i : std::exchange(granted, {})) s_.free_slot(i);
  for (uint32_t i = 0; i < s_.slots.size(); ++i) {
    RemoteSlot& rs = s_.slots[i];
    if (rs.conn != id_ || rs.state == RemoteSlot::Free || rs.state == RemoteSlot::Taken) continue;
    if (rs.state == RemoteSlot::Ready)
      s_.ready.erase(std::find(s_.ready.begin(), s_.ready.end(), i));
    s_.free_slot(i);
  }
}

}  // namespace tensorwire::inference::detail
