"""The pipe, TensorDictServer and the remote dataflow between simulated hosts (hosts.py):
peers in separate network namespaces, reaching each other over TCP on a veth link."""
import json
import os
import subprocess
import sys
import time

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


# ---- liveness: a peer whose host vanished (the link cut silently) --------------------

def wait_for_cut(hosts, port, liveness, *flags):
    """A client on host 1 waiting in recv() when its link is cut: what each side raised."""
    a, b = hosts
    extra = ([] if liveness is None else ["--liveness", liveness]) + list(flags)
    client = peer(b, "pipe-wait", a.addr, port, *extra, stdin=subprocess.PIPE)
    assert first_line(client, "connected") == "tcp/eth0"
    hosts.cut(b)
    start = time.monotonic()
    client.stdin.write("go\n")
    client.stdin.flush()
    (seen,) = results(client, timeout=120)
    return seen, time.monotonic() - start


@pytest.mark.parametrize("liveness", [None, 2.0], ids=["default", "2s"])
def test_a_cut_link_fails_both_ends_within_the_liveness_timeout(hosts, liveness):
    bound = 10.0 if liveness is None else liveness
    extra = [] if liveness is None else ["--liveness", liveness]
    server = peer(hosts[0], "pipe-server", 2, *extra)
    port = first_line(server, "port")
    seen, _ = wait_for_cut(hosts, port, liveness)
    assert seen["error"] == "ClosedError" and "no heartbeat from" in seen["message"], seen
    assert f"liveness_timeout {bound:.1f} s" in seen["message"]
    # Not before the peer could have been silent for most of the bound, not after it
    # (a second of slack for a loaded machine).
    assert bound * 0.5 <= seen["after"] <= bound + 1.0, seen
    served = json.loads(server.stdout.readline())
    assert "no heartbeat from" in served["error"] and served["echoed"] == 0, served
    # The link back: the server goes on serving, a new client from the same host is served.
    hosts.restore(hosts[1])
    again = peer(hosts[1], "pipe-client", hosts[0].addr, port, 3, 16, *extra)
    assert results(again)[0]["checked"] == 3
    assert results(server)[0]["echoed"] == 3


def test_an_idle_peer_is_not_taken_for_gone(hosts):
    # The client does not call its pipe for four liveness timeouts: its heartbeats go on.
    a, b = hosts
    server = peer(a, "pipe-server", 1, "--liveness", 1.0)
    port = first_line(server, "port")
    idle = peer(b, "pipe-idle", a.addr, port, 4.0, "--liveness", 1.0)
    assert results(idle) == [{"echo": 7}]
    (served,) = results(server)
    assert served["echoed"] == 1 and served["error"] is None, served


def test_a_cut_shorter_than_the_liveness_timeout_is_survived(hosts):
    # TCP retransmits across the gap; the heartbeats lost in it are within the bound.
    a, b = hosts
    server = peer(a, "pipe-server", 1, "--liveness", 6.0)
    port = first_line(server, "port")
    client = peer(b, "pipe-idle", a.addr, port, 4.0, "--liveness", 6.0)
    assert first_line(client, "connected") == "tcp/eth0"
    hosts.cut(b)
    time.sleep(2.0)
    hosts.restore(b)
    assert results(client) == [{"echo": 7}]
    (served,) = results(server)
    assert served["echoed"] == 1 and served["error"] is None, served


_SLOW_RECEIVER = r"""
import sys, time, numpy as np, tensorwire as tw
with tw.PipeListener(0, liveness_timeout=1.0) as listener:
    print("port", listener.port, flush=True)
    pipe = listener.accept(timeout=60)
    t = time.monotonic()
    try:
        td = pipe.recv(timeout=60)
        print("got", int(np.asarray(td["v"]).sum()), round(time.monotonic() - t, 1), flush=True)
    except Exception as e:
        print("failed", type(e).__name__, round(time.monotonic() - t, 1), flush=True)
    pipe.close()
"""
_SLOW_SENDER = r"""
import sys, numpy as np, tensorwire as tw
pipe = tw.TensorDictPipe.connect(sys.argv[1], int(sys.argv[2]), timeout=30, liveness_timeout=1.0)
try:
    pipe.send(tw.TensorDict({"v": np.ones(4_000_000 // 8)}, batch_size=[]), timeout=60)
except Exception as e:
    print("sender", type(e).__name__, flush=True)
pipe.close()
"""


@pytest.mark.parametrize("cut", [False, True], ids=["healthy", "cut-mid-message"])
def test_a_message_longer_than_the_liveness_timeout_arrives_and_a_cut_in_it_is_seen(hosts, cut):
    # 4 MB at 8 Mbit/s: 4 s on the wire, four liveness timeouts. The sender's heartbeats
    # wait behind the message on the same connection; the bytes coming in are the peer's
    # sign of life. A link cut in the middle stops them: the receiver fails within its bound.
    a, b = hosts
    shaped = a.run(["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "8mbit",
                    "burst", "32kbit", "latency", "400ms"])
    assert shaped.returncode == 0, shaped.stderr
    receiver = b.python(_SLOW_RECEIVER)
    port = first_line(receiver, "port")
    sender = a.python(_SLOW_SENDER, b.addr, port)
    if cut:
        time.sleep(3.0)
        hosts.cut(a)
    out, err = receiver.communicate(timeout=60)
    sender.communicate(timeout=60)
    words = out.split()
    if cut:
        assert words[0] == "failed" and words[1] == "ClosedError", out + err
        assert float(words[2]) < 10.0, out  # about 3 s in, then the 1 s bound (UCX: 28 s)
    else:
        assert words[:2] == ["got", str(4_000_000 // 8)], out + err
        assert float(words[2]) > 2.0, out  # it did outlast the liveness timeout


def test_connecting_from_a_cut_host_raises_a_connection_error(hosts):
    # With no carrier on its only link, UCX has no device to connect with: the connect must
    # fail as a ConnectionError (ClosedError), promptly, not as a bare RuntimeError.
    a, b = hosts
    server = peer(a, "pipe-server", 1)
    port = first_line(server, "port")
    hosts.cut(b)
    out = b.run([sys.executable, "-c", f"""
import time, tensorwire as tw
t = time.monotonic()
try:
    tw.TensorDictPipe.connect("{a.addr}", {port}, timeout=5.0)
    print("connected")
except Exception as e:
    print(type(e).__name__, isinstance(e, ConnectionError) or isinstance(e, TimeoutError),
          round(time.monotonic() - t, 1), str(e).replace(" ", "_"))
"""], timeout=60)
    hosts.restore(b)
    kind, is_connection_error, after, message = out.stdout.split()
    assert is_connection_error == "True", out
    assert float(after) <= 10.0, out


def test_a_producer_cut_off_for_a_while_resumes_and_nothing_is_lost(three_hosts):
    a, b, c = three_hosts
    consumer = peer(a, "consumer", a.addr, 4000)
    endpoint = first_line(consumer, "endpoint")
    p1 = peer(b, "producer", endpoint, 2000, "b")
    p2 = peer(c, "producer", endpoint, 2000, "c")
    time.sleep(0.5)
    three_hosts.cut(c)
    time.sleep(3.0)
    three_hosts.restore(c)
    got = results(consumer, timeout=120)[0]["by_producer"]
    assert got == {"b": list(range(2000)), "c": list(range(2000))}
    assert results(p1) == [{"sent": 2000}] and results(p2) == [{"sent": 2000}]


def test_a_cut_link_ends_an_asyncio_receive_too(hosts):
    # The liveness thread wakes the event loop through the pipe's fd.
    server = peer(hosts[0], "pipe-server", 1, "--liveness", 2.0)
    port = first_line(server, "port")
    seen, _ = wait_for_cut(hosts, port, 2.0, "--asyncio")
    assert seen["error"] == "ClosedError" and "no heartbeat from" in seen["message"], seen
    assert 1.0 <= seen["after"] <= 3.0, seen


def test_a_program_that_exits_with_cross_host_pipes_open_exits_cleanly(hosts):
    # The liveness thread stops at exit, before UCX tears down its state.
    a, b = hosts
    server = peer(a, "pipe-server", 3, "--liveness", 0.2)
    port = first_line(server, "port")
    code = """
import sys, time
import tensorwire as tw
pipes = [tw.TensorDictPipe.connect(sys.argv[1], int(sys.argv[2]), liveness_timeout=0.2) for _ in range(3)]
time.sleep(0.5)  # beats every 10 ms: one is likely in progress at exit
print("exiting", flush=True)
"""
    client = b.python(code, a.addr, port)
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0 and out.strip() == "exiting", err
    # The server's pipes end, closed by the peer or (a pipe still open when the client's
    # liveness thread stopped, 0.2 s before its exit ended) failed for want of heartbeats.
    served = results(server)
    assert len(served) == 3, served
    assert all(s["error"] is None or s["error"].startswith("ClosedError") for s in served), served
