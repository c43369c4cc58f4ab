#include "dataflow/workers.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>

#include "os/listeners.h"
#include "os/process.h"
#include "tensorwire/runtime/interrupt.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::dataflow {

namespace {
WorkerInfo g_worker;
bool g_is_worker = false;
int g_parent_pid = -1;
}  // namespace

const WorkerInfo* current_worker() noexcept {
  return g_is_worker ? &g_worker : nullptr;
}

namespace detail {

bool parent_gone() noexcept {
  return g_parent_pid > 0 && ::getppid() != g_parent_pid;
}

int fork_process(const ForkHooks& hooks, const WorkerInfo* info, const std::string& what,
                 const std::function<int()>& body) {
  const int parent = ::getpid();
  std::fflush(nullptr);  // no buffered output written twice
  if (hooks.before) hooks.before();
  const int pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    if (hooks.parent) hooks.parent();
    throw SystemError(what, err);
  }
  if (pid > 0) {
    if (hooks.parent) hooks.parent();
    return pid;
  }
  if (info) {
    g_worker = *info;  // before the hook, which may seed random generators from it
    g_is_worker = true;
  }
  g_parent_pid = parent;
  os::die_with_parent(parent);
  // Its copies of the parent's listening sockets would keep their ports taken after their
  // owners closed them, for as long as this worker lives.
  os::release_inherited_listeners();
  // Ctrl-C is the parent's to handle (it closes its workers): ignored from the start, so
  // that one sent to the process group cannot land in the child's hook (a seeding).
  ::signal(SIGINT, SIG_IGN);
  int code = 1;
  try {
    // Inside the try: nothing may unwind into the forking code's copy (a fork server's loop,
    // the caller's program).
    if (hooks.child) hooks.child();
    code = body();
  } catch (...) {
    code = 1;
  }
  std::fflush(nullptr);
  ::_exit(code);
}

void WorkerProcesses::start_fork_server(const ForkHooks& hooks,
                                        const std::function<void()>& in_server,
                                        ForkServer::Body body) {
  if (parent_pid_ < 0) parent_pid_ = ::getpid();
  server_ = std::make_unique<ForkServer>(
      owner_, hooks,
      [this, &in_server] {
        forget_in_child();
        in_server();
      },
      std::move(body));
}

std::optional<ForkServer::Spawned> WorkerProcesses::spawn_by_server(const WorkerInfo& info,
                                                                    uint32_t tag,
                                                                    const std::vector<int>& fds) {
  try {
    return server_->spawn(info, tag, fds);
  } catch (const SystemError&) {
    throw;  // its fork failed: so would ours
  } catch (const Interrupted&) {
    throw;  // Ctrl-C: the server is fine
  } catch (const Error& e) {
    log_message(LogLevel::Warning, owner_ + ": the fork server is gone (" + e.what() +
                                       "); workers are now forked by the main process");
    server_.reset();
    return std::nullopt;
  }
}

int WorkerProcesses::spawn(const WorkerInfo& info, const ForkHooks& hooks,
                           const std::function<int()>& body, uint32_t tag,
                           const std::vector<int>& fds) {
  if (parent_pid_ < 0) parent_pid_ = ::getpid();
  Worker w;
  w.index = info.index;
  if (auto s = server_ ? spawn_by_server(info, tag, fds) : std::nullopt) {
    w.pid = s->pid;
    w.watch = os::ProcessWatch(s->pid, std::move(s->pidfd));
    w.by_server = true;
  } else {
    w.pid =
        fork_process(hooks, &info, owner_ + ": fork of worker " + std::to_string(info.index), body);
    w.forker_tid = os::current_thread_id();
    try {
      w.watch = os::ProcessWatch(w.pid);
    } catch (...) {
      ::kill(w.pid, SIGKILL);
      ::waitpid(w.pid, nullptr, 0);
      throw;
    }
  }
  const int pid = w.pid;
  for (Worker& old : workers_)
    if (old.index == info.index) {
      old = std::move(w);  // a restart: the old one was reaped
      return pid;
    }
  workers_.push_back(std::move(w));
  return pid;
}

std::optional<WorkerProcesses::Death> WorkerProcesses::reap_dead() {
  for (Worker& w : workers_) {
    if (w.reaped || w.watch.alive()) continue;
    std::optional<int> status;
    if (w.by_server) {
      // The server reaps its children and reports: a moment after the pidfd said so.
      if (server_) status = server_->status_of(w.pid, Deadline::after(std::chrono::seconds(1)));
    } else {
      int st = 0;
      int r;
      do {
        r = ::waitpid(w.pid, &st, 0);
      } while (r < 0 && errno == EINTR);
      if (r == w.pid) status = st;
    }
    w.reaped = true;
    w.status = status.value_or(-1);
    std::string how = status ? os::describe_exit(*status) : "ended (exit status unavailable)";
    if (status && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL && !w.by_server &&
        w.forker_tid >= 0 && os::thread_exited(w.forker_tid))
      how +=
          " (the thread that started it has exited, and a worker is killed with the thread "
          "that forked it: call reset_state() from a thread that lives as long as the runner)";
    return Death{w.index, w.pid, w.status, std::move(how)};
  }
  return std::nullopt;
}

WorkerDiedError WorkerProcesses::died(const Death& d, const std::string& why) const {
  return WorkerDiedError(owner_ + ": worker " + std::to_string(d.index) + " (pid " +
                             std::to_string(d.pid) + ") " + d.how + why,
                         d.index, d.pid, d.status);
}

void WorkerProcesses::check() {
  if (auto d = reap_dead()) throw died(*d);
}

void WorkerProcesses::kill(int index) noexcept {
  for (Worker& w : workers_)
    if (w.index == index && !w.reaped &&
        ::syscall(SYS_pidfd_send_signal, w.watch.fd(), SIGKILL, nullptr, 0) != 0)
      ::kill(w.pid, SIGKILL);
}

std::vector<int> WorkerProcesses::pidfds() const {
  std::vector<int> fds;
  for (const Worker& w : workers_)
    if (!w.reaped) fds.push_back(w.watch.fd());
  return fds;
}

std::vector<int> WorkerProcesses::pids() const {
  std::vector<int> pids;
  for (const Worker& w : workers_) pids.push_back(w.pid);
  return pids;
}

void WorkerProcesses::forget_in_child() noexcept {
  for (Worker& w : workers_) w.watch = os::ProcessWatch();
  workers_.clear();
  parent_pid_ = -1;
  server_.reset();  // lets go of the link only: the server is not this process's child
}

void WorkerProcesses::kill_all() noexcept {
  if (parent_pid_ != ::getpid()) return;  // a forked copy: these are not our children
  for (Worker& w : workers_) {
    if (w.reaped) continue;
    // Through the pidfd: the pid cannot have been reused, as we have not reaped it.
    if (::syscall(SYS_pidfd_send_signal, w.watch.fd(), SIGKILL, nullptr, 0) != 0)
      ::kill(w.pid, SIGKILL);
  }
  for (Worker& w : workers_) {
    if (w.reaped || w.by_server) continue;
    os::reap(w.pid, std::chrono::seconds(10));  // stuck in the kernel after that: give up
    w.reaped = true;
  }
  server_.reset();  // it reaps its own (killed above) and exits; reaped by its close()
  workers_.clear();
}

}  // namespace detail
}  // namespace tensorwire::dataflow
