#include <fstream>
#include <string>

#include "commands.h"
#include "tensorwire/core/error.h"

namespace tensorwire::tools {

void write_json(const std::string& path, const std::string& json, const char* who) {
  std::ofstream f(path);
  f << json << "\n";
  f.close();
  if (!f) throw Error(std::string(who) + ": cannot write " + path);
}

}  // namespace tensorwire::tools
