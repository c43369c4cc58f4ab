"""`tensorwire bench infer` and the inference part of `tensorwire demo`."""
import json

import pytest

from conftest import run

pytestmark = pytest.mark.timeout(300)


def test_bench_infer_prints_a_table_and_writes_json(tensorwire_bin, tmp_path):
    out = tmp_path / "infer.json"
    r = run([tensorwire_bin, "bench", "infer", "--clients", "2", "--payloads", "f32x4",
             "--batches", "4", "--seconds", "0.3", "--latency-requests", "1000", "--json", str(out)])
    assert r.returncode == 0, r.stderr
    assert "bare shm ping-pong" in r.stdout and "ratio of p50s" in r.stdout
    assert "requests/s" in r.stdout and "segments for num_slots=64" in r.stdout
    figures = json.loads(out.read_text())
    assert figures["latency"]["round_trip_us"]["p50"] > 0
    (row,) = figures["throughput"]
    assert row["clients"] == 2 and row["max_batch_size"] == 4 and row["requests_per_s"] > 0
    assert figures["memory"]["segments_num_slots_64_u8x84x84x3"]["requests"] == 64 * 84 * 84 * 3


def test_bench_infer_rejects_unknown_options(tensorwire_bin):
    r = run([tensorwire_bin, "bench", "infer", "--frobnicate"])
    assert r.returncode == 2 and "usage" in r.stderr


def test_demo_runs_actors_against_one_server(tensorwire_bin):
    r = run([tensorwire_bin, "demo"])
    assert r.returncode == 0, r.stderr
    assert "actor processes, one batched policy server" in r.stdout
    assert "summary: 10000 requests from 4 actors" in r.stdout
    assert "slots in use after the run: 0" in r.stdout and "actors failed: 0" in r.stdout
