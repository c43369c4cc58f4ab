"""TensorDictPipe and TensorDictServer: stream TensorDicts between processes over UCX.

Blocking calls (``send``/``recv``) run in C++ with the GIL released. The ``a``-prefixed
coroutines are driven by UCX's wake-up file descriptor, registered with the running
asyncio loop (no polling thread, no busy loop); a peer on the same host is also watched
through a pidfd registered the same way, so its death ends a wait at once.

Without ``auth_key`` a pipe authenticates nothing: use it on trusted networks only. With
one, a listening port is still not for untrusted networks: UCX reads a connection's first
bytes before the key is checked, and bytes crafted in UCX's own format abort the process
(junk such as a port scanner's never reaches UCX; docs/reliability.md).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
import traceback
from typing import AsyncIterator, Awaitable, Callable, Optional

from . import _C
from ._C import ClosedError, TensorDict

__all__ = ["TensorDictPipe", "TensorDictServer", "PipeListener"]

_log = logging.getLogger("tensorwire")
_DEFAULT_MAX_MESSAGE = 16 << 30

# asend / arecv spin this long (microseconds, GIL released, event loop blocked) polling the
# pipe before they await its wake-up fd: a reply on one host arrives within a few
# microseconds, while a wake-up through the event loop costs tens. 0 awaits at once.
# Adaptive per pipe (_Spin): a pipe whose spins keep catching nothing stops spinning (but
# for an occasional probe), so a server with many slow clients does not block its loop.
ASYNC_SPIN_US = 50.0

# How long asend / arecv sleep when UCX will not arm the pipe's fd because sends wait for
# room the peer frees without a signal (TensorDictPipe._wait). The loop's selector rounds
# a timeout up to a millisecond.
_STALL_SLEEP_S = 0.001


class _Spin:
    """How long one pipe's asend / arecv spin before awaiting.

    Spinning pays off only when the other side answers within the spin. After
    ``OFF_AFTER`` spins in a row that caught nothing, the pipe stops spinning, except for
    one probe spin every ``PROBE_EVERY`` calls; the first spin that catches a message
    turns spinning back on. Decided from outcomes, not from measured wake-up times, which
    a loaded machine inflates."""

    OFF_AFTER = 8
    PROBE_EVERY = 16
    __slots__ = ("misses", "calls")

    def __init__(self):
        self.misses = 0
        self.calls = 0

    def budget(self) -> int:
        """Microseconds."""
        if self.misses < self.OFF_AFTER:
            return int(ASYNC_SPIN_US)
        self.calls += 1
        return int(ASYNC_SPIN_US) if self.calls % self.PROBE_EVERY == 0 else 0

    def outcome(self, spun: bool, caught: bool) -> None:
        if caught:
            self.misses = 0
        elif spun:
            self.misses += 1


def _check_sync(op: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{op}() called from a thread whose asyncio event loop is running; it would block the "
        f"loop (and deadlock if the peer is served by it): use `await pipe.a{op}()`")


def _running_here(loop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


_DETACH_WAIT_S = 5.0  # how long close() from another thread waits for the loop to detach
_LOOK_S = 5.0  # the longest aaccept() sleeps without a look at the listener (accept(0))


class _FdWaiter:
    """Wakes every coroutine waiting on a set of fds; one reader per fd, however many waiters."""

    def __init__(self, fds):
        self._fds = [fd for fd in fds if fd >= 0]
        self._waiters: set = set()
        self._loop = None
        self._pid = os.getpid()  # the process whose loop the readers are registered with
        self._closing: Optional[asyncio.Future] = None  # close_aside()'s close, while it runs

    def _own_loop(self):
        """The loop the fds are registered with, or None. In a forked child, that loop (and
        its epoll instance, which the child shares with its parent) is the parent's: it is
        forgotten without a remove_reader, which would unregister the parent's fds."""
        if self._loop is not None and self._pid != os.getpid():
            self._loop = None
            self._waiters = set()
        elif self._loop is not None and self._loop.is_closed():
            # Closed with our waiters pending (a fixture's loop torn down): its selector and
            # its futures are gone with it; nothing there to unregister or wake.
            self._loop = None
            self._waiters = set()
        return self._loop

    def on_loop(self, fn) -> None:
        """Runs ``fn`` (a close) on the loop that waits on the fds, and waits for it, when
        called from another thread while that loop runs (``close()`` may be called from any
        thread): a future set from another thread, with the fd's reader gone, never wakes
        the loop, and a waiter woken before the close is over would wait again, for ever.
        Else runs it here: a loop that is not running is in no selector call."""
        loop = self._own_loop()
        if loop is not None and not _running_here(loop) and loop.is_running():
            done = threading.Event()

            def run() -> None:
                try:
                    fn()
                finally:
                    done.set()
            try:
                loop.call_soon_threadsafe(run)
            except RuntimeError:
                pass  # its loop is closed: nothing waits there any more
            else:
                # A loop that is stopped, or blocked in this very close(), never runs it.
                if done.wait(_DETACH_WAIT_S):
                    return
        fn()

    def detach(self) -> None:
        """Unregisters the fds now (before their owner closes them) and wakes every waiter."""
        loop = self._own_loop()
        if loop is not None:
            for fd in self._fds:
                loop.remove_reader(fd)
            self._loop = None
        self._fds = []
        self.wake()

    async def close_aside(self, close_sync: Callable[[], None],
                          close_native: Callable[[], None]) -> None:
        """An ``aclose()``: the fds unregistered here, then ``close_native`` (the C++ close,
        which releases the GIL) on a thread of the loop's default executor, not on the loop.
        A graceful close waits for its peer to take what is in flight (up to half a second),
        and a peer served by this same loop (a TensorDictServer's handler) could not take
        anything while the loop waited. A waiter woken by the detach waits for the close to
        end (its next call then raises ClosedError), as does a second aclose(). Where the
        fds are another thread's loop's, or that loop's aclose() runs, ``close_sync``
        (close()) runs on a thread instead; with no executor left (shut down), here."""
        loop = asyncio.get_running_loop()
        if await self.until_closed():
            return
        aside = self._closing is not None or self._own_loop() not in (None, loop)
        closing = self._submit(loop, close_sync if aside else close_native)
        if closing is None:
            close_sync()
            return
        if aside:
            await closing
            return
        self._closing = closing
        self.detach()
        try:
            await asyncio.shield(closing)
        finally:
            if closing.done():
                self._closing = None
            else:  # cancelled meanwhile: the close goes on, and is forgotten once over
                closing.add_done_callback(lambda _: setattr(self, "_closing", None))

    @staticmethod
    def _submit(loop, fn: Callable[[], None]) -> Optional[asyncio.Future]:
        """``fn`` on the loop's default executor; None when that was shut down."""
        try:
            return loop.run_in_executor(None, fn)
        except RuntimeError:
            return None

    @property
    def closing(self) -> bool:
        """An aclose() is under way."""
        return self._closing is not None

    async def until_closed(self) -> bool:
        """Waits for an aclose() of the running loop that is under way; False when none is."""
        closing = self._closing
        if closing is None or closing.get_loop() is not asyncio.get_running_loop():
            return False
        await asyncio.shield(closing)
        return True

    def check_loop(self, loop) -> None:
        """RuntimeError when another thread's loop waits on the fds: they are watched by that
        loop's selector and its waiters woken from its thread, so a waiter of ``loop`` would
        never wake (both loops hung)."""
        if self._waiters and self._own_loop() not in (None, loop):
            raise RuntimeError(
                "this pipe is awaited on another thread's event loop already: await a pipe "
                "from one event loop at a time")

    async def wait(self, timeout: Optional[float] = None) -> None:
        """Until an fd is readable (or wake()), or ``timeout`` seconds. A timer of the
        loop's, not asyncio.wait_for: on Python 3.11 wait_for swallows a cancellation that
        comes as the inner wait ends, and the task (a server's serve()) never ends."""
        loop = asyncio.get_running_loop()
        # Detached for an aclose(): until it is over. (The attribute first: a coroutine's
        # call costs about 0.2 us, at every wait of a pipe's async calls.)
        if self._closing is not None and await self.until_closed():
            return
        self.check_loop(loop)
        fut = loop.create_future()
        if not self._waiters:
            self._loop = loop
            self._pid = os.getpid()
            for fd in self._fds:
                loop.add_reader(fd, self.wake)
        self._waiters.add(fut)
        timer = None if timeout is None else loop.call_later(
            timeout, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.discard(fut)
            if not self._waiters and self._loop is not None:
                for fd in self._fds:
                    self._loop.remove_reader(fd)
                self._loop = None
        # Woken by an aclose()'s detach: the pipe's next call would wait on its mutex, which
        # the close holds while it flushes, with the loop held up as long.
        if self._closing is not None:
            await self.until_closed()

    def wake(self) -> None:
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_result(None)


class TensorDictPipe:
    """A connected, point-to-point stream of TensorDicts.

    ``consolidated=True`` sends a structure once, then raw storage only: a receive with an
    unchanged structure writes into the previous receive's storage and returns the same
    TensorDict object with the new values (copy what you want to keep). ``False`` sends a
    JSON header and each leaf, and every receive builds a new TensorDict.
    """

    def __init__(self, impl: "_C._Pipe"):
        self._impl = impl
        self._waiter = _FdWaiter([impl.fd, impl.peer_fd])
        self._send_spin = _Spin()
        self._recv_spin = _Spin()
        # (what was passed, what is sent) for a send that may be in flight: one that timed
        # out, was interrupted or cancelled. It is read until it completes, and a retry with
        # the same object finishes it instead of sending it again.
        self._unfinished: Optional[tuple] = None
        self._held: list = []  # a received message a Ctrl-C came after (recv)
        self._receiving = False  # an arecv is running
        self._recv_owes_yield = False  # an arecv returned since the last yield
        self._stalls = 0  # waits in a row UCX would not arm for

    # -- connecting ---------------------------------------------------------------
    @classmethod
    def connect(cls, host: str, port: int, *, consolidated: bool = True, auth_key: Optional[str] = None,
                timeout: Optional[float] = 10.0, max_message_bytes: int = _DEFAULT_MAX_MESSAGE,
                liveness_timeout: Optional[float] = None) -> "TensorDictPipe":
        """Connects to a PipeListener or TensorDictServer on ``host:port``, handshake included.

        ``consolidated`` and ``auth_key`` must match the other side's (else RuntimeError
        naming the mismatch). ``timeout``: seconds for the whole connection (None: no
        limit; TimeoutError when it passes). ``max_message_bytes`` bounds what the peer may
        send. ConnectionRefusedError when nothing listens on ``host:port``; ClosedError
        when the connection ends before the server took it up (its handshake timed out, it
        closed, or the host is unreachable).

        ``liveness_timeout``: seconds a peer on another host may stay silent (its host or
        the link to it gone, without a word) before the pipe fails with ClosedError; both
        sides exchange small heartbeats from a helper thread, so an idle program is never
        taken for gone. None: the default, 10 s or the environment variable
        ``TENSORWIRE_LIVENESS_TIMEOUT``; 0: no check. A peer on this host is watched
        through its process instead."""
        return cls(_C._connect(host, port, consolidated, auth_key, timeout, max_message_bytes,
                               liveness_timeout))

    @classmethod
    async def aconnect(cls, host: str, port: int, **kwargs) -> "TensorDictPipe":
        """``connect`` without blocking the event loop. It runs on a thread of its own, not
        the loop's executor: cancelled, the coroutine returns at once and ``asyncio.run``
        does not wait for the connect, which ends by its timeout; a pipe it still makes is
        closed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def settle(pipe: Optional["TensorDictPipe"], error: Optional[BaseException]) -> None:
            if done.cancelled():
                if pipe is not None:
                    pipe.close()
            elif error is not None:
                done.set_exception(error)
            else:
                done.set_result(pipe)

        def run() -> None:
            pipe, error = None, None
            try:
                pipe = cls.connect(host, port, **kwargs)
            except BaseException as e:  # noqa: BLE001 -- handed to the coroutine
                error = e
            try:
                loop.call_soon_threadsafe(settle, pipe, error)
            except RuntimeError:  # the loop is closed: nobody takes the pipe
                if pipe is not None:
                    pipe.close()

        threading.Thread(target=run, name="tensorwire-aconnect", daemon=True).start()
        return await done

    @classmethod
    def listen(cls, port: int = 0, *, consolidated: bool = True, auth_key: Optional[str] = None,
               on_listening: Optional[Callable[[int], None]] = None, timeout: Optional[float] = None,
               max_message_bytes: int = _DEFAULT_MAX_MESSAGE,
               liveness_timeout: Optional[float] = None) -> "TensorDictPipe":
        """Waits for the first client on ``port`` (0: a free port, passed to ``on_listening``)."""
        with PipeListener._told(port, on_listening, consolidated=consolidated, auth_key=auth_key,
                                max_message_bytes=max_message_bytes,
                                liveness_timeout=liveness_timeout) as listener:
            return listener.accept(timeout=timeout, _single=True)

    @classmethod
    async def alisten(cls, port: int = 0, *, consolidated: bool = True,
                      auth_key: Optional[str] = None,
                      on_listening: Optional[Callable[[int], None]] = None,
                      timeout: Optional[float] = None,
                      max_message_bytes: int = _DEFAULT_MAX_MESSAGE,
                      liveness_timeout: Optional[float] = None) -> "TensorDictPipe":
        """``listen`` in the event loop: cancelling it (or a ``wait_for`` around it) closes
        the listener and frees the port."""
        with PipeListener._told(port, on_listening, consolidated=consolidated, auth_key=auth_key,
                                max_message_bytes=max_message_bytes,
                                liveness_timeout=liveness_timeout) as listener:
            return await listener.aaccept(timeout, _single=True)

    # -- data ---------------------------------------------------------------------
    def send(self, td: TensorDict, *, timeout: Optional[float] = None) -> None:
        """Sends ``td`` (a tensorwire.TensorDict, or a tensordict.TensorDict, converted).

        Returns once the message is handed over: ``td`` may then be changed. Up to 64 KiB
        of tensor data (and 16 KiB of metadata), UCX copies the message and ``send``
        returns without waiting for the peer, except that a sender runs at most about 1 MiB
        or 256 messages ahead of its receiver (the message that reaches that waits until
        the peer has taken it); a larger one goes straight from ``td``'s memory to the
        receiver, and ``send`` returns when the peer has received it. ``timeout``: seconds (None: no limit, 0:
        try once); TimeoutError when it passes. A send that timed out (or was interrupted
        by Ctrl-C) is still in flight: call ``send`` again with the same TensorDict to
        finish it (it arrives once); a different TensorDict is sent after it, and is not
        sent at all when the first takes past its timeout (``TimeoutError: send timed out
        before it started``: send it again)."""
        _check_sync("send")
        self._check_open("send")
        mine = self._unfinished = (td, self._to_send(td))
        done: list = []
        try:
            self._impl.send(mine[1], timeout, done)  # resumes it if it is the one in flight
        except KeyboardInterrupt as e:
            if done:  # Python raises a Ctrl-C that came as the call returned: it was sent
                e.add_note("the send had completed: the message was sent (sending it again "
                           "sends it twice)")
            raise
        finally:
            if done and self._unfinished is mine:  # else an asend of the event loop started
                self._unfinished = None  # since it, and any send in flight before it, completed

    def recv(self, td: Optional[TensorDict] = None, *, device=None, timeout: Optional[float] = None) -> TensorDict:
        """The next TensorDict from the peer.

        Consolidated pipes return the same object while the structure is unchanged, its
        storage overwritten in place (copy what you keep); ``td``: receive into this
        consolidated TensorDict when its layout matches. ``timeout``: seconds (None: no
        limit, 0: try once); TimeoutError when it passes, and the receive stays in flight
        for the next call. ClosedError once the pipe or its peer closed."""
        _check_sync("recv")
        self._check_open("recv")
        _check_device(device)
        if self._held:  # received, then Python raised a Ctrl-C as the call returned
            return self._held.pop()
        done: list = []
        try:
            return self._impl.recv(td, timeout, done)
        except KeyboardInterrupt:
            self._held = done  # the message, if the receive had completed: the next recv's
            raise

    async def asend(self, td: TensorDict) -> None:
        self._check_open("send")
        wire_td = self._to_send(td)
        resumed = self._impl.sending(wire_td)
        # This one or another that was abandoned or timed out: it completes first.
        await self._finish_send()
        self._unfinished = None
        if resumed:
            return  # delivered once
        while not self._impl.start_send(wire_td):
            # A blocking send() of another thread holds the pipe's turn, or left its send in
            # flight (it timed out): progress that one, then look again after a short sleep
            # (that thread progresses the pipe too, and the fd may stay quiet for this loop).
            seen = self._impl.events
            self._impl.poll_send(0)
            self._pass_on(seen)
            await asyncio.sleep(_STALL_SLEEP_S)
        self._unfinished = (td, wire_td)  # a retry after a cancellation finishes it
        await self._finish_send(self._send_spin)
        self._unfinished = None

    async def _finish_send(self, spin: Optional[_Spin] = None) -> None:
        """Progresses the send in flight until it completes: one poll (spinning as ``spin``
        learnt, which is told whether that caught it), then polls as the fds say."""
        budget = spin.budget() if spin is not None else 0
        seen = self._impl.events
        done = self._impl.poll_send(budget)
        if spin is not None:
            spin.outcome(budget > 0, done)
        while not done:
            await self._wait(seen)
            seen = self._impl.events
            done = self._impl.poll_send(0)
        self._pass_on(seen)

    def _pass_on(self, seen: int) -> None:
        """After every poll (or arm) of this coroutine, whether its call completed or goes to
        sleep: if it took events (the pipe's event count moved since ``seen``), they may be
        what another coroutine of this pipe sleeps for (the receive it progressed completed
        a send, or the reverse), and the fd will not fire for them again: wake it to look.
        Without this, an asend() and an arecv() of one pipe could each sleep on the other's
        event for ever."""
        if self._impl.events != seen:
            self._waiter.wake()

    def _to_send(self, td) -> TensorDict:
        """``td`` as a tensorwire.TensorDict: the conversion made for it before when its send
        is the one in flight and it still holds the same leaves (a retry continues that send;
        a dict whose leaves were replaced since is a new message, sent after it)."""
        fresh = _as_tensorwire(td)
        pending = self._unfinished
        if pending is not None and pending[0] is td and fresh._same_views(pending[1]):
            return pending[1]
        return fresh

    async def arecv(self, td: Optional[TensorDict] = None, *, device=None) -> TensorDict:
        self._check_open("recv")
        _check_device(device)
        if self._receiving:
            # Both would get the second message in one object, and the first would be lost.
            raise RuntimeError("arecv(): another arecv() on this pipe is still waiting; a pipe "
                               "delivers messages in order to one receiver: await it first")
        self._receiving = True
        try:
            if self._recv_owes_yield:
                # Let the loop run other tasks between two messages: a message already
                # here is taken without awaiting, so a pipe whose messages keep coming,
                # read with `async for`, would hold the loop, and a server's other pipes
                # and its accepting would wait until that stream ends. Before the receive,
                # so a cancellation here loses no message.
                self._recv_owes_yield = False
                await asyncio.sleep(0)
            budget = self._recv_spin.budget()
            seen = self._impl.events
            got = self._impl.poll_recv(td, budget)
            self._recv_spin.outcome(budget > 0, got is not None)
            while got is None:
                await self._wait(seen)
                seen = self._impl.events
                got = self._impl.poll_recv(td, 0)
            self._pass_on(seen)
            self._recv_owes_yield = True
        finally:
            self._receiving = False
        return got

    async def _wait(self, seen: int) -> None:
        """Sleeps until the pipe may progress. ``seen``: the pipe's event count before this
        coroutine's last poll. If it changed, that poll (or arm) took events another
        coroutine of this pipe may be waiting for (a frame moved into UCX's queue leaves the
        fd quiet): wake it before sleeping.

        UCX may refuse to arm with nothing to progress for as long as sends wait for room
        in the peer's shared-memory FIFO, which the peer frees without a signal (arm()
        already retries a refusal that only drained a stale wake-up,
        src/ucx/worker_wait.h). Then no fd will fire: the first such wait in a row yields
        to the loop's other tasks, the next ones sleep ``_STALL_SLEEP_S``. Returning at
        once instead would poll without ever giving the loop up (and hang if the peer is
        served by this loop)."""
        # An aclose() under way: arm() would wait for the close's mutex on the loop.
        if self._waiter.closing and await self._waiter.until_closed():
            return
        # Also where no fd is waited on below (a stalled send sleeps instead), which would
        # poll on for ever beside the other loop's waiter.
        self._waiter.check_loop(asyncio.get_running_loop())
        armed = self._impl.arm()
        self._pass_on(seen)
        if armed:
            self._stalls = 0
            await self._waiter.wait()
        elif self._impl.events == seen:
            self._stalls += 1
            await asyncio.sleep(0 if self._stalls == 1 else _STALL_SLEEP_S)

    # -- lifetime -----------------------------------------------------------------
    def _check_open(self, op: str) -> None:
        if self._impl.closed:
            raise ClosedError(f"Cannot {op} on a closed pipe.")

    def close(self) -> None:
        self._waiter.on_loop(self._close_here)

    def _close_here(self) -> None:
        self._waiter.detach()
        self._impl.close()

    async def aclose(self) -> None:
        """close() without holding up the event loop: the close (which lets what was sent
        reach the peer, up to half a second) runs on a thread while the loop goes on."""
        if self._impl.closed and not self._waiter.closing:
            self.close()  # nothing to wait for: the fds only
            return
        await self._waiter.close_aside(self.close, self._impl.close)

    @property
    def closed(self) -> bool:
        return self._impl.closed

    @property
    def closed_by_peer(self) -> bool:
        """True once the peer closed the pipe normally (the end of its stream)."""
        return self._impl.closed_by_peer

    @property
    def consolidated(self) -> bool:
        return self._impl.consolidated

    @property
    def peer(self) -> str:
        return self._impl.peer

    @property
    def liveness_timeout(self) -> float:
        """Seconds a peer on another host may stay silent before the pipe fails (0: no check)."""
        return self._impl.liveness_timeout

    @property
    def transports(self) -> str:
        """The UCX transports the data moves over, e.g. ``"sysv/memory"`` between
        processes of one host, ``"tcp/lo"`` over loopback TCP ("" once closed)."""
        return self._impl.transports

    def __enter__(self) -> "TensorDictPipe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "TensorDictPipe":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def __aiter__(self) -> "TensorDictPipe":
        return self

    async def __anext__(self) -> TensorDict:
        if self.closed:
            raise StopAsyncIteration
        try:
            return await self.arecv()
        except ClosedError:
            if self.closed_by_peer:  # the end of the peer's stream; anything else is an error
                raise StopAsyncIteration from None
            raise

    def __del__(self) -> None:
        impl = getattr(self, "_impl", None)
        if impl is not None and not impl.closed:
            impl.close()

    def __repr__(self) -> str:
        if self.closed:
            state = "closed"
        elif self._impl.failed:
            state = f"closed by its peer {self.peer}" if self.closed_by_peer else f"broken (peer {self.peer})"
        else:
            state = f"connected to {self.peer}"
        return f"TensorDictPipe({state}, consolidated={self.consolidated})"


class _Acceptor:
    """What PipeListener and TensorDictServer share: a C++ acceptor in ``self._impl``, and
    ``self._waiter`` on its wake-up fd."""

    _impl: "_C._PipeListener"
    _waiter: _FdWaiter

    async def _aaccept(self, accept_now: Callable[[], Optional[TensorDictPipe]],
                       timeout: Optional[float], what: str) -> TensorDictPipe:
        """Waits on the listener's wake-up fd in the event loop. Each client's handshake runs
        on a thread of the listener's own, apart from the others' (a client that stalls in
        it holds up nobody else), and wakes the fd when it ends: ``accept_now`` (an
        ``accept(0)``) only starts handshakes and hands out a pipe whose handshake is over,
        so it runs on the loop. Cancelling leaves the acceptor as it was."""
        timeout = _C._timeout_seconds(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._impl.arm():  # nothing to do: sleep until the listener's fd wakes us
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{what} timed out after {timeout} s")
                # At most _LOOK_S: accept_now() also shuts down connections that never sent
                # the listener a byte it could read (docs/reliability.md), which wake
                # nothing. At the deadline, the next arm() says so unless a client came.
                await self._waiter.wait(_LOOK_S if left is None else min(left, _LOOK_S))
            else:  # something to do: after the loop's other ready tasks had their turn
                await asyncio.sleep(0)
            pipe = accept_now()
            if pipe is not None:
                return pipe

    def close(self) -> None:
        self._waiter.on_loop(self._close_here)

    def _close_here(self) -> None:
        self._waiter.detach()
        self._impl.close()

    @property
    def port(self) -> int:
        return self._impl.port

    @property
    def closed(self) -> bool:
        return self._impl.closed

    @property
    def refused(self) -> int:
        """Clients refused at the handshake (wrong key, mode mismatch, gave up) so far."""
        return self._impl.refused


class PipeListener(_Acceptor):
    """Listens on a port (0: a free one, see ``.port``); each accepted client is a pipe."""

    def __init__(self, port: int = 0, *, consolidated: bool = True, auth_key: Optional[str] = None,
                 timeout: Optional[float] = 10.0, max_message_bytes: int = _DEFAULT_MAX_MESSAGE,
                 liveness_timeout: Optional[float] = None):
        self._impl = _C._PipeListener(port, consolidated, auth_key, timeout, max_message_bytes,
                                      liveness_timeout)
        self._waiter = _FdWaiter([self._impl.fd])

    @classmethod
    def _told(cls, port: int, on_listening: Optional[Callable[[int], None]], **options) -> "PipeListener":
        """A listener whose port ``on_listening`` (if given) is told (``listen``'s)."""
        listener = cls(port, **options)
        if on_listening is not None:
            try:
                on_listening(listener.port)
            except BaseException:
                listener.close()
                raise
        return listener

    def accept(self, timeout: Optional[float] = None, *, _single: bool = False) -> TensorDictPipe:
        """Waits for the next client and returns its connected pipe.

        ``timeout``: seconds (None: no limit, 0: try once); TimeoutError when it passes.
        A client that fails or abandons the handshake (wrong ``auth_key`` or mode) is
        refused, counted in ``refused`` and skipped. ClosedError once closed."""
        _check_sync("accept")
        impl = self._impl.accept(timeout, _single)
        if impl is None:
            raise TimeoutError(f"PipeListener.accept() timed out after {timeout} s")
        return TensorDictPipe(impl)

    async def aaccept(self, timeout: Optional[float] = None, *, _single: bool = False) -> TensorDictPipe:
        """``accept`` in the event loop (see TensorDictServer.aaccept)."""
        def accept_now() -> Optional[TensorDictPipe]:
            impl = self._impl.accept(0, _single)
            return None if impl is None else TensorDictPipe(impl)
        return await self._aaccept(accept_now, timeout, "PipeListener.aaccept()")

    def __repr__(self) -> str:
        state = "closed" if self.closed else "listening"
        return f"PipeListener(port={self.port}, {state}, refused={self.refused})"

    def __enter__(self) -> "PipeListener":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _clear_frames(exc: Optional[BaseException], seen: Optional[set] = None) -> None:
    """Clears the locals of every finished frame in `exc`'s traceback and in those of the
    exceptions chained to it (file, line and code stay, for printing)."""
    seen = set() if seen is None else seen
    if exc is None or id(exc) in seen:
        return
    seen.add(id(exc))
    try:
        traceback.clear_frames(exc.__traceback__)
    except RuntimeError:  # a frame still running: not ours to clear
        pass
    _clear_frames(exc.__cause__, seen)
    _clear_frames(exc.__context__, seen)


class TensorDictServer(_Acceptor):
    """Accepts many clients, each as its own TensorDictPipe.

    ``await server.serve(handler)`` runs ``handler(pipe)`` as a task per client and logs
    (and keeps, in ``handler_errors``) any exception a handler raises; ``async for pipe in
    server`` yields the pipes instead. A client that fails or abandons its handshake is
    counted in ``refused`` (and logged at debug level; a client this process could not
    make its end for, e.g. for want of file descriptors, at warning level, and refused at
    once); the server goes on. ``close()``
    stops accepting, cancels the handlers ``serve`` runs and closes every pipe the server
    handed out. ``liveness_timeout`` applies
    to every client's pipe (see ``TensorDictPipe.connect``).
    """

    def __init__(self, port: int = 0, *, consolidated: bool = True, auth_key: Optional[str] = None,
                 timeout: Optional[float] = 10.0, max_message_bytes: int = _DEFAULT_MAX_MESSAGE,
                 liveness_timeout: Optional[float] = None):
        self._impl = _C._Server(port, consolidated, auth_key, timeout, max_message_bytes,
                                liveness_timeout)
        self._waiter = _FdWaiter([self._impl.fd])
        self._tasks: set = set()
        self.handler_errors: list = []

    def accept(self, timeout: Optional[float] = None) -> Optional[TensorDictPipe]:
        """The next client's pipe; None when ``timeout`` (seconds; None: no limit) passes."""
        _check_sync("accept")
        return self._accepted(self._impl.refused, self._impl.accept(timeout))

    def _accepted(self, refused_before: int, impl) -> Optional[TensorDictPipe]:
        refused = self._impl.refused - refused_before  # one accept may reap several
        if refused:
            _log.debug("TensorDictServer on port %d refused %d client(s), the last: %s", self.port,
                       refused, self._impl.last_refusal)
        return TensorDictPipe(impl) if impl is not None else None

    async def aaccept(self) -> TensorDictPipe:
        """The next client; ClosedError once the server is closed."""
        def accept_now() -> Optional[TensorDictPipe]:
            refused = self._impl.refused
            return self._accepted(refused, self._impl.accept(0))
        return await self._aaccept(accept_now, None, "TensorDictServer.aaccept()")

    async def serve(self, handler: Callable[[TensorDictPipe], Awaitable[None]]) -> None:
        try:
            while True:
                try:
                    pipe = await self.aaccept()
                except ClosedError:
                    if self.closed:
                        return
                    raise
                work = handler(pipe)
                if not inspect.isawaitable(work):
                    # A plain function: every client would meet the same mistake.
                    pipe.close()
                    raise TypeError("TensorDictServer.serve: the handler must be an async function "
                                    f"(async def handler(pipe)); it returned {type(work).__name__}")
                task = asyncio.ensure_future(work)
                del pipe, work  # the handler's alone: this frame must not keep the last one alive
                self._tasks.add(task)
                task.add_done_callback(self._handler_done)
        finally:
            for t in list(self._tasks):
                t.cancel()

    def _handler_done(self, task: "asyncio.Task") -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            _log.error("TensorDictServer handler failed", exc_info=exc)
            # Kept with its traceback, but not with the handler's locals: its frames would
            # keep its pipe (a UCX worker, its endpoint and about a dozen fds) for as long as
            # handler_errors does, and a handler ends with ClosedError whenever its client
            # leaves (`while True: await pipe.arecv()`).
            _clear_frames(exc)
            self.handler_errors.append(exc)

    async def __aiter__(self) -> AsyncIterator[TensorDictPipe]:
        while True:
            try:
                yield await self.aaccept()
            except ClosedError:
                if self.closed:
                    return
                raise

    def _close_here(self) -> None:
        # The handlers first: cancelled, as the end of serve() cancels them, before their
        # pipes close under them (a handler still reading would get ClosedError, reported
        # as its failure). Tasks belong to the loop running here, if any.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        for t in list(self._tasks):
            if t.get_loop() is loop:
                t.cancel()
        super()._close_here()

    async def aclose(self) -> None:
        self.close()

    def __enter__(self) -> "TensorDictServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "TensorDictServer":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "listening"
        return (f"TensorDictServer(port={self.port}, {state}, handlers={len(self._tasks)}, "
                f"refused={self.refused})")


_ACCEPTED = ("send() takes a tensorwire.TensorDict or a tensordict.TensorDict, got {}; wrap arrays "
             "and dicts as tensorwire.TensorDict({{'key': value}}, batch_size=[...])")


def _as_tensorwire(td) -> TensorDict:
    if isinstance(td, TensorDict):
        return td
    # Only an object of tensordict's own classes is converted (importing tensordict is slow).
    if type(td).__module__.split(".")[0] != "tensordict":
        raise TypeError(_ACCEPTED.format(type(td).__name__))
    return TensorDict.from_tensordict(td)


def _check_device(device) -> None:
    # "cpu", "cpu:0", torch.device("cpu", 0): the CPU under any of its names.
    if device is not None and str(device).partition(":")[0] != "cpu":
        raise ValueError(f"device={device!r}: tensorwire receives into CPU memory only")
