"""The tensorwire command: the data-loading part of `demo` and `bench dataflow`."""
import json

from conftest import run
from dataflow_helpers import no_leftovers  # noqa: F401


def test_demo_loads_data_from_worker_processes(tensorwire_bin):
    r = run([tensorwire_bin, "demo"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "data loading: MultiProcessRunnerZMQ" in out
    assert "epoch 2 [##############################]  3000/3000" in out  # the progress bar, full
    assert "6000 datapoints in 2 epochs of 3000" in out
    assert "datapoints intact: all" in out and "workers reaped on close: yes" in out


def test_bench_dataflow_reports_throughput_beside_memcpy(tensorwire_bin):
    r = run([tensorwire_bin, "bench", "dataflow", "--shape", "224,224,3", "--num-proc", "1,2", "--seconds", "0.2",
             "--json"])
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["num_proc"] for row in rows] == [1, 2]
    for row in rows:
        assert row["shape"] == "[224, 224, 3]" and row["dps"] > 100 and row["memcpy_bytes_per_s"] > 0
        assert abs(row["bytes_per_s"] / row["dps"] - 224 * 224 * 3) < 1


def test_bench_dataflow_usage(tensorwire_bin):
    r = run([tensorwire_bin, "bench", "dataflow", "--frobnicate"])
    assert r.returncode == 2 and "usage: tensorwire bench dataflow" in r.stderr
