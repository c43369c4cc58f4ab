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


def transport(kind):
    return shm_transport() if kind == "shared_memory" else {
        "socket": tw.SocketTransport, "thread": tw.ThreadTransport}[kind]()


def policy(batch):
    return batch


def server(kind, **kw):
    return tw.InferenceServer(policy, transport(kind), **kw)


def request(kind):
    return {"obs": np.zeros(4, np.float32)}


def server_cases(kind):
    """An InferenceServer and a client on one transport kind."""
    return [
        ("a policy that is not callable", lambda: tw.InferenceServer(42, transport(kind)),
         TypeError, ["policy"]),
        ("zero max_batch_size", lambda: server(kind, max_batch_size=0), ValueError,
         ["max_batch_size", "0"]),
        ("negative max_batch_size", lambda: server(kind, max_batch_size=-4), ValueError,
         ["max_batch_size", "-4"]),
        ("a float max_batch_size", lambda: server(kind, max_batch_size=4.5), TypeError,
         ["max_batch_size", "float"]),
        ("a str max_batch_size", lambda: server(kind, max_batch_size="4"), TypeError,
         ["max_batch_size", "str"]),
        ("zero min_batch_size", lambda: server(kind, min_batch_size=0), ValueError,
         ["min_batch_size"]),
        ("min_batch_size above max_batch_size",
         lambda: server(kind, max_batch_size=2, min_batch_size=3), ValueError,
         ["min_batch_size", "max_batch_size"]),
        ("negative batching timeout", lambda: server(kind, timeout=-1), ValueError, ["timeout"]),
        ("nan batching timeout", lambda: server(kind, timeout=float("nan")), ValueError,
         ["timeout"]),
        ("a str batching timeout", lambda: server(kind, timeout="1"), TypeError, ["timeout"]),
        ("None batching timeout", lambda: server(kind, timeout=None), TypeError, ["timeout"]),
        ("zero stats window", lambda: server(kind, stats_window_size=0), ValueError,
         ["stats_window_size"]),
        ("a policy_version_key that is not a key", lambda: server(kind, policy_version_key=42),
         TypeError, ["policy_version_key"]),
        ("a str policy_version", lambda: server(kind, policy_version="1"), TypeError,
         ["policy_version"]),
        ("an unknown input_type", lambda: server(kind, input_type="numpy"), ValueError,
         ["input_type", "numpy"]),
        ("a transport that is not one", lambda: tw.InferenceServer(policy, 42), TypeError,
         ["transport"]),
        ("negative shutdown timeout", lambda: server(kind).shutdown(timeout=-1), ValueError,
         ["timeout"]),
        ("a bool shutdown timeout", lambda: server(kind).shutdown(timeout=True), TypeError,
         ["timeout", "bool"]),
        ("zero clients", lambda: transport(kind).clients(0), ValueError, ["num_clients"]),
        ("an array as a request",
         lambda: transport(kind).client()(np.zeros(4, np.float32), timeout=1), TypeError, ["dict"]),
        ("negative call timeout",
         lambda: transport(kind).client()(request(kind), timeout=-1), ValueError, ["timeout"]),
        ("nan submit timeout",
         lambda: transport(kind).client().submit(request(kind), timeout=float("nan")),
         ValueError, ["timeout"]),
    ]


def name_in_use(make):
    t = make("tensorwire-bad-input-busy")
    try:
        make("tensorwire-bad-input-busy")
    finally:
        t.close()


SURROGATE = os.fsdecode(b"caf\xe9")  # 'caf\udce9': a Latin-1 name read from a UTF-8 system


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
    ("strides not a multiple of the item size",
     lambda: tw.TensorDict({"obs_st": np.ndarray((10,), np.float32, np.zeros(64, np.uint8),
                                                 strides=(5,))}),
     ValueError, ["obs_st", "strides (5,)", "item size (4 bytes)", "ascontiguousarray"]),
    ("batch size that does not fit", lambda: tw.TensorDict({"a": np.ones(3)}, batch_size=[5]),
     ValueError, ["batch"]),
    ("negative alignment", lambda: tw.TensorDict({"a": np.ones(3)}).consolidate(alignment=-8),
     ValueError, ["alignment"]),
    ("negative storage cache limit", lambda: tw.set_storage_cache_limit(-5), ValueError, ["nbytes"]),
    ("load of a missing file", lambda: tw.load("/nonexistent/td.tw"), FileNotFoundError,
     ["/nonexistent/td.tw"]),
    ("load of a directory", lambda: tw.load("/tmp"), IsADirectoryError, ["/tmp"]),
    ("load of a device", lambda: tw.load("/dev/null"), ValueError, ["/dev/null", "regular file"]),
    ("load of a path that is not a path", lambda: tw.load(42), TypeError, ["path", "int"]),
    ("load of None", lambda: tw.load(None), TypeError, ["path", "NoneType"]),
    ("save to a directory", lambda: tw.TensorDict({"a": np.ones(2)}).save("/tmp"),
     IsADirectoryError, ["'/tmp'"]),
    ("save into a missing directory",
     lambda: tw.TensorDict({"a": np.ones(2)}).save("/nonexistent/td.tw"), FileNotFoundError,
     ["'/nonexistent/td.tw'"]),
    ("save where nothing can be written",
     lambda: tw.TensorDict({"a": np.ones(2)}).save("/proc/td.tw"), OSError, ["'/proc/td.tw'"]),
    ("save to an empty path", lambda: tw.TensorDict({"a": np.ones(2)}).save(""), ValueError,
     ["path"]),
    ("save to a path that is not a path", lambda: tw.TensorDict({"a": np.ones(2)}).save(42),
     TypeError, ["path", "int"]),
    ("save with a bad alignment",
     lambda: tw.TensorDict({"a": np.ones(2)}).save("/tmp/x.td", alignment=3), ValueError,
     ["alignment", "3"]),
    ("save with a str alignment",
     lambda: tw.TensorDict({"a": np.ones(2)}).save("/tmp/x.td", alignment="8"), TypeError,
     ["alignment", "str"]),
    # pipe
    ("port above 65535", lambda: tw.TensorDictPipe.connect("127.0.0.1", 70000), ValueError, ["port"]),
    ("negative port", lambda: tw.PipeListener(-1), ValueError, ["port"]),
    ("negative connect timeout", lambda: tw.TensorDictPipe.connect("127.0.0.1", 1, timeout=-1),
     ValueError, ["timeout"]),
    ("nan accept timeout", lambda: tw.PipeListener(0).accept(timeout=float("nan")),
     ValueError, ["timeout"]),
    ("a str accept timeout", lambda: tw.PipeListener(0).accept(timeout="soon"), TypeError,
     ["timeout", "number of seconds", "str"]),
    ("a bool connect timeout", lambda: tw.TensorDictPipe.connect("127.0.0.1", 1, timeout=True),
     TypeError, ["timeout", "bool"]),
    ("a str liveness timeout", lambda: tw.TensorDictServer(0, liveness_timeout="1"), TypeError,
     ["liveness_timeout", "str"]),
    ("a consolidated that is not a bool", lambda: tw.PipeListener(0, consolidated="yes"),
     TypeError, ["consolidated", "bool", "str"]),
    ("a None consolidated for a connect",
     lambda: tw.TensorDictPipe.connect("127.0.0.1", 1, consolidated=None), TypeError,
     ["consolidated", "NoneType"]),
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
    ("a str result timeout",
     lambda: ((t := shm_transport()),
              t.client().submit({"obs": np.zeros(4, np.float32)}).result("1")),
     TypeError, ["timeout", "str"]),
    ("a list call timeout",
     lambda: shm_transport().client()({"obs": np.zeros(4, np.float32)}, timeout=[1]),
     TypeError, ["timeout", "list"]),
    *[(f"{kind}: {name}", call, exc, words) for kind in ("socket", "thread", "shared_memory")
      for name, call, exc, words in server_cases(kind)],
    ("an empty remote transport auth_key (it would mean no authentication)",
     lambda: tw.RemoteTransport({"obs": np.zeros(4, np.float32)}, {"act": np.zeros(2, np.float32)},
                                num_slots=2, auth_key=""), ValueError, ["auth_key", "empty"]),
    ("a remote client auth_key that is not a key",
     lambda: tw.inference.connect("127.0.0.1", 1, auth_key=1.5), TypeError,
     ["auth_key", "float"]),
    ("an empty remote client auth_key",
     lambda: tw.inference.connect("127.0.0.1", 1, auth_key=b""), ValueError,
     ["auth_key", "empty"]),
    ("socket transport name in use", lambda: name_in_use(lambda n: tw.SocketTransport(name=n)),
     OSError, ["tensorwire-bad-input-busy", "in use"]),
    ("shared-memory transport name in use",
     lambda: name_in_use(lambda n: tw.SharedMemoryTransport(
         {"obs": np.zeros(4, np.float32)}, {"act": np.zeros(2, np.float32)}, num_slots=2, name=n)),
     OSError, ["tensorwire-bad-input-busy", "in use"]),
    ("socket transport name too long", lambda: tw.SocketTransport(name="x" * 200), ValueError,
     ["name", "too long"]),
    ("socket transport name not a str", lambda: tw.SocketTransport(name=42), TypeError, ["name"]),
    ("socket client of a name nobody serves",
     lambda: tw.SocketTransport.client_for("tensorwire-bad-input-nobody")(
         {"obs": np.zeros(4, np.float32)}, timeout=5),
     ConnectionRefusedError, ["tensorwire-bad-input-nobody"]),
    ("socket client name not a str", lambda: tw.SocketTransport.client_for(42), TypeError,
     ["name"]),
    # dataflow
    ("a str datapoint timeout",
     lambda: tw.MultiProcessRunnerZMQ(Flow(), num_proc=1, datapoint_timeout="5"), TypeError,
     ["datapoint_timeout", "None or a number of seconds", "str"]),
    ("a None restart window",
     lambda: tw.MultiProcessRunnerZMQ(Flow(), num_proc=1, restart_window=None), TypeError,
     ["restart_window", "NoneType"]),
    ("a str max_restarts", lambda: tw.MultiProcessMapDataZMQ(Flow(), 1, len, max_restarts="3"),
     TypeError, ["max_restarts", "str"]),
    ("an on_worker_death that is not a str",
     lambda: tw.MultiProcessRunnerZMQ(Flow(), num_proc=1, on_worker_death=True), TypeError,
     ["on_worker_death", "bool"]),
    ("zero worker processes", lambda: tw.MultiProcessRunnerZMQ(Flow(), num_proc=0), ValueError, ["num_proc"]),
    ("a map function that is not callable", lambda: tw.MultiProcessMapDataZMQ(Flow(), 1, 42),
     TypeError, ["map_func"]),
    ("negative remote receive timeout",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input").recv(timeout=-1), ValueError, ["timeout"]),
    ("a str remote receive timeout",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input").recv(timeout="1"), TypeError,
     ["timeout", "str"]),
    ("a str remote receiver liveness timeout",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input", liveness_timeout="1"), TypeError,
     ["liveness_timeout", "str"]),
    ("a remote receiver's bind that is not a bool",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input", bind="yes"), TypeError,
     ["bind", "str"]),
    ("a remote receiver's allow_pickle that is not a bool",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input", allow_pickle=None), TypeError,
     ["allow_pickle", "NoneType"]),
    ("a sender's bind that is not a bool",
     lambda: tw.send_dataflow_zmq(Flow(), "ipc://@tensorwire-bad-input", bind=1), TypeError,
     ["bind", "int"]),
    ("a pipe listener's message limit of 0 (it meant the default)",
     lambda: tw.PipeListener(0, max_message_bytes=0), ValueError, ["max_message_bytes", "at least 1"]),
    ("a negative message limit for a server",
     lambda: tw.TensorDictServer(0, max_message_bytes=-5), ValueError, ["max_message_bytes", "at least 1"]),
    ("a connect's message limit that is not an int",
     lambda: tw.TensorDictPipe.connect("127.0.0.1", 1, max_message_bytes=1.5), TypeError,
     ["max_message_bytes", "integer"]),
    ("a remote receiver's message limit of 0",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input", max_message_bytes=0), ValueError,
     ["max_message_bytes", "at least 1"]),
    ("a remote receiver's message limit that is not an int",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input", max_message_bytes="1M"), TypeError,
     ["max_message_bytes"]),
    ("a remote receiver's endpoint past addr2",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input").endpoint(2), IndexError,
     ["which", "0 (addr1) or 1 (addr2)", "2"]),
    ("a remote receiver's count of a far address",
     lambda: tw.RemoteDataZMQ("ipc://@tensorwire-bad-input")._core.count(10**6), IndexError,
     ["which", "1000000"]),
    # a str that os.fsdecode made of bytes that are not UTF-8: named, never "std::bad_cast"
    *[(f"a lone surrogate in {what}", call, ValueError, [what, "UTF-8", "surrogate"]) for what, call in [
        ("key", lambda: tw.TensorDict({SURROGATE: np.zeros(2)})),
        ("name", lambda: tw.SocketTransport(name=SURROGATE)),
        ("auth_key", lambda: tw.PipeListener(0, auth_key=SURROGATE)),
        ("host", lambda: tw.TensorDictPipe.connect(SURROGATE, 1)),
        ("address", lambda: tw.inference.connect(SURROGATE, 1)),
        ("addr1", lambda: tw.RemoteDataZMQ(SURROGATE)),
    ]],
    ("a lone surrogate in a non-tensor value",
     lambda: tw.TensorDict({"note": tw.NonTensorStack([SURROGATE])}), ValueError,
     ["NonTensorStack value", "UTF-8"]),
    ("a path holding a NUL", lambda: tw.load("/tmp/a\0b"), ValueError, ["load", "NUL"]),
    ("a None host", lambda: tw.TensorDictPipe.connect(None, 1), TypeError, ["host", "NoneType"]),
    ("a negative spin", lambda: tw.SharedMemoryTransport(
        {"obs": np.zeros(4, np.float32)}, {"act": np.zeros(2, np.float32)}, num_slots=2, spin=-1),
     ValueError, ["spin", "-1"]),
    ("a spin past 32 bits", lambda: tw.SharedMemoryTransport(
        {"obs": np.zeros(4, np.float32)}, {"act": np.zeros(2, np.float32)}, num_slots=2, spin=2**40),
     ValueError, ["spin", "1099511627776"]),
    ("an int mark_weight_update",
     lambda: server("thread").update_model(lambda p: None, mark_weight_update=1), TypeError,
     ["mark_weight_update", "int"]),
    ("an int stats reset", lambda: server("thread").stats(reset=1), TypeError, ["reset", "int"]),
    ("a timeout beyond a float", lambda: tw.PipeListener(0).accept(timeout=10**400), ValueError,
     ["timeout", "float"]),
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


@pytest.mark.parametrize("as_bytes", [False, True], ids=["surrogate-escaped str", "bytes"])
def test_a_file_name_that_is_not_utf8_saves_and_loads(tmp_path, as_bytes):
    """os.listdir gives such a name as a str with a lone surrogate: it names the same file
    (os.fsencode's bytes), as it does for open()."""
    name = os.fsencode(tmp_path) + b"/caf\xe9.tw"
    path = name if as_bytes else os.fsdecode(name)
    tw.TensorDict({"a": np.arange(3)}).save(path)
    assert os.path.exists(name)
    np.testing.assert_array_equal(tw.load(path)["a"], np.arange(3))
