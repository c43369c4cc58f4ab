// Worker processes of a runner: fork, die-with-parent, liveness and reaping.
//
// A worker is a fork() that runs a body and _exit()s: it never returns into the forking
// code, so no destructor of the parent's objects runs in it. In the child (fork_process):
// the fork hooks run, PR_SET_PDEATHSIG(SIGKILL) ties it to the thread that forked (and it
// exits at once if that is already gone), SIGINT is ignored (Ctrl-C is for the main
// process; workers go when it closes them or dies), and current_worker() describes it.
//
// The first workers are forked by the calling process. Once start_fork_server() was called
// (before the process starts threads), replacements are forked by the fork server
// (fork_server.h), a single-threaded copy of the process made then, so that no lock held by
// one of the main process's later threads is copied into them locked. If the server is gone,
// a replacement is forked here again, with a warning.
//
// The main process watches each worker through a pidfd: reap_dead() reports (and reaps) a
// worker that has ended, check() throws WorkerDiedError naming it and its exit status (for a
// worker of the fork server, the status the server reported). spawn() with the index of a
// reaped worker replaces it (a runner's "restart" policy). kill_all() sends SIGKILL and
// reaps; it does nothing in a process other than the one that forked (a forked copy of the
// object must not kill its siblings).
//
// Thread-safety: one thread at a time.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dataflow/fork_server.h"
#include "os/process.h"
#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::dataflow::detail {

class WorkerProcesses {
 public:
  explicit WorkerProcesses(std::string owner) : owner_(std::move(owner)) {}
  ~WorkerProcesses() { kill_all(); }
  WorkerProcesses(const WorkerProcesses&) = delete;
  WorkerProcesses& operator=(const WorkerProcesses&) = delete;

  // Forks the fork server (call it before this process starts threads). In the server, this
  // object forgets its workers and `in_server` drops the rest of what belongs to the main
  // process; each worker the server forks runs `body` with the tag and fds of spawn().
  void start_fork_server(const ForkHooks& hooks, const std::function<void()>& in_server,
                         ForkServer::Body body);
  // Forks worker `info.index` (replacing a reaped one of that index) and returns its pid: by
  // the fork server when there is one (its body gets `tag` and a copy of `fds`), else here
  // (the child runs body()). The worker _exit()s with the body's result.
  int spawn(const WorkerInfo& info, const ForkHooks& hooks, const std::function<int()>& body,
            uint32_t tag = 0, const std::vector<int>& fds = {});

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
    bool by_server = false;  // the fork server's child: it reaps it and reports the status
    int status = -1;
    // The thread that forked it (a direct fork): its PDEATHSIG fires when that thread
    // exits, which a death report then says.
    int forker_tid = -1;
  };
  // Forks through the fork server; std::nullopt when it is gone (it is then closed).
  std::optional<ForkServer::Spawned> spawn_by_server(const WorkerInfo& info, uint32_t tag,
                                                     const std::vector<int>& fds);

  std::string owner_;
  std::vector<Worker> workers_;
  int parent_pid_ = -1;
  std::unique_ptr<ForkServer> server_;
};

// Forks a process that runs body() and _exit()s with its result; returns its pid (SystemError
// naming `what` when fork() fails). The hooks run around the fork and first thing in the
// child; with `info`, the child is a worker that current_worker() describes.
int fork_process(const ForkHooks& hooks, const WorkerInfo* info, const std::string& what,
                 const std::function<int()>& body);

// The parent of this worker process is gone (reparented).
bool parent_gone() noexcept;

}  // namespace tensorwire::dataflow::detail
