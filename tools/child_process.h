// A child process for the tools (the pipe peer, ucx_perftest), with UCX_TLS set in its
// environment and, when asked, its stdout captured. Killed and reaped on destruction, and
// killed with the tool when the tool dies (os::fork_tied): a bench stopped by SIGKILL
// (a timeout) left its ucx_perftest server spinning a CPU for ever.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "os/process.h"
#include "tensorwire/core/error.h"

extern char** environ;

namespace tensorwire::tools {

// The file execvp would run for `name`: itself when it has a slash, else the first
// executable of that name on PATH. Looked up before fork: the child only execs.
inline std::string executable_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* env_path = std::getenv("PATH");
  std::string dirs = env_path != nullptr ? env_path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    start = end + 1;
  }
  throw SystemError("spawn " + name + " (not found on PATH)", ENOENT);
}

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  Child(const std::vector<std::string>& args, const std::string& tls, bool capture) {
    const std::string path = executable_path(args[0]);
    int fds[2] = {-1, -1};
    if (capture && ::pipe2(fds, O_CLOEXEC) != 0) throw SystemError("pipe", errno);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "UCX_TLS=", 8) != 0) env.emplace_back(*e);
    env.push_back("UCX_TLS=" + tls);
    std::vector<char*> argv, envp;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::fflush(nullptr);
    pid = os::fork_tied();
    if (pid < 0) {
      const int err = errno;
      if (capture) ::close(fds[0]), ::close(fds[1]);
      throw SystemError("fork for " + args[0], err);
    }
    if (pid == 0) {  // system calls only from here: the parent may have other threads
      if (capture) ::dup2(fds[1], 1);  // dup2 clears O_CLOEXEC on the copy
      ::execve(path.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    if (capture) {
      ::close(fds[1]);
      out = ::fdopen(fds[0], "r");
    }
  }
  std::string read_all() {
    std::string s;
    char buf[4096];
    size_t n;
    while (out && (n = std::fread(buf, 1, sizeof buf, out)) > 0) s.append(buf, n);
    return s;
  }
  int wait() {
    int st = 0;
    if (pid > 0) ::waitpid(pid, &st, 0);
    pid = -1;
    if (out) std::fclose(out), out = nullptr;
    return st;
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      wait();
    }
  }
};

}  // namespace tensorwire::tools
