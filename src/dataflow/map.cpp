#include "tensorwire/dataflow/map.h"

#include "tensorwire/runtime/interrupt.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>
#include <variant>

#include "dataflow/links.h"
#include "dataflow/raw_datapoint.h"
#include "dataflow/runner_core.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::dataflow {

namespace {

constexpr const char* kName = "MultiProcessMapDataZMQ";
// How long a worker's task queue may refuse before the worker is taken for one that never
// connected (a connected worker's queue holds the whole buffer; connecting takes
// milliseconds, seconds on a starved machine).
constexpr std::chrono::milliseconds kStartBound{10'000};
using Millis = std::chrono::milliseconds;

}  // namespace

struct MultiProcessMapDataZMQ::Impl final : detail::RunnerCore, detail::EpochSource {
  Impl(std::shared_ptr<DataFlow> d, MapFunction f, MapOptions o)
      : RunnerCore(kName, std::move(d), o.num_proc, o.seed, o.liveness_interval, o.policy),
        map(std::move(f)),
        opt(std::move(o)) {}

  MapFunction map;
  MapOptions opt;
  size_t buffer_size = 0;
  bool epoch_over = false;  // the current epoch's end was returned (epoch_step)
  // Worker i takes tasks from task_endpoint + its sender id: a replacement gets a socket
  // of its own, so no task goes into the dead one's queue once it was replaced.
  std::string result_endpoint, task_endpoint;
  // One task socket per worker, so that a task goes to the least busy worker (not blindly
  // round-robin) and the schema is sent once to each worker that needs it.
  std::vector<std::unique_ptr<zmqio::Socket>> tasks;
  // Tasks sent and not back, by seq (their number is what is in flight). Under the restart
  // policy each keeps its input, so that what a dead worker held is sent again (a result
  // that comes twice is dropped).
  struct Task {
    uint32_t pass = 0;
    uint64_t in_pass = 0;  // its index in its pass (named when it is stuck)
    size_t worker = 0;     // the worker it was sent to, or one of the two states below
    std::optional<TensorDict> input;
  };
  // A task is in exactly one place: a worker (its index), on its way to one (kUnsent: the
  // dispatch() under way owns it) or in `reissue` (kQueued). A task is queued only from
  // kUnsent or a worker, so it is never queued, and never mapped, twice.
  static constexpr size_t kUnsent = ~size_t{0};
  static constexpr size_t kQueued = ~size_t{0} - 1;
  std::unordered_map<uint64_t, Task> pending;
  std::deque<uint64_t> reissue;  // seqs to send again, oldest first
  // Inside dispatch(): a restart found there (a nested death) queues its reissues for the
  // end of the outermost dispatch, which never runs inside the task pool's allocation.
  bool dispatching = false;
  uint64_t pass_index = 0;  // index in send_pass of the next task
  // The dataflow's last next() threw (a Ctrl-C landing in it, a bug): a Python generator
  // that raised is over, so an end right after it cuts the pass short, and says so.
  bool ds_raised = false;
  std::vector<size_t> worker_in_flight;
  // Per worker, the task chunks sent to it that it may not have released yet. A worker
  // releases a task's chunk when its last view goes, which may be after it sent the result
  // (the map function returned its input) or never (it keeps it): when it dies, those it
  // never released are freed, or each death would leak some for good.
  struct HeldChunks {
    std::vector<shm::ChunkPool::Chunk> chunks;
    size_t prune_at = 0;  // the size at which those released are next forgotten
  };
  std::vector<HeldChunks> worker_chunks;
  std::vector<uint64_t> worker_schema;
  std::unique_ptr<detail::ShmSender> task_sender;

  // What is in flight, per pass of the dataflow (strict mode keeps passes apart).
  uint64_t seq = 0;
  uint32_t send_pass = 0;                  // the pass tasks are being taken from
  uint32_t yield_pass = 0;                 // the pass the current epoch yields
  bool pass_had_items = false;             // send_pass has produced at least one task
  std::map<uint32_t, size_t> outstanding;  // pass -> tasks not yet back
  std::map<uint32_t, bool> complete;       // pass -> the dataflow ended it
  // Results (or a map function's error) of passes later than the one being yielded.
  std::map<uint32_t, std::deque<std::variant<RawDatapoint, std::exception_ptr>>> stash;
  std::string scratch;
  // Non-strict: per pass, tasks sent and results back (kept or dropped). Passes whose every
  // result was dropped, kDroppedInARow datapoints of them in a row, mean an endless epoch
  // with nothing in it: an error instead. Not one such pass: a random filter (tensorpack's
  // "None drops the datapoint") over a small dataflow drops a whole pass now and then.
  struct PassCount {
    size_t sent = 0, back = 0, kept = 0;
    bool ended = false;
  };
  std::map<uint32_t, PassCount> counts;
  static constexpr size_t kDroppedInARow = 1000;
  size_t dropped_passes = 0, dropped_in_a_row = 0;  // the current run of such passes

  [[noreturn]] void worker_main(int index, uint16_t sender, os::UnixSocket sock);
  void count_result(uint32_t pass, bool kept);
  void check_pass(uint32_t pass);
  void send_task(const TensorDict& td);
  // Sends pending task `seq` to the least busy worker (again, after a restart) and records
  // that worker in it the moment it is sent: a death found later (even while reissuing
  // other tasks before dispatch() returns) then reissues it too.
  void dispatch(uint64_t seq, const TensorDict& td);
  void bind_tasks(int index, uint16_t sender);
  void flush_reissue();
  void send_new_segment(uint32_t index, const shm::Segment& segment);
  void held_by(size_t w, const shm::ChunkPool::Chunk& chunk);  // records a sent task chunk
  void after_replacing(int index, uint16_t sender) override;
  std::string describe_item(uint64_t seq) const override;
  bool items_are_shared() const override { return true; }
  void fill();
  // The next result; a worker's own failure (not one datapoint's) throws WorkerError.
  std::optional<detail::ShmReceiver::Received> receive(Deadline deadline);
  WorkerError worker_error(detail::ShmReceiver::Received& r);

  Step epoch_step(Deadline deadline) override;
  void epoch_begin() override {
    begin_epoch();
    epoch_over = false;
  }
  void epoch_end() noexcept override { end_epoch(); }
};

void MultiProcessMapDataZMQ::Impl::worker_main(int index, uint16_t sender, os::UnixSocket sock) {
  detail::WorkerProgress* progress_slot = progress(index);
  // The task socket's end in this worker: its own queue is as deep as the whole buffer,
  // so that the main process never blocks sending a task.
  detail::WorkerLink w(sender, link.sent_count(sender), std::move(sock), result_endpoint, 0,
                       buffer_size / static_cast<size_t>(opt.num_proc) + 4);
  zmqio::Socket pull(w.ctx, zmq::socket_type::pull, {.rcvhwm = static_cast<int>(buffer_size) + 1});
  pull.connect(task_endpoint + std::to_string(sender));
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
        if (progress_slot) progress_slot->begin(h.seq);
        out = map(r.datapoint->to_tensordict());
        if (progress_slot) progress_slot->end();
      } catch (...) {
        if (progress_slot) progress_slot->end();
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
        h.sender = sender;
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

void MultiProcessMapDataZMQ::Impl::dispatch(uint64_t task, const TensorDict& td) {
  const bool outermost = !dispatching;
  dispatching = true;
  struct Reset {
    bool& flag;
    bool value;
    ~Reset() { flag = value; }
  } reset{dispatching, !outermost};
  Task& entry = pending.at(task);  // stays put: only results erase, and none is read here
  while (true) {
    size_t w = 0;
    for (size_t i = 1; i < worker_in_flight.size(); ++i)
      if (worker_in_flight[i] < worker_in_flight[w]) w = i;
    const uint32_t generation = link.generation[w];
    scratch.clear();
    const auto chunk =
        task_sender->encode(td, {.sender = detail::kMainSender, .seq = task, .pass = entry.pass},
                            scratch, worker_schema[w]);
    zmq::message_t m(scratch.data(), scratch.size());
    // The queues hold the whole buffer, so this does not wait; if it does, a worker is
    // stuck or gone, which the liveness check reports (or replaces the worker).
    // encode() itself may have replaced w (a new task segment goes to every worker, and
    // one found dead there is replaced): the message, made for the dead one, may lack the
    // schema the new one needs, so it is not sent but made again.
    // A connected worker's queue never refuses a task, so refusals for kStartBound mean
    // it never connected: it is killed, and the policy replaces it (or raises).
    bool sent = false;
    const auto refused_since = std::chrono::steady_clock::now();
    try {
      while (link.generation[w] == generation && !(sent = tasks[w]->send(m, Millis(100)))) {
        link.check_workers();
        check_interrupt();
        if (link.generation[w] == generation &&
            std::chrono::steady_clock::now() - refused_since > kStartBound)
          kill_unstarted(static_cast<int>(w), kStartBound);  // not its replacement
      }
    } catch (...) {
      // Not sent (interrupted, or a worker's death raised): its chunk is freed, and the
      // worker does not have the schema it may have carried.
      task_sender->abandon(std::span(static_cast<const std::byte*>(m.data()), m.size()),
                           worker_schema[w]);
      throw;
    }
    if (sent) {
      ++worker_in_flight[w];
      entry.worker = w;
      if (chunk) held_by(w, *chunk);
      if (outermost && !reissue.empty()) {
        dispatching = false;
        flush_reissue();
      }
      return;
    }
    // Replaced meanwhile: encode again (the new worker has no schema yet), after the
    // tasks the dead worker held, which are older than this one (order with one worker).
    task_sender->abandon(std::span(static_cast<const std::byte*>(m.data()), m.size()),
                         worker_schema[w]);
    if (outermost && !reissue.empty()) {
      dispatching = false;
      flush_reissue();
      dispatching = true;
    }
  }
}

void MultiProcessMapDataZMQ::Impl::send_task(const TensorDict& td) {
  const uint64_t task = seq++;
  Task t{send_pass, pass_index++, kUnsent, std::nullopt};
  // Kept to be sent again if its worker dies: a copy, as the task is yielded now. `td` may
  // view the caller's memory (a numpy buffer the dataflow refills for every datapoint),
  // which holds another datapoint by the time a resend reads it.
  if (policy.on_death == OnWorkerDeath::Restart) t.input = td.clone();
  pending.emplace(task, std::move(t));
  const auto count_it = [&] {
    if (opt.strict)
      ++outstanding[send_pass];
    else
      ++counts[send_pass].sent;
    pass_had_items = true;
  };
  try {
    dispatch(task, td);
  } catch (const Interrupted&) {
    // Ctrl-C while it waited for a worker's queue (or while dispatch() sent a dead worker's
    // tasks again after it was sent): the dataflow gave it up, so it is sent with the next
    // call (fill() sends what waits for reissue first). Nothing is lost. Sent and then
    // lost to a death found before the interrupt, it is queued already (kQueued).
    if (Task& entry = pending.at(task); entry.worker == kUnsent) {
      if (!entry.input) entry.input = td.clone();
      entry.worker = kQueued;
      reissue.push_back(task);
    }
    count_it();
    throw;
  } catch (...) {
    // Not sent (a bad datapoint, a failed map): it is not in flight. Sent (or queued after
    // its worker died), it stays.
    if (auto it = pending.find(task); it != pending.end() && it->second.worker == kUnsent) {
      pending.erase(it);
      throw;
    }
    count_it();
    throw;
  }
  count_it();
}

void MultiProcessMapDataZMQ::Impl::fill() {
  if (!reissue.empty()) flush_reissue();  // what an interrupted call left unsent goes first
  while (pending.size() < buffer_size) {
    if (opt.strict && send_pass > yield_pass + 1) return;  // prefetch one pass ahead at most
    std::optional<TensorDict> dp;
    try {
      dp = ds->next();
    } catch (...) {
      ds_raised = true;
      throw;
    }
    if (dp) {
      ds_raised = false;
      send_task(*dp);
      continue;
    }
    // The pass is over.
    if (std::exchange(ds_raised, false))
      log_message(LogLevel::Warning,
                  std::string(kName) + ": pass " + std::to_string(send_pass) + " ended after " +
                      std::to_string(pass_index) +
                      " datapoints, at the first call of the dataflow after it raised (a "
                      "Python generator that raised, here or by a Ctrl-C that landed in it, "
                      "cannot go on): the rest of that pass is missing" +
                      (size ? " (len(ds) = " + std::to_string(*size) + ")" : ""));
    pass_index = 0;
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
  while (true) {
    auto r = link.receive(deadline);
    if (!r) return r;
    if (!link.valid_sender(r->header.sender))
      throw ProtocolError(std::string(kName) + ": result from sender " +
                          std::to_string(r->header.sender));
    if (r->header.kind == detail::DescriptorKind::Error && r->header.seq == ~0ull) {
      // The worker itself failed (not one datapoint): it is parked and its tasks are lost,
      // so the map cannot go on.
      failed = std::make_exception_ptr(worker_error(*r));
      std::rethrow_exception(failed);
    }
    auto task = pending.find(r->header.seq);
    if (task == pending.end()) continue;  // a reissued task's second result
    const size_t w = task->second.worker;
    pending.erase(task);
    if (w < worker_in_flight.size() && worker_in_flight[w] > 0) --worker_in_flight[w];
    auto it = outstanding.find(r->header.pass);
    if (it != outstanding.end() && it->second > 0) --it->second;
    return r;
  }
}

void MultiProcessMapDataZMQ::Impl::bind_tasks(int index, uint16_t sender) {
  auto& sock = tasks[static_cast<size_t>(index)];
  sock.reset();  // the dead one's queue goes with its socket; pending tasks are reissued
  sock = std::make_unique<zmqio::Socket>(
      *link.ctx, zmq::socket_type::push,
      zmqio::SocketOptions{.sndhwm = static_cast<int>(buffer_size) + 1});
  sock->bind(task_endpoint + std::to_string(sender));
}

void MultiProcessMapDataZMQ::Impl::after_replacing(int index, uint16_t sender) {
  const auto i = static_cast<size_t>(index);
  bind_tasks(index, sender);
  worker_schema[i] = 0;
  worker_in_flight[i] = 0;
  // The new worker maps the task arenas in order, before any task names them.
  for (uint32_t k = 0; k < task_sender->num_segments(); ++k)
    detail::send_segment(link.parent_ends[sender], k, task_sender->segment(k));
  task_sender->reclaim(worker_chunks[i].chunks);  // the dead worker can release nothing now
  worker_chunks[i].chunks.clear();
  // Queued, a task is in no worker: if worker `index` is replaced again before the queue is
  // sent (an interrupted flush, a replacement that never connects), it is not queued twice.
  std::vector<uint64_t> lost;
  for (auto& [task, t] : pending)
    if (t.worker == i) {
      lost.push_back(task);
      t.worker = kQueued;
    }
  std::sort(lost.begin(), lost.end());
  reissue.insert(reissue.end(), lost.begin(), lost.end());
  if (!dispatching) flush_reissue();
}

void MultiProcessMapDataZMQ::Impl::flush_reissue() {
  while (!reissue.empty()) {
    const uint64_t task = reissue.front();
    reissue.pop_front();
    auto it = pending.find(task);
    if (it == pending.end() || !it->second.input) continue;  // came back meanwhile
    const TensorDict input = *it->second.input;
    it->second.worker = kUnsent;  // in no worker's count while it is sent
    try {
      dispatch(task, input);
    } catch (...) {
      // Not sent (interrupted): first in line again, for the next fill() to send.
      if (auto again = pending.find(task);
          again != pending.end() && again->second.worker == kUnsent) {
        again->second.worker = kQueued;
        reissue.push_front(task);
      }
      throw;
    }
  }
}

void MultiProcessMapDataZMQ::Impl::held_by(size_t w, const shm::ChunkPool::Chunk& chunk) {
  HeldChunks& held = worker_chunks[w];
  // Those released are forgotten when the list has doubled since the last time (O(1) per
  // task, amortized), however many the worker keeps.
  if (held.chunks.size() >= held.prune_at) {
    std::erase_if(held.chunks, [&](const auto& c) { return !task_sender->in_use(c); });
    held.prune_at = 2 * (held.chunks.size() + buffer_size) + 16;
  }
  held.chunks.push_back(chunk);
}

void MultiProcessMapDataZMQ::Impl::send_new_segment(uint32_t index, const shm::Segment& segment) {
  for (int i = 0; i < num_proc; ++i) {
    const uint16_t sender = link.sender_of(i);
    try {
      detail::send_segment(link.parent_ends[sender], index, segment);
    } catch (const ClosedError&) {
      // Throws WorkerDiedError, or replaces it: the replacement was given every segment
      // there is, this one included.
      if (!link.await_death(i)) throw;
    }
  }
}

std::string MultiProcessMapDataZMQ::Impl::describe_item(uint64_t task) const {
  auto it = pending.find(task);
  if (it == pending.end()) return "a datapoint";
  return "datapoint " + std::to_string(it->second.in_pass) + " of pass " +
         std::to_string(it->second.pass);
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
  if (c.kept > 0) {
    dropped_passes = dropped_in_a_row = 0;
    return;
  }
  ++dropped_passes;
  dropped_in_a_row += c.sent;
  if (dropped_in_a_row >= kDroppedInARow)
    throw ValueError(std::string(kName) + ": the map function returned None for all " +
                     std::to_string(dropped_in_a_row) + " datapoints of the last " +
                     std::to_string(dropped_passes) +
                     " passes of the dataflow, so there is nothing to yield");
}

WorkerError MultiProcessMapDataZMQ::Impl::worker_error(detail::ShmReceiver::Received& r) {
  const auto pids = link.workers.pids();
  const int w = link.index_of(r.header.sender);
  return WorkerError(kName, w, pids.at(static_cast<size_t>(w)), std::move(r.failure));
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
  // The first fill reads that many datapoints before anything comes back: sys.maxsize
  // ("no limit") would read a repeating dataflow for ever, and the ZeroMQ queues sized
  // from it would overflow.
  if (m.buffer_size > kMaxBufferSize)
    throw ValueError(std::string(kName) + ": buffer_size must be at most " +
                     std::to_string(kMaxBufferSize) + " (datapoints in flight), got " +
                     std::to_string(m.opt.buffer_size));
}

MultiProcessMapDataZMQ::~MultiProcessMapDataZMQ() {
  close();
}

void MultiProcessMapDataZMQ::reset_state() {
  Impl& m = *impl_;
  // Descriptors: the runner's, and a task socket with its listener and connection; tasks:
  // the process and its ZeroMQ context's two threads.
  m.begin_reset(8, 3);
  const int n = m.opt.num_proc;
  const std::string base = "ipc://@" + os::unique_name("dataflow-map");
  m.result_endpoint = base + "-results";
  m.task_endpoint = base + "-tasks-";
  m.start_workers(m.opt.fork_hooks, [&m](int i, uint16_t sender, os::UnixSocket socket) {
    m.worker_main(i, sender, std::move(socket));
  });
  m.link.open(m.result_endpoint);
  m.tasks.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) m.bind_tasks(i, static_cast<uint16_t>(i));
  m.worker_in_flight.assign(static_cast<size_t>(n), 0);
  m.worker_schema.assign(static_cast<size_t>(n), 0);
  m.worker_chunks.assign(static_cast<size_t>(n), {});
  m.task_sender = std::make_unique<detail::ShmSender>(
      "dataflow-map-tasks", m.buffer_size + 4,
      [&m](uint32_t index, const shm::Segment& s) { m.send_new_segment(index, s); });
  m.ds->reset_state();
  m.ds->start();
  Impl::ConsumerCall call(m);  // a close() from another thread waits for this first fill
  m.fill();
}

Epoch MultiProcessMapDataZMQ::epoch() {
  return Epoch(impl_.get());
}

detail::EpochSource::Step MultiProcessMapDataZMQ::Impl::epoch_step(Deadline deadline) {
  Impl& m = *this;
  ConsumerCall call(m, deadline);  // rethrows a failure (m.failed) once it has its turn
  if (!call.entered()) return {};
  // Decided within the call's turn: a thread that waited for it while another ended the
  // epoch gets the end too, not a datapoint of the next pass.
  if (m.epoch_over) return {std::nullopt, true};
  try {
    if (!m.opt.strict) {
      while (true) {
        m.fill();
        if (m.pending.empty()) {  // an empty dataflow
          m.epoch_over = true;
          return {std::nullopt, true};
        }
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
      auto& waiting = m.stash[m.yield_pass];
      if (!waiting.empty()) {
        auto item = std::move(waiting.front());
        waiting.pop_front();
        if (auto* err = std::get_if<std::exception_ptr>(&item)) std::rethrow_exception(*err);
        return {std::move(std::get<RawDatapoint>(item)), false};
      }
      if (m.complete[m.yield_pass] && m.outstanding[m.yield_pass] == 0) {
        m.stash.erase(m.yield_pass);
        m.outstanding.erase(m.yield_pass);
        m.complete.erase(m.yield_pass);
        ++m.yield_pass;
        m.epoch_over = true;  // before fill(), which may throw (an interrupt): the end stays
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
uint64_t MultiProcessMapDataZMQ::restarts() const noexcept {
  return impl_->restarts();
}
std::vector<int> MultiProcessMapDataZMQ::pids() const {
  return impl_->link.workers.pids();
}

void MultiProcessMapDataZMQ::close() {
  Impl& m = *impl_;
  if (m.link.owner_pid != -1 && m.link.owner_pid != ::getpid()) return;  // a forked copy
  if (!m.stop_consumer()) return;
  m.tasks.clear();
  m.link.close();
  m.task_sender.reset();
  m.mark_closed();
}

bool MultiProcessMapDataZMQ::closed() const noexcept {
  return impl_->closed || impl_->link.gate.closing();
}

}  // namespace tensorwire::dataflow
