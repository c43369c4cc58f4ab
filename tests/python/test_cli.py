"""The tensorwire command: demo and inspect."""
import os
import re
import signal
import subprocess
import sys
import time
import tomllib

import numpy as np
import pytest

import tensorwire as tw
from conftest import ROOT, run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "chaos"))

from supervisor import children, comm  # noqa: E402  (/proc walks, written once)


def test_demo_runs_and_round_trips(tensorwire_bin):
    r = run([tensorwire_bin, "demo"])
    assert r.returncode == 0, r.stderr
    assert "consolidated" in r.stdout and "round trip: equal" in r.stdout
    # It ends with a one-screen table: a header and one row per part, each checked.
    table = r.stdout[r.stdout.rindex("== summary =="):].splitlines()[2:]
    assert table[0].split() == ["part", "measured", "checked"]
    parts = [row.split("  ")[1].strip() for row in table[1:]]
    assert parts == ["files", "pipe", "data loading", "inference"], table
    assert all("ok:" in row and "FAILED" not in row for row in table[1:]), table
    assert "GB/s" in table[2] and "/s" in table[3] and "requests" in table[4], table
    # The inference summary's average batch is of the whole run: requests / batches.
    requests = int(re.search(r"summary: (\d+) requests from", r.stdout).group(1))
    batches, average = re.search(r"(\d+) batches, average batch ([\d.]+)", r.stdout).groups()
    assert abs(float(average) - requests / int(batches)) < 0.01, (requests, batches, average)


def test_inspect_prints_structure_of_a_saved_tensordict(tensorwire_bin, tmp_path):
    path = str(tmp_path / "x.td")
    tw.TensorDict({"obs": np.zeros((2, 84, 84, 3), np.uint8), "info": {"r": np.zeros(2)}, "s": "hi"},
                  batch_size=[2]).save(path)
    r = run([tensorwire_bin, "inspect", path])
    assert r.returncode == 0, r.stderr
    assert "obs: uint8[2, 84, 84, 3]" in r.stdout
    assert "r: float64[2]" in r.stdout and '"hi"' in r.stdout


def test_inspect_of_a_corrupt_file_fails_with_a_message(tensorwire_bin, tmp_path):
    path = tmp_path / "bad.td"
    path.write_bytes(b"abc")
    r = run([tensorwire_bin, "inspect", str(path)])
    assert r.returncode == 1 and "truncated" in r.stderr


def test_unknown_command_is_a_usage_error(tensorwire_bin):
    r = run([tensorwire_bin, "frobnicate"])
    assert r.returncode == 2 and "frobnicate" in r.stderr and "--help" in r.stderr


def test_an_unknown_bench_is_named_with_the_bench_help(tensorwire_bin):
    r = run([tensorwire_bin, "bench", "frobnicate"])
    assert r.returncode == 2 and "unknown command 'frobnicate'" in r.stderr, r.stderr
    assert "pipe" in r.stderr and "infer" in r.stderr and "dataflow" in r.stderr


def test_version_is_the_packages(tensorwire_bin):
    r = run([tensorwire_bin, "--version"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"tensorwire {tw.__version__}"
    # The three places that write it (CMakeLists.txt for the command, pyproject.toml for
    # the wheel, tensorwire/__init__.py) agree.
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["version"] == tw.__version__


def test_no_command_is_a_usage_error(tensorwire_bin):
    r = run([tensorwire_bin])
    assert r.returncode == 2 and "subcommand" in r.stderr.lower()


@pytest.mark.parametrize("args", [[], ["demo"], ["inspect"], ["bench", "pipe"], ["bench", "infer"],
                                  ["bench", "dataflow"]])
def test_every_command_has_help(tensorwire_bin, args):
    r = run([tensorwire_bin, *args, "--help"])
    assert r.returncode == 0, r.stderr
    assert "Usage:" in r.stdout or "usage" in r.stdout.lower()
    assert "--help" in r.stdout


def test_bench_alone_prints_the_bench_help(tensorwire_bin):
    r = run([tensorwire_bin, "bench"])
    assert r.returncode == 2
    assert "pipe" in r.stderr and "infer" in r.stderr and "dataflow" in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["bench", "pipe", "--sizes", "abc"], "--sizes"),
    (["bench", "pipe", "--iters", "x"], "--iters"),
    (["bench", "pipe", "--iters", "-5"], "--iters"),
    (["bench", "pipe", "--iters", "0"], "--iters"),
    (["bench", "pipe", "--lat-iters", "0"], "--lat-iters"),
    (["bench", "pipe", "--min-bytes", "x"], "--min-bytes"),
    (["bench", "pipe", "--min-bytes", "-1"], "--min-bytes"),
    (["bench", "pipe", "--sizes", "1024,-1"], "--sizes"),
    (["bench", "pipe", "--modes", "fast"], "--modes"),
    (["bench", "pipe", "--bogus"], "--bogus"),
    (["bench", "pipe", "--iters"], "--iters"),
    (["bench", "infer", "--clients", "abc"], "--clients"),
    (["bench", "infer", "--clients", "0"], "--clients"),
    (["bench", "infer", "--seconds", "-1"], "--seconds"),
    (["bench", "infer", "--transport", "carrier-pigeon"], "--transport"),
    (["bench", "infer", "--only", "everything"], "--only"),
    (["bench", "dataflow", "--shape", "abc"], "--shape"),
    (["bench", "dataflow", "--shape", "224,-3"], "--shape"),
    # Each dim fits, their product does not: it was std::bad_alloc and an abort.
    (["bench", "dataflow", "--shape", "100000,100000,100000"], "more than 67108864 elements"),
    (["bench", "dataflow", "--num-proc", "0"], "--num-proc"),
    (["bench", "dataflow", "--hwm", "x"], "--hwm"),
    (["demo", "--dir"], "--dir"),
    (["inspect", "a", "b"], "b"),
])
def test_bad_options_are_usage_errors_naming_the_option(tensorwire_bin, args, needle):
    r = run([tensorwire_bin, *args])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr
    assert "terminate called" not in r.stderr


def test_inspect_of_a_directory_says_it_is_a_directory(tensorwire_bin, tmp_path):
    r = run([tensorwire_bin, "inspect", str(tmp_path)])
    assert r.returncode == 1 and "is a directory" in r.stderr


def test_inspect_of_a_missing_file_names_it(tensorwire_bin, tmp_path):
    r = run([tensorwire_bin, "inspect", str(tmp_path / "nope.td")])
    assert r.returncode == 1 and "nope.td" in r.stderr


@pytest.mark.parametrize("args", [
    ["bench", "pipe", "--sizes", "1024", "--iters", "1", "--lat-iters", "1", "--tls", "tcp",
     "--no-reference"],
    ["bench", "infer", "--only", "memory", "--memory", "1"],
])
def test_a_json_path_that_cannot_be_written_is_an_error_naming_it(tensorwire_bin, args):
    # bench pipe wrote nothing and said nothing (exit status 0).
    r = run([tensorwire_bin, *args, "--json", "/nonexistent/figures.json"])
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "cannot write /nonexistent/figures.json" in r.stderr


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("args, child", [
    # The pipe peer, moving 64 KiB messages for as long as the bench is not stopped.
    (["bench", "pipe", "--tls", "tcp", "--modes", "consolidated", "--sizes", "65536", "--min-bytes",
      "1000000000000", "--no-reference"], None),
    # The reference's server and client (the server waits for ever for a client that does
    # not come), after a million 64-byte messages through the pipe.
    (["bench", "pipe", "--tls", "tcp", "--modes", "consolidated", "--sizes", "64", "--min-bytes",
      "1000000000", "--lat-iters", "1"], "ucx_perftest"),
    # The latency partner (it waits for ever on a futex) and the client process.
    (["bench", "infer", "--only", "latency", "--latency-requests", "100000000"], None),
    # 16 forked actors calling in a loop.
    (["bench", "infer", "--only", "actors", "--actors", "16", "--seconds", "60"], None),
], ids=["pipe-peer", "pipe-reference", "infer-latency", "infer-actors"])
def test_a_bench_stopped_by_sigkill_leaves_no_process_behind(tensorwire_bin, args, child):
    # A bench killed by a timeout runs no clean-up: its children must go with it (an orphaned
    # ucx_perftest server once spun a CPU for ever).
    proc = subprocess.Popen([tensorwire_bin, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            kids = children(proc.pid)
            if kids and (child is None or child in map(comm, kids)):
                time.sleep(0.5)  # all of them started
                kids = children(proc.pid)
                break
            time.sleep(0.02)
        assert kids and (child is None or child in map(comm, kids)), \
            f"the bench started no {child or 'child'} process (exit status {proc.poll()})"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(k) for k in kids):
        time.sleep(0.05)
    left = [k for k in kids if _running(k)]
    for k in left:
        os.kill(k, signal.SIGKILL)
    assert not left, f"{len(left)} of {len(kids)} children outlived the SIGKILLed bench"
