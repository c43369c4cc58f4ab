"""Conversion to and from tensordict.TensorDict without copying leaf data.

tensordict is not a runtime dependency: it is imported only when these are called.
"""
from __future__ import annotations

from ._C import NonTensorStack, TensorDict


def from_tensordict(td) -> TensorDict:
    """A tensorwire TensorDict over the same leaf memory as ``td`` (a tensordict.TensorDict).

    Nesting, batch size, names and non-tensor entries are kept. CPU leaves only.
    """
    import tensordict

    if not isinstance(td, tensordict.TensorDictBase):
        raise TypeError(f"from_tensordict: expected a tensordict.TensorDict, got {type(td).__name__}")
    names = list(td.names) if td._has_names() else None
    out = TensorDict(batch_size=tuple(td.batch_size),
                     device=str(td.device) if td.device is not None else None, names=names)
    for key in td.keys():
        out[key] = _value_from_tensordict(td, key)
    return out


def _value_from_tensordict(td, key):
    import tensordict

    value = td._get_str(key, None)
    if isinstance(value, tensordict.NonTensorStack):
        return NonTensorStack(value.tolist(), batch_size=list(value.batch_size),
                              stack_dim=getattr(value, "stack_dim", 0))
    if isinstance(value, tensordict.NonTensorData):
        return value.data
    if isinstance(value, tensordict.TensorDictBase):
        return from_tensordict(value)
    return value


def to_tensordict(self: TensorDict):
    """A tensordict.TensorDict whose torch leaves share memory with this TensorDict."""
    import tensordict

    out = tensordict.TensorDict({}, batch_size=self.batch_size, device=self.device,
                                names=self.names if any(n is not None for n in self.names) else None)
    for key in self.keys():
        value = self[key]
        if isinstance(value, TensorDict):
            out[key] = to_tensordict(value)
        elif isinstance(value, NonTensorStack):
            out[key] = _non_tensor_stack(value)
        elif hasattr(value, "__array_interface__") or hasattr(value, "__dlpack__"):
            out[key] = self.get_torch(key)
        else:
            out[key] = tensordict.NonTensorData(value, batch_size=self.batch_size)
    return out


def _non_tensor_stack(st: NonTensorStack):
    import tensordict

    def build(values, dims):
        if len(dims) == 1:
            return tensordict.NonTensorStack(*[tensordict.NonTensorData(v) for v in values])
        return tensordict.NonTensorStack(*[build(v, dims[1:]) for v in values])

    return build(st.tolist(), list(st.batch_size))
