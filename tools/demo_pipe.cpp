// The pipe part of `tensorwire demo`: a second process streams TensorDicts to this one
// over a TensorDictPipe; a progress bar, then a summary.
#include <chrono>
#include <cstdio>

#include "child_process.h"
#include "commands.h"
#include "tensorwire/pipe/pipe.h"

namespace tensorwire::tools {

DemoRow demo_pipe() {
  const int count = 300;
  const size_t bytes = 4 << 20;
  const char* tls_env = std::getenv("UCX_TLS");
  const std::string tls = tls_env ? tls_env : "sm,tcp";
  std::printf(
      "\n== TensorDictPipe: a second process streams %d TensorDicts of %zu MiB (UCX_TLS=%s) ==\n",
      count, bytes >> 20, tls.c_str());
  PipeListener listener(0);
  Child peer(
      {"/proc/self/exe", "bench-pipe-peer", "send", "127.0.0.1", std::to_string(listener.port()),
       std::to_string(bytes), std::to_string(count), "consolidated"},
      tls, false);
  auto pipe = listener.accept(std::chrono::seconds(30));
  if (!pipe) {
    std::printf("the sender did not connect\n");
    return {"pipe", "-", "the sender did not connect", false};
  }
  const TensorDict* first = nullptr;
  int same = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    TensorDict& td = pipe->recv(nullptr, std::chrono::seconds(30));
    same += (&td == first);
    if (!first) first = &td;
    if ((i + 1) % 10 == 0 || i + 1 == count) {
      int filled = (i + 1) * 40 / count;
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("\r[%.*s%*s] %3d/%d  %.2f GB/s", filled,
                  "########################################", 40 - filled, "", i + 1, count,
                  static_cast<double>(bytes) * (i + 1) / secs / 1e9);
      std::fflush(stdout);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  pipe->close();
  peer.wait();
  std::printf(
      "\nreceived %d dicts, %.2f GB in %.3f s (%.2f GB/s); %d of %d receives landed in place in "
      "the same "
      "TensorDict (one schema, then storage only)\n",
      count, static_cast<double>(bytes) * count / 1e9, secs,
      static_cast<double>(bytes) * count / secs / 1e9, same, count - 1);
  return {"pipe",
          strprintf("%d x %.0f MiB from a second process: %.2f GB/s", count,
                    static_cast<double>(bytes) / (1 << 20),
                    static_cast<double>(bytes) * count / secs / 1e9),
          strprintf("%d/%d receives in place", same, count - 1), same == count - 1};
}

}  // namespace tensorwire::tools
