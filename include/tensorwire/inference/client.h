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
// its process died: raised within seconds, never a hang; also every use of a closed
// client; its subclass ConnectionRefused when nothing listens where the client connects,
// such as a transport that was destroyed), TimeoutError (the request stays in flight and result()
// may be called again), Interrupted (the process's interrupt check fired: Ctrl-C in Python; the
// request stays in flight too). Every wait is interruptible (runtime/interrupt.h).
//
// Thread-safety: a Client may be shared by threads and copies share one connection. A
// Future's result() may be called by several threads: a second caller waits for the first
// (interruptibly, within its own timeout) and gets the same response. Clients are
// fork-aware: a copy that finds itself in a forked child reconnects as a new client instead
// of acting as its parent.
#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorwire/core/tensordict.h"
#include "tensorwire/runtime/remote_error.h"
#include "tensorwire/runtime/timeout.h"

namespace tensorwire::inference {

namespace detail {
class Pending;
class ClientImpl;
struct FutureSync;  // client.cpp
}  // namespace detail

class Future {
 public:
  Future() noexcept;
  explicit Future(std::unique_ptr<detail::Pending> pending);
  Future(Future&&) noexcept;
  Future& operator=(Future&&) noexcept;
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;
  ~Future();  // a request dropped unread gives back its slot

  // Every Future made from a request has sync_ (only default and moved-from ones lack it).
  bool valid() const noexcept { return sync_ != nullptr; }
  // True when result() would not block. Safe while another thread is in result(): then it
  // says whether that thread has read the outcome yet.
  bool done();
  // The response. Waits at most `timeout`; on TimeoutError or Interrupted the request
  // stays in flight and result() may be called again. Reading the outcome releases what
  // the request held (its shared-memory slot); later calls return the same response (or
  // throw the same error) again.
  TensorDict result(Timeout timeout = Timeout::forever());
  // "pending", "done", "failed" or "empty" (for reprs and logs); as safe as done().
  const char* state();

 private:
  std::unique_ptr<detail::Pending> pending_;
  // The lock held by the thread in result() and the outcome it published; on the heap so
  // that a Future stays movable.
  std::unique_ptr<detail::FutureSync> sync_;
  std::optional<TensorDict> value_;
  std::exception_ptr error_;
};

// One leaf a request of a fixed-layout transport must carry.
struct RequestLeaf {
  Key key;
  DType dtype;
  Shape shape;
};

class Client {
 public:
  Client() = default;
  // Made by transports (transport.h); a user never makes a ClientImpl.
  explicit Client(std::shared_ptr<detail::ClientImpl> impl) noexcept : impl_(std::move(impl)) {}

  // `timeout` bounds the wait for room to submit (all slots in flight).
  Future submit(const TensorDict& request, Timeout timeout = Timeout::forever());
  // submit + result under one deadline. On TimeoutError or Interrupted the request is
  // abandoned (its slot is given back once the server is done with it).
  TensorDict operator()(const TensorDict& request, Timeout timeout = Timeout::forever());

  bool valid() const noexcept { return impl_ != nullptr; }
  const char* kind() const;
  // The name another process attaches to; empty for a ThreadTransport's clients.
  std::string address() const;
  // The leaf keys a request must carry (depth-first, insertion order) when the transport
  // has a fixed request layout (shared memory, remote: the first use connects, within
  // `timeout`); std::nullopt when any structure goes.
  std::optional<std::vector<Key>> request_keys(Timeout timeout = Timeout::forever()) const;
  // The same with each leaf's dtype and shape (the spec's: what a request must carry).
  std::optional<std::vector<RequestLeaf>> request_leaves(
      Timeout timeout = Timeout::forever()) const;
  // Disconnects this client and every copy of it; later calls throw ClosedError. Futures
  // already made keep their requests.
  void close() noexcept;

 private:
  std::shared_ptr<detail::ClientImpl> impl_;
};

}  // namespace tensorwire::inference
