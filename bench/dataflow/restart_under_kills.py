"""Datapoints/s of a self-healing runner while a worker is SIGKILLed every second,
against the same runner with no kills, in the same run (interleaved rounds).

    python bench/dataflow/restart_under_kills.py [--seconds 10] [--rounds 3] [--num-proc 2]

Each round runs MultiProcessRunnerZMQ(on_worker_death="restart") over an endless dataflow
of float32[1024] datapoints for --seconds, once undisturbed and once with a killer thread
that SIGKILLs a random worker every second; prints datapoints/s of both, their ratio, and
the restarts seen. Also MultiProcessMapDataZMQ(strict=True) epochs under the same kills
(datapoints/s, and that every epoch stayed exact).
"""
import argparse
import os
import random
import signal
import statistics
import threading
import time
import warnings

import numpy as np

from tensorwire import dataflow as twdf


class Flow:
    def reset_state(self):
        self.x = np.arange(1024, dtype=np.float32)

    def __iter__(self):
        i = 0
        while True:
            yield [self.x, i]
            i += 1


class Sized:
    def __init__(self, n):
        self.n = n

    def reset_state(self):
        pass

    def __iter__(self):
        x = np.arange(1024, dtype=np.float32)
        for i in range(self.n):
            yield [x, i]

    def __len__(self):
        return self.n


def double(dp):
    return [dp[0] * 2, dp[1]]


def killer(get_pids, stop, every=1.0):
    rng = random.Random(0)
    kills = 0
    while not stop.wait(every):
        pids = get_pids()
        if pids:
            try:
                os.kill(rng.choice(pids), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
    return kills


def run_runner(seconds, num_proc, kill):
    with twdf.MultiProcessRunnerZMQ(Flow(), num_proc=num_proc, on_worker_death="restart",
                                    max_restarts=1000, restart_window=1.0) as r:
        r.reset_state()
        it = iter(r)
        for _ in range(100):
            next(it)
        stop = threading.Event()
        t = threading.Thread(target=killer, args=(lambda: r.pids, stop)) if kill else None
        if t:
            t.start()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            next(it)
            n += 1
        dt = time.perf_counter() - t0
        stop.set()
        if t:
            t.join()
        return n / dt, r.restarts


def run_map(seconds, num_proc, kill):
    size = 2000
    with twdf.MultiProcessMapDataZMQ(Sized(size), num_proc, double, buffer_size=64, strict=True,
                                     on_worker_death="restart", max_restarts=1000,
                                     restart_window=1.0) as m:
        m.reset_state()
        stop = threading.Event()
        t = threading.Thread(target=killer, args=(lambda: m.pids, stop)) if kill else None
        if t:
            t.start()
        n, exact, t0 = 0, True, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            got = sorted(dp[1] for dp in m)
            exact &= got == list(range(size))
            n += len(got)
        dt = time.perf_counter() - t0
        stop.set()
        if t:
            t.join()
        return n / dt, m.restarts, exact


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-proc", type=int, default=2)
    a = ap.parse_args()
    warnings.simplefilter("ignore", twdf.WorkerRestartedWarning)
    import logging
    logging.getLogger("tensorwire").setLevel(logging.ERROR)
    res = {"runner": {False: [], True: []}, "map": {False: [], True: []}}
    restarts = {"runner": 0, "map": 0}
    exact = True
    for _ in range(a.rounds):
        for kill in (False, True):
            rate, k = run_runner(a.seconds, a.num_proc, kill)
            res["runner"][kill].append(rate)
            restarts["runner"] += k
            rate, k, ok = run_map(a.seconds, a.num_proc, kill)
            res["map"][kill].append(rate)
            restarts["map"] += k
            exact &= ok
    print(f"load average at the end: {os.getloadavg()}")
    print(f"| runner ({a.num_proc} workers, float32[1024]) | no kills | a kill per second | ratio | restarts |")
    print("|---|---|---|---|---|")
    for name in ("runner", "map"):
        base, killed = statistics.median(res[name][False]), statistics.median(res[name][True])
        print(f"| {name} | {base:,.0f}/s | {killed:,.0f}/s | {killed / base:.2f} | {restarts[name]} |")
    print(f"map epochs all exact under kills: {exact}")


if __name__ == "__main__":
    main()
