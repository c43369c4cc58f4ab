// InferenceServer: one thread that batches requests from a Transport and calls the
// policy once per batch.
//
//   auto transport = SharedMemoryTransport::create(request_spec, response_spec, {.num_slots = 64});
//   InferenceServer server([](TensorDict& batch) { return my_policy(batch); }, transport,
//                          {.max_batch_size = 64});
//   server.start();
//   ... clients from any process: transport->client(), SharedMemoryTransport::client_for(name)
//   server.shutdown();
//
// The serving loop (torchrl's): wait for work, drain up to max_batch_size requests; if
// fewer than min_batch_size arrived, keep draining for up to `timeout`; build the batch,
// call the policy once, answer every request. An exception from the policy fails every
// request of that batch (clients get its type name and message) and the server keeps
// serving. At shutdown, requests not yet served fail with ClosedError("InferenceServer is
// shutting down.") and later submits fail at once.
//
// Thread-safety: every method may be called from any thread. The policy is only ever
// called from the serving thread, never concurrently with an update_model() function.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tensorwire/inference/transport.h"

namespace tensorwire::inference {

// Takes a batch (leading dim = number of requests) and returns a TensorDict with the same
// leading dim holding at least the response keys. The batch may be a view of shared
// memory that later batches reuse: keep a copy (clone()) of anything needed after the
// call returns.
using Policy = std::function<TensorDict(const TensorDict& batch)>;

struct ServerOptions {
  int64_t max_batch_size = 64;  // 1 to kMaxSlots (transport.h)
  int64_t min_batch_size = 1;   // 1 to max_batch_size
  std::chrono::nanoseconds timeout = std::chrono::milliseconds(10);
  // With several transports: the share of the requests each transport whose actors are
  // asking is kept at, at least (0 to 1; at most an equal share each). 0: none kept, a
  // batch leaves with what is there (the most throughput; actors with a shorter round trip
  // get more). Above 0 a batch waits for a transport below its share, up to `timeout` and
  // a few of that transport's usual intervals: meant for actors that call in a loop, whose
  // pace is their round trip (docs/inference.md, "Several transports").
  double min_transport_share = 0;
  int64_t stats_window_size = 1024;  // >= 1: samples kept for the percentiles
  // Responses get this key set to the policy version: always for the transports without
  // a spec, and where the response spec declares it for the shared-memory transport.
  std::optional<Key> policy_version_key = Key("policy_version");
  int64_t policy_version = 0;
};

struct ServerStats {
  uint64_t requests = 0;
  uint64_t batches = 0;
  double requests_per_s = 0;
  double batches_per_s = 0;
  double avg_batch_size = 0;  // of the last stats_window_size batches (as the percentiles)
  double p50_queue_ms = 0, p95_queue_ms = 0;      // submit -> batch start
  double p50_forward_ms = 0, p95_forward_ms = 0;  // the policy calls of a batch
  int64_t policy_version = 0;
  uint64_t weight_updates = 0;
};

class InferenceServer {
 public:
  // ValueError for max_batch_size < 1, min_batch_size outside [1, max_batch_size],
  // min_transport_share outside [0, 1], stats_window_size < 1 or a negative timeout.
  InferenceServer(Policy policy, std::shared_ptr<Transport> transport, ServerOptions options = {});
  // Serves several transports as one (e.g. a SharedMemoryTransport for local actors and a
  // RemoteTransport for actors on other hosts): each batch takes from every transport
  // fairly, requests of equal structure share one policy call, and each answer goes back by
  // the transport its request came through. The batching timeout applies to all.
  // ValueError for no transport, a null one, or one given twice.
  InferenceServer(Policy policy, std::vector<std::shared_ptr<Transport>> transports,
                  ServerOptions options = {});
  ~InferenceServer();  // shutdown()
  InferenceServer(const InferenceServer&) = delete;
  InferenceServer& operator=(const InferenceServer&) = delete;

  // Starts the serving thread. Error when already running or when the transport is
  // served by another server (or cannot be served from this process).
  void start();
  // Stops serving and waits up to `timeout` for the serving thread (a policy call in
  // progress finishes first). Returns false if it did not stop in time; it then stops
  // after that call, and the destructor waits for it.
  bool shutdown(Timeout timeout = std::chrono::seconds(5));
  bool running() const noexcept;

  // Runs `fn` between batches (never during a policy call) and, when `mark`, bumps the
  // policy version. Returns after `fn` returned; an exception from fn propagates and
  // leaves the version as it was. Waits up to `timeout` for a policy call in progress:
  // TimeoutError when it still runs then (fn not run, the version as it was); the wait is
  // interruptible (check_interrupt). Error when called from the policy itself.
  void update_model(const std::function<void()>& fn, bool mark = true,
                    Timeout timeout = Timeout::forever());
  int64_t policy_version() const noexcept;
  ServerStats stats(bool reset = false);

  Client client();
  const std::shared_ptr<Transport>& transport() const noexcept;
  const ServerOptions& options() const noexcept;

 private:
  void join_worker();  // under the start/shutdown lock
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tensorwire::inference
