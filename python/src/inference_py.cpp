// Bindings for the inference transports, clients and InferenceServer: conversion only.
//
// The GIL: requests are converted under it; submit, result and calls run the C++ blocking
// API with it released (those waits check for Ctrl-C themselves, runtime/interrupt.h). The
// server's thread takes the GIL only around the policy call, which goes through a Python
// adapter (python/tensorwire/inference.py; inference_server_py.cpp binds the server). The
// policy's output is converted here in C++ (convert.h, policy_output); inference.py only
// hands a client's response back as a tensordict.TensorDict when the request was one.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "inference/remote_server.h"
#include "inference/shm_rows.h"
#include "tensorwire/inference/remote_transport.h"
#include "tensorwire/inference/shared_memory_transport.h"
#include "tensorwire/inference/socket_transport.h"
#include "tensorwire/inference/thread_transport.h"

namespace tensorwire::py {

namespace {

namespace inf = tensorwire::inference;

// A request as a C++ TensorDict: a tensorwire one as it is (a copy of its structure, its
// leaves shared: the submit reads it with the GIL released, while another thread may change
// the dict); with a fixed layout, a mapping (a dict, a tensordict.TensorDict) read at the
// declared keys; otherwise converted whole by the TensorDict rule. One rule for every
// transport.
const TensorDict& request_from(nb::handle obj, const std::optional<std::vector<Key>>& keys,
                               TensorDict& holder) {
  if (nb::isinstance<PyTensorDict>(obj)) return holder = nb::cast<PyTensorDict&>(obj).td();
  const bool mapping = nb::isinstance<nb::dict>(obj) || is_tensordict_lib(obj) ||
                       (keys && nb::hasattr(obj, "keys") && nb::hasattr(obj, "__getitem__"));
  if (!mapping)
    throw TypeError(
        "a request must be a tensorwire.TensorDict, a tensordict.TensorDict or a dict of "
        "arrays, got " +
        py_type(obj));
  holder = keys ? leaves_at(obj, *keys) : tensordict_from(obj, {}, {}, "request");
  return holder;
}

struct PyClient {
  inf::Client client;
  std::optional<std::vector<Key>> keys;
  bool keys_known = false;

  // Called with the GIL, which serialises the threads sharing this client: the keys are
  // fetched without it (the first call connects: a handshake) into a local, and stored once
  // the GIL is back (threads that wrote them together, with another reading, crashed).
  // `connect_by`: the deadline of the call that needs them.
  const std::optional<std::vector<Key>>& request_keys(Deadline connect_by = Deadline::never()) {
    if (!keys_known) {
      std::optional<std::vector<Key>> fetched;
      {
        NoGil nogil;
        fetched = client.request_keys(connect_by.remaining());
      }
      if (!keys_known) {
        keys = std::move(fetched);
        keys_known = true;
      }
    }
    return keys;
  }
};

PyClient client_for(const std::string& kind, nb::handle name) {
  const std::string address = *str_arg(name, "name", false);
  if (kind == "shared_memory") return {inf::SharedMemoryTransport::client_for(address)};
  if (kind == "socket") return {inf::SocketTransport::client_for(address)};
  throw ValueError("no client can attach to a transport of kind '" + kind + "' by name");
}

}  // namespace

// What the two fixed-layout transports (a bank of slots: shared-memory and remote) share,
// bound once: their layout and counters, and the per-request server side for
// tensorwire.torchrl (torchrl's server batches).
template <class T, class Access>
void bind_fixed_layout(nb::class_<T, inf::Transport>& c) {
  c.def_prop_ro("num_slots", &T::num_slots)
      .def_prop_ro("slots_in_use", &T::slots_in_use)
      .def_prop_ro("refused", &T::refused)
      .def_prop_ro("last_refusal", &T::last_refusal)
      .def_prop_ro("request_keys", [](const T& t) { return key_list(t.request_keys()); })
      .def_prop_ro("response_keys", [](const T& t) { return key_list(t.response_keys()); })
      .def_prop_ro("request_spec", [](const T& t) { return PyTensorDict(t.request_spec()); })
      .def_prop_ro("response_spec", [](const T& t) { return PyTensorDict(t.response_spec()); });
  c.def("_wait_for_work",
        [](T& t, nb::handle timeout) {
          const Deadline d = Deadline::after(timeout_arg(timeout));
          NoGil nogil;
          t.wait_for_work(d);
        })
      .def("_drain",
           [](T& t, size_t max_items) {
             inf::Drained d;
             {
               NoGil nogil;
               t.drain(max_items, d);
             }
             nb::list out;
             for (size_t k = 0; k < d.size(); ++k)
               out.append(nb::make_tuple(d.ids[k], static_cast<double>(d.submitted_ns[k]) / 1e9));
             return out;
           })
      .def("_request_row",
           [](const T& t, uint32_t slot) { return PyTensorDict(Access::request_row(t, slot)); })
      .def("_resolve_one",
           [](T& t, uint32_t slot, nb::handle result) {
             const TensorDict response = torchrl_result(result, t.response_keys());
             NoGil nogil;
             Access::resolve_one(t, slot, response);
           })
      .def("_reject_one", [](T& t, uint32_t slot, nb::handle exc) {
        Access::reject_one(t, slot, RemoteError(describe_python_exception(exc, false)));
      });
}

void bind_inference_server(nb::module_& m);  // inference_server_py.cpp

void bind_inference(nb::module_& m) {
  bind_inference_server(m);
  using Shm = inf::SharedMemoryTransport;
  using Access = inf::detail::ShmAccess;
  nb::class_<inf::Future>(m, "_InferenceFuture")
      .def("done", &inf::Future::done)
      .def_prop_ro("state", [](inf::Future& f) { return std::string(f.state()); })
      .def(
          "result",
          [](inf::Future& f, nb::handle timeout) {
            const Timeout t = timeout_arg(timeout);
            NoGil nogil;
            return PyTensorDict(f.result(t));
          },
          nb::arg("timeout").none() = nb::none());

  nb::class_<PyClient>(m, "_InferenceClient")
      .def(
          "submit",
          [](PyClient& self, nb::handle td, nb::handle timeout) {
            const Deadline d = Deadline::after(timeout_arg(timeout));
            TensorDict holder;
            const TensorDict& request = request_from(td, self.request_keys(d), holder);
            NoGil nogil;
            return new inf::Future(self.client.submit(request, d.remaining()));
          },
          nb::arg("td").none(), nb::arg("timeout").none() = nb::none(),
          nb::rv_policy::take_ownership)
      .def(
          "__call__",
          [](PyClient& self, nb::handle td, nb::handle timeout) {
            const Deadline d = Deadline::after(timeout_arg(timeout));
            TensorDict holder;
            const TensorDict& request = request_from(td, self.request_keys(d), holder);
            NoGil nogil;
            return PyTensorDict(self.client(request, d.remaining()));
          },
          nb::arg("td").none(), nb::arg("timeout").none() = nb::none())
      .def_prop_ro("kind", [](const PyClient& self) { return std::string(self.client.kind()); })
      .def_prop_ro("address", [](const PyClient& self) { return self.client.address(); })
      .def_prop_ro("has_fixed_layout",
                   [](PyClient& self) { return self.request_keys().has_value(); })
      .def("close", [](PyClient& self) { self.client.close(); })
      .def(
          "_request_leaves",  // [(key, "torch.<dtype>", shape)], None when any structure goes
          [](PyClient& self, nb::handle timeout) -> nb::object {
            const Timeout t = timeout_arg(timeout);
            std::optional<std::vector<inf::RequestLeaf>> leaves;
            {
              NoGil nogil;
              leaves = self.client.request_leaves(t);
            }
            if (!leaves) return nb::none();
            nb::list out;
            for (const inf::RequestLeaf& l : *leaves)
              out.append(nb::make_tuple(from_key(l.key), std::string(dtype_name(l.dtype)),
                                        nb::tuple(nb::cast(l.shape))));
            return out;
          },
          nb::arg("timeout").none() = nb::none());

  m.def("_inference_client_for", &client_for, nb::arg("kind"), nb::arg("address").none());

  nb::class_<inf::Transport>(m, "_Transport")
      .def_prop_ro("kind", [](const inf::Transport& t) { return std::string(t.kind()); })
      .def("client", [](inf::Transport& t) { return PyClient{t.client()}; })
      .def(
          "clients",
          [](inf::Transport& t, nb::handle num_clients) {
            std::vector<PyClient> out;
            for (inf::Client& c : t.clients(int_arg(num_clients, "num_clients")))
              out.push_back(PyClient{std::move(c)});
            return out;
          },
          nb::arg("num_clients").none())
      .def("close",
           [](inf::Transport& t) {
             NoGil nogil;  // a remote transport joins threads that may log (take the GIL)
             t.close();
           })
      .def_prop_ro("closed", &inf::Transport::closed);

  auto shm = nb::class_<Shm, inf::Transport>(m, "_SharedMemoryTransport");
  bind_fixed_layout<Shm, Access>(shm);
  shm.def_static(
         "create",
         [](nb::handle request_spec, nb::handle response_spec, nb::handle num_slots,
            bool copy_result, nb::handle name, nb::handle spin, nb::handle allowed_uids) {
           inf::SharedMemoryOptions o{.num_slots = int_arg(num_slots, "num_slots"),
                                      .copy_result = copy_result,
                                      .name = str_arg(name, "name", true).value_or(""),
                                      .allowed_uids = int_list_arg(allowed_uids, "allowed_uids")};
           if (!spin.is_none()) {
             const int64_t s = int_arg(spin, "spin");
             if (s < 0 || s > std::numeric_limits<uint32_t>::max())
               throw ValueError("spin must be in [0, 4294967295], got " + std::to_string(s));
             o.spin = static_cast<uint32_t>(s);
           }
           TensorDict request = tensordict_from(request_spec, {}, {}, "request_spec");
           TensorDict response = tensordict_from(response_spec, {}, {}, "response_spec");
           NoGil nogil;
           return released_without_gil(Shm::create(request, response, o));
         },
         nb::arg("request_spec"), nb::arg("response_spec"), nb::arg("num_slots").none(),
         nb::arg("copy_result") = true, nb::arg("name").none() = nb::none(),
         nb::arg("spin").none() = nb::none(), nb::arg("allowed_uids") = nb::tuple())
      .def_static(
          "attach",
          [](nb::handle name, nb::handle timeout) {
            const std::string n = *str_arg(name, "name", false);
            const Timeout t = timeout_arg(timeout);
            NoGil nogil;
            return released_without_gil(Shm::attach(n, t));
          },
          nb::arg("name").none(), nb::arg("timeout").none() = 5.0)
      .def_prop_ro("name", &Shm::name)
      .def_prop_ro("copy_result", &Shm::copy_result)
      .def_prop_ro("is_owner", &Shm::is_owner)
      .def_prop_ro("_sizes", [](const Shm& t) {
        auto s = t.sizes();
        return std::make_tuple(s.control, s.requests, s.responses);
      });

  using Remote = inf::RemoteTransport;
  auto remote = nb::class_<Remote, inf::Transport>(m, "_RemoteTransport");
  bind_fixed_layout<Remote, inf::detail::RemoteAccess>(remote);
  remote
      .def_static(
          "create",
          [](nb::handle request_spec, nb::handle response_spec, nb::handle num_slots,
             nb::handle host, nb::handle port, nb::handle auth_key, nb::handle liveness_timeout) {
            inf::RemoteOptions o{.num_slots = int_arg(num_slots, "num_slots"),
                                 .host = *str_arg(host, "host", false),
                                 .port = int_arg(port, "port"),
                                 .auth_key = auth_key_arg(auth_key)};
            o.liveness_timeout = liveness_arg(liveness_timeout);
            TensorDict request = tensordict_from(request_spec, {}, {}, "request_spec");
            TensorDict response = tensordict_from(response_spec, {}, {}, "response_spec");
            NoGil nogil;
            return released_without_gil(Remote::create(request, response, o));
          },
          nb::arg("request_spec"), nb::arg("response_spec"), nb::arg("num_slots").none(),
          nb::arg("host").none(), nb::arg("port").none(), nb::arg("auth_key").none(),
          nb::arg("liveness_timeout").none())
      .def_prop_ro("port", &Remote::port)
      .def_prop_ro("host", &Remote::host)
      .def_prop_ro("connected", &Remote::connected);
  m.def(
      "_remote_client",
      // "host:port", or a host and a port of their own (the address parser checks both).
      [](nb::handle address, nb::handle port, nb::handle auth_key, nb::handle liveness_timeout,
         nb::handle timeout, bool connect_now) {
        std::string where = *str_arg(address, "address", false);
        if (!port.is_none()) where += ":" + std::to_string(int_arg(port, "port"));
        inf::RemoteClientOptions o{.auth_key = auth_key_arg(auth_key)};
        o.liveness_timeout = liveness_arg(liveness_timeout);
        o.connect_timeout = timeout_arg(timeout);
        PyClient c{Remote::client_for(where, o)};
        NoGil nogil;
        if (connect_now) c.client.request_keys();  // connects: a refusal raises here
        return c;
      },
      nb::arg("address").none(), nb::arg("port").none(), nb::arg("auth_key").none(),
      nb::arg("liveness_timeout").none(), nb::arg("timeout").none(), nb::arg("connect_now"));

  nb::class_<inf::ThreadTransport, inf::Transport>(m, "_ThreadTransport").def_static("create", [] {
    return released_without_gil(inf::ThreadTransport::create());
  });

  nb::class_<inf::SocketTransport, inf::Transport>(m, "_SocketTransport")
      .def_static(
          "create",
          [](nb::handle name, nb::handle allowed_uids) {
            inf::SocketOptions o{.name = str_arg(name, "name", true).value_or(""),
                                 .allowed_uids = int_list_arg(allowed_uids, "allowed_uids")};
            NoGil nogil;
            return released_without_gil(inf::SocketTransport::create(std::move(o)));
          },
          nb::arg("name").none() = nb::none(), nb::arg("allowed_uids") = nb::tuple())
      .def_prop_ro("name", &inf::SocketTransport::name)
      .def_prop_ro("refused", &inf::SocketTransport::refused)
      .def_prop_ro("last_refusal", &inf::SocketTransport::last_refusal);
}

}  // namespace tensorwire::py
