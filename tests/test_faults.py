"""Worker failures on the local backend: SIGKILLed or hanging workers are detected and replaced.

A worker killed between rollouts, or silent, on every backend with processes: tests/test_backend_contract.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from conftest import pid_exists, wait_dead

from frugalrl import ClusterEnv, make_agent

pytestmark = pytest.mark.timeout(120)

W, K = 2, 2
N = W * K
DETECT_S = 20.0  # generous bound for "detected and replaced within seconds" on a loaded 2-core machine


def kill(env: ClusterEnv, w: int) -> int:
    pid = env.backend.worker_pids()[w]
    os.kill(pid, signal.SIGKILL)
    assert wait_dead(pid), f"worker {w} (pid {pid}) survived SIGKILL"
    return pid


def agent_for(env: ClusterEnv, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return make_agent(env.single_observation_space, env.single_action_space, hidden=(16, 16))


def close_and_check(env: ClusterEnv, pids: set[int]) -> None:
    pids |= set(env.backend.worker_pids().values())
    env.close()
    left = [p for p in pids if pid_exists(p)]
    assert not left, f"processes left after close(): {left}"


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_kill_during_head_side_step(mode, closing):
    env = closing(ClusterEnv("CartPole-v1", W, K, backend="local", seed=1, autoreset_mode=mode))
    pids = set(env.backend.worker_pids().values())
    obs, _ = env.reset(seed=1)
    zeros = np.zeros(N, dtype=np.int64)
    for _ in range(3):
        obs = env.step(zeros)[0]
    kill(env, 0)
    t0 = time.monotonic()
    new_obs, rewards, terms, truncs, infos = env.step(zeros)
    assert time.monotonic() - t0 < DETECT_S
    np.testing.assert_array_equal(infos["worker_restarted"], [True] * K + [False] * K)
    np.testing.assert_array_equal(infos["_worker_restarted"], infos["worker_restarted"])
    assert truncs[:K].all() and not terms[:K].any()
    assert env.stats()["restarts"] == 1
    if mode == "NextStep":
        np.testing.assert_array_equal(new_obs[:K], obs[:K])  # last obs of the cut episode
        nxt, r2, te2, tr2, infos2 = env.step(zeros)
        assert "worker_restarted" not in infos2
        assert (r2[:K] == 0).all() and not te2[:K].any() and not tr2[:K].any()
        assert (np.abs(nxt[:K]) <= 0.05).all()  # the envs reset on this step
    else:
        assert infos["_final_obs"][:K].all()
        for j in range(K):
            np.testing.assert_array_equal(infos["final_obs"][j], obs[j])
        assert (np.abs(new_obs[:K]) <= 0.05).all()  # reset in the same step
    # The other worker was not disturbed.
    assert not truncs[K:].any() or (rewards[K:] == 1).all()
    env.step(zeros)
    close_and_check(env, pids)


def test_kill_during_step_with_agent(closing):
    env = closing(ClusterEnv("CartPole-v1", W, K, backend="local", seed=2))
    pids = set(env.backend.worker_pids().values())
    agent = agent_for(env)
    env.reset(seed=2)
    for _ in range(3):
        env.step(agent)
    kill(env, 1)  # found by the act_step request
    _, _, _, truncs, infos = env.step(agent)
    np.testing.assert_array_equal(infos["worker_restarted"], [False] * K + [True] * K)
    assert truncs[K:].all()
    _, _, _, _, infos = env.step(agent)
    assert "worker_restarted" not in infos
    np.testing.assert_array_equal(infos["policy_version"], [env.learner_version] * N)
    # A learner change, then a kill: found while syncing, before any step is taken.
    with torch.no_grad():
        agent.actor[-1].bias.add_(1.0)
    kill(env, 0)
    _, _, _, truncs, infos = env.step(agent)
    np.testing.assert_array_equal(infos["worker_restarted"], [True] * K + [False] * K)
    assert truncs[:K].all()
    assert env.stats()["restarts"] == 2
    _, rewards, _, _, infos = env.step(agent)
    assert "worker_restarted" not in infos and (rewards[:K] == 0).all()
    np.testing.assert_array_equal(infos["policy_version"], [env.learner_version] * N)
    # close() right after a kill that nobody has noticed yet.
    pids |= set(env.backend.worker_pids().values())
    kill(env, 1)
    close_and_check(env, pids)


def test_kill_mid_rollout(closing):
    env = closing(ClusterEnv("CartPole-v1", W, 1, backend="local", seed=3))
    pids = set(env.backend.worker_pids().values())
    agent = agent_for(env)
    T = 4000
    env.rollout(agent, T)  # warm up: weights sent, shared memory sized: the next call only rolls out
    victim = env.backend.worker_pids()[1]
    killed_at: list[float] = []

    def killer() -> None:
        time.sleep(0.15)
        os.kill(victim, signal.SIGKILL)
        killed_at.append(time.monotonic())

    thread = threading.Thread(target=killer)
    t0 = time.monotonic()
    thread.start()
    ro = env.rollout(agent, T)
    done_at = time.monotonic()
    thread.join()
    assert killed_at and killed_at[0] < done_at
    assert done_at - t0 < DETECT_S + 10
    assert ro.restarted_workers == [1]
    assert ro.obs.shape == (T, W, 4) and ro.rewards.shape == (T, W)
    assert (np.abs(ro.obs[0, 1]) <= 0.05).all()  # re-collected from the fresh worker, from a reset
    assert (ro.versions == env.learner_version).all()
    assert env.stats()["restarts"] == 1
    assert env.backend.worker_pids()[1] != victim
    close_and_check(env, pids | {victim})


def test_hanging_worker_is_declared_dead_and_replaced(tmp_path, closing):
    marker = str(tmp_path / "hung-once")
    env = closing(
        ClusterEnv(
            "envs_for_tests:HangingEnv", 1, 1, backend="local", seed=5, worker_timeout=2.0,
            env_kwargs={"hang_after": 5, "marker": marker},
        )
    )
    pids = set(env.backend.worker_pids().values())
    agent = agent_for(env)
    t0 = time.monotonic()
    ro = env.rollout(agent, 20)
    assert time.monotonic() - t0 < 2.0 + DETECT_S
    assert os.path.exists(marker)
    assert ro.restarted_workers == [0]
    assert ro.obs.shape == (20, 1, 2)
    event = env.stats()["restart_events"][0]
    assert "no reply within" in event["reason"]
    with open(marker) as f:
        hung_pid = int(f.read())
    assert hung_pid in pids and wait_dead(hung_pid)
    close_and_check(env, pids)


def test_always_hanging_worker_exhausts_restarts_with_a_clear_error():
    env = ClusterEnv(
        "envs_for_tests:HangingEnv", 1, 1, backend="local", seed=6, worker_timeout=1.5, max_restarts=1,
        env_kwargs={"hang_after": 3},
    )
    pids = set(env.backend.worker_pids().values())
    zeros = np.zeros(1, dtype=np.int64)
    env.reset()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker 0 failed \(no reply within .*restart budget of 1 is spent"):
        for _ in range(10):
            pids |= set(env.backend.worker_pids().values())
            env.step(zeros)
    assert time.monotonic() - t0 < 2 * 1.5 + DETECT_S
    assert env.closed
    left = [p for p in pids if pid_exists(p)]
    assert not left, f"processes left: {left}"
    with pytest.raises(RuntimeError, match="closed"):
        env.step(zeros)


def test_silent_worker_while_shared_memory_grows_is_replaced(closing):
    """A worker that stops answering just when a longer rollout grows the shared-memory arenas."""
    # The timeout must cover a healthy 4000-step rollout on a loaded 2-core CI machine.
    env = closing(ClusterEnv("CartPole-v1", W, 1, backend="local", seed=7, worker_timeout=8.0))
    agent = agent_for(env)
    env.rollout(agent, 8)
    pid = env.backend.worker_pids()[1]
    os.kill(pid, signal.SIGSTOP)  # alive but silent, like a hung worker
    try:
        ro = env.rollout(agent, 4000)  # a bigger fragment: the arenas are re-attached first
        assert ro.restarted_workers == [1]
    finally:
        with contextlib.suppress(ProcessLookupError):  # already killed and reaped by the restart
            os.kill(pid, signal.SIGKILL)
