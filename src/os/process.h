// Watching other processes: a pidfd becomes readable when its process exits, which works
// for any process (not only children) and cannot be fooled by pid reuse.
#pragma once

#include <chrono>
#include <string>

#include "os/unix_socket.h"

namespace tensorwire::os {

class ProcessWatch {
 public:
  ProcessWatch() = default;
  explicit ProcessWatch(int pid);  // SystemError if the process does not exist
  ProcessWatch(int pid, Fd pidfd) noexcept : pid_(pid), fd_(std::move(pidfd)) {}  // one received

  int pid() const noexcept { return pid_; }
  int fd() const noexcept { return fd_.get(); }  // pollable: readable once the process exits
  // Non-blocking check.
  bool alive() const;

 private:
  int pid_ = -1;
  Fd fd_;
};

// Reaps child `pid`, waiting up to `timeout` for it to end (it was killed: a process stuck in
// the kernel is given up on). True with its wait status in `*status` (when given) once reaped.
bool reap(int pid, std::chrono::milliseconds timeout, int* status = nullptr) noexcept;

// Describes how a child ended ("exited with status 3", "killed by signal 9 (SIGKILL)")
// from a waitpid() status.
std::string describe_exit(int status);

// In a child just forked by process `parent`: SIGKILL when the thread that forked it exits
// (also when the parent is SIGKILLed, which runs no clean-up), and _exit(1) at once if the
// parent went before the request took hold. Only system calls: safe between fork and exec.
void die_with_parent(int parent) noexcept;
// fork(), with the child tied to the calling thread by die_with_parent: the child's pid in the
// parent, 0 in the child, -1 (errno set) when fork failed.
int fork_tied() noexcept;

// The calling thread's id (gettid), and whether thread `tid` of this process has exited:
// the parent-death signal a forked child sets fires when the thread that forked it exits.
int current_thread_id() noexcept;
bool thread_exited(int tid) noexcept;

}  // namespace tensorwire::os
