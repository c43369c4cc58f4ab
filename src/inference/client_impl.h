// What a transport implements for its clients (private: users only see Client and Future).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tensorwire/core/error.h"
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

// What a request a forked child inherited raises: `why` nothing in the child can answer it.
inline ClosedError made_before_fork(const std::string& why) {
  return ClosedError("this inference Future was made before a fork: " + why +
                     " (submit again from a client in the child)");
}

// A client's connection, made on first use and shared by the threads that use the client.
// `current()` (called under `mu`) is the connection to use now, or null (it throws once
// the client is closed); `make()` makes a new one; `keep(c)` (under `mu`) stores it.
// Connecting waits (for a handshake, for the name to be served) without holding `mu`: a
// process forked meanwhile by another thread would get `mu` locked for good, and its first
// call on the client would hang past its timeout and Ctrl-C. Two threads may both connect:
// the first to finish is kept, the other's connection dropped.
template <class Current, class Make, class Keep>
auto connect_once(std::mutex& mu, Current&& current, Make&& make, Keep&& keep)
    -> decltype(current()) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto c = current()) return c;
  }
  auto made = make();
  std::lock_guard<std::mutex> lock(mu);
  if (auto other = current()) return other;  // another thread connected meanwhile
  return keep(std::move(made));
}

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
  // The request spec's leaves of a fixed-layout transport (connecting by `connect_by`),
  // std::nullopt when any structure goes.
  virtual std::optional<std::vector<RequestLeaf>> request_leaves(Deadline /*connect_by*/) {
    return std::nullopt;
  }
  // Drops the connection; later submits throw ClosedError.
  virtual void close() noexcept = 0;
};

// The one message of every "dtype[shape]" in the inference errors: "float32[4]".
std::string leaf_str(DType dtype, const Shape& shape);

}  // namespace tensorwire::inference::detail
