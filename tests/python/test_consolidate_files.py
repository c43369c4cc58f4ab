"""consolidate(), save() and load(), and interoperability with tensordict's format."""
import json
import os

import numpy as np
import pytest
import torch
from tensordict import NonTensorStack as TDNonTensorStack
from tensordict import TensorDict as TDTensorDict

import tensorwire as tw


def reference_td():
    return TDTensorDict(
        {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
         "b": {"c": torch.tensor([True, False, True])},
         "s": "hi"},
        batch_size=[3],
    )


def test_metadata_matches_tensordict_consolidate_exactly():
    ref = reference_td().consolidate()
    ours = tw.TensorDict.from_tensordict(reference_td()).consolidate()
    assert ours.metadata == json.loads(json.dumps(ref._consolidated["metadata"]))
    assert ours.storage.nbytes == ref._consolidated["storage"].numel() == 56
    assert bytes(ours.storage) == ref._consolidated["storage"].numpy().tobytes()


def test_consolidated_leaves_are_views_into_one_aligned_storage():
    td = tw.TensorDict({"x": np.ones(3, np.uint8), "y": np.ones(3, np.float64)}, batch_size=[3])
    c = td.consolidate()
    base = c.storage.ctypes.data
    assert c["x"].ctypes.data == base
    assert c["y"].ctypes.data == base + 8  # 3 bytes + 5 padding
    assert bytes(c.storage[3:8]) == b"\0" * 5
    c16 = td.consolidate(alignment=16)
    assert c16["y"].ctypes.data - c16.storage.ctypes.data == 16
    assert c.is_consolidated() and not td.is_consolidated()


def test_tensordict_file_loads_in_tensorwire(tmp_path):
    path = str(tmp_path / "ref.td")
    ref = reference_td()
    ref["st"] = TDNonTensorStack("x", "y", "z")
    ref.consolidate(filename=path)
    ours = tw.load(path)
    assert ours.batch_size == (3,)
    np.testing.assert_array_equal(ours["a"], ref["a"].numpy())
    np.testing.assert_array_equal(ours["b", "c"], ref["b", "c"].numpy())
    assert ours["s"] == "hi"
    assert ours["st"].tolist() == ["x", "y", "z"]


def test_tensorwire_file_loads_in_tensordict(tmp_path):
    path = str(tmp_path / "ours.td")
    td = tw.TensorDict.from_tensordict(reference_td())
    td["st"] = tw.NonTensorStack(["p", "q", "r"])
    td["h"] = np.ones((3, 2), np.float16)
    td.save(path)
    back = TDTensorDict.from_consolidated(path)
    ref = reference_td()
    assert torch.equal(back["a"], ref["a"]) and torch.equal(back["b", "c"], ref["b", "c"])
    assert back["s"] == "hi"
    assert list(back["st"]) == ["p", "q", "r"]
    assert back["h"].dtype == torch.float16


def _stacked_along_dim_1():
    """A tensordict.TensorDict of batch [2, 3] whose non-tensor stack "s" was stacked along
    dim 1: s[i, j] is f"r{i}c{j}"."""
    from tensordict import NonTensorData
    cols = []
    for j in range(3):
        col = TDTensorDict({"x": torch.zeros(2)}, [2])
        col["s"] = TDNonTensorStack(*(NonTensorData(f"r{i}c{j}") for i in range(2)))
        cols.append(col)
    return torch.stack(cols, dim=1)


GRID = [[f"r{i}c{j}" for j in range(3)] for i in range(2)]


def test_a_stack_along_a_later_dim_is_read_and_written_as_tensordict_lays_it_out(tmp_path):
    # tensordict's metadata lists such a stack's elements along its stack_dim; they were
    # read (and written) as if along dim 0: the values came back transposed, both ways.
    ref = _stacked_along_dim_1()
    assert ref.get("s").stack_dim == 1 and ref.get("s").tolist() == GRID
    ref.consolidate(filename=str(tmp_path / "ref.td"))
    ours = tw.load(str(tmp_path / "ref.td"))
    assert ours["s"].tolist() == GRID and ours["s"].stack_dim == 1
    ours.save(str(tmp_path / "ours.td"))
    back = TDTensorDict.from_consolidated(str(tmp_path / "ours.td"))
    assert back.get("s").tolist() == GRID and back[0, 1]["s"] == "r0c1"
    assert tw.load(str(tmp_path / "ours.td"))["s"].tolist() == GRID


def test_load_memory_maps_without_copy_and_save_is_atomic(tmp_path):
    path = str(tmp_path / "m.td")
    big = np.arange(1 << 20, dtype=np.uint8)
    tw.TensorDict({"big": big}).save(path)
    assert sorted(os.listdir(tmp_path)) == ["m.td"]  # no temporary left behind
    td = tw.load(path)
    assert td["big"][12345] == big[12345]
    # Map is private: writes through the view never reach the file.
    td["big"][0] = 200
    assert tw.load(path)["big"][0] == 0


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:5], "truncated"),
    (lambda b: b[:-8] + (10**9).to_bytes(8, "little"), "larger than the file"),
    (lambda b: b[:-20] + b"}" * 12 + b[-8:], "malformed JSON"),
])
def test_corrupt_files_raise_a_clear_runtime_error(tmp_path, damage, message):
    path = str(tmp_path / "bad.td")
    tw.TensorDict({"x": np.zeros(4, np.float32)}).save(path)
    data = open(path, "rb").read()
    open(path, "wb").write(damage(data))
    with pytest.raises(RuntimeError, match=message):
        tw.load(path)
    assert issubclass(tw.ProtocolError, RuntimeError)


def test_leaf_past_end_of_storage_is_rejected(tmp_path):
    path = str(tmp_path / "bad.td")
    meta = {"cls": "TensorDict", "non_tensors": {}, "leaves": {"x": ["torch.float32", [1000], 0, 4000, 0]},
            "cls_metadata": {"device": None, "names": [], "batch_size": [], "is_locked": False}}
    js = json.dumps(meta).encode()
    open(path, "wb").write(b"\0" * 16 + js + len(js).to_bytes(8, "little"))
    with pytest.raises(RuntimeError, match=r"'x'.*past the storage"):
        tw.load(path)


def test_from_and_to_tensordict_share_memory_and_keep_structure():
    ref = reference_td()
    ours = tw.TensorDict.from_tensordict(ref)
    ref["a"][0, 0] = 99
    assert ours["a"][0, 0] == 99
    back = ours.to_tensordict()
    assert isinstance(back, TDTensorDict)
    assert back["b"].batch_size == torch.Size([3])
    assert back["s"] == "hi"
    back["a"][1, 1] = -5
    assert ref["a"][1, 1] == -5  # same memory all the way round
