"""tensorwire.torchrl.SharedMemoryTransport under torchrl's own InferenceServer.

Tested with torchrl 0.14.1 and tensordict 0.14.3 from PyPI (the releases that accept
torch 2.13)."""
import multiprocessing as mp
import pickle
import threading
import time

import pytest

pytestmark = pytest.mark.timeout(120)

import torch
import tensordict
import torchrl  # noqa: F401

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl.modules.inference_server import InferenceServer, InferenceTransport  # noqa: E402

from tensorwire.torchrl import SharedMemoryTransport  # noqa: E402


def specs(with_version=True):
    req = TensorDict({"observation": torch.zeros(4)})
    resp = {"action": torch.zeros(2)}
    if with_version:
        resp["policy_version"] = torch.zeros((), dtype=torch.long)
    return req, TensorDict(resp)


def sum_policy():
    lin = torch.nn.Linear(4, 2)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.zero_()
    return TensorDictModule(lin, in_keys=["observation"], out_keys=["action"])


def torchrl_actor(client, base, q):
    out = []
    for i in range(50):
        r = client(TensorDict({"observation": torch.full((4,), float(base + i))}), timeout=30)
        out.append(r["action"].tolist() == [4.0 * (base + i)] * 2)
    q.put(all(out))


def test_it_is_a_torchrl_inference_transport():
    assert isinstance(SharedMemoryTransport(*specs(), num_slots=2), InferenceTransport)


def test_torchrls_server_serves_through_it():
    t = SharedMemoryTransport(*specs(), num_slots=4)
    with InferenceServer(sum_policy(), t, max_batch_size=4) as server:
        r = t.client()(TensorDict({"observation": torch.ones(4)}), timeout=10)
        assert isinstance(r, TensorDict)
        assert r["action"].tolist() == [4.0, 4.0]
        assert int(r["policy_version"]) == 0
        server.update_model(lambda m: None)
        assert int(t.client()(TensorDict({"observation": torch.ones(4)}), timeout=10)["policy_version"]) == 1
        f = t.submit(TensorDict({"observation": torch.ones(4)}))
        assert f.result(timeout=10)["action"].tolist() == [4.0, 4.0]
        assert server.stats()["requests"] == 3


def test_clients_are_numbered_as_torchrls_and_keep_their_number_when_pickled():
    t = SharedMemoryTransport(*specs(), num_slots=4)
    clients = [t.client() for _ in range(3)]
    assert [c.client_id for c in clients] == [0, 1, 2]
    again = pickle.loads(pickle.dumps(clients[1]))
    assert again.client_id == 1
    with InferenceServer(sum_policy(), t, max_batch_size=4):
        assert again(TensorDict({"observation": torch.ones(4)}), timeout=10)["action"].tolist() == [4.0] * 2


def test_copy_result_false_gives_a_locked_view_of_the_slot_as_torchrl():
    t = SharedMemoryTransport(*specs(), num_slots=2, copy_result=False)
    with InferenceServer(sum_policy(), t, max_batch_size=2):
        c = t.client()
        r = c(TensorDict({"observation": torch.ones(4)}), timeout=10)
        assert r.is_locked and r["action"].tolist() == [4.0, 4.0]
        with pytest.raises(RuntimeError):
            r["extra"] = torch.zeros(2)  # the slot's keys are the bank's
        copied = SharedMemoryTransport(*specs(), num_slots=2)
    with InferenceServer(sum_policy(), copied, max_batch_size=2):
        assert not copied.client()(TensorDict({"observation": torch.ones(4)}), timeout=10).is_locked


def test_a_timeout_is_torchrls_queue_empty_and_a_timeout_error():
    import queue
    from tensorwire.torchrl import RequestTimeout
    t = SharedMemoryTransport(*specs(), num_slots=1)
    c = t.client()
    with pytest.raises(queue.Empty):  # no server: torchrl's client raises queue.Empty
        c(TensorDict({"observation": torch.ones(4)}), timeout=0.1)
    f = t.client().submit(TensorDict({"observation": torch.ones(4)}))
    with pytest.raises(TimeoutError) as raised:
        f.result(timeout=0.05)
    assert isinstance(raised.value, RequestTimeout) and "no response within" in str(raised.value)
    with pytest.raises(RequestTimeout):  # the one slot is held by f: no free slot in time
        c.submit(TensorDict({"observation": torch.ones(4)}), timeout=0.05)
    with InferenceServer(sum_policy(), t, max_batch_size=1):
        assert f.result(timeout=10)["action"].tolist() == [4.0, 4.0]  # still in flight


def test_specs_and_requests_with_a_device_are_served():
    # What env.reset() and env.fake_tensordict() give: dicts with device="cpu".
    req = TensorDict({"observation": torch.zeros(4)}, device="cpu")
    resp = TensorDict({"action": torch.zeros(2)}, device="cpu")
    t = SharedMemoryTransport(req, resp, num_slots=2)
    with InferenceServer(sum_policy(), t, max_batch_size=2):
        obs = TensorDict({"observation": torch.ones(4)}, device="cpu")
        assert t.client()(obs, timeout=10)["action"].tolist() == [4.0, 4.0]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_actors_in_child_processes(method):
    ctx = mp.get_context(method)
    t = SharedMemoryTransport(*specs(), num_slots=4)
    with InferenceServer(sum_policy(), t, max_batch_size=4) as server:
        q = ctx.Queue()
        procs = [ctx.Process(target=torchrl_actor, args=(t.client(), 100 * k, q)) for k in range(3)]
        for p in procs:
            p.start()
        assert [q.get(timeout=60) for _ in procs] == [True] * 3
        for p in procs:
            p.join(10)
        assert server.stats()["requests"] == 150


class PolicyFailed(Exception):
    pass


@pytest.mark.parametrize("raised", [ValueError, PolicyFailed])
def test_a_policy_exception_reaches_the_client_with_its_type(raised):
    def failing(td):
        raise raised("bad observation")

    t = SharedMemoryTransport(*specs(), num_slots=2)
    with InferenceServer(failing, t):
        with pytest.raises(raised, match="bad observation"):
            t.client()(TensorDict({"observation": torch.ones(4)}), timeout=10)


def test_undeclared_keys_are_dropped_and_a_missing_declared_key_fails():
    t = SharedMemoryTransport(*specs(with_version=False), num_slots=2)
    with InferenceServer(sum_policy(), t):
        r = t.client()(TensorDict({"observation": torch.ones(4), "extra": torch.zeros(3)}), timeout=10)
        assert set(r.keys()) == {"action"}
        # A sub-dict where the spec has a leaf names the key (it was an AttributeError from
        # the conversion reading a TensorDict's device, None, as a tensor's).
        with pytest.raises(ValueError, match="request key 'observation': expected a tensor, got a TensorDict"):
            t.client()(TensorDict({"observation": {"a": torch.ones(4)}}), timeout=10)

    def wrong(td):
        return td.set("act", torch.zeros(td.batch_size[0], 2))

    t = SharedMemoryTransport(*specs(with_version=False), num_slots=2)
    with InferenceServer(wrong, t):
        with pytest.raises(KeyError, match="action"):
            t.client()(TensorDict({"observation": torch.ones(4)}), timeout=10)


def test_a_response_of_another_dtype_is_cast_to_the_spec_like_torchrl():
    # torchrl copies each response into place with update_, which casts; the drop-in failed
    # every request instead ("expected float32[2], got float64[2]").
    double = TensorDictModule(lambda obs: obs[..., :2].double() * 2, in_keys=["observation"],
                              out_keys=["action"])
    t = SharedMemoryTransport(*specs(with_version=False), num_slots=4)
    with InferenceServer(double, t, max_batch_size=4):
        r = t.client()(TensorDict({"observation": torch.ones(4)}), timeout=10)
        assert r["action"].dtype == torch.float32 and r["action"].tolist() == [2.0, 2.0]
        # A bfloat16 spec (a torch leaf in the transport's spec, numpy has no bfloat16).
        bf16 = SharedMemoryTransport(specs(False)[0], TensorDict({"action": torch.zeros(
            2, dtype=torch.bfloat16)}), num_slots=2)
        assert bf16._response_layout == {"action": (torch.bfloat16, (2,))}


def test_a_response_leaf_is_broadcast_to_the_spec_or_fails_the_batch_like_torchrl():
    t = SharedMemoryTransport(*specs(with_version=False), num_slots=2)
    one = lambda td: td.set("action", torch.full((td.shape[0], 1), 5.0))  # noqa: E731
    with InferenceServer(one, t, max_batch_size=2):
        assert t.client()(TensorDict({"observation": torch.ones(4)}), timeout=10)["action"].tolist() == [5.0, 5.0]
    t = SharedMemoryTransport(*specs(with_version=False), num_slots=2)
    three = lambda td: td.set("action", torch.ones(td.shape[0], 3))  # noqa: E731
    with InferenceServer(three, t, max_batch_size=2):
        with pytest.raises(RuntimeError, match="expanded size"):
            t.client()(TensorDict({"observation": torch.ones(4)}), timeout=10)


def test_a_request_leaf_is_cast_and_broadcast_to_the_spec_like_torchrl():
    # torchrl copies a request into its slot with update_ (cast, broadcast); code written for
    # it sends float64 observations (numpy environments) and (1,)-shaped leaves.
    req = TensorDict({"observation": torch.zeros(4), "n": {"v": torch.zeros(2, dtype=torch.int64)}})
    t = SharedMemoryTransport(req, specs(False)[1], num_slots=4)
    policy = lambda td: td.set("action", td["observation"][..., :2] + td["n", "v"].float())  # noqa: E731
    with InferenceServer(policy, t, max_batch_size=4):
        c = t.client()
        f64 = TensorDict({"observation": torch.ones(4, dtype=torch.float64), "n": {"v": torch.ones(2)}})
        assert c(f64, timeout=10)["action"].tolist() == [2.0, 2.0]
        assert f64["observation"].dtype == torch.float64  # the caller's dict is left as it was
        one = TensorDict({"observation": torch.full((1,), 3.0), "n": {"v": torch.ones(2, dtype=torch.int64)}})
        assert c.submit(one).result(timeout=10)["action"].tolist() == [4.0, 4.0]
        again = pickle.loads(pickle.dumps(c))  # a pickled client learns the spec again
        assert again(f64, timeout=10)["action"].tolist() == [2.0, 2.0]
        by_name = SharedMemoryTransport.client_for(t.name)  # as client()'s, with no number
        assert by_name.client_id is None and by_name(f64, timeout=10)["action"].tolist() == [2.0, 2.0]
        assert t.submit(f64).result(timeout=10)["action"].tolist() == [2.0, 2.0]  # the transport's
        # A request of batch size [1] whose leaves broadcast, as torchrl answers it.
        bs1 = TensorDict({"observation": torch.ones(1), "n": {"v": torch.ones(1, dtype=torch.int64)}},
                         batch_size=[1])
        assert c(bs1, timeout=10)["action"].tolist() == [2.0, 2.0]
        # A refusal that is not the spec's stays what it was (no connection, no resend).
        for bad in (-1.0, float("nan")):
            with pytest.raises(ValueError, match="timeout must be None"):
                SharedMemoryTransport.client_for("tw-no-such-transport")(f64, timeout=bad)
        # What does not broadcast is torch's RuntimeError, as torchrl's; a missing key stays
        # a KeyError.
        with pytest.raises(RuntimeError, match="expanded size"):
            c(TensorDict({"observation": torch.ones(5), "n": {"v": torch.ones(2)}}), timeout=10)
        with pytest.raises(KeyError):
            c(TensorDict({"observation": torch.ones(4, dtype=torch.float64)}), timeout=10)


def test_shutdown_fails_pending_requests_like_torchrl():
    started, gate = threading.Event(), threading.Event()

    def slow(td):
        started.set()
        gate.wait(10)
        return sum_policy()(td)

    t = SharedMemoryTransport(*specs(), num_slots=4)
    server = InferenceServer(slow, t, max_batch_size=1).start()
    c = t.client()
    running = c.submit(TensorDict({"observation": torch.ones(4)}))
    assert started.wait(10)
    queued = c.submit(TensorDict({"observation": torch.ones(4)}))
    stopper = threading.Thread(target=server.shutdown)
    stopper.start()
    time.sleep(0.05)
    gate.set()
    stopper.join(10)
    assert running.result(timeout=10)["action"].tolist() == [4.0, 4.0]
    with pytest.raises(RuntimeError, match="InferenceServer is shutting down"):
        queued.result(timeout=10)


def test_torchrls_process_backend_is_refused_with_a_clear_error():
    # Its server side serves only in the process that made it; torchrl would pickle it.
    t = SharedMemoryTransport(*specs(), num_slots=2)
    with pytest.raises(TypeError, match="serves from the process that created it"):
        with InferenceServer(transport=t, policy_factory=sum_policy, service_backend="process"):
            pass
    t.close()


def test_the_dropin_has_a_repr_with_state_and_closes():
    t = SharedMemoryTransport(*specs(), num_slots=2)
    assert repr(t) == f"<tensorwire.torchrl.SharedMemoryTransport {t.name!r} open>"
    c = t.client()
    t.close()
    assert repr(t).endswith("closed>")
    import tensorwire as tw
    with pytest.raises(tw.ClosedError):
        c(TensorDict({"observation": torch.ones(4)}), timeout=5)


# ---- tensorwire.torchrl.RemoteTransport: the same under torchrl's server, over UCX ------

def test_torchrls_server_serves_remote_actors_unchanged():
    from tensorwire.torchrl import RemoteTransport

    t = RemoteTransport(*specs(), num_slots=4, host="127.0.0.1", auth_key="k")
    assert isinstance(t, InferenceTransport)
    with InferenceServer(sum_policy(), t, max_batch_size=4) as server:
        r = t.client()(TensorDict({"observation": torch.ones(4)}), timeout=10)
        assert isinstance(r, TensorDict) and r["action"].tolist() == [4.0, 4.0]
        # client_for takes connect's arguments; its client casts as client()'s does.
        by_address = RemoteTransport.client_for(t.address, auth_key="k", timeout=5, liveness_timeout=3)
        f64 = TensorDict({"observation": torch.ones(4, dtype=torch.float64)})
        assert by_address.client_id is None and by_address(f64, timeout=10)["action"].tolist() == [4.0, 4.0]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        # Clients pickle to their address (and key) and connect again in the child.
        procs = [ctx.Process(target=torchrl_actor, args=(RemoteTransport.client_for(
            t.address, auth_key="k"), 100 * k, q)) for k in range(2)]
        for p in procs:
            p.start()
        assert [q.get(timeout=60) for _ in procs] == [True] * 2
        for p in procs:
            p.join(10)
        assert server.stats()["requests"] == 102

    def failing(td):
        raise ValueError("bad observation")

    t = RemoteTransport(*specs(), num_slots=2, host="127.0.0.1")
    with InferenceServer(failing, t):
        with pytest.raises(ValueError, match="bad observation"):
            t.client()(TensorDict({"observation": torch.ones(4)}), timeout=10)


# ---- a batch that fails after some of its requests were answered ---------------------

def _drain(t, n):
    items, callbacks = [], []
    deadline = time.monotonic() + 10
    while len(callbacks) < n and time.monotonic() < deadline:
        t.wait_for_work(0.5)
        more_items, more_callbacks = t.drain(n - len(callbacks))
        items += more_items
        callbacks += more_callbacks
    assert len(callbacks) == n
    return items, callbacks


def _answer(value):
    return TensorDict({"action": torch.full((2,), value), "policy_version": torch.tensor(3)})


@pytest.mark.parametrize("kind", ["shared_memory", "remote"])
def test_a_request_answered_before_its_batch_failed_keeps_its_answer(kind):
    # torchrl's server answers a batch one callback at a time and, when one of those calls
    # raises, fails every callback of the batch: the ones answered already must keep their
    # answer and give their slot back once (not twice, which would hand it to two clients).
    from tensorwire.torchrl import RemoteTransport

    t = (SharedMemoryTransport(*specs(), num_slots=2) if kind == "shared_memory"
         else RemoteTransport(*specs(), num_slots=2, host="127.0.0.1"))
    c = t.client()
    first = c.submit(TensorDict({"observation": torch.full((4,), 1.0)}))
    second = c.submit(TensorDict({"observation": torch.full((4,), 2.0)}))
    items, callbacks = _drain(t, 2)
    if float(items[0]["observation"][0]) != 1.0:
        callbacks.reverse()
    t.resolve(callbacks[0], _answer(7.0))
    t.resolve(callbacks[0], _answer(-1.0))  # a second answer is not written
    for cb in callbacks:
        t.resolve_exception(cb, ValueError("the batch failed"))
    assert first.result(timeout=10)["action"].tolist() == [7.0, 7.0]
    with pytest.raises(ValueError, match="the batch failed"):
        second.result(timeout=10)
    deadline = time.monotonic() + 10
    while t._tw.slots_in_use and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t._tw.slots_in_use == 0
    # Both slots serve again, each to one request.
    clients = [t.client() for _ in range(2)]
    with InferenceServer(sum_policy(), t, max_batch_size=2):
        for round_ in range(20):
            futures = [cl.submit(TensorDict({"observation": torch.full((4,), float(round_ + k))}))
                       for k, cl in enumerate(clients)]
            assert [f.result(timeout=10)["action"].tolist() for f in futures] == [
                [4.0 * (round_ + k)] * 2 for k in range(2)]
    assert t._tw.slots_in_use == 0
