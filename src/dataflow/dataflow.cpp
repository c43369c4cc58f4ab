#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::dataflow {

WorkerError::WorkerError(const std::string& runner, int worker, int pid, Failure failure)
    : RemoteError(std::move(failure), runner + ": worker " + std::to_string(worker) + " (pid " +
                                          std::to_string(pid) + ")"),
      worker_(worker),
      pid_(pid) {}

OnWorkerDeath parse_on_worker_death(std::string_view text, const char* argument) {
  if (text == "raise") return OnWorkerDeath::Raise;
  if (text == "restart") return OnWorkerDeath::Restart;
  throw ValueError(std::string(argument) + " must be 'raise' or 'restart', got '" +
                   std::string(text) + "'");
}

}  // namespace tensorwire::dataflow
