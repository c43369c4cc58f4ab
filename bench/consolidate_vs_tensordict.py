"""consolidate(): tensorwire beside tensordict, on the same torch tensors, in one process.

Cases (the foundation issue's):
  a  100 float32 leaves of 1 KiB (256 elements)
  b  4 float32 leaves of 16 MiB

For each case, timed in the same process:
  memcpy_prefaulted     torch copy_ of the same byte count into a buffer written before timing
  memcpy_fresh          torch.empty + copy_: pays first-touch page faults, as consolidate does
  memcpy_fresh_thp      numpy.empty + copyto: numpy advises transparent huge pages for large
                        arrays, so this is a fresh destination with 2 MiB pages
  tensordict            td.consolidate()               (tensordict's default: no metadata kept)
  tensordict metadata   td.consolidate(metadata=True)  (also builds the metadata, as tensorwire does)
  tensorwire            tensorwire.TensorDict.consolidate() on a TensorDict over the same tensors

Each figure is the median over --samples samples; a sample times enough back-to-back calls
to last at least --sample-ms. The garbage collector stays on: tensordict's results hold
reference cycles, and with it off their storages pile up and distort every later figure. torch is limited to --torch-threads intra-op threads (default
1: every contender copies on one thread, like the memcpy reference).

    PYTHONPATH=python .venv/bin/python bench/consolidate_vs_tensordict.py [--json out.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

import tensorwire

try:
    import tensordict
    from tensordict import TensorDict as TDTensorDict
except ImportError:  # a test/bench dependency only
    tensordict = None

CASES = {
    "a": ("100 x 1 KiB", 100, 256),
    "b": ("4 x 16 MiB", 4, 4 << 20),
}


def make_leaves(n: int, elements: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {f"leaf_{i:03d}": torch.rand(elements, generator=g, dtype=torch.float32) for i in range(n)}


def time_call(fn, samples: int, sample_s: float) -> tuple[float, int]:
    """Median seconds per call, and the calls per sample used."""
    for _ in range(3):  # warm up: allocator, lazy imports, caches
        fn()
    # calls per sample: enough for the sample to last sample_s
    inner, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        t = time.perf_counter() - t0
        if t >= sample_s or inner >= 1 << 16:
            break
        inner *= 2
    per_call = []
    gc.collect()  # start from a clean heap; the collector stays on while timing
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        per_call.append((time.perf_counter() - t0) / inner)
    return statistics.median(per_call), inner


def check_same(tw_td, leaves: dict[str, torch.Tensor]) -> None:
    """tensorwire's consolidated leaves hold the torch tensors' values, in one storage."""
    out = tw_td.consolidate()
    assert out.is_consolidated(), "tensorwire consolidate() did not consolidate"
    for k, v in leaves.items():
        if not np.array_equal(np.asarray(out[k]), v.numpy()):
            raise AssertionError(f"tensorwire consolidate(): leaf {k} differs from the torch tensor")


def run_case(case: str, samples: int, sample_s: float) -> dict:
    title, n, elements = CASES[case]
    leaves = make_leaves(n, elements)
    nbytes = sum(v.numel() * v.element_size() for v in leaves.values())

    # The memcpy reference: the same bytes in one contiguous source.
    src = torch.cat([v.view(torch.uint8) for v in leaves.values()])
    dst = torch.zeros_like(src)  # written now: prefaulted
    src_np = src.numpy()

    def memcpy_prefaulted():
        dst.copy_(src)

    def memcpy_fresh():
        torch.empty_like(src).copy_(src)

    def memcpy_fresh_thp():
        np.copyto(np.empty_like(src_np), src_np)

    # tensorwire over the very same tensors (zero copy), built from a dict of them.
    tw_td = tensorwire.TensorDict(leaves)
    first = next(iter(leaves))
    assert np.asarray(tw_td[first]).__array_interface__["data"][0] == leaves[first].data_ptr(), \
        "tensorwire.TensorDict copied the torch tensor"
    check_same(tw_td, leaves)

    contenders = {
        "memcpy_prefaulted": memcpy_prefaulted,
        "memcpy_fresh": memcpy_fresh,
        "memcpy_fresh_thp": memcpy_fresh_thp,
    }
    if tensordict is not None:
        td = TDTensorDict(dict(leaves), batch_size=[])
        contenders["tensordict"] = lambda: td.consolidate()
        contenders["tensordict_metadata"] = lambda: td.consolidate(metadata=True)
    contenders["tensorwire"] = lambda: tw_td.consolidate()

    rows = {}
    for name, fn in contenders.items():
        sec, inner = time_call(fn, samples, sample_s)
        rows[name] = {
            "us_per_call": sec * 1e6,
            "GB_per_s": nbytes / sec / 1e9,
            "leaves_per_s": n / sec,
            "calls_per_sample": inner,
        }
    tw = rows["tensorwire"]["us_per_call"]
    # ratio x: tensorwire runs at x times the speed of the reference (>1: faster)
    ratios = {f"tensorwire_vs_{ref}": rows[ref]["us_per_call"] / tw
              for ref in ("memcpy_prefaulted", "memcpy_fresh", "memcpy_fresh_thp")}
    if "tensordict" in rows:
        ratios["speedup_vs_tensordict"] = rows["tensordict"]["us_per_call"] / tw
        ratios["speedup_vs_tensordict_metadata"] = rows["tensordict_metadata"]["us_per_call"] / tw
    return {"case": case, "title": title, "leaves": n, "bytes": nbytes, "rows": rows, "ratios": ratios}


def print_case(res: dict) -> None:
    print(f"\ncase {res['case']}: {res['title']} ({res['leaves']} leaves, {res['bytes']} bytes)")
    print(f"  {'':22s} {'us/call':>12s} {'GB/s':>9s} {'leaves/s':>12s}")
    for name, r in res["rows"].items():
        print(f"  {name:22s} {r['us_per_call']:12.2f} {r['GB_per_s']:9.2f} {r['leaves_per_s']:12.4g}")
    for name, v in res["ratios"].items():
        print(f"  {name:34s} {v:6.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="a,b", help="comma-separated subset of: a,b")
    ap.add_argument("--samples", type=int, default=21, help="timed samples per contender (median taken)")
    ap.add_argument("--sample-ms", type=float, default=20.0, help="minimum duration of one sample")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()

    torch.set_num_threads(args.torch_threads)
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "tensordict": getattr(tensordict, "__version__", None),
        "tensorwire": tensorwire.__version__,
        "torch_threads": torch.get_num_threads(),
        "loadavg_start": os.getloadavg()[0],
    }
    print("consolidate: tensorwire vs tensordict (" +
          ", ".join(f"{k} {v}" for k, v in env.items()) + ")")
    if tensordict is None:
        print("tensordict is not installed: its rows are skipped", file=sys.stderr)

    results = []
    for case in args.cases.split(","):
        res = run_case(case.strip(), args.samples, args.sample_ms / 1e3)
        print_case(res)
        results.append(res)
    env["loadavg_end"] = os.getloadavg()[0]
    print(f"\nload average (1 min): {env['loadavg_start']:.2f} at start, {env['loadavg_end']:.2f} at end")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
