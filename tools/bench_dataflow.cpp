// `tensorwire bench dataflow`: MultiProcessRunnerZMQ throughput with a C++ dataflow (no
// Python anywhere), beside single-thread memcpy bandwidth measured in the same run.
//
// The dataflow yields {"image": uint8[shape], "label": int64}. By default each datapoint
// is a fresh zero-filled tensor (as the Python benchmark's np.zeros); --reuse yields the
// same tensor each time, which measures the transport alone. The consumer drops each
// datapoint as it arrives.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

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

Shape parse_shape(const std::string& s) {
  Shape out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(std::stoll(s.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> out;
  for (int64_t v : parse_shape(s)) out.push_back(static_cast<int>(v));
  return out;
}

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
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ValueError("bench dataflow: " + s + " needs a value");
      return argv[++i];
    };
    if (s == "--shape")
      a.shapes.push_back(parse_shape(value()));
    else if (s == "--num-proc")
      a.num_procs = parse_ints(value());
    else if (s == "--hwm")
      a.hwm = std::stoi(value());
    else if (s == "--seconds")
      a.seconds = std::stod(value());
    else if (s == "--reuse")
      a.reuse = true;
    else if (s == "--json")
      a.json = true;
    else {
      std::fprintf(
          stderr,
          "usage: tensorwire bench dataflow [--shape D0,D1,...]... [--num-proc 1,2] [--hwm 50]\n"
          "                                 [--seconds 2] [--reuse] [--json]\n"
          "  MultiProcessRunnerZMQ over a C++ dataflow yielding {image: uint8[shape], label}.\n"
          "  Default shapes: 1 / 224,224,3 / 32,224,224,3. --reuse: one tensor for every\n"
          "  datapoint (transport only) instead of a fresh zero-filled one each time.\n");
      return 2;
    }
  }
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
