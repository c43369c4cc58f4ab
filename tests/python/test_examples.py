"""The Python programs in examples/ run to completion, their own checks passing."""
import os
import sys

from conftest import PYTHONPATH, ROOT, run


def test_the_tensordict_pipe_example_streams_and_checks_every_dict():
    r = run([sys.executable, os.path.join(ROOT, "examples", "tensordict_pipe.py"), "20"],
            env=dict(os.environ, PYTHONPATH=PYTHONPATH))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "tensordict_pipe: 20 TensorDicts sent and checked\n"
