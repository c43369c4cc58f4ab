"""The killer: the kinds of fault the soak injects, each with what it must lead to.

A fault is drawn from the run's seeded generator (kind, target, duration), injected, and
comes back with its expectations: events that must appear within a bound (the documented
exception, a reclaimed slot, counted rejections, dead workers) and the systems whose
documented exceptions it excuses while it lasts. The soak then heals it (SIGCONT, the
link restored; killed processes are restarted by the supervisor) and waits until every
system makes progress again.
"""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from events import RUNNER_DATAPOINT_TIMEOUT, STALL_REQUEST
from supervisor import HERE, alive, descendants, runner_workers

KINDS = [
    "kill_runner_worker", "stall_runner_worker", "kill_actor", "kill_pipe_client", "kill_pipe_server",
    "kill_inference_server", "kill_runner", "kill_producer", "kill_consumer",
    "stop_cont", "link_cut", "rogue_zmq", "rogue_tcp", "rogue_unix",
]


@dataclass
class Expect:
    what: str  # what must happen, for the report
    pred: object  # event -> bool
    bound: float  # seconds after the fault's start
    met_after: float = None  # seconds after the start, once seen
    check: object = None  # a function polled instead of pred (returns True when met)


@dataclass
class Fault:
    n: int
    kind: str
    target: str
    t: float  # monotonic start
    duration: float = 0.0
    detail: str = ""
    excuses: set = field(default_factory=set)  # systems whose documented errors it explains
    expects: list = field(default_factory=list)
    healed_at: float = None
    recovered_at: float = None
    violations: list = field(default_factory=list)

    def line(self, t0):
        return (f"#{self.n} +{self.t - t0:7.1f}s {self.kind:22s} {self.target:16s} "
                f"{self.duration:4.1f}s {self.detail}")

    def record(self, t0):
        return {"n": self.n, "at": round(self.t - t0, 2), "kind": self.kind, "target": self.target,
                "duration": round(self.duration, 2), "detail": self.detail,
                "expects": [(e.what, e.met_after) for e in self.expects],
                "recovered_after": None if self.recovered_at is None else round(self.recovered_at - self.t, 2),
                "violations": self.violations}


class Killer:
    def __init__(self, soak, rng, kinds=KINDS):
        self.kinds = list(kinds)
        self.soak = soak
        self.sup = soak.sup
        self.rng = rng
        self.n = 0

    # --- helpers -----------------------------------------------------------------------
    def roles(self, prefix):
        return sorted(r for r in self.sup.roles if r.startswith(prefix))

    def recently_progressing(self, role, within=1.5):
        """True when `role` reported progress in the last `within` seconds (so it is in a
        call on its peer, and must see the fault)."""
        now = time.monotonic()
        for ev in reversed(self.soak.log.snapshot()):
            if now - ev["t"] > within:
                return False
            if ev["role"] == role and ev["ev"] == "progress":
                return True
        return False

    def error_from(self, role, pid, types, **match):
        def pred(ev):
            return (ev["role"] == role and ev.get("pid") == pid and ev["ev"] == "error"
                    and ev["type"] in types and all(ev.get(k) == v for k, v in match.items()))
        return pred

    def kill(self, role):
        pid = self.sup.pid(role)
        if pid is None:
            return None
        self.sup.mark_killed(role)
        self.sup.signal(pid, signal.SIGKILL)
        return pid

    # --- the draw ----------------------------------------------------------------------
    def next(self):
        """Draws and injects one fault; None when its target was not there (restarting)."""
        kind = self.rng.choice(self.kinds)
        self.n += 1
        f = getattr(self, kind)(Fault(self.n, kind, "", time.monotonic()))
        return f

    # --- the kinds ---------------------------------------------------------------------
    def runner_worker(self, f):
        """A worker of the runner, drawn at random, or None (the runner is restarting)."""
        f.target = "runner"
        workers = runner_workers(self.sup.pid("runner"))
        return self.rng.choice(workers) if workers else None

    def restart_after(self, f, stuck):
        """The runner's report that it replaced a worker (on_worker_death="restart"), after
        fault `f` began; for a stuck one, naming datapoint_timeout. (The report names the
        worker by its pid in the host's pid namespace, not the pid the killer sees; one
        fault runs at a time, so any replacement after its start is its effect.)"""
        def pred(ev):
            return (ev["role"] == "runner" and ev["ev"] == "restart" and ev["t"] >= f.t
                    and (not stuck or "datapoint_timeout" in ev.get("message", "")))
        return pred

    def kill_runner_worker(self, f):
        # Healed by the runner itself: nothing may fail, a restart must be reported.
        w = self.runner_worker(f)
        if w is None:
            return None
        f.detail = f"worker pid {w}"
        os.kill(w, signal.SIGKILL)
        f.expects.append(Expect("the runner restarts the killed worker", self.restart_after(f, False),
                                self.soak.bound_local))
        return f

    def stall_runner_worker(self, f):
        # A worker hangs inside the dataflow's next() (runner_stream.py takes the request):
        # past datapoint_timeout the runner kills and restarts it; nothing may fail.
        # (A SIGSTOP would not do: a worker stopped while it waits for the consumer is not
        # stuck on a datapoint, and rightly not killed.)
        if self.sup.pid("runner") is None:
            return None
        f.target = "runner"
        f.detail = f"a worker hangs in next() past datapoint_timeout ({RUNNER_DATAPOINT_TIMEOUT} s)"
        request = os.path.join(self.soak.rundir, STALL_REQUEST)
        with open(request + ".tmp", "w") as out:
            out.write(str(f.n))
        os.replace(request + ".tmp", request)
        f.expects.append(Expect("the runner replaces the stuck worker", self.restart_after(f, True),
                                RUNNER_DATAPOINT_TIMEOUT + self.soak.bound_local))
        return f

    def kill_actor(self, f):
        f.target = self.rng.choice(self.roles("actor"))
        if self.kill(f.target) is None:
            return None
        f.excuses = {"inference"}
        server = self.sup.pid("inference_server")
        if server is None:  # being restarted: no slots to reclaim
            return f
        n_actors = len(self.roles("actor"))
        f.expects.append(Expect(
            f"the server's slots in use fall to at most {n_actors} (the dead actor's reclaimed)",
            lambda ev: (ev["role"] == "inference_server" and ev.get("pid") == server and ev["ev"] == "status"
                        and ev["t"] > f.t + 0.2 and ev["slots_in_use"] <= n_actors),
            self.soak.bound_local))
        return f

    def kill_pipe_client(self, f):
        f.target = self.rng.choice(self.roles("pipe_client"))
        server = self.sup.pid("pipe_server")
        must_see = self.recently_progressing(f.target)
        if self.kill(f.target) is None:
            return None
        f.excuses = {"pipe"}
        if must_see and server:
            remote = self.sup.roles[f.target].host != 0
            f.expects.append(Expect(f"the server's pipe to {f.target} raises ClosedError",
                                    self.error_from("pipe_server", server, {"ClosedError"}, peer=f.target),
                                    self.soak.bound_remote if remote else self.soak.bound_local))
        return f

    def kill_pipe_server(self, f):
        f.target = "pipe_server"
        clients = [c for c in self.roles("pipe_client") if self.recently_progressing(c)]
        pids = {c: self.sup.pid(c) for c in clients}
        if self.kill(f.target) is None:
            return None
        f.excuses = {"pipe"}
        for c in clients:
            remote = self.sup.roles[c].host != 0
            f.expects.append(Expect(f"{c} raises ClosedError", self.error_from(c, pids[c], {"ClosedError"}),
                                    self.soak.bound_remote if remote else self.soak.bound_local))
        return f

    def kill_inference_server(self, f):
        f.target = "inference_server"
        actors = [a for a in self.roles("actor") if self.recently_progressing(a)]
        pids = {a: self.sup.pid(a) for a in actors}
        if self.kill(f.target) is None:
            return None
        f.excuses = {"inference"}
        for a in actors:
            f.expects.append(Expect(f"{a} raises ClosedError", self.error_from(a, pids[a], {"ClosedError"}),
                                    self.soak.bound_local))
        return f

    def kill_runner(self, f):
        f.target = "runner"
        pid = self.sup.pid("runner")
        workers = descendants(pid) if pid else []  # its fork server and what that forked too
        if self.kill(f.target) is None:
            return None
        f.excuses = {"runner"}
        f.detail = f"workers {sorted(workers)}"
        f.expects.append(Expect("its workers exit with it (PDEATHSIG)", None, self.soak.bound_local,
                                check=lambda: not any(alive(w) for w in workers)))
        return f

    def kill_producer(self, f):
        f.target = self.rng.choice(self.roles("producer"))
        if self.kill(f.target) is None:
            return None
        f.excuses = {"remote"}
        return f

    def kill_consumer(self, f):
        f.target = "consumer"
        if self.kill(f.target) is None:
            return None
        f.excuses = {"remote"}
        return f

    def stop_cont(self, f):
        # Any process of the soak, workers included.
        candidates = sorted(self.sup.roles)
        f.target = self.rng.choice(candidates + ["runner_worker"])
        f.duration = self.rng.uniform(0.3, 2.5)
        if f.target == "runner_worker":
            workers = runner_workers(self.sup.pid("runner"))
            if not workers:
                return None
            pid = self.rng.choice(workers)
            system = "runner"
        else:
            pid = self.sup.pid(f.target)
            system = self.sup.roles[f.target].system
        if pid is None:
            return None
        f.detail = f"pid {pid}"
        # A stopped process sends no heartbeats: past the liveness bound its cross-host
        # pipes fail (documented); a stopped pipe peer may do that to the pipe system.
        f.excuses = {system, "pipe"} if system == "pipe" else {system}
        os.kill(pid, signal.SIGSTOP)
        self.soak.sleep(f.duration)
        os.kill(pid, signal.SIGCONT)
        # nsenter, the command's parent, stops itself when its child stops (a shell's job
        # control): it must be continued too, or it never reaps the child.
        if f.target != "runner_worker":
            self.sup.continue_parent(f.target)
        return f

    def link_cut(self, f):
        f.target = "host1"
        L = self.soak.liveness
        f.duration = self.rng.uniform(0.5, L + self.soak.slack + 3.0)  # a third of them past the bound
        remote_clients = [c for c in self.roles("pipe_client") if self.sup.roles[c].host == 1]
        watching = [c for c in remote_clients if self.recently_progressing(c)]
        pids = {c: self.sup.pid(c) for c in watching}
        server = self.sup.pid("pipe_server")
        hosts = self.soak.hosts
        hosts.cut(hosts[1])
        try:
            if f.duration >= L + self.soak.slack:
                # Longer than the bound: both ends of every cross-host pipe must fail.
                f.excuses = {"pipe", "remote"}
                f.detail = "longer than the liveness bound: cross-host pipes must fail"
                for c in watching:
                    f.expects.append(Expect(f"{c} raises ClosedError (no heartbeat)",
                                            self.error_from(c, pids[c], {"ClosedError"}), L + self.soak.slack))
                    f.expects.append(Expect(f"the server's pipe to {c} raises ClosedError (no heartbeat)",
                                            self.error_from("pipe_server", server, {"ClosedError"}, peer=c),
                                            L + self.soak.slack))
            elif f.duration < 0.5 * L:
                f.detail = "shorter than half the liveness bound: must be survived"
                f.excuses = {"remote"}
            else:
                f.detail = "about the liveness bound: failing or surviving both documented"
                f.excuses = {"pipe", "remote"}
            self.soak.sleep(f.duration)
        finally:
            hosts.restore(hosts[1])
        return f

    def _rogue(self, host, args):
        env = dict(self.soak.env, ROGUE_SEED=str(self.rng.getrandbits(32)), CHAOS_ROLE="rogue",
                   PYTHONPATH=HERE)
        p = self.soak.hosts[host].popen([sys.executable, os.path.join(HERE, "rogue.py"), *map(str, args)],
                                        env=env, stdin=subprocess.DEVNULL)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate(timeout=10)
            return {"sent": 0, "error": "rogue peer timed out"}
        lines = [line for line in out.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {"sent": 0, "error": err[-300:]}

    def rogue_zmq(self, f):
        f.target = "consumer"
        pid = self.sup.pid("consumer")
        if pid is None:
            return None
        before = self.soak.latest("consumer", pid, "rejected", default=0)
        count = self.rng.randint(1, 8)
        res = self._rogue(1, ["zmq", self.soak.endpoint, count])
        f.detail = f"{count} malformed messages from host1: {res}"
        if res.get("sent"):
            f.expects.append(Expect(f"the consumer counts {count} more rejected messages",
                                    lambda ev: (ev["role"] == "consumer" and ev.get("pid") == pid
                                                and ev.get("rejected", -1) >= before + count),
                                    self.soak.bound_remote))
        return f

    def rogue_tcp(self, f):
        f.target = "pipe_server"
        port = self.soak.read_run_file("pipe_port")
        if port is None or self.sup.pid("pipe_server") is None:
            return None
        res = self._rogue(1, ["tcp", self.soak.hosts[0].addr, port])
        f.detail = f"junk to port {port} from host1: {res}"
        return f

    def rogue_unix(self, f):
        f.target = "inference_server"
        name = self.soak.read_run_file("inference_name")
        if name is None or self.sup.pid("inference_server") is None:
            return None
        res = self._rogue(0, ["unix", name])
        f.detail = f"4 KiB of noise to the transport's socket: {res}"
        return f
