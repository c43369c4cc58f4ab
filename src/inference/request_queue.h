// The server side of the transports without a fixed layout (thread, socket), written once:
// requests queued under a mutex, drained in batches, grouped by structure and stacked
// (stacking.h), answered one by one through the request's own reply path.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tensorwire/inference/transport.h"
#include "work_notifier.h"

namespace tensorwire::inference::detail {

// One queued request and where its answer goes.
class QueuedRequest {
 public:
  virtual ~QueuedRequest() = default;
  // True when nobody waits for the answer any more (its client is gone): drain skips it.
  virtual bool gone() const noexcept { return false; }
  virtual void answer(TensorDict response) = 0;
  virtual void fail(const RemoteError& error) = 0;
  // The server stopped before serving it: the client gets ClosedError(reason).
  virtual void fail_closed(const std::string& reason) = 0;

  TensorDict td;
  int64_t submitted_ns = 0;
};

class RequestQueue {
 public:
  // Claims the queue for one server (Error when another holds it).
  void open_server();
  // Refuses new requests from now on; with `fail_pending`, also fails every queued one
  // with ClosedError(reason) and lets a new server open it.
  void close_server(const std::string& reason, bool fail_pending);
  // Undoes open_server(): unclaimed, and refusing requests again only if it did before.
  void release_server() noexcept;
  // Queues `r`. When the server was shut down, returns why (r is not queued).
  std::optional<std::string> push(std::shared_ptr<QueuedRequest> r);

  // Transport's server side (transport.h), called by the serving thread.
  void wait_for_work(Deadline deadline);
  void interrupt();
  bool has_work();
  void notify_work(std::function<void()> on_work) { notifier_.set(std::move(on_work)); }
  void drain(size_t max_items, Drained& out);
  void collate(const Drained& d, std::vector<Group>& groups);
  void resolve(const Drained& d, const Group& g, const TensorDict& output,
               const VersionStamp& stamp);
  void reject(const Drained& d, std::span<const size_t> rows, const RemoteError& error);

 private:
  std::mutex mu_;
  std::condition_variable work_;
  WorkNotifier notifier_;
  std::deque<std::shared_ptr<QueuedRequest>> queue_;
  bool serving_ = false, stopped_ = false;
  bool stopped_before_open_ = false;  // for release_server()
  std::string stop_reason_ = "the inference server was shut down";
  uint64_t wakeups_ = 0;  // interrupt() count, so a wait can tell it was interrupted
  std::vector<std::shared_ptr<QueuedRequest>> inflight_;  // serving thread only: ids index it
};

}  // namespace tensorwire::inference::detail
