"""Hundreds of remote clients on one server: memory per client, fairness, flat RSS.

    python bench/inference/remote_scale.py [--clients 256] [--procs 8] [--requests 1000000]

Host A (tests/python/hosts.py) runs an InferenceServer on a RemoteTransport (float32[4] ->
float32[2], a policy that costs nothing, max_batch_size 64). Host B runs `--procs`
processes holding `--clients` clients between them, each keeping one request of each of
its clients in flight (answers taken as they come), until the clients have made `--requests` requests in all. Reports:
the server's RSS with no client, with all connected (the difference per client), and
after the requests (flat means no growth beyond noise); requests/s in all; fairness as the
busiest client's requests/s over the idlest's (issue 10: at most 2x). Run as root.
"""
import argparse
import json
import os
import select
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from hosts import Hosts  # noqa: E402

# Host A. stdin lines: "rss" prints the RSS in bytes and the fds; EOF ends it.
SERVER = r"""
import os, sys
import numpy as np
import tensorwire as tw
from tensorwire import inference as inf
slots = int(sys.argv[1])
outs = [tw.TensorDict({"action": np.zeros((n, 2), np.float32)}, batch_size=[n])
        for n in range(65)]
t = inf.RemoteTransport({"observation": np.zeros(4, np.float32)},
                        {"action": np.zeros(2, np.float32)}, num_slots=slots)
server = inf.InferenceServer(lambda b: outs[b.batch_size[0]], t, max_batch_size=64).start()
def rss():
    with open("/proc/self/status") as f:
        kb = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    return kb * 1024, len(os.listdir("/proc/self/fd"))
print(t.port, flush=True)
for line in sys.stdin:
    print(*rss(), server.stats()["requests"], flush=True)
server.shutdown()
"""

# Host B: one process of clients. Connects them all, says "connected", waits for a line
# on stdin, then keeps one request of each client in flight until the process's share of
# requests is made; prints the per-client counts and the seconds taken (JSON).
CLIENTS = r"""
import json, sys, time
import numpy as np
import tensorwire as tw
from tensorwire import inference as inf
host, port, n, share = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
clients = [inf.connect(host, port) for _ in range(n)]
obs = tw.TensorDict({"observation": np.ones(4, np.float32)})
for c in clients:
    c(obs)
print("connected", flush=True)
sys.stdin.readline()
# One request in flight per client, answers taken as they come: the counts measure how the
# server serves the clients, not how threads of this process share its interpreter.
counts, futures = [0] * n, [c.submit(obs) for c in clients]
t0 = time.monotonic()
while sum(counts) < share:
    progressed = False
    for i, f in enumerate(futures):
        if f.done():
            f.result()
            counts[i] += 1
            futures[i] = clients[i].submit(obs)
            progressed = True
    if not progressed:
        time.sleep(0.0001)
for f in futures:
    f.result()
print(json.dumps({"counts": counts, "seconds": time.monotonic() - t0}), flush=True)
sys.stdin.readline()  # connected until the server's RSS is read
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--requests", type=int, default=1_000_000)
    a = ap.parse_args()
    per_proc = a.clients // a.procs
    with Hosts(2) as (ha, hb):
        server = ha.python(SERVER, min(a.clients, 256), stdin=subprocess.PIPE)
        port = server.stdout.readline().strip()

        def server_rss():
            server.stdin.write("rss\n")
            server.stdin.flush()
            rss, fds, served = map(int, server.stdout.readline().split())
            return rss, fds, served

        idle = server_rss()
        procs = [hb.python(CLIENTS, ha.addr, port, per_proc, a.requests // a.procs,
                           stdin=subprocess.PIPE) for _ in range(a.procs)]
        for p in procs:
            if p.stdout.readline().strip() != "connected":
                raise RuntimeError(f"clients did not connect: {p.stderr.read()[-2000:]}")
        connected = server_rss()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        # The server's RSS every 10 s while the clients run, then once all are done (still
        # connected).
        samples, results, waiting = [], {}, {p.stdout: p for p in procs}
        while waiting:
            ready, _, _ = select.select(list(waiting), [], [], 10)
            if not ready:
                samples.append(server_rss())
            for f in ready:
                p = waiting.pop(f)
                line = f.readline()
                if not line:
                    raise RuntimeError(f"client process failed: {p.stderr.read()[-2000:]}")
                results[p.pid] = json.loads(line)
        end = server_rss()
        for p in procs:
            p.stdin.close()
            p.wait(60)
        server.stdin.close()
        server.wait(60)
        results = list(results.values())
    rates = [c / r["seconds"] for r in results for c in r["counts"]]
    total = sum(sum(r["counts"]) for r in results)
    seconds = max(r["seconds"] for r in results)
    n = per_proc * a.procs
    mib = 1 << 20
    print(f"{n} remote clients in {a.procs} processes, {total} requests in {seconds:.1f} s "
          f"= {total / seconds:.0f} requests/s")
    print(f"server RSS: idle {idle[0] / mib:.1f} MiB ({idle[1]} fds), {n} connected "
          f"{connected[0] / mib:.1f} MiB ({connected[1]} fds): "
          f"{(connected[0] - idle[0]) / n / 1024:.0f} KiB and "
          f"{(connected[1] - idle[1]) / n:.1f} fds per client")
    print("server RSS over the requests (MiB after requests served): " + ", ".join(
        f"{rss / mib:.1f} after {served}" for rss, _, served in [connected, *samples, end]))
    print(f"fairness: busiest client {max(rates):.0f} req/s, idlest {min(rates):.0f} req/s: "
          f"{max(rates) / max(min(rates), 1e-9):.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
