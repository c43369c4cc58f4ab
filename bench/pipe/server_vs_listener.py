"""TensorDictServer serving its pipes while it keeps accepting, against one pipe from
PipeListener (issue 9's figure).

One run measures, in this order:

  listener   a PipeListener accepts one client; the pipe is received with `async for`.
  server-1   a TensorDictServer serves 1 client: `serve(handler)`, the handler receives
             with `async for` while the server goes on accepting.
  server-4   the same with 4 client processes.

Every client is its own process that connects and sends --messages consolidated
TensorDicts of one uint8 leaf of --kib KiB (64 by default) back to back, then closes. The
clients of a case are started together, and begin sending together: each connects, says
so on its stdout and waits for a go on its stdin, sent once all of them are connected
(else one client's Python start-up, seconds on a loaded machine, lands inside the timed
window while another already streams: 3,000 messages take well under a second). The
receiving side counts messages and times from the first message received to the last
(all clients): aggregate messages/s. Ratios are server / listener of the same run.
/proc/loadavg is printed before each case (the machine is shared).

    PYTHONPATH=python .venv/bin/python bench/pipe/server_vs_listener.py [--runs 1]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def client(port: int, messages: int, kib: int) -> None:
    import tensorwire as tw

    td = tw.TensorDict({"x": np.full(kib * 1024, 7, dtype=np.uint8)}, batch_size=[])
    with tw.TensorDictPipe.connect("127.0.0.1", port, timeout=60) as pipe:
        print("connected", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("client: no go from the benchmark")
        for _ in range(messages):
            pipe.send(td, timeout=60)


def start_clients(port: int, n: int, args) -> list:
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    cmd = [sys.executable, __file__, "--client", str(port), "--messages", str(args.messages),
           "--kib", str(args.kib)]
    return [subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(n)]


async def go(procs) -> None:
    """Once every client is connected, lets them all send (a client that dies first gives
    EOF, so the readline ends)."""
    loop = asyncio.get_running_loop()
    for p in procs:
        line = await asyncio.wait_for(loop.run_in_executor(None, p.stdout.readline), 120)
        if line.strip() != "connected":
            raise SystemExit(f"a client did not connect (exit code {p.poll()})")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()


def finish(procs) -> None:
    for p in procs:
        if p.wait(timeout=120) != 0:
            raise SystemExit(f"a client failed with exit code {p.returncode}")


class Count:
    def __init__(self, expected: int):
        self.expected, self.got, self.first, self.last = expected, 0, None, None
        self.done = asyncio.Event()

    async def drain(self, pipe) -> None:
        async for td in pipe:
            now = time.perf_counter()
            self.first = self.first or now
            self.last = now
            self.got += 1
            if self.got == self.expected:
                self.done.set()

    def rate(self) -> float:
        return (self.got - 1) / (self.last - self.first)


async def listener_case(args) -> float:
    import tensorwire as tw

    count = Count(args.messages)
    with tw.PipeListener(0) as listener:
        procs = start_clients(listener.port, 1, args)
        loop = asyncio.get_running_loop()
        pipe = await loop.run_in_executor(None, lambda: listener.accept(timeout=60))
        await go(procs)
        await asyncio.wait_for(count.drain(pipe), 300)
        pipe.close()
    finish(procs)
    return count.rate()


async def server_case(args, clients: int) -> float:
    import tensorwire as tw

    count = Count(args.messages * clients)
    async with tw.TensorDictServer(0) as server:
        procs = start_clients(server.port, clients, args)
        serving = asyncio.ensure_future(server.serve(count.drain))
        await go(procs)
        await asyncio.wait_for(count.done.wait(), 300)
        server.close()
        await serving
        if server.handler_errors:
            raise SystemExit(f"handler failed: {server.handler_errors[0]!r}")
    finish(procs)
    return count.rate()


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


async def main(args) -> None:
    for run in range(1, args.runs + 1):
        print(f"loadavg {load()}: listener", flush=True)
        base = await listener_case(args)
        rates = {}
        for n in (1, 4):
            print(f"loadavg {load()}: server-{n}", flush=True)
            rates[n] = await server_case(args, n)
        print(f"run {run}: listener {base:,.0f} msg/s | server-1 {rates[1]:,.0f} msg/s "
              f"({rates[1] / base:.0%}) | server-4 {rates[4]:,.0f} msg/s ({rates[4] / base:.0%})",
              flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--kib", type=int, default=64)
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client is not None:
        client(a.client, a.messages, a.kib)
    else:
        asyncio.run(main(a))
