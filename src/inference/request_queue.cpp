#include "request_queue.h"

#include "stacking.h"

namespace tensorwire::inference::detail {

void RequestQueue::open_server() {
  std::lock_guard<std::mutex> lock(mu_);
  if (serving_) throw Error("another InferenceServer already serves this transport");
  serving_ = true;
  stopped_before_open_ = stopped_;
  stopped_ = false;
}

void RequestQueue::release_server() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  serving_ = false;
  stopped_ = stopped_before_open_;
}

void RequestQueue::close_server(const std::string& reason, bool fail_pending) {
  std::deque<std::shared_ptr<QueuedRequest>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    stop_reason_ = reason;
    if (fail_pending) {
      serving_ = false;
      pending.swap(queue_);
    }
  }
  for (auto& r : pending) r->fail_closed(reason);
}

std::optional<std::string> RequestQueue::push(std::shared_ptr<QueuedRequest> r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return stop_reason_;
    queue_.push_back(std::move(r));
  }
  work_.notify_one();
  notifier_.notify();
  return std::nullopt;
}

bool RequestQueue::has_work() {
  std::lock_guard<std::mutex> lock(mu_);
  return !queue_.empty();
}

void RequestQueue::wait_for_work(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t seen = wakeups_;
  auto ready = [&] { return !queue_.empty() || wakeups_ != seen; };
  if (deadline.is_never())
    work_.wait(lock, ready);
  else
    work_.wait_until(lock, deadline.when(), ready);
}

void RequestQueue::interrupt() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++wakeups_;
  }
  work_.notify_all();
}

void RequestQueue::drain(size_t max_items, Drained& out) {
  if (out.empty()) inflight_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  while (max_items > 0 && !queue_.empty()) {
    std::shared_ptr<QueuedRequest> r = std::move(queue_.front());
    queue_.pop_front();
    if (r->gone()) continue;  // nobody to answer
    out.ids.push_back(inflight_.size());
    out.submitted_ns.push_back(r->submitted_ns);
    inflight_.push_back(std::move(r));
    --max_items;
  }
}

void RequestQueue::collate(const Drained& d, std::vector<Group>& groups) {
  std::vector<const TensorDict*> requests;
  requests.reserve(d.size());
  for (uint64_t id : d.ids) requests.push_back(&inflight_[id]->td);
  group_and_stack(requests, groups);
}

void RequestQueue::resolve(const Drained& d, const Group& g, const TensorDict& output,
                           const VersionStamp& stamp) {
  std::vector<TensorDict> rows = split_output(output, g.rows.size(), stamp);
  for (size_t j = 0; j < rows.size(); ++j) inflight_[d.ids[g.rows[j]]]->answer(std::move(rows[j]));
}

void RequestQueue::reject(const Drained& d, std::span<const size_t> rows,
                          const RemoteError& error) {
  for (size_t row : rows) inflight_[d.ids[row]]->fail(error);
}

}  // namespace tensorwire::inference::detail
