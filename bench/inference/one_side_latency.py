"""One actor's round trip on a server of two transports while the other one is idle.

    PYTHONPATH=python python bench/inference/one_side_latency.py [--requests 3000] [--rounds 2]

An InferenceServer over a SharedMemoryTransport and a RemoteTransport (float32[4] ->
float32[2], a policy that costs nothing, max_batch_size 64) serves one actor process that
calls in a loop through one of them (local: shared memory; remote: UCX over loopback) while
nobody uses the other. Its round trip is set against the same actor's on a server of that
transport alone, in the same run (rounds alternate). The server of two transports must not
make a lone actor wait on the idle one (issue 10: "starves neither side").
"""
import argparse
import subprocess
import sys

import numpy as np
from round_trips import round_trips

import tensorwire as tw
from tensorwire import inference as inf

SPEC = {"observation": np.zeros(4, np.float32)}
RESP = {"action": np.zeros(2, np.float32)}


def actor(kind: str, address: str, requests: int) -> None:
    c = inf.SharedMemoryTransport.client_for(address) if kind == "local" else \
        inf.connect("127.0.0.1", int(address))
    td = {"observation": np.zeros(4, np.float32)}
    lat = round_trips(lambda: c(td), requests, warmup=500)
    print(lat[len(lat) // 2], lat[len(lat) * 99 // 100])


def one(kind: str, both: bool, requests: int) -> tuple:
    outs = [tw.TensorDict({"action": np.zeros((n, 2), np.float32)}, batch_size=[n])
            for n in range(65)]
    shm = inf.SharedMemoryTransport(SPEC, RESP, num_slots=8)
    remote = inf.RemoteTransport(SPEC, RESP, num_slots=8, host="127.0.0.1")
    mine = shm if kind == "local" else remote
    parts = [shm, remote] if both else [mine]
    server = inf.InferenceServer(lambda b: outs[b.batch_size[0]], parts, max_batch_size=64)
    server.start()
    try:
        address = shm.name if kind == "local" else str(remote.port)
        out = subprocess.run([sys.executable, __file__, "--actor", kind, address, str(requests)],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"the actor failed: {out.stderr[-2000:]}")
        p50, p99 = map(float, out.stdout.split())
        return p50, p99
    finally:
        server.shutdown()
        shm.close()
        remote.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--actor", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.actor:
        actor(a.actor[0], a.actor[1], int(a.actor[2]))
        return
    print("| actor | server of | p50 us | p99 us |\n|---|---|---|---|")
    for r in range(a.rounds):
        for kind in ("local", "remote"):
            for both in (False, True):
                p50, p99 = one(kind, both, a.requests)
                parts = "shared memory + remote" if both else \
                    ("shared memory" if kind == "local" else "remote") + " alone"
                print(f"| {kind} | {parts} | {p50:.1f} | {p99:.1f} |", flush=True)


if __name__ == "__main__":
    main()
