// Bindings for the inference transports, clients and InferenceServer: conversion only.
//
// The GIL: requests are converted under it; submit, result and calls run the C++ blocking
// API with it released (those waits check for Ctrl-C themselves, runtime/interrupt.h). The
// server's thread takes the GIL only around the policy call, which goes through a Python
// adapter (python/tensorwire/inference.py) that converts the batch for the policy and its
// result back. tensordict.TensorDict requests and responses are converted there too.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <mutex>

#include "bindings.h"
#include "inference/shm_rows.h"
#include "tensordict_py.h"
#include "tensorwire/inference/server.h"
#include "tensorwire/inference/socket_transport.h"
#include "tensorwire/inference/thread_transport.h"

namespace tensorwire::py {

namespace {

namespace inf = tensorwire::inference;

Timeout timeout_arg(std::optional<double> seconds) {
  return Timeout::seconds(seconds, "timeout");
}

std::string kind_of(nb::handle obj) {
  return nb::cast<std::string>(nb::str(obj.type().attr("__name__")));
}

// One leaf of a mapping request read at a declared key (obj[a][b]...): KeyError when absent.
Tensor declared_leaf(nb::handle obj, const Key& key) {
  nb::object v = nb::borrow(obj);
  try {
    for (const std::string& part : key.parts()) v = v[nb::str(part.c_str())];
  } catch (nb::python_error& e) {
    if (!e.matches(PyExc_KeyError) && !e.matches(PyExc_TypeError) && !e.matches(PyExc_IndexError))
      throw;
    throw KeyError("request has no key " + key.str() + " (declared in the request spec)");
  }
  if (std::optional<Tensor> t = to_tensor(v)) return std::move(*t);
  if (nb::hasattr(v, "device")) {
    nb::object device = v.attr("device");
    throw ValueError("request key " + key.str() + ": tensor on " +
                     nb::cast<std::string>(nb::str(nb::handle(device))) +
                     "; SharedMemoryTransport only accepts CPU tensors");
  }
  throw ValueError("request key " + key.str() + ": expected a tensor, got a " + kind_of(v));
}

// A request as a C++ TensorDict: a tensorwire one as it is (no copy); a mapping (a dict,
// or a tensordict.TensorDict for a fixed layout) read at the declared keys when the
// transport has a fixed layout, converted whole otherwise. One rule for every transport.
const TensorDict& request_from(nb::handle obj, const std::optional<std::vector<Key>>& keys,
                               TensorDict& holder) {
  if (nb::isinstance<PyTensorDict>(obj)) return nb::cast<PyTensorDict&>(obj).td();
  const bool mapping = nb::isinstance<nb::dict>(obj) ||
                       (keys && nb::hasattr(obj, "keys") && nb::hasattr(obj, "__getitem__"));
  if (!mapping)
    throw TypeError(
        "a request must be a tensorwire.TensorDict, a tensordict.TensorDict or a dict of "
        "arrays, got " +
        kind_of(obj));
  if (keys) {
    holder = TensorDict();
    for (const Key& k : *keys) holder.set(k, declared_leaf(obj, k));
  } else {
    holder = nb::cast<PyTensorDict&>(nb::type<PyTensorDict>()(obj)).td();
  }
  return holder;
}

struct PyClient {
  inf::Client client;
  std::optional<std::vector<Key>> keys;
  bool keys_known = false;

  const std::optional<std::vector<Key>>& request_keys() {
    if (!keys_known) {
      nb::gil_scoped_release nogil;  // may connect (a handshake with the owner)
      keys = client.request_keys();
      keys_known = true;
    }
    return keys;
  }
};

// A Future shared by Python threads: a second result() waits for the first.
struct PyFuture {
  inf::Future future;
  std::mutex mu;
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
        throw TypeError("the policy adapter returned a " + kind_of(out) +
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
  void close() {
    nb::gil_scoped_release nogil;
    server.reset();
  }
  ~PyServer() {
    if (server && Py_IsInitialized() && PyGILState_Check()) close();
  }
  inf::InferenceServer& get() {
    if (!server) throw ClosedError("the InferenceServer was closed");
    return *server;
  }
};

PyClient client_for(const std::string& kind, const std::string& address) {
  if (kind == "shared_memory") return {inf::SharedMemoryTransport::client_for(address)};
  if (kind == "socket") return {inf::SocketTransport::client_for(address)};
  throw ValueError("no client can attach to a transport of kind '" + kind + "' by name");
}

nb::list key_list(const std::vector<Key>& keys) {
  nb::list out;
  for (const Key& k : keys) out.append(from_key(k));
  return out;
}

}  // namespace

void bind_inference(nb::module_& m) {
  using Shm = inf::SharedMemoryTransport;
  using Access = inf::detail::ShmAccess;
  nb::class_<PyFuture>(m, "_InferenceFuture")
      .def("done", [](PyFuture& f) { return f.future.done(); })
      .def_prop_ro("state", [](PyFuture& f) { return std::string(f.future.state()); })
      .def(
          "result",
          [](PyFuture& f, std::optional<double> timeout) {
            const Timeout t = timeout_arg(timeout);
            nb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(f.mu);
            return PyTensorDict(f.future.result(t));
          },
          nb::arg("timeout").none() = nb::none());

  nb::class_<PyClient>(m, "_InferenceClient")
      .def(
          "submit",
          [](PyClient& self, nb::handle td, std::optional<double> timeout) {
            const Timeout t = timeout_arg(timeout);
            TensorDict holder;
            const TensorDict& request = request_from(td, self.request_keys(), holder);
            auto f = std::make_unique<PyFuture>();
            nb::gil_scoped_release nogil;
            f->future = self.client.submit(request, t);
            return f.release();
          },
          nb::arg("td"), nb::arg("timeout").none() = nb::none(), nb::rv_policy::take_ownership)
      .def(
          "__call__",
          [](PyClient& self, nb::handle td, std::optional<double> timeout) {
            const Timeout t = timeout_arg(timeout);
            TensorDict holder;
            const TensorDict& request = request_from(td, self.request_keys(), holder);
            nb::gil_scoped_release nogil;
            return PyTensorDict(self.client(request, t));
          },
          nb::arg("td"), nb::arg("timeout").none() = nb::none())
      .def_prop_ro("kind", [](const PyClient& self) { return std::string(self.client.kind()); })
      .def_prop_ro("address", [](const PyClient& self) { return self.client.address(); })
      .def_prop_ro("has_fixed_layout",
                   [](PyClient& self) { return self.request_keys().has_value(); })
      .def("close", [](PyClient& self) { self.client.close(); })
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
        new (&self) PyClient(client_for(std::get<0>(state), std::get<1>(state)));
      });

  m.def("_inference_client_for", &client_for, nb::arg("kind"), nb::arg("address"));

  nb::class_<inf::Transport>(m, "_Transport")
      .def_prop_ro("kind", [](const inf::Transport& t) { return std::string(t.kind()); })
      .def("client", [](inf::Transport& t) { return PyClient{t.client()}; })
      .def("close", &inf::Transport::close)
      .def_prop_ro("closed", &inf::Transport::closed);

  nb::class_<Shm, inf::Transport>(m, "_SharedMemoryTransport")
      .def_static(
          "create",
          [](const PyTensorDict& request_spec, const PyTensorDict& response_spec,
             uint32_t num_slots, bool copy_result, std::optional<std::string> name,
             std::optional<uint32_t> spin) {
            inf::SharedMemoryOptions o{.num_slots = num_slots, .copy_result = copy_result};
            if (name) o.name = *name;
            if (spin) o.spin = *spin;
            nb::gil_scoped_release nogil;
            return Shm::create(request_spec.td(), response_spec.td(), o);
          },
          nb::arg("request_spec"), nb::arg("response_spec"), nb::arg("num_slots"),
          nb::arg("copy_result") = true, nb::arg("name").none() = nb::none(),
          nb::arg("spin").none() = nb::none())
      .def_static(
          "attach",
          [](const std::string& name, std::optional<double> timeout) {
            const Timeout t = timeout_arg(timeout);
            nb::gil_scoped_release nogil;
            return Shm::attach(name, t);
          },
          nb::arg("name"), nb::arg("timeout").none() = 5.0)
      .def_prop_ro("name", &Shm::name)
      .def_prop_ro("num_slots", &Shm::num_slots)
      .def_prop_ro("copy_result", &Shm::copy_result)
      .def_prop_ro("is_owner", &Shm::is_owner)
      .def_prop_ro("slots_in_use", &Shm::slots_in_use)
      .def_prop_ro("request_keys", [](const Shm& t) { return key_list(t.request_keys()); })
      .def_prop_ro("response_keys", [](const Shm& t) { return key_list(t.response_keys()); })
      .def_prop_ro("request_spec", [](const Shm& t) { return PyTensorDict(t.request_spec()); })
      .def_prop_ro("response_spec", [](const Shm& t) { return PyTensorDict(t.response_spec()); })
      // The per-request server side, for tensorwire.torchrl (torchrl's server batches).
      .def("_wait_for_work",
           [](Shm& t, std::optional<double> timeout) {
             const Deadline d = Deadline::after(timeout_arg(timeout));
             nb::gil_scoped_release nogil;
             t.wait_for_work(d);
           })
      .def("_drain",
           [](Shm& t, size_t max_items) {
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
      .def("_request_row",
           [](const Shm& t, uint32_t slot) { return PyTensorDict(Access::request_row(t, slot)); })
      .def("_resolve_one",
           [](Shm& t, uint32_t slot, const PyTensorDict& response) {
             nb::gil_scoped_release nogil;
             Access::resolve_one(t, slot, response.td());
           })
      .def("_reject_one",
           [](Shm& t, uint32_t slot, const std::string& type, const std::string& message) {
             Access::reject_one(t, slot, RemoteError(type, message));
           })
      .def_prop_ro("sizes", [](const Shm& t) {
        auto s = t.sizes();
        nb::dict d;
        d["control"] = s.control;
        d["requests"] = s.requests;
        d["responses"] = s.responses;
        d["total"] = s.total();
        return d;
      });

  nb::class_<inf::ThreadTransport, inf::Transport>(m, "_ThreadTransport")
      .def_static("create", &inf::ThreadTransport::create);

  nb::class_<inf::SocketTransport, inf::Transport>(m, "_SocketTransport")
      .def_static(
          "create",
          [](std::optional<std::string> name) {
            nb::gil_scoped_release nogil;
            return inf::SocketTransport::create({.name = name.value_or("")});
          },
          nb::arg("name").none() = nb::none())
      .def_prop_ro("name", &inf::SocketTransport::name);

  nb::class_<PyServer>(m, "_InferenceServer")
      .def(
          "__init__",
          [](PyServer* self, nb::object adapter, std::shared_ptr<inf::Transport> transport,
             size_t max_batch_size, size_t min_batch_size, double timeout, size_t stats_window,
             nb::handle policy_version_key, int64_t policy_version) {
            inf::ServerOptions o{.max_batch_size = max_batch_size,
                                 .min_batch_size = min_batch_size,
                                 .timeout = Timeout::seconds(timeout, "timeout").duration(),
                                 .stats_window = stats_window,
                                 .policy_version_key = std::nullopt,
                                 .policy_version = policy_version};
            if (!policy_version_key.is_none()) o.policy_version_key = to_key(policy_version_key);
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
            const Timeout t = timeout_arg(timeout);
            inf::InferenceServer& server = s.get();
            nb::gil_scoped_release nogil;
            return server.shutdown(t);
          },
          nb::arg("timeout").none() = 5.0)
      .def_prop_ro("is_alive", [](PyServer& s) { return s.server && s.server->running(); })
      .def_prop_ro("is_closed", [](PyServer& s) { return !s.server; })
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
      .def("close", &PyServer::close);
}

}  // namespace tensorwire::py
