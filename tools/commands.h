// Subcommands of the tensorwire command. Each takes (argc, argv) with argv[0] the
// subcommand's name and returns the exit status.
#pragma once

namespace tensorwire::tools {
int demo(int argc, char** argv);
int inspect(int argc, char** argv);
}  // namespace tensorwire::tools
