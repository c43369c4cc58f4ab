// Bindings of the dataflow runners (tensorwire/dataflow/*.h) for Python dataflows.
//
// Conversion and the GIL only: datapoints through convert.h (the round-trip rule, the wire
// layer's format); PyDataFlow (py_dataflow.h) for the Python dataflow object; fork hooks
// (PyOS_BeforeFork / AfterFork, the worker's seeding callable) and the worker's Python exception
// report.
//
// The GIL: blocking calls and close() (which waits for another thread's iteration) run without
// it. A worker releases it after the fork, takes it to run Python (dataflow, map, conversions).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"  // and convert.h, nanobind
#include "gc_slots.h"
#include "gil.h"
#include "held_value.h"
#include "py_dataflow.h"
#include "tensorwire/dataflow/map.h"
#include "tensorwire/dataflow/remote.h"
#include "tensorwire/dataflow/runner.h"
#include "tensorwire/runtime/liveness.h"

namespace tensorwire::py {

namespace {

namespace df = tensorwire::dataflow;
// `seed_worker(seed)` runs in each worker right after the fork (Python's generators). A
// restart forks during iteration, where the GIL is released: the hooks take it then.
df::ForkHooks python_fork_hooks(nb::object seed_worker) {
  df::ForkHooks h;
  auto taken = std::make_shared<std::optional<PyGILState_STATE>>();
  h.before = [taken] {
    if (!PyGILState_Check()) *taken = PyGILState_Ensure();
    PyOS_BeforeFork();
  };
  h.parent = [taken] {
    PyOS_AfterFork_Parent();
    if (*taken) PyGILState_Release(**taken);
    taken->reset();
  };
  h.child = [seed = std::make_shared<nb::object>(std::move(seed_worker))] {
    PyOS_AfterFork_Child();
    if (const df::WorkerInfo* w = df::current_worker(); w && !seed->is_none()) {
      try {
        (*seed)(w->seed);
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("tensorwire worker seeding");
      }
    }
    // From here on the worker's C++ code runs without the GIL; Python code takes it.
    (void)PyEval_SaveThread();
  };
  return h;
}

// Seconds that are not None (`none_ok`: the caller takes None itself, and says so when refusing).
std::chrono::milliseconds millis(nb::handle s, const char* what, bool none_ok) {
  const Timeout t = timeout_arg(s, what, none_ok);
  return std::chrono::ceil<std::chrono::milliseconds>(t.duration());
}

// The worker policy's arguments: (on_worker_death, max_restarts, restart_window seconds,
// datapoint_timeout seconds or None, on_restart(message) or None).
using PolicyArgs = std::tuple<nb::handle, nb::handle, nb::handle, nb::handle, nb::object>;

template <class Options>
Options runner_options(nb::handle num_proc, nb::handle seed, nb::object seed_worker,
                       PolicyArgs policy) {
  Options o;
  o.num_proc = int_arg_as<int>(num_proc, "num_proc");
  o.seed = count_arg(seed, "seed");
  o.fork_hooks = python_fork_hooks(std::move(seed_worker));
  o.describe_failure = describe_worker_failure;
  auto& [on_death, max_restarts, window, datapoint_timeout, on_restart] = policy;
  o.policy.on_death = df::parse_on_worker_death(*str_arg(on_death, "on_worker_death", false));
  o.policy.max_restarts = int_arg_as<int>(max_restarts, "max_restarts");
  o.policy.restart_window = millis(window, "restart_window", false);
  if (!datapoint_timeout.is_none())
    o.policy.datapoint_timeout = millis(datapoint_timeout, "datapoint_timeout", true);
  o.policy.on_restart = py_callback<df::WorkerRestart>(std::move(on_restart),
                                                       [](const auto& r) { return r.message; });
  return o;
}

// ---- Runners ------------------------------------------------------------------------------------

// A runner (T: MultiProcessRunnerZMQ or MultiProcessMapDataZMQ) and its Python dataflow.
template <class T>
struct PyRunner {
  std::shared_ptr<PyDataFlow> flow;
  std::unique_ptr<T> runner;
  std::shared_ptr<nb::object> map_func;  // the map's; runs in the workers, held here
  std::shared_ptr<HeldValue> held = std::make_shared<HeldValue>();  // by the epochs, in turn

  int traverse(visitproc visit, void* arg) {
    if (map_func) Py_VISIT(map_func->ptr());
    if (int r = held->traverse(visit, arg)) return r;
    return flow ? flow->traverse(visit, arg) : 0;
  }
  void clear() {
    held->clear();
    if (map_func) map_func->reset();
    if (flow) flow->clear();
  }
};

// An epoch of a runner as a Python iterator; keeps its runner alive. Threads sharing the
// iterator take turns in the runner; each holds the epoch while it waits, so one that ends
// the iteration (an error, the end) does not destroy it under another.
struct PyEpoch {
  nb::object owner;  // the Python object of the runner (tensorwire.dataflow's)
  nb::object core;   // the binding's: a collected cycle clears owner's attributes first
  std::shared_ptr<df::Epoch> epoch;
  std::shared_ptr<HeldValue> held;  // the runner's: a datapoint a Ctrl-C came after

  int traverse(visitproc visit, void* arg) {
    Py_VISIT(owner.ptr());
    Py_VISIT(core.ptr());
    return 0;
  }
  void clear() {
    epoch.reset();  // first: it ends its epoch in the runner
    owner.reset();
    core.reset();
  }

  nb::object next() {
    const std::shared_ptr<df::Epoch> current = epoch;
    if (!current) throw nb::stop_iteration();
    if (nb::object kept = held->take()) return kept;
    std::optional<df::RawDatapoint> dp;
    try {
      // A look without waiting first, GIL held: in a busy pipeline the datapoint is
      // there, and releasing and re-taking the GIL for each one would cost more.
      dp = df::detail::RawAccess::next(*current, Timeout::poll());
      if (!dp && !current->done()) {
        NoGil nogil;
        dp = df::detail::RawAccess::next(*current, Timeout::forever());
      }
    } catch (...) {
      epoch.reset();  // as a generator that raised: this iteration is over
      throw;
    }
    if (!dp) {
      epoch.reset();  // the guard goes with the epoch: a new one may start
      throw nb::stop_iteration();
    }
    return held->deliver(raw_to_py(*dp, true));
  }
};

bool continues_pass(const df::MultiProcessRunnerZMQ&) {
  return false;
}
bool continues_pass(const df::MultiProcessMapDataZMQ& m) {
  return m.options().strict;
}

// `owner`: what the iterator keeps alive (the Python runner object holding this one).
template <class T>
PyEpoch epoch_of(nb::handle self, nb::handle owner) {
  PyRunner<T>& r = nb::cast<PyRunner<T>&>(self);
  // A datapoint held by an epoch given up: a strict map's next epoch goes on with that
  // pass, so it is that epoch's; a stream's epoch (runner, non-strict map) is any len(ds)
  // datapoints, and the old one counted it: dropped, as tensorpack drops what it had.
  if (!continues_pass(*r.runner)) r.held->clear();
  PyEpoch e{nb::borrow(owner.is_none() ? self : owner), nb::borrow(self), nullptr, r.held};
  e.epoch = std::make_shared<df::Epoch>(r.runner->epoch());
  return e;
}

struct PyRemote {
  std::unique_ptr<df::RemoteDataZMQ> remote;
  bool allow_pickle;
  HeldValue held;  // a datapoint a Ctrl-C came after

  nb::object next(nb::handle timeout) {
    const Timeout t = timeout_arg(timeout);
    if (nb::object kept = held.take()) return kept;
    std::optional<df::RawDatapoint> dp = (NoGil(), df::detail::RawAccess::next(*remote, t));
    if (!dp) return nb::none();
    return held.deliver(raw_to_py(*dp, allow_pickle));
  }
};

// What both runners bind alike.
template <class T>
void bind_runner_common(nb::class_<PyRunner<T>>& c) {
  using R = PyRunner<T>;
  c.def("reset_state", [](R& r) { r.runner->reset_state(); })
      .def("epoch", &epoch_of<T>, nb::arg("owner").none() = nb::none())
      .def("close",
           [](R& r) {
             r.held->clear();
             NoGil nogil;
             r.runner->close();
           })
      .def_prop_ro("closed", [](R& r) { return r.runner->closed(); })
      .def_prop_ro("size", [](R& r) { return r.runner->size(); })
      .def_prop_ro("pids", [](R& r) { return r.runner->pids(); })
      .def_prop_ro("restarts", [](R& r) { return r.runner->restarts(); })
      .def_prop_ro("base_seed", [](R& r) { return r.runner->base_seed(); });
}

}  // namespace

void bind_dataflow(nb::module_& m) {
  static nb::object died =
      nb::exception<df::WorkerDiedError>(m, "WorkerDiedError", PyExc_RuntimeError);

  m.def("_current_worker", []() -> nb::object {
    const df::WorkerInfo* w = df::current_worker();
    if (!w) return nb::none();
    return nb::make_tuple(w->index, w->num_workers, w->seed);
  });
  m.def(
      "_datapoint_roundtrip",
      [](nb::handle obj, bool allow_pickle) {
        // Conversion only, for tests: Python -> datapoint -> Python.
        return datapoint_to_py(datapoint_from_py(obj), allow_pickle);
      },
      nb::arg("obj").none(), nb::arg("allow_pickle") = true);
  m.def("_datapoint_to_tensordict",
        [](nb::handle obj) { return PyTensorDict(datapoint_from_py(obj)); });

  nb::class_<PyEpoch>(m, "_Epoch", nb::type_slots(gc_slots<PyEpoch>))
      .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__next__", &PyEpoch::next);

  using Runner = PyRunner<df::MultiProcessRunnerZMQ>;
  nb::class_<Runner> runner(m, "_Runner", nb::type_slots(gc_slots<Runner>));
  runner.def(
      "__init__",
      [](Runner* self, nb::object ds, nb::handle num_proc, nb::handle hwm, nb::handle seed,
         nb::object seed_worker, PolicyArgs policy) {
        auto o = runner_options<df::RunnerOptions>(num_proc, seed, std::move(seed_worker),
                                                   std::move(policy));
        o.hwm = int_arg_as<int>(hwm, "hwm");
        auto flow = std::make_shared<PyDataFlow>(std::move(ds));
        new (self)
            Runner{flow, std::make_unique<df::MultiProcessRunnerZMQ>(flow, std::move(o)), nullptr};
      },
      nb::arg("ds").none(), nb::arg("num_proc"), nb::arg("hwm").none(), nb::arg("seed").none(),
      nb::arg("seed_worker").none(), nb::arg("policy"));
  bind_runner_common(runner);
  runner.def_prop_ro("endpoint", [](Runner& r) { return r.runner->endpoint(); })
      .def_prop_ro("shared_memory_bytes",
                   [](Runner& r) { return r.runner->shared_memory_bytes(); });

  using Map = PyRunner<df::MultiProcessMapDataZMQ>;
  nb::class_<Map> map(m, "_MapData", nb::type_slots(gc_slots<Map>));
  map.def(
      "__init__",
      [](Map* self, nb::object ds, nb::handle num_proc, nb::object fn, nb::handle buffer_size,
         nb::handle strict, nb::handle seed, nb::object seed_worker, PolicyArgs policy) {
        if (!PyCallable_Check(fn.ptr()))
          throw TypeError("MultiProcessMapDataZMQ: map_func must be callable, got a " +
                          nb::cast<std::string>(nb::type_name(fn.type())));
        auto o = runner_options<df::MapOptions>(num_proc, seed, std::move(seed_worker),
                                                std::move(policy));
        o.buffer_size = int_arg_as<size_t>(buffer_size, "buffer_size");  // C++ checks
        o.strict = bool_arg(strict, "strict");
        auto holder = std::make_shared<nb::object>(std::move(fn));
        auto map_fn = [holder](TensorDict in) -> std::optional<TensorDict> {
          nb::gil_scoped_acquire gil;
          nb::object out = (*holder)(datapoint_to_py(in, true));
          if (out.is_none()) return std::nullopt;
          return datapoint_from_py(out);
        };
        auto flow = std::make_shared<PyDataFlow>(std::move(ds));
        new (self) Map{
            flow, std::make_unique<df::MultiProcessMapDataZMQ>(flow, map_fn, std::move(o)), holder};
      },
      nb::arg("ds").none(), nb::arg("num_proc"), nb::arg("map_func").none(),
      nb::arg("buffer_size").none(), nb::arg("strict").none(), nb::arg("seed").none(),
      nb::arg("seed_worker").none(), nb::arg("policy"));
  bind_runner_common(map);
  map.def_prop_ro("buffer_size", [](Map& p) { return p.runner->buffer_size(); });

  nb::class_<PyRemote>(m, "_RemoteData")
      .def(
          "__init__",
          [](PyRemote* self, nb::handle addr1, nb::handle addr2, nb::handle hwm, nb::handle bind,
             nb::handle allow_pickle, nb::object on_rejected, nb::handle liveness_timeout,
             nb::object on_silent, nb::handle max_message_bytes) {
            df::RemoteOptions o;
            if (!max_message_bytes.is_none())  // a negative one is 0, refused as such
              o.limits.max_message_bytes =
                  int_arg_as<uint64_t>(max_message_bytes, "max_message_bytes");
            o.hwm = int_arg_as<int>(hwm, "hwm");
            o.bind = bool_arg(bind, "bind");
            o.allow_pickle = bool_arg(allow_pickle, "allow_pickle");
            o.liveness_timeout = liveness_arg(liveness_timeout);
            auto what = [](const auto& e) { return std::string(e.what()); };
            o.on_rejected = py_callback<ProtocolError>(std::move(on_rejected), what);
            o.on_silent = py_callback<TimeoutError>(std::move(on_silent), what);
            new (self)
                PyRemote{std::make_unique<df::RemoteDataZMQ>(*str_arg(addr1, "addr1", false),
                                                             *str_arg(addr2, "addr2", false), o),
                         o.allow_pickle};
          },
          nb::arg("addr1").none(), nb::arg("addr2").none(), nb::arg("hwm").none(),
          nb::arg("bind").none(), nb::arg("allow_pickle").none(), nb::arg("on_rejected").none(),
          nb::arg("liveness_timeout").none(), nb::arg("on_silent").none(),
          nb::arg("max_message_bytes").none())
      .def(  // without the GIL: a connect looks its host up (a DNS server may be slow)
          "reset_state", [](PyRemote& r) { r.remote->reset_state(); }, nb::call_guard<NoGil>())
      .def("next", &PyRemote::next, nb::arg("timeout").none() = nb::none())
      .def("endpoint",
           [](PyRemote& r, nb::handle which) {
             return r.remote->endpoint(int_arg_as<int>(which, "which"));
           })
      .def("count",
           [](PyRemote& r, nb::handle which) {
             return r.remote->count(int_arg_as<int>(which, "which"));
           })
      .def_prop_ro("rejected", [](PyRemote& r) { return r.remote->rejected(); })
      // (address, socket, connected, datapoints, last datapoint in time.monotonic() seconds
      // or None): steady_clock is CLOCK_MONOTONIC, as Python's monotonic clock.
      .def("producers",
           [](PyRemote& r) {
             std::vector<std::tuple<std::string, int, bool, uint64_t, std::optional<double>>> out;
             for (const auto& p : r.remote->producers()) {
               std::optional<double> last;
               if (p.last_datapoint)
                 last = std::chrono::duration<double>(p.last_datapoint->time_since_epoch()).count();
               out.emplace_back(p.address, p.socket, p.connected, p.datapoints, last);
             }
             return out;
           })
      .def_prop_ro("liveness_timeout",
                   [](PyRemote& r) {
                     return std::chrono::duration<double>(r.remote->liveness_timeout()).count();
                   })
      .def_prop_ro("closed", [](PyRemote& r) { return r.remote->closed(); })
      .def("close", [](PyRemote& r) {
        r.held.clear();
        NoGil nogil;
        r.remote->close();
      });

  m.def(
      "_send_dataflow_zmq",
      [](nb::object ds, nb::handle addr, nb::handle hwm, nb::handle bind, nb::handle max_datapoints,
         nb::object progress) {
        PyDataFlow flow(std::move(ds));
        const std::string address = *str_arg(addr, "addr", false);
        df::SendOptions o;
        o.hwm = int_arg_as<int>(hwm, "hwm");
        o.bind = bool_arg(bind, "bind");
        if (!max_datapoints.is_none())  // a negative one is 0, refused as such
          o.max_datapoints = int_arg_as<uint64_t>(max_datapoints, "max_datapoints");
        if (!progress.is_none())
          o.progress = [&](uint64_t sent) {
            GilForLibrary gil;
            progress(sent);
            return true;
          };
        NoGil nogil;
        return df::send_dataflow_zmq(flow, address, o);
      },
      nb::arg("ds").none(), nb::arg("addr").none(), nb::arg("hwm").none(), nb::arg("bind").none(),
      nb::arg("max_datapoints").none(), nb::arg("progress").none());
}

}  // namespace tensorwire::py
