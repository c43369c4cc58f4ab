// The server side of a SharedMemoryTransport one request at a time, for adapters whose
// own server batches (tensorwire.torchrl under torchrl's InferenceServer). Private: a C++
// user serves with InferenceServer.
#pragma once

#include <cstdint>

#include "tensorwire/inference/shared_memory_transport.h"

namespace tensorwire::inference::detail {

struct ShmAccess {
  // After drain(): the request in `slot` as a view of the bank (no batch dimension).
  static TensorDict request_row(const SharedMemoryTransport& t, uint32_t slot);
  // Answers the drained request in `slot` from one unbatched response (the declared keys
  // with the spec's shapes and dtypes: KeyError / ValueError otherwise, nothing written).
  // Both answer a slot once: one no longer Taken (answered already) is left alone.
  static void resolve_one(SharedMemoryTransport& t, uint32_t slot, const TensorDict& response);
  static void reject_one(SharedMemoryTransport& t, uint32_t slot, const RemoteError& error);
};

}  // namespace tensorwire::inference::detail
