// RunnerCore: the main-process state and life cycle that MultiProcessRunnerZMQ and
// MultiProcessMapDataZMQ share (private): argument checks, the base seed, reset_state()
// once, forking the workers, one epoch at a time, and "closed" as the final failure.
// Each runner's Impl derives from it and adds what differs (credits; task sockets).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>

#include "dataflow/links.h"
#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::dataflow::detail {

struct RunnerCore {
  // Checks the dataflow and num_proc (ValueError naming `name`); `seed` unset: random.
  RunnerCore(const char* name, std::shared_ptr<DataFlow> ds, int num_proc,
             std::optional<uint64_t> seed, Millis liveness_interval);

  // reset_state(): StateError the second time; then the socket pairs and num_proc workers,
  // worker i running worker_main(i) with WorkerInfo{i, num_proc, seed + i}.
  void start_workers(const ForkHooks& hooks, const std::function<void(int)>& worker_main);
  // StateError before reset_state() or while another epoch runs.
  void begin_epoch();
  void end_epoch() noexcept { in_epoch = false; }
  // ClosedError after close(); StateError before reset_state().
  void check_started() const;
  void check_open() const;
  // After link.close(): what any later call raises (in the process that owns the runner).
  void mark_closed() noexcept;

  const char* name;
  std::shared_ptr<DataFlow> ds;
  int num_proc;
  std::optional<size_t> size;
  uint64_t seed;
  bool reset_done = false;
  bool in_epoch = false;
  bool closed = false;
  MainLink link;
  std::exception_ptr failed;
};

}  // namespace tensorwire::dataflow::detail
