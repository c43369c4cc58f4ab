// The shared-memory region of a SharedMemoryTransport as every process maps it: the
// control segment's layout, the slot state machine, and the two banks.
//
// Control segment (all offsets fixed by num_slots, see ControlLayout):
//   ControlHeader                      identity, server state, doorbell, "slot freed" word
//   IndexSet ready                     one bit per slot: "ready for the server"
//   WaitBits answered[num_slots / 32]  slot i's owner waits on word i / 32, bit i % 32
//   SlotControl[num_slots]             per slot: state word, submit time
//   char errors[num_slots][512]        per slot: "TypeName\0message" of a failure
//
// Slot state word (64 bits): state in the low 32 bits, owning client id in the high 32.
// Every transition is a CAS on the whole word, so whoever changes a slot knows exactly
// which client's request it changes; docs/inference.md draws the state machine.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "os/adaptive_spin.h"
#include "os/futex.h"
#include "shm/index_set.h"
#include "shm/segment.h"
#include "slot_layout.h"

namespace tensorwire::inference::detail {

inline constexpr uint64_t kControlMagic = 0x314652494E495754ull;  // "TWINIRF1"
inline constexpr uint32_t kProtocolVersion = 3;
inline constexpr size_t kErrorBytes = 512;

enum SlotState : uint32_t {
  kFree = 0,       // no owner
  kWriting = 1,    // claimed by its owner, request being written
  kReady = 2,      // request written; in the ready set
  kTaken = 3,      // drained by the server, policy running
  kDone = 4,       // response written; the owner reads it, then frees the slot
  kFailed = 5,     // error text written; the owner reads it, then frees the slot
  kAbandoned = 6,  // owner gone (future dropped, process died) while Taken: the
                   // server frees the slot instead of answering
};

enum ServerState : uint32_t { kNoServer = 0, kServing = 1, kStopped = 2 };
enum ErrorKind : uint32_t { kPolicyError = 1, kClosedError = 2 };

constexpr uint64_t pack_state(uint32_t state, uint32_t owner) noexcept {
  return (static_cast<uint64_t>(owner) << 32) | state;
}
constexpr uint32_t state_of(uint64_t word) noexcept {
  return static_cast<uint32_t>(word);
}
constexpr uint32_t owner_of(uint64_t word) noexcept {
  return static_cast<uint32_t>(word >> 32);
}

struct alignas(64) ControlHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t num_slots;
  uint32_t spin;
  uint32_t copy_result;
  int32_t owner_pid;
  uint32_t error_bytes;
  uint64_t request_bank_bytes;
  uint64_t response_bank_bytes;
  alignas(64) std::atomic<uint32_t> server_state;
  std::atomic<uint32_t> next_client_id;  // ids of clients made in the owner process
  alignas(64) os::WaitWord doorbell;     // bumped when a slot becomes ready
  alignas(64) os::WaitWord freed;        // bumped when a slot becomes free (or on shutdown)
};

struct alignas(64) SlotControl {
  std::atomic<uint64_t> state;
  int64_t submitted_ns;
  uint32_t error_kind;
  uint32_t error_len;
};
static_assert(sizeof(SlotControl) == 64);

struct ControlLayout {
  size_t ready = 0, answered = 0, slots = 0, errors = 0, total = 0;
  static ControlLayout for_slots(uint32_t num_slots);
};

// Everything one process needs to use the transport: the three mappings and views of them.
struct ShmRegion {
  shm::Segment control_segment, request_segment, response_segment;
  SlotLayout request, response;
  ControlHeader* header = nullptr;
  shm::IndexSet ready;
  os::WaitBits* answered = nullptr;  // bumped when a slot becomes Done or Failed
  SlotControl* slots = nullptr;
  char* errors = nullptr;
  Storage request_bank, response_bank;  // storages over the banks (keep the mappings alive)
  uint32_t num_slots = 0;
  uint32_t max_spin = 0;  // the AdaptiveSpin maximum every waiter uses
  bool copy_result = true;

  // Creates and formats new segments (the owner).
  static std::shared_ptr<ShmRegion> create(const TensorDict& request_spec,
                                           const TensorDict& response_spec, uint32_t num_slots,
                                           bool copy_result, uint32_t spin);
  // Maps segments received from the owner; validates them against the specs.
  static std::shared_ptr<ShmRegion> map(const TensorDict& request_spec,
                                        const TensorDict& response_spec, uint32_t num_slots,
                                        int control_fd, int request_fd, int response_fd);

  SlotControl& slot(uint32_t i) const noexcept { return slots[i]; }
  // The word and bit slot i's owner waits on for its answer.
  os::WaitBits::Bit answer_of(uint32_t i) const noexcept {
    return {answered[i / 32], 1u << (i % 32)};
  }
  // Wakes the owner of slot i (its answer or failure is written).
  void notify_answered(uint32_t i) const noexcept { answered[i / 32].notify(1u << (i % 32)); }
  // Wakes the owners of many slots, one system call per run of slots that share a word
  // (a batch's slots come in index order, so mostly one per 32 slots).
  class AnsweredBatch {
   public:
    explicit AnsweredBatch(const ShmRegion& r) noexcept : r_(r) {}
    AnsweredBatch(const AnsweredBatch&) = delete;
    AnsweredBatch& operator=(const AnsweredBatch&) = delete;
    ~AnsweredBatch() { flush(); }
    void add(uint32_t i) noexcept {
      if (bits_ != 0 && i / 32 != word_) flush();
      word_ = i / 32;
      bits_ |= 1u << (i % 32);
    }

   private:
    void flush() noexcept {
      if (bits_ != 0) r_.answered[word_].notify(bits_);
      bits_ = 0;
    }
    const ShmRegion& r_;
    uint32_t word_ = 0, bits_ = 0;
  };
  std::byte* request_data() const noexcept { return request_segment.data(); }
  std::byte* response_data() const noexcept { return response_segment.data(); }

  // Makes the slot free (its owner is done with it) and wakes clients waiting for one.
  void free_slot(uint32_t i, uint64_t expected) noexcept;
  // Writes a failure into slot i's error area.
  void write_error(uint32_t i, ErrorKind kind, const std::string& type_name,
                   const std::string& message) noexcept;
  // Reads it back as the exception a client throws.
  [[noreturn]] void throw_error(uint32_t i) const;
  // Gives back every slot owned by `client` (a client that died): free where nobody
  // else touches it, Abandoned where the server holds it (it frees it when done).
  // Returns how many slots were affected.
  uint32_t reclaim(uint32_t client) noexcept;
  uint32_t slots_in_use() const noexcept;

 private:
  void attach_views();
};

int64_t now_ns() noexcept;

}  // namespace tensorwire::inference::detail
