"""Remote actors on another host: tensorwire's RemoteTransport against torchrl's
distributed (gloo) inference transport, each under its own InferenceServer, in one run.

    python bench/inference/remote_vs_gloo.py [--actors 4,16] [--payloads f32x4,u8x84x84x3]
        [--seconds 3] [--rounds 2] [--latency-requests 500] [--latency-rounds 1]
        [--only throughput|latency] [--json out.json]

Host A (tests/python/hosts.py: its own network, IPC and pid namespaces) runs the server: a
policy that costs nothing (a preallocated response of the batch's size), max_batch_size
64; host B runs the actor processes (spawned), which call the server in a loop over TCP on
the veth link. For each (payload, actors) both systems run in turn, `--rounds` times
interleaved; requests/s is summed over the actors, and the median round is reported.
Round-trip p50 is one actor's alone, `--latency-rounds` runs of each system, interleaved. gloo is told the namespace's interface
(GLOO_SOCKET_IFNAME=eth0), or it advertises 127.0.0.1. Run as root.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from hosts import Hosts  # noqa: E402

SYSTEMS = ["tensorwire", "torchrl_gloo"]
PAYLOADS = {"f32x4": ((4,), "float32"), "u8x84x84x3": ((84, 84, 3), "uint8")}
# A file, not -c: spawned actors re-import the main module by its path.
ACTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_actors.py")

# Host A: prints one line (what an actor needs to reach the server), then serves until
# its stdin closes.
SERVER = r"""
import base64, pickle, sys
import numpy as np
system, shape, dtype, actors, addr = (sys.argv[1], tuple(map(int, sys.argv[2].split("x"))),
                                      sys.argv[3], int(sys.argv[4]), sys.argv[5])
if system == "tensorwire":
    import tensorwire as tw
    from tensorwire import inference as inf
    outs = [tw.TensorDict({"action": np.zeros((n, 2), np.float32)}, batch_size=[n])
            for n in range(65)]
    t = inf.RemoteTransport({"observation": np.zeros(shape, dtype)},
                            {"action": np.zeros(2, np.float32)}, num_slots=max(actors, 16))
    server = inf.InferenceServer(lambda b: outs[b.batch_size[0]], t, max_batch_size=64).start()
    print(f"{addr}:{t.port}", flush=True)
else:
    import torch
    from tensordict import TensorDict
    from torchrl.modules.inference_server import InferenceServer
    from torchrl.modules.inference_server._distributed import _DistributedInferenceTransport
    outs = [TensorDict({"action": torch.zeros(n, 2)}, batch_size=[n]) for n in range(65)]
    t = _DistributedInferenceTransport(
        TensorDict({"observation": torch.zeros(shape, dtype=getattr(torch, dtype))}),
        TensorDict({"action": torch.zeros(2)}), host=addr)
    clients = [t.client() for _ in range(actors)]
    server = InferenceServer(lambda b: outs[b.batch_size[0]], t, max_batch_size=64).start()
    print(base64.b64encode(pickle.dumps(clients)).decode(), flush=True)
sys.stdin.read()
server.shutdown()
"""

def one_run(system, payload, actors, seconds, latency):
    """Requests/s of `actors` actors (latency=0), or one actor's p50/p99 (latency=N)."""
    shape, dtype = PAYLOADS[payload]
    shape_arg = "x".join(map(str, shape))
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0")
    with Hosts(2) as (ha, hb):
        server = ha.python(SERVER, system, shape_arg, dtype, actors, ha.addr,
                           stdin=subprocess.PIPE, env=env)
        reach = server.stdout.readline().strip()
        if not reach:
            raise RuntimeError(f"{system} server did not start: {server.stderr.read()[-2000:]}")
        client = hb.popen([sys.executable, ACTORS, system, reach, actors, shape_arg, dtype,
                           seconds, latency], env=env)
        out, err = client.communicate(timeout=seconds * 10 + 600)
        server.stdin.close()
        server.wait(60)
        if client.returncode != 0:
            raise RuntimeError(f"{system} actors failed: {err[-2000:]}")
        return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actors", default="4,16")
    ap.add_argument("--payloads", default="f32x4,u8x84x84x3")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--latency-requests", type=int, default=500)
    ap.add_argument("--latency-rounds", type=int, default=1,
                    help="round-trip runs per payload, the systems interleaved")
    ap.add_argument("--only", choices=["throughput", "latency"])
    ap.add_argument("--json")
    a = ap.parse_args()
    report = {"throughput": [], "latency": []}
    for payload in a.payloads.split(",") if a.only != "latency" else []:
        for actors in map(int, a.actors.split(",")):
            runs = {s: [] for s in SYSTEMS}
            for _ in range(a.rounds):
                for s in SYSTEMS:
                    runs[s].append(one_run(s, payload, actors, a.seconds, 0)["rps"])
            med = {s: statistics.median(v) for s, v in runs.items()}
            ratio = med["tensorwire"] / med["torchrl_gloo"]
            report["throughput"].append({"payload": payload, "actors": actors, "runs": runs,
                                         "ratio": ratio})
            print(f"{payload:11s} {actors:3d} actors: tensorwire "
                  f"{' '.join(f'{x:.0f}' for x in runs['tensorwire'])} req/s, torchrl gloo "
                  f"{' '.join(f'{x:.0f}' for x in runs['torchrl_gloo'])} req/s: "
                  f"{ratio:.1f}x (median rounds; target >= 20x)", flush=True)
    for payload in a.payloads.split(",") if a.only != "throughput" else []:
        for _ in range(a.latency_rounds):
            lat = {s: one_run(s, payload, 1, 0, a.latency_requests) for s in SYSTEMS}
            ratio = lat["torchrl_gloo"]["p50_us"] / lat["tensorwire"]["p50_us"]
            report["latency"].append({"payload": payload, **lat, "ratio": ratio})
            print(f"{payload:11s} one actor's round trip p50: tensorwire "
                  f"{lat['tensorwire']['p50_us']:.0f} us (p99 {lat['tensorwire']['p99_us']:.0f}), "
                  f"torchrl gloo {lat['torchrl_gloo']['p50_us']:.0f} us "
                  f"(p99 {lat['torchrl_gloo']['p99_us']:.0f}): {ratio:.1f}x lower (target >= 20x)",
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
