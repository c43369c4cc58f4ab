"""The chaos soak's checker rules (tests/chaos/checker.py) on made-up event logs: what it
lets through and what it calls a violation (the soak itself runs in `make test-chaos`)."""
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "chaos"))

import checker  # noqa: E402

ROLES = {"client": SimpleNamespace(system="pipe"), "runner": SimpleNamespace(system="runner")}


def fault(t, excuses, recovered):
    return SimpleNamespace(n=1, kind="kill_pipe_server", t=t, excuses=set(excuses), recovered_at=recovered)


def error(t, role="client", type="ClosedError", message="the peer closed the pipe"):
    return {"t": t, "role": role, "ev": "error", "type": type, "message": message}


def test_an_error_a_fault_of_its_system_explains_is_counted_not_a_violation():
    violations, surfaced = checker.judge_events([error(10.5)], [fault(10.0, {"pipe"}, 12.0)], ROLES, 100)
    assert violations == [] and surfaced == {"ClosedError": 1}


def test_an_error_with_no_fault_or_of_another_system_is_a_violation():
    v, _ = checker.judge_events([error(50.0)], [fault(10.0, {"pipe"}, 12.0)], ROLES, 100)
    assert len(v) == 1 and "no fault to explain it" in v[0]
    v, _ = checker.judge_events([error(10.5, role="runner", type="WorkerDiedError")],
                                [fault(10.0, {"pipe"}, 12.0)], ROLES, 100)
    assert len(v) == 1 and "runner: WorkerDiedError with no fault" in v[0]


def test_an_undocumented_exception_type_is_a_violation_even_during_a_fault():
    v, _ = checker.judge_events([error(10.5, type="ValueError")], [fault(10.0, {"pipe"}, 12.0)], ROLES, 100)
    assert len(v) == 1 and "ValueError is not what pipe documents" in v[0]


def test_corruption_and_unkilled_exits_are_violations_and_repeats_are_counted_once():
    events = [{"t": 1, "role": "client", "ev": "corrupt", "what": "crc"}] * 3 + [
        {"t": 2, "role": "runner", "ev": "exit", "killed": False, "pid": 7, "rc": -11}]
    v, _ = checker.judge_events(events, [], ROLES, 100)
    assert v == ["client: data not intact: crc (x3)", "runner (pid 7) exited with -11 without being killed"]


def test_events_of_the_teardown_are_not_judged():
    v, _ = checker.judge_events([error(101.0)], [], ROLES, 100)
    assert v == []


def test_a_known_bug_is_counted_apart(monkeypatch):
    monkeypatch.setattr(checker, "KNOWN_BUGS", [
        ("pipe", "RuntimeError", "ucp_worker_create: No such device", "a bug for the test")])
    known = {}
    ev = error(50.0, type="RuntimeError", message="ucp_worker_create: No such device")
    v, _ = checker.judge_events([ev], [], ROLES, 100, known)
    assert v == [] and list(known.values()) == [1]


def test_rss_growth_past_the_limit_of_a_long_lived_process_is_a_violation():
    flat = [(t, 100_000) for t in range(0, 120, 5)]
    grows = [(t, 50_000 + t * 2_000) for t in range(0, 120, 5)]
    short = [(0, 10_000), (10, 900_000)]
    rows, v = checker.judge_rss({("server", 1): flat, ("leaky", 1): grows, ("brief", 1): short})
    assert [r[0] for r in rows] == ["leaky", "server"]
    assert len(v) == 1 and v[0].startswith("leaky (incarnation 1): RSS grew")
