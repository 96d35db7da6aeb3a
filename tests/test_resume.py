"""Resume: a run killed with SIGKILL after a checkpoint continues from it and ends as if never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from frugalrl.algos import resume
from frugalrl.algos.ppo import PPOConfig, train
from frugalrl.driver import Callback
from frugalrl.runs import read_checkpoint, read_metrics
from frugalrl.wire.meter import KINDS

SMALL = dict(env="CartPole-v1", workers=2, envs_per_worker=2, num_steps=32, num_minibatches=2, update_epochs=2,
             eval_every=10, eval_episodes=2, checkpoint_every=3, progress=False, plots=False)


def _flags(cfg: dict) -> list[str]:
    out = []
    for k, v in cfg.items():
        out += ["--" + k.replace("_", "-"), str(v).lower() if isinstance(v, bool) else str(v)]
    return out


def _start_and_kill(flags: list[str], run: Path, min_step: int = 1) -> int:
    """Start ``frugalrl train ppo`` with ``flags``, SIGKILL it once a checkpoint at ``min_step`` or later exists;
    return the step of the checkpoint it left."""
    proc = subprocess.Popen([sys.executable, "-m", "frugalrl.cli", "train", "ppo", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    ckpt = run / "checkpoints" / "latest.pt"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if ckpt.exists() and read_checkpoint(run)["counters"]["env_steps"] >= min_step:
                break
            assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()}"
            time.sleep(0.05)
        else:
            pytest.fail("no checkpoint appeared")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the head and, with the local backend, its workers' group leader
        proc.wait(timeout=30)
    return int(read_checkpoint(run)["counters"]["env_steps"])


@pytest.mark.timeout(240)
def test_killed_serial_run_resumes_to_bit_identical_weights(tmp_path):
    """A PPO run (serial backend) SIGKILLed after a checkpoint and resumed ends with exactly the weights,
    metrics and byte counts of the same run left alone (but the full weight copies a resume sends)."""
    # uplink zstd: auto's codec choices depend on measured CPU time, so its byte counts vary between runs
    cfg = {**SMALL, "backend": "serial", "total_timesteps": 128 * 60, "seed": 5, "run_dir": str(tmp_path),
           "uplink": "zstd"}
    straight = train(PPOConfig(**cfg, run_name="straight", tensorboard=False))

    killed = tmp_path / "killed"
    step = _start_and_kill([*_flags(cfg), "--run-name", "killed", "--no-tensorboard", "--preset", "none"], killed)
    assert 0 < step < cfg["total_timesteps"]
    resumed = resume(killed)

    assert resumed["env_steps"] == straight["env_steps"] == cfg["total_timesteps"]
    assert [r["step"] for r in resumed["resumes"]] == [step] and resumed["resumes"][0]["envs"] == "restored"
    a = read_checkpoint(tmp_path / "straight")["parts"]
    b = read_checkpoint(killed)["parts"]
    for key in a["agent"]:
        assert torch.equal(a["agent"][key], b["agent"][key]), key
    assert resumed["eval_history"] == [{**e, "seconds": e2["seconds"]} for e, e2 in
                                       zip(straight["eval_history"], resumed["eval_history"], strict=True)]
    # The resumed head assumes its workers hold nothing: its first sync to each is a full copy (with the spec)
    # where the run left alone sent a delta. Weight and header bytes can only grow; every other kind is the same.
    for kind in KINDS:
        if kind in ("weights", "control"):
            assert resumed["bytes"].get(kind, 0) >= straight["bytes"].get(kind, 0), kind
        else:
            assert resumed["bytes"].get(kind, 0) == straight["bytes"].get(kind, 0), kind
    assert resumed["bytes"]["messages"] == straight["bytes"]["messages"]
    for key in ("total", "per_worker"):
        assert resumed["weight_syncs"][key] == straight["weight_syncs"][key]
    assert resumed["weight_syncs"]["delta"] == straight["weight_syncs"]["delta"] - 2  # one full copy per worker
    rows = read_metrics(killed)
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) == [r["step"] for r in read_metrics(tmp_path / "straight")]
    for mine, theirs in zip(rows, read_metrics(tmp_path / "straight"), strict=True):
        assert mine["losses/policy"] == theirs["losses/policy"]


@pytest.mark.timeout(240)
def test_cli_resume_after_sigkill_local_backend(tmp_path):
    """`frugalrl train ppo --resume` after a SIGKILL (local worker processes): the requested step total, no
    step logged twice, the summary names the resume, and no worker outlives its head."""
    cfg = {**SMALL, "backend": "local", "total_timesteps": 128 * 45, "seed": 2, "run_dir": str(tmp_path)}
    run = tmp_path / "r"
    step = _start_and_kill([*_flags(cfg), "--run-name", "r"], run)
    done = subprocess.run([sys.executable, "-m", "frugalrl.cli", "train", "ppo", "--resume", str(run), "--no-progress"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert f"resumed 1 time(s), last at step {step}" in done.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == cfg["total_timesteps"]
    assert summary["updates"] == 45
    steps = [r["step"] for r in read_metrics(run)]
    assert len(steps) == len(set(steps)) == 45 and steps == sorted(steps)
    assert summary["resumes"][0]["step"] == step


def test_resume_refuses_another_algorithm(tmp_path):
    cfg = PPOConfig(**{**SMALL, "checkpoint_every": 0}, backend="serial", total_timesteps=128, run_dir=str(tmp_path),
                    run_name="p", tensorboard=False)
    train(cfg)
    from frugalrl.algos.impala import IMPALAConfig
    from frugalrl.algos.impala import train as train_impala

    with pytest.raises(ValueError, match="ppo run"):
        train_impala(IMPALAConfig(backend="serial", run_dir=str(tmp_path), progress=False), resume=tmp_path / "p")


class _StopAfter(Callback):
    """A callback that stops the run after ``n`` updates (its end writes the checkpoint a resume starts from)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_update(self, run, update, row):
        return run.updates < self.n


class _Rates(Callback):
    """A callback that keeps the learning rate of every update."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    def on_update(self, run, update, row):
        self.rates.append(row["charts/lr"])


@pytest.mark.parametrize("workers", [1, 3])
def test_a_run_resumed_on_another_number_of_workers_keeps_its_budget_and_schedule(tmp_path, caplog, workers):
    """A run preempted on 2 workers and resumed on fewer or more (a smaller or larger allocation): its envs start
    new episodes, its budget and learning-rate schedule go on in env steps, its sync total carries over."""
    cfg = {**SMALL, "backend": "serial", "total_timesteps": 128 * 12, "seed": 3, "run_dir": str(tmp_path),
           "run_name": "r", "tensorboard": False, "eval_every": 0}
    first = train(PPOConfig(**cfg), callbacks=[_StopAfter(4)])
    assert first["stop_reason"] == "callback" and first["env_steps"] == 512
    rates = _Rates()
    with caplog.at_level("WARNING", logger="frugalrl"):
        resumed = train(PPOConfig(**{**cfg, "workers": workers}), resume=tmp_path / "r", callbacks=[rates])
    spu = workers * 2 * 32
    total = cfg["total_timesteps"] // spu
    done = -(-512 // spu)  # the updates of the new size the first 512 steps count as
    assert f"the run resumes on {workers} worker{'s' * (workers > 1)} × 2 envs (it ran on 2 × 2)" in caplog.text
    assert f"it goes on as update {done + 1} of {total}" in caplog.text
    assert resumed["resumes"][0]["envs"] == "reset"
    assert resumed["env_steps"] == 512 + (total - done) * spu <= cfg["total_timesteps"]
    assert resumed["updates"] == 4 + total - done
    lr = PPOConfig(**cfg).learning_rate
    assert rates.rates[0] == pytest.approx((1 - done / total) * lr) and rates.rates[-1] == pytest.approx(lr / total)
    syncs = resumed["weight_syncs"]
    assert len(syncs["per_worker"]) == workers
    assert syncs["total"] == first["weight_syncs"]["total"] + sum(syncs["per_worker"])


@pytest.mark.timeout(240)
def test_sigterm_checkpoints_and_the_resumed_run_ends_bit_identical(tmp_path):
    """``frugalrl train`` SIGTERMed mid-run (a scheduler's preemption): it exits with the preemption code within the
    grace period, leaving a checkpoint and a summary ("preempted"); ``--resume`` finishes the budget with exactly
    the weights of the same run left alone (serial backend)."""
    from frugalrl.driver import EXIT_PREEMPTED

    cfg = {**SMALL, "backend": "serial", "total_timesteps": 128 * 60, "seed": 5, "run_dir": str(tmp_path),
           "uplink": "zstd", "checkpoint_every": 5}
    straight = train(PPOConfig(**cfg, run_name="straight", tensorboard=False))

    run = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "frugalrl.cli", "train", "ppo", *_flags(cfg), "--run-name",
                             "stopped", "--no-tensorboard", "--preset", "none"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoints" / "latest.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended or hung before its checkpoint"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = proc.wait(timeout=60)
        stopped_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = proc.stderr.read().decode()
    assert code == EXIT_PREEMPTED, stderr
    assert stopped_in < 30 and "--resume" in stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "preempted" and 0 < summary["env_steps"] < cfg["total_timesteps"]
    assert read_checkpoint(run)["counters"]["env_steps"] == summary["env_steps"]

    resumed = resume(run)
    assert resumed["env_steps"] == straight["env_steps"] == cfg["total_timesteps"]
    assert resumed["stop_reason"] == "budget" and resumed["resumes"][0]["step"] == summary["env_steps"]
    a, b = read_checkpoint(tmp_path / "straight")["parts"], read_checkpoint(run)["parts"]
    for key in a["agent"]:
        assert torch.equal(a["agent"][key], b["agent"][key]), key


@pytest.mark.timeout(300)
def test_a_minatar_run_killed_and_resumed_ends_bit_identical(tmp_path):
    """MinAtar's games draw from generators of their own and carry the last action into the next episode: the
    workers' checkpoint records both, so that a killed run's envs continue exactly (``"envs": "restored"``) and
    the resumed run ends with the weights of the run left alone. CNN agents, acting on ONNX Runtime."""
    pytest.importorskip("minatar")
    cfg = {**SMALL, "env": "MinAtar/Breakout-v1", "backend": "serial", "total_timesteps": 128 * 40, "seed": 5,
           "run_dir": str(tmp_path), "uplink": "zstd", "eval_every": 20}
    straight = train(PPOConfig(**cfg, run_name="straight", tensorboard=False))
    killed = tmp_path / "killed"
    step = _start_and_kill([*_flags(cfg), "--run-name", "killed", "--no-tensorboard", "--preset", "none"], killed)
    assert 0 < step < cfg["total_timesteps"]
    resumed = resume(killed)
    assert resumed["env_steps"] == straight["env_steps"]
    assert [r["envs"] for r in resumed["resumes"]] == ["restored"]
    a, b = read_checkpoint(tmp_path / "straight")["parts"], read_checkpoint(killed)["parts"]
    for key in a["agent"]:
        assert torch.equal(a["agent"][key], b["agent"][key]), key


def test_a_plain_vector_env_resumed_starts_new_episodes_not_the_first_segments(tmp_path):
    """``vector_env="gym"`` (head-side inference on a Gymnasium vector env, no checkpointed env state): the resumed
    segment seeds its envs and its action sampling anew from the env steps done, not with the run's seed again."""
    from frugalrl.algos.ppo import PPO
    from frugalrl.driver import drive

    class StopAfter(Callback):
        def on_update(self, run, update, row):
            return run.updates < 2

    cfg = PPOConfig(**{**SMALL, "vector_env": "gym", "total_timesteps": 512, "run_dir": str(tmp_path),
                       "run_name": "gym", "tensorboard": False})
    first = PPO(cfg)
    assert drive(first, callbacks=[StopAfter()])["env_steps"] == 256 and first.gym_state["seed"] == cfg.seed
    again = PPO(cfg)
    assert drive(again, resume=tmp_path / "gym")["env_steps"] == 512
    assert again.gym_state["seed"] == cfg.seed + 256


def test_a_flag_changed_on_resume_holds_for_the_next_resume(tmp_path):
    """``--resume RUN --total-timesteps N`` and then, after another stop, a plain ``--resume RUN`` (the line a
    preempted run prints, a requeued job's command): the run goes on to N, not back to its first budget."""
    from frugalrl.cli import main as cli_main

    flags = ["--env", "CartPole-v1", "--workers", "1", "--envs-per-worker", "2", "--num-steps", "32",
             "--no-progress", "--no-plots", "--no-tensorboard", "--eval-episodes", "1"]
    assert cli_main(["train", "ppo", *flags, "--total-timesteps", "128", "--run-dir", str(tmp_path),
                     "--run-name", "run"]) == 0
    created = json.loads((tmp_path / "run" / "config.json").read_text())["_meta"]["created"]
    assert cli_main(["train", "ppo", "--resume", str(tmp_path / "run"), "--total-timesteps", "256"]) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["total_timesteps"] == 256 and config["sources"]["total_timesteps"] == "command line (resume)"
    assert config["_meta"]["created"] == created and "resumed" in config["_meta"]
    assert cli_main(["train", "ppo", "--resume", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == 256
    assert resume(tmp_path / "run", total_timesteps=320)["env_steps"] == 320  # the Python API says so too
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["total_timesteps"] == 320 and config["sources"]["total_timesteps"] == "resume() override"


def test_a_run_resumed_on_other_workers_keeps_its_batch(tmp_path, capsys):
    """``--resume RUN --workers 1`` on a run that ran on 2 workers × 2 envs × 32 steps: each update still learns
    from 128 env steps (64 per fragment), as ``--workers`` at the start keeps a preset's batch; the Python API's
    resume does the same, and ``--num-steps`` given with it wins."""
    from frugalrl.cli import main as cli_main

    flags = ["--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "2", "--num-steps", "32",
             "--no-progress", "--no-plots", "--no-tensorboard", "--eval-episodes", "1"]
    run = tmp_path / "run"
    assert cli_main(["train", "ppo", *flags, "--total-timesteps", "256", "--run-dir", str(tmp_path),
                     "--run-name", "run"]) == 0
    assert cli_main(["train", "ppo", "--resume", str(run), "--workers", "1", "--total-timesteps", "512"]) == 0
    assert "64 steps per env per fragment keep its 128-step updates" in capsys.readouterr().err
    config = json.loads((run / "config.json").read_text())
    assert config["num_steps"] == 64 and config["sources"]["num_steps"].startswith("batch of the run resumed")
    summary = resume(run, workers=2, total_timesteps=768)
    assert json.loads((run / "config.json").read_text())["num_steps"] == 32 and summary["env_steps"] == 768
    resume(run, workers=1, num_steps=32, total_timesteps=832)
    assert json.loads((run / "config.json").read_text())["num_steps"] == 32
