"""TensorDictPipe between real processes over loopback (shared memory and TCP)."""
import asyncio
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import tensorwire as tw
from conftest import PYTHONPATH, ROOT, connected_pipes

PY_PEER = os.path.join(os.path.dirname(__file__), "peers", "py_pipe_peer.py")


@pytest.fixture(params=["sm,tcp", "tcp"], ids=["shm", "tcp"])
def tls(request, monkeypatch):
    monkeypatch.setenv("UCX_TLS", request.param)
    return request.param


@pytest.fixture(scope="session")
def cpp_peer():
    path = os.environ.get("PIPE_PEER") or os.path.join(ROOT, "build", "examples", "pipe_peer")
    assert os.path.exists(path), "examples/pipe_peer is not built: run `make build`"
    return path


_spawned = []


def spawn(args, **kw):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw)
    _spawned.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _reap_peers():
    """A test that fails before its peer finished (a listening peer nobody connects to waits
    for ever) must not leave the peer behind: kill whatever is still running."""
    yield
    while _spawned:
        proc = _spawned.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def py_peer(*args):
    return spawn([sys.executable, PY_PEER, *map(str, args)])


async def accepted_from_py_peer(mode, *args):
    """A listener, a Python peer connected to it (`py_peer(mode, host, port, *args)`) and
    the accepted pipe; accepted on an executor thread, so the running loop goes on."""
    listener = tw.PipeListener(0)
    peer = py_peer(mode, "127.0.0.1", listener.port, *args)
    pipe = await asyncio.get_running_loop().run_in_executor(None, lambda: listener.accept(timeout=30))
    return listener, peer, pipe


def finish(proc, timeout=30):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_consolidated_steady_state_returns_the_same_object_with_new_values(tls):
    with tw.PipeListener(0) as listener:
        peer = py_peer("send", "127.0.0.1", listener.port, 5)
        pipe = listener.accept(timeout=30)
        first = pipe.recv(timeout=30)
        assert first["x"].tolist() == [0, 0, 0, 0]
        x = first["x"]  # a zero-copy view: later receives write into it
        for i in range(1, 5):
            td = pipe.recv(timeout=30)
            assert td is first
            assert x[0] == i and td["nested", "y"].tolist() == [i, i + 1, i + 2, i + 3]
            assert td["label"] == "step" and td["tags"].tolist() == ["a", "b", "c", "d"]
        assert finish(peer)[0] == 0
        pipe.close()


def test_non_consolidated_builds_a_new_dict_with_batch_size_nested_and_non_tensors(tls):
    with tw.PipeListener(0, consolidated=False) as listener:
        peer = py_peer("send", "127.0.0.1", listener.port, 3, "--nc")
        pipe = listener.accept(timeout=30)
        seen = []
        for i in range(3):
            td = pipe.recv(timeout=30)
            assert td.batch_size == (4,) and td["nested"].batch_size == (4,)
            assert td["x"][0] == i and td["label"] == "step"
            assert isinstance(td["tags"], tw.NonTensorStack)
            assert td["tags"].batch_size == (4,) and td["tags"].stack_dim == 0
            seen.append(td)
        assert seen[0] is not seen[1] and seen[0]["x"][0] == 0  # independent dicts
        assert finish(peer)[0] == 0


def test_cpp_sender_to_python_receiver(tls, cpp_peer):
    with tw.PipeListener(0) as listener:
        peer = spawn([cpp_peer, "send", "127.0.0.1", str(listener.port), "4", "--change-at", "2"])
        pipe = listener.accept(timeout=30)
        for i in range(4):
            td = pipe.recv(timeout=30)
            assert td["x"][0] == i and td["nested", "y"][3] == i + 3 and td["label"] == "step"
            assert ("extra" in td) == (i >= 2)
        assert finish(peer)[0] == 0


def test_python_sender_to_cpp_receiver(tls, cpp_peer):
    peer = spawn([cpp_peer, "recv", "0", "4"])
    port = int(peer.stdout.readline().split()[1])
    pipe = tw.TensorDictPipe.connect("127.0.0.1", port)
    for i in range(4):
        pipe.send(tw.TensorDict({"x": np.full(4, i, np.float32), "nested": {"y": np.arange(i, i + 4)},
                                 "label": "step"}, batch_size=[4]))
    code, out, err = finish(peer)
    assert code == 0 and "OK 4" in out, err


def test_recv_into_a_callers_consolidated_dict(tls):
    with tw.PipeListener(0) as listener:
        peer = py_peer("send", "127.0.0.1", listener.port, 3)
        pipe = listener.accept(timeout=30)
        pipe.recv(timeout=30)
        mine = tw.TensorDict({"x": np.zeros(4, np.float32), "nested": {"y": np.zeros(4, np.int64)},
                              "label": "step", "tags": tw.NonTensorStack(["a", "b", "c", "d"])},
                             batch_size=[4]).consolidate()
        got = pipe.recv(mine, timeout=30)
        assert got is mine and mine["x"][0] == 1
        other = tw.TensorDict({"z": np.zeros(2)}, batch_size=[2]).consolidate()
        got = pipe.recv(other, timeout=30)  # a different layout: a new dict comes back
        assert got is not other and got["x"][0] == 2
        assert finish(peer)[0] == 0


SMALL_DEV_SHM = """
import subprocess, sys
import tensorwire as tw
with tw.PipeListener(0) as listener:
    peer = subprocess.Popen([sys.executable, sys.argv[1], "send", "127.0.0.1", str(listener.port), "3"])
    pipe = listener.accept(timeout=30)
    names = pipe.transports
    got = [int(pipe.recv(timeout=30)["x"][0]) for _ in range(3)]
    pipe.close()
    print(names, got, peer.wait(30))
"""


@pytest.mark.parametrize("setting", [None, "^posix"], ids=["default", "^posix"])
def test_pipes_of_one_host_use_shared_memory_with_a_1_mib_dev_shm(setting):
    # Docker gives a container 64 MiB of /dev/shm. UCX's posix transport took 4 MiB there per
    # worker (each pipe end, each listener) although sysv carries the data: a server refused
    # its fifth local client, and a 4 MiB /dev/shm refused the first. It is left out unless
    # UCX_TLS is set; "^posix" kept shared memory off altogether (tcp between local pipes).
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    env.pop("UCX_TLS", None)
    if setting:
        env["UCX_TLS"] = setting
    in_small_shm = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"', "sh"]
    out = subprocess.run([*in_small_shm, sys.executable, "-c", SMALL_DEV_SHM, PY_PEER], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sysv/memory", "[0,", "1,", "2]", "0"], (out.stdout, out.stderr)


@pytest.mark.parametrize("spin_us", [0.0, 50.0], ids=["await-at-once", "spin-then-await"])
def test_asyncio_send_and_receive_and_async_for_ends_when_the_peer_closes(tls, spin_us, monkeypatch):
    import tensorwire.pipe
    monkeypatch.setattr(tensorwire.pipe, "ASYNC_SPIN_US", spin_us)

    async def run():
        listener, peer, pipe = await accepted_from_py_peer("echo", 3)
        async with pipe:
            for i in range(3):
                await pipe.asend(tw.TensorDict({"v": np.full(2, i)}, batch_size=[2]))
                back = await asyncio.wait_for(pipe.arecv(), 30)
                assert back["v"].tolist() == [i, i]
            received = [td async for td in pipe]  # the echo peer closes: iteration ends
            assert received == []
        assert pipe.closed
        assert finish(peer)[0] == 0
    asyncio.run(run())


def test_sync_calls_inside_a_running_event_loop_raise_instead_of_deadlocking(tls):
    async def run():
        listener, peer, pipe = await accepted_from_py_peer("send", 1)
        with pytest.raises(RuntimeError, match="event loop"):
            pipe.recv()
        with pytest.raises(RuntimeError, match="event loop"):
            pipe.send(tw.TensorDict({"a": np.zeros(1)}))
        assert (await pipe.arecv())["x"][0] == 0
        pipe.close()
        finish(peer)
    asyncio.run(run())


def test_closed_pipe_raises_and_close_is_idempotent(tls):
    with tw.PipeListener(0) as listener:
        peer = py_peer("send", "127.0.0.1", listener.port, 1)
        with listener.accept(timeout=30) as pipe:
            pass
        assert pipe.closed
        pipe.close()
        with pytest.raises(RuntimeError, match="closed pipe"):
            pipe.recv()
        with pytest.raises(RuntimeError, match="closed pipe"):
            pipe.send(tw.TensorDict({"a": np.zeros(1)}))
        finish(peer)


def test_peer_killed_with_sigkill_makes_recv_raise_within_5s(tls):
    with tw.PipeListener(0) as listener:
        peer = py_peer("send", "127.0.0.1", listener.port, 1, "--hang")
        pipe = listener.accept(timeout=30)
        pipe.recv(timeout=30)
        peer.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="exited|lost"):
            pipe.recv(timeout=30)
        assert time.monotonic() - t0 < 5
        finish(peer)


def test_peer_killed_ends_an_awaited_arecv_promptly(tls):
    async def run():
        listener, peer, pipe = await accepted_from_py_peer("send", 1, "--hang")
        await pipe.arecv()
        peer.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(pipe.arecv(), 30)
        assert time.monotonic() - t0 < 5
        finish(peer)
    asyncio.run(run())


def test_mode_mismatch_is_refused_on_both_sides(tls):
    listener = tw.PipeListener(0, consolidated=True)
    peer = py_peer("send", "127.0.0.1", listener.port, 1, "--nc")
    with pytest.raises(RuntimeError, match="mode mismatch"):
        listener.accept(timeout=30, _single=True)
    code, _, err = finish(peer)
    assert code == 3 and "mode mismatch" in err


@pytest.mark.parametrize("client_key, message", [("wrong", "authentication failed"),
                                                 (None, "authentication required")])
def test_wrong_or_missing_auth_key_is_refused_on_both_sides(tls, client_key, message):
    listener = tw.PipeListener(0, auth_key="s3cret")
    args = ["send", "127.0.0.1", listener.port, 1] + (["--key", client_key] if client_key else [])
    peer = py_peer(*args)
    with pytest.raises(RuntimeError, match=message):
        listener.accept(timeout=30, _single=True)
    code, _, err = finish(peer)
    assert code == 3 and message in err


def test_listen_on_port_zero_reports_the_port_and_connects(tls, cpp_peer):
    ports = []
    import threading

    result = {}

    def serve():
        result["pipe"] = tw.TensorDictPipe.listen(0, on_listening=ports.append)

    t = threading.Thread(target=serve)
    t.start()
    while not ports:
        time.sleep(0.01)
    peer = spawn([cpp_peer, "send", "127.0.0.1", str(ports[0]), "1"])
    t.join(30)
    assert result["pipe"].recv(timeout=30)["x"][0] == 0
    assert finish(peer)[0] == 0


def test_garbage_collection_closes_an_open_pipe(tls, cpp_peer):
    peer = spawn([cpp_peer, "recv", "0", "5"])
    port = int(peer.stdout.readline().split()[1])
    pipe = tw.TensorDictPipe.connect("127.0.0.1", port)
    del pipe
    gc.collect()
    code, _, err = finish(peer)
    assert code == 3 and "peer closed the pipe" in err


def test_server_serves_three_concurrent_clients_and_reports_handler_errors(tls):
    async def run():
        server = tw.TensorDictServer(0)
        served = []

        async def handler(pipe):  # each client is an echo peer: send, then read it back
            for i in range(3):
                await pipe.asend(tw.TensorDict({"v": np.full(2, i)}, batch_size=[2]))
                assert (await pipe.arecv())["v"].tolist() == [i, i]
            served.append(pipe)
            if len(served) == 3:
                raise ValueError("handler failure is reported")

        task = asyncio.ensure_future(server.serve(handler))
        peers = [py_peer("echo", "127.0.0.1", server.port, 3) for _ in range(3)]
        for _ in range(600):
            if len(served) == 3 and server.handler_errors:
                break
            await asyncio.sleep(0.05)
        assert len(served) == 3
        assert isinstance(server.handler_errors[0], ValueError)
        server.close()
        await asyncio.wait_for(task, 10)
        assert all(p.closed for p in served)
        for p in peers:
            finish(p)
    asyncio.run(run())


def test_a_handler_that_raises_does_not_keep_its_pipe_alive(caplog):
    # handler_errors keeps each exception with its traceback; the handler's locals (its pipe:
    # a UCX worker, its endpoint, about a dozen fds) must not stay alive with it. A handler
    # reading until its client leaves ends this way once per client.
    def fds():
        return len(os.listdir("/proc/self/fd"))

    async def run():
        server = tw.TensorDictServer(0)
        pipes = []

        async def handler(pipe):
            pipes.append(weakref.ref(pipe))
            await pipe.arecv()
            raise RuntimeError("handler failed")

        task = asyncio.ensure_future(server.serve(handler))

        def clients(n):
            for _ in range(n):
                with tw.TensorDictPipe.connect("127.0.0.1", server.port, timeout=10) as p:
                    p.send(tw.TensorDict({"x": np.arange(4)}, batch_size=[4]))

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, clients, 3)  # warm-up: lazily made state
        for _ in range(200):
            if len(server.handler_errors) == 3:
                break
            await asyncio.sleep(0.01)
        gc.collect()
        before = fds()
        await loop.run_in_executor(None, clients, 20)
        for _ in range(500):
            if len(server.handler_errors) == 23:
                break
            await asyncio.sleep(0.01)
        gc.collect()
        assert len(server.handler_errors) == 23
        assert all(isinstance(e, RuntimeError) and e.__traceback__ is not None
                   for e in server.handler_errors)
        assert [r for r in pipes if r() is not None] == []
        assert fds() <= before + 2
        server.close()
        await asyncio.wait_for(task, 10)
    asyncio.run(run())


def test_closing_the_server_ends_its_handlers_without_reporting_errors(tls, caplog):
    # close() closes every pipe the server handed out and ends the handlers reading them
    # (cancelled, as serve()'s own end cancels them): a shutdown, not handler failures to
    # log, also when a handler's pipe had more to read or its peer was closing it too.
    async def run():
        server = tw.TensorDictServer(0)
        got = []

        async def handler(pipe):
            async for td in pipe:
                got.append(td["x"][0])

        task = asyncio.ensure_future(server.serve(handler))
        peers = [py_peer("send", "127.0.0.1", server.port, 200, *hang) for hang in ([], ["--hang"])]
        for _ in range(600):
            if len(got) >= 20:
                break
            await asyncio.sleep(0.01)
        assert len(got) >= 20
        server.close()
        await asyncio.sleep(0.2)  # the handlers run before serve() ends (no await on it)
        assert server.handler_errors == []
        await asyncio.wait_for(task, 10)
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        for p in peers:
            p.kill()
            finish(p)
    asyncio.run(run())


def test_a_pipe_read_with_async_for_lets_the_loop_run_other_tasks_between_messages(tls):
    # A server reads each pipe in its own task: a pipe whose messages are already there
    # must still give the loop up between two of them, or the server's other pipes (and
    # its accepting) wait until that stream ends.
    async def run():
        async with tw.TensorDictServer(0) as server:
            peer = py_peer("send", "127.0.0.1", server.port, 200)
            pipe = await asyncio.wait_for(server.aaccept(), 30)
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0)

            other = asyncio.ensure_future(ticker())
            await asyncio.sleep(0)
            seen = []
            async for td in pipe:
                seen.append(ticks)
            other.cancel()
            assert len(seen) == 200
            stuck = [i for i in range(1, 200) if seen[i] == seen[i - 1]]
            assert not stuck, f"no other task ran between messages {stuck[:10]}"
            assert finish(peer)[0] == 0
    asyncio.run(run())


@pytest.mark.timeout(60)
def test_an_asend_stalled_on_a_peer_that_does_not_receive_lets_the_loop_run(tls):
    # 64 KiB messages are sent eagerly: they fill the peer's shared-memory FIFO, and then a
    # send waits for room that the peer frees without a signal (UCX will not arm the fd
    # meanwhile). The loop must go on running other tasks, here the one that starts the
    # peer's receives: asend used to poll without giving the loop up, and this hung.
    async def run():
        with tw.PipeListener(0) as listener:
            loop = asyncio.get_running_loop()
            accepting = loop.run_in_executor(None, lambda: listener.accept(timeout=30))
            pipe = await loop.run_in_executor(
                None, lambda: tw.TensorDictPipe.connect("127.0.0.1", listener.port, timeout=30))
            peer = await accepting
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.001)
                    ticks += 1

            async def sender():
                for i in range(100):
                    await pipe.asend(tw.TensorDict({"x": np.full(64 * 1024, i, np.uint8)}, batch_size=[]))

            other = asyncio.ensure_future(ticker())
            sending = asyncio.ensure_future(sender())
            await asyncio.sleep(0.3)
            assert ticks >= 10, f"the loop ran {ticks} times in 0.3 s while asend waited"
            got = await loop.run_in_executor(
                None, lambda: [int(peer.recv(timeout=30)["x"][-1]) for _ in range(100)])
            await asyncio.wait_for(sending, 30)
            other.cancel()
            assert got == list(range(100))
            pipe.close()
            peer.close()
    asyncio.run(run())


def test_recv_timeout_raises_timeouterror_and_the_pipe_stays_usable(tls):
    with tw.PipeListener(0) as listener:
        peer = py_peer("echo", "127.0.0.1", listener.port, 1)
        pipe = listener.accept(timeout=30)
        with pytest.raises(TimeoutError):
            pipe.recv(timeout=0.2)
        pipe.send(tw.TensorDict({"v": np.ones(2)}, batch_size=[2]))
        assert pipe.recv(timeout=30)["v"].tolist() == [1.0, 1.0]
        assert finish(peer)[0] == 0


def test_connect_to_a_closed_port_raises_and_bad_arguments_are_named(tls):
    with tw.PipeListener(0) as listener:
        port = listener.port
    with pytest.raises(ConnectionRefusedError, match=f"connection refused by 127.0.0.1:{port}"):
        tw.TensorDictPipe.connect("127.0.0.1", port, timeout=3)
    with pytest.raises(ValueError, match="no-such-host"):
        tw.TensorDictPipe.connect("no-such-host.invalid", port, timeout=3)
    with pytest.raises(ValueError, match="auth_key"):
        tw.TensorDictPipe.connect("127.0.0.1", port, auth_key="")
    # A port given as a str is named, not nanobind's signature of a private function.
    for make in (lambda: tw.TensorDictPipe.connect("127.0.0.1", str(port)),
                 lambda: tw.PipeListener(str(port)), lambda: tw.TensorDictServer(str(port))):
        with pytest.raises(TypeError, match="^port must be an integer, got str$"):
            make()


def test_connecting_to_a_listener_that_does_not_accept_names_the_cause(tls):
    # One thread that connects to its own listener before accept(): it waits its timeout,
    # and the error says nothing took the connection up, and why that happens.
    with tw.PipeListener(0) as listener:
        with pytest.raises(TimeoutError, match=f"nothing at 127.0.0.1:{listener.port} took the "
                                               r"connection up \(a PipeListener takes connections "
                                               r"only in accept\(\)"):
            tw.TensorDictPipe.connect("127.0.0.1", listener.port, timeout=0.5)


def test_a_server_that_ends_the_handshake_early_is_not_called_a_refusal(tls):
    # Something listens, takes the connection and gives up on its handshake at once: the
    # client's error says the connection ended, not that nothing listens there.
    with tw.PipeListener(0, timeout=0) as listener:
        seen = {}

        def client():
            try:
                tw.TensorDictPipe.connect("127.0.0.1", listener.port, timeout=10)
            except Exception as e:  # noqa: BLE001 - the test inspects what was raised
                seen["error"] = e
        t = threading.Thread(target=client)
        t.start()
        deadline = time.monotonic() + 10
        while t.is_alive() and time.monotonic() < deadline:
            try:
                listener.accept(timeout=0.1)
            except (TimeoutError, tw.ClosedError):
                pass
        t.join(15)
    assert not t.is_alive()
    e = seen.get("error")
    assert isinstance(e, tw.ClosedError) and not isinstance(e, ConnectionRefusedError), repr(e)
    # Ended before the wire-up completed ("ended before the server took it up") or after.
    assert f"127.0.0.1:{listener.port}" in str(e), str(e)


def test_recv_onto_a_gpu_device_is_refused(tls):
    with tw.PipeListener(0) as listener:
        peer = py_peer("send", "127.0.0.1", listener.port, 1)
        pipe = listener.accept(timeout=30)
        with pytest.raises(ValueError, match="cuda"):
            pipe.recv(device="cuda:0")
        assert pipe.recv(device="cpu", timeout=30)["x"][0] == 0
        finish(peer)


@pytest.mark.parametrize("device", ["cpu:0", "torch.device"])
def test_recv_onto_the_cpu_by_any_of_its_names_is_taken(tls, device):
    if device == "torch.device":
        import torch
        device = torch.device("cpu", 0)
    with tw.PipeListener(0) as listener:
        peer = py_peer("send", "127.0.0.1", listener.port, 1)
        pipe = listener.accept(timeout=30)
        assert pipe.recv(device=device, timeout=30)["x"][0] == 0
        finish(peer)


def test_connect_to_a_listener_that_never_accepts_times_out_cleanly(tls):
    listener = tw.PipeListener(0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="handshake"):
        tw.TensorDictPipe.connect("127.0.0.1", listener.port, timeout=1)
    # A connect given up lets its wire-up end first (at most 0.1 s, 0.3 s with a failed
    # endpoint's drain): the rest is slack for a loaded machine.
    assert time.monotonic() - t0 < 3
    listener.close()


def test_async_spin_stops_for_a_slow_peer_and_resumes_for_a_fast_one(monkeypatch):
    import tensorwire.pipe as twpipe
    monkeypatch.setattr(twpipe, "ASYNC_SPIN_US", 50.0)
    spin = twpipe._Spin()
    for _ in range(spin.OFF_AFTER):             # spins that catch nothing ...
        assert spin.budget() == 50.0
        spin.outcome(spun=True, caught=False)
    budgets = [spin.budget() for _ in range(2 * spin.PROBE_EVERY)]
    assert budgets.count(50.0) == 2             # ... leave one probe spin in PROBE_EVERY calls
    assert budgets.count(0.0) == 2 * spin.PROBE_EVERY - 2
    spin.outcome(spun=False, caught=True)       # a message there at once also counts
    assert spin.budget() == 50.0                # spinning again
    spin.outcome(spun=True, caught=False)
    assert spin.budget() == 50.0                # one miss is not enough to stop
    monkeypatch.setattr(twpipe, "ASYNC_SPIN_US", 0.0)
    assert spin.budget() == 0.0                 # 0 turns spinning off altogether


def test_transports_name_shared_memory_on_one_host_and_tcp_when_forced(tls):
    with tw.PipeListener(0) as listener:
        peer = py_peer("send", "127.0.0.1", listener.port, 1)
        pipe = listener.accept(timeout=30)
        names = pipe.transports
        if tls == "tcp":
            assert "tcp/" in names and "/memory" not in names, names
        else:
            assert ("sysv/" in names or "posix/" in names) and "tcp/" not in names, names
        assert pipe.recv(timeout=30)["x"][0] == 0
        pipe.close()
        assert pipe.transports == ""
        assert finish(peer)[0] == 0


@pytest.mark.parametrize("spin_us", [0.0, 50.0], ids=["await-at-once", "spin-then-await"])
def test_concurrent_asend_and_arecv_on_one_pipe_do_not_lose_each_others_wake_ups(tls, spin_us, monkeypatch):
    # One coroutine sends while another receives on the same pipe: a poll by one can take
    # the event the other sleeps for; the pipe's event count makes it wake the other.
    import tensorwire.pipe as twpipe
    monkeypatch.setattr(twpipe, "ASYNC_SPIN_US", spin_us)
    n = 300

    async def run():
        listener, peer, pipe = await accepted_from_py_peer("echo", n)

        async def sender():
            for i in range(n):
                await pipe.asend(tw.TensorDict({"v": np.full(2, i)}, batch_size=[2]))

        async def receiver():
            for i in range(n):
                back = await pipe.arecv()
                assert back["v"].tolist() == [i, i]

        await asyncio.wait_for(asyncio.gather(sender(), receiver()), 60)
        await pipe.aclose()
        assert finish(peer)[0] == 0
        listener.close()
    asyncio.run(run())


def test_an_abandoned_arecv_keeps_its_target_alive_until_a_receive_completes(tls):
    async def run():
        listener, peer, pipe = await accepted_from_py_peer("echo", 2)
        await pipe.asend(tw.TensorDict({"v": np.full(2, 0)}, batch_size=[2]))
        first = await asyncio.wait_for(pipe.arecv(), 30)        # the schema message
        assert first["v"].tolist() == [0, 0]
        target = tw.TensorDict({"v": np.zeros(2, np.int64)}, batch_size=[2])
        refs = sys.getrefcount(target)
        with pytest.raises(asyncio.TimeoutError):                # the echo peer waits for us
            await asyncio.wait_for(pipe.arecv(target), 0.05)
        gc.collect()
        assert sys.getrefcount(target) == refs + 1               # kept: it may still be written
        await pipe.asend(tw.TensorDict({"v": np.full(2, 1)}, batch_size=[2]))
        got = await asyncio.wait_for(pipe.arecv(), 30)          # completes the abandoned one
        assert got["v"].tolist() == [1, 1]
        del got
        assert sys.getrefcount(target) == refs                   # released once complete
        await pipe.aclose()
        assert finish(peer)[0] == 0
        listener.close()
    asyncio.run(run())


def test_aclose_with_a_send_in_flight_lets_a_peer_on_the_same_loop_take_it():
    # A cancelled 1 MiB asend leaves its message in flight; the close flushes it to the
    # peer (up to 0.5 s). aclose() ran that close on the loop, so a peer served by the same
    # loop (a TensorDictServer's handler) could not take it: the loop stood still 0.5 s.
    async def run():
        got = []

        async def handler(pipe):
            try:
                async for td in pipe:
                    got.append(int(td["i"][0]))
            except tw.ClosedError:
                pass

        server = tw.TensorDictServer(0)
        serving = asyncio.create_task(server.serve(handler))
        big = lambda i: tw.TensorDict({"i": np.array([i]), "x": np.zeros(1 << 17)})  # 1 MiB
        ticks = []

        async def ticker():
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0)

        # Alone; with a task waiting in arecv() (woken by the close, its next poll waited
        # for the close's mutex on the loop); with a second aclose() at once (it waited
        # for the same mutex on the loop).
        for case in ("alone", "a reader waits", "twice", "alone"):
            pipe = await tw.TensorDictPipe.aconnect("127.0.0.1", server.port, timeout=10)
            await pipe.asend(big(0))
            sending = asyncio.create_task(pipe.asend(big(1)))
            await asyncio.sleep(0)  # posted, then abandoned
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)
            reader = asyncio.create_task(pipe.arecv()) if case == "a reader waits" else None
            tick = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            ticks.clear()
            start = time.monotonic()
            if case == "twice":
                await asyncio.gather(pipe.aclose(), pipe.aclose())
            else:
                await pipe.aclose()
            took = time.monotonic() - start
            tick.cancel()
            assert pipe.closed
            assert len(ticks) >= 1, f"{case}: the loop ran nothing while aclose() ran"
            assert took < 0.45, f"{case}: aclose() took {took:.3f} s (the flush's whole budget)"
            if reader is not None:
                with pytest.raises(tw.ClosedError):
                    await asyncio.wait_for(reader, 10)
        server.close()
        await asyncio.gather(serving, return_exceptions=True)
        assert got.count(0) == 4, got
    asyncio.run(run())


def test_aclose_closes_from_another_threads_loop_and_after_the_executor_is_shut_down():
    # Another thread's loop while this loop's aclose() waits for its executor (busy): that
    # aclose() awaited a future of this loop (RuntimeError). With the loop's executor shut
    # down (asyncio.run's last step), aclose() raised and left the pipe open.
    async def run():
        import concurrent.futures
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(1))
        server = tw.TensorDictServer(0)
        serving = asyncio.create_task(server.serve(lambda p: asyncio.sleep(3)))
        pipe = await tw.TensorDictPipe.aconnect("127.0.0.1", server.port, timeout=10)
        busy = loop.run_in_executor(None, time.sleep, 0.5)
        first = asyncio.create_task(pipe.aclose())
        await asyncio.sleep(0.05)
        out = []
        other = threading.Thread(target=lambda: out.append(asyncio.run(pipe.aclose())))
        other.start()
        while other.is_alive():
            await asyncio.sleep(0.01)
        assert out == [None] and pipe.closed
        await first
        await busy
        second = await tw.TensorDictPipe.aconnect("127.0.0.1", server.port, timeout=10)
        await loop.shutdown_default_executor()
        await second.aclose()
        assert second.closed
        server.close()
        await asyncio.gather(serving, return_exceptions=True)
    asyncio.run(run())


def test_a_task_waiting_on_a_pipe_ends_with_closed_error_when_another_task_acloses_it(tls):
    async def run():
        listener, peer, pipe = await accepted_from_py_peer("echo", 1)
        reader = asyncio.create_task(pipe.arecv())
        await asyncio.sleep(0.05)
        await asyncio.gather(pipe.aclose(), pipe.aclose())  # twice at once: one close
        with pytest.raises(tw.ClosedError):
            await asyncio.wait_for(reader, 10)
        await pipe.aclose()
        finish(peer)
        listener.close()
    asyncio.run(run())


def _in_loop_thread(coro_fn):
    """Runs ``coro_fn()`` in an event loop of its own thread; returns (thread, outcome)."""
    import threading
    outcome = {}

    def run():
        async def main():
            try:
                await coro_fn()
                outcome["r"] = "returned"
            except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
                outcome["r"] = e
        asyncio.run(main())
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, outcome


def test_closing_a_pipe_from_another_thread_ends_its_arecv_at_once():
    # The waiter's future was set from the closing thread with the fd's reader gone: the
    # loop never woke, and arecv() waited for ever.
    client, server = connected_pipes()
    t, outcome = _in_loop_thread(client.arecv)
    time.sleep(0.3)  # arecv() is waiting
    client.close()
    t.join(5)
    assert isinstance(outcome.get("r"), tw.ClosedError), outcome
    server.close()


def test_closing_a_server_from_another_thread_ends_its_serve():
    server = tw.TensorDictServer(0)

    async def handler(pipe):
        async for _ in pipe:
            pass
    t, outcome = _in_loop_thread(lambda: server.serve(handler))
    time.sleep(0.3)  # serve() is waiting for clients
    server.close()
    t.join(5)
    assert outcome.get("r") == "returned", outcome


@pytest.mark.parametrize("consolidated", [False, True])
def test_two_threads_receiving_from_one_pipe(consolidated):
    # The binding copied the received TensorDict after the receive let go of the pipe, while
    # the other thread's receive replaced it: torn objects, duplicates and losses. Now a
    # non-consolidated pipe gives each message to one thread, whole; a consolidated one
    # (which rewrites its TensorDict in place) refuses the second receiving thread.
    import threading
    n = 3000
    client, server = connected_pipes(consolidated=consolidated)
    got, errors, lock = [], [], threading.Lock()

    def receiver():
        mine = []
        try:
            while True:
                v = int(np.asarray(server.recv(timeout=20)["seq"]).reshape(-1)[0])
                if v < 0:
                    break
                mine.append(v)
        except RuntimeError as e:
            errors.append(e)
        with lock:
            got.extend(mine)
    threads = [threading.Thread(target=receiver) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.2)  # the first one waits in recv() when the second one calls it
    for i in range(n):  # a new structure every other message
        key = "a" if i % 2 else "b"
        client.send(tw.TensorDict({"seq": np.array([i]), key: np.zeros(3)}, batch_size=[]))
    for _ in range(2):
        client.send(tw.TensorDict({"seq": np.array([-1])}, batch_size=[]))
    for t in threads:
        t.join(30)
    assert sorted(got) == list(range(n))
    if consolidated:
        assert len(errors) == 1 and "another thread is receiving" in str(errors[0])
    else:
        assert not errors
    client.close()
    server.close()


def test_a_blocking_send_of_another_thread_and_asends_take_turns():
    # asend started its send whenever none was in flight, also while a blocking send() of
    # another thread held the pipe's turn between its wait and its own start: that send
    # then raised "a send is already in progress". Each waits for the other now, and every
    # message arrives once.
    import threading
    n = 1000
    client, server = connected_pipes()
    got, errors = [], []

    def receive():
        for _ in range(2 * n):
            got.append(int(server.recv(timeout=30)["x"][0]))

    def send_blocking():
        try:
            for _ in range(n):
                client.send(tw.TensorDict({"x": np.full(16, 1)}, batch_size=[]), timeout=30)
        except Exception as e:  # noqa: BLE001 - the test reports whatever it was
            errors.append(e)

    async def send_async():
        for _ in range(n):
            await client.asend(tw.TensorDict({"x": np.full(16, 2)}, batch_size=[]))

    receiver = threading.Thread(target=receive)
    blocking = threading.Thread(target=send_blocking)
    receiver.start()
    blocking.start()
    asyncio.run(asyncio.wait_for(send_async(), 60))
    blocking.join(60)
    receiver.join(60)
    assert errors == []
    assert sorted(got) == [1] * n + [2] * n
    client.close()
    server.close()


def test_an_asend_waiting_for_the_turn_completes_a_send_another_thread_left_in_flight():
    # A blocking send() of another thread holds the pipe's turn while asend wants to start,
    # then times out with its 8 MiB still in flight. asend looped on start_send, which never
    # progresses the pipe: nothing completed that send, and asend waited for ever. Now it
    # progresses the send in flight between its looks, and both messages arrive.
    import threading
    client, server = connected_pipes()
    big = tw.TensorDict({"x": np.zeros(1 << 21, np.float32)}, batch_size=[])  # a rendezvous
    small = tw.TensorDict({"x": np.full(4, 7, np.float32)}, batch_size=[])
    real = client._impl
    timed_out = []

    def blocking():
        try:
            client.send(big, timeout=0.3)
        except TimeoutError:
            timed_out.append(True)

    class TurnTakenFirst:
        """The pipe, but the first start_send finds another thread's send holding the turn."""
        first = True

        def __getattr__(self, name):
            return getattr(real, name)

        def start_send(self, td):
            if TurnTakenFirst.first:
                TurnTakenFirst.first = False
                threading.Thread(target=blocking).start()
                deadline = time.monotonic() + 10
                while not real.sending(big) and time.monotonic() < deadline:
                    time.sleep(0.001)
            return real.start_send(td)

    client._impl = TurnTakenFirst()
    got = []

    def receive():
        time.sleep(1.0)  # after the blocking send timed out
        got.append(server.recv(timeout=10)["x"].shape)
        got.append(server.recv(timeout=10)["x"].tolist())
    receiver = threading.Thread(target=receive)
    receiver.start()
    try:
        asyncio.run(asyncio.wait_for(client.asend(small), 20))
    finally:
        receiver.join(30)
        client._impl = real
    assert timed_out == [True]
    assert got == [(1 << 21,), [7.0] * 4]
    client.close()
    server.close()


def test_serve_with_a_plain_function_says_the_handler_must_be_async():
    # It was asyncio's "An asyncio.Future, a coroutine or an awaitable is required".
    async def run():
        server = tw.TensorDictServer(0)
        task = asyncio.ensure_future(server.serve(lambda pipe: None))
        loop = asyncio.get_running_loop()

        def client():
            with tw.TensorDictPipe.connect("127.0.0.1", server.port, timeout=10):
                pass

        await loop.run_in_executor(None, client)
        with pytest.raises(TypeError, match=r"the handler must be an async function \(async def "
                                            r"handler\(pipe\)\); it returned NoneType"):
            await asyncio.wait_for(task, 10)
        server.close()

    asyncio.run(run())


def test_aaccept_looks_at_the_listener_while_no_client_comes(monkeypatch):
    # A connection that never sends a byte the listener can read wakes nothing; the look
    # that shuts it down (docs/reliability.md) runs in accept(0), which aaccept() calls at
    # least every _LOOK_S while it sleeps.
    import tensorwire.pipe as twpipe

    class Counting:
        def __init__(self, impl):
            self.impl, self.looks = impl, 0

        def accept(self, timeout, single):
            self.looks += 1
            return self.impl.accept(timeout, single)

        def __getattr__(self, name):
            return getattr(self.impl, name)

    monkeypatch.setattr(twpipe, "_LOOK_S", 0.05)
    listener = tw.PipeListener(0)
    try:
        listener._impl = counting = Counting(listener._impl)
        with pytest.raises(TimeoutError, match="timed out after 0.6 s"):
            asyncio.run(listener.aaccept(timeout=0.6))
        assert counting.looks >= 5
    finally:
        listener.close()
