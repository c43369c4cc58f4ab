"""The line protocol between the soak's system processes and its driver (soak.py).

Every system process writes one JSON object per line on stdout: what happened, when
(time.monotonic(): one clock for every process of the machine, namespaces included),
and which role said it. The driver's readers turn the lines into its event log, which
the checker judges. Nothing else may be printed on stdout by a system process.
"""
import json
import os
import sys
import threading
import time

ROLE = os.environ.get("CHAOS_ROLE", "?")
_lock = threading.Lock()

# The exceptions a fault may surface as, by system (docs/reliability.md). Anything else
# reported by a system process is a violation.
DOCUMENTED = {
    # ConnectionRefusedError: a client reconnecting to a killed server's port or name
    # before the supervisor restarted it.
    "pipe": {"ClosedError", "TimeoutError", "ConnectionRefusedError"},
    "inference": {"ClosedError", "TimeoutError", "ConnectionRefusedError"},
    "runner": {"WorkerDiedError"},
    "remote": {"TimeoutError"},
}

# The runner's datapoint_timeout (runner_stream.py), which a worker that takes the
# killer's stall request (a file of this name in the run's directory) exceeds. Longer
# than the soak's SIGSTOPs (up to 2.5 s, to be survived) and than a worker legitimately
# takes on a loaded machine.
RUNNER_DATAPOINT_TIMEOUT = 5.0
STALL_REQUEST = "stall_runner_worker"


def emit(ev, **fields):
    """Writes one event line (thread-safe); a closed stdout (the driver is gone) ends the
    process instead of raising in some unrelated thread."""
    line = json.dumps({"t": time.monotonic(), "role": ROLE, "pid": os.getpid(), "ev": ev, **fields})
    with _lock:
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):
            os._exit(3)


def error(exc, **fields):
    """Reports an exception a system call raised (type name and message)."""
    emit("error", type=type(exc).__name__, message=str(exc)[:500], **fields)


class Progress:
    """Counts good operations and reports the running total at most every `every` s."""

    def __init__(self, every=0.5):
        self.count = 0
        self._every = every
        self._last = 0.0

    def add(self, n=1, **fields):
        self.count += n
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            emit("progress", count=self.count, **fields)


def read_file(path, timeout):
    """The contents of a file another system process writes (atomically), waiting for it
    at most `timeout` seconds; None when it did not appear."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return text
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def write_file(path, text):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
