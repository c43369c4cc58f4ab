"""Peers of the remote dataflow's liveness test and benchmark (test_dataflow_remote_liveness.py,
bench/dataflow/link_cut.py), run on a simulated host.

    remote_dataflow_liveness_peer.py producer ENDPOINT
        send_dataflow_zmq of Counting datapoints to ENDPOINT, about 200 per second, until
        killed.
    remote_dataflow_liveness_peer.py receiver ERRORS BOUND PORT
        RemoteDataZMQ on tcp://*:PORT with errors=ERRORS and liveness_timeout=BOUND
        ("default": the default). Prints {"producers": [address, ...]} once two producers
        have sent; after a line on stdin (the link was cut), prints the first silence
        report {"kind", "message", "at": its time.monotonic(), "after": seconds since that
        line, "before": {address:
        [datapoints, connected]}, "later": the same after one more second of receiving,
        "again": reports in that second}. Every wait has a deadline: it always ends.
"""
import json
import select
import sys
import time
import warnings

from dataflow_helpers import Counting
from tensorwire import dataflow as twdf


def producer(endpoint):
    twdf.send_dataflow_zmq(Counting(10), endpoint, progress=lambda sent: time.sleep(0.005))


def receiver(errors, bound, port):
    r = twdf.RemoteDataZMQ(f"tcp://*:{port}", errors=errors,
                           liveness_timeout=None if bound == "default" else float(bound))
    r.reset_state()

    def step():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                r.recv(timeout=0.05)
            except TimeoutError as e:
                return {"kind": "TimeoutError", "message": str(e)}
        for w in caught:
            return {"kind": w.category.__name__, "message": str(w.message)}
        return None

    def table():
        return {p.address: [p.datapoints, p.connected] for p in r.producers}

    deadline = time.monotonic() + 30
    while sum(p.datapoints > 0 for p in r.producers) < 2 and time.monotonic() < deadline:
        assert step() is None
    print(json.dumps({"producers": [p.address for p in r.producers]}), flush=True)
    while not select.select([sys.stdin], [], [], 0)[0] and time.monotonic() < deadline:
        assert step() is None
    sys.stdin.readline()
    start = time.monotonic()
    report = None
    while report is None and time.monotonic() - start < 60:
        report = step()
    report = report or {"kind": None, "message": "no report in 60 s"}
    report["at"] = time.monotonic()  # the clock is the machine's: the caller can compare
    report["after"] = report["at"] - start
    report["before"] = table()
    more, again = time.monotonic(), []
    while time.monotonic() - more < 1:
        s = step()
        if s is not None:
            again.append(s)
    report["later"] = table()
    report["again"] = again
    print(json.dumps(report), flush=True)
    r.close()


if __name__ == "__main__":
    if sys.argv[1] == "producer":
        producer(sys.argv[2])
    else:
        receiver(*sys.argv[2:5])
