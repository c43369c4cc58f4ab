"""Self-healing runners: on_worker_death="restart", the restart limit, datapoint_timeout,
their argument checks, the tensorpack drop-in's kwargs; fork and spawn. Real workers,
killed with SIGKILL."""
import logging
import math
import os
import signal
import threading
import time
import warnings

import numpy as np
import pytest

from tensorwire import dataflow as twdf
from tensorwire import tensorpack as tp
from dataflow_helpers import Counting, Endless, check, in_child, no_leftovers  # noqa: F401

SEED = 1000


def first_generation(num_proc):
    """True in a worker of the first generation (seeds SEED .. SEED + num_proc - 1)."""
    info = twdf.get_worker_info()
    return info is not None and info.seed < SEED + num_proc


def until(cond, it, seconds=20):
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        check(next(it))
    assert cond()


def kill_and_await_restart(r, it):
    """SIGKILLs worker 0 and iterates until it was replaced, with a WorkerRestartedWarning."""
    os.kill(r.pids[0], signal.SIGKILL)
    with pytest.warns(twdf.WorkerRestartedWarning):
        until(lambda: r.restarts == 1, it)


def test_a_killed_runner_worker_is_replaced_with_a_warning_and_a_log(caplog):
    caplog.set_level(logging.WARNING, logger="tensorwire")
    with twdf.MultiProcessRunnerZMQ(Endless(), num_proc=2, hwm=4, seed=SEED,
                                    on_worker_death="restart") as r:
        r.reset_state()
        it = iter(r)
        for _ in range(10):
            check(next(it))
        victim = r.pids[1]
        os.kill(victim, signal.SIGKILL)
        with pytest.warns(twdf.WorkerRestartedWarning) as w:
            until(lambda: r.restarts == 1, it)
        msg = str(w[0].message)
        assert f"worker 1 (pid {victim})" in msg and "SIGKILL" in msg
        assert f"restarted as pid {r.pids[1]}" in msg and f"seed {SEED + 1 + 2}" in msg
        assert victim not in r.pids
        assert any(f"pid {victim}" in rec.getMessage() for rec in caplog.records
                   if rec.name == "tensorwire")
        for _ in range(200):  # the stream goes on
            check(next(it))


class InterruptedWhileLogging(logging.Handler):
    """A handler the user's Ctrl-C lands in (a slow one: a disk, a network)."""

    def emit(self, record):
        if "restarted" in record.getMessage():
            raise KeyboardInterrupt


def test_a_ctrl_c_that_lands_in_a_log_handler_still_interrupts_the_loop():
    # The KeyboardInterrupt raised in the handler was discarded as unraisable, and the loop
    # ran on as if Ctrl-C had never been pressed.
    handler = InterruptedWhileLogging()
    logging.getLogger("tensorwire").addHandler(handler)
    try:
        with twdf.MultiProcessRunnerZMQ(Endless(), num_proc=1, hwm=4, seed=SEED,
                                        on_worker_death="restart") as r:
            r.reset_state()
            it = iter(r)
            for _ in range(10):
                check(next(it))
            os.kill(r.pids[0], signal.SIGKILL)
            with warnings.catch_warnings(), pytest.raises(KeyboardInterrupt):
                warnings.simplefilter("ignore", twdf.WorkerRestartedWarning)
                until(lambda: False, it)
            assert r.restarts == 1
            it = iter(r)  # the runner still works
            for _ in range(10):
                check(next(it))
    finally:
        logging.getLogger("tensorwire").removeHandler(handler)


class Seeds:
    def reset_state(self):
        pass

    def __iter__(self):
        while True:
            yield [twdf.get_worker_info().seed]


def kill_and_await_new_seed(r, it):
    """SIGKILLs the only worker of a Seeds runner; its replacement yields SEED + 1."""
    os.kill(r.pids[0], signal.SIGKILL)
    with pytest.warns(twdf.WorkerRestartedWarning):
        end = time.monotonic() + 20
        while next(it) == [SEED] and time.monotonic() < end:
            pass
    assert next(it) == [SEED + 1]


def test_the_replacement_gets_a_new_seed():
    with twdf.MultiProcessRunnerZMQ(Seeds(), num_proc=1, seed=SEED, on_worker_death="restart") as r:
        r.reset_state()
        it = iter(r)
        assert next(it) == [SEED]
        kill_and_await_new_seed(r, it)


LOCK = threading.Lock()


class SeedsUnderALock(Seeds):
    def __iter__(self):
        while True:
            with LOCK:
                seed = twdf.get_worker_info().seed
            yield [seed]


def test_a_replacement_does_not_inherit_a_lock_a_thread_of_the_main_process_holds():
    """Forked from the main process, the replacement would get LOCK locked by a thread that
    does not exist in it and wait for ever (here: until datapoint_timeout kills it, twice, and
    the run ends). The fork server forks it from the state the first worker was forked in."""
    with twdf.MultiProcessRunnerZMQ(SeedsUnderALock(), num_proc=1, seed=SEED,
                                    on_worker_death="restart", max_restarts=1,
                                    datapoint_timeout=5) as r:
        r.reset_state()
        it = iter(r)
        assert next(it) == [SEED]
        taken, release = threading.Event(), threading.Event()

        def hold():
            with LOCK:
                taken.set()
                release.wait(60)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert taken.wait(10)
            kill_and_await_new_seed(r, it)
        finally:
            release.set()
            holder.join()


def test_a_worker_that_dies_too_often_ends_the_run():
    with twdf.MultiProcessRunnerZMQ(Endless(), num_proc=1, on_worker_death="restart",
                                    max_restarts=1, restart_window=60) as r:
        r.reset_state()
        it = iter(r)
        next(it)
        kill_and_await_restart(r, it)
        os.kill(r.pids[0], signal.SIGKILL)
        with pytest.raises(twdf.WorkerDiedError, match=r"died 2 times within restart_window "
                           r"\(60 s\), more than max_restarts \(1\)"):
            for _ in range(10**7):
                next(it)


class MapKillsItself:
    """Datapoint `bad` SIGKILLs its worker (first generation only)."""

    def __init__(self, bad, num_proc):
        self.bad, self.num_proc = bad, num_proc

    def __call__(self, dp):
        if dp[1] == self.bad and first_generation(self.num_proc):
            os.kill(os.getpid(), signal.SIGKILL)
        return dp


def test_a_strict_map_reissues_what_a_dead_worker_held_in_order():
    m = twdf.MultiProcessMapDataZMQ(Counting(30), 1, MapKillsItself(11, 1), buffer_size=6,
                                    strict=True, seed=SEED, on_worker_death="restart")
    with m:
        m.reset_state()
        with pytest.warns(twdf.WorkerRestartedWarning, match="worker 0 .*SIGKILL"):
            assert [check(dp) for dp in m] == list(range(30))
        assert [check(dp) for dp in m] == list(range(30))
        assert m.restarts == 1


class KillsWorkerZeroBeforeABigOne(twdf.DataFlow):
    """12 datapoints [array, i]; before yielding the 9th (1 MiB: the map needs a new task
    segment for it) the main process kills worker 0 of `runner`, once."""

    N, BIG = 12, 8

    def __init__(self):
        self.runner, self.killed = None, False

    def __len__(self):
        return self.N

    def __iter__(self):
        for i in range(self.N):
            if i == self.BIG and self.runner is not None and not self.killed:
                self.killed = True
                os.kill(self.runner.pids[0], signal.SIGKILL)
                time.sleep(0.5)  # dead, and replaced by the fork server, before the next send
            yield [np.full((1 << 20) if i == self.BIG else 16, i, np.uint8), i]


@pytest.mark.parametrize("num_proc", [1, 2])
def test_a_restart_warning_turned_into_an_error_loses_nothing(num_proc):
    # It was raised in the middle of handing the new segment to the workers: that task was
    # dropped (a pass one short), and the segment discarded though the replacement had it
    # (every later epoch: "the chunk at offset 128 is not in use").
    ds = KillsWorkerZeroBeforeABigOne()
    with warnings.catch_warnings():
        warnings.simplefilter("error", twdf.WorkerRestartedWarning)
        with twdf.MultiProcessMapDataZMQ(ds, num_proc, lambda dp: dp, buffer_size=4, strict=True,
                                         on_worker_death="restart") as r:
            ds.runner = r
            r.reset_state()
            got = []
            with pytest.raises(twdf.WorkerRestartedWarning, match="worker 0"):
                for dp in r:
                    got.append(dp)
            got += list(r)  # the next epoch yields the rest of that pass
            for _ in range(2):
                assert sorted(i for _, i in got) == list(range(ds.N))
                for a, i in got:
                    assert a.size == ((1 << 20) if i == ds.BIG else 16) and (a == i).all()
                got = list(r)
            assert r.restarts == 1


class Reusing:
    """Fills one buffer and yields it for every datapoint (fine with tensorpack, which
    serializes a datapoint when it is yielded)."""

    def reset_state(self):
        pass

    def __len__(self):
        return 30

    def __iter__(self):
        buf = np.zeros(16, np.uint8)
        for i in range(30):
            buf[:] = i
            yield [buf, i]


def copy_and_kill_at_11(dp):
    if dp[1] == 11 and first_generation(1):
        os.kill(os.getpid(), signal.SIGKILL)
    return [dp[0].copy(), dp[1]]


def test_what_a_dead_worker_held_is_sent_again_as_it_was_yielded():
    # The tasks sent again were read from the user's buffer at resend time: datapoints 11
    # to 15 came back holding 16.
    m = twdf.MultiProcessMapDataZMQ(Reusing(), 1, copy_and_kill_at_11, buffer_size=6,
                                    strict=True, seed=SEED, on_worker_death="restart")
    with m:
        m.reset_state()
        with pytest.warns(twdf.WorkerRestartedWarning):
            got = [(i, a.tolist()) for a, i in m]
        assert got == [(i, [i] * 16) for i in range(30)]
        assert m.restarts == 1


def slow_identity(dp):
    time.sleep(0.002)
    return dp


def test_a_strict_map_stays_exact_when_workers_are_killed_from_outside():
    m = twdf.MultiProcessMapDataZMQ(Counting(200), 3, slow_identity, buffer_size=12, strict=True,
                                    on_worker_death="restart", max_restarts=10)
    with m, warnings.catch_warnings():
        warnings.simplefilter("ignore", twdf.WorkerRestartedWarning)
        m.reset_state()
        for _ in range(2):
            got = []
            for n, dp in enumerate(m):
                got.append(check(dp))
                if n % 60 == 30:
                    os.kill(m.pids[n % 3], signal.SIGKILL)
            assert sorted(got) == list(range(200))
        assert m.restarts >= 4


class Megabytes:
    """`size` datapoints an epoch, datapoint i: 125,000 int64 of value i (1 MB), and the pid
    of the worker that made it."""

    def __init__(self, size=20):
        self.size = size

    def reset_state(self):
        pass

    def __len__(self):
        return self.size

    def __iter__(self):
        for i in range(self.size):
            yield [np.full(125_000, i, np.int64), np.array([os.getpid()], np.int64)]


def worker_segments_mapped():
    """How many segments of the runners' workers this process maps."""
    with open("/proc/self/maps") as f:
        return sum(":dataflow-w" in line for line in f)


# A dead worker's segments stayed mapped until its sender id came round again, four
# restarts of that worker later: up to 4 x (hwm + 4) datapoints of shared memory per
# worker. Now they go once its last datapoint has been read. The worker is killed while it
# waits for credits, so that nothing it sent is lost in its own ZeroMQ queue (which would
# keep its segments until its id is taken again, as before).
@pytest.mark.parametrize("kind", ["runner", "map"])
def test_a_dead_workers_shared_memory_goes_once_its_last_datapoint_was_read(kind):
    if kind == "runner":
        r = twdf.MultiProcessRunnerZMQ(Megabytes(), num_proc=1, hwm=4, on_worker_death="restart")
    else:
        r = twdf.MultiProcessMapDataZMQ(Megabytes(), 1, lambda dp: dp, buffer_size=4,
                                        strict=True, on_worker_death="restart")
    with r, warnings.catch_warnings():
        warnings.simplefilter("ignore", twdf.WorkerRestartedWarning)
        r.reset_state()
        got = [int(dp[0][0]) for dp in r]
        first = worker_segments_mapped()
        mapped = []
        for _ in range(3):
            time.sleep(0.3)  # the worker now waits for credits (or for tasks)
            os.kill(r.pids[0], signal.SIGKILL)
            got = [int(dp[0][0]) for dp in r]
            assert got == list(range(20)) or kind == "runner"
            mapped.append(worker_segments_mapped())
        assert r.restarts == 3
        assert first >= 1 and max(mapped) <= 2 * first, (first, mapped)


# A worker killed again and again behind a slow consumer: each dead one leaves its hwm
# datapoints queued. Its fourth replacement was given the sender id of the first dead one,
# whose descriptors were still to be read, and they were decoded against the new worker's
# segments ("ProtocolError: datapoint descriptor for schema 1, but the last schema from
# sender 0 is 0", or another datapoint's bytes). Every datapoint of every worker now
# arrives whole and in order, and stays intact while held.
def test_a_worker_killed_again_and_again_behind_a_slow_consumer_loses_nothing():
    held = []
    r = twdf.MultiProcessRunnerZMQ(Megabytes(10**9), num_proc=1, hwm=20, on_worker_death="restart",
                                   max_restarts=100)
    with r, warnings.catch_warnings():
        warnings.simplefilter("ignore", twdf.WorkerRestartedWarning)
        r.reset_state()
        it = iter(r)
        for _ in range(6):
            time.sleep(0.5)  # the worker fills its window
            os.kill(r.pids[0], signal.SIGKILL)
            time.sleep(0.05)
            held += [next(it) for _ in range(3)]
            time.sleep(0.15)
        held += [next(it) for _ in range(20 * 8)]
        assert r.restarts == 6
    by_pid = {}
    for a, pid in held:
        a = np.asarray(a)
        assert (a == a[0]).all()
        by_pid.setdefault(int(np.asarray(pid)[0]), []).append(int(a[0]))
    assert len(by_pid) >= 5, by_pid.keys()
    for values in by_pid.values():
        assert values == list(range(len(values))), values


class StuckAt:
    def __init__(self, bad, size=20):
        self.bad, self.size = bad, size

    def reset_state(self):
        pass

    def __iter__(self):
        for i in range(self.size):
            if i == self.bad and first_generation(1):
                time.sleep(3600)
            yield [np.full(16, i % 251, np.uint8), i, f"dp{i}"]

    def __len__(self):
        return self.size


def test_a_stuck_runner_worker_is_killed_and_its_datapoint_named():
    with twdf.MultiProcessRunnerZMQ(StuckAt(3), num_proc=1, seed=SEED, datapoint_timeout=0.3) as r:
        r.reset_state()
        it = iter(r)
        assert [check(next(it)) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(twdf.WorkerDiedError, match=r"stuck on datapoint 3 of its pass for longer "
                           r"than datapoint_timeout \(0\.3 s\)"):
            next(it)


def test_a_stuck_runner_worker_is_replaced():
    with twdf.MultiProcessRunnerZMQ(StuckAt(3), num_proc=1, seed=SEED, datapoint_timeout=0.3,
                                    on_worker_death="restart") as r:
        r.reset_state()
        with pytest.warns(twdf.WorkerRestartedWarning, match="stuck on datapoint 3"):
            got = [check(dp) for dp in r]
        assert got == [0, 1, 2] + list(range(17))  # the replacement starts its pass over
        assert r.restarts == 1


class StuckInResetState(StuckAt):
    """A worker whose reset_state() hangs (a network open that never returns), the first
    generation only."""

    def __init__(self):
        super().__init__(bad=-1, size=5)

    def reset_state(self):
        if twdf.get_worker_info() is not None and first_generation(1):
            time.sleep(3600)


def test_a_runner_worker_stuck_in_reset_state_is_killed_and_named():
    with twdf.MultiProcessRunnerZMQ(StuckInResetState(), num_proc=1, seed=SEED,
                                    datapoint_timeout=0.3) as r:
        r.reset_state()
        with pytest.raises(twdf.WorkerDiedError, match=r"stuck on its dataflow's reset_state\(\) for "
                           r"longer than datapoint_timeout \(0\.3 s\)"):
            next(iter(r))


def test_a_runner_worker_stuck_in_reset_state_is_replaced():
    with twdf.MultiProcessRunnerZMQ(StuckInResetState(), num_proc=1, seed=SEED, datapoint_timeout=0.3,
                                    on_worker_death="restart") as r:
        r.reset_state()
        with pytest.warns(twdf.WorkerRestartedWarning, match=r"reset_state\(\)"):
            assert [check(dp) for dp in r] == list(range(5))
        assert r.restarts == 1


@pytest.mark.parametrize("forever", [math.inf, 1e10])
@pytest.mark.parametrize("kind", ["runner", "map"])
def test_an_infinite_restart_window_or_time_limit_is_for_ever(kind, forever):
    """Both are compared in nanoseconds, where a value past 292 years overflowed: every
    worker was "stuck" at once, and the restart window's bookkeeping crashed the process."""
    kw = dict(seed=SEED, datapoint_timeout=forever, restart_window=forever, on_worker_death="restart")
    if kind == "runner":
        flow = twdf.MultiProcessRunnerZMQ(Endless(), 1, **kw)
    else:
        flow = twdf.MultiProcessMapDataZMQ(Endless(), 1, slow_identity, **kw)
    with flow as r:
        r.reset_state()
        it = iter(r)
        kill_and_await_restart(r, it)
        for _ in range(5):
            next(it)
        assert r.restarts == 1


class MapSleepsAt:
    """Datapoint `bad` sleeps, once: in the first worker that claims the marker file (a
    strict epoch sends the next pass early, so two workers may see a `bad`)."""

    def __init__(self, bad, marker):
        self.bad, self.marker = bad, str(marker)

    def __call__(self, dp):
        if dp[1] == self.bad:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return dp
            time.sleep(3600)
        return dp


def test_a_stuck_map_worker_is_killed_and_its_datapoint_named(tmp_path):
    m = twdf.MultiProcessMapDataZMQ(Counting(20), 2, MapSleepsAt(5, tmp_path / "m"), buffer_size=8, strict=True,
                                    seed=SEED, datapoint_timeout=0.3)
    with m:
        m.reset_state()
        with pytest.raises(twdf.WorkerDiedError, match="stuck on datapoint 5 of pass [01] "):
            list(m)  # two epochs: a worker slow to start may do pass 1's 5 first
            list(m)


def test_a_stuck_map_worker_is_replaced_and_the_epoch_stays_exact(tmp_path):
    m = twdf.MultiProcessMapDataZMQ(Counting(20), 2, MapSleepsAt(5, tmp_path / "m"), buffer_size=8, strict=True,
                                    seed=SEED, datapoint_timeout=0.3, on_worker_death="restart")
    with m:
        m.reset_state()
        with pytest.warns(twdf.WorkerRestartedWarning):
            for _ in range(2):  # the stuck datapoint may be pass 1's (prefetched)
                assert sorted(check(dp) for dp in m) == list(range(20))
        assert m.restarts == 1


@pytest.mark.parametrize("kwargs, match", [
    ({"on_worker_death": "retry"}, "on_worker_death must be 'raise' or 'restart', got 'retry'"),
    ({"max_restarts": -1}, "max_restarts must be 0 or more, got -1"),
    ({"restart_window": 0}, "restart_window must be positive"),
    ({"restart_window": -1}, "restart_window"),
    ({"restart_window": math.nan}, "restart_window"),
    ({"datapoint_timeout": 0}, "datapoint_timeout must be positive"),
    ({"datapoint_timeout": -2.0}, "datapoint_timeout"),
])
@pytest.mark.parametrize("make", [
    lambda kw: twdf.MultiProcessRunnerZMQ(Counting(), 1, **kw),
    lambda kw: twdf.MultiProcessMapDataZMQ(Counting(), 1, slow_identity, **kw),
], ids=["runner", "map"])
def test_bad_policy_arguments_are_value_errors_naming_them(make, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(kwargs)


def test_the_tensorpack_drop_in_takes_the_policy():
    r = tp.MultiProcessRunnerZMQ(Endless(), 1, on_worker_death="restart", max_restarts=2)
    m = tp.MultiProcessMapDataZMQ(Counting(10), 1, slow_identity, strict=True,
                                  on_worker_death="restart", datapoint_timeout=5)
    with r, m:
        r.reset_state()
        m.reset_state()
        it = iter(r)
        next(it)
        kill_and_await_restart(r, it)
        assert sorted(check(dp) for dp in m) == list(range(10))
    with pytest.raises(ValueError, match="on_worker_death"):
        tp.MultiProcessRunnerZMQ(Endless(), 1, on_worker_death="ignore")


def _restart_in_child(q):
    from dataflow_helpers import Endless as E
    from tensorwire import dataflow as df
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", df.WorkerRestartedWarning)
        with df.MultiProcessRunnerZMQ(E(), num_proc=1, on_worker_death="restart") as r:
            r.reset_state()
            it = iter(r)
            next(it)
            os.kill(r.pids[0], signal.SIGKILL)
            end = time.monotonic() + 20
            while r.restarts == 0 and time.monotonic() < end:
                next(it)
            q.put(r.restarts)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_restart_works_in_a_forked_or_spawned_process(method):
    restarts, exitcode = in_child(method, _restart_in_child)
    assert restarts == 1
    assert exitcode == 0
