#!/usr/bin/env python3
"""Installs this source tree's python/ into the running interpreter's environment, editable.

`make build` runs it with .venv's interpreter, so that `import tensorwire` works there with
no PYTHONPATH: the package is python/tensorwire (edits take effect at the next import) and
its extension is the one `make build` compiles into it; `tensorwire` on the venv's PATH runs
build/tools/tensorwire (python/tensorwire/__main__.py).

Why not `pip install -e .`: scikit-build-core's editable install compiles the whole library
a second time (a build of its own), and its import hook goes before sys.path, so
`PYTHONPATH=python` (how the tests and another checkout sharing the venv run) would no
longer choose which tensorwire is imported. This is the classic editable install instead: a
.pth line naming python/, which PYTHONPATH still overrides, plus the package's metadata and
console entry, packed as a small wheel that pip installs (and `pip uninstall` removes).
Nothing happens when the environment already points here.
"""
import base64
import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTH = "tensorwire-editable.pth"


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    name, version = project["name"], project["version"]
    source = os.path.join(ROOT, "python")
    installed = os.path.join(sysconfig.get_paths()["purelib"], PTH)
    if os.path.exists(installed) and open(installed).read().strip() == source:
        return
    info = f"{name}-{version}.dist-info"
    files = {
        PTH: source + "\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                            f"Summary: {project['description']}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tensorwire editable-install\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\n" +
                                    "".join(f"{k} = {v}\n" for k, v in project.get("scripts", {}).items()),
    }
    with tempfile.TemporaryDirectory() as tmp:
        wheel = os.path.join(tmp, f"{name}-{version}-0editable-py3-none-any.whl")
        with zipfile.ZipFile(wheel, "w") as z:
            record = []
            for path, text in files.items():
                z.writestr(path, text)
                record.append(record_line(path, text.encode()))
            z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                            "--force-reinstall", wheel], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"editable-install: pip install failed:\n{r.stdout}{r.stderr}")
    print(f"editable-install: {name} in {sys.prefix} is {source}")


if __name__ == "__main__":
    main()
