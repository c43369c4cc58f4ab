"""UCX's settings that must be in the environment before the extension loads libucs, which
reads them as it loads. Imported first by ``tensorwire/__init__.py``; a value the user set
wins. Processes started from here inherit them.

``UCX_MEM_EVENTS=no``. UCX 1.22 installs its memory hooks as libucs loads, by rewriting the
first bytes of ``mmap``, ``munmap`` and six more functions of the process ("bistro"),
waiting 50 ms after each while it calls ``sched_yield`` in a loop: 0.4 s and a busy CPU at
every ``import tensorwire``, 100 CPU-seconds for 256 actor processes started together. The
hooks feed a registration cache that only RDMA transports use (InfiniBand: not in the
wheel); shared memory and TCP register no memory. Their other mode, through the relocation
tables, is no way out: it puts UCX's own malloc into the process, whose lock a ``fork()``
copies held (forked children of the test suite spun in it for ever). So they are off, as
they already were in forked children (docs/pipe.md, "Process start").

``UCX_MODULE_DIR``, in a wheel. A wheel carries its own UCX (``tensorwire.libs/``, placed
there by auditwheel) and UCX's transport modules (``tensorwire.libs/ucx/``). libucs looks
for a module first beside itself, then in ``UCX_MODULE_DIR``, whose default is compiled into
it (a system UCX's is ``/usr/lib/x86_64-linux-gnu/ucx`` on Debian): a module missing beside
it (InfiniBand, not bundled) must never load a *system* UCX into the process beside the
bundled one. Outside a wheel (a source tree, ``pip install .`` against the system's UCX)
there is no such directory and it is left alone.
"""
import os

os.environ.setdefault("UCX_MEM_EVENTS", "no")

UCX_MODULE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tensorwire.libs",
                              "ucx")
if os.path.isdir(UCX_MODULE_DIR):
    os.environ.setdefault("UCX_MODULE_DIR", UCX_MODULE_DIR)
