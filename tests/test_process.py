"""The process layer (frugalrl.process): start, handshake, errors, death, orphans, process groups, stop.

The children run entry points of tests/process_children.py (the tests directory is on their import path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import pid_alive, pid_exists, wait_dead

from frugalrl.process import ChildExited, ParentGone, ParentLink, child_error, command, poll_children, spawn
from frugalrl.wire.message import Message, encode_message

pytestmark = pytest.mark.timeout(60)

ECHO = "process_children:echo_entry"


class StartError(RuntimeError):
    """The error class a caller chose."""


def started(config: dict | None = None, **kwargs):
    child = spawn(ECHO, config or {}, name="child 7", **kwargs)
    msg, sizes = child.await_ready(time.monotonic() + 30)
    return child, msg, sizes


def test_handshake_messages_and_stop():
    child, ready, sizes = started({"x": 1})
    try:
        assert ready.op == "ready" and ready.meta == {"pid": child.pid}
        assert sizes["control"] > 0 and child.config_sizes["control"] > 0
        hello = Message("hello", {"n": 3})
        for _ in range(2):  # two requests before reading: the second reply may wait in the receive buffer
            assert child.send(hello) == {"control": len(encode_message(hello)[0])}
        for _ in range(2):
            msg, _ = child.wait_message(10)
            assert (msg.op, msg.meta) == ("hello", {"n": 3})
        assert child.poll(0.1) is None  # nothing more to read, still running
        assert pid_alive(child.pid) and os.getpgid(child.pid) == child.pid  # leads its own process group
    finally:
        code = child.stop(5.0)
    assert code == 0  # it saw the end of the connection and returned
    assert not pid_exists(child.pid)  # reaped
    assert child.stop(1.0) == 0  # idempotent


def test_child_gets_the_parents_import_path_and_optionally_one_blas_thread():
    for one in (False, True):
        child, _, _ = started(one_blas_thread=one)
        try:
            child.send(Message("env"))
            env = child.wait_message(10)[0].meta
        finally:
            child.stop(1.0)
        assert env["PYTHONPATH"].split(os.pathsep) == [p for p in sys.path if p]
        if one:
            assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"


def test_build_errors_are_named_and_value_errors_can_stay_value_errors():
    child = spawn(ECHO, {"fail": "value"}, name="worker 3")
    with pytest.raises(ValueError, match=r"^worker 3 could not start: ValueError: a bad value in the config$"):
        child.await_ready(time.monotonic() + 30, error=StartError, keep_value_error=True)
    child.stop(5.0)
    child = spawn(ECHO, {"fail": "value"}, name="worker 3")
    with pytest.raises(StartError, match=r"^worker 3 could not start: ValueError: a bad value"):
        child.await_ready(time.monotonic() + 30, error=StartError)
    child.stop(5.0)
    child = spawn(ECHO, {"fail": "other"}, name="worker 4")
    with pytest.raises(StartError, match=r"^worker 4 could not start: KeyError: 'missing'$"):
        child.await_ready(time.monotonic() + 30, error=StartError, keep_value_error=True)
    assert child.stop(5.0) == 0  # it returned after reporting


def test_hung_start_hits_the_deadline_and_is_killed():
    child = spawn(ECHO, {"hang": True}, name="worker 5")
    t0 = time.monotonic()
    with pytest.raises(StartError, match=r"^worker 5 died or hung while starting \(exit code None\)$"):
        child.await_ready(time.monotonic() + 1.5, error=StartError)
    assert time.monotonic() - t0 < 5.0
    assert child.stop(0.0) == -signal.SIGKILL


def test_death_is_seen_at_once_and_reported():
    child, _, _ = started()
    child.send(Message("exit", {"code": 3}))
    t0 = time.monotonic()
    assert poll_children([child], 10) == [child]
    assert child.poll(0) in ("message", "exited")  # the end of the connection, or the pidfd
    with pytest.raises(ChildExited, match=r"child 7 died \(exit code 3\)") as e:
        child.wait_message(10)
    assert e.value.exitcode == 3 and time.monotonic() - t0 < 5.0
    assert not pid_exists(child.pid)
    child.stop(0.0)


def test_sigint_is_ignored_by_children():
    child, _, _ = started()
    try:
        child.send(Message("sigint"))
        assert child.wait_message(10)[0].op == "alive"
        os.kill(child.pid, signal.SIGINT)
        assert child.poll(0.3) is None and pid_alive(child.pid)
    finally:
        child.stop(1.0)


def test_stop_kills_the_whole_process_group():
    child, _, _ = started()
    child.send(Message("grandchild"))
    grandchild = child.wait_message(10)[0].meta["pid"]
    assert pid_alive(grandchild) and os.getpgid(grandchild) == child.pid
    child.send(Message("exit", {"code": 0}))  # the child ends; its own child would run on
    assert child.exited(10)
    child.stop(0.0)  # kills the group before reaping the child
    assert wait_dead(grandchild), "the child's own child survived stop()"


def test_a_child_exits_by_itself_when_its_parent_is_gone():
    head = subprocess.Popen(command("process_children:head_entry"), stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    try:
        grandchild = int(head.stdout.readline())
        assert pid_alive(grandchild)
    finally:
        head.kill()
        head.wait(10)
    assert wait_dead(grandchild, timeout=5.0), "the child outlived its parent"


def test_parent_link_without_a_parent():
    import socket

    mine, theirs = socket.socketpair()
    link = ParentLink(theirs, os.getpid())
    mine.close()
    with pytest.raises(ParentGone):
        link.recv()
    link.close()
    with pytest.raises(ValueError, match="module:function"):
        command("no_function_here")


def test_supervising_long_running_children_that_report_done_or_an_error(tmp_path):
    """The launcher pattern: children that compute, then report ``done`` or an error, watched together."""
    logs = [open(tmp_path / f"stage{r}.log", "w") for r in (0, 1)]  # noqa: SIM115 - closed below
    children = [
        spawn("process_children:stage_entry", {"rank": r, "seconds": 0.2 + 0.5 * r, "fail": r == 1},
              name=f"pipeline stage {r}", log=logs[r])
        for r in (0, 1)
    ]
    try:
        for child in children:
            child.await_ready(time.monotonic() + 30)
        reports = {}
        deadline = time.monotonic() + 30
        while len(reports) < 2 and time.monotonic() < deadline:
            for child in poll_children(children, 1.0):
                reports[child.name] = child.wait_message(0)[0]
        done, failed = reports["pipeline stage 0"], reports["pipeline stage 1"]
        assert (done.op, done.meta) == ("done", {"rank": 0})
        error = child_error("pipeline stage 1", failed.meta, keep_value_error=True, what="failed")
        assert isinstance(error, ValueError)
        assert str(error) == "pipeline stage 1 failed: ValueError: stage 1 went wrong"
    finally:
        codes = [child.stop(5.0) for child in children]
        for log in logs:
            log.close()
    assert codes == [0, 0]
    assert (tmp_path / "stage1.log").read_text() == "stage 1 finished\n"


def test_spin_returns_when_ready_gives_up_in_time_and_backs_off_under_contention(monkeypatch):
    import frugalrl.process as process

    calls = iter([False, False, True])
    assert process.spin(lambda: next(calls), 1.0)
    t0 = time.perf_counter()
    assert not process.spin(lambda: False, 0.002)
    assert time.perf_counter() - t0 < 0.5
    monkeypatch.setattr(process, "SPIN_CONTENDED_S", -1.0)  # every yield looks contended
    monkeypatch.setattr(process, "_spin_off_until", 0.0)
    polls = []
    assert not process.spin(lambda: polls.append(1) or False, 1.0)
    assert len(polls) == 2  # one poll, one yield, the last look
    polls.clear()
    assert not process.spin(lambda: polls.append(1) or False, 1.0)
    assert len(polls) == 1  # backing off: one look, no spinning


def test_frugalrl_spin_ms_sets_the_local_backends_spin_and_a_bad_value_is_one_clear_line(monkeypatch):
    from frugalrl.envs.backends.local import SPIN_S, spin_seconds

    monkeypatch.delenv("FRUGALRL_SPIN_MS", raising=False)
    assert spin_seconds() == SPIN_S
    monkeypatch.setenv("FRUGALRL_SPIN_MS", "0.25")
    assert spin_seconds() == 0.00025
    for bad in ("fast", "-1", "5000"):
        monkeypatch.setenv("FRUGALRL_SPIN_MS", bad)
        with pytest.raises(ValueError, match=r"FRUGALRL_SPIN_MS must be a number of milliseconds in \[0, 1000\]"):
            spin_seconds()
