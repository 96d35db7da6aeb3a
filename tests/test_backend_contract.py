"""The contract of a ClusterEnv backend, one suite run over every backend (serial, local, Ray).

Every backend must give the serial reference's rollouts and byte counts for a seed, the same shapes from
reset, step and rollout, replace a worker that dies or goes silent (where it has worker processes), name
a worker whose env cannot be built, and close idempotently without leaving a process behind.
Backend-specific checks live beside their backend: tests/test_faults.py (local), tests/test_ray_backend.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import pid_alive, pid_exists, wait_dead, worker_children
from test_cluster_env import fresh_agent, random_actions

from frugalrl import ClusterEnv, make_agent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def _spin(spinning):
    """The local backend's default waiting, spinning included (tests/conftest.py turns it off elsewhere)."""

HAVE_RAY = importlib.util.find_spec("ray") is not None
RAY = pytest.param("ray", marks=pytest.mark.skipif(not HAVE_RAY, reason="backend='ray' needs Ray"))
ALL = ["serial", "local", "local+inline", RAY]
WITH_PROCESSES = ["local", RAY]  # backends whose workers are processes that can die
W, K = 2, 2
N = W * K
DETECT_S = 20.0  # "detected and replaced within seconds" on a loaded 2-core machine


@pytest.fixture
def backend(request):
    """The backend under test; Ray's tests share one local Ray instance per module."""
    if request.param == "ray":
        request.getfixturevalue("ray_8cpus")
    return request.param


def make(backend: str, *args, **kwargs) -> ClusterEnv:
    """A ClusterEnv on ``backend`` (Ray actors reserve no CPU, so that several fit on a small machine; ``local`` has
    every worker in a process, ``local+inline`` worker 0 in this one)."""
    if backend == "ray":
        kwargs.setdefault("ray_num_cpus", 0)
    if backend.startswith("local"):
        kwargs.setdefault("inline_workers", 1 if backend == "local+inline" else 0)
        backend = "local"
    return ClusterEnv(*args, backend=backend, **kwargs)


def kill(env: ClusterEnv, w: int) -> int:
    """SIGKILL worker ``w`` and wait until it is dead; its pid."""
    pid = env.backend.worker_pids()[w]
    os.kill(pid, signal.SIGKILL)
    assert wait_dead(pid), f"worker {w} (pid {pid}) survived SIGKILL"
    return pid


# ---------------------------------------------------------------------------------------------- results
@pytest.mark.parametrize("backend", WITH_PROCESSES, indirect=True)
@pytest.mark.parametrize("env_id", ["CartPole-v1", "MinAtar/Breakout-v1", "frugalrl.envs.atari:make_atari"])
def test_worker_processes_act_without_torch(backend, env_id, closing):
    """``make_agent``'s agent (an MLP, in numpy; the grid CNN on MinAtar's 10×10 cells and the Nature-CNN on Atari's
    frames, on ONNX Runtime) is decoded, run and sampled in every worker process, and its log-probabilities are
    computed there (uplink 'logprob'): the process never loads torch (~190 MB each,
    docs/benchmarks.md#worker-footprint)."""
    env = closing(make(backend, env_id, W, K, seed=7, uplink={"behaviour": "logprob"}))
    torch.manual_seed(0)
    ro = env.rollout(make_agent(env.single_observation_space, env.single_action_space), 8)
    assert ro.behaviour_logp.shape == (8, N)
    pids = env.backend.worker_pids()
    assert len(pids) == W
    assert ["libtorch" in Path(f"/proc/{pid}/maps").read_text() for pid in pids.values()] == [False] * W


@pytest.mark.parametrize("backend", WITH_PROCESSES, indirect=True)
def test_same_rollouts_and_bytes_as_serial(backend, closing):
    """Same seed, same agent: the serial reference's observations, actions, behaviour log-probabilities,
    versions, syncs and bytes by kind (uplink zstd: auto's choices depend on each process's measured CPU
    time, zstd's bytes only on the data)."""
    names = ("serial", backend)
    envs = {b: closing(make(b, "CartPole-v1", W, K, seed=7, uplink="zstd")) for b in names}
    agent = fresh_agent(envs["serial"], seed=4)
    opt = torch.optim.SGD(agent.parameters(), lr=0.1)
    rng = np.random.default_rng(5)
    outs = {b: [] for b in names}
    for b in names:
        outs[b].append(envs[b].reset(seed=7)[0])
    for _ in range(30):
        actions = random_actions(envs["serial"].single_action_space, N, rng)
        for b in names:
            outs[b].append(envs[b].step(actions)[:4])
    for _ in range(5):
        for b in names:
            o, r, te, tr, info = envs[b].step(agent)
            outs[b].append((o, r, te, tr, info["actions"], info["policy_version"]))
            outs[b].append(info["dist_params"])
    for it in range(3):
        rollouts = {b: envs[b].rollout(agent, 50) for b in names}
        s, loc = rollouts["serial"], rollouts[backend]
        assert loc.restarted_workers == []
        for name in ("obs", "actions", "rewards", "terminations", "truncations", "versions", "final_idx", "final_obs"):
            np.testing.assert_array_equal(getattr(s, name), getattr(loc, name), err_msg=f"rollout {it}: {name}")
        np.testing.assert_allclose(s.behaviour_logp, loc.behaviour_logp, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(s.next_obs, loc.next_obs)
        assert s.episode_returns == loc.episode_returns
        # A small learner update between rollouts: both envs must sync it.
        opt.zero_grad()
        (-agent.dist_params(torch.from_numpy(s.obs.reshape(-1, 4))).logsumexp(-1).mean()).backward()
        opt.step()
    for a, b in zip(outs["serial"], outs[backend], strict=True):
        if isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 2 and a.shape[1] == 2:
            np.testing.assert_allclose(a, b, atol=1e-5)  # dist_params
        else:
            for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,), strict=True):
                np.testing.assert_array_equal(x, y)
    stats = {b: envs[b].stats() for b in names}
    for key in ("weight_syncs", "learner_version", "worker_versions", "restarts"):
        assert stats["serial"][key] == stats[backend][key], key
    bs, bl = stats["serial"]["bytes"], stats[backend]["bytes"]
    assert bs["weights"] > 0 and bs["observations"] > 0 and bs["behaviour"] > 0
    for key in ("observations", "actions", "rewards", "behaviour", "weights", "info", "control", "total"):
        assert bs[key] == bl[key], key
    assert bs["up"] == bl["up"] and bs["down"] == bl["down"]
    assert bs["per_worker"] == bl["per_worker"]
    assert bs["messages"] == bl["messages"]


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_reset_step_rollout_shapes(backend, closing):
    env = closing(make(backend, "CartPole-v1", W, K, seed=3))
    assert env.num_envs == N and env.backend.name == backend.split("+")[0]
    obs, infos = env.reset(seed=3)
    assert obs.shape == (N, 4) and obs.dtype == np.float32 and isinstance(infos, dict)
    obs, rewards, terms, truncs, infos = env.step(np.zeros(N, dtype=np.int64))
    assert obs.shape == (N, 4) and obs.dtype == np.float32
    assert rewards.shape == (N,) and rewards.dtype == np.float64  # as SyncVectorEnv
    assert terms.shape == truncs.shape == (N,) and terms.dtype == truncs.dtype == bool
    agent = fresh_agent(env)
    _, _, _, _, infos = env.step(agent)
    assert infos["actions"].shape == (N,) and infos["dist_params"].shape == (N, 2)
    ro = env.rollout(agent, 16)
    assert ro.obs.shape == (16, N, 4) and ro.actions.shape == (16, N) and ro.behaviour_logp.shape == (16, N)
    assert ro.rewards.shape == ro.terminations.shape == ro.versions.shape == (16, N)
    assert ro.next_obs.shape == (N, 4) and ro.restarted_workers == []


# ---------------------------------------------------------------------------------------------- failures
@pytest.mark.parametrize("backend", WITH_PROCESSES, indirect=True)
def test_killed_worker_is_replaced_and_reported(backend, closing):
    env = closing(make(backend, "CartPole-v1", W, K, seed=0))
    agent = fresh_agent(env)
    pids = env.backend.worker_pids()
    assert sorted(pids) == list(range(W)) and len(set(pids.values())) == W
    assert all(pid != os.getpid() and pid_alive(pid) for pid in pids.values())
    if backend == "ray":  # workers that can be on other machines say where
        import ray

        nodes = env.backend.worker_nodes()
        node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert sorted(nodes) == list(range(W))
        assert all(n["node_id"] in node_ids and n["node_ip"] for n in nodes.values())
    ro1 = env.rollout(agent, 16)
    dead = kill(env, 1)
    t0 = time.monotonic()
    ro2 = env.rollout(agent, 16)
    assert time.monotonic() - t0 < DETECT_S
    assert ro2.restarted_workers == [1]
    assert ro2.obs.shape == (16, N, 4) and ro2.actions.shape == (16, N) and ro2.behaviour_logp.shape == (16, N)
    assert (ro2.versions == env.learner_version).all()  # the fresh worker got the weights again
    np.testing.assert_array_equal(ro2.obs[0, :K], ro1.next_obs[:K])  # worker 0 carried on
    assert (np.abs(ro2.obs[0, K:]) <= 0.05).all()  # worker 1's envs were reset
    stats = env.stats()
    assert stats["restarts"] == 1
    assert stats["restart_events"][0]["worker"] == 1
    assert isinstance(stats["restart_events"][0]["reason"], str) and stats["restart_events"][0]["reason"]
    new_pid = env.backend.worker_pids()[1]
    assert new_pid != dead and pid_alive(new_pid)
    if backend == "local":
        assert not pid_exists(dead)  # reaped, not a zombie
    # The learner changes, then worker 0 dies (on Ray: its actor is killed through its handle); the sync
    # before the rollout finds it, and it is still reported.
    opt = torch.optim.SGD(agent.parameters(), lr=0.1)
    agent.dist_params(torch.from_numpy(ro2.obs[0])).sum().backward()
    opt.step()
    if backend == "ray":
        import ray

        ray.kill(env.backend.actors[0], no_restart=True)
    else:
        kill(env, 0)
    ro3 = env.rollout(agent, 16)
    assert ro3.restarted_workers == [0]
    assert env.stats()["restarts"] == 2
    assert (ro3.versions == env.learner_version).all()
    assert env.rollout(agent, 16).restarted_workers == []
    all_pids = set(pids.values()) | set(env.backend.worker_pids().values())
    env.close()
    for pid in all_pids:
        assert wait_dead(pid, timeout=10.0), f"worker process {pid} still running after close()"
        if backend == "local":
            assert not pid_exists(pid), f"worker process {pid} not reaped by close()"


@pytest.mark.parametrize("backend", WITH_PROCESSES, indirect=True)
def test_silent_worker_is_declared_dead_after_the_timeout(backend, closing):
    env = closing(make(backend, "CartPole-v1", 1, 1, seed=0, worker_timeout=2.0))
    agent = fresh_agent(env)
    env.rollout(agent, 8)
    pid = env.backend.worker_pids()[0]
    os.kill(pid, signal.SIGSTOP)  # alive but silent, like a hung worker
    try:
        t0 = time.monotonic()
        ro = env.rollout(agent, 8)
        assert time.monotonic() - t0 < 2.0 + DETECT_S
        assert ro.restarted_workers == [0]
        assert "no reply" in env.stats()["restart_events"][0]["reason"]
        assert env.backend.worker_pids()[0] != pid
    finally:
        with contextlib.suppress(ProcessLookupError):  # already killed (and reaped) by the restart
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("backend", WITH_PROCESSES, indirect=True)
def test_env_that_fails_in_a_worker_is_a_clear_error_at_start(backend):
    """The test module's envs import in the workers (sys.path travels); a build error names the worker."""
    before = set(worker_children())
    with pytest.raises(RuntimeError, match=r"worker 0 could not start: RuntimeError: boom.*worker process") as e:
        make(backend, "envs_for_tests:FailsInWorkerEnv", 1, env_kwargs={"head_pid": os.getpid()})
    assert e.match("worker 0 could not start.*refuses to start in a worker")
    assert set(worker_children()) <= before


# ---------------------------------------------------------------------------------------------- closing
@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_close_is_idempotent_and_leaves_no_process(backend):
    env = make(backend, "CartPole-v1", 1, 2, seed=0)
    pids = list(env.backend.worker_pids().values())
    if backend in ("local", "ray"):  # the one worker of local+inline is in this process
        assert len(pids) == 1 and all(pid_alive(p) for p in pids)
    if backend == "local":
        assert set(pids) <= set(worker_children())
    env.rollout(fresh_agent(env), 500)  # shared memory in use (local)
    env.close()
    assert env.closed
    shm = "/dev/shm"
    if os.path.isdir(shm):
        assert not [f for f in os.listdir(shm) if f.startswith(f"frugalrl-{os.getpid()}-")]
    for pid in pids:
        assert wait_dead(pid, timeout=10.0), f"worker process {pid} survives close()"
    if backend == "local":
        assert not any(pid_exists(p) for p in pids), "worker processes were not reaped"
        assert not set(pids) & set(worker_children())
    env.close()  # idempotent
    assert env.backend.worker_pids() == {}
