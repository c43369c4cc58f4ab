// DataFlow: a source of datapoints (TensorDicts), tensorpack's DataFlow contract in C++.
//
// A dataflow is reset once in each process that iterates it, then iterated in passes: a
// pass begins with start() and ends when next() returns std::nullopt (an infinite
// dataflow never ends its pass). size() is the number of datapoints per pass, when known.
//
// Thread-safety: a DataFlow is used by one thread of one process at a time; a runner
// iterates its own copy in each worker process (after fork(), so each worker's state is
// independent).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "tensorwire/core/tensordict.h"
#include "tensorwire/runtime/remote_error.h"
#include "tensorwire/wire/layout.h"

namespace tensorwire::dataflow {

class DataFlow {
 public:
  virtual ~DataFlow() = default;
  // Called once in each process that iterates this dataflow (in a runner's worker: after
  // the fork, before the first pass). Seed random generators here (see current_worker()).
  virtual void reset_state() {}
  // Begins a pass. Called before the first next() and again after next() returned nullopt.
  virtual void start() {}
  // The next datapoint of the current pass, or std::nullopt when the pass is over.
  virtual std::optional<TensorDict> next() = 0;
  // Datapoints per pass, when known.
  virtual std::optional<size_t> size() const { return std::nullopt; }
};

// A dataflow made of a function: each pass yields fn(0), fn(1), ... fn(size-1), or runs
// for ever when size is std::nullopt.
class FunctionFlow : public DataFlow {
 public:
  using Fn = std::function<TensorDict(uint64_t index)>;
  FunctionFlow(Fn fn, std::optional<size_t> size) : fn_(std::move(fn)), size_(size) {}
  void start() override { index_ = 0; }
  std::optional<TensorDict> next() override {
    if (size_ && index_ >= *size_) return std::nullopt;
    return fn_(index_++);
  }
  std::optional<size_t> size() const override { return size_; }

 private:
  Fn fn_;
  std::optional<size_t> size_;
  uint64_t index_ = 0;
};

namespace detail {
class EpochSource;  // what a runner's epochs come from
struct RawAccess;   // datapoints before they become TensorDicts (the Python binding's way)
}  // namespace detail

// Who this process is, in a runner's worker process.
struct WorkerInfo {
  int index = 0;  // 0 .. num_workers-1
  int num_workers = 0;
  uint64_t seed = 0;  // the runner's base seed + index: distinct per worker, reproducible
};
// This process's worker information, or nullptr when it is not a runner's worker.
const WorkerInfo* current_worker() noexcept;

// Hooks run around each fork() of a runner (in the forking thread): the Python binding
// uses them for PyOS_BeforeFork / PyOS_AfterFork_*. With the restart policy they also run
// around the fork of the runner's fork server and, in that server, around each fork of a
// replacement; in the server itself current_worker() is nullptr. A `child` hook that
// throws ends that process (exit status 1).
struct ForkHooks {
  std::function<void()> before;
  std::function<void()> parent;
  std::function<void()> child;
};

// What a runner does when one of its worker processes dies (killed, out of memory, exited)
// or, with a datapoint time limit, is stuck.
enum class OnWorkerDeath {
  Raise,    // iteration throws WorkerDiedError; the runner is failed (the default)
  Restart,  // a fresh worker with a new seed takes its place and the stream goes on
};
// "raise" or "restart"; ValueError naming `argument` otherwise.
OnWorkerDeath parse_on_worker_death(std::string_view text,
                                    const char* argument = "on_worker_death");

// A worker that was replaced (the report of OnWorkerDeath::Restart).
struct WorkerRestart {
  int worker = 0;         // its index
  int pid = -1;           // the process that died
  int wait_status = -1;   // as from waitpid(); -1 when it is unknown
  int new_pid = -1;       // the replacement
  uint64_t new_seed = 0;  // the replacement's WorkerInfo::seed
  uint64_t restarts = 0;  // the runner's restarts so far, this one included
  std::string message;    // one line: worker, pid, how it died, what replaced it
};

// How a runner treats worker deaths (RunnerOptions and MapOptions hold one).
//
// With Restart, a worker that dies more than `max_restarts` times within `restart_window`
// ends the run with WorkerDiedError instead of being restarted for ever. A worker busy on
// one datapoint (its dataflow's next(), or the map function) for longer than
// `datapoint_timeout` is killed and then treated as dead, the datapoint named in the
// message; a datapoint that more than `max_restarts` workers died on (busy with it) ends
// the run whatever the window. Checked in the constructor: ValueError naming the field.
struct WorkerPolicy {
  OnWorkerDeath on_death = OnWorkerDeath::Raise;
  int max_restarts = 3;
  std::chrono::milliseconds restart_window{60000};
  std::optional<std::chrono::milliseconds> datapoint_timeout;  // none: no limit
  // Called on the iterating thread after each restart (the library also logs a warning).
  std::function<void(const WorkerRestart&)> on_restart;
};

// A worker raised: thrown in the main process by the runner that received the report.
class WorkerError : public RemoteError {
 public:
  WorkerError(const std::string& runner, int worker, int pid, Failure failure);
  int worker() const noexcept { return worker_; }
  int pid() const noexcept { return pid_; }

 private:
  int worker_;
  int pid_;
};

// A worker process ended (killed, out of memory, exited): iteration cannot go on.
class WorkerDiedError : public Error {
 public:
  WorkerDiedError(const std::string& what, int worker, int pid, int wait_status)
      : Error(what), worker_(worker), pid_(pid), status_(wait_status) {}
  int worker() const noexcept { return worker_; }
  int pid() const noexcept { return pid_; }
  int wait_status() const noexcept { return status_; }  // as from waitpid(); -1 if unknown

 private:
  int worker_;
  int pid_;
  int status_;
};

// A second concurrent iteration, or reset_state() called twice (Python: RuntimeError).
class StateError : public Error {
 public:
  using Error::Error;
};

}  // namespace tensorwire::dataflow
