// Dataflows and helpers shared by the dataflow tests.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "os/process.h"
#include "tensorwire/dataflow/dataflow.h"

namespace tensorwire::dataflow::testing {

// Datapoint i: {"i": int64 scalar i, "x": uint8[n] filled with i % 251, "name": "dp<i>"}.
inline TensorDict make_datapoint(uint64_t i, int64_t n = 16) {
  TensorDict td;
  Tensor idx = Tensor::empty({}, DType::Int64);
  *idx.data<int64_t>() = static_cast<int64_t>(i);
  td.set("i", idx);
  Tensor x = Tensor::empty({n}, DType::UInt8);
  for (int64_t k = 0; k < n; ++k) x.data<uint8_t>()[k] = static_cast<uint8_t>(i % 251);
  td.set("x", x);
  td.set("name", NonTensor{"dp"});
  return td;
}

inline int64_t index_of(const TensorDict& td) {
  return *td.get("i").data<int64_t>();
}

inline bool datapoint_ok(const TensorDict& td) {
  const Tensor& x = td.get("x");
  const auto want = static_cast<uint8_t>(index_of(td) % 251);
  for (int64_t k = 0; k < x.numel(); ++k)
    if (x.data<uint8_t>()[k] != want) return false;
  return true;
}

// 0 .. n-1 per pass, `bytes` per datapoint; infinite when n is nullopt.
inline std::shared_ptr<DataFlow> counting(std::optional<size_t> n, int64_t bytes = 16) {
  return std::make_shared<FunctionFlow>([bytes](uint64_t i) { return make_datapoint(i, bytes); },
                                        n);
}

// Yields `good` datapoints, then throws ValueError("bad datapoint <good>").
class RaisingFlow : public DataFlow {
 public:
  explicit RaisingFlow(uint64_t good) : good_(good) {}
  std::optional<TensorDict> next() override {
    if (i_ == good_) throw ValueError("bad datapoint " + std::to_string(i_));
    return make_datapoint(i_++);
  }

 private:
  uint64_t good_;
  uint64_t i_ = 0;
};

// Records the worker seed it saw, as datapoints {"seed": uint64 scalar, "worker": int64}.
class SeedFlow : public DataFlow {
 public:
  void reset_state() override {
    const WorkerInfo* w = current_worker();
    seed_ = w ? w->seed : 0;
    worker_ = w ? w->index : -1;
  }
  std::optional<TensorDict> next() override {
    TensorDict td;
    Tensor s = Tensor::empty({}, DType::UInt64);
    *s.data<uint64_t>() = seed_;
    td.set("seed", s);
    Tensor w = Tensor::empty({}, DType::Int64);
    *w.data<int64_t>() = worker_;
    td.set("worker", w);
    return td;
  }

 private:
  uint64_t seed_ = 0;
  int64_t worker_ = -1;
};

// Children of this process that are still there (zombies included), from /proc.
inline std::set<int> child_pids() {
  std::set<int> out;
  const std::string self = std::to_string(::getpid());
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    FILE* f = std::fopen(("/proc/" + std::string(e->d_name) + "/stat").c_str(), "r");
    if (!f) continue;
    char buf[512] = {};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    // "pid (comm) state ppid ...": comm may hold spaces, so read after the last ')'.
    std::string s(buf, n);
    auto close = s.rfind(')');
    if (close == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(s.c_str() + close + 1, " %c %d", &state, &ppid) == 2 &&
        std::to_string(ppid) == self)
      out.insert(pid);
  }
  ::closedir(d);
  return out;
}

inline size_t open_fds() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

// A fixture for tests that fork workers: after each test no child of this process is left
// (workers killed and reaped) and no file descriptor leaked.
class NoLeftovers : public ::testing::Test {
 protected:
  void SetUp() override {
    children_before_ = child_pids();
    fds_before_ = open_fds();
  }
  void TearDown() override {
    EXPECT_EQ(child_pids(), children_before_);
    EXPECT_EQ(open_fds(), fds_before_);
  }
  std::set<int> children_before_;
  size_t fds_before_ = 0;
};

// True when `pid` has ended within `timeout` (it may be a zombie of another parent).
inline bool ends_within(int pid, std::chrono::milliseconds timeout) {
  os::ProcessWatch w;
  try {
    w = os::ProcessWatch(pid);
  } catch (const SystemError&) {
    return true;  // already gone
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!w.alive()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !w.alive();
}

}  // namespace tensorwire::dataflow::testing
