"""A Python peer for the pipe tests, run as a separate process.

    py_pipe_peer.py send HOST PORT COUNT [--nc] [--key K] [--hang] [--dropin]
    py_pipe_peer.py echo HOST PORT COUNT [--nc]
Sends COUNT dicts {"x": float32[4] = i, "nested": {"y": int64[4]}, "label": "step",
"tags": NonTensorStack}, the same shape as examples/pipe_peer.cpp.
"""
import argparse
import asyncio
import sys
import time

import numpy as np

import tensorwire as tw


def make(i):
    return tw.TensorDict({"x": np.full(4, i, np.float32), "nested": {"y": np.arange(i, i + 4, dtype=np.int64)},
                          "label": "step", "tags": tw.NonTensorStack(["a", "b", "c", "d"])}, batch_size=[4])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("--nc", action="store_true")
    ap.add_argument("--key")
    ap.add_argument("--hang", action="store_true")
    ap.add_argument("--dropin", action="store_true")
    a = ap.parse_args()
    try:
        if a.dropin:
            import torch
            from tensordict import TensorDict

            from tensorwire.tensordict import TensorDictPipe

            # tensordict's own idiom: an async connect, then td.send(pipe), which tensordict
            # dispatches to pipe.send (called outside any running loop)
            pipe = asyncio.run(TensorDictPipe.connect(a.host, a.port, consolidated=not a.nc))
            for i in range(a.count):
                td = TensorDict({"x": torch.full((4,), float(i)), "nested": {"y": torch.arange(i, i + 4)},
                                 "label": "step"}, batch_size=[4])
                td.send(pipe)
            pipe.close()
            return 0
        pipe = tw.TensorDictPipe.connect(a.host, a.port, consolidated=not a.nc, auth_key=a.key)
        if a.cmd == "send":
            for i in range(a.count):
                pipe.send(make(i))
            if a.hang:
                time.sleep(3600)
        elif a.cmd == "echo":
            for _ in range(a.count):
                pipe.send(pipe.recv())
        pipe.close()
        return 0
    except RuntimeError as e:
        print(f"py_pipe_peer: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
