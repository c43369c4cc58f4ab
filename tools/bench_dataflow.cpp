// `tensorwire bench dataflow`: MultiProcessRunnerZMQ throughput with a C++ dataflow (no
// Python anywhere), beside single-thread memcpy bandwidth measured in the same run.
//
// The dataflow yields {"image": uint8[shape], "label": int64}. By default each datapoint
// is a fresh zero-filled tensor (as the Python benchmark's np.zeros); --reuse yields the
// same tensor each time, which measures the transport alone. The consumer drops each
// datapoint as it arrives.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "tensorwire/dataflow/runner.h"

namespace tensorwire::tools {

namespace {

using clock_type = std::chrono::steady_clock;

struct Args {
  std::vector<Shape> shapes;
  std::vector<int> num_procs;
  int hwm = 50;
  double seconds = 2.0;
  bool reuse = false;
  bool json = false;
};

// "224,224,3" -> {224, 224, 3}; the text was checked by kShape.
Shape parse_shape(const std::string& s) {
  Shape out;
  for (size_t pos = 0; pos <= s.size();) {
    size_t comma = std::min(s.find(',', pos), s.size());
    out.push_back(std::stoll(s.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

// The most elements a datapoint's shape may have: the benchmark makes datapoints of it (and
// workers' buffers of several), so a shape beyond the machine is a usage error, not an
// allocation that fails halfway.
constexpr long long kMaxElements = 1LL << 26;

const CLI::Validator kShape(
    [](std::string& s) -> std::string {
      long long elements = 1;
      for (size_t pos = 0; pos <= s.size();) {
        size_t comma = std::min(s.find(',', pos), s.size());
        const std::string dim = s.substr(pos, comma - pos);
        if (dim.empty() || dim.size() > 9 || dim.find_first_not_of("0123456789") != dim.npos ||
            std::stoll(dim) == 0)
          return "'" + s + "' is not a shape (positive ints, ','-separated, e.g. 224,224,3)";
        elements = std::min(elements * std::stoll(dim), kMaxElements + 1);  // no overflow
        pos = comma + 1;
      }
      if (elements > kMaxElements)
        return "'" + s + "' has more than " + std::to_string(kMaxElements) + " elements";
      return "";
    },
    "D0,D1,...");

// Single-thread memcpy of `bytes` between two warm buffers, in bytes per second.
double memcpy_bandwidth(size_t bytes, double seconds) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  size_t n = 0;
  const auto t0 = clock_type::now();
  double dt = 0;
  do {
    std::memcpy(b.data(), a.data(), bytes);
    a[n % bytes] = static_cast<char>(n);  // keep the copies from being folded away
    ++n;
    dt = std::chrono::duration<double>(clock_type::now() - t0).count();
  } while (dt < seconds);
  return static_cast<double>(n * bytes) / dt;
}

struct Result {
  double dps = 0, bytes_per_s = 0;
  size_t shm_bytes = 0;
  uint64_t count = 0;
};

Result run(const Shape& shape, int num_proc, const Args& args) {
  Tensor image = Tensor::zeros(shape, DType::UInt8);
  const bool reuse = args.reuse;
  auto flow = std::make_shared<dataflow::FunctionFlow>(
      [image, shape, reuse](uint64_t i) {
        TensorDict td;
        td.set("image", reuse ? image : Tensor::zeros(shape, DType::UInt8));
        Tensor label = Tensor::empty({}, DType::Int64);
        *label.data<int64_t>() = static_cast<int64_t>(i);
        td.set("label", label);
        return td;
      },
      std::nullopt);
  dataflow::MultiProcessRunnerZMQ runner(flow, {.num_proc = num_proc, .hwm = args.hwm});
  runner.reset_state();
  const auto warm_until = clock_type::now() + std::chrono::milliseconds(300);
  uint64_t warm = 0;
  while (clock_type::now() < warm_until || warm < 20) {
    runner.next();
    ++warm;
  }
  Result r;
  const auto t0 = clock_type::now();
  double dt = 0;
  do {
    for (int k = 0; k < 16; ++k) runner.next();
    r.count += 16;
    dt = std::chrono::duration<double>(clock_type::now() - t0).count();
  } while (dt < args.seconds);
  r.dps = static_cast<double>(r.count) / dt;
  r.bytes_per_s = r.dps * static_cast<double>(image.nbytes());
  r.shm_bytes = runner.shared_memory_bytes();
  return r;
}

}  // namespace

int bench_dataflow(int argc, char** argv) {
  Args a;
  std::vector<std::string> shapes;
  CLI::App app("MultiProcessRunnerZMQ over a C++ dataflow yielding {image: uint8[shape], label}.",
               "tensorwire bench dataflow");
  app.add_option("--shape", shapes,
                 "an image shape, repeatable (default 1 / 224,224,3 / "
                 "32,224,224,3)")
      ->check(kShape)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--num-proc", a.num_procs, "worker counts, ','-separated (default 1,2)")
      ->delimiter(',')
      ->check(kPositive);
  app.add_option("--hwm", a.hwm, "ZeroMQ high-water mark (default 50)")->check(kPositive);
  app.add_option("--seconds", a.seconds, "duration of each run (default 2)")->check(kPositive);
  app.add_flag("--reuse", a.reuse,
               "one tensor for every datapoint (transport only) instead of a fresh one each");
  app.add_flag("--json", a.json, "print the figures as JSON");
  if (int status = parse(app, argc, argv); status >= 0) return status;
  for (const std::string& s : shapes) a.shapes.push_back(parse_shape(s));
  if (a.shapes.empty()) a.shapes = {{1}, {224, 224, 3}, {32, 224, 224, 3}};
  if (a.num_procs.empty()) a.num_procs = {1, 2};

  if (!a.json)
    std::printf(
        "MultiProcessRunnerZMQ, C++ dataflow (%s tensor per datapoint), hwm %d, %.1f s per row\n\n"
        "%-16s %4s %12s %10s %14s %8s %10s\n",
        a.reuse ? "one reused" : "a fresh zero-filled", a.hwm, a.seconds, "shape", "proc",
        "datapoints/s", "GB/s", "memcpy GB/s", "ratio", "shm MiB");
  else
    std::printf("[\n");
  bool first = true;
  for (const Shape& shape : a.shapes) {
    const size_t bytes = static_cast<size_t>(checked_numel(shape));
    for (int np : a.num_procs) {
      Result r = run(shape, np, a);
      const double mc = memcpy_bandwidth(bytes, 0.3);
      if (a.json) {
        std::printf(
            "%s  {\"shape\": \"%s\", \"num_proc\": %d, \"dps\": %.1f, \"bytes_per_s\": %.0f, "
            "\"memcpy_bytes_per_s\": %.0f, \"shm_bytes\": %zu, \"count\": %llu}",
            first ? "" : ",\n", shape_str(shape).c_str(), np, r.dps, r.bytes_per_s, mc, r.shm_bytes,
            static_cast<unsigned long long>(r.count));
      } else {
        // A memcpy of a few bytes measures call overhead, not bandwidth: no ratio then.
        if (bytes < 4096)
          std::printf("%-16s %4d %12.0f %10.3f %14s %8s %10.1f\n", shape_str(shape).c_str(), np,
                      r.dps, r.bytes_per_s / 1e9, "-", "-",
                      static_cast<double>(r.shm_bytes) / (1 << 20));
        else
          std::printf("%-16s %4d %12.0f %10.3f %14.2f %7.0f%% %10.1f\n", shape_str(shape).c_str(),
                      np, r.dps, r.bytes_per_s / 1e9, mc / 1e9, 100.0 * r.bytes_per_s / mc,
                      static_cast<double>(r.shm_bytes) / (1 << 20));
      }
      std::fflush(stdout);
      first = false;
    }
  }
  if (a.json) std::printf("\n]\n");
  return 0;
}

}  // namespace tensorwire::tools
