"""The pipe, TensorDictServer and the remote dataflow between simulated hosts (hosts.py):
peers in separate network namespaces, reaching each other over TCP on a veth link."""
import json
import os
import sys

import pytest

PEER = os.path.join(os.path.dirname(__file__), "peers", "host_peer.py")


def peer(host, *args, **kw):
    return host.popen([sys.executable, PEER, *map(str, args)], **kw)


def first_line(proc, prefix):
    line = proc.stdout.readline().split()
    if not line or line[0] != prefix:
        proc.kill()
        raise AssertionError(f"peer said {line!r}, expected '{prefix} ...': {proc.communicate()[1]}")
    return line[1]


def results(proc, timeout=90):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_a_server_serves_a_local_and_a_remote_client_at_once(hosts):
    a, b = hosts
    server = peer(a, "pipe-server", 2)
    port = first_line(server, "port")
    # Small dicts (one eager message each) and large ones (rendezvous, zero copy), both at once.
    local = peer(a, "pipe-client", "127.0.0.1", port, 200, 64)
    remote = peer(b, "pipe-client", a.addr, port, 200, 64)
    (loc,), (rem,) = results(local), results(remote)
    assert loc["checked"] == rem["checked"] == 200
    # The remote client's bytes crossed the link: TCP on eth0, never shared memory.
    assert "tcp/eth0" in rem["transports"] and "memory" not in rem["transports"], rem
    assert "memory" in loc["transports"] and "tcp/eth0" not in loc["transports"], loc  # shared memory
    served = results(server)
    assert sorted(s["echoed"] for s in served) == [200, 200]
    assert all(s["error"] is None for s in served), served
    assert {s["peer"].split(":")[0] for s in served} >= {b.addr}


def test_large_dicts_cross_the_link_intact(hosts):
    a, b = hosts
    server = peer(a, "pipe-server", 2)
    port = first_line(server, "port")
    remote = peer(b, "pipe-client", a.addr, port, 5, 8 << 20)  # 8 MiB each way, 5 times
    local = peer(a, "pipe-client", a.addr, port, 5, 8 << 20)
    assert results(remote)[0]["checked"] == 5
    assert results(local)[0]["checked"] == 5
    assert sorted(s["echoed"] for s in results(server)) == [5, 5]


def test_a_wrong_key_from_another_host_is_refused_on_both_sides(hosts):
    a, b = hosts
    server = peer(a, "pipe-server", 1, "--key", "right")
    port = first_line(server, "port")
    wrong = peer(b, "pipe-client", a.addr, port, 1, 8, "--key", "wrong")
    out, err = wrong.communicate(timeout=60)
    assert wrong.returncode != 0 and "authentication" in err.lower(), err
    good = peer(b, "pipe-client", a.addr, port, 3, 8, "--key", "right")
    assert results(good)[0]["checked"] == 3
    assert results(server)[0]["echoed"] == 3


def test_two_producers_on_two_hosts_feed_one_consumer(three_hosts):
    a, b, c = three_hosts
    consumer = peer(a, "consumer", a.addr, 400)
    endpoint = first_line(consumer, "endpoint")
    assert endpoint.startswith(f"tcp://{a.addr}:")
    p1 = peer(b, "producer", endpoint, 200, "b")
    p2 = peer(c, "producer", endpoint, 200, "c")
    got = results(consumer)[0]["by_producer"]
    # Every datapoint of each producer arrived once, in that producer's order.
    assert got == {"b": list(range(200)), "c": list(range(200))}
    assert results(p1) == [{"sent": 200}] and results(p2) == [{"sent": 200}]
