// ForkServer: forks a runner's replacement workers from a single-threaded process.
//
// Why: by the time a worker dies, the main process has threads (ZeroMQ's I/O threads, the
// caller's own, a sanitizer's). fork() copies only the calling thread, so a lock another
// thread held at that moment (an allocator's, a library's, the dataflow's own) stays locked
// for ever in the child, and a replacement forked from the main process can hang on its first
// use of it. The fork server is forked beside the first workers, before the main process
// starts any thread of its own, and then only forks: each replacement is a fork of that quiet
// copy, in the state the first workers were forked in.
//
// The server is a child of the main process and the parent of the workers it forks. For each
// it hands back the pid and a pidfd (SCM_RIGHTS, opened while the worker could not yet have
// been reaped, so never another process's), reaps it when it ends and reports its wait
// status. It goes when the main process closes the link (it then kills and reaps what it
// forked) or dies (PR_SET_PDEATHSIG; its workers follow it the same way).
//
// Thread-safety: one thread at a time (the runner's).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "os/process.h"
#include "os/unix_socket.h"
#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::dataflow::detail {

class ForkServer {
 public:
  // What each worker the server forks runs: its info, the tag of spawn() and the fds it sent.
  // Returns the worker's exit status.
  using Body = std::function<int(const WorkerInfo&, uint32_t tag, std::vector<os::Fd> fds)>;

  // Forks the server (SystemError when fork fails). In the server, after `hooks.child`,
  // `in_server` drops what belongs to the main process; `hooks` are run around each fork
  // there too.
  ForkServer(std::string owner, ForkHooks hooks, const std::function<void()>& in_server, Body body);
  ~ForkServer() { close(); }
  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;

  struct Spawned {
    int pid = -1;
    os::Fd pidfd;
  };
  // Has the server fork worker `info`, handing it `tag` and a copy of `fds`. SystemError when
  // its fork failed; ClosedError when the server is gone; TimeoutError when it does not answer
  // within 10 s (stopped).
  Spawned spawn(const WorkerInfo& info, uint32_t tag, const std::vector<int>& fds);
  // The wait status of worker `pid`, which has ended: the server's report, waited for until
  // `deadline`. std::nullopt when it does not come (the server is gone or stopped).
  std::optional<int> status_of(int pid, Deadline deadline);

  int pid() const noexcept { return pid_; }
  // After close(): the server's wait status (an exit of 0 when it quit as told), -1 before.
  int exit_status() const noexcept { return exit_status_; }
  // Ends the server and reaps it (bounded: a stopped server is killed). It kills and reaps the
  // workers it forked. In a forked copy of the owner, only lets go of the link.
  void close() noexcept;

 private:
  [[noreturn]] void serve(const std::function<void()>& in_server);
  // In the server: forks the worker of one order and answers it; false for the quit order.
  bool fork_worker(os::Message order, std::map<int, os::ProcessWatch>& children);
  // The server's next report, waited for until `deadline` (std::nullopt), not interruptible.
  std::optional<os::Message> next_report(Deadline deadline);

  // The server's process name (comm), and the one it gives back to the workers it forks.
  static constexpr const char* kProcessName = "tw-forkserver";
  char worker_name_[16] = {};
  std::string owner_;
  ForkHooks hooks_;
  Body body_;
  int pid_ = -1;
  int owner_pid_ = -1;
  int exit_status_ = -1;
  os::UnixSocket link_;
  std::map<int, int> ended_;  // pid -> wait status, reports not asked for yet
};

}  // namespace tensorwire::dataflow::detail
