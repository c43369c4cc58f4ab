"""What a new user gets wrong with the dataflow runners: never a hang, never a silent loss,
an error that says what to do; Ctrl-C, fork and spawn."""
import ast
import collections
import enum
import errno
import multiprocessing
import os
import pickle
import signal
import sys
import time
import warnings

import numpy as np
import pytest

import tensorwire
from tensorwire import dataflow as twdf
from conftest import NOBODY, as_user
from dataflow_helpers import Counting, check, in_child, no_leftovers, python, run_script  # noqa: F401


class Empty:
    def reset_state(self):
        pass

    def __iter__(self):
        return iter(())


class EmptyWithLen(Empty):
    def __len__(self):
        return 5


@pytest.mark.parametrize("flow", [Empty, EmptyWithLen])
def test_a_dataflow_that_yields_nothing_raises_instead_of_blocking(flow):
    with twdf.MultiProcessRunnerZMQ(flow(), num_proc=1) as r:
        r.reset_state()
        t0 = time.monotonic()
        with pytest.raises(ValueError, match="no datapoint in a whole pass"):
            next(iter(r))
        assert time.monotonic() - t0 < 10


def test_a_map_that_drops_every_datapoint_raises_instead_of_blocking():
    with twdf.MultiProcessMapDataZMQ(Counting(6), 2, lambda dp: None, buffer_size=4) as m:
        m.reset_state()
        # 1,000 in a row at least (a random filter may drop a whole pass of 6 now and then)
        with pytest.raises(ValueError, match="returned None for all 1002 datapoints of the last "
                                             "167 passes"):
            next(iter(m))


class PassNumbered(twdf.DataFlow):
    """Two datapoints [pass, i] per pass (the map's dataflow runs in the main process)."""

    def __init__(self):
        self.passes = 0

    def __iter__(self):
        p, self.passes = self.passes, self.passes + 1
        for i in range(2):
            yield [p, i]


def test_a_map_that_drops_a_whole_small_pass_now_and_then_goes_on():
    # tensorpack's non-strict map is endless and skips what the map drops; a pass of two
    # datapoints both dropped (a random crop failing half of the time) raised ValueError.
    # Here every pass but one in three is dropped whole.
    with twdf.MultiProcessMapDataZMQ(PassNumbered(), 2, lambda dp: dp if dp[0] % 3 == 0 else None,
                                     buffer_size=2) as m:
        m.reset_state()
        it = iter(m)
        got = [next(it)[0] for _ in range(20)]
        assert all(p % 3 == 0 for p in got) and max(got) >= 27


def make_runner():
    r = twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=1)
    r.reset_state()
    return r


def make_map():
    m = twdf.MultiProcessMapDataZMQ(Counting(5), 1, lambda dp: dp, strict=True)
    m.reset_state()
    return m


@pytest.mark.parametrize("make", [make_runner, make_map])
def test_an_iterator_keeps_its_runner_alive(make):
    got = [check(dp) for dp in make()]
    assert sorted(got) == [0, 1, 2, 3, 4]


def test_map_func_must_be_callable():
    with pytest.raises(TypeError, match="map_func must be callable, got a int"):
        twdf.MultiProcessMapDataZMQ(Counting(5), 1, 42)


@pytest.mark.parametrize("size", [0, -5])
def test_buffer_size_is_checked_with_a_clear_message(size):
    with pytest.raises(ValueError, match="buffer_size must be at least 1"):
        twdf.MultiProcessMapDataZMQ(Counting(5), 1, lambda dp: dp, buffer_size=size)


def test_a_count_beyond_its_type_names_the_bound_it_is_beyond():
    # Not the C type's whole range: hwm must be at least 1, which its C++ check says.
    with pytest.raises(ValueError, match="hwm must be at most 2147483647, got 1099511627776"):
        twdf.MultiProcessRunnerZMQ(Counting(5), 1, hwm=2 ** 40)
    with pytest.raises(ValueError, match="hwm must be at least 1"):
        twdf.MultiProcessRunnerZMQ(Counting(5), 1, hwm=-1)


@pytest.mark.parametrize("size", [sys.maxsize, 2 ** 31, 65537])
def test_a_buffer_beyond_the_limit_is_refused_not_filled_for_ever(size):
    # A non-strict map fills its buffer from a repeating dataflow before anything comes
    # back: sys.maxsize ("no limit") never returned from reset_state().
    with pytest.raises(ValueError, match=f"buffer_size must be at most 65536 .*, got {size}"):
        twdf.MultiProcessMapDataZMQ(Counting(5), 1, lambda dp: dp, buffer_size=size)


@pytest.mark.parametrize("hwm", [0, -1])
def test_hwm_is_checked_with_a_clear_message(hwm):
    with pytest.raises(ValueError, match="hwm must be at least 1"):
        twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=1, hwm=hwm)
    with pytest.raises(ValueError, match=r"hwm must be >= 0 \(0: no limit\), got -1"):
        twdf.RemoteDataZMQ("tcp://127.0.0.1:*", hwm=-1)
    with pytest.raises(ValueError, match=r"hwm must be >= 0 \(0: no limit\), got -1"):
        _send(hwm=-1)


def test_hwm_0_is_zeromqs_no_limit_on_both_ends_of_a_remote_link():
    # tensorpack passes hwm to ZeroMQ, where 0 means no limit; code written for it may too.
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*", hwm=0)
    r.reset_state()
    try:
        assert _send(addr=r.endpoint(), hwm=0, max_datapoints=3) == 3
        it = iter(r)
        assert [next(it)[1] for _ in range(3)] == [0, 1, 2]
    finally:
        r.close()


def test_num_proc_is_checked_once_with_a_clear_message():
    with pytest.raises(ValueError, match=r"num_proc must be in \[1, 1024\], got 0"):
        twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=0)
    with pytest.raises(ValueError, match=r"num_proc must be in \[1, 1024\], got -1"):
        twdf.MultiProcessMapDataZMQ(Counting(5), -1, lambda dp: dp)


def _send(**kw):
    return twdf.send_dataflow_zmq(Counting(3), kw.pop("addr", "tcp://127.0.0.1:1"), **kw)


@pytest.mark.parametrize("make, error, match", [
    # Each was nanobind's "incompatible function arguments" and a dump of the signature.
    (lambda: twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=2.0), TypeError,
     "num_proc must be an integer, got float"),
    (lambda: twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=1, hwm=None), TypeError,
     "hwm must be an integer, got NoneType"),
    (lambda: twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=1, seed=-1), ValueError,
     r"seed must be None or an integer in \[0, 2\*\*64\), got -1"),
    (lambda: twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=1, seed=2**64), ValueError,
     r"seed must be None or an integer in \[0, 2\*\*64\), got 18446744073709551616"),
    (lambda: twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=2**40), ValueError,
     r"num_proc must be at most 2147483647, got 1099511627776"),
    (lambda: twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=1, hwm=2**70), ValueError,
     r"hwm must be at most 2147483647, got 1180591620717411303424"),
    (lambda: twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=1, seed="x"), TypeError,
     "seed must be None or an integer, got str"),
    (lambda: twdf.MultiProcessRunnerZMQ(None, num_proc=1), TypeError,
     r"ds must be a DataFlow \(iterable, with reset_state\(\)\), got NoneType"),
    (lambda: twdf.MultiProcessRunnerZMQ([1, 2, 3], num_proc=1), TypeError,
     r"ds must be a DataFlow .*got list \(it has no reset_state\(\)"),
    (lambda: twdf.MultiProcessMapDataZMQ([1, 2], 1, lambda dp: dp), TypeError,
     r"got list \(it has no reset_state\(\)"),
    (lambda: twdf.send_dataflow_zmq([1, 2], "tcp://127.0.0.1:1", max_datapoints=1), TypeError,
     r"got list \(it has no reset_state\(\)"),
    (lambda: twdf.MultiProcessMapDataZMQ(Counting(5), 1, None), TypeError,
     "map_func must be callable, got a NoneType"),
    (lambda: twdf.MultiProcessMapDataZMQ(Counting(5), 1, lambda dp: dp, strict="yes"),
     TypeError, "strict must be a bool, got str"),
    (lambda: twdf.RemoteDataZMQ(5), TypeError, "addr1 must be a str, got int"),
    (lambda: _send(max_datapoints=-1), ValueError, "max_datapoints must be at least 1"),
    (lambda: _send(addr=None, max_datapoints=1), TypeError, "addr must be a str, got NoneType"),
])
def test_arguments_of_the_wrong_type_or_sign_get_an_error_naming_them(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("make", [make_runner, make_map])
def test_every_use_of_a_closed_runner_is_a_closed_error(make):
    r = make()
    r.close()
    with pytest.raises(tensorwire.ClosedError):
        next(iter(r))
    with pytest.raises(tensorwire.ClosedError):
        r.reset_state()
    assert "closed" in repr(r)


class Slow:
    """Endless, a datapoint every 20 ms: the consumer mostly waits in the runner."""

    def reset_state(self):
        pass

    def __iter__(self):
        i = 0
        while True:
            time.sleep(0.02)
            yield [np.full(16, i % 251, np.uint8), i, f"dp{i}"]
            i += 1


def slow_runner():
    return twdf.MultiProcessRunnerZMQ(Slow(), num_proc=1)


def slow_map():
    return twdf.MultiProcessMapDataZMQ(Slow(), 1, lambda dp: dp)


@pytest.mark.parametrize("make", [slow_runner, slow_map])
def test_close_from_another_thread_ends_an_iteration_with_closed_error(make):
    # As tensorwire.dataflow's exit hook does to a daemon thread that iterates: the
    # iteration ends with ClosedError, the workers are reaped, nothing is used after it is
    # freed (before: "Socket operation on non-socket", a false WorkerDiedError, a crash).
    import threading

    r = make()
    r.reset_state()
    it = iter(r)
    check(next(it))
    ended = []

    def consume():
        try:
            for dp in it:
                check(dp)
        except BaseException as e:  # noqa: B036 - what ended it is the point
            ended.append(e)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.3)
    start = time.monotonic()
    r.close()
    t.join(10)
    assert not t.is_alive()
    assert time.monotonic() - start < 5
    assert len(ended) == 1 and isinstance(ended[0], tensorwire.ClosedError), ended
    assert "closed" in repr(r) and r.pids == []
    with pytest.raises(tensorwire.ClosedError):
        next(iter(r))


def test_a_daemon_thread_waiting_in_an_iteration_at_exit_ends_quietly():
    # The exit hook of tensorwire.dataflow closes the runner, which wakes the consumer; the
    # extension's own hook, which runs next, lets it take the GIL back before finalization
    # (else CPython ends it mid-unwind: "terminate called without an active exception").
    import subprocess
    import sys
    from conftest import PYTHONPATH

    script = f"""
import sys, threading, time
sys.path.insert(0, {os.path.dirname(__file__)!r})
import tensorwire
from test_dataflow_hardening import Slow
from tensorwire.dataflow import MultiProcessRunnerZMQ
r = MultiProcessRunnerZMQ(Slow(), num_proc=1)
r.reset_state()
def consume():
    try:
        for dp in r:
            pass
    except tensorwire.ClosedError:
        print("closed", flush=True)
threading.Thread(target=consume, daemon=True).start()
time.sleep(0.5)
"""
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=PYTHONPATH), timeout=120)
        assert out.returncode == 0 and out.stderr == "", (out.returncode, out.stderr)


def _recv_in_a_thread(r, timeout=None):
    """A started thread waiting in r.recv(timeout), and the list that gets what ended it."""
    import threading
    ended = []

    def wait():
        try:
            r.recv(timeout=timeout)
        except BaseException as e:  # noqa: B036 - what ended it is the point
            ended.append(e)
    t = threading.Thread(target=wait)
    t.start()
    return t, ended


def test_close_of_a_remote_from_another_thread_ends_its_recv_with_closed_error():
    # The same for RemoteDataZMQ (before: OSError 'zmq poll: Socket operation on
    # non-socket', 9 runs of 9).
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    r.reset_state()
    t, ended = _recv_in_a_thread(r)
    time.sleep(0.3)
    r.close()
    t.join(10)
    assert not t.is_alive()
    assert len(ended) == 1 and isinstance(ended[0], tensorwire.ClosedError), ended
    with pytest.raises(tensorwire.ClosedError):
        r.recv(timeout=0)


@pytest.mark.parametrize("kind", ["MultiProcessRunnerZMQ(Counting(5), num_proc=1)",
                                  "MultiProcessMapDataZMQ(Counting(5), 1, lambda dp: dp)"])
def test_an_iterator_in_a_reference_cycle_with_its_runner_is_collected_safely(kind):
    # The collector breaking the cycle clears the runner object's attributes first; the
    # iterator ends its epoch afterwards, in a runner it must still hold. Freed memory is
    # scribbled over (MALLOC_PERTURB_, no tcache), so a use after free crashes.
    import subprocess
    import sys
    from conftest import PYTHONPATH

    script = f"""
import gc, sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from dataflow_helpers import Counting
from tensorwire.dataflow import MultiProcessRunnerZMQ, MultiProcessMapDataZMQ
r = {kind}
r.reset_state()
r._it = iter(r)
next(r._it)
del r
gc.collect()
print("collected")
"""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, MALLOC_PERTURB_="90",
               GLIBC_TUNABLES="glibc.malloc.tcache_count=0")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "collected", (out.returncode, out.stderr)


def test_reset_state_after_close_forks_nothing():
    r = twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=2)
    r.close()
    with pytest.raises(tensorwire.ClosedError):
        r.reset_state()
    assert r.pids == []


def test_reprs_say_the_state():
    r = twdf.MultiProcessRunnerZMQ(Counting(5), num_proc=1)
    assert "num_proc=1" in repr(r) and "not started" in repr(r)
    r.reset_state()
    assert f"workers [{r.pids[0]}]" in repr(r)
    r.close()
    assert "closed" in repr(r)
    remote = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    assert "not started" in repr(remote)
    remote.reset_state()
    assert remote.endpoint() in repr(remote) and "rejected 0" in repr(remote)
    remote.close()
    assert "closed" in repr(remote)
    with pytest.raises(tensorwire.ClosedError):
        remote.recv(timeout=0)


def test_remote_timeouts_mean_the_same_as_everywhere():
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    r.reset_state()
    assert r.recv(timeout=0) is None
    t0 = time.monotonic()
    assert r.recv(timeout=0.2) is None
    assert 0.15 < time.monotonic() - t0 < 5
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            r.recv(timeout=bad)
    r.close()


PRODUCER = """
import numpy as np
from tensorwire.dataflow import send_dataflow_zmq
class Mixed:
    def reset_state(self): pass
    def __iter__(self):
        for i in range(4):
            yield [i, complex(i, 1)] if i % 2 else [i, "plain"]
send_dataflow_zmq(Mixed(), {addr!r}, max_datapoints=4)
"""


def test_recv_follows_errors_warn_for_a_pickled_message_and_counts_it():
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*", errors="warn")
    r.reset_state()
    p = python(PRODUCER.format(addr=r.endpoint()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [r.recv(timeout=20), r.recv(timeout=20)]
        deadline = time.monotonic() + 20
        while r.rejected < 2 and time.monotonic() < deadline:
            assert r.recv(timeout=0.2) is None  # the last one is rejected: nothing comes
    assert [dp[0] for dp in got] == [0, 2]
    assert r.rejected == 2
    msgs = [str(w.message) for w in caught if issubclass(w.category, twdf.MalformedMessageWarning)]
    assert len(msgs) == 2 and all("does not unpickle" in m for m in msgs)
    p.communicate(timeout=60)
    assert p.returncode == 0
    r.close()


def test_send_with_no_receiver_blocks_and_ctrl_c_ends_it():
    p = python("""
import sys, time
from tensorwire.dataflow import send_dataflow_zmq
from dataflow_helpers import Counting
print("ready", flush=True)
try:
    send_dataflow_zmq(Counting(5), "tcp://127.0.0.1:9", max_datapoints=3)
    print("returned")
except KeyboardInterrupt:
    print("interrupted")
""")
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    assert p.poll() is None  # still blocked: nothing was delivered
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert out.strip() == "interrupted", err


CTRL_C = """
import time
import numpy as np
from tensorwire import dataflow as twdf

class Late:
    # The first datapoint comes after 3 s: the main process is blocked in next() until then.
    def reset_state(self): pass
    def __iter__(self):
        time.sleep(3)
        while True:
            yield [np.zeros(4), 1]

r = twdf.MultiProcessRunnerZMQ(Late(), num_proc=1)
r.reset_state()
it = iter(r)
print("ready", flush=True)
t0 = None
try:
    next(it)
    print("no interrupt", flush=True)
except KeyboardInterrupt:
    t = time.monotonic()
    print("interrupted", flush=True)
    print(input(), t, flush=True)  # the parent's send time comes back with ours
dp = next(iter(r))  # usable afterwards: a new iteration
print("again", dp[1], flush=True)
r.close()
"""


def test_ctrl_c_interrupts_a_blocked_iteration_and_the_runner_goes_on():
    p = python(CTRL_C, stdin=__import__("subprocess").PIPE)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    assert p.stdout.readline().strip() == "interrupted"
    p.stdin.write(f"{sent}\n")
    p.stdin.flush()
    sent_back, got = map(float, p.stdout.readline().split())
    latency = got - sent_back
    print(f"KeyboardInterrupt {latency * 1000:.1f} ms after SIGINT")
    assert latency < 1.0
    assert p.stdout.readline().strip() == "again 1"
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err


def _child_uses_own_runner(q):
    with twdf.MultiProcessRunnerZMQ(Counting(4), num_proc=1) as r:
        r.reset_state()
        q.put(sorted(check(dp) for dp in r))


FEW_FDS = """
import errno, os, resource, sys
import numpy as np
from tensorwire import dataflow as twdf
from dataflow_helpers import check

class Flow:
    def reset_state(self):
        pass
    def __len__(self):
        return 4
    def __iter__(self):
        for i in range(4):
            yield [np.full(8, i % 251, np.uint8), i, f"dp{i}"]

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
for r in (twdf.MultiProcessRunnerZMQ(Flow(), num_proc=12),
          twdf.MultiProcessMapDataZMQ(Flow(), 12, lambda dp: dp, strict=True)):
    try:
        r.reset_state()
        raise SystemExit(f"{type(r).__name__} started with 40 descriptors free")
    except OSError as e:
        assert e.errno == errno.EMFILE, e
        assert "with 12 workers needs about" in str(e) and "RLIMIT_NOFILE" in str(e), e
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    r.reset_state()  # nothing was half-made: it starts once the limit allows
    assert len([check(dp) for dp in r]) == 4  # an epoch: len(ds) datapoints
    r.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
print("ok")
"""


def test_too_few_file_descriptors_for_the_workers_is_an_emfile_naming_the_limit():
    # libzmq aborted the process (an assertion on EMFILE in its I/O thread) when the limit
    # ran out while the workers connected: a container's `ulimit -n` with many workers.
    out = run_script(FEW_FDS)
    assert out.split() == ["ok"], out


FEW_FDS_AT_A_RESTART = """
import errno, os, resource, signal, time, warnings
from tensorwire import dataflow as twdf
from dataflow_helpers import Endless, check

warnings.simplefilter("ignore", twdf.WorkerRestartedWarning)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
for r in (twdf.MultiProcessRunnerZMQ(Endless(), num_proc=2, on_worker_death="restart"),
          twdf.MultiProcessMapDataZMQ(Endless(), 2, lambda dp: dp,
                                      on_worker_death="restart")):
    r.reset_state()
    it = iter(r)
    for _ in range(10):
        check(next(it))
    # Room for a replacement (about 2 more at its peak, measured): it goes ahead.
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
    os.kill(r.pids[1], signal.SIGKILL)
    end = time.monotonic() + 30
    while r.restarts == 0 and time.monotonic() < end:
        check(next(it))
    assert r.restarts == 1, "no replacement with 16 descriptors free"
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 3, hard))
    os.kill(r.pids[0], signal.SIGKILL)
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            check(next(it))
        raise SystemExit(f"{type(r).__name__} went on without room for a replacement")
    except OSError as e:
        assert e.errno == errno.EMFILE, e
        assert "replacing worker 0 needs about" in str(e) and "RLIMIT_NOFILE" in str(e), e
    assert r.restarts == 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:  # the run ended with it: a new iterator says so again
        next(iter(r))
        raise SystemExit("the run went on")
    except OSError as e:
        assert e.errno == errno.EMFILE, e
    r.close()
print("ok")
"""


def test_too_few_file_descriptors_to_replace_a_worker_ends_the_run_with_an_emfile():
    # The check at reset_state() alone left a replacement (the restart policy) to libzmq's
    # abort on EMFILE when the process had used its descriptors up since.
    out = run_script(FEW_FDS_AT_A_RESTART)
    assert out.split() == ["ok"], out

def _too_few_tasks(kind):
    def make(n):
        if kind == "runner":
            return twdf.MultiProcessRunnerZMQ(Counting(4), num_proc=n)
        return twdf.MultiProcessMapDataZMQ(Counting(4), n, lambda dp: dp, strict=True)

    r = make(12)
    try:
        r.reset_state()
        return "12 workers started"
    except BlockingIOError as e:
        refusal = (e.errno, str(e))
    finally:
        r.close()
    with make(2) as r:  # room for 2: nothing was left behind by the refusal
        r.reset_state()
        return refusal, sorted(check(dp) for dp in r)


@pytest.mark.parametrize("kind", ["runner", "map"])
def test_a_thread_or_process_limit_too_low_for_the_workers_is_an_eagain_naming_it(kind):
    # A worker, or the runner's own process, died of SIGABRT: libzmq asserts that its I/O
    # thread started, and a thread limit (RLIMIT_NPROC counts threads; a container's
    # pids.max) stopped it. Another user (root is exempt), with room for about 20 threads.
    status, out = as_user(NOBODY, lambda: _too_few_tasks(kind), nproc=(20, 20))
    assert status == "ok", out
    (errno_, msg), data = ast.literal_eval(out)
    assert errno_ == errno.EAGAIN, out
    needed = 8 + 12 * (4 if kind == "runner" else 3)
    assert f"with 12 workers needs about {needed} more threads or processes" in msg, msg
    assert "RLIMIT_NPROC" in msg and "ulimit -u" in msg, msg
    if kind == "runner":  # each worker iterates the whole dataflow (tensorpack's): any 4
        assert len(data) == 4 and set(data) <= {0, 1, 2, 3}, data
    else:  # the strict map: each datapoint once
        assert data == [0, 1, 2, 3], data

CTRL_C_IN_A_FORK_HOOK = """
import os, signal
from tensorwire import dataflow as twdf
from dataflow_helpers import Counting, check
sent = []

def ctrl_c_once():  # as a Ctrl-C landing while Python's at-fork hooks run
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)

os.register_at_fork(before=ctrl_c_once)
for make in (lambda: twdf.MultiProcessRunnerZMQ(Counting(4), num_proc=2),
             lambda: twdf.MultiProcessMapDataZMQ(Counting(4), 2, lambda dp: dp, strict=True)):
    sent.clear()
    with make() as r:
        try:
            r.reset_state()
            print("no KeyboardInterrupt")
        except KeyboardInterrupt:
            print("KeyboardInterrupt", len(r.pids))
print("handler restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def test_a_ctrl_c_while_the_workers_are_forked_is_raised_not_lost():
    # Python's at-fork hooks (logging's lock) met the KeyboardInterrupt, printed it as
    # ignored, and the program ran on as if Ctrl-C had never been pressed.
    proc = python(CTRL_C_IN_A_FORK_HOOK)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.split("\n")[:3] == ["KeyboardInterrupt 2", "KeyboardInterrupt 2",
                                   "handler restored True"], out + err
    assert "Exception ignored" not in err, err

def _child_uses_inherited(r, q, it=None):
    try:
        next(iter(r) if it is None else it)
        q.put("no error")
    except tensorwire.ClosedError as e:
        q.put(str(e))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_process_makes_and_uses_its_own_runner(method):
    got, exitcode = in_child(method, _child_uses_own_runner)
    assert got == [0, 1, 2, 3]
    assert exitcode == 0


def _child_uses_inherited_remote(r, q):
    try:
        r.recv(timeout=0)
        q.put("no error")
    except tensorwire.ClosedError as e:
        q.put(str(e))


def test_a_forked_child_cannot_use_its_parents_remote():
    ctx = multiprocessing.get_context("fork")
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    r.reset_state()
    q = ctx.Queue()
    p = ctx.Process(target=_child_uses_inherited_remote, args=(r, q))
    p.start()
    msg = q.get(timeout=60)
    p.join(30)
    assert "forked child cannot use it" in msg
    assert r.recv(timeout=0) is None  # the parent's goes on
    r.close()


def test_a_forked_child_closing_its_copy_of_a_busy_remote_returns_at_once():
    # Forked while another thread of the parent waited in recv(): the child's copy holds that
    # call's turn, which no thread of the child will give back. Its close() waited 5 s for
    # it (at every exit of such a child), then warned.
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    r.reset_state()
    waiting, ended = _recv_in_a_thread(r, timeout=30)
    time.sleep(0.5)  # the thread is in recv()
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            t0 = time.monotonic()
            r.close()
            code = 0 if time.monotonic() - t0 < 1 else 1
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    r.close()  # the parent's recv() was in progress all along: close() ends it
    waiting.join(10)
    assert len(ended) == 1 and isinstance(ended[0], tensorwire.ClosedError), ended


@pytest.mark.parametrize("kind", ["runner", "map"])
@pytest.mark.parametrize("inherited_iterator", [False, True], ids=["new iterator", "its iterator"])
def test_a_forked_child_cannot_use_its_parents_runner(kind, inherited_iterator):
    # The map's iterator, inherited, went on in the child and broke the parent's stream.
    ctx = multiprocessing.get_context("fork")
    with (twdf.MultiProcessRunnerZMQ(Counting(4), num_proc=1) if kind == "runner" else
          twdf.MultiProcessMapDataZMQ(Counting(4), 1, lambda dp: dp, strict=True)) as r:
        r.reset_state()
        it = iter(r) if inherited_iterator else None
        got = [check(next(it))] if it else []
        q = ctx.Queue()
        p = ctx.Process(target=_child_uses_inherited, args=(r, q, it))
        p.start()
        msg = q.get(timeout=60)
        p.join(30)
        assert "forked child cannot use it" in msg and str(os.getpid()) in msg
        assert p.exitcode == 0
        got += [check(dp) for dp in (it or r)]  # the parent's goes on
        assert sorted(got) == [0, 1, 2, 3]


Point = collections.namedtuple("Point", "x y")


class Color(enum.IntEnum):
    RED = 1


class MyFloat(float):
    pass


def test_a_datapoint_comes_back_as_exactly_what_was_yielded():
    from tensorwire import _C

    dp = [1.5, 7, -(2 ** 63), 2 ** 64, np.float64(2.5), np.int32(3), np.bool_(True), True,
          Point(1, 2), Color.RED, MyFloat(0.5), np.ma.masked_array([1, 2], mask=[0, 1]),
          {"\x00k": 1}, {1: "int key"}, "a\udc80"]
    back = _C._datapoint_roundtrip(dp)
    for a, b in zip(dp, back):
        assert type(a) is type(b), (a, b)
    assert back[:8] == dp[:8]
    assert back[8] == Point(1, 2) and back[9] is Color.RED and back[10] == 0.5
    assert back[11].mask.tolist() == [False, True]
    assert back[12:] == dp[12:]


@pytest.mark.parametrize("blocked", ["map", "remote"])
def test_ctrl_c_interrupts_a_blocked_map_or_remote_and_it_goes_on(blocked):
    p = python(f"""
import time
from tensorwire import dataflow as twdf
from dataflow_helpers import Counting
def slow(dp):
    time.sleep(3)
    return dp
if {blocked!r} == "map":
    obj = twdf.MultiProcessMapDataZMQ(Counting(4), 1, slow, strict=True)
    obj.reset_state()
    wait, again = (lambda: next(iter(obj))), (lambda: next(iter(obj))[1])
else:
    obj = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    obj.reset_state()
    wait, again = obj.recv, (lambda: obj.recv(timeout=0))
print("ready", flush=True)
try:
    wait()
    print("no interrupt", flush=True)
except KeyboardInterrupt:
    print("interrupted", time.monotonic(), flush=True)
print("again", again(), flush=True)
obj.close()
""")
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    word, when = p.stdout.readline().split()
    assert word == "interrupted" and float(when) - sent < 1.0
    assert p.stdout.readline().strip() in ("again 0", "again None")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err


# Two threads iterate two runners: one of a single schema whose datapoints unpickle an
# object (Python code runs mid-conversion, and Python may give the GIL to the other
# thread there), one of a new schema every datapoint (which empties the process's cache of
# datapoint structures every 64). The first thread's structure was freed under it: wrong
# arrays or "view of shape [139796189214571] ... does not fit" after one datapoint.
_TWO_THREADS_TWO_SCHEMAS = """
import threading, time
import numpy as np
from tensorwire import dataflow as twdf

def make(i):
    time.sleep(0)  # unpickling that lets another thread run
    return Tag(i)

class Tag:
    def __init__(self, i):
        self.i = i
    def __reduce__(self):
        return (make, (self.i,))

class Stable:
    def reset_state(self):
        pass
    def __iter__(self):
        i = 0
        while True:
            yield [Tag(i)] + [np.full(8, k, np.int64) for k in range(12)]
            i += 1

class Varying:
    def reset_state(self):
        pass
    def __iter__(self):
        i = 0
        while True:
            yield [np.zeros(1 + i % 500, np.uint8), {"a": 1.0, "b": [1, 2]}]
            i += 1

errors, read = [], {}
stop = threading.Event()

def consume(flow, check):
    with twdf.MultiProcessRunnerZMQ(flow, 1) as r:
        r.reset_state()
        n = 0
        try:
            for dp in r:
                check(dp)
                n += 1
                if stop.is_set():
                    break
        except Exception as e:
            errors.append(f"after {n}: {type(e).__name__}: {e}")
        read[type(flow).__name__] = n

def stable(dp):
    assert type(dp[0]) is Tag, type(dp[0])
    for k in range(12):
        assert dp[k + 1].shape == (8,) and (dp[k + 1] == k).all(), (k, dp[k + 1])

threads = [threading.Thread(target=consume, args=(Stable(), stable)),
           threading.Thread(target=consume, args=(Varying(), lambda dp: None))]
for t in threads:
    t.start()
time.sleep(3)
stop.set()
for t in threads:
    t.join()
print("errors", errors, "read", read)
"""


def test_two_threads_iterating_runners_of_many_schemas_read_every_datapoint_right():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _TWO_THREADS_TWO_SCHEMAS], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "errors []" in out.stdout, out.stdout
    assert "'Varying'" in out.stdout and "'Stable'" in out.stdout, out.stdout


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("listener", ["remote_dataflow", "tensordict_server", "remote_transport"])
def test_a_port_closed_while_a_runner_worker_lives_can_be_bound_again(listener):
    # The runner's worker, forked while the listener was open, held a copy of the listening
    # socket: the port stayed taken ("Address already in use") as long as the worker lived.
    from tensorwire import inference as inf
    port = _free_port()

    def listen():
        if listener == "remote_dataflow":
            r = twdf.RemoteDataZMQ(f"tcp://127.0.0.1:{port}")
            r.reset_state()
            return r
        if listener == "tensordict_server":
            return tensorwire.TensorDictServer(port)
        spec = {"observation": np.zeros(4, np.float32)}
        return inf.RemoteTransport(spec, spec, num_slots=2, host="127.0.0.1", port=port)

    first = listen()
    with twdf.MultiProcessRunnerZMQ(Counting(10), num_proc=1) as runner:
        runner.reset_state()
        check(next(iter(runner)))  # its worker runs, forked while `first` listens
        first.close()
        again = listen()  # raised OSError (EADDRINUSE) before
        again.close()
        assert runner.pids and all(os.path.exists(f"/proc/{p}") for p in runner.pids)


def test_an_endpoint_without_its_transport_is_an_error_that_says_so():
    # ZeroMQ's own word for it is "Invalid argument".
    remote = twdf.RemoteDataZMQ("127.0.0.1:5555")
    with pytest.raises(OSError, match=r"zmq bind to 127\.0\.0\.1:5555: an endpoint names its "
                                      r"transport, as in 'tcp://host:port'"):
        remote.reset_state()
    remote.close()
    with pytest.raises(OSError, match=r"zmq connect to 127\.0\.0\.1:1: an endpoint names its"):
        twdf.send_dataflow_zmq(Counting(3), "127.0.0.1:1", max_datapoints=1)


def test_a_tcp_port_out_of_range_is_an_error_not_another_port():
    # libzmq takes the port modulo 65536 (99999 bound 34463) and connects to port 0 for ever.
    for addr in ("tcp://127.0.0.1:99999", "tcp://127.0.0.1:-1", "tcp://127.0.0.1:x"):
        remote = twdf.RemoteDataZMQ(addr)
        with pytest.raises(ValueError, match=r"zmq bind to .*: the port must be 0 to 65535 or \*"):
            remote.reset_state()
        remote.close()
    for addr in ("tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://127.0.0.1"):
        with pytest.raises(ValueError, match=r"zmq connect to .*: the port must be 1 to 65535"):
            twdf.send_dataflow_zmq(Counting(3), addr, max_datapoints=1)


def test_a_host_that_does_not_resolve_is_named_in_a_warning(caplog):
    # libzmq retries the name for ever, silently, and a sender blocks with no word of why.
    # The connect says so, and ZeroMQ goes on trying (the name may appear later).
    for addr in ("tcp://nosuchhost.invalid:5555", "tcp://127.0.0.1:4444;nosuchhost.invalid:5555",
                 "tcp://[nosuchhost.invalid]:5555"):
        caplog.clear()
        remote = twdf.RemoteDataZMQ(addr, bind=False)
        with caplog.at_level("WARNING", logger="tensorwire"):
            remote.reset_state()
        assert remote.recv(timeout=0) is None  # connected, waiting for the name
        remote.close()
        assert [r.getMessage() for r in caplog.records
                if "cannot resolve host 'nosuchhost.invalid'" in r.getMessage()
                and "ZeroMQ keeps trying" in r.getMessage()], caplog.text


def _child_runs_what_it_was_sent(runner, q):
    runner.reset_state()
    try:
        it = iter(runner)
        q.put(sorted(next(it)[1] for _ in range(4)))
    finally:
        runner.close()


def _add_one(dp):
    arr, i, name = dp
    return [arr, i + 1, name]


@pytest.mark.parametrize("make", [
    lambda: twdf.MultiProcessRunnerZMQ(Counting(4), num_proc=1, hwm=3, seed=5),
    lambda: twdf.MultiProcessMapDataZMQ(Counting(4), 1, _add_one, buffer_size=3, strict=True),
], ids=["runner", "map"])
def test_a_runner_pickles_before_reset_state_as_tensorpacks_and_not_after(make):
    # tensorpack's runners pickle (to their arguments) until they start; code hands one to a
    # spawned process that way.
    r = make()
    got, exitcode = in_child("spawn", _child_runs_what_it_was_sent, r)
    assert exitcode == 0
    assert got == ([0, 1, 2, 3] if isinstance(r, twdf.MultiProcessRunnerZMQ) else [1, 2, 3, 4])
    r.reset_state()
    try:
        with pytest.raises(TypeError, match=r"cannot be pickled once reset_state\(\) was called"):
            pickle.dumps(r)
    finally:
        r.close()
    closed = make()
    closed.close()
    with pytest.raises(TypeError, match="a closed .* cannot be pickled"):
        pickle.dumps(closed)


class _Loader(twdf.MultiProcessRunnerZMQ):
    """A subclass with a constructor of its own, as users write them."""

    def __init__(self, n):
        super().__init__(Counting(n), num_proc=1, hwm=4)
        self.label = "mine"


def test_a_subclass_pickles_with_its_attributes_as_tensorpacks():
    r = _Loader(4)
    r.epoch_hint = 7  # set after construction: kept, as pickle keeps tensorpack's
    back = pickle.loads(pickle.dumps(r))
    assert type(back) is _Loader and (back.label, back.epoch_hint, back._hwm) == ("mine", 7, 4)
    got, exitcode = in_child("spawn", _child_runs_what_it_was_sent, r)
    assert (got, exitcode) == ([0, 1, 2, 3], 0)
    back.close()
    r.close()


def _read_in_threads(read, threads=2):
    """Datapoint indices read by `threads` threads calling read() until it returns None or
    raises StopIteration; whether each came intact; and what else was raised."""
    import threading
    seen, errors, lock = [], [], threading.Lock()

    def consume():
        try:
            while (dp := read()) is not None:
                with lock:
                    seen.append((dp[1], bool((dp[0] == dp[1] % 251).all())))
        except StopIteration:
            pass
        except Exception as e:  # noqa: BLE001 (reported by the test)
            errors.append(repr(e))
    ts = [threading.Thread(target=consume) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return [i for i, _ in seen], all(ok for _, ok in seen), errors


def test_threads_sharing_one_receiver_take_turns_and_each_datapoint_comes_once():
    # Two threads in recv() read one ZeroMQ socket at once: the heap was corrupted (abort),
    # messages were split between them (false rejections), datapoints came twice.
    import threading
    n = 600
    remote = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    remote.reset_state()
    sender = threading.Thread(target=twdf.send_dataflow_zmq,
                              args=(Counting(n, 2048), remote.endpoint(0)),
                              kwargs={"max_datapoints": n}, daemon=True)
    sender.start()
    try:
        got, intact, errors = _read_in_threads(lambda: remote.recv(timeout=3))
        assert errors == [] and intact and remote.rejected == 0
        assert sorted(got) == list(range(n))
    finally:
        sender.join(30)
        remote.close()


@pytest.mark.parametrize("strict_map", [False, True], ids=["runner", "strict map"])
def test_threads_sharing_one_iterator_take_turns_and_the_epoch_stays_whole(strict_map):
    # The map's iterator shared by two threads ran its dataflow's generator in both ("generator
    # already executing"), cut the epoch short, or gave a datapoint twice.
    flow = Counting(300, 2048)
    with (twdf.MultiProcessMapDataZMQ(flow, 2, lambda dp: dp, buffer_size=16, strict=True)
          if strict_map else twdf.MultiProcessRunnerZMQ(flow, num_proc=2)) as runner:
        runner.reset_state()
        it = iter(runner)
        got, intact, errors = _read_in_threads(lambda: next(it))
        assert errors == [] and intact
        # An epoch is len(ds) datapoints; the runner's workers each iterate the whole flow
        # (tensorpack's), the strict map's epoch is each datapoint once.
        assert sorted(got) == list(range(300)) if strict_map else len(got) == 300


CTRL_C_AS_A_DATAPOINT_ARRIVES = """
import random, signal, sys, threading, time
from tensorwire import dataflow as twdf
from tensorwire.dataflow import send_dataflow_zmq
from dataflow_helpers import Counting
N = 3000
if KIND == "runner":  # one worker: datapoints 0, 1, 2, ... in order
    r = twdf.MultiProcessRunnerZMQ(Counting(N), num_proc=1)
    r.reset_state()
    it = iter(r)
    def next_one():
        return next(it)
else:  # a producer process sending one pass
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    r.reset_state()
    threading.Thread(target=send_dataflow_zmq, daemon=True,
                     args=(Counting(N), r.endpoint()), kwargs={"max_datapoints": N}).start()
    def next_one():
        return r.recv()
armed = [False]
def interrupt(signum, frame):  # a KeyboardInterrupt only while waiting for a datapoint
    if armed[0]:
        armed[0] = False
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, interrupt)
stop = []
def ctrl_c():
    rng = random.Random(1)
    while not stop:
        time.sleep(rng.uniform(0.0002, 0.002))
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
threading.Thread(target=ctrl_c, daemon=True).start()
got, interrupts, end = [], 0, time.monotonic() + 60
while len(got) < N and time.monotonic() < end:
    try:
        armed[0] = True
        dp = next_one()
        armed[0] = False
        got.append(dp[1])
    except KeyboardInterrupt:
        interrupts += 1
    except StopIteration:  # a Ctrl-C in the wait ended the runner's epoch: the next goes on
        it = iter(r)
stop.append(1)
armed[0] = False
assert interrupts >= 5, interrupts
assert got == list(range(N)), [i for i in range(N) if i not in got][:10]
r.close()
print("ok", interrupts)
"""


@pytest.mark.parametrize("kind", ["runner", "remote"])
def test_a_ctrl_c_as_a_datapoint_arrives_keeps_it_for_the_next_call(kind):
    # A call made as an expression (`dp = next(it)`, `remote.recv()`) has Python's pending
    # signal handlers run as it returns: a Ctrl-C that came while it waited raised there,
    # and the datapoint it had got was dropped (48 of 3,000 with about 50 Ctrl-C).
    out = run_script(f"KIND = {kind!r}" + CTRL_C_AS_A_DATAPOINT_ARRIVES)
    assert out.startswith("ok"), out


HELD_DATAPOINT = """
import _thread, os
import tensorwire
from tensorwire import dataflow as twdf
N = 5
fired = []

class Trigger:
    # Pickled in a worker, the first time there: unpickled in the consumer, it makes a
    # Ctrl-C pending as the datapoint is converted (interrupt_main only marks SIGINT as
    # tripped; no Python code runs before the check that comes before it is handed over).
    def __reduce__(self):
        if fired:
            return (int, ())
        fired.append(1)
        return (_thread.interrupt_main, ())

class DS:
    def __len__(self):
        return N
    def reset_state(self):
        pass
    def __iter__(self):
        for i in range(N):
            yield [i, Trigger() if i == N - 1 and self.trigger else 0]

    trigger = True

def interrupted_at_the_last(make):
    r = make()
    r.reset_state()
    it = iter(r)
    first = []
    try:
        for _ in range(N):
            first.append(next(it)[0])
    except KeyboardInterrupt:
        pass
    assert first == [0, 1, 2, 3], first
    return r, it

runner = lambda: twdf.MultiProcessRunnerZMQ(DS(), num_proc=1)
class Plain(DS):
    trigger = False

strict = lambda: twdf.MultiProcessMapDataZMQ(  # the Trigger comes from the map function
    Plain(), 1, lambda dp: [dp[0], Trigger() if dp[0] == N - 1 else 0], strict=True)

r, it = interrupted_at_the_last(runner)
assert next(it)[0] == 4  # the same iterator: kept for it
del it
r.close()

r, it = interrupted_at_the_last(runner)
del it  # given up: the next epoch is len(ds) datapoints, not the kept one and len(ds)
assert [dp[0] for dp in r] == [0, 1, 2, 3, 4]
r.close()

r, it = interrupted_at_the_last(strict)
del it  # given up: a strict map's next epoch goes on with that pass, the kept one first
assert [dp[0] for dp in r] == [4]
assert sorted(dp[0] for dp in r) == [0, 1, 2, 3, 4]
r.close()

r, it = interrupted_at_the_last(runner)
pid = os.fork()
if pid == 0:  # the parent's kept datapoint is not the child's to deliver
    try:
        next(it)
        os._exit(1)
    except tensorwire.ClosedError:
        os._exit(0)
assert os.waitpid(pid, 0)[1] == 0, "a forked child delivered the parent's kept datapoint"
assert next(it)[0] == 4
r.close()

r, it = interrupted_at_the_last(runner)
r.close()
try:
    next(it)
    raise SystemExit("a closed runner delivered its kept datapoint")
except tensorwire.ClosedError:
    pass
print("ok")
"""


def test_a_kept_datapoint_belongs_to_its_pass_its_process_and_its_open_runner():
    # Deterministic: the datapoint's conversion raises the signal, whose handler runs in
    # the check before the datapoint is handed over. A runner's epoch given up then began
    # the next with it (len(ds) + 1 datapoints), and a closed runner and a forked child's
    # copy delivered it.
    out = run_script(HELD_DATAPOINT)
    assert out.split() == ["ok"], out


class _InterruptedAtThirdPass(Counting):
    """Ctrl-C lands in the dataflow's generator as its third pass begins (in the main
    process, where the map pulls datapoints); the second pass is empty, so the third is
    pulled exactly as the first epoch ends."""

    passes = 0

    def __iter__(self):
        type(self).passes += 1
        if type(self).passes == 2:
            return
        if type(self).passes == 3:
            raise KeyboardInterrupt
        yield from super().__iter__()


def test_a_ctrl_c_in_the_dataflow_as_an_epoch_ends_keeps_the_epoch_and_the_passes_after():
    # Ctrl-C in the dataflow's generator (the map pulls in the main process) exactly as the
    # first epoch ends: the iteration has the whole epoch, then KeyboardInterrupt; nothing of
    # a later pass comes into it; the pass that raised is empty, and the passes after it are
    # whole.
    _InterruptedAtThirdPass.passes = 0
    with twdf.MultiProcessMapDataZMQ(_InterruptedAtThirdPass(4), 2, lambda dp: dp,
                                     strict=True) as m:
        m.reset_state()
        it = iter(m)
        got = []
        with pytest.raises(KeyboardInterrupt):
            for dp in it:
                got.append(check(dp))
        assert sorted(got) == [0, 1, 2, 3]
        assert next(it, "ended") == "ended"  # the end stays
        assert _InterruptedAtThirdPass.passes == 3
        assert list(m) == []  # the second pass
        assert list(m) == []  # the third, which raised (logged: "ended after 0 datapoints")
        assert sorted(check(dp) for dp in m) == [0, 1, 2, 3]  # and on


class _FirstWorkerDies:
    """The first worker to start exits (code 3) after 0.3 s without sending; the others
    send from 1.5 s on."""

    def __init__(self, mark_dir):
        self.mark = os.path.join(mark_dir, "first")

    def reset_state(self):
        pass

    def __len__(self):
        return 100

    def __iter__(self):
        try:
            os.mkdir(self.mark)
        except FileExistsError:
            time.sleep(1.5)
            for i in range(100):
                yield [np.full(8, i % 251, np.uint8), i, f"dp{i}"]
            return
        time.sleep(0.3)
        os._exit(3)


def test_a_worker_death_met_by_one_thread_ends_the_waiting_threads_call_too(tmp_path):
    # The thread waiting for its turn while the other's call met the death went on, once it
    # had the turn, and took the next worker's datapoint from a runner that had failed.
    with twdf.MultiProcessRunnerZMQ(_FirstWorkerDies(str(tmp_path)), num_proc=2) as runner:
        runner.reset_state()
        it = iter(runner)
        got, _, errors = _read_in_threads(lambda: next(it))
        assert got == []
        assert len(errors) == 2 and all("WorkerDiedError" in e and "exited with status 3" in e
                                        for e in errors), errors


@pytest.mark.parametrize("strict_map", [False, True], ids=["runner", "map"])
def test_a_forked_child_dropping_its_copy_of_a_datapoint_leaves_the_parents_whole(strict_map):
    # The child's copy views the same shared memory: releasing it (the child dropping it, or
    # exiting) handed the chunk back to the worker, which rewrote the parent's datapoint.
    import gc
    flow = Counting(10_000, 1 << 16)
    with (twdf.MultiProcessMapDataZMQ(flow, 1, lambda dp: dp, buffer_size=4, strict=True)
          if strict_map else twdf.MultiProcessRunnerZMQ(flow, num_proc=1)) as runner:
        runner.reset_state()
        it = iter(runner)
        kept = next(it)
        pid = os.fork()
        if pid == 0:
            del kept
            gc.collect()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        for _ in range(200):
            next(it)
        assert (kept[0] == kept[1] % 251).all()
