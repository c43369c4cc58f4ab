"""Simulated hosts for tests: Linux network namespaces joined by a switch.

    with Hosts(2) as hosts:             # or the `hosts` / `three_hosts` fixtures
        a, b = hosts
        server = a.python("...")          # a process on host a (nsenter: Host.wrap)
        client = b.popen([...])           # its kill() reaches the command itself
        hosts.cut(b)                      # b's link goes silent: no FIN, no RST
        hosts.restore(b)

Each host has its own network, IPC and pid namespaces (see Host: UCX would otherwise carry
"remote" bytes by shared memory or CMA), its loopback up and one interface, eth0, with its
own address (198.18.0.1, .2, ...: RFC 2544's range for benchmark networks, never routed;
not link-local 169.254.0.0/16, whose addresses UCX 1.22 leaves out of its TCP transport, so a
pipe between such hosts finds no route); processes of one host share them. The eth0s
are the ends of veth pairs whose other ends are ports of a bridge in a further namespace,
the switch; so any number of hosts see each other, and a link is cut at the switch (its
port set down: the host's eth0 loses its carrier, packets on either side vanish, neither
kernel sends a FIN or an RST, and the host's own address and routes stay). Nothing is added
to the machine's own network namespace, and no address is used that is not one of these
namespaces' (or loopback).

Names carry this process's pid and its pid namespace (twh<pid>i<namespace>x<n>...), so
parallel runs do not collide. close() (the context manager, the fixtures, and atexit for an
interrupted run) kills every process still running in the namespaces and deletes them; a
run that was killed outright leaves namespaces named after a pid that no longer exists, and
the next Hosts() of the same pid namespace removes those. A run in another pid namespace
(a CI job in a container beside a run on the host) cannot tell whether that pid lives, and
leaves them alone: looking its pid up in its own /proc, a run deleted the namespaces of a
live run beside it.

Tests must run as root (as `make test` does).
"""
import atexit
import itertools
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "twh"
_counter = itertools.count()
_open = set()


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _netns_list():
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_namespace():
    """This process's pid namespace (its inode number)."""
    return os.stat("/proc/self/ns/pid").st_ino


def _owner_of(name):
    """(pid, pid namespace) of the run that made namespace `name` (twh<pid>i<ns>x<n>...; an
    earlier form without the namespace gives None for it), or None when not made here."""
    if not name.startswith(PREFIX):
        return None
    owner = name[len(PREFIX):].split("x", 1)[0]
    pid, _, ns = owner.partition("i")
    if not pid.isdigit() or (ns and not ns.isdigit()):
        return None
    return int(pid), (int(ns) if ns else None)


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _kill_all_in(ns):
    """SIGKILLs every process in namespace `ns` and waits (bounded) until they are gone (a
    pid namespace's init exits only after every process of its namespace)."""
    deadline = time.monotonic() + 10
    killed = set()
    while time.monotonic() < deadline:
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        killed.update(pids)
        if not pids and all(_gone(pid) for pid in killed):
            return
        time.sleep(0.05)


def _delete(ns):
    _kill_all_in(ns)
    _ip("netns", "delete", ns, check=False)


def remove_stale():
    """Deletes namespaces left by runs of this pid namespace whose process no longer exists."""
    here = _pid_namespace()
    for ns in _netns_list():
        owner = _owner_of(ns)
        if owner is None:
            continue
        pid, pid_ns = owner
        if pid_ns not in (here, None) or pid == os.getpid():
            continue
        if not os.path.exists(f"/proc/{pid}"):
            _delete(ns)


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class HostProcess(subprocess.Popen):
    """A process started on a simulated host. nsenter forks to enter the host's pid
    namespace: this object's pid is nsenter's (which waits for the command and exits as it
    did), while signals (kill(), terminate(), send_signal()) go to the command itself."""

    def command_pid(self, timeout=10.0):
        """The command's pid (in this test's pid namespace)."""
        deadline = time.monotonic() + timeout
        while True:
            kids = _children(self.pid)
            if kids:
                return kids[0]
            if self.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.005)

    def send_signal(self, sig):
        if self.poll() is not None:
            return
        pid = self.command_pid()
        try:
            os.kill(pid if pid is not None else self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self):
        self.send_signal(9)

    def terminate(self):
        self.send_signal(15)


class Host:
    """One simulated host: its own network, IPC and pid namespaces, and its address.

    UCX reaches a peer by shared memory (sysv, posix) when it shares the IPC namespace, and
    by CMA when it shares the pid namespace; either would carry "remote" bytes past the
    link. So each host has a holder process (`unshare --ipc --pid`, inside the network
    namespace) whose child, `sleep`, is the init of the host's pid namespace; every process
    of the host is started in its namespaces by nsenter. Killing the holder kills its init
    (--kill-child), and the kernel then kills every process of the host."""

    def __init__(self, hosts, name, addr):
        self._hosts = hosts
        self.name = name  # the network namespace
        self.addr = addr  # its eth0 address, reachable from every other host
        self._holder = subprocess.Popen(
            ["ip", "netns", "exec", name, "unshare", "--ipc", "--pid", "--fork", "--kill-child",
             "--mount-proc", "sleep", "infinity"], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _children(self._holder.pid):
            if self._holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: the host's namespace holder did not start")
            time.sleep(0.005)
        self._init = _children(self._holder.pid)[0]

    def wrap(self, args):
        """The command line that runs `args` on this host."""
        return ["nsenter", "-t", str(self._init), "--net", "--ipc", "--pid", "--mount",
                f"--wd={os.getcwd()}", "--", *map(str, args)]

    def popen(self, args, env=None, **kw):
        """Starts `args` on this host (stdout and stderr piped, text), killed by close()."""
        full_env = dict(os.environ if env is None else env)
        full_env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python")] +
            [os.path.abspath(p) for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p])
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        proc = HostProcess(self.wrap(args), env=full_env, **kw)
        self._hosts._procs.append(proc)
        return proc

    def python(self, code, *args, **kw):
        """Runs Python `code` on this host (`python -c code args...`)."""
        return self.popen([sys.executable, "-c", code, *map(str, args)], **kw)

    def run(self, args, timeout=60):
        return subprocess.run(self.wrap(args), capture_output=True, text=True, timeout=timeout)

    def stop(self):
        """Kills every process of the host (its init first: the kernel kills the rest)."""
        if self._holder.poll() is None:
            self._holder.kill()
        self._holder.wait()

    def __repr__(self):
        return f"Host({self.name}, {self.addr})"


class Hosts:
    """`n` simulated hosts on one switch. Iterable and indexable: hosts[0] is the first."""

    def __init__(self, n=2):
        if os.geteuid() != 0:
            raise RuntimeError("simulated hosts need root (network namespaces): run the tests as root")
        if shutil.which("ip") is None:
            raise RuntimeError("simulated hosts need the `ip` command (Debian package iproute2)")
        remove_stale()
        self._tag = f"{PREFIX}{os.getpid()}i{_pid_namespace()}x{next(_counter)}"
        self._procs = []
        self._namespaces = []
        self.switch = f"{self._tag}sw"
        self.hosts = []
        _open.add(self)
        try:
            self._make_namespace(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge", "stp_state", "0",
                "forward_delay", "0")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i in range(n):
                name = f"{self._tag}h{i}"
                self._make_namespace(name)
                addr = f"198.18.0.{i + 1}"
                port = f"p{i}"
                _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                    "netns", name)
                _ip("-n", self.switch, "link", "set", port, "master", "br0")
                _ip("-n", self.switch, "link", "set", port, "up")
                _ip("-n", name, "addr", "add", f"{addr}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                self.hosts.append(Host(self, name, addr))
        except BaseException:
            self.close()
            raise

    def _make_namespace(self, name):
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def __iter__(self):
        return iter(self.hosts)

    def __getitem__(self, i):
        return self.hosts[i]

    def __len__(self):
        return len(self.hosts)

    def _port(self, host):
        return f"p{self.hosts.index(host)}"

    def cut(self, host):
        """Cuts `host` off the switch silently: packets to and from it vanish, no FIN, no RST."""
        _ip("-n", self.switch, "link", "set", self._port(host), "down")

    def restore(self, host):
        """Reconnects a host cut off by cut()."""
        _ip("-n", self.switch, "link", "set", self._port(host), "up")
        # Addresses that went unanswered during the cut are cached as unreachable (and
        # refused at once for a while): forget them on every host.
        for h in self.hosts:
            _ip("-n", h.name, "neigh", "flush", "all", check=False)
        # The host's eth0 gets its carrier back asynchronously: wait until it is up.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            out = _ip("-n", host.name, "link", "show", "eth0").stdout
            if "NO-CARRIER" not in out and "state UP" in out:
                return
            time.sleep(0.02)
        raise RuntimeError(f"{host.name}: eth0 did not come back up: {out}")

    def close(self):
        """Kills every process started on the hosts and deletes the namespaces."""
        for h in self.hosts:
            h.stop()
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass
        self._procs.clear()
        for ns in reversed(self._namespaces):
            _delete(ns)
        self._namespaces.clear()
        _open.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@atexit.register
def _close_all():
    for h in list(_open):
        h.close()
