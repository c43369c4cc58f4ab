"""How a tensorwire.TensorDict pickles and deep-copies: as its consolidated storage bytes,
metadata and lock state, registered with copyreg (the standard way to pickle an extension
type). Unpickling validates the bytes like any untrusted input (``_C._from_consolidated``)
and copies them into memory of its own.
"""
from __future__ import annotations

import copyreg

import numpy as np

from ._C import TensorDict, _from_consolidated


def _rebuild(storage: bytes, metadata: dict, locked: bool) -> TensorDict:
    td = _from_consolidated(np.frombuffer(storage, np.uint8), metadata)  # read-only: copied
    return td if locked else td.unlock_()


def _reduce(td: TensorDict):
    c = td.consolidate()
    return _rebuild, (c.storage.tobytes(), c.metadata, td.is_locked)


copyreg.pickle(TensorDict, _reduce)
