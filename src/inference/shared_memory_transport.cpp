// SharedMemoryTransport: creation, attachment, and the server side of the slot protocol.
// The client side is in shm_client.cpp, the watcher of attached clients in shm_owner.cpp.
#include "tensorwire/inference/shared_memory_transport.h"

#include <algorithm>
#include <cstring>

#include "attach.h"
#include "bank_batch.h"
#include "os/fork.h"
#include "shm_client.h"
#include "shm_owner.h"
#include "shm_rows.h"

namespace tensorwire::inference {

using namespace detail;

std::shared_ptr<SharedMemoryTransport> SharedMemoryTransport::create(
    const TensorDict& request_spec, const TensorDict& response_spec, SharedMemoryOptions options) {
  if (options.num_slots < 1)
    throw ValueError("num_slots must be at least 1, got " + std::to_string(options.num_slots));
  if (options.num_slots > kMaxSlots)
    throw ValueError("num_slots must be at most " + std::to_string(kMaxSlots) + ", got " +
                     std::to_string(options.num_slots));
  os::PeerPolicy admitted(options.allowed_uids);
  std::shared_ptr<SharedMemoryTransport> t(new SharedMemoryTransport());
  t->name_ = options.name.empty() ? os::unique_name("infer") : options.name;
  t->region_ =
      ShmRegion::create(request_spec, response_spec, static_cast<uint32_t>(options.num_slots),
                        options.copy_result, options.spin);
  t->owner_ = std::make_unique<ShmOwner>(t->region_, t->name_, std::move(admitted));
  return t;
}

std::shared_ptr<SharedMemoryTransport> SharedMemoryTransport::attach(const std::string& name,
                                                                     Timeout timeout) {
  std::shared_ptr<ShmConnection> c = attach_by_name(name, Deadline::after(timeout));
  std::shared_ptr<SharedMemoryTransport> t(new SharedMemoryTransport());
  t->name_ = name;
  t->region_ = c->region;
  t->attachment_ = c;  // stays open (and watched by the owner) while the transport lives
  return t;
}

Client SharedMemoryTransport::client_for(const std::string& name) {
  return Client(std::make_shared<ShmClient>(name, nullptr));
}

SharedMemoryTransport::~SharedMemoryTransport() {
  if (owner_ && owner_->here()) {
    // Clients still holding the region must not wait for a server that cannot come.
    close_server("the shared-memory transport was closed", true);
  }
}

const std::string& SharedMemoryTransport::name() const noexcept {
  return name_;
}
uint32_t SharedMemoryTransport::num_slots() const noexcept {
  return region_->num_slots;
}
bool SharedMemoryTransport::copy_result() const noexcept {
  return region_->copy_result;
}
const TensorDict& SharedMemoryTransport::request_spec() const noexcept {
  return region_->request.spec();
}
const TensorDict& SharedMemoryTransport::response_spec() const noexcept {
  return region_->response.spec();
}
std::vector<Key> SharedMemoryTransport::request_keys() const {
  return region_->request.keys();
}
std::vector<Key> SharedMemoryTransport::response_keys() const {
  return region_->response.keys();
}
bool SharedMemoryTransport::is_owner() const noexcept {
  return owner_ && owner_->here();
}
uint64_t SharedMemoryTransport::refused() const noexcept {
  return owner_ ? owner_->refused() : 0;
}
std::string SharedMemoryTransport::last_refusal() const {
  return is_owner() ? owner_->last_refusal() : std::string();  // a forked child's: the parent's
}
uint32_t SharedMemoryTransport::slots_in_use() const noexcept {
  return region_->slots_in_use();
}

SharedMemoryTransport::Sizes SharedMemoryTransport::sizes() const noexcept {
  return {region_->control_segment.size(), region_->request_segment.size(),
          region_->response_segment.size()};
}

Client SharedMemoryTransport::client() {
  check_open();
  return Client(std::make_shared<ShmClient>(name_, is_owner() ? region_ : nullptr));
}

void SharedMemoryTransport::open_server() {
  if (!is_owner())
    throw ClosedError(std::string("this SharedMemoryTransport was ") +
                      (owner_ ? "made before a fork" : "attached by name") +
                      ": only the process that created it (pid " +
                      std::to_string(region_->header->owner_pid) + ") can serve it");
  if (owner_->claimed.exchange(true))
    throw Error("another InferenceServer already serves this transport");
  try {
    if (!owner_->batch.staging.defined())
      owner_->batch.staging = Storage::allocate(region_->request.bank_bytes(), 64);
  } catch (...) {
    owner_->claimed.store(false);
    throw;
  }
  owner_->state_before_open =
      region_->header->server_state.exchange(kServing, std::memory_order_seq_cst);
}

void SharedMemoryTransport::release_server() noexcept {
  if (!is_owner()) return;
  region_->header->server_state.store(owner_->state_before_open, std::memory_order_seq_cst);
  region_->header->freed.notify_all();  // clients waiting for a slot re-check the state
  owner_->claimed.store(false);
}

void SharedMemoryTransport::close_server(const std::string& reason, bool fail_pending) {
  if (!is_owner()) return;  // attached (or a forked copy): the owner's server is not ours
  ShmRegion& r = *region_;
  r.header->server_state.store(kStopped, std::memory_order_seq_cst);
  r.header->freed.notify_all();  // clients waiting for a slot re-check the state
  if (!fail_pending) return;
  owner_->claimed.store(false);  // the serving thread's last call: another may start
  // Requests made ready after this sweep are taken back by their clients, who see the
  // state (seq_cst on both sides: either we see their bit or they see kStopped).
  std::vector<uint32_t> taken(r.num_slots);
  uint32_t cursor = 0;
  while (size_t n = r.ready.take(r.num_slots, taken.data(), cursor)) {
    for (size_t k = 0; k < n; ++k) {
      const uint32_t i = taken[k];
      SlotControl& sc = r.slot(i);
      uint64_t w = sc.state.load(std::memory_order_acquire);
      while (state_of(w) == kReady) {
        if (sc.state.compare_exchange_weak(w, pack_state(kTaken, owner_of(w)),
                                           std::memory_order_acq_rel)) {
          r.write_error(i, kClosedError, "RuntimeError", reason);
          uint64_t taken_word = pack_state(kTaken, owner_of(w));
          if (!sc.state.compare_exchange_strong(taken_word, pack_state(kFailed, owner_of(w)),
                                                std::memory_order_acq_rel))
            r.free_slot(i, taken_word);  // abandoned meanwhile
          r.notify_answered(i);
          break;
        }
      }
    }
  }
}

void SharedMemoryTransport::wait_for_work(Deadline deadline) {
  ShmRegion& r = *region_;
  if (!r.ready.empty()) return;
  const uint32_t seen = r.header->doorbell.seq.load(std::memory_order_acquire);
  if (!r.ready.empty()) return;
  owner_->doorbell_wait.wait(r.header->doorbell, seen, deadline.when(), [] { return true; });
}

void SharedMemoryTransport::interrupt() {
  region_->header->doorbell.notify_all();
}

bool SharedMemoryTransport::has_work() {
  return !region_->ready.empty();
}

bool SharedMemoryTransport::notify_work(std::function<void()>) {
  return false;  // its clients, other processes, make requests ready: a server sleeps on it
}

void SharedMemoryTransport::drain(size_t max_items, Drained& out) {
  if (!is_owner())
    throw Error("only the process that created a SharedMemoryTransport can drain it");
  ShmRegion& r = *region_;
  ShmOwner& o = *owner_;
  const size_t n = r.ready.take(std::min<size_t>(max_items, r.num_slots), o.taken.data(), o.cursor);
  for (size_t k = 0; k < n; ++k) {
    const uint32_t i = o.taken[k];
    SlotControl& sc = r.slot(i);
    uint64_t w = sc.state.load(std::memory_order_acquire);
    // A bit whose slot is no longer Ready (taken back by its client, reclaimed) is stale.
    while (state_of(w) == kReady) {
      if (sc.state.compare_exchange_weak(w, pack_state(kTaken, owner_of(w)),
                                         std::memory_order_acq_rel)) {
        out.ids.push_back(i);
        out.submitted_ns.push_back(sc.submitted_ns);
        break;
      }
    }
  }
}

void SharedMemoryTransport::collate(const Drained& d, std::vector<Group>& groups) {
  collate_slots(region_->request, region_->request_bank, owner_->batch, d, groups);
}

void SharedMemoryTransport::resolve(const Drained& d, const Group& g, const TensorDict& output,
                                    const VersionStamp& stamp) {
  ShmRegion& r = *region_;
  write_response_rows(r.response, r.response_data(), d, g, output, stamp);
  const int64_t n = static_cast<int64_t>(g.rows.size());
  ShmRegion::AnsweredBatch wake(r);
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t i = static_cast<uint32_t>(d.ids[g.rows[j]]);
    SlotControl& sc = r.slot(i);
    uint64_t w = sc.state.load(std::memory_order_relaxed);
    if (state_of(w) == kTaken && sc.state.compare_exchange_strong(w, pack_state(kDone, owner_of(w)),
                                                                  std::memory_order_acq_rel)) {
      wake.add(i);
    } else if (state_of(w) == kAbandoned) {
      r.free_slot(i, w);
    }
  }
}

TensorDict ShmAccess::request_row(const SharedMemoryTransport& t, uint32_t slot) {
  const ShmRegion& r = *t.region_;
  if (slot >= r.num_slots) throw ValueError("slot " + std::to_string(slot) + " out of range");
  return r.request.row(r.request_bank, slot);
}

void ShmAccess::resolve_one(SharedMemoryTransport& t, uint32_t slot, const TensorDict& response) {
  ShmRegion& r = *t.region_;
  if (slot >= r.num_slots) throw ValueError("slot " + std::to_string(slot) + " out of range");
  SlotControl& sc = r.slot(slot);
  uint64_t w = sc.state.load(std::memory_order_acquire);
  // Only the server leaves Taken, so the row is the server's to write; a slot answered
  // already is left alone (see RemoteAccess::resolve_one): its owner may be reading it.
  if (state_of(w) == kTaken) {
    write_response_row(r.response, r.response_data(), slot, response);
    if (sc.state.compare_exchange_strong(w, pack_state(kDone, owner_of(w)),
                                         std::memory_order_acq_rel))
      return r.notify_answered(slot);
  }
  if (state_of(w) == kAbandoned) r.free_slot(slot, w);  // its owner gave up meanwhile
}

void ShmAccess::reject_one(SharedMemoryTransport& t, uint32_t slot, const RemoteError& error) {
  if (slot >= t.region_->num_slots)
    throw ValueError("slot " + std::to_string(slot) + " out of range");
  Drained d;
  d.ids.push_back(slot);
  const size_t row = 0;
  t.reject(d, std::span<const size_t>(&row, 1), error);
}

void SharedMemoryTransport::reject(const Drained& d, std::span<const size_t> rows,
                                   const RemoteError& error) {
  ShmRegion& r = *region_;
  ShmRegion::AnsweredBatch wake(r);
  for (size_t row : rows) {
    const uint32_t i = static_cast<uint32_t>(d.ids[row]);
    SlotControl& sc = r.slot(i);
    uint64_t w = sc.state.load(std::memory_order_acquire);
    // As in resolve_one: an answered slot is not written again.
    if (state_of(w) == kTaken) r.write_error(i, kPolicyError, error.type_name(), error.message());
    if (state_of(w) == kTaken &&
        sc.state.compare_exchange_strong(w, pack_state(kFailed, owner_of(w)),
                                         std::memory_order_acq_rel)) {
      wake.add(i);
    } else if (state_of(w) == kAbandoned) {
      r.free_slot(i, w);
    }
  }
}

}  // namespace tensorwire::inference
