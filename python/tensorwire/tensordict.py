"""Drop-in replacement for tensordict's UCXX pipe: change the import, keep the code.

    from tensordict._ucxx import TensorDictPipe, TensorDictServer      # before
    from tensorwire.tensordict import TensorDictPipe, TensorDictServer  # after

Same signatures and semantics (``await TensorDictPipe.connect(host, port)``, ``listen``,
``send``/``recv``/``asend``/``arecv``, ``async for``, ``TensorDictServer(port).serve``),
tensordict.TensorDict in and out. Received leaves are torch tensors viewing the received
storage, and a steady-state consolidated receive returns the same object, as in
tensordict. The classes subclass tensordict's, so ``td.send(pipe)`` / ``td.recv(pipe)``
dispatch here. Differences, all on the safe side: headers are validated (a bad message
raises instead of corrupting), a dead peer raises within seconds, sync calls made from a
running event loop raise instead of deadlocking, and ``auth_key=`` is available.
``TensorDictServer.close()`` also closes the pipes it handed out and cancels their handlers
(tensordict's only stops accepting): close the server once its clients are done. A
``LazyStackedTensorDict`` goes out dense and arrives as a TensorDict; one whose members
differ in shape is a ValueError saying so (send its members one by one, or pad them).
"""
from __future__ import annotations

from typing import Optional

from tensordict import LazyStackedTensorDict, TensorDictBase, is_tensorclass
from tensordict._reductions import _rebuild_tensordict_files_consolidated
from tensordict._ucxx import TensorDictPipe as _ReferencePipe
from tensordict._ucxx import TensorDictServer as _ReferenceServer

from . import _C
from . import pipe as _pipe

__all__ = ["TensorDictPipe", "TensorDictServer"]


class TensorDictPipe(_ReferencePipe):
    def __init__(self, impl: "_pipe.TensorDictPipe"):  # noqa: D401  (built by connect/listen)
        # tensordict's __init__ expects a UCXX endpoint: not called on purpose.
        self._tw = impl
        self._consolidated = impl.consolidated
        self._out_cache: tuple = (None, None, None)  # (tensordict storage, metadata, tensorwire td)
        self._in_cache: tuple = (None, None)  # (tensorwire td received, tensordict td)
        self._in_flight = None  # the tensorwire td of a send not finished (timed out, cancelled)
        self._in_flight_td = None  # the dict it was made from

    @classmethod
    async def connect(cls, host: str, port: int, *, consolidated: bool = True,
                      auth_key: Optional[str] = None) -> "TensorDictPipe":
        return cls(await _pipe.TensorDictPipe.aconnect(host, port, consolidated=consolidated, auth_key=auth_key))

    @classmethod
    async def listen(cls, port: int, *, consolidated: bool = True, auth_key: Optional[str] = None,
                     on_listening=None) -> "TensorDictPipe":
        return cls(await _pipe.TensorDictPipe.alisten(port, consolidated=consolidated, auth_key=auth_key,
                                                      on_listening=on_listening))

    # -- conversions ------------------------------------------------------------
    def _to_wire(self, td: TensorDictBase):
        if is_tensorclass(td):  # its TensorDict goes, as tensordict's pipe sends it
            td = td._tensordict
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"expected a tensordict.TensorDict, got {type(td).__name__}")
        lazy = isinstance(td, LazyStackedTensorDict)
        if self._consolidated and td.is_consolidated() and not lazy:
            storage = td._consolidated["storage"]
            metadata = td._consolidated["metadata"]
            cached_storage, cached_meta, cached = self._out_cache
            if storage is cached_storage and metadata is cached_meta:
                return cached  # the same consolidated dict again: no work at all
            tw = _C._from_consolidated(storage, metadata)
            self._out_cache = (storage, metadata, tw)
            return tw
        try:
            return _C.TensorDict.from_tensordict(td)
        except RuntimeError as e:  # tensordict's own "Failed to stack tensors ..."
            if not lazy:
                raise
            raise ValueError(
                "a LazyStackedTensorDict whose members differ in shape cannot be sent: the "
                "pipe sends one dense TensorDict (send the members one by one, or pad them)"
            ) from e

    def _from_wire(self, tw) -> TensorDictBase:
        received, converted = self._in_cache
        if tw is received:
            return converted  # steady state: same object, storage rewritten in place
        out = None
        if self._consolidated and tw.is_consolidated():
            try:
                out = _rebuild_tensordict_files_consolidated(tw.metadata, _C_storage_as_torch(tw))
            except KeyError as e:
                # A dtype tensordict's table lacks (torch.float8_*: its own consolidate()
                # refuses them too): such a dict comes as tensordict can hold it, unconsolidated.
                if not (e.args and str(e.args[0]).startswith("torch.")):
                    raise
        if out is None:
            out = tw.to_tensordict()
        self._in_cache = (tw, out) if self._consolidated else (None, None)
        return out

    # -- data -------------------------------------------------------------------
    async def asend(self, td: TensorDictBase) -> None:
        wire = self._in_flight = self._to_send(td)
        await self._tw.asend(wire)
        self._in_flight = None

    def send(self, td: TensorDictBase) -> None:
        wire = self._in_flight = self._to_send(td)
        self._tw.send(wire)
        self._in_flight = None

    def _to_send(self, td: TensorDictBase):
        """The conversion the send in flight was given when ``td`` is its dict with the same
        leaves (a retry after a timeout or a cancelled asend finishes it instead of sending
        it twice), else a new one."""
        wire = self._to_wire(td)
        pending = self._in_flight
        if pending is not None and pending is not wire and self._in_flight_td is td and \
                wire._same_views(pending):
            return pending
        self._in_flight_td = td
        return wire

    async def arecv(self, td: Optional[TensorDictBase] = None, *, device=None) -> TensorDictBase:
        got = await self._tw.arecv(self._into(td), device=device)
        return td if td is not None and self._received_into(td, got) else self._from_wire(got)

    def recv(self, td: Optional[TensorDictBase] = None, *, device=None) -> TensorDictBase:
        got = self._tw.recv(self._into(td), device=device)
        return td if td is not None and self._received_into(td, got) else self._from_wire(got)

    def _into(self, td):
        """A caller's consolidated tensordict as a tensorwire view of the same storage."""
        if td is None or not self._consolidated or not td.is_consolidated():
            return None
        self._into_pair = (td, _C._from_consolidated(td._consolidated["storage"], td._consolidated["metadata"]))
        return self._into_pair[1]

    def _received_into(self, td, got) -> bool:
        pair = getattr(self, "_into_pair", None)
        return pair is not None and pair[0] is td and pair[1] is got

    # -- lifetime ---------------------------------------------------------------
    async def aclose(self) -> None:
        await self._tw.aclose()

    def close(self) -> None:
        self._tw.close()

    @property
    def closed(self) -> bool:
        return self._tw.closed

    async def __anext__(self) -> TensorDictBase:
        if self.closed:
            raise StopAsyncIteration
        try:
            return await self.arecv()
        except _C.ClosedError:
            # The end of the peer's stream, or this pipe closed here (by another task):
            # the loop ends. A peer that died raises.
            if self._tw.closed_by_peer or self._tw.closed:
                raise StopAsyncIteration from None
            raise

    def __del__(self) -> None:
        tw = getattr(self, "_tw", None)
        if tw is not None and not tw.closed:
            tw.close()


class TensorDictServer(_ReferenceServer):
    def __init__(self, port: int, *, consolidated: bool = True, auth_key: Optional[str] = None):
        self._server = _pipe.TensorDictServer(port, consolidated=consolidated, auth_key=auth_key)
        self._consolidated = consolidated
        self._closed = False

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def handler_errors(self) -> list:
        return self._server.handler_errors

    async def serve(self, on_connect) -> None:
        async def handler(pipe):
            await on_connect(TensorDictPipe(pipe))
        await self._server.serve(handler)

    async def __aiter__(self):
        async for pipe in self._server:
            yield TensorDictPipe(pipe)

    def close(self) -> None:
        self._closed = True
        self._server.close()

    async def aclose(self) -> None:
        self.close()


def _C_storage_as_torch(tw):
    import torch

    return torch.from_numpy(tw.storage)
