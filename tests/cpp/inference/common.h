// Shared pieces of the inference tests: specs, a policy, and process helpers.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "os/unix_socket.h"
#include "tensorwire/inference/remote_transport.h"
#include "tensorwire/inference/server.h"
#include "tensorwire/inference/shared_memory_transport.h"
#include "tensorwire/inference/socket_transport.h"
#include "tensorwire/inference/thread_transport.h"

#ifndef INFERENCE_PEER_PATH
#define INFERENCE_PEER_PATH ""
#endif

namespace tw_test {

using namespace tensorwire;
using namespace tensorwire::inference;
using namespace std::chrono_literals;

// float32[4] observation -> float32[2] action (+ the policy version).
inline TensorDict request_spec() {
  TensorDict td;
  td.set("observation", Tensor::zeros({4}, DType::Float32));
  return td;
}
inline TensorDict response_spec(bool with_version = true) {
  TensorDict td;
  td.set("action", Tensor::zeros({2}, DType::Float32));
  if (with_version) td.set("policy_version", Tensor::zeros({}, DType::Int64));
  return td;
}
inline TensorDict observation(float base) {
  TensorDict td;
  td.set("observation", Tensor::from_vector<float>({base, base + 1, base + 2, base + 3}, {4}));
  return td;
}
// action = 2 * observation[:2]
inline TensorDict double_policy(const TensorDict& batch) {
  const Tensor& obs = batch.get("observation");
  const int64_t n = obs.shape()[0];
  Tensor act = Tensor::empty({n, 2}, DType::Float32);
  Tensor o = obs.contiguous();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < 2; ++j) act.data<float>()[i * 2 + j] = 2 * o.data<float>()[i * 4 + j];
  TensorDict out(Shape{n});
  out.set("action", act);
  return out;
}
inline float action0(const TensorDict& r) {
  return r.get("action").data<float>()[0];
}

inline std::shared_ptr<SharedMemoryTransport> make_shm(uint32_t slots, bool copy_result = true,
                                                       const std::string& name = "") {
  SharedMemoryOptions o;
  o.num_slots = slots;
  o.copy_result = copy_result;
  o.name = name;
  return SharedMemoryTransport::create(request_spec(), response_spec(), o);
}

// What InferenceServer hands resolve(): the response spec's "policy_version" key, stamped.
inline VersionStamp version_stamp(int64_t version = 0) {
  static const Key key("policy_version");
  return {&key, version};
}

// Polls `cond` until true or `limit` passes.
inline bool eventually(const std::function<bool()>& cond,
                       std::chrono::milliseconds limit = 5000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

// Runs `fn` in a forked child; returns its pid. The child's exit status is fn()'s value.
// Tests that use it belong to a fixture CMake labels `forked-child` (ForkedChildTest in
// test_processes.cpp): `make test-tsan` excludes them, since ThreadSanitizer's allocator
// is not fork-safe and a child forked from a multithreaded process can deadlock in it.
inline pid_t fork_child(const std::function<int()>& fn) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      code = 98;
    }
    ::_exit(code);
  }
  return pid;
}

// Waits for a child; returns its exit status (or 128 + signal).
inline int wait_child(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// A process running the peer helper, its stdout readable line by line. Its stdin is a
// pipe held here: a serving peer exits when it closes (wait(), or this process dying).
struct Peer {
  pid_t pid = -1;
  FILE* out = nullptr;
  int in = -1;

  static Peer spawn(const std::vector<std::string>& args) {
    // Everything the child needs is built before fork(): between fork and exec the child
    // only calls async-signal-safe functions (no allocation).
    std::string exe = INFERENCE_PEER_PATH;
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    argv.push_back(exe.data());
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2], ins[2];
    if (::pipe2(fds, O_CLOEXEC) != 0 || ::pipe2(ins, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe");
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::dup2(ins[0], 0);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    ::close(ins[0]);
    Peer p;
    p.pid = pid;
    p.out = ::fdopen(fds[0], "r");
    p.in = ins[1];
    return p;
  }
  std::string line() {
    char buf[512];
    if (!std::fgets(buf, sizeof buf, out)) return {};
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void kill(int sig = SIGKILL) const { ::kill(pid, sig); }
  int wait() {
    if (in >= 0) ::close(in);
    in = -1;
    int code = wait_child(pid);
    if (out) std::fclose(out);
    out = nullptr;
    return code;
  }
};

// Entries of /dev/shm (tensorwire must never create any).
inline std::vector<std::string> dev_shm() {
  std::vector<std::string> names;
  if (FILE* f = ::popen("ls -A /dev/shm 2>/dev/null", "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) names.emplace_back(buf);
    ::pclose(f);
  }
  return names;
}

}  // namespace tw_test
