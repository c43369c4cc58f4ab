"""tensorwire.TensorDict from Python: construction, access, mutation, structure."""
import numpy as np
import pytest
import torch

import tensorwire as tw


def make():
    return tw.TensorDict(
        {
            "obs": np.arange(12, dtype=np.float32).reshape(3, 4),
            "info": {"reward": np.zeros((3, 1), dtype=np.float64)},
            "name": "cartpole",
        },
        batch_size=[3],
    )


def test_construction_from_nested_dicts_of_numpy_torch_scalars_and_strings():
    td = tw.TensorDict(
        {"a": np.ones((2, 3), np.int32), "b": torch.zeros(2, dtype=torch.bfloat16),
         "c": {"d": torch.arange(2)}, "s": "hi", "none": None},
        batch_size=[2],
    )
    assert td.batch_size == (2,)
    assert td["a"].dtype == np.int32 and td["a"].shape == (2, 3)
    assert td["b"].dtype == torch.bfloat16  # numpy has no bfloat16: comes back as torch
    assert isinstance(td["c"], tw.TensorDict) and td["c"].batch_size == (2,)
    assert td["c", "d"].tolist() == [0, 1]
    assert td["s"] == "hi" and td["none"] is None


def test_python_numbers_become_0dim_tensors_typed_like_torch():
    td = tw.TensorDict({"i": 3, "f": 2.5, "b": True, "l": [1.0, 2.0]})
    assert td["i"].dtype == np.int64 and td["i"].shape == ()
    assert td["f"].dtype == np.float32
    assert td["b"].dtype == np.bool_
    assert td["l"].dtype == np.float32 and td["l"].shape == (2,)


def test_nested_key_tuples_get_and_set_and_create_intermediate_dicts():
    td = make()
    td["next", "obs"] = np.ones((3, 4), np.float32)
    assert ("next", "obs") in td
    assert td["next"].batch_size == (3,)
    assert td.keys(include_nested=True, leaves_only=True) == ["obs", ("info", "reward"), "name", ("next", "obs")]
    assert td.keys() == ["obs", "info", "name", "next"]


def test_set_rejects_leaf_whose_leading_dims_differ_from_batch_size():
    td = make()
    with pytest.raises(ValueError, match=r"'bad'.*\[4\].*batch_size \[3\]"):
        td["bad"] = np.zeros(4)


def test_unknown_key_raises_keyerror_and_bad_key_type_raises_typeerror():
    td = make()
    with pytest.raises(KeyError, match="missing"):
        td["missing"]
    with pytest.raises(KeyError):
        td["info", "missing"]
    with pytest.raises(TypeError):
        td[1.5]
    with pytest.raises(TypeError, match="not a TensorDict"):
        td["obs", "x"] = np.zeros(3)


def test_non_json_non_tensor_value_is_rejected_with_valueerror():
    td = make()
    with pytest.raises((TypeError, ValueError)):
        td["obj"] = object()
    with pytest.raises(ValueError, match="JSON"):
        td["obj"] = ["a", object()]


def test_cuda_flagged_torch_tensor_is_rejected():
    class FakeCuda:  # a torch-like object claiming to live on a GPU
        dtype = torch.float32
        is_cuda = True

        class device:
            type = "cuda"

    with pytest.raises(ValueError, match="cuda"):
        tw.TensorDict()["x"] = FakeCuda()


def test_leaves_are_zero_copy_numpy_views_shared_with_torch():
    td = make()
    a = td["obs"]
    a[0, 0] = 42.0  # write through numpy
    t = td.get_torch("obs")
    assert t[0, 0].item() == 42.0  # read through torch
    t[2, 3] = -1.0  # write through torch
    assert td["obs"][2, 3] == -1.0  # read through numpy
    assert td.torch()["obs"].data_ptr() == td["obs"].ctypes.data


def test_input_arrays_and_tensors_are_wrapped_without_copy():
    x = np.zeros((2, 2), np.float32)
    y = torch.zeros(2, 3)
    td = tw.TensorDict({"x": x, "y": y}, batch_size=[2])
    x[1, 1] = 5
    y[0, 2] = 7
    assert td["x"][1, 1] == 5 and td["y"][0, 2] == 7


def test_strided_inputs_are_viewed_and_copied_correctly_on_clone():
    base = np.arange(24, dtype=np.int64).reshape(4, 6)
    view = base[:, ::2]
    td = tw.TensorDict({"v": view}, batch_size=[4])
    np.testing.assert_array_equal(td["v"], view)
    c = td.clone()
    np.testing.assert_array_equal(c["v"], view)
    assert c["v"].flags["C_CONTIGUOUS"]


def test_readonly_arrays_are_copied_so_inplace_writes_are_safe():
    ro = np.frombuffer(b"\x01\x02\x03\x04", dtype=np.uint8)
    td = tw.TensorDict({"r": ro}, batch_size=[4])
    td.update_({"r": np.zeros(4, np.uint8)})
    assert ro.tolist() == [1, 2, 3, 4]
    assert td["r"].tolist() == [0, 0, 0, 0]


def test_clone_is_independent():
    td = make()
    c = td.clone()
    c["obs"][0, 0] = 100
    assert td["obs"][0, 0] == 0


def test_update_copies_in_place_and_raises_for_unknown_key_without_partial_write():
    td = make()
    before = td["obs"]
    td.update_({"obs": np.full((3, 4), 9, np.float32)})
    assert before[0, 0] == 9  # same memory, written in place
    with pytest.raises(KeyError, match="nope"):
        td.update_({"obs": np.full((3, 4), 1, np.float32), "nope": np.zeros(3)})
    assert td["obs"][0, 0] == 9  # nothing written when any key fails
    with pytest.raises(ValueError):
        td.update_({"obs": np.zeros((3, 5), np.float32)})


def test_update_broadcasts_and_casts_as_tensordict():
    td = make()
    td["count"] = np.zeros((3, 2), np.int64)
    td["half"] = torch.zeros(3, 5, dtype=torch.float16)
    td["bf"] = torch.zeros(3, 5, dtype=torch.bfloat16)
    td.update_({"obs": np.arange(4), "info": {"reward": 0.5}, "count": [1.9, -1.9]})
    assert td["obs"].dtype == np.float32 and td["obs"][2].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert td["info", "reward"].dtype == np.float64 and (td["info", "reward"] == 0.5).all()
    assert td["count"].tolist() == [[1, -1]] * 3
    # Every float16 / bfloat16 rounding as torch's: subnormals, halfway cases, overflow, NaN.
    values = torch.tensor([1e-7, 6e-8, 3e-8, 2.98e-8, 65519.0, 65520.0, 1e5, -1e39, float("nan"),
                           float("inf"), 1 / 3, 1.00048828125, 1.0009765625, -0.0, 3.4e38, 1e-41],
                          dtype=torch.float64)
    for i in range(0, len(values), 5):
        chunk = values[i:i + 5]
        chunk = torch.cat([chunk, chunk.new_zeros(5 - len(chunk))])
        td.update_({"half": chunk.numpy(), "bf": chunk.numpy()})
        for key, dt in (("half", torch.float16), ("bf", torch.bfloat16)):
            got = td.get_torch(key)[0].view(torch.int16)
            assert got.tolist() == chunk.to(dt).view(torch.int16).tolist(), (key, chunk)


def test_update_refuses_what_does_not_broadcast_or_cast_and_writes_nothing():
    td = make()
    td["count"] = np.zeros(3, np.int32)
    for bad, match in (({"obs": np.zeros(3, np.float32)}, r"'obs'.*\[3\].*\[3, 4\]"),
                       ({"count": np.array([1.0, np.nan, 2.0])}, r"'count'.*nan.*torch.int32"),
                       ({"count": 1e10}, r"'count'.*torch.int32"),
                       ({"obs": np.zeros((3, 4), np.complex64)}, "complex64 to torch.float32")):
        with pytest.raises(ValueError, match=match):
            td.update_({"info": {"reward": np.ones((3, 1))}, **bad})
        assert (td["info", "reward"] == 0).all() and (td["obs"] == make()["obs"]).all()


def test_select_strict_and_non_strict():
    td = make()
    s = td.select("obs", ("info", "reward"))
    assert s.keys(True, True) == ["obs", ("info", "reward")]
    with pytest.raises(KeyError):
        td.select("obs", "missing")
    assert td.select("obs", "missing", strict=False).keys() == ["obs"]


def test_stack_and_unbind_round_trip_with_non_tensors():
    a, b = make(), make()
    b["obs"][:] = 1
    b["name"] = "other"
    s = tw.stack([a, b])
    assert s.batch_size == (2, 3)
    assert s["obs"].shape == (2, 3, 4)
    assert isinstance(s["name"], tw.NonTensorStack)
    assert s["name"].tolist() == [["cartpole"] * 3, ["other"] * 3]
    parts = s.unbind(0)
    assert parts[0].equal(a) and parts[1].equal(b), parts[1].difference(b)
    assert s[1]["name"] == "other"  # identical values collapse back to one value
    with pytest.raises(ValueError, match="batch_size"):
        tw.stack([make(), tw.TensorDict({"obs": np.zeros((2, 4), np.float32)}, batch_size=[2])])


def test_delete_contains_keys():
    td = make()
    assert list(td.keys()) == ["obs", "info", "name"]
    del td["name"]
    assert "name" not in td and list(td.keys()) == ["obs", "info"]
    with pytest.raises(KeyError):
        del td["name"]


def test_len_and_iteration_follow_the_first_batch_dim_as_in_tensordict():
    td = make()
    assert len(td) == 3
    rows = list(td)
    assert len(rows) == 3 and all(isinstance(r, tw.TensorDict) and r.batch_size == () for r in rows)
    assert rows[2]["obs"].tolist() == [8.0, 9.0, 10.0, 11.0] and rows[2]["name"] == "cartpole"
    rows[0]["obs"][0] = -1  # rows view the dict's storage, as unbind(0)
    assert td["obs"][0, 0] == -1
    scalar = tw.TensorDict({"x": np.zeros(3)})
    assert len(scalar) == 0
    with pytest.raises(TypeError, match="no batch dimension"):
        iter(scalar)
    assert len(tw.TensorDict({}, batch_size=[0])) == 0 and list(tw.TensorDict({}, batch_size=[0])) == []


def test_truth_value_is_refused_and_is_empty_counts_leaves():
    with pytest.raises(ValueError, match="truth value"):
        bool(make())
    with pytest.raises(ValueError, match="truth value"):
        if tw.TensorDict({}):
            pass
    assert not make().is_empty()
    assert tw.TensorDict({}).is_empty() and tw.TensorDict({"a": {"b": {}}}).is_empty()
    assert not tw.TensorDict({"a": {"s": "text"}}).is_empty()


def test_a_tensordict_source_takes_the_batch_size_and_device_given_as_tensordict():
    src = make()
    assert tw.TensorDict(src).batch_size == ()  # none given: no batch dims, as tensordict
    same = tw.TensorDict(src, batch_size=[3])
    assert same.batch_size == (3,) and same.equal(src)
    same["obs"][0, 0] = 42  # the entries are shared, not copied
    assert src["obs"][0, 0] == 42
    assert tw.TensorDict(src, batch_size=[3], names=["t"]).names == ["t"]
    with pytest.raises(ValueError, match="batch dimension mismatch.*'obs'"):
        tw.TensorDict(src, batch_size=[2])
    with pytest.raises(ValueError, match="batch dimension mismatch"):
        tw.TensorDict(src, batch_size=[3, 4])
    assert tw.TensorDict(src, batch_size=[3], device="cpu").device == "cpu"


def test_locked_consolidated_dict_refuses_new_keys_but_allows_update_():
    c = make().consolidate()
    assert c.is_locked
    with pytest.raises(RuntimeError, match="locked"):
        c["new"] = np.zeros(3)
    c.update_({"obs": np.ones((3, 4), np.float32)})
    assert c["obs"].sum() == 12


def test_storage_cache_reuses_a_released_large_storage_and_honours_its_limit():
    saved = tw.storage_cache_stats()["limit_bytes"]
    try:
        tw.release_storage_cache()
        tw.set_storage_cache_limit(32 << 20)
        td = tw.TensorDict({"a": np.arange(1 << 20, dtype=np.float32)})  # 4 MiB
        first = td.consolidate()
        address = first["a"].__array_interface__["data"][0]
        del first
        assert tw.storage_cache_stats()["cached_blocks"] == 1
        hits = tw.storage_cache_stats()["hits"]
        second = td.consolidate()
        assert second["a"].__array_interface__["data"][0] == address
        assert tw.storage_cache_stats()["hits"] == hits + 1
        np.testing.assert_array_equal(second["a"], td["a"])
        del second
        tw.set_storage_cache_limit(0)  # shrinking empties it
        assert tw.storage_cache_stats()["cached_bytes"] == 0
        with pytest.raises(ValueError, match="nbytes must be >= 0"):
            tw.set_storage_cache_limit(-1)
    finally:
        tw.set_storage_cache_limit(saved)


class _DeletesSubWhenConverted:
    """An array-like whose conversion (its __dlpack__, as a torch tensor's runs Python code)
    drops the sub-dict `td["sub"]` and refills the dict."""

    def __init__(self, td):
        self.td, self.a = td, np.arange(3.0)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, *args, **kwargs):
        del self.td["sub"]
        for i in range(50):
            self.td[f"k{i}"] = {"a": np.zeros(3)}
        return self.a.__dlpack__(*args, **kwargs)


@pytest.mark.parametrize("how", ["setitem", "update_"])
def test_a_nested_view_written_while_its_dict_is_dropped_does_not_touch_freed_memory(how):
    # The view held the sub-dict across the value's conversion: a segfault (use after free).
    td = tw.TensorDict({"sub": {"a": np.zeros(3)}}, batch_size=[3])
    sub = td["sub"]
    with pytest.raises(KeyError, match="sub"):
        if how == "setitem":
            sub["x"] = _DeletesSubWhenConverted(td)
        else:
            sub.update_({"a": _DeletesSubWhenConverted(td)})
    assert "sub" not in td and td["k0", "a"].tolist() == [0.0, 0.0, 0.0]


class _Finalized(np.ndarray):
    """An array whose finalizer looks at (and adds to) `_Finalized.td`."""

    td, seen = None, None

    def __del__(self):
        _Finalized.seen = _Finalized.td.keys()
        _Finalized.td["z"] = np.zeros(3)


@pytest.mark.parametrize("how", ["del", "replace"])
def test_code_run_by_releasing_a_leaf_sees_the_dict_whole(how):
    # erase() released the entry while the entries were half shifted: the finalizer saw a
    # key named '' and the key it added was lost.
    td = tw.TensorDict({}, batch_size=[3])
    _Finalized.td = td
    a = np.zeros(3).view(_Finalized)
    td["a"] = a
    del a
    td["b"] = np.ones(3)
    if how == "del":
        del td["a"]
        assert _Finalized.seen == ["b"] and td.keys() == ["b", "z"]
    else:
        td["a"] = np.full(3, 2.0)
        assert _Finalized.seen == ["a", "b"] and td.keys() == ["a", "b", "z"]
        assert td["a"].tolist() == [2.0, 2.0, 2.0]


def test_set_of_a_nested_key_builds_a_dict_with_its_parents_batch_size():
    td = tw.TensorDict({"sub": tw.TensorDict({}, batch_size=[3, 2])}, batch_size=[3])
    td.set(("sub", "d"), {"x": np.zeros((3, 2))})  # was built with the root's [3]: ValueError
    assert td["sub", "d"].batch_size == (3, 2)


def test_an_index_out_of_range_is_an_indexerror():
    td = tw.TensorDict({"x": np.arange(3)}, batch_size=[3])
    with pytest.raises(IndexError, match="index 3 is out of range for batch dimension 0 of size 3"):
        td[3]
    with pytest.raises(IndexError):
        td[-4]
    assert int(td[-1]["x"]) == 2


def test_comparing_dicts_of_other_keys_or_batch_sizes_is_an_error_not_a_broadcast():
    a = tw.TensorDict({"x": np.arange(3)}, batch_size=[3])
    b = tw.TensorDict({"x": np.arange(3), "y": np.arange(3)}, batch_size=[3])
    with pytest.raises(KeyError, match="'y'.* right-hand TensorDict only"):
        a == b  # was all True: the extra key ignored
    c = tw.TensorDict({"x": np.zeros((3, 4))}, batch_size=[3])
    d = tw.TensorDict({"x": np.zeros((1, 4))}, batch_size=[1])
    with pytest.raises(ValueError, match=r"batch sizes \[3\] and \[1\]"):
        c == d  # was broadcast to a (3, 4) leaf
    assert (a == a).all()


def test_all_takes_minus_zero_for_zero():
    assert not tw.TensorDict({"x": np.array([-0.0])}, batch_size=[1]).all()
    assert tw.TensorDict({"x": np.array([-2.0])}, batch_size=[1]).all()
