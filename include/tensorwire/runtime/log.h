// Reports the library makes on its own threads, where no caller is there to receive an
// exception: a transport failure in an InferenceServer's serving thread, a shared-memory
// watcher that can no longer poll. By default a report is one line on stderr; a program
// installs one handler for the whole process instead. The Python extension installs one
// that hands reports to Python's `logging` module (logger "tensorwire"), so a Python
// program sees them only as it configured logging.
//
// Thread-safety: set_log_handler() may race with reports from other threads (the hook is
// read atomically); the handler is called from whichever thread reports.
#pragma once

#include <string>

namespace tensorwire {

enum class LogLevel { Warning, Error };

// The process-wide handler; nullptr restores the default (stderr).
using LogHandler = void (*)(LogLevel level, const std::string& message);
void set_log_handler(LogHandler handler) noexcept;
// Hands `message` to the installed handler; an exception from the handler is dropped.
void log_message(LogLevel level, const std::string& message) noexcept;

}  // namespace tensorwire
