// Subcommands of the tensorwire command. Each takes (argc, argv) with argv[0] the
// subcommand's name and returns the exit status.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>

namespace tensorwire::tools {

// One row of the summary table `tensorwire demo` ends with: what a part of the demo
// measured, what it checked, and whether the checks held.
struct DemoRow {
  std::string part, measured, checked;
  bool ok = false;
};

// printf into a std::string (the demo's table cells).
inline std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strprintf(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// Writes `json` (a document's text) to `path`: Error "`who`: cannot write PATH" when the
// file cannot be opened or written (the caller's exit status then says so).
void write_json(const std::string& path, const std::string& json, const char* who);

int demo(int argc, char** argv);
int inspect(int argc, char** argv);
int bench_pipe(int argc, char** argv);
int bench_pipe_peer(int argc, char** argv);
// The pipe part of `tensorwire demo` (demo_pipe.cpp).
DemoRow demo_pipe();
int bench_infer(int argc, char** argv);
int bench_dataflow(int argc, char** argv);
// The data-loading part of `tensorwire demo` (demo_dataflow.cpp).
DemoRow demo_dataflow();
// The inference part of `tensorwire demo` (demo_infer.cpp).
DemoRow demo_infer(int actors = 4, int steps = 2500);
}  // namespace tensorwire::tools
