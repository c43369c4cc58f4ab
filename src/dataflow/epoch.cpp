#include "tensorwire/dataflow/epoch.h"

#include <utility>

#include "dataflow/raw_datapoint.h"
#include "tensorwire/core/error.h"

namespace tensorwire::dataflow {

Epoch::Epoch(detail::EpochSource* source) : source_(source) {
  source_->epoch_begin();
  source_->live_ = this;
}

Epoch::Epoch(Epoch&& o) noexcept
    : source_(std::exchange(o.source_, nullptr)),
      count_(o.count_.load()),
      done_(o.done_.load()),
      orphaned_(o.orphaned_) {
  if (source_) source_->live_ = this;
}

Epoch::~Epoch() {
  if (!source_) return;
  source_->live_ = nullptr;
  source_->epoch_end();
}

detail::EpochSource::~EpochSource() {
  if (!live_) return;
  live_->source_ = nullptr;
  live_->orphaned_ = true;
}

std::optional<TensorDict> Epoch::next(Timeout timeout) {
  auto raw = detail::RawAccess::next(*this, timeout);
  if (!raw) return std::nullopt;
  return raw->to_tensordict();
}

std::optional<RawDatapoint> detail::RawAccess::next(Epoch& epoch, Timeout timeout) {
  if (epoch.orphaned_) throw ClosedError("this epoch's runner was destroyed");
  if (epoch.done_ || !epoch.source_) return std::nullopt;
  EpochSource::Step s = epoch.source_->epoch_step(Deadline::after(timeout));
  if (s.end) epoch.done_ = true;
  if (s.datapoint) ++epoch.count_;
  return std::move(s.datapoint);
}

}  // namespace tensorwire::dataflow
