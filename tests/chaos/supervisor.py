"""The soak's process table: starts every system process on its simulated host, reads
its event lines into the event log, and restarts a process that exited (the healing the
systems do not do themselves yet: a killed server, actor, producer or consumer).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
RESTART_DELAY = 0.3


@dataclass
class Role:
    name: str
    system: str  # pipe, inference, runner, remote
    host: int  # index into Hosts
    args: list
    progresses: bool = True  # reports progress events (the recovery check waits for them)


@dataclass
class Running:
    role: Role
    incarnation: int
    proc: object  # hosts.HostProcess
    started: float
    pid: int = None  # the command's pid in this (the driver's) pid namespace
    killed: bool = False
    reader: threading.Thread = None


class EventLog:
    """Every event of the run, in arrival order, with waits on new ones."""

    def __init__(self):
        self.events = []
        self._cond = threading.Condition()

    def add(self, ev):
        with self._cond:
            self.events.append(ev)
            self._cond.notify_all()

    def wait_for(self, pred, timeout, start=0):
        """The first event from index `start` on that satisfies pred, waiting up to
        `timeout` seconds; None when none came."""
        deadline = time.monotonic() + timeout
        i = start
        with self._cond:
            while True:
                while i < len(self.events):
                    if pred(self.events[i]):
                        return self.events[i]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.2))

    def __len__(self):
        with self._cond:
            return len(self.events)

    def snapshot(self):
        with self._cond:
            return list(self.events)


def children(pid):
    """The direct children of pid (this pid namespace's numbers)."""
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


# The process name of a runner's fork server (src/dataflow/fork_server.h): a child of the
# runner, and the parent of the workers it forked as replacements, but no worker itself.
FORK_SERVER_NAME = "tw-forkserver"


def descendants(pid):
    """Every process below pid (children, theirs, ...)."""
    out, todo = [], children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def comm(pid):
    """The process's name, or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def runner_workers(pid):
    """The runner's workers: its descendants but its fork server (replacements are the fork
    server's children, not the runner's)."""
    return sorted(p for p in descendants(pid) if comm(p) != FORK_SERVER_NAME) if pid else []


def alive(pid):
    """True while pid runs (a zombie is not running: nothing reaps in a host's pid
    namespace, whose init is `sleep`)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class Supervisor:
    def __init__(self, hosts, rundir, log, env):
        self.hosts = hosts
        self.rundir = rundir
        self.log = log
        self.env = env
        self.roles = {}
        self.running = {}
        self.stopping = False
        self._incarnations = {}
        self._lock = threading.RLock()

    def add(self, role):
        self.roles[role.name] = role
        self._start(role)

    def _start(self, role):
        n = self._incarnations.get(role.name, 0) + 1
        self._incarnations[role.name] = n
        env = dict(self.env, CHAOS_ROLE=role.name, PYTHONUNBUFFERED="1",
                   PYTHONPATH=HERE)
        stderr = open(os.path.join(self.rundir, f"{role.name}.{n}.stderr"), "w")
        host = self.hosts[role.host]
        proc = host.popen([sys.executable, os.path.join(HERE, role.args[0]), *role.args[1:]],
                          env=env, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL)
        stderr.close()
        run = Running(role, n, proc, time.monotonic())
        run.pid = proc.command_pid(timeout=30)
        run.reader = threading.Thread(target=self._read, args=(run,), daemon=True)
        run.reader.start()
        self.log.add({"t": time.monotonic(), "role": role.name, "ev": "started", "pid": run.pid,
                      "incarnation": n, "driver": True})
        with self._lock:
            self.running[role.name] = run

    def _read(self, run):
        for line in run.proc.stdout:
            try:
                ev = json.loads(line)
                ev["pid"] = run.pid  # the driver's number for it (events carry the host's)
                ev["incarnation"] = run.incarnation
            except ValueError:
                ev = {"t": time.monotonic(), "role": run.role.name, "ev": "stray", "line": line[:300]}
            self.log.add(ev)

    def poll(self):
        """Restarts every process that exited (after logging how it ended)."""
        if self.stopping:
            return
        with self._lock:
            for name, run in list(self.running.items()):
                rc = run.proc.poll()
                if rc is None:
                    continue
                run.reader.join(timeout=5)
                self.log.add({"t": time.monotonic(), "role": name, "ev": "exit", "rc": rc,
                              "pid": run.pid, "incarnation": run.incarnation, "driver": True,
                              "killed": run.killed, "lived": time.monotonic() - run.started})
                time.sleep(RESTART_DELAY)
                if not self.stopping:
                    self._start(run.role)

    def pid(self, name):
        with self._lock:
            run = self.running.get(name)
            return run.pid if run and run.proc.poll() is None else None

    def mark_killed(self, name):
        with self._lock:
            if name in self.running:
                self.running[name].killed = True

    def continue_parent(self, name):
        with self._lock:
            run = self.running.get(name)
            if run is not None:
                self.signal(run.proc.pid, signal.SIGCONT)

    def signal(self, pid, sig):
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def stop_all(self):
        self.stopping = True
        with self._lock:
            for run in self.running.values():
                if run.pid:
                    self.signal(run.pid, signal.SIGCONT)
                    self.signal(run.pid, signal.SIGKILL)
                self.signal(run.proc.pid, signal.SIGCONT)
                if run.proc.poll() is None:
                    run.proc.kill()
            for run in self.running.values():
                try:
                    run.proc.wait(timeout=10)
                except Exception:  # noqa: BLE001 - Hosts.close() kills what is left
                    pass
                try:
                    run.proc.stdout.close()
                except OSError:
                    pass
