"""Actor processes on one simulated host, for bench/inference/remote_vs_gloo.py and
bench/inference/mixed_batch.py:

    python host_actors.py SYSTEM REACH ACTORS SHAPE DTYPE SECONDS LATENCY

spawns ACTORS processes, each with its own client of SYSTEM's server (REACH: for
"tensorwire", a RemoteTransport's "host:port"; for "shm", a SharedMemoryTransport's name;
for "torchrl_gloo", torchrl's pickled clients in base64); with LATENCY=0 each calls in a loop
for SECONDS and the requests/s summed over them is printed, else one actor times LATENCY
calls and their p50/p99 are printed (JSON, one line).
"""
import base64
import json
import multiprocessing as mp
import pickle
import sys
import time

import numpy as np
from round_trips import round_trips


def make_client(system, reach, i):
    if system == "tensorwire":
        from tensorwire import inference as inf
        host, port = reach.rsplit(":", 1)
        return inf.connect(host, int(port))
    if system == "shm":
        from tensorwire import inference as inf
        return inf.SharedMemoryTransport.client_for(reach)
    return pickle.loads(base64.b64decode(reach))[i]


def request(system, shape, dtype):
    if system in ("tensorwire", "shm"):
        import tensorwire as tw
        return tw.TensorDict({"observation": np.ones(shape, dtype)})
    import torch
    from tensordict import TensorDict
    return TensorDict({"observation": torch.ones(shape, dtype=getattr(torch, dtype))})


def actor(system, reach, i, shape, dtype, seconds, latency, go, results):
    client, td = make_client(system, reach, i), request(system, shape, dtype)
    for _ in range(50):
        client(td)
    results.put(("ready", 0, 0.0, []))
    go.wait()
    if latency:
        results.put(("done", latency, 0.0, round_trips(lambda: client(td), latency)))
        return
    n, t0 = 0, time.monotonic()
    while True:
        client(td)
        n += 1
        if (n & 7) == 0 and time.monotonic() - t0 >= seconds:
            break
    results.put(("done", n, time.monotonic() - t0, []))


if __name__ == "__main__":
    system, reach, actors = sys.argv[1], sys.argv[2], int(sys.argv[3])
    shape, dtype = tuple(map(int, sys.argv[4].split("x"))), sys.argv[5]
    seconds, latency = float(sys.argv[6]), int(sys.argv[7])
    ctx = mp.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=actor, args=(system, reach, i, shape, dtype, seconds, latency,
                                             go, results)) for i in range(actors)]
    for p in procs:
        p.start()
    for _ in procs:
        assert results.get(timeout=300)[0] == "ready"
    go.set()
    done = [results.get(timeout=seconds * 10 + 300) for _ in procs]
    for p in procs:
        p.join(30)
    if latency:
        s = done[0][3]
        print(json.dumps({"p50_us": s[len(s) // 2], "p99_us": s[int(len(s) * 0.99)]}))
    else:
        print(json.dumps({"rps": sum(d[1] for d in done) / max(d[2] for d in done)}))
