"""The head's share of the cores: how many workers a ClusterEnv runs inline by default, and the one line it logs
when torch in the head runs more threads than the worker processes leave it."""

from __future__ import annotations

import pytest
import torch

from frugalrl import ClusterEnv
from frugalrl.envs import backends

pytestmark = pytest.mark.timeout(60)


def test_inline_workers_keep_the_processes_fewer_than_the_cores(monkeypatch):
    monkeypatch.setattr(backends, "_cores", lambda: 2)
    assert [backends.inline_workers("local", n, None) for n in (1, 2, 4)] == [0, 1, 3]
    monkeypatch.setattr(backends, "_cores", lambda: 16)
    assert [backends.inline_workers("local", n, None) for n in (2, 15, 16)] == [0, 0, 1]
    assert backends.inline_workers("ray", 4, None) == 0
    with pytest.raises(ValueError, match="applies to backend='local' only"):
        backends.inline_workers("ray", 4, 1)


@pytest.mark.parametrize("backend", ["local", "serial"])
def test_torch_threads_that_crowd_the_workers_are_named_once(monkeypatch, caplog, backend):
    monkeypatch.setattr(backends, "_cores", lambda: 2)
    monkeypatch.setattr(backends, "_threads_noted", False)
    threads = torch.get_num_threads()
    caplog.set_level("WARNING", logger="frugalrl")
    try:
        torch.set_num_threads(2)
        for _ in range(2):  # one process worker beside two torch threads on two cores
            ClusterEnv("CartPole-v1", 1, 1, backend=backend, inline_workers=0 if backend == "local" else None).close()
    finally:
        torch.set_num_threads(threads)
    lines = [r.getMessage() for r in caplog.records if "torch runs" in r.getMessage()]
    if backend == "serial":  # no worker process: nothing to crowd
        assert lines == []
    else:
        assert lines == ["frugalrl: torch runs 2 threads in this process while 1 ClusterEnv worker process(es) step "
                         "envs on its 2 cores; torch.set_num_threads(1) before your loop leaves them their cores "
                         "(docs/clusterenv.md#head-threads)"]


def test_one_torch_thread_or_no_worker_process_says_nothing(monkeypatch, caplog):
    monkeypatch.setattr(backends, "_cores", lambda: 2)
    monkeypatch.setattr(backends, "_threads_noted", False)
    caplog.set_level("WARNING", logger="frugalrl")
    assert torch.get_num_threads() == 1  # the suite's (conftest)
    ClusterEnv("CartPole-v1", 1, 1, backend="local", inline_workers=0).close()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        ClusterEnv("CartPole-v1", 1, 1, backend="local", inline_workers=1).close()  # every worker inline
    finally:
        torch.set_num_threads(threads)
    assert "torch runs" not in caplog.text
