#include <cstdio>
#include <string>

#include "commands.h"
#include "tensorwire/tensorwire.h"

namespace tensorwire::tools {

int inspect(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tensorwire inspect FILE\n");
    return 2;
  }
  TensorDict td = load(argv[1]);
  std::printf("%s", describe(td).c_str());
  return 0;
}

}  // namespace tensorwire::tools
