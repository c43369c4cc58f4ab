"""The figure of `tensorwire bench pipe --json`: TensorDictPipe throughput against
ucx_perftest (tag_bw) at each message size, and the pipe's one-way latency distribution
beside ucx_perftest's tag_lat median, per UCX_TLS setting.

    tensorwire bench pipe --json pipe.json [options]
    .venv/bin/python bench/pipe/plot_bench_pipe.py pipe.json pipe.png

The drawing is Python (matplotlib, bench/plotting.py), so the command needs no plotting
library: it writes its figures as JSON and this script draws them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plotting  # noqa: E402


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def plot(rows: list[dict], path: str) -> None:
    thr = [r for r in rows if r["measure"] == "throughput"]
    lat = [r for r in rows if r["measure"] != "throughput"]
    if not thr and not lat:
        raise SystemExit("no figures in the JSON (is it `tensorwire bench pipe --json` output?)")
    tls_list = list(dict.fromkeys(r["tls"] for r in rows))
    sizes = sorted({r["bytes"] for r in thr})
    fig, (ax_thr, ax_lat) = plotting.figure(2, "TensorDictPipe between two processes, beside ucx_perftest")

    series: dict[str, list[float | None]] = {}
    for tls in tls_list:
        for mode in dict.fromkeys(r["mode"] for r in thr):
            by_size = {r["bytes"]: r["tensorwire"] for r in thr if r["tls"] == tls and r["mode"] == mode}
            series[f"tensorwire {mode} {tls}"] = [by_size.get(s) for s in sizes]
        ref = {r["bytes"]: r["ucx_perftest"] for r in thr if r["tls"] == tls and r["ucx_perftest"] > 0}
        if ref:
            series[f"ucx_perftest {tls}"] = [ref.get(s) for s in sizes]
    if thr:
        plotting.bars(ax_thr, "throughput at each message size", [_size(s) for s in sizes], series, "GB/s")
    else:
        plotting.note(ax_thr, "throughput", "not measured in this run")

    curves = {f"tensorwire {r['mode']} {r['tls']}": r["quantiles_us"] for r in lat if r.get("quantiles_us")}
    if curves:
        plotting.distributions(ax_lat, "1 KiB (4 leaves) one-way latency", curves, "microseconds (log)")
        for r in lat:
            if r["ucx_perftest"] > 0:  # the reference reports its median only
                ax_lat.axvline(r["ucx_perftest"], linestyle="--", label=f"ucx_perftest {r['tls']} p50",
                               color=plotting.COLOURS["ucx_perftest"] if r["tls"] == tls_list[0] else "#000000")
        ax_lat.legend(fontsize="small")
    else:
        plotting.note(ax_lat, "latency", "no latency distribution in this JSON")
    plotting.save(fig, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="the file `tensorwire bench pipe --json` wrote")
    ap.add_argument("png", help="the figure to write")
    a = ap.parse_args()
    with open(a.json) as f:
        plot(json.load(f), a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
