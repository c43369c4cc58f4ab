#include "dataflow/runner_core.h"

#include <unistd.h>

#include <random>
#include <string>

#include "tensorwire/core/error.h"

namespace tensorwire::dataflow::detail {

namespace {
uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}
}  // namespace

RunnerCore::RunnerCore(const char* runner_name, std::shared_ptr<DataFlow> dataflow, int n,
                       std::optional<uint64_t> base_seed, Millis liveness_interval)
    : name(runner_name),
      ds(std::move(dataflow)),
      num_proc(n),
      seed(base_seed ? *base_seed : random_seed()),
      link(runner_name, liveness_interval) {
  if (!ds) throw ValueError(std::string(name) + ": no dataflow");
  if (num_proc < 1 || num_proc > 1024)
    throw ValueError(std::string(name) + ": num_proc must be in [1, 1024], got " +
                     std::to_string(num_proc));
  size = ds->size();
}

void RunnerCore::start_workers(const ForkHooks& hooks,
                               const std::function<void(int)>& worker_main) {
  check_open();
  if (reset_done) throw StateError(std::string(name) + ": reset_state() was called twice");
  reset_done = true;
  link.make_sockets(num_proc);
  for (int i = 0; i < num_proc; ++i) {
    WorkerInfo info{i, num_proc, seed + static_cast<uint64_t>(i)};
    link.workers.spawn(info, hooks, [&worker_main, i]() -> int {
      worker_main(i);  // a worker ends its process; it does not return
      return 0;
    });
  }
}

void RunnerCore::check_open() const {
  if (closed) throw ClosedError(std::string(name) + " is closed");
  // A forked child holds a copy whose sockets and workers belong to its parent.
  if (link.owner_pid != -1 && link.owner_pid != ::getpid())
    throw ClosedError(std::string(name) + " was started by process " +
                      std::to_string(link.owner_pid) +
                      "; this forked child cannot use it (make a new one here)");
}

void RunnerCore::check_started() const {
  check_open();
  if (!reset_done) throw StateError(std::string(name) + ": call reset_state() before iterating");
}

void RunnerCore::begin_epoch() {
  check_started();
  if (in_epoch) throw StateError("This DataFlow is not reentrant!");
  in_epoch = true;
}

void RunnerCore::mark_closed() noexcept {
  if (link.owner_pid == -1 || link.owner_pid == ::getpid()) closed = true;
  if (!failed && reset_done && link.owner_pid == ::getpid())
    failed = std::make_exception_ptr(ClosedError(std::string(name) + " is closed"));
}

}  // namespace tensorwire::dataflow::detail
