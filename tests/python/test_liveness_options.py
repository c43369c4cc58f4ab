"""The liveness setting of pipes and servers: its default, the environment variable, and
bad values (what it does across hosts: test_across_hosts.py)."""
import os
import subprocess
import sys

import pytest

import tensorwire as tw
from conftest import ROOT


def connected_pair(**kw):
    """A server, a client's pipe and the server's pipe to it (the handshake needs both sides)."""
    from concurrent.futures import ThreadPoolExecutor
    server = tw.TensorDictServer(0, **kw)
    with ThreadPoolExecutor(1) as ex:
        served = ex.submit(server.accept, 10)
        client = tw.TensorDictPipe.connect("127.0.0.1", server.port, **kw)
        return server, client, served.result(timeout=30)


def test_the_default_is_ten_seconds_and_each_object_takes_its_own():
    server, client, served = connected_pair()
    assert client.liveness_timeout == served.liveness_timeout == 10.0
    server.close()
    server, client, served = connected_pair(liveness_timeout=2.5)
    assert client.liveness_timeout == served.liveness_timeout == 2.5
    server.close()
    server, client, served = connected_pair(liveness_timeout=0)
    assert client.liveness_timeout == served.liveness_timeout == 0.0
    server.close()


@pytest.mark.parametrize("bad", [-1, float("nan")])
def test_a_negative_or_nan_timeout_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="liveness_timeout must be None"):
        tw.TensorDictServer(0, liveness_timeout=bad)
    with pytest.raises(ValueError, match="liveness_timeout must be None"):
        tw.TensorDictPipe.connect("127.0.0.1", 1, liveness_timeout=bad)


def run_with_env(value, code):
    env = dict(os.environ, TENSORWIRE_LIVENESS_TIMEOUT=value, PYTHONPATH=os.path.join(ROOT, "python"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_the_environment_variable_sets_the_default():
    r = run_with_env("3.5", "import sys; sys.path.insert(0, %r)\n"
                            "from test_liveness_options import connected_pair\n"
                            "s, c, p = connected_pair(); print(c.liveness_timeout, p.liveness_timeout)"
                     % os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3.5", "3.5"]


def test_a_malformed_environment_variable_is_a_value_error_naming_it():
    r = run_with_env("ten", "import tensorwire as tw; tw.TensorDictServer(0)")
    assert r.returncode != 0
    assert "ValueError: TENSORWIRE_LIVENESS_TIMEOUT must be a number of seconds >= 0" in r.stderr
    assert "'ten'" in r.stderr


@pytest.mark.parametrize("seconds", [14401, 86400 * 30, float("inf")])
def test_a_timeout_past_four_hours_still_connects(seconds):
    # A quarter of it, asked of the peer as its heartbeat interval, was past the handshake's
    # 1 h cap: every connection was refused ("heartbeat_ms must be ... to 3600000").
    server, client, served = connected_pair(liveness_timeout=seconds)
    assert client.liveness_timeout == served.liveness_timeout > 14400
    server.close()


def test_a_positive_timeout_below_a_millisecond_is_one_not_off():
    server, client, served = connected_pair(liveness_timeout=0.0004)
    assert client.liveness_timeout == served.liveness_timeout == 0.001  # 0 would mean off
    server.close()
