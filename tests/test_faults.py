"""Worker failures on the local backend: SIGKILLed or hanging workers are detected and replaced.

A worker killed between rollouts, or silent, on every backend with processes: tests/test_backend_contract.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from conftest import pid_exists, wait_dead

from frugalrl import ClusterEnv, make_agent
from frugalrl.envs.restarts import CrashLoopRule, WorkersFailed

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
    env = closing(ClusterEnv("CartPole-v1", W, K, backend="local", inline_workers=0, seed=1, autoreset_mode=mode))
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
    env = closing(ClusterEnv("CartPole-v1", W, K, backend="local", inline_workers=0, seed=2))
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
    env = closing(ClusterEnv("CartPole-v1", W, 1, backend="local", inline_workers=0, seed=3))
    pids = set(env.backend.worker_pids().values())
    agent = agent_for(env)
    T = 20_000  # ~0.5 s of CartPole steps (numpy acting): the kill lands mid-rollout
    env.rollout(agent, T)  # warm up: weights sent, shared memory sized: the next call only rolls out
    victim = env.backend.worker_pids()[1]
    killed_at: list[float] = []

    def killer() -> None:
        time.sleep(0.1)
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
            "envs_for_tests:HangingEnv", 1, 1, backend="local", inline_workers=0, seed=5, worker_timeout=2.0,
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


def test_worker_that_always_hangs_is_a_crash_loop_given_up_after_back_off():
    """A worker that hangs at its first step after every start never completes a request: it is replaced
    ``crash_loop_tries`` times, after 0 s then 0.25 s of back-off, then WorkersFailed names it and its errors, the
    env is closed and no process is left."""
    env = ClusterEnv(
        "envs_for_tests:HangingEnv", 1, 1, backend="local", inline_workers=0, seed=6, worker_timeout=1.5, crash_loop_tries=2,
        env_kwargs={"hang_after": 1},
    )
    pids = set(env.backend.worker_pids().values())
    zeros = np.zeros(1, dtype=np.int64)
    env.reset()
    t0 = time.monotonic()
    with pytest.raises(WorkersFailed, match=r"worker 0 failed 3 times in a row with no completed request in between "
                                            r"\(last: no reply within"):
        for _ in range(10):
            pids |= set(env.backend.worker_pids().values())
            env.step(zeros)
    assert 3 * 1.5 + 0.25 <= time.monotonic() - t0 < 3 * 1.5 + 0.25 + DETECT_S
    assert env.closed and len(env.restart_events) == 2
    left = [p for p in pids if pid_exists(p)]
    assert not left, f"processes left: {left}"
    with pytest.raises(RuntimeError, match="closed"):
        env.step(zeros)


def test_worker_that_dies_while_starting_is_replaced(tmp_path):
    """SIGKILL while a worker builds its envs (the first attempt only): the env starts anyway, on a replacement."""
    marker = str(tmp_path / "died")
    env = ClusterEnv("envs_for_tests:DiesWhileStartingEnv", 2, 1, backend="local", inline_workers=0, seed=1,
                     env_kwargs={"head_pid": os.getpid(), "marker": marker})
    try:
        assert os.path.exists(marker)
        assert len(env.restart_events) == 1  # one of the two workers, whichever built its env first
        assert "died or hung while starting" in env.restart_events[0]["reason"]
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 2)
    finally:
        close_and_check(env, set())


def test_worker_that_never_starts_fails_in_seconds():
    """Every attempt dies while starting: a crash loop, given up after its tries (no retry storm)."""
    t0 = time.monotonic()
    with pytest.raises(WorkersFailed, match=r"worker 0 failed 3 times in a row .*died or hung while starting"):
        ClusterEnv("envs_for_tests:DiesWhileStartingEnv", 1, 1, backend="local", inline_workers=0, seed=1, crash_loop_tries=2,
                   env_kwargs={"head_pid": os.getpid()})
    assert time.monotonic() - t0 < 0.25 + DETECT_S


def test_silent_worker_while_shared_memory_grows_is_replaced(closing):
    """A worker that stops answering just when a longer rollout grows the shared-memory arenas."""
    # The timeout must cover a healthy 4000-step rollout on a loaded 2-core CI machine.
    env = closing(ClusterEnv("CartPole-v1", W, 1, backend="local", inline_workers=0, seed=7, worker_timeout=8.0))
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


def test_run_whose_workers_keep_failing_saves_the_learner_and_says_how_to_resume(tmp_path, capsys):
    """PPO's one worker dies after useful work (replaced), then its replacements die before completing a fragment:
    the rule gives up, and the run writes its checkpoint and summary ("workers_failed", the errors) and the CLI
    prints one line with the --resume command (no traceback)."""
    from frugalrl.cli import main as cli_main

    env_kwargs = json.dumps({"head_pid": os.getpid(), "marker": str(tmp_path / "marker"), "die_after": 200})
    code = cli_main(["train", "ppo", "--env", "envs_for_tests:DiesAfterEnv", "--env-kwargs", env_kwargs,
                     "--preset", "none", "--workers", "1", "--envs-per-worker", "1", "--num-steps", "16",
                     "--crash-loop-tries", "5",
                     "--total-timesteps", "100000", "--run-dir", str(tmp_path), "--run-name", "run", "--no-progress",
                     "--no-plots", "--no-tensorboard", "--eval-episodes", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and err[-1].startswith("frugalrl: error: workers failed: worker 0 failed 6 times in a row"), err
    assert err[-1].endswith(f"frugalrl train ppo --resume {tmp_path / 'run'}")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "workers_failed" and 160 <= summary["env_steps"] <= 200
    assert len(summary["details"]["workers_failed"]["errors"]) == 6 and summary["restarts"] == 5
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").exists()


def test_an_env_that_raises_mid_run_saves_the_run_and_the_resume_finishes_it(tmp_path, capsys):
    """An env raises in a worker after useful work (not retried by default: it may raise again): the learner is intact, so
    the run writes its checkpoint and summary ("worker_error", the error) and the CLI prints one line with the
    --resume command; resumed, the run reaches its budget."""
    from frugalrl.cli import main as cli_main

    env_kwargs = json.dumps({"marker": str(tmp_path / "marker"), "raise_at": 200})
    argv = ["train", "ppo", "--env", "envs_for_tests:RaisesOnceEnv", "--env-kwargs", env_kwargs, "--preset", "none",
            "--workers", "1", "--envs-per-worker", "1", "--num-steps", "16", "--total-timesteps", "400",
            "--run-dir", str(tmp_path), "--run-name", "run", "--no-progress", "--no-plots", "--no-tensorboard",
            "--eval-episodes", "1"]
    code = cli_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("frugalrl: error: worker 0: env 0 (envs_for_tests:RaisesOnceEnv) raised "
                                            "RuntimeError: simulation unstable at step 200; on_env_error='restart'"), err
    assert err[-1].endswith(f"frugalrl train ppo --resume {tmp_path / 'run'}")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "worker_error" and summary["env_steps"] == 192
    assert "simulation unstable" in summary["details"]["worker_error"]
    capsys.readouterr()
    assert cli_main(["train", "ppo", "--resume", str(tmp_path / "run"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == 400
    assert "could not be rebuilt" not in capsys.readouterr().err  # the envs start anew, not from a failed rollout


def _file_size_limit(limit: int):
    """For a child process: files it writes may not pass ``limit`` bytes (EFBIG, as a full disk's ENOSPC)."""
    def preexec() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.slow
def test_a_run_out_of_disk_stops_with_one_line_and_resumes_from_its_last_checkpoint(tmp_path):
    """A write that fails for want of space (here a file size limit: a real EFBIG from the kernel) stops the run
    with one line naming the error and the --resume command; the checkpoint before it is intact, no partial
    copy is left, and the resumed run (with space again) reaches its budget."""
    argv = [sys.executable, "-m", "frugalrl.cli", "train", "ppo", "--env", "CartPole-v1", "--backend", "serial",
            "--workers", "1", "--envs-per-worker", "2", "--num-steps", "16", "--total-timesteps", "12000",
            "--checkpoint-every", "20", "--no-progress", "--no-tensorboard", "--no-plots", "--eval-episodes", "1",
            "--run-dir", str(tmp_path), "--run-name", "run"]
    # 250 kB: a checkpoint (~170 kB here) fits; metrics.jsonl passes it after ~10k steps
    full = subprocess.run(argv, capture_output=True, text=True, timeout=300, preexec_fn=_file_size_limit(250_000))
    last = (full.stderr.strip().splitlines() or [f"no stderr; exit {full.returncode}"])[-1]
    assert full.returncode == 2 and last.startswith("frugalrl: error: [Errno 27] File too large"), full.stderr[-2000:]
    step = int(last.rsplit("(from step ", 1)[1].rstrip(")"))
    assert last.endswith(f"frugalrl train ppo --resume {tmp_path / 'run'} (from step {step})") and step > 0
    assert not list((tmp_path / "run").rglob("*.tmp"))
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=False)
    assert ckpt["counters"]["env_steps"] == step
    resume = [sys.executable, "-m", "frugalrl.cli", "train", "ppo", "--resume", str(tmp_path / "run"), "--no-progress"]
    still_full = subprocess.run(resume, capture_output=True, text=True, timeout=300,
                                preexec_fn=_file_size_limit(250_000))  # still full: it stops again, saying so
    assert still_full.returncode == 2, still_full.stderr[-2000:]
    assert f"frugalrl train ppo --resume {tmp_path / 'run'}" in still_full.stderr.strip().splitlines()[-1]
    assert not list((tmp_path / "run").rglob("*.tmp"))
    resumed = subprocess.run(resume, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == 12000


def test_a_worker_over_its_memory_bound_is_recycled_between_rollouts(closing, monkeypatch):
    """A worker whose env leaks 1 MiB per step passes its bound: it is replaced before the next rollout, which
    is whole and from a fresh process; the replacement's memory is back near the start."""
    monkeypatch.setattr(ClusterEnv, "memory_check_s", 0.0)
    env = closing(ClusterEnv("envs_for_tests:LeakyEnv", 1, 1, backend="local", inline_workers=0, seed=0, env_kwargs={"leak_kb": 1024}))
    agent = agent_for(env)
    env.rollout(agent, 4)
    start = env.backend.worker_rss_mb()[0]
    env.worker_memory_mb = start + 30
    pid = env.backend.worker_pids()[0]
    for _ in range(3):  # 60 MiB: over the bound after the second
        assert env.rollout(agent, 20).obs.shape == (20, 1, 2)
    assert [e["worker"] for e in env.recycle_events] == [0] and env.recycle_events[0]["rss_mb"] > start + 30
    assert env.backend.worker_pids()[0] != pid and wait_dead(pid)
    assert env.backend.worker_rss_mb()[0] < start + 25 and env.stats()["restarts"] == 0


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_the_drop_in_step_recycles_a_worker_over_its_memory_bound(closing, monkeypatch, mode):
    """step(actions), a user's loop on a leaking env: the worker over its bound is replaced between two steps; that
    step reports its env truncated (``worker_restarted``), as for a worker that fails during it, and the env starts
    a new episode (next step, or at once with same-step autoreset); a worker under its bound goes on."""
    monkeypatch.setattr(ClusterEnv, "memory_check_s", 0.0)
    env = closing(ClusterEnv("envs_for_tests:LeakyEnv", 2, 1, backend="local", inline_workers=0, seed=0,
                             autoreset_mode=mode, env_kwargs={"leak_kb": 1024}))
    env.reset(seed=0)
    start = max(env.backend.worker_rss_mb().values())
    env.worker_memory_mb = start + 12
    pids = env.backend.worker_pids()
    actions = np.zeros(2, dtype=np.int64)
    for t in range(1, 40):
        obs, rewards, terms, truncs, infos = env.step(actions)
        if env.recycle_events:
            break
        assert obs[:, 0].tolist() == [t, t] and not truncs.any()
    assert env.recycle_events, "no worker passed its bound"
    cut = sorted({e["worker"] for e in env.recycle_events})
    assert truncs[cut].all() and infos["worker_restarted"][cut].all() and rewards[cut].tolist() == [0.0] * len(cut)
    assert all(env.backend.worker_pids()[w] != pids[w] for w in cut) and env.stats()["restarts"] == 0
    kept = [w for w in range(2) if w not in cut]  # (both may pass the bound at the same check)
    assert (obs[kept, 0] == t).all() and not truncs[kept].any()
    if mode == "SameStep":
        assert (obs[cut, 0] == 0).all() and (infos["final_obs"][cut[0]][0] == t - 1)  # the new episode, at once
    else:
        assert (obs[cut, 0] == t - 1).all()  # the last observation; the new episode starts on the next step
        obs, *_ = env.step(actions)
        assert (obs[cut, 0] == 0).all()
    env.worker_memory_mb = None
    obs, *_ = env.step(actions)
    assert (obs[cut, 0] == 1).all()


def test_inline_workers_leave_the_head_once_it_outgrows_the_memory_bound(closing, monkeypatch):
    """An inline worker's leaking env grows the head, which no process bound can replace: once the head has grown by
    ``worker_memory_mb`` since its first check, the worker moves to a process of its own (rollouts stay whole), and
    the head stops growing. (64 MiB leaked per rollout: this test process's own ups and downs are smaller.)"""
    import envs_for_tests

    from frugalrl.process import resident_mb

    monkeypatch.setattr(ClusterEnv, "memory_check_s", 0.0)
    env = closing(ClusterEnv("envs_for_tests:LeakyEnv", 1, 1, backend="local", inline_workers=1, seed=0,
                             worker_memory_mb=100, env_kwargs={"leak_kb": 4096}))
    try:
        agent = agent_for(env)
        assert env.backend.inline_ids() == [0] and env.backend.worker_pids() == {}
        rollouts = 0
        while not env.recycle_events and rollouts < 8:  # the first check takes the head's base
            assert env.rollout(agent, 16).obs.shape == (16, 1, 2)
            rollouts += 1
        assert rollouts >= 2, "the worker left at the first check"
        assert [(e["worker"], e["inline"]) for e in env.recycle_events] == [(0, True)]
        assert env.backend.inline_ids() == [] and env.inline_workers == 0 and list(env.backend.worker_pids()) == [0]
        env.worker_memory_mb = None  # the new process holds torch: over 100 MB from its start
        head = resident_mb(os.getpid())
        assert env.rollout(agent, 16).obs.shape == (16, 1, 2) and env.stats()["restarts"] == 0
        assert resident_mb(os.getpid()) < head + 32  # the 64 MiB went to the worker process
    finally:
        envs_for_tests._LEAKED.clear()  # this process's leak, unmapped


def test_an_inline_worker_whose_new_process_dies_while_starting_is_replaced(closing, monkeypatch, tmp_path):
    """Moving out is a start like any other: a process that dies while starting goes to the crash-loop rule and is
    replaced; the rollout that follows is whole. (The head's base is set low: the move, not a leak, is tested.)"""
    monkeypatch.setattr(ClusterEnv, "memory_check_s", 0.0)
    env = closing(ClusterEnv("envs_for_tests:DiesWhileStartingEnv", 1, 1, backend="local", inline_workers=1, seed=0,
                             worker_memory_mb=100, env_kwargs={"head_pid": os.getpid(),
                                                               "marker": str(tmp_path / "died")}))
    agent = agent_for(env)
    env.rollout(agent, 4)  # the first check takes the head's base
    env._head_rss_base -= 1000.0
    assert env.rollout(agent, 8).obs.shape == (8, 1, 2)
    assert [(e["worker"], e["inline"]) for e in env.recycle_events] == [(0, True)]
    assert [e["worker"] for e in env.restart_events] == [0] and "died" in env.restart_events[0]["reason"]
    assert env.backend.inline_ids() == [] and list(env.backend.worker_pids()) == [0]


def test_a_run_whose_worker_never_starts_ends_in_one_line_with_a_summary(tmp_path, capsys):
    """Every start of the worker dies: one line (nothing to resume), a summary that says why, no checkpoint."""
    from frugalrl.cli import main as cli_main

    t0 = time.monotonic()
    code = cli_main(["train", "ppo", "--env", "envs_for_tests:DiesWhileStartingEnv", "--env-kwargs",
                     json.dumps({"head_pid": os.getpid()}), "--preset", "none", "--workers", "1",
                     "--crash-loop-tries", "2", "--run-dir", str(tmp_path), "--run-name", "run", "--no-progress",
                     "--no-plots", "--no-tensorboard"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("frugalrl: error: workers failed: worker 0 failed 3 times in a row")
    assert "--resume" not in err[-1] and time.monotonic() - t0 < 0.25 + DETECT_S
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "workers_failed" and summary["env_steps"] == 0
    assert not (tmp_path / "run" / "checkpoints" / "latest.pt").exists()


def test_crash_loop_rule():
    """Useful work resets the count; failures in a row back off 0, 0.5, 1, 2 s ... and give up after max_tries."""
    rule = CrashLoopRule(2, max_tries=4, first_delay=0.5, max_delay=1.5)
    assert [rule.failed(0, f"e{i}") for i in range(4)] == [0.0, 0.5, 1.0, 1.5]
    with pytest.raises(WorkersFailed, match=r"worker 0 failed 5 times in a row .*\(last: e4\)") as failed:
        rule.failed(0, "e4")
    assert failed.value.errors == ["e0", "e1", "e2", "e3", "e4"]
    rule.succeeded(1)
    assert [rule.failed(1, "x") for _ in range(2)] == [0.0, 0.5]
    rule.succeeded(1)  # it worked in between: the next death is a first one again
    assert rule.failed(1, "y") == 0.0 and rule.loop_errors[1] == ["y"]


def test_books_of_envs_that_cannot_be_rebuilt_survive_a_resume():
    """``state_dict(workers=False)`` (envs not replayable, or closed after their workers failed): a new ClusterEnv
    goes on counting bytes, syncs and restarts from there; its workers hold no weights and its envs start anew."""
    first = ClusterEnv("CartPole-v1", 2, 1, backend="serial", seed=3)
    agent = agent_for(first)
    first.rollout(agent, 8)
    first.close()
    books = first.state_dict(workers=False)
    assert books["workers"] is None and books["meter"]
    second = ClusterEnv("CartPole-v1", 2, 1, backend="serial", seed=4)
    try:
        assert second.load_state_dict(books) == [0, 1]  # every env starts anew
        assert second.meter.total() == first.meter.total() and second.sync_counts.tolist() == [1, 1]
        assert second.worker_versions == [None, None]
        second.rollout(agent, 8)  # the weights go out again
        assert second.sync_counts.tolist() == [2, 2] and second.meter.total() > first.meter.total()
    finally:
        second.close()
