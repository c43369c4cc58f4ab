// RemoteTransport's client side: the link to the server and the requests in flight on it.
#include "remote_client.h"

#include "bank_batch.h"
#include "os/fork.h"
#include "os/port.h"
#include "remote_server.h"
#include "runtime/wait.h"
#include "ucx/control.h"
#include "wire/control_frame.h"
#include "wire/message_bytes.h"
#include "wire/remote_frames.h"

namespace tensorwire::inference::detail {

namespace remote = wire::remote;
using Clock = std::chrono::steady_clock;

namespace {
// A spec message is a wire-codec message of a spec's metadata and example leaves.
constexpr size_t kMaxSpecBytes = 64ull << 20;
}  // namespace

std::pair<std::string, uint16_t> parse_address(const std::string& address) {
  const auto colon = address.rfind(':');
  auto bad = [&] {
    return ValueError("remote inference address must be \"host:port\", got \"" + address + "\"");
  };
  if (colon == std::string::npos || colon == 0) throw bad();
  const std::optional<uint16_t> port = os::parse_port(std::string_view(address).substr(colon + 1));
  if (!port || *port == 0) throw bad();
  return {address.substr(0, colon), *port};
}

// ---- RemoteLink ----------------------------------------------------------------

RemoteLink::RemoteLink(const std::string& host, uint16_t port, const RemoteClientOptions& options,
                       Deadline deadline)
    : generation(os::fork_generation()),
      address(host + ":" + std::to_string(port)),
      options_(options) {
  worker = std::make_unique<ucx::Worker>();
  ep = std::make_unique<ucx::Endpoint>(*worker, host, port);
  const uint64_t ctl = remote::tag(remote::Kind::Control);
  const wire::Limits limits;
  const char* what = "remote inference connect";
  bool wired = false;  // the wire-up is over
  try {
    try {
      ucx::wait_wired_up(*worker, *ep, deadline, what);
      wired = true;
    } catch (const Error&) {
      ep->throw_if_unreached(what, host, port, "a RemoteTransport");
      throw;
    }
    auto send = [&](const Json& j) { ucx::send_control(*worker, *ep, ctl, j, deadline); };
    auto recv = [&] { return ucx::recv_control(*worker, *ep, ctl, limits, deadline, what); };
    wire::PeerIdentity peer = wire::handshake_as_client(
        remote_handshake_config(options.auth_key, options.liveness_timeout), send, recv);
    num_slots = remote::parse_num_slots(recv());
    TensorDict specs[2];
    for (TensorDict& spec : specs) {
      std::optional<ucx::Endpoint::Probed> m;
      const bool got = runtime::wait_until(deadline, [&](Deadline slice) {
        while (worker->progress()) {
        }
        m = ep->probe(remote::tag(remote::Kind::Spec), ~uint64_t{0});
        if (m) return true;
        if (ep->error() != UCS_OK)
          throw ClosedError(std::string(what) + ": connection to " + address + " lost");
        worker->wait(std::chrono::milliseconds(std::max<int>(1, slice.poll_ms())));
        return false;
      });
      if (!got) throw TimeoutError(std::string(what) + ": no spec from " + address + " in time");
      if (m->length > kMaxSpecBytes)
        throw ProtocolError("remote inference spec of " + std::to_string(m->length) +
                            " bytes (at most " + std::to_string(kMaxSpecBytes) + ")");
      spec = wire::decode_structure(
          ucx::receive_probed(*worker, *ep, m->message, m->length, deadline, what), limits);
    }
    request = SlotLayout::from_spec(specs[0], 1, "the server's request_spec");
    response = SlotLayout::from_spec(specs[1], 1, "the server's response_spec");
    auto period = heartbeats_.start(peer.heartbeat_ms, options.liveness_timeout);
    if (period) heartbeat_period = *period;
  } catch (...) {
    if (!wired) ucx::let_wireup_end(*worker, *ep, ucx::kAbandonedWireup);
    for (int i = 0; i < 50 && worker->progress(); ++i) {  // let a refusal reach the server
    }
    throw;
  }
}

RemoteLink::~RemoteLink() {
  if (ucx::inherited(generation)) {
    // A forked child's copy: the UCX state is the parent's (ucx.h).
    (void)worker.release();
    (void)ep.release();
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  for (auto& o : orphans) o->recv.cancel(worker->handle());
  heartbeats_.drop();
  try {
    if (ep->error() == UCS_OK && failure.empty()) {
      std::vector<std::byte> bye = wire::control_frame({{"bye", true}});
      ucx::Request req = ep->send(remote::tag(remote::Kind::Control), bye);
      const auto until = Clock::now() + std::chrono::milliseconds(200);
      while (!req.done() && Clock::now() < until) worker->progress();
    }
    ep->close(false, std::chrono::milliseconds(200));
    ep->discard_unexpected();
  } catch (const Error&) {
  }
  // Only now: a receive cancelled too late (its message was arriving) writes into an
  // orphan's buffer until the endpoint is closed.
  ep.reset();
  orphans.clear();
}

void RemoteLink::fail(const std::string& why, bool protocol) {
  if (failure.empty()) {
    failure = why;
    failure_protocol = protocol;
  }
  waiting_.wake_all(*worker);
}

void RemoteLink::check() const {
  if (failure.empty()) return;
  if (failure_protocol) throw ProtocolError(failure);
  throw ClosedError(failure);
}

std::string RemoteLink::inherited_error() const {
  return "this remote inference client (to " + address +
         ") was connected before a fork: its UCX state belongs to the parent";
}

namespace {
// The kinds of message a server sends once the specs are in (wire/remote_frames.h).
bool server_sends(uint64_t tag) {
  switch (static_cast<remote::Kind>(tag & remote::kKindMask)) {
    case remote::Kind::Response:
    case remote::Kind::Failure:
      return true;
    case remote::Kind::Control:
    case remote::Kind::Heartbeat:
      return remote::seq_of(tag) == 0;
    default:
      return false;
  }
}
}  // namespace

void RemoteLink::step() {
  if (inherited()) throw ClosedError(inherited_error());
  check();
  try {
    while (waiting_.progress(*worker)) {
    }
    reap_orphans();
    if (auto c = ucx::take_control(*worker, *ep, remote::tag(remote::Kind::Control),
                                   ucx::kMaxControlFrame, wire::Limits{}, "control message",
                                   frame_deadline())) {
      if (c->is_object() && c->contains("error"))
        fail("the remote inference server at " + address + " closed the connection: " +
                 ((*c)["error"].is_string() ? (*c)["error"].get<std::string>() : c->dump()),
             true);
      else
        fail("the remote inference server at " + address + " closed the connection" +
                 (c->is_object() && c->contains("closed") && (*c)["closed"].is_string()
                      ? ": " + (*c)["closed"].get<std::string>()
                      : std::string()),
             false);
    }
    ucx::refuse_foreign_tags(*worker, server_sends, "remote inference connection");
    if (ep->error() != UCS_OK)
      fail("connection to the remote inference server at " + address +
               " lost: " + ucs_status_string(ep->error()),
           false);
  } catch (const ProtocolError& e) {
    fail(e.what(), true);
  } catch (const ClosedError& e) {  // a server that stopped in the middle of a message
    fail(e.what(), false);
  }
  check();
}

void RemoteLink::reap_orphans() {
  for (size_t i = 0; i < orphans.size();) {
    Orphan& o = *orphans[i];
    bool done = false;
    try {
      done = o.recv.done() && o.send.done();
      if (!done) {
        if (auto f = ucx::take_control(*worker, *ep, remote::tag(remote::Kind::Failure, o.seq),
                                       ucx::kMaxControlFrame, wire::Limits{}, "failure",
                                       frame_deadline())) {
          o.recv.cancel(worker->handle());
          done = true;
        }
      }
    } catch (const Error&) {
      done = true;
    }
    if (done && o.send.done()) {
      --in_flight;
      orphans[i] = std::move(orphans.back());
      orphans.pop_back();
    } else {
      ++i;
    }
  }
}

void RemoteLink::wait(Deadline slice, uint64_t seen) {
  waiting_.wait(*worker, mu, slice, seen, [&] {
    // The worker's fd fires for every transfer in flight too, so no short poll is needed.
    return failure.empty();
  });
}

void RemoteLink::beat() noexcept {
  if (ucx::inherited(generation)) return;
  std::lock_guard<std::mutex> lock(mu);
  if (!failure.empty()) return;
  try {
    if (worker->progress()) worker->signal();
    if (auto why = heartbeats_.beat(*worker, *ep, remote::tag(remote::Kind::Heartbeat),
                                    wire::Limits{}, "the remote inference server at " + address))
      fail(*why, false);
  } catch (const ProtocolError& e) {
    fail(e.what(), true);
  } catch (const Error& e) {
    // The heartbeat's own send failed (a server killed while this client was idle): the
    // raw engine error ("send: Endpoint timeout") named neither the server nor the fix.
    fail("connection to the remote inference server at " + address + " lost: " + e.what() +
             " (make a new client once a server listens there again)",
         false);
  }
}

// ---- requests ------------------------------------------------------------------

namespace {

class RemotePending final : public Pending {
 public:
  RemotePending(std::shared_ptr<RemoteLink> link, std::unique_ptr<RemoteLink::Orphan> r)
      : link_(std::move(link)), r_(std::move(r)) {}

  // A request of the parent, in a forked child: never touches the link's mutex, which a
  // thread of the parent may have held at the fork (the child hung on it for ever).
  ~RemotePending() override {
    if (done_ || !r_) return;
    if (link_->inherited()) {
      (void)r_.release();  // its UCX requests are the parent's
      return;
    }
    std::lock_guard<std::mutex> lock(link_->mu);
    orphan();
  }

  bool ready() override {
    if (inherited()) return true;
    std::lock_guard<std::mutex> lock(link_->mu);
    return poll();
  }

  bool wait(Deadline slice) override {
    if (inherited()) return true;
    while (true) {
      uint64_t seen;
      {
        std::lock_guard<std::mutex> lock(link_->mu);
        seen = link_->worker->events();
        if (poll()) return true;
      }
      if (slice.passed()) return false;
      link_->wait(slice, seen);
    }
  }

  TensorDict take() override {
    if (!closed_.empty()) throw ClosedError(closed_);
    if (failure_) {
      if (failure_->closed) throw ClosedError(failure_->message);
      throw RemoteError(failure_->type, failure_->message);
    }
    size_t expected = 0;
    for (const LeafSlot& l : link_->response.leaves()) expected += l.row_bytes;
    if (r_->length != expected)
      throw ProtocolError("remote inference response of " + std::to_string(r_->length) +
                          " bytes, the response spec takes " + std::to_string(expected));
    return link_->response.row(r_->buffer, 0);
  }

 private:
  // Done (take() then raises why) when the link is a forked child's copy.
  bool inherited() {
    if (!link_->inherited()) return false;
    if (!done_) closed_ = link_->inherited_error();
    done_ = true;
    return true;
  }
  // Under link mu.
  bool poll() {
    if (done_) return true;
    try {
      link_->step();
      if (r_->recv.done() && r_->send.done()) return finish();
      if (auto f = ucx::take_control(
              *link_->worker, *link_->ep, remote::tag(remote::Kind::Failure, r_->seq),
              ucx::kMaxControlFrame, wire::Limits{}, "failure", link_->frame_deadline())) {
        failure_ = remote::parse_failure(*f);
        r_->recv.cancel(link_->worker->handle());
        return finish();
      }
    } catch (const ProtocolError& e) {
      link_->fail(e.what(), true);
      closed_ = e.what();
      orphan();
    } catch (const Error& e) {
      closed_ = e.what();
      orphan();
    }
    return done_;
  }
  // Under link mu: the request is dropped, or its link failed, before its answer came. Its
  // receive may still be posted (or be receiving), writing into its buffer: the link keeps
  // the buffers, as an orphan, until the answer comes or, on a failed link, until its
  // endpoint is closed (the receive cancelled first).
  void orphan() {
    if (!link_->failure.empty()) r_->recv.cancel(link_->worker->handle());
    link_->orphans.push_back(std::move(r_));
    done_ = true;
  }
  bool finish() {
    done_ = true;
    --link_->in_flight;
    return true;
  }

  std::shared_ptr<RemoteLink> link_;
  std::unique_ptr<RemoteLink::Orphan> r_;
  bool done_ = false;
  std::string closed_;
  std::optional<remote::Failure> failure_;
};

}  // namespace

RemoteClient::RemoteClient(std::string host, uint16_t port, RemoteClientOptions options)
    : host_(std::move(host)), port_(port), options_(std::move(options)) {
  checked_duration(options_.liveness_timeout, "liveness_timeout");
}

std::string RemoteClient::address() const {
  return host_ + ":" + std::to_string(port_);
}

void RemoteClient::throw_closed() const {
  throw ClosedError("this remote inference client (to " + address() + ") is closed");
}

std::shared_ptr<RemoteLink> RemoteClient::link(Deadline limit) {
  auto current = [&]() -> std::shared_ptr<RemoteLink> {
    if (closed_) throw_closed();
    if (link_ && link_->inherited()) {
      // Made by the parent of this forked child: not ours to use nor to tear down.
      (void)new std::shared_ptr<RemoteLink>(std::move(link_));
    }
    return link_;
  };
  auto make = [&] {  // a handshake, up to connect_timeout
    return std::make_shared<RemoteLink>(host_, port_, options_,
                                        limit.min(Deadline::after(options_.connect_timeout)));
  };
  return connect_once(mu_, current, make, [&](std::shared_ptr<RemoteLink> l) {
    if (l->heartbeat_period.count() > 0) runtime::keep_alive(l, l->heartbeat_period);
    link_ = std::move(l);
    return link_;
  });
}

std::optional<std::vector<RequestLeaf>> RemoteClient::request_leaves(Deadline connect_by) {
  return link(connect_by)->request.request_leaves();
}

void RemoteClient::close() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  link_.reset();
}

std::unique_ptr<Pending> RemoteClient::submit(const TensorDict& td, Deadline deadline) {
  std::shared_ptr<RemoteLink> l = link(deadline);
  std::vector<const Tensor*> leaves;
  validate_request(td, l->request, leaves, "RemoteTransport");
  auto r = std::make_unique<RemoteLink::Orphan>();
  // The request goes out of a one-row bank of its own, as its answer comes into one.
  r->sent = Storage::allocate(l->request.bank_bytes(), 64);
  write_row(l->request, r->sent.data(), 0, leaves);
  std::vector<std::span<const std::byte>> out;
  for (const LeafSlot& leaf : l->request.leaves())
    out.emplace_back(r->sent.data() + leaf.offset, leaf.row_bytes);
  r->buffer = Storage::allocate(l->response.bank_bytes(), 64);
  std::vector<std::span<std::byte>> in;
  for (const LeafSlot& leaf : l->response.leaves())
    in.emplace_back(r->buffer.data() + leaf.offset, leaf.row_bytes);
  // Room: at most num_slots requests of this client in flight (the server's bank).
  const bool room = runtime::wait_until(deadline, [&](Deadline slice) {
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(l->mu);
      l->step();
      if (l->in_flight < l->num_slots) {
        r->seq = l->next_seq++;
        r->recv = l->ep->recv(remote::tag(remote::Kind::Response, r->seq), in, r->iov, &r->length);
        ++l->in_flight;
        try {
          r->send = l->ep->send(remote::tag(remote::Kind::Request, r->seq), out, r->send_iov);
        } catch (...) {
          // The receive is posted into r's buffer: r lives on as an orphan until UCX
          // has let go of it (freeing it here would leave UCX a dangling buffer).
          r->recv.cancel(l->worker->handle());
          l->orphans.push_back(std::move(r));
          throw;
        }
        return true;
      }
      seen = l->worker->events();
    }
    if (closed_.load(std::memory_order_acquire))  // by another thread, while we wait
      throw_closed();
    l->wait(slice, seen);
    return false;
  });
  if (!room)
    throw TimeoutError("RemoteTransport: all " + std::to_string(l->num_slots) +
                       " slots of this client were in flight until the timeout");
  return std::make_unique<RemotePending>(std::move(l), std::move(r));
}

}  // namespace tensorwire::inference::detail
