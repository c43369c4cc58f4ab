// Bindings for the inference transports, clients and InferenceServer.
//
// The GIL: conversions of Python objects happen under it; every wait (for a slot, for a
// response) and every copy into or out of shared memory runs without it, in slices so
// Ctrl-C is honoured. The server's thread takes the GIL only around the policy call,
// which goes through a Python adapter (python/tensorwire/inference.py) that converts the
// batch for the policy and its result back to a tensorwire TensorDict.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <mutex>

#include "bindings.h"
#include "tensordict_py.h"
#include "tensorwire/inference/server.h"
#include "tensorwire/inference/shared_memory_transport.h"
#include "tensorwire/inference/socket_transport.h"
#include "tensorwire/inference/thread_transport.h"

namespace tensorwire::py {

namespace {

namespace inf = tensorwire::inference;
using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kSlice{200};

inf::Timeout to_timeout(std::optional<double> seconds) {
  if (!seconds) return inf::kNoTimeout;
  if (*seconds < 0)
    throw ValueError("timeout must be None or >= 0, got " + std::to_string(*seconds));
  return std::chrono::duration_cast<inf::Timeout>(std::chrono::duration<double>(*seconds));
}

// Python helpers, looked up per use (caching Python objects in C++ statics would keep
// them alive past the interpreter's teardown).
nb::object interop(const char* name) {
  return nb::module_::import_("tensorwire._interop").attr(name);
}
// A tensordict.TensorDictBase? Only possible when tensordict is imported already.
bool is_tensordict(nb::handle obj) {
  if (nb::isinstance<PyTensorDict>(obj)) return false;
  PyObject* mod = PyDict_GetItemString(PyImport_GetModuleDict(), "tensordict");  // borrowed
  if (!mod) return false;
  nb::object base = nb::getattr(nb::handle(mod), "TensorDictBase", nb::none());
  if (base.is_none()) return false;
  int r = PyObject_IsInstance(obj.ptr(), base.ptr());
  if (r < 0) throw nb::python_error();
  return r == 1;
}

// Walks a (possibly nested) key into a mapping: obj[a][b]...
nb::object get_path(nb::handle obj, const Key& key) {
  nb::object v = nb::borrow(obj);
  for (const std::string& part : key.parts()) v = v[nb::str(part.c_str())];
  return v;
}

// A request as a C++ TensorDict. Only the declared keys are read from a foreign mapping
// (a tensordict.TensorDict, a dict) when the transport has a fixed layout.
TensorDict convert_request(nb::handle obj, const std::optional<std::vector<Key>>& keys) {
  if (keys) {
    TensorDict td;
    for (const Key& k : *keys) {
      nb::object v;
      try {
        v = get_path(obj, k);
      } catch (nb::python_error& e) {
        if (!e.matches(PyExc_KeyError) && !e.matches(PyExc_TypeError) &&
            !e.matches(PyExc_IndexError))
          throw;
        throw KeyError("request has no key " + k.str() + " (declared in the request spec)");
      }
      if (nb::hasattr(v, "device") && nb::hasattr(v, "dtype")) {
        nb::object dev = v.attr("device");
        std::string type = nb::hasattr(dev, "type")
                               ? nb::cast<std::string>(nb::str(dev.attr("type")))
                               : nb::cast<std::string>(nb::str(dev));
        if (type != "cpu")
          throw ValueError("request key " + k.str() + ": tensor on " +
                           nb::cast<std::string>(nb::str(dev)) +
                           "; SharedMemoryTransport only accepts CPU tensors");
      }
      std::optional<Tensor> t = to_tensor(v);
      if (!t)
        throw ValueError("request key " + k.str() + ": expected a tensor, got a " +
                         nb::cast<std::string>(nb::str(v.type().attr("__name__"))));
      td.set(k, std::move(*t));
    }
    return td;
  }
  if (is_tensordict(obj)) {
    return nb::cast<PyTensorDict&>(interop("from_tensordict")(obj)).td();
  }
  if (nb::isinstance<nb::dict>(obj)) {
    nb::object td = nb::module_::import_("tensorwire._C").attr("TensorDict")(obj);
    return nb::cast<PyTensorDict&>(td).td();
  }
  throw TypeError("a request must be a TensorDict (tensorwire or tensordict) or a dict, got a " +
                  nb::cast<std::string>(nb::str(obj.type().attr("__name__"))));
}

// The request as a TensorDict: a tensorwire one as it is (no copy), anything else
// converted into `holder`.
const TensorDict& request_from(nb::handle obj, const std::optional<std::vector<Key>>& keys,
                               TensorDict& holder) {
  if (nb::isinstance<PyTensorDict>(obj)) return nb::cast<PyTensorDict&>(obj).td();
  holder = convert_request(obj, keys);
  return holder;
}

nb::object response_to(TensorDict td, bool as_tensordict) {
  nb::object out = nb::cast(PyTensorDict(std::move(td)));
  if (!as_tensordict) return out;
  return interop("to_tensordict")(out);
}

// Runs `step(deadline)` without the GIL in slices of at most kSlice, checking for signals
// between slices, until it returns true or `deadline` passes (returns false).
template <class Step>
bool in_slices(Clock::time_point deadline, Step&& step) {
  while (true) {
    const auto now = Clock::now();
    const auto slice = deadline - now > kSlice ? now + kSlice : deadline;
    bool done;
    {
      nb::gil_scoped_release nogil;
      done = step(slice);
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (Clock::now() >= deadline) return false;
  }
}

struct PyClient {
  inf::Client client;
  std::optional<std::vector<Key>> keys;
  bool keys_known = false;

  const std::optional<std::vector<Key>>& request_keys() {
    if (!keys_known) {
      nb::gil_scoped_release nogil;  // may connect (a handshake with the owner)
      keys = client.impl()->request_keys();
      keys_known = true;
    }
    return keys;
  }

  // Submits, waiting for room in slices; returns the pending request.
  std::unique_ptr<inf::detail::Pending> submit(const TensorDict& td, Clock::time_point deadline) {
    std::unique_ptr<inf::detail::Pending> p;
    in_slices(deadline, [&](Clock::time_point slice) {
      try {
        p = client.impl()->submit(td, slice);
        return true;
      } catch (const TimeoutError&) {
        if (slice >= deadline) throw;
        return false;
      }
    });
    return p;
  }
};

struct PyFuture {
  std::unique_ptr<inf::detail::Pending> pending;
  bool as_tensordict = false;
  std::mutex mu;  // result() from two threads at once: one waits for the other
  std::optional<TensorDict> value;
  std::exception_ptr error;

  bool done() {
    std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
    if (!lock) return false;
    return value || error || !pending || pending->ready();
  }

  nb::object result(std::optional<double> timeout) {
    const auto deadline = inf::deadline_after(to_timeout(timeout));
    TensorDict out;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu);
      if (!value && !error) {
        bool ready = false;
        while (!ready) {
          const auto now = Clock::now();
          ready = pending->wait(deadline - now > kSlice ? now + kSlice : deadline);
          if (ready) break;
          {
            nb::gil_scoped_acquire gil;
            if (PyErr_CheckSignals() != 0) throw nb::python_error();
          }
          if (Clock::now() >= deadline)
            throw TimeoutError("no response within the timeout; the request is still in flight");
        }
        try {
          value = pending->take();
        } catch (...) {
          error = std::current_exception();
        }
        pending.reset();
      }
      if (error) std::rethrow_exception(error);
      out = *value;
    }
    return response_to(std::move(out), as_tensordict);
  }
};

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

RemoteError describe_python_error(nb::python_error& e) {
  nb::handle type = e.type();
  std::string module = nb::cast<std::string>(nb::str(type.attr("__module__")));
  std::string name = nb::cast<std::string>(nb::str(type.attr("__qualname__")));
  if (module != "builtins") name = module + "." + name;
  nb::object value = nb::borrow(e.value());
  nb::object args = value.attr("args");
  std::string message = nb::len(args) == 1 && nb::isinstance<nb::str>(args[0])
                            ? nb::cast<std::string>(args[0])
                            : nb::cast<std::string>(nb::str(value));
  return RemoteError(std::move(name), std::move(message));
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// One Python thread state for the whole life of the serving thread. Without it every
// policy call would create and destroy a thread state (PyGILState_Ensure/Release from a
// thread Python does not know), and with it a fresh frame stack, mapped and faulted in
// per batch. The state is kept by holding one PyGILState_Ensure open (the GIL itself is
// released at once) and given back when the thread exits.
struct ServingThreadState {
  PyGILState_STATE gil_state{};
  PyThreadState* saved = nullptr;
  bool active = false;

  void ensure() {
    if (active) return;
    gil_state = PyGILState_Ensure();
    saved = PyEval_SaveThread();
    active = true;
  }
  ~ServingThreadState() {
    if (!active || !Py_IsInitialized() || interpreter_finalizing()) return;
    PyEval_RestoreThread(saved);
    PyGILState_Release(gil_state);
  }
};
thread_local ServingThreadState serving_thread_state;

inf::Policy make_policy(nb::object adapter) {
  auto holder = std::make_shared<PyCallable>();
  holder->fn = nb::weakref(adapter);
  return [holder](const TensorDict& batch) -> TensorDict {
    serving_thread_state.ensure();
    nb::gil_scoped_acquire gil;
    try {
      nb::object fn = holder->fn();
      if (fn.is_none()) throw ClosedError("the InferenceServer's Python object is gone");
      nb::object out = fn(PyTensorDict(batch));
      if (!nb::isinstance<PyTensorDict>(out))
        throw TypeError("the policy adapter returned a " +
                        nb::cast<std::string>(nb::str(out.type().attr("__name__"))) +
                        ", not a tensorwire.TensorDict");
      return nb::cast<PyTensorDict&>(out).td();
    } catch (nb::python_error& e) {
      throw describe_python_error(e);
    }
  };
}

// The server and the GIL: a destructor that joins the serving thread must not hold the
// GIL (the thread may be waiting for it to call the policy).
struct PyServer {
  std::unique_ptr<inf::InferenceServer> server;
  ~PyServer() {
    if (!server) return;
    if (Py_IsInitialized() && PyGILState_Check()) {
      nb::gil_scoped_release nogil;
      server.reset();
    } else {
      server.reset();
    }
  }
  inf::InferenceServer& get() {
    if (!server) throw ClosedError("the InferenceServer was closed");
    return *server;
  }
};

inf::Client client_for(const std::string& kind, const std::string& address) {
  if (kind == "shared_memory") return inf::SharedMemoryTransport::client_for(address);
  if (kind == "socket") return inf::SocketTransport::client_for(address);
  throw ValueError("no client can attach to a transport of kind '" + kind + "' by name");
}

nb::list key_list(const std::vector<Key>& keys) {
  nb::list out;
  for (const Key& k : keys) out.append(from_key(k));
  return out;
}

}  // namespace

void bind_inference(nb::module_& m) {
  nb::class_<PyFuture>(m, "InferenceFuture", "One in-flight inference request.")
      .def("done", &PyFuture::done, "True when result() would not block.")
      .def("result", &PyFuture::result, nb::arg("timeout").none() = nb::none(),
           "The response (TimeoutError after `timeout` seconds: the request stays in flight).");

  nb::class_<PyClient>(
      m, "InferenceClient",
      "Submits single requests to an inference server; picklable by transport name.")
      .def(
          "submit",
          [](PyClient& self, nb::handle td, std::optional<double> timeout) {
            TensorDict holder;
            const TensorDict& request = request_from(td, self.request_keys(), holder);
            auto f = std::make_unique<PyFuture>();
            f->as_tensordict = is_tensordict(td);
            f->pending = self.submit(request, inf::deadline_after(to_timeout(timeout)));
            return f.release();
          },
          nb::arg("td"), nb::arg("timeout").none() = nb::none(), nb::rv_policy::take_ownership)
      .def(
          "__call__",
          [](PyClient& self, nb::handle td, std::optional<double> timeout) {
            TensorDict holder;
            const TensorDict& request = request_from(td, self.request_keys(), holder);
            const bool as_td = is_tensordict(td);
            const auto deadline = inf::deadline_after(to_timeout(timeout));
            TensorDict out;
            bool answered = false;
            {
              // The common case in one GIL release: submit, the answer within a slice.
              nb::gil_scoped_release nogil;
              const auto now = Clock::now();
              const auto slice = deadline - now > kSlice ? now + kSlice : deadline;
              std::unique_ptr<inf::detail::Pending> p;
              try {
                p = self.client.impl()->submit(request, slice);
              } catch (const TimeoutError&) {
                if (slice >= deadline) throw;
              }
              if (p && p->wait(slice)) {
                out = p->take();
                answered = true;
              } else if (p) {
                nb::gil_scoped_acquire gil;
                if (!in_slices(deadline, [&](Clock::time_point s) { return p->wait(s); }))
                  throw TimeoutError("no response within the timeout");
                nb::gil_scoped_release again;
                out = p->take();
                answered = true;
              }
            }
            if (!answered) {  // no room within the first slice: the slow path
              std::unique_ptr<inf::detail::Pending> p = self.submit(request, deadline);
              if (!in_slices(deadline, [&](Clock::time_point s) { return p->wait(s); }))
                throw TimeoutError("no response within the timeout");
              nb::gil_scoped_release nogil;
              out = p->take();
            }
            return response_to(std::move(out), as_td);
          },
          nb::arg("td"), nb::arg("timeout").none() = nb::none())
      .def_prop_ro("kind", [](const PyClient& self) { return std::string(self.client.kind()); })
      .def_prop_ro("address", [](const PyClient& self) { return self.client.address(); })
      .def("__getstate__",
           [](const PyClient& self) {
             std::string address = self.client.address();
             if (address.empty())
               throw TypeError(std::string("a ") + self.client.kind() +
                               " transport client cannot leave its process (use a "
                               "SharedMemoryTransport or SocketTransport)");
             return std::make_tuple(std::string(self.client.kind()), address);
           })
      .def("__setstate__", [](PyClient& self, const std::tuple<std::string, std::string>& state) {
        new (&self)
            PyClient{client_for(std::get<0>(state), std::get<1>(state)), std::nullopt, false};
      });

  m.def(
      "_inference_client_for",
      [](const std::string& kind, const std::string& address) {
        return PyClient{client_for(kind, address), std::nullopt, false};
      },
      nb::arg("kind"), nb::arg("address"));

  nb::class_<inf::Transport>(m, "_Transport")
      .def_prop_ro("kind", [](const inf::Transport& t) { return std::string(t.kind()); })
      .def("client", [](inf::Transport& t) {
        return PyClient{t.client(), std::nullopt, false};
      });

  nb::class_<inf::SharedMemoryTransport, inf::Transport>(m, "_SharedMemoryTransport")
      .def_static(
          "create",
          [](const PyTensorDict& request_spec, const PyTensorDict& response_spec,
             uint32_t num_slots, bool copy_result, std::optional<std::string> name,
             std::optional<uint32_t> spin) {
            inf::SharedMemoryOptions o;
            o.num_slots = num_slots;
            o.copy_result = copy_result;
            if (name) o.name = *name;
            if (spin) o.spin = *spin;
            const TensorDict& req = request_spec.td();
            const TensorDict& resp = response_spec.td();
            nb::gil_scoped_release nogil;
            return inf::SharedMemoryTransport::create(req, resp, o);
          },
          nb::arg("request_spec"), nb::arg("response_spec"), nb::arg("num_slots"),
          nb::arg("copy_result") = true, nb::arg("name").none() = nb::none(),
          nb::arg("spin").none() = nb::none())
      .def_static(
          "attach",
          [](const std::string& name, double timeout) {
            nb::gil_scoped_release nogil;
            return inf::SharedMemoryTransport::attach(
                name, std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
          },
          nb::arg("name"), nb::arg("timeout") = 5.0)
      .def_prop_ro("name", &inf::SharedMemoryTransport::name)
      .def_prop_ro("num_slots", &inf::SharedMemoryTransport::num_slots)
      .def_prop_ro("copy_result", &inf::SharedMemoryTransport::copy_result)
      .def_prop_ro("is_owner", &inf::SharedMemoryTransport::is_owner)
      .def_prop_ro("slots_in_use", &inf::SharedMemoryTransport::slots_in_use)
      .def_prop_ro("request_keys",
                   [](const inf::SharedMemoryTransport& t) { return key_list(t.request_keys()); })
      .def_prop_ro("response_keys",
                   [](const inf::SharedMemoryTransport& t) { return key_list(t.response_keys()); })
      .def_prop_ro(
          "request_spec",
          [](const inf::SharedMemoryTransport& t) { return PyTensorDict(t.request_spec()); })
      .def_prop_ro(
          "response_spec",
          [](const inf::SharedMemoryTransport& t) { return PyTensorDict(t.response_spec()); })
      // The per-request server side, for tensorwire.torchrl (torchrl's server batches).
      .def("_wait_for_work",
           [](inf::SharedMemoryTransport& t, double timeout) {
             nb::gil_scoped_release nogil;
             t.wait_for_work(inf::deadline_after(to_timeout(timeout)));
           })
      .def("_drain",
           [](inf::SharedMemoryTransport& t, size_t max_items) {
             inf::Drained d;
             {
               nb::gil_scoped_release nogil;
               t.drain(max_items, d);
             }
             nb::list out;
             for (size_t k = 0; k < d.size(); ++k)
               out.append(nb::make_tuple(d.ids[k], static_cast<double>(d.submitted_ns[k]) / 1e9));
             return out;
           })
      .def("_request_row", [](const inf::SharedMemoryTransport& t,
                              uint32_t slot) { return PyTensorDict(t.request_row(slot)); })
      .def("_resolve_one",
           [](inf::SharedMemoryTransport& t, uint32_t slot, const PyTensorDict& response) {
             const TensorDict& td = response.td();
             nb::gil_scoped_release nogil;
             t.resolve_one(slot, td);
           })
      .def("_reject_one",
           [](inf::SharedMemoryTransport& t, uint32_t slot, const std::string& type,
              const std::string& message) { t.reject_one(slot, RemoteError(type, message)); })
      .def_prop_ro("sizes", [](const inf::SharedMemoryTransport& t) {
        auto s = t.sizes();
        nb::dict d;
        d["control"] = s.control;
        d["requests"] = s.requests;
        d["responses"] = s.responses;
        d["total"] = s.total();
        return d;
      });

  nb::class_<inf::ThreadTransport, inf::Transport>(m, "_ThreadTransport").def_static("create", [] {
    return inf::ThreadTransport::create();
  });

  nb::class_<inf::SocketTransport, inf::Transport>(m, "_SocketTransport")
      .def_static(
          "create",
          [](std::optional<std::string> name) {
            inf::SocketOptions o;
            if (name) o.name = *name;
            nb::gil_scoped_release nogil;
            return inf::SocketTransport::create(o);
          },
          nb::arg("name").none() = nb::none())
      .def_prop_ro("name", &inf::SocketTransport::name);

  nb::class_<PyServer>(m, "_InferenceServer")
      .def(
          "__init__",
          [](PyServer* self, nb::object adapter, std::shared_ptr<inf::Transport> transport,
             size_t max_batch_size, size_t min_batch_size, double timeout, size_t stats_window,
             nb::handle policy_version_key, int64_t policy_version) {
            inf::ServerOptions o;
            o.max_batch_size = max_batch_size;
            o.min_batch_size = min_batch_size;
            if (timeout < 0) throw ValueError("timeout must be >= 0");
            o.timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::duration<double>(timeout));
            o.stats_window = stats_window;
            if (policy_version_key.is_none())
              o.policy_version_key.reset();
            else
              o.policy_version_key = to_key(policy_version_key);
            o.policy_version = policy_version;
            new (self) PyServer{std::make_unique<inf::InferenceServer>(
                make_policy(std::move(adapter)), std::move(transport), o)};
          },
          nb::arg("adapter"), nb::arg("transport"), nb::arg("max_batch_size"),
          nb::arg("min_batch_size"), nb::arg("timeout"), nb::arg("stats_window"),
          nb::arg("policy_version_key").none(), nb::arg("policy_version"))
      .def("start", [](PyServer& s) { s.get().start(); })
      .def(
          "shutdown",
          [](PyServer& s, std::optional<double> timeout) {
            inf::InferenceServer& server = s.get();
            nb::gil_scoped_release nogil;
            return server.shutdown(to_timeout(timeout));
          },
          nb::arg("timeout").none() = 5.0)
      .def_prop_ro("is_alive", [](PyServer& s) { return s.server && s.server->running(); })
      .def_prop_ro("policy_version", [](PyServer& s) { return s.get().policy_version(); })
      .def(
          "update_model",
          [](PyServer& s, nb::callable fn, bool mark) {
            inf::InferenceServer& server = s.get();
            nb::object result;
            {
              nb::gil_scoped_release nogil;
              server.update_model(
                  [&] {
                    nb::gil_scoped_acquire gil;
                    result = fn();
                  },
                  mark);
            }
            return result;
          },
          nb::arg("fn"), nb::arg("mark_weight_update") = true)
      .def(
          "stats",
          [](PyServer& s, bool reset) {
            inf::ServerStats st = s.get().stats(reset);
            nb::dict d;
            d["requests"] = st.requests;
            d["batches"] = st.batches;
            d["requests_per_s"] = st.requests_per_s;
            d["batches_per_s"] = st.batches_per_s;
            d["avg_batch_size"] = st.avg_batch_size;
            d["p50_queue_ms"] = st.p50_queue_ms;
            d["p95_queue_ms"] = st.p95_queue_ms;
            d["p50_forward_ms"] = st.p50_forward_ms;
            d["p95_forward_ms"] = st.p95_forward_ms;
            d["policy_version"] = st.policy_version;
            d["weight_updates"] = st.weight_updates;
            return d;
          },
          nb::arg("reset") = false)
      .def("close", [](PyServer& s) {
        nb::gil_scoped_release nogil;
        s.server.reset();
      });
}

}  // namespace tensorwire::py
