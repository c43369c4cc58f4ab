"""TensorDictPipe: tensorwire's drop-in beside tensordict's own (tensordict._ucxx, over ucxx).

Both sides run the same asyncio code, with only the class changed:

    from tensordict._ucxx import TensorDictPipe        # reference (needs the ucxx package)
    from tensorwire.tensordict import TensorDictPipe   # tensorwire's drop-in

Each contender runs as two processes on one host (a listener and a client, over --host,
default 127.0.0.1), once per UCX_TLS setting (--tls, default "sm,tcp" and "tcp"). On one
connection the client measures, --reps times:

  throughput  a consolidated TensorDict with one uint8 leaf of 1 MiB, sent --messages times
              back to back (steady state: the schema is sent once, in the warm-up); the
              clock runs from the first send to the receipt of the listener's 1 KiB ack
              after the last receive. Reported in GiB/s of leaf bytes.
  latency     a consolidated TensorDict of 4 float32 leaves of 64 elements (1 KiB), sent and
              echoed back --pingpongs times; one-way latency = round trip / 2, p50 (and p99)
              over the round trips of one repetition.

Before and after the timed part the listener checks the bytes it received and the client
the bytes echoed back, so a contender that skips work fails instead of winning.
The contenders alternate, --rounds times over (tls x contender), so slow drift in the
machine's load hits both alike; each figure is the median over all rounds x reps.
/proc/loadavg is recorded before every pair of processes.

The reference side runs under --ref-python (an interpreter with torch, tensordict and
ucxx; default: this one). If `import ucxx` fails there, the reference is skipped with the
error, and tensorwire is measured alone. The tensorwire side runs under --tw-python
(default: this one) with the repository's python/ directory put on PYTHONPATH.

    PYTHONPATH=python .venv/bin/python bench/pipe/pipe_vs_tensordict.py \\
        --ref-python /tmp/ucxx-venv/bin/python [--json out.json] [--plot out.png]

--plot draws the two side by side (bench/plotting.py): throughput per UCX_TLS setting,
and the one-way latency distributions (every repetition's round trips pooled by quantile).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import faulthandler
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIG_BYTES = 1 << 20
SMALL_LEAVES, SMALL_ELEMENTS = 4, 64
IMPLS = ("tensordict", "tensorwire")


# --------------------------------------------------------------------------- payloads
def _big(torch, stamp: int):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (BIG_BYTES,), dtype=torch.uint8, generator=g)
    x[0] = stamp % 256
    return x


def _small(torch):
    g = torch.Generator().manual_seed(2)
    return {f"leaf_{i}": torch.rand(SMALL_ELEMENTS, generator=g, dtype=torch.float32)
            for i in range(SMALL_LEAVES)}


def _td(leaves):
    from tensordict import TensorDict
    return TensorDict(leaves, batch_size=[]).consolidate(metadata=True)


def _pipe_class(impl: str):
    if impl == "tensordict":
        from tensordict._ucxx import TensorDictPipe
    else:
        from tensorwire.tensordict import TensorDictPipe
    return TensorDictPipe


# --------------------------------------------------------------------------- the two peers
async def _listener(impl: str, a) -> None:
    import torch
    Pipe = _pipe_class(impl)
    if impl == "tensorwire":
        pipe = await Pipe.listen(0, on_listening=lambda port: print(f"READY {port}", flush=True))
    else:
        # tensordict's listen takes a fixed port and returns only once a client connected;
        # ucxx.create_listener runs before its first await, so the port is open after one yield.
        with socket.socket() as s:
            s.bind((a.host, 0))
            port = s.getsockname()[1]
        task = asyncio.ensure_future(Pipe.listen(port))
        await asyncio.sleep(0.2)
        if task.done():
            task.result()
        print(f"READY {port}", flush=True)
        pipe = await task
    ack = _td(_small(torch))
    for rep in range(a.reps):
        # throughput: warm-up (schema), ack, timed stream, ack; then check the bytes
        for _ in range(a.warmup):
            await pipe.arecv()
        await pipe.asend(ack)
        for _ in range(a.messages):
            got = await pipe.arecv()
        await pipe.asend(ack)
        want = _big(torch, rep)
        if not torch.equal(got["x"], want):
            raise SystemExit(f"{impl}: 1 MiB payload of repetition {rep} arrived wrong")
        # latency: echo
        for _ in range(a.warmup + a.pingpongs):
            got = await pipe.arecv()
            await pipe.asend(got)
    await pipe.aclose()


async def _client(impl: str, a) -> None:
    import torch
    Pipe = _pipe_class(impl)
    pipe = None
    deadline = time.monotonic() + 30
    while pipe is None:
        try:
            pipe = await asyncio.wait_for(Pipe.connect(a.host, a.port), 10)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    small = _td(_small(torch))
    small_ref = small.clone()
    for rep in range(a.reps):
        big = _td({"x": _big(torch, rep)})
        for _ in range(a.warmup):
            await pipe.asend(big)
        await pipe.arecv()
        t0 = time.perf_counter()
        for _ in range(a.messages):
            await pipe.asend(big)
        await pipe.arecv()
        t1 = time.perf_counter()
        rtts = []
        for i in range(a.warmup + a.pingpongs):
            s = time.perf_counter_ns()
            await pipe.asend(small)
            echo = await pipe.arecv()
            e = time.perf_counter_ns()
            if i >= a.warmup:
                rtts.append(e - s)
        if not all(torch.equal(echo[k], small_ref[k]) for k in small_ref.keys()):
            raise SystemExit(f"{impl}: 1 KiB echo of repetition {rep} came back wrong")
        rtts.sort()
        print("RESULT " + json.dumps({
            "rep": rep,
            "gib_s": a.messages * BIG_BYTES / (t1 - t0) / (1 << 30),
            "p50_us": rtts[len(rtts) // 2] / 2 / 1e3,
            "p99_us": rtts[int(len(rtts) * 0.99)] / 2 / 1e3,
            # one-way latency at percentiles 0, 5, ..., 100: the distribution of the figure
            "quantiles_us": [rtts[min(len(rtts) - 1, round(q * (len(rtts) - 1) / 20))] / 2 / 1e3
                             for q in range(21)],
        }), flush=True)
    await pipe.aclose()


# --------------------------------------------------------------------------- driver
def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


def _tensorwire_path() -> str:
    """Where this interpreter finds the tensorwire package (python/ of this checkout, or an
    installed copy), so the tensorwire side runs the same one."""
    import importlib.util
    spec = importlib.util.find_spec("tensorwire")
    if spec is None or spec.origin is None:
        return str(REPO / "python")
    return str(Path(spec.origin).parent.parent)


def _reference_available(python: str) -> tuple[bool, str]:
    try:
        r = subprocess.run([python, "-c", "import ucxx, tensordict._ucxx; print(ucxx.__version__)"],
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{type(e).__name__}: {e}"
    if r.returncode != 0:
        lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
        return False, lines[-1] if lines else f"exit status {r.returncode}"
    return True, r.stdout.strip()


def _run_pair(impl: str, python: str, tls: str, a) -> tuple[list[dict], str]:
    env = dict(os.environ, UCX_TLS=tls, UCX_WARN_UNUSED_ENV_VARS="n")
    if impl == "tensorwire":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_tensorwire_path(), env.get("PYTHONPATH")]))
    else:
        env.pop("PYTHONPATH", None)  # the reference interpreter's own packages only
        if a.ref_progress_mode:
            env["UCXPY_PROGRESS_MODE"] = a.ref_progress_mode
    common = [python, __file__, "--host", a.host, "--reps", str(a.reps), "--messages", str(a.messages),
              "--pingpongs", str(a.pingpongs), "--warmup", str(a.warmup), "--impl", impl]
    load = _loadavg()
    with tempfile.TemporaryFile("w+") as srv_err, tempfile.TemporaryFile("w+") as cli_err:
        srv = subprocess.Popen(common + ["--role", "listener"], env=env, stdout=subprocess.PIPE,
                               stderr=srv_err, text=True)
        cli = None

        def errors() -> str:
            text = []
            for name, f in (("client", cli_err), ("listener", srv_err)):
                f.seek(0)
                text.append(f"--- {name} stderr (tail):\n{f.read()[-3000:]}")
            return "\n".join(text)

        try:
            line = srv.stdout.readline()
            if not line.startswith("READY "):
                srv.wait(timeout=30)
                raise RuntimeError(f"{impl} listener did not start: {line!r}\n{errors()}")
            port = line.split()[1]
            cli = subprocess.Popen(common + ["--role", "client", "--port", port], env=env,
                                   stdout=subprocess.PIPE, stderr=cli_err, text=True)
            try:
                out, _ = cli.communicate(timeout=a.timeout)
                srv.wait(timeout=60)
            except subprocess.TimeoutExpired:
                for p in (cli, srv):  # Python stacks of whoever is stuck, to stderr
                    if p.poll() is None:
                        p.send_signal(signal.SIGUSR1)
                time.sleep(2)
                raise RuntimeError(f"{impl} (UCX_TLS={tls}) hung: client {cli.poll()}, listener "
                                   f"{srv.poll()}\n{errors()}") from None
            if cli.returncode != 0 or srv.returncode != 0:
                raise RuntimeError(f"{impl} (UCX_TLS={tls}) failed: client {cli.returncode}, "
                                   f"listener {srv.returncode}\n{errors()}")
        finally:
            for p in (cli, srv):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
    results = [json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")]
    return results, load


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-python", default=sys.executable,
                    help="interpreter with torch, tensordict and ucxx for the reference side")
    ap.add_argument("--ref-progress-mode", choices=["thread", "thread-polling", "polling", "blocking"],
                    help="UCXPY_PROGRESS_MODE for the reference (default: ucxx's own, 'thread')")
    ap.add_argument("--tw-python", default=sys.executable, help="interpreter for the tensorwire side")
    ap.add_argument("--tls", nargs="+", default=["sm,tcp", "tcp"], help="UCX_TLS settings to run")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the contenders")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per connection")
    ap.add_argument("--messages", type=int, default=400, help="1 MiB messages per timed stream")
    ap.add_argument("--pingpongs", type=int, default=2000, help="1 KiB round trips per repetition")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed per process pair")
    ap.add_argument("--json", help="write all samples here")
    ap.add_argument("--plot", metavar="FILE.png", help="draw the figure here")
    ap.add_argument("--role", choices=["listener", "client"], help=argparse.SUPPRESS)
    ap.add_argument("--impl", choices=IMPLS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.role:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    if a.role == "listener":
        asyncio.run(_listener(a.impl, a))
        return 0
    if a.role == "client":
        asyncio.run(_client(a.impl, a))
        return 0

    impls = {"tensorwire": a.tw_python}
    ok, info = _reference_available(a.ref_python)
    if ok:
        impls = {"tensordict": a.ref_python, **impls}
        print(f"reference: tensordict._ucxx over ucxx {info} ({a.ref_python})")
    else:
        print(f"SKIPPING the tensordict reference: `import ucxx` fails under {a.ref_python}: {info}")
        print("  (pass --ref-python with an interpreter that has torch, tensordict and ucxx)")
    print(f"payloads: 1 MiB uint8 leaf x {a.messages} messages; 1 KiB (4 x 64 float32) x "
          f"{a.pingpongs} round trips; {a.rounds} rounds x {a.reps} reps; host {a.host}")

    samples: dict[tuple[str, str], list[dict]] = {}
    loads = []
    for rnd in range(a.rounds):
        for tls in a.tls:
            for impl, python in impls.items():
                res, load = _run_pair(impl, python, tls, a)
                loads.append({"round": rnd, "tls": tls, "impl": impl, "loadavg": load})
                samples.setdefault((tls, impl), []).extend(res)
                print(f"  round {rnd} UCX_TLS={tls:7s} {impl:10s} load [{load}]  " + "  ".join(
                    f"{r['gib_s']:.2f} GiB/s {r['p50_us']:.1f} us" for r in res), flush=True)

    summary = {}
    print(f"\n| UCX_TLS | pipe | 1 MiB throughput, GiB/s (median) | 1 KiB one-way p50, us (median) "
          f"| 1 KiB one-way p99, us (median) |")
    print("|---|---|---|---|---|")
    for (tls, impl), res in samples.items():
        s = {k: statistics.median(r[k] for r in res) for k in ("gib_s", "p50_us", "p99_us")}
        s["n"] = len(res)
        summary[f"{tls}/{impl}"] = s
        print(f"| {tls} | {impl} | {s['gib_s']:.3f} | {s['p50_us']:.1f} | {s['p99_us']:.1f} |")
    if "tensordict" in impls:
        print()
        for tls in a.tls:
            td, tw = summary[f"{tls}/tensordict"], summary[f"{tls}/tensorwire"]
            print(f"UCX_TLS={tls}: throughput tensorwire/tensordict = {tw['gib_s'] / td['gib_s']:.2f}x "
                  f"(goal >= 2x); latency tensordict/tensorwire = {td['p50_us'] / tw['p50_us']:.2f}x "
                  f"(goal >= 5x)")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "samples": {f"{t}/{i}": r for (t, i), r in samples.items()}, "summary": summary,
            "loadavg": loads, "reference": info, "args": vars(a)}, indent=2))
    if a.plot:
        plot(a.tls, list(impls), samples, info, a.plot)
    return 0


def plot(tls_list, impls, samples, reference_info, path) -> None:
    """Throughput of each contender per UCX_TLS setting, and its latency distribution."""
    sys.path.insert(0, str(REPO / "bench"))
    import plotting
    fig, (thr, lat) = plotting.figure(2, "TensorDictPipe: tensorwire's drop-in beside tensordict._ucxx")
    series = {impl: [statistics.median(r["gib_s"] for r in samples[(t, impl)]) for t in tls_list]
              for impl in IMPLS if impl in impls}
    plotting.bars(thr, f"1 MiB messages (median of {len(samples[(tls_list[0], 'tensorwire')])} runs)",
                  [f"UCX_TLS={t}" for t in tls_list], series, "GiB/s")
    # Quantiles pooled over the repetitions: the median of each percentile.
    dist = {f"{impl} {t}": [statistics.median(r["quantiles_us"][q] for r in samples[(t, impl)])
                            for q in range(21)]
            for impl in IMPLS if impl in impls for t in tls_list}
    plotting.distributions(lat, "1 KiB one-way latency", dist, "microseconds (log)")
    if "tensordict" not in impls:
        thr.text(0.5, 0.92, f"tensordict not measured: {reference_info}", ha="center", fontsize="small",
                 wrap=True, transform=thr.transAxes)
    plotting.save(fig, path)


if __name__ == "__main__":
    sys.exit(main())
