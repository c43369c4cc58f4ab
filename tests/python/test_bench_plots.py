"""The benchmarks' figures (issue 12, "figures people can look at"): each plot path runs on
a tiny real run and writes a valid PNG that shows the expected panels and series.

What a figure shows is read from the PNG itself: bench/plotting.py records every panel's
title, series (its legend, as drawn) and groups in a "tensorwire-series" text chunk. No
timing is asserted: the runs are far too short to mean anything, only the path is tested.
"""
import json
import os
import struct
import subprocess
import sys
import zlib

import pytest

from conftest import PYTHONPATH, ROOT

BENCH = os.path.join(ROOT, "bench")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png(path):
    """Checks that `path` is a well-formed PNG (signature, chunk CRCs, IHDR first with a
    non-empty image, IDAT, IEND last); returns its panels (the tensorwire-series chunk)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    pos, chunks, text = 8, [], {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in chunk {kind!r}"
        chunks.append(kind)
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
    assert pos == len(data), f"{path}: truncated"
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks, chunks
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100, (width, height)
    assert "tensorwire-series" in text, f"{path} does not say what it shows: {sorted(text)}"
    return json.loads(text["tensorwire-series"])


def run_script(args, timeout=280):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    r = subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{args[0]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def test_plotting_rejects_mismatched_series(tmp_path):
    sys.path.insert(0, BENCH)
    try:
        import plotting
    finally:
        sys.path.remove(BENCH)
    fig, (ax,) = plotting.figure(1, "t")
    with pytest.raises(ValueError, match="series 'a' has 1 values for 2 groups"):
        plotting.bars(ax, "x", ["g1", "g2"], {"a": [1.0]}, "y")
    with pytest.raises(ValueError, match="needs at least two quantiles"):
        plotting.distributions(ax, "x", {"a": [1.0]}, "y")
    with pytest.raises(ValueError, match="no samples"):
        plotting.quantiles([])
    assert plotting.quantiles([3, 1, 2], n=3) == [1, 2, 3]


@pytest.mark.timeout(300)
def test_bench_pipe_json_plot(tmp_path, tensorwire_bin):
    out, png = tmp_path / "pipe.json", tmp_path / "pipe.png"
    subprocess.run([tensorwire_bin, "bench", "pipe", "--tls", "sm,tcp", "--modes", "consolidated", "--sizes",
                    "4096,65536", "--iters", "3", "--min-bytes", "0", "--lat-iters", "50", "--json", str(out)],
                   check=True, capture_output=True, timeout=240)
    run_script([os.path.join(BENCH, "pipe", "plot_bench_pipe.py"), str(out), str(png)])
    thr, lat = read_png(png)
    assert thr["title"] == "throughput at each message size"
    assert thr["groups"] == ["4 KiB", "64 KiB"]
    assert thr["series"] == ["tensorwire consolidated sm,tcp", "ucx_perftest sm,tcp"]
    assert lat["title"] == "1 KiB (4 leaves) one-way latency"
    assert lat["series"] == ["tensorwire consolidated sm,tcp", "ucx_perftest sm,tcp p50"]


def test_bench_pipe_plot_rejects_other_json(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text("[]")
    r = subprocess.run([sys.executable, os.path.join(BENCH, "pipe", "plot_bench_pipe.py"), str(bad),
                        str(tmp_path / "x.png")], capture_output=True, text=True, timeout=100)
    assert r.returncode != 0 and "no figures in the JSON" in r.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.timeout(300)
def test_pipe_vs_tensordict_plot(tmp_path):
    png = tmp_path / "pipe_td.png"
    r = run_script([os.path.join(BENCH, "pipe", "pipe_vs_tensordict.py"), "--tls", "sm,tcp", "--rounds", "1",
                    "--reps", "1", "--messages", "5", "--pingpongs", "50", "--warmup", "2", "--plot", str(png)])
    thr, lat = read_png(png)
    assert thr["groups"] == ["UCX_TLS=sm,tcp"]
    # tensordict's side needs the ucxx package; without it the figure says so instead.
    measured_td = "SKIPPING the tensordict reference" not in r.stdout
    assert thr["series"] == (["tensordict", "tensorwire"] if measured_td else ["tensorwire"])
    assert measured_td or "tensordict not measured" in thr["note"]
    assert lat["series"] == (["tensordict sm,tcp"] if measured_td else []) + ["tensorwire sm,tcp"]


@pytest.mark.timeout(300)
def test_compare_torchrl_plot(tmp_path):
    png = tmp_path / "inference.png"
    run_script([os.path.join(BENCH, "inference", "compare_torchrl.py"), "--systems", "tensorwire,torchrl_shm",
                "--payloads", "f32x4", "--batches", "4", "--clients", "1", "--seconds", "0.3", "--rounds", "1",
                "--latency-requests", "50", "--plot", str(png)])
    thr, lat = read_png(png)
    assert thr["series"] == ["tensorwire", "torchrl_shm"]
    assert thr["groups"] == ["f32x4\nbatch 4"]
    assert lat["series"] == ["tensorwire", "torchrl_shm"]


@pytest.mark.timeout(300)
def test_compare_tensorpack_plot(tmp_path):
    png = tmp_path / "dataflow.png"
    run_script([os.path.join(BENCH, "dataflow", "compare_tensorpack.py"), "--shapes", "1,224x224x3",
                "--num-proc", "1", "--seconds", "0.2", "--warmup", "10", "--plot", str(png)])
    thr, cpu = read_png(png)
    assert thr["series"] == cpu["series"] == ["tensorpack", "tensorwire"]
    assert thr["groups"] == ["1\n1 worker", "224x224x3\n1 worker"]
    assert cpu["title"] == "CPU per datapoint, main process and workers"
