// The tensorwire command: one subcommand per job.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"
#include "tensorwire/core/error.h"

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: tensorwire <command> [args]\n\n"
               "commands:\n"
               "  demo [--dir DIR]   build a nested TensorDict, consolidate, save, map back\n"
               "  inspect FILE       print the structure of a saved TensorDict\n"
               "  bench pipe [...]   TensorDictPipe throughput/latency beside ucx_perftest\n"
               "  bench infer [...]  inference server figures (latency, throughput, memory)\n"
               "  bench dataflow [...]  data loading from worker processes (datapoints/s, GB/s)\n"
               "  help               this text\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "demo") return tensorwire::tools::demo(argc - 1, argv + 1);
    if (cmd == "inspect") return tensorwire::tools::inspect(argc - 1, argv + 1);
    if (cmd == "bench" && argc > 2 && std::strcmp(argv[2], "pipe") == 0)
      return tensorwire::tools::bench_pipe(argc - 2, argv + 2);
    if (cmd == "bench-pipe-peer") return tensorwire::tools::bench_pipe_peer(argc - 1, argv + 1);
    if (cmd == "bench" && argc > 2 && std::strcmp(argv[2], "infer") == 0)
      return tensorwire::tools::bench_infer(argc - 2, argv + 2);
    if (cmd == "bench" && argc > 2 && std::strcmp(argv[2], "dataflow") == 0)
      return tensorwire::tools::bench_dataflow(argc - 2, argv + 2);
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      usage(stdout);
      return 0;
    }
  } catch (const tensorwire::Error& e) {
    std::fprintf(stderr, "tensorwire %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "tensorwire: unknown command '%s'\n", cmd.c_str());
  usage(stderr);
  return 2;
}
