"""A rogue peer: malformed bytes to the soak's endpoints, run on a simulated host.

    rogue.py zmq ENDPOINT COUNT   COUNT malformed messages to a RemoteDataZMQ (ZeroMQ PUSH)
    rogue.py tcp HOST PORT        junk to a TCP listener (the pipe server's): noise, bytes
                                  that aborted UCX 1.13, or nothing
    rogue.py unix NAME            random bytes to an abstract Unix socket (the inference
                                  transport's), then hangs up

Prints one JSON line {"sent": n} when done. Seeded by ROGUE_SEED (reproducible).
"""
import json
import os
import random
import socket
import sys
import time


def garbage(rng, n):
    return bytes(rng.getrandbits(8) for _ in range(n))


def zmq_messages(endpoint, count, rng):
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 5000)
    s.connect(endpoint)
    for i in range(count):
        shape = i % 4
        if shape == 0:  # one frame of noise
            s.send(garbage(rng, rng.randint(1, 64)))
        elif shape == 1:  # three frames of noise
            s.send_multipart([garbage(rng, 32), garbage(rng, 100), garbage(rng, 1000)])
        elif shape == 2:  # an empty message
            s.send(b"")
        else:  # too many frames
            s.send_multipart([garbage(rng, 8)] * 7)
    s.close()  # lingers until delivered
    ctx.term()
    return count


def tcp_bytes(host, port, rng):
    """One of: noise; what made UCX 1.13 abort the listening process before tensorwire's
    socket filter (docs/reliability.md): more bytes than a UCX header announces, zeros, a
    stray HTTP request; or a connection that never says a word."""
    header = (8).to_bytes(8, "little") + bytes(8)  # announces 8 bytes, then sends 24
    data = rng.choice([garbage(rng, 4096), header + garbage(rng, 24), bytes(24),
                       b"GET / HTTP/1.1\r\nHost: tensorwire\r\n\r\n", b""])
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(data)
        time.sleep(0.3)
    return len(data)


def unix_bytes(name, rng):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect("\0" + name)
        s.sendall(garbage(rng, 4096))
        time.sleep(0.3)
    finally:
        s.close()
    return 4096


if __name__ == "__main__":
    rng = random.Random(int(os.environ.get("ROGUE_SEED", "0")))
    kind = sys.argv[1]
    try:
        if kind == "zmq":
            n = zmq_messages(sys.argv[2], int(sys.argv[3]), rng)
        elif kind == "tcp":
            n = tcp_bytes(sys.argv[2], int(sys.argv[3]), rng)
        else:
            n = unix_bytes(sys.argv[2], rng)
        print(json.dumps({"sent": n}), flush=True)
    except OSError as e:  # the target was down (a fault of its own): nothing sent
        print(json.dumps({"sent": 0, "error": f"{type(e).__name__}: {e}"}), flush=True)
