#include "shm_client.h"

#include "attach.h"
#include "bank_batch.h"
#include "os/fork.h"
#include "os/peer.h"
#include "runtime/wait.h"
#include "shm_handshake.h"

namespace tensorwire::inference::detail {

namespace {

constexpr const char* kClientClosed = "the inference client was closed";
// What a client sees in shared memory (kStopped) does not say which of the two it was.
constexpr const char* kServerStopped =
    "the inference server was shut down, or its shared-memory transport closed";

class ShmPending final : public Pending {
 public:
  ShmPending(std::shared_ptr<ShmConnection> conn, uint32_t slot)
      : conn_(std::move(conn)), slot_(slot) {}
  ~ShmPending() override { release(); }

  bool ready() override {
    if (!closed_.empty() || released_) return true;
    uint32_t s = state_of(conn_->region->slot(slot_).state.load(std::memory_order_acquire));
    return s == kDone || s == kFailed;
  }

  bool wait(Deadline slice) override {
    if (!closed_.empty() || released_) return true;
    if (conn_->stale()) throw made_before_fork("its slot belongs to the parent process");
    ShmRegion& r = *conn_->region;
    SlotControl& sc = r.slot(slot_);
    const os::WaitBits::Bit answer = r.answer_of(slot_);
    for (bool first = true;; first = false) {
      const uint32_t seen = answer.word.seq.load(std::memory_order_acquire);
      const uint64_t w = sc.state.load(std::memory_order_acquire);
      const uint32_t s = state_of(w);
      if (s == kDone || s == kFailed) return true;
      // Submitted after the server's final sweep: take the request back.
      if (s == kReady && r.header->server_state.load(std::memory_order_seq_cst) == kStopped) {
        uint64_t expected = w;
        if (sc.state.compare_exchange_strong(expected, pack_state(kFree, 0),
                                             std::memory_order_acq_rel)) {
          r.header->freed.notify_one();
          released_ = true;
          closed_ = kServerStopped;
          return true;
        }
        continue;
      }
      // The owner's pidfd only after a wait that brought no answer: a system call before
      // every sleep was a large share of a request's cost with hundreds of actors.
      if (!first && !conn_->owner_alive()) {
        closed_ = conn_->gone_message();
        return true;
      }
      if (!first && slice.passed()) return false;
      conn_->reply_wait.wait(answer, seen, slice.when(), [&] {
        if (!conn_->owner_alive()) return false;
        return !(state_of(sc.state.load(std::memory_order_acquire)) == kReady &&
                 r.header->server_state.load(std::memory_order_acquire) == kStopped);
      });
    }
  }

  TensorDict take() override {
    if (!closed_.empty()) throw ClosedError(closed_);
    ShmRegion& r = *conn_->region;
    const uint64_t w = r.slot(slot_).state.load(std::memory_order_acquire);
    if (state_of(w) == kFailed) {
      try {
        r.throw_error(slot_);
      } catch (...) {
        release();
        throw;
      }
    }
    if (state_of(w) != kDone) throw Error("take() before the request completed");
    TensorDict out = r.copy_result ? r.response.copy_row(r.response_data(), slot_)
                                   : r.response.row(r.response_bank, slot_);
    // A view of the slot is locked, as torchrl's slot views are: its keys are the bank's,
    // not the caller's to change.
    if (!r.copy_result) out.lock_();
    release();
    return out;
  }

 private:
  // Gives the slot back: free when nobody else holds it, Abandoned while the server does
  // (it frees it once the batch is answered). A no-op in a forked copy: the slot is the
  // parent's.
  void release() noexcept {
    if (released_ || conn_->stale()) return;
    released_ = true;
    ShmRegion& r = *conn_->region;
    SlotControl& sc = r.slot(slot_);
    uint64_t w = sc.state.load(std::memory_order_acquire);
    while (owner_of(w) == conn_->id) {
      const uint32_t s = state_of(w);
      if (s == kFree || s == kAbandoned) return;
      const uint64_t next = s == kTaken ? pack_state(kAbandoned, conn_->id) : pack_state(kFree, 0);
      if (sc.state.compare_exchange_weak(w, next, std::memory_order_acq_rel)) {
        if (s != kTaken) r.header->freed.notify_one();
        return;
      }
    }
  }

  std::shared_ptr<ShmConnection> conn_;
  uint32_t slot_;
  bool released_ = false;
  std::string closed_;  // non-empty: the server is gone, take() throws ClosedError
};

}  // namespace

bool ShmConnection::stale() const noexcept {
  return fork_generation != os::fork_generation();
}

std::string ShmConnection::gone_message() const {
  return "the inference server process (pid " + std::to_string(owner_pid) + ") exited";
}

std::shared_ptr<ShmConnection> attach_by_name(const std::string& name, Deadline deadline) {
  auto c = std::make_shared<ShmConnection>();
  c->socket = os::UnixSocket::connect(name, deadline);
  const os::PeerCredentials owner = os::peer_credentials(c->socket.fd());
  os::check_server(owner, name);
  Welcome w = receive_welcome(c->socket, deadline);
  c->region = std::move(w.region);
  c->id = w.client_id;
  c->owner_pid = owner.pid;
  if (w.owner_pid != c->owner_pid)
    throw ProtocolError("shared-memory transport '" + name + "': owner pid " +
                        std::to_string(w.owner_pid) + " announced, peer is pid " +
                        std::to_string(c->owner_pid));
  try {
    c->owner.emplace(c->owner_pid);
  } catch (const SystemError&) {
    throw ClosedError("the inference server process (pid " + std::to_string(c->owner_pid) +
                      ") exited");
  }
  c->fork_generation = os::fork_generation();
  c->reply_wait = os::AdaptiveSpin(c->region->max_spin);
  c->slot_wait = os::AdaptiveSpin(c->region->max_spin);
  return c;
}

ShmClient::ShmClient(std::string name, std::shared_ptr<ShmRegion> local)
    : name_(std::move(name)), local_(std::move(local)), local_generation_(os::fork_generation()) {}

std::shared_ptr<ShmConnection> ShmClient::connection(Deadline limit) {
  auto current = [&]() -> std::shared_ptr<ShmConnection> {
    if (closed_) throw ClosedError(kClientClosed);
    return conn_ && !conn_->stale() ? conn_ : nullptr;
  };
  auto make = [&] {
    if (!local_ || local_generation_ != os::fork_generation())
      return attach_by_name(name_, Deadline::after(kConnectTimeout).min(limit));
    auto c = std::make_shared<ShmConnection>();
    c->region = local_;
    c->id = local_->header->next_client_id.fetch_add(1);
    c->owner_pid = local_->header->owner_pid;
    c->fork_generation = local_generation_;
    c->reply_wait = os::AdaptiveSpin(local_->max_spin);
    c->slot_wait = os::AdaptiveSpin(local_->max_spin);
    return c;
  };
  return connect_once(mu_, current, make, [&](std::shared_ptr<ShmConnection> c) {
    hint_.store(c->id % c->region->num_slots, std::memory_order_relaxed);
    conn_ = std::move(c);
    return conn_;
  });
}

std::optional<std::vector<RequestLeaf>> ShmClient::request_leaves(Deadline connect_by) {
  return connection(connect_by)->region->request.request_leaves();
}

void ShmClient::close() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  conn_.reset();  // pending requests keep the connection until they are read or dropped
}

uint32_t ShmClient::claim(ShmConnection& c, Deadline deadline) {
  ShmRegion& r = *c.region;
  const uint32_t n = r.num_slots;
  const uint32_t start = hint_.load(std::memory_order_relaxed) % n;
  auto alive = [&] {
    return c.owner_alive() && r.header->server_state.load(std::memory_order_acquire) != kStopped;
  };
  uint32_t slot = 0;
  // A freed slot wakes one sleeping claimer (notify_one: with hundreds of clients, waking
  // them all for one slot cost more than the requests). A claimer that leaves without a
  // slot may have been the one woken for a slot still free: it wakes the next.
  struct PassOn {
    ShmRegion& r;
    bool claimed = false;
    ~PassOn() {
      if (!claimed) r.header->freed.notify_one();
    }
  } pass_on{r};
  bool slept = false;
  const bool claimed = runtime::wait_until(deadline, [&](Deadline slice) {
    const uint32_t seen = r.header->freed.seq.load(std::memory_order_acquire);
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t i = start + k < n ? start + k : start + k - n;
      uint64_t w = r.slot(i).state.load(std::memory_order_relaxed);
      if (state_of(w) == kFree && r.slot(i).state.compare_exchange_strong(
                                      w, pack_state(kWriting, c.id), std::memory_order_acquire)) {
        hint_.store(i, std::memory_order_relaxed);
        slot = i;
        return true;
      }
    }
    if (closed_.load(std::memory_order_acquire))  // by another thread, while we wait
      throw ClosedError(kClientClosed);
    // The owner's pidfd (a system call) only once a wait for a slot went by: the slots
    // being taken shows the server at work.
    if (slept && !c.owner_alive()) throw ClosedError(c.gone_message());
    if (r.header->server_state.load(std::memory_order_acquire) == kStopped)
      throw ClosedError(kServerStopped);
    c.slot_wait.wait(r.header->freed, seen, slice.when(), alive);
    slept = true;
    return false;
  });
  pass_on.claimed = claimed;
  if (!claimed)
    throw TimeoutError("no free slot in time: all " + std::to_string(n) +
                       " slots of the shared-memory transport hold requests in flight");
  return slot;
}

std::unique_ptr<Pending> ShmClient::submit(const TensorDict& td, Deadline deadline) {
  std::shared_ptr<ShmConnection> c = connection(deadline);
  ShmRegion& r = *c->region;
  thread_local std::vector<const Tensor*> leaves;
  validate_request(td, r.request, leaves, "SharedMemoryTransport");
  if (r.header->server_state.load(std::memory_order_acquire) == kStopped)
    throw ClosedError(kServerStopped);
  const uint32_t slot = claim(*c, deadline);
  SlotControl& sc = r.slot(slot);
  write_row(r.request, r.request_data(), slot, leaves);
  sc.submitted_ns = now_ns();
  sc.state.store(pack_state(kReady, c->id), std::memory_order_seq_cst);
  r.ready.insert(slot);
  r.header->doorbell.notify_all();
  auto pending = std::make_unique<ShmPending>(c, slot);
  // The server may have made its final sweep between our check above and the insert:
  // then the pending request notices on its first wait and takes the slot back.
  return pending;
}

}  // namespace tensorwire::inference::detail
