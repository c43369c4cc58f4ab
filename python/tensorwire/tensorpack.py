"""Drop-in replacements for tensorpack's parallel dataflows.

    # from tensorpack.dataflow import MultiProcessRunnerZMQ, MultiProcessMapDataZMQ
    from tensorwire.tensorpack import MultiProcessRunnerZMQ, MultiProcessMapDataZMQ

Same constructors, same iteration semantics, same datapoint structure (a list stays a
list, arrays come back as numpy arrays), so tensorpack DataFlows work unchanged; the
tensor bytes travel through shared memory instead of being pickled, a dead worker is
reported instead of hanging, and workers never outlive the main process. When tensorpack
is installed the classes are also tensorpack ``DataFlow`` subclasses, so tensorpack code
that checks ``isinstance(ds, DataFlow)`` (``BatchData``, ``QueueInput``...) accepts them.

tensorpack is not a dependency of tensorwire: this module works without it.
"""
from __future__ import annotations

from . import dataflow as _df

try:  # the base classes only: importing tensorpack.dataflow does not need TensorFlow
    from tensorpack.dataflow.base import DataFlow as _TensorpackDataFlow
    from tensorpack.dataflow.base import DataFlowTerminated
    from tensorpack.dataflow.base import ProxyDataFlow as _TensorpackProxyDataFlow
except Exception:  # tensorpack not installed
    _TensorpackDataFlow = _TensorpackProxyDataFlow = _df.DataFlow

    class DataFlowTerminated(BaseException):  # type: ignore[no-redef]  # tensorpack's, when it is there
        """tensorpack's: the dataflow cannot produce more data."""


__all__ = [
    "MultiProcessRunnerZMQ",
    "PrefetchDataZMQ",
    "MultiProcessMapDataZMQ",
    "MultiProcessMapData",
    "send_dataflow_zmq",
    "RemoteDataZMQ",
    "DataFlowTerminated",
]


class _TensorpackReset:
    """tensorpack asserts on a second reset_state(); so does the drop-in."""

    _reset_done = False

    def reset_state(self):
        assert not self._reset_done, "reset_state() was called twice! This violates the API of DataFlow!"
        self._reset_done = True
        super().reset_state()  # type: ignore[misc]  # a mixin: the next class in the MRO has it


class MultiProcessRunnerZMQ(_TensorpackReset, _df.MultiProcessRunnerZMQ, _TensorpackDataFlow):
    __doc__ = _df.MultiProcessRunnerZMQ.__doc__

    def __init__(self, ds, num_proc=1, hwm=50, **kwargs):
        _df.MultiProcessRunnerZMQ.__init__(self, ds, num_proc, hwm, **kwargs)


PrefetchDataZMQ = MultiProcessRunnerZMQ


# A ProxyDataFlow (of `ds`), as tensorpack's; its own methods come first in the MRO.
class MultiProcessMapDataZMQ(_TensorpackReset, _df.MultiProcessMapDataZMQ, _TensorpackProxyDataFlow):
    __doc__ = _df.MultiProcessMapDataZMQ.__doc__

    def __init__(self, ds, num_proc=None, map_func=None, *, buffer_size=200, strict=False, **kwargs):
        if num_proc is None or map_func is None:
            raise TypeError("MultiProcessMapDataZMQ(ds, num_proc, map_func, ...) needs num_proc and map_func")
        _df.MultiProcessMapDataZMQ.__init__(self, ds, num_proc, map_func, buffer_size=buffer_size,
                                            strict=strict, **kwargs)


MultiProcessMapData = MultiProcessMapDataZMQ


class RemoteDataZMQ(_df.RemoteDataZMQ, _TensorpackDataFlow):
    __doc__ = _df.RemoteDataZMQ.__doc__

    def __init__(self, addr1, addr2=None, hwm=50, bind=True, **kwargs):
        _df.RemoteDataZMQ.__init__(self, addr1, addr2, hwm, bind, **kwargs)
        self._bound = False

    def reset_state(self):
        """tensorpack's may be called again (it binds in ``__iter__``): here the first call
        binds, and a later one does nothing (the counters go on). ClosedError once closed."""
        if self._bound and not self._core.closed:
            return
        super().reset_state()
        self._bound = True


send_dataflow_zmq = _df.send_dataflow_zmq
