"""Peers for the cross-host tests (test_across_hosts.py), run on a simulated host.

    host_peer.py pipe-server NCLIENTS [--key K] [--liveness S]
        A TensorDictServer on a free port: prints "port N", then serves NCLIENTS clients at
        once, one thread each, echoing every dict back; prints one JSON line per client when
        it leaves: {"peer", "transports", "echoed", "error"}.
    host_peer.py pipe-client HOST PORT COUNT NBYTES [--key K] [--liveness S]
        Sends COUNT dicts {"x": uint8[NBYTES] = i % 251, "i": int64[1] = i} and checks
        each echo; prints {"transports", "checked"}.
    host_peer.py pipe-wait HOST PORT [--liveness S] [--asyncio]
        Connects, prints "connected <transports>", then waits in recv() (or arecv()) and
        prints {"error": type, "message", "after": seconds since the first line of stdin}.
    host_peer.py pipe-idle HOST PORT SECONDS [--liveness S]
        Connects, prints "connected <transports>", does nothing for SECONDS, then sends one
        dict and prints {"echo": x}.
    host_peer.py consumer ADDR COUNT
        A RemoteDataZMQ bound on tcp://ADDR:*: prints "endpoint E", receives COUNT
        datapoints and prints {"by_producer": {tag: [i, ...]}}.
    host_peer.py producer ENDPOINT COUNT TAG
        send_dataflow_zmq of COUNT datapoints [uint8[1000] = i % 251, i, TAG].
"""
import argparse
import json
import sys
import threading
import time

import numpy as np

import tensorwire as tw


def out(*parts):
    print(*parts, flush=True)


def pipe_kwargs(a):
    kw = {}
    if a.key:
        kw["auth_key"] = a.key
    if a.liveness is not None:
        kw["liveness_timeout"] = a.liveness
    return kw


def pipe_server(a):
    server = tw.TensorDictServer(0, **pipe_kwargs(a))
    out("port", server.port)
    lock = threading.Lock()

    def serve(pipe):
        report = {"peer": pipe.peer, "transports": pipe.transports, "echoed": 0, "error": None}
        try:
            while True:
                pipe.send(pipe.recv(timeout=60), timeout=60)
                report["echoed"] += 1
        except tw.ClosedError as e:
            if not pipe.closed_by_peer:
                report["error"] = f"{type(e).__name__}: {e}"
        with lock:
            out(json.dumps(report))

    threads = []
    for _ in range(a.args[0] if a.args else 1):
        pipe = server.accept(timeout=60)
        t = threading.Thread(target=serve, args=(pipe,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    server.close()


def pipe_client(a):
    host, port, count, nbytes = a.args[0], int(a.args[1]), int(a.args[2]), int(a.args[3])
    pipe = tw.TensorDictPipe.connect(host, port, timeout=30, **pipe_kwargs(a))
    checked = 0
    for i in range(count):
        td = tw.TensorDict({"x": np.full(nbytes, i % 251, np.uint8), "i": np.array([i])}, batch_size=[])
        pipe.send(td, timeout=60)
        back = pipe.recv(timeout=60)
        assert int(back["i"][0]) == i and (np.asarray(back["x"]) == i % 251).all(), f"echo {i} differs"
        checked += 1
    out(json.dumps({"transports": pipe.transports, "checked": checked}))
    pipe.close()


def pipe_wait(a):
    host, port = a.args[0], int(a.args[1])
    pipe = tw.TensorDictPipe.connect(host, port, timeout=30, **pipe_kwargs(a))
    out("connected", pipe.transports)
    sys.stdin.readline()  # the test cuts the link, then writes a line
    start = time.monotonic()
    try:
        if a.asyncio:  # woken through the pipe's fd in the event loop
            import asyncio
            asyncio.run(asyncio.wait_for(pipe.arecv(), 120))
        else:
            pipe.recv(timeout=120)
        out(json.dumps({"error": None}))
    except Exception as e:  # noqa: BLE001 - reported to the test
        out(json.dumps({"error": type(e).__name__, "message": str(e), "after": time.monotonic() - start}))


def pipe_idle(a):
    host, port, idle = a.args[0], int(a.args[1]), float(a.args[2])
    pipe = tw.TensorDictPipe.connect(host, port, timeout=30, **pipe_kwargs(a))
    out("connected", pipe.transports)
    time.sleep(idle)  # no call on the pipe: only the liveness thread speaks for it
    pipe.send(tw.TensorDict({"x": np.full(8, 7, np.uint8), "i": np.array([0])}, batch_size=[]), timeout=30)
    back = pipe.recv(timeout=30)
    out(json.dumps({"echo": int(back["x"][0])}))
    pipe.close()


def consumer(a):
    addr, count = a.args[0], int(a.args[1])
    r = tw.dataflow.RemoteDataZMQ(f"tcp://{addr}:*")
    r.reset_state()
    out("endpoint", r.endpoint())
    got = {}
    for _ in range(count):
        dp = r.recv(timeout=60)
        assert dp is not None, "no datapoint within 60 s"
        arr, i, tag = dp
        assert (np.asarray(arr) == i % 251).all()
        got.setdefault(tag, []).append(i)
    out(json.dumps({"by_producer": got}))
    r.close()


class Numbered:
    def __init__(self, count, tag):
        self.count, self.tag = count, tag

    def reset_state(self):
        pass

    def __iter__(self):
        for i in range(self.count):
            yield [np.full(1000, i % 251, np.uint8), i, self.tag]

    def __len__(self):
        return self.count


def producer(a):
    endpoint, count, tag = a.args[0], int(a.args[1]), a.args[2]
    sent = tw.dataflow.send_dataflow_zmq(Numbered(count, tag), endpoint, max_datapoints=count)
    out(json.dumps({"sent": sent}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("args", nargs="*")
    ap.add_argument("--key")
    ap.add_argument("--liveness", type=float)
    ap.add_argument("--asyncio", action="store_true")
    a = ap.parse_args()
    if a.cmd == "pipe-server":
        a.args = [int(x) for x in a.args]
    {"pipe-server": pipe_server, "pipe-client": pipe_client, "pipe-wait": pipe_wait, "pipe-idle": pipe_idle,
     "consumer": consumer, "producer": producer}[a.cmd](a)


if __name__ == "__main__":
    main()
