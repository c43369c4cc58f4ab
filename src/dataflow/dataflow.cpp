#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::dataflow {

WorkerError::WorkerError(const std::string& runner, int worker, int pid, Failure failure)
    : RemoteError(std::move(failure), runner + ": worker " + std::to_string(worker) + " (pid " +
                                          std::to_string(pid) + ")"),
      worker_(worker),
      pid_(pid) {}

}  // namespace tensorwire::dataflow
