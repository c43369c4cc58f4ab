"""Side by side: tensorpack's MultiProcessRunnerZMQ (from PyPI) vs tensorwire's, same run.

The same Python dataflow yields ``[np.zeros(shape, np.uint8), 1]`` for ever (as in the
reference measurement, docs/benchmarks.md "Dataflow runners"); each runner is timed
with ``perf_counter`` over ``--seconds`` after ``--warmup`` datapoints, the consumer
dropping each datapoint. Single-thread memcpy bandwidth is measured in the same run
(np.copyto between two warm arrays of the datapoint's size, and of 256 MiB).

Also, with ``--memory``: the main process's RSS over 10^5 datapoints that the consumer
drops, and the shared memory each worker maps (its bound is about hwm datapoints).

    PYTHONPATH=python .venv/bin/python bench/dataflow/compare_tensorpack.py [--json out.json] [--plot out.png]

--plot draws the two runners side by side (bench/plotting.py): datapoints per second at
each datapoint size and worker count, and the CPU time each datapoint costs.
"""
import argparse
import json
import logging
import os
import sys
import time

import numpy as np

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def cpu_seconds(pid):
    """User + system CPU time of a process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(runner, warmup, seconds, worker_pids):
    """Datapoints per second of wall clock, and CPU microseconds per datapoint (main
    process and workers together: the cost of a datapoint, whatever the machine's load)."""
    it = iter(runner)
    for _ in range(warmup):
        next(it)
    pids = [os.getpid()] + list(worker_pids())
    n = 0
    cpu0 = sum(cpu_seconds(p) for p in pids)
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(16):
            next(it)
        n += 16
        now = time.perf_counter()
        if now >= deadline:
            cpu = sum(cpu_seconds(p) for p in pids) - cpu0
            return n / (now - t0), cpu / n * 1e6


def run_tensorpack(shape, num_proc, hwm, warmup, seconds):
    from tensorpack.dataflow import MultiProcessRunnerZMQ

    r = MultiProcessRunnerZMQ(Inf(shape), num_proc=num_proc, hwm=hwm)
    r.reset_state()
    try:
        return timed(r, warmup, seconds, lambda: [p.pid for p in r._procs])
    finally:
        r.__del__()  # tensorpack cleans up in __del__ (terminate + join)


def run_tensorwire(shape, num_proc, hwm, warmup, seconds):
    from tensorwire.tensorpack import MultiProcessRunnerZMQ

    r = MultiProcessRunnerZMQ(Inf(shape), num_proc=num_proc, hwm=hwm)
    r.reset_state()
    try:
        dps, cpu = timed(r, warmup, seconds, lambda: r.pids)
        return dps, cpu, r.shared_memory_bytes
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
    p.add_argument("--plot", metavar="FILE.png", help="draw the figure here")
    args = p.parse_args()
    logging.getLogger("tensorpack").setLevel(logging.ERROR)
    logging.getLogger("tensorwire").setLevel(logging.ERROR)

    results = {"machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}, "runs": []}
    mc_dram = memcpy_bandwidth(256 << 20, 1.0)
    results["memcpy_256MiB_bytes_per_s"] = mc_dram
    print(f"single-thread memcpy (np.copyto) of 256 MiB: {mc_dram / 1e9:.2f} GB/s; of each datapoint's size: "
          "measured in each round, just before tensorwire's run (% memcpy below)")
    configs = [(name, num_proc) for name in args.shapes.split(",") for num_proc in map(int, args.num_proc.split(","))]
    rounds = {c: [] for c in configs}
    for rnd in range(args.rounds):
        for name, num_proc in configs:
            shape = SHAPES[name]
            nbytes = int(np.prod(shape))
            tp, tp_cpu = run_tensorpack(shape, num_proc, args.hwm, args.warmup, args.seconds)
            # memcpy right before tensorwire's run: the same conditions, as far as a shared
            # machine allows
            mc = memcpy_bandwidth(nbytes, 0.3) if nbytes >= 4096 else float("nan")
            tw, tw_cpu, shm = run_tensorwire(shape, num_proc, args.hwm, args.warmup, args.seconds)
            rounds[(name, num_proc)].append({"tensorpack": tp, "tensorwire": tw, "tensorpack_cpu_us": tp_cpu,
                                             "tensorwire_cpu_us": tw_cpu, "memcpy": mc, "shm": shm})
            if args.rounds > 1:
                print(f"  round {rnd + 1}: {name} x{num_proc}: tensorpack {tp:,.0f}, tensorwire {tw:,.0f} dp/s "
                      f"({tw / tp:.1f}x); CPU per datapoint {tp_cpu:.1f} vs {tw_cpu:.1f} us "
                      f"({tp_cpu / tw_cpu:.1f}x)", flush=True)
    print(f"{'shape':>14} {'proc':>4} | {'tensorpack dp/s':>15} {'GB/s':>6} | {'tensorwire dp/s':>15} {'GB/s':>6}"
          f" | {'ratio':>6} | {'CPU us/dp tp / tw':>17} {'ratio':>6} | {'% memcpy':>8} | {'shm MiB':>7}")
    med = lambda xs: float(np.median(xs))  # noqa: E731
    for (name, num_proc), rs in rounds.items():
        nbytes = int(np.prod(SHAPES[name]))
        tp, tw = med([r["tensorpack"] for r in rs]), med([r["tensorwire"] for r in rs])
        ratio = med([r["tensorwire"] / r["tensorpack"] for r in rs])  # each ratio from one round
        tp_cpu, tw_cpu = med([r["tensorpack_cpu_us"] for r in rs]), med([r["tensorwire_cpu_us"] for r in rs])
        cpu_ratio = med([r["tensorpack_cpu_us"] / r["tensorwire_cpu_us"] for r in rs])
        frac = med([r["tensorwire"] * nbytes / r["memcpy"] for r in rs])
        row = {"shape": name, "num_proc": num_proc, "tensorpack_dps": tp, "tensorwire_dps": tw, "ratio": ratio,
               "tensorpack_cpu_us_per_dp": tp_cpu, "tensorwire_cpu_us_per_dp": tw_cpu, "cpu_ratio": cpu_ratio,
               "bytes": nbytes, "tensorwire_bytes_per_s": tw * nbytes, "memcpy_fraction": frac,
               "memcpy_256MiB_fraction": tw * nbytes / mc_dram, "shm_bytes": rs[-1]["shm"], "rounds": rs}
        results["runs"].append(row)
        pct = f"{100 * frac:>7.0f}%" if nbytes >= 4096 else f"{'-':>8}"
        print(f"{name:>14} {num_proc:>4} | {tp:>15,.0f} {tp * nbytes / 1e9:>6.2f} | {tw:>15,.0f} "
              f"{tw * nbytes / 1e9:>6.2f} | {ratio:>5.1f}x | {tp_cpu:>8.2f} / {tw_cpu:>6.2f} {cpu_ratio:>5.1f}x | "
              f"{pct} | {rs[-1]['shm'] / 2**20:>7.1f}", flush=True)
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
    if args.plot:
        plot(results, args.rounds, args.plot)


def plot(results, rounds, path):
    """Datapoints/s of both runners per (shape, workers), and CPU microseconds per datapoint."""
    sys.path.insert(0, BENCH)
    import plotting
    fig, (thr, cpu) = plotting.figure(2, "Dataflow runners: tensorwire beside tensorpack's MultiProcessRunnerZMQ")
    runs = results["runs"]
    groups = [f"{r['shape']}\n{r['num_proc']} worker{'s' if r['num_proc'] > 1 else ''}" for r in runs]
    plotting.bars(thr, f"datapoints/s (median of {rounds} round{'s' if rounds > 1 else ''})", groups,
                  {name: [r[f"{name}_dps"] for r in runs] for name in ("tensorpack", "tensorwire")},
                  "datapoints/s (log)", log=True)
    plotting.bars(cpu, "CPU per datapoint, main process and workers", groups,
                  {name: [r[f"{name}_cpu_us_per_dp"] for r in runs] for name in ("tensorpack", "tensorwire")},
                  "microseconds (log)", log=True)
    plotting.save(fig, path)


if __name__ == "__main__":
    sys.exit(main())
