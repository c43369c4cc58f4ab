// Transport: how requests reach an InferenceServer and responses go back.
//
// Three implementations share this interface and the client API (client.h):
//   SharedMemoryTransport  fixed request/response layout; slot banks in shared memory,
//                          only slot indices and control words cross processes
//   SocketTransport        any structure, across processes: the wire codec over a Unix
//                          socket (the role of torchrl's MPTransport)
//   ThreadTransport        any structure, within one process
//
// The server side below is driven by one InferenceServer. Its cycle:
//   wait_for_work -> drain (maybe several times, for min_batch_size) -> collate ->
//   policy(group.input) -> resolve (or reject) each group
// A transport never calls the policy and never holds a lock while the policy runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensorwire/inference/client.h"

namespace tensorwire::inference {

// The most slots a transport with a slot bank has (shared-memory and remote; a client refuses
// a larger count from its server).
inline constexpr int64_t kMaxSlots = int64_t{1} << 24;

// The requests one drain took: transport-specific handles and when each was submitted.
// Reused from batch to batch (cleared, not reallocated).
struct Drained {
  std::vector<uint64_t> ids;
  std::vector<int64_t> submitted_ns;  // steady_clock nanoseconds at submit (0 = unknown)
  size_t size() const noexcept { return ids.size(); }
  bool empty() const noexcept { return ids.empty(); }
  void clear() noexcept {
    ids.clear();
    submitted_ns.clear();
  }
};

// One policy call: the batched input and, for each of its rows, the position in Drained
// of the request the row answers. The input is shared so a transport can hand out the
// same (cached) view of its memory batch after batch without rebuilding it.
struct Group {
  std::shared_ptr<const TensorDict> input;
  std::vector<size_t> rows;
};

// How the server marks responses with the version of the policy that made them.
struct VersionStamp {
  const Key* key = nullptr;  // nullptr: no stamping
  int64_t version = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* kind() const noexcept = 0;  // "shared_memory", "socket", "thread"
  // A new client; see client.h. ClosedError once the transport is closed.
  virtual Client client() = 0;
  // `num_clients` new clients (ValueError when it is below 1).
  std::vector<Client> clients(int64_t num_clients);
  // Closes the transport: requests not yet served fail with ClosedError, and every later
  // submit (from any client, in any process), client() and InferenceServer::start() throw
  // ClosedError. A SocketTransport's client already connected hears of it from its
  // connection, at its next result(): a submit in between may still be taken, and its
  // result() throws ClosedError. A server still running idles until it is shut down.
  // Idempotent.
  void close();
  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  // --- server side: called by InferenceServer only ---------------------------------
  // open_server/close_server run on the thread that starts/stops the server; the rest
  // on the serving thread, except interrupt(), which any thread may call.

  // Claims the transport for one server. Throws Error when another server holds it or
  // this process cannot serve it (an attached SharedMemoryTransport).
  virtual void open_server() = 0;
  // Marks the server gone: new submits fail with ClosedError. With `fail_pending`,
  // also fails every request not yet drained with ClosedError(reason) and gives up the
  // server's claim (the serving thread does this once it has stopped; until then
  // open_server() refuses another server, also after a shutdown that timed out).
  virtual void close_server(const std::string& reason, bool fail_pending) = 0;
  // Undoes open_server() when the server does not start after all (another of its
  // transports refused it): the claim is given up and the transport is as it was before,
  // its pending requests kept for a server to come.
  virtual void release_server() noexcept = 0;
  // Returns when a drain may find work, at `deadline`, or after interrupt().
  virtual void wait_for_work(Deadline deadline) = 0;
  virtual void interrupt() = 0;
  // Whether a drain would find a request now: a check, never a wait.
  virtual bool has_work() = 0;
  // For a server of several transports, which sleeps on one of them: `on_work` is called
  // (from any thread of this process, after has_work() turned true) each time a request
  // becomes ready here, so that it can interrupt() the one it sleeps on; nullptr removes it.
  // Returns false when this transport cannot do that because other processes make its
  // requests ready (shared memory): the server then sleeps on it.
  virtual bool notify_work(std::function<void()> on_work) = 0;
  // Appends up to `max_items` requests to `out` without blocking.
  virtual void drain(size_t max_items, Drained& out) = 0;
  // Builds the policy inputs for everything in `drained` (one group per structure; a
  // fixed-layout transport makes exactly one). `groups` is reused between calls.
  virtual void collate(const Drained& drained, std::vector<Group>& groups) = 0;
  // Answers every row of `group` from `output` (the policy's result for group.input).
  // Validates the whole output first: on error it throws and answers nothing, so the
  // caller can reject the group instead.
  virtual void resolve(const Drained& drained, const Group& group, const TensorDict& output,
                       const VersionStamp& stamp) = 0;
  // Fails the given positions of `drained` with `error`.
  virtual void reject(const Drained& drained, std::span<const size_t> rows,
                      const RemoteError& error) = 0;

 protected:
  // ClosedError naming the transport when it was closed.
  void check_open() const;

 private:
  std::atomic<bool> closed_{false};
};

}  // namespace tensorwire::inference
