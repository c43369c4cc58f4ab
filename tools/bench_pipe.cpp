// `tensorwire bench pipe`: TensorDictPipe throughput and latency between two processes,
// beside ucx_perftest (tag_bw / tag_lat) run in the same invocation on the same transport,
// so every figure comes with its same-run ratio.
//
//   tensorwire bench pipe [--tls sm,tcp/tcp] [--sizes 1048576,67108864] [--iters N]
//                         [--min-bytes N] [--lat-iters N] [--lat-bytes N]
//                         [--modes consolidated,nc] [--json PATH] [--no-reference]
// Each size sends at least --iters messages and at least --min-bytes in all: 30 messages of
// 64 KiB take a fraction of a millisecond, a window that measured start-up, not the pipe
// (1-5 GB/s in runs that moved 9-10 GB/s over 3,000 messages).
// bench/pipe/plot_bench_pipe.py draws the --json figures (throughput against ucx_perftest at
// each size, latency distributions).
// The peer is this same program, re-executed as `tensorwire bench-pipe-peer ...`.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "cli.h"
#include "commands.h"
#include "tensorwire/pipe/pipe.h"
#include "tensorwire/tensorwire.h"

namespace tensorwire::tools {

namespace {

// The reference: the ucx_perftest of the UCX the library links (tools/CMakeLists.txt), with
// that UCX's libraries (the libucx wheel's binaries look for them beside themselves, then
// take a system UCX of another version), else the one on PATH: the command installed from a
// wheel runs where that UCX (its build machine's) is not.
std::vector<std::string> ucx_perftest(std::vector<std::string> args) {
#ifdef TENSORWIRE_UCX_PERFTEST
  if (::access(TENSORWIRE_UCX_PERFTEST, X_OK) == 0) {
    args.insert(args.begin(),
                {"env", "LD_LIBRARY_PATH=" TENSORWIRE_UCX_LIBDIR, TENSORWIRE_UCX_PERFTEST});
    return args;
  }
#endif
  args.insert(args.begin(), "ucx_perftest");
  return args;
}

using Clock = std::chrono::steady_clock;

TensorDict payload(size_t bytes) {
  TensorDict td;
  Tensor t = Tensor::empty({static_cast<int64_t>(bytes)}, DType::UInt8);
  std::memset(t.data(), 7, bytes);
  td.set("data", t);
  return td;
}

// The latency dict: four float32 leaves of `bytes` / 4 bytes each (1 KiB: [4, 16] each).
TensorDict small(size_t bytes) {
  TensorDict td({4});
  for (const char* k : {"obs", "action", "reward", "done"})
    td.set(k, Tensor::zeros({4, static_cast<int64_t>(bytes / 64)}, DType::Float32));
  return td;
}

// ucx_perftest's "Final:" line: iterations, p50 latency (us), avg latency, overall latency,
// avg MB/s, overall MB/s, ...
std::vector<double> perftest(const std::string& tls, const std::string& test, size_t size,
                             int iters) {
  static int port = 20000 + static_cast<int>(::getpid() % 20000);
  std::string out;
  std::string::size_type pos = std::string::npos;
  // The client connects once, 300 ms after the server starts: on a loaded machine the
  // server may not listen yet (or its port, picked here, is taken), and the reference went
  // missing from the run. Tried again (a new port each time) up to three times; a server
  // left waiting for a client that never came is killed (Child's destructor).
  for (int attempt = 0; attempt < 3 && pos == std::string::npos; ++attempt) {
    ++port;
    Child server(ucx_perftest({"-p", std::to_string(port)}), tls, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(300 * (attempt + 1)));
    Child client(ucx_perftest({"127.0.0.1", "-p", std::to_string(port), "-t", test, "-s",
                               std::to_string(size), "-n", std::to_string(iters)}),
                 tls, true);
    out = client.read_all();
    client.wait();
    pos = out.rfind("Final:");
    if (pos != std::string::npos) server.wait();
  }
  if (pos == std::string::npos) return {};
  std::vector<double> v;
  std::stringstream ss(out.substr(pos + 6));
  double x;
  while (ss >> x) v.push_back(x);
  return v;
}

struct Row {
  std::string tls, what, mode;
  size_t size;
  double ours, reference;  // GB/s or us
  const char* unit;
  std::vector<double> quantiles = {};  // latency: one-way us at percentiles 0, 5, ..., 100
};

}  // namespace

// The peer: `tensorwire bench-pipe-peer send HOST PORT SIZE COUNT MODE` sends COUNT
// copies of one consolidated payload; `... echo HOST PORT COUNT MODE` echoes COUNT dicts.
int bench_pipe_peer(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string role = argv[1];
  PipeOptions opt;
  opt.consolidated = std::string(argv[argc - 1]) != "nc";
  auto pipe = TensorDictPipe::connect(argv[2], static_cast<uint16_t>(std::atoi(argv[3])), opt);
  if (role == "send") {
    size_t size = std::strtoull(argv[4], nullptr, 10);
    int count = std::atoi(argv[5]);
    TensorDict td = payload(size);
    if (opt.consolidated) td = consolidate(td);
    for (int i = 0; i < count; ++i) pipe.send(td);
  } else {
    int count = std::atoi(argv[4]);
    for (int i = 0; i < count; ++i) pipe.send(pipe.recv());
  }
  // Wait for the receiver to hang up, so the last messages are not cut short.
  try {
    pipe.recv(nullptr, std::chrono::seconds(30));
  } catch (const Error&) {
  }
  return 0;
}

int bench_pipe(int argc, char** argv) {
  std::vector<std::string> tls_list = {"sm,tcp", "tcp"};
  std::vector<size_t> sizes = {1 << 20, 64 << 20};
  std::vector<std::string> modes = {"consolidated", "nc"};
  int iters = 30, lat_iters = 20000;
  size_t min_bytes = size_t{256} << 20;
  size_t lat_bytes = 1024;
  std::string json_path;
  bool reference = true;
  CLI::App app("TensorDictPipe throughput and latency beside ucx_perftest.",
               "tensorwire bench pipe");
  app.add_option("--tls", tls_list, "UCX_TLS settings to run, '/'-separated")->delimiter('/');
  app.add_option("--sizes", sizes, "message sizes in bytes, ','-separated")
      ->delimiter(',')
      ->check(kPositive);
  app.add_option("--modes", modes, "consolidated and/or nc, ','-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"consolidated", "nc"}));
  app.add_option("--iters", iters, "throughput messages per size, at least")->check(kPositive);
  app.add_option("--min-bytes", min_bytes, "throughput bytes per size, at least")
      ->check(kNonNegative);
  app.add_option("--lat-iters", lat_iters, "latency round trips")->check(kPositive);
  app.add_option("--lat-bytes", lat_bytes, "bytes of the latency dict (a multiple of 64)")
      ->check(kPositive);
  app.add_option("--json", json_path, "also write the figures to this JSON file");
  app.add_flag("!--no-reference", reference, "skip ucx_perftest");
  if (int status = parse(app, argc, argv); status >= 0) return status;
  if (lat_bytes % 64 != 0) {
    std::fprintf(stderr, "--lat-bytes: %zu is not a multiple of 64\n", lat_bytes);
    return 2;
  }
  const std::string self = "/proc/self/exe";
  std::vector<Row> rows;
  for (const auto& tls : tls_list) {
    ::setenv("UCX_TLS", tls.c_str(), 1);
    for (const auto& mode : modes) {
      PipeOptions opt;
      opt.consolidated = mode != "nc";
      for (size_t size : sizes) {
        const int warm = 3;
        const int n =
            std::max(iters, static_cast<int>(std::min<size_t>(min_bytes / size, 1 << 20)));
        PipeListener listener(0, opt);
        Child peer({self, "bench-pipe-peer", "send", "127.0.0.1", std::to_string(listener.port()),
                    std::to_string(size), std::to_string(n + warm), mode},
                   tls, false);
        auto pipe = listener.accept(std::chrono::seconds(30));
        for (int i = 0; i < warm; ++i) pipe->recv(nullptr, std::chrono::seconds(30));
        auto t0 = Clock::now();
        for (int i = 0; i < n; ++i) pipe->recv(nullptr, std::chrono::seconds(60));
        double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        pipe->close();
        peer.wait();
        double ref = 0;
        if (reference && mode == "consolidated") {
          auto v = perftest(tls, "tag_bw", size, std::max(n, 20));
          if (v.size() >= 6) ref = v[5] * 1e6 / 1e9;  // overall MB/s -> GB/s
        }
        rows.push_back({tls, "throughput", mode, size, static_cast<double>(size) * n / secs / 1e9,
                        ref, "GB/s"});
        std::fprintf(stderr, "  %-7s %-12s %9zu B  %.2f GB/s\n", tls.c_str(), mode.c_str(), size,
                     rows.back().ours);
      }
      // Latency: ping-pong of a 4-leaf dict (1 KiB by default); one-way = round trip / 2.
      PipeListener listener(0, opt);
      Child peer({self, "bench-pipe-peer", "echo", "127.0.0.1", std::to_string(listener.port()),
                  std::to_string(lat_iters + 100), mode},
                 tls, false);
      auto pipe = listener.accept(std::chrono::seconds(30));
      TensorDict td = small(lat_bytes);
      if (opt.consolidated) td = consolidate(td);
      std::vector<double> us;
      us.reserve(lat_iters);
      for (int i = 0; i < lat_iters + 100; ++i) {
        auto t0 = Clock::now();
        pipe->send(td);
        pipe->recv(nullptr, std::chrono::seconds(30));
        if (i >= 100)
          us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
      }
      pipe->close();
      peer.wait();
      std::sort(us.begin(), us.end());
      double p50 = us[us.size() / 2];
      std::vector<double> quantiles;
      for (size_t q = 0; q <= 20; ++q) quantiles.push_back(us[(us.size() - 1) * q / 20]);
      double ref = 0;
      if (reference && mode == "consolidated") {
        auto v = perftest(tls, "tag_lat", lat_bytes, lat_iters);
        if (v.size() >= 2) ref = v[1];
      }
      rows.push_back({tls, "latency p50", mode, lat_bytes, p50, ref, "us", quantiles});
      std::fprintf(stderr, "  %-7s %-12s latency p50 %.2f us\n", tls.c_str(), mode.c_str(), p50);
    }
  }
  std::printf("\n%-8s %-12s %-13s %10s %12s %14s %8s\n", "UCX_TLS", "measure", "mode", "bytes",
              "tensorwire", "ucx_perftest", "ratio");
  for (const auto& r : rows) {
    char ref[32] = "-", ratio[32] = "-";
    if (r.reference > 0) {
      std::snprintf(ref, sizeof ref, "%.2f %s", r.reference, r.unit);
      std::snprintf(ratio, sizeof ratio, "%.2f", r.ours / r.reference);
    }
    std::printf("%-8s %-12s %-13s %10zu %9.2f %-4s %12s %8s\n", r.tls.c_str(), r.what.c_str(),
                r.mode.c_str(), r.size, r.ours, r.unit, ref, ratio);
  }
  if (!json_path.empty()) {
    Json j = Json::array();
    for (const auto& r : rows)
      j.push_back({{"tls", r.tls},
                   {"measure", r.what},
                   {"mode", r.mode},
                   {"bytes", r.size},
                   {"tensorwire", r.ours},
                   {"ucx_perftest", r.reference},
                   {"unit", r.unit}});
    for (size_t i = 0; i < rows.size(); ++i)
      if (!rows[i].quantiles.empty()) j[i]["quantiles_us"] = rows[i].quantiles;
    write_json(json_path, j.dump(2), "bench pipe");
  }
  return 0;
}

}  // namespace tensorwire::tools
