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
