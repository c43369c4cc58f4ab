"""Link-cut detection time of a TensorDictPipe between two simulated hosts.

    python bench/pipe/link_cut.py [--trials 3] [--settings default,2,0]

A TensorDictServer on host A (network, IPC and pid namespaces of its own: tests/python/
hosts.py), a client on host B waiting in recv(); the link is cut silently at the switch (no
FIN, no RST). Reports, per liveness setting, how long after the cut each side raised
(median and max of the trials). Setting 0 (liveness off) shows what UCX alone does: the
wait ends only at its own 120 s timeout. Run as root.
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

PEER = os.path.join(ROOT, "tests", "python", "peers", "host_peer.py")


def trial(setting):
    extra = [] if setting == "default" else ["--liveness", setting]
    with Hosts(2) as hosts:
        a, b = hosts
        server = a.popen([sys.executable, PEER, "pipe-server", "1", *extra])
        port = server.stdout.readline().split()[1]
        client = b.popen([sys.executable, PEER, "pipe-wait", a.addr, port, *extra], stdin=subprocess.PIPE)
        assert client.stdout.readline().startswith("connected")
        time.sleep(0.5)
        hosts.cut(b)
        start = time.monotonic()
        client.stdin.write("go\n")
        client.stdin.flush()
        seen = json.loads(client.stdout.readline())
        client_s = time.monotonic() - start
        line = server.stdout.readline() if seen.get("error") != "TimeoutError" else ""
        server_s = time.monotonic() - start if line else float("nan")
        return client_s, server_s, seen.get("error")


if __name__ == "__main__":
    link_cut_table.run(trial)
