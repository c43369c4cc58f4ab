// Bindings for TensorDictPipe, PipeListener and TensorDictServer, conversions only: blocking
// calls are the C++ ones (they check for Ctrl-C), with the GIL released; the asyncio glue
// (tensorwire/pipe.py) uses the poll_* forms and the wake-up fds.
#include <algorithm>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "tensorwire/pipe/pipe.h"
#include "tensorwire/pipe/server.h"
#include "tensorwire/runtime/liveness.h"

namespace tensorwire::py {

namespace {

using Seconds = std::optional<double>;  // None: for ever (Timeout::seconds)

// A Python int as a port: one line naming the rule instead of nanobind's signature dump
// (also for a port given as a str).
uint16_t port_of(nb::handle value) {
  const int64_t port = int_arg(value, "port");
  if (port < 0 || port > 65535)
    throw ValueError("port must be in 0..65535 (0: a free port), got " + std::to_string(port));
  return static_cast<uint16_t>(port);
}

PipeOptions make_options(nb::handle consolidated, nb::handle auth_key, nb::handle connect_timeout,
                         nb::handle max_message_bytes, nb::handle liveness_timeout) {
  PipeOptions o;
  o.consolidated = bool_arg(consolidated, "consolidated");
  o.auth_key = auth_key_arg(auth_key);
  o.connect_timeout = timeout_arg(connect_timeout);
  // A negative one is 0, refused as such (checked_options).
  o.limits.max_message_bytes =
      static_cast<uint64_t>(std::max<int64_t>(0, int_arg(max_message_bytes, "max_message_bytes")));
  o.liveness_timeout = liveness_arg(liveness_timeout);
  return o;
}

TensorDict* into_of(nb::handle td) {
  if (td.is_none()) return nullptr;
  if (!nb::isinstance<PyTensorDict>(td))
    throw TypeError("recv(td): td must be a tensorwire.TensorDict");
  return &nb::cast<PyTensorDict&>(td).td();
}

// A pipe as Python sees it: the C++ pipe plus the Python object of the last receive, so
// a steady-state receive returns the very same TensorDict object.
struct PyPipe {
  // What a send sends is a copy of the dict's structure (its leaves shared), taken under the
  // GIL: while the send runs without it (a blocking send, or UCX reading after start_send),
  // other threads may add, replace or remove the dict's entries; the copy keeps what is sent
  // whole and its leaves alive. The send in flight (one that timed out, was interrupted, or
  // whose poll loop was abandoned) keeps its copy here with the dict it was taken from:
  // that dict sent again, with the same leaves, gives the pipe that same copy, and the pipe
  // resumes the send instead of sending the message twice.
  struct Sent {
    nb::object obj;
    std::shared_ptr<const TensorDict> copy;
  } sent;
  // Declared after `sent`, so destroyed first: a close that lingers (pipe.md) copies the
  // send in flight out of `sent`.
  TensorDictPipe pipe;
  nb::object cached;  // PyTensorDict of the current schema (consolidated mode)
  // The targets given to receives not completed yet (timed out, interrupted, an abandoned
  // poll loop, or a call still waiting on another thread): the receive in flight writes into
  // one of them (the one given when its message arrived), so they stay alive, and the call
  // that completes it returns that one. A target leaves once no call has it and no receive
  // in flight writes into it (it may be another thread's call's, which completed it or not).
  struct Target {
    nb::object obj;
    int calls = 0;  // calls of receive() running with it
    TensorDict& td() const { return nb::cast<PyTensorDict&>(obj).td(); }
  };
  std::vector<Target> targets;

  // Whether the send in flight is `obj`'s.
  bool sending(nb::handle obj) {
    // pipe.sending first: it tells same_leaves that the copy is within the nesting limit.
    return sent.obj.is_valid() && sent.obj.is(obj) && pipe.sending(*sent.copy) &&
           same_leaves(nb::cast<const PyTensorDict&>(obj).td(), *sent.copy);
  }
  // What sending `obj` gives the pipe: the copy in flight when it is `obj`'s, else a new one,
  // kept at once when no other send is in flight (so sending(obj) sees it while a blocking
  // send of it runs).
  std::shared_ptr<const TensorDict> to_send(nb::handle obj) {
    if (sending(obj)) return sent.copy;
    auto copy = std::make_shared<const TensorDict>(nb::cast<const PyTensorDict&>(obj).td());
    forget_finished();
    if (!sent.copy) sent = {nb::borrow(obj), copy};
    return copy;
  }
  // After a send call, under the GIL: keeps the copy of the send in flight, if any.
  void after_send(nb::handle obj, const std::shared_ptr<const TensorDict>& copy) {
    if (pipe.sending(*copy))
      sent = {nb::borrow(obj), copy};
    else
      forget_finished();
  }
  // Drops the kept copy once its send is over (not another thread's send started since).
  void forget_finished() {
    if (sent.copy && !pipe.sending(*sent.copy)) sent = {};
  }

  Target* target_of(nb::handle obj) {
    for (Target& t : targets)
      if (t.obj.is(obj)) return &t;
    return nullptr;
  }

  int receiving = 0, receiving_own = 0;  // receive() calls running; those with no target

  // Runs `get(into)` (a receive, TensorDictPipe::Received) with the GIL released; what it
  // received, or None. What is kept was taken by the receive itself: another thread's
  // receive may replace the decoder's object as soon as this one lets go of the pipe.
  template <class Get>
  nb::object receive(nb::handle into_obj, Get&& get) {
    TensorDict* into = into_of(into_obj);
    // A consolidated pipe rewrites the TensorDict it returns at the next receive, in place:
    // a second thread's receive would overwrite the first's before its caller read it (and
    // the two could get each other's object). Refused rather than torn, unless each call
    // receives into a target of its own.
    if (pipe.options().consolidated && (receiving_own > 0 || (!into && receiving > 0)))
      throw Error(
          "another thread is receiving from this pipe: a consolidated pipe rewrites the "
          "TensorDict it returns at each receive, so receive from one thread at a time, each "
          "thread into a TensorDict of its own (recv(td)), or use consolidated=False, whose "
          "receives each return a new TensorDict");
    ++receiving;
    if (!into) ++receiving_own;
    struct Done {
      PyPipe& p;
      bool own;
      ~Done() {
        --p.receiving;
        if (own) --p.receiving_own;
      }
    } done{*this, into == nullptr};
    if (into) {
      if (!target_of(into_obj)) targets.push_back({nb::borrow(into_obj)});
      ++target_of(into_obj)->calls;
    }
    // Under the GIL again, whatever the call did (the vector may have grown meanwhile).
    auto returned = [&] {
      if (into) --target_of(into_obj)->calls;
    };
    TensorDictPipe::Received r;
    try {
      r = (NoGil(), get(into));
    } catch (...) {
      returned();
      throw;
    }
    returned();
    TensorDict* got = r.target;
    if (!got) return nb::none();
    nb::object given;
    for (const Target& t : targets)
      if (&t.td() == got) given = t.obj;
    std::erase_if(targets,
                  [&](const Target& t) { return t.calls == 0 && !pipe.receiving_into(t.td()); });
    if (given.is_valid()) return given;
    const bool consolidated = pipe.options().consolidated;
    if (!r.copy && cached.is_valid()) return cached;  // consolidated, the same structure
    // A structural copy: it shares the received storage, so later in-place receives are
    // seen through it, and it stays valid after the next schema change.
    nb::object obj = nb::cast(PyTensorDict(r.copy ? std::move(*r.copy) : TensorDict(*got)));
    if (consolidated) cached = obj;
    return obj;
  }
};

// A blocking send or receive that completed puts what it did in `done` (a list, or None),
// here in C++: Python raises a Ctrl-C that came meanwhile as the call returns, which would
// lose the message received, or leave a sent one looking unsent (tensorwire/pipe.py).
void said_done(nb::handle done, nb::handle what) {
  if (!done.is_none() && PyList_Append(done.ptr(), what.ptr()) != 0) throw nb::python_error();
}

// PipeListener and TensorDictServer alike; accept() gives None on timeout.
template <class T>
void bind_acceptor(nb::module_& m, const char* name) {
  auto accept = [](T& self, nb::handle timeout, bool throw_on_refusal) {
    Timeout t = timeout_arg(timeout);
    std::optional<TensorDictPipe> got;
    {
      NoGil nogil;
      if constexpr (std::is_same_v<T, PipeListener>)
        got = self.accept(t, throw_on_refusal);
      else
        got = self.accept(t);
    }
    return got ? std::optional<PyPipe>(PyPipe{{}, std::move(*got), {}}) : std::nullopt;
  };
  nb::class_<T>(m, name)
      .def(
          "__init__",
          [](T* self, nb::handle port, nb::handle consolidated, nb::handle auth_key,
             nb::handle timeout, nb::handle max_message_bytes, nb::handle liveness_timeout) {
            new (self) T(port_of(port), make_options(consolidated, auth_key, timeout,
                                                     max_message_bytes, liveness_timeout));
          },
          nb::arg("port"), nb::arg("consolidated").none(), nb::arg("auth_key").none(),
          nb::arg("timeout").none(), nb::arg("max_message_bytes"),
          nb::arg("liveness_timeout").none() = nb::none())
      .def("accept", accept, nb::arg("timeout").none() = nb::none(),
           nb::arg("throw_on_refusal") = false)
      .def_prop_ro("port", &T::port)
      // Without the GIL: these take the listener's lock, which accept() on another thread
      // holds while it may log (a record takes the GIL).
      .def_prop_ro("fd", &T::fd, nb::call_guard<NoGil>())
      .def("arm", &T::arm, nb::call_guard<NoGil>())
      .def("close", &T::close, nb::call_guard<NoGil>())
      .def_prop_ro("closed", &T::closed, nb::call_guard<NoGil>())
      .def_prop_ro("refused", &T::refused)
      .def_prop_ro("last_refusal", &T::last_refusal, nb::call_guard<NoGil>());
}

}  // namespace

void bind_pipe(nb::module_& m) {
  // The pipe's own error kinds, on top of the mapping of python/src/errors.cpp (tried first).
  using us = std::chrono::microseconds;
  nb::class_<PyPipe>(m, "_Pipe")
      .def(
          "send",
          [](PyPipe& self, nb::handle td, nb::handle timeout, nb::handle done) {
            Timeout t = timeout_arg(timeout);
            const std::shared_ptr<const TensorDict> copy = self.to_send(td);
            try {
              (NoGil(), self.pipe.send(*copy, t));
            } catch (...) {
              self.after_send(td, copy);
              throw;
            }
            // Sent: its copy is no longer in flight (no look at the pipe, whose lock a
            // progressing thread may hold, on this path of every message).
            if (self.sent.copy == copy)
              self.sent = {};
            else
              self.forget_finished();
            said_done(done, Py_True);
          },
          nb::arg("td"), nb::arg("timeout").none() = nb::none(),
          nb::arg("done").none() = nb::none())
      .def(
          "recv",
          [](PyPipe& self, nb::handle into, nb::handle timeout, nb::handle done) {
            Timeout t = timeout_arg(timeout);
            nb::object got =
                self.receive(into, [&](TensorDict* td) { return self.pipe.receive(td, t); });
            said_done(done, got);
            return got;
          },
          nb::arg("td").none() = nb::none(), nb::arg("timeout").none() = nb::none(),
          nb::arg("done").none() = nb::none())
      .def("start_send",
           [](PyPipe& self, nb::handle td) {
             const std::shared_ptr<const TensorDict> copy = self.to_send(td);
             if (!self.pipe.start_send(*copy)) return false;
             self.after_send(td, copy);
             return true;
           })
      .def("sending", [](PyPipe& self, nb::handle td) { return self.sending(td); })
      // The asyncio forms spin up to spin_us (a reply may be microseconds away) before the
      // caller arms the wake-up fd (a trip through epoll costs tens of microseconds).
      .def(
          "poll_send",
          [](PyPipe& self, int64_t spin) {
            const bool done = (NoGil(), self.pipe.poll_send(us(spin)));
            if (done) self.forget_finished();
            return done;
          },
          nb::arg("spin_us") = 0)
      .def(
          "poll_recv",
          [](PyPipe& self, nb::handle into, int64_t spin) {
            return self.receive(
                into, [&](TensorDict* td) { return self.pipe.poll_receive(td, us(spin)); });
          },
          nb::arg("td").none() = nb::none(), nb::arg("spin_us") = 0)
      .def("arm", [](PyPipe& self) { return self.pipe.arm(); })
      .def_prop_ro("events", [](PyPipe& self) { return self.pipe.events(); })
      .def_prop_ro("fd", [](PyPipe& self) { return self.pipe.fd(); })
      .def_prop_ro("peer_fd", [](PyPipe& self) { return self.pipe.peer_fd(); })
      .def_prop_ro("peer", [](PyPipe& self) { return self.pipe.peer(); })
      .def_prop_ro("transports", [](PyPipe& self) { return self.pipe.transports(); })
      .def_prop_ro("consolidated", [](PyPipe& self) { return self.pipe.options().consolidated; })
      .def_prop_ro(
          "liveness_timeout",
          [](PyPipe& self) {
            return std::chrono::duration<double>(self.pipe.options().liveness_timeout).count();
          })
      .def_prop_ro("closed", [](PyPipe& self) { return self.pipe.closed(); })
      .def_prop_ro("failed", [](PyPipe& self) { return self.pipe.failed(); })
      .def_prop_ro("closed_by_peer", [](PyPipe& self) { return self.pipe.closed_by_peer(); })
      .def(
          "close", [](PyPipe& self) { self.pipe.close(); }, nb::call_guard<NoGil>());

  m.def(
      "_connect",
      [](nb::handle host_arg, nb::handle port, nb::handle consolidated, nb::handle auth_key,
         nb::handle timeout, nb::handle max_message_bytes, nb::handle liveness_timeout) {
        const std::string host = *str_arg(host_arg, "host", false);
        PipeOptions o =
            make_options(consolidated, auth_key, timeout, max_message_bytes, liveness_timeout);
        uint16_t p = port_of(port);
        NoGil nogil;
        return PyPipe{{}, TensorDictPipe::connect(host, p, o), {}};
      },
      nb::arg("host").none(), nb::arg("port"), nb::arg("consolidated").none(),
      nb::arg("auth_key").none(), nb::arg("timeout").none(), nb::arg("max_message_bytes"),
      nb::arg("liveness_timeout").none() = nb::none());

  // The timeout rule (Timeout::seconds) for the asyncio forms, which wait in the event loop:
  // None for no limit, else the seconds; ValueError for a negative or NaN value.
  m.def(
      "_timeout_seconds",
      [](nb::handle s) -> Seconds {
        const Timeout t = timeout_arg(s);
        if (t.is_forever()) return std::nullopt;
        return std::chrono::duration<double>(t.duration()).count();
      },
      nb::arg("timeout").none());

  bind_acceptor<PipeListener>(m, "_PipeListener");
  bind_acceptor<TensorDictServer>(m, "_Server");
}

}  // namespace tensorwire::py
