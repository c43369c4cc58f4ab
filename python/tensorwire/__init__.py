"""tensorwire: move TensorDicts between processes and machines, fast.

The core is C++ (``tensorwire._C``); leaves come back as zero-copy numpy arrays (or torch
tensors through ``td.torch()``) over the same memory as the C++ storage.
"""
from . import _ucx_env  # noqa: F401  (first: the settings UCX reads when _C loads it)
from ._C import (ClosedError, NonTensorStack, ProtocolError, RemoteTraceback, TensorDict, load, release_storage_cache,
                 set_storage_cache_limit, stack, storage_cache_stats)
from . import _pickling  # noqa: F401  (registers how a TensorDict pickles)
from .pipe import PipeListener, TensorDictPipe, TensorDictServer
from .dataflow import (MultiProcessMapDataZMQ, MultiProcessRunnerZMQ, RemoteDataZMQ, WorkerRestartedWarning,
                       send_dataflow_zmq)
from .inference import InferenceServer, RemoteTransport, SharedMemoryTransport, SocketTransport, ThreadTransport

# The same conversions as module functions (tensorwire.from_tensordict(td)).
from_tensordict = TensorDict.from_tensordict
to_tensordict = TensorDict.to_tensordict

__all__ = [
    "TensorDict",
    "NonTensorStack",
    "ProtocolError",
    "ClosedError",
    "RemoteTraceback",
    "load",
    "stack",
    "set_storage_cache_limit", "release_storage_cache", "storage_cache_stats",
    "from_tensordict",
    "to_tensordict",
    "TensorDictPipe",
    "TensorDictServer",
    "PipeListener",
    "MultiProcessRunnerZMQ", "MultiProcessMapDataZMQ", "RemoteDataZMQ", "send_dataflow_zmq",
    "WorkerRestartedWarning",
    "InferenceServer", "SharedMemoryTransport", "SocketTransport", "ThreadTransport", "RemoteTransport",
]
__version__ = "0.1.0"
