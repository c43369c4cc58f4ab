// RemoteTransport: the public face of the remote server (remote_server.cpp) and clients
// (remote_client.cpp); the serving thread's side of the slot protocol.
#include "tensorwire/inference/remote_transport.h"

#include <algorithm>

#include "bank_batch.h"
#include "remote_client.h"
#include "remote_server.h"
#include "wire/remote_frames.h"

namespace tensorwire::inference {

using namespace detail;

std::shared_ptr<RemoteTransport> RemoteTransport::create(const TensorDict& request_spec,
                                                         const TensorDict& response_spec,
                                                         RemoteOptions options) {
  std::shared_ptr<RemoteTransport> t(new RemoteTransport());
  t->s_ = std::make_shared<RemoteServer>(request_spec, response_spec, std::move(options));
  return t;
}

Client RemoteTransport::connect(const std::string& host, uint16_t port,
                                RemoteClientOptions options) {
  auto c = std::make_shared<RemoteClient>(host, port, std::move(options));
  c->link();
  return Client(std::move(c));
}

Client RemoteTransport::client_for(const std::string& address, RemoteClientOptions options) {
  auto [host, port] = parse_address(address);
  return Client(std::make_shared<RemoteClient>(host, port, std::move(options)));
}

RemoteTransport::~RemoteTransport() {
  if (!s_) return;        // create() failed
  if (s_->inherited()) {  // the parent's listener and connections, not ours
    os::leak(std::move(s_));
    return;
  }
  s_->stop("the remote transport was closed");
}

uint16_t RemoteTransport::port() const noexcept {
  return s_->port;
}
const std::string& RemoteTransport::host() const noexcept {
  return s_->options.host;
}
uint32_t RemoteTransport::num_slots() const noexcept {
  return static_cast<uint32_t>(s_->options.num_slots);
}
const TensorDict& RemoteTransport::request_spec() const noexcept {
  return s_->request.spec();
}
const TensorDict& RemoteTransport::response_spec() const noexcept {
  return s_->response.spec();
}
std::vector<Key> RemoteTransport::request_keys() const {
  return s_->request.keys();
}
std::vector<Key> RemoteTransport::response_keys() const {
  return s_->response.keys();
}
// In a forked child the counters are the parent's, under a lock that a thread of the
// parent may have held at the fork (and would hold for ever here): the child reads none.
size_t RemoteTransport::connected() const {
  if (s_->inherited()) return 0;
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->connected;
}
uint32_t RemoteTransport::slots_in_use() const {
  if (s_->inherited()) return 0;
  std::lock_guard<std::mutex> lock(s_->mu);
  return static_cast<uint32_t>(s_->slots.size() - s_->free_slots.size());
}
uint64_t RemoteTransport::refused() const noexcept {
  if (s_->inherited()) return 0;
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->refused;
}
std::string RemoteTransport::last_refusal() const {
  if (s_->inherited()) return "";
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->last_refusal;
}

Client RemoteTransport::client() {
  check_open();
  RemoteClientOptions o;
  o.auth_key = s_->options.auth_key;
  o.liveness_timeout = s_->options.liveness_timeout;
  const std::string host = s_->options.host == "0.0.0.0" ? "127.0.0.1" : s_->options.host;
  return Client(std::make_shared<RemoteClient>(host, s_->port, std::move(o)));
}

void RemoteTransport::open_server() {
  check_open();
  if (s_->inherited())
    throw ClosedError(
        "this RemoteTransport was made before a fork: only the process that created it can "
        "serve it (its clients work in any process)");
  std::lock_guard<std::mutex> lock(s_->mu);
  if (s_->serving) throw Error("another InferenceServer already serves this transport");
  s_->serving = true;
  s_->stopped_before_open = s_->stopped;
  s_->stopped = false;
}

void RemoteTransport::release_server() noexcept {
  if (s_->inherited()) return;
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->serving = false;
  s_->stopped = s_->stopped_before_open;
}

void RemoteTransport::close_server(const std::string& reason, bool fail_pending) {
  if (s_->inherited()) return;  // in a forked child: the parent's, left alone
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stopped = true;
    s_->stop_reason = reason;
    ++s_->wakeups;
    s_->work.notify_all();
    if (fail_pending) {
      // The serving thread's last call (a shutdown that timed out returns before it): only
      // now may another server claim the transport.
      s_->serving = false;
      while (!s_->ready.empty()) {
        const uint32_t i = s_->ready.front();
        s_->ready.pop_front();
        s_->answer(i, wire::remote::failure_json({"RuntimeError", reason, true}));
      }
    }
  }
  // A closed transport stops listening and ends its connections now, not when the last
  // reference goes: its port is free again and its clients are told at once.
  if (closed()) s_->stop(reason);
}

void RemoteTransport::wait_for_work(Deadline deadline) {
  std::unique_lock<std::mutex> lock(s_->mu);
  const uint64_t seen = s_->wakeups;
  auto ready = [&] { return !s_->ready.empty() || s_->wakeups != seen; };
  if (ready()) return;
  // Spin first (RemoteServer::work_spin): a sleeping serving thread woke 8-16 us after a
  // request was ready, about a sixth of a remote round trip across two simulated hosts.
  // Not when the deadline comes sooner than a spin could end (a batch's short wait).
  auto sleep = [&] { s_->work.wait_until(lock, deadline.when(), ready); };
  if (deadline.left() <= kLongestSpin) return sleep();
  lock.unlock();
  // A look never blocks on the mutex: a connection's thread holds it for a moment, and a
  // look that blocked slept in the kernel and paid a wake-up (remote_server.cpp, serve()).
  auto look = [&] {
    std::unique_lock<std::mutex> l(s_->mu, std::try_to_lock);
    return l && ready();
  };
  s_->work_spin.poll_or_sleep(look, [&] {
    lock.lock();
    sleep();
  });
}

void RemoteTransport::interrupt() {
  std::lock_guard<std::mutex> lock(s_->mu);
  ++s_->wakeups;
  s_->work.notify_all();
}

bool RemoteTransport::has_work() {
  std::lock_guard<std::mutex> lock(s_->mu);
  return !s_->ready.empty();
}

bool RemoteTransport::notify_work(std::function<void()> on_work) {
  s_->notifier.set(std::move(on_work));
  return true;
}

void RemoteTransport::drain(size_t max_items, Drained& out) {
  const uint64_t taken_in = s_->take_arrivals();
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->taken_in += taken_in;
  for (size_t n = 0; n < max_items && !s_->ready.empty(); ++n) {
    const uint32_t i = s_->ready.front();
    s_->ready.pop_front();
    s_->slots[i].state = RemoteSlot::Taken;
    out.ids.push_back(i);
    out.submitted_ns.push_back(s_->slots[i].submitted_ns);
  }
}

void RemoteTransport::collate(const Drained& drained, std::vector<Group>& groups) {
  collate_slots(s_->request, s_->request_bank, s_->batch, drained, groups);
}

void RemoteTransport::resolve(const Drained& drained, const Group& group, const TensorDict& output,
                              const VersionStamp& stamp) {
  write_response_rows(s_->response, s_->response_bank.data(), drained, group, output, stamp);
  std::lock_guard<std::mutex> lock(s_->mu);
  const auto sender = drained.size() <= kAnswersSentByTheServer ? RemoteServer::Sender::Caller
                                                                : RemoteServer::Sender::Connection;
  for (size_t row : group.rows)
    s_->answer(static_cast<uint32_t>(drained.ids[row]), std::nullopt, sender);
}

void RemoteTransport::reject(const Drained& drained, std::span<const size_t> rows,
                             const RemoteError& error) {
  std::lock_guard<std::mutex> lock(s_->mu);
  for (size_t row : rows)
    s_->answer(static_cast<uint32_t>(drained.ids[row]),
               wire::remote::failure_json({error.type_name(), error.message(), false}));
}

namespace detail {

namespace {
RemoteServer& taken_slot(const RemoteTransport& t, uint32_t slot,
                         const std::shared_ptr<RemoteServer>& s) {
  if (slot >= s->slots.size()) throw ValueError("slot " + std::to_string(slot) + " out of range");
  (void)t;
  return *s;
}
}  // namespace

TensorDict RemoteAccess::request_row(const RemoteTransport& t, uint32_t slot) {
  RemoteServer& s = taken_slot(t, slot, t.s_);
  return s.request.row(s.request_bank, slot);
}

// Only a slot the policy still works on is answered: torchrl's server fails every request
// of a batch when answering one of them raised, and those answered before must keep their
// answer (a second write would overwrite a response being sent, a second free would give
// the slot to two clients).
void RemoteAccess::resolve_one(RemoteTransport& t, uint32_t slot, const TensorDict& response) {
  RemoteServer& s = taken_slot(t, slot, t.s_);
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.slots[slot].state != RemoteSlot::Taken) return;
  write_response_row(s.response, s.response_bank.data(), slot, response);
  s.answer(slot, std::nullopt);
}

void RemoteAccess::reject_one(RemoteTransport& t, uint32_t slot, const RemoteError& error) {
  RemoteServer& s = taken_slot(t, slot, t.s_);
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.slots[slot].state != RemoteSlot::Taken) return;
  s.answer(slot, wire::remote::failure_json({error.type_name(), error.message(), false}));
}

uint64_t RemoteAccess::taken_in(const RemoteTransport& t) {
  std::lock_guard<std::mutex> lock(t.s_->mu);
  return t.s_->taken_in;
}

}  // namespace detail

}  // namespace tensorwire::inference
