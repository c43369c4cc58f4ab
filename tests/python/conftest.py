import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def tensorwire_bin():
    """The tensorwire command built by `make build` (or on PATH after pip install)."""
    path = os.environ.get("TENSORWIRE_BIN") or os.path.join(ROOT, "build", "tools", "tensorwire")
    if not os.path.exists(path):
        path = shutil.which("tensorwire")
    assert path and os.path.exists(path), "the tensorwire command is not built: run `make build`"
    return path


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)
