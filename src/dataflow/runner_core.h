// RunnerCore: the main-process state and life cycle that MultiProcessRunnerZMQ and
// MultiProcessMapDataZMQ share (private): argument checks, the base seed, reset_state()
// once, forking the workers, one epoch at a time, "closed" as the final failure, and the
// worker policy (WorkerPolicy: restarts, their limit, the datapoint time limit).
// Each runner's Impl derives from it and adds what differs (credits; task sockets).
#pragma once

#include <atomic>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "dataflow/links.h"
#include "shm/segment.h"
#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::dataflow::detail {

// What a worker is busy with, in shared memory (one cache line per worker): the main
// process's watchdog kills a worker busy on one datapoint longer than the time limit.
struct alignas(64) WorkerProgress {
  std::atomic<int64_t> since_ns{0};  // steady clock; 0: not inside a datapoint
  std::atomic<uint64_t> item{0};     // which datapoint (the runner says how to name it)
  // The item of a worker in its dataflow's reset_state(), which the time limit bounds too:
  // a worker that hangs there (a network open) would otherwise hang the run for ever.
  static constexpr uint64_t kResetState = ~uint64_t{0};

  void begin(uint64_t what) noexcept;
  void end() noexcept { since_ns.store(0, std::memory_order_relaxed); }
};

struct RunnerCore {
  // Checks the dataflow, num_proc and the policy (ValueError naming the argument); `seed`
  // unset: random.
  RunnerCore(const char* name, std::shared_ptr<DataFlow> ds, int num_proc,
             std::optional<uint64_t> seed, Millis liveness_interval, WorkerPolicy policy);
  virtual ~RunnerCore() = default;

  // reset_state(), after begin_reset(): the socket pairs and num_proc workers,
  // worker i running worker_main(i, its sender id, its end of its socket pair) with
  // WorkerInfo{i, num_proc, seed + i} (its k-th replacement: seed + i + k x num_proc). With
  // the restart policy, also the fork server that forks the replacements (workers.h).
  using WorkerMain = std::function<void(int index, uint16_t sender, os::UnixSocket socket)>;
  void start_workers(const ForkHooks& hooks, WorkerMain worker_main);
  // First in reset_state(), before anything is made: ClosedError after close(), StateError
  // the second time, SystemError (EMFILE) naming the limit when the process has too few
  // file descriptors left for its sockets and num_proc workers, each taking about
  // `per_worker` (libzmq aborted the process on EMFILE); SystemError (EAGAIN) naming the
  // limit when a thread or process limit leaves too little room for the workers, each
  // taking about `tasks_per_worker` (its process and libzmq's threads, whose failure to
  // start aborts it). A replacement of a worker (the restart policy) checks for room for
  // one the same way.
  void begin_reset(size_t per_worker, size_t tasks_per_worker);
  // StateError before reset_state() or while another epoch runs.
  void begin_epoch();
  void end_epoch() noexcept { in_epoch = false; }
  // ClosedError after close(); StateError before reset_state().
  void check_started() const;
  void check_open() const;
  // After link.close(): what any later call raises (in the process that owns the runner).
  void mark_closed() noexcept;

  // The consumer's call (next(), an epoch's step, the map's first fill) while it runs:
  // close() from another thread waits for it to leave the link (link.gate). It begins by
  // throwing what an on_restart callback threw in an earlier call (deferred_report).
  // Calls take turns (ConsumerGate): one that waited for its turn until `deadline` is not
  // entered() and returns as at its timeout. Each begins with check_open(): a forked
  // child's copy of the runner (its iterator, an epoch) is refused here, once for all.
  struct ConsumerCall : ConsumerGate::Call {
    explicit ConsumerCall(RunnerCore& core, Deadline deadline = Deadline::never())
        : ConsumerGate::Call((core.check_open(), core.link.gate), core.name, deadline) {
      if (!entered()) return;
      // A failure is final: an earlier call's, or one another thread's call met while this
      // one waited for its turn.
      if (core.failed) std::rethrow_exception(core.failed);
      if (std::exception_ptr e = std::exchange(core.deferred_report, nullptr))
        std::rethrow_exception(e);
    }
  };
  // Start of close(): false when the link must stay until the destructor (ConsumerGate).
  bool stop_consumer() noexcept { return link.gate.stop(kConsumerLeaves, name); }
  static constexpr std::chrono::milliseconds kConsumerLeaves{5000};

  // In a worker: its progress slot, or nullptr without a datapoint time limit.
  WorkerProgress* progress(int index) const;
  // Workers replaced so far.
  uint64_t restarts() const noexcept;
  // Worker `index` never connected, `waited` after it was needed: it is killed (once), and
  // its death, seen by the next check of the workers, takes the policy's way, this reason
  // named. A worker connects right after its fork, before any user code: one that has not
  // is stuck (e.g. on a lock its parent held at the fork, docs/design.md).
  void kill_unstarted(int index, std::chrono::milliseconds waited);

  const char* name;
  std::shared_ptr<DataFlow> ds;
  int num_proc;
  std::optional<size_t> size;
  uint64_t seed;
  WorkerPolicy policy;
  bool reset_done = false;
  bool in_epoch = false;
  bool closed = false;
  MainLink link;
  std::exception_ptr failed;
  // What policy.on_restart threw (a Python warning turned into an error), for the start of
  // the consumer's next call: thrown where the restart was found, in the middle of sending
  // a task or handing a new segment to the workers, it tore that apart (the task dropped,
  // the segment given to some workers and then discarded).
  std::exception_ptr deferred_report;

 protected:
  // Around a restart of worker `index`: before the fork (reset shared state the new worker
  // reads), and after it (hand it what it needs, reissue what the dead one held).
  virtual void before_replacing(int /*index*/) {}
  virtual void after_replacing(int /*index*/, uint16_t /*sender*/) {}
  // How to name the datapoint `item` of a worker's progress in a message.
  virtual std::string describe_item(uint64_t item) const;
  // describe_item(), or what WorkerProgress::kResetState stands for.
  std::string describe_progress(uint64_t item) const;
  // Whether an item names one datapoint whichever worker has it (the map's task ids, kept
  // when a task is sent again). Else it is a position in a worker's own pass: the same
  // datapoint at each restart only for a dataflow whose order does not depend on the seed.
  virtual bool items_are_shared() const { return false; }

 private:
  // SystemError (EMFILE, EAGAIN) naming `what` and the limit, unless `fds` descriptors and
  // `tasks` threads or processes are to be had.
  void require_room(size_t fds, size_t tasks, const std::string& what) const;
  void on_death(const WorkerProcesses::Death& d);
  // The warning (log and on_restart) that worker d.index was replaced by `new_pid`.
  void report_restart(const WorkerProcesses::Death& d, const std::string& why, int new_pid);
  void watch_stuck();
  // Forks the replacement of worker `index` (as `sender`); returns its pid. The caller
  // then calls after_replacing().
  int replace(int index, uint16_t& sender);
  // Forks worker `index` (its current generation) as `sender`; returns its pid.
  int spawn(int index, uint16_t sender);
  uint64_t worker_seed(int index) const;  // seed + index + num_proc x its generation

  // Descriptors the runner's own sockets take, and each worker (begin_reset()).
  static constexpr size_t kFdsOfTheRunner = 16;
  // A replacement's own, beyond a worker's: the runner's sockets exist already (about 2 more
  // at the peak of a restart, measured; room for a few).
  static constexpr size_t kFdsOfAReplacement = 4;
  // Threads and processes the runner's own take (libzmq's, the fork server), and each
  // worker (begin_reset()).
  static constexpr size_t kTasksOfTheRunner = 8;
  size_t tasks_per_worker_ = 0;
  size_t fds_per_worker_ = 0;
  ForkHooks hooks_;
  WorkerMain worker_main_;
  shm::Segment progress_;
  std::vector<std::deque<std::chrono::steady_clock::time_point>> deaths_;  // per index
  std::vector<std::string> stuck_;  // per index: why the watchdog killed it
  // Workers that died on a datapoint: by (worker index, item), or (-1, item) when items
  // name one datapoint whichever worker has it (items_are_shared()).
  std::map<std::pair<int, uint64_t>, int> deaths_on_;
};

}  // namespace tensorwire::dataflow::detail
