// The data-loading part of `tensorwire demo`: a C++ dataflow that "decodes" images runs in
// worker processes (MultiProcessRunnerZMQ); the main process shows a progress bar, checks
// every datapoint, and sums up what happened.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "commands.h"
#include "tensorwire/dataflow/runner.h"

namespace tensorwire::tools {

namespace {

constexpr int64_t kSide = 96;
constexpr size_t kPerEpoch = 3000;
constexpr int kEpochs = 2;
constexpr int kWorkers = 2;

// Datapoint i: a 3 x 96 x 96 image whose pixels encode i, its label, and which worker
// made it. Filling the pixels stands in for decoding a JPEG.
class Images : public dataflow::DataFlow {
 public:
  void reset_state() override {
    worker_ = dataflow::current_worker() ? dataflow::current_worker()->index : -1;
  }
  void start() override { i_ = 0; }
  std::optional<TensorDict> next() override {
    if (i_ == kPerEpoch) return std::nullopt;
    TensorDict td;
    Tensor image = Tensor::empty({3, kSide, kSide}, DType::UInt8);
    auto* p = image.data<uint8_t>();
    for (int64_t k = 0; k < image.numel(); ++k)
      p[k] = static_cast<uint8_t>(i_ + static_cast<uint64_t>(k));
    td.set("image", image);
    Tensor label = Tensor::empty({}, DType::Int64);
    *label.data<int64_t>() = static_cast<int64_t>(i_ % 10);
    td.set("label", label);
    Tensor index = Tensor::empty({}, DType::Int64);
    *index.data<int64_t>() = static_cast<int64_t>(i_);
    td.set({"info", "index"}, index);
    Tensor worker = Tensor::empty({}, DType::Int64);
    *worker.data<int64_t>() = worker_;
    td.set({"info", "worker"}, worker);
    ++i_;
    return td;
  }
  std::optional<size_t> size() const override { return kPerEpoch; }

 private:
  uint64_t i_ = 0;
  int64_t worker_ = -1;
};

bool intact(const TensorDict& td) {
  const Tensor& image = td.get("image");
  const auto i = static_cast<uint64_t>(*td.get({"info", "index"}).data<int64_t>());
  const auto* p = image.data<uint8_t>();
  for (int64_t k = 0; k < image.numel(); k += 97)
    if (p[k] != static_cast<uint8_t>(i + static_cast<uint64_t>(k))) return false;
  return true;
}

void progress_bar(int epoch, size_t done, size_t total, double rate, bool final) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / total);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::printf("\r  epoch %d [%s] %5zu/%zu  %8.0f datapoints/s%s", epoch, bar.c_str(), done, total,
              rate, final ? "\n" : "");
  std::fflush(stdout);
}

}  // namespace

DemoRow demo_dataflow() {
  using clock_type = std::chrono::steady_clock;
  std::printf("\n== data loading: MultiProcessRunnerZMQ, %d worker processes, shared memory ==\n\n",
              kWorkers);
  dataflow::MultiProcessRunnerZMQ runner(std::make_shared<Images>(),
                                         {.num_proc = kWorkers, .hwm = 32, .seed = 7});
  runner.reset_state();
  std::printf("forked workers (pids");
  for (int pid : runner.pids()) std::printf(" %d", pid);
  std::printf("), pipe %s\n", runner.endpoint().c_str());

  std::map<int64_t, size_t> per_worker;
  size_t total = 0, bad = 0;
  const auto t_all = clock_type::now();
  for (int epoch = 1; epoch <= kEpochs; ++epoch) {
    const auto t0 = clock_type::now();
    auto last = t0;
    size_t done = 0;
    for (TensorDict& dp : runner.epoch()) {
      bad += intact(dp) ? 0 : 1;
      ++per_worker[*dp.get({"info", "worker"}).data<int64_t>()];
      ++done;
      const auto now = clock_type::now();
      if (now - last > std::chrono::milliseconds(100) || done == kPerEpoch) {
        const double dt = std::chrono::duration<double>(now - t0).count();
        progress_bar(epoch, done, kPerEpoch, dt > 0 ? static_cast<double>(done) / dt : 0,
                     done == kPerEpoch);
        last = now;
      }
    }
    total += done;
  }
  const double secs = std::chrono::duration<double>(clock_type::now() - t_all).count();
  const size_t shm = runner.shared_memory_bytes();
  const auto pids = runner.pids();
  runner.close();
  bool reaped = true;
  for (int pid : pids) reaped = reaped && ::getpgid(pid) < 0;

  const double mb = static_cast<double>(total) * 3 * kSide * kSide / 1e6;
  std::printf(
      "\nsummary: %zu datapoints in %d epochs of %zu (exactly len(ds) each), %.2f s, %.0f "
      "datapoints/s, "
      "%.0f MB/s\n",
      total, kEpochs, kPerEpoch, secs, static_cast<double>(total) / secs, mb / secs);
  std::printf("  per worker:");
  for (auto [w, n] : per_worker) std::printf(" worker %lld: %zu", static_cast<long long>(w), n);
  std::printf("\n  datapoints intact: %s (%zu corrupt)\n", bad == 0 ? "all" : "NO", bad);
  std::printf(
      "  shared memory mapped from the workers: %.1f MiB (bounded by hwm datapoints per worker)\n",
      static_cast<double>(shm) / (1 << 20));
  std::printf("  workers reaped on close: %s\n", reaped ? "yes" : "NO");
  return {"data loading",
          strprintf("%zu datapoints, %d workers: %.0f/s, %.0f MB/s", total, kWorkers,
                    static_cast<double>(total) / secs, mb / secs),
          strprintf("%zu corrupt, workers %s", bad, reaped ? "reaped" : "NOT reaped"),
          bad == 0 && reaped && total == kEpochs * kPerEpoch};
}

}  // namespace tensorwire::tools
