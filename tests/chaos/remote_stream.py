"""The remote dataflow of the soak, across two simulated hosts: send_dataflow_zmq on one
host, RemoteDataZMQ on the other.

    remote_stream.py consumer ENDPOINT    binds ENDPOINT (tcp://ADDR:PORT, fixed: a restarted
                                          consumer binds it again and producers reconnect)
    remote_stream.py producer ENDPOINT    sends numbered, checksummed datapoints for ever

Each producer process tags its datapoints with its pid and start time, so the consumer
checks per producer that every datapoint arrived intact, once and in order: a gap is a
datapoint lost. The first datapoint a consumer sees of a producer may be any (what was
queued for a consumer that died is lost with it; ZeroMQ documents that). Malformed
messages (the rogue peer) are counted by the consumer and reported.
"""
import os
import sys
import time
import warnings

import numpy as np

import tensorwire as tw
from events import Progress, emit
from payloads import check, make

NBYTES = 16 << 10


class Numbered(tw.dataflow.DataFlow):
    def __init__(self, tag):
        self.tag = tag

    def __iter__(self):
        seq = 0
        while True:
            seq += 1
            p = make(self.tag, seq, NBYTES)
            yield [p["seq"], p["x"], p["crc"], self.tag]
            time.sleep(0.003)


def producer(endpoint):
    tag = f"p{os.getpid()}-{time.monotonic_ns()}"
    progress = Progress()
    emit("ready", tag=tag)
    tw.send_dataflow_zmq(Numbered(tag), endpoint, hwm=20, progress=lambda sent: progress.add())


def consumer(endpoint):
    remote = tw.RemoteDataZMQ(endpoint)
    remote.reset_state()
    emit("ready", endpoint=remote.endpoint())
    progress = Progress()
    last = {}

    def warned(message, category, *args, **kwargs):
        # A producer cut off (or killed) for longer than the liveness bound is reported
        # (ProducerSilentWarning); that is no rejected message.
        if issubclass(category, tw.dataflow.ProducerSilentWarning):
            emit("silent", message=str(message)[:300])
        else:
            emit("rejected", message=str(message)[:300], total=remote.rejected)

    warnings.showwarning = warned
    while True:
        dp = remote.recv(timeout=1.0)
        if dp is None:
            emit("idle", rejected=remote.rejected)
            continue
        seq_a, x, crc_a, tag = dp
        seq = int(np.asarray(seq_a)[0])
        if tag in last and seq != last[tag] + 1:
            emit("corrupt", what=f"remote stream of {tag}: seq {seq} after {last[tag]}: "
                                 f"{'lost' if seq > last[tag] else 'repeated'} datapoints")
        bad = check(tag, seq, {"seq": seq_a, "x": x, "crc": crc_a})
        if bad:
            emit("corrupt", what=f"remote datapoint of {tag}: {bad}")
        last[tag] = seq
        progress.add(rejected=remote.rejected)


if __name__ == "__main__":
    (producer if sys.argv[1] == "producer" else consumer)(sys.argv[2])
