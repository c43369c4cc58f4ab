#include "dataflow/workers.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>

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

int WorkerProcesses::spawn(const WorkerInfo& info, const ForkHooks& hooks,
                           const std::function<int()>& body) {
  if (parent_pid_ < 0) parent_pid_ = ::getpid();
  const int parent = ::getpid();
  std::fflush(nullptr);  // no buffered output written twice
  if (hooks.before) hooks.before();
  const int pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    if (hooks.parent) hooks.parent();
    throw SystemError(owner_ + ": fork of worker " + std::to_string(info.index), err);
  }
  if (pid == 0) {
    g_worker = info;  // before the hook, which may seed random generators from it
    g_is_worker = true;
    g_parent_pid = parent;
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the parent went before the prctl took hold
    if (hooks.child) hooks.child();
    ::signal(SIGINT, SIG_IGN);
    int code = 1;
    try {
      code = body();
    } catch (...) {
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  if (hooks.parent) hooks.parent();
  Worker w;
  w.index = info.index;
  w.pid = pid;
  try {
    w.watch = os::ProcessWatch(pid);
  } catch (...) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    throw;
  }
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
    int status = 0;
    int r;
    do {
      r = ::waitpid(w.pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    w.reaped = true;
    w.status = r == w.pid ? status : -1;
    return Death{w.index, w.pid, w.status,
                 r == w.pid ? os::describe_exit(status) : "ended (exit status unavailable)"};
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
    if (w.reaped) continue;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      int status = 0;
      const int r = ::waitpid(w.pid, &status, WNOHANG);
      if (r == w.pid || (r < 0 && errno != EINTR)) break;
      if (std::chrono::steady_clock::now() > deadline) break;  // stuck in the kernel: give up
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    w.reaped = true;
  }
  workers_.clear();
}

}  // namespace detail
}  // namespace tensorwire::dataflow
