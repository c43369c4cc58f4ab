"""CPU a sender and a receiver spend per message: one pipe, a stream of plain dicts.

    PYTHONPATH=python python bench/pipe/send_cost.py [--messages 30000] [--kib 64] [--runs 3]

A PipeListener in a spawned process receives --messages dicts of one uint8 leaf of --kib
KiB (not consolidated: the sender plans, packs or gathers each one) that this process
sends back to back. Each side times its loop and reads its own CPU time (getrusage):
messages/s and CPU microseconds per message, user and system. A side that waits for the
other spins for a while first, so its CPU includes some waiting: compare runs of one
build against another in the same session, not against a budget.
"""
import argparse
import multiprocessing as mp
import resource
import time

import numpy as np

import tensorwire as tw


def _usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime


def _report(side, n, before, after):
    (t0, u0, s0), (t1, u1, s1) = before, after
    return (f"{side}: {n / (t1 - t0):,.0f} msg/s, CPU {(u1 - u0 + s1 - s0) / n * 1e6:.1f} us/msg "
            f"(user {(u1 - u0) / n * 1e6:.1f})")


def _receive(port_queue, result_queue, n):
    with tw.PipeListener(0) as listener:
        port_queue.put(listener.port)
        pipe = listener.accept(timeout=60)
        before = _usage()
        for _ in range(n):
            pipe.recv(timeout=60)
        result_queue.put(_report("recv", n, before, _usage()))
        pipe.close()


def run(n, kib):
    ctx = mp.get_context("spawn")
    ports, results = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_receive, args=(ports, results, n))
    receiver.start()
    td = tw.TensorDict({"x": np.full(kib * 1024, 7, dtype=np.uint8)}, batch_size=[])
    with tw.TensorDictPipe.connect("127.0.0.1", ports.get(timeout=60), timeout=60) as pipe:
        before = _usage()
        for _ in range(n):
            pipe.send(td, timeout=60)
        sent = _report("send", n, before, _usage())
        got = results.get(timeout=120)
    receiver.join(60)
    return sent, got


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=30000)
    p.add_argument("--kib", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    for i in range(args.runs):
        sent, got = run(args.messages, args.kib)
        print(f"run {i + 1}: {sent} | {got}", flush=True)


if __name__ == "__main__":
    main()
