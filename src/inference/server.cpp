#include "tensorwire/inference/server.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "multi_transport.h"
#include "os/fork.h"
#include "runtime/timed_lock.h"
#include "runtime/wait.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::inference {

namespace {

// A fixed-capacity window of recent samples (allocated once).
class Window {
 public:
  explicit Window(size_t capacity) : v_(std::max<size_t>(capacity, 1)) {}
  void add(double x) noexcept {
    v_[next_] = x;
    next_ = (next_ + 1) % v_.size();
    n_ = std::min(n_ + 1, v_.size());
  }
  void clear() noexcept { next_ = n_ = 0; }
  // Nearest rank, sorted[round((n - 1) p)], as torchrl computes it.
  double percentile(double p) const {
    if (n_ == 0) return 0;
    std::vector<double> s(v_.begin(), v_.begin() + static_cast<std::ptrdiff_t>(n_));
    std::sort(s.begin(), s.end());
    return s[static_cast<size_t>(static_cast<double>(n_ - 1) * p + 0.5)];
  }
  double mean() const {
    if (n_ == 0) return 0;
    double sum = 0;
    for (size_t i = 0; i < n_; ++i) sum += v_[i];
    return sum / static_cast<double>(n_);
  }

 private:
  std::vector<double> v_;
  size_t next_ = 0, n_ = 0;
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

struct InferenceServer::State {
  Policy policy;
  std::shared_ptr<Transport> transport;
  ServerOptions options;

  // start() and shutdown() one at a time, whichever threads call them (the worker below is
  // theirs); shutdown() waits for it no longer than its timeout.
  runtime::TimedLock lifecycle_mu;
  std::thread worker;
  std::atomic<bool> stop{false};
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool finished = true;
  bool started = false;            // under done_mu: a worker was started and not joined yet
  uint64_t worker_generation = 0;  // under done_mu
  // The process that started a worker (0: none yet). Atomic, read without done_mu: a
  // forked child's copy of that mutex may be locked for ever.
  std::atomic<int> started_by{0};

  // A forked child's copy of a server started by its parent: the serving thread, the model
  // and the batches are the parent's. What would act on them is refused here, naming the
  // fork (a copy would run `update_model` on the child's policy and say nothing). Quiet
  // calls (is_alive, shutdown, close: an exit hook's) stay quiet.
  void refuse_if_inherited(const char* what) const {
    const int by = started_by.load(std::memory_order_acquire);
    if (by != 0 && by != ::getpid())
      throw ClosedError(std::string("InferenceServer.") + what +
                        "(): this server serves in process " + std::to_string(by) +
                        "; a forked child cannot use it (make a new one here)");
  }

  // Held during each batch's policy calls and by update_model (which may give up waiting).
  runtime::TimedLock model_mu;
  // The thread in a policy call, while it holds model_mu: update_model() from there (the
  // policy itself) would wait for itself.
  std::atomic<std::thread::id> in_policy{};
  std::atomic<int64_t> version{0};

  std::mutex stats_mu;
  Clock::time_point stats_since = Clock::now();
  uint64_t requests = 0, batches = 0, weight_updates = 0;
  Window batch_sizes, queue_ms, forward_ms;

  explicit State(size_t window) : batch_sizes(window), queue_ms(window), forward_ms(window) {}

  void run();
  // The serving thread ended mid-loop: fails what it drained and what is pending.
  void abandon(Drained& d) noexcept;
  std::vector<TensorDict> outputs;                 // serving thread: one per group
  std::vector<std::optional<RemoteError>> errors;  // serving thread: one per group

  void serve(Drained& d, std::vector<Group>& groups);
  void record(const Drained& d, Clock::time_point start, Clock::time_point forward_start,
              Clock::time_point forward_end);
};

void InferenceServer::State::run() {
  Drained d;
  // Run however the thread ends: also when the policy ends it (pthread_exit, as CPython
  // does at exit), which leaves the batch drained and unanswered and the loop's own ending
  // (below) not run.
  bool ended = false;
  struct Ending {
    State* s;
    Drained& d;
    const bool& ended;
    ~Ending() {
      if (!ended) s->abandon(d);
      std::lock_guard<std::mutex> lock(s->done_mu);
      s->finished = true;
      s->done_cv.notify_all();
    }
  } ending{this, d, ended};
  const auto max_batch = static_cast<size_t>(options.max_batch_size);  // checked: >= 1
  const auto min_batch = static_cast<size_t>(options.min_batch_size);
  d.ids.reserve(std::min<size_t>(max_batch, 1024));  // they grow to a larger batch once
  d.submitted_ns.reserve(std::min<size_t>(max_batch, 1024));
  std::vector<Group> groups;
  while (!stop.load(std::memory_order_acquire)) {
    try {
      transport->wait_for_work(Deadline::after(options.timeout));
      if (stop.load(std::memory_order_acquire)) break;
      d.clear();
      transport->drain(max_batch, d);
      if (d.empty()) continue;
      if (d.size() < min_batch) {
        const Deadline deadline = Deadline::after(options.timeout);
        while (d.size() < min_batch && !deadline.passed() &&
               !stop.load(std::memory_order_acquire)) {
          transport->wait_for_work(deadline);
          transport->drain(max_batch - d.size(), d);
        }
      }
      serve(d, groups);
    } catch (const std::exception& e) {
      // Not the policy's fault (serve() catches those): a transport failure. Fail what
      // was drained and keep serving.
      log_message(LogLevel::Error, std::string("InferenceServer: ") + e.what());
      if (!d.empty()) {
        std::vector<size_t> all(d.size());
        for (size_t k = 0; k < all.size(); ++k) all[k] = k;
        try {
          transport->reject(d, all, RemoteError(describe_exception(std::current_exception())));
        } catch (...) {
        }
        d.clear();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  try {
    transport->close_server("InferenceServer is shutting down.", true);
  } catch (const std::exception& e) {
    log_message(LogLevel::Error, std::string("InferenceServer shutdown: ") + e.what());
  }
  ended = true;
}

void InferenceServer::State::abandon(Drained& d) noexcept {
  try {
    if (!d.empty()) {
      std::vector<size_t> all(d.size());
      for (size_t k = 0; k < all.size(); ++k) all[k] = k;
      transport->reject(d, all,
                        RemoteError("ClosedError",
                                    "the InferenceServer's serving thread ended "
                                    "during the policy call"));
    }
    transport->close_server("InferenceServer's serving thread ended.", true);
  } catch (const std::exception& e) {
    log_message(LogLevel::Error, std::string("InferenceServer: ") + e.what());
  }
}

void InferenceServer::State::serve(Drained& d, std::vector<Group>& groups) {
  const auto start = Clock::now();
  try {
    transport->collate(d, groups);
  } catch (...) {
    std::vector<size_t> all(d.size());
    for (size_t k = 0; k < all.size(); ++k) all[k] = k;
    transport->reject(d, all, RemoteError(describe_exception(std::current_exception())));
    d.clear();
    return;
  }
  // The policy runs for every group first; stats are recorded before any response goes
  // out (as torchrl does), so a client that has its answer also sees it counted.
  outputs.resize(groups.size());
  errors.resize(groups.size());
  Clock::time_point forward_start, forward_end;
  VersionStamp stamp;
  {
    std::lock_guard<runtime::TimedLock> lock(model_mu);
    // Cleared however the calls end (a policy may end the thread: then a later thread with
    // the same id would be taken for the policy by update_model()).
    struct InPolicy {
      std::atomic<std::thread::id>& id;
      ~InPolicy() { id = std::thread::id(); }
    } in_policy_until_done{in_policy};
    in_policy = std::this_thread::get_id();
    if (options.policy_version_key) stamp.key = &*options.policy_version_key;
    stamp.version = version.load(std::memory_order_relaxed);
    forward_start = Clock::now();
    for (size_t k = 0; k < groups.size(); ++k) {
      errors[k].reset();
      try {
        outputs[k] = policy(*groups[k].input);
      } catch (...) {
        // No C++ exception: pthread_exit's unwinding (Python ending the thread at exit),
        // which must go on (the thread ends). Told apart this way rather than by catching
        // abi::__forced_unwind&, a reference UBSan sees bound to null.
        std::exception_ptr e = std::current_exception();
        if (!e) throw;
        errors[k] = RemoteError(describe_exception(e));
      }
    }
    forward_end = Clock::now();
  }
  record(d, start, forward_start, forward_end);
  for (size_t k = 0; k < groups.size(); ++k) {
    if (!errors[k]) {
      try {
        transport->resolve(d, groups[k], outputs[k], stamp);
      } catch (...) {
        errors[k] = RemoteError(describe_exception(std::current_exception()));
      }
    }
    if (errors[k]) transport->reject(d, groups[k].rows, *errors[k]);
    outputs[k] = TensorDict();
  }
  d.clear();  // all answered
}

void InferenceServer::State::record(const Drained& d, Clock::time_point start,
                                    Clock::time_point forward_start,
                                    Clock::time_point forward_end) {
  const int64_t start_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(stats_mu);
  requests += d.size();
  ++batches;
  batch_sizes.add(static_cast<double>(d.size()));
  for (int64_t t : d.submitted_ns)
    if (t > 0) queue_ms.add(static_cast<double>(std::max<int64_t>(start_ns - t, 0)) / 1e6);
  forward_ms.add(ms_between(forward_start, forward_end));
}

namespace {

// The options' rules, checked before anything is allocated from them.
const ServerOptions& checked(const ServerOptions& o) {
  // At most what a transport holds in flight: sys.maxsize ("no limit") is refused here,
  // not by an allocation on the serving thread.
  if (o.max_batch_size < 1 || o.max_batch_size > kMaxSlots)
    throw ValueError("max_batch_size must be in [1, " + std::to_string(kMaxSlots) + "], got " +
                     std::to_string(o.max_batch_size));
  if (o.min_batch_size < 1 || o.min_batch_size > o.max_batch_size)
    throw ValueError(
        "min_batch_size must be in [1, max_batch_size=" + std::to_string(o.max_batch_size) +
        "], got " + std::to_string(o.min_batch_size));
  if (!(o.min_transport_share >= 0 && o.min_transport_share <= 1))  // NaN too
    throw ValueError("min_transport_share must be in [0, 1], got " +
                     (std::ostringstream() << o.min_transport_share).str());
  if (o.stats_window_size < 1)
    throw ValueError("stats_window_size must be at least 1, got " +
                     std::to_string(o.stats_window_size));
  if (o.timeout.count() < 0) throw ValueError("timeout must not be negative");
  // Else every response would fail at the stamp, long after the mistake.
  if (const auto& key = o.policy_version_key;
      key &&
      (key->size() == 0 || std::any_of(key->parts().begin(), key->parts().end(),
                                       [](const std::string& part) { return part.empty(); })))
    throw ValueError("policy_version_key must be a key of non-empty names (or none), got " +
                     key->str());
  return o;
}

}  // namespace

InferenceServer::InferenceServer(Policy policy, std::shared_ptr<Transport> transport,
                                 ServerOptions options)
    : s_(std::make_unique<State>(static_cast<size_t>(checked(options).stats_window_size))) {
  if (!policy) throw ValueError("InferenceServer: the policy is empty");
  if (!transport) throw ValueError("InferenceServer: the transport is null");
  s_->policy = std::move(policy);
  s_->transport = std::move(transport);
  s_->version = options.policy_version;
  s_->options = std::move(options);
}

namespace {
std::shared_ptr<Transport> served(std::vector<std::shared_ptr<Transport>> transports,
                                  const ServerOptions& options) {
  if (transports.size() == 1 && transports[0]) return std::move(transports[0]);
  // The options are checked by the constructor this one delegates to.
  return std::make_shared<detail::MultiTransport>(std::move(transports),
                                                  options.min_transport_share, options.timeout);
}
}  // namespace

InferenceServer::InferenceServer(Policy policy, std::vector<std::shared_ptr<Transport>> transports,
                                 ServerOptions options)
    // `options` copied, not moved: the arguments are made in no set order, and served()
    // reads them.
    : InferenceServer(std::move(policy), served(std::move(transports), options), options) {}

InferenceServer::~InferenceServer() {
  if (s_->worker.joinable() && s_->worker_generation != os::fork_generation()) {
    new std::thread(std::move(s_->worker));  // a forked copy: the thread is the parent's
    return;
  }
  try {
    shutdown(Timeout::forever());
  } catch (...) {
    // Interrupted: the serving thread stops anyway (stop is set); the join below waits.
  }
  if (s_->worker.joinable()) s_->worker.join();
}

void InferenceServer::start() {
  std::lock_guard<runtime::TimedLock> life(s_->lifecycle_mu);
  if (running()) throw Error("the InferenceServer is already running");
  if (s_->worker.joinable()) join_worker();  // finished earlier
  if (s_->transport->closed())
    throw ClosedError(std::string("cannot start an InferenceServer on a closed ") +
                      s_->transport->kind() + " transport");
  s_->transport->open_server();
  s_->stop = false;
  auto set_started = [&](bool started) {
    std::lock_guard<std::mutex> lock(s_->done_mu);
    s_->finished = !started;  // before the thread runs: it sets finished when it ends
    s_->started = started;
    s_->worker_generation = os::fork_generation();
    s_->started_by.store(::getpid(), std::memory_order_release);
  };
  set_started(true);
  try {
    s_->worker = std::thread([s = s_.get()] { s->run(); });
  } catch (...) {
    set_started(false);
    s_->transport->release_server();  // no thread: the transport is as it was
    throw;
  }
}

void InferenceServer::join_worker() {
  s_->worker.join();
  std::lock_guard<std::mutex> lock(s_->done_mu);
  s_->started = false;
}

bool InferenceServer::shutdown(Timeout timeout) {
  // It waits for the serving thread to end, which would be the caller: a hang for ever.
  if (s_->in_policy.load() == std::this_thread::get_id())
    throw Error(
        "shutdown() called from the policy: it waits for the serving thread, which is the "
        "caller; call it from another thread");
  const Deadline deadline = Deadline::after(timeout);
  std::unique_lock<runtime::TimedLock> life(s_->lifecycle_mu, std::defer_lock);
  if (!runtime::wait_until(deadline,
                           [&](Deadline slice) { return life.try_lock_until(slice.when()); }))
    return false;  // a start() or another shutdown() holds the server that long
  if (!s_->worker.joinable()) return true;
  if (s_->worker_generation != os::fork_generation()) return false;
  s_->stop = true;
  s_->transport->close_server("InferenceServer is shutting down.", false);
  s_->transport->interrupt();
  // Interruptible: a policy call in progress may take long. An interrupted shutdown
  // leaves the server stopping; calling shutdown() again waits for it.
  const bool stopped = runtime::wait_until(deadline, [&](Deadline slice) {
    std::unique_lock<std::mutex> lock(s_->done_mu);
    return s_->done_cv.wait_until(lock, slice.when(), [&] { return s_->finished; });
  });
  if (!stopped) return false;
  join_worker();
  return true;
}

bool InferenceServer::running() const noexcept {
  std::lock_guard<std::mutex> lock(s_->done_mu);
  return s_->started && !s_->finished && s_->worker_generation == os::fork_generation();
}

void InferenceServer::update_model(const std::function<void()>& fn, bool mark, Timeout timeout) {
  s_->refuse_if_inherited("update_model");
  if (s_->in_policy.load() == std::this_thread::get_id())
    throw Error(
        "update_model() called from the policy: it runs between batches, and this batch's "
        "policy call is the caller; call it from another thread");
  std::unique_lock<runtime::TimedLock> lock(s_->model_mu, std::defer_lock);
  if (!runtime::wait_until(Deadline::after(timeout),
                           [&](Deadline slice) { return lock.try_lock_until(slice.when()); }))
    throw TimeoutError("update_model(): a policy call still runs after " + timeout.str() +
                       "; the model was not updated");
  fn();
  if (mark) {
    s_->version.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> st(s_->stats_mu);
    ++s_->weight_updates;
  }
}

int64_t InferenceServer::policy_version() const noexcept {
  return s_->version.load();
}

ServerStats InferenceServer::stats(bool reset) {
  s_->refuse_if_inherited("stats");
  std::lock_guard<std::mutex> lock(s_->stats_mu);
  ServerStats st;
  const double elapsed =
      std::max(std::chrono::duration<double>(Clock::now() - s_->stats_since).count(), 1e-12);
  st.requests = s_->requests;
  st.batches = s_->batches;
  st.requests_per_s = static_cast<double>(s_->requests) / elapsed;
  st.batches_per_s = static_cast<double>(s_->batches) / elapsed;
  st.avg_batch_size = s_->batch_sizes.mean();
  st.p50_queue_ms = s_->queue_ms.percentile(0.50);
  st.p95_queue_ms = s_->queue_ms.percentile(0.95);
  st.p50_forward_ms = s_->forward_ms.percentile(0.50);
  st.p95_forward_ms = s_->forward_ms.percentile(0.95);
  st.policy_version = s_->version.load();
  st.weight_updates = s_->weight_updates;
  if (reset) {
    s_->stats_since = Clock::now();
    s_->requests = s_->batches = s_->weight_updates = 0;
    s_->batch_sizes.clear();
    s_->queue_ms.clear();
    s_->forward_ms.clear();
  }
  return st;
}

Client InferenceServer::client() {
  return s_->transport->client();
}
const std::shared_ptr<Transport>& InferenceServer::transport() const noexcept {
  return s_->transport;
}
const ServerOptions& InferenceServer::options() const noexcept {
  return s_->options;
}

}  // namespace tensorwire::inference
