"""ClusterEnv's EnvPool-style send / recv (frugalrl.envs.pool): the same trajectories as step(), envs in flight
overlap, bad ids and misuse are clear errors, a worker that dies mid-flight is replaced."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from frugalrl import ClusterEnv

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def _spin(spinning):
    """The local backend's default waiting, spinning included (tests/conftest.py turns it off elsewhere)."""


def _actions(env_ids: np.ndarray, t: np.ndarray) -> np.ndarray:
    return ((t[env_ids] + env_ids) // 3 % 2).astype(np.int64)  # a fixed sequence per env


@pytest.mark.parametrize("backend", ["local", "serial"])
def test_send_recv_gives_each_env_the_trajectory_step_gives(backend, closing):
    n, steps = 4, 40
    env = closing(ClusterEnv("CartPole-v1", 2, 2, backend=backend, seed=3))
    obs, _ = env.reset(seed=3)
    t = np.zeros(n, np.int64)
    want = [[o] for o in obs]
    for _ in range(steps):
        obs, rew, term, trunc, _ = env.step(_actions(np.arange(n), t))
        t += 1
        for j in range(n):
            want[j].append((obs[j], rew[j], term[j], trunc[j]))
    env.async_reset(seed=3)
    got: list[list] = [[] for _ in range(n)]
    t[:] = 0
    sent = np.zeros(n, np.int64)
    while sent.min() < steps or env._in_flight:
        obs, rew, term, trunc, info = env.recv()
        ids = info["env_id"]
        assert len(ids) % 2 == 0 and len(ids) == len(obs)
        for i, j in enumerate(ids):
            got[j].append(obs[i] if not got[j] else (obs[i], rew[i], term[i], trunc[i]))
        ids = ids[sent[ids] < steps]  # each worker's envs are sent together: steps for all of them or none
        if len(ids):
            env.send(_actions(ids, t), ids)
            t[ids] += 1
            sent[ids] += 1
    assert [len(g) for g in got] == [len(g) for g in want]
    for j in range(n):
        np.testing.assert_array_equal(got[j][0], want[j][0])
        for (o, r, te, tr), (wo, wr, wte, wtr) in zip(got[j][1:], want[j][1:], strict=True):
            np.testing.assert_array_equal(o, wo)
            assert (r, te, tr) == (wr, wte, wtr)


def test_misuse_is_a_clear_error_and_a_dead_worker_is_replaced(closing):
    env = closing(ClusterEnv("CartPole-v1", 2, 2, backend="local", seed=0))
    with pytest.raises(RuntimeError, match="no envs in flight"):
        env.recv()
    env.async_reset(seed=0)
    with pytest.raises(RuntimeError, match=r"in flight .*recv\(\) them first"):
        env.step(np.zeros(4, np.int64))
    env.recv(min_workers=2)
    with pytest.raises(ValueError, match="whole workers"):
        env.send(np.zeros(1, np.int64), [1])
    with pytest.raises(ValueError, match="indices"):
        env.send(np.zeros(2, np.int64), [4, 5])
    env.send(np.zeros(2, np.int64), [3, 2])  # any order within whole workers
    with pytest.raises(RuntimeError, match="in flight"):
        env.send(np.zeros(2, np.int64), [2, 3])
    _, _, _, _, info = env.recv()
    assert info["env_id"].tolist() == [2, 3]
    env.step(np.zeros(4, np.int64))  # nothing in flight: synchronous steps again

    # A worker that dies with envs in flight is replaced; its envs come back truncated.
    os.kill(env.backend.worker_pids()[1], signal.SIGKILL)
    env.send(np.zeros(4, np.int64))
    got = {}
    while len(got) < 4:
        _, _, _, trunc, info = env.recv()
        for i, j in enumerate(info["env_id"]):
            got[int(j)] = (bool(trunc[i]), bool(info.get("worker_restarted", np.zeros(len(trunc), bool))[i]))
    assert got[2] == got[3] == (True, True)
    assert len(env.restart_events) == 1
