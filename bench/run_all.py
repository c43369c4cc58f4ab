"""Runs every benchmark (`make bench`) and checks the foundation issue's targets.

1. bench_consolidate (C++, Google Benchmark): consolidate / pack / decode beside a
   single-thread memcpy of the same bytes, medians of --repetitions runs.
2. bench/consolidate_vs_tensordict.py: tensorwire's consolidate() beside tensordict's,
   on the same torch tensors, in one Python process.
3. The figures of docs/benchmarks.md (--figures DIR, default docs/img; --skip-figures):
   `tensorwire bench pipe` against ucx_perftest, and the side-by-side scripts against
   tensordict (bench/pipe), torchrl (bench/inference) and tensorpack (bench/dataflow),
   each drawn with --plot (FIGURE_RUNS below: the commands, shorter than their defaults so
   `make bench` stays within minutes; the scripts' own defaults are the recorded figures).

The binary is looked up in $TENSORWIRE_BUILD/bench (default: build/ beside this folder);
build it with -DTENSORWIRE_BENCH=ON. docs/benchmarks.md records the figures.

    PYTHONPATH=python .venv/bin/python bench/run_all.py [--out DIR] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Targets from the foundation issue.
MIN_LEAVES_PER_S_A = 1e6      # consolidate, case a
MIN_FRACTION_OF_MEMCPY_B = 0.70  # consolidate, case b, of single-thread memcpy bandwidth
MIN_SPEEDUP_VS_TENSORDICT_A = 5.0  # goal, case a


def run_cpp(binary: Path, args: argparse.Namespace, out_json: Path) -> dict[str, dict]:
    cmd = [str(binary), f"--benchmark_repetitions={args.repetitions}",
           "--benchmark_report_aggregates_only=true", f"--benchmark_min_time={args.min_time}",
           f"--benchmark_out={out_json}", "--benchmark_out_format=json"]
    if args.filter:
        cmd.append(f"--benchmark_filter={args.filter}")
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    data = json.loads(out_json.read_text())
    # Medians of the repetitions; with a single repetition there are no aggregates.
    want = "median" if args.repetitions > 1 else None
    medians = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") == want:
            medians[b["run_name"].removesuffix("/real_time")] = b
    return medians


def summarize_cpp(m: dict[str, dict]) -> list[tuple[str, bool | None]]:
    """Prints the ratios the targets are stated in; returns (target, met) pairs."""
    def bps(name):
        return m[name]["bytes_per_second"] if name in m else None

    checks = []
    print("\nC++ summary (medians; ratio = bytes/s over the reference's bytes/s in this run)")
    for case in ("a_100x1KiB", "b_4x16MiB"):
        ref = bps(f"memcpy_prefaulted/{case}")
        if ref is None:
            continue
        print(f"  {case}: memcpy (prefaulted) {ref / 1e9:.2f} GB/s")
        for bench in ("memcpy_fresh", "memcpy_fresh_thp", "consolidate", "consolidate_cold", "plan_and_pack", "pack_only",
                      "encoder_encode", "decode_schema_message", "decode_storage_message"):
            name = f"{bench}/{case}"
            if name not in m:
                continue
            r = m[name]
            print(f"    {bench:24s} {r['real_time']:10.2f} {r['time_unit']} (cpu {r['cpu_time']:10.2f})"
                  f"  {r['bytes_per_second'] / 1e9:7.2f} GB/s  {r['items_per_second']:12.4g} leaves/s"
                  f"  {r['bytes_per_second'] / ref:6.3f}x memcpy")
    if "consolidate/a_100x1KiB" in m:
        lps = m["consolidate/a_100x1KiB"]["items_per_second"]
        ok = lps >= MIN_LEAVES_PER_S_A
        checks.append((f"(a) consolidate >= {MIN_LEAVES_PER_S_A:.0e} leaves/s: {lps:.3g}", ok))
    if "consolidate/b_4x16MiB" in m and "memcpy_prefaulted/b_4x16MiB" in m:
        frac = bps("consolidate/b_4x16MiB") / bps("memcpy_prefaulted/b_4x16MiB")
        checks.append((f"(b) consolidate >= {MIN_FRACTION_OF_MEMCPY_B:.0%} of memcpy bandwidth: "
                       f"{frac:.1%}", frac >= MIN_FRACTION_OF_MEMCPY_B))
        if "consolidate_cold/b_4x16MiB" in m:
            f2 = bps("consolidate_cold/b_4x16MiB") / bps("memcpy_prefaulted/b_4x16MiB")
            checks.append((f"(b) for context: first consolidation of a size (storage cache off, "
                           f"fresh pages): {f2:.1%} of memcpy", None))
    return checks


def run_python(args: argparse.Namespace, out_json: Path) -> dict | None:
    cmd = [sys.executable, str(HERE / "consolidate_vs_tensordict.py"), "--json", str(out_json)]
    if args.quick:
        cmd += ["--samples", "7"]
    print("\n$ " + " ".join(cmd), flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    if subprocess.run(cmd, env=env).returncode != 0:
        print("error: the Python side-by-side failed (is the binding in python/tensorwire built?)",
              file=sys.stderr)
        return None
    return json.loads(out_json.read_text())


# (figure, command); {json}, {png}, {tensorwire} and {python} are filled in.
FIGURE_RUNS = [
    ("pipe_ucx_perftest", ["{tensorwire}", "bench", "pipe", "--sizes", "65536,1048576,16777216", "--iters", "20",
                           "--lat-iters", "5000", "--json", "{json}"],
     ["{python}", str(HERE / "pipe" / "plot_bench_pipe.py"), "{json}", "{png}"]),
    ("pipe_tensordict", ["{python}", str(HERE / "pipe" / "pipe_vs_tensordict.py"), "--rounds", "1",
                         "--messages", "200", "--pingpongs", "1000", "--ref-python", "{ref_python}",
                         "--json", "{json}", "--plot", "{png}"], None),
    ("inference_torchrl", ["{python}", str(HERE / "inference" / "compare_torchrl.py"), "--payloads", "f32x4",
                           "--rounds", "1", "--seconds", "1", "--latency-requests", "1000", "--json", "{json}",
                           "--plot", "{png}"], None),
    ("dataflow_tensorpack", ["{python}", str(HERE / "dataflow" / "compare_tensorpack.py"), "--seconds", "1",
                             "--json", "{json}", "--plot", "{png}"], None),
]


def run_figures(build: Path, figures: Path, out_dir: Path) -> list[str]:
    """Runs FIGURE_RUNS; returns the figures that failed."""
    figures.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    failed = []
    # tensordict's pipe runs on ucxx, kept out of .venv: a reference venv of its own, made once.
    ref_venv = build / "bench-ref-venv"
    ref_python = str(ref_venv / "bin" / "python")
    if subprocess.run([str(ROOT / "scripts" / "bench-ref-venv.sh"), str(ref_venv)],
                      env={**env, "PYTHON": sys.executable}).returncode != 0:
        print("run_all: the reference venv (ucxx) could not be made; the pipe figure lacks "
              "tensordict's side", file=sys.stderr)
    for name, *commands in FIGURE_RUNS:
        fill = {"json": str(out_dir / f"{name}.json"), "png": str(figures / f"{name}.png"),
                "tensorwire": str(build / "tools" / "tensorwire"), "python": sys.executable,
                "ref_python": ref_python}
        for cmd in filter(None, commands):
            cmd = [part.format(**fill) for part in cmd]
            print("\n$ " + " ".join(cmd), flush=True)
            if subprocess.run(cmd, env=env).returncode != 0:
                failed.append(name)
                break
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", metavar="DIR", help="keep both JSON results in DIR")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run, not for the record)")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per C++ repetition")
    ap.add_argument("--filter", help="--benchmark_filter for the C++ binary")
    ap.add_argument("--skip-cpp", action="store_true")
    ap.add_argument("--skip-python", action="store_true")
    ap.add_argument("--figures", metavar="DIR", default=str(ROOT / "docs" / "img"),
                    help="where the side-by-side figures go (default: docs/img)")
    ap.add_argument("--skip-figures", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.repetitions, args.min_time = 1, 0.05

    build = Path(os.environ.get("TENSORWIRE_BUILD", ROOT / "build"))
    binary = build / "bench" / "bench_consolidate"
    if args.out:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        return run(args, binary, build, out_dir)
    with tempfile.TemporaryDirectory(prefix="tensorwire-bench-") as tmp:
        return run(args, binary, build, Path(tmp))


def run(args: argparse.Namespace, binary: Path, build: Path, out_dir: Path) -> int:
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    checks = []
    failed = False
    if not args.skip_cpp:
        if not binary.exists():
            print(f"error: {binary} not found; build it with\n"
                  f"  cmake -S {ROOT} -B {build} -DTENSORWIRE_BENCH=ON && "
                  f"cmake --build {build} --target bench_consolidate\n"
                  "or point TENSORWIRE_BUILD at a build folder that has it", file=sys.stderr)
            return 2
        checks += summarize_cpp(run_cpp(binary, args, out_dir / "bench_consolidate.json"))
    if not args.skip_python:
        py = run_python(args, out_dir / "consolidate_vs_tensordict.json")
        if py is None:
            failed = True
            checks.append(("(a) goal: >= 5x tensordict's consolidate(): not measured (script failed)", False))
        for res in py["results"] if py else []:
            if res["case"] == "a" and "speedup_vs_tensordict" in res["ratios"]:
                s = res["ratios"]["speedup_vs_tensordict"]
                checks.append((f"(a) goal: >= {MIN_SPEEDUP_VS_TENSORDICT_A:.0f}x tensordict's consolidate(): "
                               f"{s:.1f}x", s >= MIN_SPEEDUP_VS_TENSORDICT_A))

    if not args.skip_figures:
        for name in run_figures(build, Path(args.figures), out_dir):
            failed = True
            checks.append((f"figure {name}: not drawn (its command failed)", False))

    print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("targets:")
    for text, ok in checks:
        print(f"  {'      ' if ok is None else ('MET   ' if ok else 'MISSED')} {text}")
    if args.out:
        print(f"JSON results in {out_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
