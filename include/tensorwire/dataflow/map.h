// MultiProcessMapDataZMQ: iterates a DataFlow in this process and runs a map function
// on its datapoints in worker processes, as tensorpack's class of the same name does.
// Inputs travel to the workers and results back through shared memory; only descriptors
// go through ZeroMQ (docs/dataflow.md).
//
// `buffer_size` datapoints are in flight (sent to a worker and not yet received back).
//   strict = false: epochs are endless; the dataflow is repeated for ever, results come
//                   in completion order and a map function that returns std::nullopt
//                   drops that datapoint.
//   strict = true:  each epoch yields the mapping of every datapoint of one pass exactly
//                   once (in completion order); returning std::nullopt is an error. The
//                   next pass is already being sent while the current one finishes, and
//                   its early results are kept for the next epoch.
// A map function that throws makes the epoch throw WorkerError (the worker goes on
// serving); a worker that dies makes it throw WorkerDiedError. Neither ever hangs. With
// policy.on_death = Restart a dead (or stuck) worker is replaced and the datapoints it
// held are sent again, a result that comes twice counted once: strict epochs stay exact.
//
// Thread-safety: one thread at a time; not fork-safe after reset_state().
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tensorwire/dataflow/dataflow.h"
#include "tensorwire/dataflow/epoch.h"

namespace tensorwire::dataflow {

// Runs in a worker; std::nullopt filters the datapoint out.
using MapFunction = std::function<std::optional<TensorDict>(TensorDict)>;

// The most datapoints in flight a map runner takes (buffer_size; more is a ValueError).
inline constexpr size_t kMaxBufferSize = size_t{1} << 16;

struct MapOptions {
  int num_proc = 1;
  size_t buffer_size = 200;  // 1 to kMaxBufferSize (after strict mode's clamp to size())
  bool strict = false;
  std::optional<uint64_t> seed;
  ForkHooks fork_hooks;
  std::function<Failure(std::exception_ptr)> describe_failure = describe_exception;
  std::chrono::milliseconds liveness_interval{100};
  WorkerPolicy policy;  // dead and stuck workers
};

class MultiProcessMapDataZMQ final {
 public:
  MultiProcessMapDataZMQ(std::shared_ptr<DataFlow> ds, MapFunction map, MapOptions options = {});
  ~MultiProcessMapDataZMQ();
  MultiProcessMapDataZMQ(const MultiProcessMapDataZMQ&) = delete;
  MultiProcessMapDataZMQ& operator=(const MultiProcessMapDataZMQ&) = delete;

  // Forks the workers, resets the dataflow in this process and fills the buffer.
  void reset_state();
  Epoch epoch();

  std::optional<size_t> size() const;  // the dataflow's
  uint64_t base_seed() const noexcept;
  const MapOptions& options() const noexcept;
  size_t buffer_size() const noexcept;  // after clamping to size() in strict mode
  std::vector<int> pids() const;
  uint64_t restarts() const noexcept;  // workers replaced so far (policy Restart)
  void close();
  bool closed() const noexcept;  // close() was called (later calls throw ClosedError)

  struct Impl;

 private:
  friend struct detail::RawAccess;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorwire::dataflow
