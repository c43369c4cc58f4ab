"""Drop-ins for torchrl's inference transports, on tensorwire's slot banks.

``tensorwire.torchrl.SharedMemoryTransport`` implements torchrl's
``InferenceTransport`` interface (``submit``, ``drain``, ``wait_for_work``, ``resolve``,
``resolve_exception``, ``client``; plus ``drain_with_timing``) with tensordict.TensorDict
in and out, so torchrl's own ``InferenceServer`` runs on it unchanged::

    from torchrl.modules.inference_server import InferenceServer
    from tensorwire.torchrl import SharedMemoryTransport

    transport = SharedMemoryTransport(request_spec, response_spec, num_slots=8)
    client = transport.client()  # picklable: hand it to spawned or forked actors
    with InferenceServer(policy, transport, max_batch_size=8):
        action = client(TensorDict({"observation": obs}))["action"]

What changes against torchrl's own transport: requests and responses cross processes
through shared memory with futex wake-ups instead of ``multiprocessing`` queues; clients
can also be made after the actors start (``SharedMemoryTransport.client_for(name)``);
a dropped future gives its slot back; a dead actor's slots are reclaimed. As in torchrl,
whose ``update_`` copies into the slots, a request or response leaf of another dtype or a
broadcastable shape (``(1,)``, a scalar) is cast and broadcast to its spec's (RuntimeError
for one that does not broadcast). A request of the spec's dtypes and shapes takes the fast
path; a mended one is converted once more (about 50 us a request here: send the spec's
dtype, e.g. ``obs.float()``, where that counts), and once a client's request needed
mending, its next ones are mended before they are sent. A timeout raises
:class:`RequestTimeout`, both the ``queue.Empty`` torchrl raises and a ``TimeoutError``.
The transport serves from the process that created it, so torchrl's
``service_backend="process"`` is refused with a TypeError saying so. A policy's exception
comes back as its type made again from its message (torchrl passes the object itself),
where the client's process has imported that type's module and the type can be made from
the message alone, and as ``RuntimeError("module.Type: message")`` otherwise (a
``UnicodeDecodeError``, a ``json.JSONDecodeError``, a class whose constructor needs more
arguments); ``remote_type`` names the type either way.

``tensorwire.torchrl.RemoteTransport`` is the same for actors on other hosts (tensorwire's
:class:`~tensorwire.inference.RemoteTransport`, over UCX): torchrl's ``InferenceServer``
serves it unchanged, and its clients (``transport.client()``,
``RemoteTransport.client_for("host:port", auth_key=...)``) pickle to their address
(``transport.client()`` of one listening on 0.0.0.0, the default, is for this host only:
give ``host=`` the address the actors reach it at).

torchrl is needed only when this module is imported.
"""
from __future__ import annotations

import itertools
import queue

import tensordict
import torch
from torchrl.modules.inference_server import InferenceTransport

from . import inference as _inference

__all__ = ["SharedMemoryTransport", "RemoteTransport", "RequestTimeout"]


class RequestTimeout(TimeoutError, queue.Empty):
    """A request not answered in time: a TimeoutError, and the ``queue.Empty`` torchrl's
    clients raise, so code written for either catches it."""


def _mended(value, dtype, shape):
    """``value`` cast and broadcast to a spec leaf's ``dtype`` and ``shape``, as torch's
    ``copy_`` into that leaf (torchrl's ``update_``) does: RuntimeError when it does not
    broadcast. None when it already matches, or is no tensor (a check of its own refuses it)."""
    if not isinstance(value, torch.Tensor) or (value.dtype == dtype and value.shape == shape):
        return None
    return value.to(dtype).expand(shape)


def _timed_out(e: TimeoutError) -> RequestTimeout:
    return e if isinstance(e, RequestTimeout) else RequestTimeout(*e.args)


class _Future(_inference.InferenceFuture):
    """A future whose timeout is a :class:`RequestTimeout`."""

    __slots__ = ()

    def result(self, timeout: float | None = None):
        try:
            return super().result(timeout)
        except TimeoutError as e:  # the request stays in flight: result() may be called again
            raise _timed_out(e) from None


class _Client(_inference.InferenceClient):
    """A client as torchrl's: ``client_id`` numbers a transport's clients from 0, in the
    order ``client()`` made them (None for one made by ``client_for``), and travels with
    the client when it is pickled; a request leaf of another dtype or a broadcastable shape
    is cast and broadcast to the request spec's, as torchrl's ``update_`` into the slot does
    (RuntimeError when it does not broadcast); a timeout is a :class:`RequestTimeout`."""

    __slots__ = ("client_id", "_layout", "_mend")
    client_id: int | None
    _layout: dict | None  # key -> (torch dtype, shape) of the request spec, once needed
    _mend: bool  # a request needed mending: mend the next ones first (a float64 env's do)

    _future = _Future

    # The fast path is the base class's call in a try: a request the spec takes pays one
    # Python frame. Everything else is _slow's.
    def __call__(self, td, timeout: float | None = None):
        if not self._mend:
            try:
                return super().__call__(td, timeout)
            except (ValueError, TimeoutError) as e:
                return self._slow(td, timeout, False, e)
        return self._slow(td, timeout, False)

    def submit(self, td, timeout: float | None = None):
        if not self._mend:
            try:
                return super().submit(td, timeout)
            except (ValueError, TimeoutError) as e:  # TimeoutError: no free slot in time
                return self._slow(td, timeout, True, e)
        return self._slow(td, timeout, True)

    def _slow(self, td, timeout, submit: bool, refused: Exception | None = None):
        """A request the fast path refused (``refused``), or one of a client whose requests
        needed mending (these are mended before they are sent instead of after a refusal):
        sent mended when a leaf's dtype or shape differs from the spec's, else sent as it
        is, or its refusal raised as it was."""
        if isinstance(refused, TimeoutError):
            raise _timed_out(refused) from None
        conformed = self._conformed(td, timeout)
        if conformed is not None:
            self._mend = True
            return self._send(conformed, timeout, submit)
        if refused is not None:  # refused for another reason than a leaf's dtype or shape
            raise refused
        try:  # as the fast path, with no second mending
            return super().submit(td, timeout) if submit else super().__call__(td, timeout)
        except TimeoutError as e:
            raise _timed_out(e) from None

    def _send(self, conformed: dict, timeout, submit: bool):
        try:
            if submit:
                return _Future(self._c.submit(conformed, timeout), True)
            return self._c(conformed, timeout).to_tensordict()
        except TimeoutError as e:
            raise _timed_out(e) from None

    def _conformed(self, td, timeout):
        """The request spec's leaves of ``td`` as a nested dict, each cast and broadcast to
        the spec's dtype and shape (the caller's dict is left as it is), or None when no
        leaf differs in dtype or shape (the refusal was for another reason)."""
        if not isinstance(td, tensordict.TensorDictBase):
            return None
        if self._layout is None:
            if timeout is not None and not timeout >= 0:
                return None  # the refusal was the timeout's (negative or NaN)
            try:  # connected by now when the refusal was the spec's; never connect here
                leaves = self._c._request_leaves(0)
            except Exception:
                return None
            if leaves is None:
                return None
            self._layout = {key: (getattr(torch, dtype.removeprefix("torch.")), shape)
                            for key, dtype, shape in leaves}
        out: dict = {}
        changed = False
        for key, (dtype, shape) in self._layout.items():
            value = td.get(key, None)
            if value is None:
                return None  # a missing key is a KeyError, not ours to mend
            mended = _mended(value, dtype, shape)
            if mended is not None:
                value, changed = mended, True
            *parents, leaf = (key,) if isinstance(key, str) else key
            node = out
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        return out if changed else None

    def __reduce__(self):
        return (_numbered_again, (super().__reduce__(), self.client_id))


def _numbered(client: _inference.InferenceClient, client_id: int | None) -> _Client:
    c = _Client.__new__(_Client)
    c._c, c._reconnect_with = client._c, client._reconnect_with
    c.client_id, c._layout, c._mend = client_id, None, False
    return c


def _numbered_again(reduced, client_id: int | None) -> _Client:
    make, args = reduced
    return _numbered(make(*args), client_id)


class _SlotBankTransport(InferenceTransport):
    """torchrl's server side over a tensorwire fixed-layout transport (``self._tw``)."""

    def _adopt(self, tw_transport) -> None:
        self._tw = tw_transport
        self._impl = tw_transport._impl
        self._request_batch = tuple(self._impl.request_spec.batch_size)
        self._default_client: _Client | None = None
        self._client_ids = itertools.count()  # next() is atomic under the GIL
        # What a response leaf is cast to when the policy made another dtype: torchrl's
        # transports copy each response into place with update_, which casts and broadcasts.
        spec = self._impl.response_spec
        self._response_layout = {
            k: (v.dtype, tuple(v.shape))
            for k, v in ((k, spec.get_torch(k)) for k in spec.keys(True, True))}

    def client(self):
        """A client taking and returning tensordict.TensorDict; picklable. Its
        ``client_id`` is torchrl's: 0 for the first, then 1, 2, ..."""
        return _numbered(self._tw.client(), next(self._client_ids))

    def __reduce__(self):
        # What torchrl's service_backend="process" does with a transport: its server side
        # serves only in the process that made it.
        raise TypeError(
            f"tensorwire.torchrl.{type(self).__name__} cannot be pickled: it serves from the "
            "process that created it. Run torchrl's InferenceServer there (service_backend="
            "'thread', the default) and hand transport.client() to the actor processes")

    def submit(self, td):
        """Submits through a transport-wide client; returns a future."""
        client = self._default_client
        if client is None:  # a client as client()'s, outside the numbering
            client = self._default_client = _numbered(self._tw.client(), None)
        return client.submit(td)

    @property
    def num_slots(self) -> int:
        return self._tw.num_slots

    def close(self) -> None:
        """Closes the transport: pending requests and every later use raise ClosedError."""
        self._tw.close()

    @property
    def closed(self) -> bool:
        return self._tw.closed

    # -- server side (torchrl's InferenceServer calls these from its worker thread) -------

    def wait_for_work(self, timeout: float) -> None:
        self._impl._wait_for_work(max(float(timeout), 0.0))

    def drain_with_timing(self, max_items: int):
        drained = self._impl._drain(max_items)
        items, callbacks, submitted_at = [], [], []
        for slot, submitted in drained:
            row = self._impl._request_row(slot)
            # A tensordict over the slot's memory (zero-copy), unlocked so the model can
            # write its outputs into the collated batch.
            items.append(tensordict.TensorDict(row.torch(), batch_size=self._request_batch))
            callbacks.append(slot)
            submitted_at.append(submitted)
        return items, callbacks, submitted_at

    def drain(self, max_items: int):
        items, callbacks, _ = self.drain_with_timing(max_items)
        return items, callbacks

    def resolve(self, callback, result) -> None:
        cast = None
        for key, (dtype, shape) in self._response_layout.items():
            # A missing key is left to the slot's KeyError.
            mended = _mended(result.get(key, None), dtype, shape)
            if mended is not None:
                if cast is None:
                    cast = result.copy()  # the policy's own result is left as it is
                cast.set(key, mended)
        self._impl._resolve_one(callback, result if cast is None else cast)

    def resolve_exception(self, callback, exc: BaseException) -> None:
        self._impl._reject_one(callback, exc)


class RemoteTransport(_SlotBankTransport):
    """torchrl's InferenceTransport interface over tensorwire's RemoteTransport (UCX).

    Args as :class:`tensorwire.inference.RemoteTransport`: request_spec, response_spec,
    num_slots, port (0: any; see ``port``), host, auth_key (without one: trusted networks
    only), liveness_timeout. Nothing received from the network is unpickled.
    """

    def __init__(self, request_spec, response_spec, *, num_slots: int, port: int = 0,
                 host: str = "0.0.0.0", auth_key: str | None = None,
                 liveness_timeout: float | None = None):
        super().__init__()
        self._adopt(_inference.RemoteTransport(
            request_spec, response_spec, num_slots=num_slots, port=port, host=host,
            auth_key=auth_key, liveness_timeout=liveness_timeout))

    @staticmethod
    def client_for(address: str, *, auth_key: str | None = None,
                   liveness_timeout: float | None = None, timeout: float | None = 10.0):
        """A client of the transport at ``"host:port"`` (the arguments are
        :func:`tensorwire.inference.connect`'s), as ``client()``'s but with no client_id."""
        return _numbered(_inference.RemoteTransport.client_for(
            address, auth_key=auth_key, liveness_timeout=liveness_timeout, timeout=timeout), None)

    port = property(lambda self: self._tw.port)
    address = property(lambda self: self._tw.address)

    def __repr__(self) -> str:
        return f"<tensorwire.torchrl.RemoteTransport {self.address} {'closed' if self.closed else 'open'}>"


class SharedMemoryTransport(_SlotBankTransport):
    """torchrl's SharedMemoryTransport interface over tensorwire's shared-memory slots.

    Args:
        request_spec (tensordict.TensorDictBase): a representative single request.
        response_spec (tensordict.TensorDictBase): a representative single response
            (declare ``"policy_version"`` to receive the server's version stamp).
        num_slots (int): requests in flight across all clients.
        copy_result (bool): ``False`` returns views of the response slot.
        ctx: accepted for signature compatibility with torchrl and ignored (no
            multiprocessing queues are used).
    """

    def __init__(self, request_spec, response_spec, *, num_slots: int, ctx=None,
                 copy_result: bool = True, name: str | None = None):
        super().__init__()
        del ctx
        self._adopt(_inference.SharedMemoryTransport(
            request_spec, response_spec, num_slots=num_slots, copy_result=copy_result, name=name))

    @staticmethod
    def client_for(name: str):
        """A client of the transport named ``name``, as ``client()``'s but with no client_id."""
        return _numbered(_inference.SharedMemoryTransport.client_for(name), None)

    @property
    def name(self) -> str:
        return self._tw.name

    def __repr__(self) -> str:
        return f"<tensorwire.torchrl.SharedMemoryTransport {self.name!r} {'closed' if self.closed else 'open'}>"
