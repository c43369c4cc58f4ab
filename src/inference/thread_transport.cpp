#include "tensorwire/inference/thread_transport.h"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "client_impl.h"
#include "os/fork.h"
#include "request_queue.h"
#include "shm_region.h"

namespace tensorwire::inference {

namespace {

// A request and its outcome; the client's Pending waits on it.
class ThreadRequest final : public detail::QueuedRequest {
 public:
  void answer(TensorDict response) override { finish(std::move(response), nullptr); }
  void fail(const RemoteError& error) override {
    finish(std::nullopt, std::make_exception_ptr(error));
  }
  void fail_closed(const std::string& reason) override {
    finish(std::nullopt, std::make_exception_ptr(ClosedError(reason)));
  }

  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  bool wait(Deadline slice) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, slice.when(), [&] { return done_; });
  }
  TensorDict take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    return *response_;
  }

 private:
  void finish(std::optional<TensorDict> r, std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu_);
    response_ = std::move(r);
    error_ = std::move(e);
    done_ = true;
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::optional<TensorDict> response_;
  std::exception_ptr error_;
};

class ThreadPending final : public detail::Pending {
 public:
  explicit ThreadPending(std::shared_ptr<ThreadRequest> r) : r_(std::move(r)) {}
  // A forked child's copy is done at once, and take() says why: no thread of the child
  // answers it (a wait hung for ever), and its mutex may have been held at the fork.
  bool ready() override { return stale() || r_->done(); }
  bool wait(Deadline slice) override { return stale() || r_->wait(slice); }
  TensorDict take() override {
    if (stale())
      throw detail::made_before_fork(
          "the ThreadTransport's server thread is in the parent process");
    return r_->take();
  }

 private:
  bool stale() const noexcept { return generation_ != os::fork_generation(); }
  std::shared_ptr<ThreadRequest> r_;
  uint64_t generation_ = os::fork_generation();
};

}  // namespace

struct ThreadTransport::Shared {
  detail::RequestQueue queue;
  uint64_t generation = os::fork_generation();

  // Its server thread lives in the process that made it: a forked child's copy cannot be
  // served or answered.
  void check_here() const {
    if (generation != os::fork_generation())
      throw ClosedError(
          "this ThreadTransport (or its client) was made before a fork: it serves threads of "
          "the parent process only; use a SharedMemoryTransport or SocketTransport across "
          "processes");
  }
};

namespace {

class ThreadClient final : public detail::ClientImpl {
 public:
  explicit ThreadClient(std::shared_ptr<ThreadTransport::Shared> s) : s_(std::move(s)) {}
  std::unique_ptr<detail::Pending> submit(const TensorDict& td, Deadline) override {
    if (closed_.load(std::memory_order_acquire)) throw ClosedError("the client was closed");
    s_->check_here();
    auto r = std::make_shared<ThreadRequest>();
    r->td = td.clone();  // the caller may reuse its buffers at once
    r->submitted_ns = detail::now_ns();
    if (auto refused = s_->queue.push(r)) throw ClosedError(*refused);
    return std::make_unique<ThreadPending>(std::move(r));
  }
  const char* kind() const noexcept override { return "thread"; }
  std::string address() const override { return {}; }
  void close() noexcept override { closed_.store(true, std::memory_order_release); }

 private:
  std::shared_ptr<ThreadTransport::Shared> s_;
  std::atomic<bool> closed_{false};
};

}  // namespace

std::shared_ptr<ThreadTransport> ThreadTransport::create() {
  std::shared_ptr<ThreadTransport> t(new ThreadTransport());
  t->s_ = std::make_shared<Shared>();
  return t;
}

ThreadTransport::~ThreadTransport() {
  if (s_->generation != os::fork_generation()) {  // the parent's requests, not ours
    os::leak(std::move(s_));
    return;
  }
  close_server("the thread transport was closed", true);
}

Client ThreadTransport::client() {
  check_open();
  s_->check_here();
  return Client(std::make_shared<ThreadClient>(s_));
}

void ThreadTransport::open_server() {
  s_->check_here();
  s_->queue.open_server();
}
void ThreadTransport::release_server() noexcept {
  s_->queue.release_server();
}
void ThreadTransport::close_server(const std::string& reason, bool fail_pending) {
  s_->queue.close_server(reason, fail_pending);
}
void ThreadTransport::wait_for_work(Deadline deadline) {
  s_->queue.wait_for_work(deadline);
}
void ThreadTransport::interrupt() {
  s_->queue.interrupt();
}
bool ThreadTransport::has_work() {
  return s_->queue.has_work();
}
bool ThreadTransport::notify_work(std::function<void()> on_work) {
  s_->queue.notify_work(std::move(on_work));
  return true;
}
void ThreadTransport::drain(size_t max_items, Drained& out) {
  s_->queue.drain(max_items, out);
}
void ThreadTransport::collate(const Drained& d, std::vector<Group>& groups) {
  s_->queue.collate(d, groups);
}
void ThreadTransport::resolve(const Drained& d, const Group& g, const TensorDict& output,
                              const VersionStamp& stamp) {
  s_->queue.resolve(d, g, output, stamp);
}
void ThreadTransport::reject(const Drained& d, std::span<const size_t> rows,
                             const RemoteError& error) {
  s_->queue.reject(d, rows, error);
}

}  // namespace tensorwire::inference
