"""Batched policy inference for many actor processes.

Transports (all share one client API: ``client(td, timeout=None)``,
``client.submit(td, timeout=None).result(timeout=None)``):

* :class:`SharedMemoryTransport` -- fixed request/response layout; two preallocated
  shared-memory slot banks, only slot indices and control words cross processes. Any
  process can attach by name; clients pickle to that name (fork and spawn both work).
* :class:`SocketTransport` -- any structure, across processes, through tensorwire's wire
  codec over a Unix socket (the role of torchrl's ``MPTransport``).
* :class:`ThreadTransport` -- any structure, threads of one process.
* :class:`RemoteTransport` -- fixed layout, actors on other hosts, over UCX (TCP, or
  InfiniBand/RoCE where UCX finds it); clients from :func:`connect` pickle to their address.

:class:`InferenceServer` runs one thread that drains requests in batches and calls the
policy once per batch; the GIL is taken only for that call. The C++ core
(``tensorwire._C``) does the waiting, the copying and the batching.
"""
from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any

from . import _C
from ._C import ClosedError, TensorDict

__all__ = [
    "InferenceServer",
    "SharedMemoryTransport",
    "SocketTransport",
    "ThreadTransport",
    "RemoteTransport",
    "connect",
    "InferenceClient",
    "InferenceFuture",
]


def _is_tensordict(obj) -> bool:
    """True for a tensordict.TensorDictBase (without importing tensordict needlessly)."""
    td = sys.modules.get("tensordict")
    return td is not None and isinstance(obj, td.TensorDictBase)


def _client_for(kind: str, address: str) -> InferenceClient:
    return InferenceClient(_C._inference_client_for(kind, address))


def _remote_client(address: str, auth_key, liveness_timeout, timeout: float | None = 10.0,
                   connect_now: bool = False, port: int | None = None):
    c = InferenceClient(_C._remote_client(address, port, auth_key, liveness_timeout, timeout,
                                          connect_now))
    c._reconnect_with = (_remote_client, (address if port is None else f"{address}:{port}",
                                          auth_key, liveness_timeout, timeout))
    return c


def _this_host() -> tuple:
    """Which host and network this process is on: the boot and the network namespace.
    127.0.0.1 reaches the same servers wherever both are the same."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return boot, os.stat("/proc/self/ns/net").st_ino


def _loopback_client(address: str, auth_key, liveness_timeout, made_on: tuple):
    """A client of a transport listening on 0.0.0.0, unpickled: 127.0.0.1 is that
    transport only on the host (and network namespace) the client was made on."""
    if _this_host() != made_on:
        raise ValueError(
            f"this client of a RemoteTransport listening on 0.0.0.0 was made for "
            f"{address} on another host, where that address is this host's own: give "
            "RemoteTransport host= the address the actors reach it at, or make the client "
            "here with RemoteTransport.client_for('host:port')")
    c = _remote_client(address, auth_key, liveness_timeout)
    c._reconnect_with = (_loopback_client, (address, auth_key, liveness_timeout, made_on))
    return c


def connect(host: str, port: int, *, auth_key: str | bytes | None = None,
            liveness_timeout: float | None = None, timeout: float | None = 10.0) -> InferenceClient:
    """A client of the :class:`RemoteTransport` listening at ``host:port``, connected now.

    ``auth_key`` must be the server's (a wrong or missing one raises RuntimeError naming
    the refusal here, and the server refuses too). ConnectionRefusedError when nothing
    listens at ``host:port``. ``liveness_timeout``
    (seconds; default 10, or TENSORWIRE_LIVENESS_TIMEOUT; 0: off): a server silent for longer
    (its host or the link to it gone) makes every call raise ClosedError. The client pickles
    to its address (and key): unpickled in another process, it connects again from there.
    ``timeout``: seconds for each connection, this one and any later one (after a pickle),
    handshake included (None: no limit; TimeoutError, or ClosedError when the link broke,
    when it passes), as ``TensorDictPipe.connect``'s.
    """
    return _remote_client(host, auth_key, liveness_timeout, timeout, True, port=port)


class InferenceFuture:
    """One in-flight inference request (from ``client.submit``)."""

    __slots__ = ("_f", "_as_tensordict")

    def __init__(self, future, as_tensordict: bool):
        self._f = future
        self._as_tensordict = as_tensordict

    def done(self) -> bool:
        """True when result() would not block."""
        return self._f.done()

    def result(self, timeout: float | None = None):
        """The response. ``timeout`` in seconds (None: no limit, 0: poll). On TimeoutError
        or KeyboardInterrupt the request stays in flight: call result() again."""
        r = self._f.result(timeout)
        return r.to_tensordict() if self._as_tensordict else r

    def __repr__(self) -> str:
        return f"<InferenceFuture {self._f.state}>"


class InferenceClient:
    """Submits single requests to an inference server; picklable by transport name.

    A request is a tensorwire.TensorDict, a tensordict.TensorDict (the response is one
    too) or a dict of arrays; anything else is a TypeError. ``timeout`` (seconds) means
    the same everywhere: None waits for ever, 0 polls once, negative or NaN is a
    ValueError. ``close()`` disconnects the client: later calls raise ClosedError.
    """

    __slots__ = ("_c", "_reconnect_with", "__weakref__")
    _future = InferenceFuture  # what submit() returns (a drop-in's client may refine it)

    def __init__(self, client):
        self._c = client
        self._reconnect_with = None  # a remote client's pickle: (function, arguments)

    def __call__(self, td, timeout: float | None = None):
        """Submits ``td`` and waits for its response (interruptible by Ctrl-C)."""
        if type(td) is TensorDict or not _is_tensordict(td):
            return self._c(td, timeout)
        return self._c(td, timeout).to_tensordict()

    def submit(self, td, timeout: float | None = None) -> InferenceFuture:
        """Submits ``td`` and returns its future; ``timeout`` bounds the wait for a free slot."""
        if type(td) is TensorDict or not _is_tensordict(td):
            return self._future(self._c.submit(td, timeout), False)
        return self._future(self._c.submit(td, timeout), True)

    def close(self) -> None:
        self._c.close()

    kind = property(lambda self: self._c.kind, doc="The transport's kind.")
    address = property(lambda self: self._c.address,
                       doc="The name other processes attach to ('' for a thread transport).")

    def __reduce__(self):
        if self._reconnect_with is not None:
            return self._reconnect_with
        if not self.address:
            raise TypeError(f"a {self.kind} transport client cannot leave its process (use a "
                            "SharedMemoryTransport or SocketTransport)")
        return (_client_for, (self.kind, self.address))

    def __repr__(self) -> str:
        where = f" {self.address!r}" if self.address else ""
        return f"<InferenceClient {self.kind}{where}>"


def _is_torch_module(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


class _Transport:
    """What every transport offers: ``client()`` and, for the server, ``_impl``."""

    _impl: Any = None  # the extension's transport (tensorwire._C), set by each subclass
    _tensordict_specs = False
    _response_keys = None

    def client(self) -> InferenceClient:
        """A new client. Clients are independent; each may be shared by threads."""
        return InferenceClient(self._impl.client())

    def close(self) -> None:
        """Closes the transport: requests not yet served fail with ClosedError, and every
        later submit, ``client()`` and server start raise ClosedError."""
        self._impl.close()

    @property
    def closed(self) -> bool:
        return self._impl.closed

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        name = getattr(self._impl, "name", None)
        return f"<{type(self).__name__}{f' {name!r}' if name else ''} {state}>"

    def clients(self, num_clients: int) -> list:
        """``num_clients`` new clients (at least 1)."""
        return [InferenceClient(c) for c in self._impl.clients(num_clients)]

    @property
    def kind(self) -> str:
        return self._impl.kind


class _FixedLayout(_Transport):
    """What the transports with a bank of slots of one layout (shared-memory, remote) share."""

    num_slots = property(lambda self: self._impl.num_slots)
    slots_in_use = property(lambda self: self._impl.slots_in_use)
    request_keys = property(lambda self: self._impl.request_keys)
    response_keys = property(lambda self: self._impl.response_keys)
    request_spec = property(lambda self: self._impl.request_spec)
    response_spec = property(lambda self: self._impl.response_spec)


class SharedMemoryTransport(_FixedLayout):
    """Requests and responses in two preallocated shared-memory slot banks.

    Args:
        request_spec, response_spec: a representative single request / response
            (tensorwire or tensordict TensorDict, or a dict of arrays): keys, shapes,
            dtypes and batch size define the slot layout. Tensor leaves only (TypeError
            otherwise), at least one (ValueError), on the CPU (ValueError).
        num_slots: requests in flight across all clients; ``submit`` blocks while all are
            taken (with a timeout: TimeoutError).
        copy_result: ``False`` returns views of the response slot, valid until a later
            request reuses the slot (read or copy them before submitting again), locked.
        name: the abstract socket name other processes attach to (default: unique).
        spin: the most pause iterations a waiter spins before sleeping on a futex.
        allowed_uids: users admitted besides this process's own. Every attaching process's
            uid is checked (the socket is abstract: it has no file permissions); one of
            another user gets a PermissionError before any memory is shared with it, and
            ``refused`` counts it here.

    Only declared keys travel: extra keys are dropped, a missing one raises KeyError, a
    leaf of the wrong shape or dtype raises ValueError naming the key, expected and given.
    The memory is anonymous (memfd passed over a Unix socket): nothing appears in
    /dev/shm and nothing is left behind when any process exits, however it exits.
    """

    def __init__(self, request_spec, response_spec, *, num_slots: int, copy_result: bool = True,
                 name: str | None = None, spin: int | None = None, allowed_uids=()):
        self._tensordict_specs = _is_tensordict(request_spec)
        self._impl = _C._SharedMemoryTransport.create(
            request_spec, response_spec, num_slots, bool(copy_result), name, spin, allowed_uids)
        self._response_keys = self._impl.response_keys

    @classmethod
    def attach(cls, name: str, timeout: float = 5.0) -> "SharedMemoryTransport":
        """The transport another process created under ``name``; it makes clients only."""
        self = cls.__new__(cls)
        self._impl = _C._SharedMemoryTransport.attach(name, timeout)
        self._response_keys = self._impl.response_keys
        return self

    @staticmethod
    def client_for(name: str) -> InferenceClient:
        """A client of the transport named ``name``, connecting on first use."""
        return _client_for("shared_memory", name)

    def __reduce__(self):
        return (SharedMemoryTransport.attach, (self.name,))

    name = property(lambda self: self._impl.name, doc="The name other processes attach to.")
    refused = property(lambda self: self._impl.refused,
                       doc="Attachments refused: their user is not admitted (see allowed_uids), or "
                       "no file descriptor was left to admit them.")
    last_refusal = property(lambda self: self._impl.last_refusal,
                            doc="Why the last attachment was refused ('' when none was).")
    copy_result = property(lambda self: self._impl.copy_result)
    is_owner = property(lambda self: self._impl.is_owner, doc="True in the creating process.")

    @property
    def sizes(self) -> dict:
        """Bytes of the control area and of each bank."""
        control, requests, responses = self._impl._sizes
        return {"control": control, "requests": requests, "responses": responses,
                "total": control + requests + responses}


class SocketTransport(_Transport):
    """Requests of any structure from any process, over a Unix socket (wire codec)."""

    def __init__(self, *, name: str | None = None, allowed_uids=()):
        """``allowed_uids``: users admitted besides this process's own. Every connection's
        uid is checked (the socket is abstract: it has no file permissions); a client of
        another user gets a PermissionError, and ``refused`` counts it here."""
        self._impl = _C._SocketTransport.create(name, allowed_uids)

    @staticmethod
    def client_for(name: str) -> InferenceClient:
        return _client_for("socket", name)

    name = property(lambda self: self._impl.name)
    refused = property(lambda self: self._impl.refused,
                       doc="Connections refused: their user is not admitted (see allowed_uids).")
    last_refusal = property(lambda self: self._impl.last_refusal,
                            doc="Why the last connection was refused ('' when none was).")


class ThreadTransport(_Transport):
    """Requests of any structure from threads of this process."""

    def __init__(self):
        self._impl = _C._ThreadTransport.create()


class RemoteTransport(_FixedLayout):
    """Requests from actors on other hosts, over UCX, into a bank of ``num_slots`` slots.

    Args:
        request_spec, response_spec: as for :class:`SharedMemoryTransport`: fixed keys,
            shapes and dtypes, validated by the same rules with the same errors.
        num_slots: requests in flight across all remote clients.
        port, host: where to listen (``port=0``: any free port, see ``port``).
        auth_key: a shared key both sides prove (HMAC challenge-response; the key never
            crosses the wire), str or bytes as for a pipe (an empty one is refused); a
            client with a wrong or no key is refused on both sides.
            **Without a key anyone who reaches the port can submit requests and read
            responses: use it on trusted networks only.** With one, bytes crafted in
            UCX's own connection format still abort the server before the key is
            checked (docs/reliability.md): keep the port off untrusted networks.
        liveness_timeout: seconds after which a silent client (its host or link gone) is
            dropped, its requests discarded and its slots freed (default 10, or
            TENSORWIRE_LIVENESS_TIMEOUT; 0: off).

    A request is received by UCX straight into a free slot; only raw leaf bytes of the
    declared size cross the network after the handshake, nothing received is unpickled, and a
    peer sending a message of the wrong size (or a malformed frame) is disconnected with an
    error naming the rule, without any slot written. ``UCX_TLS`` selects UCX's transports, as
    for the pipe. Clients: ``transport.client()`` here, :func:`connect` or
    ``RemoteTransport.client_for("host:port", auth_key=...)`` anywhere.
    """

    def __init__(self, request_spec, response_spec, *, num_slots: int, port: int = 0,
                 host: str = "0.0.0.0", auth_key: str | bytes | None = None,
                 liveness_timeout: float | None = None):
        self._tensordict_specs = _is_tensordict(request_spec)
        self._auth_key, self._liveness = auth_key, liveness_timeout
        self._impl = _C._RemoteTransport.create(request_spec, response_spec, num_slots, host,
                                                port, auth_key, liveness_timeout)
        self._response_keys = self._impl.response_keys

    def client(self) -> InferenceClient:
        """A client connecting over UCX to this transport (on first use), at :attr:`address`.

        Listening on 0.0.0.0 (the default), that is 127.0.0.1: the client pickles to
        processes of this host only, and unpickled on another host it raises ValueError
        (127.0.0.1 there is another machine). For actors on other hosts, give ``host=`` the
        address they reach this one at, or make their clients with :meth:`client_for`."""
        if self.closed:
            return InferenceClient(self._impl.client())  # raises ClosedError
        if self._impl.host == "0.0.0.0":  # reached at 127.0.0.1: on this host only
            return _loopback_client(self.address, self._auth_key, self._liveness, _this_host())
        return _remote_client(self.address, self._auth_key, self._liveness)

    def clients(self, num_clients: int) -> list:
        """``num_clients`` new clients (at least 1), each picklable as ``client()``'s."""
        # The transport's own clients check the count (and that it is open); they connect on
        # first use, so making and dropping them costs nothing.
        return [self.client() for _ in super().clients(num_clients)]

    @staticmethod
    def client_for(address: str, *, auth_key: str | bytes | None = None,
                   liveness_timeout: float | None = None,
                   timeout: float | None = 10.0) -> InferenceClient:
        """A client of the transport at ``"host:port"``, connecting on first use (the
        arguments are :func:`connect`'s)."""
        return _remote_client(address, auth_key, liveness_timeout, timeout)

    @property
    def address(self) -> str:
        """``"host:port"`` for clients of this host (127.0.0.1 when listening on 0.0.0.0)."""
        host = "127.0.0.1" if self._impl.host == "0.0.0.0" else self._impl.host
        return f"{host}:{self._impl.port}"

    port = property(lambda self: self._impl.port, doc="The port it listens on.")
    host = property(lambda self: self._impl.host, doc="The address it listens on.")
    connected = property(lambda self: self._impl.connected, doc="Clients connected now.")
    refused = property(lambda self: self._impl.refused,
                       doc="Connections refused or dropped for breaking the protocol, "
                           "or for stalling in their handshake.")
    last_refusal = property(lambda self: self._impl.last_refusal)


def _make_adapter(policy, input_type: str | None, tensordict_specs: bool):
    """The callable the C++ server invokes (with the GIL) once per batch; the C++ server
    converts what it returns (a TensorDict, tensorwire or tensordict) to the response."""
    if input_type not in (None, "tensorwire", "tensordict"):
        raise ValueError(f"input_type must be None, 'tensorwire' or 'tensordict', got {input_type!r}")
    if input_type is None:
        input_type = "tensordict" if (_is_torch_module(policy) or tensordict_specs) else "tensorwire"
    if input_type == "tensorwire":
        def adapter(batch):
            out = policy(batch)
            if out is None:
                raise TypeError("the policy returned None; it must return a TensorDict")
            return out
        return adapter

    import tensordict
    import torch

    def adapter(batch):
        td = tensordict.TensorDict(batch.torch(), batch_size=batch.batch_size)
        with torch.no_grad():
            out = policy(td)
        return td if out is None else out  # None: a module that wrote into its input
    return adapter


def _response_keys(transports: list):
    """The response keys all transports declare, or None (the policy's output as it is)."""
    keys = transports[0]._response_keys if transports else None
    return None if any(t._response_keys != keys for t in transports) else keys


_STATS = ("requests", "batches", "requests_per_s", "batches_per_s", "avg_batch_size",
          "p50_queue_ms", "p95_queue_ms", "p50_forward_ms", "p95_forward_ms", "policy_version",
          "weight_updates")

_live_servers: "weakref.WeakSet[InferenceServer]" = weakref.WeakSet()
# Started servers, held until shutdown() or close(), as a started threading.Thread is: a
# server started by a helper that drops it (`InferenceServer(...).start()`) goes on serving
# instead of being shut down by the garbage collector under its clients.
_serving: "set[InferenceServer]" = set()


@atexit.register
def _shutdown_all():  # the serving threads must not outlive the interpreter
    for server in list(_live_servers):
        server.shutdown(timeout=1.0)


class InferenceServer:
    """Serves a policy to the clients of a transport, in batches.

    Args:
        policy: a callable taking and returning a TensorDict (tensorwire or tensordict), a
            ``torch.nn.Module`` or a ``tensordict.nn.TensorDictModule``. It gets a
            tensordict.TensorDict when it is a torch module or the transport was built
            from tensordict specs (``input_type`` overrides), a tensorwire TensorDict
            otherwise; torch modules run under ``torch.no_grad()``.
        transport: a SharedMemoryTransport (created in this process), SocketTransport,
            ThreadTransport or RemoteTransport, or a list of them: local and remote actors
            then share batches (requests of one structure share one policy call, each
            answer goes back by its own transport; every transport gets its share of each
            batch, and the timeout applies to all).
        max_batch_size, min_batch_size, timeout: the batching rule (torchrl's): drain up
            to ``max_batch_size`` (at most 2**24, the most requests a transport holds in
            flight); below ``min_batch_size`` keep draining for up to ``timeout`` seconds.
        min_transport_share: with several transports, the share of the requests (0 to 1,
            at most an equal share each) that each transport whose actors are asking keeps:
            a batch waits for one below it, up to ``timeout`` and a few of its usual
            intervals. 0 (the default): a batch leaves with what is there, the most
            throughput, and actors with a shorter round trip (local ones) get more. Meant
            for actors that call in a loop (docs/inference.md, "Several transports").
        policy_version, policy_version_key: responses get the policy version under this
            key (for a SharedMemoryTransport only when its response spec declares it).

    An exception raised by the policy fails every request of its batch: clients raise
    the same exception type when it is a builtin or a class of a module the client has
    imported already, ``RuntimeError("module.Type: message")`` otherwise.
    """

    def __init__(self, policy, transport: _Transport, *, max_batch_size: int = 64,
                 min_batch_size: int = 1, timeout: float = 0.01, min_transport_share: float = 0.0,
                 stats_window_size: int = 1024,
                 policy_version: int = 0, policy_version_key="policy_version",
                 input_type: str | None = None):
        if not callable(policy):
            raise TypeError(f"policy must be callable (a function, a torch.nn.Module, ...) taking and "
                            f"returning a TensorDict, got {type(policy).__name__}")
        transports = list(transport) if isinstance(transport, (list, tuple)) else [transport]
        for t in transports:
            if not isinstance(t, _Transport):
                raise TypeError(f"transport must be a tensorwire transport or a list of them, got "
                                f"{type(t).__name__}")
        transport = transports[0] if transports else None
        if not (policy_version_key is None or isinstance(policy_version_key, str) or (
                isinstance(policy_version_key, tuple) and policy_version_key
                and all(isinstance(k, str) for k in policy_version_key))):
            raise TypeError("policy_version_key must be None, a str or a non-empty tuple of str, "
                            f"got {policy_version_key!r}")
        self.policy = policy
        self.transport = transport  # the first one (client() comes from it)
        self.transports = transports
        self.max_batch_size = max_batch_size
        self.min_batch_size = min_batch_size
        self.timeout = timeout
        self.min_transport_share = min_transport_share
        # The C++ server holds the adapter weakly (see inference_py.cpp): keep it here.
        self._adapter = _make_adapter(policy, input_type,
                                      any(t._tensordict_specs for t in transports))
        self._server = _C._InferenceServer(
            self._adapter, _response_keys(transports), [t._impl for t in transports],
            max_batch_size, min_batch_size, timeout, min_transport_share, stats_window_size,
            policy_version_key, policy_version)
        _live_servers.add(self)

    def start(self) -> "InferenceServer":
        """Starts the serving thread (RuntimeError when already running). The server is
        then kept alive until ``shutdown()`` or ``close()``, as a started thread is."""
        self._server.start()
        _serving.add(self)
        return self

    def shutdown(self, timeout: float | None = 5.0) -> bool:
        """Stops serving: pending requests fail with RuntimeError, later submits too.

        Waits up to ``timeout`` seconds for a policy call in progress; returns whether the
        serving thread stopped in time.
        """
        _serving.discard(self)
        return self._server.shutdown(timeout)

    @property
    def is_alive(self) -> bool:
        return self._server.is_alive

    @property
    def policy_version(self) -> int:
        return self._server.policy_version

    def update_model(self, fn, *, mark_weight_update: bool = True, timeout: float | None = None):
        """Runs ``fn(policy)`` between batches and, by default, bumps the policy version.

        Waits up to ``timeout`` seconds (None: for ever; Ctrl-C ends the wait) for a policy
        call in progress; TimeoutError when it still runs then, with ``fn`` not run.
        """
        if not callable(fn):
            raise TypeError(f"update_model: fn must be callable as fn(policy), got {type(fn).__name__}")
        return self._server.update_model(lambda: fn(self.policy), mark_weight_update, timeout)

    def stats(self, *, reset: bool = False) -> dict:
        """requests, batches, requests_per_s, batches_per_s, avg_batch_size, p50/p95
        queue and forward times (ms), policy_version, weight_updates."""
        return dict(zip(_STATS, self._server.stats(reset)))

    def client(self) -> InferenceClient:
        return self.transport.client()

    def clients(self, num_clients: int) -> list:
        return self.transport.clients(num_clients)

    def close(self) -> None:
        """Shuts down (if running) and releases the server: every later use raises ClosedError.
        Waits for a policy call in progress; Ctrl-C interrupts the wait (KeyboardInterrupt),
        leaving the server stopping: call close() again to finish."""
        self._server.close()
        _live_servers.discard(self)  # nothing left for the exit hook to shut down
        _serving.discard(self)

    def __repr__(self) -> str:
        state = "closed" if self._server.is_closed else "running" if self.is_alive else "stopped"
        return f"<InferenceServer {state} on {self.transport!r} max_batch_size={self.max_batch_size}>"

    def __enter__(self) -> "InferenceServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def __del__(self):
        server = getattr(self, "_server", None)
        if server is not None and server.is_alive:
            server.shutdown(1.0)
