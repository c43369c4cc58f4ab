"""The soak's checker: judges the event log against the faults, and the machine after
the run (leftovers), and the memory of long-lived processes.

Rules (docs/reliability.md):
- a "corrupt" event (a checksum, pattern or sequence mismatch) is always a violation;
- an exception reported by a system process is fine only when a fault in that system
  explains it (between its start and its recovery, plus GRACE) and its type is one that
  system documents for that fault (events.DOCUMENTED); anything else is a violation;
- a process that exited without being killed by the killer crashed: a violation;
- after the run: no process of the run, no namespace, no new fd or memfd in the driver,
  no new /dev/shm entry; RSS of a long-lived process may not grow by more than RSS_LIMIT.
"""
import os
import subprocess
import time

from events import DOCUMENTED

GRACE = 2.0

# Bugs the soak found in the systems, reported (docs/reliability.md, "Known bugs") and
# counted on their own, not as survived: (system, exception type, text in its message).
# Empty: the one found so far (a pipe connect during a cut raised UCX's "ucp_worker_create: No
# such device" as a bare RuntimeError) is fixed; UCS_ERR_NO_DEVICE is a ClosedError now.
KNOWN_BUGS: list = []


def known_bug(system, ev):
    return next((why for s, t, text, why in KNOWN_BUGS
                 if s == system and ev["type"] == t and text in ev.get("message", "")), None)
RSS_WARMUP = 20.0  # seconds of a process's life before its baseline sample
RSS_MIN_LIFE = 60.0  # shorter lives are not judged
RSS_LIMIT_MB = 64.0  # growth beyond this (and beyond half the baseline) is a violation


def judge_events(events, faults, roles, end, known=None):
    """Violations (deduplicated) and {exception type: count} of the explained ones; the
    known bugs seen go to `known` ({description: count})."""
    violations, surfaced = [], {}
    known = {} if known is None else known
    for ev in events:
        if ev["t"] > end:  # the teardown: killed in any order by the soak itself
            continue
        kind = ev["ev"]
        if kind == "corrupt":
            violations.append(f"{ev['role']}: data not intact: {ev['what']}")
        elif kind == "stray":
            violations.append(f"{ev['role']}: printed a line that is not an event: {ev['line']!r}")
        elif kind == "exit" and not ev["killed"]:
            violations.append(f"{ev['role']} (pid {ev['pid']}) exited with {ev['rc']} without being killed")
        elif kind in ("error", "connect_failed"):
            system = roles[ev["role"]].system
            why = known_bug(system, ev)
            if why:
                known[why] = known.get(why, 0) + 1
                continue
            fault = next((f for f in faults if system in f.excuses
                          and f.t - 0.5 <= ev["t"] <= (f.recovered_at or end) + GRACE), None)
            if fault is None:
                violations.append(f"{ev['role']}: {ev['type']} with no fault to explain it: {ev['message']}")
            elif ev["type"] not in DOCUMENTED[system]:
                violations.append(f"{ev['role']}: {ev['type']} is not what {system} documents "
                                  f"(fault #{fault.n} {fault.kind}): {ev['message']}")
            else:
                surfaced[ev["type"]] = surfaced.get(ev["type"], 0) + 1
    return dedup(violations), surfaced


def dedup(lines):
    """The same violation repeated (a client retrying) once, with its count."""
    counts = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return [line if n == 1 else f"{line} (x{n})" for line, n in counts.items()]


def delivered(events):
    """Good operations per role: the last running total of each process, summed."""
    last = {}
    for ev in events:
        if ev["ev"] == "progress":
            last[(ev["role"], ev["pid"], ev.get("incarnation"))] = ev["count"]
    totals = {}
    for (role, _, _), n in last.items():
        totals[role] = totals.get(role, 0) + n
    return totals


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def judge_rss(samples):
    """samples: {(role, incarnation): [(t, kB), ...]} -> (rows, violations)."""
    rows, violations = [], []
    for (role, inc), series in sorted(samples.items()):
        if len(series) < 2 or series[-1][0] - series[0][0] < RSS_MIN_LIFE:
            continue
        start = series[0][0]
        base = next(((t, kb) for t, kb in series if t - start >= RSS_WARMUP), series[0])
        growth_mb = (series[-1][1] - base[1]) / 1024
        rows.append((role, inc, round(series[-1][0] - start), base[1] / 1024, series[-1][1] / 1024, growth_mb))
        # The driver's growth is its event log (about 1 KiB per event, all kept for the
        # checker): reported, not judged.
        if role != "driver" and growth_mb > RSS_LIMIT_MB and growth_mb > 0.5 * base[1] / 1024:
            violations.append(f"{role} (incarnation {inc}): RSS grew {growth_mb:.0f} MiB "
                              f"({base[1] / 1024:.0f} -> {series[-1][1] / 1024:.0f} MiB)")
    return rows, violations


# --- leftovers ---------------------------------------------------------------------------

def own_fds():
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return fds


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def processes_with(marker):
    """Pids whose environment carries `marker` (every process of the run has it)."""
    found, needle = [], marker.encode()
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{p}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                            found.append(int(p))
        except OSError:
            pass
    return found


def leftovers(marker, tag, fds_before, shm_before):
    problems = []
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in processes_with(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            cmd = "?"
        problems.append(f"process {pid} of the run still runs: {cmd}")
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    problems += [f"network namespace left behind: {line.split()[0]}"
                 for line in out.splitlines() if line.startswith(tag)]
    now = own_fds()
    for fd, target in sorted(now.items()):
        if fd not in fds_before:
            what = "memfd" if target.startswith("/memfd:") else "fd"
            problems.append(f"the driver holds a new {what} {fd} -> {target}")
    new = shm_entries() - shm_before
    if new:
        time.sleep(1.0)  # another program's transient entry is not ours
        new &= shm_entries()
    problems += [f"/dev/shm entry left behind: {name}" for name in sorted(new)]
    return problems
