#include "tensorwire/dataflow/runner.h"

#include <unistd.h>

#include <thread>

#include "dataflow/links.h"
#include "dataflow/raw_datapoint.h"
#include "dataflow/runner_core.h"
#include "os/futex.h"
#include "tensorwire/runtime/interrupt.h"

namespace tensorwire::dataflow {

namespace {

constexpr const char* kName = "MultiProcessRunnerZMQ";
// Descriptor batching in the workers (see worker_main).
constexpr size_t kMaxBatch = 32;
constexpr auto kSlowDatapoint = std::chrono::microseconds(50);
constexpr auto kIdleWait = std::chrono::microseconds(10);
constexpr auto kBusyWait = std::chrono::microseconds(200);
// The most a batched datapoint waits, even while the dataflow blocks (the flusher thread).
constexpr auto kMaxDelay = std::chrono::microseconds(2000);

// Credits, one cache line per worker, in a segment the main process creates before the
// fork (so both sides map it): the main process counts the datapoints it has received
// from each worker; a worker sends only while (sent - received) < hwm.
//
// A worker that runs out of credits sleeps until half its window is free, not until the
// next credit: it then sends a burst instead of one datapoint per wake-up, and the main
// process makes one futex_wake per half window (only when the worker sleeps and the
// count reaches `wake_at`), not one per datapoint.
struct alignas(64) Credit {
  std::atomic<uint32_t> received{0};
  std::atomic<uint32_t> sleeping{0};  // the worker is (about to be) in futex_wait
  std::atomic<uint32_t> wake_at{0};   // the `received` count it waits for

  void on_received() noexcept {
    const uint32_t r = received.fetch_add(1, std::memory_order_seq_cst) + 1;
    if (sleeping.load(std::memory_order_seq_cst) &&
        static_cast<int32_t>(r - wake_at.load(std::memory_order_relaxed)) >= 0)
      os::futex_wake(&received);
  }
  // Worker side: waits until received reaches `target` (or the parent is gone).
  uint32_t wait_for(uint32_t target) noexcept {
    uint32_t r = received.load(std::memory_order_acquire);
    while (static_cast<int32_t>(r - target) < 0) {
      if (detail::parent_gone()) ::_exit(0);
      wake_at.store(target, std::memory_order_relaxed);
      sleeping.store(1, std::memory_order_seq_cst);
      // Re-read after announcing: a count that reached the target in between is seen
      // here, or the main process saw `sleeping` and wakes us.
      r = received.load(std::memory_order_seq_cst);
      if (static_cast<int32_t>(r - target) < 0)
        os::futex_wait(&received, r, std::chrono::milliseconds(100));
      sleeping.store(0, std::memory_order_relaxed);
      r = received.load(std::memory_order_acquire);
    }
    return r;
  }
};

}  // namespace

struct MultiProcessRunnerZMQ::Impl final : detail::RunnerCore, detail::EpochSource {
  Impl(std::shared_ptr<DataFlow> d, RunnerOptions o)
      : RunnerCore(kName, std::move(d), o.num_proc, o.seed, o.liveness_interval, o.policy),
        opt(std::move(o)) {}

  RunnerOptions opt;
  uint64_t epoch_count = 0;
  std::string endpoint;
  shm::Segment credits;

  Credit& credit(int i) const { return reinterpret_cast<Credit*>(credits.data())[i]; }
  [[noreturn]] void worker_main(int index, uint16_t sender, os::UnixSocket socket);
  // The next datapoint. For an epoch (`epoch_end` given), its end is decided within the
  // call's turn: a thread that waited for its turn while another took the epoch's last
  // datapoint gets the end, not a datapoint of the next epoch.
  std::optional<RawDatapoint> next_raw(Deadline deadline, bool* epoch_end = nullptr);
  // A replacement starts with no datapoint sent and none received.
  void before_replacing(int index) override {
    Credit& c = credit(index);
    c.received.store(0);
    c.sleeping.store(0);
    c.wake_at.store(0);
  }

  Step epoch_step(Deadline deadline) override;
  void epoch_begin() override;
  void epoch_end() noexcept override;
};

void MultiProcessRunnerZMQ::Impl::worker_main(int index, uint16_t sender, os::UnixSocket socket) {
  detail::WorkerLink w(sender, link.sent_count(sender), std::move(socket), endpoint, opt.hwm + 2,
                       static_cast<size_t>(opt.hwm) + 4);
  detail::WorkerProgress* progress_slot = progress(index);
  w.start_flusher(kMaxDelay);
  Credit& c = credit(index);
  const auto hwm = static_cast<uint32_t>(opt.hwm);
  uint32_t sent = 0, flushed = 0;
  uint64_t seq = 0;
  using clock = std::chrono::steady_clock;
  try {
    if (progress_slot) progress_slot->begin(detail::WorkerProgress::kResetState);
    ds->reset_state();
    if (progress_slot) progress_slot->end();
    auto last = clock::now(), batch_start = last;
    while (true) {
      ds->start();
      bool any = false;
      for (uint64_t in_pass = 0;; ++in_pass) {
        if (progress_slot) progress_slot->begin(in_pass);
        std::optional<TensorDict> dp = ds->next();
        if (progress_slot) progress_slot->end();
        if (!dp) break;
        any = true;
        const auto produced = clock::now();
        uint32_t received = c.received.load(std::memory_order_acquire);
        if (sent - received >= hwm) {
          w.flush();  // never wait for credits with datapoints the main process cannot see
          flushed = sent;
          received = c.wait_for(sent - hwm + (hwm + 1) / 2);  // half the window free
        }
        if (w.batched() == 0) batch_start = produced;
        w.add_datapoint(*dp, {.seq = seq++});
        ++sent;
        // Batch while the dataflow is fast. Send when the batch is full, when this datapoint
        // took long to make (the next one would only delay it), or when the oldest one has
        // waited long enough: kIdleWait if the main process has read everything sent (it
        // may be waiting), kBusyWait if it still has datapoints to read.
        const auto now = clock::now();
        const auto waited = now - batch_start;
        if (w.batched() >= kMaxBatch || produced - last > kSlowDatapoint ||
            waited > (received == flushed ? kIdleWait : kBusyWait)) {
          w.flush();
          flushed = sent;
        }
        last = now;
      }
      // A pass with nothing in it would have the main process wait for ever.
      if (!any)
        throw ValueError(
            "the dataflow yielded no datapoint in a whole pass (its __iter__ / "
            "next() ended at once), so there is nothing to run");
    }
  } catch (...) {
    Failure f;
    try {
      f = opt.describe_failure(std::current_exception());
    } catch (...) {
      f = describe_exception(std::current_exception());
    }
    w.flush();
    w.send_failure(f, {.seq = seq});
  }
  w.park();
}

MultiProcessRunnerZMQ::MultiProcessRunnerZMQ(std::shared_ptr<DataFlow> ds, RunnerOptions options)
    : impl_(std::make_unique<Impl>(std::move(ds), std::move(options))) {
  if (impl_->opt.hwm < 1) throw ValueError(std::string(kName) + ": hwm must be at least 1");
}

MultiProcessRunnerZMQ::~MultiProcessRunnerZMQ() {
  close();
}

void MultiProcessRunnerZMQ::reset_state() {
  Impl& m = *impl_;
  // Descriptors: a socket pair end, its ZeroMQ connection, segments in flight; tasks: the
  // process, its flusher and its ZeroMQ context's two threads.
  m.begin_reset(4, 4);
  const int n = m.opt.num_proc;
  m.endpoint = "ipc://@" + os::unique_name("dataflow");
  m.credits = shm::Segment::create("dataflow-credits", sizeof(Credit) * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) new (&m.credit(i)) Credit{};
  m.start_workers(m.opt.fork_hooks, [&m](int i, uint16_t sender, os::UnixSocket socket) {
    m.worker_main(i, sender, std::move(socket));
  });
  // Contexts and threads only after every fork (a context does not survive one).
  m.link.open(m.endpoint);
}

std::optional<TensorDict> MultiProcessRunnerZMQ::next(Timeout timeout) {
  auto raw = impl_->next_raw(Deadline::after(timeout));
  if (!raw) return std::nullopt;
  return raw->to_tensordict();
}

std::optional<RawDatapoint> detail::RawAccess::next(MultiProcessRunnerZMQ& runner,
                                                    Timeout timeout) {
  return runner.impl_->next_raw(Deadline::after(timeout));
}

std::optional<RawDatapoint> MultiProcessRunnerZMQ::Impl::next_raw(Deadline deadline,
                                                                  bool* epoch_end) {
  Impl& m = *this;
  m.check_started();
  ConsumerCall call(m, deadline);  // rethrows a failure (m.failed) once it has its turn
  if (!call.entered()) return std::nullopt;
  if (epoch_end && m.size && m.epoch_count >= *m.size) {
    *epoch_end = true;
    return std::nullopt;
  }
  try {
    while (true) {
      auto r = m.link.receive(deadline);
      if (!r) return std::nullopt;
      const uint16_t sender = r->header.sender;
      if (!m.link.valid_sender(sender))
        throw ProtocolError(std::string(kName) + ": descriptor from sender " +
                            std::to_string(sender));
      const int w = m.link.index_of(sender);
      if (r->header.kind == detail::DescriptorKind::Error) {
        const auto pids = m.link.workers.pids();
        throw WorkerError(kName, w, pids.empty() ? -1 : pids[static_cast<size_t>(w)],
                          std::move(r->failure));
      }
      if (r->header.kind != detail::DescriptorKind::Datapoint) continue;
      // A replaced worker's last datapoints still count, but not against its successor.
      if (m.link.is_current(sender)) m.credit(w).on_received();
      if (epoch_end) ++m.epoch_count;
      return std::move(r->datapoint);
    }
  } catch (const ClosedError&) {
    throw;
  } catch (const Interrupted&) {
    throw;  // the wait was abandoned, nothing was lost: the runner goes on
  } catch (const Error&) {
    m.failed = std::current_exception();
    throw;
  }
}

TensorDict MultiProcessRunnerZMQ::next() {
  return *next(Timeout::forever());
}

Epoch MultiProcessRunnerZMQ::epoch() {
  return Epoch(impl_.get());
}

void MultiProcessRunnerZMQ::Impl::epoch_begin() {
  begin_epoch();
  epoch_count = 0;
}

void MultiProcessRunnerZMQ::Impl::epoch_end() noexcept {
  end_epoch();
}

detail::EpochSource::Step MultiProcessRunnerZMQ::Impl::epoch_step(Deadline deadline) {
  Step step;
  step.datapoint = next_raw(deadline, &step.end);
  return step;
}

std::optional<size_t> MultiProcessRunnerZMQ::size() const {
  return impl_->size;
}
uint64_t MultiProcessRunnerZMQ::base_seed() const noexcept {
  return impl_->seed;
}
const RunnerOptions& MultiProcessRunnerZMQ::options() const noexcept {
  return impl_->opt;
}
uint64_t MultiProcessRunnerZMQ::restarts() const noexcept {
  return impl_->restarts();
}
std::vector<int> MultiProcessRunnerZMQ::pids() const {
  return impl_->link.workers.pids();
}
std::string MultiProcessRunnerZMQ::endpoint() const {
  return impl_->endpoint;
}

size_t MultiProcessRunnerZMQ::shared_memory_bytes() const {
  return impl_->link.receiver ? impl_->link.receiver->mapped_bytes() : 0;
}

void MultiProcessRunnerZMQ::close() {
  const int owner = impl_->link.owner_pid;
  if (owner != -1 && owner != ::getpid()) return;  // a forked copy: nothing here is ours
  if (!impl_->stop_consumer()) return;
  impl_->link.close();
  impl_->mark_closed();
}

bool MultiProcessRunnerZMQ::closed() const noexcept {
  return impl_->closed || impl_->link.gate.closing();
}

}  // namespace tensorwire::dataflow
