#include "os/process.h"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <thread>

#include "tensorwire/core/error.h"

namespace tensorwire::os {

ProcessWatch::ProcessWatch(int pid) : pid_(pid) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) throw SystemError("pidfd_open(" + std::to_string(pid) + ")", errno);
  fd_ = Fd(fd);
}

bool ProcessWatch::alive() const {
  if (!fd_) return false;
  struct pollfd p {
    fd_.get(), POLLIN, 0
  };
  return ::poll(&p, 1, 0) == 0;
}

bool reap(int pid, std::chrono::milliseconds timeout, int* status) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int st = 0;
    const int r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      if (status) *status = st;
      return true;
    }
    if (r < 0 && errno != EINTR) return false;  // not a child (any more)
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* abbrev = ::sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) +
           (abbrev ? " (SIG" + std::string(abbrev) + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

int current_thread_id() noexcept {
  return static_cast<int>(::syscall(SYS_gettid));
}

bool thread_exited(int tid) noexcept {
  char task[40];
  std::snprintf(task, sizeof task, "/proc/self/task/%d", tid);
  return ::access(task, F_OK) != 0 && errno == ENOENT;
}

void die_with_parent(int parent) noexcept {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
}

int fork_tied() noexcept {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) die_with_parent(parent);
  return pid;
}

}  // namespace tensorwire::os
