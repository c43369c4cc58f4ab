// Releasing the GIL around a blocking call in a way that survives interpreter exit. Every
// binding releases the GIL through NoGil, never nb::gil_scoped_release.
//
// A daemon thread (torchrl's server thread, a user's actor thread) may be blocked in a
// tensorwire call when the interpreter finalizes. Taking the GIL back then makes CPython end
// the thread with pthread_exit, whose forced unwinding through the C++ frames here (a
// noexcept destructor, nanobind's catch (...)) calls std::terminate: the process aborts at
// exit. So an atexit hook (registered by bind_errors, run before finalization starts)
// marks the exit and lets every thread already taking the GIL back get it; after that, a
// thread other than the main one that returns from a blocking call parks instead of taking
// the GIL (the process is exiting and nothing waits for it).
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

namespace tensorwire::py {

class NoGil {
 public:
  NoGil() : state_(PyEval_SaveThread()) {}
  ~NoGil() {
    restoring().fetch_add(1);
    if (exiting().load() && std::this_thread::get_id() != main_thread()) {
      restoring().fetch_sub(1);
      park();
    }
    PyEval_RestoreThread(state_);
    restoring().fetch_sub(1);
  }
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

  // The thread that imported tensorwire._C (the interpreter's main thread).
  static std::thread::id& main_thread() {
    static std::thread::id id = std::this_thread::get_id();
    return id;
  }
  static std::atomic<bool>& exiting() {
    static std::atomic<bool> flag{false};
    return flag;
  }
  // Threads between the exit check and having the GIL back.
  static std::atomic<int>& restoring() {
    static std::atomic<int> count{0};
    return count;
  }
  // Where a thread that must not touch Python again waits for the process to exit.
  [[noreturn]] static void park() {
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
  }

 private:
  PyThreadState* state_;
};

// The GIL, taken by a thread that gave it up to run the library's loop, for the Python code
// that loop calls (a dataflow's iterator and progress callback in send_dataflow_zmq): as
// NoGil's destructor does, a thread other than the main one parks once the process is
// exiting, rather than be ended by CPython mid-unwind through the loop's C++ frames
// (std::terminate: an abort at the exit of a program whose daemon thread produced).
class GilForLibrary {
 public:
  GilForLibrary() {
    NoGil::restoring().fetch_add(1);
    if (!PyGILState_Check() && (NoGil::exiting().load() || NoGil::finalizing()) &&
        std::this_thread::get_id() != NoGil::main_thread()) {
      NoGil::restoring().fetch_sub(1);
      NoGil::park();
    }
    gil_.emplace();
    NoGil::restoring().fetch_sub(1);
  }

 private:
  std::optional<nb::gil_scoped_acquire> gil_;
};

// Releases Python objects (`f`, run with the GIL) from any thread, unless the process is
// exiting: a library thread (a lingering pipe close on the liveness thread) that took the
// GIL once finalization began would be ended mid-unwind in a noexcept frame. It counts as
// a thread taking the GIL back (NoGil), so the exit hook waits for it or it leaks.
template <class F>
void release_unless_exiting(F&& f) {
  if (!Py_IsInitialized()) return;  // nothing left to release into
  NoGil::restoring().fetch_add(1);
  if (!PyGILState_Check() && (NoGil::exiting().load() || NoGil::finalizing())) {
    NoGil::restoring().fetch_sub(1);
    return;
  }
  {
    nb::gil_scoped_acquire gil;
    f();
  }
  NoGil::restoring().fetch_sub(1);
}

// Runs `f` with the GIL on a thread of the library (the serving thread, a monitor's
// callback). While the interpreter finalizes, CPython ends such a thread with pthread_exit
// when it takes the GIL (here, or within `f` after a sleep or a torch op): the forced
// unwinding must then not give back a thread state that is no longer current
// (PyGILState_Release: a fatal error, the process aborted at exit), so it passes here
// without, and the thread ends as CPython means it to (its callers let that unwinding
// through). It passes `f`'s own frames too: what they own through RAII is released without
// the GIL, so `f` holds Python objects on raw references where it calls code that may
// release the GIL for long (the policy).
template <class F>
decltype(auto) with_gil(F&& f) {
  PyGILState_STATE state{};
  struct Release {
    PyGILState_STATE* state = nullptr;
    ~Release() {
      if (state) PyGILState_Release(*state);
    }
  } release;
  try {
    state = PyGILState_Ensure();
    release.state = &state;
    return std::forward<F>(f)();
  } catch (...) {
    // No C++ exception: pthread_exit's unwinding (not caught as abi::__forced_unwind&, a
    // reference UBSan sees bound to null). The state is not current any more.
    if (!std::current_exception()) release.state = nullptr;
    throw;
  }
}

// An object of the library handed to Python, whose destructor joins threads of its own that
// may be waiting for the GIL (to log through Python's logging, log_py.cpp): the last
// reference, when Python drops it with the GIL held, is released with the GIL released, or
// the join would wait for ever (a RemoteTransport deleted while a connection it refused was
// being logged).
template <class T>
std::shared_ptr<T> released_without_gil(std::shared_ptr<T> p) {
  T* raw = p.get();
  return std::shared_ptr<T>(raw, [keep = std::move(p)](T*) mutable {
    std::optional<NoGil> nogil;
    if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
    keep.reset();
  });
}

// A Python callable, or None (no callback), as a C++ callback: it is called with the GIL,
// with what `convert` makes of the argument. Shared, as std::function copies it where the
// GIL is not held.
template <class Arg, class Convert>
std::function<void(const Arg&)> py_callback(nanobind::object f, Convert convert) {
  if (f.is_none()) return {};
  return [f = std::make_shared<nanobind::object>(std::move(f)), convert](const Arg& a) {
    with_gil([&] { (*f)(convert(a)); });
  };
}

}  // namespace tensorwire::py
