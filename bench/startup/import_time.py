"""How long `import tensorwire` takes with UCX's memory hooks off, as tensorwire sets them
(UCX_MEM_EVENTS=no), and with UCX 1.22's default (UCX_MEM_EVENTS=yes: eight functions
rewritten, each followed by a 50 ms wait calling sched_yield; docs/pipe.md "Process start").

Each round starts N Python processes at once (--procs, default 1 and 4) for each mode, the
modes alternating; each process reports the wall time of its `import tensorwire` (numpy is
imported first, outside the timed part), its CPU time, and its involuntary context switches.
Medians over --rounds per mode and process count.

    PYTHONPATH=python .venv/bin/python bench/startup/import_time.py [--rounds 5] [--procs 1,4]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, resource, time
import numpy
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
import tensorwire
t1 = time.perf_counter()
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": t1 - t0,
                  "cpu": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                  "nivcsw": r1.ru_nivcsw - r0.ru_nivcsw}))
"""


MODES = {"events off (tensorwire)": "no", "UCX's default hooks": "yes"}


def one_round(mode: str, procs: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), UCX_MEM_EVENTS=MODES[mode])
    ps = [subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True)
          for _ in range(procs)]
    out = []
    for p in ps:
        line, _ = p.communicate(timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"an importing process failed ({mode}, exit code {p.returncode})")
        out.append(json.loads(line))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--procs", default="1,4", help="processes importing at once, ','-separated")
    args = ap.parse_args()
    for procs in [int(n) for n in args.procs.split(",")]:
        seen: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode in seen:
                seen[mode] += one_round(mode, procs)
        for mode, rows in seen.items():
            med = {k: statistics.median(r[k] for r in rows) for k in ("wall", "cpu", "nivcsw")}
            walls = ", ".join(f"{r['wall']:.3f}" for r in rows)
            print(f"{procs} at once, {mode:23s}: median import {med['wall']:.3f} s, CPU {med['cpu']:.3f} s, "
                  f"{med['nivcsw']:.0f} involuntary switches (each: {walls})", flush=True)


if __name__ == "__main__":
    main()
