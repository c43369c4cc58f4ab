import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The PYTHONPATH for the Python processes tests start: the source tree's python/ when the suite
# runs against it (`make test-python`), nothing when it runs against an installed wheel
# (`make test-wheel`), whose children must import the installed package as this process did.
import tensorwire  # noqa: E402

PYTHONPATH = os.path.join(ROOT, "python") \
    if os.path.realpath(os.path.dirname(tensorwire.__file__)) == os.path.realpath(os.path.join(ROOT, "python", "tensorwire")) \
    else ""


@pytest.fixture(scope="session")
def tensorwire_bin():
    """The tensorwire command built by `make build` (or on PATH after pip install)."""
    path = os.environ.get("TENSORWIRE_BIN") or os.path.join(ROOT, "build", "tools", "tensorwire")
    if not os.path.exists(path):
        path = shutil.which("tensorwire")
    assert path and os.path.exists(path), "the tensorwire command is not built: run `make build`"
    return path


def run(cmd, **kw):
    # Below the 120 s per-test timeout: subprocess.run then kills a command that hangs, where
    # pytest-timeout firing first would end the test and leave the command running.
    return subprocess.run(cmd, capture_output=True, text=True, timeout=100, **kw)



NOBODY = 65534


def as_user(uid, fn, nproc=None):
    """Runs fn() in a forked child under `uid`, with RLIMIT_NPROC (soft, hard) = `nproc`
    set first when given (root is exempt from that limit, another user is not); returns
    ("ok", repr(result)) or (exception type name, message)."""
    assert os.geteuid() == 0, "these tests change user: they run as root (like the suite)"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never return into pytest
        try:
            os.close(r)
            if nproc is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, nproc)
            os.setgid(uid)
            os.setuid(uid)
            try:
                out = ("ok", repr(fn()))
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                out = (type(e).__name__, str(e))
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return tuple(json.loads(data))

def stop_process(pid):
    """SIGSTOPs `pid` and returns once it is stopped: kill() returns before the stop takes
    hold, and a process running on another CPU meanwhile still answers a request or two."""
    os.kill(pid, signal.SIGSTOP)
    while (state := open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1][0]) != "T":
        if state in "ZX":
            raise AssertionError(f"process {pid} exited instead of stopping")
        time.sleep(0.001)


def connected_pipes(**kw):
    """(client, server): a client's pipe and the listener's pipe to it, in this process (the
    handshake needs both sides running); `kw` goes to both (consolidated, auth_key, ...)."""
    from concurrent.futures import ThreadPoolExecutor
    with tensorwire.PipeListener(0, **kw) as listener, ThreadPoolExecutor(1) as pool:
        accepted = pool.submit(listener.accept, timeout=30)
        client = tensorwire.TensorDictPipe.connect("127.0.0.1", listener.port, timeout=30, **kw)
        return client, accepted.result(timeout=30)

# ---- no leftovers after the whole suite ------------------------------------------------
# Every process a test starts (peers, workers, servers) must be gone when the suite ends,
# and so must any shared memory it created. Processes are told apart from others on the
# machine by their start time (after the session began) and their command line naming this
# checkout or a tensorwire peer.

def _clock_ticks_now():
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK")


def _ours_started_after(ticks):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] == "Z" or float(fields[19]) < ticks:
            continue
        # multiprocessing's resource tracker / forkserver serve this interpreter and end
        # with it (they wait for its end of a pipe): not leftovers of a test.
        if "from multiprocessing." in cmd and int(fields[1]) == os.getpid():
            continue
        if ROOT in cmd or "tensorwire" in cmd or "pipe_peer" in cmd:
            found.append(f"{pid}: {cmd[:160]}")
    return found


def _shm_names():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def pytest_sessionstart(session):
    # A suite started in the background by a non-interactive shell (`make test &`) inherits
    # SIGINT ignored, and so would every child: Python then installs no KeyboardInterrupt
    # handler and the Ctrl-C tests' real SIGINTs do nothing. Children inherit a handled
    # SIGINT as the default disposition, so give this process Python's own handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    session.config._tw_start_ticks = _clock_ticks_now()
    session.config._tw_shm = _shm_names()


def pytest_sessionfinish(session, exitstatus):
    start = getattr(session.config, "_tw_start_ticks", None)
    if start is None:
        return
    deadline = time.monotonic() + 10  # processes being reaped get a moment
    while True:
        procs = _ours_started_after(start)
        shm = sorted(_shm_names() - session.config._tw_shm)
        if (not procs and not shm) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if procs or shm:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["", "leftovers after the test suite:"] + [f"  process {p}" for p in procs] + \
                [f"  /dev/shm/{n}" for n in shm]
        if tr:
            tr.write_line("\n".join(lines), red=True)
        else:
            print("\n".join(lines))
        session.exitstatus = 1


# ---- simulated hosts (tests/python/hosts.py) ------------------------------------------
# Network namespaces joined by a switch, removed after the test whatever happens.

@pytest.fixture
def hosts():
    """Two simulated hosts, hosts[0] and hosts[1] (hosts.py)."""
    from hosts import Hosts
    with Hosts(2) as h:
        yield h


@pytest.fixture
def three_hosts():
    """Three simulated hosts on one switch (hosts.py)."""
    from hosts import Hosts
    with Hosts(3) as h:
        yield h
