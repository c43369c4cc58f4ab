"""Link-cut detection time of the remote dataflow between two simulated hosts.

    python bench/dataflow/link_cut.py [--trials 3] [--settings default,2]

A RemoteDataZMQ on host A fed by two producers (send_dataflow_zmq), one on host A itself and
one on host B (network, IPC and pid namespaces of their own: tests/python/hosts.py); B's
link is cut silently at the switch (no FIN, no RST). Reports, per liveness_timeout setting,
how long after the cut the receiver reported B's producer silent (ProducerSilentWarning;
median and max of the trials), and the datapoints A's producer delivered in the second
after the report (the others go on). Run as root. The peers are the test's
(tests/python/peers/remote_dataflow_liveness_peer.py).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from hosts import Hosts  # noqa: E402

PEER = os.path.join(ROOT, "tests", "python", "peers", "remote_dataflow_liveness_peer.py")
PORT = 5555


def trial(setting):
    with Hosts(2) as hosts:
        a, b = hosts
        recv = a.popen([sys.executable, PEER, "receiver", "warn", setting, PORT], stdin=subprocess.PIPE)
        a.popen([sys.executable, PEER, "producer", f"tcp://127.0.0.1:{PORT}"])
        b.popen([sys.executable, PEER, "producer", f"tcp://{a.addr}:{PORT}"])
        producers = json.loads(recv.stdout.readline())["producers"]
        (near,) = [p for p in producers if p.startswith("tcp://127.0.0.1:")]
        time.sleep(0.5)
        hosts.cut(b)
        start = time.monotonic()
        recv.stdin.write("cut\n")
        recv.stdin.flush()
        report = json.loads(recv.stdout.readline())
        # time.monotonic() is the machine's clock, the same in every namespace.
        return report["at"] - start, report["later"][near][0] - report["before"][near][0], report["kind"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--settings", default="default,2")
    a = ap.parse_args()
    print(f"{'liveness_timeout':>16} {'median':>8} {'max':>8}  {'trials':<24} near dp in the next 1 s  reported")
    for setting in a.settings.split(","):
        runs = [trial(setting) for _ in range(a.trials)]
        s = [r[0] for r in runs]
        print(f"{setting:>16} {statistics.median(s):>7.2f}s {max(s):>7.2f}s  "
              f"{', '.join(f'{x:.2f}' for x in s):<24} {[r[1] for r in runs]}  {sorted({r[2] for r in runs})}",
              flush=True)


if __name__ == "__main__":
    main()
