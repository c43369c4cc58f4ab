"""send_dataflow_zmq / RemoteDataZMQ over tcp:// between two processes on the loopback."""
import warnings

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import dataflow as twdf
from dataflow_helpers import check, no_leftovers, python  # noqa: F401


def producer(addr, n, size=10, nbytes=16, extra=""):
    return python(f"""
from dataflow_helpers import Counting
from tensorwire.dataflow import send_dataflow_zmq
{extra}
print(send_dataflow_zmq(Counting({size}, n={nbytes}), {addr!r}, max_datapoints={n}), flush=True)
""")


@pytest.fixture
def rogue():
    """A raw pyzmq PUSH socket (connect it yourself), destroyed whatever happens."""
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 1000)
    try:
        yield sock
    finally:
        ctx.destroy(linger=0)


def finish(p):
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return int(out)


def test_a_producer_process_feeds_a_receiver_over_tcp():
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    r.reset_state()
    p = producer(r.endpoint(), 25, nbytes=5000)
    got = [check(r.recv(timeout=20)) for _ in range(25)]
    assert got == [i % 10 for i in range(25)]  # one producer: in order, pass after pass
    assert finish(p) == 25
    assert r.cnt1 == 25 and r.cnt2 == 0
    assert r.recv(timeout=0.1) is None
    r.close()


def test_a_malformed_message_is_rejected_and_other_producers_go_on(rogue):
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", errors="warn")
    r.reset_state()
    rogue.connect(r.endpoint(1))
    rogue.send_multipart([b"x" * 40, b"{}", b"abc"])  # not a frame header
    rogue.send(b"a lone frame")
    p = producer(r.endpoint(0), 30)
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = iter(r)
        while len(got) < 30 or r.rejected < 2:
            got.append(check(next(it)))
    assert got[:30] == [i % 10 for i in range(30)]
    assert finish(p) == 30
    assert r.rejected == 2 and r.cnt1 >= 30 and r.cnt2 == 0
    msgs = [str(w.message) for w in caught if issubclass(w.category, twdf.MalformedMessageWarning)]
    assert len(msgs) == 2 and all(r.endpoint(1) in m for m in msgs)
    assert any("invalid frame header" in m for m in msgs) and any("expected 3 frames" in m for m in msgs)
    r.close()


def test_errors_raise_mode_raises_and_iteration_goes_on(rogue):
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*", errors="raise")
    r.reset_state()
    rogue.connect(r.endpoint())
    rogue.send(b"junk")
    with pytest.raises(tw.ProtocolError, match=r"expected 3 frames .*, got 1 \(a tensorpack "
                                                r"send_dataflow_zmq's pickle\? both ends"):
        next(iter(r))
    p = producer(r.endpoint(), 3)
    assert [check(dp) for _, dp in zip(range(3), r)] == [0, 1, 2]
    finish(p)
    r.close()


def test_pickled_values_are_refused_unless_allowed():
    extra = """
import dataflow_helpers, numpy as np
class Counting(dataflow_helpers.Counting):
    def __iter__(self):
        for dp in super().__iter__():
            yield dp + [{1, 2}]
"""
    strict = twdf.RemoteDataZMQ("tcp://127.0.0.1:*", errors="raise")
    strict.reset_state()
    p = producer(strict.endpoint(), 1, extra=extra)
    with pytest.raises(tw.ProtocolError, match="allow_pickle"):
        strict.recv(timeout=20)
    finish(p)
    strict.close()

    trusting = twdf.RemoteDataZMQ("tcp://127.0.0.1:*", allow_pickle=True)
    trusting.reset_state()
    p = producer(trusting.endpoint(), 1, extra=extra)
    dp = trusting.recv(timeout=20)
    assert dp[3] == {1, 2} and check(dp[:3]) == 0
    finish(p)
    trusting.close()


def test_two_producers_on_two_addresses():
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    r.reset_state()
    a = producer(r.endpoint(0), 20)
    b = producer(r.endpoint(1), 20, nbytes=100_000)
    got = [check(r.recv(timeout=20)) for _ in range(40)]
    assert sorted(got) == sorted([i % 10 for i in range(20)] * 2)
    finish(a), finish(b)
    assert r.cnt1 == 20 and r.cnt2 == 20
    r.close()


def test_a_cpp_style_tensordict_arrives_as_a_tensordict():
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*")
    r.reset_state()
    p = python(f"""
import numpy as np, tensorwire as tw
from tensorwire.dataflow import send_dataflow_zmq
class TD:
    def reset_state(self): pass
    def __iter__(self):
        yield tw.TensorDict({{"obs": np.ones((2, 3), np.float32)}}, batch_size=[2])
send_dataflow_zmq(TD(), {r.endpoint()!r}, max_datapoints=1)
""")
    td = r.recv(timeout=20)
    assert isinstance(td, tw.TensorDict) and tuple(td.batch_size) == (2,)
    assert (td["obs"] == 1).all()
    p.communicate(timeout=60)
    r.close()


def test_a_datapoint_over_max_message_bytes_is_rejected_and_the_stream_goes_on():
    r = twdf.RemoteDataZMQ("tcp://127.0.0.1:*", max_message_bytes=4096)
    r.reset_state()
    p = python(f"""
from dataflow_helpers import Counting
from tensorwire.dataflow import send_dataflow_zmq
send_dataflow_zmq(Counting(1, n=10000), {r.endpoint()!r}, max_datapoints=1)
send_dataflow_zmq(Counting(1, n=16), {r.endpoint()!r}, max_datapoints=1)
""")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check(r.recv(timeout=20)) == 0
    msgs = [str(w.message) for w in caught if issubclass(w.category, twdf.MalformedMessageWarning)]
    assert len(msgs) == 1 and "exceeds max_message_bytes 4096" in msgs[0], msgs
    assert r.rejected == 1
    p.communicate(timeout=60)
    r.close()


def test_a_program_ends_cleanly_while_a_daemon_thread_produces():
    # The producer thread, in send_dataflow_zmq, took the GIL for the dataflow's next
    # datapoint as the interpreter finalized: CPython ended it mid-unwind through the C++
    # loop, and the process aborted at exit ("terminate called without an active exception")
    # every time.
    p = python("""
import threading
import tensorwire as tw
from dataflow_helpers import Endless, check
r = tw.RemoteDataZMQ("tcp://127.0.0.1:*")
r.reset_state()
threading.Thread(target=tw.send_dataflow_zmq, args=(Endless(), r.endpoint(0)), kwargs={"hwm": 8},
                 daemon=True).start()
for _ in range(10):
    check(r.recv(timeout=30))
print("done")
""")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.strip() == "done" and "terminate" not in err, err
