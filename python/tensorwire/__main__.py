"""``python -m tensorwire`` and the ``tensorwire`` console command: run the native command.

The command is C++ (tools/); a wheel ships it inside the package (``tensorwire/_bin``), next
to the libraries it was repaired against. A source tree after ``make build`` has it in
``build/tools``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def command_path() -> str:
    """The path of the native ``tensorwire`` executable of this installation."""
    here = Path(__file__).resolve().parent
    candidates = [
        here / "_bin" / "tensorwire",  # a wheel, or `pip install .`
        here.parent.parent / "build" / "tools" / "tensorwire",  # the source tree (editable install)
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise SystemExit("tensorwire: the native command is not part of this installation (looked in "
                     + ", ".join(str(c) for c in candidates) + "); reinstall the wheel, or run "
                     "`make build` in the source tree")


def main() -> None:
    """Replace this process with the native command, passing the arguments through."""
    path = command_path()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, ["tensorwire", *sys.argv[1:]])


if __name__ == "__main__":
    main()
