"""Checksummed payloads: every datapoint, request, response and TensorDict of the soak
carries a CRC32 of its bytes, computed where it was made and checked where it arrives.

The bytes themselves follow from (stream tag, sequence number), so a payload delivered
intact but to the wrong place or out of order is caught too.
"""
import zlib

import numpy as np


def pattern(tag, seq, nbytes):
    """nbytes of a pattern fixed by (tag, seq): a multiplicative hash of the index."""
    base = (zlib.crc32(tag.encode()) ^ (seq * 2654435761)) & 0xFFFFFFFF
    idx = np.arange(nbytes, dtype=np.uint32)
    return ((idx * np.uint32(40503) + np.uint32(base)) >> np.uint32(7)).astype(np.uint8)


def crc(array):
    return zlib.crc32(np.ascontiguousarray(array).view(np.uint8).tobytes()) & 0xFFFFFFFF


def make(tag, seq, nbytes):
    """A datapoint / dict: {"seq": int64[1], "x": uint8[nbytes], "crc": int64[1]}."""
    x = pattern(tag, seq, nbytes)
    return {"seq": np.array([seq], np.int64), "x": x, "crc": np.array([crc(x)], np.int64)}


def check(tag, seq, got):
    """None when `got` (a mapping like make()'s) is the payload (tag, seq), else what is wrong."""
    try:
        x = np.asarray(got["x"])
        if int(np.asarray(got["seq"]).reshape(-1)[0]) != seq:
            return f"seq {int(np.asarray(got['seq']).reshape(-1)[0])} where {seq} was expected"
        if crc(x) != int(np.asarray(got["crc"]).reshape(-1)[0]):
            return f"seq {seq}: crc32 of x does not match the embedded checksum"
        if not np.array_equal(x, pattern(tag, seq, x.size)):
            return f"seq {seq}: x is not the pattern of ({tag}, {seq})"
    except (KeyError, IndexError, TypeError, ValueError) as e:
        return f"seq {seq}: malformed payload: {type(e).__name__}: {e}"
    return None
