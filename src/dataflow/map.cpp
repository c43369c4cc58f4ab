#include "tensorwire/dataflow/map.h"

#include "tensorwire/runtime/interrupt.h"

#include <unistd.h>

#include <deque>
#include <map>
#include <variant>

#include "dataflow/links.h"
#include "dataflow/raw_datapoint.h"
#include "dataflow/runner_core.h"

namespace tensorwire::dataflow {

namespace {

constexpr const char* kName = "MultiProcessMapDataZMQ";
using Millis = std::chrono::milliseconds;

}  // namespace

struct MultiProcessMapDataZMQ::Impl final : detail::RunnerCore, detail::EpochSource {
  Impl(std::shared_ptr<DataFlow> d, MapFunction f, MapOptions o)
      : RunnerCore(kName, std::move(d), o.num_proc, o.seed, o.liveness_interval),
        map(std::move(f)),
        opt(std::move(o)) {}

  MapFunction map;
  MapOptions opt;
  size_t buffer_size = 0;
  std::string result_endpoint, task_endpoint;  // worker i takes tasks from task_endpoint + i
  // One task socket per worker, so that a task goes to the least busy worker (not blindly
  // round-robin) and the schema is sent once to each worker that needs it.
  std::vector<std::unique_ptr<zmqio::Socket>> tasks;
  std::vector<size_t> worker_in_flight;
  std::vector<uint64_t> worker_schema;
  std::unique_ptr<detail::ShmSender> task_sender;

  // What is in flight, per pass of the dataflow (strict mode keeps passes apart).
  uint64_t seq = 0;
  size_t in_flight = 0;
  uint32_t send_pass = 0;                  // the pass tasks are being taken from
  uint32_t yield_pass = 0;                 // the pass the current epoch yields
  bool pass_had_items = false;             // send_pass has produced at least one task
  std::map<uint32_t, size_t> outstanding;  // pass -> tasks not yet back
  std::map<uint32_t, bool> complete;       // pass -> the dataflow ended it
  // Results (or a map function's error) of passes later than the one being yielded.
  std::map<uint32_t, std::deque<std::variant<RawDatapoint, std::exception_ptr>>> stash;
  std::string scratch;
  // Non-strict: per pass, tasks sent and results back (kept or dropped). A pass whose
  // every result was dropped means an endless epoch with nothing in it: an error instead.
  struct PassCount {
    size_t sent = 0, back = 0, kept = 0;
    bool ended = false;
  };
  std::map<uint32_t, PassCount> counts;

  [[noreturn]] void worker_main(int index);
  void count_result(uint32_t pass, bool kept);
  void check_pass(uint32_t pass);
  void send_task(const TensorDict& td);
  void fill();
  // The next result; a worker's own failure (not one datapoint's) throws WorkerError.
  std::optional<detail::ShmReceiver::Received> receive(Deadline deadline);
  WorkerError worker_error(detail::ShmReceiver::Received& r);

  Step epoch_step(Deadline deadline) override;
  void epoch_begin() override { begin_epoch(); }
  void epoch_end() noexcept override { end_epoch(); }
};

void MultiProcessMapDataZMQ::Impl::worker_main(int index) {
  os::UnixSocket sock = link.take_child_end(index);
  // The task socket's end in this worker: its own queue is as deep as the whole buffer,
  // so that the main process never blocks sending a task.
  detail::WorkerLink w(index, std::move(sock), result_endpoint, 0,
                       buffer_size / static_cast<size_t>(opt.num_proc) + 4);
  zmqio::Socket pull(w.ctx, zmq::socket_type::pull, {.rcvhwm = static_cast<int>(buffer_size) + 1});
  pull.connect(task_endpoint + std::to_string(index));
  detail::ShmReceiver tasks_in([&w](uint16_t, uint32_t index_wanted) {
    while (true) {
      auto m = detail::recv_segment(w.socket, Millis(200));
      if (m) {
        if (m->first != index_wanted) throw ProtocolError("segments out of order");
        return std::move(m->second);
      }
      if (detail::parent_gone()) ::_exit(0);
    }
  });
  try {
    zmqio::PollItem item{&pull, -1, false};
    zmq::message_t msg;
    while (true) {
      bool more = false;
      if (!pull.try_recv_frame(msg, more)) {
        zmqio::poll(std::span(&item, 1), Millis(200));
        if (detail::parent_gone()) ::_exit(0);
        continue;
      }
      auto r = tasks_in.decode(std::span(static_cast<const std::byte*>(msg.data()), msg.size()));
      detail::DescriptorHeader h{.seq = r.header.seq, .pass = r.header.pass};
      if (!r.datapoint) continue;
      std::optional<TensorDict> out;
      try {
        out = map(r.datapoint->to_tensordict());
      } catch (...) {
        Failure f;
        try {
          f = opt.describe_failure(std::current_exception());
        } catch (...) {
          f = describe_exception(std::current_exception());
        }
        w.send_failure(f, h);
        continue;  // one bad datapoint does not end the worker
      }
      r.datapoint.reset();  // release the input chunk before producing more
      if (out) {
        w.send_datapoint(*out, h);
      } else {
        h.sender = static_cast<uint16_t>(index);
        h.kind = detail::DescriptorKind::Filtered;
        w.scratch.clear();
        h.encode(w.scratch);
        w.add(w.scratch);
        w.flush();
      }
    }
  } catch (...) {
    Failure f;
    try {
      f = opt.describe_failure(std::current_exception());
    } catch (...) {
      f = describe_exception(std::current_exception());
    }
    w.send_failure(f, {.seq = ~0ull});
  }
  w.park();
}

void MultiProcessMapDataZMQ::Impl::send_task(const TensorDict& td) {
  size_t w = 0;
  for (size_t i = 1; i < worker_in_flight.size(); ++i)
    if (worker_in_flight[i] < worker_in_flight[w]) w = i;
  scratch.clear();
  task_sender->encode(td, {.sender = detail::kMainSender, .seq = seq++, .pass = send_pass}, scratch,
                      worker_schema[w]);
  zmq::message_t m(scratch.data(), scratch.size());
  // The queues hold the whole buffer, so this does not wait; if it does, a worker is
  // stuck or gone, which the liveness check reports.
  while (!tasks[w]->send(m, Millis(100))) link.check_workers();
  ++worker_in_flight[w];
  ++in_flight;
  if (opt.strict)
    ++outstanding[send_pass];
  else
    ++counts[send_pass].sent;
  pass_had_items = true;
}

void MultiProcessMapDataZMQ::Impl::fill() {
  while (in_flight < buffer_size) {
    if (opt.strict && send_pass > yield_pass + 1) return;  // prefetch one pass ahead at most
    std::optional<TensorDict> dp = ds->next();
    if (dp) {
      send_task(*dp);
      continue;
    }
    // The pass is over.
    if (opt.strict) complete[send_pass] = true;
    const bool empty = !pass_had_items;
    if (!opt.strict && !empty) {
      counts[send_pass].ended = true;
      check_pass(send_pass);
    }
    ++send_pass;
    pass_had_items = false;
    ds->start();
    if (!opt.strict && empty) return;  // an empty pass: do not spin on it
  }
}

std::optional<detail::ShmReceiver::Received> MultiProcessMapDataZMQ::Impl::receive(
    Deadline deadline) {
  auto r = link.receive(deadline);
  if (!r) return r;
  if (r->header.sender >= opt.num_proc)
    throw ProtocolError(std::string(kName) + ": result from sender " +
                        std::to_string(r->header.sender));
  if (r->header.kind == detail::DescriptorKind::Error && r->header.seq == ~0ull) {
    // The worker itself failed (not one datapoint): it is parked and its tasks are lost,
    // so the map cannot go on.
    failed = std::make_exception_ptr(worker_error(*r));
    std::rethrow_exception(failed);
  }
  --in_flight;
  if (worker_in_flight[r->header.sender] > 0) --worker_in_flight[r->header.sender];
  auto it = outstanding.find(r->header.pass);
  if (it != outstanding.end() && it->second > 0) --it->second;
  return r;
}

void MultiProcessMapDataZMQ::Impl::count_result(uint32_t pass, bool kept) {
  PassCount& c = counts[pass];
  ++c.back;
  if (kept) ++c.kept;
  check_pass(pass);
}

void MultiProcessMapDataZMQ::Impl::check_pass(uint32_t pass) {
  auto it = counts.find(pass);
  if (it == counts.end() || !it->second.ended || it->second.back < it->second.sent) return;
  const PassCount c = it->second;
  counts.erase(it);
  if (c.kept == 0)
    throw ValueError(std::string(kName) + ": the map function returned None for all " +
                     std::to_string(c.sent) +
                     " datapoints of a pass of the dataflow, so there is nothing to yield");
}

WorkerError MultiProcessMapDataZMQ::Impl::worker_error(detail::ShmReceiver::Received& r) {
  const auto pids = link.workers.pids();
  return WorkerError(kName, r.header.sender, pids.at(r.header.sender), std::move(r.failure));
}

MultiProcessMapDataZMQ::MultiProcessMapDataZMQ(std::shared_ptr<DataFlow> ds, MapFunction map,
                                               MapOptions options)
    : impl_(std::make_unique<Impl>(std::move(ds), std::move(map), std::move(options))) {
  Impl& m = *impl_;
  if (!m.map) throw ValueError(std::string(kName) + ": no map function");
  if (m.opt.buffer_size < 1)
    throw ValueError(std::string(kName) +
                     ": buffer_size must be at least 1 (datapoints in flight)");
  m.buffer_size = m.opt.buffer_size;
  // As tensorpack: a strict buffer larger than the dataflow could never be filled.
  if (m.opt.strict && m.size && *m.size > 0) m.buffer_size = std::min(m.buffer_size, *m.size);
}

MultiProcessMapDataZMQ::~MultiProcessMapDataZMQ() {
  close();
}

void MultiProcessMapDataZMQ::reset_state() {
  Impl& m = *impl_;
  m.check_open();
  const int n = m.opt.num_proc;
  const std::string base = "ipc://@" + os::unique_name("dataflow-map");
  m.result_endpoint = base + "-results";
  m.task_endpoint = base + "-tasks-";
  m.start_workers(m.opt.fork_hooks, [&m](int i) { m.worker_main(i); });
  m.link.open(m.result_endpoint);
  for (int i = 0; i < n; ++i) {
    m.tasks.push_back(std::make_unique<zmqio::Socket>(
        *m.link.ctx, zmq::socket_type::push,
        zmqio::SocketOptions{.sndhwm = static_cast<int>(m.buffer_size) + 1}));
    m.tasks.back()->bind(m.task_endpoint + std::to_string(i));
  }
  m.worker_in_flight.assign(static_cast<size_t>(n), 0);
  m.worker_schema.assign(static_cast<size_t>(n), 0);
  m.task_sender = std::make_unique<detail::ShmSender>("dataflow-map-tasks", m.buffer_size + 4,
                                                      [&m](uint32_t index, const shm::Segment& s) {
                                                        for (auto& sock : m.link.parent_ends) {
                                                          try {
                                                            detail::send_segment(sock, index, s);
                                                          } catch (const ClosedError&) {
                                                            m.link.check_workers();
                                                            throw;
                                                          }
                                                        }
                                                      });
  m.ds->reset_state();
  m.ds->start();
  m.fill();
}

Epoch MultiProcessMapDataZMQ::epoch() {
  return Epoch(impl_.get());
}

detail::EpochSource::Step MultiProcessMapDataZMQ::Impl::epoch_step(Deadline deadline) {
  Impl& m = *this;
  if (m.failed) std::rethrow_exception(m.failed);
  try {
    if (!m.opt.strict) {
      while (true) {
        m.fill();
        if (m.in_flight == 0) return {std::nullopt, true};  // an empty dataflow
        auto r = m.receive(deadline);
        if (!r) return {};
        const bool filtered = r->header.kind == detail::DescriptorKind::Filtered;
        m.count_result(r->header.pass, !filtered);
        if (r->header.kind == detail::DescriptorKind::Error) throw m.worker_error(*r);
        if (filtered) continue;
        return {std::move(r->datapoint), false};
      }
    }
    while (true) {
      auto& stash = m.stash[m.yield_pass];
      if (!stash.empty()) {
        auto item = std::move(stash.front());
        stash.pop_front();
        if (auto* err = std::get_if<std::exception_ptr>(&item)) std::rethrow_exception(*err);
        return {std::move(std::get<RawDatapoint>(item)), false};
      }
      if (m.complete[m.yield_pass] && m.outstanding[m.yield_pass] == 0) {
        m.stash.erase(m.yield_pass);
        m.outstanding.erase(m.yield_pass);
        m.complete.erase(m.yield_pass);
        ++m.yield_pass;
        m.fill();
        return {std::nullopt, true};
      }
      m.fill();
      auto r = m.receive(deadline);
      if (!r) return {};
      if (r->header.kind == detail::DescriptorKind::Error) {
        // A map error belongs to the pass of its datapoint: a later pass's waits for it.
        auto err = std::make_exception_ptr(m.worker_error(*r));
        if (r->header.pass == m.yield_pass) std::rethrow_exception(err);
        m.stash[r->header.pass].push_back(err);
        continue;
      }
      if (r->header.kind == detail::DescriptorKind::Filtered)
        throw ValueError(std::string(kName) + ": the map function returned nothing in strict mode");
      if (r->header.pass == m.yield_pass) return {std::move(r->datapoint), false};
      m.stash[r->header.pass].push_back(std::move(*r->datapoint));
    }
  } catch (const WorkerError&) {
    throw;  // one datapoint failed: the stream can go on
  } catch (const ValueError&) {
    throw;
  } catch (const Interrupted&) {
    throw;  // the wait was abandoned, nothing was lost: the map goes on
  } catch (const Error&) {
    m.failed = std::current_exception();
    throw;
  }
}

std::optional<size_t> MultiProcessMapDataZMQ::size() const {
  return impl_->size;
}
uint64_t MultiProcessMapDataZMQ::base_seed() const noexcept {
  return impl_->seed;
}
const MapOptions& MultiProcessMapDataZMQ::options() const noexcept {
  return impl_->opt;
}
size_t MultiProcessMapDataZMQ::buffer_size() const noexcept {
  return impl_->buffer_size;
}
std::vector<int> MultiProcessMapDataZMQ::pids() const {
  return impl_->link.workers.pids();
}

void MultiProcessMapDataZMQ::close() {
  Impl& m = *impl_;
  if (m.link.owner_pid != -1 && m.link.owner_pid != ::getpid()) return;  // a forked copy
  m.tasks.clear();
  m.link.close();
  m.task_sender.reset();
  m.mark_closed();
}

bool MultiProcessMapDataZMQ::closed() const noexcept {
  return impl_->closed;
}

}  // namespace tensorwire::dataflow
