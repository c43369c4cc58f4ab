"""Helpers shared by the inference tests. Module-level functions, so spawned processes
can import them (multiprocessing's spawn start method pickles functions by name)."""
import os
import time

import numpy as np

import tensorwire as tw
from conftest import PYTHONPATH as PYTHON_DIR  # python/ for the source tree, nothing for a wheel


def request_spec():
    return tw.TensorDict({"observation": np.zeros(4, np.float32)})


def response_spec(with_version=True):
    d = {"action": np.zeros(2, np.float32)}
    if with_version:
        d["policy_version"] = np.zeros((), np.int64)
    return tw.TensorDict(d)


def observation(base):
    return tw.TensorDict({"observation": np.arange(base, base + 4, dtype=np.float32)})


def double_policy(batch):
    """action = 2 * observation[:, :2]"""
    out = tw.TensorDict(batch_size=batch.batch_size)
    out["action"] = batch["observation"][:, :2] * 2
    return out


def slow_double_policy(batch, delay=0.3):
    time.sleep(delay)
    return double_policy(batch)


def make_shm(num_slots=8, **kw):
    return tw.SharedMemoryTransport(request_spec(), response_spec(), num_slots=num_slots, **kw)


def actor(client, base, count, queue):
    """Calls `count` times and reports how many answers were right."""
    right = 0
    for i in range(count):
        r = client(observation(base + i), timeout=30)
        right += float(r["action"][0]) == 2.0 * (base + i)
    queue.put((base, right))


def hold(client, ready):
    """Submits one request, says so, and waits to be killed."""
    f = client.submit(observation(1))
    ready.set()
    time.sleep(600)
    f.result()


def serve_forever(name, ready, delay):
    """A server process: creates the transport under `name` and serves until killed."""
    t = tw.SharedMemoryTransport(request_spec(), response_spec(), num_slots=2, name=name)
    server = tw.InferenceServer(lambda b: slow_double_policy(b, delay), t)
    server.start()
    ready.set()
    time.sleep(600)


def dev_shm():
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


FOREIGN_SHM = ("ucx", "sem.", "torch_", "psm_", "mp-", "pym-")


def new_shm_entries(before):
    """/dev/shm entries that appeared since `before` and are not other libraries'."""
    return sorted(n for n in dev_shm() - before if not n.startswith(FOREIGN_SHM))


def live_children():
    import psutil

    kids = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd or p.status() == psutil.STATUS_ZOMBIE:
            continue
        kids.append((p.pid, cmd))
    return kids


def wait_until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()
