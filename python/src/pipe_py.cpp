// Bindings for TensorDictPipe, PipeListener and TensorDictServer. Blocking calls release
// the GIL and wait in slices so Ctrl-C (PyErr_CheckSignals) is honoured; the asyncio glue
// (python/tensorwire/pipe.py) uses the non-blocking poll_* forms and the wake-up fds.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <poll.h>

#include "bindings.h"
#include "tensordict_py.h"
#include "tensorwire/pipe/pipe.h"
#include "tensorwire/pipe/server.h"

namespace tensorwire::py {

namespace {

std::chrono::microseconds micros(double us) {
  return std::chrono::microseconds(us > 0 ? static_cast<int64_t>(us) : 0);
}

using Millis = std::chrono::milliseconds;
constexpr Millis kSlice{200};

PipeOptions make_options(bool consolidated, const std::optional<std::string>& auth_key,
                         double connect_timeout, uint64_t max_message_bytes) {
  PipeOptions o;
  o.consolidated = consolidated;
  if (auth_key) {
    if (auth_key->empty())
      throw ValueError("auth_key must not be empty (pass None for no authentication)");
    o.auth_key = *auth_key;
  }
  o.connect_timeout = Millis(static_cast<int64_t>(connect_timeout * 1000));
  if (max_message_bytes) o.limits.max_message_bytes = max_message_bytes;
  return o;
}

// Runs `step(slice)` with the GIL released until it returns true, checking for signals
// between slices; TimeoutError after `timeout` seconds (None: no limit).
template <class Step>
void blocking(std::optional<double> timeout, Step&& step) {
  auto deadline = timeout ? std::chrono::steady_clock::now() +
                                std::chrono::microseconds(static_cast<int64_t>(*timeout * 1e6))
                          : std::chrono::steady_clock::time_point::max();
  while (true) {
    auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    Millis slice = std::clamp(left, Millis{0}, kSlice);
    bool done;
    {
      nb::gil_scoped_release nogil;
      done = step(slice);
    }
    if (done) return;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (std::chrono::steady_clock::now() >= deadline) throw TimeoutError("the operation timed out");
  }
}

// A pipe as Python sees it: the C++ pipe plus the Python object of the last receive, so
// a steady-state receive returns the very same TensorDict object.
struct PyPipe {
  std::unique_ptr<TensorDictPipe> pipe;
  nb::object cached;  // PyTensorDict of the current schema (consolidated mode)

  TensorDictPipe& get() {
    if (!pipe) throw ClosedError("the pipe is closed");
    return *pipe;
  }

  nb::object wrap(TensorDict& received, nb::handle into_obj, TensorDict* into) {
    if (into && &received == into) return nb::borrow(into_obj);
    if (pipe->options().consolidated && !pipe->last_recv_was_new_schema() && cached.is_valid())
      return cached;
    // A structural copy: it shares the received storage, so later in-place receives are
    // seen through it, and it stays valid after the next schema change.
    nb::object obj = nb::cast(PyTensorDict(TensorDict(received)));
    if (pipe->options().consolidated) cached = obj;
    return obj;
  }
};

TensorDict* into_of(nb::handle td) {
  if (td.is_none()) return nullptr;
  if (!nb::isinstance<PyTensorDict>(td))
    throw TypeError("recv(td): td must be a tensorwire.TensorDict");
  return &nb::cast<PyTensorDict&>(td).td();
}

}  // namespace

void bind_pipe(nb::module_& m) {
  nb::class_<PyPipe>(m, "_Pipe")
      .def(
          "send",
          [](PyPipe& self, const PyTensorDict& td, std::optional<double> timeout) {
            const TensorDict& t = td.td();
            TensorDictPipe& p = self.get();
            bool started = false;
            blocking(timeout, [&](Millis) {
              if (!started) {
                p.start_send(t);
                started = true;
              }
              // The blocking form of a slice: poll, then sleep on the wake-up fd.
              auto until = std::chrono::steady_clock::now() + kSlice;
              while (std::chrono::steady_clock::now() < until) {
                if (p.poll_send()) return true;
                if (p.arm()) {
                  struct pollfd fds[2] = {{p.fd(), POLLIN, 0}, {p.peer_fd(), POLLIN, 0}};
                  ::poll(fds, p.peer_fd() >= 0 ? 2 : 1, 50);
                }
              }
              return false;
            });
          },
          nb::arg("td"), nb::arg("timeout").none() = nb::none())
      .def(
          "recv",
          [](PyPipe& self, nb::handle into_obj, std::optional<double> timeout) -> nb::object {
            TensorDict* into = into_of(into_obj);
            TensorDictPipe& p = self.get();
            TensorDict* got = nullptr;
            blocking(timeout, [&](Millis slice) {
              try {
                got = &p.recv(into, slice);
                return true;
              } catch (const TimeoutError&) {
                return false;
              }
            });
            return self.wrap(*got, into_obj, into);
          },
          nb::arg("td").none() = nb::none(), nb::arg("timeout").none() = nb::none())
      .def("start_send",
           [](PyPipe& self, const PyTensorDict& td) {
             const TensorDict& t = td.td();
             nb::gil_scoped_release nogil;
             self.get().start_send(t);
           })
      // The asyncio forms poll, spinning up to spin_us (GIL released) before they arm the
      // wake-up fd and await it: a reply is often a few microseconds away, and a trip
      // through the event loop's epoll costs tens of microseconds.
      .def(
          "poll_send",
          [](PyPipe& self, double spin_us) {
            nb::gil_scoped_release nogil;
            TensorDictPipe& p = self.get();
            return p.poll_send(micros(spin_us));
          },
          nb::arg("spin_us") = 0.0)
      .def(
          "poll_recv",
          [](PyPipe& self, nb::handle into_obj, double spin_us) -> nb::object {
            TensorDict* into = into_of(into_obj);
            TensorDict* got = nullptr;
            {
              nb::gil_scoped_release nogil;
              TensorDictPipe& p = self.get();
              got = p.poll_recv(into, micros(spin_us));
            }
            return got ? self.wrap(*got, into_obj, into) : nb::none();
          },
          nb::arg("td").none() = nb::none(), nb::arg("spin_us") = 0.0)
      .def("arm", [](PyPipe& self) { return self.get().arm(); })
      .def_prop_ro("events", [](PyPipe& self) { return self.get().events(); })
      .def_prop_ro("fd", [](PyPipe& self) { return self.get().fd(); })
      .def_prop_ro("peer_fd", [](PyPipe& self) { return self.get().peer_fd(); })
      .def_prop_ro("peer", [](PyPipe& self) { return self.get().peer(); })
      .def_prop_ro("transports",
                   [](PyPipe& self) { return self.pipe ? self.pipe->transports() : std::string(); })
      .def_prop_ro("local_port", [](PyPipe& self) { return self.get().local_port(); })
      .def_prop_ro("consolidated", [](PyPipe& self) { return self.get().options().consolidated; })
      .def_prop_ro("closed", [](PyPipe& self) { return !self.pipe || self.pipe->closed(); })
      .def("close", [](PyPipe& self) {
        if (!self.pipe) return;
        nb::gil_scoped_release nogil;
        self.pipe->close();
      });

  m.def(
      "_connect",
      [](const std::string& host, uint16_t port, bool consolidated,
         std::optional<std::string> auth_key, double timeout, uint64_t max_message_bytes) {
        PipeOptions o = make_options(consolidated, auth_key, timeout, max_message_bytes);
        nb::gil_scoped_release nogil;
        auto p = std::make_unique<TensorDictPipe>(TensorDictPipe::connect(host, port, o));
        return PyPipe{std::move(p), nb::object()};
      },
      nb::arg("host"), nb::arg("port"), nb::arg("consolidated"), nb::arg("auth_key").none(),
      nb::arg("timeout"), nb::arg("max_message_bytes"));

  nb::class_<PipeListener>(m, "_PipeListener")
      .def(
          "__init__",
          [](PipeListener* self, uint16_t port, bool consolidated,
             std::optional<std::string> auth_key, double timeout, uint64_t max_message_bytes) {
            new (self) PipeListener(
                port, make_options(consolidated, auth_key, timeout, max_message_bytes));
          },
          nb::arg("port"), nb::arg("consolidated"), nb::arg("auth_key").none(), nb::arg("timeout"),
          nb::arg("max_message_bytes"))
      .def_prop_ro("port", &PipeListener::port)
      .def(
          "accept",
          [](PipeListener& self, std::optional<double> timeout,
             bool throw_on_refusal) -> std::optional<PyPipe> {
            std::optional<TensorDictPipe> got;
            blocking(timeout, [&](Millis slice) {
              got = self.accept(slice, throw_on_refusal);
              return got.has_value();
            });
            return PyPipe{std::make_unique<TensorDictPipe>(std::move(*got)), nb::object()};
          },
          nb::arg("timeout").none() = nb::none(), nb::arg("throw_on_refusal") = false)
      .def("close", &PipeListener::close)
      .def_prop_ro("refused", &PipeListener::refused);

  nb::class_<TensorDictServer>(m, "_Server")
      .def(
          "__init__",
          [](TensorDictServer* self, uint16_t port, bool consolidated,
             std::optional<std::string> auth_key, double timeout, uint64_t max_message_bytes) {
            new (self) TensorDictServer(
                port, make_options(consolidated, auth_key, timeout, max_message_bytes));
          },
          nb::arg("port"), nb::arg("consolidated"), nb::arg("auth_key").none(), nb::arg("timeout"),
          nb::arg("max_message_bytes"))
      .def_prop_ro("port", &TensorDictServer::port)
      .def(
          "accept",
          [](TensorDictServer& self, double timeout) -> std::optional<PyPipe> {
            std::optional<TensorDictPipe> got;
            {
              nb::gil_scoped_release nogil;
              got = self.accept(Millis(static_cast<int64_t>(timeout * 1000)));
            }
            if (!got) return std::nullopt;
            return PyPipe{std::make_unique<TensorDictPipe>(std::move(*got)), nb::object()};
          },
          nb::arg("timeout"))
      .def("close",
           [](TensorDictServer& self) {
             nb::gil_scoped_release nogil;
             self.close();
           })
      .def_prop_ro("closed", &TensorDictServer::closed)
      .def_prop_ro("refused", &TensorDictServer::refused)
      .def_prop_ro("last_refusal", &TensorDictServer::last_refusal);
}

}  // namespace tensorwire::py
