// A child process for the tools (the pipe peer, ucx_perftest), with UCX_TLS set in its
// environment and, when asked, its stdout captured. Killed and reaped on destruction.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tensorwire/core/error.h"

extern char** environ;

namespace tensorwire::tools {

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  Child(const std::vector<std::string>& args, const std::string& tls, bool capture) {
    int fds[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (capture) {
      if (::pipe(fds) != 0) throw SystemError("pipe", errno);
      posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
      posix_spawn_file_actions_addclose(&fa, fds[0]);
    }
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "UCX_TLS=", 8) != 0) env.emplace_back(*e);
    env.push_back("UCX_TLS=" + tls);
    std::vector<char*> argv, envp;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw SystemError("spawn " + args[0], rc);
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
