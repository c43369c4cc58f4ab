"""What a TensorDict holds comes back exactly, or is refused where it is set."""
import json
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
