"""The wheel as a user gets it.

Run by `make test-wheel` (scripts/test-wheel.sh) with the interpreter of a virtual
environment that holds the built wheel and its `test` extra and nothing of the source tree.
The build machine has the UCX and the ZeroMQ the wheel is built against (the libucx-cu12 wheel
in the source tree's .venv, Debian's ZeroMQ); the wheel must use its own copies even so, and
must work where they cannot be reached at all: some tests hide them in a mount namespace
(tests run as root).
"""
import glob
import os
import subprocess
import sys
import sysconfig

import tensorwire as tw

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = os.path.realpath(sysconfig.get_paths()["platlib"])
PACKAGE = os.path.join(SITE, "tensorwire")
LIBS = os.path.join(SITE, "tensorwire.libs")
COMMAND = os.path.join(os.path.dirname(sys.executable), "tensorwire")
THREE_SYSTEMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "three_systems.py")

# What a manylinux system provides (glibc and the C++ runtime): the only libraries the
# extension and the command may take from the system.
BASE_SYSTEM = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2",
               "libpthread.so.0", "libdl.so.2", "librt.so.1", "libresolv.so.2", "libz.so.1", "linux-vdso.so.1"}
# The build machine's runtime packages behind the -dev packages the wheel is built against
# (libucx0: Debian's UCX, hidden too where it is installed).
BUILD_MACHINE_PACKAGES = ["libucx0", "libzmq5", "libsodium23", "libpgm-5.3-0", "libnorm1"]
# The UCX the wheel is built against: the libucx wheel of the build's .venv (cmake/UcxRoot.cmake).
BUILD_MACHINE_UCX = glob.glob(os.path.join(ROOT, ".venv", "lib", "python3*", "site-packages", "libucx", "lib"))
# A library of one of these names must be the wheel's copy, never the system's.
BUNDLED_STEMS = ("libucp", "libuct", "libucs", "libucm", "libzmq", "libsodium", "libpgm", "libnorm", "libcrypto")


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=100, **kw)


def test_tensorwire_is_the_installed_wheel_not_the_source_tree():
    assert os.path.realpath(tw.__file__) == os.path.join(PACKAGE, "__init__.py")
    source = os.path.realpath(os.path.join(ROOT, "python"))
    assert source not in [os.path.realpath(p) for p in sys.path if p]
    assert os.path.isfile(os.path.join(PACKAGE, "py.typed"))


def native_files():
    files = glob.glob(os.path.join(PACKAGE, "_C*.so")) + [os.path.join(PACKAGE, "_bin", "tensorwire")]
    files += [f for f in glob.glob(os.path.join(LIBS, "**", "*.so*"), recursive=True) if os.path.isfile(f)]
    return files


def test_every_library_of_the_extension_and_the_command_resolves_in_the_wheel_or_the_base_system():
    files = native_files()
    assert len(files) >= 4 and glob.glob(os.path.join(LIBS, "ucx", "libuct_cma*")), files
    problems = []
    for f in files:
        out = run(["ldd", f]).stdout
        for line in out.splitlines():
            name, _, where = line.strip().partition(" => ")
            path = where.split(" (")[0].strip()
            if "not found" in where:
                problems.append(f"{f}: {name} not found")
            elif path and not os.path.realpath(path).startswith(LIBS + "/") and name not in BASE_SYSTEM:
                problems.append(f"{f}: {name} => {path}")
    assert not problems, "\n".join(problems)


def judge_mapped(lines):
    libs = [line[4:] for line in lines if line.startswith("lib ")]
    wrong = [p for p in libs if os.path.basename(p).startswith(BUNDLED_STEMS) and not p.startswith(LIBS + "/")
             # the interpreter's own modules (hashlib, ssl) may map the system's libcrypto
             and not os.path.basename(p).startswith("libcrypto")]
    assert not wrong, f"system copies of bundled libraries were loaded: {wrong}"
    for bundled in ("libucp-", "libzmq-", "ucx/libuct_cma"):
        assert any(p.startswith(LIBS + "/") and bundled in p for p in libs), f"{bundled} not loaded: {libs}"


def test_the_three_systems_use_the_bundled_libraries_beside_the_systems_own():
    r = run([sys.executable, THREE_SYSTEMS])
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0] for line in r.stdout.splitlines()[:3]] == ["pipe", "inference", "runner"]
    judge_mapped(r.stdout.splitlines())


def hidden(cmd):
    """`cmd` in a mount namespace where the build machine's UCX and ZeroMQ are /dev/null."""
    files = []
    for package in BUILD_MACHINE_PACKAGES:
        listed = run(["dpkg", "-L", package]).stdout.split()
        files += [f for f in listed if ".so" in os.path.basename(f) and os.path.isfile(f)]
    for lib in BUILD_MACHINE_UCX:
        files += [f for f in glob.glob(os.path.join(lib, "**", "*.so*"), recursive=True) if os.path.isfile(f)]
    assert any("libucp" in f for f in files) and any("libzmq" in f for f in files), files
    binds = "".join(f"mount --bind /dev/null {f} && " for f in files)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", binds + 'exec "$@"', "hidden", *cmd]


def test_the_three_systems_run_where_the_build_machines_libraries_cannot_be_reached():
    [ucx] = BUILD_MACHINE_UCX
    probe = run(hidden(["sh", "-c", f"cat {ucx}/libucp.so.0 | wc -c"]))
    assert probe.stdout.split()[-1] == "0", probe  # hidden: the file reads as empty
    r = run(hidden([sys.executable, THREE_SYSTEMS]))
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0] for line in r.stdout.splitlines()[:3]] == ["pipe", "inference", "runner"]
    judge_mapped(r.stdout.splitlines())


def test_the_command_is_on_path_and_runs_the_demo_where_the_build_machines_libraries_cannot_be_reached(tmp_path):
    assert os.access(COMMAND, os.X_OK)
    r = run(hidden([COMMAND, "demo", "--dir", str(tmp_path)]))
    assert r.returncode == 0, r.stderr
    assert "round trip: equal" in r.stdout and "actors failed: 0" in r.stdout, r.stdout[-2000:]
    m = run([sys.executable, "-m", "tensorwire", "inspect", "--help"])
    assert m.returncode == 0 and "inspect" in m.stdout, m.stderr
    bad = run([COMMAND, "bench", "pipe", "--no-such-option"])
    assert bad.returncode != 0 and "--no-such-option" in bad.stderr + bad.stdout
