#include "shm_region.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "tensorwire/runtime/remote_error.h"

namespace tensorwire::inference::detail {

namespace {

size_t align64(size_t n) {
  return (n + 63) / 64 * 64;
}

}  // namespace

int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ControlLayout ControlLayout::for_slots(uint32_t num_slots) {
  ControlLayout l;
  l.ready = align64(sizeof(ControlHeader));
  l.answered = align64(l.ready + shm::IndexSet::bytes_for(num_slots));
  l.slots = align64(l.answered + sizeof(os::WaitBits) * ((size_t{num_slots} + 31) / 32));
  l.errors = l.slots + sizeof(SlotControl) * num_slots;
  l.total = align64(l.errors + kErrorBytes * num_slots);
  return l;
}

void ShmRegion::attach_views() {
  ControlLayout cl = ControlLayout::for_slots(num_slots);
  std::byte* base = control_segment.data();
  header = reinterpret_cast<ControlHeader*>(base);
  ready = shm::IndexSet(base + cl.ready, num_slots);
  answered = reinterpret_cast<os::WaitBits*>(base + cl.answered);
  slots = reinterpret_cast<SlotControl*>(base + cl.slots);
  errors = reinterpret_cast<char*>(base + cl.errors);
  request_bank = request_segment.storage(0, request_segment.size());
  response_bank = response_segment.storage(0, response_segment.size());
}

std::shared_ptr<ShmRegion> ShmRegion::create(const TensorDict& request_spec,
                                             const TensorDict& response_spec, uint32_t num_slots,
                                             bool copy_result, uint32_t spin) {
  auto r = std::make_shared<ShmRegion>();
  r->request = SlotLayout::from_spec(request_spec, num_slots, "request_spec");
  r->response = SlotLayout::from_spec(response_spec, num_slots, "response_spec");
  r->num_slots = num_slots;
  r->copy_result = copy_result;
  r->max_spin = spin;
  ControlLayout cl = ControlLayout::for_slots(num_slots);
  r->control_segment = shm::Segment::create("inference-control", cl.total);
  r->request_segment = shm::Segment::create("inference-requests", r->request.bank_bytes());
  r->response_segment = shm::Segment::create("inference-responses", r->response.bank_bytes());
  r->attach_views();

  // The segments are fresh (zero-filled) and not shared yet: construct the atomics.
  ControlHeader* h = new (r->header) ControlHeader{};
  h->magic = kControlMagic;
  h->version = kProtocolVersion;
  h->num_slots = num_slots;
  h->spin = spin;
  h->copy_result = copy_result ? 1 : 0;
  h->owner_pid = static_cast<int32_t>(::getpid());
  h->error_bytes = static_cast<uint32_t>(kErrorBytes);
  h->request_bank_bytes = r->request.bank_bytes();
  h->response_bank_bytes = r->response.bank_bytes();
  h->server_state.store(kNoServer);
  h->next_client_id.store(1);
  r->ready.format();
  for (uint32_t i = 0; i < (num_slots + 31) / 32; ++i) new (&r->answered[i]) os::WaitBits{};
  for (uint32_t i = 0; i < num_slots; ++i) new (&r->slots[i]) SlotControl{};
  return r;
}

std::shared_ptr<ShmRegion> ShmRegion::map(const TensorDict& request_spec,
                                          const TensorDict& response_spec, uint32_t num_slots,
                                          int control_fd, int request_fd, int response_fd) {
  auto r = std::make_shared<ShmRegion>();
  r->request = SlotLayout::from_spec(request_spec, num_slots, "request_spec");
  r->response = SlotLayout::from_spec(response_spec, num_slots, "response_spec");
  r->num_slots = num_slots;
  r->control_segment = shm::Segment::map(control_fd, ControlLayout::for_slots(num_slots).total);
  r->request_segment = shm::Segment::map(request_fd, r->request.bank_bytes());
  r->response_segment = shm::Segment::map(response_fd, r->response.bank_bytes());
  r->attach_views();
  const ControlHeader& h = *r->header;
  if (h.magic != kControlMagic || h.version != kProtocolVersion)
    throw ProtocolError("shared-memory transport: control segment has magic " +
                        std::to_string(h.magic) + " version " + std::to_string(h.version) +
                        ", expected version " + std::to_string(kProtocolVersion));
  if (h.num_slots != num_slots || h.error_bytes != kErrorBytes ||
      h.request_bank_bytes != r->request.bank_bytes() ||
      h.response_bank_bytes != r->response.bank_bytes())
    throw ProtocolError("shared-memory transport: control segment does not match the specs");
  r->copy_result = h.copy_result != 0;
  r->max_spin = h.spin;
  return r;
}

void ShmRegion::free_slot(uint32_t i, uint64_t expected) noexcept {
  if (slots[i].state.compare_exchange_strong(expected, pack_state(kFree, 0),
                                             std::memory_order_acq_rel))
    header->freed.notify_one();
}

void ShmRegion::write_error(uint32_t i, ErrorKind kind, const std::string& type_name,
                            const std::string& message) noexcept {
  char* out = errors + i * kErrorBytes;
  // "type\0message", both truncated to fit; a truncated message ends in "...".
  size_t tn = std::min(type_name.size(), size_t{127});
  std::memcpy(out, type_name.data(), tn);
  out[tn] = '\0';
  size_t room = kErrorBytes - tn - 1;
  size_t mn = message.size();
  if (mn > room) {
    std::memcpy(out + tn + 1, message.data(), room - 3);
    std::memcpy(out + tn + 1 + room - 3, "...", 3);
    mn = room;
  } else {
    std::memcpy(out + tn + 1, message.data(), mn);
  }
  slots[i].error_kind = kind;
  slots[i].error_len = static_cast<uint32_t>(tn + 1 + mn);
}

void ShmRegion::throw_error(uint32_t i) const {
  const char* in = errors + i * kErrorBytes;
  size_t len = std::min<size_t>(slots[i].error_len, kErrorBytes);
  size_t tn = strnlen(in, len);
  std::string type(in, tn);
  std::string message = tn < len ? std::string(in + tn + 1, len - tn - 1) : std::string();
  if (slots[i].error_kind == kClosedError) throw ClosedError(message);
  throw RemoteError(std::move(type), std::move(message));
}

uint32_t ShmRegion::reclaim(uint32_t client) noexcept {
  uint32_t affected = 0;
  for (uint32_t i = 0; i < num_slots; ++i) {
    uint64_t w = slots[i].state.load(std::memory_order_acquire);
    while (owner_of(w) == client && state_of(w) != kFree && state_of(w) != kAbandoned) {
      const uint32_t s = state_of(w);
      const uint64_t next = s == kTaken ? pack_state(kAbandoned, client) : pack_state(kFree, 0);
      // A Ready slot's bit stays in the ready set: the server skips bits whose slot is
      // not Ready (clearing the bit here could clear a later owner's).
      if (slots[i].state.compare_exchange_weak(w, next, std::memory_order_acq_rel)) {
        if (s != kTaken) header->freed.notify_one();
        ++affected;
        break;
      }
    }
  }
  return affected;
}

uint32_t ShmRegion::slots_in_use() const noexcept {
  uint32_t n = 0;
  for (uint32_t i = 0; i < num_slots; ++i)
    if (state_of(slots[i].state.load(std::memory_order_relaxed)) != kFree) ++n;
  return n;
}

}  // namespace tensorwire::inference::detail
