"""A mixed batch: local and remote actors of one InferenceServer, and each side's share.

    python bench/inference/mixed_batch.py [--local 4] [--remote 4] [--seconds 5] [--rounds 3]
                                          [--min-batch 1] [--timeout-ms 10] [--min-share 0]
                                          [--pin]

Host A (tests/python/hosts.py) runs one InferenceServer over two transports, a
SharedMemoryTransport and a RemoteTransport (float32[4] -> float32[2], a policy that costs
nothing, max_batch_size 64, min_batch_size `--min-batch`, batching timeout `--timeout-ms`,
min_transport_share `--min-share`);
`--local` actors on host A call it through shared memory and
`--remote` actors on host B over TCP on the veth link, all in a loop for `--seconds`.
Reports each side's requests/s and its share of the total (issue 10: each side at least
30%), and the server's average batch. The two groups start within about a second of each
other; shares are taken from their rates, so the skew does not count. `--pin` runs each
host on a CPU of its own (host A on CPU 0, host B on CPU 1, with taskset), as two machines
would: the remote actors then do not take the server host's CPU. Run as root.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from hosts import Hosts  # noqa: E402

ACTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_actors.py")

SERVER = r"""
import json, sys
import numpy as np
import tensorwire as tw
from tensorwire import inference as inf
slots, min_batch, timeout_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
min_share = float(sys.argv[4])
outs = [tw.TensorDict({"action": np.zeros((n, 2), np.float32)}, batch_size=[n])
        for n in range(65)]
spec, resp = {"observation": np.zeros(4, np.float32)}, {"action": np.zeros(2, np.float32)}
shm = inf.SharedMemoryTransport(spec, resp, num_slots=slots)
remote = inf.RemoteTransport(spec, resp, num_slots=slots)
server = inf.InferenceServer(lambda b: outs[b.batch_size[0]], [shm, remote],
                             max_batch_size=64, min_batch_size=min_batch,
                             timeout=timeout_ms / 1000, min_transport_share=min_share).start()
print(shm.name, remote.port, flush=True)
sys.stdin.read()
print(json.dumps(server.stats()), flush=True)
server.shutdown()
"""


def one_round(local, remote, seconds, min_batch, timeout_ms, min_share, pin):
    on = {cpu: ["taskset", "-c", cpu] if pin else [] for cpu in ("0", "1")}
    with Hosts(2) as (ha, hb):
        server = ha.popen([*on["0"], sys.executable, "-c", SERVER,
                           *map(str, (max(local, remote, 4), min_batch, timeout_ms, min_share))],
                          stdin=subprocess.PIPE)
        line = server.stdout.readline().split()
        if len(line) != 2:
            raise RuntimeError(f"the server did not start: {server.stderr.read()[-2000:]}")
        name, port = line
        groups = {
            "local": ha.popen([*on["0"], sys.executable, ACTORS, "shm", name, local, "4", "float32",
                               seconds, 0]),
            "remote": hb.popen([*on["1"], sys.executable, ACTORS, "tensorwire", f"{ha.addr}:{port}",
                                remote, "4", "float32", seconds, 0]),
        }
        rps = {}
        for side, proc in groups.items():
            out, err = proc.communicate(timeout=seconds * 10 + 300)
            if proc.returncode != 0:
                raise RuntimeError(f"the {side} actors failed: {err[-2000:]}")
            rps[side] = json.loads(out.strip().splitlines()[-1])["rps"]
        server.stdin.close()
        stats = json.loads(server.stdout.readline())
        server.wait(60)
        return rps, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local", type=int, default=4)
    ap.add_argument("--remote", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-batch", type=int, default=1, help="the server's min_batch_size")
    ap.add_argument("--timeout-ms", type=float, default=10.0, help="its batching timeout")
    ap.add_argument("--min-share", type=float, default=0.0,
                    help="the server's min_transport_share (0: none kept)")
    ap.add_argument("--pin", action="store_true", help="each host on a CPU of its own")
    a = ap.parse_args()
    for r in range(a.rounds):
        rps, stats = one_round(a.local, a.remote, a.seconds, a.min_batch, a.timeout_ms,
                               a.min_share, a.pin)
        total = rps["local"] + rps["remote"]
        print(f"round {r}: {a.local} local actors {rps['local']:.0f} req/s "
              f"({100 * rps['local'] / total:.0f}%), {a.remote} remote actors "
              f"{rps['remote']:.0f} req/s ({100 * rps['remote'] / total:.0f}%); average batch "
              f"{stats.get('avg_batch_size', 0):.1f} (target: each side >= 30%)", flush=True)


if __name__ == "__main__":
    main()
