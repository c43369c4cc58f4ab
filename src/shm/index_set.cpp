#include "shm/index_set.h"

#include <bit>
#include <new>

namespace tensorwire::shm {

IndexSet::IndexSet(void* memory, uint32_t capacity) noexcept
    : words_(static_cast<std::atomic<uint64_t>*>(memory)),
      capacity_(capacity),
      nwords_((capacity + 63) / 64),
      last_word_mask_(capacity % 64 ? (uint64_t{1} << (capacity % 64)) - 1 : ~uint64_t{0}) {}

uint64_t IndexSet::load_word(uint32_t w, std::memory_order order) const noexcept {
  const uint64_t bits = words_[w].load(order);
  return w + 1 == nwords_ ? bits & last_word_mask_ : bits;
}

void IndexSet::format() noexcept {
  for (uint32_t w = 0; w < nwords_; ++w) new (&words_[w]) std::atomic<uint64_t>(0);
}

void IndexSet::insert(uint32_t i) noexcept {
  words_[i / 64].fetch_or(uint64_t{1} << (i % 64), std::memory_order_seq_cst);
}

bool IndexSet::erase(uint32_t i) noexcept {
  const uint64_t bit = uint64_t{1} << (i % 64);
  return (words_[i / 64].fetch_and(~bit, std::memory_order_acq_rel) & bit) != 0;
}

bool IndexSet::contains(uint32_t i) const noexcept {
  return (words_[i / 64].load(std::memory_order_acquire) >> (i % 64)) & 1;
}

bool IndexSet::empty() const noexcept {
  for (uint32_t w = 0; w < nwords_; ++w)
    if (load_word(w, std::memory_order_acquire) != 0) return false;
  return true;
}

size_t IndexSet::take(size_t max, uint32_t* out, uint32_t& cursor) noexcept {
  if (max == 0 || capacity_ == 0) return 0;
  if (cursor >= capacity_) cursor = 0;
  size_t n = 0;
  const uint32_t first_word = cursor / 64;
  const uint32_t first_bit = cursor % 64;
  // nwords_ + 1 visits: the first word is visited twice, above the cursor first and
  // below it last, so the scan covers every index exactly once in rotating order.
  for (uint32_t step = 0; step <= nwords_ && n < max; ++step) {
    const uint32_t w = (first_word + step) % nwords_;
    uint64_t window = ~uint64_t{0};
    if (step == 0)
      window = first_bit ? ~((uint64_t{1} << first_bit) - 1) : ~uint64_t{0};
    else if (step == nwords_)
      window = first_bit ? (uint64_t{1} << first_bit) - 1 : 0;
    uint64_t present = load_word(w, std::memory_order_relaxed) & window;
    if (!present) continue;
    // Keep the lowest bits up to the number still wanted.
    uint64_t want = 0;
    size_t k = 0;
    for (uint64_t rest = present; rest && n + k < max; rest &= rest - 1, ++k)
      want |= rest & (~rest + 1);
    const uint64_t got = words_[w].fetch_and(~want, std::memory_order_acq_rel) & want;
    for (uint64_t rest = got; rest; rest &= rest - 1) {
      const uint32_t idx = w * 64 + static_cast<uint32_t>(std::countr_zero(rest));
      out[n++] = idx;
      cursor = idx + 1 == capacity_ ? 0 : idx + 1;
    }
  }
  return n;
}

}  // namespace tensorwire::shm
