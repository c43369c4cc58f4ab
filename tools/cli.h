// Command-line parsing for the tensorwire command (CLI11). Every subcommand parses its own
// options with parse(), so each has --help, and every usage error names the option and
// exits with status 2.
#pragma once

#include <CLI/CLI.hpp>

namespace tensorwire::tools {

// Counts, sizes and durations: "must be a positive number" (CLI11's PositiveNumber prints
// the whole double range), or >= 0 for kNonNegative.
inline CLI::Validator number_check(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& s) -> std::string {
        double v = 0;
        std::size_t used = 0;
        try {
          v = std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == s.size() && used > 0 && (v > 0 || (allow_zero && v == 0))) return "";
        return std::string("must be a ") + (allow_zero ? "non-negative" : "positive") +
               " number, got '" + s + "'";
      },
      allow_zero ? "NUMBER>=0" : "NUMBER>0");
}
inline const CLI::Validator kPositive = number_check(false);
inline const CLI::Validator kNonNegative = number_check(true);

// Parses argv (argv[0] = the subcommand's name). Returns -1 to go on, else the exit
// status: 0 after --help (printed on stdout), 2 after a usage error (on stderr).
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion& e) {  // its what() is the version text
    std::printf("%s\n", e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    auto formatter = std::dynamic_pointer_cast<CLI::Formatter>(app.get_formatter());
    std::string usage = formatter ? formatter->make_usage(&app, app.get_name())
                                  : "Usage: " + app.get_name() + " [OPTIONS]\n";
    usage.erase(0, usage.find_first_not_of('\n'));
    if (!usage.empty()) usage[0] = 'u';  // "usage: tensorwire inspect [OPTIONS] FILE"
    std::fprintf(stderr, "%s: %s\n%s(--help for the options)\n", app.get_name().c_str(), e.what(),
                 usage.c_str());
    return 2;
  }
}

}  // namespace tensorwire::tools
