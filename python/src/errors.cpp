// Exceptions and interrupts, in one place for the whole extension:
//  - the mapping of every tensorwire::Error kind to the Python exception a user of the
//    reference libraries expects (ClosedError is a ConnectionError, and a RuntimeError as
//    before, so existing `except RuntimeError` keeps working);
//  - RemoteError (a policy or a worker that raised in another process) rebuilt as the
//    original exception where that is possible, with the remote traceback as its cause;
//  - the interrupt check every blocking call of the library runs between wait slices: it
//    takes the GIL briefly, on the main thread only (where Python handles signals), and
//    turns a pending KeyboardInterrupt (or any signal handler's exception) into
//    tensorwire::Interrupted, which unwinds the C++ wait and comes back here as that same
//    Python exception.
#include <nanobind/nanobind.h>

#include <cerrno>
#include <chrono>
#include <system_error>
#include <thread>

#include "bindings.h"
#include "gil.h"
#include "tensorwire/core/error.h"
#include "tensorwire/dataflow/dataflow.h"
#include "tensorwire/pipe/errors.h"
#include "tensorwire/runtime/interrupt.h"
#include "tensorwire/runtime/remote_error.h"

namespace tensorwire::py {

namespace nb = nanobind;

namespace {

// The Python exception an interrupt check fetched, per thread, until the translator
// restores it (a strong reference; only ever touched with the GIL held).
thread_local PyObject* t_pending = nullptr;

void python_interrupt_check() {
  if (std::this_thread::get_id() != NoGil::main_thread() || !Py_IsInitialized() ||
      NoGil::finalizing())
    return;
  PyGILState_STATE s = PyGILState_Ensure();
  if (PyErr_CheckSignals() != 0) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    Py_XDECREF(t_pending);
    t_pending = value;
    PyGILState_Release(s);
    throw Interrupted("interrupted by a signal");
  }
  PyGILState_Release(s);
}

// The exception class called `name`: a builtin ("KeyError" or "builtins.KeyError"), or
// "module.Qual.Name" of a module this process has imported already, so a policy's or a
// worker's own exception type comes back as itself where the caller can catch it. The name
// comes from another process: the module is looked up in sys.modules by its exact name and
// the rest in the real dicts of that module and of the classes below it, never by getattr
// (a module's __getattr__ or a property can import modules or run code). Only Exception
// subclasses: a SystemExit or KeyboardInterrupt raised elsewhere must not end this
// process. Invalid when there is none.
nb::object exception_class(std::string name) {
  if (name.rfind("builtins.", 0) == 0) name = name.substr(9);
  if (name.empty() || name.find('\0') != std::string::npos) return {};
  PyObject* t = nullptr;  // borrowed from a dict that the module keeps alive
  nb::object module;
  if (name.find('.') == std::string::npos) {
    PyObject* builtins = PyEval_GetBuiltins();
    t = builtins ? PyDict_GetItemString(builtins, name.c_str()) : nullptr;
  } else {
    // The longest prefix that names an imported module, then names down its classes.
    for (size_t cut = name.rfind('.'); cut != std::string::npos && cut > 0;
         cut = name.rfind('.', cut - 1)) {
      PyObject* m = PyImport_GetModule(nb::str(name.substr(0, cut).c_str()).ptr());
      if (!m) {
        PyErr_Clear();
        continue;
      }
      module = nb::steal(m);
      if (!PyModule_Check(m)) return {};
      t = m;
      for (size_t at = cut + 1; t != nullptr && at <= name.size();) {
        const size_t end = std::min(name.find('.', at), name.size());
        PyObject* dict = PyModule_Check(t) ? PyModule_GetDict(t)
                         : PyType_Check(t) ? reinterpret_cast<PyTypeObject*>(t)->tp_dict
                                           : nullptr;
        t = dict ? PyDict_GetItemString(dict, name.substr(at, end - at).c_str()) : nullptr;
        at = end + 1;
      }
      break;
    }
  }
  if (t != nullptr && PyType_Check(t) &&
      PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t),
                       reinterpret_cast<PyTypeObject*>(PyExc_Exception)))
    return nb::borrow(t);
  return {};
}

// Text that came from another process: its exact length (a NUL does not end it) and any
// invalid UTF-8 escaped, so building the exception can never fail in turn.
nb::str text(const std::string& s) {
  return nb::steal<nb::str>(
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "backslashreplace"));
}

nb::object g_remote_traceback;  // tensorwire.RemoteTraceback (the class)

// The Python exception for a failure in another process.
nb::object remote_exception(const RemoteError& e, const dataflow::WorkerError* worker) {
  const Failure& f = e.failure();
  nb::object exc;
  if (!f.payload.empty()) {  // only a runner's own forked worker fills it (trusted)
    try {
      exc = nb::module_::import_("pickle").attr("loads")(
          nb::bytes(f.payload.data(), f.payload.size()));
      if (!PyObject_IsInstance(exc.ptr(), PyExc_Exception)) exc = nb::object();
    } catch (nb::python_error&) {
      exc = nb::object();
    }
  }
  if (!exc.is_valid()) {
    if (nb::object t = exception_class(f.type); t.is_valid()) {
      try {
        exc = t(text(f.message));
        if (!PyObject_IsInstance(exc.ptr(), PyExc_Exception)) exc = nb::object();
      } catch (nb::python_error&) {
        exc = nb::object();
      }
    }
  }
  auto fallback = [&] { return nb::borrow(PyExc_RuntimeError)(text(f.type + ": " + f.message)); };
  if (!exc.is_valid()) exc = fallback();
  auto describe = [&](nb::handle e) {
    if (!f.traceback.empty()) {
      std::string cause = "\n\"\"\"\n" + f.traceback + "\"\"\"";
      PyException_SetCause(e.ptr(), g_remote_traceback(text(cause)).release().ptr());
    }
    e.attr("remote_type") = text(f.type);
    e.attr("remote_traceback") = text(f.traceback);
    if (worker) {
      e.attr("worker") = worker->worker();
      e.attr("worker_pid") = worker->pid();
      e.attr("worker_traceback") = text(f.traceback);
      if (nb::hasattr(e, "add_note")) e.attr("add_note")(text("raised in " + worker->context()));
    }
  };
  try {
    describe(exc);
  } catch (nb::python_error&) {
    // An exception that refuses attributes (a frozen dataclass, __slots__): the RuntimeError
    // naming its type keeps the message.
    exc = fallback();
    describe(exc);
  }
  // A StopIteration raised from __next__ (a runner's) ends the caller's loop as if the
  // stream were over: epochs cut short without a word. As PEP 479 does for generators, it
  // becomes a RuntimeError whose cause is the original.
  if (PyErr_GivenExceptionMatches(exc.type().ptr(), PyExc_StopIteration) ||
      PyErr_GivenExceptionMatches(exc.type().ptr(), PyExc_StopAsyncIteration)) {
    nb::object wrapped = nb::borrow(PyExc_RuntimeError)(
        text(f.type + (worker ? " raised in another process" : " raised by the policy") +
             (f.message.empty() ? "" : ": " + f.message)));
    describe(wrapped);
    PyException_SetCause(wrapped.ptr(), exc.release().ptr());
    exc = std::move(wrapped);
  }
  return exc;
}

}  // namespace

Failure describe_python_exception(nb::handle exc, bool with_payload) {
  Failure f;
  nb::handle type = exc.type();
  std::string module =
      nb::cast<std::string>(nb::str(nb::getattr(type, "__module__", nb::str("builtins"))));
  f.type = nb::cast<std::string>(nb::str(nb::getattr(type, "__qualname__", nb::str("Exception"))));
  if (module != "builtins") f.type = module + "." + f.type;
  try {
    // The single argument as given (str() of a KeyError adds quotes), else str(exc).
    nb::object args = exc.attr("args");
    f.message = nb::len(args) == 1 && nb::isinstance<nb::str>(args[0])
                    ? nb::cast<std::string>(args[0])
                    : nb::cast<std::string>(nb::str(exc));
    nb::object lines = nb::module_::import_("traceback").attr("format_exception")(exc);
    f.traceback = nb::cast<std::string>(nb::str("").attr("join")(lines));
  } catch (nb::python_error&) {
    if (f.message.empty()) f.message = "(unprintable)";
  }
  if (with_payload) {
    try {
      nb::bytes b = nb::cast<nb::bytes>(nb::module_::import_("pickle").attr("dumps")(exc, -1));
      f.payload.assign(b.c_str(), b.size());
    } catch (nb::python_error&) {
      // Not picklable: the receiving side rebuilds it from type and message.
    }
  }
  return f;
}

Failure describe_worker_failure(std::exception_ptr ep) {
  nb::gil_scoped_acquire gil;
  try {
    std::rethrow_exception(ep);
  } catch (nb::python_error& e) {
    return describe_python_exception(e.value(), true);
  } catch (...) {
    return describe_exception(std::current_exception());
  }
}

void bind_errors(nb::module_& m) {
  NoGil::main_thread();  // the importing thread, where Python runs signal handlers
  set_interrupt_check(python_interrupt_check);
  // See gil.h: from here on, a daemon thread coming back from a blocking call parks
  // instead of being ended by CPython mid-unwind (std::terminate).
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    NoGil::exiting() = true;
    // Threads already taking the GIL back get it now (bounded wait): such a thread may have
    // been woken by an atexit hook that ran before this one (tensorwire.dataflow closes its
    // runners), and finalization would end it mid-unwind. This NoGil counts in restoring()
    // only once it is destroyed.
    NoGil nogil;
    for (int i = 0; i < 1000 && NoGil::restoring().load() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }));

  static nb::object protocol_error =
      nb::exception<ProtocolError>(m, "ProtocolError", PyExc_RuntimeError);
  // ClosedError: a ConnectionError (what a closed connection is in Python) that is also a
  // RuntimeError (what it was before, and what tensordict's pipe raises).
  nb::object closed_error = nb::borrow(reinterpret_cast<PyObject*>(&PyType_Type))(
      "ClosedError",
      nb::make_tuple(nb::handle(PyExc_ConnectionError), nb::handle(PyExc_RuntimeError)),
      nb::dict());
  closed_error.attr("__module__") = "tensorwire";
  closed_error.attr("__doc__") =
      "Use of a closed pipe, transport, server or runner, or one whose peer went away.";
  m.attr("ClosedError") = closed_error;
  g_remote_traceback = nb::borrow(reinterpret_cast<PyObject*>(&PyType_Type))(
      "RemoteTraceback", nb::make_tuple(nb::handle(PyExc_Exception)), nb::dict());
  g_remote_traceback.attr("__module__") = "tensorwire";
  g_remote_traceback.attr("__doc__") = "The traceback of an exception raised in another process.";
  g_remote_traceback.attr("__str__") = nb::cpp_function(
      [](nb::handle self) { return nb::str(nb::handle(self.attr("args")[0])); }, nb::is_method());
  m.attr("RemoteTraceback") = g_remote_traceback;
  // Module attributes keep both classes alive; these statics only borrow them until the
  // module is gone (nanobind warns about leaks otherwise).
  static PyObject* closed_type = closed_error.ptr();

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Interrupted& e) {
      if (t_pending) {
        PyObject* v = t_pending;
        t_pending = nullptr;
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(v)), v);
        Py_DECREF(v);
      } else {
        PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
      }
    } catch (const dataflow::WorkerError& e) {
      nb::object exc = remote_exception(e, &e);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (const RemoteError& e) {
      nb::object exc = remote_exception(e, nullptr);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (const KeyError& e) {
      PyErr_SetString(PyExc_KeyError, e.what());
    } catch (const IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    } catch (const ProtocolError& e) {
      PyErr_SetString(protocol_error.ptr(), e.what());
    } catch (const ConnectionRefused& e) {
      PyErr_SetString(PyExc_ConnectionRefusedError, e.what());
    } catch (const PortInUse& e) {
      PyErr_SetObject(PyExc_OSError, nb::make_tuple(EADDRINUSE, e.what()).ptr());
    } catch (const ClosedError& e) {
      PyErr_SetString(closed_type, e.what());
    } catch (const SystemError& e) {
      // OSError(errno, message) is the errno's own subclass (FileNotFoundError, ...).
      PyErr_SetObject(PyExc_OSError, nb::make_tuple(e.code(), e.what()).ptr());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const nb::cast_error&) {
      // A conversion the binding left to nanobind (whose message is "std::bad_cast").
      PyErr_SetString(PyExc_TypeError,
                      "a value could not be converted to the type this call takes (a str must "
                      "be valid UTF-8 text)");
    } catch (const std::system_error& e) {
      // A thread that could not start (std::thread's EAGAIN), for one: its errno's OSError,
      // naming the limit (a RuntimeError "Resource temporarily unavailable" said nothing).
      // Only an errno: another category's codes (std::future_error's) are not errnos.
      if (e.code().category() != std::generic_category() &&
          e.code().category() != std::system_category()) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return;
      }
      std::string msg = e.what();
      if (e.code().value() == EAGAIN)
        msg +=
            " (a thread could not start: a thread or process limit is reached, RLIMIT_NPROC "
            "(ulimit -u) or a cgroup's pids.max)";
      PyErr_SetObject(PyExc_OSError, nb::make_tuple(e.code().value(), msg).ptr());
    }
  });
}

}  // namespace tensorwire::py
