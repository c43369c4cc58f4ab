"""What the native libraries bundled in a wheel need before the extension loads them.

A wheel carries its own UCX (``tensorwire.libs/``, placed there by auditwheel) and UCX's
transport modules (``tensorwire.libs/ucx/``). libucs looks for a module first beside itself,
then in ``UCX_MODULE_DIR``, whose default is compiled into it (a system UCX's is
``/usr/lib/x86_64-linux-gnu/ucx`` on Debian): a module missing beside it (InfiniBand, not
bundled) must never load a *system* UCX into the process beside the bundled one. libucs reads ``UCX_MODULE_DIR`` when it is loaded, so it is
set here, before ``tensorwire._C`` is imported; a value the user set wins. Outside a wheel
(a source tree, ``pip install .`` against the system's UCX) there is no such directory and
nothing is set.
"""
import os

UCX_MODULE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tensorwire.libs",
                              "ucx")
if os.path.isdir(UCX_MODULE_DIR):
    os.environ.setdefault("UCX_MODULE_DIR", UCX_MODULE_DIR)
