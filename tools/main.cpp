// The tensorwire command: one subcommand per job. main() only dispatches; each subcommand
// parses its own options (cli.h), so `tensorwire SUB --help` is the subcommand's help.
#include <cstdio>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "tensorwire/core/error.h"

namespace {

using Command = std::function<int(int, char**)>;

// A subcommand whose arguments all go to `run` (its own parser).
CLI::App* add(CLI::App& parent, const std::string& name, const std::string& what) {
  CLI::App* sub = parent.add_subcommand(name, what);
  sub->prefix_command();
  sub->set_help_flag();  // --help goes through to the subcommand's own parser
  return sub;
}

// `name` is not a subcommand of `parent`: says so with the parent's help (CLI11's own word
// is "The following argument was not expected", and the top level's usage).
bool unknown(CLI::App& parent, const char* name, const std::string& command) {
  if (name[0] == '-') return false;
  try {
    parent.get_subcommand(name);
    return false;
  } catch (const CLI::OptionNotFound&) {
    std::fprintf(stderr, "%s: unknown command '%s'\n%s", command.c_str(), name,
                 parent.help().c_str());
    return true;
  }
}

}  // namespace

int main(int argc, char** argv) {
  namespace tools = tensorwire::tools;
  CLI::App app("tensorwire: move TensorDicts between processes and machines, fast", "tensorwire");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tensorwire ") + TENSORWIRE_VERSION);
  std::vector<std::pair<CLI::App*, Command>> commands = {
      {add(app, "demo", "build a nested TensorDict, consolidate, save, map back"), tools::demo},
      {add(app, "inspect", "print the structure of a saved TensorDict"), tools::inspect},
      {add(app, "bench-pipe-peer", ""), tools::bench_pipe_peer},  // started by bench pipe
  };
  CLI::App* bench = app.add_subcommand("bench", "benchmarks (tensorwire bench SUB --help)");
  commands.push_back({add(*bench, "pipe", "TensorDictPipe throughput/latency beside ucx_perftest"),
                      tools::bench_pipe});
  commands.push_back(
      {add(*bench, "infer", "inference server figures (latency, throughput, memory)"),
       tools::bench_infer});
  commands.push_back(
      {add(*bench, "dataflow", "data loading from worker processes (datapoints/s, GB/s)"),
       tools::bench_dataflow});
  commands[2].first->group("");  // hidden from the help

  if (argc > 1 && unknown(app, argv[1], "tensorwire")) return 2;
  if (argc > 2 && std::string(argv[1]) == "bench" && unknown(*bench, argv[2], "tensorwire bench"))
    return 2;
  if (int status = tools::parse(app, argc, argv); status >= 0) return status;
  if (bench->parsed() && bench->get_subcommands().empty()) {
    std::fputs(bench->help().c_str(), stderr);
    return 2;
  }
  for (auto& [sub, run] : commands) {
    if (!sub->parsed()) continue;
    // The subcommand's own argv: its name, then what main did not parse.
    std::vector<std::string> args = sub->remaining();
    args.insert(args.begin(), sub->get_name());
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    av.push_back(nullptr);
    try {
      return run(static_cast<int>(args.size()), av.data());
    } catch (const tensorwire::Error& e) {
      std::fprintf(stderr, "tensorwire %s: %s\n", sub->get_name().c_str(), e.what());
      return 1;
    } catch (const std::bad_alloc&) {  // a benchmark sized beyond this machine
      std::fprintf(stderr, "tensorwire %s: out of memory\n", sub->get_name().c_str());
      return 1;
    }
  }
  return 2;
}
