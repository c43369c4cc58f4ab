"""Real processes: clients in forked and spawned children and in an unrelated process that
attaches by name; clients and servers killed with SIGKILL. Every test ends with no child
process left and nothing new in /dev/shm."""
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import tensorwire as tw
from _inference_common import (PYTHON_DIR, actor, dev_shm, double_policy, hold, live_children,
                                make_shm, new_shm_entries, observation, serve_forever,
                                slow_double_policy, wait_until)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def no_leftovers():
    before = dev_shm()
    yield
    assert new_shm_entries(before) == []
    assert wait_until(lambda: not live_children(), 5), live_children()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_clients_in_child_processes(method):
    ctx = mp.get_context(method)
    t = make_shm(8)
    with tw.InferenceServer(double_policy, t, max_batch_size=8) as server:
        q = ctx.Queue()
        procs = [ctx.Process(target=actor, args=(t.client(), 1000 * k, 200, q)) for k in range(4)]
        for p in procs:
            p.start()
        results = sorted(q.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
        assert results == [(1000 * k, 200) for k in range(4)]
        assert server.stats()["requests"] == 800
    assert t.slots_in_use == 0


def test_a_client_made_before_a_fork_is_used_by_parent_and_children():
    ctx = mp.get_context("fork")
    t = make_shm(4)
    with tw.InferenceServer(double_policy, t):
        c = t.client()
        assert float(c(observation(1), timeout=5)["action"][0]) == 2  # connected in the parent
        q = ctx.Queue()
        procs = [ctx.Process(target=actor, args=(c, 100 * k, 100, q)) for k in range(3)]
        for p in procs:
            p.start()
        assert sorted(q.get(timeout=60) for _ in procs) == [(0, 100), (100, 100), (200, 100)]
        for p in procs:
            p.join(10)
        assert float(c(observation(2), timeout=5)["action"][0]) == 4


def test_the_transport_pickles_to_its_name():
    ctx = mp.get_context("spawn")
    t = make_shm(2)
    with tw.InferenceServer(double_policy, t):
        q = ctx.Queue()
        p = ctx.Process(target=_client_from_transport, args=(t, q))
        p.start()
        assert q.get(timeout=60) == 10.0
        p.join(10)


def _client_from_transport(transport, q):
    assert not transport.is_owner
    q.put(float(transport.client()(observation(5), timeout=10)["action"][0]))


@pytest.mark.parametrize("kind", ["shared_memory", "socket"])
def test_an_unrelated_process_attaches_by_name(kind):
    t = make_shm(4) if kind == "shared_memory" else tw.SocketTransport()
    code = textwrap.dedent(f"""
        import numpy as np, tensorwire as tw
        c = tw.{'SharedMemoryTransport' if kind == 'shared_memory' else 'SocketTransport'}.client_for({t.name!r})
        for i in range(300):
            r = c(tw.TensorDict({{"observation": np.full(4, i, np.float32)}}), timeout=10)
            assert float(r["action"][0]) == 2 * i
        print("done")
    """)
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    with tw.InferenceServer(double_policy, t) as server:
        procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            assert out.strip() == "done"
        assert server.stats()["requests"] == 600


def test_a_client_killed_mid_request_does_not_keep_its_slot():
    ctx = mp.get_context("fork")
    t = make_shm(1)
    with tw.InferenceServer(lambda b: slow_double_policy(b, 0.3), t):
        ready = ctx.Event()
        p = ctx.Process(target=hold, args=(t.client(), ready))
        p.start()
        assert ready.wait(10)
        assert t.slots_in_use == 1
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert p.exitcode == -signal.SIGKILL
        assert wait_until(lambda: t.slots_in_use == 0, 5), "the dead client's slot was not reclaimed"
        assert float(t.client()(observation(4), timeout=5)["action"][0]) == 8


def test_a_spawned_client_killed_before_the_server_starts_is_reclaimed():
    ctx = mp.get_context("spawn")
    t = make_shm(1)
    ready = ctx.Event()
    p = ctx.Process(target=hold, args=(t.client(), ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert wait_until(lambda: t.slots_in_use == 0, 5)
    with tw.InferenceServer(double_policy, t):
        assert float(t.client()(observation(1), timeout=5)["action"][0]) == 2


def test_a_killed_server_process_is_detected_within_five_seconds():
    ctx = mp.get_context("spawn")
    name = f"tensorwire-test-{os.getpid()}-killed-server"
    ready = ctx.Event()
    server = ctx.Process(target=serve_forever, args=(name, ready, 60.0))
    server.start()
    assert ready.wait(30)
    c = tw.SharedMemoryTransport.client_for(name)
    f = c.submit(observation(1))  # the policy sleeps for a minute
    time.sleep(0.2)
    os.kill(server.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited"):
        f.result()
    assert time.monotonic() - t0 < 5
    server.join(10)


def test_a_shut_down_server_is_detected_by_a_waiting_client():
    t = make_shm(1)
    server = tw.InferenceServer(double_policy, t)
    c = t.client()
    f = c.submit(observation(1))  # not served yet: the server is not started
    server.start()
    f.result(timeout=5)
    server.shutdown()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="shut"):
        c(observation(1))
    assert time.monotonic() - t0 < 5


def test_socket_transport_clients_in_spawned_processes():
    ctx = mp.get_context("spawn")
    t = tw.SocketTransport()
    with tw.InferenceServer(double_policy, t, max_batch_size=8):
        q = ctx.Queue()
        procs = [ctx.Process(target=actor, args=(t.client(), 100 * k, 100, q)) for k in range(3)]
        for p in procs:
            p.start()
        assert sorted(q.get(timeout=60) for _ in procs) == [(0, 100), (100, 100), (200, 100)]
        for p in procs:
            p.join(10)


def _big_request(name, q):
    import numpy as np
    c = tw.SharedMemoryTransport.client_for(name)
    r = c({"obs": np.full(64 << 20, 3, np.uint8)}, timeout=30)
    t = tw.SharedMemoryTransport.attach(name, timeout=10)
    spec = t.request_spec
    q.put((float(r["action"][0]), tuple(spec["obs"].shape), int(spec["obs"].max())))


def test_a_spec_of_64_mib_or_more_reaches_a_client_in_another_process():
    # A client is sent the specs' structure, not their values: a 64 MiB leaf was sent whole
    # to every client and did not fit in a socket message (64 MiB at most), so a client in
    # another process failed with "peer closed the socket".
    import numpy as np
    t = tw.SharedMemoryTransport({"obs": np.full(64 << 20, 1, np.uint8)},
                                 {"action": np.zeros(1, np.float32)}, num_slots=1)

    def policy(batch):
        return tw.TensorDict({"action": batch["obs"][:, :1].astype(np.float32)}, batch_size=[1])

    with tw.InferenceServer(policy, t):
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_big_request, args=(t.name, q))
        p.start()
        # The values of the attached spec are zero: only its structure travelled.
        assert q.get(timeout=60) == (3.0, (64 << 20,), 0)
        p.join(10)
        assert p.exitcode == 0


def _child_uses_inherited_server(server, queue):
    out = {"is_alive": server.is_alive}
    for name, call in (("stats", server.stats), ("update_model", lambda: server.update_model(
            lambda policy: None, timeout=2))):
        try:
            call()
            out[name] = "no error"
        except tw.ClosedError as e:
            out[name] = str(e)
    queue.put(out)


def test_a_forked_child_cannot_use_its_parents_server_and_the_parent_goes_on():
    # update_model() ran fn on the child's copy of the policy and returned as if done; stats()
    # reported the copy's.
    ctx = mp.get_context("fork")
    transport = make_shm(4)
    with tw.InferenceServer(double_policy, transport) as server:
        q = ctx.Queue()
        p = ctx.Process(target=_child_uses_inherited_server, args=(server, q))
        p.start()
        out = q.get(timeout=60)
        p.join(30)
        assert p.exitcode == 0 and out["is_alive"] is False
        for name in ("stats", "update_model"):
            assert f"InferenceServer.{name}(): this server serves in process {os.getpid()}" in \
                out[name] and "forked child cannot use it" in out[name]
        assert transport.client()(observation(1), timeout=10)["action"].tolist() == [2.0, 4.0]
    transport.close()
