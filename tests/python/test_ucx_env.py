"""UCX's settings that `import tensorwire` puts in the environment before libucs loads
(python/tensorwire/_ucx_env.py, docs/pipe.md "Process start"): UCX's memory hooks off (no
function of the process rewritten, no 50 ms wait after each) unless the user chose, asked
for a registration cache, or the host has RDMA devices. UCX's own memory log says which
hooks went in; the script's round trip shows UCX working either way."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import PYTHONPATH
from tensorwire._ucx_env import memory_events_off

SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, threading
    import numpy as np
    import tensorwire as tw
    print("events", os.environ.get("UCX_MEM_EVENTS"), flush=True)
    # A process started from here has the same setting.
    child = subprocess.run([sys.executable, "-c",
                            "import os; print(os.environ.get('UCX_MEM_EVENTS'))"],
                           capture_output=True, text=True, check=True)
    print("child", child.stdout.strip(), flush=True)
    with tw.PipeListener(0) as listener:
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("p", listener.accept(timeout=30)))
        t.start()
        with tw.TensorDictPipe.connect("127.0.0.1", listener.port, timeout=30) as client:
            t.join()
            client.send(tw.TensorDict({"a": np.arange(3.0)}), timeout=30)
            print("got", got["p"].recv(timeout=30)["a"].tolist(), flush=True)
            got["p"].close()
""")


def ours(r):
    """The script's own lines (UCX's memory log goes to stdout too)."""
    return [line for line in r.stdout.splitlines() if line.split(" ")[0] in ("events", "child", "got")]


def run(**settings):
    env = {k: v for k, v in os.environ.items()
           if k not in ("UCX_MEM_EVENTS", "UCX_MEM_MMAP_HOOK_MODE") and "RCACHE" not in k}
    env.update(PYTHONPATH=PYTHONPATH, UCX_MEM_LOG_LEVEL="debug", **settings)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_turns_ucxs_memory_hooks_off_where_nobody_chose():
    r = run()
    assert r.returncode == 0, r.stderr
    if memory_events_off({}):
        assert ours(r) == ["events no", "child no", "got [0.0, 1.0, 2.0]"]
        assert "installing" not in r.stdout + r.stderr  # no hook of UCX's went in
    else:  # a host with RDMA devices: UCX's own default, the hooks on
        assert ours(r) == ["events None", "child None", "got [0.0, 1.0, 2.0]"]
        assert "installing bistro hook for munmap" in r.stdout + r.stderr


@pytest.mark.parametrize("settings", [{"UCX_MEM_EVENTS": "yes"}, {"UCX_RCACHE_ENABLE": "y"}],
                         ids=["events-on", "rcache-asked-for"])
def test_hooks_the_user_chose_or_a_registration_cache_needs_are_installed(settings):
    r = run(**settings)
    assert r.returncode == 0, r.stderr  # UCX_RCACHE_ENABLE=y without the events: ucp_init fails
    events = settings.get("UCX_MEM_EVENTS")
    assert ours(r) == [f"events {events}", f"child {events}", "got [0.0, 1.0, 2.0]"]
    assert "installing bistro hook for munmap" in r.stdout + r.stderr


def test_a_host_with_rdma_devices_keeps_the_hooks(tmp_path):
    assert memory_events_off({}, rdma_devices=str(tmp_path))  # the folder, but no device
    (tmp_path / "mlx5_0").mkdir()
    assert not memory_events_off({}, rdma_devices=str(tmp_path))
    assert memory_events_off({}, rdma_devices=str(tmp_path / "absent"))
