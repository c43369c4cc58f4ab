// Watching other processes: a pidfd becomes readable when its process exits, which works
// for any process (not only children) and cannot be fooled by pid reuse.
#pragma once

#include <string>

#include "os/unix_socket.h"

namespace tensorwire::os {

class ProcessWatch {
 public:
  ProcessWatch() = default;
  explicit ProcessWatch(int pid);  // SystemError if the process does not exist

  int pid() const noexcept { return pid_; }
  int fd() const noexcept { return fd_.get(); }  // pollable: readable once the process exits
  // Non-blocking check.
  bool alive() const;

 private:
  int pid_ = -1;
  Fd fd_;
};

// Describes how a child ended ("exited with status 3", "killed by signal 9 (SIGKILL)")
// from a waitpid() status.
std::string describe_exit(int status);

}  // namespace tensorwire::os
