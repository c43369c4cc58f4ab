"""UCX's settings that `import tensorwire` puts in the environment before libucs loads
(python/tensorwire/_ucx_env.py, docs/pipe.md "Process start"): UCX's memory hooks installed
through the relocation tables, not by rewriting code with a 50 ms wait per function, unless
the user chose a mode. UCX's own debug log says which way each hook went in."""
import os
import subprocess
import sys
import textwrap

from conftest import PYTHONPATH

SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, threading
    import numpy as np
    import tensorwire as tw
    print("mode", os.environ.get("UCX_MEM_MMAP_HOOK_MODE"), flush=True)
    # A process started from here has it too.
    child = subprocess.run([sys.executable, "-c",
                            "import os; print(os.environ.get('UCX_MEM_MMAP_HOOK_MODE'))"],
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
    return [line for line in r.stdout.splitlines() if line.split(" ")[0] in ("mode", "child", "got")]


def run(mode):
    env = {k: v for k, v in os.environ.items() if k != "UCX_MEM_MMAP_HOOK_MODE"}
    env.update(PYTHONPATH=PYTHONPATH, UCX_MEM_LOG_LEVEL="debug")
    if mode is not None:
        env["UCX_MEM_MMAP_HOOK_MODE"] = mode
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_has_ucx_install_its_memory_hooks_through_the_relocation_tables():
    r = run(None)
    assert r.returncode == 0, r.stderr
    assert ours(r) == ["mode reloc", "child reloc", "got [0.0, 1.0, 2.0]"]
    assert "installing reloc hook for munmap" in r.stdout + r.stderr
    assert "installing bistro hook" not in r.stdout + r.stderr


def test_a_hook_mode_the_user_set_is_the_one_ucx_uses():
    r = run("bistro")
    assert r.returncode == 0, r.stderr
    assert ours(r) == ["mode bistro", "child bistro", "got [0.0, 1.0, 2.0]"]
    assert "installing bistro hook for munmap" in r.stdout + r.stderr
    assert "installing reloc hook" not in r.stdout + r.stderr
