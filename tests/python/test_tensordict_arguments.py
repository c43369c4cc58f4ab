"""TensorDict arguments taken as tensordict takes them; bad ones named in one line."""
import copy
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

import tensorwire as tw


def make():
    return tw.TensorDict({"a": np.arange(8, dtype=np.float32).reshape(4, 2), "n": {"b": np.arange(4)},
                          "s": "hi", "st": tw.NonTensorStack(["w", "x", "y", "z"])}, batch_size=[4])


@pytest.mark.parametrize("batch_size, expected", [(4, (4,)), (None, ()), ((4,), (4,)), (torch.Size([4]), (4,))])
def test_batch_size_forms(batch_size, expected):
    d = {"a": np.zeros(4)} if expected else {}
    assert tw.TensorDict(d, batch_size=batch_size).batch_size == expected


def test_torch_device_is_accepted():
    assert tw.TensorDict({}, device=torch.device("cpu")).device == "cpu"


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(batch_size="4"), TypeError, "batch_size"),
    (dict(batch_size=[1.5]), TypeError, "batch_size"),
    (dict(device=3), TypeError, "device"),
    (dict(device="tpu"), ValueError, "unknown device 'tpu'"),
])
def test_bad_construction_arguments_are_named_in_one_line(kwargs, error, needle):
    with pytest.raises(error, match=needle) as e:
        tw.TensorDict({}, **kwargs)
    assert "\n" not in str(e.value) and "incompatible" not in str(e.value)


@pytest.mark.parametrize("alignment, error", [(-8, ValueError), (0, ValueError), (3, ValueError),
                                              (1, ValueError), (4, ValueError),
                                              ("8", TypeError), (None, TypeError)])
def test_bad_alignment_is_named(tmp_path, alignment, error):
    with pytest.raises(error, match="alignment"):
        make().consolidate(alignment)
    with pytest.raises(error, match="alignment"):
        make().save(str(tmp_path / "x.td"), alignment=alignment)


def test_paths_may_be_pathlike_and_other_types_are_named(tmp_path):
    make().save(tmp_path / "x.td")
    assert tw.load(tmp_path / "x.td").equal(make())
    with pytest.raises(TypeError, match="path must be"):
        make().save(42)
    with pytest.raises(TypeError, match="path must be"):
        tw.load(None)


@pytest.mark.parametrize("array, needle", [
    (np.array(["a", "b"]), "tolist"),
    (np.array([b"a", b"b"]), "tolist"),
    (np.array([object(), object()]), "tolist"),
    (np.ones(2, dtype=">f8"), "native byte order"),
    (np.ones(2, dtype=np.longdouble), "float64"),
    (np.zeros(2, dtype=[("x", "i4"), ("y", "f4")]), "field"),
    (np.array(["2024-01-01", "2024-01-02"], dtype="datetime64[D]"), "int64"),
])
def test_unsupported_numpy_dtypes_name_the_key_the_dtype_and_what_to_do(array, needle):
    with pytest.raises(TypeError) as e:
        tw.TensorDict({"obs": array}, batch_size=[2])
    msg = str(e.value)
    assert "'obs'" in msg and str(array.dtype) in msg and needle in msg and "supported" in msg


def test_float8_tensors_are_stored():
    x = torch.ones(3, dtype=torch.float8_e4m3fn)
    td = tw.TensorDict({"x": x, "y": torch.ones(3, dtype=torch.float8_e5m2)})
    assert td.get_torch("x").dtype == torch.float8_e4m3fn
    assert td.get_torch("y").float().tolist() == [1.0, 1.0, 1.0]


def test_pickle_and_deepcopy_round_trip_also_inside_a_list():
    td = make()
    for back in (pickle.loads(pickle.dumps(td)), copy.deepcopy(td), pickle.loads(pickle.dumps([td]))[0]):
        assert back.equal(td) and back.batch_size == (4,)
        assert back["st"].tolist() == ["w", "x", "y", "z"]
    td["a"][0, 0] = 100  # a deep copy shares nothing
    assert copy.deepcopy(make())["a"][0, 0] == 0
    locked = make().lock_()
    assert pickle.loads(pickle.dumps(locked)).is_locked


def test_pickle_keeps_the_order_the_keys_were_set_in_as_tensordict():
    # The consolidated metadata groups leaves, non-tensors and sub-dicts apart.
    td = tw.TensorDict({"x": np.zeros(2), "n": {"s": "t", "q": np.ones(2), "e": {}}, "s": "str",
                        "b": np.ones(2)}, batch_size=[2])
    order = td.keys(True)
    for locked in (False, True):
        src = td.clone().lock_() if locked else td
        back = pickle.loads(pickle.dumps(src))
        assert back.keys(True) == order and back.is_locked == locked
        assert back.equal(td) and back["n", "s"] == "t" and back["n", "e"].is_empty()
    assert copy.deepcopy(td).keys(True) == order


def test_equality_is_element_wise_as_in_tensordict():
    td = make()
    eq = td == td.clone()
    assert isinstance(eq, tw.TensorDict) and eq.all()
    assert eq["a"].dtype == np.bool_ and eq["a"].shape == (4, 2)
    other = td.clone()
    other["a"][1, 1] = -1
    eq = td == other
    assert not eq.all() and eq["a"][1].tolist() == [True, False]
    assert (td != other)["a"][1].tolist() == [False, True]
    with pytest.raises(ValueError, match="ambiguous"):
        bool(td == other)


def test_slicing_follows_the_batch_dims():
    td = make()
    head = td[:2]
    assert head.batch_size == (2,) and head["a"].tolist() == [[0, 1], [2, 3]]
    assert head["n", "b"].tolist() == [0, 1] and head["s"] == "hi"
    assert head["st"].tolist() == ["w", "x"]
    odd = td[1::2]
    assert odd["a"][:, 0].tolist() == [2, 6] and odd["st"].tolist() == ["x", "z"]
    assert td[10:].batch_size == (0,)
    head["a"][0, 0] = 42  # a view, as in tensordict
    assert td["a"][0, 0] == 42
    with pytest.raises(ValueError, match="step"):
        td[::-1]


def test_methods_have_docstrings():
    for f in (tw.TensorDict.consolidate, tw.TensorDict.get_torch, tw.TensorDict.save, tw.load):
        assert f.__doc__ and len(f.__doc__.splitlines()) > 1, f


@pytest.mark.parametrize("value", ["-5", "abc", ""])
def test_a_bad_storage_cache_variable_warns_naming_it(value):
    env = dict(os.environ, TENSORWIRE_STORAGE_CACHE_MB=value)
    code = ("import warnings; warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    import tensorwire as tw\n"
            "print([str(x.message) for x in w]); print(tw.storage_cache_stats()['limit_bytes'])")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "TENSORWIRE_STORAGE_CACHE_MB" in r.stdout and repr(value)[1:-1] in r.stdout
    assert r.stdout.strip().splitlines()[-1] == str(256 << 20)


def test_a_good_storage_cache_variable_sets_the_limit_silently():
    env = dict(os.environ, TENSORWIRE_STORAGE_CACHE_MB="3")
    code = ("import warnings; warnings.simplefilter('error')\n"
            "import tensorwire as tw; print(tw.storage_cache_stats()['limit_bytes'])")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(3 << 20)
