"""What a TensorDict holds comes back exactly, or is refused where it is set."""
import json
import os
import pickle

import numpy as np
import pytest

import tensorwire as tw


def test_keys_with_a_nul_character_stay_distinct_everywhere(tmp_path):
    td = tw.TensorDict({"a\x00b": np.ones(3), "a": np.zeros(3), "d\x00": {"x\x00": "v\x00w"}})
    assert list(td.keys()) == ["a\x00b", "a", "d\x00"]
    c = td.consolidate()
    assert list(c.keys()) == ["a\x00b", "a", "d\x00"]
    assert list(c.metadata["leaves"]) == ["a\x00b", "a"]
    td.save(str(tmp_path / "x.td"))
    back = tw.load(str(tmp_path / "x.td"))
    assert back["a\x00b"].tolist() == [1, 1, 1] and back["a"].tolist() == [0, 0, 0]
    assert back["d\x00", "x\x00"] == "v\x00w"
    assert list(back.torch()) == ["a\x00b", "a", "d\x00"]


def nested(levels):
    d = {"x": np.ones(1)}
    for _ in range(levels):
        d = {"n": d}
    return tw.TensorDict(d)


def test_what_consolidate_and_save_accept_load_reads_back(tmp_path):
    for levels in (100, 256):
        path = str(tmp_path / f"{levels}.td")
        nested(levels).save(path)
        assert tw.load(path).equal(nested(levels))


@pytest.mark.parametrize("levels", [257, 5000])
def test_nesting_past_the_limit_is_refused_by_consolidate_and_save(tmp_path, levels):
    td = nested(levels)
    with pytest.raises(ValueError, match="limit of 256.*max_depth"):
        td.consolidate()
    with pytest.raises(ValueError, match="limit of 256"):
        td.save(str(tmp_path / "deep.td"))
    assert not (tmp_path / "deep.td").exists()


def test_invalid_utf8_in_a_saved_file_is_a_protocol_error(tmp_path):
    path = tmp_path / "bad.td"
    meta = b'{"cls": "TensorDict", "\xff": 1}'
    path.write_bytes(meta + len(meta).to_bytes(8, "little"))
    with pytest.raises(tw.ProtocolError, match="malformed JSON"):
        tw.load(str(path))


def test_metadata_followed_by_a_nul_is_rejected(tmp_path):
    path = tmp_path / "nul.td"
    tw.TensorDict({"a": np.ones(2)}).save(str(path))
    data = path.read_bytes()
    n = int.from_bytes(data[-8:], "little")
    meta = data[-8 - n:-8] + b"\x00garbage"
    path.write_bytes(data[:-8 - n] + meta + len(meta).to_bytes(8, "little"))
    with pytest.raises(tw.ProtocolError, match="NUL byte"):
        tw.load(str(path))


def deep_list(levels):
    v = 1
    for _ in range(levels):
        v = [v]
    return v


def write_file(path, metadata):
    meta = json.dumps(metadata).encode()
    path.write_bytes(meta + len(meta).to_bytes(8, "little"))


def metadata_with_value(value):
    return {"cls": "TensorDict", "leaves": {}, "cls_metadata": {"batch_size": []},
            "non_tensors": {"v": [value, [], None]}}


def test_a_received_value_deeper_than_the_limit_is_refused_where_it_is_read(tmp_path):
    # A value at the limit is read back and can be saved again; one level more is refused
    # by load (received bytes), naming the limit, as save refuses to write it.
    at_limit, past = tmp_path / "at.td", tmp_path / "past.td"
    write_file(at_limit, metadata_with_value(deep_list(256)))
    back = tw.load(str(at_limit))
    assert back["v"] == deep_list(256)
    back.save(str(tmp_path / "again.td"))
    write_file(past, metadata_with_value(deep_list(257)))
    with pytest.raises(tw.ProtocolError, match=r"'v'.*more than 256 levels deep.*max_depth"):
        tw.load(str(past))


class _CraftedPickle:
    """Pickles as the bytes a TensorDict's pickle carries, with metadata of our choosing:
    what an untrusted pickle could hold."""

    def __init__(self, metadata):
        self.metadata = metadata

    def __reduce__(self):
        import tensorwire._pickling
        return tensorwire._pickling._rebuild, (b"", self.metadata, False)


def test_an_unpickled_value_deeper_than_the_limit_is_refused():
    td = pickle.loads(pickle.dumps(_CraftedPickle(metadata_with_value(deep_list(256)))))
    assert td["v"] == deep_list(256)
    crafted = pickle.dumps(_CraftedPickle(metadata_with_value(deep_list(257))))
    with pytest.raises(tw.ProtocolError, match="more than 256 levels deep"):
        pickle.loads(crafted)


# ---- numbers, torch views, overlapping updates, concurrent use (found by a review) -----

@pytest.mark.parametrize("value", [2**63, 2**64 - 1, 2**70, -(2**63) - 1, [1, 2**63], [[0], [2**70]]])
def test_an_int_that_int64_cannot_hold_is_refused_not_wrapped(value):
    # Before: 2**63 became -2**63 and 2**64 - 1 became -1 (a wrapping cast); 2**70 crashed.
    td = tw.TensorDict()
    with pytest.raises(ValueError, match="does not fit int64"):
        td["x"] = value
    assert "x" not in td


def test_python_numbers_follow_torch_and_numpy_scalars_keep_their_dtype():
    td = tw.TensorDict({"f": 0.1, "i": 2**63 - 1, "b": True, "n": np.float64(1e300),
                        "l": [1.5, 2], "n32": np.float32(0.5)})
    assert td["f"].dtype == np.float32 and td["i"] == 2**63 - 1 and td["b"].dtype == np.bool_
    assert td["n"].dtype == np.float64 and td["n"] == 1e300  # was float32 inf
    assert td["l"].dtype == np.float32 and td["n32"].dtype == np.float32


def test_torch_conjugate_and_negative_views_are_stored_with_their_values():
    import torch
    x = torch.tensor([1 + 2j, 3 + 4j])
    td = tw.TensorDict({"c": x.conj(), "n": x.conj().imag})
    np.testing.assert_array_equal(td["c"], x.conj().resolve_conj().numpy())  # was x
    np.testing.assert_array_equal(td["n"], [-2.0, -4.0])  # was [2, 4]
    import tensordict
    back = tw.TensorDict.from_tensordict(tensordict.TensorDict({"c": x.conj()}, batch_size=[]))
    np.testing.assert_array_equal(back["c"], [1 - 2j, 3 - 4j])


@pytest.mark.parametrize("device", ["cpu", "torch.device"])
def test_a_tensordict_with_a_device_keeps_it(device):
    # td.device is a torch.device: converting it once failed with std::bad_cast.
    import torch
    import tensordict
    dev = torch.device("cpu") if device == "torch.device" else "cpu"
    td = tensordict.TensorDict({"x": torch.arange(3.0)}, batch_size=[3], device=dev)
    for source in (td, td.consolidate()):
        tw_td = tw.TensorDict.from_tensordict(source)
        assert tw_td.device == "cpu" and tw_td["x"].tolist() == [0.0, 1.0, 2.0]
        assert tw_td.to_tensordict().device == torch.device("cpu")


def test_64_bit_integer_leaves_come_back_as_numpys_own_int64_and_uint64():
    # nanobind exports them as longlong ('q'), equal to int64 but another type.
    td = tw.TensorDict({"i": np.arange(3), "u": np.arange(3, dtype=np.uint64)})
    assert td["i"].dtype.type is np.int64 and isinstance(td["i"][0], np.int64)
    assert td["u"].dtype.type is np.uint64 and isinstance(td["u"][0], np.uint64)
    td["i"][0] = 7  # still a writable view of the leaf
    assert td["i"].tolist() == [7, 1, 2]


def test_update_from_a_view_of_the_same_memory_reads_it_whole_first():
    a = np.arange(8.0)
    td = tw.TensorDict({"a": a, "m": np.arange(9.0).reshape(3, 3)})
    td.update_({"a": a[::-1]})
    np.testing.assert_array_equal(td["a"], [7, 6, 5, 4, 3, 2, 1, 0])  # was [7 6 5 4 4 5 6 7]
    m = td["m"]
    td.update_({"m": m.T})
    np.testing.assert_array_equal(td["m"], np.arange(9.0).reshape(3, 3).T)  # was unchanged


def test_saves_to_one_path_from_two_threads_leave_one_whole_file(tmp_path):
    # Both wrote the same temporary file (path.tmp.<pid>): a mix of the two, a rename of a
    # file the other had removed, or an error.
    import threading

    path = str(tmp_path / "td.bin")
    big = tw.TensorDict({"x": np.full(1 << 20, 2.0, np.float32)})
    small = tw.TensorDict({"x": np.full(1 << 18, 1.0, np.float32)})
    errors = []

    def save(td):
        try:
            for _ in range(10):
                td.save(path)
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            errors.append(e)

    threads = [threading.Thread(target=save, args=(td,)) for td in (big, small)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    x = tw.load(path)["x"]
    assert (x == x[0]).all() and ((x[0] == 2.0 and len(x) == 1 << 20) or (x[0] == 1.0 and len(x) == 1 << 18))
    assert [p.name for p in tmp_path.iterdir()] == ["td.bin"]  # no temporary left
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


_MUTATED_WHILE_COPIED = """
import threading, numpy as np, tensorwire as tw, os
td = tw.TensorDict({f"k{i}": np.ones(200_000, np.float32) for i in range(20)})
stop = False
def mutate():
    i = 0
    while not stop:
        td[f"n{i}"] = np.ones(10, np.float32)
        if i % 50 == 49:
            for j in range(i - 49, i + 1):
                del td[f"n{j}"]
        i += 1
t = threading.Thread(target=mutate)
t.start()
try:
    for n in range(300):
        td.clone()
        td.consolidate()
        td.update_(tw.TensorDict({"k0": np.zeros(200_000, np.float32)}))
        if n % 30 == 0:
            td.save(os.path.join(TMP, "td.bin"))
finally:
    stop = True
    t.join()
print("survived")
"""


def test_a_dict_changed_by_another_thread_while_it_is_copied_or_saved_does_not_crash(tmp_path):
    # clone, consolidate, save and update_ release the GIL: they read the dict's entries,
    # which another thread could reallocate meanwhile (a segfault in Tensor::clone).
    import subprocess
    import sys
    from conftest import PYTHONPATH

    out = subprocess.run([sys.executable, "-c", _MUTATED_WHILE_COPIED.replace("TMP", repr(str(tmp_path)))],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=PYTHONPATH))
    assert out.returncode == 0 and "survived" in out.stdout, (out.returncode, out.stderr[-2000:])
