"""The simulated-hosts fixture itself (hosts.py): reachability, silent cuts, cleanup."""
import os
import signal
import subprocess
import sys
import time

import pytest

import hosts as hosts_mod
from hosts import Hosts, _netns_list

# A TCP echo server on HOST:PORT: prints "ready", then echoes one line per connection.
ECHO = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.recv(100))
    c.close()
"""

# Connects to HOST:PORT with a timeout, sends a line, prints the reply or the error's class.
CLIENT = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    s.settimeout(float(sys.argv[3]))
    s.sendall(b"hello")
    print(s.recv(100).decode())
except OSError as e:
    print(type(e).__name__)
"""


def echo_on(host, port=7000):
    p = host.python(ECHO, host.addr, port)
    assert p.stdout.readline().strip() == "ready"
    return p


def call(host, addr, port=7000, timeout=5.0):
    p = host.python(CLIENT, addr, port, timeout)
    out, err = p.communicate(timeout=timeout + 30)
    assert p.returncode == 0, err
    return out.strip()


def test_each_host_has_its_own_address_and_reaches_the_others(three_hosts):
    a, b, c = three_hosts
    assert len({a.addr, b.addr, c.addr}) == 3
    assert all(h.addr.startswith("198.18.0.") for h in three_hosts)
    echo_on(a)
    assert call(b, a.addr) == "hello"
    assert call(c, a.addr) == "hello"
    assert call(a, "127.0.0.1") == "ConnectionRefusedError"  # its own loopback, nothing there


def test_a_cut_link_is_silent_and_restore_brings_it_back(hosts):
    a, b = hosts
    echo_on(a)
    # A connection made before the cut: after it, a send gets neither a reply nor an error.
    held = b.python("""
import socket, sys
s = socket.create_connection((sys.argv[1], 7000), timeout=5)
print("connected", flush=True)
sys.stdin.readline()
s.settimeout(1.5)
s.sendall(b"after cut")
try:
    print("reply", s.recv(100), flush=True)
except OSError as e:
    print(type(e).__name__, flush=True)
""", a.addr, stdin=subprocess.PIPE)
    assert held.stdout.readline().strip() == "connected"
    hosts.cut(b)
    held.stdin.write("go\n")
    held.stdin.flush()
    assert held.stdout.readline().strip() in ("TimeoutError", "timeout")  # silence: no RST
    assert call(b, a.addr, timeout=1.0) in ("TimeoutError", "timeout")
    hosts.restore(b)
    assert call(b, a.addr) == "hello"


def test_close_kills_the_hosts_processes_and_removes_every_namespace():
    h = Hosts(2)
    names = [h.switch] + [x.name for x in h]
    assert set(names) <= set(_netns_list())
    sleeper = h[1].python("import time; print('up', flush=True); time.sleep(600)")
    # Wait until the command runs: a host stopped while nsenter is still entering its
    # namespaces makes nsenter fail (exit 1) rather than its command die of SIGKILL.
    assert sleeper.stdout.readline().strip() == "up"
    h.close()
    assert sleeper.poll() == -signal.SIGKILL
    assert not set(names) & set(_netns_list())


def test_a_failing_test_still_cleans_up():
    with pytest.raises(ZeroDivisionError):
        with Hosts(2) as h:
            names = [h.switch] + [x.name for x in h]
            h[0].python("import time; time.sleep(600)")
            1 / 0
    assert not set(names) & set(_netns_list())


def test_namespaces_of_a_killed_run_are_removed_by_the_next():
    # A run killed outright (SIGKILL: no finaliser, no atexit) leaves its namespaces and the
    # processes in them; the next Hosts() removes both.
    code = f"""
import sys, time
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from hosts import Hosts
h = Hosts(2)
h[0].python("import time; time.sleep(600)")
print(h.switch, h[0].name, h[1].name, flush=True)
time.sleep(600)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        names = p.stdout.readline().split()
        assert len(names) == 3 and set(names) <= set(_netns_list())
        leftover = [int(x) for x in subprocess.run(["ip", "netns", "pids", names[1]], capture_output=True,
                                                   text=True).stdout.split()]
        assert leftover
    finally:
        p.kill()
        p.wait()
    hosts_mod.remove_stale()
    assert not set(names) & set(_netns_list())
    alive = [pid for pid in leftover if os.path.exists(f"/proc/{pid}") and not _zombie(pid)]
    assert not alive, [open(f"/proc/{pid}/stat").read() for pid in alive]


def test_namespaces_of_a_run_in_another_pid_namespace_are_left_alone():
    # A run in another pid namespace (a CI job in a container beside a run on the host):
    # its pid means nothing in this /proc, so whether it lives cannot be told here. Looking
    # it up anyway, a run deleted the namespaces of a live run beside it.
    other = hosts_mod._pid_namespace() + 1
    name = f"{hosts_mod.PREFIX}{2 ** 22 + 7}i{other}x0h0"  # above the largest pid Linux gives
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        hosts_mod.remove_stale()
        assert name in _netns_list()
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)
    assert name not in _netns_list()


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_processes_of_one_host_share_its_namespaces_and_other_hosts_do_not(hosts):
    a, b = hosts
    show = "import os; print(*(os.readlink(f'/proc/self/ns/{n}') for n in ('net', 'ipc', 'pid')))"
    a1, a2, b1 = (h.python(show).communicate(timeout=30)[0].split() for h in (a, a, b))
    assert a1 == a2
    assert all(x != y for x, y in zip(a1, b1))
    assert a1 != open_ns()


def open_ns():
    return [os.readlink(f"/proc/self/ns/{n}") for n in ("net", "ipc", "pid")]
