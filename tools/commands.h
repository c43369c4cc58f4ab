// Subcommands of the tensorwire command. Each takes (argc, argv) with argv[0] the
// subcommand's name and returns the exit status.
#pragma once

namespace tensorwire::tools {
int demo(int argc, char** argv);
int inspect(int argc, char** argv);
int bench_pipe(int argc, char** argv);
int bench_pipe_peer(int argc, char** argv);
// The pipe part of `tensorwire demo` (demo_pipe.cpp); returns the exit status.
int demo_pipe();
int bench_infer(int argc, char** argv);
int bench_dataflow(int argc, char** argv);
// The data-loading part of `tensorwire demo` (demo_dataflow.cpp); returns the exit status.
int demo_dataflow();
// The inference part of `tensorwire demo` (demo_infer.cpp); returns the exit status.
int demo_infer(int actors = 4, int steps = 2500);
}  // namespace tensorwire::tools
