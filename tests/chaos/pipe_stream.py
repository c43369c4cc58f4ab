"""The pipe system of the soak: a TensorDictServer echoing every dict, and clients that
send checksummed dicts and check the echo.

    pipe_stream.py server RUNDIR          writes its port to RUNDIR/pipe_port
    pipe_stream.py client RUNDIR HOST     connects to HOST:port, reconnects after a failure

A handler or client that fails reports the exception (events.error) and goes on: the
server keeps accepting, a client reconnects (re-reading the port: a killed server is
restarted by the driver on a new one). Every call has a timeout.
"""
import os
import sys
import threading
import time

import numpy as np

import tensorwire as tw
from events import Progress, emit, error, read_file, write_file
from payloads import check, make

CALL_TIMEOUT = 30.0  # longer than any fault the killer holds (a stop, a cut)
NBYTES = 32 << 10


def to_td(payload, who):
    return tw.TensorDict({**payload, "who": who}, batch_size=[])


def server(rundir):
    srv = tw.TensorDictServer(0)
    write_file(os.path.join(rundir, "pipe_port"), str(srv.port))
    emit("ready", port=srv.port)
    progress = Progress()
    lock = threading.Lock()

    def serve(pipe):
        who = None
        try:
            while True:
                td = pipe.recv(timeout=CALL_TIMEOUT)
                who = td["who"]
                seq = int(np.asarray(td["seq"])[0])
                bad = check(who, seq, td)
                if bad:
                    emit("corrupt", what=f"pipe server from {who}: {bad}")
                pipe.send(td, timeout=CALL_TIMEOUT)
                with lock:
                    progress.add()
        except tw.ClosedError as e:
            if not pipe.closed_by_peer:
                error(e, peer=who)
        except TimeoutError as e:
            error(e, peer=who)
        finally:
            pipe.close()

    while True:
        pipe = srv.accept(timeout=1.0)
        if pipe is not None:
            threading.Thread(target=serve, args=(pipe,), daemon=True).start()


def client(rundir, host):
    who = os.environ["CHAOS_ROLE"]
    seq = 0
    progress = Progress()
    while True:
        port = read_file(os.path.join(rundir, "pipe_port"), timeout=CALL_TIMEOUT)
        if port is None:
            emit("error", type="NoServer", message="no pipe_port file for 30 s")
            continue
        try:
            pipe = tw.TensorDictPipe.connect(host, int(port), timeout=10)
        except Exception as e:  # noqa: BLE001 - the checker judges the type
            emit("connect_failed", type=type(e).__name__, message=str(e)[:300])
            time.sleep(0.2)
            continue
        emit("connected", port=int(port), transports=pipe.transports)
        try:
            while True:
                seq += 1
                pipe.send(to_td(make(who, seq, NBYTES), who), timeout=CALL_TIMEOUT)
                back = pipe.recv(timeout=CALL_TIMEOUT)
                bad = check(who, seq, back)
                if bad:
                    emit("corrupt", what=f"pipe echo to {who}: {bad}")
                progress.add()
                time.sleep(0.002)  # a steady stream, not a saturating one (2 shared cores)
        except (tw.ClosedError, TimeoutError) as e:
            error(e)
        finally:
            pipe.close()
        time.sleep(0.2)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2])
    else:
        client(sys.argv[2], sys.argv[3])
