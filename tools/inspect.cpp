#include <cstdio>
#include <filesystem>
#include <string>

#include "cli.h"
#include "commands.h"
#include "tensorwire/tensorwire.h"

namespace tensorwire::tools {

int inspect(int argc, char** argv) {
  CLI::App app("Print the structure of a saved TensorDict.", "tensorwire inspect");
  std::string file;
  app.add_option("FILE", file, "a file written by TensorDict.save() or tensordict")->required();
  if (int status = parse(app, argc, argv); status >= 0) return status;
  if (std::filesystem::is_directory(file))
    throw ValueError("'" + file + "' is a directory, not a saved TensorDict");
  TensorDict td = load(file);
  std::printf("%s", describe(td).c_str());
  return 0;
}

}  // namespace tensorwire::tools
