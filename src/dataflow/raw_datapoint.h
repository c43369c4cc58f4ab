// Datapoints before they become TensorDicts, and how the runners hand them to an Epoch.
// Internal: the Python binding reads datapoints this way (wire::DatapointDecoder, a plan per
// layout, values straight from the storage) instead of building TensorDicts; users get
// TensorDicts from next() and Epoch, declared in the public headers.
#pragma once

#include <memory>
#include <optional>

#include "tensorwire/core/storage.h"
#include "tensorwire/core/tensordict.h"
#include "tensorwire/runtime/timeout.h"
#include "tensorwire/wire/layout.h"

namespace tensorwire::dataflow {

class Epoch;
class MultiProcessRunnerZMQ;
class RemoteDataZMQ;

// A received datapoint: its consolidated storage (a view of the sender's shared memory or
// of the received message) and the layout (schema) that maps it; to_tensordict() is what
// next() returns. The storage keeps the chunk; dropping the last copy releases it.
struct RawDatapoint {
  Storage storage;
  std::shared_ptr<const wire::ConsolidatedLayout> layout;
  TensorDict to_tensordict() const { return layout->instantiate(storage); }
};

namespace detail {

// What a runner implements for its epochs (its Impl does; an Epoch holds a pointer).
// It knows its live Epoch (at most one) and detaches it when it goes: an Epoch may outlive
// its runner (a function that returns runner.epoch() of a local runner), and then says so
// instead of reading freed memory.
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
  virtual ~EpochSource();

 private:
  friend class tensorwire::dataflow::Epoch;
  Epoch* live_ = nullptr;  // set and cleared by the Epoch
};

// next() before the datapoint becomes a TensorDict: the same waits, errors and counts.
struct RawAccess {
  static std::optional<RawDatapoint> next(MultiProcessRunnerZMQ& runner, Timeout timeout);
  static std::optional<RawDatapoint> next(RemoteDataZMQ& remote, Timeout timeout);
  static std::optional<RawDatapoint> next(Epoch& epoch, Timeout timeout);
};

}  // namespace detail
}  // namespace tensorwire::dataflow
