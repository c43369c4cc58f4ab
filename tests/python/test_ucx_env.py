"""UCX's settings that `import tensorwire` puts in the environment before libucs loads
(python/tensorwire/_ucx_env.py, docs/pipe.md "Process start"): UCX's memory hooks off (no
function of the process rewritten, no 50 ms wait for each), unless the user turned them on.
UCX's own debug log says which hooks went in, and how."""
import os
import subprocess
import sys
import textwrap

from conftest import PYTHONPATH

SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, threading
    import numpy as np
    import tensorwire as tw
    print("events", os.environ.get("UCX_MEM_EVENTS"), flush=True)
    # A process started from here has it too.
    child = subprocess.run([sys.executable, "-c",
                            "import os; print(os.environ.get('UCX_MEM_EVENTS'))"],
                           capture_output=True, text=True, check=True)
    print("child", child.stdout.strip(), flush=True)
    # UCX in use (its hooks go in at its first context): a round trip.
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
    """The script's own lines (UCX's debug log goes to stdout too)."""
    return [line for line in r.stdout.splitlines() if line.split(" ")[0] in ("events", "child", "got")]


def run(events):
    env = {k: v for k, v in os.environ.items() if k != "UCX_MEM_EVENTS"}
    env.update(PYTHONPATH=PYTHONPATH, UCX_MEM_LOG_LEVEL="debug")
    if events is not None:
        env["UCX_MEM_EVENTS"] = events
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_leaves_every_function_of_the_process_as_it_is():
    r = run(None)
    assert r.returncode == 0, r.stderr
    assert ours(r) == ["events no", "child no", "got [0.0, 1.0, 2.0]"]
    assert "installing" not in r.stdout + r.stderr


def test_memory_events_the_user_turned_on_are_installed():
    r = run("yes")
    assert r.returncode == 0, r.stderr
    assert ours(r) == ["events yes", "child yes", "got [0.0, 1.0, 2.0]"]
    assert "installing bistro hook for munmap" in r.stdout + r.stderr
