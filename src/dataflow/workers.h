// Worker processes of a runner: fork, die-with-parent, liveness and reaping.
//
// A worker is a fork() of the calling process that runs a body and _exit()s: it never
// returns into the caller's code, so no destructor of the parent's objects runs in it.
// In the child: the fork hooks run, PR_SET_PDEATHSIG(SIGKILL) ties it to the thread that
// forked (and it exits at once if that is already gone), SIGINT is ignored (Ctrl-C
// is for the main process; workers go when it closes them or dies), and
// current_worker() describes it.
//
// The parent watches each worker through a pidfd: reap_dead() reports (and reaps) a worker
// that has ended, check() throws WorkerDiedError naming it and its exit status. spawn()
// with the index of a reaped worker replaces it (a runner's "restart" policy). kill_all() sends
// SIGKILL and reaps; it does nothing in a process other than the one that forked (a forked copy of
// the object must not kill its siblings).
//
// Thread-safety: one thread at a time.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "os/process.h"
#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::dataflow::detail {

class WorkerProcesses {
 public:
  explicit WorkerProcesses(std::string owner) : owner_(std::move(owner)) {}
  ~WorkerProcesses() { kill_all(); }
  WorkerProcesses(const WorkerProcesses&) = delete;
  WorkerProcesses& operator=(const WorkerProcesses&) = delete;

  // Forks worker `info.index` (replacing a reaped one of that index); the child runs
  // body() and _exit()s with its result. Returns the child's pid.
  int spawn(const WorkerInfo& info, const ForkHooks& hooks, const std::function<int()>& body);

  struct Death {
    int index = 0;
    int pid = -1;
    int status = -1;  // as from waitpid(); -1 when unavailable
    std::string how;  // "killed by signal 9 (SIGKILL)", "exited with status 3"
  };
  // The first worker found ended, reaped; std::nullopt when all are alive.
  std::optional<Death> reap_dead();
  // The WorkerDiedError for `d` ("<owner>: worker i (pid p) <how><why>").
  WorkerDiedError died(const Death& d, const std::string& why = "") const;
  // Throws died() for the first worker found ended (and reaps it).
  void check();
  // SIGKILLs worker `index` (a stuck one); its death is then reported as any other.
  void kill(int index) noexcept;
  // Pollable fds, one per worker, readable once it has ended.
  std::vector<int> pidfds() const;
  std::vector<int> pids() const;
  size_t size() const noexcept { return workers_.size(); }
  // In a child: closes the parent-side pidfds it inherited.
  void forget_in_child() noexcept;

  void kill_all() noexcept;

 private:
  struct Worker {
    int index = 0;
    int pid = -1;
    os::ProcessWatch watch;
    bool reaped = false;
    int status = -1;
  };
  std::string owner_;
  std::vector<Worker> workers_;
  int parent_pid_ = -1;
};

// The parent of this worker process is gone (reparented).
bool parent_gone() noexcept;

}  // namespace tensorwire::dataflow::detail
