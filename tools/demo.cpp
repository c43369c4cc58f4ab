// `tensorwire demo`: the main job, end to end. For now: build a nested TensorDict,
// consolidate it, save it, memory-map it back, and show what happened.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "tensorwire/tensorwire.h"

namespace tensorwire::tools {

namespace {

TensorDict make_demo_td() {
  const int64_t batch = 8;
  TensorDict td({batch});
  Tensor obs = Tensor::empty({batch, 84, 84, 3}, DType::UInt8);
  auto* p = obs.data<uint8_t>();
  for (int64_t i = 0; i < obs.numel(); ++i) p[i] = static_cast<uint8_t>(i * 31);
  td.set("observation", obs);
  Tensor action = Tensor::empty({batch, 6}, DType::Float32);
  for (int64_t i = 0; i < action.numel(); ++i)
    action.data<float>()[i] = 0.5f * static_cast<float>(i);
  td.set("action", action);
  td.set({"next", "reward"}, Tensor::zeros({batch, 1}, DType::Float32));
  td.set({"next", "done"}, Tensor::zeros({batch, 1}, DType::Bool));
  td.set({"info", "episode"}, Tensor::from_vector<int64_t>({0, 0, 1, 1, 2, 2, 3, 3}, {batch}));
  td.set("env_name", NonTensor{"CartPole-v1"});
  return td;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The table the demo ends with: one row per part, one screen.
void print_summary(const std::vector<DemoRow>& rows) {
  size_t w_part = 4, w_measured = 8;
  for (const DemoRow& r : rows) {
    w_part = std::max(w_part, r.part.size());
    w_measured = std::max(w_measured, r.measured.size());
  }
  std::printf("\n== summary ==\n\n  %-*s  %-*s  %s\n", static_cast<int>(w_part), "part",
              static_cast<int>(w_measured), "measured", "checked");
  for (const DemoRow& r : rows)
    std::printf("  %-*s  %-*s  %s: %s\n", static_cast<int>(w_part), r.part.c_str(),
                static_cast<int>(w_measured), r.measured.c_str(), r.ok ? "ok" : "FAILED",
                r.checked.c_str());
}

}  // namespace

int demo(int argc, char** argv) {
  std::string dir;
  CLI::App app(
      "Build a nested TensorDict, consolidate, save, map back; then the pipe, "
      "inference and dataflow demos.",
      "tensorwire demo");
  app.add_option("--dir", dir, "where to write the demo file (default: a new temporary dir)");
  if (int status = parse(app, argc, argv); status >= 0) return status;
  namespace fs = std::filesystem;
  bool own_dir = dir.empty();
  if (own_dir) {
    std::string tmpl = (fs::temp_directory_path() / "tensorwire-demo-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw SystemError("mkdtemp", errno);
    dir = tmpl;
  }
  const std::string path = (fs::path(dir) / "demo.td").string();

  std::printf("== tensorwire demo: TensorDict -> consolidate -> save -> mmap load ==\n\n");
  TensorDict td = make_demo_td();
  std::printf("built:\n%s\n", describe(td).c_str());

  auto t0 = std::chrono::steady_clock::now();
  TensorDict c = consolidate(td);
  double t_cons = ms_since(t0);
  std::printf("consolidated: one storage of %zu bytes, %zu bytes of metadata (%.3f ms)\n",
              c.consolidated()->storage.nbytes(), c.consolidated()->metadata->dump().size(),
              t_cons);

  t0 = std::chrono::steady_clock::now();
  save(c, path);
  double t_save = ms_since(t0);
  std::printf("saved to %s: %ju bytes (%.3f ms)\n", path.c_str(),
              static_cast<uintmax_t>(fs::file_size(path)), t_save);

  t0 = std::chrono::steady_clock::now();
  TensorDict back = load(path);
  double t_load = ms_since(t0);
  std::printf("loaded by memory-mapping (%.3f ms, storage kind: %s):\n%s\n", t_load,
              back.consolidated()->storage.kind() == Storage::Kind::Mapped ? "mapped" : "other",
              describe(back).c_str());

  std::string why;
  bool same = equal(td, back, &why);
  std::printf("round trip: %s%s\n", same ? "equal" : "DIFFERENT: ", why.c_str());
  if (own_dir) fs::remove_all(dir);
  std::vector<DemoRow> rows = {
      {"files",
       strprintf("consolidate %.3f ms, save %.3f ms, mmap load %.3f ms", t_cons, t_save, t_load),
       same ? "round trip equal" : "round trip DIFFERENT", same}};
  rows.push_back(demo_pipe());
  rows.push_back(demo_dataflow());
  rows.push_back(demo_infer());
  print_summary(rows);
  bool ok = true;
  for (const DemoRow& r : rows) ok = ok && r.ok;
  return ok ? 0 : 1;
}

}  // namespace tensorwire::tools
