#include "tensorwire/inference/thread_transport.h"

#include <condition_variable>
#include <deque>
#include <mutex>

#include "shm_region.h"
#include "stacking.h"

namespace tensorwire::inference {

namespace {

struct Request {
  TensorDict td;
  int64_t submitted_ns = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<TensorDict> response;
  std::exception_ptr error;

  void finish(std::optional<TensorDict> r, std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    response = std::move(r);
    error = std::move(e);
    done = true;
    cv.notify_all();
  }
};

}  // namespace

struct ThreadTransport::Shared {
  std::mutex mu;
  std::condition_variable work;
  std::deque<std::shared_ptr<Request>> queue;
  bool serving = false, stopped = false;
  uint64_t wakeups = 0;  // interrupt() count, so a wait can tell it was interrupted
  std::vector<std::shared_ptr<Request>> inflight;  // serving thread only: ids index this
};

namespace {

class ThreadPending final : public detail::Pending {
 public:
  explicit ThreadPending(std::shared_ptr<Request> r) : r_(std::move(r)) {}
  bool ready() override {
    std::lock_guard<std::mutex> lock(r_->mu);
    return r_->done;
  }
  bool wait(Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(r_->mu);
    if (deadline == Clock::time_point::max()) {
      r_->cv.wait(lock, [&] { return r_->done; });
      return true;
    }
    return r_->cv.wait_until(lock, deadline, [&] { return r_->done; });
  }
  TensorDict take() override {
    std::lock_guard<std::mutex> lock(r_->mu);
    if (r_->error) std::rethrow_exception(r_->error);
    return *r_->response;
  }

 private:
  std::shared_ptr<Request> r_;
};

class ThreadClient final : public detail::ClientImpl {
 public:
  explicit ThreadClient(std::shared_ptr<ThreadTransport::Shared> s) : s_(std::move(s)) {}
  std::unique_ptr<detail::Pending> submit(const TensorDict& td, Clock::time_point) override {
    auto r = std::make_shared<Request>();
    r->td = td.clone();
    r->submitted_ns = detail::now_ns();
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (s_->stopped) throw ClosedError("the inference server was shut down");
      s_->queue.push_back(r);
    }
    s_->work.notify_one();
    return std::make_unique<ThreadPending>(std::move(r));
  }
  const char* kind() const noexcept override { return "thread"; }
  std::string address() const override { return {}; }

 private:
  std::shared_ptr<ThreadTransport::Shared> s_;
};

}  // namespace

std::shared_ptr<ThreadTransport> ThreadTransport::create() {
  std::shared_ptr<ThreadTransport> t(new ThreadTransport());
  t->s_ = std::make_shared<Shared>();
  return t;
}

ThreadTransport::~ThreadTransport() {
  close_server("the thread transport was closed", true);
}

Client ThreadTransport::client() {
  return Client(std::make_shared<ThreadClient>(s_));
}

void ThreadTransport::open_server() {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (s_->serving) throw Error("another InferenceServer already serves this transport");
  s_->serving = true;
  s_->stopped = false;
}

void ThreadTransport::close_server(const std::string& reason, bool fail_pending) {
  std::deque<std::shared_ptr<Request>> pending;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stopped = true;
    if (fail_pending) {
      s_->serving = false;
      pending.swap(s_->queue);
    }
  }
  for (auto& r : pending) r->finish(std::nullopt, std::make_exception_ptr(ClosedError(reason)));
}

void ThreadTransport::wait_for_work(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(s_->mu);
  const uint64_t seen = s_->wakeups;
  auto ready = [&] { return !s_->queue.empty() || s_->wakeups != seen; };
  if (deadline == Clock::time_point::max())
    s_->work.wait(lock, ready);
  else
    s_->work.wait_until(lock, deadline, ready);
}

void ThreadTransport::interrupt() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    ++s_->wakeups;
  }
  s_->work.notify_all();
}

void ThreadTransport::drain(size_t max_items, Drained& out) {
  if (out.empty()) s_->inflight.clear();
  std::lock_guard<std::mutex> lock(s_->mu);
  while (max_items-- > 0 && !s_->queue.empty()) {
    out.ids.push_back(s_->inflight.size());
    out.submitted_ns.push_back(s_->queue.front()->submitted_ns);
    s_->inflight.push_back(std::move(s_->queue.front()));
    s_->queue.pop_front();
  }
}

void ThreadTransport::collate(const Drained& d, std::vector<Group>& groups) {
  std::vector<const TensorDict*> requests;
  requests.reserve(d.size());
  for (uint64_t id : d.ids) requests.push_back(&s_->inflight[id]->td);
  detail::group_and_stack(requests, groups);
}

void ThreadTransport::resolve(const Drained& d, const Group& g, const TensorDict& output,
                              const VersionStamp& stamp) {
  std::vector<TensorDict> rows = detail::split_output(output, g.rows.size(), stamp);
  for (size_t j = 0; j < rows.size(); ++j)
    s_->inflight[d.ids[g.rows[j]]]->finish(std::move(rows[j]), nullptr);
}

void ThreadTransport::reject(const Drained& d, std::span<const size_t> rows,
                             const RemoteError& error) {
  auto e = std::make_exception_ptr(error);
  for (size_t row : rows) s_->inflight[d.ids[row]]->finish(std::nullopt, e);
}

}  // namespace tensorwire::inference
