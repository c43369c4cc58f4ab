"""Side by side: tensorpack's MultiProcessRunnerZMQ (from PyPI) vs tensorwire's, same run.

The same Python dataflow yields ``[np.zeros(shape, np.uint8), 1]`` for ever (as in the
reference measurement, docs/benchmarks.md "Dataflow runners"); each runner is timed
with ``perf_counter`` over ``--seconds`` after ``--warmup`` datapoints, the consumer
dropping each datapoint. Single-thread memcpy bandwidth is measured in the same run
(np.copyto between two warm arrays of the datapoint's size, and of 256 MiB).

Also, with ``--memory``: the main process's RSS over 10^5 datapoints that the consumer
drops, and the shared memory each worker maps (its bound is about hwm datapoints).

    PYTHONPATH=python .venv/bin/python bench/dataflow/compare_tensorpack.py [--json out.json]
"""
import argparse
import json
import logging
import os
import sys
import time

import numpy as np

SHAPES = {"1": (1,), "224x224x3": (224, 224, 3), "32x224x224x3": (32, 224, 224, 3)}


class Inf:
    """The benchmark dataflow: [uint8 zeros of `shape`, 1], for ever."""

    def __init__(self, shape):
        self.shape = shape

    def reset_state(self):
        pass

    def __iter__(self):
        shape = self.shape
        while True:
            yield [np.zeros(shape, np.uint8), 1]

    def __len__(self):
        raise NotImplementedError  # endless (tensorpack reads the length in its constructor)


def timed(runner, warmup, seconds):
    it = iter(runner)
    for _ in range(warmup):
        next(it)
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(16):
            next(it)
        n += 16
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - t0)


def run_tensorpack(shape, num_proc, hwm, warmup, seconds):
    from tensorpack.dataflow import MultiProcessRunnerZMQ

    r = MultiProcessRunnerZMQ(Inf(shape), num_proc=num_proc, hwm=hwm)
    r.reset_state()
    try:
        return timed(r, warmup, seconds)
    finally:
        r.__del__()  # tensorpack cleans up in __del__ (terminate + join)


def run_tensorwire(shape, num_proc, hwm, warmup, seconds):
    from tensorwire.tensorpack import MultiProcessRunnerZMQ

    r = MultiProcessRunnerZMQ(Inf(shape), num_proc=num_proc, hwm=hwm)
    r.reset_state()
    try:
        dps = timed(r, warmup, seconds)
        return dps, r.shared_memory_bytes
    finally:
        r.close()


def memcpy_bandwidth(nbytes, seconds=0.5):
    a = np.ones(nbytes, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        np.copyto(b, a)
        n += 1
    return n * nbytes / (time.perf_counter() - t0)


def rss():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "RssAnon", "RssShmem")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def memory_check(shape, total, hwm):
    from tensorwire.dataflow import MultiProcessRunnerZMQ

    r = MultiProcessRunnerZMQ(Inf(shape), num_proc=2, hwm=hwm)
    r.reset_state()
    samples = []
    it = iter(r)
    for i in range(total + 1):
        next(it)
        if i % (total // 10) == 0:
            samples.append({"datapoints": i, **rss(), "shm_mapped": r.shared_memory_bytes})
    r.close()
    return samples


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated among: " + ", ".join(SHAPES))
    p.add_argument("--num-proc", default="1,2")
    p.add_argument("--hwm", type=int, default=50)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=1, help="repeat; medians are reported (ratios per round)")
    p.add_argument("--memory", action="store_true", help="also the RSS / shared-memory check")
    p.add_argument("--memory-datapoints", type=int, default=100_000)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    logging.getLogger("tensorpack").setLevel(logging.ERROR)
    logging.getLogger("tensorwire").setLevel(logging.ERROR)

    results = {"machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}, "runs": []}
    big = max(int(np.prod(SHAPES[s])) for s in args.shapes.split(","))
    mc_dp = memcpy_bandwidth(big)
    mc_dram = memcpy_bandwidth(256 << 20, 1.0)
    results["memcpy"] = {"datapoint_bytes": big, "bytes_per_s": mc_dp, "256MiB_bytes_per_s": mc_dram}
    print(f"single-thread memcpy (np.copyto): {mc_dp / 1e9:.2f} GB/s at {big} B, {mc_dram / 1e9:.2f} GB/s at 256 MiB")
    configs = [(name, num_proc) for name in args.shapes.split(",") for num_proc in map(int, args.num_proc.split(","))]
    rounds = {c: [] for c in configs}
    for rnd in range(args.rounds):
        for name, num_proc in configs:
            shape = SHAPES[name]
            tp = run_tensorpack(shape, num_proc, args.hwm, args.warmup, args.seconds)
            tw, shm = run_tensorwire(shape, num_proc, args.hwm, args.warmup, args.seconds)
            rounds[(name, num_proc)].append((tp, tw, shm))
            if args.rounds > 1:
                print(f"  round {rnd + 1}: {name} x{num_proc}: tensorpack {tp:,.0f}, tensorwire {tw:,.0f} dp/s "
                      f"({tw / tp:.1f}x)", flush=True)
    print(f"{'shape':>14} {'proc':>4} | {'tensorpack dp/s':>15} {'GB/s':>7} | {'tensorwire dp/s':>15} {'GB/s':>7}"
          f" | {'ratio':>6} | {'% memcpy':>8} | {'shm MiB':>7}")
    for (name, num_proc), rs in rounds.items():
        nbytes = int(np.prod(SHAPES[name]))
        tp = float(np.median([r[0] for r in rs]))
        tw = float(np.median([r[1] for r in rs]))
        ratio = float(np.median([r[1] / r[0] for r in rs]))  # each ratio from one round
        shm = rs[-1][2]
        row = {"shape": name, "num_proc": num_proc, "tensorpack_dps": tp, "tensorwire_dps": tw, "ratio": ratio,
               "bytes": nbytes, "tensorwire_bytes_per_s": tw * nbytes, "tensorpack_bytes_per_s": tp * nbytes,
               "memcpy_fraction": tw * nbytes / mc_dp, "memcpy_256MiB_fraction": tw * nbytes / mc_dram,
               "shm_bytes": shm, "rounds": [{"tensorpack": a, "tensorwire": b} for a, b, _ in rs]}
        results["runs"].append(row)
        frac = f"{100 * tw * nbytes / mc_dp:>7.0f}%" if nbytes >= 4096 else f"{'-':>8}"
        print(f"{name:>14} {num_proc:>4} | {tp:>15,.0f} {tp * nbytes / 1e9:>7.2f} | {tw:>15,.0f} "
              f"{tw * nbytes / 1e9:>7.2f} | {ratio:>5.1f}x | {frac} | {shm / 2**20:>7.1f}", flush=True)
    if args.memory:
        shape = SHAPES["224x224x3"]
        samples = memory_check(shape, args.memory_datapoints, args.hwm)
        results["memory"] = {"shape": "224x224x3", "num_proc": 2, "hwm": args.hwm, "samples": samples}
        print(f"\nmain-process memory over {args.memory_datapoints} datapoints of 224x224x3 (2 workers, hwm "
              f"{args.hwm}); bound: 2 x (hwm + 4) x {int(np.prod(shape))} B = "
              f"{2 * (args.hwm + 4) * int(np.prod(shape)) / 2**20:.1f} MiB")
        for s in samples:
            print(f"  {s['datapoints']:>7} datapoints: RSS {s['VmRSS'] / 2**20:7.1f} MiB (anon "
                  f"{s['RssAnon'] / 2**20:6.1f}, shmem {s['RssShmem'] / 2**20:6.1f}), shared memory mapped "
                  f"{s['shm_mapped'] / 2**20:6.1f} MiB")
    results["machine"]["loadavg_end"] = os.getloadavg()
    print(f"load average: {results['machine']['loadavg_start'][0]:.2f} at the start, "
          f"{results['machine']['loadavg_end'][0]:.2f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
