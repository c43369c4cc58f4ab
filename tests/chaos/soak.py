"""The chaos soak: the three systems under load at once, a seeded killer, a checker.

    python tests/chaos/soak.py [--seconds 600] [--seed N] [--liveness 2] [--slack 3]

Runs as root (network namespaces: tests/python/hosts.py). Two simulated hosts:

    host0: TensorDictServer + 2 clients, InferenceServer (SharedMemoryTransport) + actors,
           MultiProcessRunnerZMQ + workers, RemoteDataZMQ consumer
    host1: a pipe client and a send_dataflow_zmq producer, across the link

The killer injects one fault at a time (faults.py), the soak waits for what it must lead
to, heals it and waits until every system makes progress again; then the checker
(checker.py) judges the event log and the machine. Exit status 0 when nothing was
violated; otherwise 1, with the seed and the fault sequence to reproduce the run.
Ctrl-C or SIGTERM end it cleanly: every process and namespace of the run is removed.
"""
import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests", "python")]

import checker  # noqa: E402
from faults import KINDS, Killer  # noqa: E402
from hosts import Hosts  # noqa: E402
from supervisor import EventLog, Role, Supervisor  # noqa: E402

CONSUMER_PORT = 7555  # in host0's own network namespace: no other program uses it


class Soak:
    def __init__(self, a):
        self.a = a
        self.liveness = a.liveness
        self.slack = a.slack
        self.bound_local = 5.0 + a.slack  # a dead process on this host (pidfd): docs say within 5 s
        self.bound_remote = max(5.0, a.liveness) + a.slack  # across the link: the liveness bound
        # Every process of the run inherits this variable: the leftover check finds them by it.
        self.marker = ("CHAOS_RUN", f"{os.getpid()}-{time.time_ns()}")
        self.log = EventLog()
        self.faults = []
        self.skipped = {}
        self.rss = {}
        self.violations = []
        self.done = threading.Event()

    # --- helpers used by the killer ---------------------------------------------------
    def sleep(self, seconds):
        self.done.wait(seconds)

    def latest(self, role, pid, key, default=None):
        for ev in reversed(self.log.snapshot()):
            if ev["role"] == role and ev.get("pid") == pid and key in ev:
                return ev[key]
        return default

    def read_run_file(self, name):
        try:
            with open(os.path.join(self.rundir, name)) as f:
                return f.read().strip() or None
        except FileNotFoundError:
            return None

    # --- the run ------------------------------------------------------------------------
    def start_systems(self):
        h0 = self.hosts[0].addr
        self.endpoint = f"tcp://{h0}:{CONSUMER_PORT}"
        d = self.rundir
        for role in [
            Role("pipe_server", "pipe", 0, ["pipe_stream.py", "server", d], progresses=False),
            Role("pipe_client_a1", "pipe", 0, ["pipe_stream.py", "client", d, h0]),
            Role("pipe_client_a2", "pipe", 0, ["pipe_stream.py", "client", d, h0]),
            Role("pipe_client_b1", "pipe", 1, ["pipe_stream.py", "client", d, h0]),
            Role("inference_server", "inference", 0, ["inference_stream.py", "server", d], progresses=False),
            *[Role(f"actor{i}", "inference", 0, ["inference_stream.py", "actor", d]) for i in range(1, 5)],
            Role("runner", "runner", 0, ["runner_stream.py", d]),
            Role("consumer", "remote", 0, ["remote_stream.py", "consumer", self.endpoint]),
            Role("producer_b1", "remote", 1, ["remote_stream.py", "producer", self.endpoint]),
        ]:
            self.sup.add(role)

    def progressing(self):
        return sorted(r.name for r in self.sup.roles.values() if r.progresses)

    def wait_progress(self, since, bound):
        """Waits until every progressing role reported progress after `since`; the roles
        that did not, after `bound` seconds."""
        missing = set(self.progressing())
        # Scan from a little before: events arrive in order per process, not globally.
        events = self.log.snapshot()
        i = len(events)
        while i > 0 and events[i - 1]["t"] > since - 1:
            i -= 1
        deadline = time.monotonic() + bound

        def pred(ev):
            if ev["ev"] == "progress" and ev["t"] > since:
                missing.discard(ev["role"])
            return not missing
        while missing and not self.done.is_set():
            if self.log.wait_for(pred, max(0.0, min(0.5, deadline - time.monotonic())), start=i) is not None:
                break
            i = max(i, len(self.log) - 1)
            if time.monotonic() > deadline:
                break
        return sorted(missing)

    def background(self):
        """Restarts exited processes; samples RSS every 5 s."""
        next_rss = 0.0
        while not self.done.is_set():
            self.sup.poll()
            now = time.monotonic()
            if now >= next_rss:
                next_rss = now + 5.0
                for name, run in list(self.sup.running.items()):
                    kb = checker.rss_kb(run.pid) if run.pid else None
                    if kb:
                        self.rss.setdefault((name, run.incarnation), []).append((now, kb))
                kb = checker.rss_kb(os.getpid())
                self.rss.setdefault(("driver", 1), []).append((now, kb))
            self.done.wait(0.1)

    def fault_cycle(self, killer):
        f = killer.next()
        if f is None:
            return None
        self.faults.append(f)
        healed = time.monotonic()
        f.healed_at = healed
        print(f.line(self.t0), flush=True)
        # What it must lead to, each within its bound from the fault's start.
        for e in f.expects:
            left = f.t + e.bound - time.monotonic()
            if e.check is not None:
                end = time.monotonic() + max(0.0, left)
                while not e.check() and time.monotonic() < end:
                    time.sleep(0.05)
                ok = e.check()
                seen_t = time.monotonic() if ok else None
            else:
                ev = self.log.wait_for(e.pred, max(0.0, left))
                seen_t = ev["t"] if ev else None
            if seen_t is not None and seen_t - f.t <= e.bound:
                e.met_after = round(max(0.0, seen_t - f.t), 2)
            else:
                f.violations.append(f"not within {e.bound:.1f} s: {e.what}")
        # Every system makes progress again.
        missing = self.wait_progress(healed, self.a.recover)
        if missing:
            f.violations.append(f"no progress within {self.a.recover:.0f} s of the heal: {', '.join(missing)}")
        f.recovered_at = time.monotonic()
        for v in f.violations:
            print(f"    VIOLATION: {v}", flush=True)
        return f

    def run(self):
        a = self.a
        self.rundir = a.rundir or os.path.join(ROOT, "build", "chaos", f"run-{os.getpid()}")
        os.makedirs(self.rundir, exist_ok=True)
        fds_before, shm_before = checker.own_fds(), checker.shm_entries()
        print(f"chaos soak: seed {a.seed}, {a.seconds:.0f} s, liveness bound {a.liveness} s, "
              f"slack {a.slack} s, logs in {self.rundir}", flush=True)
        env = dict(os.environ, TENSORWIRE_LIVENESS_TIMEOUT=str(a.liveness))
        env[self.marker[0]] = self.marker[1]
        self.env = env
        self.hosts = Hosts(2)
        tag = self.hosts._tag
        bg = None
        interrupted = False
        try:
            self.sup = Supervisor(self.hosts, self.rundir, self.log, env)
            self.start_systems()
            bg = threading.Thread(target=self.background, daemon=True)
            bg.start()
            missing = self.wait_progress(0.0, a.startup)
            if missing:
                self.violations.append(f"not started within {a.startup:.0f} s: {', '.join(missing)}")
                raise StopIteration
            self.t0 = time.monotonic()
            print(f"all systems running after {self.t0 - self.log.events[0]['t']:.1f} s", flush=True)
            killer = Killer(self, random.Random(a.seed), a.kinds)
            gaps = random.Random(a.seed + 1)
            while time.monotonic() - self.t0 < a.seconds:
                self.sleep(gaps.uniform(0.5, 3.0))
                f = self.fault_cycle(killer)
                if f is None:  # its target was restarting: drawn again
                    self.skipped[killer.n] = True
            # The quiet end: everything still runs and nothing fails without a fault.
            self.sleep(2.0)
        except StopIteration:
            pass
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: cleaning up", flush=True)
        finally:
            # The cleanup runs to its end: a second Ctrl-C or SIGTERM waits for it.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            self.end = time.monotonic()
            self.done.set()
            if bg:
                bg.join(timeout=10)
            if hasattr(self, "sup"):
                self.sup.stop_all()
            self.hosts.close()
        return self.report(tag, fds_before, shm_before, interrupted)

    def report(self, tag, fds_before, shm_before, interrupted):
        events = self.log.snapshot()
        roles = self.sup.roles if hasattr(self, "sup") else {}
        known = {}
        ev_violations, surfaced = checker.judge_events(events, self.faults, roles, self.end, known)
        rows, rss_violations = checker.judge_rss(self.rss)
        left = checker.leftovers("=".join(self.marker), tag, fds_before, shm_before)
        fault_violations = [f"fault #{f.n} {f.kind} {f.target}: {v}" for f in self.faults for v in f.violations]
        violations = self.violations + fault_violations + ev_violations + rss_violations + left
        totals = checker.delivered(events)
        summary = self.summary(surfaced, totals, rows)
        if known:
            summary += "\nKNOWN BUGS seen (reported, not counted as survived; docs/reliability.md):\n" + \
                "\n".join(f"  - x{n}: {why}" for why, n in known.items())
        with open(os.path.join(self.rundir, "faults.json"), "w") as fh:
            json.dump({"seed": self.a.seed, "faults": [f.record(self.t0) for f in self.faults]
                       if hasattr(self, "t0") else [], "violations": violations, "summary": summary}, fh, indent=1)
        with open(os.path.join(self.rundir, "events.jsonl"), "w") as fh:
            for ev in events:
                fh.write(json.dumps(ev) + "\n")
        print(summary)
        if violations or interrupted:
            print(f"\n{len(violations)} violation(s):" if violations else "\ninterrupted")
            for v in violations:
                print(f"  - {v}")
            print(f"\nreproduce: make chaos CHAOS_SECONDS={self.a.seconds:.0f} CHAOS_SEED={self.a.seed} "
                  f"(liveness {self.a.liveness}, slack {self.a.slack}); the fault sequence:")
            for f in self.faults:
                print("  " + f.line(self.t0))
            return 1 if violations else 130
        print(f"\nchaos soak passed: seed {self.a.seed}, {len(self.faults)} faults, no violation")
        return 0

    def summary(self, surfaced, totals, rss_rows):
        lines = ["", "| fault | injected | expectations met | slowest detection (s) | slowest recovery (s) |",
                 "|---|---:|---:|---:|---:|"]
        for kind in KINDS:
            fs = [f for f in self.faults if f.kind == kind]
            if not fs:
                continue
            exp = [e for f in fs for e in f.expects]
            met = [e for e in exp if e.met_after is not None]
            det = max((e.met_after for e in met), default=None)
            rec = max(f.recovered_at - f.t for f in fs if f.recovered_at)
            lines.append(f"| {kind} | {len(fs)} | {len(met)}/{len(exp)} | "
                         f"{'-' if det is None else f'{det:.2f}'} | {rec:.1f} |")
        if self.skipped:
            lines.append(f"\n{len(self.skipped)} draws found their target restarting and were drawn again")
        lines.append(f"\nexceptions surfaced (all explained by a fault): "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(surfaced.items())) or 'none'}")
        groups = {"pipe round trips": "pipe_client", "inference responses": "actor",
                  "runner datapoints": "runner", "remote datapoints": "consumer"}
        lines.append("delivered and checked: " + ", ".join(
            f"{label} {sum(n for r, n in totals.items() if r.startswith(p))}" for label, p in groups.items()))
        if rss_rows:
            lines.append("RSS of long-lived processes (MiB: after warm-up -> end, growth):")
            for role, inc, life, base, end, growth in rss_rows:
                lines.append(f"  {role}#{inc} ({life} s): {base:.0f} -> {end:.0f}, {growth:+.1f}")
        return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=600.0, help="how long the killer runs")
    p.add_argument("--seed", type=int, default=None, help="the killer's seed (random when not given)")
    p.add_argument("--liveness", type=float, default=2.0, help="TENSORWIRE_LIVENESS_TIMEOUT of every process")
    p.add_argument("--slack", type=float, default=3.0, help="seconds added to every bound (a loaded machine)")
    p.add_argument("--recover", type=float, default=45.0, help="seconds every system has to progress after a heal")
    p.add_argument("--startup", type=float, default=120.0, help="seconds the systems have to start")
    p.add_argument("--kinds", type=lambda v: v.split(","), default=KINDS,
                   help=f"comma-separated fault kinds to draw from (default all: {','.join(KINDS)})")
    p.add_argument("--rundir", default=None, help="logs (default build/chaos/run-PID)")
    a = p.parse_args()
    unknown = set(a.kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1 << 31)
    if os.geteuid() != 0:
        sys.exit("the chaos soak needs root (network namespaces for the simulated hosts)")

    def stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    soak = Soak(a)
    # The watchdog: the driver itself must not hang either.
    limit = a.seconds + a.startup + 4 * a.recover + 300

    def watchdog():
        if not soak.done.wait(limit):
            print(f"WATCHDOG: the soak ran past {limit:.0f} s (seed {a.seed}); stacks:", flush=True)
            for tid, frame in sys._current_frames().items():
                traceback.print_stack(frame)
            os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watchdog, daemon=True).start()
    sys.exit(soak.run())


if __name__ == "__main__":
    main()
