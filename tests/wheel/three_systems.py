"""The three systems, run from an installed wheel, then the libraries this process mapped.

    python three_systems.py
A pipe between two processes (a child connects and sends), an inference round trip (a
child process calls an InferenceServer over shared memory) and a runner epoch (forked
workers, ZeroMQ descriptors). Prints one line per system, then one line per native library
this process has mapped (`lib PATH`), for tests/wheel/test_installed_wheel.py to judge.
"""
import multiprocessing as mp
import subprocess
import sys
import textwrap

import numpy as np

import tensorwire as tw

SENDER = textwrap.dedent("""
    import sys, numpy as np, tensorwire as tw
    pipe = tw.TensorDictPipe.connect("127.0.0.1", int(sys.argv[1]), timeout=30)
    for i in range(3):
        pipe.send(tw.TensorDict({"x": np.full(4, i, np.float32)}, batch_size=[4]))
    pipe.close()
""")


def pipe_between_processes():
    with tw.PipeListener(0) as listener:
        child = subprocess.Popen([sys.executable, "-c", SENDER, str(listener.port)])
        pipe = listener.accept(timeout=30)
        got = [float(pipe.recv(timeout=30)["x"][0]) for _ in range(3)]
        assert child.wait(30) == 0
        pipe.close()
    assert got == [0.0, 1.0, 2.0], got
    return f"pipe: received {got} from process {child.pid}"


def double(batch):
    out = tw.TensorDict(batch_size=batch.batch_size)
    out["action"] = batch["observation"] * 2
    return out


def call_server(transport, queue):
    r = transport.client()(tw.TensorDict({"observation": np.full(2, 21, np.float32)}), timeout=30)
    queue.put(float(r["action"][0]))


def inference_round_trip():
    transport = tw.SharedMemoryTransport(tw.TensorDict({"observation": np.zeros(2, np.float32)}),
                                         tw.TensorDict({"action": np.zeros(2, np.float32)}), num_slots=2)
    ctx = mp.get_context("spawn")
    with tw.InferenceServer(double, transport):
        queue = ctx.Queue()
        child = ctx.Process(target=call_server, args=(transport, queue))
        child.start()
        answer = queue.get(timeout=60)
        child.join(30)
    assert answer == 42.0 and child.exitcode == 0, (answer, child.exitcode)
    return f"inference: 21 -> {answer} for process {child.pid}"


class Squares:
    def reset_state(self):
        pass

    def __len__(self):
        return 20

    def __iter__(self):
        for i in range(20):
            yield [np.full(8, i, np.int64), i * i]


def runner_epoch():
    with tw.MultiProcessRunnerZMQ(Squares(), num_proc=2) as runner:
        runner.reset_state()
        got = [(int(x[0]), int(sq)) for x, sq in runner]
    # Each worker runs the whole dataflow, as tensorpack's runner does: an epoch is len()
    # datapoints from either worker, so a value may come twice and another not at all.
    assert len(got) == 20 and all(sq == i * i and 0 <= i < 20 for i, sq in got), got
    return f"runner: one epoch of {len(got)} datapoints from 2 workers"


def mapped_libraries():
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and ".so" in parts[5]:
                paths.add(parts[5].strip())
    return sorted(paths)


if __name__ == "__main__":
    print(pipe_between_processes())
    print(inference_round_trip())
    print(runner_epoch())
    for path in mapped_libraries():
        print("lib", path)
