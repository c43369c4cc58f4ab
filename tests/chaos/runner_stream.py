"""The data-loading system of the soak: a MultiProcessRunnerZMQ whose workers yield
checksummed datapoints, checked as they arrive.

    runner_stream.py RUNDIR

The runner heals its workers itself (on_worker_death="restart"): a killed worker, or one
stuck on a datapoint for longer than RUNNER_DATAPOINT_TIMEOUT, is replaced, and
each replacement is reported as a "restart" event carrying the runner's warning (the
checker expects one for every such fault). Should the runner still raise
WorkerDiedError (too many restarts), this process reports it, closes the runner and
starts a new one. Each worker numbers its datapoints itself, so the main process checks
per worker that none is lost, repeated or reordered.
"""
import os
import sys
import time
import warnings

import numpy as np

import tensorwire as tw
from events import RUNNER_DATAPOINT_TIMEOUT, STALL_REQUEST, Progress, emit, error
from payloads import check, make

NUM_PROC = 3
NBYTES = 64 << 10
NEXT_TIMEOUT = 30.0
# The soak kills workers at random, at times several a minute: the runner must go on.
MAX_RESTARTS = 1000


def report_restarts(message, category, *args, **kwargs):
    if issubclass(category, tw.dataflow.WorkerRestartedWarning):
        emit("restart", message=str(message)[:500])


class Numbered(tw.dataflow.DataFlow):
    """Endless datapoints [payload..., tag]: tag names the worker process.

    A worker that takes the killer's stall request (the file STALL_REQUEST in the run's
    directory; faults.py) hangs in the middle of making a datapoint, as a decoder stuck
    on a dead network share would."""

    def __init__(self, rundir):
        self.stall_request = os.path.join(rundir, STALL_REQUEST)

    def __iter__(self):
        tag = f"w{os.getpid()}"
        seq = 0
        while True:
            seq += 1
            if os.path.exists(self.stall_request):
                try:  # one worker takes it
                    os.rename(self.stall_request, f"{self.stall_request}.taken.{os.getpid()}")
                    time.sleep(3600)
                except FileNotFoundError:
                    pass
            p = make(tag, seq, NBYTES)
            yield [p["seq"], p["x"], p["crc"], tag]
            time.sleep(0.002)


def main(rundir):
    progress = Progress()
    warnings.simplefilter("always", tw.dataflow.WorkerRestartedWarning)
    warnings.showwarning = report_restarts
    generation = 0
    while True:
        generation += 1
        runner = tw.MultiProcessRunnerZMQ(Numbered(rundir), num_proc=NUM_PROC, hwm=8,
                                          on_worker_death="restart", max_restarts=MAX_RESTARTS,
                                          datapoint_timeout=RUNNER_DATAPOINT_TIMEOUT)
        runner.reset_state()
        emit("ready", generation=generation, workers=list(runner.pids))
        last = {}
        try:
            it = iter(runner)
            while True:
                dp = next(it)
                seq_a, x, crc_a, tag = dp
                seq = int(np.asarray(seq_a)[0])
                want = last.get(tag, seq - 1) + 1
                bad = check(tag, want, {"seq": seq_a, "x": x, "crc": crc_a})
                if bad:
                    emit("corrupt", what=f"runner datapoint of worker {tag}: {bad}")
                last[tag] = seq
                progress.add()
        except tw.dataflow.WorkerDiedError as e:
            error(e)
        finally:
            runner.close()


if __name__ == "__main__":
    main(sys.argv[1])
