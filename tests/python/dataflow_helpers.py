"""Dataflows and process checks shared by the test_dataflow_*.py files."""
import multiprocessing
import os
import select
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Counting:
    """Datapoint i: [uint8 array of `n` bytes filled with i % 251, i, "dp<i>"]; `size` per pass."""

    def __init__(self, size=10, n=16):
        self.size, self.n = size, n
        self.resets = 0

    def reset_state(self):
        self.resets += 1

    def __iter__(self):
        for i in range(self.size):
            yield [np.full(self.n, i % 251, np.uint8), i, f"dp{i}"]

    def __len__(self):
        return self.size


class Endless(Counting):
    def __iter__(self):
        i = 0
        while True:
            yield [np.full(self.n, i % 251, np.uint8), i, f"dp{i}"]
            i += 1

    def __len__(self):
        raise NotImplementedError


def check(dp):
    arr, i, name = dp
    assert isinstance(arr, np.ndarray) and isinstance(i, int) and name == f"dp{i}"
    assert (arr == i % 251).all()
    return i


def same_structure(a, b):
    """Asserts equal values of the same types, recursively (arrays: dtype, shape, values)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same_structure(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same_structure(a[k], b[k])
    elif isinstance(a, np.ndarray):
        # The dtype's type too: int64 as numpy makes it (long), not an equal longlong.
        assert a.dtype.type is b.dtype.type and a.shape == b.shape and (a == b).all()
    else:
        assert a == b


def children():
    """Pids of this process's children (zombies included)."""
    me = os.getpid()
    out = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == me and not _is_python_helper(int(d)):
            out.add(int(d))
    return out


def _is_python_helper(pid):
    """multiprocessing's resource tracker and forkserver: started lazily by whichever test
    first needs them, they live as long as the interpreter; they are not workers."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"resource_tracker" in cmd or b"forkserver" in cmd


def shm_files():
    """Files in /dev/shm, but for multiprocessing's semaphores (sem.mp-*): tensorwire never
    creates those, and other test suites running on the same machine do."""
    try:
        return {f for f in os.listdir("/dev/shm") if not f.startswith("sem.mp-")}
    except FileNotFoundError:
        return set()


def _describe(pids):
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
            out.append(f"{pid}: {cmd}")
        except OSError:
            out.append(f"{pid}: (gone)")
    return "; ".join(out)


@pytest.fixture(autouse=True)
def no_leftovers():
    """Each test leaves no child process and no /dev/shm file behind."""
    import gc

    before, shm_before = children(), shm_files()
    yield
    gc.collect()
    deadline = time.monotonic() + 15  # a loaded 2-core machine reaps slowly
    while children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = children() - before
    assert left == set(), f"worker processes left behind: {_describe(left)}"
    assert shm_files() - shm_before == set(), "files left in /dev/shm"


def ends_within(pid, seconds):
    """True when process `pid` (not necessarily our child) has ended within `seconds`."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        r, _, _ = select.select([fd], [], [], seconds)
        return bool(r)
    finally:
        os.close(fd)


def python(script, **kw):
    """Runs `script` in a fresh interpreter with tensorwire importable; a Popen."""
    from conftest import PYTHONPATH
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (PYTHONPATH, os.path.join(ROOT, "tests", "python")) if p))
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **kw)


def run_script(script, timeout=120):
    """Runs `script` (python()) to its end; asserts it exited 0 (its stderr otherwise) and
    returns its stdout."""
    proc = python(script)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def in_child(method, target, *args):
    """Runs target(*args, q) in a multiprocessing child started by `method` ("fork" or
    "spawn"); returns what it put in q (waited for 60 s) and its exit code (joined, 30 s)."""
    ctx = multiprocessing.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    got = q.get(timeout=60)
    p.join(30)
    return got, p.exitcode
