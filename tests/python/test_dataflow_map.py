"""tensorwire.dataflow.MultiProcessMapDataZMQ with real worker processes."""
import collections
import os
import signal
import time

import numpy as np
import pytest

from tensorwire import dataflow as twdf
from dataflow_helpers import Counting, check, no_leftovers  # noqa: F401


def square(dp):
    arr, i, name = dp
    return [arr, i, name, i * i, twdf.get_worker_info().id]


def test_strict_yields_each_mapping_exactly_once_per_pass():
    with twdf.MultiProcessMapDataZMQ(Counting(50, n=100), 2, square, buffer_size=8, strict=True) as m:
        m.reset_state()
        workers = set()
        for _ in range(3):
            seen = collections.Counter()
            for dp in m:
                i = check(dp[:3])
                assert dp[3] == i * i
                workers.add(dp[4])
                seen[i] += 1
            assert seen == collections.Counter(range(50))
        assert workers == {0, 1}


def test_strict_clamps_the_buffer_to_the_dataflow():
    with twdf.MultiProcessMapDataZMQ(Counting(5), 2, square, strict=True) as m:
        assert m._buffer_size == 5
        m.reset_state()
        assert sorted(dp[1] for dp in m) == list(range(5))


def odd_only(dp):
    return dp if dp[1] % 2 else None


def test_non_strict_is_endless_and_drops_none_results():
    with twdf.MultiProcessMapDataZMQ(Counting(10), 2, odd_only, buffer_size=4) as m:
        m.reset_state()
        it = iter(m)
        got = [check(next(it)) for _ in range(100)]
        assert set(got) == {1, 3, 5, 7, 9}


def picky(dp):
    if dp[1] == 7:
        raise ValueError("cannot map 7")
    return dp


def test_a_map_error_is_raised_with_its_traceback_and_the_stream_goes_on():
    with twdf.MultiProcessMapDataZMQ(Counting(20), 2, picky, buffer_size=4, strict=True) as m:
        m.reset_state()
        got = []
        with pytest.raises(ValueError, match="cannot map 7") as info:
            for dp in m:
                got.append(check(dp))
        assert 'raise ValueError("cannot map 7")' in info.value.worker_traceback
        got += [check(dp) for dp in m]  # the rest of the pass
        assert sorted(got) == [i for i in range(20) if i != 7]


def test_a_none_result_is_an_error_in_strict_mode():
    with twdf.MultiProcessMapDataZMQ(Counting(4), 1, lambda dp: None, strict=True) as m:
        m.reset_state()
        with pytest.raises(ValueError, match="returned nothing"):
            next(iter(m))


def slow(dp):
    time.sleep(0.005)
    return dp


def test_a_killed_worker_raises_instead_of_hanging():
    with twdf.MultiProcessMapDataZMQ(Counting(1000), 2, slow, buffer_size=8) as m:
        m.reset_state()
        it = iter(m)
        next(it)
        os.kill(m.pids[0], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(twdf.WorkerDiedError, match="worker 0.*SIGKILL"):
            for _ in it:
                pass
        assert time.monotonic() - t0 < 5


def flip(dp):
    arr, i, name = dp
    assert not arr.flags.owndata  # the input is a view into the main process's shared memory
    return [arr[::-1].copy(), i, name]


def test_large_inputs_travel_through_shared_memory_both_ways():
    with twdf.MultiProcessMapDataZMQ(Counting(32, n=300_000), 2, flip, buffer_size=8, strict=True) as m:
        m.reset_state()
        for _ in range(2):
            assert sorted(check(dp) for dp in m) == list(range(32))


def test_reset_state_twice_raises():
    with twdf.MultiProcessMapDataZMQ(Counting(4), 1, square) as m:
        m.reset_state()
        with pytest.raises(RuntimeError, match="called twice"):
            m.reset_state()


def test_map_workers_are_seeded():
    def draw(dp):
        return [twdf.get_worker_info().seed, float(np.random.rand())]

    with twdf.MultiProcessMapDataZMQ(Counting(100), 2, draw, buffer_size=4, strict=True, seed=99) as m:
        m.reset_state()
        seeds = {s for s, _ in m}
    assert seeds == {99, 100}


class RaisesOnceAt(twdf.DataFlow):
    """Datapoints 0..n-1; the first pass raises before yielding datapoint `at` (as a Ctrl-C
    landing in the generator does), which ends that generator."""

    def __init__(self, n, at):
        self.n, self.at, self.raised = n, at, False

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            if i == self.at and not self.raised:
                self.raised = True
                raise ValueError("the dataflow failed")
            yield [np.full(4, i, np.uint8), i]


def test_a_pass_cut_short_by_the_dataflows_own_exception_is_reported(caplog):
    # The generator that raised is over: the pass ended there, silently (an epoch of 9 of
    # 16 datapoints, no word of it).
    with twdf.MultiProcessMapDataZMQ(RaisesOnceAt(16, 9), 2, lambda dp: dp, buffer_size=4,
                                     strict=True) as r:
        r.reset_state()
        got = []
        with pytest.raises(ValueError, match="the dataflow failed"):
            for dp in r:
                got.append(dp[1])
        got += [dp[1] for dp in r]
        assert sorted(got) == list(range(9))
        assert any("pass 0 ended after 9 datapoints, at the first call of the dataflow after it "
                   "raised" in rec.getMessage() and "(len(ds) = 16)" in rec.getMessage()
                   for rec in caplog.records if rec.name == "tensorwire")
        assert sorted(dp[1] for dp in r) == list(range(16))  # the next pass starts over
