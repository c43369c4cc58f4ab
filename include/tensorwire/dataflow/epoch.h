// Epoch: one pass over a runner's output, as a range or with explicit next() calls.
//
//   for (TensorDict& dp : runner.epoch()) ...
//
// An Epoch holds its runner's iteration guard: while one is alive, asking the runner for
// another throws StateError (tensorpack's "This DataFlow is not reentrant!").
// Thread-safety: as its runner (one thread).
#pragma once

#include <iterator>
#include <optional>

#include "tensorwire/dataflow/dataflow.h"
#include "tensorwire/runtime/timeout.h"

namespace tensorwire::dataflow {

// What a runner implements for its epochs.
class EpochSource {
 public:
  struct Step {
    std::optional<RawDatapoint> datapoint;
    bool end = false;  // the epoch is over (datapoint empty)
  };
  // The next step of the current epoch; a Step with neither a datapoint nor `end` means
  // the deadline passed. Waits through runtime::wait_until (interruptible).
  virtual Step epoch_step(Deadline deadline) = 0;
  virtual void epoch_begin() = 0;  // StateError when an epoch is already running
  virtual void epoch_end() noexcept = 0;

 protected:
  ~EpochSource() = default;
};

class Epoch {
 public:
  explicit Epoch(EpochSource* source) : source_(source) { source_->epoch_begin(); }
  Epoch(Epoch&& o) noexcept : source_(o.source_), count_(o.count_), done_(o.done_) {
    o.source_ = nullptr;
  }
  Epoch& operator=(Epoch&&) = delete;
  ~Epoch() {
    if (source_) source_->epoch_end();
  }

  // The next datapoint, or std::nullopt at the end of the epoch (done() true) or when
  // `timeout` passed first (done() false). An interrupt (see runtime/interrupt.h) or a
  // timeout leaves the epoch where it was: next() may be called again.
  std::optional<TensorDict> next(Timeout timeout = Timeout::forever()) {
    auto raw = next_raw(timeout);
    if (!raw) return std::nullopt;
    return raw->to_tensordict();
  }
  // The same, before the datapoint becomes a TensorDict (see RawDatapoint).
  std::optional<RawDatapoint> next_raw(Timeout timeout = Timeout::forever()) {
    if (done_ || !source_) return std::nullopt;
    EpochSource::Step s = source_->epoch_step(Deadline::after(timeout));
    if (s.end) done_ = true;
    if (s.datapoint) ++count_;
    return std::move(s.datapoint);
  }
  bool done() const noexcept { return done_; }
  uint64_t count() const noexcept { return count_; }

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
  EpochSource* source_;
  uint64_t count_ = 0;
  bool done_ = false;
};

}  // namespace tensorwire::dataflow
