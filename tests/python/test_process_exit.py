"""How programs using tensorwire end: for each system, a script that exits normally with its
objects still alive, one that raises mid-use, and one that forks a child which exits, must
end with exit code 0 (or 1 with its own traceback) and print nothing on stderr that it did
not print itself: no abort, no UCX or nanobind message, no crash handler's backtrace."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import PYTHONPATH

pytestmark = pytest.mark.timeout(180)

# Each system's setup: after it, the script has made a round trip and holds live objects.
SETUP = {
    "pipe": """
        import threading
        import numpy as np
        import tensorwire as tw
        listener = tw.PipeListener(0)
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("pipe", listener.accept(timeout=30)))
        t.start()
        client = tw.TensorDictPipe.connect("127.0.0.1", listener.port, timeout=30)
        t.join()
        server_side = got["pipe"]
        client.send(tw.TensorDict({"a": np.arange(4.0)}), timeout=30)
        assert server_side.recv(timeout=30)["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    """,
    "inference": """
        import numpy as np
        import tensorwire as tw
        req = tw.TensorDict({"observation": np.zeros(4, np.float32)})
        resp = tw.TensorDict({"action": np.zeros(4, np.float32)})
        transport = tw.SharedMemoryTransport(req, resp, num_slots=4)
        server = tw.InferenceServer(
            lambda b: tw.TensorDict({"action": b["observation"] * 2}, batch_size=b.batch_size), transport)
        server.start()
        client = transport.client()
        out = client({"observation": np.ones(4, np.float32)}, timeout=30)
        assert out["action"].tolist() == [2.0] * 4
    """,
    "torchrl": """
        import torch
        from tensordict import TensorDict
        from tensordict.nn import TensorDictModule
        from torchrl.modules.inference_server import InferenceServer
        from tensorwire.torchrl import SharedMemoryTransport
        transport = SharedMemoryTransport(TensorDict({"observation": torch.zeros(4)}),
                                          TensorDict({"action": torch.zeros(4)}), num_slots=4)
        policy = TensorDictModule(lambda x: x * 2, in_keys=["observation"], out_keys=["action"])
        server = InferenceServer(policy, transport, max_batch_size=4)
        server.start()
        client = transport.client()
        out = client(TensorDict({"observation": torch.ones(4)}), timeout=30)
        assert out["action"].tolist() == [2.0] * 4
    """,
    "dataflow": """
        import numpy as np
        import tensorwire as tw

        class Flow:
            def reset_state(self):
                pass
            def __iter__(self):
                i = 0
                while True:
                    yield [np.full(8, i % 251, np.uint8), i]
                    i += 1

        runner = tw.MultiProcessRunnerZMQ(Flow(), num_proc=2)
        runner.reset_state()
        it = iter(runner)
        for _ in range(5):
            next(it)
    """,
}

ENDING = {
    "exit": "",
    "raise": 'raise RuntimeError("the script\'s own error")',
    # A daemon thread still holds the system's objects when the interpreter exits.
    "daemon": """
        import threading, time
        held = dict(globals())
        threading.Thread(target=lambda: (held, time.sleep(60)), daemon=True).start()
    """,
    # A daemon thread still uses the system's objects (waiting in a call, or between two)
    # when the interpreter exits; tensorwire.dataflow's exit hook closes a runner under it.
    "busy": """
        import threading, time
        import tensorwire
        def use():
            try:
                while True:
                    USE
            except tensorwire.ClosedError:
                pass
        threading.Thread(target=use, daemon=True).start()
        time.sleep(0.3)
    """,
    "fork": """
        import multiprocessing as mp
        child = mp.get_context("fork").Process(target=lambda: None)
        child.start()
        child.join(30)
        assert child.exitcode == 0, child.exitcode
    """,
}


# What the "busy" ending's thread does, again and again.
USE = {
    "pipe": "server_side.recv(timeout=None)",
    "inference": 'client({"observation": np.ones(4, np.float32)}, timeout=30)',
    "torchrl": 'client(TensorDict({"observation": torch.ones(4)}), timeout=30)',
    "dataflow": "next(it)",
}


def run_script(system, ending):
    code = textwrap.dedent(SETUP[system]) + textwrap.dedent(ENDING[ending]).replace("USE", USE[system])
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("ending", sorted(ENDING))
@pytest.mark.parametrize("system", sorted(SETUP))
def test_a_program_ends_cleanly_and_prints_nothing_it_did_not_ask_for(system, ending):
    r = run_script(system, ending)
    if ending == "raise":
        assert r.returncode == 1, (r.returncode, r.stderr)
        # Only the script's own traceback.
        assert r.stderr.startswith("Traceback (most recent call last):"), r.stderr
        assert r.stderr.rstrip().endswith("RuntimeError: the script's own error"), r.stderr
        assert r.stderr.count("Traceback") == 1, r.stderr
    else:
        assert r.returncode == 0, (r.returncode, r.stderr)
        assert r.stderr == "", r.stderr
