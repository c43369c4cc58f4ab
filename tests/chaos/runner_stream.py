"""The data-loading system of the soak: a MultiProcessRunnerZMQ whose workers yield
checksummed datapoints, checked as they arrive.

    runner_stream.py RUNDIR

The runner has no policy for a dead worker yet beyond raising WorkerDiedError ("raise"),
so this process is its supervisor: it reports the error, closes the runner (which reaps
the workers) and starts a new one. Each worker numbers its datapoints itself, so the
main process checks per worker that none is lost, repeated or reordered.
"""
import sys
import time

import numpy as np

import tensorwire as tw
from events import Progress, emit, error
from payloads import check, make

NUM_PROC = 3
NBYTES = 64 << 10
NEXT_TIMEOUT = 30.0


class Numbered(tw.dataflow.DataFlow):
    """Endless datapoints [payload..., tag]: tag names the worker process."""

    def __iter__(self):
        import os
        tag = f"w{os.getpid()}"
        seq = 0
        while True:
            seq += 1
            p = make(tag, seq, NBYTES)
            yield [p["seq"], p["x"], p["crc"], tag]
            time.sleep(0.002)


def main(rundir):
    progress = Progress()
    generation = 0
    while True:
        generation += 1
        runner = tw.MultiProcessRunnerZMQ(Numbered(), num_proc=NUM_PROC, hwm=8)
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
