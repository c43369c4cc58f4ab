"""A process that holds a PipeListener, a TensorDictServer and a connected pipe starts
children with multiprocessing (fork and spawn). Each scenario runs as its own script, so
the parent's exit code and stderr are checked too (nothing may abort or print)."""
import os
import subprocess
import sys
import textwrap

from conftest import PYTHONPATH

PARENT = textwrap.dedent('''
    import multiprocessing as mp
    import sys
    import threading
    import time

    import numpy as np
    import tensorwire as tw


    def use_inherited(pipe, listener, server, q):
        out = []
        for name, call in (("pipe", lambda: pipe.send(tw.TensorDict({"v": [1.0]}, batch_size=[1]), timeout=1)),
                           ("listener", lambda: listener.accept(timeout=1)),
                           ("server", lambda: server.accept(timeout=1))):
            try:
                call()
                out.append(name + " worked?!")
            except tw.ClosedError as e:
                out.append(name + (": fork named" if "forked child" in str(e) else ": " + str(e)))
        q.put(out)


    def only_exit(pipe, listener, server, q):
        q.put(["exited"])


    def connect_back(port, q):
        start = time.monotonic()
        try:
            with tw.TensorDictPipe.connect("127.0.0.1", port, timeout=20) as pipe:
                pipe.send(tw.TensorDict({"v": [5.0]}, batch_size=[1]), timeout=20)
                pipe.recv(timeout=20)  # the parent's ack: the message was taken
            q.put(["sent"])
        except RuntimeError as e:
            q.put(["refused" if "spawn" in str(e) and time.monotonic() - start < 2 else str(e)])


    if __name__ == "__main__":
        method, scenario = sys.argv[1], sys.argv[2]
        ctx = mp.get_context(method)
        with tw.PipeListener(0) as listener, tw.TensorDictServer(0) as server:
            got = {}
            t = threading.Thread(target=lambda: got.setdefault("pipe", listener.accept(timeout=30)))
            t.start()
            mine = tw.TensorDictPipe.connect("127.0.0.1", listener.port, timeout=30)
            t.join()
            q = ctx.Queue()
            if scenario == "connect_back":
                child = ctx.Process(target=connect_back, args=(listener.port, q))
                child.start()
                if method == "spawn":
                    pipe = listener.accept(timeout=60)
                    print(pipe.recv(timeout=30)["v"].tolist())
                    pipe.send(tw.TensorDict({"ok": [1]}, batch_size=[1]), timeout=30)
            else:
                target = use_inherited if scenario == "use_inherited" else only_exit
                child = ctx.Process(target=target, args=(got["pipe"], listener, server, q))
                child.start()
            print(q.get(timeout=60))
            child.join(60)
            print("child exit", child.exitcode)
            # The parent's own pipe works after the child is gone.
            mine.send(tw.TensorDict({"v": [2.0]}, batch_size=[1]), timeout=30)
            print(got["pipe"].recv(timeout=30)["v"].tolist())
            mine.close()
''')


def run(tmp_path, method, scenario):
    path = tmp_path / "parent.py"
    path.write_text(PARENT)
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    r = subprocess.run([sys.executable, str(path), method, scenario], capture_output=True, text=True,
                       env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # nothing aborted or printed, in the child or the parent
    return r.stdout.splitlines()


def test_a_forked_child_that_uses_inherited_objects_gets_closederror_naming_the_fork(tmp_path):
    assert run(tmp_path, "fork", "use_inherited") == [
        "['pipe: fork named', 'listener: fork named', 'server: fork named']", "child exit 0", "[2.0]"]


def test_a_forked_child_that_only_exits_leaves_everything_working(tmp_path):
    assert run(tmp_path, "fork", "only_exit") == ["['exited']", "child exit 0", "[2.0]"]


def test_a_spawned_child_connects_back_to_its_parent(tmp_path):
    assert run(tmp_path, "spawn", "connect_back") == ["[5.0]", "['sent']", "child exit 0", "[2.0]"]


def test_a_child_forked_while_ucx_is_in_use_cannot_open_pipes_and_says_so_at_once(tmp_path):
    # UCX 1.13 does not survive fork() (docs/pipe.md, "UCX and fork"): the child gets an
    # immediate error that points to spawn/forkserver instead of a hang.
    assert run(tmp_path, "fork", "connect_back") == ["['refused']", "child exit 0", "[2.0]"]


def test_pipes_listeners_and_servers_cannot_be_pickled_for_a_spawned_child(tmp_path):
    path = tmp_path / "pickling.py"
    path.write_text(textwrap.dedent('''
        import pickle
        import tensorwire as tw
        with tw.PipeListener(0) as listener, tw.TensorDictServer(0) as server:
            for obj in (listener, server):
                try:
                    pickle.dumps(obj)
                except (TypeError, pickle.PicklingError):
                    print("refused")
    '''))
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["refused", "refused"], r.stderr
