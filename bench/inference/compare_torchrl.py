"""Side by side: tensorwire's InferenceServer + SharedMemoryTransport against torchrl's
InferenceServer with its SharedMemoryTransport and with its MPTransport, in one run.

N client processes (spawned, as torchrl requires) call the server in a loop for a fixed
time with a policy that costs nothing; requests/s is summed over the clients. Every
(payload, max_batch_size) configuration runs each system in turn, `--rounds` times
interleaved, and reports the median, so all ratios come from the same run under the same
machine load. Also: one client's round-trip latency for each system, and the tensorwire
drop-in (tensorwire.torchrl) under torchrl's own server.

    PYTHONPATH=python .venv/bin/python bench/inference/compare_torchrl.py --json out.json [--plot out.png]

--plot draws the systems side by side (bench/plotting.py): requests/s per payload and
max_batch_size, and one client's round-trip latency distribution.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np
from round_trips import round_trips

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SYSTEMS = ["tensorwire", "torchrl_shm", "torchrl_mp", "torchrl_server+tensorwire_dropin"]
PAYLOADS = {"f32x4": ((4,), "float32"), "u8x84x84x3": ((84, 84, 3), "uint8")}


# --- servers (in this process) and their clients ------------------------------------------

class _TwPolicy:
    """Returns preallocated actions: a policy that costs (almost) nothing."""

    def __init__(self, max_batch):
        import tensorwire as tw
        self.out = [tw.TensorDict({"action": np.zeros((n, 2), np.float32)}, batch_size=[n])
                    for n in range(max_batch + 1)]

    def __call__(self, batch):
        return self.out[batch.batch_size[0]]


class _TdPolicy:
    def __init__(self, max_batch):
        import torch
        from tensordict import TensorDict
        self.out = [TensorDict({"action": torch.zeros(n, 2)}, batch_size=[n]) for n in range(max_batch + 1)]

    def __call__(self, batch):
        return self.out[batch.batch_size[0]]


def make_system(system, payload, max_batch, clients):
    """(server, client list) for one system; the server is started."""
    shape, dtype = PAYLOADS[payload]
    if system == "tensorwire":
        import tensorwire as tw
        t = tw.SharedMemoryTransport({"observation": np.zeros(shape, dtype)},
                                     {"action": np.zeros(2, np.float32)}, num_slots=clients)
        server = tw.InferenceServer(_TwPolicy(max_batch), t, max_batch_size=max_batch).start()
        return server, [t.client() for _ in range(clients)]
    import torch
    from tensordict import TensorDict
    from torchrl.modules.inference_server import InferenceServer, MPTransport
    from torchrl.modules.inference_server import SharedMemoryTransport as TorchrlShm
    req = TensorDict({"observation": torch.zeros(shape, dtype=getattr(torch, dtype))})
    resp = TensorDict({"action": torch.zeros(2)})
    if system == "torchrl_shm":
        t = TorchrlShm(req, resp, num_slots=clients)
    elif system == "torchrl_mp":
        t = MPTransport()
    else:
        from tensorwire.torchrl import SharedMemoryTransport as Dropin
        t = Dropin(req, resp, num_slots=clients)
    cl = [t.client() for _ in range(clients)]
    server = InferenceServer(_TdPolicy(max_batch), t, max_batch_size=max_batch).start()
    return server, cl


def _request(system, payload):
    shape, dtype = PAYLOADS[payload]
    if system == "tensorwire":
        import tensorwire as tw
        return tw.TensorDict({"observation": np.ones(shape, dtype)})
    import torch
    from tensordict import TensorDict
    return TensorDict({"observation": torch.ones(shape, dtype=getattr(torch, dtype))})


def client_loop(system, payload, client, seconds, go, results):
    td = _request(system, payload)
    warm_until = time.monotonic() + 0.3
    while time.monotonic() < warm_until:
        client(td)
    results.put(("ready", 0, 0.0))
    go.wait()
    n, t0 = 0, time.monotonic()
    stop = t0 + seconds
    while True:
        client(td)
        n += 1
        if (n & 7) == 0 and time.monotonic() >= stop:
            break
    results.put(("done", n, time.monotonic() - t0))


def latency_loop(system, payload, client, count, results):
    td = _request(system, payload)
    samples = round_trips(lambda: client(td), count, warmup=200)
    # p50, p95, and the percentiles 0, 5, ..., 100 for the figure's distribution
    results.put((samples[len(samples) // 2], samples[int(len(samples) * 0.95)],
                 [samples[min(len(samples) - 1, round(q * (len(samples) - 1) / 20))] for q in range(21)]))


def memory_loop(client, count, results):
    import psutil
    import tensorwire as tw
    td = tw.TensorDict({"observation": np.ones(4, np.float32)})
    me = psutil.Process()
    for _ in range(1000):
        client(td)
    start = me.memory_info().rss
    for _ in range(count):
        client(td)
    results.put((start, me.memory_info().rss))


def run_memory(count, clients, ctx):
    """RSS of the Python server process and of each client over `count` requests."""
    import psutil
    server, cl = make_system("tensorwire", "f32x4", 64, clients)
    try:
        results = ctx.Queue()
        procs = [ctx.Process(target=memory_loop, args=(c, count // clients, results)) for c in cl]
        for p in procs:
            p.start()
        time.sleep(1.0)  # the clients' warm-up
        me = psutil.Process()
        server_start = me.memory_info().rss
        client_rss = [results.get(timeout=600) for _ in procs]
        server_end = me.memory_info().rss
        for p in procs:
            p.join(30)
        return {"requests": count, "server_rss_start": server_start, "server_rss_end": server_end,
                "clients": [{"rss_start": a, "rss_end": b} for a, b in client_rss],
                "served": server.stats()["requests"]}
    finally:
        server.shutdown()


def run_throughput(system, payload, max_batch, clients, seconds, ctx):
    server, cl = make_system(system, payload, max_batch, clients)
    try:
        go, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=client_loop, args=(system, payload, c, seconds, go, results))
                 for c in cl]
        for p in procs:
            p.start()
        for _ in procs:
            assert results.get(timeout=120)[0] == "ready"
        go.set()
        done = [results.get(timeout=seconds * 10 + 60) for _ in procs]
        for p in procs:
            p.join(30)
        stats = server.stats()
        return sum(d[1] for d in done) / max(d[2] for d in done), stats.get("avg_batch_size", 0.0)
    finally:
        server.shutdown()


def run_latency(system, count, ctx):
    server, cl = make_system(system, "f32x4", 64, 1)
    try:
        results = ctx.Queue()
        p = ctx.Process(target=latency_loop, args=(system, "f32x4", cl[0], count, results))
        p.start()
        r = results.get(timeout=300)
        p.join(30)
        return r
    finally:
        server.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--payloads", default="f32x4,u8x84x84x3")
    ap.add_argument("--batches", default="4,64")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--latency-requests", type=int, default=3000)
    ap.add_argument("--memory", type=int, default=0,
                    help="also run this many requests through tensorwire and report RSS")
    ap.add_argument("--json")
    ap.add_argument("--plot", metavar="FILE.png", help="draw the figure here")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    systems = args.systems.split(",")
    import torch
    import torchrl
    import tensordict
    print(f"# torch {torch.__version__}, tensordict {tensordict.__version__}, torchrl {torchrl.__version__}; "
          f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    out = {"clients": args.clients, "seconds": args.seconds, "rounds": args.rounds,
           "versions": {"torch": torch.__version__, "tensordict": tensordict.__version__,
                        "torchrl": torchrl.__version__},
           "latency_us": {}, "throughput": []}

    print("\n## one client, float32[4] -> float32[2]: round trip (us)")
    for system in systems:
        p50, p95, qs = run_latency(system, args.latency_requests, ctx)
        out["latency_us"][system] = {"p50": p50, "p95": p95, "quantiles": qs}
        print(f"  {system:34s} p50 {p50:9.1f}   p95 {p95:9.1f}")

    print(f"\n## {args.clients} client processes, {args.seconds:.0f} s each, median of {args.rounds} "
          "interleaved rounds: requests/s")
    header = f"  {'payload':12s} {'max_batch':>9s} " + "".join(f"{s[:22]:>24s}" for s in systems)
    print(header + "   tw/torchrl_shm  tw/torchrl_mp")
    for payload in args.payloads.split(","):
        for max_batch in [int(b) for b in args.batches.split(",")]:
            rates = {s: [] for s in systems}
            batches = {s: [] for s in systems}
            for _ in range(args.rounds):
                for system in systems:
                    r, b = run_throughput(system, payload, max_batch, args.clients, args.seconds, ctx)
                    rates[system].append(r)
                    batches[system].append(b)
            med = {s: statistics.median(v) for s, v in rates.items()}
            row = {"payload": payload, "max_batch_size": max_batch, "requests_per_s": med,
                   "all_rounds": rates,
                   "avg_batch": {s: statistics.median(v) for s, v in batches.items()}}
            line = f"  {payload:12s} {max_batch:9d} " + "".join(f"{med[s]:24.0f}" for s in systems)
            if "tensorwire" in med:
                for ref in ("torchrl_shm", "torchrl_mp"):
                    if ref in med:
                        row[f"ratio_vs_{ref}"] = med["tensorwire"] / med[ref]
                line += f"   {row.get('ratio_vs_torchrl_shm', float('nan')):13.1f}x" \
                        f"  {row.get('ratio_vs_torchrl_mp', float('nan')):12.1f}x"
            print(line, flush=True)
            out["throughput"].append(row)
    if args.memory:
        m = run_memory(args.memory, args.clients, ctx)
        out["memory"] = m
        kib = 1024
        print(f"\n## RSS over {m['requests']} requests from {args.clients} client processes (tensorwire)")
        print(f"  server: {m['server_rss_start'] // kib} -> {m['server_rss_end'] // kib} KiB "
              f"({(m['server_rss_end'] - m['server_rss_start']) // kib:+d})")
        for i, c in enumerate(m["clients"]):
            print(f"  client {i}: {c['rss_start'] // kib} -> {c['rss_end'] // kib} KiB "
                  f"({(c['rss_end'] - c['rss_start']) // kib:+d})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"\nfigures written to {args.json}")
    if args.plot:
        plot(out, systems, args.plot)


def plot(out, systems, path):
    """Requests/s of every system per (payload, max_batch_size), and the latency distributions."""
    sys.path.insert(0, BENCH)
    import plotting
    fig, (thr, lat) = plotting.figure(2, "Inference server: tensorwire beside torchrl")
    rows = out["throughput"]
    plotting.bars(thr, f"{out['clients']} client processes, median of {out['rounds']} rounds",
                  [f"{r['payload']}\nbatch {r['max_batch_size']}" for r in rows],
                  {s: [r["requests_per_s"][s] for r in rows] for s in systems}, "requests/s (log)", log=True)
    plotting.distributions(lat, "one client, float32[4]: round trip",
                           {s: out["latency_us"][s]["quantiles"] for s in systems}, "microseconds (log)")
    plotting.save(fig, path)


if __name__ == "__main__":
    sys.exit(main())
