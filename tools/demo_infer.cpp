// The inference part of `tensorwire demo`: N actor processes ask one server for actions
// through a SharedMemoryTransport, with a progress bar and a summary.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "os/process.h"
#include "tensorwire/inference/server.h"
#include "tensorwire/inference/shared_memory_transport.h"

namespace tensorwire::tools {

namespace {

using namespace inference;

constexpr int64_t kActions = 6;

// A stand-in policy: logits from the mean of each colour channel of the frame.
TensorDict pixel_policy(const TensorDict& batch) {
  const Tensor& frames = batch.get("pixels");
  const int64_t n = frames.shape()[0], pixels = 84 * 84;
  Tensor logits = Tensor::empty({n, kActions}, DType::Float32);
  const auto* src = static_cast<const uint8_t*>(frames.data());
  for (int64_t i = 0; i < n; ++i) {
    double mean[3] = {0, 0, 0};
    for (int64_t p = 0; p < pixels; ++p)
      for (int c = 0; c < 3; ++c) mean[c] += src[(i * pixels + p) * 3 + c];
    for (int64_t a = 0; a < kActions; ++a)
      logits.data<float>()[i * kActions + a] =
          static_cast<float>(mean[a % 3] / pixels / 255.0 * (a + 1));
  }
  TensorDict out(Shape{n});
  out.set("logits", logits);
  return out;
}

void progress(uint64_t done, uint64_t total, double seconds) {
  const int width = 40;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::printf("\r  [%s] %6lu / %lu requests  %5.1f s", bar.c_str(),
              static_cast<unsigned long>(done), static_cast<unsigned long>(total), seconds);
  std::fflush(stdout);
}

}  // namespace

DemoRow demo_infer(int actors, int steps) {
  std::printf("\n== inference: %d actor processes, one batched policy server ==\n\n", actors);
  TensorDict request;
  request.set("pixels", Tensor::zeros({84, 84, 3}, DType::UInt8));
  TensorDict response;
  response.set("logits", Tensor::zeros({kActions}, DType::Float32));
  response.set("policy_version", Tensor::zeros({}, DType::Int64));
  SharedMemoryOptions so;
  so.num_slots = static_cast<uint32_t>(actors);
  auto transport = SharedMemoryTransport::create(request, response, so);
  auto sizes = transport->sizes();
  std::printf(
      "  transport '%s': %u slots, shared memory %.2f MiB (control %zu B, requests %zu B, "
      "responses %zu B), nothing in /dev/shm\n",
      transport->name().c_str(), transport->num_slots(),
      static_cast<double>(sizes.total()) / (1 << 20), sizes.control, sizes.requests,
      sizes.responses);
  InferenceServer server(pixel_policy, transport, {.max_batch_size = actors});
  server.start();

  std::vector<pid_t> kids;
  std::fflush(nullptr);
  for (int a = 0; a < actors; ++a) {
    pid_t pid = os::fork_tied();  // an actor ends with the demo, however the demo ends
    if (pid == 0) {
      int code = 0;
      try {
        // An unrelated process would do the same: attach by name.
        Client client = SharedMemoryTransport::client_for(transport->name());
        TensorDict obs;
        Tensor frame = Tensor::empty({84, 84, 3}, DType::UInt8);
        obs.set("pixels", frame);
        for (int s = 0; s < steps; ++s) {
          std::memset(frame.data(), (a * 31 + s) & 0xff, frame.nbytes());  // "env.step()"
          TensorDict out = client(obs, std::chrono::seconds(30));
          if (out.get("logits").shape() != Shape{kActions}) code = 1;
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "actor %d: %s\n", a, e.what());
        code = 1;
      }
      ::_exit(code);
    }
    kids.push_back(pid);
  }

  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t total = static_cast<uint64_t>(actors) * static_cast<uint64_t>(steps);
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Each request has 30 s; an actor that has not finished long after that is stuck, and
  // the demo says so instead of waiting for it.
  constexpr double kLimit = 60;
  int failed = 0;
  size_t left = kids.size();
  while (left > 0) {
    progress(server.stats().requests, total, elapsed());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const bool late = elapsed() > kLimit;
    for (pid_t& pid : kids) {
      if (pid <= 0) continue;
      int status = 0;
      if (late) {
        std::fprintf(stderr, "\nactor pid %d did not finish in %.0f s: killed\n", pid, kLimit);
        ::kill(pid, SIGKILL);
      }
      if (::waitpid(pid, &status, late ? 0 : WNOHANG) == pid) {
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        pid = -1;
        --left;
      }
    }
  }
  const double seconds = elapsed();
  ServerStats st = server.stats();
  progress(st.requests, total, seconds);
  server.update_model([] {});  // a weight update between batches bumps the version
  server.shutdown();
  std::printf("\n\n  summary: %lu requests from %d actors in %.2f s = %.0f requests/s\n",
              static_cast<unsigned long>(st.requests), actors, seconds,
              static_cast<double>(st.requests) / seconds);
  std::printf(
      "           %lu batches, average batch %.2f; queue p50 %.3f ms p95 %.3f ms; "
      "policy p50 %.3f ms p95 %.3f ms\n",
      // Over the whole run: the stats' own average is of the last stats_window_size batches.
      static_cast<unsigned long>(st.batches),
      st.batches ? static_cast<double>(st.requests) / static_cast<double>(st.batches) : 0.0,
      st.p50_queue_ms, st.p95_queue_ms, st.p50_forward_ms, st.p95_forward_ms);
  std::printf(
      "           slots in use after the run: %u; policy version now %ld; actors failed: %d\n",
      transport->slots_in_use(), static_cast<long>(server.policy_version()), failed);
  return {"inference",
          strprintf("%lu requests, %d actors: %.0f/s, queue p50 %.3f ms",
                    static_cast<unsigned long>(st.requests), actors,
                    static_cast<double>(st.requests) / seconds, st.p50_queue_ms),
          strprintf("%d actors failed, %u slots left in use", failed, transport->slots_in_use()),
          failed == 0 && st.requests == total};
}

}  // namespace tensorwire::tools
