"""One remote actor's round trip against the pipe's, between two simulated hosts.

    python bench/inference/remote_vs_pipe.py [--n 3000] [--rounds 3]

Host A (tests/python/hosts.py: its own network, IPC and pid namespaces) runs an
InferenceServer on a RemoteTransport (float32[4] -> float32[4], a policy that costs
nothing: it returns a preallocated response of the batch's size) and a TensorDictServer
that echoes; host B runs one actor that times N calls of each, over TCP on the veth link,
in the same run: the remote float32[4] inference round trip and the pipe's 1 KiB round
trip (send + recv of {"x": uint8[1024]}). Reports p50/p99 and the ratio of the p50s. Run
as root.
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from hosts import Hosts  # noqa: E402

SERVER = r"""
import sys, threading
import numpy as np
import tensorwire as tw
from tensorwire import inference as inf
spec = {"observation": np.zeros(4, np.float32)}
outs = {}
def policy(batch):
    n = batch.batch_size[0]
    if n not in outs:
        outs[n] = tw.TensorDict({"action": np.zeros((n, 4), np.float32)}, batch_size=[n])
    return outs[n]
t = inf.RemoteTransport(spec, {"action": np.zeros(4, np.float32)}, num_slots=16)
srv = inf.InferenceServer(policy, t, max_batch_size=16, timeout=0.001).start()
ps = tw.TensorDictServer(0)
def echo():
    pipe = ps.accept(timeout=60)
    try:
        while True:
            pipe.send(pipe.recv())
    except Exception:
        pass
threading.Thread(target=echo, daemon=True).start()
print(t.port, ps.port, flush=True)
sys.stdin.read()
"""

CLIENT = r"""
import json, sys, time
import numpy as np
import tensorwire as tw
from tensorwire import inference as inf
host, rport, pport, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = inf.connect(host, rport)
obs = tw.TensorDict({"observation": np.ones(4, np.float32)}, batch_size=[])
pipe = tw.TensorDictPipe.connect(host, pport, timeout=30)
kib = tw.TensorDict({"x": np.zeros(1024, np.uint8)}, batch_size=[])
def remote():
    c(obs)
def piped():
    pipe.send(kib)
    pipe.recv()
res = {}
for name, fn in (("remote", remote), ("pipe", piped)) * 2:  # interleaved, warm-up included
    for _ in range(200):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    res[name] = {"p50_us": ts[n // 2] / 1e3, "p99_us": ts[int(n * 0.99)] / 1e3,
                 "transports": pipe.transports}
print(json.dumps(res), flush=True)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import subprocess
    ratios = []
    for r in range(a.rounds):
        with Hosts(2) as hosts:
            ha, hb = hosts
            server = ha.python(SERVER, stdin=subprocess.PIPE)
            rport, pport = server.stdout.readline().split()
            client = hb.python(CLIENT, ha.addr, rport, pport, a.n)
            out, err = client.communicate(timeout=300)
            assert client.returncode == 0, err
            res = json.loads(out.strip().splitlines()[-1])
            server.stdin.close()
            ratio = res["remote"]["p50_us"] / res["pipe"]["p50_us"]
            ratios.append(ratio)
            print(f"round {r}: remote float32[4] p50 {res['remote']['p50_us']:.1f} us "
                  f"p99 {res['remote']['p99_us']:.1f} us | pipe 1 KiB p50 "
                  f"{res['pipe']['p50_us']:.1f} us p99 {res['pipe']['p99_us']:.1f} us "
                  f"({res['pipe']['transports']}) | ratio {ratio:.2f}", flush=True)
    print(f"median ratio remote/pipe p50: {statistics.median(ratios):.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
