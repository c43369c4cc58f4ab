"""The inference system of the soak: an InferenceServer on a SharedMemoryTransport and
actor processes attached to it by name.

    inference_stream.py server RUNDIR     writes the transport's name to RUNDIR/inference_name
    inference_stream.py actor RUNDIR      calls the server in a loop, checks every response

The policy answers obs with act = 2 * obs + 1 and the CRC32 of act, so an actor checks
both the arithmetic (its own request came back, not another actor's) and the bytes.
An actor that gets ClosedError (the server died) re-reads the name and attaches to the
server the driver restarted. Every call has a timeout.
"""
import os
import sys
import time

import numpy as np

import tensorwire as tw
from events import Progress, emit, error, read_file, write_file
from payloads import crc

OBS = 256
CALL_TIMEOUT = 30.0


def policy(batch):
    act = np.asarray(batch["obs"]) * 2 + 1
    sums = np.array([[crc(row)] for row in act], np.int64)
    return tw.TensorDict({"act": act, "crc": sums}, batch_size=[act.shape[0]])


def server(rundir):
    request = {"obs": np.zeros(OBS, np.float32)}
    response = {"act": np.zeros(OBS, np.float32), "crc": np.zeros(1, np.int64)}
    transport = tw.SharedMemoryTransport(request, response, num_slots=16,
                                         name=f"chaos-{os.getpid()}-{time.monotonic_ns()}")
    srv = tw.InferenceServer(policy, transport, max_batch_size=16).start()
    write_file(os.path.join(rundir, "inference_name"), transport.name)
    emit("ready", name=transport.name)
    while True:
        time.sleep(0.5)
        emit("status", slots_in_use=transport.slots_in_use, alive=srv.is_alive)


def actor(rundir):
    rng = np.random.default_rng(os.getpid())
    progress = Progress()
    while True:
        name = read_file(os.path.join(rundir, "inference_name"), timeout=CALL_TIMEOUT)
        if name is None:
            emit("error", type="NoServer", message="no inference_name file for 30 s")
            continue
        client = tw.SharedMemoryTransport.client_for(name)
        try:
            while True:
                obs = rng.integers(0, 1000, OBS).astype(np.float32)
                out = client({"obs": obs}, timeout=CALL_TIMEOUT)
                act = np.asarray(out["act"])
                if not np.array_equal(act, obs * 2 + 1):
                    emit("corrupt", what="inference response is not this request's answer")
                elif crc(act) != int(np.asarray(out["crc"])[0]):
                    emit("corrupt", what="inference response: crc32 of act does not match")
                progress.add(server=name)
                time.sleep(0.002)
        except (tw.ClosedError, TimeoutError) as e:
            error(e, server=name)
        except Exception as e:  # noqa: BLE001 - attaching to a dead server's name: judged by the checker
            error(e, server=name)
        finally:
            client.close()
        time.sleep(0.2)


if __name__ == "__main__":
    (server if sys.argv[1] == "server" else actor)(sys.argv[2])
