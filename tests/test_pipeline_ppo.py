"""Split-model PPO over two real gloo processes: bytes equal the estimator, errors are clear, it learns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from frugalrl.cli import main as cli_main
from frugalrl.experience import collect_fragment
from frugalrl.nets import action_desc
from frugalrl.pipeline import PipelinePPOConfig, predict_bytes, train
from frugalrl.pipeline.bytes import table_one
from frugalrl.pipeline.launcher import free_port
from frugalrl.pipeline.model import Heads, make_encoder
from frugalrl.pipeline.stage0 import make_env_group
from frugalrl.pipeline.stage1 import rollout_targets
from frugalrl.returns import bootstrap_values, gae

QUIET = {"progress": False, "tensorboard": False, "plots": False}


def _car_cfg(tmp_path: Path, **kw) -> PipelinePPOConfig:
    """CarRacing-v3 (4×96×96 frames, the paper's cut of 4096) at a tiny budget; short episodes."""
    base = dict(env_kwargs={"max_episode_steps": 40}, num_envs=2, num_steps=32, num_minibatches=2,
                update_epochs=2, total_timesteps=128, warmup_timesteps=64, head_hidden=32,
                run_dir=str(tmp_path), **QUIET)
    base.update(kw)
    return PipelinePPOConfig(**base)


def _measured(summary: dict) -> dict:
    return {k: v for k, v in summary["bytes"].items() if v and k not in ("up", "down", "per_worker", "messages")}


def test_encoder_and_heads_match_the_paper():
    enc = make_encoder(gym.spaces.Box(0, 255, (4, 96, 96), np.uint8), [64])
    assert enc.feature_dim == 4096
    assert enc(torch.zeros(2, 4, 96, 96, dtype=torch.uint8)).shape == (2, 4096)
    # CarRacing-v3's own (96, 96, 3) screens: the same convolutions, reading the frames channels last
    hwc = make_encoder(gym.spaces.Box(0, 255, (96, 96, 3), np.uint8), [64])
    frames = torch.randint(0, 256, (2, 96, 96, 3), dtype=torch.uint8)
    assert hwc.feature_dim == 4096 and hwc(frames).shape == (2, 4096)
    torch.testing.assert_close(hwc(frames), hwc.net(frames.permute(0, 3, 1, 2).float() / 255))
    space = gym.spaces.Box(np.array([-1, 0, 0], np.float32), np.array([1, 1, 1], np.float32))
    heads = Heads(4096, action_desc(space), hidden=512)
    assert [m.weight.shape for m in heads.actor if hasattr(m, "weight")] == [(512, 4096), (3, 512)]
    u = torch.randn(1000, 3) * 5
    a = heads.env_action(u)
    assert (a[:, 0] >= -1).all() and (a[:, 0] <= 1).all() and (a[:, 1:] >= 0).all() and (a[:, 1:] <= 1).all()


def test_a_split_policy_spec_rebuilds_it_under_its_old_name_too():
    """SplitPolicy moved from frugalrl.nets to frugalrl.pipeline.model; specs written before still build."""
    from frugalrl.nets import build_policy
    from frugalrl.pipeline.model import SplitPolicy, space_desc

    obs = gym.spaces.Box(-1, 1, (4,), np.float32)
    policy = SplitPolicy(space_desc(obs), action_desc(gym.spaces.Discrete(2)), [16], 8)
    old = {**policy.spec.to_json(), "factory": "frugalrl.nets:SplitPolicy"}
    for spec in (policy.spec, old):
        rebuilt = build_policy(spec)
        rebuilt.load_state_dict(policy.state_dict())
        x = torch.randn(3, 4)
        assert isinstance(rebuilt, SplitPolicy) and torch.equal(rebuilt.dist_params(x), policy.dist_params(x))


def test_small_grids_train_through_a_flattening_encoder_and_evaluate(tmp_path):
    """MinAtar's 10×10×4 boolean planes are too small for the CNN: stage 0 runs its MLP on them flattened, with no
    flag, and the saved policy rebuilds from its spec (a bool Box) for ``frugalrl eval``; the id's ``/`` does not
    nest the run directory."""
    pytest.importorskip("minatar")
    from frugalrl.pipeline import load_policy

    cfg = PipelinePPOConfig(env="MinAtar/Breakout-v1", num_envs=2, num_steps=32, num_minibatches=2, update_epochs=1,
                            total_timesteps=128, warmup_timesteps=64, run_dir=str(tmp_path), eval_episodes=1,
                            eval_max_steps=50, **QUIET)
    summary = train(cfg)
    assert summary["bytes"]["gradients"] > 0
    assert Path(summary["run_dir"]).parent == tmp_path
    policy, _ = load_policy(summary["run_dir"])
    obs, _ = gym.make("MinAtar/Breakout-v1").reset(seed=0)
    assert obs.shape == (10, 10, 4) and obs.dtype == np.bool_
    logits = policy.dist_params(torch.from_numpy(obs[None]))
    assert logits.shape == (1, 3) and torch.isfinite(logits).all()


@pytest.mark.parametrize("index", ["coo16", pytest.param("bitmask", marks=pytest.mark.slow)])
def test_two_stage_carracing_bytes_equal_the_estimator(tmp_path, index):
    """A real two-process gloo run on CarRacing: dense warm start, then sparse; every byte predicted."""
    cfg = _car_cfg(tmp_path, cut_index=index, cut_percentile=0.9, run_name=f"car-{index}")
    summary = train(cfg)
    assert summary["env_steps"] == 128 and summary["details"]["feature_dim"] == 4096
    ckpt = Path(summary["run_dir"]) / "checkpoints"
    assert (ckpt / "latest.pt").exists() and (ckpt / "heads.pt").exists()  # each stage keeps its half
    predicted = predict_bytes(cfg, summary["details"]["truncation_bootstraps"])  # episodes end at 40 steps
    assert predicted["exact"]
    assert _measured(summary) == predicted["bytes"]
    assert summary["bytes"]["up"] == {k: v for k, v in predicted["up"].items()}
    assert summary["bytes"]["down"] == {k: v for k, v in predicted["down"].items()}
    # The sparse update really is smaller than the dense warm-start one.
    dense = predict_bytes(PipelinePPOConfig(**{**cfg.__dict__, "warmup_timesteps": 10**6}))
    assert summary["bytes"]["gradients"] < 0.7 * dense["bytes"]["gradients"]
    # The CLI compares prediction and measurement from the run directory.
    assert cli_main(["pipeline-bytes", "--run", summary["run_dir"], "--json"]) == 0


def test_sparse_cut_shrinks_gradient_bytes_tenfold(tmp_path):
    cfg = _car_cfg(tmp_path, warmup_timesteps=0, cut_percentile=0.99, cut_index="auto")
    dense_cfg = _car_cfg(tmp_path, cut="dense")
    sparse, dense = predict_bytes(cfg)["bytes"], predict_bytes(dense_cfg)["bytes"]
    assert sparse["gradients"] <= 0.1 * dense["gradients"]


def test_table_one_reproduces_the_paper():
    rows = {r["setup"]: r for r in table_one()}
    cloud = rows["cloud, formula, 2 B/element"]
    pipe = rows["pipeline, formula, 2 B/element"]
    assert cloud["elements"] == 100 * 4096 * 4 * 96 * 96
    assert pipe["elements"] == 100 * 10 * 32 * 128 * 4096 * 2
    assert 2.0 < pipe["bytes"] / cloud["bytes"] < 2.5  # the paper: 2.4×
    assert 27e9 < cloud["bytes"] / 1.074 < 30e9  # ≈ 28 GB (GiB)
    sparse = rows["ours: activations bf16, gradients p=0.99 gap+bf16"]["bytes"]
    assert sparse < 0.55 * rows["ours: activations bf16, gradients dense fp32"]["bytes"]


def test_bad_configs_raise_before_any_process_starts(tmp_path):
    with pytest.raises(ValueError, match="cut_percentile"):
        _car_cfg(tmp_path, cut_percentile=1.5).validate()
    with pytest.raises(ValueError, match="divisible"):
        _car_cfg(tmp_path, num_minibatches=3).validate()
    with pytest.raises(ValueError, match="cut_index"):
        _car_cfg(tmp_path, cut_index="zip").validate()
    with pytest.raises(ValueError, match="unknown Gymnasium environment id"):
        train(_car_cfg(tmp_path, env="NoSuchEnv-v0"))
    with pytest.raises(ValueError, match="Box observation|frames or flat"):
        train(_car_cfg(tmp_path, env="envs_for_tests:TextObservationEnv", env_kwargs={}))


def test_stages_with_different_configs_refuse_to_train(tmp_path):
    """Two separately started stages (as on two machines: ``frugalrl train pipeline-ppo --rank R``) must agree on
    the config."""
    port = free_port("127.0.0.1")
    procs = []
    for rank, lr in ((0, 1e-3), (1, 2e-3)):
        flags = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2",
                 "--total-timesteps", "128", "--learning-rate", str(lr), "--rank", str(rank), "--master-port", str(port),
                 "--timeout", "60", "--run-dir", str(tmp_path), "--run-name", "mismatch", "--no-progress",
                 "--no-tensorboard", "--no-plots"]
        procs.append(subprocess.Popen([sys.executable, "-m", "frugalrl.cli", "train", "pipeline-ppo", *flags],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode != 0 for p in procs)
    errors = [err for _, err in results]
    assert all("digest mismatch" in e for e in errors), errors


def _stage_pids(marker: str, rank: int) -> list[int]:
    """Pids of the launcher's stage processes of rank ``rank`` in run directory ``marker`` (stage 1 writes to
    its ``stage1.log``, stage 0 to the terminal)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
            out = os.readlink(entry / "fd" / "1")
        except OSError:
            continue
        if "frugalrl.pipeline.launcher import stage_entry" in cmd and (marker in out) == (rank == 1):
            pids.append(int(entry.name))
    return pids


def test_a_dead_stage_is_reported_not_hung(tmp_path):
    cfg = PipelinePPOConfig(env="CartPole-v1", num_envs=2, num_steps=64, num_minibatches=2, update_epochs=2,
                            total_timesteps=10**6, head_hidden=16, run_dir=str(tmp_path), **QUIET)

    def kill_stage1():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = _stage_pids(str(tmp_path), 1)
            if pids:
                time.sleep(3)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_stage1)
    killer.start()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="pipeline stage"):
        train(cfg)
    killer.join()
    assert time.monotonic() - start < 90


@pytest.mark.slow
def test_pipeline_ppo_learns_cartpole_with_its_defaults(tmp_path):
    """Learning through the cut on a small real task with nothing set but the env and a budget (what ``frugalrl
    train pipeline-ppo --env CartPole-v1`` runs): a dense warm start, then sparse top-percentile cut gradients."""
    cfg = PipelinePPOConfig(env="CartPole-v1", total_timesteps=40_960, seed=1, run_dir=str(tmp_path), **QUIET)
    assert cfg.cut == "topk" and cfg.warmup_timesteps < cfg.total_timesteps  # the sparse phase is exercised
    summary = train(cfg)
    assert summary["eval_return_mean"] >= 150, summary["details"]["return_curve"]
    assert summary["bytes"]["gradients"] > 0


@pytest.mark.slow
def test_sparse_activations_are_lossless_and_smaller(tmp_path):
    """ReLU features sent as their non-zero entries: same training bytes elsewhere, fewer activation bytes."""
    from frugalrl.pipeline.stage0 import encode_features
    from frugalrl.wire.cut import decode_cut

    cfg = _car_cfg(tmp_path, activations_sparse=True, cut_index="coo16", run_name="sparse-act")
    f = torch.relu(torch.randn(32, 4096))
    msg = encode_features(cfg, f)
    dense = encode_features(_car_cfg(tmp_path), f)
    assert len(msg) < 0.75 * len(dense)
    assert torch.equal(decode_cut(msg), decode_cut(dense))
    summary = train(cfg)
    predicted = predict_bytes(cfg, summary["details"]["truncation_bootstraps"])
    assert not predicted["exact"]
    assert 0 < summary["bytes"]["activations"] <= predicted["bytes"]["activations"]
    assert summary["bytes"]["gradients"] == predicted["bytes"]["gradients"]


def test_stage1_bootstraps_a_truncation_from_its_final_observation_and_a_termination_from_nothing():
    """Stage 1's targets are PPO's: GAE with ``next_values`` from :func:`frugalrl.returns.bootstrap_values`, which
    puts the final observation's value at every finished step (``gae`` drops it at terminations)."""
    T, N, gamma, lam = 4, 2, 0.9, 0.8
    gen = torch.Generator().manual_seed(0)
    rewards, values, last_value = torch.rand(T, N, generator=gen), torch.rand(T, N, generator=gen), torch.rand(N, generator=gen)
    terminations, dones = torch.zeros(T, N), torch.zeros(T, N)
    terminations[1, 0] = dones[1, 0] = 1  # env 0 terminates at step 1
    dones[2, 1] = 1  # env 1 is truncated at step 2; the value of its final observation is 5
    advantages, returns = rollout_targets(rewards, values, last_value, torch.tensor([5.0]), terminations, dones,
                                          gamma, lam)
    # PPO's way: observations that are their own values, the final ones kept apart.
    _, next_values = bootstrap_values(lambda x: x[:, 0], values[..., None], last_value[:, None],
                                      torch.tensor([[1, 0], [2, 1]]), torch.tensor([[7.0], [5.0]]))
    expected = gae(rewards, values, next_values, terminations, dones, gamma, lam)
    torch.testing.assert_close(advantages, expected[0])
    torch.testing.assert_close(returns, expected[1])
    torch.testing.assert_close(advantages[2, 1], rewards[2, 1] + gamma * 5.0 - values[2, 1])
    torch.testing.assert_close(advantages[1, 0], rewards[1, 0] - values[1, 0])


def test_stage0_keeps_the_final_observations_of_truncated_steps():
    """Same-step autoreset: after the step the group holds the reset observation, the fragment the last one."""
    cfg = PipelinePPOConfig(env="envs_for_tests:CounterEnv", env_kwargs={"horizon": 2}, num_envs=2)
    envs = make_env_group(cfg, seed=0)
    try:
        fragment = collect_fragment(envs, lambda obs: (np.zeros(2, dtype=np.int64), None), 2)
    finally:
        envs.close()
    assert fragment.truncations[1].all() and not fragment.terminations.any() and (fragment.next_obs[:, 0] == 0).all()
    assert [f[0] for f in fragment.truncated_final_obs()] == [2.0, 2.0]
    fragment.terminations[1, 0] = True  # a termination: no bootstrap, so no final observation to send
    assert len(fragment.truncated_final_obs()) == 1


def test_time_limited_env_bootstraps_every_truncation_and_bytes_stay_exact(tmp_path):
    """A time limit, never a termination (CounterEnv: reward 1, truncated after 5 steps): stage 0 sends the
    features of every final observation, stage 1 reads them (or the stream would go out of step), and the
    predictor, given the count, still predicts every byte."""
    cfg = PipelinePPOConfig(env="envs_for_tests:CounterEnv", env_kwargs={"horizon": 5}, num_envs=2, num_steps=16,
                            num_minibatches=2, update_epochs=1, total_timesteps=64, head_hidden=16,
                            warmup_timesteps=0, cut_index="coo16", run_dir=str(tmp_path), **QUIET)
    summary = train(cfg)
    # Each env is truncated at its steps 5, 10, 15 (first rollout) and 20, 25, 30 (second).
    assert summary["details"]["truncation_bootstraps"] == [6, 6]
    predicted = predict_bytes(cfg, summary["details"]["truncation_bootstraps"])
    assert predicted["exact"] and _measured(summary) == predicted["bytes"]
    untruncated = predict_bytes(cfg)
    # One bf16 feature row per truncation, and one header and length prefix per rollout that has any.
    feature_dim = summary["details"]["feature_dim"]
    assert predicted["bytes"]["activations"] - untruncated["bytes"]["activations"] == 12 * feature_dim * 2
    assert predicted["bytes"]["control"] - untruncated["bytes"]["control"] == 2 * (12 + 4 * 2 + 8)


def _preempt(tmp_path, total: int, ready, extra: tuple[str, ...] = ()) -> dict:
    """Run ``frugalrl train pipeline-ppo`` (CartPole, 32-step iterations) in ``tmp_path/run``, send it SIGTERM once
    ``ready(run)`` holds, check it exits with the preemption code, and return its summary."""
    from frugalrl.driver import EXIT_PREEMPTED

    settings = {"env": "CartPole-v1", "num-envs": 2, "num-steps": 16, "num-minibatches": 2, "update-epochs": 1,
                "total-timesteps": total, "head-hidden": 16, "warmup-timesteps": 0, "run-dir": str(tmp_path),
                "run-name": "run"}
    flags = [x for k, v in settings.items() for x in (f"--{k}", str(v))]
    proc = subprocess.Popen([sys.executable, "-m", "frugalrl.cli", "train", "pipeline-ppo", *flags, *extra,
                             "--no-progress", "--no-plots", "--no-tensorboard"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    run = tmp_path / "run"
    try:
        deadline = time.monotonic() + 120
        while not ready(run):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended or hung before the signal"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == EXIT_PREEMPTED, proc.stderr.read().decode()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "preempted"
    return summary


@pytest.mark.timeout(240)
def test_sigterm_while_the_stages_start_stops_after_the_first_iteration(tmp_path):
    """A preemption while the stages import and connect (before stage 0 could take a signal) waits in the
    launcher, then stops the run after its first iteration: both halves saved, the preemption's exit code."""

    def starting(run) -> bool:  # the launcher has opened stage 1's log and is starting the stages
        if not (run / "stage1.log").exists():
            return False
        time.sleep(0.2)
        assert not (run / "metrics.jsonl").exists()
        return True

    summary = _preempt(tmp_path, 32 * 20, starting)
    assert summary["updates"] == 1
    assert torch.load(tmp_path / "run" / "checkpoints" / "heads.pt", weights_only=True)["iteration"] == 1


@pytest.mark.slow
def test_sigterm_stops_both_stages_with_their_checkpoints_and_resume_finishes(tmp_path):
    """SIGTERM to ``frugalrl train pipeline-ppo``: the launcher passes it to stage 0, whose driver stops after the
    iteration in progress and tells stage 1; both halves are saved at the same iteration, the command exits with
    the preemption code, and ``--resume`` finishes the budget."""
    from frugalrl.runs import read_metrics

    summary = _preempt(tmp_path, 32 * 150, lambda run: (run / "metrics.jsonl").exists() and len(read_metrics(run)) >= 3,
                       ("--eval-episodes", "1"))
    run = tmp_path / "run"
    assert 0 < summary["updates"] < 150
    heads = torch.load(run / "checkpoints" / "heads.pt", weights_only=True)
    assert heads["iteration"] == summary["updates"]
    # as a checkpoint written before stage 0 logged its truncation bootstraps: those iterations sent none
    latest = torch.load(run / "checkpoints" / "latest.pt", weights_only=False)
    del latest["parts"]["truncations"]
    torch.save(latest, run / "checkpoints" / "latest.pt")

    assert json.loads((run / "config.json").read_text())["master_port"] == 0  # the port picked is not kept:
    resumed = cli_main(["train", "pipeline-ppo", "--resume", str(run), "--no-progress"])  # a resume picks one anew
    assert resumed == 0
    final = json.loads((run / "summary.json").read_text())
    assert final["env_steps"] == 32 * 150 and len(final["details"]["truncation_bootstraps"]) == 150
    assert json.loads((run / "config.json").read_text())["master_port"] == 0
