// The client API shared by every inference transport: submit a single (unbatched)
// request, get a Future, read the response.
//
//   Client client = transport->client();
//   TensorDict action = client(observation);            // blocking call
//   Future f = client.submit(observation);               // or asynchronous
//   TensorDict same = f.result(std::chrono::seconds(1));
//
// Errors a result can raise: RemoteError (the policy failed: every request of its batch
// gets the original type name and message), ClosedError (the server was shut down, or
// its process died: raised within seconds, never a hang), TimeoutError (the request stays
// in flight and result() may be called again).
//
// Thread-safety: a Client may be shared by threads and copies share one connection. A
// Future is used by one thread at a time. Clients are fork-aware: a copy that finds
// itself in a forked child reconnects as a new client instead of acting as its parent.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorwire/core/tensordict.h"
#include "tensorwire/runtime/remote_error.h"

namespace tensorwire::inference {

using Clock = std::chrono::steady_clock;
// A timeout; a negative one means "no limit".
using Timeout = std::chrono::nanoseconds;
inline constexpr Timeout kNoTimeout{-1};

// The deadline `timeout` from now (time_point::max() for no limit).
Clock::time_point deadline_after(Timeout timeout) noexcept;

namespace detail {

// One in-flight request, as a transport sees it.
class Pending {
 public:
  virtual ~Pending() = default;  // a request dropped unread gives back what it holds
  // True once take() would not block.
  virtual bool ready() = 0;
  // Blocks until ready() or `deadline`; false on timeout. A server that is gone makes it
  // return true (take() then throws ClosedError).
  virtual bool wait(Clock::time_point deadline) = 0;
  // The outcome, once ready (called at most once): the response, or throws.
  virtual TensorDict take() = 0;
};

// A transport's client side.
class ClientImpl {
 public:
  virtual ~ClientImpl() = default;
  // Validates `td`, then enqueues it; blocks until it can be enqueued (a free slot), at
  // most until `deadline` (TimeoutError).
  virtual std::unique_ptr<Pending> submit(const TensorDict& td, Clock::time_point deadline) = 0;
  virtual const char* kind() const noexcept = 0;
  // The name another process attaches to (empty when clients cannot leave the process).
  virtual std::string address() const = 0;
  // The leaf keys a request must carry (depth-first, insertion order), when the
  // transport has a fixed request layout; std::nullopt when any structure goes.
  virtual std::optional<std::vector<Key>> request_keys() { return std::nullopt; }
};

}  // namespace detail

class Future {
 public:
  Future() = default;
  explicit Future(std::unique_ptr<detail::Pending> pending) : pending_(std::move(pending)) {}
  Future(Future&&) noexcept = default;
  Future& operator=(Future&&) noexcept = default;
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  bool valid() const noexcept { return pending_ || value_ || error_; }
  // True when result() would not block.
  bool done();
  // The response. Waits at most `timeout` (TimeoutError: still in flight, call again).
  // Reading the outcome releases what the request held (its shared-memory slot); later
  // calls return the same response (or throw the same error) again.
  TensorDict result(Timeout timeout = kNoTimeout);

 private:
  std::unique_ptr<detail::Pending> pending_;
  std::optional<TensorDict> value_;
  std::exception_ptr error_;
};

class Client {
 public:
  Client() = default;
  explicit Client(std::shared_ptr<detail::ClientImpl> impl) : impl_(std::move(impl)) {}

  // `timeout` bounds the wait for room to submit (all slots in flight).
  Future submit(const TensorDict& request, Timeout timeout = kNoTimeout);
  // submit + result under one deadline.
  TensorDict operator()(const TensorDict& request, Timeout timeout = kNoTimeout);

  bool valid() const noexcept { return impl_ != nullptr; }
  const char* kind() const;
  std::string address() const;
  const std::shared_ptr<detail::ClientImpl>& impl() const noexcept { return impl_; }

 private:
  std::shared_ptr<detail::ClientImpl> impl_;
};

}  // namespace tensorwire::inference
