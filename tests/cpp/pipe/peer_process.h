// Runs a peer program in a second process (posix_spawn, so nothing UCX-related is
// inherited through fork), with extra environment, its stdout and stderr captured.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

extern char** environ;

namespace tensorwire::test_support {

class PeerProcess {
 public:
  PeerProcess(const std::vector<std::string>& args,
              const std::vector<std::string>& env_extra = {}) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe2");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    for (const auto& e : env_extra) env.push_back(e);
    std::vector<char*> argv, envp;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0)
      throw std::runtime_error("posix_spawn " + args[0]);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~PeerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
    ::close(err_);
  }

  // Reads stdout until a line starting with `prefix` (or timeout); returns the line.
  std::string read_line(const std::string& prefix,
                        std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      size_t nl;
      while ((nl = out_buf_.find('\n')) != std::string::npos) {
        std::string line = out_buf_.substr(0, nl);
        out_buf_.erase(0, nl + 1);
        if (line.rfind(prefix, 0) == 0) return line;
      }
      struct pollfd p {
        out_, POLLIN, 0
      };
      if (::poll(&p, 1, 100) > 0) {
        char buf[4096];
        ssize_t n = ::read(out_, buf, sizeof buf);
        if (n <= 0) break;
        out_buf_.append(buf, static_cast<size_t>(n));
      }
    }
    return "";
  }

  // Waits for exit (SIGKILL after the timeout); returns the wait status.
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) ::kill(pid_, SIGKILL);
      ::usleep(10000);
    }
    pid_ = -1;
    return status;
  }
  int exit_code(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    int st = wait(timeout);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  }
  std::string stderr_text() {
    std::string s;
    char buf[4096];
    ::fcntl(err_, F_SETFL, O_NONBLOCK);
    ssize_t n;
    while ((n = ::read(err_, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(n));
    return s;
  }
  void kill(int sig = SIGKILL) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  std::string out_buf_;
};

}  // namespace tensorwire::test_support
