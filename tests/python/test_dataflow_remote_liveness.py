"""RemoteDataZMQ's producers: the table of producer connections, and the report of a producer
that goes silent (its link cut between two simulated hosts) while the others go on."""
import json
import os
import subprocess
import sys
import time

import pytest

from tensorwire import dataflow as twdf
from dataflow_helpers import no_leftovers, python  # noqa: F401

PORT = 5555  # each simulated host has its own network namespace

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers",
                    "remote_dataflow_liveness_peer.py")


def line(proc):
    out = proc.stdout.readline()
    if not out.startswith("{"):
        proc.kill()
        raise AssertionError(f"expected a JSON line, got {out!r}: {proc.communicate()[1]}")
    return json.loads(out)


@pytest.mark.parametrize("errors", ["warn", "raise"])
def test_a_producer_cut_off_is_reported_within_the_bound_while_the_other_goes_on(hosts, errors):
    a, b = hosts
    bound = 2.0
    recv = a.popen([sys.executable, PEER, "receiver", errors, bound, PORT], stdin=subprocess.PIPE)
    near = a.popen([sys.executable, PEER, "producer", f"tcp://127.0.0.1:{PORT}"])
    far = b.popen([sys.executable, PEER, "producer", f"tcp://{a.addr}:{PORT}"])
    producers = line(recv)["producers"]
    assert len(producers) == 2, producers
    (far_address,) = [p for p in producers if p.startswith(f"tcp://{b.addr}:")]
    (near_address,) = [p for p in producers if p.startswith("tcp://127.0.0.1:")]
    hosts.cut(b)
    recv.stdin.write("cut\n")
    recv.stdin.flush()
    report = line(recv)
    recv.stdin.close()
    recv.stdin = None
    recv.communicate(timeout=30)
    assert recv.returncode == 0
    expected = "ProducerSilentWarning" if errors == "warn" else "TimeoutError"
    assert report["kind"] == expected, report
    assert f"producer {far_address} on tcp://0.0.0.0:{PORT} sent" in report["message"], report
    assert "liveness_timeout 2.0 s" in report["message"], report
    assert report["after"] <= bound + 1.5, report
    # Reported once; the near producer went on, the far one sent nothing more.
    assert report["again"] == [], report
    assert report["later"][near_address][0] > report["before"][near_address][0] + 50, report
    assert report["later"][far_address][0] == report["before"][far_address][0], report
    for p in (near, far):
        p.kill()
        p.communicate(timeout=30)


def test_producers_lists_connections_with_their_datapoints():
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*", liveness_timeout=5)
    r.reset_state()
    assert r.producers == [] and r.liveness_timeout == 5.0
    p = python(f"""
from dataflow_helpers import Counting
from tensorwire.dataflow import send_dataflow_zmq
send_dataflow_zmq(Counting(10), {r.endpoint()!r}, max_datapoints=25)
""")
    for _ in range(25):
        assert r.recv(timeout=20) is not None
    p.communicate(timeout=30)
    assert p.returncode == 0
    (prod,) = r.producers
    # A producer that ended before its first message was read is named by its host only.
    assert prod.address.startswith("tcp://127.0.0.1") and prod.address != r.endpoint()
    assert prod.socket == 0 and prod.datapoints == 25
    assert prod.last_datapoint <= time.monotonic()
    deadline = time.monotonic() + 10  # its connection closes as it exits
    while r.producers[0].connected and time.monotonic() < deadline:
        r.recv(timeout=0.05)
    assert not r.producers[0].connected and r.producers[0].datapoints == 25
    r.close()


@pytest.mark.parametrize("bad", [-1, float("nan")])
def test_a_negative_or_nan_liveness_timeout_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="liveness_timeout"):
        twdf.RemoteDataZMQ("tcp://127.0.0.1:*", liveness_timeout=bad)


def test_the_default_bound_comes_from_the_environment_variable():
    code = ("from tensorwire import dataflow as d; "
            "print(d.RemoteDataZMQ('tcp://127.0.0.1:*').liveness_timeout)")
    from conftest import PYTHONPATH
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    env.pop("TENSORWIRE_LIVENESS_TIMEOUT", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "10.0", out.stderr
    env["TENSORWIRE_LIVENESS_TIMEOUT"] = "2.5"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "2.5", out.stderr
    env["TENSORWIRE_LIVENESS_TIMEOUT"] = "soon"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode != 0 and "TENSORWIRE_LIVENESS_TIMEOUT" in out.stderr, out.stderr
