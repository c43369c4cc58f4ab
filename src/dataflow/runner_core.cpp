#include "dataflow/runner_core.h"

#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>

#include "os/fd_budget.h"
#include "os/fork.h"
#include "os/task_budget.h"
#include "tensorwire/core/error.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::dataflow::detail {

namespace {
using Clock = std::chrono::steady_clock;

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Longer than any run: a window or a time limit beyond it is for ever (100 years fits the
// steady clock's nanoseconds with room to add to a time point).
constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365 * 100);

std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}
}  // namespace

void WorkerProgress::begin(uint64_t what) noexcept {
  item.store(what, std::memory_order_relaxed);
  since_ns.store(now_ns(), std::memory_order_release);
}

RunnerCore::RunnerCore(const char* runner_name, std::shared_ptr<DataFlow> dataflow, int n,
                       std::optional<uint64_t> base_seed, Millis liveness_interval,
                       WorkerPolicy worker_policy)
    : name(runner_name),
      ds(std::move(dataflow)),
      num_proc(n),
      seed(base_seed ? *base_seed : random_seed()),
      policy(std::move(worker_policy)),
      link(runner_name, liveness_interval) {
  const std::string who(name);
  if (!ds) throw ValueError(who + ": no dataflow");
  if (num_proc < 1 || num_proc > 1024)
    throw ValueError(who + ": num_proc must be in [1, 1024], got " + std::to_string(num_proc));
  // 0 would make every blocked wait spin (a CPU at 100%), a negative one too.
  if (liveness_interval.count() <= 0)
    throw ValueError(who + ": liveness_interval must be positive, got " +
                     seconds(liveness_interval));
  if (policy.max_restarts < 0)
    throw ValueError(who + ": max_restarts must be 0 or more, got " +
                     std::to_string(policy.max_restarts));
  if (policy.restart_window.count() <= 0)
    throw ValueError(who + ": restart_window must be positive, got " +
                     seconds(policy.restart_window));
  if (policy.datapoint_timeout && policy.datapoint_timeout->count() <= 0)
    throw ValueError(who + ": datapoint_timeout must be positive (or none), got " +
                     seconds(*policy.datapoint_timeout));
  // For ever (an infinite timeout from Python, a huge one): both are compared with the
  // steady clock in nanoseconds, where such a value would overflow to a negative one (every
  // worker "stuck" at once; the restart window emptied past its end, a crash).
  if (policy.restart_window > kForever) policy.restart_window = kForever;
  if (policy.datapoint_timeout && *policy.datapoint_timeout > kForever)
    policy.datapoint_timeout.reset();
  size = ds->size();
}

void RunnerCore::begin_reset(size_t per_worker, size_t tasks_per_worker) {
  check_open();
  if (reset_done) throw StateError(std::string(name) + ": reset_state() was called twice");
  fds_per_worker_ = per_worker;
  tasks_per_worker_ = tasks_per_worker;
  const auto n = static_cast<size_t>(num_proc);
  require_room(kFdsOfTheRunner + per_worker * n, kTasksOfTheRunner + tasks_per_worker * n,
               std::string(name) + " with " + std::to_string(num_proc) + " workers");
}

// libzmq aborts the process on EMFILE, and a process (this one, or a worker) whose threads
// it cannot start: checked before anything is made, the error names the limit.
void RunnerCore::require_room(size_t fds, size_t tasks, const std::string& what) const {
  os::require_free_fds(fds, what);
  os::require_free_tasks(tasks, what);
}

void RunnerCore::start_workers(const ForkHooks& hooks, WorkerMain worker_main) {
  reset_done = true;
  hooks_ = hooks;
  worker_main_ = std::move(worker_main);
  deaths_.assign(static_cast<size_t>(num_proc), {});
  stuck_.assign(static_cast<size_t>(num_proc), {});
  if (policy.datapoint_timeout) {
    progress_ = shm::Segment::create("dataflow-progress",
                                     sizeof(WorkerProgress) * static_cast<size_t>(num_proc));
    for (int i = 0; i < num_proc; ++i) new (progress(i)) WorkerProgress{};
    link.watchdog = [this] { watch_stuck(); };
  }
  link.on_death = [this](const WorkerProcesses::Death& d) { on_death(d); };
  link.make_sockets(num_proc);
  for (int i = 0; i < num_proc; ++i) spawn(i, link.sender_of(i));
  // Now, while the runner has started no thread: a replacement forked later from this
  // process could inherit a lock held by one (workers.h).
  if (policy.on_death == OnWorkerDeath::Restart)
    link.workers.start_fork_server(
        hooks_, [this] { link.forget_in_child(); },
        [this](const WorkerInfo& info, uint32_t sender, std::vector<os::Fd> fds) -> int {
          worker_main_(info.index, static_cast<uint16_t>(sender),
                       os::UnixSocket(std::move(fds.at(0))));  // it ends its process
          return 0;
        });
}

uint64_t RunnerCore::worker_seed(int index) const {
  return seed + static_cast<uint64_t>(index) +
         static_cast<uint64_t>(num_proc) * link.generation[static_cast<size_t>(index)];
}

int RunnerCore::spawn(int index, uint16_t sender) {
  return link.workers.spawn(WorkerInfo{index, num_proc, worker_seed(index)}, hooks_,
                            [this, index, sender]() -> int {
                              worker_main_(index, sender,
                                           link.take_child_end(sender));  // it ends its process
                              return 0;
                            },
                            sender, {link.child_ends[sender].fd()});
}

uint64_t RunnerCore::restarts() const noexcept {
  uint64_t n = 0;
  for (uint32_t g : link.generation) n += g;  // each replacement is a new generation
  return n;
}

WorkerProgress* RunnerCore::progress(int index) const {
  if (!progress_.data()) return nullptr;
  return reinterpret_cast<WorkerProgress*>(progress_.data()) + index;
}

std::string RunnerCore::describe_item(uint64_t item) const {
  return "datapoint " + std::to_string(item) + " of its pass";
}

std::string RunnerCore::describe_progress(uint64_t item) const {
  return item == WorkerProgress::kResetState ? "its dataflow's reset_state()" : describe_item(item);
}

void RunnerCore::watch_stuck() {
  const int64_t limit_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(*policy.datapoint_timeout).count();
  const int64_t now = now_ns();
  for (int i = 0; i < num_proc; ++i) {
    WorkerProgress& p = *progress(i);
    const int64_t since = p.since_ns.load(std::memory_order_acquire);
    auto& why = stuck_[static_cast<size_t>(i)];
    if (since == 0 || now - since <= limit_ns || !why.empty()) continue;
    why = ": it was stuck on " + describe_progress(p.item.load(std::memory_order_relaxed)) +
          " for longer than datapoint_timeout (" + seconds(*policy.datapoint_timeout) +
          ") and was killed";
    link.workers.kill(i);
  }
}

void RunnerCore::kill_unstarted(int index, std::chrono::milliseconds waited) {
  auto& why = stuck_[static_cast<size_t>(index)];
  if (!why.empty()) return;
  why = ": it had not connected " + seconds(waited) + " after it was needed, and was killed";
  link.workers.kill(index);
}

void RunnerCore::on_death(const WorkerProcesses::Death& d) {
  const auto index = static_cast<size_t>(d.index);
  std::string why = std::move(stuck_[index]);
  stuck_[index].clear();
  if (policy.on_death == OnWorkerDeath::Raise) throw link.workers.died(d, why);
  // A datapoint that workers die on (or get stuck on) again and again ends the run, however
  // far apart the deaths are: killed after datapoint_timeout, each death may fall outside
  // restart_window of the last, and the count below would never stop the loop.
  if (const WorkerProgress* p = progress(d.index);
      p && p->since_ns.load(std::memory_order_acquire) != 0) {
    const uint64_t item = p->item.load(std::memory_order_relaxed);
    const int n = ++deaths_on_[{items_are_shared() ? -1 : d.index, item}];
    if (n > policy.max_restarts)
      throw link.workers.died(d, why + "; " + std::to_string(n) + " workers died on " +
                                     describe_progress(item) + ", more than max_restarts (" +
                                     std::to_string(policy.max_restarts) + "), so the run ends");
  }
  auto& times = deaths_[index];
  const auto now = Clock::now();
  times.push_back(now);
  while (now - times.front() > policy.restart_window) times.pop_front();
  if (times.size() > static_cast<size_t>(policy.max_restarts))
    throw link.workers.died(
        d, why + "; it died " + std::to_string(times.size()) + " times within restart_window (" +
               seconds(policy.restart_window) + "), more than max_restarts (" +
               std::to_string(policy.max_restarts) + "), so it is not restarted again");
  uint16_t sender = 0;
  const int pid = replace(d.index, sender);
  // Reported before after_replacing(): that may send tasks, wait, and see (and report)
  // another death inside this one; the reports then keep their order.
  report_restart(d, why, pid);
  after_replacing(d.index, sender);
}

void RunnerCore::report_restart(const WorkerProcesses::Death& d, const std::string& why,
                                int new_pid) {
  WorkerRestart r;
  r.worker = d.index;
  r.pid = d.pid;
  r.wait_status = d.status;
  r.new_pid = new_pid;
  r.new_seed = worker_seed(d.index);
  r.restarts = restarts();
  r.message = std::string(name) + ": worker " + std::to_string(d.index) + " (pid " +
              std::to_string(d.pid) + ") " + d.how + why + "; restarted as pid " +
              std::to_string(new_pid) + " with seed " + std::to_string(r.new_seed) + " (restart " +
              std::to_string(r.restarts) + ")";
  log_message(LogLevel::Warning, r.message);
  if (!policy.on_restart) return;
  try {
    policy.on_restart(r);
  } catch (...) {
    if (!deferred_report) deferred_report = std::current_exception();  // the first one
  }
}

int RunnerCore::replace(int index, uint16_t& sender) {
  // As at the start: a replacement connects to this process's sockets, and libzmq aborts
  // the process on EMFILE (and a worker that cannot start its threads), where the user's
  // code may have taken the descriptors or threads since (the run ends with the error
  // instead, nothing made for the replacement).
  require_room(fds_per_worker_ + kFdsOfAReplacement, tasks_per_worker_,
               std::string(name) + " replacing worker " + std::to_string(index));
  sender = link.next_generation(index);
  if (WorkerProgress* p = progress(index)) p->end();
  before_replacing(index);
  const int pid = spawn(index, sender);
  link.child_ends[sender].close();
  return pid;
}

void RunnerCore::check_open() const {
  if (closed || link.gate.closing()) throw ClosedError(std::string(name) + " is closed");
  // A forked child holds a copy whose sockets and workers belong to its parent.
  if (link.owner_pid != -1 && link.owner_generation != os::fork_generation())
    throw ClosedError(std::string(name) + " was started by process " +
                      std::to_string(link.owner_pid) +
                      "; this forked child cannot use it (make a new one here)");
}

void RunnerCore::check_started() const {
  check_open();
  if (!reset_done) throw StateError(std::string(name) + ": call reset_state() before iterating");
}

void RunnerCore::begin_epoch() {
  check_started();
  if (in_epoch) throw StateError("This DataFlow is not reentrant!");
  in_epoch = true;
}

void RunnerCore::mark_closed() noexcept {
  if (link.owner_pid == -1 || link.owner_pid == ::getpid()) closed = true;
  if (!failed && reset_done && link.owner_pid == ::getpid())
    failed = std::make_exception_ptr(ClosedError(std::string(name) + " is closed"));
}

}  // namespace tensorwire::dataflow::detail
