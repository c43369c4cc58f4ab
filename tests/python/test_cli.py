"""The tensorwire command: demo and inspect."""
import numpy as np

import tensorwire as tw
from conftest import run


def test_demo_runs_and_round_trips(tensorwire_bin):
    r = run([tensorwire_bin, "demo"])
    assert r.returncode == 0, r.stderr
    assert "consolidated" in r.stdout and "round trip: equal" in r.stdout


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
    assert r.returncode == 2 and "usage" in r.stderr
