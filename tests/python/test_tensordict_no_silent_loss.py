"""What a TensorDict holds comes back exactly, or is refused where it is set."""
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
