// Epoch: one pass over a runner's output, as a range or with explicit next() calls.
//
//   for (TensorDict& dp : runner.epoch()) ...
//
// An Epoch holds its runner's iteration guard: while one is alive, asking the runner for
// another throws StateError (tensorpack's "This DataFlow is not reentrant!"). An Epoch
// that outlives its runner throws ClosedError from next().
// Thread-safety: as its runner (one thread).
#pragma once

#include <atomic>
#include <iterator>
#include <optional>

#include "tensorwire/dataflow/dataflow.h"
#include "tensorwire/runtime/timeout.h"

namespace tensorwire::dataflow {

class Epoch {
 public:
  // Made by a runner's epoch(): begins an epoch of `source` (StateError when one runs).
  explicit Epoch(detail::EpochSource* source);
  Epoch(Epoch&& o) noexcept;
  Epoch& operator=(Epoch&&) = delete;
  ~Epoch();

  // The next datapoint, or std::nullopt at the end of the epoch (done() true) or when
  // `timeout` passed first (done() false). An interrupt (see runtime/interrupt.h) or a
  // timeout leaves the epoch where it was: next() may be called again.
  std::optional<TensorDict> next(Timeout timeout = Timeout::forever());
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }
  uint64_t count() const noexcept { return count_.load(std::memory_order_acquire); }

  class iterator {
   public:
    using value_type = TensorDict;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    TensorDict& operator*() const { return *current_; }
    iterator& operator++() {
      current_ = epoch_->next();
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return !current_.has_value(); }

   private:
    friend class Epoch;
    Epoch* epoch_ = nullptr;
    mutable std::optional<TensorDict> current_;
  };
  iterator begin() {
    iterator it;
    it.epoch_ = this;
    it.current_ = next();
    return it;
  }
  std::default_sentinel_t end() const { return {}; }

 private:
  friend struct detail::RawAccess;
  friend class detail::EpochSource;
  detail::EpochSource* source_;  // null once moved from, or once the runner went
  // Atomic: the runner's calls take turns (a second thread's next() waits for the first),
  // but each updates these after its turn.
  std::atomic<uint64_t> count_{0};
  std::atomic<bool> done_{false};
  bool orphaned_ = false;  // the runner went first
};

}  // namespace tensorwire::dataflow
