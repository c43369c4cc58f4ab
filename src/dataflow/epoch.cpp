#include "tensorwire/dataflow/epoch.h"

#include "dataflow/raw_datapoint.h"

namespace tensorwire::dataflow {

Epoch::Epoch(detail::EpochSource* source) : source_(source) {
  source_->epoch_begin();
}

Epoch::~Epoch() {
  if (source_) source_->epoch_end();
}

std::optional<TensorDict> Epoch::next(Timeout timeout) {
  auto raw = detail::RawAccess::next(*this, timeout);
  if (!raw) return std::nullopt;
  return raw->to_tensordict();
}

std::optional<RawDatapoint> detail::RawAccess::next(Epoch& epoch, Timeout timeout) {
  if (epoch.done_ || !epoch.source_) return std::nullopt;
  EpochSource::Step s = epoch.source_->epoch_step(Deadline::after(timeout));
  if (s.end) epoch.done_ = true;
  if (s.datapoint) ++epoch.count_;
  return std::move(s.datapoint);
}

}  // namespace tensorwire::dataflow
