"""Every public entry point against the values people commonly get wrong: each gets the
exception a user of the reference library expects, with a message that names the offending
key or argument, and never an abort, a hang or nanobind's "incompatible function arguments"
dump. One table for all systems, so a new entry point is one line."""
import os
import subprocess

import numpy as np
import pytest

import tensorwire as tw

pytestmark = pytest.mark.timeout(120)


class Flow:
    def reset_state(self):
        pass

    def __iter__(self):
        yield [np.zeros(2)]

    def __len__(self):
        return 1


def shm_transport():
    return tw.SharedMemoryTransport(tw.TensorDict({"obs": np.zeros(4, np.float32)}),
                                    tw.TensorDict({"act": np.zeros(2, np.float32)}), num_slots=2)


def closed_listener():
    listener = tw.PipeListener(0)
    listener.close()
    return listener


# (name, call, expected exception type, words the message must contain)
CASES = [
    # TensorDict construction and files
    ("object dtype leaf", lambda: tw.TensorDict({"obs_o": np.array([object()])}),
     TypeError, ["obs_o", "object"]),
    ("str dtype leaf", lambda: tw.TensorDict({"obs_s": np.array(["x"])}), TypeError, ["obs_s"]),
    ("big-endian leaf", lambda: tw.TensorDict({"obs_be": np.ones(2, ">f4")}), TypeError, ["obs_be"]),
    ("batch size that does not fit", lambda: tw.TensorDict({"a": np.ones(3)}, batch_size=[5]),
     ValueError, ["batch"]),
    ("negative alignment", lambda: tw.TensorDict({"a": np.ones(3)}).consolidate(alignment=-8),
     ValueError, ["alignment"]),
    ("negative storage cache limit", lambda: tw.set_storage_cache_limit(-5), ValueError, ["nbytes"]),
    ("load of a missing file", lambda: tw.load("/nonexistent/td.tw"), OSError, ["/nonexistent/td.tw"]),
    # pipe
    ("port above 65535", lambda: tw.TensorDictPipe.connect("127.0.0.1", 70000), ValueError, ["port"]),
    ("negative port", lambda: tw.PipeListener(-1), ValueError, ["port"]),
    ("negative connect timeout", lambda: tw.TensorDictPipe.connect("127.0.0.1", 1, timeout=-1),
     ValueError, ["timeout"]),
    ("nan accept timeout", lambda: tw.PipeListener(0).accept(timeout=float("nan")),
     ValueError, ["timeout"]),
    ("an auth_key that is neither str nor bytes", lambda: tw.PipeListener(0, auth_key=42),
     TypeError, ["auth_key"]),
    ("an empty auth_key", lambda: tw.PipeListener(0, auth_key=b""), ValueError, ["auth_key"]),
    ("accept on a closed listener", lambda: closed_listener().accept(timeout=0), tw.ClosedError, []),
    # inference
    ("zero slots", lambda: tw.SharedMemoryTransport(tw.TensorDict({"obs": np.zeros(4)}),
                                                    tw.TensorDict({"act": np.zeros(2)}), num_slots=0),
     ValueError, ["num_slots"]),
    ("a policy that is not callable", lambda: tw.InferenceServer(42, shm_transport()),
     TypeError, ["policy"]),
    ("an array as a request", lambda: shm_transport().client()(np.zeros(4, np.float32), timeout=1),
     TypeError, ["dict"]),
    ("a list as a request", lambda: shm_transport().client()([1, 2], timeout=1), TypeError, ["dict"]),
    ("nan result timeout",
     lambda: ((t := shm_transport()),
              t.client().submit({"obs": np.zeros(4, np.float32)}).result(float("nan"))),
     ValueError, ["timeout"]),
    ("negative submit timeout",
     lambda: shm_transport().client().submit({"obs": np.zeros(4, np.float32)}, timeout=-1),
     ValueError, ["timeout"]),
    # dataflow
    ("zero worker processes", lambda: tw.MultiProcessRunnerZMQ(Flow(), num_proc=0), ValueError, ["num_proc"]),
    ("a map function that is not callable", lambda: tw.MultiProcessMapDataZMQ(Flow(), 1, 42),
     TypeError, ["map_func"]),
    ("negative remote receive timeout",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input").recv(timeout=-1), ValueError, ["timeout"]),
]


@pytest.mark.parametrize("name,call,exc,words", CASES, ids=[c[0] for c in CASES])
def test_a_bad_value_gets_the_expected_exception_naming_what_was_wrong(name, call, exc, words):
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    assert "incompatible function arguments" not in message, message
    for w in words:
        assert w in message, f"{name}: {w!r} not in {message!r}"


CLI_CASES = [
    (["bench", "pipe", "--sizes", "abc"], "--sizes"),
    (["bench", "pipe", "--iters", "x"], "--iters"),
    (["bench", "pipe", "--iters", "-5"], "--iters"),
    (["bench", "pipe", "--iters", "0"], "--iters"),
    (["bench", "infer", "--clients", "abc"], "--clients"),
    (["bench", "dataflow", "--shape", "abc"], "--shape"),
    (["inspect", "/"], "directory"),
]


@pytest.mark.parametrize("args,word", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_the_command_refuses_bad_options_by_name_and_never_aborts(args, word):
    binary = os.environ.get("TENSORWIRE_BIN") or os.path.join(
        os.path.dirname(__file__), "..", "..", "build", "tools", "tensorwire")
    r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode in (1, 2), (r.returncode, r.stderr)
    assert word in r.stderr + r.stdout, r.stderr


def test_an_auth_key_may_be_bytes_as_well_as_str():
    import threading

    key = b"\x00secret\xff"  # not UTF-8, with a NUL: used byte for byte
    with tw.PipeListener(0, auth_key=key) as listener:
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("pipe", listener.accept(timeout=30)))
        t.start()
        with tw.TensorDictPipe.connect("127.0.0.1", listener.port, auth_key=key, timeout=30) as p:
            t.join()
            p.send(tw.TensorDict({"a": np.arange(3.0)}), timeout=30)
            assert got["pipe"].recv(timeout=30)["a"].tolist() == [0.0, 1.0, 2.0]
            got["pipe"].close()
