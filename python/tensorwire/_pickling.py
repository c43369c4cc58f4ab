"""How a tensorwire.TensorDict pickles and deep-copies: as its consolidated storage bytes,
metadata and lock state, registered with copyreg (the standard way to pickle an extension
type). Unpickling validates the bytes like any untrusted input (``_C._from_consolidated``)
and copies them into memory of its own.
"""
from __future__ import annotations

import copyreg

import numpy as np

from ._C import TensorDict, _from_consolidated


def _rebuild(storage: bytes, metadata: dict, locked: bool, order: list | None = None) -> TensorDict:
    td = _from_consolidated(np.frombuffer(storage, np.uint8), metadata)  # read-only: copied
    if order is not None and order != td.keys(True):
        # The metadata groups leaves, non-tensors and sub-dicts apart; a pickle, as
        # tensordict's, keeps the order the keys were set in. Selecting the leaves (and the
        # dicts without any) in that order rebuilds it, sharing the same storage.
        keep = [k for k in order if not isinstance(v := td.get(k), TensorDict) or v.is_empty()]
        td = td.select(*keep)
        if locked:
            td.lock_()
    return td if locked else td.unlock_()


def _reduce(td: TensorDict):
    c = td.consolidate()
    return _rebuild, (c.storage.tobytes(), c.metadata, td.is_locked, td.keys(True))


copyreg.pickle(TensorDict, _reduce)
