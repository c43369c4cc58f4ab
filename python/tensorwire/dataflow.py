"""Parallel data loading: tensorpack's dataflow runners, with tensor bytes in shared memory.

``MultiProcessRunnerZMQ`` runs a dataflow in worker processes, ``MultiProcessMapDataZMQ``
runs a map function in worker processes, and ``send_dataflow_zmq`` / ``RemoteDataZMQ``
feed a trainer from producers on other machines. The behaviour is tensorpack's
(``tensorwire.tensorpack`` has the drop-in names), with what tensorpack lacks: a worker
that dies makes iteration raise within seconds instead of hanging, workers die with
their parent and are reaped on close, garbage collection and interpreter exit, each
worker gets a distinct reproducible seed, and datapoints come back as zero-copy views
into the workers' shared memory (docs/dataflow.md).

A dataflow is any object with ``reset_state()``, ``__iter__`` and optionally
``__len__``, yielding lists or dicts (or tuples) of numpy arrays, torch tensors,
numbers, strings and bytes, nested at will; other picklable objects are allowed and
are pickled (slower). A datapoint comes back with the same structure.

Memory: a datapoint's arrays view the worker's shared memory, which is recycled when
the last array of the datapoint is dropped. A consumer that keeps datapoints keeps
their memory (copy the arrays to keep them without it).
"""
from __future__ import annotations

import atexit
import builtins
import collections
import contextlib
import logging
import pickle
import random
import signal
import sys
import threading
import warnings
import weakref

from . import _C
from ._C import RemoteTraceback, WorkerDiedError

__all__ = [
    "DataFlow",
    "MultiProcessRunnerZMQ",
    "MultiProcessMapDataZMQ",
    "send_dataflow_zmq",
    "RemoteDataZMQ",
    "WorkerInfo",
    "get_worker_info",
    "WorkerDiedError",
    "RemoteTraceback",
    "MalformedMessageWarning",
    "ProducerSilentWarning",
    "Producer",
    "WorkerRestartedWarning",
]

logger = logging.getLogger("tensorwire.dataflow")

WorkerInfo = collections.namedtuple("WorkerInfo", ["id", "num_workers", "seed"])
WorkerInfo.__doc__ = "This process's place among a runner's workers: index, count and seed."


def get_worker_info():
    """The ``WorkerInfo`` of this process when it is a runner's worker, else ``None``.

    ``seed`` is the runner's base seed plus the worker index: distinct per worker and
    reproducible when the runner was given ``seed=``. Python workers have already seeded
    ``random``, ``numpy.random`` and (when imported) ``torch`` with it.
    """
    info = _C._current_worker()
    return None if info is None else WorkerInfo(*info)


def _seed_worker(seed):
    """Runs in each worker right after the fork (given to the runners' C++ fork hook)."""
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % (1 << 32))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


# Every runner that forked, so that interpreter exit reaps their workers even when the
# objects are still referenced (module globals) and never collected.
_live = weakref.WeakSet()
_live_lock = threading.Lock()


@atexit.register
def _close_all():
    with _live_lock:
        runners = list(_live)
    for r in runners:
        try:
            r.close()
        except Exception:
            pass


class DataFlow:
    """The dataflow contract (tensorpack's): ``reset_state``, ``__iter__``, ``__len__``."""

    def reset_state(self):
        pass

    def __iter__(self):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError()


def _remade(cls, base, args, kwargs, state):
    """A runner pickled before reset_state(): made again by the tensorwire class's own
    constructor (a subclass's may take other arguments), then given its attributes."""
    runner = cls.__new__(cls)
    base.__init__(runner, *args, **kwargs)
    runner.__dict__.update(state)
    return runner


@contextlib.contextmanager
def _sigint_deferred():
    """Ctrl-C held back until the block ends, then raised (a second one at once). Around
    the forks of the workers: Python's at-fork hooks (logging's lock) run Python code, and a
    KeyboardInterrupt raised there is printed as ignored and lost; the program never saw
    its Ctrl-C."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield  # Python runs handlers on the main thread only; a handler of the user's stays
        return
    caught = []

    def held_back(signum, frame):
        if caught:
            raise KeyboardInterrupt
        caught.append(signum)

    signal.signal(signal.SIGINT, held_back)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


class _Forking(DataFlow):
    _core = None
    _made_with: tuple | None = None  # (tensorwire class, its constructor's args, kwargs)
    _started = False

    def reset_state(self):
        """Forks the workers (once: a second call raises RuntimeError). A Ctrl-C meanwhile
        is raised once they are all started."""
        self._started = True  # from here on it is not its arguments any more (__reduce__)
        with _sigint_deferred():
            self._core.reset_state()
        with _live_lock:
            _live.add(self)

    def __reduce__(self):
        # Before reset_state() a runner is its arguments (tensorpack's pickle then too, to
        # hand one to a spawned process); after, its workers and shared memory are this
        # process's.
        name = type(self).__name__
        if self._started or self._made_with is None:
            raise TypeError(f"a {name} cannot be pickled once reset_state() was called (its "
                            "workers and shared memory belong to this process): pickle it "
                            "before, and call reset_state() where it runs")
        if self._core.closed:
            raise TypeError(f"a closed {name} cannot be pickled")
        state = {k: v for k, v in self.__dict__.items() if k not in ("_core", "_made_with")}
        return (_remade, (type(self), *self._made_with, state))

    def close(self):
        """Kills and reaps the workers; idempotent. Datapoints already received stay valid."""
        if self._core is not None:
            self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __iter__(self):
        # The iterator holds this object, so a runner made and returned by a function
        # (`for dp in make_loader()`) lives as long as its iteration.
        return self._core.epoch(self)

    def __len__(self):
        return self.ds.__len__()

    def __repr__(self):
        core = getattr(self, "_core", None)
        if core is None:
            state = "not constructed"
        elif core.closed:
            state = "closed"
        elif core.pids:
            state = f"running, workers {list(core.pids)}"
        else:
            state = "not started (call reset_state())"
        return f"<{type(self).__name__} num_proc={self.num_proc} {state}>"

    @property
    def pids(self):
        """Process ids of the workers (empty before ``reset_state()``)."""
        return list(self._core.pids)

    @property
    def base_seed(self):
        """The base seed: worker ``i`` is seeded with ``base_seed + i`` (its ``k``-th
        replacement under ``on_worker_death="restart"``: ``base_seed + i + k * num_proc``)."""
        return self._core.base_seed

    @property
    def restarts(self):
        """Workers replaced so far (``on_worker_death="restart"``)."""
        return self._core.restarts


class WorkerRestartedWarning(RuntimeWarning):
    """A runner replaced a dead (or stuck) worker; the message names it, its pid and how it
    died. The same line goes to the ``tensorwire`` logger. Turned into an error, it is
    raised by the iteration's next call, once the restart is complete."""


def _warn_restart(message):
    warnings.warn(message, WorkerRestartedWarning, stacklevel=2)


def _policy(on_worker_death, max_restarts, restart_window, datapoint_timeout):
    # Checked in C++ (ValueError naming the argument); converted by the binding.
    return (on_worker_death, max_restarts, restart_window, datapoint_timeout, _warn_restart)


_POLICY_DOC = """
    Dead workers: ``on_worker_death="raise"`` (the default) raises ``WorkerDiedError``;
    ``"restart"`` replaces the worker by a fresh one with a new seed, warns
    (``WorkerRestartedWarning`` and the ``tensorwire`` logger) naming the worker, its pid and
    how it died, counts it in ``restarts``, and goes on. A worker that dies more than
    ``max_restarts`` times within ``restart_window`` seconds ends the run with
    ``WorkerDiedError``. ``datapoint_timeout`` (seconds, ``None``: no limit): a worker busy
    on one datapoint (or, in a runner, in the dataflow's ``reset_state()``) for longer is
    killed and then treated as dead, the datapoint named; a datapoint that more than
    ``max_restarts`` workers died on ends the run, however far apart the deaths.
    ``float("inf")`` is for ever for both.
"""


class MultiProcessRunnerZMQ(_Forking):
    """Runs ``ds`` in ``num_proc`` worker processes and yields their datapoints.

    Nothing forks in the constructor: ``reset_state()`` (once; a second call raises
    ``RuntimeError``) forks the workers, each of which calls ``ds.reset_state()`` and
    loops over ``ds`` for ever, sending each datapoint through shared memory it owns. At
    most ``hwm`` datapoints per worker are sent and not yet received.

    Iterating yields ``len(ds)`` datapoints when the length is known (an endless stream
    otherwise); a second concurrent iteration raises ``RuntimeError``. With one worker
    the datapoints come in the order of ``ds``; with several, in the same distribution
    (each worker runs all of ``ds``: expect duplicates and reordering).

    A worker's exception is raised here with its type, message and the worker's
    traceback (as ``__cause__``); a worker that dies makes iteration raise
    ``WorkerDiedError`` naming it and its signal within seconds.
    """

    def __init__(self, ds, num_proc=1, hwm=50, *, seed=None, on_worker_death="raise",
                 max_restarts=3, restart_window=60.0, datapoint_timeout=None):
        self._core = _C._Runner(ds, num_proc, hwm, seed, _seed_worker,
                                _policy(on_worker_death, max_restarts, restart_window,
                                        datapoint_timeout))
        self._made_with = (MultiProcessRunnerZMQ, (ds, num_proc, hwm), dict(
            seed=seed, on_worker_death=on_worker_death, max_restarts=max_restarts,
            restart_window=restart_window, datapoint_timeout=datapoint_timeout))
        self.ds = ds
        self.num_proc = num_proc
        self._hwm = hwm
        if num_proc > 1:
            logger.info("[MultiProcessRunnerZMQ] Will fork a dataflow more than one times. "
                        "This assumes the datapoints are i.i.d.")

    @property
    def shared_memory_bytes(self):
        """Bytes of worker shared memory mapped in this process (the chunk arenas)."""
        return self._core.shared_memory_bytes


MultiProcessRunnerZMQ.__doc__ += _POLICY_DOC
PrefetchDataZMQ = MultiProcessRunnerZMQ


class MultiProcessMapDataZMQ(_Forking):
    """Iterates ``ds`` here and applies ``map_func`` in ``num_proc`` worker processes.

    ``buffer_size`` datapoints are in flight (1 to 65,536, after strict mode clamps it to
    ``len(ds)``; a ValueError beyond). ``strict=False``: iteration is endless (the
    dataflow repeats), results come in completion order and a ``None`` result drops the
    datapoint. ``strict=True``: each iteration yields the mapping of every datapoint of
    one pass exactly once (``None`` is an error). An exception in ``map_func`` is raised
    here with its traceback; a dead worker raises ``WorkerDiedError``. Never a hang.
    """

    def __init__(self, ds, num_proc, map_func, *, buffer_size=200, strict=False, seed=None,
                 on_worker_death="raise", max_restarts=3, restart_window=60.0,
                 datapoint_timeout=None):
        self._core = _C._MapData(ds, num_proc, map_func, buffer_size, strict, seed, _seed_worker,
                                 _policy(on_worker_death, max_restarts, restart_window,
                                         datapoint_timeout))
        self._made_with = (MultiProcessMapDataZMQ, (ds, num_proc, map_func), dict(
            buffer_size=buffer_size, strict=strict, seed=seed, on_worker_death=on_worker_death,
            max_restarts=max_restarts, restart_window=restart_window,
            datapoint_timeout=datapoint_timeout))
        self.ds = ds
        self.num_proc = num_proc
        self.map_func = map_func
        self._strict = strict
        self._buffer_size = self._core.buffer_size


MultiProcessMapDataZMQ.__doc__ += _POLICY_DOC
MultiProcessMapData = MultiProcessMapDataZMQ


def send_dataflow_zmq(df, addr, hwm=50, format=None, bind=False, *, max_datapoints=None, progress=None):
    """Resets ``df`` and sends its datapoints to ``addr`` (a PUSH socket) pass after pass.

    Runs for ever (as tensorpack's), or until ``max_datapoints`` were sent. Datapoints are
    queued only for a connected receiver: with none (or ``hwm`` datapoints waiting for
    it; 0: no limit, ZeroMQ's) this blocks, and Ctrl-C interrupts it. Datapoints go in
    tensorwire's wire format;
    tensors are never pickled. ``progress(sent)`` is called after each datapoint. Returns
    the number sent once the last is queued (a ``tcp://`` host that does not resolve is
    named in a warning, and tried again); the receiver then has 5 s to take what is still
    queued for it (ZeroMQ's linger) before it is dropped: up to ``hwm`` datapoints, and with
    ``hwm=0`` as many as the receiver is behind, so keep a bound where a slow receiver must
    get the whole of a stream cut by ``max_datapoints``.
    """
    if format not in (None, "tensorwire"):
        warnings.warn(f"send_dataflow_zmq: format={format!r} is ignored; datapoints go in "
                      "tensorwire's wire format", stacklevel=2)
    return _C._send_dataflow_zmq(df, addr, hwm, bind, max_datapoints, progress)


class MalformedMessageWarning(RuntimeWarning):
    """A message RemoteDataZMQ rejected (the stream goes on)."""


class ProducerSilentWarning(RuntimeWarning):
    """A producer of RemoteDataZMQ that sent and then went silent for longer than its
    ``liveness_timeout`` (the stream of the others goes on)."""


Producer = collections.namedtuple("Producer", ["address", "socket", "connected", "datapoints",
                                               "last_datapoint"])
Producer.__doc__ = ("A producer connection of RemoteDataZMQ: its end (``tcp://host:port``), "
                    "the socket (0: addr1, 1: addr2), whether it is open, the datapoints it "
                    "sent, and when the last came (``time.monotonic()`` seconds, or None).")


class RemoteDataZMQ(DataFlow):
    """Receives datapoints sent by ``send_dataflow_zmq`` on one or two PULL sockets.

    Iteration is endless. A malformed message is rejected with a warning naming the
    socket and the rule it broke (``errors="raise"``: raised as ``tensorwire.ProtocolError``
    instead; iterating again goes on with the stream) and never stops the datapoints of
    other producers. Pickled values (odd objects in Python datapoints) are refused unless
    ``allow_pickle=True``: unpickling runs code chosen by whoever can reach the socket.

    ``producers`` lists the producer connections. A producer that sent and then sends
    nothing for longer than ``liveness_timeout`` seconds (``None``: the environment variable
    ``TENSORWIRE_LIVENESS_TIMEOUT``, else 10; ``0``: no checks) is reported once with a
    ``ProducerSilentWarning`` naming it (``errors="raise"``: raised as ``TimeoutError``;
    iterating again goes on), while the others go on; its connection is kept, so a producer
    whose link comes back goes on without a gap. Time this receiver spends away from
    ``recv``/iteration for longer than a quarter of the timeout does not count as silence.

    ``max_message_bytes`` (``None``: 16 GiB) bounds a datapoint's storage: a frame larger
    than it (or than the 64 MiB metadata limit, whichever is larger) drops its producer's
    connection before it is buffered. Set it when producers are not trusted; up to ``hwm``
    messages per connection are buffered (0: no limit, ZeroMQ's reading: keep a bound for
    untrusted producers).
    """

    def __init__(self, addr1, addr2=None, hwm=50, bind=True, *, allow_pickle=False, errors="warn",
                 liveness_timeout=None, max_message_bytes=None):
        if errors not in ("warn", "raise"):
            raise ValueError(f"errors must be 'warn' or 'raise', got {errors!r}")
        self._errors = errors
        warn = errors == "warn"
        self._core = _C._RemoteData(addr1, addr2 or "", hwm, bind, allow_pickle,
                                    _warn_rejected if warn else None, liveness_timeout,
                                    _warn_silent if warn else None, max_message_bytes)
        self._guard = threading.Lock()

    def reset_state(self):
        self._core.reset_state()

    def endpoint(self, which=0):
        """The endpoint actually bound (``tcp://host:*`` resolved to its port)."""
        return self._core.endpoint(which)

    @property
    def cnt1(self):
        return self._core.count(0)

    @property
    def cnt2(self):
        return self._core.count(1)

    @property
    def rejected(self):
        """Malformed messages dropped so far."""
        return self._core.rejected

    @property
    def producers(self):
        """The producer connections (``Producer`` tuples): the open ones, and closed ones that
        sent datapoints (the last 64), in the order they connected."""
        return [Producer(*p) for p in self._core.producers()]

    @property
    def liveness_timeout(self):
        """Seconds a producer that was sending may stay silent before it is reported."""
        return self._core.liveness_timeout

    def recv(self, timeout=None):
        """The next datapoint, or ``None`` after ``timeout`` seconds (``None``: wait for
        ever; ``0``: only what has arrived). Malformed messages are handled as ``errors``
        says."""
        return self._core.next(timeout)

    def __iter__(self):
        if not self._guard.acquire(False):
            raise RuntimeError("This DataFlow is not reentrant!")
        try:
            while True:
                yield self._core.next(None)
        finally:
            self._guard.release()

    def close(self):
        self._core.close()

    def __repr__(self):
        core = self._core
        state = "closed" if core.closed else (
            f"receiving on {self.endpoint(0)}" if self.endpoint(0) else "not started (call reset_state())")
        return (f"<{type(self).__name__} {state}, received {self.cnt1}+{self.cnt2}, "
                f"rejected {self.rejected}>")


def _warn_rejected(message):
    warnings.warn(message, MalformedMessageWarning, stacklevel=3)


def _warn_silent(message):
    warnings.warn(message, ProducerSilentWarning, stacklevel=3)
