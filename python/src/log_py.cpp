// The library's reports (tensorwire/runtime/log.h) as records of Python's `logging` module,
// logger "tensorwire": a Python program sees them as it configured logging (with none
// configured, logging's last resort prints warnings and errors to stderr), never as lines the
// C++ code wrote itself.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "gil.h"
#include "tensorwire/runtime/log.h"

namespace nb = nanobind;

namespace tensorwire::py {

namespace {

void to_logging(LogLevel level, const std::string& message) {
  // At interpreter exit a thread other than the main one must not take the GIL (gil.h).
  if (NoGil::exiting().load() || NoGil::finalizing()) return;
  with_gil([&] {
    try {
      nb::object logger = nb::module_::import_("logging").attr("getLogger")("tensorwire");
      logger.attr(level == LogLevel::Error ? "error" : "warning")(message);
    } catch (nb::python_error& e) {
      // A Ctrl-C that came while a handler ran is not the handler's error: dropped, the
      // caller's loop would run on. Raised again where the next wait checks for signals.
      if (e.matches(PyExc_KeyboardInterrupt)) {
        PyErr_SetInterrupt();
        return;
      }
      e.discard_as_unraisable("tensorwire: logging a report of the library");
    }
  });
}

}  // namespace

void bind_log(nb::module_& m) {
  set_log_handler(&to_logging);
  // For the tests: a report as the library's own threads make them.
  m.def(
      "_log_report",
      [](const std::string& level, const std::string& message) {
        if (level != "warning" && level != "error")
          throw nb::value_error("_log_report: level must be 'warning' or 'error'");
        NoGil released;  // reported from a thread without the GIL, as the library does
        log_message(level == "error" ? LogLevel::Error : LogLevel::Warning, message);
      },
      nb::arg("level"), nb::arg("message"));
}

}  // namespace tensorwire::py
