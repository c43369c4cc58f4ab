// What a transport implements for its clients (private: users only see Client and Future).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorwire/inference/client.h"

namespace tensorwire::inference::detail {

// One in-flight request, as a transport sees it.
class Pending {
 public:
  virtual ~Pending() = default;  // a request dropped unread gives back what it holds
  // True once take() would not block.
  virtual bool ready() = 0;
  // One step of a wait: blocks at most until `slice` (short: the caller loops through
  // runtime::wait_until, which checks for interrupts between steps). True when ready; a
  // server that is gone makes it return true (take() then throws ClosedError).
  virtual bool wait(Deadline slice) = 0;
  // The outcome, once ready (called at most once): the response, or throws.
  virtual TensorDict take() = 0;
};

// A transport's client side.
class ClientImpl {
 public:
  virtual ~ClientImpl() = default;
  // Validates `td`, then enqueues it; blocks until it can be enqueued (a free slot), at
  // most until `deadline` (TimeoutError), interruptibly.
  virtual std::unique_ptr<Pending> submit(const TensorDict& td, Deadline deadline) = 0;
  virtual const char* kind() const noexcept = 0;
  // The name another process attaches to (empty when clients cannot leave the process).
  virtual std::string address() const = 0;
  virtual std::optional<std::vector<Key>> request_keys() { return std::nullopt; }
  // Drops the connection; later submits throw ClosedError.
  virtual void close() noexcept = 0;
};

// The one message of every "dtype[shape]" in the inference errors: "float32[4]".
std::string leaf_str(DType dtype, const Shape& shape);

}  // namespace tensorwire::inference::detail
