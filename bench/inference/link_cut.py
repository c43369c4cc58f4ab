"""Link-cut detection time of a remote inference client and its server, two simulated hosts.

    python bench/inference/link_cut.py [--trials 3] [--settings default,2]

An InferenceServer over a RemoteTransport on host A (network, IPC and pid namespaces of its
own: tests/python/hosts.py), one client on host B calling it in a loop (100 calls/s,
tests/python/peers/remote_inference_peer.py `loop`); B's link is cut silently at the switch
(no FIN, no RST). Reports, per liveness setting (`liveness_timeout` on both sides), how long
after the cut the client's call raised and the server dropped the client (its `connected`
count fell to 0, polled every 10 ms), median and max of the trials. Run as root.
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from hosts import Hosts  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import link_cut_table  # noqa: E402

PEER = os.path.join(ROOT, "tests", "python", "peers", "remote_inference_peer.py")

# The server: prints its port, waits for its client, then (after a line on stdin, written
# right after the cut) prints how long until it dropped that client.
SERVER = r"""
import sys, time
import numpy as np
import tensorwire as tw
from tensorwire import inference as inf
liveness = None if sys.argv[1] == "default" else float(sys.argv[1])
spec = {"observation": np.zeros(4, np.float32)}
remote = inf.RemoteTransport(spec, {"action": np.zeros(4, np.float32)}, num_slots=4,
                             liveness_timeout=liveness)
server = inf.InferenceServer(
    lambda b: tw.TensorDict({"action": b["observation"]}, batch_size=b.batch_size),
    [remote]).start()
print("port", remote.port, flush=True)
sys.stdin.readline()
start = time.monotonic()
while remote.connected > 0 and time.monotonic() - start < 120:
    time.sleep(0.01)
print("dropped", time.monotonic() - start if remote.connected == 0 else "nan", flush=True)
server.shutdown()
"""


def trial(setting):
    liveness = [] if setting == "default" else ["--liveness", setting]
    with Hosts(2) as hosts:
        a, b = hosts
        server = a.popen([sys.executable, "-c", SERVER, setting], stdin=subprocess.PIPE)
        port = server.stdout.readline().split()[1]
        client = b.popen([sys.executable, PEER, "loop", a.addr, port, *liveness],
                         stdin=subprocess.PIPE)
        assert client.stdout.readline().startswith("connected")
        time.sleep(0.5)
        hosts.cut(b)
        for proc in (client, server):  # both clocks start at the cut
            proc.stdin.write("go\n")
            proc.stdin.flush()
        seen = json.loads(client.stdout.readline())
        dropped = server.stdout.readline().split()
        server.communicate(timeout=60)
        client.communicate(timeout=60)
        return seen["after"], float(dropped[1]), f'{seen["error"]}: {seen["message"][:60]}'


if __name__ == "__main__":
    link_cut_table.run(trial)
