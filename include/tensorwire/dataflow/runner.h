// MultiProcessRunnerZMQ: runs a DataFlow in worker processes and collects the
// datapoints, as tensorpack's class of the same name does, with the tensor bytes in
// shared memory (docs/dataflow.md).
//
//   auto runner = MultiProcessRunnerZMQ(std::make_shared<MyFlow>(), {.num_proc = 2});
//   runner.reset_state();                       // forks the workers
//   for (TensorDict& dp : runner.epoch()) ...   // len(ds) datapoints (for ever if unknown)
//
// Nothing forks in the constructor. reset_state() forks num_proc workers (once; a second
// call throws StateError); each worker resets its copy of the dataflow and loops over it
// for ever, writing each datapoint into shared memory it owns and pushing a descriptor
// through a ZeroMQ PUSH -> PULL pipe on an abstract ipc address (no file). At most `hwm`
// datapoints per worker are sent and not yet received. A received datapoint is a
// TensorDict of views into the worker's memory, recycled when its last view goes: a
// consumer that keeps datapoints keeps their memory.
//
// Ordering: one worker yields the dataflow's datapoints in order; several yield the same
// distribution, with duplicates (each worker runs the whole dataflow) and reordering.
//
// Failures: a worker's exception is rethrown here as WorkerError (type, message,
// traceback); a worker that dies makes next() throw WorkerDiedError within
// `liveness_interval`, naming the worker and how it ended. Either leaves the runner
// failed: later calls throw the same error. With policy.on_death = Restart, a dead worker
// is replaced instead (a new seed: base seed + index + num_proc x its restarts; it starts
// its dataflow from the beginning), a warning is logged and the stream goes on
// (WorkerPolicy in dataflow.h). Workers die with this process
// (PR_SET_PDEATHSIG, tied to the thread that called reset_state()) and are killed and
// reaped by close() and the destructor.
//
// Thread-safety: one thread at a time; not fork-safe after reset_state() (do not nest).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "tensorwire/dataflow/dataflow.h"
#include "tensorwire/dataflow/epoch.h"

namespace tensorwire::dataflow {

struct RunnerOptions {
  int num_proc = 1;
  int hwm = 50;                  // datapoints buffered per worker
  std::optional<uint64_t> seed;  // base seed; random when not given (see base_seed())
  ForkHooks fork_hooks;
  std::function<Failure(std::exception_ptr)> describe_failure = describe_exception;
  std::chrono::milliseconds liveness_interval{100};  // how often busy iteration checks workers
  WorkerPolicy policy;                               // dead and stuck workers
};

class MultiProcessRunnerZMQ final {
 public:
  MultiProcessRunnerZMQ(std::shared_ptr<DataFlow> ds, RunnerOptions options = {});
  ~MultiProcessRunnerZMQ();
  MultiProcessRunnerZMQ(const MultiProcessRunnerZMQ&) = delete;
  MultiProcessRunnerZMQ& operator=(const MultiProcessRunnerZMQ&) = delete;

  void reset_state();

  // The next datapoint of the stream, from whichever worker; waits up to `timeout` and
  // returns std::nullopt when it ran out. Interruptible (runtime/interrupt.h); a timeout
  // or an interrupt leaves the runner usable. ClosedError after close().
  std::optional<TensorDict> next(Timeout timeout);
  TensorDict next();

  // One epoch: size() datapoints, or an endless stream when the size is unknown. Only one
  // Epoch may be alive at a time (StateError otherwise).
  Epoch epoch();

  std::optional<size_t> size() const;  // the dataflow's, read in the constructor
  uint64_t base_seed() const noexcept;
  const RunnerOptions& options() const noexcept;
  std::vector<int> pids() const;       // the workers' process ids (empty before reset_state)
  uint64_t restarts() const noexcept;  // workers replaced so far (policy Restart)
  std::string endpoint() const;        // the ipc address of the pipe
  // Bytes of shared memory mapped from the workers (their chunk arenas).
  size_t shared_memory_bytes() const;

  // Kills and reaps the workers and closes the pipe; idempotent. Datapoints already
  // received stay valid.
  void close();
  bool closed() const noexcept;  // close() was called (later calls throw ClosedError)

  struct Impl;

 private:
  friend struct detail::RawAccess;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorwire::dataflow
