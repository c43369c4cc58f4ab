// The InferenceServer binding: calling a Python policy from the C++ serving thread (its
// Python thread state, the adapter held weakly, a Python exception as a RemoteError) and the
// GIL around starting and stopping.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "tensorwire/inference/server.h"

namespace tensorwire::py {

namespace {

namespace inf = tensorwire::inference;

// The policy adapter, held weakly: the Python InferenceServer owns it. A strong reference
// from C++ would hide the cycle server -> adapter -> policy -> module globals -> server
// from Python's garbage collector, and leak it.
struct PyCallable {
  nb::object fn;  // a weakref.ref to the adapter
  ~PyCallable() {
    if (!Py_IsInitialized()) {
      fn.release();  // the interpreter is gone: leak rather than touch it
      return;
    }
    nb::gil_scoped_acquire gil;
    fn.reset();
  }
};

// One Python thread state for the whole life of the serving thread, instead of one per
// policy call (PyGILState_Ensure/Release from a thread Python does not know creates and
// destroys one each time, with a fresh frame stack). Kept by holding one PyGILState_Ensure
// open (the GIL itself is released at once), given back when the thread exits.
struct ServingThreadState {
  PyGILState_STATE gil_state{};
  PyThreadState* saved = nullptr;
  bool active = false;

  void ensure() {
    if (active) return;
    gil_state = PyGILState_Ensure();  // may end the thread at exit, as with_gil says
    saved = PyEval_SaveThread();
    active = true;
  }
  ~ServingThreadState() {
    if (!active || !Py_IsInitialized() || NoGil::finalizing()) return;
    PyEval_RestoreThread(saved);
    PyGILState_Release(gil_state);
  }
};
thread_local ServingThreadState serving_thread_state;

// The adapter called with the batch, on raw references only (see make_policy): a new
// reference to its result, or nullptr with the Python error set, or nullptr and `gone`
// when the adapter is gone.
PyObject* call_adapter(PyObject* weak_adapter, const TensorDict& batch, bool& gone) {
  PyObject* fn = PyObject_CallNoArgs(weak_adapter);  // the weakref's referent
  gone = fn == Py_None;
  if (fn == nullptr || gone) {
    Py_XDECREF(fn);
    return nullptr;
  }
  PyObject* arg = nb::cast(PyTensorDict(batch)).release().ptr();
  PyObject* out = PyObject_CallOneArg(fn, arg);
  Py_DECREF(arg);
  Py_DECREF(fn);
  return out;
}

// The policy's output goes through the conversion module (convert.h, policy_output).
//
// The interpreter may finalize while a policy call runs (the program ended during a slow
// forward pass, past the exit hook's wait): CPython then ends the serving thread as the
// policy takes the GIL back (with_gil), so the call holds the adapter and the batch on raw
// references, which that unwinding leaves alone.
inf::Policy make_policy(nb::object adapter, std::optional<std::vector<Key>> keys) {
  auto holder = std::make_shared<PyCallable>();
  holder->fn = nb::weakref(adapter);
  return [holder, keys = std::move(keys)](const TensorDict& batch) -> TensorDict {
    serving_thread_state.ensure();
    return with_gil([&] {
      bool gone = false;
      PyObject* out = call_adapter(holder->fn.ptr(), batch, gone);
      if (gone) throw ClosedError("the InferenceServer's Python object is gone");
      try {
        if (out == nullptr) throw nb::python_error();
        return policy_output(nb::steal(out), keys, batch.batch_size());
      } catch (nb::python_error& e) {
        throw RemoteError(describe_python_exception(e.value(), false));
      }
    });
  };
}

// The server and the GIL: a destructor that joins the serving thread must not hold the
// GIL (the thread may be waiting for it to call the policy).
struct PyServer {
  // Shared with the calls that release the GIL (start, shutdown, update_model): a close()
  // from another thread meanwhile leaves the server to the last of them, whose release
  // destroys it (a shutdown and a join) without the GIL.
  std::shared_ptr<inf::InferenceServer> server;
  void close() {
    // First the interruptible wait for a policy call in progress (Ctrl-C raises
    // KeyboardInterrupt and leaves the server stopping; close() again finishes), then the
    // release, whose join is then at once.
    if (std::shared_ptr<inf::InferenceServer> s = server) {
      NoGil nogil;
      s->shutdown(Timeout::forever());
    }
    std::shared_ptr<inf::InferenceServer> doomed = std::move(server);  // under the GIL
    NoGil nogil;
    doomed.reset();
  }
  ~PyServer() {
    if (server && Py_IsInitialized() && PyGILState_Check()) close();
  }
  std::shared_ptr<inf::InferenceServer> get() {
    if (!server) throw ClosedError("the InferenceServer was closed");
    return server;
  }
};

}  // namespace

void bind_inference_server(nb::module_& m) {
  nb::class_<PyServer>(m, "_InferenceServer")
      .def(
          "__init__",
          [](PyServer* self, nb::object adapter, nb::handle response_keys,
             std::vector<std::shared_ptr<inf::Transport>> transports, nb::handle max_batch_size,
             nb::handle min_batch_size, nb::handle timeout, nb::handle min_transport_share,
             nb::handle stats_window, nb::handle policy_version_key, nb::handle policy_version) {
            inf::ServerOptions o{.max_batch_size = int_arg(max_batch_size, "max_batch_size"),
                                 .min_batch_size = int_arg(min_batch_size, "min_batch_size"),
                                 .timeout = timeout_arg(timeout, "timeout", false).duration(),
                                 .min_transport_share =
                                     *number_arg(min_transport_share, "min_transport_share", false),
                                 .stats_window_size = int_arg(stats_window, "stats_window_size"),
                                 .policy_version_key = std::nullopt,
                                 .policy_version = int_arg(policy_version, "policy_version")};
            if (!policy_version_key.is_none()) o.policy_version_key = to_key(policy_version_key);
            std::optional<std::vector<Key>> keys;
            if (!response_keys.is_none()) {
              keys.emplace();
              for (nb::handle k : response_keys) keys->push_back(to_key(k));
            }
            new (self) PyServer{released_without_gil(std::make_shared<inf::InferenceServer>(
                make_policy(std::move(adapter), std::move(keys)), std::move(transports), o))};
          },
          nb::arg("adapter"), nb::arg("response_keys").none(), nb::arg("transports"),
          nb::arg("max_batch_size").none(), nb::arg("min_batch_size").none(),
          nb::arg("timeout").none(), nb::arg("min_transport_share").none(),
          nb::arg("stats_window").none(), nb::arg("policy_version_key").none(),
          nb::arg("policy_version").none())
      .def("start",
           [](PyServer& s) {
             std::shared_ptr<inf::InferenceServer> server = s.get();
             // It joins a serving thread that ended before, which takes the GIL as it ends.
             NoGil nogil;
             server->start();
           })
      .def(
          "shutdown",
          [](PyServer& s, nb::handle timeout) {
            const Timeout t = timeout_arg(timeout);
            std::shared_ptr<inf::InferenceServer> server = s.get();
            NoGil nogil;
            return server->shutdown(t);
          },
          nb::arg("timeout").none() = 5.0)
      .def_prop_ro("is_alive", [](PyServer& s) { return s.server && s.server->running(); })
      .def_prop_ro("is_closed", [](PyServer& s) { return !s.server; })
      .def_prop_ro("policy_version", [](PyServer& s) { return s.get()->policy_version(); })
      .def(
          "update_model",
          [](PyServer& s, nb::callable fn, nb::handle mark_weight_update, nb::handle timeout) {
            const bool mark = bool_arg(mark_weight_update, "mark_weight_update");
            const Timeout t = timeout_arg(timeout);
            std::shared_ptr<inf::InferenceServer> server = s.get();
            nb::object result;
            {
              NoGil nogil;
              server->update_model(
                  [&] {
                    nb::gil_scoped_acquire gil;
                    result = fn();
                  },
                  mark, t);
            }
            return result;
          },
          nb::arg("fn"), nb::arg("mark_weight_update").none() = true,
          nb::arg("timeout").none() = nb::none())
      .def(
          "stats",
          [](PyServer& s, nb::handle reset) {  // in the order of inference.py's _STATS
            inf::ServerStats st = s.get()->stats(bool_arg(reset, "reset"));
            return nb::make_tuple(st.requests, st.batches, st.requests_per_s, st.batches_per_s,
                                  st.avg_batch_size, st.p50_queue_ms, st.p95_queue_ms,
                                  st.p50_forward_ms, st.p95_forward_ms, st.policy_version,
                                  st.weight_updates);
          },
          nb::arg("reset").none() = false)
      .def("close", &PyServer::close);
}

}  // namespace tensorwire::py
