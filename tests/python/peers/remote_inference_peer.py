"""Peers for the remote inference tests (test_remote_inference.py), run on a simulated host.

    remote_inference_peer.py server [--key K] [--liveness S] [--slots N] [--local N] [--port P]
        A RemoteTransport on a free port (or P) served by an InferenceServer (policy:
        action = 2 * observation, observation float32[4]); with --local N, also a
        SharedMemoryTransport served by the same server, and N local actor processes
        (spawned) calling it from when the first remote actor connects until stdin closes
        (at least 200 times each).
        Prints "port N", then serves until stdin closes and its remote clients are gone (up
        to 10 s);
        prints {"batches": [[n_local, n_remote], ...], "refused", "last_refusal",
        "connected", "slots_in_use", "local_checked": [[calls, checked], ...]}.
    remote_inference_peer.py actor HOST PORT COUNT [--key K] [--liveness S] [--tag T]
        Connects and calls COUNT times with observation [T, i, 0, 0]; checks each answer;
        prints {"checked"}.
    remote_inference_peer.py hang HOST PORT [--key K] [--liveness S]
        Connects, submits one request, prints "submitted", then waits in result() and prints
        {"error": type, "message", "after": seconds since the first line of stdin}.
    remote_inference_peer.py loop HOST PORT [--liveness S]
        Connects, calls once, prints "connected"; after a line on stdin calls in a loop until
        a call raises, and prints {"error": type, "message", "after"}.
    (server --hold-first S: the policy's first batch takes S seconds.)
"""
import argparse
import json
import multiprocessing as mp
import sys
import threading
import time

import numpy as np

import tensorwire as tw
from tensorwire import inference as inf


def out(*parts):
    print(*parts, flush=True)


def obs(tag, i):
    return {"observation": np.array([tag, i, 0, 0], dtype=np.float32)}


def spec():
    return ({"observation": np.zeros(4, np.float32)}, {"action": np.zeros(4, np.float32)})


def local_actor(client, count, q, go, stop):
    # Starts with the remote actors and calls until they are done (at least `count` calls):
    # a fixed number of local calls (microseconds each) could all be over before the first
    # remote request arrives, and no batch would mix the two.
    go.wait(60)
    checked = i = 0
    while i < count or not stop.is_set():
        r = client(obs(-1, i), timeout=30)
        if float(r["action"][1]) == 2 * i:
            checked += 1
        i += 1
    q.put([i, checked])


def server(a):
    req, resp = spec()
    batches = []

    def policy(batch):
        if a.hold_first and not batches:
            time.sleep(a.hold_first)
        o = batch["observation"]
        batches.append([int((o[:, 0] < 0).sum()), int((o[:, 0] >= 0).sum())])
        return tw.TensorDict({"action": o * 2}, batch_size=[len(o)])

    remote = inf.RemoteTransport(req, resp, num_slots=a.slots, port=a.port, auth_key=a.key,
                                 liveness_timeout=a.liveness)
    transports = [remote]
    if a.local:
        shm = inf.SharedMemoryTransport(req, resp, num_slots=64)
        transports = [shm, remote]
    srv = inf.InferenceServer(policy, transports, max_batch_size=16, timeout=0.005)
    srv.start()
    procs, q = [], None
    if a.local:
        ctx = mp.get_context("spawn")
        q, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
        procs = [ctx.Process(target=local_actor, args=(shm.client(), 200, q, go, stop))
                 for _ in range(a.local)]
        for p in procs:
            p.start()

        def start_when_remote_connected():
            deadline = time.monotonic() + 60
            while remote.connected < 1 and time.monotonic() < deadline:
                time.sleep(0.001)
            go.set()
        threading.Thread(target=start_when_remote_connected, daemon=True).start()
    out("port", remote.port)
    sys.stdin.read()  # until the test closes stdin, once the remote actors are done
    if procs:
        stop.set()
    local_checked = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    # The remote actors have exited; on a loaded machine their connections' ends may not be
    # seen yet: wait (bounded) until they are, so the report says what the server settles on.
    settle = time.monotonic() + 10
    while (remote.connected or remote.slots_in_use) and time.monotonic() < settle:
        time.sleep(0.01)
    info = {"refused": remote.refused, "last_refusal": remote.last_refusal,
            "connected": remote.connected, "slots_in_use": remote.slots_in_use}
    srv.shutdown()
    info.update(batches=batches, local_checked=local_checked)
    out(json.dumps(info))


def actor(a):
    c = inf.connect(a.host, a.port, auth_key=a.key, liveness_timeout=a.liveness)
    checked = 0
    for i in range(a.count):
        r = c(obs(a.tag, i), timeout=30)
        assert float(r["action"][0]) == 2 * a.tag and float(r["action"][1]) == 2 * i, r
        checked += 1
    out(json.dumps({"checked": checked}))


def hang(a):
    c = inf.connect(a.host, a.port, auth_key=a.key, liveness_timeout=a.liveness)
    f = c.submit(obs(0, 0))
    out("submitted")
    sys.stdin.readline()
    start = time.monotonic()
    try:
        f.result(timeout=120)
        out(json.dumps({"error": None, "after": time.monotonic() - start}))
    except Exception as e:  # noqa: BLE001 - reported to the test
        out(json.dumps({"error": type(e).__name__, "message": str(e),
                        "after": time.monotonic() - start}))


def loop(a):
    c = inf.connect(a.host, a.port, liveness_timeout=a.liveness)
    c(obs(0, 0), timeout=30)
    out("connected")
    sys.stdin.readline()
    start = time.monotonic()
    try:
        while True:
            c(obs(0, 1), timeout=60)
            time.sleep(0.01)
    except Exception as e:  # noqa: BLE001 - reported to the test
        out(json.dumps({"error": type(e).__name__, "message": str(e),
                        "after": time.monotonic() - start}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("rest", nargs="*")
    p.add_argument("--key", default=None)
    p.add_argument("--liveness", type=float, default=None)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--local", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tag", type=float, default=1.0)
    p.add_argument("--hold-first", type=float, default=0.0)
    a = p.parse_args()
    if a.mode == "server":
        server(a)
    elif a.mode == "actor":
        a.host, a.port, a.count = a.rest[0], int(a.rest[1]), int(a.rest[2])
        actor(a)
    elif a.mode == "loop":
        a.host, a.port = a.rest[0], int(a.rest[1])
        loop(a)
    elif a.mode == "hang":
        a.host, a.port = a.rest[0], int(a.rest[1])
        hang(a)
    else:
        raise SystemExit(f"unknown mode {a.mode}")


if __name__ == "__main__":
    main()
