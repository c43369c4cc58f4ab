"""Local endpoints admit only their own user. Abstract Unix sockets (the socket and
shared-memory transports) and ZeroMQ ipc endpoints (the runners) carry no file permissions,
so each checks its peer's uid: a process of another user is refused with a PermissionError
naming its uid before any byte or fd is handed over, the endpoint counts the refusal, and
allowed_uids admits more. The other user is a forked child that setuid()s to nobody."""
import os
import time

import numpy as np
import pytest

import tensorwire as tw
from _inference_common import double_policy, make_shm, observation
from conftest import NOBODY, as_user

pytestmark = pytest.mark.timeout(120)


def call(make_client):
    return lambda: float(make_client()(observation(1), timeout=10)["action"][0])


@pytest.mark.parametrize("kind", ["socket", "shared_memory"])
def test_a_client_of_another_user_is_refused_on_both_sides(kind):
    t = tw.SocketTransport() if kind == "socket" else make_shm(4)
    client_for = tw.SocketTransport.client_for if kind == "socket" else tw.SharedMemoryTransport.client_for
    with tw.InferenceServer(double_policy, t):
        kind_, message = as_user(NOBODY, call(lambda: client_for(t.name)))
        assert kind_ == "PermissionError", (kind_, message)
        assert f"uid {NOBODY}" in message and "allowed_uids" in message, message
        assert t.refused == 1 and f"uid {NOBODY}" in t.last_refusal, t.last_refusal
        # The owner's own user is served as before.
        assert float(t.client()(observation(2), timeout=10)["action"][0]) == 4.0


@pytest.mark.parametrize("kind", ["socket", "shared_memory"])
def test_allowed_uids_admits_another_user(kind):
    t = (tw.SocketTransport(allowed_uids=[NOBODY]) if kind == "socket"
         else make_shm(4, allowed_uids=[NOBODY]))
    client_for = tw.SocketTransport.client_for if kind == "socket" else tw.SharedMemoryTransport.client_for
    with tw.InferenceServer(double_policy, t):
        assert as_user(NOBODY, call(lambda: client_for(t.name))) == ("ok", "2.0")
        assert t.refused == 0


def test_a_client_refuses_a_server_of_another_user():
    # A name can be squatted: a client talks only to its own user's (or root's) server.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            t = tw.SocketTransport(name=f"tensorwire-squatted-{os.getppid()}")
            server = tw.InferenceServer(double_policy, t).start()
            os.write(w, b"ready")
            time.sleep(60)  # the parent kills it
        finally:
            os._exit(0)
    try:
        os.close(w)
        assert os.read(r, 5) == b"ready"
        client = tw.SocketTransport.client_for(f"tensorwire-squatted-{os.getpid()}")
        with pytest.raises(PermissionError, match=f"uid {NOBODY}"):
            client(observation(1), timeout=10)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)


@pytest.mark.parametrize("value", [[-1], ["x"], 5])
def test_bad_allowed_uids_are_refused_by_name(value):
    with pytest.raises((TypeError, ValueError), match="allowed_uids"):
        tw.SocketTransport(allowed_uids=value)


def push(endpoint, payload):
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 2000)
    s.connect(endpoint)
    s.send(payload)
    s.close()  # lingers: the message goes out if the connection is admitted
    ctx.term()
    return "sent"


def test_an_ipc_endpoint_admits_only_its_user():
    endpoint = f"ipc://@tensorwire-local-access-{os.getpid()}"
    remote = tw.RemoteDataZMQ(endpoint, errors="raise")
    remote.reset_state()
    try:
        assert as_user(NOBODY, lambda: push(endpoint, b"not a datapoint")) == ("ok", "'sent'")
        assert remote.recv(timeout=1) is None  # the other user's connection was closed unread
        assert remote.rejected == 0
        push(endpoint, b"not a datapoint")  # this user's bytes arrive (and are rejected)
        with pytest.raises(tw.ProtocolError):
            remote.recv(timeout=10)
    finally:
        remote.close()
