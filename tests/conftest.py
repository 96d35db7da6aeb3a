"""Shared helpers for the frugalrl tests: process checks and env bookkeeping."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

TESTS_DIR = str(Path(__file__).resolve().parent)
if TESTS_DIR not in sys.path:  # worker processes inherit sys.path, so envs_for_tests imports there too
    sys.path.insert(0, TESTS_DIR)

# Spinning (the local backend's processes poll for 1 ms before they block) changes when a message is read, never what:
# most tests run without it, because with dozens of short-lived processes on two cores it costs the suite minutes.
# The backend contract and send/recv modules (`spinning` below) run the default, spinning included.
os.environ.setdefault("FRUGALRL_SPIN_MS", "0")


@pytest.fixture(scope="module")
def spinning():
    """The local backend's default waiting for the whole module: processes spin before they block."""
    old = os.environ.pop("FRUGALRL_SPIN_MS", None)
    yield
    if old is not None:
        os.environ["FRUGALRL_SPIN_MS"] = old


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid`` from /proc, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    rest = data[data.rindex(")") + 2 :].split()
    return rest[0], int(rest[1])


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a running (not zombie) process."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def pid_exists(pid: int) -> bool:
    """True if ``pid`` exists at all (a zombie counts: not reaped yet)."""
    return _stat(pid) is not None


def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    """Wait until ``pid`` is no longer running (zombie or gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.01)
    return not pid_alive(pid)


def worker_children() -> list[int]:
    """Children of this process that are frugalrl worker processes (running or zombie)."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is None or st[1] != me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"worker_entry" in cmd:
            out.append(int(name))
    return out


@pytest.fixture(scope="session", autouse=True)
def no_orphan_workers():
    """After the whole session, no worker process started by a test may be left behind."""
    yield
    import gc

    gc.collect()
    left = worker_children()
    assert not left, f"worker processes left after the test session: {left}"


@pytest.fixture
def closing():
    """Register ClusterEnvs to close at the end of a test, even when it fails."""
    envs = []

    def register(env):
        envs.append(env)
        return env

    yield register
    for env in envs:
        env.close()


# The suite runs beside worker processes on small machines: one intra-op thread in the test process
# avoids oversubscription (workers use one thread each too), and makes serial and local inference
# run the same kernels.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ray_8cpus():
    """A local Ray shared by a test module, with 8 logical CPUs so that several 2-worker envs or runs fit
    on 2 cores (an instance someone else started is used as it is)."""
    import ray

    if ray.is_initialized():  # pragma: no cover - someone else's instance
        yield
        return
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
