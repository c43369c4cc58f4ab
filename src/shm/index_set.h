// IndexSet: a lock-free set of small indices [0, capacity) that lives in shared memory.
//
// The use it is made for: "which of these N slots are ready?" between processes. Any
// process inserts an index with one fetch_or; a consumer takes up to `max` members with
// one fetch_and per 64 indices, in rotating order from a cursor it keeps, so a busy low
// index cannot starve a high one. The layout is a plain array of 64-bit atomic words (no
// pointers, no process-local state), so it works at any address in any process.
//
// Why a bitmap and not a ring of indices: every operation is a single atomic
// read-modify-write on one word, so a process killed at any instruction leaves the set
// consistent (an index is either in it or not). A ring needs a claim-then-publish pair
// of steps, and a producer killed between the two blocks every consumer behind it. The
// price is that order is by index, not FIFO; callers that need fairness rotate the
// cursor (take() does).
//
// The words may be written by processes that are not trusted to keep to insert() (an
// inference client maps the ready set): bits at or past the capacity are ignored, so
// take() only ever returns indices below it.
//
// Thread-safety: every method may be called concurrently from any thread of any process
// that maps the memory, except format(), which must happen before the set is shared.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tensorwire::shm {

class IndexSet {
 public:
  IndexSet() = default;
  // A view of the set stored in `memory`, which must hold bytes_for(capacity) bytes,
  // 8-byte aligned. The memory is not initialised: call format() once, in one process.
  IndexSet(void* memory, uint32_t capacity) noexcept;

  static constexpr size_t bytes_for(uint32_t capacity) noexcept {
    return (static_cast<size_t>(capacity) + 63) / 64 * sizeof(uint64_t);
  }

  void format() noexcept;  // makes the set empty
  uint32_t capacity() const noexcept { return capacity_; }

  // Adds i (release: writes made before insert() are visible to whoever takes i).
  // Inserting a present index is a no-op. i must be < capacity().
  void insert(uint32_t i) noexcept;
  // Removes i; returns whether it was present.
  bool erase(uint32_t i) noexcept;
  bool contains(uint32_t i) const noexcept;
  bool empty() const noexcept;

  // Removes up to `max` members and writes them to `out` in the order found, scanning
  // from index `cursor` upwards and wrapping around; then sets `cursor` just past the
  // last index taken. Returns how many were taken (acquire: see insert()).
  size_t take(size_t max, uint32_t* out, uint32_t& cursor) noexcept;

 private:
  std::atomic<uint64_t>* words_ = nullptr;
  uint32_t capacity_ = 0;
  uint32_t nwords_ = 0;
  uint64_t last_word_mask_ = 0;  // the bits of the last word that are indices
  uint64_t load_word(uint32_t w, std::memory_order order) const noexcept;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "IndexSet needs address-free 64-bit atomics to work across processes");

}  // namespace tensorwire::shm
