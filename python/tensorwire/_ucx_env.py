"""UCX's settings that must be in the environment before the extension loads libucs, which
reads them as it loads. Imported first by ``tensorwire/__init__.py``; a value the user set
wins, and processes started from here inherit them (docs/pipe.md, "Process start").

``UCX_MEM_EVENTS=no``: UCX 1.22 installs its memory hooks as libucs loads, rewriting eight
functions of the process with a 50 ms wait after each (0.4 s of every ``import
tensorwire``). They feed the registration caches of RDMA transports; shared memory and TCP
register no memory. So they stay on where those caches pay or are asked for: a host with
RDMA devices, or a ``UCX_*RCACHE*`` setting (``UCX_RCACHE_ENABLE=y`` makes UCX fail to start
without them).

``UCX_MODULE_DIR``, in a wheel. A wheel carries its own UCX (``tensorwire.libs/``, placed
there by auditwheel) and UCX's transport modules (``tensorwire.libs/ucx/``). libucs looks
for a module first beside itself, then in ``UCX_MODULE_DIR``, whose default is compiled into
it (a system UCX's is ``/usr/lib/x86_64-linux-gnu/ucx`` on Debian): a module missing beside
it (InfiniBand, not bundled) must never load a *system* UCX into the process beside the
bundled one. Outside a wheel (a source tree, ``pip install .`` against the system's UCX)
there is no such directory and it is left alone.
"""
import os
from typing import Mapping

RDMA_DEVICES = "/sys/class/infiniband"


def memory_events_off(environ: Mapping[str, str], rdma_devices: str = RDMA_DEVICES) -> bool:
    """Whether to turn UCX's memory events off: nobody chose, and no registration cache is
    asked for or would pay (no RDMA device on this host)."""
    if "UCX_MEM_EVENTS" in environ or any(k.startswith("UCX_") and "RCACHE" in k for k in environ):
        return False
    try:
        return not os.listdir(rdma_devices)
    except OSError:
        return True


if memory_events_off(os.environ):
    os.environ["UCX_MEM_EVENTS"] = "no"

UCX_MODULE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tensorwire.libs",
                              "ucx")
if os.path.isdir(UCX_MODULE_DIR):
    os.environ.setdefault("UCX_MODULE_DIR", UCX_MODULE_DIR)
