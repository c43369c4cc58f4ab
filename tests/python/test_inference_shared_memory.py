"""SharedMemoryTransport from Python: spec and request validation, slots and
back-pressure, copy_result, response validation, segment sizes."""
import threading
import time

import numpy as np
import pytest

import tensorwire as tw
from _inference_common import double_policy, make_shm, observation, request_spec, response_spec

pytestmark = pytest.mark.timeout(60)

import torch
import tensordict


# --- specs ------------------------------------------------------------------------------

def test_a_spec_with_a_non_tensor_leaf_is_a_type_error():
    spec = request_spec()
    spec["name"] = "cartpole"
    with pytest.raises(TypeError, match="tensor leaves"):
        tw.SharedMemoryTransport(spec, response_spec(), num_slots=2)


def test_a_spec_without_leaves_is_a_value_error():
    with pytest.raises(ValueError, match="at least one tensor leaf"):
        tw.SharedMemoryTransport(tw.TensorDict(), response_spec(), num_slots=2)
    with pytest.raises(ValueError, match="at least one tensor leaf"):
        tw.SharedMemoryTransport(request_spec(), tensordict.TensorDict({"nested": {}}), num_slots=2)


@pytest.mark.parametrize("num_slots", [0, -3])
def test_num_slots_below_one_is_a_value_error(num_slots):
    with pytest.raises(ValueError, match="num_slots"):
        tw.SharedMemoryTransport(request_spec(), response_spec(), num_slots=num_slots)


def test_a_spec_leaf_off_the_cpu_is_a_value_error():
    spec = tensordict.TensorDict({"observation": torch.zeros(4, device="meta")})
    with pytest.raises(ValueError):
        tw.SharedMemoryTransport(spec, response_spec(), num_slots=2)


def test_tensordict_specs_with_nesting_and_a_batch_size():
    req = tensordict.TensorDict({"obs": {"pixels": torch.zeros(3, 8, 8, 3, dtype=torch.uint8),
                                         "state": torch.zeros(3, 5)}}, batch_size=[3])
    resp = tensordict.TensorDict({"logits": torch.zeros(3, 6)}, batch_size=[3])
    t = tw.SharedMemoryTransport(req, resp, num_slots=3)
    assert t.request_keys == [("obs", "pixels"), ("obs", "state")]
    assert t.response_keys == ["logits"]

    def policy(b):  # tensordict specs: the policy gets a tensordict
        assert isinstance(b, tensordict.TensorDict) and b.batch_size == (b.batch_size[0], 3)
        out = tensordict.TensorDict({"logits": b["obs", "state"][..., :1].expand(*b.batch_size, 6) * 2},
                                    batch_size=b.batch_size)
        return out

    with tw.InferenceServer(policy, t):
        r = t.client()(req.apply(lambda x: x + 1), timeout=5)
    assert isinstance(r, tensordict.TensorDict) and r.batch_size == (3,)
    assert torch.equal(r["logits"], torch.full((3, 6), 2.0))


# --- requests ---------------------------------------------------------------------------

def test_a_missing_declared_key_is_a_key_error_naming_it_and_takes_no_slot():
    t = make_shm(2)
    c = t.client()
    with pytest.raises(KeyError, match="'observation'"):
        c.submit({"obs": np.zeros(4, np.float32)})
    with pytest.raises(KeyError, match="'observation'"):
        c(tensordict.TensorDict({"obs": torch.zeros(4)}))
    assert t.slots_in_use == 0


@pytest.mark.parametrize("value, given", [
    (np.zeros(4, np.float64), "float64[4]"),
    (np.zeros(5, np.float32), "float32[5]"),
    (torch.zeros(2, 2), "float32[2, 2]"),
])
def test_a_wrong_shape_or_dtype_is_a_value_error_naming_key_expected_and_given(value, given):
    t = make_shm(2)
    with pytest.raises(ValueError) as e:
        t.client().submit({"observation": value})
    assert str(e.value) == f"request key 'observation': expected float32[4], got {given}"
    assert t.slots_in_use == 0


def test_a_leaf_off_the_cpu_is_a_value_error():
    t = make_shm(2)
    with pytest.raises(ValueError, match="only accepts CPU tensors"):
        t.client().submit(tensordict.TensorDict({"observation": torch.zeros(4, device="meta")}))
    assert t.slots_in_use == 0


def test_extra_keys_are_dropped():
    seen = []

    def policy(b):
        seen.append(sorted(b.keys()))
        return double_policy(b)

    t = make_shm(2)
    with tw.InferenceServer(policy, t):
        r = t.client()({"observation": np.ones(4, np.float32), "extra": np.zeros(7)}, timeout=5)
    assert seen == [["observation"]]
    np.testing.assert_array_equal(r["action"], [2, 2])


def test_strided_requests_are_accepted():
    t = make_shm(2)
    with tw.InferenceServer(double_policy, t):
        r = t.client()({"observation": np.arange(8, dtype=np.float32)[::2]}, timeout=5)
    np.testing.assert_array_equal(r["action"], [0, 4])


# --- slots ------------------------------------------------------------------------------

def test_submit_blocks_while_every_slot_is_in_flight_and_times_out():
    t = make_shm(2)
    c = t.client()
    held = [c.submit(observation(i)) for i in range(2)]
    assert t.slots_in_use == 2
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        c.submit(observation(9), timeout=0.05)
    assert time.monotonic() - t0 >= 0.05
    got = []
    blocked = threading.Thread(target=lambda: got.append(c(observation(7), timeout=10)))
    blocked.start()
    time.sleep(0.05)
    assert not got  # back-pressure: waits for a slot
    with tw.InferenceServer(double_policy, t):
        for i, f in enumerate(held):
            assert float(f.result(timeout=5)["action"][0]) == 2 * i
        blocked.join(10)
    assert float(got[0]["action"][0]) == 14
    assert t.slots_in_use == 0


def test_a_slot_is_released_when_its_result_is_read_or_its_future_dropped():
    t = make_shm(4)
    c = t.client()
    f = c.submit(observation(1))
    del f  # dropped before the server took it
    assert t.slots_in_use == 0
    with tw.InferenceServer(double_policy, t):
        f = c.submit(observation(1))
        assert f.result(timeout=5) is not None
        assert t.slots_in_use == 0
        g = c.submit(observation(2))
        for _ in range(500):
            if g.done():
                break
            time.sleep(0.01)
        assert t.slots_in_use == 1  # the answer waits in its slot
        del g
        assert t.slots_in_use == 0


@pytest.mark.parametrize("copy_result", [True, False])
def test_copy_result(copy_result):
    t = make_shm(2, copy_result=copy_result)
    with tw.InferenceServer(double_policy, t):
        c = t.client()
        first = c(observation(1), timeout=5)
        second = c(observation(5), timeout=5)  # one client reuses its slot
    assert float(second["action"][0]) == 10
    assert first.is_locked == (not copy_result)  # a view's keys are the slot bank's
    # A view sees the slot's next answer; a copy keeps its own.
    assert float(first["action"][0]) == (2 if copy_result else 10)


def test_a_missing_response_key_fails_the_batch_with_key_error():
    def policy(b):
        out = tw.TensorDict(batch_size=b.batch_size)
        out["act"] = np.zeros((b.batch_size[0], 2), np.float32)
        return out

    t = make_shm(2)
    with tw.InferenceServer(policy, t):
        with pytest.raises(KeyError, match="'action'"):
            t.client()(observation(0), timeout=5)
    assert t.slots_in_use == 0


def test_a_response_of_the_wrong_shape_is_a_value_error():
    def policy(b):
        out = tw.TensorDict(batch_size=b.batch_size)
        out["action"] = np.zeros((b.batch_size[0], 3), np.float32)
        return out

    t = make_shm(2)
    with tw.InferenceServer(policy, t):
        with pytest.raises(ValueError, match=r"expected float32\[1, 2\], got float32\[1, 3\]"):
            t.client()(observation(0), timeout=5)


def test_the_policy_version_is_returned_only_when_declared():
    t = tw.SharedMemoryTransport(request_spec(), response_spec(with_version=False), num_slots=2)
    with tw.InferenceServer(double_policy, t, policy_version=7):
        r = t.client()(observation(1), timeout=5)
    assert r.keys() == ["action"]
    t = make_shm(2)
    with tw.InferenceServer(double_policy, t, policy_version=7):
        assert int(t.client()(observation(1), timeout=5)["policy_version"]) == 7


def test_the_segments_hold_two_banks_and_a_small_control_area():
    t = tw.SharedMemoryTransport({"pixels": np.zeros((84, 84, 3), np.uint8)}, response_spec(),
                                 num_slots=64)
    s = t.sizes
    assert s["requests"] == 64 * 84 * 84 * 3
    assert s["responses"] == 64 * (2 * 4 + 8)
    assert s["control"] <= 40 * 1024
    assert s["total"] == s["control"] + s["requests"] + s["responses"]


def test_attach_by_name_in_the_same_process():
    t = make_shm(2)
    with tw.InferenceServer(double_policy, t):
        other = tw.SharedMemoryTransport.attach(t.name)
        assert not other.is_owner and other.num_slots == 2
        assert other.request_keys == ["observation"]
        assert float(other.client()(observation(2), timeout=5)["action"][0]) == 4
        assert float(tw.SharedMemoryTransport.client_for(t.name)(observation(3), timeout=5)["action"][0]) == 6
        with pytest.raises(RuntimeError, match="only the process that created it"):
            tw.InferenceServer(double_policy, other).start()


def test_attaching_to_a_name_nobody_listens_on_fails():
    # As for a pipe: nothing listening is a ConnectionRefusedError naming the address.
    with pytest.raises(ConnectionRefusedError, match="tensorwire-test-nobody-listens' "
                       r"\(nothing listened under that name until the timeout"):
        tw.SharedMemoryTransport.attach("tensorwire-test-nobody-listens", timeout=0.1)


@pytest.mark.parametrize("call", ["call", "submit"])
def test_a_calls_timeout_bounds_its_first_connect(call):
    # The first call of a client connects: within the call's timeout, as in C++ (it took
    # the transport's 3 s connect timeout from Python, whatever the call's).
    c = tw.SharedMemoryTransport.client_for("tensorwire-test-nobody-listens")
    start = time.monotonic()
    with pytest.raises(ConnectionRefusedError, match="tensorwire-test-nobody-listens"):
        if call == "call":
            c(observation(1), timeout=0)
        else:
            c.submit(observation(1), timeout=0)
    assert time.monotonic() - start < 2.0


def test_a_thread_transport_client_cannot_be_pickled():
    import pickle

    with pytest.raises(TypeError, match="cannot leave its process"):
        pickle.dumps(tw.ThreadTransport().client())
    c = pickle.loads(pickle.dumps(make_shm(2).client()))
    assert c.kind == "shared_memory"
