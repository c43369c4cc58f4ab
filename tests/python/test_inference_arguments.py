"""Bad arguments of the inference API: one-line errors naming the argument. The binding
converts (TypeError for a value of the wrong type); the C++ API checks the rules (ValueError
for a count below its minimum, a uid out of range), once, for every caller."""
import sys

import numpy as np
import pytest

import tensorwire as tw
import tensorwire.inference  # noqa: F401  (tw.inference.InferenceClient)


def spec():
    return {"observation": np.zeros(4, np.float32)}


def one_line(excinfo):
    text = str(excinfo.value)
    assert "\n" not in text and "incompatible" not in text, text
    return text


@pytest.mark.parametrize("num_slots, error, needle", [
    (0, ValueError, "num_slots must be at least 1, got 0"),
    (-3, ValueError, "num_slots must be at least 1, got -3"),
    (1 << 30, ValueError, "num_slots must be at most 16777216"),
    ("4", TypeError, "num_slots must be an integer, got str"),
    (True, TypeError, "num_slots must be an integer, got bool"),
    (2.0, TypeError, "num_slots must be an integer, got float"),
])
def test_shared_memory_num_slots(num_slots, error, needle):
    with pytest.raises(error, match=needle) as e:
        tw.SharedMemoryTransport(spec(), spec(), num_slots=num_slots)
    one_line(e)


@pytest.mark.parametrize("make", [
    lambda name: tw.SharedMemoryTransport(spec(), spec(), num_slots=1, name=name),
    lambda name: tw.SocketTransport(name=name),
])
def test_a_transport_name_must_be_a_str_or_none(make):
    with pytest.raises(TypeError, match="name must be a str or None, got int") as e:
        make(42)
    one_line(e)


@pytest.mark.parametrize("call", [
    lambda: tw.SharedMemoryTransport.attach(42),
    lambda: tw.SharedMemoryTransport.client_for(None),
    lambda: tw.SocketTransport.client_for(b"name"),
])
def test_an_attach_name_must_be_a_str(call):
    with pytest.raises(TypeError, match="name must be a str, got") as e:
        call()
    one_line(e)


@pytest.mark.parametrize("value, error, needle", [
    ([-1], ValueError, "allowed_uids entry must be a uid from 0 to 4294967294, got -1"),
    ([1 << 32], ValueError, "allowed_uids entry must be a uid"),
    (["x"], TypeError, "allowed_uids entry must be an integer, got str"),
    (5, TypeError, "allowed_uids must be an iterable of integers, got int"),
    ("123", TypeError, "allowed_uids must be an iterable of integers, got str"),
])
@pytest.mark.parametrize("kind", ["socket", "shared_memory"])
def test_allowed_uids(kind, value, error, needle):
    with pytest.raises(error, match=needle) as e:
        if kind == "socket":
            tw.SocketTransport(allowed_uids=value)
        else:
            tw.SharedMemoryTransport(spec(), spec(), num_slots=1, allowed_uids=value)
    one_line(e)


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(max_batch_size=0), ValueError, r"max_batch_size must be in \[1, 16777216\], got 0"),
    (dict(max_batch_size=-1), ValueError, r"max_batch_size must be in \[1, 16777216\], got -1"),
    # "No limit" said as sys.maxsize: refused here, not by an allocation on the serving
    # thread (which ended the process).
    (dict(max_batch_size=sys.maxsize), ValueError,
     r"max_batch_size must be in \[1, 16777216\], got 9223372036854775807"),
    (dict(max_batch_size="8"), TypeError, "max_batch_size must be an integer, got str"),
    (dict(timeout="0.1"), TypeError, "timeout must be a number of seconds, got str"),
    (dict(timeout=None), TypeError, "timeout must be a number of seconds, got NoneType"),
    (dict(timeout=-1), ValueError, "timeout"),
    (dict(policy_version="1"), TypeError, "policy_version must be an integer, got str"),
    (dict(policy_version=2 ** 70), ValueError, "policy_version does not fit in 64 bits"),
    (dict(min_batch_size=0), ValueError, r"min_batch_size must be in \[1, max_batch_size=64\], got 0"),
    (dict(min_batch_size=1.5), TypeError, "min_batch_size must be an integer, got float"),
    (dict(min_transport_share=-0.1), ValueError, r"min_transport_share must be in \[0, 1\], got -0.1$"),
    (dict(min_transport_share=1.5), ValueError, r"min_transport_share must be in \[0, 1\], got 1.5$"),
    (dict(min_transport_share=float("nan")), ValueError, r"min_transport_share must be in \[0, 1\], got nan$"),
    (dict(min_transport_share="0.3"), TypeError, "min_transport_share must be a number, got str"),
    (dict(min_transport_share=None), TypeError, "min_transport_share must be a number, got NoneType"),
    (dict(stats_window_size=0), ValueError, "stats_window_size must be at least 1, got 0"),
    (dict(stats_window_size=None), TypeError, "stats_window_size must be an integer, got NoneType"),
    (dict(policy_version_key=""), ValueError, "policy_version_key must be a key of non-empty names"),
    (dict(policy_version_key=("meta", "")), ValueError, r"non-empty names .*\('meta', ''\)"),
])
def test_server_counts(kwargs, error, needle):
    transport = tw.ThreadTransport()
    with pytest.raises(error, match=needle) as e:
        tw.InferenceServer(lambda td: td, transport, **kwargs)
    one_line(e)


def test_update_model_needs_a_callable():
    server = tw.InferenceServer(lambda td: td, tw.ThreadTransport())
    with pytest.raises(TypeError, match=r"update_model: fn must be callable as fn\(policy\), got int"):
        server.update_model(5)
    server.close()


def test_clients_makes_that_many_and_names_a_bad_count():
    transport = tw.ThreadTransport()
    clients = transport.clients(3)
    assert len(clients) == 3 and all(isinstance(c, tw.inference.InferenceClient) for c in clients)
    with pytest.raises(ValueError, match="num_clients must be at least 1, got 0") as e:
        transport.clients(0)
    one_line(e)
    with pytest.raises(TypeError, match="num_clients must be an integer, got str") as e:
        transport.clients("2")
    one_line(e)
